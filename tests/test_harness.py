"""The notebook harness (scripts/harness/, its command line scripts/notebooks.py): modules of one concern each,
none over 500 lines; no state kept between calls (--chapter selects for one command, the build folders are
read when a command runs, so a test may point them elsewhere)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import notebooks  # noqa: E402

HARNESS = ROOT / "scripts" / "harness"


def test_harness_modules_are_small_and_the_command_line_thin():
    sizes = {p.name: len(p.read_text().splitlines()) for p in HARNESS.glob("*.py")}
    assert len(sizes) >= 6 and all(n <= 500 for n in sizes.values()), sizes
    assert len((ROOT / "scripts" / "notebooks.py").read_text().splitlines()) <= 200


def test_harness_modules_keep_no_mutable_state():
    """No module-level list, dict or set that a function appends to: what a command works on is passed."""
    for path in HARNESS.glob("*.py"):
        tree = ast.parse(path.read_text())
        lists = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(t, ast.Name) and isinstance(node.value, (ast.List, ast.Set))}
        mutated = {n.func.value.id for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                   and n.func.value.id in lists and n.func.attr in ("append", "extend", "add", "clear")}
        globals_ = [n for n in ast.walk(tree) if isinstance(n, ast.Global)]
        assert not mutated and not globals_, (path.name, mutated, globals_)


def test_a_chapter_selection_lasts_one_command(monkeypatch, tmp_path):
    every = notebooks.chapters()
    chapter = ROOT / "book" / "03_convolution.md"
    monkeypatch.setattr(notebooks, "NBTEST", tmp_path)
    monkeypatch.setattr(sys, "argv", ["notebooks.py", "prepare", "--record", "--chapter", "book/03_convolution.md"])
    notebooks.main()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.ipynb")) == \
        ["book/03_convolution.ipynb"]
    injected = [c for c in nbformat.read(tmp_path / "book" / "03_convolution.ipynb", as_version=4).cells
                if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "PROFILE = \"cpu\"" in injected[0].source
    assert notebooks.chapters() == every and chapter in every and len(every) > 1


def test_the_build_folders_are_read_when_a_command_runs(monkeypatch, tmp_path):
    """Pointing EXECUTED at a folder holding one executed chapter: its glued values and scoreboard rows are read
    from there, and no other chapter counts as executed."""
    chapter = notebooks.chapters()[0]
    copy = tmp_path / chapter.relative_to(ROOT).with_suffix(".ipynb")
    copy.parent.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    glued = {"output_type": "display_data", "data": {"text/plain": "'0.97'"},
             "metadata": {"scrapbook": {"name": "acc", "mime_prefix": ""}}}
    row = {"output_type": "display_data", "data": {"text/plain": repr('{"key": "k", "verdict": "reproduced"}')},
           "metadata": {"scrapbook": {"name": "scoreboard__k", "mime_prefix": ""}}}
    nb.cells = [nbformat.v4.new_code_cell("x", outputs=[nbformat.from_dict(glued), nbformat.from_dict(row)])]
    nbformat.write(nb, copy)
    monkeypatch.setattr(notebooks, "EXECUTED", tmp_path)
    assert notebooks.book_run_values(chapter)["acc"] == "'0.97'"
    assert notebooks.book_run_values(notebooks.chapters()[1]) is None
    assert notebooks.scoreboard_rows() == [(copy.relative_to(tmp_path).as_posix(), {"key": "k", "verdict": "reproduced"})]
