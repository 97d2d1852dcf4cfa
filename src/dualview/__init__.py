"""dualview: the dual (path) view of ReLU networks, as a small tested library.

One module per concept, in the order of the book:

* :mod:`dualview.paths`: neural path features and values, path activity (hard or soft), counting paths (Chapter 1);
* :mod:`dualview.nets`: the plain ReLU networks of the book, no weights;
* :mod:`dualview.gates`: the instrumentation context and its rules: recording and imposing the gates of any supported network;
* :mod:`dualview.npk`: the NPK of any supported network (one entry point), kernel machines (Chapters 2-4);
* :mod:`dualview.npk_fc`: the product-form NPK of fully connected networks, base kernels, the memory budget (Chapter 2);
* :mod:`dualview.ntk`: the empirical NTK and its constant relation to the NPK (Chapter 2);
* :mod:`dualview.npk_conv`: the rotation-sum NPK of convolutional networks with global pooling (Chapter 3);
* :mod:`dualview.npk_resnet`: the ensemble-sum NPK of residual networks (Chapter 4);
* :mod:`dualview.architectures`: network specifications and their gate sites (Chapter 5);
* :mod:`dualview.dgn`: one gated network: value and gating network, fixed gates, permutations, DLGNs (Chapters 2, 5);
* :mod:`dualview.hyperplanes`: the effective hyperplanes of linearly gated networks, the dual-lifting ladder (Chapter 5);
* :mod:`dualview.pullbacks`: excitation pullbacks, counterfactual ascent, gated linear models (Chapter 6);
* :mod:`dualview.surrogates`: soft gates, the surrogate ReLU and soft max-pool, their gates rule (Chapter 6);
* :mod:`dualview.metrics`: faithfulness (deletion, insertion) and smoothness of attribution maps, Quantus' metrics (Chapters 6, 9);
* :mod:`dualview.projections`: switched linear projections and Insens (Chapter 7);
* :mod:`dualview.receptive_fields`: switched weights of plain conv nets on receptive fields, Insens' fast path (Chapter 7);
* :mod:`dualview.leveling`: feature leveling with routing gates, trained by :mod:`dualview.train` (Chapter 8);
* :mod:`dualview.levels`: a trained leveling network pruned and read level by level (Chapter 8);
* :mod:`dualview.explain`: one verb, ``attribute(model, x, target, method=...)``, over every attribution method (Chapter 9);
* :mod:`dualview.data`: data sets, offline or downloaded, with clear errors;
* :mod:`dualview.download`: downloads from the public sources (or ``$DUALVIEW_MIRROR``), checked before kept;
* :mod:`dualview.splits`: splits and subsets, and the training/test sets of each profile;
* :mod:`dualview.zoo`: pretrained weights for the networks of :mod:`dualview.nets`, checked by SHA-256;
* :mod:`dualview.train`: a small seeded training loop (classification or regression, penalties, parameter groups);
* :mod:`dualview.stats`: seeds, confidence intervals and paired comparisons;
* :mod:`dualview.plot`: figures;
* :mod:`dualview.sweep`: sweeps over seeds and permutations as submitit jobs, rows aggregated into tables;
* :mod:`dualview.glue`: values handed to a chapter's prose, with or without the book's build (myst-nb);
* :mod:`dualview.exercises`: self-checks of the exercises' answers for the student notebooks.

Plus :func:`seed_everything`, :func:`default_device`, :func:`setup` (the first code cell of every chapter)
and :func:`smoke_scale` here.
"""
from __future__ import annotations

import os
import random
from typing import Any, Mapping, NamedTuple

import numpy as np
import torch

__version__ = "0.1.0"


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (CPU and CUDA) and return a seeded ``torch.Generator``."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    return torch.Generator().manual_seed(seed)


def default_device() -> torch.device:
    """CUDA if available, then Apple MPS, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class Setup(NamedTuple):
    """What :func:`setup` returns: the sizes of the chosen profile and the device (unpacks as a pair)."""

    sizes: dict[str, Any]
    device: torch.device


#: The scales a profile runs at: ``"full"`` (its own sizes) and ``"smoke"`` (its code path in seconds).
SCALES = ("full", "smoke")
#: The environment variable holding the scale of this run (set by :func:`setup`).
SCALE_ENV = "DUALVIEW_SCALE"


def smoke_scale() -> bool:
    """True in a smoke run: :func:`setup` was called with ``scale="smoke"`` (or ``$DUALVIEW_SCALE`` is
    ``smoke``). Then the data layer reads only the offline folder, cuts every data set to a few images
    per class and lets an offline stand-in replace what would need a download (saying so by name),
    :func:`dualview.zoo.imagenet_model` falls back to random weights, and :func:`dualview.stats.claim`
    prints comparative claims instead of asserting them: a smoke run tests that the code runs, not what
    its numbers say."""
    return os.environ.get(SCALE_ENV, "full") == "smoke"


def sharp_figures() -> bool:
    """In a notebook kernel, show matplotlib figures as PNGs at twice their resolution (Jupyter's
    "retina" format: the image has 2x the pixels and is displayed at its normal size, so it stays sharp on
    high-density screens and in the book). Returns False outside IPython, where there is nothing to set."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    if get_ipython() is None:
        return False
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    set_matplotlib_formats("retina")
    return True


def setup(profile: str, seed: int, device: str | torch.device | None = None,
          sizes: Mapping[str, Mapping[str, Any]] | None = None, scale: str = "full") -> Setup:
    """The first code cell of every chapter: choose the profile's sizes, pick the device, seed, glue.

    ``sizes`` maps each profile (``"cpu"``: laptop scale, what the book shows; ``"gpu"``: paper scale) to
    that profile's sizes, and optionally ``"smoke"`` to the sizes a smoke run overrides (fewer epochs,
    seeds, images, widths: keys of the profile's own sizes). ``scale="smoke"`` runs the chosen profile's
    code path (same branches, models and data sources) at those sizes in seconds, on one CPU thread; see
    :func:`smoke_scale`.
    ``device`` ``None`` picks :func:`default_device`. Seeds everything with ``seed``, glues the
    profile's name as ``"profile"`` for the chapter's prose (when run by the book's notebook engine),
    shows figures at twice the resolution in a notebook (``sharp_figures``), on CUDA turns TF32 off
    (:func:`dualview.gates.tf32_off`: the chapters check identities to float32 precision)
    and prints one line saying what runs where. Use it as
    ``SIZES, device = dualview.setup(PROFILE, SEED, DEVICE, sizes={"cpu": {...}, "gpu": {...}}, scale=SCALE)``.
    """
    sizes = {"cpu": {}, "gpu": {}} if sizes is None else sizes
    if profile not in ("cpu", "gpu") or profile not in sizes:
        raise ValueError(f"unknown profile {profile!r}: this chapter has the profiles "
                         f"{sorted(p for p in sizes if p != 'smoke')}; set PROFILE in the parameters cell to one of them")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: use one of {SCALES} (SCALE in the parameters cell)")
    chosen = dict(sizes[profile])
    if scale == "smoke":
        unknown = sorted(set(sizes.get("smoke", {})) - set(chosen))
        if unknown:
            raise ValueError(f"the smoke sizes {unknown} are not sizes of the profile {profile!r}: a smoke run "
                             "only shrinks the profile's own sizes")
        chosen.update(sizes.get("smoke", {}))
    os.environ[SCALE_ENV] = scale
    if scale == "smoke":  # tiny tensors gain nothing from more threads, and a busy machine slows them badly
        torch.set_num_threads(1)
    dev = torch.device(device) if device is not None else default_device()
    seed_everything(seed)
    sharp_figures()
    from dualview.glue import glue

    glue("profile", profile if scale == "full" else f"{profile}, {scale} scale", display=False)
    where = f"profile {profile!r}" + (f" at {scale} scale" if scale != "full" else "") + f" on {dev}"
    if dev.type == "cuda":  # TF32 (on by default for convolutions) would break the chapters' exact identities
        from dualview.gates import tf32_off

        tf32_off()
        where += " with TF32 off (float32 in full precision)"
    print(f"{where}: {chosen}" if chosen else where)
    return Setup(chosen, dev)
