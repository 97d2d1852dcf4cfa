"""Paths: neural path features, neural path values and path activity; counting paths.

For a fully connected ReLU network with layers ``W_1 ... W_L`` a *path* ``p`` picks one unit in every
layer, from an input coordinate to an output unit. Definition E.1 of the duality paper
:cite:`lakshminarayanan2022explicitising`:

* the *activity* of a path is the product of the gates along it, ``A(x, p) = prod_l G_l(x)[p_l]``;
* its *neural path feature* (NPF) is ``phi(x)_p = x[p_0] * A(x, p)``;
* its *neural path value* (NPV) is the product of the weights along it, ``v_p = prod_l W_l[p_l, p_{l-1}]``;

and the network's output is ``f(x) = <phi(x), v>`` (Eq. 1 there; Eq. 17-19 of
:cite:`satkiewicz2025tapping`).

**Biases** are handled with the augmented-input convention of :cite:`satkiewicz2025tapping`
(Section 2.1): every layer's input gets an extra constant unit equal to 1 whose gate is always on,
and ``W~_l = [[W_l, b_l], [0, 1]]``. A path that starts at the constant unit and stays on the
constant units until layer ``l`` carries the bias ``b_{l+1}[j]`` of the unit ``j`` it then enters:
biases are *bias paths*. Paths that would go from an ordinary unit back to a constant unit have
value 0 and are left out, so ``P`` counts the paths that exist in the network:
``P = d_0 w_1 ... w_{L-1}`` input paths plus one family of bias paths per layer with a bias.

The explicit enumeration is for small networks (teaching and testing): ``P`` grows like the
product of the widths. :func:`count_paths` counts paths of any supported network (convolutions
and pooling included) without enumerating them.
"""
from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dualview.gates import POOL_GATE_LAYERS, instrument, record_gates

__all__ = [
    "fc_layers",
    "path_index",
    "path_activity",
    "neural_path_features",
    "neural_path_values",
    "neural_path_features_reference",
    "neural_path_values_reference",
    "fc_path_count",
    "conv_path_count",
    "resnet_path_count",
    "parameter_count",
    "PathCount",
    "count_paths",
]


def fc_layers(model: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` layers of a fully connected ReLU network ``Sequential([Flatten], Linear, ReLU, ..., Linear)``.

    Raises ``TypeError`` naming the offending layer for anything else: explicit path enumeration is
    defined here for fully connected networks only (use :func:`count_paths` for convolutional ones).
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"explicit path enumeration needs an nn.Sequential of Linear and ReLU layers, got "
            f"{type(model).__name__}; for other architectures use dualview.paths.count_paths"
        )
    mods = list(model.named_children())
    if mods and isinstance(mods[0][1], nn.Flatten):
        mods = mods[1:]
    linears: list[nn.Linear] = []
    for i, (name, m) in enumerate(mods):
        want = nn.Linear if i % 2 == 0 else nn.ReLU
        if not isinstance(m, want):
            raise TypeError(
                f"layer '{name}' is {type(m).__name__}, expected {want.__name__}: explicit path "
                "enumeration supports Sequential([Flatten], Linear, ReLU, Linear, ..., Linear)"
            )
        if isinstance(m, nn.Linear):
            linears.append(m)
    if not linears or len(mods) % 2 == 0:
        raise TypeError("the network must start and end with an nn.Linear layer")
    return linears


def _has_bias(layers: list[nn.Linear]) -> list[bool]:
    return [lin.bias is not None for lin in layers]


def _augmented_weights(layers: list[nn.Linear], dtype: torch.dtype) -> list[Tensor]:
    """``W~_l = [[W_l, b_l], [0, 1]]`` for hidden layers and ``[W_L, b_L]`` for the output layer."""
    out = []
    for k, lin in enumerate(layers):
        W = lin.weight.detach().to(dtype)
        b = lin.bias.detach().to(dtype) if lin.bias is not None else W.new_zeros(W.shape[0])
        Wt = torch.cat([W, b[:, None]], dim=1)
        if k < len(layers) - 1:
            last = W.new_zeros(1, W.shape[1] + 1)
            last[0, -1] = 1.0
            Wt = torch.cat([Wt, last], dim=0)
        out.append(Wt)
    return out


def _valid_path_mask(layers: list[nn.Linear]) -> Tensor:
    """Bool mask over the augmented path grid ``(a_0, ..., a_{L-1})`` of the paths that exist."""
    sizes = [layers[0].in_features + 1] + [lin.out_features + 1 for lin in layers[:-1]]
    bias = _has_bias(layers)
    # c_l = 1 if the path sits on the constant unit of layer l. A path exists iff c is
    # non-increasing (it never re-enters a constant unit) and the bias it uses exists: a path whose
    # last constant unit is at layer j uses the bias of layer j + 1.
    mask = torch.ones(sizes, dtype=torch.bool)
    L = len(sizes)
    consts = []
    for l, a in enumerate(sizes):
        shape = [1] * L
        shape[l] = a
        c = torch.zeros(a, dtype=torch.bool)
        c[-1] = True
        consts.append(c.view(shape))
    for l in range(1, L):
        mask &= ~(consts[l] & ~consts[l - 1])  # no step from an ordinary unit to a constant unit
    for j in range(L):  # last constant unit at layer j -> bias of layer j + 1 must exist
        nxt = ~consts[j + 1] if j + 1 < L else torch.ones((), dtype=torch.bool)
        uses_bias_j = consts[j] & nxt
        if not bias[j]:
            mask &= ~uses_bias_j
    return mask.flatten()


def path_index(model: nn.Module) -> Tensor:
    """The units each path passes through: ``(P, L)`` long tensor, column ``l`` = unit in layer ``l``.

    Column 0 indexes the input coordinates, column ``l`` the units of hidden layer ``l``; the index
    equal to a layer's width is its constant (bias) unit. The output unit is not part of a path's
    index: every path reaches every output unit, with one value per output (see
    :func:`neural_path_values`).
    """
    layers = fc_layers(model)
    sizes = [layers[0].in_features + 1] + [lin.out_features + 1 for lin in layers[:-1]]
    grids = torch.meshgrid(*[torch.arange(a) for a in sizes], indexing="ij")
    idx = torch.stack([g.flatten() for g in grids], dim=1)
    return idx[_valid_path_mask(layers)]


def _augmented_gates(model: nn.Module, x: Tensor) -> tuple[list[nn.Linear], list[Tensor]]:
    layers = fc_layers(model)
    x = x.flatten(1)
    if x.shape[1] != layers[0].in_features:
        raise ValueError(
            f"input has {x.shape[1]} features per sample, the network expects {layers[0].in_features}"
        )
    rec = record_gates(model, x)
    ones = x.new_ones(x.shape[0], 1)
    gates = [torch.cat([g.to(x.dtype), ones], dim=1) for g in rec.gates.values()]
    return layers, [torch.cat([x, ones], dim=1)] + gates


def _outer(vectors: list[Tensor]) -> Tensor:
    """Batched outer product ``v_0 ⊗ v_1 ⊗ ...`` of ``(N, a_l)`` tensors, flattened to ``(N, prod a_l)``."""
    t = vectors[0]
    for v in vectors[1:]:
        t = t.unsqueeze(-1) * v.view(v.shape[0], *([1] * (t.dim() - 1)), v.shape[1])
    return t.flatten(1)


def path_activity(model: nn.Module, x: Tensor) -> Tensor:
    """``A(x, p)``: for each input and path, whether every gate along the path is on. ``(N, P)`` bool."""
    with torch.no_grad():
        layers, vecs = _augmented_gates(model, x)
        ones = torch.ones_like(vecs[0])
        act = _outer([ones] + vecs[1:])
    return act[:, _valid_path_mask(layers)].bool()


def neural_path_features(model: nn.Module, x: Tensor) -> Tensor:
    """``phi(x)``: ``(N, P)``, ``phi(x)_p = x~[p_0] * A(x, p)`` (Definition E.1; Eq. 18 of the pullbacks paper).

    ``x~ = (x, 1)`` is the augmented input. Compute in float64 (``x.double()``) for exact checks.
    """
    with torch.no_grad():
        layers, vecs = _augmented_gates(model, x)
        phi = _outer(vecs)
    return phi[:, _valid_path_mask(layers)]


def neural_path_values(model: nn.Module, dtype: torch.dtype = torch.float64) -> Tensor:
    """``v``: ``(P, C)``, the product of the weights along each path, one column per output unit.

    ``f(x) = neural_path_features(model, x) @ neural_path_values(model)`` (Eq. 1 of the duality
    paper; Eq. 17 and 19 of the pullbacks paper).
    """
    layers = fc_layers(model)
    Ws = _augmented_weights(layers, dtype)
    v = Ws[0].T  # (a_0, a_1)
    for W in Ws[1:]:
        v = v.unsqueeze(-1) * W.T.view(*([1] * (v.dim() - 1)), *W.T.shape)
    C = v.shape[-1]
    return v.reshape(-1, C)[_valid_path_mask(layers)]


# --- slow, obviously correct references (loops over paths and layers) -------------------------


def _reference_paths(layers: list[nn.Linear]) -> list[tuple[int, ...]]:
    """All existing paths, by walking the network: returns unit tuples (constant unit = width)."""
    widths = [layers[0].in_features] + [lin.out_features for lin in layers[:-1]]
    bias = _has_bias(layers)
    paths = []
    for p in itertools.product(*[range(w + 1) for w in widths]):
        ok = True
        for l in range(len(p)):
            const = p[l] == widths[l]
            if l > 0 and const and p[l - 1] != widths[l - 1]:
                ok = False  # an ordinary unit has no edge into a constant unit
            next_ordinary = l + 1 == len(p) or p[l + 1] != widths[l + 1]
            if const and next_ordinary and not bias[l]:
                ok = False  # the bias this path would carry does not exist
        if ok:
            paths.append(p)
    return paths


def neural_path_features_reference(model: nn.Module, x: Tensor) -> Tensor:
    """Reference for :func:`neural_path_features`: a loop over samples and paths."""
    layers = fc_layers(model)
    widths = [layers[0].in_features] + [lin.out_features for lin in layers[:-1]]
    paths = _reference_paths(layers)
    out = torch.zeros(x.shape[0], len(paths), dtype=x.dtype)
    with torch.no_grad():
        for n in range(x.shape[0]):
            # forward pass written out layer by layer
            z = x[n].flatten()
            gates = []
            for lin in layers[:-1]:
                q = lin(z)
                gates.append([bool(v > 0) for v in q])
                z = torch.relu(q)
            for k, p in enumerate(paths):
                feat = 1.0 if p[0] == widths[0] else float(x[n].flatten()[p[0]])
                for l in range(1, len(p)):
                    if p[l] != widths[l] and not gates[l - 1][p[l]]:
                        feat = 0.0
                out[n, k] = feat
    return out


def neural_path_values_reference(model: nn.Module, dtype: torch.dtype = torch.float64) -> Tensor:
    """Reference for :func:`neural_path_values`: a loop over paths, outputs and layers."""
    layers = fc_layers(model)
    widths = [layers[0].in_features] + [lin.out_features for lin in layers[:-1]]
    paths = _reference_paths(layers)
    C = layers[-1].out_features

    def weight(l: int, j: int, i: int) -> float:
        # the edge from unit i of layer l to unit j of layer l + 1, in augmented form
        lin = layers[l]
        if i == widths[l]:  # from the constant unit
            if l + 1 < len(widths) and j == widths[l + 1]:
                return 1.0
            return float(lin.bias[j]) if lin.bias is not None else 0.0
        return float(lin.weight[j, i])

    out = torch.zeros(len(paths), C, dtype=dtype)
    with torch.no_grad():
        for k, p in enumerate(paths):
            for c in range(C):
                val = 1.0
                for l in range(len(p) - 1):
                    val *= weight(l, p[l + 1], p[l])
                out[k, c] = val * weight(len(p) - 1, c, p[-1])
    return out


# --- counting ------------------------------------------------------------------------------


def fc_path_count(widths: list[int], bias: bool | list[bool] = False) -> int:
    """Number of paths of a fully connected network with layer sizes ``widths = [d_in, w_1, ..., w_{L-1}, C]``.

    Input paths: ``d_in * w_1 * ... * w_{L-1} * C`` (every output unit counted). With biases, each
    layer ``l`` (1-based) with a bias adds the paths that start at its bias: ``w_l * ... * C``.
    """
    if len(widths) < 2 or any((not isinstance(w, int)) or w < 1 for w in widths):
        raise ValueError(f"widths must be >= 2 positive ints [d_in, ..., C], got {widths}")
    L = len(widths) - 1
    flags = [bias] * L if isinstance(bias, bool) else list(bias)
    if len(flags) != L:
        raise ValueError(f"bias needs one flag per layer ({L}), got {len(flags)}")
    total = 1
    for w in widths:
        total *= w
    for l in range(1, L + 1):
        if flags[l - 1]:
            prod = 1
            for w in widths[l:]:
                prod *= w
            total += prod
    return total


def conv_path_count(positions: int, kernel_taps: int, channels: list[int], fc_widths: list[int] = (),
                    num_outputs: int = 1, in_channels: int = 1) -> int:
    """Number of paths of a same-size convolutional network with a pooled (or flattened) top.

    A path starts at one of ``positions * in_channels`` input units and crosses each convolution
    through one of its ``kernel_taps`` taps into one of its ``channels[l]`` filters, then the fully
    connected units: ``positions * in_channels * prod_l (taps * c_l) * prod fc_widths * num_outputs``.
    With one input channel, ``c_l = w`` and fully connected widths ``w`` this is Proposition F.1 of
    :cite:`lakshminarayanan2022explicitising`, ``P = d_in (w_cv w)^{d_cv} w^{d_fc - 1}``.
    """
    if any(int(v) < 1 for v in [positions, kernel_taps, num_outputs, in_channels, *channels, *fc_widths]):
        raise ValueError("every size must be a positive integer")
    return positions * in_channels * math.prod(kernel_taps * c for c in channels) * math.prod(fc_widths) * num_outputs


def resnet_path_count(d_in: int, width: int, d_blk: int, b: int, num_outputs: int = 1) -> int:
    """Number of paths of the fully connected ResNet of Theorem 3.3 (:class:`dualview.nets.FCResNet`).

    Proposition G.1 of :cite:`lakshminarayanan2022explicitising`: the sub-network through ``i`` of the
    ``b`` residual blocks has ``(i + 2) d_blk - 1`` hidden layers of width ``w``, so
    ``P = d_in sum_i C(b, i) w^{(i + 2) d_blk - 1}`` (times ``num_outputs``).
    """
    if min(d_in, width, d_blk, num_outputs) < 1 or b < 0:
        raise ValueError(f"sizes must be positive (b >= 0), got d_in={d_in}, width={width}, d_blk={d_blk}, b={b}")
    return d_in * num_outputs * sum(math.comb(b, i) * width ** ((i + 2) * d_blk - 1) for i in range(b + 1))


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters (weights and biases)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@dataclass
class PathCount:
    """Paths from the input to the units of each layer.

    ``layers`` names each ReLU layer (as :func:`dualview.gates.record_gates` does) and finally
    ``"output"``. ``total[l]`` is the number of paths from any input coordinate to any unit of
    layer ``l`` (bias paths not counted); ``active[n, l]`` the number of those whose gates are all
    on for input ``n`` (including the gates of layer ``l`` itself, and max-pool windows passing
    only their winner).
    """

    layers: list[str]
    total: Tensor
    active: Tensor | None = None

    @property
    def share(self) -> Tensor:
        """Active paths as a share of all paths, ``(N, L)``."""
        if self.active is None:
            raise ValueError("no inputs were given to count_paths, so there are no active paths")
        return self.active / self.total


def _unit_network(model: nn.Module) -> nn.Module:
    """A float64 copy of ``model`` in which every edge has weight 1 and there are no biases.

    Running it on an all-ones input counts paths: each unit receives the number of paths from the
    input that reach it.
    """
    unit = copy.deepcopy(model).double().eval()
    for name, m in unit.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            with torch.no_grad():
                m.weight.fill_(1.0)
                if m.bias is not None:
                    m.bias.zero_()
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            with torch.no_grad():
                if m.affine:
                    m.weight.fill_(1.0)
                    m.bias.zero_()
                m.running_mean.zero_()
                m.running_var.fill_(1.0)
            m.eps = 0.0
        elif isinstance(m, (nn.AvgPool1d, nn.AvgPool2d)):
            k = m.kernel_size if isinstance(m.kernel_size, tuple) else (m.kernel_size,) * (
                1 if isinstance(m, nn.AvgPool1d) else 2)
            area = 1
            for s in k:
                area *= s
            m.register_forward_hook(lambda mod, a, out, area=area: out * area)
        elif isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
            def hook(mod, args, out, name=name):
                ins, outs = args[0].shape[2:], out.shape[2:]
                if any(i % o for i, o in zip(ins, outs)):
                    raise ValueError(
                        f"count_paths: adaptive pooling '{name}' maps {tuple(ins)} to {tuple(outs)} "
                        "with unequal windows; path counts need equal windows"
                    )
                area = 1
                for i, o in zip(ins, outs):
                    area *= i // o
                return out * area
            m.register_forward_hook(hook)
        elif (not list(m.children())) and not isinstance(
            m, (nn.ReLU, nn.Flatten, nn.Identity, nn.Dropout, nn.Sequential, nn.ModuleList, nn.ModuleDict)
            + POOL_GATE_LAYERS
        ):
            rule = _UNIT_RULES.get(type(m)) or getattr(type(m), "unit_weights", None)
            if rule is None:
                raise TypeError(
                    f"count_paths does not know how paths cross layer '{name}' ({type(m).__name__}); "
                    "give its class a unit_weights() method, or register its unit-weight version with "
                    "dualview.paths.register_unit_rule"
                )
            parent, _, child = name.rpartition(".")
            setattr(unit.get_submodule(parent) if parent else unit, child, rule(m))
    return unit


_UNIT_RULES: dict[type, object] = {}


def register_unit_rule(cls: type[nn.Module], rule) -> None:
    """Tell :func:`count_paths` how paths cross a custom linear layer (for a class you cannot edit;
    a class of your own can define a ``unit_weights()`` method instead).

    ``rule(module)`` returns the module's unit-weight version: the layer with every edge weight
    set to 1 and no offsets (e.g. a per-channel normalisation becomes ``nn.Identity()``; a fixed
    selection such as a subsampling shortcut stays as it is).
    """
    _UNIT_RULES[cls] = rule


def count_paths(model: nn.Module, x: Tensor | None = None, input_shape: tuple[int, ...] | None = None,
                batch_size: int = 250) -> PathCount:
    """Count the paths of any supported network, and the active ones for inputs ``x``, without enumerating them.

    Runs a unit-weight copy of the network (every edge weight 1, no biases, float64) on an all-ones
    input. For the total count every gate is on and every max-pool window passes all its inputs;
    for input ``x`` the copy runs with ``x``'s gates and max-pool winners imposed (GaLU mode), so
    each unit receives the number of active paths reaching it. Give ``x`` (``(N, ...)``) or
    ``input_shape`` (one input's shape, without the batch dimension).
    """
    if x is None and input_shape is None:
        raise ValueError("give the inputs x or the input_shape of one input")
    shape = tuple(x.shape[1:]) if x is not None else tuple(input_shape)
    unit = _unit_network(model)
    ones = torch.ones((1, *shape), dtype=torch.float64)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    unit = unit.to(device)
    ones = ones.to(device)

    def run(gates=None, pools=None, n=1):
        sums: dict[str, Tensor] = {}

        def on_gate(name, module, q):
            z = q if gates is None else q * gates[name].to(q.dtype)
            sums[name] = z.flatten(1).sum(1)
            return z

        def on_pool(name, module, inp, out):
            if pools is None:  # every window passes all of its inputs: a sum pool
                fn = F.avg_pool1d if inp.dim() == 3 else F.avg_pool2d
                if module.dilation not in (1, (1, 1)):
                    raise ValueError(f"count_paths: dilated max-pool '{name}' is not supported")
                k = module.kernel_size
                area = k if isinstance(k, int) else k[0] * k[1]
                if inp.dim() == 4 and isinstance(k, int):
                    area = k * k
                return fn(inp, module.kernel_size, module.stride, module.padding,
                          ceil_mode=module.ceil_mode, count_include_pad=True) * area
            return inp.flatten(2).gather(2, pools[name].flatten(2)).view(out.shape)

        with torch.no_grad(), instrument(unit, on_gate, on_pool):
            out = unit(ones.expand(n, *shape))
        sums["output"] = out.flatten(1).sum(1)
        return sums

    totals = run()
    names = list(totals)
    total = torch.stack([totals[k][0] for k in names]).cpu()
    active = None
    if x is not None:
        rows = []
        with torch.no_grad():
            for chunk in x.split(batch_size):
                rec = record_gates(model, chunk)
                counts = run(rec.gates, rec.pool_indices, n=chunk.shape[0])
                rows.append(torch.stack([counts[k] for k in names], dim=1).cpu())
        active = torch.cat(rows)
    return PathCount(layers=names, total=total, active=active)
