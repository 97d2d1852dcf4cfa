"""Student notebooks: each chapter's Colab copy without the solutions of its exercises, with answer cells.

    python scripts/student.py write     book/<ch>.md -> book/student/<ch>.ipynb (`make student`, `make sync`)
    python scripts/student.py check     fail if a committed student notebook is missing or out of date (`make test`)

A student notebook is the chapter as Colab opens it (``book/<ch>.ipynb``, plain Markdown, see
scripts/notebooks.py) with every solution cell and solution paragraph removed (the gated
``solution-start``/``solution-end`` blocks, as in the course build), a first cell with its own Colab link
and a link to the chapter's page of the course (not to the solutions), and after each exercise an empty
answer cell; where the answer is a number, a tuple of numbers or a short function (ANSWERS), the answer
cell is followed by a self-check, ``dualview.exercises.check(label, answer_<n>, ...)``, which says right or
wrong without showing the solution, and "not answered yet" while the answer is ``...``. The notebooks are
committed, because Colab opens files from the repository named in ``_config.yml``.

The same file is a Sphinx extension for the course build (``make html HIDE_SOLUTIONS=1``, where
``notebooks.py stage`` adds it): each chapter's Colab button then opens the student notebook.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import notebooks  # noqa: E402  (the chapters, their Colab copies, the removal of solutions)

ROOT = notebooks.ROOT
STUDENT = ROOT / "book" / "student"
_EXERCISE_HEADING = re.compile(r"^#### Exercise (\d+)$", re.M)
# a fill-in line of a chapter's code cell tagged `fill-in`: `name = expression  # fill-in: what to compute`;
# the student notebook keeps `name = ...  # fill in: what to compute`
FILL_IN_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<name>[A-Za-z_][\w, ]*?)[ \t]*=[ \t]*(?P<solution>\S.*?)[ \t]*"
                          r"#[ \t]*fill-in\b:?[ \t]*(?P<hint>.*)$", re.M)

# The exercises with a self-check (dualview.exercises), by label: what the answer cell asks for, and what the
# check needs from the chapter's own variables besides the answer.
ANSWERS = {
    "ex-paths-count": ("a function of the layer sizes [d_in, w_1, ..., C] returning the number of paths, "
                       "bias paths included", ""),
    "ex-patterns": ("the number of distinct gate patterns of the digits network on x_test", "model=fc, x=x_test"),
    "ex-resnet-count": ("(number of paths, share through all four blocks, share skipping block 2)", ""),
    "ex-dgn-temperature": ("a function slope(q, temperature): the derivative of sigmoid(q / temperature) "
                           "with respect to q", ""),
    "ex-leveling-hc": ("the log alpha at which P(z = 0) = P(z = 1)", ""),
    "ex-npk-sigma": ("a function constant(sigmas) returning c in E[NTK] = c * NPK", ""),
    "ex-conv-pool": ("a function factor(d_in): what global average pooling multiplies the NPK by", ""),
    "ex-npk-diag": ("the average of overlap(x, x)^(1/(L-1)) / w over the first 200 test digits",
                    "model=mlp_cpu, x=xk_te[:200]"),
}


def colab_link(path: Path) -> str:
    """The Colab address of a notebook of this repository, as the book's Colab buttons build it from
    ``_config.yml`` (``repository`` and ``launch_buttons.colab_url``)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repository = config.get("repository", {})
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", repository.get("url", ""))
    if match is None:
        sys.exit(f"_config.yml: repository.url is {repository.get('url')!r}; Colab opens notebooks from a "
                 "GitHub repository, so set it to https://github.com/<owner>/<name>")
    colab = config.get("launch_buttons", {}).get("colab_url", "https://colab.research.google.com").rstrip("/")
    book = repository.get("path_to_book", "").strip("/")
    in_repo = "/".join(filter(None, [book, path.relative_to(ROOT).as_posix()]))
    return f"{colab}/github/{match[1]}/{match[2]}/blob/{repository.get('branch', 'main')}/{in_repo}"


def student_path(chapter: Path) -> Path:
    return STUDENT / chapter.with_suffix(".ipynb").name


def answer_cells(label: str | None, number: int) -> list:
    """The cells a student answers Exercise ``number`` in: an empty answer cell, and a self-check if the
    exercise has one (ANSWERS)."""
    if label not in ANSWERS:
        return [nbformat.v4.new_code_cell(f"# Exercise {number}: your answer (code here; reasoning in a text cell)\n")]
    asks, given = ANSWERS[label]
    name = f"answer_{number}"
    return [nbformat.v4.new_code_cell(f"# Exercise {number}: {asks}\n{name} = ..."),
            nbformat.v4.new_code_cell(f"# Exercise {number}: check your answer (run it again after changing it)\n"
                                      "from dualview import exercises\n\n"
                                      f"exercises.check({label!r}, {name}{', ' + given if given else ''})")]


def blank_fill_ins(source: str, where: str = "a fill-in cell") -> str:
    """A fill-in cell as the student notebook shows it: each marked line's expression replaced by ``...``."""
    blanked, count = FILL_IN_LINE.subn(
        lambda m: f"{m['indent']}{m['name']} = ...  # fill in" + (f": {m['hint']}" if m["hint"] else ""), source)
    if not count:
        raise ValueError(f"{where} is tagged fill-in but has no line `name = expression  # fill-in: hint`; mark "
                         "the line the reader writes, or remove the tag")
    return blanked


def fill_in_names(source: str) -> list[str]:
    """The names a fill-in cell's marked lines assign."""
    return [name.strip() for m in FILL_IN_LINE.finditer(source) for name in m["name"].split(",")]


def course_page(chapter: Path) -> str:
    """The chapter's page in the online course build (the course is published where the book is)."""
    return notebooks.pages_url() + "/" + chapter.relative_to(ROOT).with_suffix(".html").as_posix()


def student_notebook(chapter: Path):
    """The student notebook of ``chapter`` (its exercises numbered as the book numbers them)."""
    nb = notebooks._colab_copy(chapter, solutions=False)
    labels = {number: label for label, number in nb.metadata["dualview"]["exercises"].items()}
    cells = []
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "fill-in" in cell.metadata.get("tags", []):
            cell.source = blank_fill_ins(cell.source, f"{chapter.name}, cell {k}")
            cell.outputs = []
        cells.append(cell)
        for match in _EXERCISE_HEADING.finditer(cell.source) if cell.cell_type == "markdown" else []:
            number = int(match[1])
            for k, extra in enumerate(answer_cells(labels.get(number), number)):
                extra.id = f"answer{number}{'abcdefgh'[k]}"
                cells.append(extra)
    header = nbformat.v4.new_markdown_cell(
        "*Student notebook*: the chapter with its exercises and without their solutions. "
        f"[Open it in Colab]({colab_link(student_path(chapter))}); the chapter's page in the course: "
        f"[{course_page(chapter).rsplit('/', 1)[-1]}]({course_page(chapter)}). Each exercise is followed by an "
        "empty answer cell; where the answer is a number or a short function, a check cell after it says "
        "whether your answer is right (it does not show the solution). Inside the chapter, cells with a "
        "`...  # fill in` line ask you to compute one thing yourself; the cell after each says whether "
        "your value is right.")
    header.id = "student0"
    nb.cells = [header, *cells]
    return nb


def student_notebooks() -> dict[Path, object]:
    """Every chapter's student notebook, by the path it is committed at."""
    return {student_path(chapter): student_notebook(chapter) for chapter in notebooks.chapters()}


def write() -> None:
    STUDENT.mkdir(parents=True, exist_ok=True)
    wanted = student_notebooks()
    for stale in set(STUDENT.glob("*.ipynb")) - set(wanted):
        stale.unlink()
        print(f"removed {stale.relative_to(ROOT)} (its chapter is not in _toc.yml)")
    for path, nb in wanted.items():
        nbformat.write(nb, path)
        print(f"wrote {path.relative_to(ROOT)}")


def check() -> None:
    wanted = student_notebooks()
    stale = [f"{p.relative_to(ROOT)} is not a chapter's student notebook" for p in set(STUDENT.glob("*.ipynb")) - set(wanted)]
    for path, nb in wanted.items():
        if not path.exists():
            stale.append(f"{path.relative_to(ROOT)} is missing")
        elif [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells] != \
                [(c.cell_type, c.source) for c in nb.cells]:
            stale.append(f"{path.relative_to(ROOT)} differs from its chapter")
    if stale:
        sys.exit("The student notebooks are out of date; run `make student` and commit book/student/:\n  "
                 + "\n  ".join(sorted(stale)))


def _colab_button_to_student(app, pagename, templatename, context, doctree) -> None:
    """html-page-context (after sphinx-book-theme's launch buttons): a chapter's Colab button opens its
    student notebook."""
    student = STUDENT / f"{Path(pagename).name}.ipynb"

    def visit(buttons):
        for button in buttons:
            if button.get("text") == "Colab":
                if not student.exists():
                    raise RuntimeError(f"{pagename}: the course build links its Colab button to "
                                       f"{student.relative_to(ROOT)}, which does not exist; run `make student`")
                button["url"] = colab_link(student)
            visit(button.get("buttons", []))

    visit(context.get("header_buttons", []))


def setup(app):
    app.connect("html-page-context", _colab_button_to_student, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["write", "check"])
    {"write": write, "check": check}[parser.parse_args().command]()
