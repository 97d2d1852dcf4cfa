"""The course material has the exercises and none of the solutions: the student notebooks
(book/student/<ch>.ipynb, `make student`) and the course build of the HTML (`make html HIDE_SOLUTIONS=1`,
which `make test` writes to _build/course).

The markers are the chapters' real solutions, read from book/<ch>.md: every line of a solution block
(between `solution-start` and `solution-end`) that occurs nowhere else in the chapter; for the HTML only
those a rendering keeps verbatim (lines of a solution's code cells, prose lines without markup). Each must
be found where the solutions are shown (the Colab copy book/<ch>.ipynb, the full build _build/html) and
must not be found in the student notebook or the course build; the lines of the exercises must be in all.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest

from test_html import HTML, ROOT, notebooks, visible_text

COURSE_HTML = Path(os.environ.get("DUALVIEW_COURSE_HTML", ROOT / "_build" / "course" / "_build" / "html"))
STUDENT = ROOT / "book" / "student"
SOLUTION_BLOCK = re.compile(r"^```\{solution-start\}.*?^```\{solution-end\}", re.S | re.M)
EXERCISE_BLOCK = re.compile(r"^```\{exercise\}[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
# characters a rendering changes (math, roles, emphasis, links, smart quotes, dashes) and list/heading marks
MARKUP = re.compile(r"[$`{}*\[\]\\_|<>\"']|--|\.\.\.|^[-+#>]|^\d+\. ")
MIN_LENGTH = 25
# a MyST role, which the plain notebooks rewrite (scripts/harness/plain.py, Plain)
ROLE = re.compile(r"\{[\w:-]+\}`")


def _squash(text: str) -> str:
    return " ".join(text.split())


def block_lines(block: str, html: bool) -> list[str]:
    """The lines of a MyST block, long enough to be specific, that a rendering keeps verbatim: code lines
    of code cells, and prose lines without markup (HTML) or without MyST roles (the plain notebooks)."""
    lines, in_code, in_metadata, first = [], False, False, False
    for line in block.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = first = stripped.startswith("```{code-cell")
            continue
        # a code cell's YAML metadata block (between --- lines at its top) is not shown as text
        if in_code and stripped == "---" and (first or in_metadata):
            in_metadata, first = not in_metadata, False
            continue
        first = False
        if in_metadata or stripped.startswith(":") or len(stripped) < MIN_LENGTH:
            continue
        if in_code or not (MARKUP if html else ROLE).search(stripped):
            lines.append(_squash(stripped))
    return lines


def markers(chapter: Path, html: bool) -> tuple[list[str], list[str]]:
    """(solution lines, exercise lines) of a chapter; the solution lines occur nowhere else in it."""
    source = chapter.read_text(encoding="utf-8")
    solutions = SOLUTION_BLOCK.findall(source)
    rest = _squash(SOLUTION_BLOCK.sub("", source))
    solution_lines = [m for block in solutions for m in block_lines(block, html) if m not in rest]
    exercise_lines = [m for block in EXERCISE_BLOCK.findall(source) for m in block_lines(block, html)]
    return solution_lines, exercise_lines


def notebook_text(path: Path) -> str:
    return _squash("\n".join(c.source for c in nbformat.read(path, as_version=4).cells))


def html_text(page: Path) -> str:
    if not page.exists():
        pytest.fail(f"{page} does not exist: build the book first (`make html`, and for the course build "
                    "`make html HIDE_SOLUTIONS=1 BOOK_OUT=_build/course`, as `make test` does)")
    return _squash(visible_text(page.read_text(encoding="utf-8")))


def colab_links(page: Path) -> list[str]:
    return re.findall(r'href="([^"]*colab[^"]*\.ipynb)"', page.read_text(encoding="utf-8"))


CHAPTERS = sorted(p.stem for p in notebooks.chapters()) if (ROOT / "_toc.yml").exists() else []


def _chapter(name: str) -> Path:
    return ROOT / "book" / f"{name}.md"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_student_notebook_keeps_exercises_drops_solutions(chapter):
    solution_lines, exercise_lines = markers(_chapter(chapter), html=False)
    n_exercises = len(EXERCISE_BLOCK.findall(_chapter(chapter).read_text(encoding="utf-8")))
    assert len(solution_lines) >= 3 and len(exercise_lines) >= n_exercises, (
        f"{chapter}: too few marker lines to test with ({len(solution_lines)} solution lines, "
        f"{len(exercise_lines)} exercise lines for {n_exercises} exercises)")
    student_path = STUDENT / f"{chapter}.ipynb"
    assert student_path.exists(), f"{student_path} is missing: run `make student` and commit book/student/"
    full, student = notebook_text(ROOT / "book" / f"{chapter}.ipynb"), notebook_text(student_path)
    assert not [m for m in solution_lines if m not in full], \
        f"{chapter}: solution lines not found in the Colab copy; run `make sync`"
    leaked = [m for m in solution_lines if m in student]
    assert not leaked, f"{chapter}: the student notebook contains solution text:\n  " + "\n  ".join(leaked[:10])
    lost = [m for m in exercise_lines if m not in student]
    assert not lost, f"{chapter}: the student notebook lost exercise text:\n  " + "\n  ".join(lost[:10])
    assert "solution-start" not in student and "solution-end" not in student


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_course_html_keeps_exercises_drops_solutions(chapter):
    solution_lines, exercise_lines = markers(_chapter(chapter), html=True)
    full = html_text(HTML / "book" / f"{chapter}.html")
    course = html_text(COURSE_HTML / "book" / f"{chapter}.html")
    shown = [m for m in solution_lines if m in full]
    assert len(shown) >= 3, f"{chapter}: only {len(shown)} solution lines found in the full build {HTML}"
    leaked = [m for m in shown if m in course]
    assert not leaked, f"{chapter}: the course build shows solution text:\n  " + "\n  ".join(leaked[:10])
    in_full = [m for m in exercise_lines if m in full]
    assert in_full, f"{chapter}: no exercise line found in the full build {HTML}"
    lost = [m for m in in_full if m not in course]
    assert not lost, f"{chapter}: the course build lost exercise text:\n  " + "\n  ".join(lost[:10])


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_course_colab_button_opens_the_student_notebook(chapter):
    """The course build's Colab button and the student notebook's own link open book/student/<ch>.ipynb,
    built like the full build's button for book/<ch>.ipynb (same Colab, repository and branch)."""
    html_text(HTML / "book" / f"{chapter}.html")
    html_text(COURSE_HTML / "book" / f"{chapter}.html")
    full = colab_links(HTML / "book" / f"{chapter}.html")
    assert len(full) == 1 and full[0].endswith(f"/book/{chapter}.ipynb"), f"{chapter}: Colab links {full}"
    student_link = full[0][:-len(f"book/{chapter}.ipynb")] + f"book/student/{chapter}.ipynb"
    assert colab_links(COURSE_HTML / "book" / f"{chapter}.html") == [student_link]
    first_cell = nbformat.read(STUDENT / f"{chapter}.ipynb", as_version=4).cells[0].source
    assert f"({student_link})" in first_cell, f"{chapter}: the student notebook does not link {student_link}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_student_notebook_numbers_exercises_as_the_book(chapter):
    """A teacher says "Exercise 21"; the student notebook and the course build must mean the same one."""
    page = COURSE_HTML / "book" / f"{chapter}.html"
    html_text(page)
    captions = re.findall(r'<span class="caption-number">Exercise (\d+) ?</span>', page.read_text(encoding="utf-8"))
    in_book = [int(n) for n in captions]
    in_notebook = [int(n) for n in re.findall(r"#### Exercise (\d+)", notebook_text(STUDENT / f"{chapter}.ipynb"))]
    assert in_book and in_notebook == in_book, f"{chapter}: exercises {in_notebook} in the student notebook, " \
                                               f"{in_book} in the course build"
