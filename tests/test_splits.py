"""dualview.splits: choosing classes and the CIFAR-10 sets of each profile (the split functions
themselves are tested in test_data.py on real MNIST)."""
from __future__ import annotations

import os

import pytest
import torch

from dualview import data, splits


def fake(labels, classes=("a", "b", "c", "d")):
    x = torch.arange(len(labels), dtype=torch.float32).view(-1, 1, 1, 1)
    return data.ImageData(x, torch.tensor(labels), classes, "fake")


def test_select_classes_relabels_in_the_order_given():
    d = fake([0, 1, 2, 3, 2, 1, 3])
    s = splits.select_classes(d, ["d", "b"])
    assert s.x.flatten().tolist() == [1, 3, 5, 6] and s.y.tolist() == [1, 0, 1, 0]
    assert s.classes == ("d", "b") and s.source.endswith("classes d, b")
    with pytest.raises(ValueError, match="classes must name some of"):
        splits.select_classes(d, ["e"])
    with pytest.raises(ValueError, match="classes must name some of"):
        splits.select_classes(d, [])


@pytest.fixture(scope="module")
def cifar_test():
    if not (data.data_dir() / "cifar10" / "test").is_dir() and "DUALVIEW_DATA" not in os.environ:
        pytest.skip("offline CIFAR-10 not found: set DUALVIEW_DATA to the shared data folder")
    return data.load_cifar10("test")


def test_cpu_profile_splits_the_offline_test_images(cifar_test):
    train, test = splits.cifar10_sets("cpu", test_size=2000, train_size=4000, seed=3)
    pool, held_out = splits.train_test_split(cifar_test, test_size=2000, seed=3)
    assert torch.equal(test.x, held_out.x)
    assert torch.equal(train.x, splits.subset_per_class(pool, 400, seed=3).x)
    assert torch.bincount(train.y).tolist() == [400] * 10
    cats, deer = splits.cifar10_sets("cpu", test_size=0.2, seed=0, classes=("cat", "deer"))
    assert len(cats) + len(deer) == 2000 and set(deer.y.tolist()) == {0, 1} and deer.classes == ("cat", "deer")
    assert len(set(cats.x.flatten(1).sum(1).tolist()) & set(deer.x.flatten(1).sum(1).tolist())) == 0


def test_gpu_profile_asks_for_the_official_sets(monkeypatch):
    asked = []

    def load(split):
        asked.append(split)
        return fake([0, 1, 2, 3] * 2, data.CIFAR10_CLASSES[:4])

    monkeypatch.setattr(splits, "load_cifar10", load)
    train, test = splits.cifar10_sets("gpu", test_size=2000, seed=0)
    assert asked == ["train", "test"] and len(train) == len(test) == 8
    train, test = splits.cifar10_sets("gpu", test_size=2000, seed=0, classes=("bird", "airplane"))
    assert train.y.tolist() == [1, 0, 1, 0] and test.classes == ("bird", "airplane")


@pytest.mark.parametrize("kwargs, match", [
    (dict(profile="tpu", test_size=10, seed=0), "profile must be"),
    (dict(profile="cpu", test_size=10, seed=0, train_size=15), "multiple of the 10 classes"),
])
def test_bad_arguments(kwargs, match, cifar_test):
    with pytest.raises(ValueError, match=match):
        splits.cifar10_sets(**kwargs)
