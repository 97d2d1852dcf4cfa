"""Benchmark: Insens at ImageNet size, the Hutchinson estimate against the exact forward-mode sweep.

Model: torchvision ResNet-18, random weights (seeded), eval mode, one random 3 x 224 x 224 image
(batch 1). Sides:
- estimate: ``projections.insens_estimate`` with ``--probes`` Rademacher probes in ``--groups`` jackknife
  groups (``--probes`` forward-mode passes, ``--groups + 1`` reverse-mode ones); its relative standard
  error ``|omega_se| / |omega|`` as the method reports it;
- exact: ``projections.insens`` (the generic sweep: ResNet-18 is no plain Sequential conv net), which
  needs one forward-mode column per input coordinate (150,528 here). Running it takes hours, so we time
  ``--columns`` columns through the same code (``projections._jacobian_chunks``, the sweep ``insens``
  runs) and scale linearly to all columns: an extrapolation, printed as such (the final reverse pass,
  under a second, is left out).
Each side is timed ``--repeats`` times (median). Prints one JSON line.

    .venv/bin/python benchmarks/insens_estimate.py [--probes 64] [--groups 16] [--columns 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import torchvision

from timing import median_time

from dualview import projections, seed_everything
from dualview.gates import record_gates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=64)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=8, help="probes per batched jvp")
    parser.add_argument("--columns", type=int, default=64, help="exact columns timed, then extrapolated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    seed_everything(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, args.size, args.size)
    d = x[0].numel()

    runs = []

    def estimate():
        runs.append(projections.insens_estimate(model, x, probes=args.probes, groups=args.groups,
                                                chunk=args.chunk, generator=torch.Generator().manual_seed(len(runs))))

    t_est = median_time(estimate, args.repeats)
    est, errors = runs[-1], sorted(r.relative_error().item() for r in runs)
    with torch.no_grad():
        rec = record_gates(model, x)

    def columns():
        sweep = projections._jacobian_chunks(model, x, rec, rec.names, args.columns)
        for _, cols in itertools.islice(sweep, 1):   # one chunk of --columns input coordinates
            sum(c.square().sum() for c in cols.values())

    t_cols = median_time(columns, args.repeats)
    t_exact = t_cols / args.columns * d
    print(json.dumps({
        "model": "torchvision resnet18 (random weights, eval)", "input": [1, 3, args.size, args.size],
        "hidden_neurons": est.n_hidden, "inactive": int(est.n_inactive[0]), "probes": args.probes,
        "groups": args.groups, "estimate_s": round(t_est, 2),
        "estimate_relative_se": [round(e, 4) for e in errors],
        "exact_columns_timed": args.columns, "exact_columns_s": round(t_cols, 2),
        "exact_extrapolated_s": round(t_exact), "exact_extrapolated_h": round(t_exact / 3600, 2),
        "ratio_exact_over_estimate": round(t_exact / t_est), "threads": torch.get_num_threads(),
        "load": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
