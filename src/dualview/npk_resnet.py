"""The NPK of fully connected residual networks: the ensemble sum over sub-networks.

A residual network with ``b`` skippable blocks is an ensemble of ``2^b`` sub-networks, and its NPK is
the sum of their NPKs (Theorem 3.3 and Lemma G.1 of :cite:`lakshminarayanan2022explicitising`):
:func:`npk_resnet` (and :func:`npk_resnet_subnetwork` for one sub-network) from the block gates of
:func:`resnet_gates`, against :func:`npk_resnet_reference`, the Gram matrix of explicitly concatenated
path features.
"""
from __future__ import annotations

import itertools
from typing import Sequence

import torch
from torch import Tensor, nn

from dualview.gates import UnsupportedLayerError, record_gates
from dualview.nets import FCResNet
from dualview.npk_fc import neural_path_features_from_gates_reference, npk_from_gates
from dualview.paths import neural_path_values

__all__ = [
    "block_subsets",
    "resnet_gates",
    "npk_resnet",
    "npk_resnet_subnetwork",
    "resnet_path_features_reference",
    "npk_resnet_reference",
]

# ==================================================================================================
# Residual networks: the ensemble sum of Theorem 3.3


def _check_resnet(model: nn.Module) -> None:

    if not isinstance(model, FCResNet):
        raise UnsupportedLayerError(
            f"the ensemble-sum NPK (Theorem 3.3) is implemented for dualview.nets.FCResNet (fully connected "
            f"residual blocks), got {type(model).__name__}"
        )
    biased = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.bias is not None]
    if biased:
        raise UnsupportedLayerError(f"layers {biased} have biases; Theorem 3.3 is for bias-free networks")


def block_subsets(b: int) -> list[tuple[int, ...]]:
    """The ``2^b`` sets ``J`` of residual blocks (0-based) a path can enter, by size, then in order: the
    sub-networks whose NPKs the ensemble sum of Theorem 3.3 of :cite:`lakshminarayanan2022explicitising`
    adds (``subset`` of :func:`npk_resnet_subnetwork`)."""
    if isinstance(b, bool) or not isinstance(b, int) or b < 0:
        raise ValueError(f"b, the number of residual blocks, must be an int >= 0, got {b!r}")
    return [subset for size in range(b + 1) for subset in itertools.combinations(range(b), size)]


def resnet_gates(model: nn.Module, x: Tensor, dtype: torch.dtype = torch.float64) -> list[list[Tensor]]:
    """The gates of a :class:`dualview.nets.FCResNet`, block by block: ``[first, block_1, ..., block_b,
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
    """The NPK of a fully connected ResNet (:class:`dualview.nets.FCResNet`): ``(N1, N2)``.

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
    ResNet's own gates (one term of Theorem 3.3); the product form of :func:`~dualview.npk_fc.npk_from_gates`."""
    model.subnetwork(subset)  # checks the block indices
    g1 = resnet_gates(model, x1, dtype)
    g2 = g1 if x2 is None else resnet_gates(model, x2, dtype)
    keep = [0, *(j + 1 for j in sorted(set(subset))), len(g1) - 1]
    flat1 = [g for k in keep for g in g1[k]]
    flat2 = [g for k in keep for g in g2[k]]
    return npk_from_gates(x1, flat1, None if x2 is None else x2, None if x2 is None else flat2, dtype=dtype)


def resnet_path_features_reference(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """The NPF and NPV of a :class:`dualview.nets.FCResNet` by explicit enumeration: the concatenation,
    over the ``2^b`` sub-networks ``J``, of their path features (with the ResNet's gates) and values
    (Appendix G of :cite:`lakshminarayanan2022explicitising`). Returns ``(phi (N, P), v (P, C))`` with
    ``model(x) = phi @ v``. Tiny networks only.
    """
    g = resnet_gates(model, x, torch.float64)
    feats, values = [], []
    for subset in block_subsets(model.b):
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
