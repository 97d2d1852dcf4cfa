"""Benchmark: the structured NPKs of Chapters 3 and 4 against their plain definitions.

1. Convolutional NPK (Theorem 3.2): ``npk_conv.npk_conv`` (joint-gate path counts, all rotations at once)
   against the Gram matrix of explicitly enumerated bundles (``npk_conv.npk_conv_reference``), on 8 real
   MNIST-1D signals and a tiny circular network. Goal: ratio >= 100.
2. ResNet NPK (Theorem 3.3): ``npk_resnet.npk_resnet`` (the factorised ensemble sum, O(b)) against the sum
   of the 2^b sub-network kernels (``npk_resnet.npk_resnet_subnetwork``), b = 8, 500 real digits.
   Goal: ratio >= 10.

Prints one JSON line per comparison.

    .venv/bin/python benchmarks/npk_conv_resnet.py
"""
from __future__ import annotations

import json

import torch
from sklearn.datasets import load_digits

from timing import median_time

from dualview import data, nets, npk_conv, npk_resnet


def report(name: str, ours, baseline, repeats=(5, 1), **extra) -> None:
    a, b = ours(), baseline()
    err = ((a - b).abs().max() / b.abs().max()).item()
    assert err < 1e-9, err
    ours_s, base_s = median_time(ours, repeats[0]), median_time(baseline, repeats[1])
    print(json.dumps({"benchmark": name, "baseline_s": round(base_s, 4), "ours_s": round(ours_s, 5),
                      "ratio": round(base_s / ours_s, 1), "rel_error": float(f"{err:.1e}"), **extra}))


def main() -> None:
    torch.manual_seed(0)
    x, _ = data.load_mnist1d("test", num_samples=200)
    x = x[:8].double()
    conv = nets.circular_convnet(1, [4, 4], [4], 10, kernel_size=3).double()
    report("npk_conv", lambda: npk_conv.npk_conv(conv, x), lambda: npk_conv.npk_conv_reference(conv, x),
           n_samples=len(x), d_in=x.shape[-1])

    b = 8
    digits = torch.tensor(load_digits().data[:500] / 16.0)
    res = nets.fc_resnet(64, 64, 2, b, num_outputs=10).double()
    subsets = npk_resnet.block_subsets(b)
    report("npk_resnet", lambda: npk_resnet.npk_resnet(res, digits),
           lambda: sum(npk_resnet.npk_resnet_subnetwork(res, digits, subset=J) for J in subsets),
           repeats=(5, 1), n_samples=len(digits), blocks=b, subnetworks=len(subsets))


if __name__ == "__main__":
    main()
