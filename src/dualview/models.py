"""Deep gated networks (DGN), deep linearly gated networks (DLGN) and their DNN / linear baselines.

A ReLU network entangles two jobs in every layer: the weights compute pre-activations, and the
ReLUs switch units on and off. The *deep gated network* of :cite:`lakshminarayanan2020neural`
(Figure 2 of :cite:`lakshminarayanan2022explicitising`, Appendix D) separates them into two networks
of the same architecture:

* the **gating network** (feature network, weights ``Theta^g``) sees the input ``x`` and produces
  a pre-activation ``q_l`` at every ReLU position ``l`` (a *gate site*); the gate is
  ``G_l = 1{q_l > 0}`` (hard) or ``sigmoid(beta * q_l)`` (soft, ``beta = 10`` in the papers);
* the **value network** (weight network, weights ``Theta^v``) replaces every ReLU by a *gated
  linear unit* (GaLU) ``z_l = q^v_l * G_l`` :cite:`fiat2019decoupling` fed the gating network's
  gates. Its input is ``x`` or the constant ``1`` ("DGN-ALLONES", Section 4.1 of
  :cite:`lakshminarayanan2022explicitising`), and its gate layers may receive the gates in a
  permuted order (Figure 3 there: value site ``l`` gets ``G_{pi(l)}``).

With ReLUs in the gating network this is a DGN; with the identity (no activation) it is a DLGN, whose
gating pre-activations are affine in the input, ``q_l(x) = W_eff x + b_eff`` (Section 5 there,
"primal linearity"; :func:`dualview.hyperplanes.effective_hyperplanes`). Shallow-feature gating (DLGN-SF,
Section 3.3 of :cite:`lakshminarayanan2022disentangling`) computes each gate layer from the input
with one linear layer of its own.

Everything is built from one :class:`Architecture` (FC, conv + global average pooling (C4GAP,
CONV1), VGG with batch norm and average or max pooling, CIFAR ResNets) by :func:`build`::

    arch = models.c4gap(width=128)
    dnn = models.build(arch, "dnn")                        # the ReLU network
    dgn = models.build(arch, "dgn", value_input="ones")    # standalone (ST): soft gates, both trained
    pg = models.build(arch, "dgn", pretrained=dnn)         # pretrained gates (PG): frozen, hard
    dlgn = models.build(arch, "dlgn", permutation=(3, 2, 1, 0))

The DNN and the gating network keep ``nn.ReLU`` modules (one instance per use), so
:mod:`dualview.gates` can record them; a linear network's sites are :class:`LinearSite` (an
``nn.Identity``). Max-pooling layers stay max-pooling in both networks; the value network pools its
own signal.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Iterator, Literal, Sequence

import torch
from torch import Tensor, nn

from dualview.gates import record_gates, run_with_gates
from dualview.nets import cifar_resnet

__all__ = [
    "Architecture",
    "fc",
    "conv_gap",
    "c4gap",
    "conv1",
    "vgg",
    "vgg16",
    "resnet",
    "VGG16_CFG",
    "LinearSite",
    "GaLU",
    "DeepGating",
    "ShallowGating",
    "GatedNetwork",
    "GatedTrace",
    "build",
    "gate_sites",
    "site_shapes",
    "site_blocks",
    "reverse_within_blocks",
    "sample_permutations",
    "gated_forward_reference",
]

Kind = Literal["dnn", "linear", "dgn", "dlgn"]

# --------------------------------------------------------------------------------------------------
# Architectures


VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "P", 128, 128, "P", 256, 256, 256, "P", 512, 512, 512, "P", 512, 512, 512, "P",
)
"""VGG-16's convolutional layers: output channels of each 3x3 convolution, ``"P"`` for a 2x2 pooling."""


@dataclass(frozen=True)
class Architecture:
    """A plain description of a ReLU network; :func:`build` turns it into a DNN, DGN or DLGN.

    ``family`` is ``"fc"`` (``widths``: hidden widths), ``"conv"`` (``widths``: channels of the
    convolutional layers, followed by global average pooling and a linear output layer), ``"vgg"``
    (``widths``: a VGG configuration, numbers for 3x3 convolutions and ``"P"`` for 2x2 pooling of
    kind ``pool``; then global average pooling and a linear layer) or ``"resnet"`` (the CIFAR
    ResNet of :func:`dualview.nets.cifar_resnet` of depth ``depth``). ``in_shape`` is the shape of
    one input, without the batch dimension.
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

    def with_(self, **changes) -> "Architecture":
        """A copy with some fields changed (e.g. ``arch.with_(pool="avg", name="VGG-avg")``)."""
        return replace(self, **changes)


def fc(widths: Sequence[int] = (128, 128, 128, 128), in_shape: tuple[int, ...] = (1, 28, 28),
       num_classes: int = 10, name: str | None = None) -> Architecture:
    """Fully connected: flatten, then ``Linear``-ReLU per hidden width, then a linear output layer.

    The default is FC4 of Table 2 of :cite:`lakshminarayanan2022explicitising` (MNIST, 4 x 128).
    """
    return Architecture("fc", name or f"FC{len(widths)}", tuple(in_shape), num_classes, tuple(widths))


def conv_gap(channels: Sequence[int], in_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
             kernel_size: int = 3, padding_mode: str = "zeros", batch_norm: bool = False,
             name: str | None = None) -> Architecture:
    """Same-size convolutions (stride 1), each followed by a ReLU, then global average pooling and a
    linear output layer (the CNN-GAP of :cite:`lakshminarayanan2020neural`).

    ``padding_mode="circular"`` gives the circular convolutions of Theorem 3.2 of
    :cite:`lakshminarayanan2022explicitising`.
    """
    return Architecture("conv", name or f"C{len(channels)}GAP", tuple(in_shape), num_classes, tuple(channels),
                        kernel_size=kernel_size, padding_mode=padding_mode, batch_norm=batch_norm)


def c4gap(width: int = 128, **kwargs) -> Architecture:
    """C4GAP / CONV4: four 3x3 convolutions of ``width`` filters, GAP, linear (Table 2 / Table I)."""
    return conv_gap((width,) * 4, name=kwargs.pop("name", "C4GAP" if width == 128 else f"C4GAP-{width}"), **kwargs)


def conv1(width: int = 512, **kwargs) -> Architecture:
    """CONV1 / C1GAP: one 3x3 convolution of ``width`` filters, ReLU, GAP, linear (Figure 4 of
    :cite:`lakshminarayanan2022explicitising`, the "shallow + ReLU" model)."""
    return conv_gap((width,), name=kwargs.pop("name", "CONV1" if width == 512 else f"CONV1-{width}"), **kwargs)


def vgg(cfg: Sequence[int | str], in_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
        pool: Literal["max", "avg"] = "max", batch_norm: bool = True, name: str | None = None) -> Architecture:
    """A VGG-style network: 3x3 convolutions (with batch norm if ``batch_norm``), ReLUs, 2x2 pooling at
    each ``"P"``, then global average pooling and a linear layer."""
    return Architecture("vgg", name or "VGG", tuple(in_shape), num_classes, tuple(cfg), pool=pool,
                        batch_norm=batch_norm)


def vgg16(pool: Literal["max", "avg"] = "max", batch_norm: bool = True, num_classes: int = 10,
          width: float = 1.0) -> Architecture:
    """VGG-16 with batch norm for 32x32 CIFAR images: 13 convolutions in 5 blocks of widths
    (64, 128, 256, 512, 512), 5 poolings, a linear layer. ``width`` scales every channel count (a
    narrow copy for CPU runs)."""
    cfg = tuple(w if w == "P" else max(1, round(w * width)) for w in VGG16_CFG)
    name = "VGG-16" if width == 1.0 else f"VGG-16x{width:g}"
    return vgg(cfg, num_classes=num_classes, pool=pool, batch_norm=batch_norm, name=name)


def resnet(depth: int = 110, num_classes: int = 10) -> Architecture:
    """The CIFAR ResNet of He et al. :cite:`he2016deep` (3 stages of 16, 32, 64 channels, option-A
    shortcuts), as :func:`dualview.nets.cifar_resnet` builds it; ResNet-110 at paper scale."""
    return Architecture("resnet", f"ResNet-{depth}", (3, 32, 32), num_classes, depth=depth, batch_norm=True)


# --------------------------------------------------------------------------------------------------
# Gate sites


class LinearSite(nn.Identity):
    """The identity at a ReLU's position: the 'activation' of linear networks and DLGN gating networks."""


class GaLU(nn.Module):
    """Gated linear unit ``z = q * G``: multiplies its input by a gate supplied from outside.

    The owning :class:`GatedNetwork` hands each GaLU its gate for one forward pass (``self.gate``)
    and takes it back afterwards; calling a GaLU without a gate is an error.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gate: Tensor | None = None

    def forward(self, q: Tensor) -> Tensor:
        if self.gate is None:
            raise RuntimeError("a GaLU was called without a gate: run the value network through its GatedNetwork")
        return q * self.gate


_SITE_TYPES = (nn.ReLU, LinearSite, GaLU)


def gate_sites(net: nn.Module) -> list[nn.Module]:
    """The activation modules (ReLU, :class:`LinearSite` or :class:`GaLU`) of ``net``, in order."""
    return [m for m in net.modules() if isinstance(m, _SITE_TYPES)]


def _replace_sites(net: nn.Module, factory: Callable[[], nn.Module]) -> nn.Module:
    """Replace every gate site of ``net`` (in place) by a fresh ``factory()`` module; returns ``net``."""
    for module in list(net.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, _SITE_TYPES):
                setattr(module, name, factory())
    return net


def _dnn(arch: Architecture) -> nn.Module:
    """The ReLU network of ``arch`` (one ``nn.ReLU`` instance per gate site)."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    if arch.family == "fc":
        layers["flatten"] = nn.Flatten()
        prev = arch.in_features
        for i, w in enumerate(arch.widths, 1):
            layers[f"fc{i}"] = nn.Linear(prev, w)
            layers[f"relu{i}"] = nn.ReLU()
            prev = w
        layers["out"] = nn.Linear(prev, arch.num_classes)
        return nn.Sequential(layers)
    if arch.family == "resnet":
        return cifar_resnet(arch.depth, arch.num_classes)
    prev, i, p = arch.in_shape[0], 0, 0
    for w in arch.widths:
        if w == "P":
            p += 1
            layers[f"pool{p}"] = nn.MaxPool2d(2) if arch.pool == "max" else nn.AvgPool2d(2)
            continue
        i += 1
        layers[f"conv{i}"] = nn.Conv2d(prev, w, arch.kernel_size, padding=arch.kernel_size // 2,
                                       padding_mode=arch.padding_mode, bias=not arch.batch_norm)
        if arch.batch_norm:
            layers[f"bn{i}"] = nn.BatchNorm2d(w)
        layers[f"relu{i}"] = nn.ReLU()
        prev = w
    layers["gap"] = nn.AdaptiveAvgPool2d(1)
    layers["flatten"] = nn.Flatten()
    layers["out"] = nn.Linear(prev, arch.num_classes)
    return nn.Sequential(layers)


@contextlib.contextmanager
def _capture_site_inputs(sites: Sequence[nn.Module]) -> Iterator[list[Tensor]]:
    """Collect the input of every call of the given modules, in call order, for the ``with`` body."""
    captured: list[Tensor] = []
    handles = [s.register_forward_pre_hook(lambda mod, args: captured.append(args[0])) for s in sites]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


@lru_cache(maxsize=64)
def _site_shapes(arch: Architecture) -> tuple[tuple[int, ...], ...]:
    net = _dnn(arch).eval()
    sites = gate_sites(net)
    order: list[int] = []
    handles = [s.register_forward_pre_hook(lambda mod, args, k=k: order.append(k)) for k, s in enumerate(sites)]
    with _capture_site_inputs(sites) as q, torch.no_grad():
        net(torch.zeros(1, *arch.in_shape))
    for h in handles:
        h.remove()
    if order != list(range(len(sites))):  # our builders register sites in the order they are called
        raise RuntimeError(f"gate sites of {arch.name} are not called once each in module order: {order}")
    return tuple(tuple(t.shape[1:]) for t in q)


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


def reverse_within_blocks(arch: Architecture) -> tuple[int, ...]:
    """The permutation the papers use for VGG and ResNet: the gates of each block in reverse order
    (Figure 6 of :cite:`lakshminarayanan2022explicitising`). For FC/conv-GAP: all sites reversed."""
    perm: list[int] = []
    for block in site_blocks(arch):
        perm.extend(reversed(block))
    return tuple(perm)


def sample_permutations(n: int, k: int | None = None, seed: int = 0) -> list[tuple[int, ...]]:
    """``k`` distinct non-identity permutations of ``range(n)`` (all ``n! - 1`` if ``k`` is None),
    in a seeded random order; for FC4 / C4GAP, ``n = 4`` gives the papers' 23 permutations."""
    if n < 2 or n > 8:
        raise ValueError(f"n must be between 2 and 8 (n! permutations are listed), got {n}")
    everything = [p for p in itertools.permutations(range(n)) if p != tuple(range(n))]
    if k is None:
        k = len(everything)
    if not 1 <= k <= len(everything):
        raise ValueError(f"k must be between 1 and {len(everything)} for n = {n}, got {k}")
    order = torch.randperm(len(everything), generator=torch.Generator().manual_seed(seed))[:k]
    return [everything[i] for i in order.tolist()]


# --------------------------------------------------------------------------------------------------
# Gating networks


class DeepGating(nn.Module):
    """A full network of the architecture used as gating network: ReLUs (DGN) or identities (DLGN).

    ``net`` is an ordinary network (its own output is the gating network's prediction, used to
    pretrain it); ``preactivations`` runs it and returns the input of every gate site.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self._sites = gate_sites(net)  # a plain list (not registered twice): the site modules of net

    @property
    def linear(self) -> bool:
        """True if the gating network has no ReLUs (a DLGN); max-pooling may still make it non-linear."""
        return all(isinstance(s, LinearSite) for s in gate_sites(self.net))

    @property
    def affine(self) -> bool:
        """True if every pre-activation is an affine function of the input (no ReLU, no max-pool)."""
        return self.linear and not any(isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)) for m in self.net.modules())

    def preactivations(self, x: Tensor) -> list[Tensor]:
        with _capture_site_inputs(self._sites) as q:
            self.net(x)
        return list(q)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class ShallowGating(nn.Module):
    """Shallow-feature gating (DLGN-SF, Section 3.3 of :cite:`lakshminarayanan2022disentangling`;
    VGG-DLGN-SHALLOW, Figure 8 of :cite:`lakshminarayanan2022explicitising`): the pre-activations of
    gate layer ``l`` come from the input through one linear layer of their own.

    FC: ``Linear(d_in, w_l)``. Convolutional: average-pool the input down to layer ``l``'s resolution,
    then one ``k x k`` convolution to its channels (then batch norm if the architecture has it).
    """

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        if arch.family == "resnet":
            raise ValueError("shallow gating is built for FC, conv-GAP and VGG architectures, not ResNets")
        branches = []
        for shape in site_shapes(arch):
            if arch.family == "fc":
                branches.append(nn.Sequential(nn.Flatten(), nn.Linear(arch.in_features, shape[0])))
                continue
            c, h, _ = shape
            factor = arch.in_shape[1] // h
            layers: list[nn.Module] = [nn.AvgPool2d(factor)] if factor > 1 else []
            layers.append(nn.Conv2d(arch.in_shape[0], c, arch.kernel_size, padding=arch.kernel_size // 2,
                                    padding_mode=arch.padding_mode, bias=not arch.batch_norm))
            if arch.batch_norm:
                layers.append(nn.BatchNorm2d(c))
            branches.append(nn.Sequential(*layers))
        self.branches = nn.ModuleList(branches)

    linear = True
    affine = True

    def preactivations(self, x: Tensor) -> list[Tensor]:
        return [branch(x) for branch in self.branches]


# --------------------------------------------------------------------------------------------------
# The gated network


@dataclass
class GatedTrace:
    """Everything a :class:`GatedNetwork` computes for one batch, one list entry per gate site.

    ``gating_preactivations[l]`` is ``q^g_l``; ``gates[l]`` the gate applied at *value* site ``l``
    (``G_{pi(l)}``); ``value_preactivations[l]`` the GaLU input ``q^v_l`` and ``value_outputs[l]``
    its output ``q^v_l * gates[l]``; ``gating_outputs[l]`` the gating network's own layer output
    (``ReLU(q^g_l)`` in a DGN, ``q^g_l`` in a DLGN).
    """

    output: Tensor
    gating_preactivations: list[Tensor]
    gating_outputs: list[Tensor]
    gates: list[Tensor]
    value_preactivations: list[Tensor]
    value_outputs: list[Tensor]


class GatedNetwork(nn.Module):
    """A DGN or DLGN: gating network, gate function, gate permutation and value network of GaLUs.

    ``forward(x) = value(x_v)`` where every GaLU ``l`` of the value network multiplies by
    ``gate(q^g_{pi(l)}(x))`` and ``x_v`` is ``x`` or ``ones_like(x)`` (``value_input``).
    Build it with :func:`build`.
    """

    def __init__(self, arch: Architecture, gating: DeepGating | ShallowGating, value: nn.Module, *,
                 value_input: str, gate: str, beta: float, permutation: Sequence[int], frozen_gating: bool) -> None:
        super().__init__()
        self.arch = arch
        self.gating = gating
        self.value = value
        self.value_input = value_input
        self.gate_fn = gate
        self.beta = float(beta)
        self.permutation = tuple(permutation)
        self.frozen_gating = frozen_gating
        self._value_sites = gate_sites(value)  # the GaLUs, in call order
        if frozen_gating:
            self.gating.requires_grad_(False)
            self.gating.eval()

    @property
    def kind(self) -> str:
        return "dlgn" if self.gating.linear else "dgn"

    @property
    def mode(self) -> str:
        """``"pg"`` (pretrained, frozen gating network) or ``"st"`` (standalone: both trained)."""
        return "pg" if self.frozen_gating else "st"

    def train(self, mode: bool = True) -> "GatedNetwork":
        super().train(mode)
        if self.frozen_gating:  # pretrained gates stay fixed, batch-norm statistics included
            self.gating.eval()
        return self

    def gate(self, q: Tensor) -> Tensor:
        """``1{q > 0}`` (hard) or ``sigmoid(beta * q)`` (soft), Appendix D.1 of :cite:`lakshminarayanan2022explicitising`."""
        if self.gate_fn == "hard":
            return (q > 0).to(q.dtype)
        return torch.sigmoid(self.beta * q)

    def gating_preactivations(self, x: Tensor) -> list[Tensor]:
        """``q^g_l(x)`` for every gate site ``l`` of the gating network (unpermuted)."""
        return self.gating.preactivations(x)

    def _run_value(self, x: Tensor, gates: list[Tensor]) -> Tensor:
        sites = self._value_sites
        for site, g in zip(sites, gates):
            site.gate = g
        try:
            return self.value(torch.ones_like(x) if self.value_input == "ones" else x)
        finally:
            for site in sites:
                site.gate = None

    def forward(self, x: Tensor) -> Tensor:
        q = self.gating_preactivations(x)
        gates = [self.gate(q[i]) for i in self.permutation]
        return self._run_value(x, gates)

    def trace(self, x: Tensor) -> GatedTrace:
        """Run the network and return every intermediate of :class:`GatedTrace` (for figures and tests)."""
        q = self.gating_preactivations(x)
        gates = [self.gate(q[i]) for i in self.permutation]
        with _capture_site_inputs(self._value_sites) as qv:
            out = self._run_value(x, gates)
        own = [qi if self.gating.linear else torch.relu(qi) for qi in q]
        return GatedTrace(out, q, own, gates, list(qv), [a * g for a, g in zip(qv, gates)])

    def extra_repr(self) -> str:
        perm = "identity" if self.permutation == tuple(range(len(self.permutation))) else str(self.permutation)
        return (f"arch={self.arch.name}, kind={self.kind}, mode={self.mode}, value_input={self.value_input!r}, "
                f"gate={self.gate_fn!r}, beta={self.beta:g}, permutation={perm}")


def _check_choice(name: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _check_permutation(arch: Architecture, permutation: Sequence[int]) -> tuple[int, ...]:
    shapes = site_shapes(arch)
    n = len(shapes)
    perm = tuple(int(i) for i in permutation)
    if sorted(perm) != list(range(n)):
        raise ValueError(f"permutation must be a permutation of range({n}) (one entry per gate site of "
                         f"{arch.name}), got {tuple(permutation)}")
    for value_site, gating_site in enumerate(perm):
        if shapes[gating_site] != shapes[value_site]:
            blocks = site_blocks(arch)
            raise ValueError(
                f"permutation sends the gates of gating layer {gating_site} (shape {shapes[gating_site]}) to "
                f"value layer {value_site} (shape {shapes[value_site]}): gates can only move between layers of "
                f"the same shape. Permute within the blocks of {arch.name} ({blocks}), e.g. "
                f"reverse_within_blocks(arch) = {reverse_within_blocks(arch)}"
            )
    return perm


def build(arch: Architecture, kind: Kind = "dnn", *, value_input: Literal["x", "ones"] = "x",
          gating: Literal["deep", "shallow"] = "deep", gate: Literal["hard", "soft"] | None = None,
          beta: float = 10.0, permutation: Sequence[int] | None = None,
          pretrained: nn.Module | None = None) -> nn.Module:
    """Build the network ``kind`` of architecture ``arch``.

    * ``"dnn"``: the ReLU network; ``"linear"``: the same with every ReLU replaced by the identity
      (CONV1-LIN, VGG-LIN, VGG-LIN-MAX of Figure 4 of :cite:`lakshminarayanan2022explicitising`);
    * ``"dgn"`` / ``"dlgn"``: a :class:`GatedNetwork` whose gating network has ReLUs / none.
      ``value_input``: ``"x"`` or ``"ones"`` (constant input to the value network);
      ``gating="shallow"``: shallow-feature gating (DLGN only, it is linear);
      ``gate``: ``"hard"`` ``1{q > 0}`` or ``"soft"`` ``sigmoid(beta q)`` (default: soft for
      standalone training, hard with ``pretrained``); ``permutation[l]`` is the gating layer whose
      gates value layer ``l`` receives (only between layers of equal shape);
      ``pretrained``: a trained DNN of the same architecture used, frozen, as gating network
      (pretrained-gates mode, PG); it is copied, never modified. Without it both networks are
      initialised at random and trained together (standalone mode, ST).
    """
    if not isinstance(arch, Architecture):
        raise TypeError(f"arch must be an Architecture (e.g. models.fc(), models.c4gap()), got {type(arch).__name__}")
    _check_choice("kind", kind, ("dnn", "linear", "dgn", "dlgn"))
    _check_choice("value_input", value_input, ("x", "ones"))
    _check_choice("gating", gating, ("deep", "shallow"))
    _check_choice("gate", gate, (None, "hard", "soft"))
    if kind in ("dnn", "linear"):
        options = dict(value_input=value_input == "x", gating=gating == "deep", gate=gate is None,
                       permutation=permutation is None, pretrained=pretrained is None)
        bad = [k for k, ok in options.items() if not ok]
        if bad:
            raise ValueError(f"{', '.join(bad)} only apply to gated networks (kind 'dgn' or 'dlgn'), not to {kind!r}")
        net = _dnn(arch)
        return _replace_sites(net, LinearSite) if kind == "linear" else net
    if not beta > 0:
        raise ValueError(f"beta must be positive, got {beta}")
    if gating == "shallow" and kind == "dgn":
        raise ValueError("shallow gating is linear (one linear layer per gate layer): use kind='dlgn' "
                         "(the DLGN-SF of the papers)")
    if pretrained is not None:
        if gating == "shallow":
            raise ValueError("pretrained gates come from a deep network: use gating='deep' with pretrained=")
        if not isinstance(pretrained, nn.Module):
            raise TypeError(f"pretrained must be the trained network (an nn.Module), got {type(pretrained).__name__}")
        pre_sites = gate_sites(pretrained)
        want_linear = kind == "dlgn"
        if len(pre_sites) != len(site_shapes(arch)) or any(isinstance(s, LinearSite) != want_linear for s in pre_sites):
            raise ValueError(
                f"pretrained must be a {'linear network' if want_linear else 'DNN'} of architecture {arch.name} "
                f"(build(arch, {'linear' if want_linear else 'dnn'!r}) trained), with {len(site_shapes(arch))} "
                f"gate sites; it has {len(pre_sites)}"
            )
        if any(getattr(site, "inplace", False) for site in pre_sites):
            raise ValueError("pretrained has in-place ReLUs, which overwrite the pre-activations the gates are "
                             "read from: build it with nn.ReLU() (inplace=False)")
        gating_net = copy.deepcopy(pretrained)
    else:
        gating_net = _dnn(arch)
        if kind == "dlgn":
            _replace_sites(gating_net, LinearSite)
    gating_module: DeepGating | ShallowGating = ShallowGating(arch) if gating == "shallow" else DeepGating(gating_net)
    perm = _check_permutation(arch, permutation if permutation is not None else range(len(site_shapes(arch))))
    value_net = _replace_sites(_dnn(arch), GaLU)
    model = GatedNetwork(arch, gating_module, value_net, value_input=value_input,
                         gate=gate or ("hard" if pretrained is not None else "soft"), beta=beta,
                         permutation=perm, frozen_gating=pretrained is not None)
    reference = next(pretrained.parameters(), None) if pretrained is not None else None
    return model.to(reference.device) if reference is not None else model  # next to the pretrained gates


def gated_forward_reference(model: GatedNetwork, x: Tensor) -> Tensor:
    """The output of a DGN with hard gates computed with :mod:`dualview.gates` instead of GaLU modules.

    The gating network's ReLU gates are recorded with :func:`dualview.gates.record_gates`; a copy of
    the value network with ReLUs in place of GaLUs is run with
    :func:`dualview.gates.run_with_gates`, its ReLU ``l`` given the recorded gate of gating ReLU
    ``pi(l)``. A slow, independent check of :meth:`GatedNetwork.forward`.
    """
    if model.gate_fn != "hard" or not isinstance(model.gating, DeepGating) or model.gating.linear:
        raise ValueError("the reference covers DGNs with deep ReLU gating and hard gates")
    rec = record_gates(model.gating.net, x)
    gating_names = rec.names
    relu_value = _replace_sites(copy.deepcopy(model.value), nn.ReLU)
    value_names = [n for n, m in relu_value.named_modules() if isinstance(m, nn.ReLU)]
    given = {name: rec.gates[gating_names[model.permutation[l]]] for l, name in enumerate(value_names)}
    xv = torch.ones_like(x) if model.value_input == "ones" else x
    return run_with_gates(relu_value, xv, given)
