"""Benchmark: vectorised neural path features and values against the path-by-path reference.

Measures, side by side in one run, the time to compute phi(x) for a batch of real digits and v for a
64-12-12-10 network (the network of Chapter 1), with dualview.paths (outer products over layers) and with
the reference (a Python loop over samples and paths). Prints one JSON line. Goal: ratio >= 100.

    .venv/bin/python benchmarks/paths_npf.py
"""
from __future__ import annotations

import json

import torch
from sklearn.datasets import load_digits
from torch import nn

from timing import median_time

from dualview import paths


def main() -> None:
    torch.manual_seed(0)
    x = torch.tensor(load_digits().data[:8] / 16.0)
    net = nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 10)).double()

    def ours():
        return paths.neural_path_features(net, x), paths.neural_path_values(net)

    def reference():
        return paths.neural_path_features_reference(net, x), paths.neural_path_values_reference(net)

    a, b = ours(), reference()
    assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1])
    ours_s = median_time(ours, 7)
    ref_s = median_time(reference, 3)
    print(json.dumps({"benchmark": "paths_npf", "baseline_s": round(ref_s, 4), "ours_s": round(ours_s, 6),
                      "ratio": round(ref_s / ours_s, 1), "n_samples": len(x), "n_paths": a[0].shape[1]}))


if __name__ == "__main__":
    main()
