"""Tests of dualview.zoo: the pretrained weights reproduce the accuracies of the data README.

Run with DUALVIEW_DATA=/path/to/shared/data. The accuracy tests evaluate the MNIST networks on the full test
set and the CIFAR ResNets on a 2,000-image stratified subset (the README's accuracy is then compared within four
binomial standard errors), about half a minute on two CPU cores.
"""
from __future__ import annotations

import os
import shutil
from collections import Counter

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from dualview import zoo
from dualview.data import DataNotFoundError, data_dir, load_cifar10, load_mnist
from dualview.splits import subset_per_class
from dualview.gates import check_supported
from dualview.nets import Normalize, Resize, ShortcutA, cifar_resnet
from dualview.zoo import PRETRAINED, ChecksumError, load_pretrained

ROOT = data_dir()  # resolved once, before any test changes the environment


def require(relative: str) -> None:
    """Skip (only) when DUALVIEW_DATA is not set at all and the data directory lacks the file."""
    if not (ROOT / relative).exists() and "DUALVIEW_DATA" not in os.environ:
        pytest.skip(f"offline data not found at {ROOT / relative}: set DUALVIEW_DATA to the data folder")


@pytest.fixture(scope="module")
def test_sets() -> dict:
    require("mnist/raw")
    require("cifar10/test")
    return {
        "mnist": load_mnist(root=ROOT, download=False),
        "cifar10": load_cifar10(root=ROOT, download=False),
    }


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 500) -> float:
    with torch.no_grad():
        predictions = torch.cat([model(xb).argmax(1) for xb in x.split(batch_size)])
    return (predictions == y).double().mean().item()


# name, lower bound on the accuracy, images per class (None: the whole test set)
ACCURACY = [
    ("mnist-cnn-20-50-500", 0.989, None),
    ("mnist-lenet5", 0.988, None),
    ("advertorch-lenet5-clean", 0.987, None),
    ("advertorch-lenet5-adv", 0.984, None),
    ("resnet20", 0.80, 200),
    ("resnet32", 0.80, 200),
    ("resnet44", 0.80, 200),
    ("resnet56", 0.82, 200),
]


@pytest.mark.parametrize("name, bound, per_class", ACCURACY)
def test_pretrained_accuracy(test_sets, name, bound, per_class):
    require(f"weights/{PRETRAINED[name].filename}")
    data = test_sets[PRETRAINED[name].dataset]
    if per_class is not None:
        data = subset_per_class(data, per_class, seed=0)
    model = load_pretrained(name, root=ROOT, download=False)
    assert not any(m.training for m in model.modules())
    acc = accuracy(model, data.x, data.y)
    assert acc >= bound, f"{name}: {acc:.4f} < {bound} on {len(data)} images of {data.source}"
    readme = PRETRAINED[name].accuracy  # the README's number, on the whole test set
    if readme is not None:  # on a subset: within four binomial standard errors of it
        tolerance = 0.01 if per_class is None else max(0.01, 4 * (readme * (1 - readme) / len(data)) ** 0.5)
        assert abs(acc - readme) < tolerance, f"{name}: {acc:.4f} on {len(data)} images, README {readme}"


def test_registry():
    assert list(PRETRAINED) == [
        "mnist-cnn-20-50-500", "mnist-lenet5", "advertorch-lenet5-clean", "advertorch-lenet5-adv",
        "resnet20", "resnet32", "resnet44", "resnet56",
    ]
    for name, spec in PRETRAINED.items():
        assert spec.name == name and len(spec.sha256) == 64 and spec.licence
        assert spec.url.startswith("https://")
        if name.startswith("resnet"):
            assert spec.url.endswith("/pretrained_models/" + spec.filename)
            assert spec.filename == f"{name}-{spec.sha256[:8]}.th"  # akamaster names files by hash
        model = nn.Sequential(spec.preprocess(), spec.build()).eval()
        with torch.no_grad():
            assert model(torch.rand(2, *spec.input_shape)).shape == (2, 10)


def test_models_are_supported_by_the_gate_recorder():
    for name in PRETRAINED:
        require(f"weights/{PRETRAINED[name].filename}")
        check_supported(load_pretrained(name, root=ROOT, download=False))


class _CountRelu(TorchFunctionMode):
    """Counts relu calls however they are made (module or functional)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.relu, torch.relu_, nn.functional.relu, nn.functional.relu_, torch.Tensor.relu):
            self.calls += 1
        return func(*args, **(kwargs or {}))


ARCHITECTURES = {
    **{name: (lambda spec=spec: nn.Sequential(spec.preprocess(), spec.build()), spec.input_shape)
       for name, spec in PRETRAINED.items()},
    "resnet8": (lambda: cifar_resnet(8), (3, 32, 32)),
    "resnet110": (lambda: cifar_resnet(110), (3, 32, 32)),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_relu_is_its_own_module_called_once(name):
    build, shape = ARCHITECTURES[name]
    model = build().eval()
    relus = [m for _, m in model.named_modules(remove_duplicate=False) if isinstance(m, nn.ReLU)]
    assert relus and len({id(m) for m in relus}) == len(relus)  # no instance reused under two names
    assert not any(m.inplace for m in relus)
    calls: Counter[int] = Counter()
    for m in relus:
        m.register_forward_hook(lambda mod, args, out: calls.update([id(mod)]))
    with torch.no_grad(), _CountRelu() as counter:
        model(torch.rand(2, *shape))
    assert sorted(calls.values()) == [1] * len(relus)
    assert counter.calls == len(relus)  # no functional relu besides the modules'


def test_resnet_depths_and_parameters():
    for depth, params in [(20, 269_722), (56, 853_018)]:  # 0.27M and 0.85M as in He et al. (2016)
        net = cifar_resnet(depth)
        assert sum(p.numel() for p in net.parameters()) == params
        assert sum(isinstance(m, nn.ReLU) for m in net.modules()) == depth - 1
    assert cifar_resnet(20, num_classes=100).linear.out_features == 100


@pytest.mark.parametrize("depth", [0, 2, 19, 21, 22, 20.0, "20", True, None])
def test_bad_depth(depth):
    with pytest.raises(ValueError, match="6n"):
        cifar_resnet(depth)


def test_helper_layers():
    x = torch.rand(2, 3, 4, 4)
    norm = Normalize((0.1, 0.2, 0.3), (0.5, 0.5, 0.25))
    assert torch.allclose(norm(x)[:, 2], (x[:, 2] - 0.3) / 0.25)
    assert norm.state_dict() == {}  # constants, not weights
    with pytest.raises(ValueError):
        Normalize((0.1, 0.2), (1.0,))
    assert torch.allclose(Resize(32)(torch.full((1, 1, 28, 28), 0.7)), torch.full((1, 1, 32, 32), 0.7))
    out = ShortcutA(32)(torch.rand(2, 16, 8, 8))
    assert out.shape == (2, 32, 4, 4) and out[:, :8].abs().sum() == 0 and out[:, 24:].abs().sum() == 0


def test_unknown_name():
    known = "known: mnist-cnn-20-50-500, mnist-lenet5, .*resnet56"
    with pytest.raises(ValueError, match=f"unknown pretrained model 'resnet18'; {known}"):
        load_pretrained("resnet18")


def test_checksum_mismatch_and_cache(tmp_path):
    require("weights/mnist-lenet5.pt")
    spec = PRETRAINED["mnist-lenet5"]
    (tmp_path / "weights").mkdir()
    copy = tmp_path / "weights" / spec.filename
    shutil.copy(ROOT / "weights" / spec.filename, copy)
    load_pretrained("mnist-lenet5", root=tmp_path)
    assert any(key[0] == str(copy.resolve()) for key in zoo._VERIFIED)  # checked once per process
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new version of the file
    with pytest.raises(ChecksumError) as info:
        load_pretrained("mnist-lenet5", root=tmp_path)
    message = str(info.value)
    assert str(copy) in message and spec.sha256 in message
    assert (actual := message.split("got ")[1].split(".")[0]) != spec.sha256 and len(actual) == 64


@pytest.mark.parametrize("name", ["mnist-cnn-20-50-500", "resnet20"])
def test_missing_weights(monkeypatch, tmp_path, name):
    monkeypatch.setenv("DUALVIEW_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError) as info:
        load_pretrained(name, download=False)
    message = str(info.value)
    assert str(tmp_path / "weights" / PRETRAINED[name].filename) in message and "DUALVIEW_DATA" in message
    assert PRETRAINED[name].url in message and "DUALVIEW_MIRROR" in message


def test_failed_download(monkeypatch, tmp_path):
    monkeypatch.setenv("DUALVIEW_MIRROR", "http://127.0.0.1:9")  # the discard port: connection refused
    with pytest.raises(DataNotFoundError, match="(?s)akamaster.*download failed.*127.0.0.1:9/github.com/akamaster"):
        load_pretrained("resnet20", root=tmp_path)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
