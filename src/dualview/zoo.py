"""Pretrained ReLU networks: weights from the data directory, checked by SHA-256, in our own modules.

Every architecture here is a plain ``nn.Module`` in which each ReLU is its own ``nn.ReLU()`` instance,
used exactly once in ``forward`` (no ``F.relu``, no shared or in-place ReLU), so that
:mod:`dualview.gates` can record every gate. :func:`load_pretrained` returns
``nn.Sequential(preprocess=..., net=...)`` in eval mode, taking images in ``[0, 1]``; the
preprocessing layers (:class:`Normalize`, :class:`Resize`, :class:`ShortcutA`) are affine and
declared as linear layers to the gate recorder.

Weights files live in ``data_dir() / "weights"`` (see :mod:`dualview.data`); the CIFAR ResNets are
downloaded from their public URL when missing and a network is there. :data:`PRETRAINED` lists them.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from dualview.data import DataNotFoundError, data_dir

__all__ = [
    "Normalize",
    "Resize",
    "ShortcutA",
    "BasicBlock",
    "CifarResNet",
    "mnist_cnn",
    "lenet5",
    "advertorch_lenet5",
    "cifar_resnet",
    "Pretrained",
    "PRETRAINED",
    "ChecksumError",
    "load_pretrained",
]

# --------------------------------------------------------------------------------------------------
# Affine helper layers


class Normalize(nn.Module):
    """Per-channel affine map ``(x - mean) / std`` on ``(N, C, H, W)`` inputs."""

    pointwise = True  # each output pixel reads only the same input pixel (receptive fields, projections.insens)

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
        std_t = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
        if mean_t.numel() != std_t.numel() or not bool((std_t > 0).all()):
            raise ValueError(f"mean and std need the same length and std > 0, got {mean!r}, {std!r}")
        self.register_buffer("mean", mean_t, persistent=False)
        self.register_buffer("std", std_t, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class Resize(nn.Module):
    """Bilinear resize (``align_corners=False``), e.g. 28x28 MNIST to the 32x32 input of LeNet-5."""

    def __init__(self, size: int | tuple[int, int]) -> None:
        super().__init__()
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)

    def extra_repr(self) -> str:
        return f"size={self.size}"


class ShortcutA(nn.Module):
    """The "option A" CIFAR ResNet shortcut: subsample ``x[:, :, ::2, ::2]``, zero-pad channels.

    ``planes // 4`` zero channels go on each side, so 16 -> 32 and 32 -> 64 channels (He et al. 2016).
    """

    def __init__(self, planes: int) -> None:
        super().__init__()
        self.pad = planes // 4

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))

    def extra_repr(self) -> str:
        return f"pad={self.pad}"


from dualview.gates import register_linear_layer  # noqa: E402  (after the classes it registers)

register_linear_layer(Normalize, Resize, ShortcutA)


class _ResizeConnectivity(nn.Module):
    """Unit-weight version of :class:`Resize` for path counting: each output pixel sums, with weight 1,
    the input pixels its bilinear interpolation reads (those with a non-zero interpolation weight)."""

    def __init__(self, resize: Resize) -> None:
        super().__init__()
        self.size = resize.size

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        basis = torch.eye(h * w, dtype=x.dtype, device=x.device).view(h * w, 1, h, w)
        reads = F.interpolate(basis, size=self.size, mode="bilinear", align_corners=False) != 0
        conn = reads.flatten(1).to(x.dtype)  # (h*w inputs, H*W outputs)
        return (x.reshape(n * c, h * w) @ conn).view(n, c, *self.size)


from dualview.paths import register_unit_rule  # noqa: E402

register_linear_layer(_ResizeConnectivity)
register_unit_rule(Normalize, lambda m: nn.Identity())  # a per-pixel affine map: one edge per pixel
register_unit_rule(ShortcutA, lambda m: m)  # a fixed selection of inputs: edges of weight 1 already
register_unit_rule(Resize, _ResizeConnectivity)

# --------------------------------------------------------------------------------------------------
# Architectures (module names match the published state dicts)


def mnist_cnn() -> nn.Sequential:
    """conv 1->20 5x5, ReLU, maxpool 2, conv 20->50 5x5, ReLU, maxpool 2, fc 800->500, ReLU, fc 500->10.

    The shape of the "2CONV" network of the switched-projections paper; 28x28 input.
    """
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(1, 20, 5), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(20, 50, 5), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), fc1=nn.Linear(800, 500), relu3=nn.ReLU(), fc2=nn.Linear(500, 10),
    ))


def lenet5() -> nn.Sequential:
    """LeNet-5 with ReLUs and max pools on a 32x32 input: c1 1->6, c3 6->16, c5 16->120 (5x5), f6, f7.

    The original ends in a LogSoftmax; we return the logits (same argmax).
    """
    return nn.Sequential(OrderedDict(
        convnet=nn.Sequential(OrderedDict(
            c1=nn.Conv2d(1, 6, 5), relu1=nn.ReLU(), s2=nn.MaxPool2d(2),
            c3=nn.Conv2d(6, 16, 5), relu3=nn.ReLU(), s4=nn.MaxPool2d(2),
            c5=nn.Conv2d(16, 120, 5), relu5=nn.ReLU(),
        )),
        flatten=nn.Flatten(),
        fc=nn.Sequential(OrderedDict(f6=nn.Linear(120, 84), relu6=nn.ReLU(), f7=nn.Linear(84, 10))),
    ))


def advertorch_lenet5() -> nn.Sequential:
    """advertorch's MNIST LeNet5: conv 1->32 3x3 pad 1, ReLU, maxpool 2, conv 32->64, ReLU, maxpool 2,
    linear 3136->200, ReLU, linear 200->10; 28x28 input in [0, 1]."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(1, 32, 3, padding=1), relu1=nn.ReLU(), maxpool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(32, 64, 3, padding=1), relu2=nn.ReLU(), maxpool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), linear1=nn.Linear(7 * 7 * 64, 200), relu3=nn.ReLU(), linear2=nn.Linear(200, 10),
    ))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU (two separate ReLU modules)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        changes_shape = stride != 1 or in_planes != planes
        self.shortcut = ShortcutA(planes) if changes_shape else nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """The CIFAR ResNet of He et al. (2016), depth ``6n + 2``: three stages of ``n`` blocks with 16,
    32 and 64 channels, option-A shortcuts, global average pooling and a ``linear`` head.

    Parameter names match akamaster/pytorch_resnet_cifar10 (without its ``module.`` prefix).
    """

    def __init__(self, depth: int, num_classes: int = 10) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
            raise ValueError(
                f"depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...); got {depth!r}"
            )
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.layer1 = self._stage(16, 16, n, stride=1)
        self.layer2 = self._stage(16, 32, n, stride=2)
        self.layer3 = self._stage(32, 64, n, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(64, num_classes)

    @staticmethod
    def _stage(in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            BasicBlock(in_planes, planes, stride), *(BasicBlock(planes, planes) for _ in range(blocks - 1))
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.linear(self.flatten(self.pool(out)))


def cifar_resnet(depth: int, num_classes: int = 10) -> CifarResNet:
    """A CIFAR ResNet of depth ``6n + 2`` (20, 32, 44, 56, 110, ...); see :class:`CifarResNet`."""
    return CifarResNet(depth, num_classes)


# --------------------------------------------------------------------------------------------------
# The registry


def _mnist_normalize() -> Normalize:
    return Normalize(0.1307, 0.3081)


def _imagenet_normalize() -> Normalize:
    return Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _resize_and_normalize() -> nn.Sequential:
    return nn.Sequential(OrderedDict(resize=Resize(32), normalize=_mnist_normalize()))


@dataclass(frozen=True)
class Pretrained:
    """One pretrained network: its file, checksum, architecture, preprocessing and provenance.

    ``build()`` and ``preprocess()`` make fresh modules; the model takes ``(N, *input_shape)``
    images in ``[0, 1]``. ``accuracy`` is the top-1 accuracy the offline data's README reports on
    the local test set of ``dataset`` (for CIFAR-10 the lossy JPEG copies), ``None`` where it
    reports none. ``url`` is the public download address, ``None`` where only the data directory
    has the file.
    """

    name: str
    filename: str
    sha256: str
    build: Callable[[], nn.Module]
    preprocess: Callable[[], nn.Module]
    input_shape: tuple[int, int, int]
    dataset: str
    accuracy: float | None
    url: str | None
    licence: str
    description: str


def _mnist(name: str, filename: str, sha256: str, **fields) -> Pretrained:
    return Pretrained(name, filename, sha256, input_shape=(1, 28, 28), dataset="mnist", url=None, **fields)


def _resnet(depth: int, sha256: str, accuracy: float | None, lossless: float) -> Pretrained:
    filename = f"resnet{depth}-{sha256[:8]}.th"
    return Pretrained(
        f"resnet{depth}", filename, sha256, build=lambda: cifar_resnet(depth), preprocess=_imagenet_normalize,
        input_shape=(3, 32, 32), dataset="cifar10", accuracy=accuracy,
        url=f"https://github.com/akamaster/pytorch_resnet_cifar10/raw/master/pretrained_models/{filename}",
        licence="BSD-2-Clause",
        description=f"CIFAR ResNet-{depth} (He et al. 2016) from akamaster/pytorch_resnet_cifar10; "
        f"{lossless}% on the lossless CIFAR-10 test set (best_prec1 stored in the file)",
    )


PRETRAINED: dict[str, Pretrained] = {p.name: p for p in [
    _mnist(
        "mnist-cnn-20-50-500", "mnist-cnn-20-50-500.pt",
        "2af1dfcb084e92bd836094fc0874cd6b8699cc69b889e7c724a41500bd612848",
        build=mnist_cnn, preprocess=_mnist_normalize, accuracy=0.9905, licence="MIT",
        description="conv-conv-fc-fc MNIST network (the '2CONV' shape) from khushbujpatel/lenet_mnist",
    ),
    _mnist(
        "mnist-lenet5", "mnist-lenet5.pt", "d5d98d05c84b8cf305ebf37ca682a9852c41831230a3667e0e39cfeb7c88f4e2",
        build=lenet5, preprocess=_resize_and_normalize, accuracy=0.9904, licence="MIT",
        description="LeNet-5 with ReLUs (32x32 input: MNIST resized bilinearly) "
        "from khushbujpatel/lenet_mnist",
    ),
    _mnist(
        "advertorch-lenet5-clean", "advertorch_mnist_lenet5_clntrained.pt",
        "551a11267982991fb0c9f74e9094de19e54b51455eff9bd1c19c77a69d85156a",
        build=advertorch_lenet5, preprocess=nn.Identity, accuracy=0.9889, licence="LGPL-3.0",
        description="advertorch's MNIST LeNet5 trained on clean data "
        "(also in the PyPI sdist advertorch-0.2.3)",
    ),
    _mnist(
        "advertorch-lenet5-adv", "advertorch_mnist_lenet5_advtrained.pt",
        "b89abfcfe8b33235fe8f8e964188d82a97c56a12ffe25132eaba197e40ac7658",
        build=advertorch_lenet5, preprocess=nn.Identity, accuracy=0.9864, licence="LGPL-3.0",
        description="advertorch's MNIST LeNet5, adversarially trained; robust models have perceptually "
        "aligned gradients (also in the PyPI sdist advertorch-0.2.3)",
    ),
    # accuracy on the JPEG test copies: the README's numbers (we measure 81.0%, 82.6%, 82.7%, 83.2%)
    _resnet(20, "12fca82f0bebc4135bf1f32f6e3710e61d5108578464b84fd6d7f5c1b04036c8", 0.810, 91.78),
    _resnet(32, "d509ac1820d7f25398913559d7e81a13229b1e7adc5648e3bfa5e22dc137f850", None, 92.78),
    _resnet(44, "014dd6541728a1c700b1642ab640e211dc6eb8ed507d70697458dc8f8a0ae2e4", None, 93.14),
    _resnet(56, "4bfd97631478d6b638d2764fd2baff3edb1d7d82252d54439343b6596b9b5367", 0.839, 93.62),
]}

# --------------------------------------------------------------------------------------------------
# Loading


class ChecksumError(RuntimeError):
    """A weights file's SHA-256 differs from the published one."""


_VERIFIED: set[tuple[str, int, int, str]] = set()  # (path, size, mtime_ns, sha256) checked in this process


def _verify_sha256(path: Path, expected: str) -> None:
    """Raise :class:`ChecksumError` unless ``path`` hashes to ``expected`` (cached per process)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, expected)
    if key in _VERIFIED:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    actual = digest.hexdigest()
    if actual != expected:
        raise ChecksumError(
            f"SHA-256 mismatch for {path}: expected {expected}, got {actual}. The file is corrupted or "
            "not the published one: delete it and provide the original (or let it download again)."
        )
    _VERIFIED.add(key)


def _spec(name: str) -> Pretrained:
    if name not in PRETRAINED:
        raise ValueError(f"unknown pretrained model {name!r}; known: {', '.join(PRETRAINED)}")
    return PRETRAINED[name]


def _weights_file(spec: Pretrained, root: str | os.PathLike | None, download: bool | None) -> Path:
    """The local weights file, downloaded into ``root/weights`` first if needed and possible."""
    folder = (data_dir() if root is None else Path(root).expanduser()) / "weights"
    path = folder / spec.filename
    if path.is_file():
        return path
    failure = ""
    if spec.url is not None and download is not False:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(spec.url, str(path), progress=True)
            return path
        except Exception as err:  # no network, read-only directory, ...
            failure = f"\nThe download from {spec.url} failed: {err!r}"
    how = (
        f"or run where a network is available (download=None) so it downloads from {spec.url}"
        if spec.url is not None
        else "these weights have no public download URL, so the data directory is needed"
    )
    raise DataNotFoundError(
        f"weights file {spec.filename!r} of pretrained model {spec.name!r} not found. Paths tried:\n"
        f"  {path}\nTo provide it, set DUALVIEW_DATA (or pass root=) to a folder holding "
        f"weights/{spec.filename} (the project's offline data folder has it), {how}.{failure}"
    )


def load_pretrained(
    name: str, root: str | os.PathLike | None = None, device: torch.device | str = "cpu",
    download: bool | None = None,
) -> nn.Sequential:
    """A pretrained network from :data:`PRETRAINED`, as ``nn.Sequential(preprocess=..., net=...)``.

    Takes images in ``[0, 1]`` of shape ``(N, *PRETRAINED[name].input_shape)`` and returns logits.
    The weights file (in ``root/weights``, default ``data_dir()/weights``) is checked against its
    SHA-256 (once per process) and loaded with ``weights_only=True`` and ``strict=True``. The model
    is in eval mode on ``device``. ``download=False`` never touches the network.
    """
    spec = _spec(name)
    path = _weights_file(spec, root, download)
    _verify_sha256(path, spec.sha256)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if "state_dict" in state:  # akamaster's files: {"state_dict": ..., "best_prec1": ...}
        state = state["state_dict"]
    consume_prefix_in_state_dict_if_present(state, "module.")  # saved from nn.DataParallel
    net = spec.build()
    net.load_state_dict(state, strict=True)
    model = nn.Sequential(OrderedDict(preprocess=spec.preprocess(), net=net))
    return model.to(device).eval()
