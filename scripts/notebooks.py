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
import sys
from collections.abc import Sequence
from pathlib import Path

# The harness's code is the package scripts/harness/, one module per concern (see its __init__); this module is
# its command line, and keeps the names the Makefile's callers, scripts/student.py, scripts/gpu_check.py and the
# tests use (notebooks.chapters(), notebooks._colab_copy, ...). The build folders below are read when a command
# runs (a test may point EXECUTED elsewhere) and passed to the harness, which keeps no state of its own.
_SCRIPTS = str(Path(__file__).resolve().parent)
if _SCRIPTS not in sys.path:  # loaded by its path (tests/test_references.py): the package sits next to it
    sys.path.insert(0, _SCRIPTS)

from harness import book, claims, colab, editions, instructor, plain, staging, testing  # noqa: E402
from harness.book import RECORDED_WITH, REFERENCES, ROOT, Build, chapters, is_notebook, toc_files  # noqa: E402,F401
from harness.claims import (BOOK_RUN, SCOREBOARD_MARKER, SCOREBOARD_PREFIX, scoreboard_page,  # noqa: E402,F401
                            verdict_links)
from harness.colab import INSTALL_PLACEHOLDER, check_sync  # noqa: E402,F401
from harness.cpu import (CPU_VARIABLES, OTHER_THREADS, TEST_CONFIGURATIONS, cpu_configuration,  # noqa: E402,F401
                         cpu_model, describe, native_capability, test_env)
from harness.editions import PREDICT_ANSWER, edition_text  # noqa: E402,F401
from harness.instructor import (CODE_LINES_PER_MINUTE, READING_MARKER, READING_WPM, TIMES_MARKER,  # noqa: E402,F401
                                chapter_times, reading_times)
from harness.plain import BOOK_RUN_MARK, MYST_SYNTAX, NOT_RUN_TEXT, Plain, pages_url  # noqa: E402,F401
from harness.testing import CHECK_TAG  # noqa: E402,F401

BUILD = ROOT / "_build"
_DEFAULT = Build.default(BUILD)
NBTEST, SMOKE, ROBUST, CLAIMS = _DEFAULT.nbtest, _DEFAULT.smoke, _DEFAULT.robust, _DEFAULT.claims
EXECUTED, STATUS, STAGE = _DEFAULT.executed, _DEFAULT.status, _DEFAULT.stage


def folders() -> Build:
    """The build folders as this module names them when a command runs."""
    return Build(nbtest=NBTEST, smoke=SMOKE, robust=ROBUST, claims=CLAIMS, executed=EXECUTED, status=STATUS,
                 stage=STAGE)


# the commands; ``only``: these chapters instead of every chapter of _toc.yml (--chapter)
def prepare(profile: str, record: bool, scale: str = "full", seed: int | None = None,
            only: Sequence[Path] = ()) -> None:
    testing.prepare(profile, record, scale, seed, build=folders(), only=only)


def record(only: Sequence[Path] = ()) -> None:
    testing.record(build=folders(), only=only)


def report() -> None:
    testing.report(STATUS)


def claims_report() -> None:
    claims.claims_report(CLAIMS)


def stage(only: Sequence[Path] = ()) -> None:
    staging.stage(folders(), only)


def sync(only: Sequence[Path] = ()) -> None:
    colab.sync(EXECUTED, only)


# what the executed chapters hold
def book_run_values(chapter: Path) -> dict[str, str] | None:
    return colab.book_run_values(chapter, EXECUTED)


def scoreboard_rows(only: Sequence[Path] = ()) -> list[tuple[str, dict]]:
    return claims.scoreboard_rows(EXECUTED, only)


def _claim_runs() -> dict[str, list[dict]]:
    return claims.claim_runs(CLAIMS)


# the harness's helpers under the names they had in this module
_code_tokens, _cell_key, _strip_images = testing.code_tokens, testing.cell_key, testing.strip_images
_reference_file, _checked_cells = testing.reference_file, testing.checked_cells
_chapter_titles, _repository = book.chapter_titles, book.repository
_reading_parts, _duration = instructor.reading_parts, instructor.duration
_without_solutions = editions.without_solutions
_page, _bibliography, _labels = plain.page, plain.bibliography, plain.labels
_latex_text, _format_glued = plain.latex_text, plain.format_glued
_git, _head_revision, _pinned_revision = colab.git, colab.head_revision, colab.pinned_revision
_first_exercise, _committed_values, _sync_revision = colab.first_exercise, colab.committed_values, colab.sync_revision
_colab_copy, _compared = colab.colab_copy, colab.compared


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
    only = []
    for name in args.chapter:
        path = (ROOT / name).resolve()
        if not (path.exists() and is_notebook(path)):
            sys.exit(f"--chapter {name}: not a MyST notebook with a kernelspec")
        only.append(path)
    commands = {"prepare": lambda: prepare(args.profile, args.record, args.scale, args.seed, only),
                "record": lambda: record(only), "stage": lambda: stage(only), "sync": lambda: sync(only),
                "check-sync": lambda: check_sync(only), "test-env": test_env, "report": report,
                "claims": claims_report}
    commands[args.command]()


if __name__ == "__main__":
    main()
