"""The named sweeps of `make sweep` (README, "Paper-scale sweeps"): a command line over dualview.sweep.

    python scripts/sweep.py fc4-mnist [--cluster slurm] [--max-parallel 4] [--partition gpu --gpus-per-node 1]
    python scripts/sweep.py chapter --chapter 05_dgn --profile gpu --seeds 5

The jobs run library functions (``dualview.sweep.train_gated``, ``run_chapter``), so they pickle by their
module's name and this script's own names never travel to a job.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from dualview.dgn import sample_permutations
from dualview.sweep import CLUSTERS, grid, results_folder, run, run_chapter, train_gated

def _chapter5_points(seeds: Sequence[int], permutations: Sequence[Sequence[int] | None]) -> list[dict[str, Any]]:
    return (grid(seed=list(seeds), model=["linear", "dnn"])
            + grid(seed=list(seeds), model=["dgn", "dgn-allones"], permutation=list(permutations)))


def _shuffles(n: int, k: int | None = None) -> list[list[int] | None]:
    """The identity (None) and ``k`` sampled other orders of ``n`` gate layers (all ``n! - 1`` if ``k`` is None)."""
    return [None] + [list(p) for p in sample_permutations(n, k)]


#: The sweeps ``make sweep SWEEP=<name>`` runs: name -> (function, its points, a timeout per job in minutes).
#: ``fc4-mnist``: Chapter 5's FC4 rows of Table 2 at the papers' scale (the chapter's ``gpu`` sizes): 5 seeds x
#: (linear, DNN, and DGN / DGN-ALLONES with the identity and all 23 other gate-layer orders), 250 jobs;
#: ``digits``: the same protocol on 600 of scikit-learn's 8x8 digits, 3 seeds x (identity + 3 sampled orders), 30 jobs of
#: seconds each: a try-out of the machinery on a laptop.
SWEEPS: dict[str, Callable[[], tuple[Callable[..., Any], list[dict[str, Any]], float]]] = {
    "fc4-mnist": lambda: (train_gated, [dict(p, dataset="mnist", widths=[128] * 4, epochs=30, lr=3e-4, batch_size=32)
                                        for p in _chapter5_points(range(5), _shuffles(4))], 120),
    "digits": lambda: (train_gated, [dict(p, n_train=600) for p in _chapter5_points(range(3), _shuffles(4, 3))], 10),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/sweep.py", description=(
        "Fan a sweep out as submitit jobs; rows go to <out>/rows, a finished point is never run again."))
    parser.add_argument("sweep", help=f"a named sweep {sorted(SWEEPS)}, or 'chapter' (a chapter over seeds)")
    parser.add_argument("--cluster", choices=CLUSTERS, default="local")
    parser.add_argument("--max-parallel", type=int, default=2, help="jobs running at once (local) / array tasks (slurm)")
    parser.add_argument("--timeout-min", type=float, default=None, help="minutes per job (default: the sweep's)")
    parser.add_argument("--out", default=None, help="results folder (default: $DUALVIEW_SWEEPS/<sweep> or _build/sweeps/<sweep>)")
    parser.add_argument("--chapter", default="05_dgn", help="for 'chapter': the chapter, e.g. 05_dgn")
    parser.add_argument("--profile", default="gpu", help="for 'chapter': its PROFILE")
    parser.add_argument("--seeds", type=int, default=5, help="for 'chapter': SEED = 0, ..., seeds - 1")
    parser.add_argument("--gpus-per-node", type=int, default=None)
    parser.add_argument("--cpus-per-task", type=int, default=None)
    parser.add_argument("--mem-gb", type=float, default=None)
    parser.add_argument("--partition", default=None, help="slurm partition")
    args = parser.parse_args(argv)
    if args.sweep == "chapter":
        fn, points, timeout = run_chapter, grid(chapter=[args.chapter], PROFILE=[args.profile],
                                                SEED=list(range(args.seeds))), 24 * 60
        name = f"{args.chapter}-{args.profile}"
    elif args.sweep in SWEEPS:
        (fn, points, timeout), name = SWEEPS[args.sweep](), args.sweep
    else:
        parser.error(f"unknown sweep {args.sweep!r}: choose one of {sorted(SWEEPS)} or 'chapter'")
    resources = {k: v for k, v in dict(gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task,
                                       mem_gb=args.mem_gb, slurm_partition=args.partition).items() if v is not None}
    report = run(fn, points, args.out or results_folder(name), cluster=args.cluster, max_parallel=args.max_parallel,
                 timeout_min=args.timeout_min or timeout, resources=resources)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
