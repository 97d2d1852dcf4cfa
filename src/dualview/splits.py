"""Splits and subsets of a data set, and the training/test sets of each profile.

* :func:`train_test_split`: a seeded, stratified split; :func:`subset_per_class`: a seeded, balanced
  subset; :func:`select_classes`: some classes of a set, relabelled ``0, 1, ...``;
* :func:`cifar10_sets`: the CIFAR-10 training and test images of a chapter by profile: the official
  sets in the ``gpu`` profile, a split of the offline test images in the ``cpu`` profile.

Every result is an :class:`~dualview.data.ImageData` whose ``source`` says how it was cut.
"""
from __future__ import annotations

import numbers
from typing import Sequence

import torch
from torch import Tensor

from dualview.data import ImageData, load_cifar10

__all__ = ["train_test_split", "subset_per_class", "select_classes", "cifar10_sets"]




def _grouped_by_class(y: Tensor, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """Indices sorted by class, in a seeded random order within each class.

    Returns ``(order, rank, counts)``: ``order[i]`` is a sample index, ``rank[i]`` its position
    within its class and ``counts[c]`` the size of class ``c``.
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    y = y.cpu()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(int(seed)), device=y.device)
    order = perm[torch.argsort(y[perm], stable=True)]
    counts = torch.bincount(y)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(y), device=y.device) - starts[y[order]]
    return order, rank, counts


def _apportion(counts: Tensor, total: int) -> Tensor:
    """Split ``total`` over classes in proportion to ``counts`` (largest remainders), summing exactly."""
    exact = counts.double() * total / counts.sum()
    share = exact.floor().long()
    left = total - int(share.sum())
    share[torch.argsort(exact.floor() - exact, stable=True)[:left]] += 1
    return share


def train_test_split(data: ImageData, test_size: int | float, seed: int) -> tuple[ImageData, ImageData]:
    """A seeded split into ``(train, test)`` that keeps every class's share (stratified).

    ``test_size``: a number of samples ``1 <= test_size < len(data)``, or a fraction
    ``0 < test_size < 1`` of ``len(data)`` (rounded). Each class gives its share of the test set
    (largest remainders, so the sizes add up exactly). Both parts keep the original order.
    """
    n = len(data)
    if isinstance(test_size, bool) or not isinstance(test_size, numbers.Real):
        raise ValueError(f"test_size must be an int (a count) or a float (a fraction), got {test_size!r}")
    if isinstance(test_size, numbers.Integral):
        n_test = int(test_size)
    elif 0 < test_size < 1:
        n_test = round(float(test_size) * n)
    else:
        raise ValueError(f"a fractional test_size must lie strictly between 0 and 1, got {test_size!r}")
    if not 1 <= n_test <= n - 1:
        raise ValueError(
            f"test_size={test_size!r} gives {n_test} test samples out of {n}; both parts must be non-empty"
        )
    order, rank, counts = _grouped_by_class(data.y, seed)
    is_test = rank < _apportion(counts, n_test)[data.y.cpu()[order]]
    train, test = order[~is_test].sort().values, order[is_test].sort().values

    def part(index: Tensor, name: str) -> ImageData:
        note = f"; stratified {name} split (seed {seed}): {len(index)} of {n}"
        return ImageData(data.x[index], data.y[index], data.classes, data.source + note)

    return part(train, "train"), part(test, "test")


def subset_per_class(data: ImageData, n_per_class: int, seed: int) -> ImageData:
    """A seeded, balanced subset: ``n_per_class`` random samples of every class present in ``data``."""
    if isinstance(n_per_class, bool) or not isinstance(n_per_class, numbers.Integral) or n_per_class < 1:
        raise ValueError(f"n_per_class must be a positive int, got {n_per_class!r}")
    order, rank, counts = _grouped_by_class(data.y, seed)
    small = [(c, int(k)) for c, k in enumerate(counts) if 0 < k < n_per_class]
    if small:
        names = ", ".join(f"{data.classes[c] if c < len(data.classes) else c!r}: {k}" for c, k in small)
        raise ValueError(f"n_per_class={n_per_class} but some classes have fewer samples ({names})")
    keep = order[rank < n_per_class].sort().values
    note = f"; {n_per_class} per class (seed {seed})"
    return ImageData(data.x[keep], data.y[keep], data.classes, data.source + note)


def select_classes(data: ImageData, classes: Sequence[str]) -> ImageData:
    """The samples of the named ``classes``, relabelled ``0, 1, ...`` in the order given."""
    unknown = [c for c in classes if c not in data.classes]
    if not classes or unknown:
        raise ValueError(f"classes must name some of {list(data.classes)}, got {list(classes)}")
    old = torch.tensor([data.classes.index(c) for c in classes], device=data.y.device)
    keep = (data.y[:, None] == old).any(1)
    y = (data.y[keep, None] == old).long().argmax(1)
    return ImageData(data.x[keep], y, tuple(classes), data.source + f"; classes {', '.join(classes)}")


def cifar10_sets(profile: str, *, test_size: int | float, seed: int, train_size: int | None = None,
                 classes: Sequence[str] | None = None) -> tuple[ImageData, ImageData]:
    """``(train, test)`` CIFAR-10 images for a chapter's ``profile``.

    ``"gpu"``: the official 50,000 training and 10,000 test images (downloaded if absent). ``"cpu"``:
    only the offline test images (:func:`~dualview.data.load_cifar10`), split with
    :func:`train_test_split` into a training pool and ``test_size`` held-out images, the pool cut to
    ``train_size`` images (the same number per class) if given. ``classes`` keeps only those classes
    (relabelled ``0, 1, ...``) before anything else.
    """
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"profile must be 'cpu' or 'gpu', got {profile!r}")

    def load(split: str) -> ImageData:
        images = load_cifar10(split)
        return images if classes is None else select_classes(images, classes)

    if profile == "gpu":
        return load("train"), load("test")
    pool, test = train_test_split(load("test"), test_size=test_size, seed=seed)
    if train_size is not None:
        per_class, rest = divmod(train_size, len(pool.classes))
        if rest or per_class < 1:
            raise ValueError(f"train_size must be a positive multiple of the {len(pool.classes)} classes, "
                             f"got {train_size}")
        pool = subset_per_class(pool, per_class, seed=seed)
    return pool, test
