"""Architectures: plain descriptions of the networks of the deep-gated-network papers, and their gate sites.

An :class:`Architecture` names a network family and its sizes; its classmethods are the papers'
specifications (FC4 and C4GAP of Table 2 of :cite:`lakshminarayanan2022explicitising`, CONV1, VGG-16,
CIFAR ResNets)::

    fc4 = Architecture.fc((128, 128, 128, 128))   # a specification, not a network
    net = fc4.network()                            # its ReLU network

:meth:`Architecture.network` builds the ReLU network (one ``nn.ReLU`` instance per use, so
:mod:`dualview.gates` records it) or, with ``linear=True``, the same network with every ReLU replaced by
a :class:`LinearSite`. :func:`dualview.dgn.build` turns a specification into a DNN, a linear network, a
DGN or a DLGN. The positions of the ReLUs are the *gate sites*: :func:`site_shapes` gives the shape of
each site's pre-activation and :func:`site_blocks` groups them into the papers' blocks of equal width.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Literal, Sequence

import torch
from torch import nn

from dualview.gates import record_gates
from dualview.nets import cifar_resnet

__all__ = ["VGG16_CFG", "Architecture", "LinearSite", "gate_sites", "replace_gate_sites", "site_shapes",
           "site_blocks"]

VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "P", 128, 128, "P", 256, 256, 256, "P", 512, 512, 512, "P", 512, 512, 512, "P",
)
"""VGG-16's convolutional layers: output channels of each 3x3 convolution, ``"P"`` for a 2x2 pooling."""


@dataclass(frozen=True)
class Architecture:
    """A plain description of a ReLU network; build it with :meth:`network` or :func:`dualview.dgn.build`.

    ``family`` is ``"fc"`` (``widths``: hidden widths), ``"conv"`` (``widths``: channels of the
    convolutional layers, followed by global average pooling and a linear output layer), ``"vgg"``
    (``widths``: a VGG configuration, numbers for 3x3 convolutions and ``"P"`` for 2x2 pooling of
    kind ``pool``; then global average pooling and a linear layer) or ``"resnet"`` (the CIFAR
    ResNet of :func:`dualview.nets.cifar_resnet` of depth ``depth``). ``in_shape`` is the shape of
    one input, without the batch dimension. The classmethods (:meth:`fc`, :meth:`c4gap`, ...) give
    the papers' specifications.
    """

    family: Literal["fc", "conv", "vgg", "resnet"]
    name: str
    in_shape: tuple[int, ...]
    num_classes: int = 10
    widths: tuple[int | str, ...] = ()
    kernel_size: int = 3
    pool: Literal["max", "avg"] = "max"
    batch_norm: bool = False
    padding_mode: str = "zeros"
    depth: int = 0

    def __post_init__(self) -> None:
        if self.family not in ("fc", "conv", "vgg", "resnet"):
            raise ValueError(f"family must be 'fc', 'conv', 'vgg' or 'resnet', got {self.family!r}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {self.num_classes}")
        if self.pool not in ("max", "avg"):
            raise ValueError(f"pool must be 'max' or 'avg', got {self.pool!r}")
        if self.family == "fc":
            if not self.widths or any(not isinstance(w, int) or w < 1 for w in self.widths):
                raise ValueError(f"an FC architecture needs positive integer hidden widths, got {self.widths!r}")
        elif self.family in ("conv", "vgg"):
            if len(self.in_shape) != 3:
                raise ValueError(f"a convolutional architecture needs in_shape (C, H, W), got {self.in_shape!r}")
            convs = [w for w in self.widths if w != "P"]
            if not convs or any(not isinstance(w, int) or w < 1 for w in convs):
                raise ValueError(
                    f"widths must hold positive channel counts (and 'P' for pooling in a VGG), got {self.widths!r}"
                )
            if self.family == "conv" and "P" in self.widths:
                raise ValueError("a 'conv' (GAP) architecture has no pooling layers: use family 'vgg' for 'P'")
            if self.kernel_size < 1 or self.kernel_size % 2 == 0:
                raise ValueError(f"kernel_size must be odd (same-size convolutions), got {self.kernel_size}")
        elif self.family == "resnet":
            if self.in_shape != (3, 32, 32):
                raise ValueError(f"the CIFAR ResNet takes in_shape (3, 32, 32), got {self.in_shape!r}")
            if self.depth < 8 or (self.depth - 2) % 6:
                raise ValueError(f"ResNet depth must be 6n + 2 (20, 32, 56, 110, ...), got {self.depth}")

    @property
    def in_features(self) -> int:
        return math.prod(self.in_shape)

    def with_(self, **changes) -> Architecture:
        """A copy with some fields changed (e.g. ``arch.with_(pool="avg", name="VGG-avg")``)."""
        return replace(self, **changes)

    # -- the papers' specifications ------------------------------------------------------------------

    @classmethod
    def fc(cls, widths: Sequence[int] = (128, 128, 128, 128), in_shape: tuple[int, ...] = (1, 28, 28),
           num_classes: int = 10, name: str | None = None) -> Architecture:
        """Fully connected: flatten, then ``Linear``-ReLU per hidden width, then a linear output layer.

        The default is FC4 of Table 2 of :cite:`lakshminarayanan2022explicitising` (MNIST, 4 x 128).
        """
        return cls("fc", name or f"FC{len(widths)}", tuple(in_shape), num_classes, tuple(widths))

    @classmethod
    def conv_gap(cls, channels: Sequence[int], in_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
                 kernel_size: int = 3, padding_mode: str = "zeros", batch_norm: bool = False,
                 name: str | None = None) -> Architecture:
        """Same-size convolutions (stride 1), each followed by a ReLU, then global average pooling and a
        linear output layer (the CNN-GAP of :cite:`lakshminarayanan2020neural`).

        ``padding_mode="circular"`` gives the circular convolutions of Theorem 3.2 of
        :cite:`lakshminarayanan2022explicitising`.
        """
        return cls("conv", name or f"C{len(channels)}GAP", tuple(in_shape), num_classes, tuple(channels),
                   kernel_size=kernel_size, padding_mode=padding_mode, batch_norm=batch_norm)

    @classmethod
    def c4gap(cls, width: int = 128, **kwargs) -> Architecture:
        """C4GAP / CONV4: four 3x3 convolutions of ``width`` filters, GAP, linear (Table 2 / Table I);
        ``kwargs`` as for :meth:`conv_gap`."""
        return cls.conv_gap((width,) * 4, name=kwargs.pop("name", "C4GAP" if width == 128 else f"C4GAP-{width}"),
                            **kwargs)

    @classmethod
    def conv1(cls, width: int = 512, **kwargs) -> Architecture:
        """CONV1 / C1GAP: one 3x3 convolution of ``width`` filters, ReLU, GAP, linear (Figure 4 of
        :cite:`lakshminarayanan2022explicitising`, the "shallow + ReLU" model)."""
        return cls.conv_gap((width,), name=kwargs.pop("name", "CONV1" if width == 512 else f"CONV1-{width}"),
                            **kwargs)

    @classmethod
    def vgg(cls, cfg: Sequence[int | str], in_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
            pool: Literal["max", "avg"] = "max", batch_norm: bool = True, name: str | None = None) -> Architecture:
        """A VGG-style network: 3x3 convolutions (with batch norm if ``batch_norm``), ReLUs, 2x2 pooling at
        each ``"P"``, then global average pooling and a linear layer."""
        return cls("vgg", name or "VGG", tuple(in_shape), num_classes, tuple(cfg), pool=pool, batch_norm=batch_norm)

    @classmethod
    def vgg16(cls, pool: Literal["max", "avg"] = "max", batch_norm: bool = True, num_classes: int = 10,
              width: float = 1.0) -> Architecture:
        """VGG-16 with batch norm for 32x32 CIFAR images: 13 convolutions in 5 blocks of widths
        (64, 128, 256, 512, 512), 5 poolings, a linear layer (:data:`VGG16_CFG`). ``width`` scales every
        channel count (a narrow copy for CPU runs)."""
        cfg = tuple(w if w == "P" else max(1, round(w * width)) for w in VGG16_CFG)
        name = "VGG-16" if width == 1.0 else f"VGG-16x{width:g}"
        return cls.vgg(cfg, num_classes=num_classes, pool=pool, batch_norm=batch_norm, name=name)

    @classmethod
    def resnet(cls, depth: int = 110, num_classes: int = 10) -> Architecture:
        """The CIFAR ResNet of He et al. :cite:`he2016deep` (3 stages of 16, 32, 64 channels, option-A
        shortcuts), as :func:`dualview.nets.cifar_resnet` builds it; ResNet-110 at paper scale."""
        return cls("resnet", f"ResNet-{depth}", (3, 32, 32), num_classes, depth=depth, batch_norm=True)

    # -- the network ---------------------------------------------------------------------------------

    def network(self, linear: bool = False) -> nn.Module:
        """The ReLU network of this architecture (one ``nn.ReLU`` instance per gate site), randomly
        initialised; ``linear=True``: the same with every ReLU replaced by a :class:`LinearSite`
        (CONV1-LIN, VGG-LIN, VGG-LIN-MAX of Figure 4 of :cite:`lakshminarayanan2022explicitising`)."""
        net = self._relu_network()
        return replace_gate_sites(net, LinearSite) if linear else net

    def _relu_network(self) -> nn.Module:
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        if self.family == "fc":
            layers["flatten"] = nn.Flatten()
            prev = self.in_features
            for i, w in enumerate(self.widths, 1):
                layers[f"fc{i}"] = nn.Linear(prev, w)
                layers[f"relu{i}"] = nn.ReLU()
                prev = w
            layers["out"] = nn.Linear(prev, self.num_classes)
            return nn.Sequential(layers)
        if self.family == "resnet":
            return cifar_resnet(self.depth, self.num_classes)
        prev, i, p = self.in_shape[0], 0, 0
        for w in self.widths:
            if w == "P":
                p += 1
                layers[f"pool{p}"] = nn.MaxPool2d(2) if self.pool == "max" else nn.AvgPool2d(2)
                continue
            i += 1
            layers[f"conv{i}"] = nn.Conv2d(prev, w, self.kernel_size, padding=self.kernel_size // 2,
                                           padding_mode=self.padding_mode, bias=not self.batch_norm)
            if self.batch_norm:
                layers[f"bn{i}"] = nn.BatchNorm2d(w)
            layers[f"relu{i}"] = nn.ReLU()
            prev = w
        layers["gap"] = nn.AdaptiveAvgPool2d(1)
        layers["flatten"] = nn.Flatten()
        layers["out"] = nn.Linear(prev, self.num_classes)
        return nn.Sequential(layers)


# --------------------------------------------------------------------------------------------------
# Gate sites


class LinearSite(nn.Identity):
    """The identity at a ReLU's position: the 'activation' of linear networks and DLGN gating networks."""


def gate_sites(net: nn.Module) -> list[nn.Module]:
    """The activation modules (``nn.ReLU`` or :class:`LinearSite`) of ``net``, in module order."""
    return [m for m in net.modules() if isinstance(m, (nn.ReLU, LinearSite))]


def replace_gate_sites(net: nn.Module, factory: Callable[[], nn.Module],
                       sites: tuple[type[nn.Module], ...] = (nn.ReLU, LinearSite)) -> nn.Module:
    """Replace every gate site of ``net`` (a module of one of the types ``sites``; by default those of
    :func:`gate_sites`) by a fresh ``factory()`` module, in place; returns ``net``."""
    for module in list(net.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, sites):
                setattr(module, name, factory())
    return net


@lru_cache(maxsize=64)
def _site_shapes(arch: Architecture) -> tuple[tuple[int, ...], ...]:
    net = arch.network().eval()
    with torch.no_grad():
        rec = record_gates(net, torch.zeros(1, *arch.in_shape))
    order = [name for name, m in net.named_modules() if isinstance(m, nn.ReLU)]
    if rec.names != order:  # our builders call every ReLU once, in module order
        raise RuntimeError(f"gate sites of {arch.name} are not called once each in module order: {rec.names}")
    return tuple(tuple(q.shape[1:]) for q in rec.preactivations.values())


def site_shapes(arch: Architecture) -> list[tuple[int, ...]]:
    """The shape (without batch dimension) of the pre-activation at every gate site of ``arch``."""
    return list(_site_shapes(arch))


def site_blocks(arch: Architecture) -> list[list[int]]:
    """Gate sites grouped into the paper's blocks of equal width (Appendix A of
    :cite:`lakshminarayanan2022explicitising`).

    FC and conv-GAP: one block of all sites. VGG: the convolutions between two poolings. ResNet: the
    stem on its own, then each of the three stages (``2n`` sites each, 36 for ResNet-110).
    """
    n = len(site_shapes(arch))
    if arch.family in ("fc", "conv"):
        return [list(range(n))]
    if arch.family == "resnet":
        per_stage = 2 * ((arch.depth - 2) // 6)
        return [[0]] + [list(range(1 + s * per_stage, 1 + (s + 1) * per_stage)) for s in range(3)]
    blocks, current, k = [], [], 0
    for w in arch.widths:
        if w == "P":
            if current:
                blocks.append(current)
            current = []
        else:
            current.append(k)
            k += 1
    if current:
        blocks.append(current)
    return blocks
