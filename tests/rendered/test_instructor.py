"""The instructor page (book/instructor.md) in both builds: the full book (`make html`, or $DUALVIEW_HTML) and
the course build (`make html HIDE_SOLUTIONS=1 BOOK_OUT=_build/course`, or $DUALVIEW_COURSE_HTML; with
HIDE_SOLUTIONS=1 set, $DUALVIEW_HTML is the course build and only it is checked).

It is in the table of contents, has the schedule (a session per chapter, each linking its chapter), the
dependency map (which must name every chapter a chapter's own prerequisites name), the execution-time table
(one row per chapter, the times of _build/executed/status.json when the page was built after it) or the
sentence that says they were not measured; and the intro of the course build says solutions are not
included, the full book's that they are.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from test_html import HTML, ROOT, notebooks, visible_text

COURSE_HTML = Path(os.environ.get("DUALVIEW_COURSE_HTML", ROOT / "_build" / "course" / "_build" / "html"))
BUILDS = ({"course": HTML} if os.environ.get("HIDE_SOLUTIONS") == "1" else {"book": HTML, "course": COURSE_HTML})
STATUS = ROOT / "_build" / "executed" / "status.json"
CHAPTERS = notebooks.chapters() if (ROOT / "_toc.yml").exists() else []
# a chapter's prerequisites paragraph and the chapters it names ({ref}`Chapter 2 <ch-npk>`)
PREREQUISITES = re.compile(r"^\*\*Prerequisites\*\*:(.*?)(?:\n\n|\n```)", re.S | re.M)
CHAPTER_REF = re.compile(r"\{ref\}`Chapter (\d+) <")


def _page(build: str, name: str) -> str:
    path = BUILDS[build] / "book" / f"{name}.html"
    if not path.exists():
        pytest.fail(f"{path} does not exist: build the book first (`make html`, and for the course build "
                    "`make html HIDE_SOLUTIONS=1 BOOK_OUT=_build/course`, as `make test` does)")
    return path.read_text(encoding="utf-8")


def _tables(html: str) -> list[list[list[str]]]:
    """Every <table> of a page as rows of visible cell texts (header row included)."""
    tables = []
    for table in re.findall(r"<table.*?</table>", html, re.S):
        rows = re.findall(r"<tr.*?</tr>", table, re.S)
        tables.append([[" ".join(visible_text(c).split()) for c in re.findall(r"<t[hd].*?</t[hd]>", r, re.S)]
                       for r in rows])
    return tables


def _table_with(html: str, header: str) -> tuple[list[list[str]], str]:
    """(rows, html) of the table whose header row has a cell `header`."""
    for table, rows in zip(re.findall(r"<table.*?</table>", html, re.S), _tables(html)):
        if rows and header in rows[0]:
            return rows, table
    return [], ""


@pytest.mark.parametrize("build", BUILDS)
def test_instructor_page_is_in_the_table_of_contents(build):
    nav = re.search(r'<nav class="[^"]*bd-docs-nav[^"]*".*?</nav>', _page(build, "intro"), re.S)
    assert nav, f"{build}: no table of contents (sidebar navigation) in intro.html"
    assert re.search(r'<a class="reference internal" href="instructor.html">', nav.group(0)), \
        f"{build}: the instructor page is not in the table of contents"


@pytest.mark.parametrize("build", BUILDS)
def test_schedule_has_a_session_per_chapter(build):
    rows, table = _table_with(_page(build, "instructor"), "Session")
    assert [row[0] for row in rows[1:]] == [str(k) for k in range(1, len(CHAPTERS) + 1)], rows
    for chapter in CHAPTERS:
        assert f'href="{chapter.stem}.html' in table, f"{build}: the schedule does not link {chapter.stem}"


@pytest.mark.parametrize("build", BUILDS)
def test_dependency_map_names_each_chapters_prerequisites(build):
    html = _page(build, "instructor")
    assert re.search(r"<pre>.*1 Paths.*9 Which explanation", html, re.S), f"{build}: no dependency diagram"
    rows, _ = _table_with(html, "Needs")
    assert len(rows) == len(CHAPTERS) + 1, f"{build}: the dependency table has {len(rows) - 1} chapter rows"
    for chapter, row in zip(CHAPTERS, rows[1:]):
        number = int(chapter.stem.split("_")[0])
        assert row[0].startswith(f"{number}."), row
        named = set(re.findall(r"\d+", row[1] + " " + row[2]))
        prerequisites = PREREQUISITES.search(chapter.read_text(encoding="utf-8"))
        wanted = set(CHAPTER_REF.findall(prerequisites.group(1))) if prerequisites else set()
        assert wanted <= named, f"{build}: chapter {number} names {sorted(wanted)} as prerequisites, " \
                                f"the instructor page only {sorted(named)}"


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(?:(\d+) min )?(\d+) s", text)
    assert match, f"not a duration: {text!r}"
    return 60 * int(match.group(1) or 0) + int(match.group(2))


@pytest.mark.parametrize("build", BUILDS)
def test_execution_times_one_row_per_chapter_or_not_measured(build):
    html = _page(build, "instructor")
    text = " ".join(visible_text(html).split())
    assert "chapter-times" not in html, f"{build}: the times marker was not replaced (scripts/notebooks.py stage)"
    rows, _ = _table_with(html, "Execution time, cpu profile")
    if not rows:
        assert "execution times were not measured in this build" in text, f"{build}: neither times nor why not"
        return
    body = [row for row in rows[1:] if "one after another" not in row[0]]
    titles = notebooks._chapter_titles()
    assert [row[0] for row in body] == list(titles.values()), f"{build}: not one row per chapter"
    page = BUILDS[build] / "book" / "instructor.html"
    status = json.loads(STATUS.read_text()) if STATUS.exists() else None
    fresh = status is not None and STATUS.stat().st_mtime <= page.stat().st_mtime
    for name, row in zip(titles, body):
        if row[1] == "not timed":
            continue
        measured = _seconds(row[1])
        if fresh:  # built after the run that status.json describes: the times must be that run's
            assert abs(measured - status["chapters"][name]["seconds"]) <= 0.5, f"{build}: {row}"
    assert "an estimate, not a measurement" in text


@pytest.mark.parametrize("build", BUILDS)
def test_course_intro_says_solutions_are_not_included(build):
    text = " ".join(visible_text(_page(build, "intro")).split())
    if build == "course":
        assert "solutions are not included" in text and "followed by its solution" not in text
        assert "exercises with solutions" not in text
    else:
        assert "followed by its solution" in text and "solutions are not included" not in text
    assert "book-only" not in text and "course-only" not in text
