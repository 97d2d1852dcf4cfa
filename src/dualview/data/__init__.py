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

from dualview.data.files import (  # noqa: F401
    CIFAR10_CLASSES,
    DataNotFoundError,
    ImageData,
    MNIST_CLASSES,
    SMOKE_PER_CLASS,
    data_dir,
    load_mnist,
    read_idx,
    shown_path,
    smoke_cut,
)
from dualview.data.images import (  # noqa: F401
    IMAGENETTE_CLASSES,
    IMAGENETTE_IMAGENET_INDEX,
    load_cifar10,
    load_cifar100,
    load_imagenette,
)
from dualview.data.tables import (  # noqa: F401
    Table,
    ixor_labels_reference,
    load_digits,
    load_mnist1d,
    load_tabular,
    make_ixor,
)

__all__ = [
    'MNIST_CLASSES', 'CIFAR10_CLASSES', 'DataNotFoundError', 'ImageData', 'data_dir', 'shown_path', 'read_idx',
    'load_mnist', 'load_cifar10', 'load_cifar100', 'Table', 'load_tabular', 'SMOKE_PER_CLASS', 'smoke_cut',
    'load_digits', 'load_mnist1d', 'IMAGENETTE_CLASSES', 'IMAGENETTE_IMAGENET_INDEX', 'load_imagenette',
    'make_ixor', 'ixor_labels_reference',
]

# the package's names are documented and shown as dualview.data.<name> (where a reader of the book calls them)
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
