"""The book's notebook harness: prepare chapters for testing, record reference outputs, stage the build.

Every chapter listed in ``_toc.yml`` that is a notebook (a MyST-Markdown file with a jupytext
``kernelspec``) takes part; a new chapter joins by being in the table of contents.

    python scripts/notebooks.py prepare [--profile cpu] [--record]
        book/<ch>.md -> _build/nbtest/book/<ch>.ipynb: parameters injected with papermill, and the
        reference outputs of the cells tagged ``nbval-check-output`` attached from
        tests/reference/<ch>.json, for ``pytest --nbval-lax`` to execute and compare. With
        ``--profile gpu --scale smoke`` the chapters go to _build/smoke/ instead, with SCALE="smoke"
        injected and nothing to compare (the gpu profile's code path at sizes that run in seconds). The root
        conftest.py writes each executed notebook to _build/executed/ as nbval runs it, so a
        chapter is executed once and the same outputs go into the book.
        With ``--seed N`` the chapters go to _build/robust/seed<N>/ with SEED = N injected and nothing to
        compare (another training draw of the book's run: `make robustness`).
    python scripts/notebooks.py claims
        the claims report: every `stats.claim` of the last runs (the book's run, and the runs under other
        seeds of `make robustness`, read from _build/claims/), listing the claims that fail and those that
        hold with a margin below one half-width or without an interval, with their chapters and cells;
        exit 1 if a claim fails or an asserted claim has margin < 1.
    python scripts/notebooks.py record
        store the outputs of the tagged cells of the executed chapters as the new references, and the CPU
        configuration they were executed under in tests/reference/recorded-with.json (this process has the
        kernels' environment, so it sees their torch kernels and thread count).
    python scripts/notebooks.py test-env
        print (one line, possibly empty) the environment variables under which `make test` executes the
        chapters: a CPU configuration other than the recorded one, of similar cost, so that every checked cell
        is shown to survive other CPU kernels; nothing if the user's environment sets one already. A line on
        stderr says which configuration was recorded and which one runs here.
    python scripts/notebooks.py report
        after `pytest --nbval-lax _build/nbtest` (make book): read _build/executed/status.json, which the root
        conftest.py writes, print the checked cells whose outputs differ from their references and the cells
        that failed; exit 0 if outputs only differ (the book is built from this run's outputs), 1 if a cell
        failed (an assert, an exception, a timeout) or the run did not finish.
    python scripts/notebooks.py stage
        assemble _build/stage/ (configuration, plain pages, executed chapters) for jupyter-book;
        with HIDE_SOLUTIONS=1 in the environment, the exercises' solutions are left out (a course build).
    python scripts/notebooks.py sync
        write book/<ch>.ipynb (no outputs) from book/<ch>.md: the copy Colab opens. The setup cell's
        install line ``dualview[book] @ git+REPOSITORY@REVISION`` gets the repository of _config.yml
        and the revision the copies are written from ($DUALVIEW_REVISION, else git's HEAD commit, or the
        revision already pinned if the library (src/, pyproject.toml) is the same there);
        chapters whose `gpu` profile asks for a CUDA device get Colab's GPU accelerator metadata.
    python scripts/notebooks.py check-sync
        fail if a committed book/<ch>.ipynb differs from its .md source, the same substitution made
        with the revision the copy pins (so a commit alone does not outdate the copies), or if the
        copies pin different revisions, or one that is not a commit of this repository's history.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
NBTEST = BUILD / "nbtest"
SMOKE = BUILD / "smoke"
ROBUST = BUILD / "robust"  # make robustness: the cpu chapters under other seeds (_build/robust/seed<N>)
CLAIMS = BUILD / "claims"  # the root conftest.py writes every run's claims here, one JSON file per chapter and run
EXECUTED = BUILD / "executed"
STAGE = Path(os.environ.get("DUALVIEW_STAGE") or BUILD / "stage")  # make test stages the course build apart
REFERENCES = ROOT / "tests" / "reference"
RECORDED_WITH = REFERENCES / "recorded-with.json"
STATUS = EXECUTED / "status.json"  # written by the root conftest.py at the end of a session that ran chapters
CHECK_TAG = "nbval-check-output"


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


_ONLY: list[Path] = []


def chapters() -> list[Path]:
    """The notebook chapters of the table of contents (or only those given with --chapter)."""
    if _ONLY:
        return _ONLY
    return [p for p in toc_files() if is_notebook(p)]


def _code_tokens(source: str) -> str:
    """The cell's Python tokens without comments, line breaks, indentation and trailing commas: re-wrapping
    or re-commenting a cell keeps its key (its outputs cannot change), changing its code does not. Source
    that does not tokenize (e.g. an IPython magic) is keyed by its text without whitespace."""
    import io
    import tokenize

    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    try:
        tokens = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "".join(source.split())
    # a trailing comma before a closing bracket (a formatter adds it when it splits a call) changes nothing
    return " ".join(t for t, after in zip(tokens, tokens[1:] + [""]) if not (t == "," and after in ")]}"))


def _cell_key(source: str) -> str:
    return hashlib.sha1(_code_tokens(source).encode()).hexdigest()[:16]


def _reference_file(chapter: Path) -> Path:
    return REFERENCES / f"{chapter.stem}.json"


def _checked_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and CHECK_TAG in c.metadata.get("tags", [])]


def prepare(profile: str, record: bool, scale: str = "full", seed: int | None = None) -> None:
    from papermill.parameterize import parameterize_notebook

    smoke = scale == "smoke"
    robust = seed is not None  # another training draw: executed, its claims reported, nothing compared
    parameters = {"PROFILE": profile, **({"SCALE": scale} if smoke else {}), **({"SEED": seed} if robust else {})}
    problems = []
    for ch in chapters():
        nb = jupytext.read(ch)
        for cell in nb.cells:
            cell.metadata.setdefault("tags", [])  # papermill looks up tags on every cell
        nb.metadata.setdefault("papermill", {})
        nb = parameterize_notebook(nb, parameters, kernel_name="python3", language="python")
        for cell in nb.cells:  # the injected copy of the parameters is not for readers
            if "injected-parameters" in cell.metadata.tags:
                cell.metadata.tags.append("remove-cell")
        refs = {} if record else json.loads(_reference_file(ch).read_text()) if _reference_file(ch).exists() else {}
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        for cell in _checked_cells(nb):
            if smoke or robust:  # a smoke run's or another seed's numbers are not the book's: not compared
                cell.metadata.tags.remove(CHECK_TAG)
                continue
            if record:
                continue
            key = _cell_key(cell.source)
            if key not in refs:
                problems.append(f"{ch.relative_to(ROOT)}: no reference output for the checked cell\n    "
                                + cell.source.strip().splitlines()[0])
                continue
            cell.outputs = [nbformat.from_dict(o) for o in refs[key]]
            cell.execution_count = 1
        folder = SMOKE if smoke else ROBUST / f"seed{seed}" if robust else NBTEST
        out = folder / ch.relative_to(ROOT).with_suffix(".ipynb")
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
    if problems:
        sys.exit("Reference outputs are missing (a checked cell is new or its code changed).\n"
                 "Execute the chapters with `make references` and review the diff of tests/reference/.\n"
                 + "\n".join(problems))


def _strip_images(output: dict) -> dict:
    out = copy.deepcopy(output)
    for key in list(out.get("data", {})):
        if key.startswith("image/"):
            out["data"][key] = ""  # nbval never compares images; keep the key so fields match
    out.pop("execution_count", None)
    return out


# The environment variables that choose torch's CPU kernels and thread count (PyTorch reads them at first use).
CPU_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_configuration() -> dict:
    """What this process's torch computes with: its kernels' instruction set, the variables that choose
    them, its thread count, the CPU."""
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            **{name: os.environ.get(name) for name in CPU_VARIABLES},
            "torch_threads": torch.get_num_threads(), "cpu": cpu_model()}


def describe(config: dict) -> str:
    """One line: 'AVX2, 2 threads (ATEN_CPU_CAPABILITY=default)'."""
    threads = config.get("torch_threads")
    text = f"{config.get('cpu_capability')}, {threads} thread{'s' if threads != 1 else ''}"
    set_vars = " ".join(f"{k}={config[k]}" for k in CPU_VARIABLES if config.get(k) is not None)
    return text + (f" ({set_vars})" if set_vars else "")


def record() -> None:
    REFERENCES.mkdir(parents=True, exist_ok=True)
    for ch in chapters():
        executed = EXECUTED / ch.relative_to(ROOT).with_suffix(".ipynb")
        if not executed.exists():
            sys.exit(f"{executed} does not exist: execute the chapters first (make notebooks)")
        nb = nbformat.read(executed, as_version=4)
        refs = {_cell_key(c.source): [_strip_images(o) for o in c.outputs] for c in _checked_cells(nb)}
        _reference_file(ch).write_text(json.dumps(refs, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(refs)} reference outputs for {ch.relative_to(ROOT)}")
    config = cpu_configuration()
    RECORDED_WITH.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    print(f"recorded with {describe(config)} on {config['cpu']}: {RECORDED_WITH.relative_to(ROOT)}")


# How `make test` moves the chapters off the recorded CPU configuration when this machine's native one is the
# recorded one, keyed by the native capability (torch.backends.cpu.get_cpu_capability()). Each choice should
# cost about as much as the native run (CI has 30 minutes on 2 cores): other vectorised kernels of the same
# width class, or the plain kernels with another thread count. OTHER_THREADS stands for "a thread count other
# than the recorded one" (1 if the references were recorded with 2 or more threads, else 2). A capability not
# listed falls back to "*". The slow configuration (plain kernels, SSE4.2 MKL, one thread) is `make portable`.
OTHER_THREADS = "other"
TEST_CONFIGURATIONS = {
    "AVX512": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "AVX2": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": OTHER_THREADS},
    "*": {"OMP_NUM_THREADS": OTHER_THREADS},
}


def native_capability() -> str:
    """This machine's torch kernels with none of CPU_VARIABLES set (asked in a fresh process)."""
    env = {k: v for k, v in os.environ.items() if k not in CPU_VARIABLES}
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_env() -> None:
    """Print the variables `make test` executes the chapters under (see TEST_CONFIGURATIONS)."""
    recorded = json.loads(RECORDED_WITH.read_text()) if RECORDED_WITH.exists() else None
    what = f"references recorded with {describe(recorded)}" if recorded else f"{RECORDED_WITH.name} is missing"
    user = {k: os.environ[k] for k in CPU_VARIABLES if k in os.environ}
    chosen: dict[str, str] = {}
    if user:
        why = "as your environment sets them: " + " ".join(f"{k}={v}" for k, v in user.items())
    else:
        native = native_capability()
        if recorded is None:
            why = f"natively ({native})"
        elif native != recorded.get("cpu_capability"):
            why = f"natively ({native}, not the recorded kernels)"
        else:
            threads = recorded.get("torch_threads") or 1
            chosen = {k: str((1 if threads >= 2 else 2) if v == OTHER_THREADS else v)
                      for k, v in TEST_CONFIGURATIONS.get(native, TEST_CONFIGURATIONS["*"]).items()}
            why = "with " + " ".join(f"{k}={v}" for k, v in chosen.items()) + f" (native {native})"
    print(f"{what}; checked cells run here {why}", file=sys.stderr)
    print(" ".join(f"{k}={v}" for k, v in chosen.items()))


def report() -> None:
    """Print what the last execution of the chapters left in STATUS; exit 1 if a cell failed."""
    if not STATUS.exists():
        sys.exit(f"{STATUS.relative_to(ROOT)} does not exist: the chapters' execution did not finish")
    status = json.loads(STATUS.read_text())
    mismatches = [(name, cell) for name, ch in status["chapters"].items() for cell in ch["mismatches"]]
    errors = [(name, cell) for name, ch in status["chapters"].items() for cell in ch["errors"]]
    if mismatches:
        print(f"{len(mismatches)} checked output(s) differ from tests/reference/ (`make test` fails on them; "
              "the book shows this run's outputs):")
        for name, cell in mismatches:
            print(f"  {name}, cell {cell['cell']}: {cell['first_line']}")
        print("If the change is intended, re-record with `make references` and review the diff of tests/reference/.")
    if errors:
        print(f"{len(errors)} cell(s) failed (an assert, an exception or a timeout); the book is not built:")
        for name, cell in errors:
            print(f"  {name}, cell {cell['cell']}: {cell['first_line']}\n      {cell['message']}")
    if status.get("exitstatus", 0) not in (0, 1) or (status.get("exitstatus") == 1 and not (mismatches or errors)):
        errors.append(None)
        print(f"pytest ended with exit status {status.get('exitstatus')} (see its output above)")
    sys.exit(1 if errors else 0)


def _claim_runs() -> dict[str, list[dict]]:
    """The recorded claims by run ("book run (SEED = 0)", "SEED = 1", ...), each with chapter and cell."""
    runs: dict[str, list[dict]] = {}
    for path in sorted(CLAIMS.glob("*/*.json")):
        runs.setdefault(path.parent.name, []).extend(json.loads(path.read_text()))
    return runs


BOOK_RUN = "book run"  # the claims of the run the book is built from (SEED = 0): the root conftest.py's name


def claims_report() -> None:
    """Print every claim that fails, or holds with margin < 1 or without an interval, in the recorded runs.

    The book's rule: an asserted claim holds with margin >= 1 in the book run and holds (margin > 0) under
    the other seeds. Exit 1 if a claim fails in any run, or holds with margin < 1 or without an interval in
    the book run; a margin below 1 under another seed is listed (a thin claim) but allowed."""
    runs = _claim_runs()
    if not runs:
        sys.exit(f"no claims recorded in {CLAIMS.relative_to(ROOT)}: execute the chapters first "
                 "(make test, make book or make robustness)")
    if BOOK_RUN not in runs:
        print(f"(no claims of the book run in {CLAIMS.relative_to(ROOT)}: run make test or make book for its "
              "margins)")
    failed = weak = bare = 0
    for run, found in runs.items():
        n_fail = sum(not c["holds"] for c in found)
        n_weak = sum(c["holds"] and c["margin"] is not None and c["margin"] < 1 for c in found)
        n_bare = sum(c["margin"] is None for c in found)
        failed += n_fail
        if run == BOOK_RUN:
            weak, bare = weak + n_weak, bare + n_bare
        print(f"{run}: {len(found)} claims in {len({c['chapter'] for c in found})} chapters; "
              f"{n_fail} fail, {n_weak} hold with margin < 1, {n_bare} without an interval"
              + ("" if run == BOOK_RUN else " (allowed under another seed if >= 1 in the book run)"))
        for c in sorted(found, key=lambda c: (c["chapter"], c["cell"])):
            if c["holds"] and (c["margin"] is None or c["margin"] >= 1):
                continue
            state = ("FAILS" if not c["holds"] else "no interval" if c["margin"] is None
                     else f"margin {c['margin']:.2f}")
            print(f"  {c['chapter']}, cell {c['cell']}: {state}: {c['message']}")
            for detail in c["details"]:
                print(f"      {detail}")
    print(f"in all: {failed} failed claim(s) in any run; in the book run {weak} claim(s) with margin < 1 and "
          f"{bare} without an interval")
    sys.exit(1 if failed or weak or bare else 0)


SCOREBOARD_MARKER = "<!-- scoreboard -->"  # replaced by the rows glued in the executed chapters (book/scoreboard.md)
SCOREBOARD_PREFIX = "scoreboard__"  # dualview.scoreboard.PREFIX


def scoreboard_rows() -> list[tuple[str, dict]]:
    """The scoreboard rows glued in the executed chapters, in chapter order: ('book/NN_x.ipynb', row)."""
    import ast

    rows = []
    for ch in chapters():
        executed = EXECUTED / ch.relative_to(ROOT).with_suffix(".ipynb")
        if not executed.exists():
            continue
        for cell in nbformat.read(executed, as_version=4).cells:
            for out in cell.get("outputs", []):
                scrap = out.get("metadata", {}).get("scrapbook", {})
                if scrap.get("name", "").startswith(SCOREBOARD_PREFIX):  # myst-nb's glue keeps the repr
                    text = out["data"][scrap.get("mime_prefix", "") + "text/plain"]
                    rows.append((ch.relative_to(ROOT).with_suffix(".ipynb").as_posix(),
                                 json.loads(ast.literal_eval(text))))
    return rows


# a citation in a row's text: "cite:KEY" (chapters write it so, as a {cite} role in their code would show as raw
# markup on the page of the chapter); the scoreboard page turns it into the role
_CITE = re.compile(r"\bcite:([A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)*)")


def scoreboard_page(rows: list[tuple[str, dict]]) -> str:
    """The scoreboard: a count per verdict, then one table per chapter (claim, paper, this run, verdict)."""
    if not rows:
        return "No chapter of this build glued a scoreboard row (execute the chapters first: `make book`).\n"
    titles = _chapter_titles()
    verdicts = ("reproduced", "not decided at this scale", "reversed", "not run")
    counts = {v: sum(r["verdict"] == v for _, r in rows) for v in verdicts}
    lines = ["| verdict | claims |", "|---|---|"] + [f"| {v} | {counts[v]} |" for v in verdicts] + [""]
    for stem in dict.fromkeys(s for s, _ in rows):
        lines += [f"## {titles.get(stem, stem)}", "", "| the papers' claim | paper | this run | verdict |",
                  "|---|---|---|---|"]
        for _, r in ((s, r) for s, r in rows if s == stem):
            cell = lambda t: _CITE.sub(r"{cite}`\1`", str(t).replace("|", "\\|").replace("\n", " "))  # noqa: E731
            lines.append(f"| <span id=\"sb-{r['key']}\"></span>{cell(r['claim'])} ({{ref}}`section <{r['section']}>`) "
                         f"| {cell(r['paper'])} | {cell(r['this_run'])} | **{r['verdict']}** |")
        lines.append("")
    return "\n".join(lines)


_VERDICT = re.compile(r"<!-- verdict ([A-Za-z0-9_-]+) -->")


def verdict_links(page: str, rows: list[tuple[str, dict]], where: str) -> str:
    """Replace each ``<!-- verdict KEY -->`` of a plain page (the introduction's summaries) by the verdict of
    the scoreboard row KEY, linked to that row: the page says what the run supports, whatever it is."""
    by_key = {r["key"]: r for _, r in rows}
    missing = sorted({k for k in _VERDICT.findall(page) if k not in by_key})
    if missing and rows:
        sys.exit(f"{where} names scoreboard rows that no executed chapter glued: {missing} "
                 "(a chapter's dualview.scoreboard.row key changed, or the chapter was not executed)")

    def link(m: re.Match) -> str:
        r = by_key.get(m.group(1))
        if r is None:  # nothing executed (a build of the plain pages alone)
            return "(not run in this build)"
        return f'<a class="reference internal" href="scoreboard.html#sb-{r["key"]}"><strong>{r["verdict"]}</strong></a>'

    return _VERDICT.sub(link, page)


def stage() -> None:
    if STAGE.exists():
        shutil.rmtree(STAGE)
    STAGE.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml", "references.bib"):
        shutil.copy2(ROOT / name, STAGE / name)
    hide = os.environ.get("HIDE_SOLUTIONS") == "1"  # a course build: exercises without their solutions
    if hide:  # and its Colab buttons open the student notebooks (scripts/student.py, a Sphinx extension)
        config = yaml.safe_load((STAGE / "_config.yml").read_text())
        config["sphinx"].setdefault("local_extensions", {})["student"] = str(Path(__file__).resolve().parent)
        (STAGE / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    for path in toc_files():
        rel = path.relative_to(ROOT)
        if is_notebook(path):
            src = EXECUTED / rel.with_suffix(".ipynb")
            if not src.exists():
                sys.exit(f"{src} does not exist: execute the chapters first (make notebooks)")
            dst = STAGE / rel.with_suffix(".ipynb")
        else:
            src, dst = path, STAGE / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if hide and dst.suffix == ".ipynb":
            nbformat.write(_without_solutions(nbformat.read(src, as_version=4)), dst)
        elif dst.suffix == ".md":  # a plain page: the build's own text, the measured chapter times
            page = edition_text(src.read_text(encoding="utf-8"), course=hide)
            if TIMES_MARKER in page:
                status = json.loads(STATUS.read_text()) if STATUS.exists() else None
                page = page.replace(TIMES_MARKER, chapter_times(status, _chapter_titles()))
            if READING_MARKER in page:
                status = json.loads(STATUS.read_text()) if STATUS.exists() else None
                page = page.replace(READING_MARKER, reading_times(status))
            if SCOREBOARD_MARKER in page:
                page = page.replace(SCOREBOARD_MARKER, scoreboard_page(scoreboard_rows()))
            page = verdict_links(page, scoreboard_rows(), str(rel))
            dst.write_text(page, encoding="utf-8")
        else:
            shutil.copy2(src, dst)
    for folder in ("book/images",):
        if (ROOT / folder).exists():
            shutil.copytree(ROOT / folder, STAGE / folder)


# A plain page's text for one edition: <!-- book-only --> ... <!-- /book-only --> is shown in the full book
# only, a comment <!-- course-only ... --> is shown (uncommented) in the course build (HIDE_SOLUTIONS=1) only.
_BOOK_ONLY = re.compile(r"^<!-- book-only -->[ \t]*\n(.*?)^<!-- /book-only -->[ \t]*\n?", re.S | re.M)
_COURSE_ONLY = re.compile(r"^<!-- course-only[ \t]*\n(.*?)^-->[ \t]*\n?", re.S | re.M)


def edition_text(text: str, course: bool) -> str:
    """The page as the full book (course=False) or the course build (course=True) shows it."""
    text = _BOOK_ONLY.sub("" if course else r"\1", text)
    return _COURSE_ONLY.sub(r"\1" if course else "", text)


TIMES_MARKER = "<!-- chapter-times -->"  # replaced by the measured execution times (book/instructor.md)


def _chapter_titles() -> dict[str, str]:
    """{'book/01_paths.ipynb': '1. Paths, ...', ...}: the chapters' names in status.json and their titles."""
    titles = {}
    for ch in chapters():
        heading = re.search(r"^# (.+)$", ch.read_text(encoding="utf-8"), re.M)
        name = ch.relative_to(ROOT).with_suffix(".ipynb").as_posix()
        titles[name] = heading.group(1).strip() if heading else ch.stem
    return titles


READING_MARKER = "<!-- reading-times -->"  # replaced by the reading-time table (book/instructor.md)
READING_WPM = 150  # words of technical prose a student reads per minute, formulas and figures included
CODE_LINES_PER_MINUTE = 10  # visible code lines a student reads (not writes) per minute


def _reading_parts(ch: Path) -> list[tuple[str, int, int]]:
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


def reading_times(status: dict | None = None) -> str:
    """The instructor page's table: per chapter and section, words and code lines and the reading time they
    take at READING_WPM words and CODE_LINES_PER_MINUTE code lines a minute, with the chapter's execution
    time where it was measured."""
    timed = {name: e for name, e in (status or {}).get("chapters", {}).items() if e.get("run") == "cpu profile"}
    lines = [f"Reading time counted from the chapters' sources at {READING_WPM} words and "
             f"{CODE_LINES_PER_MINUTE} visible code lines a minute (collapsed notes and solutions not counted); "
             "execution time from the last run of the chapters. Teaching time in class is about twice the "
             "reading time of the sections covered.", "",
             "| Chapter, section | Words | Code lines | Reading time |", "|---|---:|---:|---:|"]
    for ch, title in zip(chapters(), _chapter_titles().values()):
        parts = _reading_parts(ch)
        words, code = sum(p[1] for p in parts), sum(p[2] for p in parts)
        minutes = words / READING_WPM + code / CODE_LINES_PER_MINUTE
        run = timed.get(ch.relative_to(ROOT).with_suffix(".ipynb").as_posix())
        ran = f"; runs in {_duration(run['seconds'])}" if run else ""
        lines.append(f"| **{title}**{ran} | **{words:,}** | **{code}** | **{round(minutes)} min** |")
        for heading, w, c in parts:
            lines.append(f"| &nbsp;&nbsp;{heading} | {w:,} | {c} | "
                         f"{max(1, round(w / READING_WPM + c / CODE_LINES_PER_MINUTE))} min |")
    return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
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
        lines.append(f"| {title} | {_duration(entry['seconds'])} | {result} |")
    if len(timed) == len(titles):
        total = sum(entry["seconds"] for entry in timed.values())
        lines.append(f"| **All chapters, one after another** | {_duration(total)} | |")
    return "\n".join(lines) + "\n"


_SOLUTION_FENCE = re.compile(r"```\{solution-(start|end)\}[^\n]*\n(?:[^`]*?\n)?```[ \t]*\n?")
# the answer to a concept check ("Predict, then run"): a collapsed admonition of class predict-answer
PREDICT_ANSWER = re.compile(r"^(`{3,})\{admonition\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*?:class:[^\n]*\bpredict-answer\b"
                            r"[^\n]*\n.*?^\1[ \t]*(?:\n|$)", re.S | re.M)


def _without_solutions(nb):
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


# the setup cell's install line: MyST sources carry the placeholders, Colab copies the address and revision
INSTALL_PLACEHOLDER = "git+REPOSITORY@REVISION"
_PINNED = re.compile(r"git\+(\S+?)@([0-9a-f]{40})\b")


def _repository() -> str:
    url = (yaml.safe_load((ROOT / "_config.yml").read_text()).get("repository") or {}).get("url")
    if not url:
        sys.exit("_config.yml has no repository.url: the Colab copies install the library from there")
    return url.rstrip("/")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _head_revision() -> str:
    revision = os.environ.get("DUALVIEW_REVISION") or _git("rev-parse", "HEAD").stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        sys.exit(f"cannot pin the Colab copies: {revision!r} is not a full commit hash (set DUALVIEW_REVISION)")
    return revision


def _pinned_revision(ipynb: Path) -> str | None:
    """The revision the setup cell of a committed Colab copy installs, if it pins one."""
    if ipynb.exists():
        for cell in nbformat.read(ipynb, as_version=4).cells:
            if cell.cell_type == "code" and (match := _PINNED.search(cell.source)):
                return match[2]
    return None


_EXERCISE_FENCE = re.compile(r"^(?:`{3,}|:{3,})\{exercise\}", re.M)


def _first_exercise(chapter: Path) -> int:
    """The book's number of the chapter's first exercise (the HTML numbers them through the chapters)."""
    number = 1
    for other in (p for p in toc_files() if is_notebook(p)):
        if other == chapter:
            break
        number += len(_EXERCISE_FENCE.findall(other.read_text(encoding="utf-8")))
    return number


def _committed_values(ipynb: Path) -> dict[str, str]:
    """The book-run values a committed Colab copy shows (its metadata), so that re-writing it without
    _build/executed/ (a fresh clone) or checking it (check-sync) does not depend on a run."""
    if not ipynb.exists():
        return {}
    return nbformat.read(ipynb, as_version=4).metadata.get("dualview", {}).get("book_run", {})


def _colab_copy(chapter: Path, revision: str | None = None, values: dict[str, str] | None = None,
                solutions: bool = True):
    """The Colab copy of a chapter: no jupytext header, plain Markdown (no MyST, see Plain), glued values
    from ``values`` (default: those its committed copy shows) marked as the book's run, stable cell ids,
    the install line pinned to ``revision`` (default: the revision its committed copy pins, else HEAD),
    GPU metadata if due. ``solutions=False``: without the exercises' solutions (the student notebook)."""
    nb = jupytext.read(chapter)
    nb.metadata.pop("jupytext", None)
    if not solutions:
        nb = _without_solutions(nb)
    values = _committed_values(chapter.with_suffix(".ipynb")) if values is None else values
    plain = Plain(values, _first_exercise(chapter))
    revision = revision or _pinned_revision(chapter.with_suffix(".ipynb")) or _head_revision()
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = plain.markdown(cell.source)
            if not cell.source.strip():
                continue
        cell.source = cell.source.replace(INSTALL_PLACEHOLDER, f"git+{_repository()}@{revision}")
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


def _compared(nb) -> list:
    return [(c.cell_type, c.source) for c in nb.cells] + \
        [nb.metadata.get(k) for k in ("accelerator", "colab", "dualview")]


def _sync_revision() -> str:
    """HEAD (or $DUALVIEW_REVISION); but the revision the copies already pin while the library (src/,
    pyproject.toml) is the same there as at HEAD, so that a sync without library changes changes nothing."""
    head = _head_revision()
    pins = {_pinned_revision(ch.with_suffix(".ipynb")) for ch in chapters()}
    if len(pins) == 1 and None not in pins and not os.environ.get("DUALVIEW_REVISION"):
        (pin,) = pins
        if _git("diff", "--quiet", pin, head, "--", "src", "pyproject.toml").returncode == 0:
            return pin
    return head


def sync() -> None:
    revision = _sync_revision()
    if _git("status", "--porcelain", "--", "src", "pyproject.toml").stdout.strip():
        print(f"note: src/ or pyproject.toml has uncommitted changes, which the pinned revision {revision[:12]} "
              "lacks: commit the library, then run `make sync` again")
    for ch in chapters():
        values = book_run_values(ch)
        source = "the book's run in _build/executed" if values is not None else "its committed copy"
        nbformat.write(_colab_copy(ch, revision, values), ch.with_suffix(".ipynb"))
        print(f"wrote {ch.with_suffix('.ipynb').relative_to(ROOT)} (installs dualview at {revision[:12]}; "
              f"glued values from {source})")


def check_sync() -> None:
    stale, pins = [], {}
    for ch in chapters():
        ipynb = ch.with_suffix(".ipynb")
        if not ipynb.exists():
            stale.append(f"{ipynb.relative_to(ROOT)} is missing")
            continue
        pins[ipynb.name] = _pinned_revision(ipynb)
        if pins[ipynb.name] is None:
            stale.append(f"{ipynb.relative_to(ROOT)} does not install dualview[book] pinned to a revision "
                         f"(its chapter's setup cell needs the line with {INSTALL_PLACEHOLDER})")
        elif _compared(_colab_copy(ch)) != _compared(nbformat.read(ipynb, as_version=4)):
            stale.append(f"{ipynb.relative_to(ROOT)} differs from {ch.relative_to(ROOT)}")
    revisions = set(pins.values()) - {None}
    if len(revisions) > 1:
        stale.append("the copies pin different revisions: " + ", ".join(f"{k} {v}" for k, v in sorted(pins.items())))
    shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false"
    for revision in revisions:
        if not shallow and _git("merge-base", "--is-ancestor", revision, "HEAD").returncode != 0:
            stale.append(f"the pinned revision {revision} is not a commit of this branch's history")
        elif not shallow and _git("diff", "--quiet", revision, "HEAD", "--", "src", "pyproject.toml").returncode:
            print(f"note: the library changed since the revision the Colab copies install ({revision[:12]}); "
                  "`make sync` pins the new one")
    if shallow:
        print("note: a shallow clone: the revision the Colab copies install was not checked against the history")
    if stale:
        sys.exit("The Colab copies are out of date; run `make sync`:\n  " + "\n  ".join(stale))


# ------------------------------------------------------------------------------------------------------------
# Plain notebooks: the Colab copies and the student notebooks are read by plain Jupyter/Colab renderers, which
# know no MyST. Every role and directive the chapters use is rewritten as Markdown (a test forbids what is left).

BOOK_RUN_MARK = "†"  # follows a value taken from the book's own run
NOT_RUN_TEXT = "*(computed when the notebook runs)*"  # a glued value the book's run does not provide


def pages_url() -> str:
    """The address of the online book: GitHub Pages of the repository of _config.yml (the one setting)."""
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", _repository())
    if match is None:
        sys.exit(f"_config.yml: repository.url is {_repository()!r}; set it to https://github.com/<owner>/<name>")
    return f"https://{match[1]}.github.io/{match[2]}"


def _page(doc: str, anchor: str = "") -> str:
    return f"{pages_url()}/{doc}.html" + (f"#{anchor}" if anchor else "")


def _bibliography() -> dict[str, str]:
    """'Author (year)' by BibTeX key, from references.bib; same authors and year get letters (2022a, 2022b)
    in the order of their titles."""
    text = (ROOT / "references.bib").read_text(encoding="utf-8")
    entries = {}
    for entry in re.split(r"\n(?=@)", text):
        key = re.match(r"@\w+\{([^,\s]+),", entry.strip())
        if not key:
            continue
        field = {name: m[1] if (m := re.search(rf"\b{name}\s*=\s*\{{(.*?)\}},?\s*\n", entry + "\n", re.S))
                 else "" for name in ("author", "year", "title")}
        names = [" ".join(a.split()) for a in re.split(r"\s+and\s+", field["author"])] or ["Anonymous"]
        last = [_latex_text(n.split(",")[0] if "," in n else n.split()[-1]) for n in names]
        who = last[0] if len(last) == 1 else " and ".join(last) if len(last) == 2 else f"{last[0]} et al."
        entries[key[1]] = (who, field["year"].strip("{} ") or "n.d.", field["title"])
    out = {}
    for key, (who, year, title) in entries.items():
        same = sorted((t, k) for k, (w, y, t) in entries.items() if (w, y) == (who, year))
        letter = "abcdefghij"[[k for _, k in same].index(key)] if len(same) > 1 else ""
        out[key] = f"{who} ({year}{letter})"
    return out


_ACCENTS = {"'": "\u0301", '"': "\u0308", "`": "\u0300", "^": "\u0302", "~": "\u0303", "c": "\u0327"}


def _latex_text(name: str) -> str:
    """A BibTeX name as text: accents (``{\\'u}``, ``\\"o``) as Unicode, braces dropped."""
    import unicodedata

    name = re.sub(r"\\(['\"`^~c])\s*\{?(\w)\}?", lambda m: m[2] + _ACCENTS[m[1]], name)
    return unicodedata.normalize("NFC", name.replace("{", "").replace("}", "").strip())


_TARGET = re.compile(r"^\(([\w-]+)\)=[ \t]*\n+(?:#+[ \t]*(.*))?", re.M)
_DIRECTIVE_LABEL = re.compile(r"^(?:`{3,}|:{3,})\{([\w:-]+)\}[ \t]*([^\n]*)\n(?::[\w-]+:[^\n]*\n)*?:label:[ \t]*(\S+)", re.M)


def _labels() -> dict[str, tuple[str, str]]:
    """(page, title) of every cross-reference target of the book: ``(label)=`` and directives' ``:label:``."""
    out = {}
    for path in toc_files():
        doc = path.relative_to(ROOT).with_suffix("").as_posix()
        text = path.read_text(encoding="utf-8")
        for match in _TARGET.finditer(text):
            out[match[1]] = (doc, (match[2] or match[1]).strip())
        for match in _DIRECTIVE_LABEL.finditer(text):
            kind = match[1].split(":")[-1].capitalize()
            out[match[3]] = (doc, f"{kind}: {match[2].strip()}" if match[2].strip() else kind)
    return out


def _format_glued(text: str, spec: str) -> str:
    """A glued value's plain-text display formatted as myst-nb's ``{glue:text}`name:spec``` does."""
    import ast

    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if not spec:
        return str(value)
    kind = spec[-1]
    value = str(value) if kind == "s" else int(value) if kind in "bcdoxX" else \
        float(value) if kind in "eEfFgGn%" else value
    return format(value, spec)


def book_run_values(chapter: Path) -> dict[str, str] | None:
    """The plain-text display of every value the chapter glued in the book's last run
    (_build/executed/), or None if there is no executed copy."""
    executed = EXECUTED / chapter.relative_to(ROOT).with_suffix(".ipynb")
    if not executed.exists():
        return None
    values = {}
    for cell in nbformat.read(executed, as_version=4).cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            meta = output.get("metadata", {}).get("scrapbook")
            text = output.get("data", {}).get((meta or {}).get("mime_prefix", "") + "text/plain")
            if meta and text is not None:
                values[meta["name"]] = text
    return values


class Plain:
    """Rewrites a chapter's Markdown cells without MyST: glued values, citations, cross-references, API roles,
    theorem-like boxes, exercises and solutions, targets and equation labels."""

    def __init__(self, values: dict[str, str], first_exercise: int):
        self.values, self.used, self.missing = values, set(), set()
        self.bib, self.labels = _bibliography(), _labels()
        self.next_exercise, self.numbers = first_exercise, {}

    # roles ------------------------------------------------------------------------------------------------
    def _glue(self, content: str) -> str:
        name, _, spec = content.partition(":")
        if name not in self.values:
            self.missing.add(name)
            return NOT_RUN_TEXT
        self.used.add(name)
        return _format_glued(self.values[name], spec) + BOOK_RUN_MARK

    def _cite(self, role: str, content: str) -> str:
        keys = [k.strip() for k in content.split(",")]
        unknown = [k for k in keys if k not in self.bib]
        if unknown:
            raise ValueError(f"cited keys {unknown} are not in references.bib")
        link = _page("book/bibliography")
        if role == "cite:p":
            return "(" + "; ".join(f"[{self.bib[k].replace(' (', ', ').rstrip(')')}]({link})" for k in keys) + ")"
        return ", ".join(f"[{self.bib[k]}]({link})" for k in keys)

    def _ref(self, role: str, content: str) -> str:
        text, label = (m[1].strip(), m[2]) if (m := re.fullmatch(r"(.*?)\s*<([^>]+)>", content, re.S)) else \
            (None, content.strip())
        if role == "eq":
            return f"({label})"
        if label not in self.labels:
            raise ValueError(f"{{{role}}}`{content}`: no target {label!r} in the book")
        doc, title = self.labels[label]
        if not text:  # a title may hold roles itself: as plain text inside the link
            title = _ROLE.sub(lambda m: "; ".join(self.bib.get(k.strip(), k) for k in m[2].split(","))
                              if m[1].startswith("cite") else m[2].rsplit("<", 1)[0].strip(), title)
        return f"[{text or title}]({_page(doc, label)})"

    def _api(self, role: str, content: str) -> str:
        text, target = (m[1].strip(), m[2]) if (m := re.fullmatch(r"(.*?)\s*<([^>]+)>", content, re.S)) else \
            (None, content.strip())
        short = target.lstrip("~")
        shown = text or (short.rsplit(".", 1)[-1] if target.startswith("~") else short)
        if role.endswith("func") and not text:
            shown += "()"
        return f"[`{shown}`]({_page('book/api', short)})"

    def role(self, match: re.Match) -> str:
        role, content = match[1], match[2]
        if role in ("glue", "glue:text"):
            return self._glue(content)
        if role.startswith("cite"):
            return self._cite(role, content)
        if role in ("ref", "numref", "prf:ref", "eq", "doc"):
            return self._ref(role, content)
        if role in ("func", "class", "mod", "meth", "attr") or role.startswith("py:"):
            return self._api(role, content)
        if role == "math":
            return f"${content}$"
        raise ValueError(f"the MyST role {{{role}}} has no plain-Markdown rewrite (scripts/notebooks.py, Plain)")

    # directives -------------------------------------------------------------------------------------------
    def directive(self, match: re.Match) -> str:
        name, argument, options, body = match[2], match[3].strip(), match[4], match[5].strip("\n")
        label = m[1] if (m := re.search(r"^:label:[ \t]*(\S+)", options, re.M)) else None
        if name == "exercise":  # numbered through the book, as the HTML numbers them
            number, self.next_exercise = self.next_exercise, self.next_exercise + 1
            if label:
                self.numbers[label] = number
            return f"#### Exercise {number}\n\n{body}"
        if name == "solution-start":
            number = self.numbers.get(argument)
            return f"#### Solution to Exercise {number}" if number else "#### Solution"
        if name == "solution-end":
            return ""
        if name.startswith("prf:"):
            kind = name[4:].capitalize()
            if kind == "Proof":
                return "\n".join(f"> {line}".rstrip() for line in f"*Proof.* {body} ∎".splitlines())
            head = f"**{kind}: {argument}**" if argument else f"**{kind}.**"
            return "\n".join(f"> {line}".rstrip() for line in f"{head}\n\n{body}".splitlines())
        if name == "admonition":  # the reproducibility notes: collapsed in Jupyter and Colab too
            collapsed = "dropdown" in options
            if collapsed:
                return f"<details><summary><b>{argument}</b></summary>\n\n{body}\n\n</details>"
            return "\n".join(f"> {line}".rstrip() for line in f"**{argument}**\n\n{body}".splitlines())
        raise ValueError(f"the MyST directive {{{name}}} has no plain-Markdown rewrite (scripts/notebooks.py, Plain)")

    def markdown(self, source: str) -> str:
        for _ in range(3):  # directives nest (a proof in a theorem): rewrite the innermost first
            source = _DIRECTIVE.sub(self.directive, source)
        source = _ROLE.sub(self.role, source)
        source = _TARGET_LINE.sub("", source)
        source = _MATH_LABEL.sub("$$", source)
        return re.sub(r"\n{3,}", "\n\n", source).strip("\n")


_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{([\w:-]+)\}([^\n]*)\n((?::[\w-]+:[^\n]*\n)*)"
                        r"((?:(?!^\1\{)(?!^(?:`{3,}|:{3,})\{).)*?)^\1[ \t]*$", re.S | re.M)
_ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
_TARGET_LINE = re.compile(r"^\([\w-]+\)=[ \t]*\n", re.M)
_MATH_LABEL = re.compile(r"\$\$[ \t]*\([\w-]+\)[ \t]*$", re.M)
# what a plain renderer would show raw: a role, a directive fence, a target, a labelled equation
MYST_SYNTAX = re.compile(r"\{[\w:-]+\}`|^(?:`{3,}|:{3,})\{|:::\{|^\([\w-]+\)=|\$\$[ \t]*\([\w-]+\)", re.M)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "record", "stage", "sync", "check-sync", "test-env",
                                                          "report", "claims"])
    parser.add_argument("--profile", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--scale", default="full", choices=["full", "smoke"],
                        help="smoke: the profile's code path at tiny sizes, into _build/smoke, nothing compared")
    parser.add_argument("--record", action="store_true", help="prepare without references (to record new ones)")
    parser.add_argument("--seed", type=int, default=None,
                        help="prepare with this SEED into _build/robust/seed<N>, nothing compared (make robustness)")
    parser.add_argument("--chapter", action="append", default=[], metavar="book/NN_name.md",
                        help="work on this chapter only (repeatable; need not be in _toc.yml yet)")
    args = parser.parse_args()
    for name in args.chapter:
        path = (ROOT / name).resolve()
        if not (path.exists() and is_notebook(path)):
            sys.exit(f"--chapter {name}: not a MyST notebook with a kernelspec")
        _ONLY.append(path)
    if args.command == "prepare":
        prepare(args.profile, args.record, args.scale, args.seed)
    else:
        {"record": record, "stage": stage, "sync": sync, "check-sync": check_sync, "test-env": test_env,
         "report": report, "claims": claims_report}[args.command]()


if __name__ == "__main__":
    main()
