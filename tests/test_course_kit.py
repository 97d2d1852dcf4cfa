"""The course kit inside the chapters (issue 38): fill-in cells with self-checks and concept checks.

- **Fill-in cells**: a code cell tagged ``fill-in`` holds at least one line ``name = expression  # fill-in: what``;
  the student notebook shows it as ``name = ...  # fill in: what`` (scripts/student.py). The next code cell is
  its self-check, ``exercises.fill_in("label", name, expected=...)``, where ``expected`` is computed by the
  library, not from the answer. The filled names are used by nothing else, so a student notebook with empty
  answers still runs. At least two per chapter.
- **Concept checks**: an admonition of class ``predict`` ("Predict, then run": a question to answer before the
  next cell runs), followed by its answer, a collapsed admonition of class ``predict-answer``, which the
  course build and the student notebooks leave out. Three to five per chapter.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import jupytext
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import notebooks  # noqa: E402
import student  # noqa: E402

from dualview import exercises  # noqa: E402

CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
PREDICT = re.compile(r"^(`{3,})\{admonition\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*?:class:[^\n]*\bpredict\b(?!-)", re.M)
ANSWER = re.compile(r"^(`{3,})\{admonition\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*?:class:[^\n]*\bpredict-answer\b", re.M)


def _cells(chapter: Path):
    return jupytext.read(chapter).cells


def _fill_ins(chapter: Path) -> list[tuple[int, list[str], str]]:
    """(cell index, names filled in, the next code cell's source) per fill-in cell."""
    cells, found = _cells(chapter), []
    for k, cell in enumerate(cells):
        if cell.cell_type == "code" and "fill-in" in cell.metadata.get("tags", []):
            following = next((c.source for c in cells[k + 1:] if c.cell_type == "code"), "")
            found.append((k, student.fill_in_names(cell.source), following))
    return found


# --- the mechanism -------------------------------------------------------------------------------------------
def test_fill_in_accepts_the_value_and_rejects_others():
    assert exercises.fill_in("x", 162, 162).correct is True
    assert exercises.fill_in("x", 161, 162).correct is False
    assert exercises.fill_in("x", 162.0000001, 162).correct is False  # a count is exact
    assert exercises.fill_in("x", 0.30000001, 0.3).correct is True
    assert exercises.fill_in("x", 0.31, 0.3).correct is False
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert exercises.fill_in("x", t.tolist(), t).correct is True
    assert exercises.fill_in("x", t.T, t).correct is False
    assert exercises.fill_in("x", t.flatten(), t).correct is False  # shape matters
    assert exercises.fill_in("x", (1, 0.5), (1, 0.5)).correct is True
    assert exercises.fill_in("x", (1, 0.6), (1, 0.5)).correct is False
    assert exercises.fill_in("x", "on", "off").correct is False
    assert exercises.fill_in("x", ..., 3).correct is None
    assert exercises.fill_in("x", "three", 3).correct is False


def test_a_wrong_value_is_not_shown_the_answer():
    check = exercises.fill_in("x", 0.123, 0.987654)
    assert "0.98" not in repr(check) and "not right yet" in repr(check)


def test_fill_in_lines_are_blanked():
    source = "w = torch.tensor([1.0, -2.0])\nq = w @ x  # fill-in: the pre-activation\ny = 3"
    assert student.blank_fill_ins(source) == \
        "w = torch.tensor([1.0, -2.0])\nq = ...  # fill in: the pre-activation\ny = 3"
    assert student.fill_in_names("a, b = f(x)  # fill-in") == ["a", "b"]
    with pytest.raises(ValueError, match="fill-in"):
        student.blank_fill_ins("q = w @ x")


def test_predict_answers_are_left_out_of_student_copies():
    md = ("Text before.\n\n```{admonition} Predict, then run\n:class: tip predict\nWhich gate?\n```\n\n"
          "```{admonition} Answer\n:class: dropdown predict-answer\nThe second one.\n```\n\nText after.")
    nb = jupytext.reads(md, fmt="md:myst")
    kept = notebooks._without_solutions(nb).cells[0].source
    assert "Which gate?" in kept and "Text after." in kept and "second one" not in kept


# --- every chapter -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_fill_in_cells(chapter):
    found = _fill_ins(chapter)
    assert len(found) >= 2, f"{chapter.name}: {len(found)} fill-in cell(s); the course kit asks for 2-3"
    later = {}
    cells = _cells(chapter)
    for k, names, check in found:
        assert names, f"{chapter.name}, cell {k}: tagged fill-in without a `name = ...  # fill-in` line"
        call = re.search(r"exercises\.fill_in\(\s*[\"']([\w-]+)[\"']\s*,\s*([A-Za-z_]\w*)\s*,(.*)\)", check, re.S)
        assert call, f"{chapter.name}, cell {k}: the next code cell must be `exercises.fill_in(label, name, ...)`"
        assert call[2] in names, f"{chapter.name}, cell {k}: its check tests {call[2]}, not {names}"
        expected = call[3]
        assert not re.search(rf"\b{re.escape(call[2])}\b", expected), (
            f"{chapter.name}, cell {k}: the expected value must not be computed from the answer {call[2]}")
        ast.parse(student.blank_fill_ins(cells[k].source))
        later.update({name: k for name in names})
    # a student notebook with empty answers still runs: nothing but the check uses a filled name
    checks = {k: next(j for j in range(k + 1, len(cells)) if cells[j].cell_type == "code") for k, _, _ in found}
    for j, cell in enumerate(cells):
        if cell.cell_type != "code" or j in checks.values() or j in checks:
            continue
        used = [n for n, k in later.items() if j > k and re.search(rf"\b{re.escape(n)}\b", cell.source)]
        assert not used, (f"{chapter.name}, code cell {j} uses {used}, which a student fills in: give the "
                          "fill-in its own name")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_concept_checks(chapter):
    text = chapter.read_text(encoding="utf-8")
    questions, answers = PREDICT.findall(text), ANSWER.findall(text)
    assert 3 <= len(questions) <= 5, (f"{chapter.name}: {len(questions)} concept checks (admonition of class "
                                      "predict); the course kit asks for 3-5 per chapter")
    assert len(answers) == len(questions), (f"{chapter.name}: {len(questions)} concept checks but "
                                            f"{len(answers)} answers (admonition of class predict-answer)")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_student_notebook_has_the_blanks(chapter):
    nb = student.student_notebook(chapter)
    blanks = [c for c in nb.cells if c.cell_type == "code" and "= ...  # fill in" in c.source]
    assert len(blanks) == len(_fill_ins(chapter))
    assert not any("predict-answer" in c.source or "<summary><b>Answer" in c.source for c in nb.cells)
