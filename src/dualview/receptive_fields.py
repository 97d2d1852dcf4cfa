"""Receptive fields: the switched weights of a plain conv net, built patch by patch.

A unit of a convolutional layer reads only the input pixels of its *receptive field*, so its switched
weight ``w_i = dq_i/dx`` (Theorem 1 of :cite:`szymanski2020switched`) is zero outside that window. This
module computes the squared norms ``|w_i|^2`` that :func:`dualview.projections.insens` needs (Eq. 7-8)
from these windows alone, layer by layer, instead of sweeping over every input pixel: the *fast path*
of ``insens(..., structure=True)``. :func:`conv_plan` reads the structure of a plain ``Sequential`` conv
net (or returns ``None`` for any other model); :func:`sq_norms` runs the plan on a chunk of inputs with
their recorded gates. Both are tested against the per-neuron reference
:func:`dualview.projections.insens_reference` and the generic sweep (``structure=False``).

Layers: ``Conv2d`` (zero padding, strides, dilation, groups), ``MaxPool2d`` and ``AvgPool2d`` (not in
ceil mode), ``ReLU``, ``BatchNorm2d`` in eval mode, ``Dropout``, ``Identity`` and point-wise layers that
declare ``pointwise = True`` (as :class:`dualview.nets.Normalize` does), then one ``Flatten`` and a tail
of ``Linear``/``ReLU``/``Dropout``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ConvPlan", "conv_plan", "jvp", "sq_norms"]


def jvp(fn, primal: Tensor, tangent: Tensor) -> Tensor:
    """``torch.func.jvp(fn, (primal,), (tangent,))[1]``: the forward-mode derivative of ``fn`` at
    ``primal`` along ``tangent``. PyTorch's first forward-mode pass in a process loads its decompositions
    with ``torch.jit.script``, which warns that it is deprecated; that warning is PyTorch's own business,
    not the caller's, and is silenced here (only that one)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=FutureWarning)
        return torch.func.jvp(fn, (primal,), (tangent,))[1]


@dataclass
class ConvPlan:
    """How :func:`dualview.projections.insens` takes ``|w_i|^2`` of a plain conv net: ``Sequential(spatial
    part, Flatten, tail)``; made by :func:`conv_plan`, run by :func:`sq_norms`.

    A unit of the spatial part (convolutions, pools, point-wise maps) depends only on the input pixels
    of its receptive field, a window of ``size`` pixels that starts at ``start + jump * position``. So
    its switched weight is a *patch*, ``C_in x size_h x size_w`` numbers, and the patches of one layer
    follow from those of the layer below: a convolution sums its kernel's patches, each shifted to its
    place in the larger window; a max-pool passes its winner's patch, shifted; a gate scales it. This
    costs one pass per kernel offset instead of one forward-mode pass per input pixel (the generic
    sweep), and holds only the non-zero part of the Jacobian. The tail after ``Flatten`` (Linear,
    ReLU) mixes all pixels: its first layer's switched weights are the weighted sums of the flattened
    units' patches, added into the image position by position, and later layers multiply these dense
    rows by their weights and gates. Layers after the last ReLU hold no hidden neuron and are left out
    of the plan. (MNIST CNN: windows of at most 16 x 16 of the 28 x 28 pixels.)
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


def conv_plan(model: nn.Module, x: Tensor, names: list[str]) -> ConvPlan | None:
    """The fast path's plan for ``model`` on inputs shaped like ``x``, or ``None`` where its structure is
    not a plain ``Sequential`` conv net (then :func:`dualview.projections.insens` uses the generic
    forward-mode sweep). ``names``: the ReLU calls as :func:`dualview.gates.record_gates` names them;
    every ReLU must be its own module (one site per module).
    """
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
    tail = [(next(sites) if isinstance(m, nn.ReLU) else None, m) for _, m in tail]
    spatial = [(n, m, s) for (n, m), s in zip(spatial, shapes)]
    # layers after the last ReLU hold no hidden neuron: the plan stops there
    last = [k for k, (_, m) in enumerate(tail) if isinstance(m, nn.ReLU)]
    if last:
        tail = tail[:last[-1] + 1]
        first = tail[0][1].out_features if isinstance(tail[0][1], nn.Linear) else z[0].numel()
        volume = max(volume, first * c * h * w)  # the dense switched weights of the first tail layer
    else:
        tail, spatial = [], spatial[:max((k for k, (_, m, _) in enumerate(spatial) if isinstance(m, nn.ReLU)), default=-1) + 1]
    return ConvPlan(spatial, tail, volume)


def _shift_add(patches: Tensor, m: nn.Module, shape, batch: int, jump, add) -> Tensor:
    """Patches ``(C_in, s_h, s_w, N, H, W, C)`` through a windowed layer into ``shape = (C', H', W')``:
    for each kernel offset, ``add(window, ky, kx, selected)`` adds the units below at that offset
    (zero-padded, ``(C_in, s_h, s_w, N, H', W', C)``) into the offset's place of the larger window of
    every unit above (``out[:, y: y + s_h, x: x + s_w]``, a view)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _window(m)
    cin, s0, s1 = patches.shape[:3]
    patches = F.pad(patches, (0, 0, pw, pw, ph, ph)) if ph or pw else patches
    co, oh, ow = shape
    out = patches.new_zeros(cin, s0 + (kh - 1) * dh * jump[0], s1 + (kw - 1) * dw * jump[1], batch, oh, ow, co)
    for ky in range(kh):
        for kx in range(kw):
            sel = patches[:, :, :, :, ky * dh: ky * dh + sh * (oh - 1) + 1: sh, kx * dw: kx * dw + sw * (ow - 1) + 1: sw]
            y, x = ky * dh * jump[0], kx * dw * jump[1]
            add(out[:, y: y + s0, x: x + s1], ky, kx, sel)
    return out


def _conv(t: Tensor, m: nn.Conv2d, shape, jump) -> Tensor:
    """A convolution's patches: for each kernel offset, its ``C x C'`` weights times the patches of
    the units below at that offset, accumulated by the matrix product itself (``baddbmm_``) into each
    row of the larger windows (channels last, so a window row is one matrix of ``s_w N H' W'`` rows)."""
    wt = m.weight.to(t.dtype)
    if m.groups > 1:  # the dense (O, C) weight of a grouped convolution, zero across groups
        o, g = wt.shape[0], m.groups
        dense = wt.new_zeros(o, g, wt.shape[1], *wt.shape[2:])
        dense[torch.arange(o), torch.arange(o) // (o // g)] = wt
        wt = dense.flatten(1, 2)
    by_offset = wt.permute(2, 3, 1, 0).contiguous()  # (k_h, k_w, C, C')

    def add(window, ky, kx, sel):
        cin, s0 = sel.shape[:2]
        rows = sel.reshape(cin, s0, -1, sel.shape[-1])  # (C_in, s_h, s_w N H' W', C), one copy
        w = by_offset[ky, kx].expand(s0, -1, -1)
        for ci in range(cin):  # patch channels (1 for grey images): each window row is a strided view
            window[ci].view(s0, -1, window.shape[-1]).baddbmm_(rows[ci], w)
    return _shift_add(t, m, shape, t.shape[3], jump, add)


def _max_pool(t: Tensor, m: nn.MaxPool2d, shape, jump, idx: Tensor, gate: Tensor | None) -> Tensor:
    """A max-pool's patches: each window passes its winner's patch (``idx``: ``(N, C, H', W')`` flat
    positions in the map below, as recorded), shifted into place and scaled by the winner's gate of a
    ReLU right below (``gate``: ``(N, C, H, W)``; gating only the winners spares a pass over the map)."""
    width = t.shape[5]
    (_, _), (sh, sw), (ph, pw), (dh, dw) = _window(m)
    oy = torch.arange(shape[1], device=t.device)[:, None] * sh - ph
    ox = torch.arange(shape[2], device=t.device)[None, :] * sw - pw
    ky, kx = (idx // width - oy) // dh, (idx % width - ox) // dw  # the winners' kernel offsets
    scale = torch.ones((), dtype=t.dtype, device=t.device) if gate is None else \
        gate.flatten(2).gather(2, idx.flatten(2)).view_as(idx).to(t.dtype)
    to_last = (0, 2, 3, 1)  # (N, C, H', W') -> (N, H', W', C)

    def add(window, a, b, sel):
        window.addcmul_(sel, torch.where((ky == a) & (kx == b), scale, 0).permute(to_last))
    return _shift_add(t, m, shape, idx.shape[0], jump, add)


def sq_norms(x: Tensor, gates: dict[str, Tensor], pool_indices: dict[str, Tensor], plan: ConvPlan) -> dict[str, Tensor]:
    """``|w_i|^2``, the squared norm of the switched weight (Theorem 1 of :cite:`szymanski2020switched`)
    of every hidden neuron, ``{name: (N, U_l)}``, for the inputs ``x`` (one chunk, with their recorded
    gates and max-pool winners, as :func:`dualview.gates.record_gates` gives them) through the plan's
    patches, held as ``(C_in, s_h, s_w, N, H, W, C)``: patch coordinates first, so that adding a patch
    into a window of a larger one adds whole layers, and channels last, so that a window row is one
    matrix for the matrix products. A ReLU's gate waits for the next layer: a max-pool right above
    applies it to its winners only."""
    n, (c, h, w) = x.shape[0], x.shape[1:]
    sq: dict[str, Tensor] = {}
    # an input unit's patch is its own coordinate, the same for every input until the first gate or
    # max-pool (a batch dimension of 1 broadcasts)
    t = torch.eye(c, dtype=x.dtype, device=x.device)[:, None, None, None, None, None, :].expand(c, 1, 1, 1, h, w, c)
    jump, start = [1, 1], [0, 0]  # of the receptive fields, in input pixels
    gate = None  # of the last ReLU, not yet applied
    for name, m, shape in plan.spatial:
        if gate is not None and not isinstance(m, (nn.MaxPool2d, nn.Dropout, nn.Identity)):
            t, gate = _apply_gate(t, gate, n), None
        if isinstance(m, nn.Conv2d):
            t = _conv(t, m, shape, jump)
        elif isinstance(m, nn.MaxPool2d):
            t, gate = _max_pool(t, m, shape, jump, pool_indices[name], gate), None
        elif isinstance(m, nn.AvgPool2d):
            k = _window(m)[0]
            div = m.divisor_override or k[0] * k[1]
            t = _shift_add(t, m, shape, t.shape[3], jump,
                           lambda window, a, b, sel, div=div: window.add_(sel, alpha=1 / div))
        elif isinstance(m, nn.ReLU):
            norms = _sum_squares(t, 3)  # (N, H, W, C)
            sq[name] = norms.permute(0, 3, 1, 2).flatten(1).expand(n, -1)
            gate = gates[name]
        elif not isinstance(m, (nn.Dropout, nn.Identity)):  # point-wise affine (BatchNorm, Normalize)
            cc, hh, ww = t.shape[-1], *t.shape[4:6]
            tangent = t.reshape(-1, hh, ww, cc).permute(0, 3, 1, 2)
            lin = jvp(m, torch.zeros_like(tangent), tangent)
            t = lin.permute(0, 2, 3, 1).reshape(*t.shape[:-1], lin.shape[1])
        if isinstance(m, _WINDOWED):
            _, stride, pad, _ = _window(m)
            start = [start[a] - pad[a] * jump[a] for a in range(2)]
            jump = [jump[a] * stride[a] for a in range(2)]
    if not plan.tail:
        return sq
    if gate is not None:
        t = _apply_gate(t, gate, n)
    # the first tail layer's switched weights: position by position of the flattened map, its weights
    # (C x O) times the C patches there, added into the image (all O rows at once)
    fc, fh, fw = plan.spatial[-1][2] if plan.spatial else (c, h, w)
    tail = list(plan.tail)
    if isinstance(tail[0][1], nn.Linear):
        wt = tail.pop(0)[1].weight.to(x.dtype).reshape(-1, fc, fh, fw)
    else:  # a gate right after Flatten: the flattened units themselves
        wt = torch.eye(fc * fh * fw, dtype=x.dtype, device=x.device).reshape(-1, fc, fh, fw)
    by_weight = wt.permute(2, 3, 1, 0).contiguous()  # (H, W, C, O)
    o, (cin, s0, s1) = wt.shape[0], t.shape[:3]
    canvas = (jump[0] * (fh - 1) + s0, jump[1] * (fw - 1) + s1)
    img = x.new_zeros(cin, *canvas, n, o)
    by_position = t.expand(*t.shape[:3], n, *t.shape[4:]).permute(4, 5, 0, 1, 2, 3, 6)
    by_position = by_position.reshape(fh, fw, cin * s0 * s1 * n, fc)  # one copy
    for py in range(fh):
        for px in range(fw):
            part = by_position[py, px] @ by_weight[py, px]  # (C_in s_h s_w N, O)
            img[:, py * jump[0]: py * jump[0] + s0, px * jump[1]: px * jump[1] + s1] += part.view(cin, s0, s1, n, o)
    if start == [0, 0] and canvas == (h, w):
        rows = img
    else:  # the part of the canvas inside the image
        rows = x.new_zeros(c, h, w, n, o)
        r0, c0 = max(0, start[0]), max(0, start[1])
        r1, c1 = min(h, start[0] + canvas[0]), min(w, start[1] + canvas[1])
        rows[:, r0:r1, c0:c1] = img[:, r0 - start[0]: r1 - start[0], c0 - start[1]: c1 - start[1]]
    rows = rows.reshape(c * h * w, n, o)
    for k, (name, m) in enumerate(tail):
        if isinstance(m, nn.Linear):
            rows = rows @ m.weight.to(rows.dtype).T
        elif name is not None:
            sq[name] = _sum_squares(rows, 1)
            if k < len(tail) - 1:
                rows = rows * gates[name].flatten(1).to(rows.dtype)
    return sq


def _apply_gate(t: Tensor, gate: Tensor, n: int) -> Tensor:
    """Patches times a ReLU's gates ``(N, C, H, W)`` (in place unless ``t`` is shared by the batch)."""
    g = gate.permute(0, 2, 3, 1).to(t.dtype)
    return t.mul_(g) if t.shape[3] == n and t.is_contiguous() else t * g


def _sum_squares(t: Tensor, k: int) -> Tensor:
    """``(t * t).sum`` over the first ``k`` dimensions, a cache-sized slice at a time (a temporary as
    large as ``t`` would cost a pass through memory)."""
    flat = t.reshape(-1, *t.shape[k:])
    step = max(1, (1 << 16) // flat[0].numel())
    total = None
    for part in flat.split(step):
        square = part * part
        total = square.sum(0) if total is None else total.add_(square.sum(0))
    return total
