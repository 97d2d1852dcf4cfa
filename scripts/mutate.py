"""Mutation check: do the unit tests catch plausible one-line mistakes in the library?

Each mutant below is one small edit of ``src/dualview`` that a developer could make by accident (a changed
comparison, a flipped sign, an ignored argument, a wrong default). For each, the library is copied to a
temporary folder, the edit is applied there (the working tree is never touched), and the tests that
cover the module run against the copy (``PYTHONPATH`` puts it ahead of the installed package). A mutant
is *killed* when the tests fail, *survives* when they pass. Every mutant should be killed.

    python scripts/mutate.py            # all mutants          (make mutants)
    python scripts/mutate.py --list     # what they are
    python scripts/mutate.py -k stats   # only those whose name contains "stats"

A mutant whose text is no longer found in the source is reported as "stale" (update it after a refactor):
the script fails then too, so the list cannot silently rot.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "dualview"


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str        # file under src/dualview
    old: str           # exact text, found exactly once
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant("gates: gate on at q = 0", "gates/rules.py",
           "return {k: q > 0 for k, q in self.preactivations.items()}",
           "return {k: q >= 0 for k, q in self.preactivations.items()}",
           ("tests/test_gates.py", "tests/test_paths.py")),
    Mutant("gates: hooks kept after a BaseException", "gates/instrument.py",
           "        yield\n    finally:\n        for h in handles:\n            h.remove()\n",
           "        yield\n    except Exception:\n        for h in handles:\n            h.remove()\n        raise\n"
           "    else:\n        for h in handles:\n            h.remove()\n    finally:\n",
           ("tests/test_gates.py",)),
    Mutant("gates: in-place ReLU input not kept", "gates/instrument.py",
           "captured[id(mod)] = args[0].clone()", "captured[id(mod)] = args[0]",
           ("tests/test_gates.py",)),
    Mutant("gates: guard on in the whole block", "gates/instrument.py",
           "        _INSTRUMENTED.update(model.modules())\n        yield\n",
           "        _INSTRUMENTED.update(model.modules())\n        with guard:\n            yield\n",
           ("tests/test_gates.py",)),
    Mutant("paths: activity read off the features", "paths/features.py",
           "act = _outer([torch.ones_like(vecs[0])] + vecs[1:])[:, _valid_path_mask(layers)]",
           "act = _outer(vecs)[:, _valid_path_mask(layers)] != 0",
           ("tests/test_paths.py",)),
    Mutant("surrogates: soft gates without the sigmoid", "surrogates.py",
           "return {k: torch.sigmoid(q / t) for k, q in preactivations.items()}",
           "return {k: q / t for k, q in preactivations.items()}",
           ("tests/test_surrogates.py",)),
    Mutant("paths: features lose their sign", "paths/features.py",
           "        phi = _outer(vecs)\n", "        phi = _outer(vecs).abs()\n",
           ("tests/test_paths.py",)),
    Mutant("npk_conv: rotation in the other direction", "npk_conv.py",
           "shifts=tuple(-k for k in rs)", "shifts=tuple(k for k in rs)",
           ("tests/test_rotation_ensemble.py", "tests/test_kernels.py")),
    Mutant("stats: t quantile with n degrees of freedom", "stats.py",
           "t.ppf((1 + level) / 2, x.size - 1)", "t.ppf((1 + level) / 2, x.size)",
           ("tests/test_stats.py",)),
    Mutant("stats: Wilson centre term", "stats.py",
           "centre = (p + z * z / (2 * n)) / (1 + z * z / n)", "centre = (p + z * z / n) / (1 + z * z / n)",
           ("tests/test_stats.py",)),
    Mutant("stats: bootstrap lower quantile", "stats.py",
           "np.quantile(means, [(1 - level) / 2, (1 + level) / 2])",
           "np.quantile(means, [(1 - level), (1 + level) / 2])",
           ("tests/test_stats.py",)),
    Mutant("stats: paired difference reversed", "stats.py",
           "    d = xa - xb\n", "    d = xb - xa\n", ("tests/test_stats.py",)),
    Mutant("stats: two-way bootstrap ignores the seeds", "stats.py",
           "row_counts, col_counts = counts(b, s), counts(b, n)",
           "row_counts, col_counts = np.ones((b, s)), counts(b, n)", ("tests/test_stats.py",)),
    Mutant("projections: q = 0 counted as active in Insens", "projections/switched.py",
           "inactive = {k: (q[k] <= 0) & (sq[k] > tiny) for k in names}",
           "inactive = {k: (q[k] < 0) & (sq[k] > tiny) for k in names}",
           ("tests/test_projections.py",)),
    Mutant("receptive_fields: padding ignored", "receptive_fields.py",
           "start = [start[a] - pad[a] * jump[a] for a in range(2)]", "start = [start[a] - pad[a] for a in range(2)]",
           ("tests/test_projections.py",)),
    Mutant("receptive_fields: gates skipped in the fast path", "receptive_fields.py",
           "return t.mul_(g) if t.shape[3] == n and t.is_contiguous() else t * g", "return t",
           ("tests/test_projections.py", "tests/test_receptive_fields.py")),
    Mutant("receptive_fields: max-pool winners not gated", "receptive_fields.py",
           "scale = torch.ones((), dtype=t.dtype, device=t.device) if gate is None else \\",
           "scale = torch.ones((), dtype=t.dtype, device=t.device) if True else \\",
           ("tests/test_projections.py", "tests/test_receptive_fields.py")),
    Mutant("projections: switched bias at input 1", "projections/switched.py",
           "q0 = frozen_preactivations(model, torch.zeros_like(x), rec.gates, rec.pool_indices)",
           "q0 = frozen_preactivations(model, torch.ones_like(x), rec.gates, rec.pool_indices)",
           ("tests/test_projections.py",)),
    Mutant("leveling: L0 penalty with the wrong sign", "leveling.py",
           "return torch.stack([g.expected_l0() for g in self.routing]).mean()",
           "return -torch.stack([g.expected_l0() for g in self.routing]).mean()",
           ("tests/test_leveling.py",)),
    Mutant("leveling: fine-tuning keeps sampling the routing gates", "leveling.py",
           "return net(x) if epoch < epochs else net(x, routing=net.routing_gates())", "return net(x)",
           ("tests/test_leveling.py",)),
    Mutant("leveling: train.fit adds the penalty without its weight", "train.py",
           "objective = loss + weight * pen", "objective = loss + pen",
           ("tests/test_train.py", "tests/test_leveling.py")),
    Mutant("leveling: IXOR labels ignore x3", "data/tables.py",
           "y = ((x[:, 0] * x[:, 1] > 0) & (x[:, 2] > 0.5)).long()", "y = (x[:, 0] * x[:, 1] > 0).long()",
           ("tests/test_data.py",)),
    Mutant("dgn: gate-layer permutation ignored", "dgn/networks.py",
           "return [self.gate(q[i]) for i in self.permutation]", "return [self.gate(q[i]) for i in range(len(q))]",
           ("tests/test_dgn.py",)),
    Mutant("dgn: soft gates at the inverse temperature", "dgn/networks.py",
           "torch.sigmoid(q * (1 / self.temperature))", "torch.sigmoid(q * self.temperature)",
           ("tests/test_dgn.py",)),
    Mutant("surrogates: max-pool surrogate off by default", "surrogates.py",
           "self.pool_temperature = self.temperature if pool_temperature is None else",
           "self.pool_temperature = 0.0 if pool_temperature is None else",
           ("tests/test_pullbacks.py",)),
    Mutant("data: MNIST labels shifted by one", "data/files.py",
           "torch.from_numpy(labels.copy())", "torch.from_numpy(labels.copy()).roll(1)",
           ("tests/test_data.py",)),
    Mutant("train: accuracy compares against shuffled labels", "train.py",
           "(predict(model, x, batch_size).argmax(1) == y)", "(predict(model, x, batch_size).argmax(1) == y.roll(1))",
           ("tests/test_train.py", "tests/test_leveling.py", "tests/test_dgn.py", "tests/test_zoo.py")),
    Mutant("nets: Normalize divides by the variance", "nets.py",
           "return (x - self.mean) / self.std", "return (x - self.mean) / self.std ** 2",
           ("tests/test_zoo.py",)),
]


def run(mutant: Mutant, timeout: int) -> tuple[str, float, str]:
    source = (SRC / mutant.module).read_text()
    if source.count(mutant.old) != 1:
        return "stale", 0.0, f"the text to mutate occurs {source.count(mutant.old)} times in {mutant.module}"
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        shutil.copytree(SRC, Path(tmp) / "dualview")
        (Path(tmp) / "dualview" / mutant.module).write_text(source.replace(mutant.old, mutant.new))
        env = dict(os.environ, PYTHONPATH=tmp + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   HYPOTHESIS_PROFILE=os.environ.get("HYPOTHESIS_PROFILE", "ci"))
        probe = subprocess.run([sys.executable, "-c", "import dualview; print(dualview.__file__)"], cwd=ROOT,
                               env=env, capture_output=True, text=True)
        if not probe.stdout.startswith(tmp):
            return "error (copy not imported)", 0.0, probe.stdout.strip() + probe.stderr.strip()[-200:]
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed (timeout)", time.perf_counter() - start, ""
        seconds = time.perf_counter() - start
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        if proc.returncode == 0:
            return "SURVIVED", seconds, last
        if proc.returncode in (1,):
            return "killed", seconds, last
        return f"error (pytest exit {proc.returncode})", seconds, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only mutants whose name contains this text")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutant")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if args.k.lower() in m.name.lower()]
    if args.list:
        for m in chosen:
            print(f"{m.name:55s} {m.module:15s} {' '.join(m.tests)}")
        return
    import dualview  # the copy must shadow the installed package, or the check means nothing

    if Path(dualview.__file__).resolve().parent != SRC.resolve():
        sys.exit(f"dualview is imported from {dualview.__file__}, not from {SRC}: install with pip install -e .")
    results = []
    for m in chosen:
        status, seconds, last = run(m, args.timeout)
        results.append(status)
        print(f"{status:18s} {seconds:6.1f} s  {m.name}  [{last}]", flush=True)
    killed = sum(s.startswith("killed") for s in results)
    others = ", ".join(f"{results.count(s)} {s}" for s in sorted(set(results)) if not s.startswith("killed"))
    print(f"\n{killed} of {len(results)} mutants killed" + (f" ({others})" if others else ""))
    if killed != len(results):
        sys.exit(1)


if __name__ == "__main__":
    main()
