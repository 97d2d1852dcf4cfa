"""Overhead of the excitation pullback over the plain input gradient (one forward + backward pass each).

ResNet-20 (pretrained, CIFAR-10) on a batch of 64 CIFAR-10 test images. Timed side by side, interleaved, in
one run (the median of ``--repeats`` runs each):

- ``gradient_s``: the plain input gradient (no instrumentation);
- ``pullback_s``: the excitation pullback (instrumented, sigmoid surrogate in the backward pass);
- ``instrumented_s``: the pullback's code path with temperature 0 (the hard gate, i.e. the gradient again;
  parameters frozen as the pullback freezes them): what the instrumentation alone costs (hooks, the
  whitelist guard, the model checks, the surrogate's ``autograd.Function`` and BatchNorm backward);
- ``forward_s`` and ``record_gates_s``: a plain forward and ``gates.record_gates``, both without autograd.

Prints one JSON line with the times and ``ratio`` (pullback / gradient; goal <= 1.15),
``instrumentation_ratio`` (instrumented / gradient) and ``record_gates_ratio`` (record_gates / forward).
The surrogate's own arithmetic (one sigmoid per ReLU unit in the backward pass, where the gradient needs a
comparison) is the difference between ``pullback_s`` and ``instrumented_s``. ``held_mb_gradient`` and
``held_mb_pullback``: the megabytes the autograd graph holds when the backward pass starts (the tensors saved
for it, each storage once; exact, not timed). Run with ``DUALVIEW_DATA`` pointing at the data folder:
``python benchmarks/pullback_overhead.py [--repeats 20] [--batch 64] [--device cpu]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import weakref

import torch

import dualview
from dualview import data, gates, pullbacks, zoo
from dualview.surrogates import SurrogateBackward


class _Held:
    __slots__ = ("t", "__weakref__")


def held_megabytes(fn) -> float:
    """The megabytes of the tensors that ``fn``'s autograd graph still holds when its backward pass starts
    (saved tensors whose node was dropped in the forward do not count; each storage once)."""
    refs: list[weakref.ref] = []
    at_backward: list[float] = []

    def pack(t: torch.Tensor) -> _Held:
        h = _Held()
        h.t = t
        refs.append(weakref.ref(h))
        return h

    def unpack(h: _Held) -> torch.Tensor:
        if not at_backward:
            live = {r().t.untyped_storage().data_ptr(): r().t.untyped_storage().nbytes()
                    for r in refs if r() is not None}
            at_backward.append(sum(live.values()) / 2**20)
        return h.t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    return at_backward[0]


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
        frozen = [p for p in model.parameters() if p.requires_grad]
        try:
            for p in frozen:
                p.requires_grad_(False)
            with gates.instrument(model, SurrogateBackward(0.0, 0.0, None)):
                xg = x.detach().clone().requires_grad_(True)
                logits = model(xg)
                torch.autograd.grad(logits.gather(1, y[:, None]).sum(), xg)
        finally:
            for p in frozen:
                p.requires_grad_(True)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    def record_gates() -> None:  # without autograd, as the plain forward it is compared with
        with torch.no_grad():
            gates.record_gates(model, x)

    runs = {
        "gradient_s": lambda: pullbacks.input_gradient(model, x, y),
        "pullback_s": lambda: pullbacks.excitation_pullback(model, x, y),
        "instrumented_s": instrumented,
        "forward_s": forward,
        "record_gates_s": record_gates,
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
    held = {"held_mb_gradient": held_megabytes(runs["gradient_s"]),
            "held_mb_pullback": held_megabytes(runs["pullback_s"])}
    print(json.dumps({"benchmark": "pullback_overhead", **{k: round(v, 5) for k, v in result.items()},
                      "ratio": round(result["pullback_s"] / result["gradient_s"], 3),
                      "instrumentation_ratio": round(result["instrumented_s"] / result["gradient_s"], 3),
                      "record_gates_ratio": round(result["record_gates_s"] / result["forward_s"], 3),
                      **{k: round(v, 2) for k, v in held.items()},
                      "batch": args.batch, "device": str(device), "threads": torch.get_num_threads(),
                      "repeats": args.repeats}))


if __name__ == "__main__":
    main()
