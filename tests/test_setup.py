"""dualview.setup: the first code cell of every chapter."""
from __future__ import annotations

import pytest
import torch

import dualview

SIZES = {"cpu": dict(epochs=2, n=10), "gpu": dict(epochs=50, n=1000)}


def test_setup_picks_the_profile_sizes_and_device(capsys):
    sizes, device = dualview.setup("gpu", 0, "cpu", sizes=SIZES)
    assert sizes == SIZES["gpu"] and device == torch.device("cpu")
    assert "profile 'gpu' on cpu" in capsys.readouterr().out
    sizes["n"] = 1  # a copy: the chapter's table of sizes is not changed
    assert SIZES["gpu"]["n"] == 1000
    assert dualview.setup("cpu", 0, sizes=SIZES).device == dualview.default_device()


def test_setup_seeds_everything():
    dualview.setup("cpu", 3, "cpu", sizes=SIZES)
    a = torch.rand(5)
    torch.rand(7)
    dualview.setup("cpu", 3, "cpu", sizes=SIZES)
    assert torch.equal(a, torch.rand(5))
    dualview.setup("cpu", 4, "cpu", sizes=SIZES)
    assert not torch.equal(a, torch.rand(5))


def test_setup_names_the_profiles_on_a_typo():
    with pytest.raises(ValueError, match=r"unknown profile 'GPU'.*\['cpu', 'gpu'\]"):
        dualview.setup("GPU", 0, sizes=SIZES)
