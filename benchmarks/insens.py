"""Benchmark: Insens of one MNIST test digit on the pretrained MNIST CNN 20-50-500.

Reference: one autograd backward per hidden neuron (15,220 of them), then Eq. 7-8 written out
(dualview.projections.insens_reference). Ours: dualview.projections.insens (forward-mode sweeps
over the input basis for |w_i|^2, one backward pass for Omega). Goals (issue 7): ratio >= 100, ours
<= 1 s per image, max relative error <= 1e-5. Prints one JSON line.

    DUALVIEW_DATA=/work/shared/data python benchmarks/insens.py [--index 0] [--repeats 5]

Reported: wall-clock seconds (best of ``--repeats`` runs for ours, one run for the reference,
which takes minutes) and, next to them, process CPU seconds, the fairer measure on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from dualview import data, projections, seed_everything, zoo


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, default=0, help="MNIST test image")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    seed_everything(0)
    model = zoo.load_pretrained("mnist-cnn-20-50-500")
    x = data.load_mnist("test").x[args.index : args.index + 1]
    projections.insens(model, x)  # warm-up (oneDNN kernels, vmap tracing)
    runs = [timed(lambda: projections.insens(model, x)) for _ in range(args.repeats)]
    ours, ours_s, ours_cpu = min(runs, key=lambda r: r[1])
    ref, ref_s, ref_cpu = timed(lambda: projections.insens_reference(model, x))
    scale = ref.omega.abs().max()
    max_rel_err = ((ours.omega - ref.omega).abs().max() / scale).item()
    assert torch.equal(ours.n_inactive, ref.n_inactive) and torch.equal(ours.n_cut_off, ref.n_cut_off)
    print(json.dumps({
        "benchmark": "insens", "reference_s": round(ref_s, 3), "ours_s": round(ours_s, 4),
        "ratio": round(ref_s / ours_s, 1), "max_rel_err": float(f"{max_rel_err:.3g}"),
        "reference_cpu_s": round(ref_cpu, 3), "ours_cpu_s": round(ours_cpu, 4),
        "hidden_neurons": ours.n_hidden, "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
