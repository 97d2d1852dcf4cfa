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
    run_with_gates(model, z, gates, pool_indices, preactivations=captured)
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
# The structured fast path of Insens: each neuron's switched weight lives on its receptive field


@dataclass
class _ConvPlan:
    """How :func:`insens` takes ``|w_i|^2`` of a plain conv net: ``Sequential(spatial part, Flatten, tail)``.

    A unit of the spatial part (convolutions, pools, point-wise maps) depends only on the input pixels
    of its receptive field, a window of ``size`` pixels that starts at ``start + jump * position``. So
    its switched weight is a *patch*, ``C_in x size_h x size_w`` numbers, and the patches of one layer
    follow from those of the layer below: a convolution sums its kernel's patches, each shifted to its
    place in the larger window; a max-pool passes its winner's patch, shifted; a gate scales it. This
    costs one pass per kernel offset instead of one forward-mode pass per input pixel (the generic
    sweep), and holds only the non-zero part of the Jacobian. The tail after ``Flatten`` (Linear,
    ReLU) mixes all pixels: its first layer's switched weights are the weighted sums of the flattened
    units' patches, added into the image position by position, and later layers multiply these dense
    rows by their weights and gates. (MNIST CNN: windows of at most 16 x 16 of the 28 x 28 pixels.)
    """

    spatial: list[tuple[str, nn.Module, tuple[int, ...]]]   # (name, module, output shape C x H x W)
    tail: list[tuple[str | None, nn.Module]]                  # (site name or None, module) after Flatten
    volume: int                                               # largest patch tensor per image (elements)


_POINTWISE = (nn.ReLU, nn.BatchNorm2d, nn.Dropout, nn.Identity)
_WINDOWED = (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _window(m: nn.Module):
    """Kernel, stride, padding and dilation of a windowed layer, as pairs."""
    return (_pair(m.kernel_size), _pair(m.stride or m.kernel_size), _pair(m.padding),
            _pair(getattr(m, "dilation", 1)))


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
    c, h, w = x.shape[1:]
    size, jump, volume, shapes = [1, 1], [1, 1], c * h * w, []
    with torch.no_grad():
        z = x[:1]
        for _, m in spatial:
            if isinstance(m, _WINDOWED):
                if getattr(m, "ceil_mode", False) or (isinstance(m, nn.Conv2d) and m.padding_mode != "zeros"):
                    return None  # ceil mode and circular padding move fields across the border
                if isinstance(m, nn.Conv2d) and isinstance(m.padding, str):
                    return None
                if isinstance(m, nn.AvgPool2d) and m.padding and not m.count_include_pad:
                    return None
                k, s, _, dil = _window(m)
                size = [size[a] + (k[a] - 1) * dil[a] * jump[a] for a in range(2)]
                jump = [jump[a] * s[a] for a in range(2)]
            elif not (isinstance(m, _POINTWISE) or getattr(type(m), "pointwise", False)):
                return None
            z = m(z)
            shapes.append(tuple(z.shape[1:]))
            volume = max(volume, z[0].numel() * c * size[0] * size[1])
    if c * size[0] * size[1] >= c * h * w:
        return None  # fields as large as the image: nothing to gain over the generic sweep
    if any(not isinstance(m, (nn.Linear, nn.ReLU, nn.Dropout, nn.Identity)) for _, m in tail):
        return None
    relu_names = [n for n, m in spatial + tail if isinstance(m, nn.ReLU)]
    if relu_names != names:
        return None  # every ReLU module is one site, named by its path (record_gates' names)
    sites = iter(n for n, m in tail if isinstance(m, nn.ReLU))
    first = tail[0][1].out_features if tail and isinstance(tail[0][1], nn.Linear) else z[0].numel()
    volume = max(volume, first * c * h * w)  # the dense switched weights of the first tail layer
    return _ConvPlan([(n, m, s) for (n, m), s in zip(spatial, shapes)],
                     [(next(sites) if isinstance(m, nn.ReLU) else None, m) for _, m in tail], volume)


def _shift_add(patches: Tensor, m: nn.Module, shape, batch: int, jump, add) -> Tensor:
    """Patches ``(C_in, s_h, s_w, C, N, H, W)`` through a windowed layer into ``shape = (C', H', W')``:
    for each kernel offset, ``add(window, ky, kx, selected)`` adds the units below at that offset
    (zero-padded) into the offset's place of the larger window of every unit above."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _window(m)
    cin, s0, s1 = patches.shape[:3]
    patches = F.pad(patches, (pw, pw, ph, ph)) if ph or pw else patches
    co, oh, ow = shape
    out = patches.new_zeros(cin, s0 + (kh - 1) * dh * jump[0], s1 + (kw - 1) * dw * jump[1], co, batch, oh, ow)
    for ky in range(kh):
        for kx in range(kw):
            sel = patches[..., ky * dh: ky * dh + sh * (oh - 1) + 1: sh, kx * dw: kx * dw + sw * (ow - 1) + 1: sw]
            y, x = ky * dh * jump[0], kx * dw * jump[1]
            add(out[:, y: y + s0, x: x + s1], ky, kx, sel)
    return out


def _sq_norms_conv(x: Tensor, gates: dict[str, Tensor], pool_indices: dict[str, Tensor],
                   plan: _ConvPlan) -> dict[str, Tensor]:
    """``|w_i|^2`` of every hidden neuron of the inputs ``x`` (one chunk, with their recorded gates and
    max-pool winners) through the plan's patches, held as ``(C_in, s_h, s_w, C, N, H, W)``: patch
    coordinates first, so that adding a patch into a window of a larger one adds whole layers."""
    n, (c, h, w) = x.shape[0], x.shape[1:]
    sq: dict[str, Tensor] = {}
    # an input unit's patch is its own coordinate, the same for every input until the first gate or
    # max-pool (a batch dimension of 1 broadcasts)
    t = torch.eye(c, dtype=x.dtype, device=x.device)[:, None, None, :, None, None, None].expand(c, 1, 1, c, 1, h, w)
    jump, start = [1, 1], [0, 0]  # of the receptive fields, in input pixels
    for name, m, shape in plan.spatial:
        if isinstance(m, nn.Conv2d):
            wt = m.weight.to(x.dtype)
            if m.groups > 1:  # the dense (O, C) weight of a grouped convolution, zero across groups
                o, g = wt.shape[0], m.groups
                dense = wt.new_zeros(o, g, wt.shape[1], *wt.shape[2:])
                dense[torch.arange(o), torch.arange(o) // (o // g)] = wt
                wt = dense.flatten(1, 2)

            def conv_add(window, ky, kx, sel, wt=wt):
                part = torch.matmul(wt[:, :, ky, kx], sel.reshape(-1, sel.shape[3], sel[0, 0, 0, 0].numel()))
                window += part.view(window.shape)
            t = _shift_add(t, m, shape, t.shape[4], jump, conv_add)
        elif isinstance(m, nn.MaxPool2d):  # each window passes its winner's patch, shifted into place
            idx = pool_indices[name].transpose(0, 1)  # (C, N, H', W') flat positions in the map below
            width = t.shape[-1]
            (_, _), (sh, sw), (ph, pw), (dh, dw) = _window(m)
            oy = torch.arange(shape[1], device=x.device)[:, None] * sh - ph
            ox = torch.arange(shape[2], device=x.device)[None, :] * sw - pw
            ky, kx = (idx // width - oy) // dh, (idx % width - ox) // dw

            def pool_add(window, a, b, sel, ky=ky, kx=kx):
                window.addcmul_(sel, ((ky == a) & (kx == b)).to(sel.dtype))
            t = _shift_add(t, m, shape, n, jump, pool_add)
        elif isinstance(m, nn.AvgPool2d):
            k = _window(m)[0]
            div = m.divisor_override or k[0] * k[1]
            t = _shift_add(t, m, shape, t.shape[4], jump,
                           lambda window, a, b, sel, div=div: window.add_(sel, alpha=1 / div))
        elif isinstance(m, nn.ReLU):
            norms = (t * t).sum((0, 1, 2))  # (C, N, H, W)
            sq[name] = norms.transpose(0, 1).flatten(1).expand(n, -1)
            g = gates[name].transpose(0, 1).to(x.dtype)
            t = t.mul_(g) if t.shape[4] == n and t.is_contiguous() else t * g  # in place unless shared
        elif not isinstance(m, (nn.Dropout, nn.Identity)):  # point-wise affine (BatchNorm, Normalize)
            v, cc, nn_, hh, ww = t.flatten(0, 2).shape
            tangent = t.flatten(0, 2).transpose(1, 2).reshape(v * nn_, cc, hh, ww)
            lin = torch.func.jvp(m, (torch.zeros_like(tangent),), (tangent,))[1]
            t = lin.view(v, nn_, *lin.shape[1:]).transpose(1, 2).reshape(*t.shape[:3], *lin.shape[1:2],
                                                                          nn_, *lin.shape[2:])
        if isinstance(m, _WINDOWED):
            _, stride, pad, _ = _window(m)
            start = [start[a] - pad[a] * jump[a] for a in range(2)]
            jump = [jump[a] * stride[a] for a in range(2)]
    # the first tail layer's switched weights: position by position of the flattened map, its weights
    # (O x C) times the C patches there, added into the image (all O rows at once)
    fc, fh, fw = plan.spatial[-1][2] if plan.spatial else (c, h, w)
    t = t.expand(*t.shape[:4], n, *t.shape[5:])
    tail = list(plan.tail)
    if tail and isinstance(tail[0][1], nn.Linear):
        wt = tail.pop(0)[1].weight.to(x.dtype).reshape(-1, fc, fh, fw)
    else:  # a gate right after Flatten: the flattened units themselves
        wt = torch.eye(fc * fh * fw, dtype=x.dtype, device=x.device).reshape(-1, fc, fh, fw)
    o, (s0, s1) = wt.shape[0], t.shape[1:3]
    canvas = (jump[0] * (fh - 1) + s0, jump[1] * (fw - 1) + s1)
    img = x.new_zeros(c, *canvas, n, o)
    by_position = t.permute(5, 6, 0, 1, 2, 4, 3).reshape(fh, fw, -1, fc)  # (H, W, C_in s_h s_w N, C)
    for py in range(fh):
        for px in range(fw):
            part = by_position[py, px] @ wt[:, :, py, px].T  # (C_in s_h s_w N, O)
            img[:, py * jump[0]: py * jump[0] + s0, px * jump[1]: px * jump[1] + s1] += part.view(c, s0, s1, n, o)
    if start == [0, 0] and canvas == (h, w):
        rows = img
    else:  # the part of the canvas inside the image
        rows = x.new_zeros(c, h, w, n, o)
        r0, c0 = max(0, start[0]), max(0, start[1])
        r1, c1 = min(h, start[0] + canvas[0]), min(w, start[1] + canvas[1])
        rows[:, r0:r1, c0:c1] = img[:, r0 - start[0]: r1 - start[0], c0 - start[1]: c1 - start[1]]
    rows = rows.reshape(c * h * w, n, o)
    for name, m in tail:
        if isinstance(m, nn.Linear):
            rows = rows @ m.weight.to(rows.dtype).T
        elif name is not None:
            sq[name] = (rows * rows).sum(0)
            rows = rows * gates[name].flatten(1).to(rows.dtype)
    return sq


# --------------------------------------------------------------------------------------------------
# Insens


def insens(model: nn.Module, x: Tensor, chunk_size: int | None = None, structure: bool = True) -> InsensResult:
    """Inactive state sensitivity ``Omega(x) = mean_{i: q_i <= 0} q_i w_i / |w_i|^2`` (Eq. 7-8).

    Two passes, never holding more than about ``chunk_size`` columns of the Jacobian (one number per
    hidden neuron and input each): forward mode through the frozen network accumulates ``|w_i|^2`` for
    every hidden neuron; then one backward
    pass computes ``Omega = J^T a`` with ``a_i = q_i / |w_i|^2 / |I|`` on the inactive neurons ``I``
    (``w_i = 0`` neurons are left out, see the module docstring). Vectorised over the batch.

    With ``structure=True`` (the default), a plain ``Sequential`` conv net (convolutions, pools and
    point-wise layers, then ``Flatten`` and a Linear/ReLU tail) takes the receptive-field fast path:
    each spatial neuron's switched weight is built on its receptive field only, layer by layer (see
    ``_ConvPlan``), and the tail's from the flattened units' ones. Other models, or ``structure=False``,
    take the generic forward-mode sweep over all input coordinates; both give the same result.
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
        if plan is not None:  # as many inputs per chunk as hold about chunk_size Jacobian columns
            n_hidden = sum(rec.preactivations[k][0].numel() for k in names)
            budget = chunk_size * n_hidden if chunk_size else 1 << 22  # default: a few cache-sized images
            per = max(1, budget // plan.volume)
            parts = [_sq_norms_conv(x[i:i + per], {k: g[i:i + per] for k, g in rec.gates.items()},
                                    {k: p[i:i + per] for k, p in rec.pool_indices.items()}, plan)
                     for i in range(0, n, per)]
            sq = {k: torch.cat([part[k] for part in parts]) for k in names}
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
