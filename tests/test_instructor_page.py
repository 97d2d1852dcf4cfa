"""The instructor page's generated parts (scripts/notebooks.py stage): the chapter-times table built from the
status.json the chapters' execution writes, the two editions of a plain page (full book and course build),
and the page's source: every exercise of the book sorted into homework or class, the self-checks marked."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import notebooks  # noqa: E402

from dualview import exercises  # noqa: E402

PAGE = ROOT / "book" / "instructor.md"
TITLES = {"book/01_a.ipynb": "1. First", "book/02_b.ipynb": "2. Second", "book/03_c.ipynb": "3. Third"}


def _rows(table: str) -> list[list[str]]:
    """The body rows of the first Markdown table in `table`, as lists of stripped cells."""
    lines = [line for line in table.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _seconds(text: str) -> float:
    """'4 min 05 s' -> 245, '38 s' -> 38 (written independently of notebooks._duration)."""
    match = re.fullmatch(r"(?:(\d+) min )?(\d+) s", text)
    assert match, f"not a duration: {text!r}"
    return 60 * int(match.group(1) or 0) + int(match.group(2))


def _status(chapters: dict, workers: int | None = 2) -> dict:
    status = {"exitstatus": 0, "chapters": chapters, "runs": {},
              "configuration": {"cpu_capability": "AVX2", "OMP_NUM_THREADS": "1", "torch_threads": 1}}
    if workers is not None:
        status["workers"] = workers
    return status


def _entry(seconds: float, run: str = "cpu profile", errors=(), mismatches=()) -> dict:
    return {"run": run, "seconds": seconds, "errors": list(errors), "mismatches": list(mismatches)}


def test_times_table_has_one_row_per_chapter_with_the_measured_times():
    status = _status({"book/01_a.ipynb": _entry(76.0), "book/03_c.ipynb": _entry(295.8, errors=[{"cell": 3}]),
                      "book/02_b.ipynb (smoke)": _entry(12.0, run="gpu profile, smoke scale")})
    table = notebooks.chapter_times(status, TITLES, cpu="Test CPU 9000", cores=2)
    rows = _rows(table)
    assert [row[0] for row in rows] == list(TITLES.values()), table
    assert abs(_seconds(rows[0][1]) - 76.0) <= 0.5 and rows[0][2] == "ok"
    assert rows[1][1] == "not timed", "a smoke run is not the cpu profile's time"
    assert abs(_seconds(rows[2][1]) - 295.8) <= 0.5 and rows[2][2] == "failed"
    assert "Test CPU 9000" in table and "2 cores" in table and "2 at a time" in table and "1 torch thread" in table


def test_times_table_totals_only_when_every_chapter_was_timed():
    seconds = {"book/01_a.ipynb": 59.6, "book/02_b.ipynb": 3.2, "book/03_c.ipynb": 600.0}
    status = _status({name: _entry(s, mismatches=[{"cell": 1}] * (k == 1)) for k, (name, s) in
                      enumerate(seconds.items())}, workers=None)
    rows = _rows(notebooks.chapter_times(status, TITLES, cpu="x", cores=4))
    assert len(rows) == len(TITLES) + 1 and "one after another" in rows[-1][0]
    for row, s in zip(rows, seconds.values()):
        assert abs(_seconds(row[1]) - s) <= 0.5
    assert rows[1][2] == "1 checked output(s) differ"
    assert abs(_seconds(rows[-1][1]) - sum(seconds.values())) <= 0.5
    assert "one at a time" in notebooks.chapter_times(status, TITLES, cpu="x", cores=4)


@pytest.mark.parametrize("status", [None, _status({"book/01_a.ipynb (smoke)": _entry(5.0, run="gpu profile")})])
def test_times_not_measured_says_so_instead_of_a_table(status):
    text = notebooks.chapter_times(status, TITLES, cpu="x", cores=2)
    assert "not measured in this build" in text and not _rows(text)


def test_editions_of_a_page():
    text = ("Intro.\n<!-- book-only -->\nWith solutions.\n<!-- /book-only -->\n"
            "<!-- course-only\nWithout solutions.\n-->\nEnd.\n")
    assert notebooks.edition_text(text, course=False) == "Intro.\nWith solutions.\nEnd.\n"
    assert notebooks.edition_text(text, course=True) == "Intro.\nWithout solutions.\nEnd.\n"


def test_the_intro_promises_solutions_only_in_the_full_book():
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    book, course = (notebooks.edition_text(intro, course=c) for c in (False, True))
    assert "followed by its solution" in book and "not included" not in book
    assert "solutions are not included" in course and "followed by its solution" not in course
    assert "with solutions" not in course
    for text in (book, course):
        assert "book-only" not in text and "course-only" not in text


def test_the_page_is_in_the_toc_and_not_a_notebook():
    assert PAGE in notebooks.toc_files() and not notebooks.is_notebook(PAGE)
    source = PAGE.read_text(encoding="utf-8")
    assert source.count(notebooks.TIMES_MARKER) == 1
    assert not re.search(r"\d+ min \d+ s", source), "execution times must come from the run, not the source"


def _exercise_lines() -> dict[str, str]:
    """{exercise label: its line on the page}."""
    source = PAGE.read_text(encoding="utf-8")
    return {m.group(1): m.group(0) for m in re.finditer(r"^- \{ref\}`(ex-[\w-]+)`.*$", source, re.M)}


def test_every_exercise_is_sorted_into_homework_or_class():
    labels = [label for ch in notebooks.chapters() for label in
              re.findall(r"^```\{exercise\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*?:label:\s*(\S+)",
                         ch.read_text(encoding="utf-8"), re.M)]
    lines = _exercise_lines()
    assert labels and sorted(lines) == sorted(labels), "book/instructor.md must list every exercise once"
    unsorted = [label for label, line in lines.items() if not re.search(r"— (homework|class)\b", line)]
    assert not unsorted, f"exercises neither homework nor class on the instructor page: {unsorted}"
    marked = sorted(label for label, line in lines.items() if "*self-check*" in line)
    assert marked == sorted(exercises.exercises()), \
        "mark exactly the exercises that dualview.exercises can check with *self-check* on book/instructor.md"


def test_reading_times_table_has_every_chapter_and_its_sections():
    table = notebooks.reading_times(None)
    titles = list(notebooks._chapter_titles().values())
    rows = [line for line in table.splitlines() if line.startswith("| **")]
    assert [re.match(r"\| \*\*(.+?)\*\*", r).group(1) for r in rows] == titles
    for row in rows:  # words / 150 + code lines / 10, rounded
        words, code, minutes = re.search(r"\*\*([\d,]+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+) min", row).groups()
        assert int(minutes) == round(int(words.replace(",", "")) / 150 + int(code) / 10)
    assert "| &nbsp;&nbsp;Exercises |" in table


def test_reading_parts_skip_hidden_code_and_collapsed_notes(tmp_path):
    ch = tmp_path / "ch.md"
    ch.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
        "    format_version: 0.13\nkernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n"
        "# Title\n\none two three\n\n## Section\n\nfour five\n\n"
        "```{admonition} Reproducibility notes\n:class: dropdown\nnot counted at all here\n```\n\n"
        "```{code-cell} ipython3\nx = 1\ny = 2\n```\n\n"
        "```{code-cell} ipython3\n:tags: [hide-input]\nhidden = 1\n```\n")
    parts = notebooks._reading_parts(ch)
    assert parts == [("Opening", 4, 0), ("Section", 3, 2)]  # headings count as words


def test_instructor_page_has_the_reading_table_and_three_lab_plans():
    page = (ROOT / "book" / "instructor.md").read_text()
    assert notebooks.READING_MARKER in page
    assert len(re.findall(r"^\*\*Lab \d+: .+\(Chapter \d+\)\.\*\*$", page, re.M)) >= 3
    for chapter in (1, 2, 6):
        assert f"(Chapter {chapter}).**" in page
