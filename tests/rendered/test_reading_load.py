"""A tutorial, not an audit (issue 38), measured on the built chapters outside what is collapsed
(scripts/reading_load.py says what is counted): prose of at most 4,500 words, at most 2.5 numbers per
paragraph on average, visible code cells of at most 15 lines at the median and 40 at most; every fill-in
self-check accepts the chapter's own answer; no glued number is shown as a raw float."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("DUALVIEW_HTML", ROOT / "_build" / "html"))
sys.path.insert(0, str(ROOT / "scripts"))
import reading_load  # noqa: E402

CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.md"))
MAX_WORDS, MAX_NUMBERS, MAX_MEDIAN_LINES, MAX_LINES = 4500, 2.5, 15, 40
RAW_FLOAT = re.compile(r"\d\.\d{6,}")


def _page(chapter: str) -> Path:
    page = HTML / "book" / f"{chapter}.html"
    if not page.exists():
        pytest.fail(f"{page} does not exist: build the book first (make book)")
    return page


def test_numerals_are_counted_as_a_reader_sees_them():
    assert reading_load.numerals("ResNet-20 and FC4 on 32×32 images, Chapter 6, Table 2") == ["32", "32"]
    assert reading_load.numerals("accuracy 91.2 [90.1, 92.3] %, 10,000 digits") == ["91.2", "90.1", "92.3", "10,000"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_reading_load(chapter):
    load = reading_load.measure(_page(chapter))
    problems = []
    if load.words > MAX_WORDS:
        problems.append(f"{load.words} words of prose outside the collapsed notes (at most {MAX_WORDS})")
    if load.numbers_per_paragraph > MAX_NUMBERS:
        problems.append(f"{load.numbers_per_paragraph:.2f} numbers per paragraph (at most {MAX_NUMBERS}); the "
                        "main text keeps one verdict and its number per experiment, the rest goes into the notes")
    if load.code_median > MAX_MEDIAN_LINES or load.code_max > MAX_LINES:
        problems.append(f"visible code cells: median {load.code_median:g} lines, longest {load.code_max} (at "
                        f"most {MAX_MEDIAN_LINES} and {MAX_LINES}); move what is not the lesson into a cell "
                        "tagged hide-input or into the library")
    assert not problems, f"{chapter}: " + "; ".join(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_fill_in_checks_accept_the_chapters_answer(chapter):
    soup = BeautifulSoup(_page(chapter).read_text(encoding="utf-8"), "html.parser")
    checks = [cell for cell in soup.find_all("div", class_="cell")
              if "exercises.fill_in(" in (cell.find("div", class_="cell_input") or cell).get_text()]
    assert len(checks) >= 2, f"{chapter}: {len(checks)} fill-in self-checks rendered; at least 2 expected"
    for cell in checks:
        output = cell.find("div", class_="cell_output")
        text = output.get_text(" ") if output else ""
        assert ": right." in text, f"{chapter}: a fill-in self-check does not accept the chapter's answer: {text!r}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_raw_float_in_prose(chapter):
    soup = BeautifulSoup(_page(chapter).read_text(encoding="utf-8"), "html.parser")
    raw = [span.get_text() for span in soup.find_all("span", class_="pasted-text")
           if RAW_FLOAT.search(span.get_text())]
    assert not raw, (f"{chapter}: glued numbers shown as raw floats: {raw[:5]}; give the glue role a format "
                     "spec at the precision the claim needs, e.g. {glue:text}`name:.1f`")
