"""dualview.scoreboard: the verdict of each row is computed from the interval and the paper's direction."""
from __future__ import annotations

import json

import pytest

from dualview import glue, scoreboard, stats


def _iv(low, high):
    return stats.Interval((low + high) / 2, low, high, 0.95, 10, "test")


@pytest.mark.parametrize("low, high, expect, verdict", [
    (1.0, 3.0, "above", "reproduced"),
    (-1.0, 3.0, "above", "not decided at this scale"),
    (-3.0, -1.0, "above", "reversed"),
    (-3.0, -1.0, "below", "reproduced"),
    (-0.5, 0.5, "equal", "reproduced"),       # inside the band ±1
    (-0.5, 1.5, "equal", "not decided at this scale"),
    (1.5, 2.5, "equal", "reversed"),          # wholly outside the band
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
