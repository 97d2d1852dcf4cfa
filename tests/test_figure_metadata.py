"""Every figure of the chapters can be read and cited: each code cell that draws one carries myst-nb's
cell metadata for a numbered figure (``mystnb.figure.caption`` and ``name``) and an alt text for its image
(``mystnb.image.alt``). Runs on the MyST sources in seconds; tests/rendered/test_figures.py checks the
built HTML.

A cell draws a figure when it calls matplotlib (``plt.…``), dualview's figure helpers (``plot.…``) or a
function defined earlier in the chapter that does. Cells whose output the page removes (tags
``remove-output``, ``remove-cell``) are exempt. An animation made by ``plot.animate(…, alt=…)`` has
its alt text from that argument.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
PLOT_MODULES = {"plt", "plot"}  # matplotlib.pyplot and dualview.plot, as the chapters import them
HIDDEN = {"remove-output", "remove-cell"}
FILE_NAME = re.compile(r"\.(png|jpe?g|svg|gif)\b|[0-9a-f]{64}", re.I)


def _calls(node: ast.AST, into_definitions: bool):
    """The calls under ``node``; without ``into_definitions``, those that run when the cell runs."""
    stack = [node]
    while stack:
        current = stack.pop()
        for child in ast.iter_child_nodes(current):
            if into_definitions or not isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)
        if isinstance(current, ast.Call):
            yield current


def _plots(call: ast.Call, plotters: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in plotters
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in PLOT_MODULES


def plotting_cells(nb: nbformat.NotebookNode) -> list[int]:
    """Indices of the code cells that draw a figure when they run."""
    plotters: set[str] = set()
    found = []
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics; tests/test_code_lines.py checks the rest parses
            continue
        definitions = [d for d in ast.walk(tree) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for _ in definitions:  # a definition may call one defined after it in the same cell
            new = {d.name for d in definitions if d.name not in plotters
                   and any(_plots(c, plotters) for c in _calls(d, into_definitions=True))}
            if not new:
                break
            plotters |= new
        if any(_plots(c, plotters) for c in _calls(tree, into_definitions=False)):
            found.append(k)
    return found


def _animation_alt(source: str, keyword: str = "alt") -> bool:
    """Whether the cell calls plot.animate with a non-empty ``keyword`` (alt= or caption=) text."""
    for call in _calls(ast.parse(source), into_definitions=False):
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr == "animate":
            for kw in call.keywords:
                if kw.arg == keyword and not (isinstance(kw.value, ast.Constant) and not kw.value.value):
                    return True
    return False


def figure_problems(nb: nbformat.NotebookNode, number: str) -> list[str]:
    """What is missing from the figure cells of one chapter (``number``: its two digits)."""
    problems = []
    for k in plotting_cells(nb):
        cell = nb.cells[k]
        if HIDDEN & set(cell.metadata.get("tags", [])):
            continue
        where = f"code cell {k} ({cell.source.strip().splitlines()[0][:50]!r})"
        options = cell.metadata.get("mystnb", {})
        figure, image = options.get("figure", {}), options.get("image", {})
        caption, alt, name = figure.get("caption"), image.get("alt"), figure.get("name")
        if not (isinstance(caption, str) and caption.strip()) and not _animation_alt(cell.source, "caption"):
            problems.append(f"{where}: no mystnb.figure.caption (an animation: plot.animate(caption=...))")
        if not (isinstance(alt, str) and alt.strip()) and not _animation_alt(cell.source):
            problems.append(f"{where}: no mystnb.image.alt")
        elif isinstance(alt, str) and FILE_NAME.search(alt):
            problems.append(f"{where}: the alt text {alt!r} is a file name, not a description")
        if name is not None and not re.fullmatch(rf"fig-ch{number}-[a-z0-9-]+", str(name)):
            problems.append(f"{where}: figure name {name!r} is not fig-ch{number}-<short name>")
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_every_figure_has_a_caption_and_alt_text(chapter):
    nb = jupytext.read(chapter)
    assert plotting_cells(nb), f"{chapter.name}: no figure cell found; is the detection broken?"
    problems = figure_problems(nb, chapter.name[:2])
    assert not problems, (
        f"{chapter.name}: figure cells without caption or alt text:\n  " + "\n  ".join(problems) +
        "\nAdd after the ```{code-cell} ipython3 line:\n---\nmystnb:\n  figure:\n"
        "    caption: <what it shows>\n"
        f"    name: fig-ch{chapter.name[:2]}-<short name>\n  image:\n    alt: <what is drawn>\n---")


def test_figure_names_are_unique():
    names = Counter(name for ch in CHAPTERS for cell in jupytext.read(ch).cells
                    if (name := cell.metadata.get("mystnb", {}).get("figure", {}).get("name")))
    assert names, "no named figure in the chapters"
    duplicates = sorted(name for name, n in names.items() if n > 1)
    assert not duplicates, f"figure names used more than once (Sphinx needs unique labels): {duplicates}"


def _notebook(*cells: tuple[str, dict]) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(src, metadata=meta) for src, meta in cells])


def test_detection_of_figure_cells():
    nb = _notebook(
        ("x = 1\nprint(x)", {}),                                             # 0: no figure
        ("fig, ax = plt.subplots()\nax.plot([1, 2])", {}),                   # 1: matplotlib
        ("def draw(v):\n    return plot.heatmap_grid(v, {})", {}),           # 2: only defines
        ("def outer(v):\n    return draw(v)", {}),                           # 3: only defines
        ("outer(3)", {}),                                                    # 4: calls a plotter
        ("im = plt.imshow([[0]])", {"tags": ["remove-output"]}),             # 5: hidden
        ("xs = [draw for _ in range(2)]", {}),                               # 6: names it, no call
    )
    assert plotting_cells(nb) == [1, 4, 5]
    problems = figure_problems(nb, "01")
    assert len(problems) == 4 and all("cell 1" in p or "cell 4" in p for p in problems), problems


def test_the_check_accepts_complete_metadata_and_rejects_file_names():
    good = {"mystnb": {"figure": {"caption": "A curve.", "name": "fig-ch01-curve"},
                       "image": {"alt": "A rising blue line."}}}
    nb = _notebook(("plt.plot([1, 2])", good))
    assert figure_problems(nb, "01") == []
    assert figure_problems(nb, "02") == [
        "code cell 0 ('plt.plot([1, 2])'): figure name 'fig-ch01-curve' is not fig-ch02-<short name>"]
    hashed = "../_images/" + "ab" * 32 + ".png"
    bad = {"mystnb": {"figure": {"caption": "A curve."}, "image": {"alt": hashed}}}
    assert "file name" in figure_problems(_notebook(("plt.plot([1, 2])", bad)), "01")[0]
    animation = _notebook(('plot.animate(draw, 3, alt="a dot moving right")',
                           {"mystnb": {"figure": {"caption": "A moving dot."}}}))
    assert figure_problems(animation, "01") == []
