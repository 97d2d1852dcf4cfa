"""The `gpu` profile on a real GPU in one short command (`make gpu-check`).

    python scripts/gpu_check.py [--out DIR] [--chapters 01_paths ...] [--budget SECONDS]

On a machine with a CUDA GPU, in about 8 minutes:

1. executes every chapter with ``PROFILE = "gpu"``, ``SCALE = "smoke"`` (the paper-scale code path at tiny
   sizes) on the GPU, and checks that the chapter's work ran there: every call of the library's training and
   attribution entry points (``train.fit``, ``train.per_point_scores``, ``pullbacks.excitation_pullback``,
   ``explain.attribute``, ``projections.insens_estimate``) is recorded with the device of its model; a chapter
   fails when none of them ran on the GPU or when a training run did not (the table counts the other calls
   made off the GPU, e.g. the float64 identity checks some chapters do on the CPU on purpose);
2. times a few steps of each chapter's paper-scale loops (``PROBES``: the models at the sizes of the chapter's
   ``gpu`` profile, with the chapter's batch sizes; random inputs of the data's shape, since only time is
   measured) and multiplies each by the number of steps the full ``gpu`` profile runs, which gives an
   extrapolated full time per chapter (of the timed loops: a lower bound, the rest of the chapter is not in it);
3. writes one table (chapter, smoke time, per-step times, extrapolated full time, peak GPU memory) to
   ``DIR/gpu_check.md`` and ``DIR/gpu_check.json`` (default ``_build/gpu-check``) and exits 1 on any failure.

Without a GPU it says so and runs the same code on the CPU at smoke scale: the chapters as above, the probes
with the smoke sizes and a batch of at most ``CPU_BATCH``, one timed step. Its times are CPU times, no estimate
of anything (a test runs this path, so the script cannot rot).
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jupytext
import nbformat
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import notebooks  # noqa: E402  (which files are chapters)

ROOT = notebooks.ROOT
CPU_BATCH = 8  # without a GPU the probes run at smoke scale, with batches of at most this size
WATCHED = {"train": ("fit", "per_point_scores"), "pullbacks": ("excitation_pullback",),
           "explain": ("attribute",), "projections": ("insens_estimate",)}

# the first cell after the parameters: record the device of every call of the library's entry points
_RECORDER = '''
import functools as _ft, torch as _torch, dualview as _dv
from dualview import explain as _ex, projections as _pr, pullbacks as _pb, train as _tr
_GPU_CHECK = []
def _gpu_check_device(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, _torch.nn.Module):
            for t in (*a.parameters(), *a.buffers()):
                return t.device.type
        if isinstance(a, _torch.Tensor):
            return a.device.type
    return "none"
def _gpu_check_wrap(module, name):
    fn = getattr(module, name)
    @_ft.wraps(fn)
    def wrapper(*args, **kwargs):
        _GPU_CHECK.append((name, _gpu_check_device(args, kwargs)))
        return fn(*args, **kwargs)
    setattr(module, name, wrapper)
for _m, _names in {WATCHED}.items():
    for _n in _names:
        _gpu_check_wrap({{"train": _tr, "pullbacks": _pb, "explain": _ex, "projections": _pr}}[_m], _n)
if _torch.cuda.is_available():
    _torch.cuda.reset_peak_memory_stats()
'''
_REPORT = '''
import json as _json
print("GPU-CHECK " + _json.dumps({"calls": _GPU_CHECK, "peak_mb": (_torch.cuda.max_memory_allocated() / 2**20
      if _torch.cuda.is_available() else None)}))
'''


# --- the chapters at smoke scale ------------------------------------------------------------------------------
def smoke_notebook(chapter: Path):
    """The chapter with PROFILE="gpu", SCALE="smoke", and the recorder cells around it."""
    from papermill.parameterize import parameterize_notebook

    nb = jupytext.read(chapter)
    for cell in nb.cells:
        cell.metadata.setdefault("tags", [])
    nb.metadata.setdefault("papermill", {})
    nb = parameterize_notebook(nb, {"PROFILE": "gpu", "SCALE": "smoke"}, kernel_name="python3",
                               language="python")
    where = next(k for k, c in enumerate(nb.cells) if "injected-parameters" in c.metadata.tags)
    nb.cells.insert(where + 1, nbformat.v4.new_code_cell(_RECORDER.format(WATCHED=dict(WATCHED))))
    nb.cells.append(nbformat.v4.new_code_cell(_REPORT))
    return nb


def execute(nb, timeout: float) -> str:
    """Run the notebook's code cells one after another in a fresh kernel (the way nbval does: plain messages,
    no widget state kept; a cell's widgets do not hold the run up) and return the last cell's printed text.
    Raises RuntimeError naming the cell that failed, TimeoutError when the time is up."""
    from jupyter_client.manager import start_new_kernel

    deadline = time.monotonic() + timeout
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    printed: list[str] = []
    try:
        for k, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the time was up before code cell {k}")
            printed.clear()
            errors: list[str] = []

            def hook(msg, printed=printed, errors=errors):
                if msg["msg_type"] == "stream":
                    printed.append(msg["content"]["text"])
                elif msg["msg_type"] == "error":
                    errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

            try:
                reply = kc.execute_interactive(cell.source, timeout=left, output_hook=hook, allow_stdin=False)
            except TimeoutError:
                raise TimeoutError(f"code cell {k} was still running when the time was up") from None
            if reply["content"]["status"] != "ok":
                first = cell.source.strip().splitlines()[0][:80] if cell.source.strip() else ""
                raise RuntimeError(f"code cell {k} ({first!r}) failed: " + "; ".join(errors)[-300:])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return "".join(printed)


def run_chapter(chapter: Path, gpu: bool, timeout: int) -> dict:
    nb = smoke_notebook(chapter)
    start = time.perf_counter()
    row = {"chapter": chapter.stem, "ok": False, "problem": ""}
    text = ""
    try:
        text = execute(nb, timeout)
    except (RuntimeError, TimeoutError) as error:
        row["problem"] = str(error)
    except Exception as error:  # noqa: BLE001  (a dead kernel: reported in the table)
        row["problem"] = f"{type(error).__name__}: {str(error)[:300]}"
    row["smoke_s"] = time.perf_counter() - start
    report = None
    for line in text.splitlines():
        if line.startswith("GPU-CHECK "):
            report = json.loads(line[len("GPU-CHECK "):])
    if report is None:
        row["problem"] = row["problem"] or "the chapter did not reach its last cell"
        return row
    calls = [tuple(c) for c in report["calls"]]
    want = "cuda" if gpu else "cpu"
    on = [name for name, dev in calls if dev == want]
    row.update(calls=len(calls), on_device=len(on), off_device=len(calls) - len(on), smoke_peak_mb=report["peak_mb"])
    row["problem"] = row["problem"] or judge(calls, want)
    row["ok"] = not row["problem"]
    return row


def judge(calls: list[tuple[str, str]], want: str) -> str:
    """What is wrong with where a chapter's recorded calls (entry point, device type) ran, or ""."""
    on = [name for name, dev in calls if dev == want]
    off_training = [name for name, dev in calls if name == "fit" and dev != want]
    if not on:
        return f"none of its {len(calls)} training or attribution calls ran on {want}"
    if off_training:
        return f"{len(off_training)} training run(s) did not run on {want}"
    return ""


# --- the paper-scale loops ------------------------------------------------------------------------------------
def chapter_sizes(chapter: Path, gpu: bool) -> dict:
    """The chapter's ``gpu`` sizes (with its smoke sizes over them when there is no GPU), read from the
    ``sizes=`` argument of its ``dualview.setup`` call."""
    from dualview import architectures

    names = {"dict": dict, "tuple": tuple, "list": list, **vars(architectures)}
    for cell in jupytext.read(chapter).cells:
        if cell.cell_type == "code" and "dualview.setup(" in cell.source:
            for node in ast.walk(ast.parse(cell.source)):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "setup":
                    expr = next(k.value for k in node.keywords if k.arg == "sizes")
                    sizes = eval(compile(ast.Expression(expr), chapter.name, "eval"),  # noqa: S307
                                 names)
                    chosen = dict(sizes["gpu"])
                    if not gpu:
                        chosen.update(sizes.get("smoke", {}))
                    return chosen
    raise ValueError(f"{chapter.name}: no dualview.setup(..., sizes=...) call found")


@dataclass
class Probe:
    """One paper-scale loop of a chapter: ``build(sizes)`` gives (model, one input, batch size, classes);
    ``steps(sizes)`` is the number of such steps the full ``gpu`` profile runs; ``kind`` is ``"train"``
    (forward, cross-entropy, backward, Adam step), ``"forward"`` (eval, no gradient) or ``"pullback"``
    (the excitation pullback of a batch)."""

    loop: str
    kind: str
    build: Callable[[dict], tuple[nn.Module, tuple[int, ...], int, int]]
    steps: Callable[[dict], int]
    dtype: torch.dtype = torch.float32


def _mlp(widths):
    layers = [nn.Flatten()]
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _convnet(ch):  # Chapter 2's CIFAR network
    return nn.Sequential(nn.Conv2d(3, ch, 3, 2, 1), nn.ReLU(), nn.Conv2d(ch, ch, 3, 2, 1), nn.ReLU(),
                         nn.Conv2d(ch, 2 * ch, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(2 * ch, 10))


def _plain(widths, depth, stride):  # Chapter 4's plain network: stages of 3x3 convolutions, GAP, linear
    layers, c = [nn.Conv2d(3, widths[0], 3, stride, 1), nn.ReLU()], widths[0]
    for k, w in enumerate(widths):
        for j in range(depth):
            layers += [nn.Conv2d(c, w, 3, 2 if (j == 0 and k > 0) else 1, 1), nn.BatchNorm2d(w), nn.ReLU()]
            c = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))


def _probes() -> dict[str, list[Probe]]:
    from dualview import dgn, leveling, nets
    from dualview.architectures import Architecture

    def batches(n, b):
        return math.ceil(n / b)

    return {
        "01_paths": [Probe("FC 64-12-12-10 (float64) on 8x8 digits", "train",
                           lambda s: (_mlp([64, 12, 12, 10]), (1, 8, 8), 64, 10),
                           lambda s: s["epochs"] * batches(1437, 64), torch.float64)],
        "02_npk": [
            Probe("MNIST MLP, 3 trainings a seed", "train",
                  lambda s: (_mlp([784] + [s["mnist_width"]] * 3 + [10]), (1, 28, 28), 128, 10),
                  lambda s: 3 * s["mnist_seeds"] * s["mnist_epochs"] * batches(60000, 128)),
            Probe("CIFAR-10 convnet, 3 trainings a seed", "train",
                  lambda s: (_convnet(s["cifar_channels"]), (3, 32, 32), 64, 10),
                  lambda s: 3 * s["gate_seeds"] * s["cifar_epochs"] * batches(50000, 64))],
        "03_convolution": [
            Probe("MNIST-1D circular convnet (GAP and flatten heads)", "train",
                  lambda s: (nets.circular_convnet(1, [s["channels"]] * 3, [64], 10, kernel_size=5, spatial=40),
                             (1, 40), 100, 10),
                  lambda s: (s["epochs"] + s["epochs"] // 2) * batches(4000, 100)),
            Probe("MNIST 2-D circular convnet, two heads", "train",
                  lambda s: (nets.circular_convnet(1, [s["mnist_channels"]] * 4, [64], 10, kernel_size=3, dims=2,
                                                   spatial=(14, 14)), (1, 14, 14), 100, 10),
                  lambda s: 2 * s["mnist_epochs"] * batches(60000, 100))],
        "04_resnet": [
            Probe("CIFAR-10 plain and skip networks", "train",
                  lambda s: (_plain(s["plain_widths"], s["plain_depth"], s["plain_stem_stride"]), (3, 32, 32),
                             s["plain_batch"], 10),
                  lambda s: 2 * s["small_seeds"] * s["plain_epochs"] * batches(s["plain_train"], s["plain_batch"])),
            Probe("ResNet-56 lesions (forward)", "forward",
                  lambda s: (nets.cifar_resnet(56), (3, 32, 32), s["lesion_batch"], 10),
                  lambda s: (len(s["lesion_ks"]) * s["lesion_draws"] + s["lesion_draws_down"])
                  * batches(s["held_out"], s["lesion_batch"]))],
        "05_dgn": [
            Probe("FC4 DNN/DGN on MNIST, 6 trainings a seed", "train",
                  lambda s: (dgn.build(Architecture.fc(), "dgn"), (1, 28, 28), s["fc_batch"], 10),
                  lambda s: 6 * s["fc_seeds"] * s["fc_epochs"] * batches(60000, s["fc_batch"])),
            Probe("C4GAP DGN on CIFAR-10, 6 trainings a seed", "train",
                  lambda s: (dgn.build(Architecture.c4gap(s["c4_width"], in_shape=(3, s["cifar_side"],
                                                                                      s["cifar_side"])), "dgn"),
                             (3, s["cifar_side"], s["cifar_side"]), s["conv_batch"], 10),
                  lambda s: 6 * s["c4_seeds"] * s["c4_epochs"] * batches(s["cifar_train"], s["conv_batch"])),
            Probe("VGG-16 DNN on CIFAR-10 (Table 2's deep rows)", "train",
                  lambda s: (dgn.build(Architecture.vgg16(), "dnn"), (3, 32, 32), s["deep_batch"], 10),
                  lambda s: s["deep_seeds"] * s["deep_epochs"] * batches(50000, s["deep_batch"]))],
        "06_pullbacks": [
            Probe("ResNet-56 excitation pullbacks (ascent steps)", "pullback",
                  lambda s: (nets.cifar_resnet(56), (3, 32, 32), 64, 10),
                  lambda s: len(s["measure_nets"]) * 2 * batches(s["n_measure"], 64) * 10),
            Probe("ResNet-56 deletion curves (forward)", "forward",
                  lambda s: (nets.cifar_resnet(56), (3, 32, 32), 256, 10),
                  lambda s: len(s["measure_nets"]) * 2 * s["fractions"] * batches(s["n_measure"], 256))],
        "07_projections": [
            Probe("2CONV on MNIST (book, noise and encoding networks)", "train",
                  lambda s: (nets.two_conv(), (1, 28, 28), 64, 10),
                  lambda s: (1 + s["noise_seeds"] + 2 * s["encoding_seeds"]) * s["mnist_epochs"]
                  * batches(60000, 64))],
        "08_leveling": [
            Probe("MNIST FCNN and leveling net 784-300-100", "train",
                  lambda s: (leveling.FeatureLevelingNet([784, 300, 100], 10), (1, 28, 28), 128, 10),
                  lambda s: 2 * s["mnist_seeds"] * (s["mnist_epochs"] + s["finetune"]) * batches(60000, 128)),
            Probe("CIFAR-10 leveling net", "train",
                  lambda s: (leveling.FeatureLevelingNet([3072, *s["cifar_hidden"]], 10), (3, 32, 32), 64, 10),
                  lambda s: 2 * s["cifar_epochs"] * batches(50000, 64))],
        "09_explanations": [
            Probe("ResNet-20 attributions (integrated gradients' steps)", "pullback",
                  lambda s: (nets.cifar_resnet(20), (3, 32, 32), 64, 10),
                  lambda s: len(s["methods_resnet"]) * batches(s["n"], 64) * s["ig_steps"] * s["seeds"])],
        "10_own_model": [
            Probe("ResNet-18 pullback of the photos", "pullback",
                  lambda s: (__import__("torchvision").models.resnet18(), (3, s["side"], s["side"]),
                             s["n_photos"], 1000),
                  lambda s: 1)],
    }


def time_probe(probe: Probe, sizes: dict, device: torch.device, gpu: bool) -> dict:
    from dualview import pullbacks

    model, shape, batch, classes = probe.build(sizes)
    if not gpu:
        batch = min(batch, CPU_BATCH)
    model = model.to(device=device, dtype=probe.dtype)
    x = torch.rand(batch, *shape, device=device, dtype=probe.dtype)
    y = torch.randint(0, classes, (batch,), device=device)
    if probe.kind == "train":
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    elif probe.kind == "forward":
        model.eval()

        def step():
            with torch.no_grad():
                model(x)
    else:
        model.eval()

        def step():
            pullbacks.excitation_pullback(model, x, y)
    warm, timed = (2, 5) if gpu else (1, 1)
    times = []
    for k in range(warm + timed):
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if gpu:
            torch.cuda.synchronize()
        if k >= warm:
            times.append(time.perf_counter() - start)
    per_step = statistics.median(times)
    steps = probe.steps(sizes)
    return {"loop": probe.loop, "kind": probe.kind, "batch": batch, "per_step_ms": 1000 * per_step,
            "steps": steps, "extrapolated_s": per_step * steps}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def table(rows: list[dict], device_name: str, gpu: bool) -> str:
    head = (f"# GPU check on {device_name}\n" if gpu else
            f"# GPU check without a GPU ({device_name}): CPU times at smoke scale, not estimates\n")
    lines = [head, "| chapter | smoke run | calls on the device / all | timed loops: ms per step (batch) "
             "| extrapolated full time (timed loops) | peak GPU memory | result |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        loops = "; ".join(f"{p['loop']}: {p['per_step_ms']:.1f} ms ({p['batch']})" for p in r.get("probes", []))
        full = sum(p["extrapolated_s"] for p in r.get("probes", []))
        peak = r.get("peak_mb")
        lines.append(f"| {r['chapter']} | {_duration(r.get('smoke_s'))} | {r.get('on_device', 0)} / "
                     f"{r.get('calls', 0)} | {loops or '-'} | {_duration(full) if r.get('probes') else '-'} | "
                     f"{f'{peak:,.0f} MB' if peak is not None else '-'} | "
                     f"{'ok' if r['ok'] else 'FAILED: ' + r['problem']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "_build" / "gpu-check"), help="the folder of the table")
    parser.add_argument("--chapters", nargs="*", help="chapter stems (default: all)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check (8 minutes)")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    name = torch.cuda.get_device_name(0) if gpu else "no CUDA device found"
    if not gpu:
        print("No GPU: running the same checks on the CPU at smoke scale (probe batches of at most "
              f"{CPU_BATCH}); the times are CPU times, not GPU estimates.", flush=True)
    chapters = [c for c in notebooks.chapters() if not args.chapters or c.stem in args.chapters]
    if args.chapters and len(chapters) != len(args.chapters):
        parser.error(f"unknown chapter among {args.chapters}; chapters: {[c.stem for c in notebooks.chapters()]}")
    probes, start, rows = _probes(), time.perf_counter(), []
    for chapter in chapters:
        left = args.budget - (time.perf_counter() - start)
        if left <= 0:
            rows.append({"chapter": chapter.stem, "ok": False, "problem": "not run: the time budget was spent"})
            continue
        print(f"{chapter.stem}: smoke run on {device} ...", flush=True)
        row = run_chapter(chapter, gpu, timeout=int(max(left, 30)))
        sizes = chapter_sizes(chapter, gpu)
        row["probes"] = []
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        for probe in probes.get(chapter.stem, []):
            try:
                row["probes"].append(time_probe(probe, sizes, device, gpu))
            except Exception as error:  # noqa: BLE001  (reported in the table; the check fails)
                row["ok"], row["problem"] = False, row["problem"] or f"probe {probe.loop!r}: {error!r}"[:300]
        peaks = [p for p in (row.get("smoke_peak_mb"), torch.cuda.max_memory_allocated() / 2**20 if gpu else None)
                 if p is not None]
        row["peak_mb"] = max(peaks) if peaks else None
        print(f"  {'ok' if row['ok'] else 'FAILED: ' + row['problem']} ({_duration(row['smoke_s'])})", flush=True)
        rows.append(row)
    elapsed = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = table(rows, name, gpu) + f"\nWhole check: {_duration(elapsed)} (budget {_duration(args.budget)}).\n"
    (out / "gpu_check.md").write_text(text)
    (out / "gpu_check.json").write_text(json.dumps({"device": name, "gpu": gpu, "seconds": elapsed,
                                                    "rows": rows}, indent=1))
    print(text)
    print(f"The table is in {out / 'gpu_check.md'}")
    failed = [r["chapter"] for r in rows if not r["ok"]]
    if elapsed > args.budget:
        print(f"The check took {_duration(elapsed)}, over its budget of {_duration(args.budget)}.")
        return 1
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
