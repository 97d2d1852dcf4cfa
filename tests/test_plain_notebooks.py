"""The Colab copies (book/<ch>.ipynb) and student notebooks (book/student/<ch>.ipynb) are plain notebooks:
no MyST syntax a plain Jupyter/Colab renderer would show raw; ``dualview.glue`` works without myst-nb; the
exercises' self-checks (``dualview.exercises``) accept the solutions' answers and reject wrong ones."""
from __future__ import annotations

import builtins
import math
import re
import sys
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import notebooks  # noqa: E402
import student  # noqa: E402

from dualview import exercises, glue  # noqa: E402

COPIES = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book" / "student").glob("*.ipynb"))
# independent of notebooks.MYST_SYNTAX: a role, a directive fence, a colon fence, a target, a labelled equation
RAW_MYST = [re.compile(p, re.M) for p in (r"\{[a-z][\w:-]*\}`", r"^\s*`{3,}\s*\{", r":::\s*\{", r"^\([\w-]+\)=\s*$",
                                          r"\$\$\s*\([\w-]+\)\s*$", r"^:(label|class|nonumber):")]


def test_the_copies_exist():
    assert len(COPIES) == 2 * len(notebooks.chapters()), "run `make sync`"


@pytest.mark.parametrize("path", COPIES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_myst_syntax_in_plain_notebooks(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            found = [m[0] for pattern in RAW_MYST for m in pattern.finditer(cell.source)]
            assert not found, f"{path.name}: MyST syntax {found[:3]} in a Markdown cell:\n{cell.source[:300]}"


def test_the_syntax_test_catches_myst():
    for text in ("{glue:text}`x:.1f`", "{cite:p}`a`", "```{exercise}\n", ":::{prf:theorem} T\n", "(ch-x)=\n",
                 "$$ x $$ (eq-1)\n", ":label: thm\n", "{py:func}`f`"):
        assert any(p.search(text) for p in RAW_MYST), text
        assert notebooks.MYST_SYNTAX.search(text) or text.startswith(":label:"), text


def _plain(values=None, first=1):
    return notebooks.Plain(values or {}, first)


def test_plain_rewrites_every_construct():
    plain = _plain({"acc": "97.912", "name": "'within noise'"}, first=7)
    text = plain.markdown(
        "(ch-paths)=\n# Title\n\nAccuracy {glue:text}`acc:.1f`%, {glue:text}`name`, {glue:text}`absent:.2f`.\n"
        "As {cite:t}`jacot2018neural` and {cite:p}`jacot2018neural,arora2019exact` show; see {ref}`Chapter 1 "
        "<ch-paths>`, {prf:ref}`thm-product` and {py:func}`~dualview.paths.fc_path_count`.\n\n"
        ":::{prf:theorem} Product\n:label: x-thm\n:nonumber:\n\nBody $a$.\n:::\n\n"
        "```{exercise}\n:label: ex-a\n\nDo it.\n```\n\n```{solution-start} ex-a\n:class: dropdown\n```\n\nSo.\n\n"
        "```{solution-end}\n```\n\n$$ y = x $$ (eq-y)\n")
    assert not notebooks.MYST_SYNTAX.search(text), text
    assert f"97.9{notebooks.BOOK_RUN_MARK}%" in text and f"within noise{notebooks.BOOK_RUN_MARK}" in text
    assert notebooks.NOT_RUN_TEXT in text and plain.missing == {"absent"} and plain.used == {"acc", "name"}
    bib = notebooks.pages_url() + "/book/bibliography.html"
    assert f"[Jacot et al. (2018)]({bib})" in text and f"([Jacot et al., 2018]({bib}); [Arora et al., 2019]({bib}))" in text
    assert f"[Chapter 1]({notebooks.pages_url()}/book/01_paths.html#ch-paths)" in text
    assert "/book/02_npk.html#thm-product)" in text
    assert f"[`fc_path_count()`]({notebooks.pages_url()}/book/api.html#dualview.paths.fc_path_count)" in text
    assert "> **Theorem: Product**\n>\n> Body $a$." in text
    assert "#### Exercise 7\n\nDo it." in text and "#### Solution to Exercise 7" in text and plain.numbers == {"ex-a": 7}
    assert "$$ y = x $$" in text and "(ch-paths)=" not in text


def test_plain_refuses_what_it_cannot_rewrite():
    with pytest.raises(ValueError, match="no plain-Markdown rewrite"):
        _plain().markdown("{download}`file.zip`")
    with pytest.raises(ValueError, match="not in references.bib"):
        _plain().markdown("{cite}`nobody1999`")
    with pytest.raises(ValueError, match="no target"):
        _plain().markdown("{ref}`no-such-label`")


@pytest.mark.parametrize("text, spec", [("97.91234", ".1f"), ("1234567", ","), ("0.00012", ".0e"),
                                        ("'12 % [11, 13]'", ""), ("3", "d"), ("0.25", ".0%")])
def test_glued_values_are_formatted_as_myst_nb_does(text, spec):
    from myst_nb.core.variables import format_plain_text

    assert notebooks._format_glued(text, spec) == format_plain_text(text, spec)


def test_bibliography_names_and_letters():
    bib = notebooks._bibliography()
    assert bib["montufar2014number"] == "Montúfar et al. (2014)"
    assert bib["hanin2019deep"] == "Hanin and Rolnick (2019)"
    assert {bib["lakshminarayanan2022disentangling"], bib["lakshminarayanan2022explicitising"]} == \
        {"Lakshminarayanan et al. (2022a)", "Lakshminarayanan et al. (2022b)"}


def test_check_sync_does_not_depend_on_the_build(monkeypatch, tmp_path):
    """The committed copies are compared with values from their own metadata, never from _build."""
    monkeypatch.setattr(notebooks, "EXECUTED", tmp_path / "nothing")
    chapter = notebooks.chapters()[0]
    committed = nbformat.read(chapter.with_suffix(".ipynb"), as_version=4)
    assert notebooks._compared(notebooks._colab_copy(chapter)) == notebooks._compared(committed)
    assert notebooks.book_run_values(chapter) is None


# glue without myst-nb ------------------------------------------------------------------------------------------
def test_glue_without_myst_nb_records_and_displays(monkeypatch, capsys):
    real_import = builtins.__import__

    def no_myst(name, *args, **kwargs):
        if name.startswith("myst_nb"):
            raise ImportError("No module named 'myst_nb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_myst)
    glue.glue("h27_hidden", 1.5, display=False)
    assert capsys.readouterr().out == ""
    glue.glue("h27_shown", [1, 2])
    assert "[1, 2]" in capsys.readouterr().out
    assert glue.values["h27_hidden"] == 1.5 and glue.values["h27_shown"] == [1, 2]
    with pytest.raises(ValueError, match="non-empty string name"):
        glue.glue("", 1)


# self-checks -----------------------------------------------------------------------------------------------------
def _fc_paths(widths):  # the solution's formula: input paths plus the paths from each layer's bias
    return math.prod(widths) + sum(math.prod(widths[k:]) for k in range(1, len(widths)))


def _resnet_answer():  # the solution's formulas (Proposition G.1), not the library
    total = 784 * sum(math.comb(4, i) * 100 ** (2 * i + 3) for i in range(5))
    return total, (100**2 / (1 + 100**2)) ** 4, 1 / (1 + 100**2)


def _slope(q, t):
    s = torch.sigmoid(q / t)
    return s * (1 - s) / t


RIGHT_AND_WRONG = {
    "ex-paths-count": (_fc_paths, lambda widths: math.prod(widths)),
    "ex-resnet-count": (_resnet_answer(), (_resnet_answer()[0], 0.5, 0.5)),
    "ex-dgn-temperature": (_slope, lambda q, t: torch.sigmoid(q / t) * (1 - torch.sigmoid(q / t))),
    "ex-leveling-hc": (0.0, 0.5),
    # the solution's formula: each weight's derivative is the product of the other layers' sigmas
    "ex-npk-sigma": (lambda sig: sum(math.prod(s * s for k, s in enumerate(sig) if k != l) for l in range(len(sig))),
                     lambda sig: len(sig) * math.prod(s * s for s in sig)),
    "ex-conv-pool": (lambda d: d ** -2, lambda d: 1 / d),
}


@pytest.mark.parametrize("label", sorted(RIGHT_AND_WRONG))
def test_self_checks_accept_the_solution_and_reject_a_wrong_answer(label):
    right, wrong = RIGHT_AND_WRONG[label]
    assert exercises.check(label, right).correct is True
    verdict = exercises.check(label, wrong)
    assert verdict.correct is False and "not right yet" in repr(verdict)


def test_self_check_of_the_geometric_share_counts_gates_independently():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 4), torch.nn.ReLU(),
                                torch.nn.Linear(4, 2))
    x = torch.randn(30, 3)
    with torch.no_grad():  # by hand: the gates on per layer, one input at a time
        shares = []
        for xi in x:
            h1 = model[0](xi)
            h2 = model[2](h1.relu())
            shares.append((float((h1 > 0).sum()) / 5 * float((h2 > 0).sum()) / 4) ** 0.5)
    expected = sum(shares) / len(shares)
    assert exercises.check("ex-npk-diag", expected, model=model, x=x).correct is True
    assert exercises.check("ex-npk-diag", expected * 1.1, model=model, x=x).correct is False


def test_self_check_of_gate_patterns_counts_them_independently():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(40, 3)
    with torch.no_grad():  # brute force: the set of gate tuples, one image at a time
        expected = len({tuple((model[0](xi) > 0).tolist()) for xi in x})
    model.train()
    assert exercises.check("ex-patterns", expected, model=model, x=x).correct is True
    assert exercises.check("ex-patterns", expected + 1, model=model, x=x).correct is False
    assert model.training, "the check must leave the model as it found it"


@pytest.mark.parametrize("label", sorted(exercises.exercises()))
@pytest.mark.parametrize("empty", [None, ...])
def test_an_empty_answer_is_not_answered_yet(label, empty):
    given = {"model": torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), "x": torch.zeros(1, 2)} \
        if label in ("ex-patterns", "ex-npk-diag") else {}
    verdict = exercises.check(label, empty, **given)
    assert verdict.correct is None and "not answered yet" in repr(verdict) and not verdict


def test_a_crashing_answer_is_wrong_not_an_error():
    assert exercises.check("ex-paths-count", lambda widths: 1 / 0).correct is False
    assert exercises.check("ex-leveling-hc", "zero").correct is False
    with pytest.raises(ValueError, match="no self-check"):
        exercises.check("ex-nope", 1)
    with pytest.raises(ValueError, match="model"):
        exercises.check("ex-patterns", 3)


def test_every_self_check_is_offered_in_a_student_notebook():
    """Each checked exercise exists in a chapter, and its student notebook has the check cell after it."""
    assert set(student.ANSWERS) == set(exercises.exercises())
    cells = [c.source for p in sorted((ROOT / "book" / "student").glob("*.ipynb"))
             for c in nbformat.read(p, as_version=4).cells]
    for label in student.ANSWERS:
        assert any(f"exercises.check({label!r}" in s for s in cells), f"{label}: no check cell (run `make sync`)"


def test_student_notebooks_do_not_link_the_solutions():
    for path in sorted((ROOT / "book" / "student").glob("*.ipynb")):
        first = nbformat.read(path, as_version=4).cells[0].source
        solutions = f"/book/{path.name}"
        assert solutions not in first.replace(f"/book/student/{path.name}", ""), f"{path.name} links the solutions"
        assert f"{notebooks.pages_url()}/book/{path.stem}.html" in first


def test_student_copy_of_chapter_1_runs_with_empty_answers(monkeypatch):
    """The student notebook of Chapter 1 as a student receives it, every answer cell left empty, executes
    to the end; each self-check says "not answered yet". Every cell runs, at the chapter's smoke sizes
    (SCALE = "smoke" in its parameters cell, as papermill would set it: seconds; the cpu profile takes
    about 30 s on an idle 2-core machine)."""
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "book" / "student" / "01_paths.ipynb", as_version=4)
    checks = [c for c in nb.cells if c.cell_type == "code" and "exercises.check(" in c.source]
    assert checks, "the student notebook of Chapter 1 has no self-check cell"
    (parameters,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert 'SCALE = "full"' in parameters.source, parameters.source
    parameters.source = parameters.source.replace('SCALE = "full"', 'SCALE = "smoke"')
    monkeypatch.setenv("MPLBACKEND", "agg")  # the kernel draws no figure (the inline backend stalled here)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "book")}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors[0]
    for cell in checks:
        shown = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)
        assert "not answered yet" in shown, (cell.source, shown)
