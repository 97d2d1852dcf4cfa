"""Benchmark: Insens on the pretrained MNIST CNN 20-50-500 (15,220 hidden neurons).

Sides, measured interleaved in rounds on the same MNIST test digit(s):
- reference: one autograd backward per hidden neuron, then Eq. 7-8 written out
  (``projections.insens_reference``);
- generic: the forward-mode sweep over all 784 input pixels (``insens(..., structure=False)``);
- ours: the receptive-field fast path (``insens``, the default; ``dualview.receptive_fields``), for one
  image and, batched, per image of a batch of ``--batch`` images.
Goals (issue 16): ratio reference/ours >= 100, ours <= 0.05 s for one image, batched at least 2x cheaper
per image than one image alone, max relative error <= 1e-5. Prints one JSON line with the median over
``--rounds`` rounds of every time (each round: the reference once, ours and generic ``--repeats`` times,
their median), the per-round ratios, and the number of threads.

    DUALVIEW_DATA=/work/shared/data python benchmarks/insens.py [--rounds 3] [--repeats 5] [--batch 32]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, default=0, help="MNIST test image")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
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
                       "batched_per_image": median_time(batched, max(1, args.repeats // 2)) / len(xb)})
    fast = ours()
    scale = ref.omega.abs().max()
    max_rel_err = ((fast.omega - ref.omega).abs().max() / scale).item()
    assert torch.equal(fast.n_inactive, ref.n_inactive) and torch.equal(fast.n_cut_off, ref.n_cut_off)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(json.dumps({
        "benchmark": "insens", "rounds": args.rounds,
        "reference_s": round(med["reference"], 3), "generic_s": round(med["generic"], 4),
        "ours_s": round(med["ours"], 4), "batched_per_image_s": round(med["batched_per_image"], 4),
        "ratio_reference_ours": [round(r["reference"] / r["ours"], 1) for r in rounds],
        "ratio_generic_ours": [round(r["generic"] / r["ours"], 2) for r in rounds],
        "ratio_single_batched": [round(r["ours"] / r["batched_per_image"], 2) for r in rounds],
        "max_rel_err": float(f"{max_rel_err:.3g}"), "hidden_neurons": fast.n_hidden,
        "threads": torch.get_num_threads(), "load_avg_1min": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
