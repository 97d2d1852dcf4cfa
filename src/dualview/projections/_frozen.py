"""Plumbing shared by :func:`~dualview.projections.insens`, :func:`~dualview.projections.insens_estimate` and
the switched projections (private to :mod:`dualview.projections`): the network with an input's gates frozen,
as one affine map of the input, and Eq. 8's coefficients on its hidden neurons."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from dualview.gates import GateRecord, run_with_gates


def check_input(model: nn.Module, x: Tensor) -> None:
    """A model and a non-empty floating-point batch ``(N, ...)``, or an error that says what to pass."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"expected a floating-point tensor input, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 2 or x.shape[0] == 0:
        raise ValueError(
            f"expected a non-empty batch (N, ...) of inputs, got shape {tuple(x.shape)}; "
            "use x.unsqueeze(0) for a single input"
        )


def frozen_preactivations(
    model: nn.Module, z: Tensor, gates: dict[str, Tensor], pool_indices: dict[str, Tensor],
    saturated: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Pre-activations of every ReLU call when ``model`` runs on ``z`` with the given gates frozen.

    This is the active sub-network (:func:`dualview.gates.run_with_gates`) read at every hidden
    layer: an affine function of ``z`` for fixed gates; at ``z = x`` with ``x``'s own gates it
    equals ``record_gates(model, x).preactivations``. Names follow :func:`dualview.gates.record_gates`.
    ``saturated``: the saturated pieces of hard-clipped ReLUs (``record_gates(model, x).saturated``).
    """
    captured: dict[str, Tensor] = {}
    run_with_gates(model, z, gates, pool_indices, preactivations=captured, saturated=saturated)
    return captured


def frozen_network(model: nn.Module, rec: GateRecord, names: list[str]) -> Callable[[Tensor], Tensor]:
    """``z -> q(z)``, ``(N, U)``: the pre-activations of the ReLU calls ``names`` (flattened, concatenated in
    that order) when ``model`` runs on ``z`` with the gates, max-pool winners and saturated pieces of ``rec``
    frozen; an affine map of ``z`` (Theorem 1), whose Jacobian rows are the switched weights ``w_i``."""
    def frozen(z: Tensor) -> Tensor:
        q = frozen_preactivations(model, z, rec.gates, rec.pool_indices, rec.saturated)
        return torch.cat([q[name].flatten(1) for name in names], 1)

    return frozen


@dataclass
class InactiveCoefficients:
    """Eq. 8 as a cotangent: ``Omega = J^T coef`` with ``coef_i = q_i / |w_i|^2 / |I|`` on the inactive
    neurons ``I`` (``q_i <= 0``, ``w_i != 0``) and 0 elsewhere. ``coef``: ``(..., N, U)`` (one map per set of
    norms); ``n_inactive``, ``n_cut_off`` (``q_i <= 0`` and ``w_i = 0``): ``(N,)``."""

    coef: Tensor
    n_inactive: Tensor
    n_cut_off: Tensor


def inactive_coefficients(q: Tensor, sq_norm: Tensor, norms: Tensor | None = None) -> InactiveCoefficients:
    """Eq. 8's coefficients for pre-activations ``q`` and squared switched-weight norms ``sq_norm``, both
    ``(N, U)``. Which neurons are inactive or cut off is decided by ``sq_norm``; the division is by ``norms``
    (default ``sq_norm``; ``(..., N, U)``: :func:`insens_estimate` passes its leave-one-group-out norms too)."""
    tiny = torch.finfo(sq_norm.dtype).tiny
    off = q <= 0
    inactive, cut = off & (sq_norm > tiny), off & (sq_norm <= tiny)
    n_inactive = inactive.sum(1)
    denom = n_inactive.clamp_min(1).to(q.dtype)[:, None]
    norms = sq_norm if norms is None else norms
    coef = torch.where(inactive, q / norms.clamp_min(tiny), torch.zeros_like(q)) / denom
    return InactiveCoefficients(coef=coef, n_inactive=n_inactive, n_cut_off=cut.sum(1))
