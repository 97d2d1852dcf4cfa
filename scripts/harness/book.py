"""The book's sources (the table of contents and its chapters) and the folders a build writes."""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jupytext
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
REFERENCES = ROOT / "tests" / "reference"
RECORDED_WITH = REFERENCES / "recorded-with.json"


@dataclass(frozen=True)
class Build:
    """Where a build puts what it makes: the prepared chapters (nbtest, smoke, robust/seed<N>), the claims of
    every run, the executed chapters and their status.json (the root conftest.py writes both), the stage."""

    nbtest: Path
    smoke: Path
    robust: Path  # make robustness: the cpu chapters under other seeds (robust/seed<N>)
    claims: Path  # the root conftest.py writes every run's claims here, one JSON file per chapter and run
    executed: Path
    status: Path  # written by the root conftest.py at the end of a session that ran chapters
    stage: Path

    @classmethod
    def default(cls, build: Path = ROOT / "_build") -> Build:
        """The folders under _build/; the stage is $DUALVIEW_STAGE if set (make test stages the course build
        apart)."""
        return cls(nbtest=build / "nbtest", smoke=build / "smoke", robust=build / "robust", claims=build / "claims",
                   executed=build / "executed", status=build / "executed" / "status.json",
                   stage=Path(os.environ.get("DUALVIEW_STAGE") or build / "stage"))


def executed_copy(executed: Path, chapter: Path) -> Path:
    """The executed notebook of a chapter in the folder ``executed``."""
    return executed / chapter.relative_to(ROOT).with_suffix(".ipynb")


def toc_files() -> list[Path]:
    """Source files of every entry of ``_toc.yml``, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    names = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                names.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk({k: v for k, v in toc.items() if k != "root"})
    files = []
    for name in names:
        for suffix in (".md", ".ipynb"):
            path = ROOT / f"{name}{suffix}"
            if path.exists():
                files.append(path)
                break
        else:
            raise FileNotFoundError(f"_toc.yml lists '{name}', but neither {name}.md nor {name}.ipynb exists")
    return files


def is_notebook(path: Path) -> bool:
    return path.suffix == ".md" and "kernelspec" in jupytext.read(path).metadata


def chapters(only: Sequence[Path] = ()) -> list[Path]:
    """The notebook chapters of the table of contents, or ``only`` those (the command line's --chapter)."""
    if only:
        return list(only)
    return [p for p in toc_files() if is_notebook(p)]


def chapter_titles(only: Sequence[Path] = ()) -> dict[str, str]:
    """{'book/01_paths.ipynb': '1. Paths, ...', ...}: the chapters' names in status.json and their titles."""
    titles = {}
    for ch in chapters(only):
        heading = re.search(r"^# (.+)$", ch.read_text(encoding="utf-8"), re.M)
        name = ch.relative_to(ROOT).with_suffix(".ipynb").as_posix()
        titles[name] = heading.group(1).strip() if heading else ch.stem
    return titles


def repository() -> str:
    """The repository of _config.yml (repository.url), without a trailing slash."""
    url = (yaml.safe_load((ROOT / "_config.yml").read_text()).get("repository") or {}).get("url")
    if not url:
        sys.exit("_config.yml has no repository.url: the Colab copies install the library from there")
    return url.rstrip("/")
