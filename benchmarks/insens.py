"""Benchmark: Insens on the pretrained MNIST CNN 20-50-500 (15,220 hidden neurons).

Sides, measured interleaved in rounds on the same MNIST test digit(s):
- reference: one autograd backward per hidden neuron, then Eq. 7-8 written out
  (``projections.insens_reference``);
- generic: the forward-mode sweep over all 784 input pixels (``insens(..., structure=False)``);
- ours: the receptive-field fast path (``insens``, the default; ``dualview.receptive_fields``), for one
  image and, batched, per image of one call on ``--batch`` images.
Goals (issue 16): ratio reference/ours >= 100, ours <= 0.05 s for one image, batched at least 2x cheaper
per image than one image alone, max relative error <= 1e-5 (one image against the reference; every
image of the batch against ``ours`` on that image alone, and the batch's first against the reference).
Each round times the reference once and every other side ``--repeats`` times (their median); the
script prints one JSON line with the median over ``--rounds`` rounds of every time, the per-round
ratios, the batch size, the number of threads and whether each goal is met (on the medians).

    DUALVIEW_DATA=/work/shared/data python benchmarks/insens.py [--rounds 5] [--repeats 5] [--batch 32]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from timing import median_time

from dualview import data, projections, seed_everything, zoo


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference over the largest magnitude of ``b``."""
    return ((a - b).abs().max() / b.abs().max()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, default=0, help="MNIST test image")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="images per batched call (a usual batch size)")
    args = parser.parse_args()
    seed_everything(0)
    model = zoo.load_pretrained("mnist-cnn-20-50-500")
    test = data.load_mnist("test").x
    x = test[args.index : args.index + 1]
    xb = test[args.index : args.index + args.batch]
    ours = lambda: projections.insens(model, x)  # noqa: E731
    generic = lambda: projections.insens(model, x, structure=False)  # noqa: E731
    batched = lambda: projections.insens(model, xb)  # noqa: E731
    for warm in (ours, generic, batched):
        warm()  # oneDNN kernels, vmap tracing
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        ref = projections.insens_reference(model, x)
        ref_s = time.perf_counter() - start
        rounds.append({"reference": ref_s, "ours": median_time(ours, args.repeats),
                       "generic": median_time(generic, args.repeats),
                       "batched_per_image": median_time(batched, args.repeats) / len(xb)})
    fast, batch = ours(), batched()
    assert torch.equal(fast.n_inactive, ref.n_inactive) and torch.equal(fast.n_cut_off, ref.n_cut_off)
    alone = [projections.insens(model, xb[i:i + 1]).omega for i in range(len(xb))]  # each image on its own
    errors = {"ours_vs_reference": rel_err(fast.omega, ref.omega),
              "batched_first_vs_reference": rel_err(batch.omega[:1], ref.omega),
              "batched_vs_ours_alone": max(rel_err(batch.omega[i:i + 1], a) for i, a in enumerate(alone))}
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratios = {"reference_ours": [r["reference"] / r["ours"] for r in rounds],
              "generic_ours": [r["generic"] / r["ours"] for r in rounds],
              "single_batched": [r["ours"] / r["batched_per_image"] for r in rounds]}
    goals = {"reference/ours >= 100": statistics.median(ratios["reference_ours"]) >= 100,
             "ours <= 0.05 s": med["ours"] <= 0.05,
             "single/batched >= 2": statistics.median(ratios["single_batched"]) >= 2,
             "max rel err <= 1e-5": max(errors.values()) <= 1e-5}
    print(json.dumps({
        "benchmark": "insens", "rounds": args.rounds, "repeats": args.repeats, "batch": len(xb),
        "reference_s": round(med["reference"], 3), "generic_s": round(med["generic"], 4),
        "ours_s": round(med["ours"], 4), "batched_per_image_s": round(med["batched_per_image"], 4),
        **{f"ratio_{k}": [round(v, 2) for v in vs] for k, vs in ratios.items()},
        **{f"median_ratio_{k}": round(statistics.median(vs), 2) for k, vs in ratios.items()},
        "max_rel_err": {k: float(f"{v:.3g}") for k, v in errors.items()}, "hidden_neurons": fast.n_hidden,
        "threads": torch.get_num_threads(), "load_avg_1min": round(os.getloadavg()[0], 2),
        "goals_met": goals, "all_goals_met": all(goals.values()),
    }))


if __name__ == "__main__":
    main()
