"""Smoke runs: a profile's code path at sizes that run in seconds (dualview.setup(scale="smoke")).

What a smoke run changes is tested here: the sizes it overrides, the data layer's policy (the offline
folder only, stand-ins said by name, a few images per class), random weights for uncached ImageNet
networks, and claims printed instead of asserted.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

import dualview
from dualview import data, stats, zoo

SIZES = {"cpu": dict(epochs=2, n=10), "gpu": dict(epochs=50, n=1000, width=512), "smoke": dict(epochs=1, n=20)}


def test_smoke_scale_overrides_the_profile_sizes_and_says_so(capsys):
    sizes, _ = dualview.setup("gpu", 0, "cpu", sizes=SIZES, scale="smoke")
    assert sizes == dict(epochs=1, n=20, width=512) and dualview.smoke_scale() and torch.get_num_threads() == 1
    assert "profile 'gpu' at smoke scale on cpu" in capsys.readouterr().out
    sizes, _ = dualview.setup("gpu", 0, "cpu", sizes=SIZES)
    assert sizes == SIZES["gpu"] and not dualview.smoke_scale()


def test_smoke_scale_refuses_bad_input():
    with pytest.raises(ValueError, match="unknown scale 'tiny'"):
        dualview.setup("gpu", 0, "cpu", sizes=SIZES, scale="tiny")
    with pytest.raises(ValueError, match=r"smoke sizes \['depth'\] are not sizes of the profile 'cpu'"):
        dualview.setup("cpu", 0, "cpu", sizes={**SIZES, "smoke": dict(depth=3)}, scale="smoke")
    with pytest.raises(ValueError, match="unknown profile 'smoke'"):
        dualview.setup("smoke", 0, "cpu", sizes=SIZES)


def test_claim_asserts_at_full_scale_and_prints_in_a_smoke_run(monkeypatch, capsys):
    stats.claim(True, "A beats B")
    with pytest.raises(AssertionError, match="A beats B"):
        stats.claim(False, "A beats B")
    monkeypatch.setenv("DUALVIEW_SCALE", "smoke")
    stats.claim(False, "A beats B")
    assert "claim not checked (fails here): A beats B" in capsys.readouterr().out


def smoke_cut_reference(y: torch.Tensor, k: int) -> list[int]:
    seen: dict[int, int] = {}
    kept = []
    for i, label in enumerate(y.tolist()):
        if seen.get(label, 0) < k:
            kept.append(i)
            seen[label] = seen.get(label, 0) + 1
    return kept


def test_smoke_cut_keeps_the_first_images_of_each_class():
    y = torch.randint(0, 4, (200,), generator=torch.Generator().manual_seed(0))
    images = data.ImageData(torch.arange(200.0).reshape(200, 1, 1, 1), y, tuple("abcd"), "test")
    for k in (1, 3, 60):
        kept = data.smoke_cut(images, k)
        assert kept.x.flatten().long().tolist() == smoke_cut_reference(y, k)


def test_smoke_run_cuts_mnist1d(monkeypatch):
    x, y = data.load_mnist1d("test", num_samples=400)
    monkeypatch.setenv("DUALVIEW_SCALE", "smoke")
    xs, ys = data.load_mnist1d("test", num_samples=400)
    kept = smoke_cut_reference(y, data.SMOKE_PER_CLASS)
    assert torch.equal(xs, x[kept]) and torch.equal(ys, y[kept])


def test_smoke_run_lets_an_offline_stand_in_replace_a_download(monkeypatch, tmp_path, capsys):
    (tmp_path / "cifar10" / "test" / "cat").mkdir(parents=True)
    for c in data.CIFAR10_CLASSES:  # a tiny offline CIFAR-10 test folder: 20 images per class
        folder = tmp_path / "cifar10" / "test" / c
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(20):
            from PIL import Image
            Image.fromarray(np.full((32, 32, 3), i, np.uint8)).save(folder / f"{i:04d}.jpg")
    monkeypatch.setenv("DUALVIEW_SCALE", "smoke")
    train = data.load_cifar10("train", root=tmp_path)
    out = capsys.readouterr().out
    assert "CIFAR-10 train is not in the data directory" in out and "standing in for it: CIFAR-10 test images" in out
    assert len(train) == 10 * data.SMOKE_PER_CLASS and not (tmp_path / "cifar10" / "cifar-10-batches-py").exists()
    hundred = data.load_cifar100("train", root=tmp_path)
    assert "CIFAR-100 train is not in the data directory" in capsys.readouterr().out and len(hundred) == 160
    with pytest.raises(data.DataNotFoundError, match="MNIST test set not found"):  # no stand-in: the error stands
        data.load_mnist("test", root=tmp_path)
    monkeypatch.setenv("DUALVIEW_SCALE", "full")
    with pytest.raises(data.DataNotFoundError, match="CIFAR-10 train set not found"):
        data.load_cifar10("train", root=tmp_path, download=False)


def test_cifar100_reads_the_python_version(tmp_path):
    folder = tmp_path / "cifar100" / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 3 * 32 * 32), dtype=np.uint8)
    labels = [3, 0, 99, 3, 0, 50]
    with open(folder / "test", "wb") as f:
        pickle.dump({"data": x, "fine_labels": labels, "coarse_labels": [0] * 6}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"class_{i}" for i in range(100)]}, f)
    images = data.load_cifar100("test", root=tmp_path, download=False)
    order = np.argsort(labels, kind="stable")  # class by class, the original order within a class
    assert images.y.tolist() == sorted(labels) and len(images.classes) == 100 and images.classes[99] == "class 99"
    assert torch.equal(images.x, torch.from_numpy(x[order].reshape(6, 3, 32, 32)).float() / 255)


def test_tabular_smoke_run_stands_in_the_bundled_table(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path))  # an empty data home: California is missing
    x, y, features, name = data.load_tabular("diabetes")
    assert x.shape == (442, 10) and y.shape == (442,) and "diabetes" in name and features[:2] == ("age", "sex")
    with pytest.raises(data.DataNotFoundError, match="California Housing"):
        data.load_tabular("california_housing", download=False)
    monkeypatch.setenv("DUALVIEW_SCALE", "smoke")
    x, y, features, name = data.load_tabular("california_housing")
    assert "standing in for it" in capsys.readouterr().out and "diabetes" in name
    assert x.shape == (10 * data.SMOKE_PER_CLASS, 10) and not os.listdir(tmp_path)
    with pytest.raises(ValueError, match="name must be one of"):
        data.load_tabular("boston")


def test_imagenet_model_takes_unit_images_and_stands_in_random_weights(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty cache: no weights downloaded yet
    monkeypatch.setenv("DUALVIEW_SCALE", "smoke")
    model = zoo.imagenet_model("resnet18")
    assert "random weights stand in" in capsys.readouterr().out and not model.training
    x = torch.rand(2, 3, 32, 32)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    expected = model.net(((x - mean[:, None, None]) / std[:, None, None]))
    torch.testing.assert_close(model(x), expected)
    assert model(x).shape == (2, 1000) and not list(tmp_path.rglob("*.pth"))
    with pytest.raises(ValueError, match="not a torchvision model name"):
        zoo.imagenet_model("resnet5O")
    with pytest.raises(ValueError, match="has no weights 'V9'"):
        zoo.imagenet_model("resnet18", "V9")
