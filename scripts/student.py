"""Student notebooks: each chapter's Colab copy without the solutions of its exercises.

    python scripts/student.py write     book/<ch>.md -> book/student/<ch>.ipynb (`make student`, `make sync`)
    python scripts/student.py check     fail if a committed student notebook is missing or out of date (`make test`)

A student notebook is the chapter as Colab opens it (``book/<ch>.ipynb``, see scripts/notebooks.py) with
every solution cell and solution paragraph removed (the gated ``solution-start``/``solution-end`` blocks,
as in the course build), the exercises turned from MyST directives into plain Markdown a notebook shows,
and a first cell with its own Colab link. The notebooks are committed, because Colab opens files from the
repository named in ``_config.yml``.

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
# an exercise directive: its fence, its options (:label: ...), its text, the closing fence of the same length
_EXERCISE = re.compile(r"^(`{3,})\{exercise\}[^\n]*\n((?::[\w-]+:[^\n]*\n)*)\n?(.*?)\n\1[ \t]*$", re.S | re.M)


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


def student_notebook(chapter: Path, first_exercise: int):
    """The student notebook of `chapter`; its exercises are numbered from `first_exercise` (the book's
    numbering runs through the chapters)."""
    nb = notebooks._without_solutions(notebooks._colab_copy(chapter))
    number = first_exercise

    def plain(match: re.Match) -> str:
        nonlocal number
        number += 1
        return f"**Exercise {number - 1}.** {match[3].strip()}"

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _EXERCISE.sub(plain, cell.source)
    header = nbformat.v4.new_markdown_cell(
        f"*Student notebook*: the exercises of this chapter without their solutions. "
        f"[Open it in Colab]({colab_link(student_path(chapter))}); the chapter with the solutions is "
        f"[book/{chapter.with_suffix('.ipynb').name}]({colab_link(chapter.with_suffix('.ipynb'))}).")
    header.id = "student0"
    nb.cells.insert(0, header)
    return nb


def student_notebooks() -> dict[Path, object]:
    """Every chapter's student notebook, by the path it is committed at."""
    out, first = {}, 1
    for chapter in notebooks.chapters():
        out[student_path(chapter)] = student_notebook(chapter, first)
        first += len(_EXERCISE.findall(chapter.read_text()))
    return out


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
