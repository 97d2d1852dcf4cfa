"""Checks of the built HTML book (run by `make test` after `make html`; not part of `make unit`).

A page must not show MyST/Sphinx markup as text (a glue role inside a code span, a directive fence that
did not parse, an unresolved citation), and every chapter must render its theorem/definition blocks (titled
with the paper's own numbering, not sphinx-proof's page counter) and its exercises.
"""
from __future__ import annotations

import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("DUALVIEW_HTML", ROOT / "_build" / "html"))
sys.path.insert(0, str(ROOT / "scripts"))
import notebooks  # noqa: E402  (the harness: which files are chapters)

LEAKS = ["```{", "{glue", "{prf:", "{cite}", "{cite:", "{ref}", "{eq}", "{numref}", "{doc}", "{term}"]
PROOF_KINDS_WITH_NUMBERS = {"theorem", "lemma", "proposition", "corollary"}


class _VisibleText(HTMLParser):
    """The text a reader sees: everything outside <script>, <style> and <head>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = _VisibleText()
    parser.feed(html)
    return "".join(parser.parts)


def _pages() -> list[Path]:
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML / 'index.html'} does not exist: build the book first (`make html` after `make notebooks`)")
    return sorted(p for p in HTML.rglob("*.html")
                  if not any(part in ("_static", "_sources", "_sphinx_design_static") for part in p.parts))


def _chapter_pages() -> dict[str, Path]:
    return {p.stem: HTML / p.relative_to(ROOT).with_suffix(".html") for p in notebooks.toc_files()
            if notebooks.is_notebook(p)}


def _proof_blocks(html: str) -> list[tuple[str, str]]:
    """(kind, title html) of every sphinx-proof block of a page."""
    pattern = re.compile(r'<div class="proof (\w+) admonition"[^>]*>\s*<p class="admonition-title"[^>]*>(.*?)</p>', re.S)
    return pattern.findall(html)


def test_every_toc_page_was_built():
    missing = [str(p) for p in _chapter_pages().values() if not p.exists()]
    assert not missing, f"chapters in _toc.yml without a built page: {missing}"


def test_no_page_shows_raw_markup():
    problems = []
    for page in _pages():
        text = visible_text(page.read_text(encoding="utf-8"))
        for leak in LEAKS:
            for m in re.finditer(re.escape(leak), text):
                context = text[max(0, m.start() - 60):m.end() + 60].replace("\n", " ")
                problems.append(f"{page.relative_to(HTML)}: '{leak}' in …{context}…")
    assert not problems, "raw MyST/Sphinx markup is visible on built pages:\n" + "\n".join(problems[:40])


@pytest.mark.parametrize("chapter", sorted(_chapter_pages()) if (ROOT / "_toc.yml").exists() else [])
def test_chapter_renders_its_blocks_and_exercises(chapter):
    page = _chapter_pages()[chapter]
    if not page.exists():
        pytest.fail(f"{page} does not exist: build the book first (`make html`)")
    html = page.read_text(encoding="utf-8")
    blocks = [(kind, title) for kind, title in _proof_blocks(html) if kind != "proof"]
    assert any(kind in ("theorem", "definition", "proposition", "lemma") for kind, _ in blocks), \
        f"{chapter}: no theorem or definition block rendered"
    for kind, title in blocks:
        counter = re.findall(r'<span class="caption-number">(.*?)</span>', title, re.S)
        assert not any(re.search(r"\d", c) for c in counter), (
            f"{chapter}: a {kind} block is numbered by the page counter ({visible_text(title)!r}); give it "
            f":nonumber: and the paper's own number in its title")
        cites_source = "bibliography" in title or "this book" in visible_text(title).lower()
        assert cites_source, f"{chapter}: the {kind} block {visible_text(title)!r} does not name its source " \
                             "(a {cite} of the paper, or 'this book')"
        if kind in PROOF_KINDS_WITH_NUMBERS and "this book" not in visible_text(title).lower():
            without_citations = re.sub(r"<a [^>]*bibliography[^>]*>.*?</a>", "", title, flags=re.S)
            assert re.search(r"\d", visible_text(without_citations)), \
                f"{chapter}: the {kind} block {visible_text(title)!r} does not give the paper's number"
    exercises = html.count('class="exercise admonition"')
    solutions = len(re.findall(r'class="solution[^"]*admonition', html))
    assert exercises >= 1, f"{chapter}: no exercise rendered"
    questions = len(re.findall(r'class="[^"]*\bpredict\b(?!-)[^"]*admonition|class="admonition[^"]*\bpredict\b(?!-)', html))
    answers = len(re.findall(r'class="[^"]*\bpredict-answer\b', html))
    assert questions >= 3, f"{chapter}: {questions} concept checks (Predict, then run) rendered; 3-5 expected"
    if os.environ.get("HIDE_SOLUTIONS") == "1":
        assert solutions == 0, f"{chapter}: the course build (HIDE_SOLUTIONS=1) still shows {solutions} solutions"
        assert answers == 0, f"{chapter}: the course build still shows {answers} answers to its concept checks"
    else:
        assert solutions >= 1, f"{chapter}: the exercises have no rendered solutions"
        assert answers == questions, f"{chapter}: {questions} concept checks but {answers} answers rendered"
