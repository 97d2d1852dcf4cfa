"""What the book reproduces: one row per experimental claim of the papers, with this run's verdict.

A chapter that re-runs a paper's experiment calls :func:`row` once per claim of the paper it tests, with the
paper's number, this run's result (an interval or a paired comparison from :mod:`dualview.stats`) and the
direction the paper reports. The verdict is computed, never typed:

- ``"reproduced"``: this run decides the paper's direction with room: the interval clears the threshold by at
  least one half-width (:data:`DECIDED_MARGIN`, the margin the book asks of an asserted claim);
- ``"reversed"``: this run decides the opposite direction, with the same room;
- ``"not decided at this scale"``: anything else: the interval contains the threshold, or clears it by less
  than a half-width, so another seed could move it across (for ``expect="equal"``: the interval is neither
  inside the tolerance band nor outside it with that room);
- ``"not run"``: the chapter does not run this experiment in this profile (``result=None``).

The row is glued (``scoreboard__<key>``) into the executed chapter, and the book's page "What this book
reproduces" (``book/scoreboard.md``) is generated from the glued rows of every executed chapter by
``scripts/notebooks.py stage``, so the page always shows the run the book was built from.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from dualview import stats
from dualview.glue import glue

__all__ = ["Row", "VERDICTS", "row"]

VERDICTS = ("reproduced", "not decided at this scale", "reversed", "not run")
PREFIX = "scoreboard__"


@dataclass(frozen=True)
class Row:
    """One claim of a paper and what this run says of it (``margin``: in half-widths, see ``stats.Evidence``)."""

    key: str
    claim: str
    paper: str
    this_run: str
    verdict: str
    margin: float | None
    section: str


#: the least margin (in half-widths, see ``stats.Evidence``) at which a result counts as decided: the book's rule
#: for asserted claims, so that another seed or another CPU does not flip a row's verdict
DECIDED_MARGIN = 1.0


def _verdict(result: stats.Interval | stats.Comparison, expect: str, threshold: float,
             tolerance: float | None) -> tuple[str, float | None]:
    if expect in ("above", "below"):
        toward = (stats.above if expect == "above" else stats.below)(result, threshold)
        away = (stats.below if expect == "above" else stats.above)(result, threshold)
        if toward.margin >= DECIDED_MARGIN:
            return "reproduced", toward.margin
        return ("reversed" if away.margin >= DECIDED_MARGIN else "not decided at this scale"), toward.margin
    # "equal": the interval inside the band threshold ± tolerance reproduces; wholly outside it reverses
    band = stats.inside(result, threshold - tolerance, threshold + tolerance)
    if band.margin >= DECIDED_MARGIN:
        return "reproduced", band.margin
    out = [stats.above(result, threshold + tolerance), stats.below(result, threshold - tolerance)]
    return ("reversed" if any(e.margin >= DECIDED_MARGIN for e in out) else "not decided at this scale"), band.margin


def row(key: str, claim: str, paper: str, result: stats.Interval | stats.Comparison | None, *,
        section: str, expect: str = "above", threshold: float = 0.0, tolerance: float | None = None,
        digits: int = 1, scale: float = 1.0, unit: str = "", not_run: str = "not run in this profile") -> Row:
    """Score one claim of a paper against this run and glue the row for the book's scoreboard page.

    ``claim``: the paper's claim in a few words ("learnt gates beat random gates, FC4 on MNIST"); ``paper``:
    its number and source ("+1.8 points (Table 1 of cite:KEY)": ``cite:KEY`` becomes a citation of the
    bibliography key KEY on the scoreboard page; a MyST role in the chapter's code would show as raw markup); ``result``: this
    run's interval or paired comparison (``None``: not run, with ``not_run`` saying why); ``expect``:
    ``"above"`` or ``"below"`` (the paper's direction against ``threshold``) or ``"equal"`` (within
    ``± tolerance`` of ``threshold``, as in "A matches B"); ``section``: the label of the chapter's section
    that runs it (the page links there); ``digits``, ``scale``, ``unit``: how the interval is shown.
    """
    if not key or not key.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"a scoreboard key is a non-empty name of letters, digits, - and _, got {key!r}")
    if expect not in ("above", "below", "equal"):
        raise ValueError(f"expect must be 'above', 'below' or 'equal' (the paper's direction), got {expect!r}")
    if expect == "equal" and not (tolerance is not None and tolerance > 0):
        raise ValueError("expect='equal' needs a positive tolerance: the band threshold ± tolerance in which "
                         "the paper's 'A matches B' counts as reproduced")
    if not section:
        raise ValueError("section must name the label of the chapter's section that runs the experiment")
    if result is None:
        verdict, margin, shown = "not run", None, not_run
    else:
        verdict, margin = _verdict(result, expect, threshold, tolerance)
        iv = result.difference if isinstance(result, stats.Comparison) else result
        shown = iv.format(digits, scale) + f"{unit} ({iv.method}, n = {iv.n})"
    if margin is not None and not math.isfinite(margin):
        margin = 1e9 if margin > 0 else -1e9
    out = Row(key, claim, paper, shown, verdict, margin, section)
    glue(PREFIX + key, json.dumps(asdict(out)), display=False)
    return out
