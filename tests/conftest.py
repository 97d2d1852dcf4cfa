"""Shared fixtures of the unit tests."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

# CI runs the same property-test examples every time (HYPOTHESIS_PROFILE=ci, set by .ci/run), so a
# submission cannot pass or fail by the luck of the draw; a local run explores new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def digits_small() -> tuple[torch.Tensor, torch.Tensor]:
    """40 real 8x8 handwritten digits (scikit-learn's bundled set), flattened, float64 in [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data[:40] / 16.0), torch.tensor(d.target[:40])


@pytest.fixture(autouse=True)
def full_scale(monkeypatch):
    """Every test starts at full scale, and a test that turns on a smoke run (dualview.setup with
    scale="smoke" sets $DUALVIEW_SCALE and one torch thread) leaves no trace in the next one."""
    monkeypatch.setenv("DUALVIEW_SCALE", "full")
    threads = torch.get_num_threads()  # a smoke run's setup sets one thread
    yield
    torch.set_num_threads(threads)
