"""dualview: the dual (path) view of ReLU networks, as a small tested library.

Modules are named after the concepts of the book: :mod:`dualview.gates`, :mod:`dualview.paths`,
:mod:`dualview.data`, :mod:`dualview.zoo`, :mod:`dualview.train`, :mod:`dualview.plot`,
:mod:`dualview.stats` (seeds, confidence intervals and paired comparisons behind every comparative claim).
"""
from __future__ import annotations

import os
import random

import numpy as np
import torch

__version__ = "0.1.0"


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (CPU and CUDA) and return a seeded ``torch.Generator``."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    return torch.Generator().manual_seed(seed)


def default_device() -> torch.device:
    """CUDA if available, then Apple MPS, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
