"""Switched linear projections and inactive state sensitivity (Insens).

For an input ``x``, freeze every gate of a ReLU network (and every max-pool winner) at its value for
``x``. What remains is the *active sub-network*, an affine map, so every hidden neuron ``i`` computes

    q_i(x) = <x, w_i> + b_i                                   (Theorem 1 / Eq. 2 of the paper)

with the *switched weight* ``w_i = dq_i/dx`` and the *switched bias* ``b_i`` (written ŵ, b̂ in the
book; the paper calls the pre-activation ``q`` the neuron's *activity* ``v``)
:cite:`szymanski2020switched`. From them:

* the *switched centre* ``c_i = x - q_i w_i / |w_i|^2`` (Eq. 6), the point of the neuron's
  switching hyperplane nearest to ``x``;
* the *decomposition* ``q_i = sum_j (x_j - c_ij) w_ij`` (Eq. 4-5);
* the *inactive state sensitivity* ``Omega(x) = mean_{i inactive} q_i w_i / |w_i|^2`` (Eq. 7-8),
  averaged over the hidden neurons with ``q_i <= 0``.

Computation. The switched bias is the frozen network's pre-activation at input 0, and the
switched weights are its Jacobian: one forward-mode (dual-number) pass through the frozen network
(:func:`dualview.gates.run_with_gates`) per chunk of input basis vectors gives, for every hidden
neuron at once, one input coordinate of its switched weight. :func:`insens` needs only the squared
norms ``|w_i|^2`` (accumulated chunk by chunk, never holding more than one chunk of the Jacobian) and
then one reverse-mode pass, since ``Omega = J^T a`` with ``a_i = q_i / |w_i|^2 / |I|`` on inactive
neurons. ``*_reference`` functions do the same with one autograd backward per neuron.

Neurons. The hidden neurons are the units of every ReLU call, in the order
:func:`dualview.gates.record_gates` names them. A max-pool output is a copy of its window's winner,
not a neuron of its own, so it is never counted twice; this is the paper's exclusion of max-pool
winners from Eq. 8. Output units (no ReLU) are not hidden neurons.

Cut-off neurons. A neuron whose every path to the input is switched off has ``w_i = 0``: its
pre-activation is the constant ``b_i`` near ``x``, it has no centre and no sensitivity. We mark it
(``cut_off``), give it a NaN centre and a zero ``omega``, and leave it out of the Insens average
(``InsensResult.n_cut_off`` counts them). Its decomposition is all zeros, so Eq. 5 holds for it only
when ``q_i = 0``.

Limitation: an in-place ``nn.ReLU(inplace=True)`` whose *input* tensor is read again later in
``forward`` (e.g. ``self.relu(x) + x``) changes that tensor inside the frozen network too, with the
gates of the frozen pass rather than ``x``'s; such models give wrong switched weights. In-place
ReLUs whose input is not reused (the usual ``out = self.relu(out)``) are fine.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dualview.gates import record_gates, run_with_gates

__all__ = [
    "SwitchedProjections",
    "InsensResult",
    "frozen_preactivations",
    "switched_projections",
    "switched_projections_reference",
    "insens",
    "insens_reference",
    "active_neuron_share",
]


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

    @property
    def active_share(self) -> Tensor:
        """Share of hidden neurons with ``q > 0`` per input, ``(N,)``."""
        return 1 - (self.n_inactive + self.n_cut_off).double() / self.n_hidden


# --------------------------------------------------------------------------------------------------
# The frozen network and its pre-activations


def _check(model: nn.Module, x: Tensor) -> None:
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
    model: nn.Module, z: Tensor, gates: dict[str, Tensor], pool_indices: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Pre-activations of every ReLU call when ``model`` runs on ``z`` with the given gates frozen.

    This is the active sub-network (:func:`dualview.gates.run_with_gates`) read at every hidden
    layer: an affine function of ``z`` for fixed gates; at ``z = x`` with ``x``'s own gates it
    equals ``record_gates(model, x).preactivations``. Names follow :func:`dualview.gates.record_gates`.
    """
    captured: dict[str, Tensor] = {}
    calls: Counter[str] = Counter()
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ReLU):
            label = name or "<model>"

            def pre(mod, args, label=label):
                k = calls[label]
                calls[label] += 1
                q = args[0]
                captured[label if k == 0 else f"{label}#{k}"] = q.clone() if mod.inplace else q

            handles.append(module.register_forward_pre_hook(pre))
    try:
        run_with_gates(model, z, gates, pool_indices)
    finally:
        for h in handles:
            h.remove()
    return captured


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

    def frozen(z):
        q = frozen_preactivations(model, z, rec.gates, rec.pool_indices)
        return tuple(q[name].flatten(1) for name in names)

    def column(tangent):
        return torch.func.jvp(frozen, (zero,), (tangent,))[1]

    for coord in torch.arange(d, device=x.device).split(k):
        basis = torch.zeros(len(coord), d, dtype=x.dtype, device=x.device)
        basis[torch.arange(len(coord), device=x.device), coord] = 1
        tangents = basis[:, None, :].expand(len(coord), n, d).reshape(len(coord), *x.shape)
        cols = torch.func.vmap(column)(tangents)
        yield coord, dict(zip(names, cols))


def _default_chunk(x: Tensor) -> int:
    """(input, coordinate) pairs per pass: 1024 (all 784 pixels of one MNIST digit at once)."""
    return 1024


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
        q0 = frozen_preactivations(model, torch.zeros_like(x), rec.gates, rec.pool_indices)
    bias = torch.cat([q0[k].flatten(1) for k in names], 1)
    return SwitchedProjections(
        x=x.detach().flatten(1), preactivation=torch.cat([q[k] for k in names], 1), weight=weight, bias=bias,
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
# The structured fast path of Insens: receptive fields compress the Jacobian of convolutional layers


@dataclass
class _ConvPlan:
    """How :func:`insens` takes ``|w_i|^2`` of a plain conv net: ``Sequential(spatial part, Flatten, tail)``.

    A neuron of the spatial part (convolutions, pools, point-wise maps) depends only on the input pixels of
    its receptive field, at most ``period`` pixels apart in each direction. Input pixels whose coordinates
    agree modulo ``period`` (and share a channel) never meet in one receptive field, so one forward-mode
    direction can carry all of them at once (Jacobian compression by colouring the columns, as in sparse
    automatic differentiation): ``C * period_h * period_w`` directions instead of ``C * H * W``, and each
    neuron reads its own Jacobian entries off them exactly. The tail after ``Flatten`` (Linear, ReLU)
    mixes all pixels: its switched weights come from the flattened layer's Jacobian, re-assembled from the
    compressed one (``pixel`` maps each flattened unit and direction to its input pixel), times the tail's
    weights and gates.
    """

    directions: Tensor            # (K, C*H*W) 0/1 rows: the colour classes of the input coordinates
    pixel: Tensor                 # (P, K) input coordinate of each flattened position per direction, or d
    channels: int                 # channels of the flattened layer (its units are channels x P positions)
    spatial: list[tuple[str, nn.Module]]       # (name, module) before the Flatten, in order
    tail: list[tuple[str | None, nn.Module]]   # (site name or None, module) after the Flatten, in order


_POINTWISE = (nn.ReLU, nn.BatchNorm2d, nn.Dropout, nn.Identity)
_WINDOWED = (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv_plan(model: nn.Module, x: Tensor, names: list[str]) -> _ConvPlan | None:
    """The fast path's plan for ``model`` on inputs shaped like ``x``, or ``None`` where its structure is
    not a plain ``Sequential`` conv net (then :func:`insens` uses the generic forward-mode sweep)."""
    if x.dim() != 4:
        return None
    leaves: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        children = list(module.children())
        if children:
            if type(module) is not nn.Sequential:
                return None  # a custom forward may reorder, reuse or add: only plain Sequential trees
            continue
        leaves.append((name, module))
    flat_at = [k for k, (_, m) in enumerate(leaves) if isinstance(m, nn.Flatten)]
    if len(flat_at) != 1 or len({id(m) for _, m in leaves}) != len(leaves):
        return None
    spatial, flatten, tail = leaves[:flat_at[0]], leaves[flat_at[0]][1], leaves[flat_at[0] + 1:]
    if flatten.start_dim != 1 or flatten.end_dim != -1:
        return None
    # receptive field (size, jump, start) per spatial direction, through the spatial part
    size, jump, start = [1, 1], [1, 1], [0, 0]
    for _, m in spatial:
        if isinstance(m, _WINDOWED):
            if getattr(m, "ceil_mode", False) or (isinstance(m, nn.Conv2d) and m.padding_mode != "zeros"):
                return None  # ceil mode and circular padding move fields across the border
            if isinstance(m, nn.Conv2d) and isinstance(m.padding, str):
                return None
            k, s, p = _pair(m.kernel_size), _pair(m.stride or m.kernel_size), _pair(m.padding)
            dil = _pair(getattr(m, "dilation", 1))
            for a in range(2):
                size[a] += (k[a] - 1) * dil[a] * jump[a]
                start[a] -= p[a] * jump[a]
                jump[a] *= s[a]
        elif not (isinstance(m, _POINTWISE) or getattr(type(m), "pointwise", False)):
            return None
    if any(not isinstance(m, (nn.Linear, nn.ReLU, nn.Dropout, nn.Identity)) for _, m in tail):
        return None
    relu_names = [n for n, m in spatial + tail if isinstance(m, nn.ReLU)]
    if relu_names != names:
        return None  # every ReLU module is one site, named by its path (record_gates' names)
    tail_names = [n for n, m in tail if isinstance(m, nn.ReLU)]
    c, h, w = x.shape[1:]
    period = (min(size[0], h), min(size[1], w))
    n_dir = c * period[0] * period[1]
    if n_dir >= c * h * w:
        return None  # no compression to gain
    # the flattened layer's shape, from one forward pass of a single input through the spatial part
    with torch.no_grad():
        z = x[:1]
        for _, m in spatial:
            z = m(z)
    fc, fh, fw = z.shape[1:]
    dev = x.device
    # direction of input coordinate (ch, r, s): (ch, r mod P_h, s mod P_w)
    ch, r, s = torch.meshgrid(torch.arange(c, device=dev), torch.arange(h, device=dev),
                              torch.arange(w, device=dev), indexing="ij")
    colour = (ch * period[0] + r % period[0]) * period[1] + s % period[1]
    directions = torch.zeros(n_dir, c * h * w, dtype=x.dtype, device=dev)
    directions[colour.flatten(), torch.arange(c * h * w, device=dev)] = 1
    # pixel of colour (ch, a, b) in the field of flattened unit (f, y, x): the unique r in [lo, lo + P)
    # with r = a mod P, kept if it lies inside the image
    def rows(a_len, out_len, axis, limit):
        lo = start[axis] + jump[axis] * torch.arange(out_len, device=dev)[:, None]  # field start (unclipped)
        first = lo.clamp_min(0)  # field and image meet in [first, min(lo + size, limit)), at most a_len long
        a = torch.arange(a_len, device=dev)[None, :]
        pos = first + (a - first) % a_len
        return pos, pos < torch.clamp(lo + size[axis], max=limit)
    pr, okr = rows(period[0], fh, 0, h)   # (fh, P_h)
    ps, oks = rows(period[1], fw, 1, w)   # (fw, P_w)
    coord = (torch.arange(c, device=dev)[None, None, :, None, None] * h
             + pr[:, None, None, :, None]) * w + ps[None, :, None, None, :]        # (fh, fw, C, P_h, P_w)
    ok = okr[:, None, None, :, None] & oks[None, :, None, None, :]
    coord = torch.where(ok, coord, torch.full_like(coord, c * h * w)).reshape(fh * fw, n_dir)
    sites = iter(tail_names)
    return _ConvPlan(directions, coord, fc, spatial,
                     [(next(sites) if isinstance(m, nn.ReLU) else None, m) for _, m in tail])


def _sq_norms_conv(model: nn.Module, x: Tensor, rec, names: list[str], plan: _ConvPlan,
                   chunk_size: int) -> dict[str, Tensor]:
    """``|w_i|^2`` of every hidden neuron through the plan: compressed forward mode for the spatial part,
    the re-assembled dense Jacobian of the flattened layer times the tail for the rest."""
    n, d = x.shape[0], x[0].numel()
    sq = {k: x.new_zeros(n, rec.preactivations[k][0].numel()) for k in names}
    flat_cols = []
    k = max(1, chunk_size // n)
    gates = {name: rec.gates[name].to(x.dtype) for name, m in plan.spatial if isinstance(m, nn.ReLU)}
    for rows in torch.arange(plan.directions.shape[0], device=x.device).split(k):
        # the frozen network's linear part, layer by layer, on the directions; until the first gate or
        # max-pool the tangents are the same for every input, so they run once, not once per input
        t, shared = plan.directions[rows].to(x.dtype).reshape(len(rows), *x.shape[1:]), True
        for name, m in plan.spatial:
            if isinstance(m, nn.Conv2d):
                t = F.conv2d(t, m.weight.to(t.dtype), None, m.stride, m.padding, m.dilation, m.groups)
            elif isinstance(m, nn.ReLU):
                t = t.view(len(rows), 1 if shared else n, *t.shape[1:])
                sq[name] += torch.einsum("kni,kni->ni", t.flatten(2), t.flatten(2))  # broadcasts if shared
                t, shared = (t * gates[name]).flatten(0, 1), False
            elif isinstance(m, nn.MaxPool2d):  # each window passes its winner's tangent
                idx = rec.pool_indices[name]
                t = t.view(len(rows), 1 if shared else n, t.shape[1], -1)
                t, shared = torch.take_along_dim(t, idx.flatten(2)[None], dim=3).reshape(-1, *idx.shape[1:]), False
            elif isinstance(m, nn.AvgPool2d):
                t = m(t)
            elif not isinstance(m, (nn.Dropout, nn.Identity)):  # point-wise affine (BatchNorm, Normalize)
                t = torch.func.jvp(m, (torch.zeros_like(t),), (t,))[1]
        t = t.reshape(len(rows), 1 if shared else n, -1)
        flat_cols.append(t.expand(len(rows), n, t.shape[2]))
    flat = torch.cat(flat_cols, 0)  # (K, N, U_flat): each flattened unit's Jacobian entries, compressed
    n_pos, n_dir = plan.pixel.shape
    flat = flat.reshape(n_dir, n, plan.channels, n_pos)
    tail = list(plan.tail)
    if tail and isinstance(tail[0][1], nn.Linear):
        # first tail layer, position by position: W[:, :, p] (O x C) times the C x K compressed block of
        # position p, added into the input pixels of p's receptive field (never the dense U_flat x d matrix)
        m = tail.pop(0)[1]
        w = m.weight.to(x.dtype).reshape(m.out_features, plan.channels, n_pos)
        vals = torch.einsum("ocp,kncp->nopk", w, flat).reshape(n, m.out_features, n_pos * n_dir)
        t = x.new_zeros(n, m.out_features, d + 1)
        t.scatter_add_(2, plan.pixel.reshape(1, 1, -1).expand(n, m.out_features, -1), vals)
    else:
        t = x.new_zeros(n, plan.channels, n_pos, d + 1)
        t.scatter_(3, plan.pixel[None, None].expand(n, plan.channels, -1, -1), flat.permute(1, 2, 3, 0))
        t = t.reshape(n, plan.channels * n_pos, d + 1)
    t = t[..., :d]  # (N, units, d): the Jacobian of the first tail layer (or of the flattened layer), dense
    for name, m in tail:
        if isinstance(m, nn.Linear):
            t = torch.einsum("ou,nud->nod", m.weight.to(t.dtype), t)
        elif name is not None:
            sq[name] = torch.einsum("nud,nud->nu", t, t)
            t = t * rec.gates[name].flatten(1).to(t.dtype)[..., None]
    return sq


# --------------------------------------------------------------------------------------------------
# Insens


def insens(model: nn.Module, x: Tensor, chunk_size: int | None = None, structure: bool = True) -> InsensResult:
    """Inactive state sensitivity ``Omega(x) = mean_{i: q_i <= 0} q_i w_i / |w_i|^2`` (Eq. 7-8).

    Two passes, never holding more than ``chunk_size`` columns of the Jacobian: forward mode
    through the frozen network accumulates ``|w_i|^2`` for every hidden neuron; then one backward
    pass computes ``Omega = J^T a`` with ``a_i = q_i / |w_i|^2 / |I|`` on the inactive neurons ``I``
    (``w_i = 0`` neurons are left out, see the module docstring). Vectorised over the batch.

    With ``structure=True`` (the default), a plain ``Sequential`` conv net (convolutions, pools and
    point-wise layers, then ``Flatten`` and a Linear/ReLU tail) takes the receptive-field fast path: one
    forward-mode direction per colour class of input pixels instead of one per pixel (see ``_ConvPlan``),
    and the tail's switched weights from the flattened layer's Jacobian. Other models, or
    ``structure=False``, take the generic sweep over all input coordinates; both give the same result.
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
    plan = _conv_plan(model, x, names) if structure else None
    with torch.no_grad():
        if plan is not None:
            sq = _sq_norms_conv(model, x, rec, names, plan, chunk_size or 256)
        else:
            sq = {k: x.new_zeros(n, rec.preactivations[k][0].numel()) for k in names}
            for _, cols in _jacobian_chunks(model, x, rec, names, chunk_size or _default_chunk(x)):
                for k in names:
                    sq[k] += cols[k].square().sum(0)
    tiny = torch.finfo(x.dtype).tiny
    q = {k: rec.preactivations[k].flatten(1) for k in names}
    inactive = {k: (q[k] <= 0) & (sq[k] > tiny) for k in names}
    cut = {k: (q[k] <= 0) & (sq[k] <= tiny) for k in names}
    n_inactive = sum(m.sum(1) for m in inactive.values())
    n_cut = sum(m.sum(1) for m in cut.values())
    denom = n_inactive.clamp_min(1).to(x.dtype)
    coef = {
        k: torch.where(inactive[k], q[k] / sq[k].clamp_min(tiny), torch.zeros_like(q[k])) / denom[:, None]
        for k in names
    }
    z = x.clone().requires_grad_(True)
    with torch.enable_grad():
        qz = frozen_preactivations(model, z, rec.gates, rec.pool_indices)
        total = sum((qz[k].flatten(1) * coef[k]).sum() for k in names)
        (omega,) = torch.autograd.grad(total, z)
    return InsensResult(
        omega=omega, n_inactive=n_inactive.cpu(), n_cut_off=n_cut.cpu(),
        n_hidden=sum(v.shape[1] for v in q.values()),
    )


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


def active_neuron_share(model: nn.Module, x: Tensor, batch_size: int = 500) -> Tensor:
    """Per input, the share of all hidden neurons (units of every ReLU call) with ``q > 0`` (Table 3).

    Processes ``x`` in chunks of ``batch_size``; returns a ``(N,)`` float64 tensor.
    """
    _check(model, x)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    parts = []
    with torch.no_grad():
        for chunk in x.split(batch_size):
            rec = record_gates(model, chunk)
            on = sum((q > 0).flatten(1).sum(1) for q in rec.preactivations.values())
            total = sum(q[0].numel() for q in rec.preactivations.values())
            parts.append(on.double().cpu() / total)
    return torch.cat(parts)
