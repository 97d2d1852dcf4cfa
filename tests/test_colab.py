"""Chapter 1's Colab copy runs on a fresh machine: a wheel of the project, a new virtual environment that
holds only what Colab has preinstalled (torch, torchvision, a Jupyter kernel), the chapter's own setup
cell installing ``dualview[book]``, no data folder, and a local mirror as the only source of data and
weights (run with DUALVIEW_DATA=/path/to/shared/data, which only the mirror reads).

The setup cell runs as in Colab: a stand-in ``google.colab`` module is registered first, and the cell's
``git+<repository>@<revision>`` (which needs GitHub) is pointed at the wheel; everything else it installs
comes from the package registry. Takes one to three minutes (torch and torchvision, with what they need,
are this environment's own, linked into the new one as Colab's preinstalled copies: `preinstall_torch`;
the book extra's packages come from the registry or pip's cache). Colab's ipywidgets 7 is preinstalled too: the light install must keep it and bring nothing that only builds the HTML (myst-nb, Sphinx).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from importlib import metadata

import nbformat
import pytest
from packaging.requirements import Requirement

from test_mirror import mirror_folder, offline, serve  # noqa: F401  (mirror_folder is a fixture)

ROOT = Path(__file__).resolve().parents[1]
# the chapters simulated, with what each must have downloaded from the mirror: Chapter 10 (the light install on
# a reader's own model, half the time of Chapter 1) in every run; Chapter 1 (pretrained weights and MNIST from
# the mirror; test_mirror checks those downloads too) with DUALVIEW_COLAB_CHAPTERS=01_paths,10_own_model (each
# costs a fresh environment)
# (None: the chapter reads the offline data folder, as a reader with the data does: Imagenette's tarball in the
# mirror is built here and cannot carry the published checksum the loader checks)
FETCHED = {"01_paths": ["mnist/raw/t10k-images-idx3-ubyte", "weights/mnist-cnn-20-50-500.pt"],
           "10_own_model": None}
CHAPTERS = os.environ.get("DUALVIEW_COLAB_CHAPTERS", "10_own_model").split(",")
# what Colab has preinstalled and the light install must keep (ipywidgets 7, not upgraded for one slider)
COLAB_PREINSTALLED = ["torch==2.14.1", "torchvision==0.29.1", "ipykernel", "nbclient", "ipywidgets==7.7.1"]
# torch and torchvision come from this environment (preinstall_torch); pip checks the pins above against them

# executed by the fresh environment's Python: simulate Colab, point the install line at the wheel, run all
RUNNER = r"""
import sys, nbformat, nbclient
notebook, pinned, wheel = sys.argv[1:4]
nb = nbformat.read(notebook, as_version=4)
setup = [c for c in nb.cells if c.cell_type == "code" and pinned in c.source]
assert len(setup) == 1, f"expected one setup cell installing {pinned}, found {len(setup)}"
setup[0].source = setup[0].source.replace(pinned, wheel)
nb.cells.insert(0, nbformat.v4.new_code_cell(
    "import sys, types; sys.modules['google.colab'] = types.ModuleType('google.colab')  # as in Colab"))
nb.cells.append(nbformat.v4.new_code_cell(
    "import dualview, sys; print('DUALVIEW_FROM', dualview.__file__); print('PYTHON', sys.executable)"))
nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3").execute()
nbformat.write(nb, notebook.replace(".ipynb", ".executed.ipynb"))
"""


def run(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 900) -> str:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args[:4])} ... failed ({done.returncode}):\n{done.stdout[-4000:]}\n"
                             f"{done.stderr[-6000:]}")
    return done.stdout


def build_wheel(tmp: Path) -> Path:
    """A wheel of the project from a copy of its sources (the working tree stays clean)."""
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp / "dist"), str(source))
    (wheel,) = (tmp / "dist").glob("dualview-*.whl")
    return wheel


def preinstall_torch(venv: Path, python: Path, site: Path) -> None:
    """Make torch and torchvision (and what they need) preinstalled in ``venv``, as on Colab, without
    unpacking 5.5 GB again: the distributions of this environment, the large top-level folders linked
    and the rest copied, on a path that a ``.pth`` file adds. pip then sees them as installed.

    Safe for this environment because pip upgrades only what a requirement forces, and every requirement of
    the light install is met by these versions (this environment has the whole book extra installed).
    """
    wanted, todo = set(), ["torch", "torchvision"]
    while todo:  # the requirements of torch and torchvision, transitively, without extras
        name = todo.pop()
        dist = metadata.distribution(name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in wanted:
            continue
        wanted.add(key)
        for req in dist.requires or []:
            req = Requirement(req)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    site.mkdir()
    for key in sorted(wanted):
        dist = metadata.distribution(key)
        root = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops):
            source, target = root / top, site / top
            if target.exists() or not source.exists():
                continue
            if source.is_dir() and top in ("torch", "nvidia", "triton", "cuda", "functorch", "torchgen"):
                target.symlink_to(source, target_is_directory=True)
            elif source.is_dir():
                shutil.copytree(source, target, symlinks=True)
            else:
                shutil.copy2(source, target)
    purelib = run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    (Path(purelib) / "colab_preinstalled.pth").write_text(f"{site}\n")


@pytest.mark.parametrize("name", CHAPTERS)
def test_colab_copy_in_a_fresh_environment(name, tmp_path, mirror_folder):  # noqa: F811
    chapter = ROOT / "book" / f"{name}.ipynb"
    offline("weights")
    pinned = re.search(r"git\+\S+?@[0-9a-f]{40}", chapter.read_text())
    assert pinned, f"{chapter} does not pin the library to a revision (run `make sync`)"
    wheel = build_wheel(tmp_path)

    venv = tmp_path / "venv"
    try:  # removed at the end (torch and its CUDA libraries are linked, not copied: preinstall_torch)
        run(sys.executable, "-m", "venv", str(venv))
        python = venv / "bin" / "python"
        pip_cache = run(sys.executable, "-m", "pip", "cache", "dir").strip()
        env = {k: v for k, v in os.environ.items()
               if k not in ("DUALVIEW_MIRROR", "PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_PATH")
               and (k != "DUALVIEW_DATA" or FETCHED[name] is None)}
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
                   XDG_CACHE_HOME=str(tmp_path / "cache"), PIP_CACHE_DIR=pip_cache, MPLBACKEND="agg")
        preinstall_torch(venv, python, tmp_path / "colab-site")
        run(str(python), "-m", "pip", "install", "--quiet", "--no-compile", *COLAB_PREINSTALLED, env=env)
        before = run(str(python), "-m", "pip", "list", "--format=freeze", env=env)
        assert "dualview" not in before

        server, url = serve(mirror_folder)
        try:
            env["DUALVIEW_MIRROR"] = url
            notebook = tmp_path / "work" / chapter.name
            notebook.parent.mkdir()
            shutil.copy(chapter, notebook)
            (tmp_path / "runner.py").write_text(RUNNER)
            start = time.perf_counter()
            run(str(python), str(tmp_path / "runner.py"), str(notebook), pinned[0], f"file://{wheel}",
                env=env, cwd=notebook.parent, timeout=1800)
            seconds = time.perf_counter() - start
        finally:
            server.shutdown()
            server.server_close()
        frozen = run(str(python), "-m", "pip", "list", "--format=freeze", env=env)
    finally:
        shutil.rmtree(venv, ignore_errors=True)

    added = len(frozen.splitlines()) - len(before.splitlines())
    print(f"{name}: the setup cell installed {added} packages; install and run took {seconds:.0f} s")
    executed = nbformat.read(notebook.with_suffix(".executed.ipynb"), as_version=4)
    last = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    assert f"DUALVIEW_FROM {venv}" in last and f"PYTHON {venv}" in last, last  # the wheel, not the repository
    cache = tmp_path / "cache" / "dualview"
    fetched = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    for wanted in FETCHED[name] or []:
        assert any(f.startswith(wanted) for f in fetched), (wanted, fetched)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, json.dumps(errors)[:2000]
    installed = {k.lower().replace("_", "-"): v for k, v in (line.split("==", 1) for line in frozen.splitlines()
                                                               if "==" in line)}
    assert "myst-nb" not in installed and "sphinx" not in installed, "the light install brings HTML-only packages"
    assert installed.get("ipywidgets") == "7.7.1", f"Colab's ipywidgets 7 was changed to {installed.get('ipywidgets')}"
