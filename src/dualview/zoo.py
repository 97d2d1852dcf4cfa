"""Pretrained ReLU networks: weights from the data directory, checked by SHA-256, loaded into the
architectures of :mod:`dualview.nets`.

:func:`load_pretrained` returns ``nn.Sequential(preprocess=..., net=...)`` in eval mode, taking images
in ``[0, 1]``; the preprocessing layers (:class:`~dualview.nets.Normalize`,
:class:`~dualview.nets.Resize`) are affine and declare themselves linear layers to the gate recorder.

Weights files live in ``data_dir() / "weights"`` (see :mod:`dualview.data`); when one is missing it is
downloaded from its original public source (through :func:`dualview.download.download`, so
``$DUALVIEW_MIRROR`` applies) and kept only if its SHA-256 matches. :data:`PRETRAINED` lists them.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from dualview import smoke_scale
from dualview.data import DataNotFoundError, data_dir, shown_path
from dualview.download import ChecksumError, download as download_file, file_digest
from dualview.nets import Normalize, Resize, advertorch_lenet5, cifar_resnet, lenet5, mnist_cnn

__all__ = [
    "Pretrained",
    "PRETRAINED",
    "ChecksumError",
    "load_pretrained",
    "imagenet_model",
]

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
    reports none. ``url`` is the original public address of the file (at a fixed commit where the
    repository has several versions under one name).
    """

    name: str
    filename: str
    sha256: str
    build: Callable[[], nn.Module]
    preprocess: Callable[[], nn.Module]
    input_shape: tuple[int, int, int]
    dataset: str
    accuracy: float | None
    url: str
    licence: str
    description: str


_LENET_MNIST = "https://raw.githubusercontent.com/khushbujpatel/lenet_mnist/{}/mnist_cnn.pt"
_ADVERTORCH = ("https://raw.githubusercontent.com/BorealisAI/advertorch/a83f4c77bbd1487edac84e34720377d0eebccd92/"
               "advertorch_examples/trained_models/{}")


def _mnist(name: str, filename: str, sha256: str, **fields) -> Pretrained:
    return Pretrained(name, filename, sha256, input_shape=(1, 28, 28), dataset="mnist", **fields)


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
        # the repository's mnist_cnn.pt before a later commit replaced it with the LeNet-5 below
        url=_LENET_MNIST.format("7a74792fa7b79b673b13655d054a53c6565b1584"),
        description="conv-conv-fc-fc MNIST network (the '2CONV' layer pattern, fewer units) from khushbujpatel/lenet_mnist",
    ),
    _mnist(
        "mnist-lenet5", "mnist-lenet5.pt", "d5d98d05c84b8cf305ebf37ca682a9852c41831230a3667e0e39cfeb7c88f4e2",
        build=lenet5, preprocess=_resize_and_normalize, accuracy=0.9904, licence="MIT",
        url=_LENET_MNIST.format("3083aa4f498d3a2d975a677ad1e3dec2842acd20"),
        description="LeNet-5 with ReLUs (32x32 input: MNIST resized bilinearly) "
        "from khushbujpatel/lenet_mnist",
    ),
    _mnist(
        "advertorch-lenet5-clean", "advertorch_mnist_lenet5_clntrained.pt",
        "551a11267982991fb0c9f74e9094de19e54b51455eff9bd1c19c77a69d85156a",
        build=advertorch_lenet5, preprocess=nn.Identity, accuracy=0.9889, licence="LGPL-3.0",
        url=_ADVERTORCH.format("mnist_lenet5_clntrained.pt"),
        description="advertorch's MNIST LeNet5 trained on clean data "
        "(also in the PyPI sdist advertorch-0.2.3)",
    ),
    _mnist(
        "advertorch-lenet5-adv", "advertorch_mnist_lenet5_advtrained.pt",
        "b89abfcfe8b33235fe8f8e964188d82a97c56a12ffe25132eaba197e40ac7658",
        build=advertorch_lenet5, preprocess=nn.Identity, accuracy=0.9864, licence="LGPL-3.0",
        url=_ADVERTORCH.format("mnist_lenet5_advtrained.pt"),
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


_VERIFIED: set[tuple[str, int, int, str]] = set()  # (path, size, mtime_ns, sha256) checked in this process


def _verify_sha256(path: Path, expected: str) -> None:
    """Raise :class:`ChecksumError` unless ``path`` hashes to ``expected`` (cached per process)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, expected)
    if key in _VERIFIED:
        return
    actual = file_digest(path)
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
    if download is not False:
        try:
            return download_file(spec.url, path, f"sha256:{spec.sha256}")
        except Exception as err:  # no network, a checksum mismatch, a read-only directory, ...
            failure = f"\nThe download failed: {err}"
    raise DataNotFoundError(
        f"weights file {spec.filename!r} of pretrained model {spec.name!r} not found. Paths tried:\n"
        f"  {path}\nTo provide it, set DUALVIEW_DATA (or pass root=) to a folder holding "
        f"weights/{spec.filename} (the project's offline data folder has it), or run where a network is "
        f"available (download=None) so it downloads from {spec.url} (or set DUALVIEW_MIRROR to the base "
        f"URL of a mirror of the public files).{failure}"
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


def imagenet_model(arch: str, weights: str | None = "IMAGENET1K_V1",
                   device: torch.device | str = "cpu") -> nn.Sequential:
    """A torchvision ImageNet classifier as ``nn.Sequential(preprocess=..., net=...)``, in eval mode.

    Takes images in ``[0, 1]`` (any size from 32 pixels up; ImageNet's normalisation is the affine
    ``preprocess``) and returns the 1,000 ImageNet logits. ``arch`` is a torchvision model name
    (``"resnet50"``, ``"vgg11_bn"``, ``"densenet121"``: the networks of Satkiewicz 2025, Section 5) and
    ``weights`` the name of one of its weight sets, which torchvision downloads once into
    ``torch.hub.get_dir()`` and checks; ``None`` gives random weights. In a smoke run
    (:func:`dualview.smoke_scale`) nothing is downloaded: weights not already cached are replaced by
    random ones, and it says so.
    """
    import torchvision

    try:
        choices = torchvision.models.get_model_weights(arch)
    except ValueError as error:
        raise ValueError(f"{arch!r} is not a torchvision model name (e.g. 'resnet50', 'vgg11_bn')") from error
    if weights is not None:
        if weights not in choices.__members__:
            raise ValueError(f"{arch} has no weights {weights!r}; torchvision offers {list(choices.__members__)}")
        cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(choices[weights].url)
        if smoke_scale() and not cached.is_file():
            print(f"smoke scale: the {arch} weights {weights} are not in {shown_path(cached.parent)} and a smoke run "
                  "downloads nothing; random weights stand in for them")
            weights = None
    net = torchvision.models.get_model(arch, weights=weights)
    model = nn.Sequential(OrderedDict(preprocess=_imagenet_normalize(), net=net))
    return model.to(device).eval()
