"""The NPK of circular convolutional networks with global average pooling: the rotation sum.

Weight sharing groups a convolutional network's paths into *bundles* that share one path value, and
global average pooling makes the NPK a sum over rotations of the input (Theorem 3.2 and Lemma F.1 of
:cite:`lakshminarayanan2022explicitising`):

* :func:`conv_structure` reads the network's taps and checks it is of the supported kind,
  :func:`conv_gates` records its gates;
* :func:`npk_conv` / :func:`npk_conv_from_gates` compute the rotation sum in memory-bounded blocks,
  :func:`conv_overlap` the overlap it weights the inner products with, :func:`rotate` the rotation;
* :func:`bundle_features_reference` enumerates the bundles explicitly (tiny networks), and
  :func:`npk_conv_reference` is their Gram matrix.
"""
from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from dualview.gates import UnsupportedLayerError, check_supported, record_gates
from dualview.npk_fc import DEFAULT_MEMORY_BUDGET, check_memory_budget

__all__ = [
    "ConvStructure",
    "conv_structure",
    "conv_gates",
    "conv_overlap",
    "npk_conv_from_gates",
    "npk_conv",
    "npk_conv_reference",
    "rotate",
    "Bundles",
    "bundle_features_reference",
]

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
    custom = [n or "<model>" for n, m in model.named_modules()
              if list(m.children()) and not isinstance(m, nn.Sequential)]
    if custom:
        raise UnsupportedLayerError(
            f"the NPK reads a convolutional network from its list of layers, but '{custom[0]}' "
            f"({type(model.get_submodule(custom[0]) if custom[0] != '<model>' else model).__name__}) has a "
            "forward of its own (a skip connection, say) that the list does not show, so the kernel would "
            "be wrong. Give the network as an nn.Sequential of its layers (Theorem 3.2 has no skips); for "
            "fully connected ResNets use dualview.nets.FCResNet (Theorem 3.3).")
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
    per_pair = (4 * rr * d + widest * rr * d) * dtype.itemsize  # joint counts, recursion, rotated gates
    side = max(1, int(math.isqrt(max(memory_budget // per_pair, 1))))
    if chunk_size is not None:
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        side = min(side, chunk_size)
    check_memory_budget(per_pair, memory_budget, "one pair of the convolutional NPK",
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
    (:func:`dualview.npk_conv.bundle_features_reference`; tiny networks only)."""
    phi1 = bundle_features_reference(model, x1).features
    phi2 = phi1 if x2 is None else bundle_features_reference(model, x2).features
    return phi1 @ phi2.T


def rotate(x: Tensor, r: int | Sequence[int]) -> Tensor:
    """``rot(x, r)(i) = x(i + r)`` (Definition F.1 of :cite:`lakshminarayanan2022explicitising`),
    over the last one (``r`` an int) or last ``len(r)`` dimensions, circularly."""
    rs = (r,) if isinstance(r, int) else tuple(r)
    return torch.roll(x, shifts=tuple(-k for k in rs), dims=tuple(range(-len(rs), 0)))


# --- bundles of paths that share their weights (convolutions) ------------------------------


@dataclass
class Bundles:
    """Neural path features of a convolutional network, one per *bundle* of paths with equal value.

    ``features``: ``(N, B)``, ``phi_x(B) = sum_{p in B} x(p_0) A(x, p)``; ``values``: ``(B, C)``, the
    common product of weights of the bundle's paths into each output; ``sizes``: ``(B,)``, paths per
    bundle. ``model(x) = features @ values``.
    """

    features: Tensor
    values: Tensor
    sizes: Tensor


def bundle_features_reference(model: nn.Module, x: Tensor) -> Bundles:
    """Explicit path bundles of a circular convolutional network (Definitions F.3-F.4 of
    :cite:`lakshminarayanan2022explicitising`): a loop over every path, in float64, for tiny networks.

    Each path starts at an input unit ``(c_0, i_0)``, crosses every convolution through one tap into
    one filter (its position follows from the tap), then (global average pooling: mask ``1/d_in``;
    flatten: the unit of its position) the fully connected units. Paths whose weights are the same
    entries of the weight tensors form a bundle: with global average pooling a bundle holds one path
    per input position (Proposition F.2); with a flatten head every path is its own bundle.
    """

    s = conv_structure(model, x.shape[1:])
    net = copy.deepcopy(model).double().eval()
    x = x.double()
    rec = record_gates(net, x).gates
    conv_g = [rec[n].double().reshape(x.shape[0], rec[n].shape[1], -1) for n in s.conv_gates]
    fc_g = [rec[n].double() for n in s.fc_gates]
    net.requires_grad_(False)
    convs = [m for m in net.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d))]
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    spatial, d = s.spatial, s.d_in
    taps = [list(itertools.product(*[range(k) for k in m.kernel_size])) for m in convs]
    flat_x = x.reshape(x.shape[0], s.in_channels, -1)

    def flat(pos):
        k = 0
        for p, n in zip(pos, spatial):
            k = k * n + p
        return k

    feats: dict[tuple, Tensor] = {}
    values: dict[tuple, Tensor] = {}
    sizes: dict[tuple, int] = {}
    for c0 in range(s.in_channels):
        for i0 in itertools.product(*[range(n) for n in spatial]):
            for tap_seq in itertools.product(*taps):
                for chans in itertools.product(*[range(m.out_channels) for m in convs]):
                    pos, prev, weight = i0, c0, 1.0
                    act = torch.ones(x.shape[0], dtype=torch.float64, device=x.device)
                    for l, (m, tap, c) in enumerate(zip(convs, tap_seq, chans)):
                        # input position u + dilation * tap - padding feeds output position u
                        pos = tuple((q - dl * t + pd) % n for q, t, dl, pd, n in
                                    zip(pos, tap, m.dilation, m.padding, spatial))
                        weight *= float(m.weight[(c, prev, *tap)])
                        act = act * conv_g[l][:, c, flat(pos)]
                        prev = c
                    if s.head == "gap":
                        act, first_in, where = act / d, prev, ()
                    else:
                        first_in, where = prev * d + flat(pos), (pos,)
                    widths = [lin.out_features for lin in linears[:-1]]
                    for units in itertools.product(*[range(w) for w in widths]):
                        a, w, into = act, weight, first_in
                        for l, u in enumerate(units):
                            w *= float(linears[l].weight[u, into])
                            a = a * fc_g[l][:, u]
                            into = u
                        key = (c0, tap_seq, chans, where, units)  # the weights the path uses
                        feats[key] = feats.get(key, 0) + flat_x[:, c0, flat(i0)] * a
                        values[key] = w * linears[-1].weight[:, into].detach().double()
                        sizes[key] = sizes.get(key, 0) + 1
    keys = list(feats)
    return Bundles(torch.stack([feats[k] for k in keys], 1), torch.stack([values[k] for k in keys]),
                   torch.tensor([sizes[k] for k in keys], device=x.device))
