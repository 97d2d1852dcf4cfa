"""The instructor page's generated tables: the chapters' reading times (counted from their sources) and
execution times (measured by the last run)."""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import jupytext

from .book import ROOT, chapter_titles, chapters
from .cpu import cpu_model

TIMES_MARKER = "<!-- chapter-times -->"  # replaced by the measured execution times (book/instructor.md)
READING_MARKER = "<!-- reading-times -->"  # replaced by the reading-time table (book/instructor.md)
READING_WPM = 150  # words of technical prose a student reads per minute, formulas and figures included
CODE_LINES_PER_MINUTE = 10  # visible code lines a student reads (not writes) per minute


def reading_parts(ch: Path) -> list[tuple[str, int, int]]:
    """(section heading, prose words, visible code lines) of each ``##`` section of a chapter's source, the
    opening before the first ``##`` included; hidden/removed cells, solutions and reproducibility notes
    (collapsed) are not counted."""
    nb = jupytext.read(ch)
    parts: list[list] = [["Opening", 0, 0]]
    for cell in nb.cells:
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type == "markdown":
            text = re.sub(r"```\{admonition\} Reproducibility notes.*?```", "", cell.source, flags=re.S)
            text = re.sub(r"```\{solution-start\}.*?```\{solution-end\}[^\n]*\n```", "", text, flags=re.S)
            for block in re.split(r"^(?=## )", text, flags=re.M):
                heading = re.match(r"## (.+)", block)
                if heading:
                    parts.append([heading.group(1).strip(), 0, 0])
                prose = re.sub(r"\{[a-z:-]+\}`[^`]*`", "x", block)  # a role counts as one word
                parts[-1][1] += len(re.findall(r"[A-Za-z0-9$\\]+", prose))
        elif cell.cell_type == "code" and not tags & {"remove-cell", "hide-input", "remove-input", "parameters"}:
            parts[-1][2] += sum(1 for line in cell.source.splitlines() if line.strip())
    return [tuple(p) for p in parts if p[1] or p[2]]


def reading_times(status: dict | None = None, only: Sequence[Path] = ()) -> str:
    """The instructor page's table: per chapter and section, words and code lines and the reading time they
    take at READING_WPM words and CODE_LINES_PER_MINUTE code lines a minute, with the chapter's execution
    time where it was measured."""
    timed = {name: e for name, e in (status or {}).get("chapters", {}).items() if e.get("run") == "cpu profile"}
    lines = [f"Reading time counted from the chapters' sources at {READING_WPM} words and "
             f"{CODE_LINES_PER_MINUTE} visible code lines a minute (collapsed notes and solutions not counted); "
             "execution time from the last run of the chapters. Teaching time in class is about twice the "
             "reading time of the sections covered.", "",
             "| Chapter, section | Words | Code lines | Reading time |", "|---|---:|---:|---:|"]
    for ch, title in zip(chapters(only), chapter_titles(only).values()):
        parts = reading_parts(ch)
        words, code = sum(p[1] for p in parts), sum(p[2] for p in parts)
        minutes = words / READING_WPM + code / CODE_LINES_PER_MINUTE
        run = timed.get(ch.relative_to(ROOT).with_suffix(".ipynb").as_posix())
        ran = f"; runs in {duration(run['seconds'])}" if run else ""
        lines.append(f"| **{title}**{ran} | **{words:,}** | **{code}** | **{round(minutes)} min** |")
        for heading, w, c in parts:
            lines.append(f"| &nbsp;&nbsp;{heading} | {w:,} | {c} | "
                         f"{max(1, round(w / READING_WPM + c / CODE_LINES_PER_MINUTE))} min |")
    return "\n".join(lines) + "\n"


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def chapter_times(status: dict | None, titles: dict[str, str], cpu: str | None = None,
                  cores: int | None = None) -> str:
    """A Markdown table of the chapters' execution times (cpu profile) from status.json (the root conftest.py
    writes it: per chapter "run" and "seconds", "workers" chapters at a time, the torch "configuration"),
    one row per chapter of `titles` (status.json's name -> title), with the machine they ran on (`cpu`,
    `cores`: status.json's, else this machine's); a sentence saying so where nothing was measured."""
    timed = {name: entry for name, entry in (status or {}).get("chapters", {}).items()
             if entry.get("run") == "cpu profile" and name in titles}
    if not timed:
        why = ("`_build/executed/status.json`, which the chapters' execution writes, is missing"
               if status is None else "the last execution of the chapters timed none in the cpu profile")
        return (f"*The chapters' execution times were not measured in this build ({why}); run `make book` "
                "(or `make notebooks` before `make html`) to measure them.*\n")
    config = status.get("configuration", {})
    workers = int(status.get("workers", 1))
    threads = config.get("torch_threads")
    cpu = cpu or config.get("cpu") or cpu_model()
    cores = cores or config.get("cores") or os.cpu_count() or 1
    at_a_time = f"{workers} at a time" if workers > 1 else "one at a time"
    lines = [f"Measured by the last execution of the chapters (cpu profile) on {cpu}, {cores} cores; they "
             f"ran {at_a_time}, each with {threads} torch thread{'s' if threads != 1 else ''} "
             f"(torch kernels {config.get('cpu_capability')}).", "",
             "| Chapter | Execution time, cpu profile | Result |", "|---|---:|---|"]
    for name, title in titles.items():
        entry = timed.get(name)
        if entry is None:
            lines.append(f"| {title} | not timed | not executed in the last run of the chapters |")
            continue
        result = ("failed" if entry.get("errors") else
                  f"{len(entry['mismatches'])} checked output(s) differ" if entry.get("mismatches") else "ok")
        lines.append(f"| {title} | {duration(entry['seconds'])} | {result} |")
    if len(timed) == len(titles):
        total = sum(entry["seconds"] for entry in timed.values())
        lines.append(f"| **All chapters, one after another** | {duration(total)} | |")
    return "\n".join(lines) + "\n"
