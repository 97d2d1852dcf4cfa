"""Splits and subsets of a data set, and the training/test sets of each profile.

* :func:`train_test_split`: a seeded, stratified split; :func:`subset_per_class`: a seeded, balanced
  subset; :func:`select_classes`: some classes of a set, relabelled ``0, 1, ...``;
* :func:`cifar10_sets`: the CIFAR-10 training and test images of a chapter by profile: the official
  sets in the ``gpu`` profile, a split of the offline test images in the ``cpu`` profile.

Every result is an :class:`~dualview.data.ImageData` whose ``source`` says how it was cut.
"""
from __future__ import annotations

from typing import Sequence

import torch

from dualview.data import ImageData, load_cifar10, subset_per_class, train_test_split

__all__ = ["select_classes", "cifar10_sets"]  # + train_test_split, subset_per_class once moved here



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
