"""dualview.scoreboard: the verdict of each row is computed from the interval and the paper's direction."""
from __future__ import annotations

import json

import pytest

from dualview import glue, scoreboard, stats


def _iv(low, high):
    return stats.Interval((low + high) / 2, low, high, 0.95, 10, "test")


@pytest.mark.parametrize("low, high, expect, verdict", [
    (1.0, 3.0, "above", "reproduced"),        # clears 0 by one half-width (1)
    (0.5, 2.5, "above", "not decided at this scale"),  # clears 0, by half a half-width only
    (-1.0, 3.0, "above", "not decided at this scale"),
    (-3.0, -1.0, "above", "reversed"),
    (-2.5, -0.5, "above", "not decided at this scale"),
    (-3.0, -1.0, "below", "reproduced"),
    (-0.25, 0.25, "equal", "reproduced"),     # inside the band ±1 with room 0.75 = 3 half-widths
    (-0.6, 0.6, "equal", "not decided at this scale"),  # inside, room 0.4 < one half-width (0.6)
    (-0.5, 1.5, "equal", "not decided at this scale"),
    (2.0, 3.0, "equal", "reversed"),          # outside the band by two half-widths
])
def test_verdicts(low, high, expect, verdict):
    tol = 1.0 if expect == "equal" else None
    r = scoreboard.row(f"k{low}{high}{expect}".replace(".", "_").replace("-", "m"), "claim", "paper",
                       _iv(low, high), section="sec", expect=expect, tolerance=tol)
    assert r.verdict == verdict


def test_not_run_and_the_glued_row():
    r = scoreboard.row("not_run_row", "c", "p", None, section="sec", not_run="needs a GPU")
    assert r.verdict == "not run" and r.this_run == "needs a GPU"
    assert json.loads(glue.values["scoreboard__not_run_row"])["verdict"] == "not run"


def test_a_comparison_shows_its_difference():
    c = stats.Comparison(_iv(0.01, 0.03), "A", "B")
    r = scoreboard.row("cmp_row", "c", "p", c, section="sec", scale=100, unit=" pts")
    assert r.verdict == "reproduced" and r.this_run.startswith("2.0 [1.0, 3.0] pts")


@pytest.mark.parametrize("kwargs, message", [
    (dict(key="bad key!"), "key"),
    (dict(expect="more"), "expect"),
    (dict(expect="equal"), "tolerance"),
    (dict(section=""), "section"),
])
def test_bad_rows_say_what_is_wrong(kwargs, message):
    args = dict(key="k", claim="c", paper="p", result=_iv(0, 1), section="s") | kwargs
    with pytest.raises(ValueError, match=message):
        scoreboard.row(**args)


def _harness():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import notebooks

    return notebooks


def test_the_page_counts_verdicts_and_links_each_row():
    nb = _harness()
    rows = [("book/05_dgn.ipynb", dict(key="a", claim="A beats B", paper="+1", this_run="2 [1, 3]",
                                       verdict="reproduced", margin=1.0, section="dgn-x")),
            ("book/05_dgn.ipynb", dict(key="b", claim="C | D", paper="+2", this_run="0 [-1, 1]",
                                       verdict="not decided at this scale", margin=-1.0, section="dgn-y"))]
    page = nb.scoreboard_page(rows)
    assert "| reproduced | 1 |" in page and "| not decided at this scale | 1 |" in page and "| reversed | 0 |" in page
    assert '<span id="sb-a"></span>A beats B ({ref}`section <dgn-x>`)' in page and "C \\| D" in page


def test_introduction_markers_become_verdict_links_or_fail_loudly():
    nb = _harness()
    rows = [("book/05_dgn.ipynb", dict(key="a", verdict="reversed"))]
    out = nb.verdict_links("gates matter: <!-- verdict a -->.", rows, "book/intro.md")
    assert out == 'gates matter: <a class="reference internal" href="scoreboard.html#sb-a"><strong>reversed</strong></a>.'
    with pytest.raises(SystemExit, match="no executed chapter glued"):
        nb.verdict_links("<!-- verdict gone -->", rows, "book/intro.md")


def test_citations_in_rows_become_roles_on_the_page():
    nb = _harness()
    rows = [("book/05_dgn.ipynb", dict(key="c", claim="A", paper="+1 (Table 2 of cite:lakshminarayanan2022explicitising)",
                                       this_run="1", verdict="reproduced", margin=2.0, section="dgn-x"))]
    assert "(Table 2 of {cite}`lakshminarayanan2022explicitising`)" in nb.scoreboard_page(rows)
