"""_build/stage: the configuration, the plain pages (with their generated parts) and the executed chapters,
assembled for jupyter-book; the course build (HIDE_SOLUTIONS=1) without the exercises' solutions."""
from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat
import yaml

from .book import ROOT, SCRIPTS, Build, chapter_titles, is_notebook, toc_files
from .claims import SCOREBOARD_MARKER, scoreboard_page, scoreboard_rows, verdict_links
from .editions import edition_text, without_solutions
from .instructor import READING_MARKER, TIMES_MARKER, chapter_times, reading_times


def stage(build: Build, only: Sequence[Path] = ()) -> None:
    """Assemble ``build.stage`` from the sources and the chapters executed into ``build.executed`` (the
    generated tables and the scoreboard over ``only`` those chapters, if given)."""
    if build.stage.exists():
        shutil.rmtree(build.stage)
    build.stage.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml", "references.bib"):
        shutil.copy2(ROOT / name, build.stage / name)
    hide = os.environ.get("HIDE_SOLUTIONS") == "1"  # a course build: exercises without their solutions
    if hide:  # and its Colab buttons open the student notebooks (scripts/student.py, a Sphinx extension)
        config = yaml.safe_load((build.stage / "_config.yml").read_text())
        config["sphinx"].setdefault("local_extensions", {})["student"] = str(SCRIPTS)
        (build.stage / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    for path in toc_files():
        rel = path.relative_to(ROOT)
        if is_notebook(path):
            src = build.executed / rel.with_suffix(".ipynb")
            if not src.exists():
                sys.exit(f"{src} does not exist: execute the chapters first (make notebooks)")
            dst = build.stage / rel.with_suffix(".ipynb")
        else:
            src, dst = path, build.stage / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if hide and dst.suffix == ".ipynb":
            nbformat.write(without_solutions(nbformat.read(src, as_version=4)), dst)
        elif dst.suffix == ".md":  # a plain page: the build's own text, the measured chapter times
            page = edition_text(src.read_text(encoding="utf-8"), course=hide)
            if TIMES_MARKER in page:
                status = json.loads(build.status.read_text()) if build.status.exists() else None
                page = page.replace(TIMES_MARKER, chapter_times(status, chapter_titles(only)))
            if READING_MARKER in page:
                status = json.loads(build.status.read_text()) if build.status.exists() else None
                page = page.replace(READING_MARKER, reading_times(status, only))
            if SCOREBOARD_MARKER in page:
                page = page.replace(SCOREBOARD_MARKER, scoreboard_page(scoreboard_rows(build.executed, only), only))
            page = verdict_links(page, scoreboard_rows(build.executed, only), str(rel))
            dst.write_text(page, encoding="utf-8")
        else:
            shutil.copy2(src, dst)
    for folder in ("book/images",):
        if (ROOT / folder).exists():
            shutil.copytree(ROOT / folder, build.stage / folder)
