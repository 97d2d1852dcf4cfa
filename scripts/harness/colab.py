"""The Colab copies book/<ch>.ipynb: each chapter as a plain notebook (see plain.Plain) whose setup cell installs
the library at a pinned revision, with the values glued by the book's run; writing them (sync) and checking
that the committed ones are up to date (check_sync)."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import jupytext
import nbformat

from .book import ROOT, chapters, executed_copy, is_notebook, repository, toc_files
from .editions import without_solutions
from .plain import BOOK_RUN_MARK, NOT_RUN_TEXT, Plain

# the setup cell's install line: MyST sources carry the placeholders, Colab copies the address and revision
INSTALL_PLACEHOLDER = "git+REPOSITORY@REVISION"
_PINNED = re.compile(r"git\+(\S+?)@([0-9a-f]{40})\b")


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def head_revision() -> str:
    revision = os.environ.get("DUALVIEW_REVISION") or git("rev-parse", "HEAD").stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        sys.exit(f"cannot pin the Colab copies: {revision!r} is not a full commit hash (set DUALVIEW_REVISION)")
    return revision


def pinned_revision(ipynb: Path) -> str | None:
    """The revision the setup cell of a committed Colab copy installs, if it pins one."""
    if ipynb.exists():
        for cell in nbformat.read(ipynb, as_version=4).cells:
            if cell.cell_type == "code" and (match := _PINNED.search(cell.source)):
                return match[2]
    return None


_EXERCISE_FENCE = re.compile(r"^(?:`{3,}|:{3,})\{exercise\}", re.M)


def first_exercise(chapter: Path) -> int:
    """The book's number of the chapter's first exercise (the HTML numbers them through the chapters)."""
    number = 1
    for other in (p for p in toc_files() if is_notebook(p)):
        if other == chapter:
            break
        number += len(_EXERCISE_FENCE.findall(other.read_text(encoding="utf-8")))
    return number


def committed_values(ipynb: Path) -> dict[str, str]:
    """The book-run values a committed Colab copy shows (its metadata), so that re-writing it without
    _build/executed/ (a fresh clone) or checking it (check-sync) does not depend on a run."""
    if not ipynb.exists():
        return {}
    return nbformat.read(ipynb, as_version=4).metadata.get("dualview", {}).get("book_run", {})


def book_run_values(chapter: Path, executed: Path) -> dict[str, str] | None:
    """The plain-text display of every value the chapter glued in the book's last run (executed into the
    folder ``executed``), or None if there is no executed copy."""
    path = executed_copy(executed, chapter)
    if not path.exists():
        return None
    values = {}
    for cell in nbformat.read(path, as_version=4).cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            meta = output.get("metadata", {}).get("scrapbook")
            text = output.get("data", {}).get((meta or {}).get("mime_prefix", "") + "text/plain")
            if meta and text is not None:
                values[meta["name"]] = text
    return values


def colab_copy(chapter: Path, revision: str | None = None, values: dict[str, str] | None = None,
               solutions: bool = True):
    """The Colab copy of a chapter: no jupytext header, plain Markdown (no MyST, see Plain), glued values
    from ``values`` (default: those its committed copy shows) marked as the book's run, stable cell ids,
    the install line pinned to ``revision`` (default: the revision its committed copy pins, else HEAD),
    GPU metadata if due. ``solutions=False``: without the exercises' solutions (the student notebook)."""
    nb = jupytext.read(chapter)
    nb.metadata.pop("jupytext", None)
    if not solutions:
        nb = without_solutions(nb)
    values = committed_values(chapter.with_suffix(".ipynb")) if values is None else values
    plain = Plain(values, first_exercise(chapter))
    revision = revision or pinned_revision(chapter.with_suffix(".ipynb")) or head_revision()
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = plain.markdown(cell.source)
            if not cell.source.strip():
                continue
        cell.source = cell.source.replace(INSTALL_PLACEHOLDER, f"git+{repository()}@{revision}")
        if "parameters" in cell.metadata.get("tags", []) and "CUDA device" in cell.source:
            nb.metadata["accelerator"] = "GPU"  # Colab opens the chapter on a GPU runtime
            nb.metadata["colab"] = {"gpuType": "T4", "provenance": []}
        cells.append(cell)
    if plain.used or plain.missing:
        cells.insert(1, nbformat.v4.new_markdown_cell(
            f"*Numbers in the text marked {BOOK_RUN_MARK} are those of the book's own run (the `cpu` profile)*; "
            "the cells compute this run's own, which may differ a little. A number not known before the "
            f"notebook runs reads {NOT_RUN_TEXT}. Every glued number is also in `dualview.glue.values`."))
    for k, cell in enumerate(cells):  # stable cell ids: re-syncing an unchanged chapter changes nothing
        cell.id = hashlib.sha1(f"{k}:{cell.source}".encode()).hexdigest()[:8]
    nb.cells = cells
    nb.metadata["dualview"] = {"book_run": {k: values[k] for k in sorted(plain.used)},
                               "exercises": plain.numbers}
    return nb


def compared(nb) -> list:
    return [(c.cell_type, c.source) for c in nb.cells] + \
        [nb.metadata.get(k) for k in ("accelerator", "colab", "dualview")]


def sync_revision(only: Sequence[Path] = ()) -> str:
    """HEAD (or $DUALVIEW_REVISION); but the revision the copies already pin while the library (src/,
    pyproject.toml) is the same there as at HEAD, so that a sync without library changes changes nothing."""
    head = head_revision()
    pins = {pinned_revision(ch.with_suffix(".ipynb")) for ch in chapters(only)}
    if len(pins) == 1 and None not in pins and not os.environ.get("DUALVIEW_REVISION"):
        (pin,) = pins
        if git("diff", "--quiet", pin, head, "--", "src", "pyproject.toml").returncode == 0:
            return pin
    return head


def sync(executed: Path, only: Sequence[Path] = ()) -> None:
    """Write the Colab copies, with the values glued by the chapters executed into ``executed`` (else those
    of the committed copies)."""
    revision = sync_revision(only)
    if git("status", "--porcelain", "--", "src", "pyproject.toml").stdout.strip():
        print(f"note: src/ or pyproject.toml has uncommitted changes, which the pinned revision {revision[:12]} "
              "lacks: commit the library, then run `make sync` again")
    for ch in chapters(only):
        values = book_run_values(ch, executed)
        source = "the book's run in _build/executed" if values is not None else "its committed copy"
        nbformat.write(colab_copy(ch, revision, values), ch.with_suffix(".ipynb"))
        print(f"wrote {ch.with_suffix('.ipynb').relative_to(ROOT)} (installs dualview at {revision[:12]}; "
              f"glued values from {source})")


def check_sync(only: Sequence[Path] = ()) -> None:
    stale, pins = [], {}
    for ch in chapters(only):
        ipynb = ch.with_suffix(".ipynb")
        if not ipynb.exists():
            stale.append(f"{ipynb.relative_to(ROOT)} is missing")
            continue
        pins[ipynb.name] = pinned_revision(ipynb)
        if pins[ipynb.name] is None:
            stale.append(f"{ipynb.relative_to(ROOT)} does not install dualview[book] pinned to a revision "
                         f"(its chapter's setup cell needs the line with {INSTALL_PLACEHOLDER})")
        elif compared(colab_copy(ch)) != compared(nbformat.read(ipynb, as_version=4)):
            stale.append(f"{ipynb.relative_to(ROOT)} differs from {ch.relative_to(ROOT)}")
    revisions = set(pins.values()) - {None}
    if len(revisions) > 1:
        stale.append("the copies pin different revisions: " + ", ".join(f"{k} {v}" for k, v in sorted(pins.items())))
    shallow = git("rev-parse", "--is-shallow-repository").stdout.strip() != "false"
    for revision in revisions:
        if not shallow and git("merge-base", "--is-ancestor", revision, "HEAD").returncode != 0:
            stale.append(f"the pinned revision {revision} is not a commit of this branch's history")
        elif not shallow and git("diff", "--quiet", revision, "HEAD", "--", "src", "pyproject.toml").returncode:
            print(f"note: the library changed since the revision the Colab copies install ({revision[:12]}); "
                  "`make sync` pins the new one")
    if shallow:
        print("note: a shallow clone: the revision the Colab copies install was not checked against the history")
    if stale:
        sys.exit("The Colab copies are out of date; run `make sync`:\n  " + "\n  ".join(stale))
