"""Sweeps: a grid of runs (seeds x gate-layer permutations x models x profiles) fanned out as jobs with
submitit, one JSON row per finished job, and the rows aggregated into a "paper vs this run" table.

A paper's table averages over more runs than one notebook can afford. :func:`run` submits one job per
point of a :func:`grid` through ``submitit`` (Meta's job launcher): on one machine with its ``LocalExecutor``
(at most ``max_parallel`` jobs at a time, since local jobs start as soon as they are submitted), on a
SLURM cluster as a job array (``cluster="slurm"``). Each job calls a function, either a library
function such as :func:`train_gated` or :func:`run_chapter` (a chapter executed by papermill with its
``PROFILE``, ``SEED`` and ``DEVICE``), and writes what it returns as one row
``<folder>/rows/<key>.json``. A point whose row is present is never run again (so an interrupted sweep
resumes where it stopped); a job that fails is retried once and then reported, with its error, in
:class:`Report` and in ``<folder>/failed/<key>.json``::

    points = sweep.grid(seed=[0, 1, 2], model=["dgn", "dgn-allones"], permutation=[None, [3, 2, 1, 0]])
    report = sweep.run(sweep.train_gated, points, "_build/sweeps/digits", max_parallel=2, timeout_min=10)
    print(report)                                         # how many ran, were present, failed (and why)
    sweep.table("_build/sweeps/digits", "accuracy", by=["name"], paper={"DGN": 0.986})

:func:`table` averages each row group per seed and gives the mean over seeds with its t interval
(:func:`dualview.stats.mean_interval`); :func:`show_table` is what a chapter calls to show a sweep's table
in place of its own laptop-scale table when the sweep's rows are there, saying which one it shows.
``make sweep`` (``scripts/sweep.py``) runs the named sweeps of the chapters with these functions.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from dualview import default_device, seed_everything
from dualview.data import shown_path

__all__ = ["grid", "row_key", "run", "Failure", "Report", "train_gated", "run_chapter", "rows", "frame", "table",
           "show_table", "results_folder", "CLUSTERS"]

CLUSTERS = ("local", "slurm")


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"dualview.sweep needs {module!r}: pip install 'dualview[sweep]' (or the book's "
                          f"requirements.txt)") from error


# --------------------------------------------------------------------------------------------------
# The grid and its row files


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the values of ``axes`` (the cartesian product), as a list of parameter dicts:
    ``grid(seed=[0, 1], model=["dgn"])`` is ``[{"seed": 0, "model": "dgn"}, {"seed": 1, "model": "dgn"}]``.
    Concatenate grids with ``+`` for a sweep that is not a full product."""
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"axis {name!r} must be a non-empty list of values, got {values!r}")
    return [dict(zip(axes, combination)) for combination in itertools.product(*axes.values())]


def _canonical(params: Mapping[str, Any]) -> str:
    try:
        return json.dumps(params, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"sweep parameters must be JSON values (numbers, strings, None, lists, dicts), "
                         f"got {params!r}: {error}") from error


def row_key(params: Mapping[str, Any]) -> str:
    """The file name (without ``.json``) of the row of ``params``: readable, plus a hash of all of them."""
    text = _canonical(params)
    readable = "_".join(f"{k}={v}" for k, v in sorted(params.items()))
    readable = re.sub(r"[^A-Za-z0-9=.+-]+", "-", readable).strip("-")[:80]
    return f"{readable}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    """Write ``content`` to ``path`` all at once (a reader never sees half a row)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(content, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


class _RowJob:
    """What a job runs: ``fn(**params)``, its result written as the row file (or the error as a failure
    file, then raised so that submitit reports the job as failed). Pickled by submitit."""

    def __init__(self, fn: Callable[..., Mapping[str, Any]], params: dict[str, Any], folder: Path) -> None:
        self.fn, self.params, self.folder = fn, params, folder

    def __call__(self) -> dict[str, Any]:
        key = row_key(self.params)
        start = time.perf_counter()
        try:
            result = self.fn(**self.params)
            if not isinstance(result, Mapping):
                raise TypeError(f"a sweep function returns a dict of results (one row), "
                                f"{_name(self.fn)} returned {type(result).__name__}")
        except Exception as error:
            _write_json(self.folder / "failed" / f"{key}.json",
                        {"params": self.params, "function": _name(self.fn),
                         "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()})
            raise
        row = {"params": self.params, "result": dict(result), "function": _name(self.fn),
               "seconds": round(time.perf_counter() - start, 3), "host": os.uname().nodename}
        _write_json(self.folder / "rows" / f"{key}.json", row)
        (self.folder / "failed" / f"{key}.json").unlink(missing_ok=True)
        return row


def _name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# --------------------------------------------------------------------------------------------------
# Running a sweep


@dataclass(frozen=True)
class Failure:
    """A point whose job failed on every attempt: its parameters, the last error and the job's log files."""

    params: dict[str, Any]
    error: str
    attempts: int
    log: str


@dataclass
class Report:
    """What :func:`run` did: the points it ran, those whose row was already present (not run again),
    and the failures (after the retry). ``ok`` is true when every point has its row."""

    folder: Path
    ran: list[dict[str, Any]] = field(default_factory=list)
    present: list[dict[str, Any]] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def __str__(self) -> str:
        lines = [f"sweep in {self.folder}: {len(self.ran)} ran, {len(self.present)} already done (not re-run), "
                 f"{len(self.failed)} failed, in {self.seconds:.0f} s"]
        lines += [f"  FAILED after {f.attempts} attempts: {_canonical(f.params)}\n    {f.error}\n    log: {f.log}"
                  for f in self.failed]
        return "\n".join(lines)


def _executor(cluster: str, logs: Path, timeout_min: float, max_parallel: int, resources: Mapping[str, Any]):
    submitit = _need("submitit")
    resources = dict(resources)
    if cluster == "local":
        executor = submitit.LocalExecutor(folder=logs)
        # the local executor hides every GPU unless asked (CUDA_VISIBLE_DEVICES=""): give each job GPU 0
        resources.setdefault("gpus_per_node", 1 if torch.cuda.is_available() else 0)
        executor.update_parameters(timeout_min=timeout_min, **resources)
    else:
        executor = submitit.AutoExecutor(folder=logs, cluster="slurm")
        executor.update_parameters(timeout_min=max(1, math.ceil(timeout_min)), slurm_array_parallelism=max_parallel,
                                   **resources)
    return executor


def run(fn: Callable[..., Mapping[str, Any]], points: Sequence[Mapping[str, Any]], folder: str | os.PathLike, *,
        cluster: str = "local", max_parallel: int = 2, timeout_min: float = 60, retries: int = 1,
        resources: Mapping[str, Any] | None = None, poll_seconds: float = 0.5, verbose: bool = True) -> Report:
    """Run ``fn(**params)`` for every ``params`` of ``points`` as submitit jobs; each finished job writes its
    row ``<folder>/rows/<key>.json`` (:func:`row_key`).

    * Points whose row is present are skipped: running a sweep again runs only what is missing.
    * ``cluster="local"``: ``submitit.LocalExecutor``, at most ``max_parallel`` jobs at once (a new one starts
      when one ends), each stopped after ``timeout_min`` minutes. ``cluster="slurm"``: one SLURM job array
      (``submitit.AutoExecutor``) with at most ``max_parallel`` array tasks running; ``resources`` are
      submitit's parameters, e.g. ``{"gpus_per_node": 1, "cpus_per_task": 4, "slurm_partition": "gpu"}``.
    * A failed job (an exception, a timeout, a killed process) is submitted again up to ``retries`` times,
      then reported in ``Report.failed`` with its error and its log, and left in ``<folder>/failed/``.

    ``fn`` must be importable by the jobs (a module-level function of an installed module, such as
    :func:`train_gated` or :func:`run_chapter`); its parameters must be JSON values. Submitit's logs
    and pickles go to ``<folder>/logs``.
    """
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster must be one of {CLUSTERS} ('local': this machine; 'slurm': a SLURM cluster), "
                         f"got {cluster!r}")
    if not (isinstance(max_parallel, int) and max_parallel >= 1):
        raise ValueError(f"max_parallel must be a positive int (jobs running at once), got {max_parallel!r}")
    if not (isinstance(timeout_min, (int, float)) and 0 < timeout_min < math.inf):
        raise ValueError(f"timeout_min must be a positive number of minutes per job, got {timeout_min!r}")
    if not (isinstance(retries, int) and retries >= 0):
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if not callable(fn):
        raise TypeError(f"fn must be the function each job calls, got {type(fn).__name__}")
    folder = Path(folder).absolute()
    points = [dict(p) for p in points]
    keys = [row_key(p) for p in points]
    if len(set(keys)) != len(keys):
        twice = sorted({_canonical(p) for p, k in zip(points, keys) if keys.count(k) > 1})
        raise ValueError(f"the sweep lists some points twice: {twice}")
    start = time.perf_counter()
    report = Report(folder)
    queue = []
    for params, key in zip(points, keys):
        (report.present if (folder / "rows" / f"{key}.json").is_file() else queue).append((params, key, 1))
    if verbose:
        print(f"sweep {_name(fn)} in {folder}: {len(points)} points, {len(report.present)} already done, "
              f"{len(queue)} to run ({cluster}, at most {max_parallel} at once)", flush=True)
    executor = _executor(cluster, folder / "logs", timeout_min, max_parallel, resources or {}) if queue else None
    running: list[tuple[Any, dict[str, Any], str, int]] = []
    while queue or running:
        free = len(queue) if cluster == "slurm" else max_parallel - len(running)
        wave, queue = queue[:free], queue[free:]
        if wave:
            with executor.batch():
                jobs = [executor.submit(_RowJob(fn, params, folder)) for params, _, _ in wave]
            running += [(job, params, key, attempt) for job, (params, key, attempt) in zip(jobs, wave)]
        still = []
        for job, params, key, attempt in running:
            if not job.done():
                still.append((job, params, key, attempt))
                continue
            try:
                job.result()
                report.ran.append(params)
                if verbose:
                    print(f"  done: {_canonical(params)}", flush=True)
            except Exception as error:  # FailedJobError (an exception in fn) or UncompletedJobError (timeout, kill)
                message = _job_error(folder, key, error)
                if attempt <= retries:
                    queue.append((params, key, attempt + 1))
                    if verbose:
                        print(f"  failed (attempt {attempt}), retrying: {_canonical(params)}: {message}", flush=True)
                else:
                    report.failed.append(Failure(params, message, attempt, str(job.paths.stderr)))
                    _write_json(folder / "failed" / f"{key}.json",
                                {"params": params, "error": message, "attempts": attempt, "log": str(job.paths.stderr)})
        running = still
        if running:
            time.sleep(poll_seconds)
    report.seconds = time.perf_counter() - start
    if verbose:
        print(report, flush=True)
    return report


def _job_error(folder: Path, key: str, error: Exception) -> str:
    """The error of a failed job: the exception ``fn`` raised (written by the job itself), or submitit's
    message when the job never finished (timeout, killed)."""
    written = folder / "failed" / f"{key}.json"
    if written.is_file():
        message = json.loads(written.read_text()).get("error")
        written.unlink()  # a retry must not show this attempt's error as its own
        if message:
            return message
    lines = [line for line in str(error).splitlines() if line.strip() and not set(line.strip()) <= {"-"}]
    return " | ".join(lines[:3]) or type(error).__name__


# --------------------------------------------------------------------------------------------------
# Jobs: a gated network trained by the library, a chapter executed by papermill

_MODEL_NAMES = {"linear": "linear", "dnn": "DNN", "dgn": "DGN", "dgn-allones": "DGN-ALLONES"}


def train_gated(seed: int, model: str = "dgn", permutation: Sequence[int] | None = None, *, dataset: str = "digits",
                widths: Sequence[int] = (32, 32, 32, 32), epochs: int = 5, lr: float = 1e-2, batch_size: int = 64,
                n_train: int | None = None, device: str | None = None) -> dict[str, Any]:
    """Train one model of the pretrained-gates (PG) table of Chapter 5 (Table 2 of
    :cite:`lakshminarayanan2022explicitising`) with seed ``seed`` and return its test accuracy.

    ``model``: ``"linear"`` (softmax regression on the pixels), ``"dnn"`` (the fully connected ReLU network of
    hidden ``widths``), ``"dgn"`` or ``"dgn-allones"`` (the DNN trained first, then frozen as gating network
    with hard gates, and a value network trained on its gates with the image or a constant input of ones;
    :func:`dualview.dgn.build`). ``permutation[l]`` is the gating layer whose gates value layer ``l``
    receives (DGNs only). ``dataset``: ``"digits"`` (scikit-learn's 8x8 digits: a fixed stratified split
    with 450 test images; offline, seconds on a CPU) or ``"mnist"`` (the 60,000 training and 10,000 test
    digits); ``n_train`` keeps a seeded subset of the training set. The row: ``accuracy``, ``name`` (the
    chapter's column: e.g. ``"DGN-ALLONES shuffled"``), ``dnn_accuracy`` (DGNs), sizes and device.
    """
    from dualview import data, dgn, splits, train
    from dualview.architectures import Architecture

    if model not in _MODEL_NAMES:
        raise ValueError(f"model must be one of {list(_MODEL_NAMES)}, got {model!r}")
    shuffled = permutation is not None and list(permutation) != list(range(len(permutation)))
    if permutation is not None and not model.startswith("dgn"):
        raise ValueError(f"a permutation of the gate layers applies to the DGNs, not to model {model!r}")
    if dataset == "digits":
        train_set, test_set = splits.train_test_split(data.load_digits(), test_size=450, seed=0)
    elif dataset == "mnist":
        train_set, test_set = data.load_mnist("train"), data.load_mnist("test")
    else:
        raise ValueError(f"dataset must be 'digits' or 'mnist', got {dataset!r}")
    if n_train is not None:
        if not 1 <= n_train <= len(train_set):
            raise ValueError(f"n_train must be between 1 and {len(train_set)}, got {n_train}")
        keep = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(seed), device="cpu")[:n_train]
        train_set = train_set[keep.sort().values]
    dev = torch.device(device) if device is not None else default_device()
    arch = Architecture.fc(tuple(widths), in_shape=tuple(train_set.x.shape[1:]), num_classes=len(train_set.classes))

    def fitted(net: torch.nn.Module) -> torch.nn.Module:
        train.fit(net.to(dev), train_set, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, progress=False)
        return net

    row: dict[str, Any] = {}
    seed_everything(seed)
    if model == "linear":
        net = fitted(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(arch.in_features, arch.num_classes)))
    else:
        net = fitted(dgn.build(arch, "dnn"))
        if model != "dnn":
            row["dnn_accuracy"] = train.evaluate(net, test_set)
            seed_everything(seed)
            net = fitted(dgn.build(arch, "dgn", pretrained=net, permutation=permutation,
                                   value_input="ones" if model == "dgn-allones" else "x"))
    row.update(accuracy=train.evaluate(net, test_set), name=_MODEL_NAMES[model] + (" shuffled" if shuffled else ""),
               train_size=len(train_set), test_size=len(test_set), device=str(dev))
    return row


def _glued(notebook) -> dict[str, Any]:
    """The values a notebook glued (``myst_nb.glue``), read back from their plain-text display."""
    import ast

    values = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            meta = output.get("metadata", {}).get("scrapbook")
            if not meta:
                continue
            prefix = meta.get("mime_prefix", "")
            text = output.get("data", {}).get(prefix + "text/plain")
            if text is None:
                continue
            try:
                values[meta["name"]] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                values[meta["name"]] = text
    return values


def run_chapter(chapter: str, PROFILE: str = "gpu", SEED: int = 0, DEVICE: str | None = None, *,  # noqa: N803
                book: str | os.PathLike = "book", output: str | os.PathLike = "_build/runs") -> dict[str, Any]:
    """Execute the chapter ``<book>/<chapter>.md`` with papermill, its parameters cell given ``PROFILE``,
    ``SEED`` and ``DEVICE``, and return every value it glued (the numbers behind its prose and its "Paper
    vs this run" table), plus the path of the executed notebook ``<output>/<chapter>-<PROFILE>-seed<SEED>.ipynb``.
    The chapter runs in ``book`` (its working directory), as the book's build runs it."""
    jupytext, papermill = _need("jupytext"), _need("papermill")
    source = Path(book) / f"{chapter}.md"
    if not source.is_file():
        raise FileNotFoundError(f"no chapter {source}: name a chapter of the book, e.g. '05_dgn'")
    out = Path(output).absolute()
    out.mkdir(parents=True, exist_ok=True)
    notebook_in = out / f"{chapter}-{PROFILE}-seed{SEED}.input.ipynb"
    notebook_out = out / f"{chapter}-{PROFILE}-seed{SEED}.ipynb"
    jupytext.write(jupytext.read(source), notebook_in)
    executed = papermill.execute_notebook(str(notebook_in), str(notebook_out), cwd=str(source.parent.absolute()),
                                          parameters={"PROFILE": PROFILE, "SEED": SEED, "DEVICE": DEVICE},
                                          progress_bar=False)
    notebook_in.unlink()
    return {**_glued(executed), "notebook": str(notebook_out)}


# --------------------------------------------------------------------------------------------------
# Aggregation: rows -> "paper vs this run"


def results_folder(name: str) -> Path:
    """Where the sweep ``name`` keeps its rows: ``$DUALVIEW_SWEEPS/<name>``, else ``_build/sweeps/<name>``
    (relative to the working directory, the repository's root for ``make sweep``)."""
    return Path(os.environ.get("DUALVIEW_SWEEPS") or "_build/sweeps") / name


def rows(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a sweep folder (``<folder>/rows/*.json``), in file-name order; empty if there are none."""
    files = sorted((Path(folder) / "rows").glob("*.json"))
    return [json.loads(path.read_text()) for path in files]


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def frame(source: str | os.PathLike | Sequence[Mapping[str, Any]]):
    """A sweep's rows (a folder or a list of rows) as a pandas DataFrame: one line per finished job, one
    column per parameter and per result (lists become tuples, so a permutation can be grouped on)."""
    pd = _need("pandas")
    found = rows(source) if isinstance(source, (str, os.PathLike)) else list(source)
    records = []
    for row in found:
        clash = set(row["params"]) & set(row["result"])
        if clash:
            raise ValueError(f"a row's parameters and results share the names {sorted(clash)}: rename one")
        records.append({k: _hashable(v) for k, v in {**row["params"], **row["result"]}.items()})
    return pd.DataFrame(records)


def table(source, metric: str, by: Sequence[str], *, over: str = "seed", paper: Mapping[str, Any] | None = None,
          level: float = 0.95, scale: float = 1.0, digits: int = 1):
    """The "paper vs this run" table of a sweep: for every group of rows with equal ``by`` values, the mean of
    ``metric`` over the seeds with its ``level`` t interval (:func:`dualview.stats.mean_interval`).

    Rows of one group and one seed (e.g. several gate-layer permutations) are averaged first, so the interval
    is over independent seeds. ``paper`` maps a group's name (its ``by`` values joined by ``" / "``) to the
    paper's number, shown beside it. ``scale=100`` shows shares as percent. Columns: ``by``, ``paper``,
    ``this run`` (``"mean [low, high]"``), ``seeds``, ``mean``, ``low``, ``high``; a group with one seed has
    no interval (``low``, ``high`` are NaN and ``this run`` says so).
    """
    from dualview.stats import mean_interval

    pd = _need("pandas")
    df = source if isinstance(source, pd.DataFrame) else frame(source)
    missing = [c for c in [metric, over, *by] if c not in df.columns]
    if df.empty or missing:
        raise ValueError(f"the sweep's rows have no column(s) {missing or [metric]}; they have {list(df.columns)}")
    lines = []
    for group, part in df.groupby(list(by), sort=True):
        group = group if isinstance(group, tuple) else (group,)
        name = " / ".join(str(g) for g in group)
        per_seed = part.groupby(over)[metric].mean()
        line = dict(zip(by, group), paper=(paper or {}).get(name, "not reported"), seeds=len(per_seed))
        if len(per_seed) >= 2:
            iv = mean_interval(per_seed.to_numpy(), level)
            line.update({"this run": f"{iv.format(digits, scale)} ({iv.level:.0%} CI, t over {iv.n} seeds)",
                         "mean": iv.estimate * scale, "low": iv.low * scale, "high": iv.high * scale})
        else:
            mean = float(per_seed.iloc[0]) * scale
            line.update({"this run": f"{mean:.{digits}f} (one seed: no interval)", "mean": mean,
                         "low": math.nan, "high": math.nan})
        lines.append(line)
    return pd.DataFrame(lines, columns=[*by, "paper", "this run", "seeds", "mean", "low", "high"])


def show_table(folder: str | os.PathLike, this_run, metric: str, by: Sequence[str], **options):
    """The table a chapter shows: the sweep's (:func:`table` of the rows in ``folder``) when the folder has
    rows, else ``this_run`` (the chapter's own table). Prints which one it is, the number of rows and of
    failed jobs; ``options`` go to :func:`table`."""
    found, shown = rows(folder), shown_path(folder)
    if not found:
        print(f"no sweep results in {shown}: showing this run's own table")
        return this_run
    failed = len(list((Path(folder) / "failed").glob("*.json")))
    print(f"showing the sweep in {shown}: {len(found)} finished jobs"
          + (f", {failed} failed (see {shown}/failed)" if failed else "") + "; not this run's table")
    return table(found, metric, by, **options)
