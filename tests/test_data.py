"""Tests of dualview.data on the real offline data (run with DUALVIEW_DATA=/path/to/shared/data)."""
from __future__ import annotations

import gzip
import hashlib
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dualview import data as D
from dualview.data import (
    CIFAR10_CLASSES, DataNotFoundError, ImageData, data_dir, load_cifar10, load_digits, load_mnist,
    read_idx, shown_path,
)
from dualview.splits import subset_per_class, train_test_split

ROOT = data_dir()  # resolved once, before any test changes the environment
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
IDX_MD5 = {
    "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
}


def require(relative: str) -> Path:
    """The path of a file of the offline data; skip (only) when DUALVIEW_DATA is not set at all."""
    path = ROOT / relative
    if not path.exists() and "DUALVIEW_DATA" not in os.environ:
        pytest.skip(f"offline data not found at {path}: set DUALVIEW_DATA to the shared data folder")
    return path


@pytest.fixture(scope="module")
def mnist() -> ImageData:
    require("mnist/raw")
    return load_mnist("test", root=ROOT, download=False)


@pytest.fixture(scope="module")
def cifar() -> ImageData:
    require("cifar10/test")
    return load_cifar10("test", root=ROOT, download=False)


def fake(labels: list[int]) -> ImageData:
    """Tiny ImageData whose pixel value is the sample index, so subsets can be traced back."""
    n = len(labels)
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1)
    return ImageData(x, torch.tensor(labels, dtype=torch.int64), tuple("abcdefghij"), "fake")


# ---------------------------------------------------------------------------------------- data_dir


def test_data_dir_env_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DUALVIEW_DATA", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d"
    monkeypatch.delenv("DUALVIEW_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "dualview"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data_dir() == Path.home() / ".cache" / "dualview"


def test_shown_path_hides_the_machines_directories(monkeypatch, tmp_path):
    home, data = tmp_path / "home" / "reader", tmp_path / "somewhere" / "data"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DUALVIEW_DATA", str(data))
    idx = data / "mnist" / "raw" / "t10k-images-idx3-ubyte.gz"
    assert shown_path(idx) == "<data>/mnist/raw/t10k-images-idx3-ubyte.gz"
    assert shown_path(str(data / "cifar10" / "test")) == "<data>/cifar10/test" and shown_path(data) == "<data>"
    other = tmp_path / "other"  # a loader's root= is the data directory of that call
    assert shown_path(other / "mnist" / "train-5k.npz", other) == "<data>/mnist/train-5k.npz"
    assert shown_path(home / ".cache" / "torch" / "hub" / "checkpoints") == "~/.cache/torch/hub/checkpoints"
    assert shown_path("~/x/y.pt") == "~/x/y.pt"
    assert shown_path(tmp_path / "opt" / "hub" / "checkpoints") == "hub/checkpoints"
    assert shown_path("_build/sweeps/fc4") == "_build/sweeps/fc4"  # relative: nothing of the machine shown
    monkeypatch.setenv("DUALVIEW_DATA", str(home / "data"))  # the data directory comes before the home
    assert shown_path(home / "data" / "weights" / "w.th") == "<data>/weights/w.th"


def test_sources_show_no_machine_path(monkeypatch, mnist, cifar):
    monkeypatch.setenv("DUALVIEW_DATA", str(ROOT))
    loaded = load_mnist("test", download=False)  # from the data directory, not from root=
    assert loaded.source.endswith("from <data>/mnist/raw"), loaded.source
    assert cifar.source.endswith("from <data>/cifar10/test"), cifar.source
    for images in (loaded, mnist, cifar):
        assert str(ROOT.absolute()) not in images.source and str(Path.home()) not in images.source


# ---------------------------------------------------------------------------------------- MNIST


def test_mnist_test_set(mnist):
    assert mnist.x.shape == (10_000, 1, 28, 28) and mnist.x.dtype == torch.float32
    assert mnist.y.shape == (10_000,) and mnist.y.dtype == torch.int64
    assert mnist.x.min() == 0 and mnist.x.max() == 1
    assert torch.bincount(mnist.y).tolist() == MNIST_TEST_COUNTS
    assert mnist.classes == tuple("0123456789") and "t10k" in mnist.source


@pytest.mark.parametrize("name", sorted(IDX_MD5))
def test_idx_files_are_the_canonical_ones(name):
    raw = gzip.decompress(require(f"mnist/raw/{name}").read_bytes())
    assert hashlib.md5(raw).hexdigest() == IDX_MD5[name]


def test_read_idx_plain_and_gzip_agree_and_checks_magic(tmp_path):
    gz = require("mnist/raw/t10k-labels-idx1-ubyte.gz")
    plain = tmp_path / "labels"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    assert (read_idx(plain, magic=2049) == read_idx(gz, magic=2049)).all()
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        read_idx(plain, magic=2051)
    plain.write_bytes(plain.read_bytes()[:-1])  # truncated
    with pytest.raises(ValueError, match="header says shape"):
        read_idx(plain)


def test_mnist_reads_torchvision_layout(tmp_path, mnist):
    raw = tmp_path / "MNIST" / "raw"  # where torchvision downloads to, uncompressed
    raw.mkdir(parents=True)
    for name in IDX_MD5:
        (raw / name[:-3]).write_bytes(gzip.decompress(require(f"mnist/raw/{name}").read_bytes()))
    again = load_mnist(root=tmp_path, download=False)
    assert torch.equal(again.x, mnist.x) and torch.equal(again.y, mnist.y)


def test_mnist_train5k():
    require("mnist/train-5k.npz")
    d = load_mnist("train5k", root=ROOT, download=False)
    assert d.x.shape == (5000, 1, 28, 28) and d.x.dtype == torch.float32 and 0 <= d.x.min() < d.x.max() <= 1
    assert torch.bincount(d.y).tolist() == [500] * 10


def test_mnist_full_train_is_never_replaced_by_train5k():
    require("mnist/train-5k.npz")
    with pytest.raises(DataNotFoundError, match="train5k"):
        load_mnist("train", root=ROOT, download=False)


# ---------------------------------------------------------------------------------------- CIFAR-10


def test_cifar10_jpeg_test_set(cifar):
    assert cifar.x.shape == (10_000, 3, 32, 32) and cifar.x.dtype == torch.float32
    assert 0 <= cifar.x.min() and cifar.x.max() <= 1
    assert torch.bincount(cifar.y).tolist() == [1000] * 10
    assert cifar.classes == CIFAR10_CLASSES and "JPEG" in cifar.source


# ---------------------------------------------------------------------------------------- digits


def test_digits():
    d = load_digits()
    assert d.x.shape == (1797, 1, 8, 8) and d.x.dtype == torch.float32
    assert d.x.min() == 0 and d.x.max() == 1 and len(d.classes) == 10


# ---------------------------------------------------------------------------------------- ImageData


def test_image_data_indexing_and_loader():
    d = fake([0, 1, 2, 0, 1, 2, 0])
    assert d[2:4].x.flatten().tolist() == [2, 3]
    assert d[torch.tensor([6, 0])].x.flatten().tolist() == [6, 0]
    assert d[[1, 1]].y.tolist() == [1, 1]
    assert d[d.y == 0].x.flatten().tolist() == [0, 3, 6]
    assert d[-1].x.shape == (1, 1, 1, 1) and d[-1].x.item() == 6 and d[0].x.item() == 0
    with pytest.raises(IndexError):
        d[7]
    assert d.to("cpu").x.device.type == "cpu" and "fake" in repr(d)
    assert [len(xb) for xb, _ in d.loader(3)] == [3, 3, 1]
    def shuffled() -> torch.Tensor:
        loader = d.loader(2, shuffle=True, generator=torch.Generator().manual_seed(1))
        return torch.cat([yb for _, yb in loader])

    assert torch.equal(shuffled(), shuffled())
    with pytest.raises(ValueError, match="int64"):
        ImageData(d.x, d.y.int(), d.classes, "bad")


# ---------------------------------------------------------------------------------------- splits


def test_stratified_split_on_mnist(mnist):
    train, test = train_test_split(mnist, 0.2, seed=0)
    assert len(train) == 8000 and len(test) == 2000
    counts = torch.tensor(MNIST_TEST_COUNTS)
    assert (torch.bincount(test.y) - 0.2 * counts).abs().max() <= 1
    assert "stratified" in test.source and "seed 0" in test.source
    again = train_test_split(mnist, 0.2, seed=0)[1]
    other = train_test_split(mnist, 0.2, seed=1)[1]
    assert torch.equal(again.x, test.x) and not torch.equal(other.x, test.x)


@settings(max_examples=50, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=2, max_size=200),
    fraction=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**31),
)
def test_stratified_split_properties(labels, fraction, seed):
    d = fake(labels)
    n_test = round(fraction * len(d))
    if not 1 <= n_test < len(d):
        with pytest.raises(ValueError):
            train_test_split(d, fraction, seed)
        return
    train, test = train_test_split(d, fraction, seed)
    ids = torch.cat([train.x, test.x]).flatten().long()
    assert len(test) == n_test and torch.equal(ids.sort().values, torch.arange(len(d)))  # a partition
    counts = torch.bincount(d.y, minlength=5).double()
    assert (torch.bincount(test.y, minlength=5) - counts * n_test / len(d)).abs().max() < 1
    assert torch.equal(train_test_split(d, n_test, seed)[1].x, test.x)  # count = same fraction


@pytest.mark.parametrize("bad", [0, -1, 7, 8, 0.0, 1.0, 1.5, -0.2, math.nan, 0.01, "0.2", None, True])
def test_bad_test_size(bad):
    with pytest.raises(ValueError, match="test_size"):
        train_test_split(fake([0, 1, 0, 1, 0, 1, 0]), bad, seed=0)


def test_subset_per_class():
    d = fake([0] * 5 + [1] * 3 + [2] * 4)
    s = subset_per_class(d, 3, seed=0)
    assert torch.bincount(s.y).tolist() == [3, 3, 3] and "3 per class" in s.source
    assert torch.equal(subset_per_class(d, 3, seed=0).x, s.x)
    assert len({tuple(subset_per_class(d, 3, seed=k).x.flatten().tolist()) for k in range(10)}) > 1
    with pytest.raises(ValueError, match="fewer samples.*'b': 3"):
        subset_per_class(d, 4, seed=0)
    with pytest.raises(ValueError, match="positive int"):
        subset_per_class(d, 0, seed=0)


# ---------------------------------------------------------------------------------------- Imagenette


def test_imagenette_photos_as_imagenet_models_take_them():
    folder = require("imagenette/val-sample")
    d = D.load_imagenette()
    assert d.x.shape == (100, 3, 224, 224) and torch.bincount(d.y).tolist() == [10] * 10
    assert 0 <= d.x.min() and d.x.max() <= 1 and d.classes[6] == "garbage truck"
    # the first garbage-truck photo by hand: Pillow, RGB, short side to 160, centre crop
    from PIL import Image

    with Image.open(sorted((folder / "n03417042").glob("*.JPEG"))[0]) as im:
        im = im.convert("RGB")
        w, h = im.size
        im = im.resize((round(w * 160 / min(w, h)), round(h * 160 / min(w, h))), Image.BILINEAR)
        left, top = (im.size[0] - 160) // 2, (im.size[1] - 160) // 2
        by_hand = torch.tensor(list(im.crop((left, top, left + 160, top + 160)).getdata())).view(160, 160, 3)
    small = D.load_imagenette(size=160)
    assert (small.x[60] * 255 - by_hand.permute(2, 0, 1)).abs().max() <= 1  # rounding of the resampling
    assert [D.IMAGENETTE_IMAGENET_INDEX[c] for c in (0, 4, 9)] == [0, 497, 701]  # tench, church, parachute


def test_imagenette_missing_names_the_paths(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"(?s)Imagenette.*val-sample.*n01440764.*fastai/imagenette"):
        D.load_imagenette(root=tmp_path, download=False)
    with pytest.raises(ValueError, match="size must be a positive int"):
        D.load_imagenette(size=0, root=tmp_path)


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "load, split, expected",
    [
        (load_mnist, "test", "mnist/raw/t10k-images-idx3-ubyte.gz"),
        (load_mnist, "train5k", "mnist/train-5k.npz"),
        (load_mnist, "train", "MNIST/raw/train-images-idx3-ubyte"),
        (load_cifar10, "test", "cifar10/test"),
        (load_cifar10, "train", "cifar10/cifar-10-batches-py"),
    ],
)
def test_missing_data_names_paths_and_how_to_fix(monkeypatch, tmp_path, load, split, expected):
    monkeypatch.setenv("DUALVIEW_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError) as info:
        load(split, download=False)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert str(tmp_path / expected) in message and "DUALVIEW_DATA" in message
    assert "network" in message and "DUALVIEW_MIRROR" in message
    assert not list(tmp_path.rglob("*"))  # download=False: nothing was fetched or created


@pytest.mark.parametrize("load, split", [(load_mnist, "test"), (load_mnist, "train5k"), (load_cifar10, "test")])
def test_failed_download_is_a_clear_error(monkeypatch, tmp_path, load, split):
    monkeypatch.setenv("DUALVIEW_MIRROR", "http://127.0.0.1:9")  # the discard port: connection refused
    with pytest.raises(DataNotFoundError, match="(?s)DUALVIEW_DATA.*The download failed.*127.0.0.1:9/") as info:
        load(split, root=tmp_path)
    assert str(tmp_path) in str(info.value)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no partial file left behind


@pytest.mark.parametrize(
    "load, bad", [(load_mnist, "validation"), (load_mnist, "Test"), (load_cifar10, "train5k")]
)
def test_bad_split(load, bad):
    with pytest.raises(ValueError, match="split must be one of 'test'"):
        load(bad)


def test_root_argument_overrides_data_dir(monkeypatch, tmp_path):
    src = require("mnist/train-5k.npz")
    (tmp_path / "mnist").mkdir()
    shutil.copy(src, tmp_path / "mnist" / src.name)
    monkeypatch.setenv("DUALVIEW_DATA", str(tmp_path / "nowhere"))
    assert len(load_mnist("train5k", root=tmp_path)) == 5000


# ------------------------------------------------------------------------------- labels line up


def test_mnist_labels_line_up_with_images(mnist):
    """The first test labels are the well-known 7, 2, 1, 0, 4, and each image is its own: the label
    file is not shifted against the image file (pixel checks of the first digits)."""
    assert mnist.y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    raw = D.read_idx(ROOT / "mnist/raw/t10k-images-idx3-ubyte.gz")
    torch.testing.assert_close(mnist.x[:5, 0], torch.from_numpy(raw[:5].copy()).float() / 255)
    # a "1" is thin: the images labelled 1 have the fewest ink pixels on average
    ink = (mnist.x > 0.5).flatten(1).sum(1).double()
    per_class = torch.stack([ink[mnist.y == c].mean() for c in range(10)])
    assert per_class.argmin().item() == 1


def test_cifar10_labels_follow_the_class_folders(cifar):
    """Every image carries the index of the folder it was read from, in torchvision's class order."""
    import numpy as np
    from PIL import Image

    for c, name in enumerate(CIFAR10_CLASSES):
        first = sorted((ROOT / "cifar10/test" / name).glob("*.jpg"))[0]
        pixels = torch.from_numpy(np.asarray(Image.open(first).convert("RGB"))).permute(2, 0, 1)
        same = (cifar.x == pixels.float()[None] / 255).flatten(1).all(1)
        assert same.any(), f"{first} is not in the loaded set"
        assert set(cifar.y[same].tolist()) == {c}, f"{first} should have label {c} ({name})"


# ------------------------------------------------------------------------------- IXOR (synthetic)


def test_ixor_matches_its_definition_and_reference():
    x, y = D.make_ixor(2000, seed=3)
    assert x.shape == (2000, 3) and y.dtype == torch.int64
    assert (x[:, :2].abs() <= 2).all() and (x[:, 2] >= 0).all() and (x[:, 2] <= 1).all()
    assert torch.equal(y, D.ixor_labels_reference(x))
    assert abs(y.double().mean() - 0.25) < 0.05  # P(x1 x2 > 0) P(x3 > 0.5) = 1/4
    assert torch.equal(D.make_ixor(10, seed=3)[0], D.make_ixor(10, seed=3)[0])
    with pytest.raises(ValueError, match="positive int"):
        D.make_ixor(0)
