"""`make gpu-check` (scripts/gpu_check.py) on a machine without a GPU: the same code on the CPU at smoke scale.

The script executes every chapter with PROFILE="gpu", SCALE="smoke", records where the library's training and
attribution calls ran, times each chapter's paper-scale loops and writes one table; here it must pass, write
a row per chapter and stay within its time budget (8 minutes), so that the command a GPU machine runs cannot rot.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402
import notebooks  # noqa: E402


def test_judge_where_the_calls_ran():
    assert gpu_check.judge([("fit", "cuda"), ("attribute", "cuda"), ("per_point_scores", "cpu")], "cuda") == ""
    assert "none of its 2" in gpu_check.judge([("fit", "cpu"), ("attribute", "cpu")], "cuda")
    assert "training run" in gpu_check.judge([("fit", "cpu"), ("attribute", "cuda")], "cuda")
    assert "none of its 0" in gpu_check.judge([], "cuda")


def test_every_chapter_has_its_sizes_and_probes():
    probes = gpu_check._probes()
    for chapter in notebooks.chapters():
        gpu, cpu = gpu_check.chapter_sizes(chapter, True), gpu_check.chapter_sizes(chapter, False)
        assert probes.get(chapter.stem), f"{chapter.stem}: no paper-scale loop to time (gpu_check.PROBES)"
        for probe in probes[chapter.stem]:
            assert probe.steps(gpu) >= 1 and probe.steps(gpu) >= probe.steps(cpu) >= 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path; on a GPU machine run `make gpu-check`")
def test_the_cpu_path_runs_every_chapter_within_budget(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "No GPU" in run.stdout
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["chapter"] for r in result["rows"]] == [c.stem for c in notebooks.chapters()]
    assert all(r["ok"] and r["on_device"] >= 1 and r["probes"] for r in result["rows"])
    assert result["seconds"] <= 480
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.count("\n| 0") + table.count("\n| 1") == len(result["rows"])
