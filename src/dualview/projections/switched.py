"""Part of :mod:`dualview.projections` (see its docstring)."""
from __future__ import annotations

import math
from dataclasses import dataclass
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm
from dualview import receptive_fields
from dualview.gates import check_reproduces as _self_check, full_precision, record_gates
from dualview.projections._frozen import (
    check_input as _check, frozen_network, frozen_preactivations, inactive_coefficients,
)


# --------------------------------------------------------------------------------------------------
# Results


@dataclass
class SwitchedProjections:
    """Switched weights and biases of the hidden neurons of a network, for a batch of inputs.

    Neurons of all selected layers are concatenated along dimension 1 in forward order;
    ``slices[name]`` gives each layer's range and ``shapes[name]`` its unit shape (e.g. ``(C, H, W)``).
    Shapes: ``x (N, d)``, ``preactivation (N, U)``, ``weight (N, U, d)``, ``bias (N, U)``, with
    ``d`` the number of input coordinates; ``input_shape`` restores an image.
    """

    x: Tensor
    preactivation: Tensor
    weight: Tensor
    bias: Tensor
    slices: dict[str, slice]
    shapes: dict[str, tuple[int, ...]]
    input_shape: tuple[int, ...]

    @property
    def names(self) -> list[str]:
        return list(self.slices)

    @property
    def sq_norm(self) -> Tensor:
        """``|w_i|^2`` per input and neuron, ``(N, U)``."""
        return self.weight.square().sum(-1)

    @property
    def cut_off(self) -> Tensor:
        """Neurons with ``w_i = 0`` (no active path to the input), ``(N, U)`` bool."""
        return self.sq_norm <= torch.finfo(self.weight.dtype).tiny

    @property
    def active(self) -> Tensor:
        """Gates: ``q_i > 0``, ``(N, U)`` bool."""
        return self.preactivation > 0

    def omega(self) -> Tensor:
        """Per-neuron sensitivity ``omega_i = x - c_i = q_i w_i / |w_i|^2`` (Eq. 7), zero if cut off."""
        coef = self.preactivation / self.sq_norm
        coef = torch.where(self.cut_off, torch.zeros_like(coef), coef)
        return coef.unsqueeze(-1) * self.weight

    def centre(self) -> Tensor:
        """Switched centres ``c_i = x - q_i w_i / |w_i|^2`` (Eq. 6), ``(N, U, d)``; NaN if cut off."""
        c = self.x.unsqueeze(1) - self.omega()
        return c.masked_fill(self.cut_off.unsqueeze(-1), math.nan)

    def decomposition(self) -> Tensor:
        """Contributions ``(x_j - c_ij) w_ij`` of every input coordinate (Eq. 5), ``(N, U, d)``.

        They sum over ``j`` to ``q_i`` for every neuron that is not cut off (zeros for those).
        """
        return self.omega() * self.weight

    def layer(self, name: str, tensor: Tensor) -> Tensor:
        """The part of a per-neuron tensor (``(N, U, ...)``) for layer ``name``, in its unit shape."""
        if name not in self.slices:
            raise KeyError(f"no layer {name!r}; layers: {self.names}")
        part = tensor[:, self.slices[name]]
        return part.reshape(part.shape[0], *self.shapes[name], *part.shape[2:])


@dataclass
class InsensResult:
    """Insens maps and the counts behind them.

    ``omega``: ``(N, *input_shape)`` (Eq. 8); ``n_inactive``: inactive, not cut-off neurons averaged
    per input, ``(N,)``; ``n_cut_off``: inactive neurons left out because ``w_i = 0``; ``n_hidden``:
    hidden neurons per input.
    """

    omega: Tensor
    n_inactive: Tensor
    n_cut_off: Tensor
    n_hidden: int


# --------------------------------------------------------------------------------------------------
# The frozen network's Jacobian


def _select(names: list[str], layers: list[str] | None) -> list[str]:
    if layers is None:
        return names
    unknown = [n for n in layers if n not in names]
    if unknown:
        raise KeyError(f"unknown layer(s) {unknown}; the ReLU calls of this model are {names}")
    return [n for n in names if n in layers]


def _jacobian_chunks(model, x, rec, names, chunk_size):
    """Yield ``(coordinates, {layer: (k, N, U_l) Jacobian columns})`` for chunks of ``k`` input
    coordinates, all inputs at once: ``vmap`` of a forward-mode ``jvp`` of the frozen network at
    input 0 over the input basis vectors (the primal pass runs once per chunk, not once per vector)."""
    n, d = x.shape[0], x[0].numel()
    k = max(1, chunk_size // n)
    zero = torch.zeros_like(x)
    frozen = frozen_network(model, rec, names)
    sizes = [rec.preactivations[name][0].numel() for name in names]

    def column(tangent):
        return receptive_fields.jvp(frozen, zero, tangent)

    for coord in torch.arange(d, device=x.device).split(k):
        basis = torch.zeros(len(coord), d, dtype=x.dtype, device=x.device)
        basis[torch.arange(len(coord), device=x.device), coord] = 1
        tangents = basis[:, None, :].expand(len(coord), n, d).reshape(len(coord), *x.shape)
        cols = torch.func.vmap(column)(tangents)  # (k, N, U)
        yield coord, dict(zip(names, cols.split(sizes, -1)))


def _default_chunk(x: Tensor) -> int:
    """(input, coordinate) pairs per pass: 1024 (all 784 pixels of one MNIST digit at once)."""
    return 1024


@full_precision()
def switched_projections(
    model: nn.Module, x: Tensor, layers: list[str] | None = None, chunk_size: int | None = None
) -> SwitchedProjections:
    """Switched weights ``w = dq/dx`` and biases ``b`` of every hidden neuron (Theorem 1), all at once.

    ``layers`` restricts the result to some ReLU calls (names as in :func:`dualview.gates.record_gates`);
    ``chunk_size`` bounds how many (input, coordinate) pairs one forward-mode pass carries (memory
    grows with it). The result holds ``N * U * d`` numbers: select layers for big networks.
    """
    _check(model, x)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size}")
    with torch.no_grad():
        rec = record_gates(model, x)
    names = _select(rec.names, layers)
    if not names:
        raise ValueError("the model has no ReLU, so it has no hidden neurons to project")
    n, d = x.shape[0], x[0].numel()
    q = {k: rec.preactivations[k].flatten(1) for k in names}
    sizes = [q[k].shape[1] for k in names]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    slices = {k: slice(s, s + u) for k, s, u in zip(names, starts, sizes)}
    weight = x.new_zeros(n, sum(sizes), d)
    with torch.no_grad():
        for coord, cols in _jacobian_chunks(model, x, rec, names, chunk_size or _default_chunk(x)):
            weight[:, :, coord] = torch.cat([cols[k] for k in names], 2).permute(1, 2, 0)
        # the switched bias is the frozen network at input 0: one plain forward pass
        q0 = frozen_preactivations(model, torch.zeros_like(x), rec.gates, rec.pool_indices, rec.saturated)
    bias = torch.cat([q0[k].flatten(1) for k in names], 1)
    preactivation = torch.cat([q[k] for k in names], 1)
    _self_check("the switched linear model", weight * x.detach().flatten(1)[:, None], bias, preactivation)
    return SwitchedProjections(
        x=x.detach().flatten(1), preactivation=preactivation, weight=weight, bias=bias,
        slices=slices, shapes={k: tuple(rec.preactivations[k].shape[1:]) for k in names},
        input_shape=tuple(x.shape[1:]),
    )


def switched_projections_reference(
    model: nn.Module, x: Tensor, layers: list[str] | None = None
) -> SwitchedProjections:
    """Slow reference: one autograd backward per input and neuron through the real network.

    ``w_i = dq_i/dx`` from :func:`dualview.gates.record_gates` and ``b_i = q_i - <x, w_i>`` (Theorem 1, Eq. 2).
    """
    _check(model, x)
    xg = x.detach().clone().requires_grad_(True)
    rec = record_gates(model, xg)
    names = _select(rec.names, layers)
    q = torch.cat([rec.preactivations[k].flatten(1) for k in names], 1)
    n, u = q.shape
    weight = x.new_zeros(n, u, x[0].numel())
    for s in range(n):
        for i in range(u):
            (g,) = torch.autograd.grad(q[s, i], xg, retain_graph=True, allow_unused=True)
            if g is not None:
                weight[s, i] = g[s].flatten()
    q = q.detach()
    bias = q - torch.einsum("nud,nd->nu", weight, x.detach().flatten(1))
    sizes = [rec.preactivations[k][0].numel() for k in names]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return SwitchedProjections(
        x=x.detach().flatten(1), preactivation=q, weight=weight, bias=bias,
        slices={k: slice(s, s + m) for k, s, m in zip(names, starts, sizes)},
        shapes={k: tuple(rec.preactivations[k].shape[1:]) for k in names}, input_shape=tuple(x.shape[1:]),
    )


# --------------------------------------------------------------------------------------------------
# Insens


@full_precision()
def insens(model: nn.Module, x: Tensor, chunk_size: int | None = None, structure: bool = True,
           progress: bool = False) -> InsensResult:
    """Inactive state sensitivity ``Omega(x) = mean_{i: q_i <= 0} q_i w_i / |w_i|^2`` (Eq. 7-8).

    Two passes, never holding more than about ``chunk_size`` columns of the Jacobian (one number per
    hidden neuron and input each): forward mode through the frozen network accumulates ``|w_i|^2`` for
    every hidden neuron; then one backward
    pass computes ``Omega = J^T a`` with ``a_i = q_i / |w_i|^2 / |I|`` on the inactive neurons ``I``
    (``w_i = 0`` neurons are left out, see the module docstring). Vectorised over the batch.

    With ``structure=True`` (the default), a plain ``Sequential`` conv net (convolutions, pools and
    point-wise layers, then ``Flatten`` and a Linear/ReLU tail) takes the receptive-field fast path:
    each spatial neuron's switched weight is built on its receptive field only, layer by layer (see
    :mod:`dualview.receptive_fields`), and the tail's from the flattened units' ones. Other models, or ``structure=False``,
    take the generic forward-mode sweep over all input coordinates; both give the same result.
    ``progress=True`` shows a progress bar over the chunks (tqdm).
    """
    _check(model, x)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size}")
    x = x.detach()
    with torch.no_grad():
        rec = record_gates(model, x)
    names = rec.names
    if not names:
        raise ValueError("the model has no ReLU, so it has no hidden neurons to take Insens over")
    n = x.shape[0]
    plan = receptive_fields.conv_plan(model, x, names) if structure else None
    with torch.no_grad():
        if plan is not None:  # as many inputs per chunk as hold about chunk_size Jacobian columns
            n_hidden = sum(rec.preactivations[k][0].numel() for k in names)
            budget = chunk_size * n_hidden if chunk_size else 1 << 22  # default: a few cache-sized images
            count = -(-n // max(1, budget // plan.volume))  # chunks, of sizes as equal as can be
            bounds = [n * k // count for k in range(count + 1)]  # (32 inputs by <= 6: 5, 5, 6, 5, 5, 6)
            parts = [receptive_fields.sq_norms(x[i:j], {k: g[i:j] for k, g in rec.gates.items()},
                                               {k: p[i:j] for k, p in rec.pool_indices.items()}, plan)
                     for i, j in tqdm(list(zip(bounds, bounds[1:])), desc="Insens", disable=not progress)]
            sq = {k: torch.cat([part[k] for part in parts]) for k in names}
        else:
            sq = {k: x.new_zeros(n, rec.preactivations[k][0].numel()) for k in names}
            size = chunk_size or _default_chunk(x)
            sweep = _jacobian_chunks(model, x, rec, names, size)
            total = -(-x[0].numel() // max(1, size // n))
            for _, cols in tqdm(sweep, total=total, desc="Insens", disable=not progress):
                for k in names:
                    sq[k] += cols[k].square().sum(0)
    q = torch.cat([rec.preactivations[k].flatten(1) for k in names], 1)
    a = inactive_coefficients(q, torch.cat([sq[k] for k in names], 1))
    frozen = frozen_network(model, rec, names)
    z = x.clone().requires_grad_(True)
    with torch.enable_grad():
        (omega,) = torch.autograd.grad((frozen(z) * a.coef).sum(), z)
    # self-check: the frozen network is affine and is the network at x, so sum_i a_i q_i(x) equals
    # sum_i a_i b_i + <Omega, x> (b_i: the frozen network at 0); one more forward pass
    with torch.no_grad():
        bias = (frozen(torch.zeros_like(x)) * a.coef).sum(1)
        own = (q * a.coef).sum(1)
    _self_check("Insens", (omega * x).flatten(1), bias, own)
    return InsensResult(omega=omega, n_inactive=a.n_inactive.cpu(), n_cut_off=a.n_cut_off.cpu(), n_hidden=q.shape[1])


def insens_reference(model: nn.Module, x: Tensor) -> InsensResult:
    """Slow reference: Eq. 7-8 written out, looping over inputs and inactive neurons of
    :func:`switched_projections_reference`."""
    p = switched_projections_reference(model, x)
    n, u = p.preactivation.shape
    omega = torch.zeros_like(p.x)
    n_inactive = torch.zeros(n, dtype=torch.long)
    n_cut = torch.zeros(n, dtype=torch.long)
    for s in range(n):
        for i in range(u):
            q, w = p.preactivation[s, i], p.weight[s, i]
            if q > 0:
                continue
            if float(w @ w) <= torch.finfo(w.dtype).tiny:
                n_cut[s] += 1
                continue
            omega[s] += q * w / (w @ w)
            n_inactive[s] += 1
        omega[s] /= max(int(n_inactive[s]), 1)
    return InsensResult(omega.view(n, *p.input_shape), n_inactive, n_cut, u)



