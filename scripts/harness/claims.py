"""The claims report (every `stats.claim` of the recorded runs) and the scoreboard (the rows the executed
chapters glued): its page, and the verdicts the introduction links to."""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat

from .book import ROOT, chapter_titles, chapters, executed_copy

BOOK_RUN = "book run"  # the claims of the run the book is built from (SEED = 0): the root conftest.py's name


def claim_runs(claims: Path) -> dict[str, list[dict]]:
    """The claims recorded in the folder ``claims`` by run ("book run (SEED = 0)", "SEED = 1", ...), each with
    chapter and cell."""
    runs: dict[str, list[dict]] = {}
    for path in sorted(claims.glob("*/*.json")):
        runs.setdefault(path.parent.name, []).extend(json.loads(path.read_text()))
    return runs


def claims_report(claims: Path) -> None:
    """Print every claim that fails, or holds with margin < 1 or without an interval, in the runs recorded in
    the folder ``claims``.

    The book's rule: an asserted claim holds with margin >= 1 in the book run and holds (margin > 0) under
    the other seeds. Exit 1 if a claim fails in any run, or holds with margin < 1 or without an interval in
    the book run; a margin below 1 under another seed is listed (a thin claim) but allowed."""
    runs = claim_runs(claims)
    if not runs:
        sys.exit(f"no claims recorded in {claims.relative_to(ROOT)}: execute the chapters first "
                 "(make test, make book or make robustness)")
    if BOOK_RUN not in runs:
        print(f"(no claims of the book run in {claims.relative_to(ROOT)}: run make test or make book for its "
              "margins)")
    failed = weak = bare = 0
    for run, found in runs.items():
        n_fail = sum(not c["holds"] for c in found)
        n_weak = sum(c["holds"] and c["margin"] is not None and c["margin"] < 1 for c in found)
        n_bare = sum(c["margin"] is None for c in found)
        failed += n_fail
        if run == BOOK_RUN:
            weak, bare = weak + n_weak, bare + n_bare
        print(f"{run}: {len(found)} claims in {len({c['chapter'] for c in found})} chapters; "
              f"{n_fail} fail, {n_weak} hold with margin < 1, {n_bare} without an interval"
              + ("" if run == BOOK_RUN else " (allowed under another seed if >= 1 in the book run)"))
        for c in sorted(found, key=lambda c: (c["chapter"], c["cell"])):
            if c["holds"] and (c["margin"] is None or c["margin"] >= 1):
                continue
            state = ("FAILS" if not c["holds"] else "no interval" if c["margin"] is None
                     else f"margin {c['margin']:.2f}")
            print(f"  {c['chapter']}, cell {c['cell']}: {state}: {c['message']}")
            for detail in c["details"]:
                print(f"      {detail}")
    print(f"in all: {failed} failed claim(s) in any run; in the book run {weak} claim(s) with margin < 1 and "
          f"{bare} without an interval")
    sys.exit(1 if failed or weak or bare else 0)


SCOREBOARD_MARKER = "<!-- scoreboard -->"  # replaced by the rows glued in the executed chapters (book/scoreboard.md)
SCOREBOARD_PREFIX = "scoreboard__"  # dualview.scoreboard.PREFIX


def scoreboard_rows(executed: Path, only: Sequence[Path] = ()) -> list[tuple[str, dict]]:
    """The scoreboard rows glued in the chapters executed into the folder ``executed``, in chapter order:
    ('book/NN_x.ipynb', row)."""
    import ast

    rows = []
    for ch in chapters(only):
        path = executed_copy(executed, ch)
        if not path.exists():
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            for out in cell.get("outputs", []):
                scrap = out.get("metadata", {}).get("scrapbook", {})
                if scrap.get("name", "").startswith(SCOREBOARD_PREFIX):  # myst-nb's glue keeps the repr
                    text = out["data"][scrap.get("mime_prefix", "") + "text/plain"]
                    rows.append((ch.relative_to(ROOT).with_suffix(".ipynb").as_posix(),
                                 json.loads(ast.literal_eval(text))))
    return rows


# a citation in a row's text: "cite:KEY" (chapters write it so, as a {cite} role in their code would show as raw
# markup on the page of the chapter); the scoreboard page turns it into the role
_CITE = re.compile(r"\bcite:([A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)*)")


def scoreboard_page(rows: list[tuple[str, dict]], only: Sequence[Path] = ()) -> str:
    """The scoreboard: a count per verdict, then one table per chapter (claim, paper, this run, verdict)."""
    if not rows:
        return "No chapter of this build glued a scoreboard row (execute the chapters first: `make book`).\n"
    titles = chapter_titles(only)
    verdicts = ("reproduced", "not decided at this scale", "reversed", "not run")
    counts = {v: sum(r["verdict"] == v for _, r in rows) for v in verdicts}
    lines = ["| verdict | claims |", "|---|---|"] + [f"| {v} | {counts[v]} |" for v in verdicts] + [""]
    for stem in dict.fromkeys(s for s, _ in rows):
        lines += [f"## {titles.get(stem, stem)}", "", "| the papers' claim | paper | this run | verdict |",
                  "|---|---|---|---|"]
        for _, r in ((s, r) for s, r in rows if s == stem):
            cell = lambda t: _CITE.sub(r"{cite}`\1`", str(t).replace("|", "\\|").replace("\n", " "))  # noqa: E731
            lines.append(f"| <span id=\"sb-{r['key']}\"></span>{cell(r['claim'])} ({{ref}}`section <{r['section']}>`) "
                         f"| {cell(r['paper'])} | {cell(r['this_run'])} | **{r['verdict']}** |")
        lines.append("")
    return "\n".join(lines)


_VERDICT = re.compile(r"<!-- verdict ([A-Za-z0-9_-]+) -->")


def verdict_links(page: str, rows: list[tuple[str, dict]], where: str) -> str:
    """Replace each ``<!-- verdict KEY -->`` of a plain page (the introduction's summaries) by the verdict of
    the scoreboard row KEY, linked to that row: the page says what the run supports, whatever it is."""
    by_key = {r["key"]: r for _, r in rows}
    missing = sorted({k for k in _VERDICT.findall(page) if k not in by_key})
    if missing and rows:
        sys.exit(f"{where} names scoreboard rows that no executed chapter glued: {missing} "
                 "(a chapter's dualview.scoreboard.row key changed, or the chapter was not executed)")

    def link(m: re.Match) -> str:
        r = by_key.get(m.group(1))
        if r is None:  # nothing executed (a build of the plain pages alone)
            return "(not run in this build)"
        return f'<a class="reference internal" href="scoreboard.html#sb-{r["key"]}"><strong>{r["verdict"]}</strong></a>'

    return _VERDICT.sub(link, page)
