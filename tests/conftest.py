"""Shared fixtures of the unit tests."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def digits_small() -> tuple[torch.Tensor, torch.Tensor]:
    """40 real 8x8 handwritten digits (scikit-learn's bundled set), flattened, float64 in [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data[:40] / 16.0), torch.tensor(d.target[:40])
