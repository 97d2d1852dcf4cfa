"""The chapters' code fits the page: no code line over 88 characters (longer lines run off the right edge of
the book's code cells and of a Colab cell at its default width), and every code cell is valid Python."""
from __future__ import annotations

import ast
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
LIMIT = 88


def code_cells(path: Path) -> list[str]:
    return [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_code_lines_fit(chapter):
    long = [(k, line) for k, src in enumerate(code_cells(chapter)) for line in src.splitlines()
            if len(line) > LIMIT]
    assert not long, (f"{chapter.name}: {len(long)} code line(s) over {LIMIT} characters, e.g. code cell "
                      f"{long[0][0]}: {long[0][1]!r}; wrap them (black -l 88 does most of it)")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_code_cells_parse(chapter):
    for k, src in enumerate(code_cells(chapter)):
        if any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()):
            continue  # IPython magics and shell lines are not Python
        try:
            ast.parse(src)
        except SyntaxError as e:
            pytest.fail(f"{chapter.name}, code cell {k}: {e}")


def test_the_limit_is_checked():
    assert CHAPTERS, "no chapters found under book/"
    assert any(len(line) > 60 for ch in CHAPTERS for src in code_cells(ch) for line in src.splitlines())
