"""The checked outputs of the chapters (tests/reference/<chapter>.json) hold only machine-independent text.

nbval compares a checked cell's output with its reference as text, so a reference must read the same on
every CPU, kernel set and thread count (DESIGN.md, "Tests and CI"). The rules, for every reference file and
every chapter book/<chapter>.md (cells keyed by ``scripts/notebooks.py``'s ``_cell_key``):

(a) every reference belongs to a checked cell of the chapter (``nbval-check-output``), and every checked cell
    has a reference; otherwise the reference is stale (re-record with ``make references``);
(b) no checked output carries glued values (mime type ``application/papermill.record/...``): a glued number
    is a measured number;
(c) the numbers rule: in every text of every output (stream text, every ``text/*`` representation, an
    error's name and value), integers (digits, optionally with thousands commas: ``1,701``) are allowed;
    any other number (with a decimal point or an exponent: ``39.7``, ``0.98``, ``3.3e-16``, ``2.1e+12``)
    is allowed only if
      (i) it is a threshold: directly preceded on its line (spaces allowed) by a comparison, one of
          ``<  >  <=  >=  ≤  ≥  below  above  under  at least  at most  within``, as in "error below 1e-12", or
      (ii) its value equals (relative 1e-9, sign ignored) a numeric literal in the cell's source or in the
          chapter's ``parameters`` cell: a constant the code states, such as a temperature 0.15, or 1e-8
          printed as 1e-08;
    a measured number belongs in a cell that is not checked, and is checked in code with a tolerance;
(d) no absolute machine path in a checked output (/home/, /root/, /work/, /tmp/, the repository's root, the
    data directory $DUALVIEW_DATA): print paths relative to the data directory.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "tests" / "reference"
_spec = importlib.util.spec_from_file_location("book_notebooks", ROOT / "scripts" / "notebooks.py")
notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks)

ADVICE = ("a measured number belongs in a cell that is not checked, and is checked in code with a tolerance "
          "(an assert, or stats.claim); a checked cell prints only what every machine prints "
          "(DESIGN.md, 'Tests and CI')")

# a number in printed text: optional sign, integer part (thousands commas allowed) or none (.5), decimals,
# exponent; not inside a word or another number (a version such as 2.14.1 is no number)
NUMBER = re.compile(r"""
    (?<![\w.])
    [-+]?
    (?: \d{1,3}(?:,\d{3})+(?!\d) | \d+ | (?=\.\d) )
    (?: \.\d+ )?
    (?: [eE][-+]?\d+ )?
    (?!\.?\d)
""", re.X)
# a numeric literal in a cell's source (Python: underscores, no thousands commas)
LITERAL = re.compile(r"(?<![\w.])(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
# a comparison that makes the number after it a threshold ("->" is an arrow, not ">")
THRESHOLD = re.compile(r"(?:<=|>=|≤|≥|<|(?<!-)>|\bbelow|\babove|\bunder|\bat least|\bat most|\bwithin)\s*$")


def is_integer(token: str) -> bool:
    return not re.search(r"[.eE]", token)


def source_literals(source: str) -> list[float]:
    return [float(m.replace("_", "")) for m in LITERAL.findall(source)]


def offending_numbers(text: str, source: str = "") -> list[tuple[str, str]]:
    """The numbers of ``text`` that the numbers rule (c) forbids: (number, its line)."""
    literals = source_literals(source)
    found = []
    for line in text.splitlines():
        for match in NUMBER.finditer(line):
            token = match.group()
            if is_integer(token) or THRESHOLD.search(line[:match.start()]):
                continue
            value = abs(float(token.replace(",", "")))
            if any(math.isclose(value, lit, rel_tol=1e-9, abs_tol=0.0) for lit in literals):
                continue
            found.append((token, line.strip()))
    return found


def output_texts(output: dict) -> list[str]:
    """Every text an output shows: stream text, each text/* representation, an error's name and value."""
    texts = []
    if output.get("output_type") == "stream":
        texts.append(output.get("text", ""))
    for mime, value in (output.get("data") or {}).items():
        if mime.startswith("text/"):
            texts.append(value if isinstance(value, str) else "".join(value))
    if output.get("output_type") == "error":
        texts += [output.get("ename", ""), output.get("evalue", "")]
    return [t if isinstance(t, str) else "".join(t) for t in texts]


def machine_paths() -> list[str]:
    paths = ["/home/", "/root/", "/work/", "/tmp/", str(ROOT)]
    if os.environ.get("DUALVIEW_DATA"):
        paths.append(str(Path(os.environ["DUALVIEW_DATA"]).expanduser()))
        paths.append(str(Path(os.environ["DUALVIEW_DATA"]).expanduser().resolve()))
    return paths


def _first_line(source: str) -> str:
    return next((line for line in source.strip().splitlines() if line.strip()), "(empty cell)")


def reference_files() -> list[Path]:
    return sorted(p for p in REFERENCES.glob("*.json") if p.name != notebooks.RECORDED_WITH.name)


def checked_chapters() -> list[Path]:
    """Every chapter with a reference file or a checked cell."""
    names = {p.stem for p in reference_files()}
    names |= {p.stem for p in (ROOT / "book").glob("*.md")
              if notebooks.is_notebook(p) and notebooks._checked_cells(jupytext.read(p))}
    return [ROOT / "book" / f"{name}.md" for name in sorted(names)]


def parameters_source(chapter: Path) -> str:
    """The source of the chapter's ``parameters`` cell (its constants may appear in checked outputs)."""
    return "\n".join(c.source for c in jupytext.read(chapter).cells
                     if c.cell_type == "code" and "parameters" in c.metadata.get("tags", []))


def _checked(chapter: Path) -> tuple[dict, dict]:
    """The chapter's checked cells' sources and its references, both by cell key."""
    cells = {notebooks._cell_key(c.source): c.source for c in notebooks._checked_cells(jupytext.read(chapter))}
    ref = notebooks._reference_file(chapter)
    return cells, (json.loads(ref.read_text()) if ref.exists() else {})


CHAPTERS = checked_chapters()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_references_match_checked_cells(chapter):
    assert chapter.exists(), f"tests/reference/{chapter.stem}.json is stale: book/{chapter.name} does not exist"
    cells, refs = _checked(chapter)
    problems = [f"stale reference: the checked cell '{_first_line(src)}' has none"
                for key, src in cells.items() if key not in refs]
    problems += [f"stale reference {key}: no checked cell has this source (changed, gone or no longer checked); "
                 "its output begins " + repr(_first_line("".join(o.get("text", "") for o in outs) or "(no text)"))
                 for key, outs in refs.items() if key not in cells]
    assert not problems, (f"book/{chapter.name}: references out of date; re-record with `make references`:\n  "
                          + "\n  ".join(problems))


def chapter_offences(chapter: Path) -> list[str]:
    """Every breach of rules (b), (c) and (d) in the chapter's references, one line each."""
    cells, refs = _checked(chapter)
    paths, offences, parameters = machine_paths(), [], parameters_source(chapter)
    for key, outputs in refs.items():
        source = cells.get(key, "")
        where = f"book/{chapter.name}, cell '{_first_line(source) if source else key}'"
        for output in outputs:
            glued = [m for m in (output.get("data") or {}) if m.startswith("application/papermill.record")]
            if glued:
                offences.append(f"{where}: glued value(s) {glued} in a checked output (a glued number is measured)")
            for text in output_texts(output):
                by_line: dict[str, list[str]] = {}
                for number, line in offending_numbers(text, source + "\n" + parameters):
                    by_line.setdefault(line, []).append(number)
                offences += [f"{where}: {', '.join(numbers)} in {line!r}" for line, numbers in by_line.items()]
                for path in paths:
                    for line in text.splitlines():
                        if path in line:
                            offences.append(f"{where}: machine path {path} in {line.strip()!r}")
    return offences


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_checked_outputs_are_machine_independent(chapter):
    offences = chapter_offences(chapter)
    assert not offences, (f"{len(offences)} line(s) with machine-dependent values in checked outputs; {ADVICE}:\n  "
                          + "\n  ".join(offences))


@pytest.mark.parametrize("text, source, allowed", [
    ("relative error 3.3e-16", "", False),
    ("relative error below 1e-12: True", "", True),
    ("|error| <1e-12", "", True),
    ("error <= 0.01 on every point", "", True),
    ("paths 1,701", "", True),
    ("tau = 0.15", "tau = 0.15", True),
    ("tau = 0.15", "", False),
    ("threshold 1e-08", "eps = 1e-8", True),
    ("weight -1.5", "w = torch.tensor([3.0, -1.5])", True),
    ("39.7 points [32.5, 45.0]", "", False),
    ("accuracy 0.98", "", False),
    ("paths 2.1e+12", "", False),
    ("speed-up 1.5x", "", False),
    ("gates -> 0.5", "", False),
    ("torch 2.14.1, 3 layers, conv1 (20×24×24)", "", True),
])
def test_numbers_rule(text, source, allowed):
    assert (offending_numbers(text, source) == []) is allowed


def test_numbers_rule_names_the_number_and_its_line():
    assert offending_numbers("seeds 5\nmean 39.7 points\n") == [("39.7", "mean 39.7 points")]
