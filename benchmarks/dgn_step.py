"""Benchmark: one training step of a DNN, a DGN and a DLGN of the same architecture.

C4GAP of width 64 on a batch of 128 CIFAR-sized inputs (3x32x32), cross-entropy, Adam; the DGN and
DLGN are in standalone mode (soft gates at temperature 0.1, the papers' beta = 10, both networks
trained), the most expensive one. A DGN runs two networks of the DNN's size, so the goal (issue 5) is ``dgn_s / dnn_s <= 2.3``: two
networks and no more than a little overhead for the gates. The three models are timed in interleaved
rounds (so that a busy, shared machine slows them alike) and the median step time of each is
reported, in wall-clock seconds, with the process CPU seconds per step beside them. One JSON line.

    python benchmarks/dgn_step.py [--width 64] [--batch 128] [--rounds 7] [--steps 3] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from dualview import dgn, seed_everything
from dualview.architectures import Architecture


def step_timer(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def run(steps: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    seed_everything(0)
    arch = Architecture.c4gap(args.width)
    nets = {"dnn": dgn.build(arch, "dnn"), "dgn": dgn.build(arch, "dgn"), "dlgn": dgn.build(arch, "dlgn")}
    x = torch.rand(args.batch, *arch.in_shape)
    y = torch.randint(0, arch.num_classes, (args.batch,))
    timers = {k: step_timer(m.train(), x, y) for k, m in nets.items()}
    for run in timers.values():  # warm-up: oneDNN kernel selection, allocator
        run(1)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in nets}
    for _ in range(args.rounds):
        for k, run in timers.items():
            times[k].append(run(args.steps))
    wall = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
    cpu = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
    print(json.dumps({
        "benchmark": "dgn_step", "dnn_s": round(wall["dnn"], 4), "dgn_s": round(wall["dgn"], 4),
        "dlgn_s": round(wall["dlgn"], 4), "ratio": round(wall["dgn"] / wall["dnn"], 3),
        "dlgn_ratio": round(wall["dlgn"] / wall["dnn"], 3), "cpu_ratio": round(cpu["dgn"] / cpu["dnn"], 3),
        "dnn_cpu_s": round(cpu["dnn"], 4), "dgn_cpu_s": round(cpu["dgn"], 4), "dlgn_cpu_s": round(cpu["dlgn"], 4),
        "arch": arch.name, "batch": args.batch, "threads": torch.get_num_threads(), "goal": "ratio <= 2.3",
    }))


if __name__ == "__main__":
    main()
