"""The chapters prepared for testing (parameters injected, reference outputs attached for nbval), new
references recorded from the executed chapters, and the report of the last execution."""
from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import jupytext
import nbformat

from .book import RECORDED_WITH, REFERENCES, ROOT, Build, chapters, executed_copy
from .cpu import cpu_configuration, describe

CHECK_TAG = "nbval-check-output"


def code_tokens(source: str) -> str:
    """The cell's Python tokens without comments, line breaks, indentation and trailing commas: re-wrapping
    or re-commenting a cell keeps its key (its outputs cannot change), changing its code does not. Source
    that does not tokenize (e.g. an IPython magic) is keyed by its text without whitespace."""
    import io
    import tokenize

    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    try:
        tokens = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "".join(source.split())
    # a trailing comma before a closing bracket (a formatter adds it when it splits a call) changes nothing
    return " ".join(t for t, after in zip(tokens, tokens[1:] + [""]) if not (t == "," and after in ")]}"))


def cell_key(source: str) -> str:
    return hashlib.sha1(code_tokens(source).encode()).hexdigest()[:16]


def reference_file(chapter: Path) -> Path:
    return REFERENCES / f"{chapter.stem}.json"


def checked_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and CHECK_TAG in c.metadata.get("tags", [])]


def prepare(profile: str, record: bool, scale: str = "full", seed: int | None = None, *, build: Build,
            only: Sequence[Path] = ()) -> None:
    from papermill.parameterize import parameterize_notebook

    smoke = scale == "smoke"
    robust = seed is not None  # another training draw: executed, its claims reported, nothing compared
    parameters = {"PROFILE": profile, **({"SCALE": scale} if smoke else {}), **({"SEED": seed} if robust else {})}
    problems = []
    for ch in chapters(only):
        nb = jupytext.read(ch)
        for cell in nb.cells:
            cell.metadata.setdefault("tags", [])  # papermill looks up tags on every cell
        nb.metadata.setdefault("papermill", {})
        nb = parameterize_notebook(nb, parameters, kernel_name="python3", language="python")
        for cell in nb.cells:  # the injected copy of the parameters is not for readers
            if "injected-parameters" in cell.metadata.tags:
                cell.metadata.tags.append("remove-cell")
        refs = {} if record else json.loads(reference_file(ch).read_text()) if reference_file(ch).exists() else {}
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        for cell in checked_cells(nb):
            if smoke or robust:  # a smoke run's or another seed's numbers are not the book's: not compared
                cell.metadata.tags.remove(CHECK_TAG)
                continue
            if record:
                continue
            key = cell_key(cell.source)
            if key not in refs:
                problems.append(f"{ch.relative_to(ROOT)}: no reference output for the checked cell\n    "
                                + cell.source.strip().splitlines()[0])
                continue
            cell.outputs = [nbformat.from_dict(o) for o in refs[key]]
            cell.execution_count = 1
        folder = build.smoke if smoke else build.robust / f"seed{seed}" if robust else build.nbtest
        out = folder / ch.relative_to(ROOT).with_suffix(".ipynb")
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
    if problems:
        sys.exit("Reference outputs are missing (a checked cell is new or its code changed).\n"
                 "Execute the chapters with `make references` and review the diff of tests/reference/.\n"
                 + "\n".join(problems))


def strip_images(output: dict) -> dict:
    out = copy.deepcopy(output)
    for key in list(out.get("data", {})):
        if key.startswith("image/"):
            out["data"][key] = ""  # nbval never compares images; keep the key so fields match
    out.pop("execution_count", None)
    return out


def record(*, build: Build, only: Sequence[Path] = ()) -> None:
    REFERENCES.mkdir(parents=True, exist_ok=True)
    for ch in chapters(only):
        executed = executed_copy(build.executed, ch)
        if not executed.exists():
            sys.exit(f"{executed} does not exist: execute the chapters first (make notebooks)")
        nb = nbformat.read(executed, as_version=4)
        refs = {cell_key(c.source): [strip_images(o) for o in c.outputs] for c in checked_cells(nb)}
        reference_file(ch).write_text(json.dumps(refs, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(refs)} reference outputs for {ch.relative_to(ROOT)}")
    config = cpu_configuration()
    RECORDED_WITH.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    print(f"recorded with {describe(config)} on {config['cpu']}: {RECORDED_WITH.relative_to(ROOT)}")


def report(status_file: Path) -> None:
    """Print what the last execution of the chapters left in ``status_file``; exit 1 if a cell failed."""
    if not status_file.exists():
        sys.exit(f"{status_file.relative_to(ROOT)} does not exist: the chapters' execution did not finish")
    status = json.loads(status_file.read_text())
    mismatches = [(name, cell) for name, ch in status["chapters"].items() for cell in ch["mismatches"]]
    errors = [(name, cell) for name, ch in status["chapters"].items() for cell in ch["errors"]]
    if mismatches:
        print(f"{len(mismatches)} checked output(s) differ from tests/reference/ (`make test` fails on them; "
              "the book shows this run's outputs):")
        for name, cell in mismatches:
            print(f"  {name}, cell {cell['cell']}: {cell['first_line']}")
        print("If the change is intended, re-record with `make references` and review the diff of tests/reference/.")
    if errors:
        print(f"{len(errors)} cell(s) failed (an assert, an exception or a timeout); the book is not built:")
        for name, cell in errors:
            print(f"  {name}, cell {cell['cell']}: {cell['first_line']}\n      {cell['message']}")
    if status.get("exitstatus", 0) not in (0, 1) or (status.get("exitstatus") == 1 and not (mismatches or errors)):
        errors.append(None)
        print(f"pytest ended with exit status {status.get('exitstatus')} (see its output above)")
    sys.exit(1 if errors else 0)
