"""Overhead of the excitation pullback over the plain input gradient (one forward + backward pass each).

ResNet-20 (pretrained, CIFAR-10) on a batch of 64 CIFAR-10 test images. Timed side by side, interleaved, in
one run (the median of ``--repeats`` runs each):

- ``gradient_s``: the plain input gradient (no instrumentation);
- ``pullback_s``: the excitation pullback (instrumented, sigmoid surrogate in the backward pass);
- ``instrumented_s``: the same instrumented pass with temperature 0 (the hard gate, i.e. the gradient again):
  what the instrumentation alone costs (hooks, the whitelist guard, the model checks);
- ``forward_s`` and ``record_gates_s``: a plain forward without autograd, and ``gates.record_gates``.

Prints one JSON line with the times and ``ratio`` (pullback / gradient; goal <= 1.15),
``instrumentation_ratio`` (instrumented / gradient) and ``record_gates_ratio`` (record_gates / forward).
The surrogate's own arithmetic (one sigmoid per ReLU unit in the backward pass, where the gradient needs a
comparison) is the difference between ``pullback_s`` and ``instrumented_s``. Run with ``DUALVIEW_DATA``
pointing at the data folder:
``python benchmarks/pullback_overhead.py [--repeats 20] [--batch 64] [--device cpu]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import dualview
from dualview import data, gates, pullbacks, zoo
from dualview.surrogates import SurrogateBackward


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

    def instrumented() -> None:  # the pullback's code path with the hard gate: instrumentation only
        with gates.instrument(model, SurrogateBackward(0.0, 0.0, None)):
            xg = x.detach().clone().requires_grad_(True)
            logits = model(xg)
            torch.autograd.grad(logits.gather(1, y[:, None]).sum(), xg)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    runs = {
        "gradient_s": lambda: pullbacks.input_gradient(model, x, y),
        "pullback_s": lambda: pullbacks.excitation_pullback(model, x, y),
        "instrumented_s": instrumented,
        "forward_s": forward,
        "record_gates_s": lambda: gates.record_gates(model, x),
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
    print(json.dumps({"benchmark": "pullback_overhead", **{k: round(v, 5) for k, v in result.items()},
                      "ratio": round(result["pullback_s"] / result["gradient_s"], 3),
                      "instrumentation_ratio": round(result["instrumented_s"] / result["gradient_s"], 3),
                      "record_gates_ratio": round(result["record_gates_s"] / result["forward_s"], 3),
                      "batch": args.batch, "device": str(device), "threads": torch.get_num_threads(),
                      "repeats": args.repeats}))


if __name__ == "__main__":
    main()
