"""Part of :mod:`dualview.data` (see its docstring)."""
from __future__ import annotations

import numbers
import os
import pickle
from pathlib import Path
import numpy as np
import torch
from PIL import Image
from torch import Tensor
from dualview.download import fetch_unpacked
from dualview.data.files import CIFAR10_CLASSES, ImageData, _at_scale, _check_choice, _failed, _image_data, _not_found, _root, shown_path


# --------------------------------------------------------------------------------------------------
# CIFAR-10 and CIFAR-100


def _decode_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _read_jpeg_folder(folder: Path) -> tuple[Tensor, Tensor]:
    """Decode ``folder/<class>/*.jpg`` (sorted by name) with Pillow into uint8 ``(N, 3, H, W)``."""
    files = [sorted((folder / c).glob("*.jpg")) for c in CIFAR10_CLASSES]
    empty = [folder / c / "*.jpg" for c, f in zip(CIFAR10_CLASSES, files, strict=True) if not f]
    if empty:
        raise _not_found("CIFAR-10 JPEG images", empty, "cifar10/test/<class>/*.jpg", None)
    images = np.stack([_decode_rgb(p) for f in files for p in f])
    counts = torch.tensor([len(f) for f in files])
    labels = torch.repeat_interleave(torch.arange(len(CIFAR10_CLASSES)), counts)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), labels


def _read_cifar_batches(folder: Path, split: str) -> tuple[Tensor, Tensor]:
    """The python version's pickled batches (``test_batch`` or ``data_batch_1..5``) as uint8
    ``(N, 3, 32, 32)`` images and labels, ordered class by class (the original order within a class)."""
    names = ["test_batch"] if split == "test" else [f"data_batch_{k}" for k in range(1, 6)]
    missing = [folder / n for n in names if not (folder / n).is_file()]
    if missing:
        raise _not_found(f"CIFAR-10 {split} batches", missing, "cifar10/cifar-10-batches-py/*_batch*", None)
    batches = []
    for name in names:  # checked by the tarball's MD5 when downloaded here
        with open(folder / name, "rb") as f:
            batches.append(pickle.load(f, encoding="latin1"))
    x = np.concatenate([b["data"] for b in batches]).reshape(-1, 3, 32, 32)
    y = np.concatenate([b["labels"] for b in batches])
    order = np.argsort(y, kind="stable")
    return torch.from_numpy(x[order]), torch.from_numpy(y[order])


def _load_cifar10(
    split: str = "test", root: str | os.PathLike | None = None, download: bool | None = None
) -> ImageData:
    """:func:`load_cifar10` without the smoke-run policy."""
    _check_choice("split", split, ("test", "train"))
    root = _root(root)
    tried, layout = [], "cifar10/test/<class>/*.jpg or cifar10/cifar-10-batches-py"
    if split == "test":
        folder = root / "cifar10" / "test"
        tried.append(folder)
        if folder.is_dir():
            x, y = _read_jpeg_folder(folder)
            source = f"CIFAR-10 test images, lossy JPEG re-encodings, from {shown_path(folder, root)}"
            return _image_data(x, y, CIFAR10_CLASSES, source)
    batches = root / "cifar10" / "cifar-10-batches-py"
    tried.append(batches)
    error = None
    if not batches.is_dir():
        error = fetch_unpacked(root, "cifar10/cifar-10-python.tar.gz", batches, "cifar-10-batches-py/",
                               allowed=download)
    if not batches.is_dir():
        raise _not_found(f"CIFAR-10 {split} set", tried, layout, root / "cifar10", _failed(error)) from error
    x, y = _read_cifar_batches(batches, split)
    source = f"CIFAR-10 {split} set (lossless, the python version) from {shown_path(batches, root)}, class by class"
    return _image_data(x, y, CIFAR10_CLASSES, source)


def load_cifar10(
    split: str = "test", root: str | os.PathLike | None = None, download: bool | None = None
) -> ImageData:
    """CIFAR-10 as ``(N, 3, 32, 32)`` images in ``[0, 1]``, torchvision's class order.

    ``"test"`` reads the JPEG folder ``cifar10/test/<class>/*.jpg`` of the offline data if present
    (lossy re-encodings, about 30 dB PSNR; the pretrained ResNets score about 81-84% on them against
    about 92% on the originals). Pillow decodes all 10,000 in about 1.5 s once the files are in the
    OS cache, so no decoded copy is cached. Otherwise, and for ``"train"``, it reads the public
    lossless python version (``cifar10/cifar-10-batches-py``), downloading and unpacking its tarball
    (:data:`~dualview.download.DOWNLOADS`) unless ``download=False``. Either way the images come class
    by class, in the JPEG folder's order (file ``NNNN.jpg`` is taken to be the class's NNNN-th image of
    the original test batch: not checked, the offline folder has no lossless copy), with the same
    labels; ``source`` says which copy a run used (``"JPEG"`` or ``"lossless"``). In a smoke run the test images stand in for a
    missing ``"train"``.
    """
    stand_in = (lambda: _load_cifar10("test", root, False)) if split == "train" else None
    return _at_scale(f"CIFAR-10 {split}", lambda d: _load_cifar10(split, root, d), download, stand_in)


def _load_cifar100(split: str, root: str | os.PathLike | None, download: bool | None) -> ImageData:
    _check_choice("split", split, ("test", "train"))
    root = _root(root)
    folder = root / "cifar100" / "cifar-100-python"
    error = None
    if not folder.is_dir():
        error = fetch_unpacked(root, "cifar100/cifar-100-python.tar.gz", folder, "cifar-100-python/",
                               allowed=download)
    if not (folder / split).is_file():
        raise _not_found(f"CIFAR-100 {split} set", [folder / split], "cifar100/cifar-100-python/{train,test,meta}",
                         root / "cifar100", _failed(error)) from error
    with open(folder / split, "rb") as f:  # checked by the tarball's MD5 when downloaded here
        batch = pickle.load(f, encoding="latin1")
    with open(folder / "meta", "rb") as f:
        classes = tuple(n.replace("_", " ") for n in pickle.load(f, encoding="latin1")["fine_label_names"])
    x = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    y = np.asarray(batch["fine_labels"])
    order = np.argsort(y, kind="stable")
    source = (f"CIFAR-100 {split} set (100 fine classes, the python version) from {shown_path(folder, root)}, "
              "class by class")
    return _image_data(torch.from_numpy(x[order]), torch.from_numpy(y[order]), classes, source)


def load_cifar100(
    split: str = "test", root: str | os.PathLike | None = None, download: bool | None = None
) -> ImageData:
    """CIFAR-100 (the 100 fine classes) as ``(N, 3, 32, 32)`` images in ``[0, 1]``, class by class.

    Reads the public python version (``cifar100/cifar-100-python/{train,test,meta}``: 50,000 and 10,000
    images), downloading and unpacking its tarball (:data:`~dualview.download.DOWNLOADS`, 161 MB)
    unless ``download=False``. The offline data folder holds no CIFAR-100: in a smoke run the CIFAR-10
    test images stand in (10 classes, so a network sized by ``len(data.classes)`` has 10 outputs).
    """
    return _at_scale(f"CIFAR-100 {split}", lambda d: _load_cifar100(split, root, d), download,
                     lambda: _load_cifar10("test", root, False))


# --------------------------------------------------------------------------------------------------
# Imagenette: ten easy ImageNet classes

IMAGENETTE_CLASSES: tuple[str, ...] = (
    "tench", "English springer", "cassette player", "chain saw", "church", "French horn", "garbage truck",
    "gas pump", "golf ball", "parachute",
)
_IMAGENETTE_WNIDS = ("n01440764", "n02102040", "n02979186", "n03000684", "n03028079", "n03394916",
                     "n03417042", "n03425413", "n03445777", "n03888257")
#: The index of each Imagenette class among the 1,000 ImageNet classes (torchvision's order).
IMAGENETTE_IMAGENET_INDEX: tuple[int, ...] = (0, 217, 482, 491, 497, 566, 569, 571, 574, 701)


def _first_ten_per_class(names: list[str]) -> list[str]:
    return [n for w in _IMAGENETTE_WNIDS for n in [m for m in names if m.split("/")[-2] == w][:10]]


def _load_imagenette(size: int = 224, root: str | os.PathLike | None = None,
                     download: bool | None = None) -> ImageData:
    """:func:`load_imagenette` without the smoke-run policy."""
    from torchvision.transforms import functional as TF

    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    folder = _root(root) / "imagenette" / "val-sample"
    error = None
    if not folder.exists():
        error = fetch_unpacked(_root(root), "imagenette/imagenette2-320.tgz", folder, "imagenette2-320/val/",
                               _first_ten_per_class, allowed=download)
    files = [sorted((folder / w).glob("*.JPEG")) for w in _IMAGENETTE_WNIDS]
    empty = [folder / w / "*.JPEG" for w, f in zip(_IMAGENETTE_WNIDS, files) if not f]
    if empty:
        hint = ("\nImagenette (https://github.com/fastai/imagenette) is a 10-class subset of ImageNet: copy "
                "some validation images of each class (imagenette2/val/<wnid>/) into that layout.")
        raise _not_found("Imagenette validation images", empty, "imagenette/val-sample/<wnid>/*.JPEG",
                         folder.parent, hint + _failed(error)) from error
    images = []
    for path in (p for f in files for p in f):
        with Image.open(path) as image:
            images.append(TF.pil_to_tensor(TF.center_crop(TF.resize(image.convert("RGB"), size), size)))
    labels = torch.repeat_interleave(torch.arange(len(files)), torch.tensor([len(f) for f in files]))
    source = (f"Imagenette2 validation photos, short side resized to {size} and centre-cropped, "
              f"from {shown_path(folder, root)}")
    return _image_data(torch.stack(images), labels, IMAGENETTE_CLASSES, source)


def load_imagenette(size: int = 224, root: str | os.PathLike | None = None,
                    download: bool | None = None) -> ImageData:
    """Imagenette2 validation photos, 10 per class, ``(N, 3, size, size)`` in ``[0, 1]``.

    Reads ``imagenette/val-sample/<wnid>/*.JPEG`` (the offline data holds 10 per class, short side 224),
    converts to RGB (one class photo is greyscale), resizes the short side to ``size`` and crops the
    centre, as ImageNet models expect. Labels follow :data:`IMAGENETTE_CLASSES`; map them to
    ImageNet's 1,000 classes with :data:`IMAGENETTE_IMAGENET_INDEX`. When the folder is missing (and
    ``download`` is not ``False``), the first 10 validation photos by name of each class are taken
    from fastai's ``imagenette2-320.tgz`` (326 MB, short side 320; the offline sample was taken the
    same way, we believe, but at another resolution), and the tarball is deleted.
    """
    return _at_scale("Imagenette", lambda d: _load_imagenette(size, root, d), download)


# --------------------------------------------------------------------------------------------------
# Small data sets: scikit-learn's digits, MNIST-1D (generated) and IXOR (synthetic)


