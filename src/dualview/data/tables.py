"""Part of :mod:`dualview.data` (see its docstring)."""
from __future__ import annotations

import functools
import numbers
from typing import NamedTuple
import torch
from torch import Tensor
from dualview import smoke_scale
from dualview.data.files import DataNotFoundError, ImageData, MNIST_CLASSES, SMOKE_PER_CLASS, _check_choice, _first_per_class


def load_digits() -> ImageData:
    """scikit-learn's bundled 1,797 handwritten 8x8 digits, ``x = pixels / 16`` of shape ``(N, 1, 8, 8)``."""
    from sklearn.datasets import load_digits as sklearn_digits

    d = sklearn_digits()
    return ImageData(
        torch.from_numpy(d.images).to(torch.float32).div_(16).unsqueeze(1),
        torch.from_numpy(d.target).to(torch.int64),
        MNIST_CLASSES,
        "scikit-learn's bundled 8x8 handwritten digits (UCI optdigits), 1,797 images",
    )


_TABLES = {
    "diabetes": "scikit-learn's bundled diabetes data (442 patients, 10 features)",
    "california_housing": "California Housing (scikit-learn's copy, 20,640 districts, 8 features)",
}


class Table(NamedTuple):
    """A regression table: float32 features ``x (N, d)`` (unscaled), targets ``y (N,)``, the feature
    names and a human-readable ``source``."""

    x: Tensor
    y: Tensor
    features: tuple[str, ...]
    source: str


def load_tabular(name: str, download: bool | None = None) -> Table:
    """A regression table of scikit-learn as a :class:`Table`.

    ``"diabetes"`` is bundled with scikit-learn; ``"california_housing"`` is downloaded by scikit-learn
    into its own data home (``$SCIKIT_LEARN_DATA``, default ``~/scikit_learn_data``) unless
    ``download=False``. In a smoke run nothing is downloaded (the diabetes data stand in for a missing
    California Housing) and the first ``10 * SMOKE_PER_CLASS`` rows are kept.
    """
    from sklearn import datasets

    _check_choice("name", name, tuple(_TABLES))
    if smoke_scale():
        download = False
    try:
        table = (datasets.load_diabetes() if name == "diabetes"
                 else datasets.fetch_california_housing(download_if_missing=download is not False))
    except OSError as error:
        if not smoke_scale():
            raise DataNotFoundError(f"{_TABLES[name]} not found in scikit-learn's data home and not downloaded "
                                    f"({error}); run where a network is available, or set SCIKIT_LEARN_DATA to a "
                                    "folder holding scikit-learn's cal_housing files") from error
        print(f"smoke scale: {_TABLES[name]} is not in scikit-learn's data home and a smoke run downloads "
              f"nothing; standing in for it: {_TABLES['diabetes']}")
        name, table = "diabetes", datasets.load_diabetes()
    x, y = torch.tensor(table.data, dtype=torch.float32), torch.tensor(table.target, dtype=torch.float32)
    if smoke_scale():
        n = 10 * SMOKE_PER_CLASS
        print(f"smoke scale: {min(n, len(x)):,} of {len(x):,} rows kept of {_TABLES[name]}")
        x, y = x[:n], y[:n]
    return Table(x, y, tuple(table.feature_names), _TABLES[name])


@functools.lru_cache(maxsize=4)
def _mnist1d(num_samples: int, seed: int):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    return make_dataset(args)


def load_mnist1d(split: str = "train", num_samples: int = 5000, seed: int = 42) -> tuple[Tensor, Tensor]:
    """MNIST-1D :cite:`greydanus2020scaling`, generated offline by the ``mnist1d`` package: ``(x, y)``.

    ``x``: float32 ``(N, 1, 40)`` signals, ``y``: int64 labels 0-9. The package's defaults (its
    ``get_dataset_args``) with ``num_samples`` signals in all, 80 % in ``"train"``, 20 % in ``"test"``;
    the same ``seed`` gives the same signals. A smoke run keeps the first :data:`SMOKE_PER_CLASS` of each class.
    """
    _check_choice("split", split, ("train", "test"))
    if not isinstance(num_samples, int) or num_samples < 10:
        raise ValueError(f"num_samples must be an int >= 10, got {num_samples!r}")
    d = _mnist1d(num_samples, seed)
    x, y = (d["x"], d["y"]) if split == "train" else (d["x_test"], d["y_test"])
    x, y = torch.as_tensor(x, dtype=torch.float32).unsqueeze(1), torch.as_tensor(y, dtype=torch.int64)
    if smoke_scale():
        kept = _first_per_class(y, SMOKE_PER_CLASS)
        print(f"smoke scale: {len(kept):,} of {len(y):,} MNIST-1D {split} signals kept ({SMOKE_PER_CLASS} per class)")
        x, y = x[kept], y[kept]
    return x, y


def make_ixor(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """IXOR, the toy data of feature leveling (Section 2.1 of :cite:`featureleveling2020`): ``(x, y)``.

    ``x1, x2 ~ U[-2, 2]``, ``x3 ~ U[0, 1]`` independently; ``y = 1`` iff ``x1 x2 > 0`` and
    ``x3 > 0.5``, else 0 (int64). ``n`` samples, drawn with a generator of their own seeded by ``seed``.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    u = torch.rand(int(n), 3, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float64)
    x = torch.stack([4 * u[:, 0] - 2, 4 * u[:, 1] - 2, u[:, 2]], 1)
    y = ((x[:, 0] * x[:, 1] > 0) & (x[:, 2] > 0.5)).long()
    return x.to(dtype), y


def ixor_labels_reference(x: Tensor) -> Tensor:
    """IXOR labels of given points, one sample at a time (slow reference for :func:`make_ixor`)."""
    labels = [1 if (x1 * x2 > 0 and x3 > 0.5) else 0 for x1, x2, x3 in x.double().tolist()]
    return torch.tensor(labels, dtype=torch.int64)
