"""Keep what nbval executes: each chapter runs once, and its outputs go into the book.

nbval (``pytest --nbval-lax _build/nbtest``) executes every cell of a prepared chapter in a kernel
and compares the cells tagged ``nbval-check-output`` with their reference outputs. These hooks
collect the outputs nbval received for every cell and, at the end of the session, write each
executed chapter to ``_build/executed/`` (the copy ``scripts/notebooks.py stage`` hands to
jupyter-book) and print how long each chapter took, under which CPU configuration. Smoke runs
(``_build/smoke``: the gpu profile's code path at tiny sizes) are timed but not kept.

They also sort nbval's failures into two kinds and write them to ``_build/executed/status.json``
(read by ``scripts/notebooks.py report``, which ``make book`` runs): a checked cell whose output
differs from its reference (nbval's "Cell outputs differ": the book can still be built from this
run's outputs; ``make test`` fails) and a cell that failed (an assert, an exception, a timeout, a
dead kernel: nothing is built).

With pytest-xdist (``make`` runs ``-n <cores> --dist loadfile``: each chapter runs whole in one worker),
every worker writes its chapters and a part of the status (``status-<worker>.json``); the controller
merges the parts into ``status.json`` and prints the times. The chapters are collected longest first
(the order of ``LONGEST_FIRST``), so the longest one does not start last.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

# The chapters' kernels inherit this process's environment: a non-interactive MPLBACKEND (e.g. Agg)
# would stop figures from being displayed, so they would be missing from the book.
os.environ.pop("MPLBACKEND", None)

ROOT = Path(__file__).resolve().parent
NBTEST, SMOKE = ROOT / "_build" / "nbtest", ROOT / "_build" / "smoke"
ROBUST = ROOT / "_build" / "robust"  # make robustness: the chapters under SEED = N in _build/robust/seed<N>
STATUS = ROOT / "_build" / "executed" / "status.json"
CLAIMS = ROOT / "_build" / "claims"  # every run's claims: <run>/<chapter>.json (scripts/notebooks.py claims)
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set in an xdist worker process, None otherwise
# the chapters' kernels inherit this environment: dualview.stats.claim appends each claim to this file, and
# the hooks below move the new lines to the cell that made them after every cell
CLAIMS_LOG = CLAIMS / f"log-{WORKER or 'main'}-{os.getpid()}.jsonl"
os.environ["DUALVIEW_CLAIMS"] = str(CLAIMS_LOG)
# chapters in decreasing execution time (cpu profile, measured): scheduled first, so two workers finish together
LONGEST_FIRST = ("09_", "02_", "05_", "08_", "07_", "04_", "03_", "06_", "01_")
CPU_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")
OUTPUTS_DIFFER = "Cell outputs differ"  # nbval's NbCellError message for a checked output that differs
_executed: dict[Path, dict] = {}


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


def _entry(item) -> dict:
    path = Path(str(item.parent.fspath))
    return _executed.setdefault(path, {"nb": item.parent.nb, "outputs": {}, "seconds": 0.0,
                                       "mismatches": [], "errors": [], "claims": []})


def _new_claims() -> list[dict]:
    """The claims the kernels appended to CLAIMS_LOG since the last call (the file is emptied)."""
    if not CLAIMS_LOG.exists():
        return []
    lines = CLAIMS_LOG.read_text(encoding="utf-8").splitlines()
    CLAIMS_LOG.write_text("", encoding="utf-8")
    return [json.loads(line) for line in lines if line.strip()]


def _first_line(item) -> str:
    lines = [line for line in str(item.cell.source).strip().splitlines() if line.strip()]
    return lines[0] if lines else "(empty cell)"


def _part(worker: str) -> Path:
    return STATUS.with_name(f"status-{worker}.json")


def _is_controller(config) -> bool:
    return WORKER is None and bool(getattr(config.option, "numprocesses", None))


def pytest_sessionstart(session):
    CLAIMS.mkdir(parents=True, exist_ok=True)
    CLAIMS_LOG.write_text("", encoding="utf-8")
    if _is_controller(session.config):  # parts left by an earlier run are not this run's
        for part in STATUS.parent.glob("status-*.json"):
            part.unlink()
        STATUS.unlink(missing_ok=True)


def _rank(item) -> tuple:
    if not _is_nbval_cell(item):
        return (2,)
    path = Path(str(item.parent.fspath)).resolve()
    stem = path.name
    order = next((k for k, prefix in enumerate(LONGEST_FIRST) if stem.startswith(prefix)), len(LONGEST_FIRST))
    return (0 if path.is_relative_to(NBTEST) else 1, order)


def pytest_collection_modifyitems(session, config, items):
    if any(_is_nbval_cell(item) for item in items):
        items.sort(key=_rank)  # stable: the cells of a chapter keep their order


def pytest_collection_finish(session):
    if any(_is_nbval_cell(item) for item in session.items):
        STATUS.unlink(missing_ok=True)  # a session that stops before its end leaves no status behind


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _is_nbval_cell(item):
        _new_claims()  # what a unit test of this worker recorded is not this cell's
    start = time.perf_counter()
    yield
    if _is_nbval_cell(item):
        entry = _entry(item)
        entry["outputs"][item.cell_num] = list(getattr(item, "test_outputs", []) or [])
        entry["seconds"] += time.perf_counter() - start
        entry["claims"] += [{**c, "cell": item.cell_num} for c in _new_claims()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not _is_nbval_cell(item) or not (report.failed or (report.skipped and hasattr(report, "wasxfail"))):
        return
    # a cell after a timeout is xfailed by nbval: the chapter did not run, so it counts as failed
    exc = call.excinfo.value if call.excinfo is not None else None
    cell = {"cell": item.cell_num, "first_line": _first_line(item)}
    if report.when == "call" and type(exc).__name__ == "NbCellError" and str(exc) == OUTPUTS_DIFFER:
        _entry(item)["mismatches"].append(cell)
    else:
        message = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else report.outcome
        if exc is not None and getattr(exc, "inner_traceback", None):
            tail = [line for line in exc.inner_traceback.strip().splitlines() if line.strip()]
            message += ": " + _plain(tail[-1]) if tail else ""
        _entry(item)["errors"].append({**cell, "message": f"{message} ({report.when})"})


def _plain(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # a traceback from the kernel carries terminal colours


def cpu_configuration() -> dict:
    """This process's torch kernels, the variables that choose them and its thread count; the chapters'
    kernels inherit this environment (PyTorch reads the variables at its first use in each process)."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            **{name: os.environ.get(name) for name in CPU_VARIABLES}, "torch_threads": torch.get_num_threads()}


def _describe(config: dict) -> str:
    variables = " ".join(f"{k}={config[k] if config[k] is not None else '(unset)'}" for k in CPU_VARIABLES)
    return f"torch kernels {config['cpu_capability']}, {config['torch_threads']} torch thread(s); {variables}"


def _recorded() -> str:
    path = ROOT / "tests" / "reference" / "recorded-with.json"
    if not path.exists():
        return "tests/reference/recorded-with.json is missing"
    recorded = json.loads(path.read_text())
    return f"references recorded with {recorded.get('cpu_capability')}, {recorded.get('torch_threads')} thread(s)"


def pytest_sessionfinish(session, exitstatus):
    CLAIMS_LOG.unlink(missing_ok=True)
    if _is_controller(session.config):
        _merge_parts(session, exitstatus)
        return
    if not _executed:
        return
    import nbformat

    config = cpu_configuration()
    runs: dict[str, list[str]] = {}
    status = {"exitstatus": int(exitstatus), "configuration": config, "chapters": {}, "runs": runs}
    for path, entry in _executed.items():
        nb = entry["nb"]
        code_cells = [c for c in nb.cells if c.cell_type == "code"]
        for k, cell in enumerate(code_cells):
            outs = entry["outputs"].get(k)
            cell.outputs = outs if outs is not None else []
            cell.execution_count = k + 1 if outs is not None else None
        path = path.resolve()
        if path.is_relative_to(SMOKE):  # a smoke run tests the gpu profile's code path; the book shows the cpu run
            rel, run = path.relative_to(SMOKE), "gpu profile, smoke scale"
        elif path.is_relative_to(ROBUST):  # another seed: its claims are reported, the book keeps its own run
            seed_dir = path.relative_to(ROBUST).parts[0]
            rel, run = path.relative_to(ROBUST / seed_dir), f"cpu profile, SEED = {seed_dir[4:]}"
            _write_claims(f"{seed_dir}", rel, entry["claims"])
            dest = ROOT / "_build" / "robust-executed" / seed_dir / rel  # to read, not for the book
            dest.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, dest)
        else:
            rel = path.relative_to(NBTEST) if path.is_relative_to(NBTEST) else Path(path.name)
            dest = ROOT / "_build" / "executed" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, dest)
            run = "cpu profile"
            _write_claims("book run", rel, entry["claims"])
        name = rel.as_posix() + (" (smoke)" if run.startswith("gpu") else "")
        status["chapters"][name] = {"run": run, "seconds": round(entry["seconds"], 1),
                                    "mismatches": entry["mismatches"], "errors": entry["errors"]}
        state = ("FAILED" if entry["errors"] else
                 f"{len(entry['mismatches'])} checked output(s) differ" if entry["mismatches"] else "ok")
        runs.setdefault(run, []).append(f"  {rel.as_posix():40s} {entry['seconds']:7.1f} s  {state}")
    STATUS.parent.mkdir(parents=True, exist_ok=True)
    if WORKER is not None:  # the controller merges the workers' parts
        _part(WORKER).write_text(json.dumps(status, indent=1) + "\n")
        return
    STATUS.write_text(json.dumps(status, indent=1) + "\n")
    _print_times(session, status)


def _write_claims(run: str, rel: Path, claims: list[dict]) -> None:
    out = CLAIMS / run / (rel.with_suffix(".json").as_posix().replace("/", "__"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{**c, "chapter": rel.as_posix()} for c in claims], indent=1) + "\n")


def _print_times(session, status: dict) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    workers = status.get("workers", 1)
    for run, lines in status["runs"].items():
        reporter.write_sep("=", f"chapter execution times ({run})")
        where = f", {workers} chapters at a time" if workers > 1 else ""
        reporter.write_line(f"  run with {_describe(status['configuration'])}{where} ({_recorded()})")
        for line in sorted(lines):
            reporter.write_line(line)


def _merge_parts(session, exitstatus) -> None:
    parts = [json.loads(p.read_text()) for p in sorted(STATUS.parent.glob("status-*.json"))]
    if not parts:
        return
    runs: dict[str, list[str]] = {}
    status = {"exitstatus": int(exitstatus), "configuration": parts[0]["configuration"], "chapters": {},
              "runs": runs, "workers": len(parts)}
    for part in parts:
        status["chapters"].update(part["chapters"])
        for run, lines in part["runs"].items():
            runs.setdefault(run, []).extend(lines)
    STATUS.write_text(json.dumps(status, indent=1) + "\n")
    _print_times(session, status)
