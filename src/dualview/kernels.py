"""Kernels of the dual view: the neural path kernel (NPK), the empirical NTK, kernel classifiers.

The *neural path kernel* of a network is the Gram matrix of its neural path features,
``NPK(x, x') = <phi(x), phi(x')>`` (Section 2 of :cite:`lakshminarayanan2022explicitising`). It
depends on the inputs and the gates only. The module is organised by architecture:

* **gates as features** (:func:`fc_gates`, :func:`layer_kernels`): the per-layer *base kernels*
  ``<G_l(x), G_l(x')>`` that every architecture's NPK is built from;
* **fully connected networks** (:func:`npk_fc`, :func:`overlap_fc`, :func:`npk_from_gates`,
  :func:`overlap_from_gates`): the product form of Theorem 3.1,
  ``NPK(x, x') = <x, x'> * prod_l <G_l(x), G_l(x')>``, batched and chunked;
* **circular convolutional networks with global average pooling** (:func:`conv_structure`,
  :func:`npk_conv`, :func:`npk_conv_from_gates`, :func:`conv_overlap`, :func:`rotate`): the rotation
  sum of Theorem 3.2 / Lemma F.1, with :func:`npk_conv_reference` (explicit path bundles);
* **residual networks** (:func:`npk_resnet`, :func:`npk_resnet_subnetwork`, :func:`resnet_gates`):
  the ensemble sum of Theorem 3.3 over the ``2^b`` sub-networks, with
  :func:`npk_resnet_reference` (explicitly concatenated path features, Lemma G.1);
* **references** (:func:`npf_gram_reference`, :func:`neural_path_features_from_gates_reference`):
  the Gram matrix of explicitly enumerated path features, for tiny networks;
* **the empirical NTK** (:func:`empirical_ntk`, :func:`empirical_ntk_reference`,
  :func:`ntk_npk_constant`, :func:`sign_init_`) with ``torch.func``, and :class:`FixedGates`,
  the value network of a deep gated network (DGN) run with the gates of another network;
* **kernel methods** (:func:`normalize_kernel`, :func:`kernel_ridge_classify`).

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
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from dualview.gates import UnsupportedLayerError, check_supported, record_gates, run_with_gates
from dualview.paths import bundle_features_reference, fc_layers, neural_path_features, neural_path_values, path_index

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "MemoryBudgetError",
    "fc_gates",
    "layer_kernels",
    "overlap_from_gates",
    "npk_from_gates",
    "overlap_fc",
    "npk_fc",
    "npf_gram_reference",
    "neural_path_features_from_gates_reference",
    "FixedGates",
    "sign_init_",
    "ntk_npk_constant",
    "empirical_ntk",
    "empirical_ntk_reference",
    "relative_deviation",
    "normalize_kernel",
    "KernelRidgeResult",
    "kernel_ridge_classify",
    "ConvStructure",
    "conv_structure",
    "conv_gates",
    "conv_overlap",
    "npk_conv_from_gates",
    "npk_conv",
    "npk_conv_reference",
    "rotate",
    "resnet_gates",
    "npk_resnet",
    "npk_resnet_subnetwork",
    "resnet_path_features_reference",
    "npk_resnet_reference",
]

#: Bytes the temporaries of one kernel computation may take (the result itself is not counted).
DEFAULT_MEMORY_BUDGET: int = 1 << 30


class MemoryBudgetError(MemoryError):
    """A kernel computation would need more temporary memory than its budget: chunk it."""


def _check_budget(need: int, budget: int, what: str, hint: str) -> None:
    if need > budget:
        raise MemoryBudgetError(
            f"{what} needs about {need / 2**20:,.0f} MiB of temporaries, over the memory budget of "
            f"{budget / 2**20:,.0f} MiB. {hint}"
        )


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ==================================================================================================
# Gates as features: the base kernels of every architecture


def _fc_value_layers(model: nn.Module) -> list[nn.Linear]:
    """The Linear layers of a fully connected ReLU network, or :class:`UnsupportedLayerError`."""
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
    _check_budget(copies * max(rows, 1) * n2 * itemsize, budget, f"a {n1} x {n2} {what}", hint)
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
    rows = _chunked_rows(n1, n2, chunk_size, _itemsize(dtype), 2, memory_budget, "overlap matrix")
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
    rows = _chunked_rows(n1, n2, chunk_size, _itemsize(dtype), 2, memory_budget, "NPK matrix")
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
    out = torch.zeros(x.shape[0], math.prod(widths), dtype=x.dtype)
    for n in range(x.shape[0]):
        for k, p in enumerate(itertools.product(*[range(w) for w in widths])):
            feat = float(x[n, p[0]])
            for l, unit in enumerate(p[1:]):
                feat *= float(gates[l][n, unit])
            out[n, k] = feat
    return out


# ==================================================================================================
# Fixed gates (the value network of a DGN) and the empirical NTK


class FixedGates(nn.Module):
    """A deep gated network with fixed gates: ``value`` run with the gates that ``gating`` computes.

    ``forward(x)`` records the gates (and max-pool winners) of ``gating`` on ``x`` without gradients
    and runs ``value`` with them imposed (every ReLU of ``value`` becomes a GaLU), as in the DGN of
    :cite:`lakshminarayanan2020neural` (Section 2 of :cite:`lakshminarayanan2022explicitising`).
    Both networks need the same architecture (the same ReLU calls). ``value_input="ones"`` feeds the
    value network a constant all-ones input (DGN-ALLONES). ``gating`` always stays in eval mode; only
    ``value`` is meant to be trained (``value.parameters()``, or parameter names starting ``"value."``).
    """

    def __init__(self, value: nn.Module, gating: nn.Module, value_input: str = "x") -> None:
        super().__init__()
        if value_input not in ("x", "ones"):
            raise ValueError(f"value_input must be 'x' or 'ones', got {value_input!r}")
        check_supported(value)
        self.value = value
        self.gating = gating.eval()
        self.value_input = value_input

    def train(self, mode: bool = True) -> FixedGates:
        super().train(mode)
        self.gating.eval()
        return self

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            rec = record_gates(self.gating, x)
        xv = torch.ones_like(x) if self.value_input == "ones" else x
        return run_with_gates(self.value, xv, rec.gates, rec.pool_indices or None)


def sign_init_(model: nn.Module, sigma: float | Sequence[float], generator: torch.Generator | None = None) -> nn.Module:
    """Draw every weight of the Linear layers iid from ``{-sigma_l, +sigma_l}`` and zero the biases.

    Assumption 2.1 of :cite:`lakshminarayanan2022disentangling` (Assumption F.1 of
    :cite:`lakshminarayanan2022explicitising`), with one ``sigma`` for all layers or one per layer.
    Changes ``model`` in place and returns it.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    sigmas = [float(sigma)] * len(layers) if isinstance(sigma, (int, float)) else [float(s) for s in sigma]
    if len(sigmas) != len(layers):
        raise ValueError(f"need one sigma per Linear layer ({len(layers)}), got {len(sigmas)}")
    if any(s <= 0 for s in sigmas):
        raise ValueError(f"sigma must be positive, got {sigmas}")
    with torch.no_grad():
        for lin, s in zip(layers, sigmas):
            signs = torch.randint(0, 2, lin.weight.shape, generator=generator).to(lin.weight) * 2 - 1
            lin.weight.copy_(s * signs)
            if lin.bias is not None:
                lin.bias.zero_()
    return model


def ntk_npk_constant(sigmas: Sequence[float]) -> float:
    """The constant ``c`` of ``E[NTK_value] = c * NPK`` for value weights drawn from ``{-sigma_l, +sigma_l}``.

    For a path ``p`` of ``d`` weights, ``sum_theta (dv_p / dtheta)^2 = sum_l prod_{k != l} sigma_k^2``;
    cross terms between paths vanish in expectation. With one ``sigma`` for all ``d`` layers this is
    ``d * sigma^(2(d-1))`` (Theorem 2.1 of :cite:`lakshminarayanan2022disentangling`, Section 2 of
    :cite:`lakshminarayanan2022explicitising`).
    """
    s2 = [float(s) ** 2 for s in sigmas]
    if not s2 or any(v <= 0 for v in s2):
        raise ValueError(f"need one positive sigma per weight layer, got {list(sigmas)}")
    return sum(math.prod(s2[:l] + s2[l + 1:]) for l in range(len(s2)))


def _select_params(model: nn.Module, params) -> list[str]:
    names = [n for n, p in model.named_parameters()]
    if params is None:
        chosen = [n for n, p in model.named_parameters() if p.requires_grad]
    elif isinstance(params, str):
        chosen = [n for n in names if n == params or n.startswith(params.rstrip(".") + ".")]
    elif callable(params):
        chosen = [n for n in names if params(n)]
    else:
        chosen = list(params)
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise KeyError(f"the model has no parameters {unknown}; its parameters are {names}")
    if not chosen:
        raise ValueError(f"no parameters selected by params={params!r}; the model's parameters are {names}")
    return chosen


def empirical_ntk(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, *,
    params: str | Iterable[str] | Callable[[str], bool] | None = None, output: int | str | None = None,
    chunk_size: int = 64, memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """The empirical neural tangent kernel ``<d f(x)/d theta, d f(x')/d theta>`` :cite:`jacot2018neural`.

    Per-sample Jacobians with ``torch.func`` (``vmap`` over samples of ``jacrev`` of a
    ``functional_call``), ``chunk_size`` samples at a time, contracted block by block. ``params``
    selects the parameters ``theta``: ``None`` (all that require grad), a name prefix (``"value"``
    for the value network of a :class:`FixedGates`), a list of names, or a predicate on names; the
    others are held fixed. ``output``: for a single-output model ``None``; otherwise an output index,
    ``"trace"`` (sum over outputs of the diagonal blocks) or ``"full"`` (``(N1, N2, C, C)``). The
    Jacobians of ``x2`` are kept if they fit in ``memory_budget`` bytes, else recomputed per block.
    Returns ``(N1, N2)`` in the model's dtype.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    names = _select_params(model, params)
    all_params = dict(model.named_parameters())
    chosen = {n: all_params[n].detach() for n in names}
    fixed = {n: p.detach() for n, p in all_params.items() if n not in chosen}
    fixed.update({n: b for n, b in model.named_buffers()})
    n_params = sum(p.numel() for p in chosen.values())

    def f(p, xi):
        return functional_call(model, {**p, **fixed}, (xi.unsqueeze(0),)).reshape(-1)

    jac = vmap(jacrev(f), in_dims=(None, 0))
    with torch.no_grad():
        n_out = f(chosen, x1[0]).numel()
    if output is None and n_out != 1:
        raise ValueError(
            f"the model has {n_out} outputs: choose output=<index>, output='trace' or output='full'"
        )
    if isinstance(output, int) and not isinstance(output, bool):
        if not -n_out <= output < n_out:
            raise ValueError(f"output={output} but the model has {n_out} outputs")
        output = output % n_out
    if output not in (None, "trace", "full") and not isinstance(output, int):
        raise ValueError(f"output must be None, an int, 'trace' or 'full', got {output!r}")

    def jacobian(x: Tensor) -> Tensor:
        blocks = []
        for chunk in x.split(chunk_size):
            J = jac(chosen, chunk)
            Jf = torch.cat([J[n].flatten(2) for n in names], dim=2)  # (B, C, P)
            if isinstance(output, int):
                Jf = Jf[:, output:output + 1]
            blocks.append(Jf)
        return torch.cat(blocks)

    itemsize = _itemsize(next(iter(chosen.values())).dtype)
    per_sample = n_out * n_params * itemsize
    _check_budget(2 * chunk_size * per_sample, memory_budget, f"Jacobians of {chunk_size} samples "
                  f"({n_params:,} parameters, {n_out} outputs)", "Use a smaller chunk_size.")
    same = x2 is None
    x2 = x1 if same else x2
    n1, n2 = x1.shape[0], x2.shape[0]
    keep_j2 = n2 * per_sample <= memory_budget
    J2 = jacobian(x2) if keep_j2 else None
    rows = []
    for c1 in x1.split(chunk_size):
        J1 = jacobian(c1)
        if J2 is not None:
            J2_blocks = [J2]
        else:
            J2_blocks = (jacobian(c2) for c2 in x2.split(chunk_size))
        cols = []
        for J2b in J2_blocks:
            if output == "full":
                cols.append(torch.einsum("icp,jdp->ijcd", J1, J2b))
            else:
                cols.append(torch.einsum("icp,jcp->ij", J1, J2b))
        rows.append(torch.cat(cols, dim=1))
    return torch.cat(rows, dim=0)


def empirical_ntk_reference(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, *,
    params: str | Iterable[str] | Callable[[str], bool] | None = None, output: int | str | None = None,
) -> Tensor:
    """Reference for :func:`empirical_ntk`: one ``torch.autograd.grad`` per sample and output, a loop over pairs."""
    names = _select_params(model, params)
    plist = [dict(model.named_parameters())[n] for n in names]
    x2 = x1 if x2 is None else x2

    def grads(x: Tensor) -> list[Tensor]:  # per sample: (C, P)
        out = []
        for n in range(x.shape[0]):
            y = model(x[n:n + 1]).reshape(-1)
            rows = []
            for c in range(y.numel()):
                g = torch.autograd.grad(y[c], plist, retain_graph=True, allow_unused=True)
                rows.append(torch.cat([(gi if gi is not None else torch.zeros_like(p)).flatten()
                                       for gi, p in zip(g, plist)]))
            out.append(torch.stack(rows))
        return out

    G1, G2 = grads(x1), grads(x2)
    C = G1[0].shape[0]
    if output == "full":
        K = torch.zeros(len(G1), len(G2), C, C, dtype=G1[0].dtype)
    else:
        K = torch.zeros(len(G1), len(G2), dtype=G1[0].dtype)
    for i, a in enumerate(G1):
        for j, b in enumerate(G2):
            if output == "full":
                K[i, j] = a @ b.T
            elif output == "trace" or (output is None and C == 1):
                K[i, j] = (a * b).sum()
            else:
                K[i, j] = a[output] @ b[output]
    return K.detach()


def relative_deviation(a: Tensor, b: Tensor) -> float:
    """``||a - b||_F / ||b||_F``: how far a kernel matrix ``a`` is from ``b``."""
    if a.shape != b.shape:
        raise ValueError(f"kernel matrices of different shapes: {tuple(a.shape)} and {tuple(b.shape)}")
    return float(torch.linalg.norm((a - b).double()) / torch.linalg.norm(b.double()))


# ==================================================================================================
# Kernel methods


def normalize_kernel(K: Tensor, diag1: Tensor, diag2: Tensor | None = None) -> Tensor:
    """Cosine normalisation ``K(x, x') / sqrt(K(x, x) K(x', x'))`` (``diag2`` defaults to ``diag1``)."""
    diag2 = diag1 if diag2 is None else diag2
    if K.shape != (diag1.numel(), diag2.numel()):
        raise ValueError(f"K has shape {tuple(K.shape)} but the diagonals have {diag1.numel()} and {diag2.numel()} entries")
    if bool((diag1 <= 0).any()) or bool((diag2 <= 0).any()):
        raise ValueError("a kernel diagonal entry is <= 0 (an input with no active path?): cannot normalise")
    return K / torch.sqrt(diag1.reshape(-1, 1) * diag2.reshape(1, -1))


@dataclass
class KernelRidgeResult:
    """Predicted labels and scores of a kernel ridge classifier."""

    predictions: Tensor
    scores: Tensor


def kernel_ridge_classify(
    K_train: Tensor, y_train: Tensor, K_test: Tensor, ridge: float = 1e-3, num_classes: int | None = None
) -> KernelRidgeResult:
    """Kernel ridge regression on centred one-hot targets, then the arg-max class.

    ``K_train`` is ``(N, N)`` on the training inputs, ``K_test`` ``(M, N)`` between test and training
    inputs. ``ridge`` is relative to the mean of ``K_train``'s diagonal. Solved in float64 with a
    Cholesky factorisation.
    """
    n = K_train.shape[0]
    if K_train.shape != (n, n) or K_test.dim() != 2 or K_test.shape[1] != n or y_train.shape != (n,):
        raise ValueError(
            f"need K_train (N, N), y_train (N,), K_test (M, N); got {tuple(K_train.shape)}, "
            f"{tuple(y_train.shape)}, {tuple(K_test.shape)}"
        )
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    C = int(num_classes or int(y_train.max()) + 1)
    K = K_train.double()
    Y = torch.nn.functional.one_hot(y_train.long(), C).double() - 1.0 / C
    lam = ridge * K.diagonal().mean()
    L = torch.linalg.cholesky(K + lam * torch.eye(n, dtype=K.dtype, device=K.device))
    alpha = torch.cholesky_solve(Y.to(K.device), L)
    scores = K_test.double() @ alpha
    return KernelRidgeResult(predictions=scores.argmax(1), scores=scores)


# ==================================================================================================
# Convolutional networks with global average pooling: the rotation sum of Theorem 3.2


_CONV = (nn.Conv1d, nn.Conv2d)
_GAP = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)


@dataclass(frozen=True)
class ConvStructure:
    """What the rotation-sum NPK needs to know of a circular convolutional network.

    ``spatial``: the shape of the input's positions (length, or ``(H, W)``), ``d_in`` positions in
    all; ``in_channels``; ``taps[l]``: for convolution ``l``, ``(kernel_size, dilation, padding)``
    per spatial dimension (a path from position ``u + dilation * t - padding`` of layer ``l - 1``
    reaches position ``u`` of layer ``l`` through tap ``t``); ``head``: ``"gap"`` (global average pooling, Theorem 3.2) or
    ``"flatten"``; ``conv_gates`` / ``fc_gates``: the names (as in
    :func:`dualview.gates.record_gates`) of the ReLUs after the convolutions and in the fully
    connected part.
    """

    spatial: tuple[int, ...]
    in_channels: int
    taps: tuple[tuple[tuple[int, int, int], ...], ...]
    head: str
    conv_gates: tuple[str, ...]
    fc_gates: tuple[str, ...]

    @property
    def d_in(self) -> int:
        """The number of input positions (and of rotations)."""
        return math.prod(self.spatial)


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if not list(m.children()) and n]


def conv_structure(model: nn.Module, input_shape: Sequence[int]) -> ConvStructure:
    """Check that ``model`` is a network of Theorem 3.2's kind and describe it (:class:`ConvStructure`).

    The theorem (Appendix F of :cite:`lakshminarayanan2022explicitising`) needs, in this order:
    convolutions (``Conv1d``/``Conv2d``) each followed by a ReLU, every one *circular*
    (``padding_mode="circular"``), of stride 1, ungrouped and same-size (``2 * padding = dilation *
    (kernel_size - 1)``), so that rotating the input rotates every hidden map; then global average
    pooling (``AdaptiveAvgPool*(1)``, then ``Flatten``), or ``Flatten`` alone (``head="flatten"``, no
    invariance); then ``Linear``-ReLU layers and a ``Linear`` output. No biases anywhere (the theorem
    has none). ``input_shape`` is one input's shape ``(C, L)`` or ``(C, H, W)``. Anything else raises
    an error that names the layer and the assumption it breaks.
    """
    check_supported(model)
    input_shape = tuple(int(s) for s in input_shape)
    if len(input_shape) not in (2, 3):
        raise ValueError(f"input_shape must be (C, L) or (C, H, W) for one input, got {input_shape}")
    spatial = input_shape[1:]
    leaves = _leaves(model)
    taps, conv_names, fc_names = [], [], []
    k, head = 0, None
    channels = input_shape[0]

    def fail(name, m, why):
        raise UnsupportedLayerError(
            f"layer '{name}' ({m}) breaks an assumption of the rotation-sum NPK (Theorem 3.2): {why}"
        )

    while k < len(leaves) and isinstance(leaves[k][1], _CONV):
        name, m = leaves[k]
        if m.in_channels != channels:
            fail(name, m, f"expects {m.in_channels} input channels, gets {channels}")
        if (isinstance(m, nn.Conv1d) and len(spatial) != 1) or (isinstance(m, nn.Conv2d) and len(spatial) != 2):
            fail(name, m, f"the input has {len(spatial)} spatial dimension(s)")
        if m.padding_mode != "circular":
            fail(name, m, f"padding_mode is '{m.padding_mode}', the theorem needs circular convolutions "
                          "(build it with padding_mode='circular')")
        if any(s != 1 for s in m.stride):
            fail(name, m, f"stride {m.stride}: only stride-1 convolutions keep every hidden map the input's size")
        if m.groups != 1:
            fail(name, m, "grouped convolutions are not supported")
        if m.bias is not None:
            fail(name, m, "has a bias; Theorem 3.2 is for bias-free networks (build it with bias=False)")
        if isinstance(m.padding, str) or any(2 * p != d * (kk - 1) for p, d, kk in
                                             zip(m.padding, m.dilation, m.kernel_size)):
            fail(name, m, f"padding {m.padding} does not keep the size (needs 2 * padding = dilation * (kernel_size - 1))")
        if k + 1 >= len(leaves) or not isinstance(leaves[k + 1][1], nn.ReLU):
            fail(name, m, "every convolution must be followed by an nn.ReLU")
        taps.append(tuple(zip(m.kernel_size, m.dilation, m.padding)))
        conv_names.append(leaves[k + 1][0])
        channels = m.out_channels
        k += 2
    if not taps:
        raise UnsupportedLayerError(
            "the rotation-sum NPK (Theorem 3.2) needs a network that starts with circular convolutions; "
            f"the first layer is '{leaves[0][0] if leaves else None}'"
        )
    features = channels
    if k < len(leaves) and isinstance(leaves[k][1], _GAP):
        name, m = leaves[k]
        size = m.output_size if isinstance(m.output_size, tuple) else (m.output_size,)
        if any(s not in (1, None) for s in size):
            fail(name, m, f"output_size {m.output_size}: global average pooling has output size 1")
        head = "gap"
        k += 1
    else:
        head = "flatten"
        features = channels * math.prod(spatial)
    if k >= len(leaves) or not isinstance(leaves[k][1], nn.Flatten):
        name, m = leaves[k] if k < len(leaves) else ("(end)", None)
        fail(name, m, "after the convolutions comes global average pooling and/or nn.Flatten")
    k += 1
    rest = leaves[k:]
    for j, (name, m) in enumerate(rest):
        want = nn.Linear if j % 2 == 0 else nn.ReLU
        if not isinstance(m, want):
            fail(name, m, f"expected {want.__name__}: the top is Linear, ReLU, ..., Linear")
        if isinstance(m, nn.Linear):
            if m.bias is not None:
                fail(name, m, "has a bias; Theorem 3.2 is for bias-free networks (build it with bias=False)")
            if m.in_features != features:
                fail(name, m, f"expects {m.in_features} features, gets {features}")
            features = m.out_features
        else:
            fc_names.append(name)
    if not rest or len(rest) % 2 == 0:
        raise UnsupportedLayerError("the network must end with an nn.Linear output layer")
    return ConvStructure(tuple(spatial), input_shape[0], tuple(taps), head, tuple(conv_names), tuple(fc_names))


def conv_gates(model: nn.Module, x: Tensor, structure: ConvStructure | None = None, batch_size: int = 500,
               dtype: torch.dtype = torch.float64) -> list[Tensor]:
    """The gates of a circular convolutional network: ``[(N, C_l, *spatial) per convolution, (N, w) per FC layer]``."""
    s = structure or conv_structure(model, x.shape[1:])
    parts: list[list[Tensor]] = []
    wdtype = next(model.parameters()).dtype
    with torch.no_grad():
        for chunk in x.split(batch_size):
            g = record_gates(model, chunk.to(wdtype)).gates
            parts.append([g[n].to(dtype) for n in s.conv_gates + s.fc_gates])
    return [torch.cat(col) for col in zip(*parts)]


def _rotation_index(spatial: tuple[int, ...], device) -> Tensor:
    """``idx[r, v]``: the flat position ``v + r`` (componentwise, modulo the size) for every rotation ``r``."""
    grids = torch.meshgrid(*[torch.arange(s, device=device) for s in spatial], indexing="ij")
    coords = torch.stack([g.reshape(-1) for g in grids], 1)  # (d, dims)
    size = torch.tensor(spatial, device=device)
    moved = (coords[None, :, :] + coords[:, None, :]) % size  # [r, v] -> v + r
    flat = torch.zeros(moved.shape[:2], dtype=torch.long, device=device)
    for k, s in enumerate(spatial):
        flat = flat * s + moved[..., k]
    return flat


def _pairwise_positions(a: Tensor, b: Tensor, idx: Tensor | None) -> Tensor:
    """``out[i, j, r, v] = sum_c a[i, c, v] * b[j, c, v + r]`` (``idx`` None: ``r = 0`` only)."""
    if idx is None:
        return torch.einsum("icv,jcv->ijv", a, b).unsqueeze(2)
    n1, n2, d, rr = a.shape[0], b.shape[0], a.shape[2], idx.shape[0]
    lhs = a.permute(2, 0, 1).contiguous()  # (v, i, c)
    rhs = b[:, :, idx.T].permute(2, 1, 0, 3).reshape(d, a.shape[1], n2 * rr)  # (v, c, j r): b[j, c, v + r]
    return torch.bmm(lhs, rhs).view(d, n1, n2, rr).permute(1, 2, 3, 0).contiguous()


def _back_through(s: Tensor, taps, spatial) -> Tensor:
    """Sum over the taps of one same-size circular convolution, from its output positions back to
    its input positions: ``t(v) = sum_t s(v - dilation * t + padding)``. The all-ones kernel is
    separable and, being same-size, symmetric: a circular box sum along each dimension."""
    lead = s.shape[:-1]
    s = s.reshape(*lead, *spatial)
    for k, ((size, dil, pad), n) in enumerate(zip(taps, spatial)):
        dim = len(lead) + k
        wrap = torch.arange(-pad, n + pad, device=s.device) % n
        span = dil * (size - 1) + 1
        s = s.index_select(dim, wrap).unfold(dim, span, 1)[..., ::dil].sum(-1)
    return s.reshape(*lead, -1)


def _conv_block(structure: ConvStructure, cg1, fg1, cg2, fg2, rotations: bool, idx) -> Tensor:
    """Lambda for a block of pairs: ``(n1, n2, R, d_in)``, FC overlap and pooling factor included."""
    idx = idx if rotations else None
    s = None
    for l in range(len(cg1) - 1, -1, -1):
        joint = _pairwise_positions(cg1[l], cg2[l], idx)  # active-for-both units per position
        s = joint if s is None else joint.mul_(s)
        s = _back_through(s, structure.taps[l], structure.spatial)
    fc = torch.ones(s.shape[:2], dtype=s.dtype, device=s.device)
    for a, b in zip(fg1, fg2):
        fc = fc * (a @ b.T)
    pool = 1.0 / structure.d_in ** 2 if structure.head == "gap" else 1.0
    return s * (fc * pool)[:, :, None, None]


def _split_gates(structure: ConvStructure, gates: Sequence[Tensor], n: int, name: str, dtype):
    nc = len(structure.taps)
    if len(gates) != nc + len(structure.fc_gates):
        raise ValueError(f"{name}: expected {nc} convolutional and {len(structure.fc_gates)} fully connected "
                         f"gate tensors, got {len(gates)}")
    cg = [g.to(dtype).reshape(g.shape[0], g.shape[1], -1) for g in gates[:nc]]
    fg = [g.to(dtype).flatten(1) for g in gates[nc:]]
    if any(g.shape[0] != n for g in cg + fg) or any(g.shape[2] != structure.d_in for g in cg):
        raise ValueError(f"{name}: every gate tensor needs {n} rows and convolutional gates {structure.d_in} "
                         f"positions, got {[tuple(g.shape) for g in gates]}")
    return cg, fg


def conv_overlap(structure: ConvStructure, gates1: Sequence[Tensor], gates2: Sequence[Tensor] | None = None,
                 dtype: torch.dtype = torch.float64) -> Tensor:
    """``Lambda[n1, n2, r, i] = overlap(i, x, rot(x', r))``: the paths from input position ``i`` active
    for both ``x`` and ``rot(x', r)``, weighted by the pooling masks (Lemma F.1 of
    :cite:`lakshminarayanan2022explicitising`); ``(N1, N2, d_in, d_in)``, or ``(N1, N2, 1, d_in)``
    (``r = 0`` only) for ``head="flatten"``. The gates of ``rot(x', r)`` are those of ``x'``, rotated:
    circular convolutions are rotation-equivariant. Holds everything at once: small ``N`` only.
    """
    n1 = gates1[0].shape[0]
    cg1, fg1 = _split_gates(structure, gates1, n1, "gates1", dtype)
    if gates2 is None:
        cg2, fg2 = cg1, fg1
    else:
        cg2, fg2 = _split_gates(structure, gates2, gates2[0].shape[0], "gates2", dtype)
    idx = _rotation_index(structure.spatial, cg1[0].device)
    return _conv_block(structure, cg1, fg1, cg2, fg2, structure.head == "gap", idx)


def npk_conv_from_gates(
    structure: ConvStructure, x1: Tensor, gates1: Sequence[Tensor], x2: Tensor | None = None,
    gates2: Sequence[Tensor] | None = None, *, chunk_size: int | None = None, dtype: torch.dtype = torch.float64,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """The NPK of a circular convolutional network from its inputs and gates: ``(N1, N2)``.

    Theorem 3.2 / Lemma F.1 of :cite:`lakshminarayanan2022explicitising`, for global average pooling:
    ``NPK(x, x') = sum_r sum_i <x(i), rot(x', r)(i)> overlap(i, x, rot(x', r))`` with ``rot(x', r)(i)
    = x'(i + r)``, the inner product over input channels, and the overlap of :func:`conv_overlap`
    (its pooling factor ``1/d_in^2`` included). With ``head="flatten"`` only ``r = 0`` remains.
    Computed in blocks of pairs whose temporaries fit ``memory_budget`` (``chunk_size`` caps the
    block's side). ``gates*`` come from :func:`conv_gates` (or a gating network, permuted layers, ...).
    """
    if (x2 is None) != (gates2 is None):
        raise ValueError("give x2 together with gates2 (or neither, for the Gram matrix of x1)")
    expected = (structure.in_channels, *structure.spatial)
    for name, x in (("x1", x1), ("x2", x2)):
        if x is not None and tuple(x.shape[1:]) != expected:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, the network takes (N, {', '.join(map(str, expected))})")
    n1 = x1.shape[0]
    cg1, fg1 = _split_gates(structure, gates1, n1, "gates1", dtype)
    if x2 is None:
        x2, cg2, fg2 = x1, cg1, fg1
    else:
        cg2, fg2 = _split_gates(structure, gates2, x2.shape[0], "gates2", dtype)
    n2 = x2.shape[0]
    a1 = x1.to(dtype).reshape(n1, structure.in_channels, -1)
    a2 = x2.to(dtype).reshape(n2, structure.in_channels, -1)
    rotations = structure.head == "gap"
    idx = _rotation_index(structure.spatial, a1.device)
    rr, d = (structure.d_in if rotations else 1), structure.d_in
    widest = max(g.shape[1] for g in cg1 + [a1])
    per_pair = (4 * rr * d + widest * rr * d) * _itemsize(dtype)  # joint counts, recursion, rotated gates
    side = max(1, int(math.isqrt(max(memory_budget // per_pair, 1))))
    if chunk_size is not None:
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        side = min(side, chunk_size)
    _check_budget(per_pair, memory_budget, "one pair of the convolutional NPK",
                  "Raise memory_budget, or use smaller inputs.")
    out = torch.empty(n1, n2, dtype=dtype, device=a1.device)
    for i in range(0, n1, side):
        for j in range(0, n2, side):
            lam = _conv_block(structure, [g[i:i + side] for g in cg1], [g[i:i + side] for g in fg1],
                              [g[j:j + side] for g in cg2], [g[j:j + side] for g in fg2], rotations, idx)
            inner = _pairwise_positions(a1[i:i + side], a2[j:j + side], idx if rotations else None)
            out[i:i + side, j:j + side] = (inner * lam).sum((2, 3))
    return out


def npk_conv(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, *, gating: nn.Module | None = None,
    chunk_size: int | None = None, dtype: torch.dtype = torch.float64, batch_size: int = 500,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """The NPK of a circular convolutional network (or of a DGN of that kind) on data: ``(N1, N2)``.

    ``model`` fixes the paths (checked by :func:`conv_structure`); the gates come from ``gating``
    (same architecture) or from ``model``. See :func:`npk_conv_from_gates`.
    """
    s = conv_structure(model, x1.shape[1:])
    source = model if gating is None else gating
    if gating is not None and conv_structure(gating, x1.shape[1:]).taps != s.taps:
        raise ValueError("the gating network's convolutions differ from the value network's")
    g1 = conv_gates(source, x1, conv_structure(source, x1.shape[1:]), batch_size, dtype)
    g2 = None if x2 is None else conv_gates(source, x2, conv_structure(source, x2.shape[1:]), batch_size, dtype)
    return npk_conv_from_gates(s, x1, g1, x2, g2, chunk_size=chunk_size, dtype=dtype, memory_budget=memory_budget)


def npk_conv_reference(model: nn.Module, x1: Tensor, x2: Tensor | None = None) -> Tensor:
    """The convolutional NPK as the Gram matrix of explicitly enumerated bundle features
    (:func:`dualview.paths.bundle_features_reference`; tiny networks only)."""
    phi1 = bundle_features_reference(model, x1).features
    phi2 = phi1 if x2 is None else bundle_features_reference(model, x2).features
    return phi1 @ phi2.T


def rotate(x: Tensor, r: int | Sequence[int]) -> Tensor:
    """``rot(x, r)(i) = x(i + r)`` (Definition F.1 of :cite:`lakshminarayanan2022explicitising`),
    over the last one (``r`` an int) or last ``len(r)`` dimensions, circularly."""
    rs = (r,) if isinstance(r, int) else tuple(r)
    return torch.roll(x, shifts=tuple(-k for k in rs), dims=tuple(range(-len(rs), 0)))


# ==================================================================================================
# Residual networks: the ensemble sum of Theorem 3.3


def _check_resnet(model: nn.Module) -> None:
    from dualview.models import FCResNet

    if not isinstance(model, FCResNet):
        raise UnsupportedLayerError(
            f"the ensemble-sum NPK (Theorem 3.3) is implemented for dualview.models.FCResNet (fully connected "
            f"residual blocks), got {type(model).__name__}"
        )
    biased = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.bias is not None]
    if biased:
        raise UnsupportedLayerError(f"layers {biased} have biases; Theorem 3.3 is for bias-free networks")


def resnet_gates(model: nn.Module, x: Tensor, dtype: torch.dtype = torch.float64) -> list[list[Tensor]]:
    """The gates of a :class:`dualview.models.FCResNet`, block by block: ``[first, block_1, ..., block_b,
    last]``, each a list of ``(N, w)`` 0/1 tensors (one per ReLU)."""
    _check_resnet(model)
    with torch.no_grad():
        g = record_gates(model, x.to(next(model.parameters()).dtype)).gates
    groups = ["first."] + [f"blocks.{j}." for j in range(model.b)] + ["last."]
    return [[g[n].to(dtype) for n in g if n.startswith(p)] for p in groups]


def _block_kernels(blocks1, blocks2, n1: int, n2: int, dtype, device) -> list[Tensor]:
    """For each block, the product of its layers' base kernels ``prod_l <G_l(x), G_l(x')>`` (1 if it has no ReLU)."""
    out = []
    for b1, b2 in zip(blocks1, blocks2):
        k = torch.ones(n1, n2, dtype=dtype, device=device)
        for a, b in zip(b1, b2):
            k = k * (a.to(dtype) @ b.to(dtype).T)
        out.append(k)
    return out


def npk_resnet(model: nn.Module, x1: Tensor, x2: Tensor | None = None, *, dtype: torch.dtype = torch.float64
               ) -> Tensor:
    """The NPK of a fully connected ResNet (:class:`dualview.models.FCResNet`): ``(N1, N2)``.

    Theorem 3.3 of :cite:`lakshminarayanan2022explicitising`: the sum over the ``2^b`` sub-networks,
    ``NPK = sum_J NPK_J``. For fully connected blocks the sum factorises,
    ``NPK(x, x') = <x, x'> F(x, x') (prod_j (1 + B_j(x, x'))) L(x, x')``, with ``F``, ``B_j`` and ``L``
    the products of the base kernels ``<G_l(x), G_l(x')>`` over the layers of the first block, of
    residual block ``j`` and of the last block: ``O(b)`` work instead of ``O(2^b)``.
    """
    g1 = resnet_gates(model, x1, dtype)
    g2 = g1 if x2 is None else resnet_gates(model, x2, dtype)
    a1 = x1.flatten(1).to(dtype)
    a2 = a1 if x2 is None else x2.flatten(1).to(dtype)
    ks = _block_kernels(g1, g2, a1.shape[0], a2.shape[0], dtype, a1.device)
    out = (a1 @ a2.T) * ks[0] * ks[-1]
    for k in ks[1:-1]:
        out = out * (1 + k)
    return out


def npk_resnet_subnetwork(model: nn.Module, x1: Tensor, x2: Tensor | None = None, subset: Sequence[int] = (),
                          *, dtype: torch.dtype = torch.float64) -> Tensor:
    """``NPK_J``: the NPK of the sub-network through the residual blocks ``subset`` (0-based), with the
    ResNet's own gates (one term of Theorem 3.3); the product form of :func:`npk_from_gates`."""
    model.subnetwork(subset)  # checks the block indices
    g1 = resnet_gates(model, x1, dtype)
    g2 = g1 if x2 is None else resnet_gates(model, x2, dtype)
    keep = [0, *(j + 1 for j in sorted(set(subset))), len(g1) - 1]
    flat1 = [g for k in keep for g in g1[k]]
    flat2 = [g for k in keep for g in g2[k]]
    return npk_from_gates(x1, flat1, None if x2 is None else x2, None if x2 is None else flat2, dtype=dtype)


def resnet_path_features_reference(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """The NPF and NPV of a :class:`dualview.models.FCResNet` by explicit enumeration: the concatenation,
    over the ``2^b`` sub-networks ``J``, of their path features (with the ResNet's gates) and values
    (Appendix G of :cite:`lakshminarayanan2022explicitising`). Returns ``(phi (N, P), v (P, C))`` with
    ``model(x) = phi @ v``. Tiny networks only.
    """
    g = resnet_gates(model, x, torch.float64)
    feats, values = [], []
    for size in range(model.b + 1):
        for subset in itertools.combinations(range(model.b), size):
            gates = [t for k in [0, *(j + 1 for j in subset), len(g) - 1] for t in g[k]]
            feats.append(neural_path_features_from_gates_reference(x.double(), gates))
            layers = model.subnetwork(subset)
            chain = nn.Sequential(*[m for lin in layers for m in (lin, nn.ReLU())][:-1])
            values.append(neural_path_values(chain))
    return torch.cat(feats, 1), torch.cat(values, 0)


def npk_resnet_reference(model: nn.Module, x1: Tensor, x2: Tensor | None = None) -> Tensor:
    """The ResNet's NPK as the Gram matrix of the explicitly concatenated sub-network NPFs (Lemma G.1)."""
    phi1 = resnet_path_features_reference(model, x1)[0]
    phi2 = phi1 if x2 is None else resnet_path_features_reference(model, x2)[0]
    return phi1 @ phi2.T
