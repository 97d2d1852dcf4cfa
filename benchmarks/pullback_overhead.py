"""Overhead of the excitation pullback over the plain input gradient (one forward + backward pass each).

ResNet-20 (pretrained, CIFAR-10) on a batch of 64 CIFAR-10 test images. The two are timed side by side,
interleaved, in one run; the median of ``--repeats`` runs is reported. Prints one JSON line:

    {"benchmark": "pullback_overhead", "gradient_s": ..., "pullback_s": ..., "ratio": ...}

Goal: ratio <= 1.3. Run with ``DUALVIEW_DATA`` pointing at the data folder:
``python benchmarks/pullback_overhead.py [--repeats 20] [--batch 64] [--device cpu]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import dualview
from dualview import data, pullbacks, zoo


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    device = torch.device(args.device) if args.device else dualview.default_device()
    dualview.seed_everything(0)
    model = zoo.load_pretrained("resnet20", device=device)
    cifar = data.load_cifar10("test")
    x = cifar.x[: args.batch].to(device)
    y = cifar.y[: args.batch].to(device)

    runs = {
        "gradient_s": lambda: pullbacks.input_gradient(model, x, y),
        "pullback_s": lambda: pullbacks.excitation_pullback(model, x, y),
    }
    for fn in runs.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for key, fn in runs.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[key].append(time.perf_counter() - start)
    result = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"benchmark": "pullback_overhead", "gradient_s": round(result["gradient_s"], 5),
                      "pullback_s": round(result["pullback_s"], 5),
                      "ratio": round(result["pullback_s"] / result["gradient_s"], 3),
                      "batch": args.batch, "device": str(device), "repeats": args.repeats}))


if __name__ == "__main__":
    main()
