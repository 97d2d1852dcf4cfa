"""Keep what nbval executes: each chapter runs once, and its outputs go into the book.

nbval (``pytest --nbval-lax _build/nbtest``) executes every cell of a prepared chapter in a kernel
and compares the cells tagged ``nbval-check-output`` with their reference outputs. These hooks
collect the outputs nbval received for every cell and, at the end of the session, write each
executed chapter to ``_build/executed/`` (the copy ``scripts/notebooks.py stage`` hands to
jupyter-book) and print how long each chapter took. Smoke runs (``_build/smoke``: the gpu profile's
code path at tiny sizes) are timed but not kept.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# The chapters' kernels inherit this process's environment: a non-interactive MPLBACKEND (e.g. Agg)
# would stop figures from being displayed, so they would be missing from the book.
os.environ.pop("MPLBACKEND", None)

ROOT = Path(__file__).resolve().parent
NBTEST, SMOKE = ROOT / "_build" / "nbtest", ROOT / "_build" / "smoke"
_executed: dict[Path, dict] = {}


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    start = time.perf_counter()
    yield
    if _is_nbval_cell(item):
        path = Path(str(item.parent.fspath))
        entry = _executed.setdefault(path, {"nb": item.parent.nb, "outputs": {}, "seconds": 0.0, "failed": False})
        entry["outputs"][item.cell_num] = list(getattr(item, "test_outputs", []) or [])
        entry["seconds"] += time.perf_counter() - start


def pytest_runtest_logreport(report):
    if report.when == "call" and report.failed:
        for path, entry in _executed.items():
            if str(path) in report.nodeid or path.name in report.nodeid:
                entry["failed"] = True


def pytest_sessionfinish(session, exitstatus):
    if not _executed:
        return
    import nbformat

    runs: dict[str, list[str]] = {}
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
        else:
            rel = path.relative_to(NBTEST) if path.is_relative_to(NBTEST) else Path(path.name)
            dest = ROOT / "_build" / "executed" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, dest)
            run = "cpu profile"
        status = "FAILED" if entry["failed"] else "ok"
        runs.setdefault(run, []).append(f"  {rel.as_posix():40s} {entry['seconds']:7.1f} s  {status}")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for run, lines in runs.items():
            reporter.write_sep("=", f"chapter execution times ({run})")
            for line in lines:
                reporter.write_line(line)
