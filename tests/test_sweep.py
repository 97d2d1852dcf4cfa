"""dualview.sweep: a tiny sweep through submitit's LocalExecutor end to end (jobs, rows, a failing job retried
once and reported, idempotence), the aggregation into a "paper vs this run" table, and a chapter run by
papermill with its glued values read back."""
from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from dualview import sweep

SETTINGS = dict(model="dgn-allones", n_train=300, epochs=3, lr=1e-2, widths=[16, 16, 16, 16])
SHUFFLE = [3, 1, 0, 2]


def test_a_tiny_sweep_runs_fails_once_retries_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two jobs at once on two cores: one thread each
    good = [dict(p, **SETTINGS) for p in sweep.grid(seed=[0, 1], permutation=[None, SHUFFLE])]
    bad = dict(SETTINGS, seed=0, model="transformer")  # not a model of the table: train_gated raises
    report = sweep.run(sweep.train_gated, good + [bad], tmp_path, max_parallel=2, timeout_min=5, verbose=False)

    assert sorted(map(sweep.row_key, report.ran)) == sorted(map(sweep.row_key, good)) and not report.present
    assert not report.ok and [f.params for f in report.failed] == [bad]
    failure = report.failed[0]
    assert failure.attempts == 2 and failure.error.startswith("ValueError: model must be one of")
    assert "Traceback" in Path(failure.log).read_text()  # the job's own log holds the traceback
    assert "FAILED after 2 attempts" in str(report)
    # submitit started 4 + 2 jobs (one error log each): the bad point was tried exactly twice
    assert len(list((tmp_path / "logs").glob("*_log.err"))) == 6
    assert json.loads((tmp_path / "failed" / f"{sweep.row_key(bad)}.json").read_text())["attempts"] == 2

    rows = {sweep.row_key(r["params"]): r for r in sweep.rows(tmp_path)}
    assert sorted(rows) == sorted(map(sweep.row_key, good))
    for key, row in rows.items():
        assert 0.1 < row["result"]["accuracy"] <= 1 and row["result"]["test_size"] == 450
        assert row["result"]["name"] == ("DGN-ALLONES shuffled" if row["params"]["permutation"] else "DGN-ALLONES")
    # a row holds what the function computes: the same point trained here, in this process
    point = good[-1]
    here = sweep.train_gated(**point)["accuracy"]
    assert abs(rows[sweep.row_key(point)]["result"]["accuracy"] - here) <= 2 / 450

    # idempotence: a second run finds every row and submits nothing
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "rows").glob("*.json")}
    again = sweep.run(sweep.train_gated, good, tmp_path, max_parallel=2, timeout_min=5, verbose=False)
    assert again.ok and not again.ran and len(again.present) == 4
    assert len(list((tmp_path / "logs").glob("*_log.err"))) == 6
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "rows").glob("*.json")} == stamps

    # the aggregated table: one line per column of the chapter, mean over the two seeds with its t interval
    table = sweep.table(tmp_path, "accuracy", by=["name"], paper={"DGN-ALLONES": 98.6}, scale=100)
    assert list(table["name"]) == ["DGN-ALLONES", "DGN-ALLONES shuffled"]
    assert list(table["paper"]) == [98.6, "not reported"] and list(table["seeds"]) == [2, 2]
    for line in table.itertuples():
        accs = [r["result"]["accuracy"] for r in rows.values() if r["result"]["name"] == line.name]
        assert line.mean == pytest.approx(100 * np.mean(accs)) and line.low <= line.mean <= line.high


def rows_by_hand(folder: Path, accuracies: dict[tuple[int, str], float]) -> None:
    for (seed, perm), acc in accuracies.items():
        params = {"seed": seed, "permutation": perm}
        (folder / "rows").mkdir(parents=True, exist_ok=True)
        (folder / "rows" / f"{sweep.row_key(params)}.json").write_text(
            json.dumps({"params": params, "result": {"accuracy": acc, "name": "DGN shuffled"}}))


def test_table_averages_permutations_within_a_seed_then_takes_the_t_interval_over_seeds(tmp_path):
    acc = {(0, "a"): 0.90, (0, "b"): 0.80, (1, "a"): 0.70, (1, "b"): 0.75, (2, "a"): 0.95, (2, "b"): 0.85}
    rows_by_hand(tmp_path, acc)
    line = sweep.table(tmp_path, "accuracy", by=["name"]).iloc[0]
    per_seed = np.array([0.85, 0.725, 0.90])  # the means over the two permutations of each seed
    half = scipy_stats.t.ppf(0.975, 2) * per_seed.std(ddof=1) / math.sqrt(3)
    assert line["seeds"] == 3 and line["paper"] == "not reported"
    assert (line["mean"], line["low"], line["high"]) == pytest.approx(
        (per_seed.mean(), per_seed.mean() - half, per_seed.mean() + half))
    assert "t over 3 seeds" in line["this run"]
    one_seed = sweep.table(sweep.frame(tmp_path).query("seed == 0"), "accuracy", by=["name"]).iloc[0]
    assert one_seed["mean"] == pytest.approx(0.85) and math.isnan(one_seed["low"])
    assert "one seed: no interval" in one_seed["this run"]
    with pytest.raises(ValueError, match="no column"):
        sweep.table(tmp_path, "loss", by=["name"])


def test_show_table_says_which_table_it_shows(tmp_path, capsys):
    this_run = pd.DataFrame({"name": ["DGN"], "this run": ["97.0 [96.0, 98.0]"]})
    assert sweep.show_table(tmp_path / "none", this_run, "accuracy", by=["name"]) is this_run
    assert "no sweep results" in capsys.readouterr().out
    rows_by_hand(tmp_path, {(0, "a"): 0.9, (1, "a"): 0.8})
    shown = sweep.show_table(tmp_path, this_run, "accuracy", by=["name"])
    assert "showing the sweep" in capsys.readouterr().out and list(shown["seeds"]) == [2]


def test_bad_sweeps_are_refused_with_a_clear_error(tmp_path):
    assert sweep.grid(a=[1, 2], b=["x"]) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    with pytest.raises(ValueError, match="non-empty list"):
        sweep.grid(seed=3)
    with pytest.raises(ValueError, match="twice"):
        sweep.run(sweep.train_gated, [{"seed": 0}, {"seed": 0}], tmp_path)
    with pytest.raises(ValueError, match="cluster must be one of"):
        sweep.run(sweep.train_gated, [{"seed": 0}], tmp_path, cluster="kubernetes")
    with pytest.raises(ValueError, match="JSON values"):
        sweep.row_key({"seed": object()})
    assert sweep.row_key({"seed": 0, "p": [1, 0]}) == sweep.row_key({"p": [1, 0], "seed": 0})
    assert sweep.row_key({"seed": 0}) != sweep.row_key({"seed": 1})
    with pytest.raises(ValueError, match="permutation of the gate layers applies to the DGNs"):
        sweep.train_gated(0, "dnn", [1, 0, 2, 3])


CHAPTER = """\
---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---
# A chapter

```{code-cell} ipython3
:tags: [parameters]

PROFILE = "cpu"
SEED = 0
DEVICE = None
```

```{code-cell} ipython3
from myst_nb import glue

glue("seed_squared", SEED ** 2, display=False)
glue("profile_seen", PROFILE, display=False)
```
"""


def test_run_chapter_executes_it_with_its_parameters_and_returns_what_it_glued(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "09_tiny.md").write_text(CHAPTER)
    out = sweep.run_chapter("09_tiny", PROFILE="gpu", SEED=3, book=tmp_path / "book", output=tmp_path / "runs")
    assert out["seed_squared"] == 9 and out["profile_seen"] == "gpu"
    assert Path(out["notebook"]).is_file()
    with pytest.raises(FileNotFoundError, match="no chapter"):
        sweep.run_chapter("99_missing", book=tmp_path / "book")


FAKE_SBATCH = """#!/bin/bash
# records the submission script and answers as sbatch does; nothing runs
n=$(cat "$FAKE_SLURM/count" 2>/dev/null || echo 4000); n=$((n + 1)); echo $n > "$FAKE_SLURM/count"
cp "${@: -1}" "$FAKE_SLURM/sbatch-$n.sh"
echo "Submitted batch job $n"
"""
FAKE_SACCT = """#!/bin/bash
# every task of every array asked about has failed
echo "JobID|State|NodeList"
while [ $# -gt 0 ]; do [ "$1" = "-j" ] && echo "$2_[0-9]|FAILED|fake-node"; shift; done
"""


def test_on_slurm_the_points_go_out_as_an_array_and_its_failures_are_retried_then_reported(tmp_path, monkeypatch):
    """A fake SLURM (sbatch records the script, sacct says every task failed, srun exists): the points go
    out as one job array with the timeout, partition, GPU and array parallelism asked for, the failed tasks
    go out again once, and then are reported."""
    bin_dir, log = tmp_path / "bin", tmp_path / "slurm"
    bin_dir.mkdir(), log.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("sacct", FAKE_SACCT), ("srun", "#!/bin/bash\nexit 1\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(log))
    from submitit.slurm.slurm import SlurmJob

    # submitit waits 15 s for a missing result file to appear on a cluster's shared filesystem; none will here
    monkeypatch.setattr(SlurmJob, "_results_timeout_s", 0)
    points = sweep.grid(seed=[0, 1], model=["dnn"])
    report = sweep.run(sweep.train_gated, points, tmp_path / "sweep", cluster="slurm", max_parallel=1,
                       timeout_min=7, resources={"gpus_per_node": 1, "slurm_partition": "gpu"}, poll_seconds=0.2,
                       verbose=False)
    scripts = sorted(log.glob("sbatch-*.sh"))
    assert len(scripts) == 2  # the array, then the retry of its two failed tasks as a second array
    for script in scripts:
        text = script.read_text()
        for line in ("#SBATCH --array=0-1%1", "#SBATCH --time=7", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1"):
            assert line in text, f"{line!r} not in the submission script:\n{text}"
    assert sorted(f.params["seed"] for f in report.failed) == [0, 1] and not report.ran
    assert all(f.attempts == 2 and "FAILED" in f.error for f in report.failed)


def test_a_local_job_is_stopped_at_its_time_limit_and_reported(tmp_path):
    # the job would sleep a minute; its limit is 0.1 minutes (6 s), so the local executor stops it
    start = time.perf_counter()
    report = sweep.run(subprocess.run, [dict(args=["sleep", "60"])], tmp_path, timeout_min=0.1, retries=0,
                       verbose=False)
    elapsed = time.perf_counter() - start
    assert not report.ok and not report.ran and len(report.failed) == 1 and report.failed[0].attempts == 1
    assert 6 <= elapsed < 40, elapsed
    assert not (tmp_path / "rows").exists() or not list((tmp_path / "rows").glob("*.json"))
    assert "has not produced any output" in report.failed[0].error  # submitit's word for a job it stopped
