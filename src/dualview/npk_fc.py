"""The neural path kernel (NPK) of fully connected networks: Theorem 3.1, and the base kernels.

The *neural path kernel* of a network is the Gram matrix of its neural path features,
``NPK(x, x') = <phi(x), phi(x')>`` (Section 2 of :cite:`lakshminarayanan2022explicitising`). It
depends on the inputs and the gates only. This module holds what every architecture's NPK is built
from, and the fully connected case:

* **gates as features** (:func:`fc_gates`, :func:`layer_kernels`): the per-layer *base kernels*
  ``<G_l(x), G_l(x')>``;
* **fully connected networks** (:func:`npk_fc`, :func:`overlap_fc`, :func:`npk_from_gates`,
  :func:`overlap_from_gates`): the product form of Theorem 3.1,
  ``NPK(x, x') = <x, x'> * prod_l <G_l(x), G_l(x')>``, batched and chunked;
* **references** (:func:`npf_gram_reference`, :func:`neural_path_features_from_gates_reference`):
  the Gram matrix of explicitly enumerated path features, for tiny networks;
* the **memory budget** every kernel computation checks its temporaries against
  (:data:`DEFAULT_MEMORY_BUDGET`, :func:`check_memory_budget`).

Convolutional networks: :mod:`dualview.npk_conv` (Theorem 3.2); residual networks:
:mod:`dualview.npk_resnet` (Theorem 3.3); the NTK: :mod:`dualview.ntk`; one entry point for all three
forms, kernel normalisation and kernel machines: :mod:`dualview.npk`.

**Biases.** Theorem 3.1 is stated for networks without biases. With biases, :mod:`dualview.paths`
uses the augmented-input convention: every bias starts a family of *bias paths*. Their features
add a sum of partial products to the kernel (see :func:`npk_from_gates`), so with biases the NPK
is a sum of product kernels, not a single product. ``bias_paths=False`` keeps the input paths only
(Theorem 3.1's kernel); the default follows the network and equals the Gram matrix of
:func:`dualview.paths.neural_path_features`.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch
from torch import Tensor, nn

from dualview.gates import UnsupportedLayerError, check_supported, record_gates
from dualview.paths import fc_layers, neural_path_features, path_index

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "MemoryBudgetError",
    "check_memory_budget",
    "fc_gates",
    "layer_kernels",
    "overlap_from_gates",
    "npk_from_gates",
    "overlap_fc",
    "npk_fc",
    "npf_gram_reference",
    "neural_path_features_from_gates_reference",
]

#: Bytes the temporaries of one kernel computation may take (the result itself is not counted).
DEFAULT_MEMORY_BUDGET: int = 1 << 30


class MemoryBudgetError(MemoryError):
    """A kernel computation would need more temporary memory than its budget: chunk it."""


def check_memory_budget(need: int, budget: int, what: str, hint: str) -> None:
    """Raise :class:`MemoryBudgetError` (saying what needs how much, and ``hint`` on how to chunk it)
    when ``need`` bytes of temporaries exceed ``budget``."""
    if need > budget:
        raise MemoryBudgetError(
            f"{what} needs about {need / 2**20:,.0f} MiB of temporaries, over the memory budget of "
            f"{budget / 2**20:,.0f} MiB. {hint}"
        )


# ==================================================================================================
# Gates as features: the base kernels of every architecture


def _fc_value_layers(model: nn.Module) -> list[nn.Linear]:
    """The Linear layers of a fully connected ReLU network, or :class:`~dualview.gates.UnsupportedLayerError`."""
    check_supported(model)
    try:
        return fc_layers(model)
    except TypeError as err:
        raise UnsupportedLayerError(
            f"the product form of the NPK (Theorem 3.1) is for fully connected ReLU networks "
            f"Sequential([Flatten], Linear, ReLU, ..., Linear); {err}. Convolutional networks with "
            "global average pooling have a rotation-sum NPK, residual networks an ensemble sum."
        ) from err


def fc_gates(
    model: nn.Module, x: Tensor, batch_size: int = 1000, dtype: torch.dtype | None = None
) -> list[Tensor]:
    """The gates ``G_l(x)`` of every hidden layer of a fully connected ReLU network: ``[(N, w_l), ...]``.

    Recorded with :func:`dualview.gates.record_gates` in chunks of ``batch_size`` (no gradients),
    returned as 0/1 tensors of ``dtype`` (default: ``x``'s floating dtype) on ``x``'s device.
    """
    layers = _fc_value_layers(model)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    x = x.flatten(1)
    if x.shape[1] != layers[0].in_features:
        raise ValueError(
            f"input has {x.shape[1]} features per sample, the network expects {layers[0].in_features}"
        )
    dtype = dtype or (x.dtype if x.is_floating_point() else torch.get_default_dtype())
    wdtype = layers[0].weight.dtype
    parts: list[list[Tensor]] = []
    with torch.no_grad():
        for chunk in x.split(batch_size):
            rec = record_gates(model, chunk.to(wdtype))
            parts.append([g.to(dtype) for g in rec.gates.values()])
    return [torch.cat(col).to(x.device) for col in zip(*parts)]


def _check_gates(gates: Sequence[Tensor], name: str) -> list[Tensor]:
    if not isinstance(gates, (list, tuple)) or not gates:
        raise ValueError(f"{name} must be a non-empty list of (N, w_l) gate tensors, one per hidden layer")
    gates = [g.flatten(1) for g in gates]
    n = gates[0].shape[0]
    if any(g.shape[0] != n for g in gates):
        raise ValueError(f"{name}: every layer needs one row per input, got {[tuple(g.shape) for g in gates]}")
    return gates


def _pair(gates1: Sequence[Tensor], gates2: Sequence[Tensor] | None) -> tuple[list[Tensor], list[Tensor]]:
    g1 = _check_gates(gates1, "gates1")
    g2 = g1 if gates2 is None else _check_gates(gates2, "gates2")
    if len(g1) != len(g2) or any(a.shape[1] != b.shape[1] for a, b in zip(g1, g2)):
        raise ValueError(
            "gates1 and gates2 must have the same layers and widths, got "
            f"{[a.shape[1] for a in g1]} and {[b.shape[1] for b in g2]}"
        )
    return g1, g2


def layer_kernels(
    gates1: Sequence[Tensor], gates2: Sequence[Tensor] | None = None, normalize: bool = False,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """The base kernel of every layer, ``K_l(x, x') = <G_l(x), G_l(x')>``: ``(L, N1, N2)``.

    With ``normalize`` each is divided by the layer's width ``w_l`` (the share of gates on for both
    inputs), the averaging that Theorem 3.1 of :cite:`lakshminarayanan2022disentangling` attributes to
    width. Holds all ``L`` Gram matrices at once: for large ``N`` use :func:`overlap_from_gates`.
    """
    g1, g2 = _pair(gates1, gates2)
    ks = [a.to(dtype) @ b.to(dtype).T for a, b in zip(g1, g2)]
    if normalize:
        ks = [k / a.shape[1] for k, a in zip(ks, g1)]
    return torch.stack(ks)


def _chunked_rows(n1: int, n2: int, chunk_size: int | None, itemsize: int, copies: int,
                  budget: int, what: str) -> int:
    """Row chunk to use, checking the temporaries (``copies`` blocks of ``rows x n2``) against the budget."""
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    rows = n1 if chunk_size is None else min(chunk_size, n1)
    hint = ("Pass chunk_size (e.g. chunk_size=1000) to compute the Gram matrix a block of rows at a time"
            if chunk_size is None else "Use a smaller chunk_size")
    hint += ", or raise memory_budget if the machine has the memory."
    check_memory_budget(copies * max(rows, 1) * n2 * itemsize, budget, f"a {n1} x {n2} {what}", hint)
    return max(rows, 1)


def overlap_from_gates(
    gates1: Sequence[Tensor], gates2: Sequence[Tensor] | None = None, *, normalize: bool = False,
    chunk_size: int | None = None, dtype: torch.dtype = torch.float64,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """``overlap(x, x') = prod_l <G_l(x), G_l(x')>``: the number of paths (from one input unit) active for both.

    Theorem 3.1 of :cite:`lakshminarayanan2022explicitising`. ``normalize`` divides each factor by
    its width. ``chunk_size`` computes the ``(N1, N2)`` result a block of rows at a time; without it
    the temporaries must fit in ``memory_budget`` bytes (:class:`MemoryBudgetError` otherwise).
    """
    g1, g2 = _pair(gates1, gates2)
    n1, n2 = g1[0].shape[0], g2[0].shape[0]
    rows = _chunked_rows(n1, n2, chunk_size, dtype.itemsize, 2, memory_budget, "overlap matrix")
    g2t = [b.to(dtype).T for b in g2]
    out = torch.empty(n1, n2, dtype=dtype, device=g1[0].device) if rows < n1 else None
    for start in range(0, n1, rows):
        block = None
        for a, bt in zip(g1, g2t):
            k = a[start:start + rows].to(dtype) @ bt
            if normalize:
                k /= a.shape[1]
            block = k if block is None else block.mul_(k)
        if rows >= n1:
            return block
        out[start:start + rows] = block
    return out


def _bias_flags(bias: bool | Sequence[bool] | None, n_layers: int) -> list[bool]:
    if bias is None or bias is False:
        return [False] * n_layers
    if bias is True:
        return [True] * n_layers
    flags = [bool(b) for b in bias]
    if len(flags) != n_layers:
        raise ValueError(
            f"bias needs one flag per weight layer of the value network ({n_layers}: one per hidden "
            f"layer and one for the output layer), got {len(flags)}"
        )
    return flags


def npk_from_gates(
    x1: Tensor, gates1: Sequence[Tensor], x2: Tensor | None = None, gates2: Sequence[Tensor] | None = None,
    *, bias: bool | Sequence[bool] | None = None, normalize: bool = False, chunk_size: int | None = None,
    dtype: torch.dtype = torch.float64, memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """The NPK of a fully connected (gated) network from its inputs and gates: ``(N1, N2)``.

    Without biases (``bias=None``/``False``), Theorem 3.1 of :cite:`lakshminarayanan2022explicitising`:
    ``NPK(x, x') = <x, x'> * prod_{l=1}^{L-1} K_l(x, x')`` with ``K_l = <G_l(x), G_l(x')>``.

    With biases in the value network (``bias``: one flag per weight layer ``1..L``, or ``True`` for
    all), the augmented-input convention of :mod:`dualview.paths` adds the bias paths: the bias of
    layer ``j`` starts paths through hidden layers ``j..L-1``, so
    ``NPK = <x, x'> prod_{l=1}^{L-1} K_l + sum_{j=1}^{L} b_j prod_{l=j}^{L-1} K_l``,
    computed by the recursion ``S_0 = <x, x'> + b_1``, ``S_l = S_{l-1} K_l + b_{l+1}``.
    ``normalize`` divides every ``K_l`` by the width ``w_l``; see :func:`overlap_from_gates` for
    ``chunk_size`` and ``memory_budget``.
    """
    if (x2 is None) != (gates2 is None):
        raise ValueError("give x2 together with gates2 (or neither, for the Gram matrix of x1)")
    g1, g2 = _pair(gates1, gates2)
    x1 = x1.flatten(1)
    x2 = x1 if x2 is None else x2.flatten(1)
    if x1.shape[0] != g1[0].shape[0] or x2.shape[0] != g2[0].shape[0]:
        raise ValueError(
            f"inputs and gates must have one row per sample: x1 {tuple(x1.shape)} with gates for "
            f"{g1[0].shape[0]}, x2 {tuple(x2.shape)} with gates for {g2[0].shape[0]}"
        )
    if x1.shape[1] != x2.shape[1]:
        raise ValueError(f"x1 and x2 must have the same number of features, got {x1.shape[1]} and {x2.shape[1]}")
    flags = _bias_flags(bias, len(g1) + 1)
    n1, n2 = x1.shape[0], x2.shape[0]
    rows = _chunked_rows(n1, n2, chunk_size, dtype.itemsize, 2, memory_budget, "NPK matrix")
    x2t = x2.to(dtype).T
    g2t = [b.to(dtype).T for b in g2]
    out = torch.empty(n1, n2, dtype=dtype, device=x1.device) if rows < n1 else None
    for start in range(0, n1, rows):
        block = x1[start:start + rows].to(dtype) @ x2t
        if flags[0]:
            block += 1.0
        for l, (a, bt) in enumerate(zip(g1, g2t)):
            k = a[start:start + rows].to(dtype) @ bt
            if normalize:
                k /= a.shape[1]
            block.mul_(k)
            if flags[l + 1]:
                block += 1.0
        if rows >= n1:
            return block
        out[start:start + rows] = block
    return out


# ==================================================================================================
# Fully connected networks: the product kernel of Theorem 3.1


def _model_bias(layers: list[nn.Linear], bias_paths: bool | None) -> list[bool]:
    if bias_paths is None:
        return [lin.bias is not None for lin in layers]
    if bias_paths:
        missing = [k + 1 for k, lin in enumerate(layers) if lin.bias is None]
        if missing:
            raise ValueError(f"bias_paths=True but weight layers {missing} of the value network have no bias")
        return [True] * len(layers)
    return [False] * len(layers)


def _fc_pair_gates(model, gating, x1, x2, batch_size):
    layers = _fc_value_layers(model)
    source = model if gating is None else gating
    if gating is not None:
        glayers = _fc_value_layers(gating)
        widths = [lin.out_features for lin in layers[:-1]]
        gwidths = [lin.out_features for lin in glayers[:-1]]
        if widths != gwidths:
            raise ValueError(f"the gating network's hidden widths {gwidths} differ from the value network's {widths}")
    g1 = fc_gates(source, x1, batch_size)
    g2 = None if x2 is None else fc_gates(source, x2, batch_size)
    return layers, g1, g2


def npk_fc(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, *, gating: nn.Module | None = None,
    bias_paths: bool | None = None, normalize: bool = False, chunk_size: int | None = None,
    dtype: torch.dtype = torch.float64, batch_size: int = 1000, memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """The NPK of a fully connected ReLU network (or of a DGN) on data matrices: ``(N1, N2)``.

    ``model`` is the value network (its depth, widths and biases fix the paths); the gates come from
    ``gating`` (a DGN's gating network, same hidden widths) or, by default, from ``model`` itself.
    ``bias_paths=None`` follows the value network's biases, so that for a plain network the result is
    the Gram matrix of :func:`dualview.paths.neural_path_features`; ``False`` gives Theorem 3.1's
    product form ``<x, x'> prod_l <G_l(x), G_l(x')>`` over the input paths only. ``x2=None`` gives the
    Gram matrix of ``x1``. See :func:`npk_from_gates` for the other arguments.
    """
    layers, g1, g2 = _fc_pair_gates(model, gating, x1, x2, batch_size)
    return npk_from_gates(
        x1, g1, x2, g2, bias=_model_bias(layers, bias_paths), normalize=normalize,
        chunk_size=chunk_size, dtype=dtype, memory_budget=memory_budget,
    )


def overlap_fc(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, *, gating: nn.Module | None = None,
    normalize: bool = False, chunk_size: int | None = None, dtype: torch.dtype = torch.float64,
    batch_size: int = 1000, memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """``overlap(x, x') = prod_l <G_l(x), G_l(x')>`` of a fully connected network: the NPK without the input term.

    With a constant input ``x = 1`` to the value network (DGN-ALLONES), the NPK is ``d_in`` times this
    (Section 4 of :cite:`lakshminarayanan2022explicitising`).
    """
    _, g1, g2 = _fc_pair_gates(model, gating, x1, x2, batch_size)
    return overlap_from_gates(g1, g2, normalize=normalize, chunk_size=chunk_size, dtype=dtype,
                              memory_budget=memory_budget)


# ==================================================================================================
# References: explicit neural path features (tiny networks only)


def npf_gram_reference(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, input_paths_only: bool = False
) -> Tensor:
    """The NPK as the Gram matrix ``phi(x1) phi(x2)^T`` of explicitly enumerated path features.

    Uses :func:`dualview.paths.neural_path_features` (augmented input: bias paths included);
    ``input_paths_only`` drops the bias paths. Cost and memory grow with the number of paths: tiny
    networks only. Compute in float64 for exact comparisons.
    """
    layers = fc_layers(model)
    phi1 = neural_path_features(model, x1)
    phi2 = phi1 if x2 is None else neural_path_features(model, x2)
    if input_paths_only:
        keep = path_index(model)[:, 0] < layers[0].in_features
        phi1, phi2 = phi1[:, keep], phi2[:, keep]
    return phi1 @ phi2.T


def neural_path_features_from_gates_reference(x: Tensor, gates: Sequence[Tensor]) -> Tensor:
    """Path features of a bias-free gated network fed external gates: a loop over samples and paths.

    ``phi(x)_p = x[p_0] * prod_l gates[l][p_l]`` for every path ``p = (p_0, ..., p_{L-1})``; the
    gates may come from any network (a DGN's gating network, or permuted layers). ``(N, P)``.
    """
    x = x.flatten(1)
    gates = [g.flatten(1) for g in gates]
    widths = [x.shape[1]] + [g.shape[1] for g in gates]
    out = torch.zeros(x.shape[0], math.prod(widths), dtype=x.dtype, device=x.device)
    for n in range(x.shape[0]):
        for k, p in enumerate(itertools.product(*[range(w) for w in widths])):
            feat = float(x[n, p[0]])
            for l, unit in enumerate(p[1:]):
                feat *= float(gates[l][n, unit])
            out[n, k] = feat
    return out
