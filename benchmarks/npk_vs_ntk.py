"""Benchmark: the NPK Gram matrix (product form) against the empirical NTK Gram matrix.

Same fully connected network (784 -> 128 x 4 -> 1, the value network of a DGN whose gates come from a
ReLU network of the same shape), same 1,000 MNIST test images. The NTK is taken with respect to the
value-network weights (``dualview.ntk.empirical_ntk``, torch.func Jacobians contracted in
blocks); the NPK with ``dualview.npk_fc.npk_fc`` (gates recorded once, then one matrix product per
layer). Each is timed several times, side by side in one run, and the medians are compared.
Prints one JSON line. Goal: the NPK at least 100x faster than the NTK.

    DUALVIEW_DATA=../shared/data python benchmarks/npk_vs_ntk.py [--n 1000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

import dualview
from dualview import data, dgn, nets, npk_fc, ntk, splits


def fc(width: int, depth: int) -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), *nets.relu_mlp([784] + [width] * depth + [1], bias=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4, help="number of hidden layers")
    args = parser.parse_args()

    dualview.seed_everything(0)
    x = splits.subset_per_class(data.load_mnist("test"), args.n // 10, seed=0).x
    gating, value = fc(args.width, args.depth).eval(), fc(args.width, args.depth)
    fixed = dgn.GatedNetwork(value, gating)   # value with the fixed gates of gating

    def npk_side() -> torch.Tensor:
        return npk_fc.npk_fc(value, x, gating=gating, dtype=torch.float32)

    def ntk_side() -> torch.Tensor:
        return ntk.empirical_ntk(fixed, x, params="value", chunk_size=50)

    npk_side(), ntk_side()  # warm up
    ours, baseline = [], []
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        t = time.perf_counter()
        npk_side()
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        ntk_side()
        baseline.append(time.perf_counter() - t)
    b, o = statistics.median(baseline), statistics.median(ours)
    print(json.dumps({"benchmark": "npk_vs_ntk", "baseline_s": round(b, 4), "ours_s": round(o, 5),
                      "ratio": round(b / o, 1), "n": args.n, "width": args.width, "hidden_layers": args.depth,
                      "repeats": args.repeats, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
