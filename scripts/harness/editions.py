"""The book's two editions: the full book, and the course build (HIDE_SOLUTIONS=1, and the student notebooks)
that leaves out the exercises' solutions and the answers of the concept checks."""
from __future__ import annotations

import re

# A plain page's text for one edition: <!-- book-only --> ... <!-- /book-only --> is shown in the full book
# only, a comment <!-- course-only ... --> is shown (uncommented) in the course build (HIDE_SOLUTIONS=1) only.
_BOOK_ONLY = re.compile(r"^<!-- book-only -->[ \t]*\n(.*?)^<!-- /book-only -->[ \t]*\n?", re.S | re.M)
_COURSE_ONLY = re.compile(r"^<!-- course-only[ \t]*\n(.*?)^-->[ \t]*\n?", re.S | re.M)


def edition_text(text: str, course: bool) -> str:
    """The page as the full book (course=False) or the course build (course=True) shows it."""
    text = _BOOK_ONLY.sub("" if course else r"\1", text)
    return _COURSE_ONLY.sub(r"\1" if course else "", text)


_SOLUTION_FENCE = re.compile(r"```\{solution-(start|end)\}[^\n]*\n(?:[^`]*?\n)?```[ \t]*\n?")
# the answer to a concept check ("Predict, then run"): a collapsed admonition of class predict-answer
PREDICT_ANSWER = re.compile(r"^(`{3,})\{admonition\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*?:class:[^\n]*\bpredict-answer\b"
                            r"[^\n]*\n.*?^\1[ \t]*(?:\n|$)", re.S | re.M)


def without_solutions(nb):
    """The notebook without the solutions of its exercises (gated solution-start/solution-end blocks) and
    without the answers of its concept checks (admonitions of class predict-answer)."""
    inside, cells = False, []
    for cell in nb.cells:
        if cell.cell_type == "code":
            if not inside:
                cells.append(cell)
            continue
        cell.source = PREDICT_ANSWER.sub("", cell.source)
        kept, pos = [], 0
        for match in _SOLUTION_FENCE.finditer(cell.source):
            if not inside:
                kept.append(cell.source[pos:match.start()])
            inside = match.group(1) == "start"
            pos = match.end()
        if not inside:
            kept.append(cell.source[pos:])
        cell.source = "".join(kept).strip()
        if cell.source:
            cells.append(cell)
    nb.cells = cells
    return nb
