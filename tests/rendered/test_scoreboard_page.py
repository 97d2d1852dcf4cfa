"""The page "What this book reproduces" in both builds: in the table of contents, one row per glued claim with a
computed verdict, and every verdict the introduction states links to a row of it that exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILDS = {"book": ROOT / "_build" / "html", "course": ROOT / "_build" / "course" / "_build" / "html"}
VERDICTS = ("reproduced", "not decided at this scale", "reversed", "not run")


def _built(build: str) -> Path:
    html = BUILDS[build]
    if not (html / "index.html").exists():
        pytest.fail(f"{html / 'index.html'} does not exist: build the book first (make test builds both)")
    return html


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_scoreboard_is_in_the_table_of_contents(build):
    index = (_built(build) / "book" / "intro.html").read_text(encoding="utf-8")
    assert 'href="scoreboard.html"' in index, f"{build}: the scoreboard page is not in the navigation"


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_scoreboard_rows_have_computed_verdicts_and_anchors(build):
    page = (_built(build) / "book" / "scoreboard.html").read_text(encoding="utf-8")
    anchors = re.findall(r'<span id="sb-([A-Za-z0-9_-]+)"></span>', page)
    assert len(anchors) >= 20, f"{build}: only {len(anchors)} scoreboard rows"
    assert len(set(anchors)) == len(anchors), "a scoreboard key is used twice"
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page, re.S)
    verdict_cells = [v for r in rows if 'id="sb-' in r for v in re.findall(r"<strong>(.*?)</strong>", r)]
    assert len(verdict_cells) == len(anchors) and set(verdict_cells) <= set(VERDICTS), set(verdict_cells)
    # each row links to the chapter section that runs it
    for r in rows:
        if 'id="sb-' in r:
            assert re.search(r'href="\d\d_[a-z_]+\.html#', r), f"{build}: a row without a link to its section"


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_introduction_verdicts_link_to_existing_rows(build):
    html = _built(build)
    intro = (html / "book" / "intro.html").read_text(encoding="utf-8")
    page = (html / "book" / "scoreboard.html").read_text(encoding="utf-8")
    links = re.findall(r'href="scoreboard.html#sb-([A-Za-z0-9_-]+)"><strong>(.*?)</strong>', intro)
    assert len(links) >= 5, f"{build}: the introduction links only {len(links)} verdicts to the scoreboard"
    for key, verdict in links:
        row = re.search(rf'<tr[^>]*>(?:(?!</tr>).)*id="sb-{re.escape(key)}"(?:(?!</tr>).)*</tr>', page, re.S)
        assert row, f"{build}: the introduction links to a scoreboard row that does not exist: {key}"
        assert f"<strong>{verdict}</strong>" in row.group(0), f"{build}: {key}: the introduction says {verdict!r}"
