"""Part of :mod:`dualview.paths` (see its docstring)."""
from __future__ import annotations

import itertools
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from dualview.gates import record_gates
from dualview.surrogates import check_temperature, soft_gates


def fc_layers(model: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` layers of a fully connected ReLU network ``Sequential([Flatten], Linear, ReLU, ..., Linear)``.

    Raises ``TypeError`` naming the offending layer for anything else: explicit path enumeration is
    defined here for fully connected networks only (use :func:`count_paths` for convolutional ones).
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"explicit path enumeration needs an nn.Sequential of Linear and ReLU layers, got "
                        f"{type(model).__name__}; for other architectures use dualview.paths.count_paths")
    mods = list(model.named_children())
    if mods and isinstance(mods[0][1], nn.Flatten):
        mods = mods[1:]
    linears: list[nn.Linear] = []
    for i, (name, m) in enumerate(mods):
        want = nn.Linear if i % 2 == 0 else nn.ReLU
        if not isinstance(m, want):
            raise TypeError(f"layer '{name}' is {type(m).__name__}, expected {want.__name__}: explicit path "
                            "enumeration supports Sequential([Flatten], Linear, ReLU, Linear, ..., Linear)")
        if isinstance(m, nn.Linear):
            linears.append(m)
    if not linears or len(mods) % 2 == 0:
        raise TypeError("the network must start and end with an nn.Linear layer")
    return linears


def _augmented_weights(layers: list[nn.Linear], dtype: torch.dtype) -> list[Tensor]:
    """``W~_l = [[W_l, b_l], [0, 1]]`` for hidden layers and ``[W_L, b_L]`` for the output layer."""
    out = []
    for k, lin in enumerate(layers):
        W = lin.weight.detach().to(dtype)
        b = lin.bias.detach().to(dtype) if lin.bias is not None else W.new_zeros(W.shape[0])
        Wt = torch.cat([W, b[:, None]], dim=1)
        if k < len(layers) - 1:  # the constant unit's row: it passes its 1 on
            Wt = torch.cat([Wt, F.one_hot(torch.tensor([W.shape[1]], device=W.device), W.shape[1] + 1).to(Wt)], dim=0)
        out.append(Wt)
    return out


def _valid_path_mask(layers: list[nn.Linear]) -> Tensor:
    """Bool mask over the augmented path grid ``(a_0, ..., a_{L-1})`` of the paths that exist."""
    sizes = [layers[0].in_features + 1] + [lin.out_features + 1 for lin in layers[:-1]]
    L, dev = len(sizes), layers[0].weight.device
    # const[l]: the path sits on the constant unit of layer l. A path exists iff it never steps from an
    # ordinary unit to a constant unit and the bias it carries exists: a path whose last constant unit
    # is at layer j carries the bias of layer j + 1.
    const = [(torch.arange(a, device=dev) == a - 1).view([a if k == l else 1 for k in range(L)])
             for l, a in enumerate(sizes)]
    mask = torch.ones(sizes, dtype=torch.bool, device=dev)
    for l in range(1, L):
        mask &= ~(const[l] & ~const[l - 1])
    for j, lin in enumerate(layers):
        if lin.bias is None:
            mask &= ~(const[j] & (~const[j + 1] if j + 1 < L else True))
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


def _augmented_gates(model: nn.Module, x: Tensor, temperature: float) -> tuple[list[nn.Linear], list[Tensor]]:
    layers = fc_layers(model)
    x = x.flatten(1)
    if x.shape[1] != layers[0].in_features:
        raise ValueError(
            f"input has {x.shape[1]} features per sample, the network expects {layers[0].in_features}"
        )
    rec = record_gates(model, x)
    ones = x.new_ones(x.shape[0], 1)
    gates = [torch.cat([g.to(x.dtype), ones], dim=1) for g in soft_gates(rec.preactivations, temperature).values()]
    return layers, [torch.cat([x, ones], dim=1)] + gates


def _outer(vectors: list[Tensor]) -> Tensor:
    """Batched outer product ``v_0 ⊗ v_1 ⊗ ...`` of ``(N, a_l)`` tensors, flattened to ``(N, prod a_l)``."""
    t = vectors[0]
    for v in vectors[1:]:
        t = t.unsqueeze(-1) * v.view(v.shape[0], *([1] * (t.dim() - 1)), v.shape[1])
    return t.flatten(1)


def path_activity(model: nn.Module, x: Tensor, temperature: float = 0.0) -> Tensor:
    """``A(x, p)``: for each input and path, the product of the gates along it, ``(N, P)``.

    ``temperature = 0``: the hard gates, so ``A`` says whether every gate on the path is on (bool).
    ``temperature > 0``: the soft gates ``sigmoid(q / temperature)`` of the excitation function, so
    ``A_tau(x, p) = prod_l sigmoid(z_l(x)[p_l] / temperature)`` (floats; Eq. 13-15 of
    :cite:`satkiewicz2025tapping`). Constant (bias) units have gate 1.
    """
    with torch.no_grad():
        layers, vecs = _augmented_gates(model, x, temperature)
        act = _outer([torch.ones_like(vecs[0])] + vecs[1:])[:, _valid_path_mask(layers)]
    return act.bool() if temperature == 0 else act


def neural_path_features(model: nn.Module, x: Tensor, temperature: float = 0.0) -> Tensor:
    """``phi(x)``: ``(N, P)``, ``phi(x)_p = x~[p_0] * A(x, p)`` (Definition E.1; Eq. 18 of the pullbacks paper).

    ``x~ = (x, 1)`` is the augmented input. With ``temperature > 0`` the gates are soft
    (:func:`path_activity`), and ``phi_tau(x) @ neural_path_values(model)`` is the output of the
    soft-gated network (Eq. 19-20 of :cite:`satkiewicz2025tapping`). Compute in float64
    (``x.double()``) for exact checks.
    """
    with torch.no_grad():
        layers, vecs = _augmented_gates(model, x, temperature)
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
    bias = [lin.bias is not None for lin in layers]
    paths = []
    for p in itertools.product(*[range(w + 1) for w in widths]):
        const = [p[l] == widths[l] for l in range(len(p))]
        # an ordinary unit has no edge into a constant unit
        reenters = any(const[l] and not const[l - 1] for l in range(1, len(p)))
        # the bias a path carries (that of the layer after its last constant unit) must exist
        no_bias = any(const[l] and (l + 1 == len(p) or not const[l + 1]) and not bias[l] for l in range(len(p)))
        if not (reenters or no_bias):
            paths.append(p)
    return paths


def neural_path_features_reference(model: nn.Module, x: Tensor, temperature: float = 0.0) -> Tensor:
    """Reference for :func:`neural_path_features`: a forward pass written out layer by layer, then a
    loop over samples, paths and layers."""
    t = check_temperature(temperature)
    layers = fc_layers(model)
    widths = [layers[0].in_features] + [lin.out_features for lin in layers[:-1]]
    paths = _reference_paths(layers)
    out = torch.zeros(x.shape[0], len(paths), dtype=x.dtype, device=x.device)
    with torch.no_grad():
        for n in range(x.shape[0]):
            z = x[n].flatten()
            gates = []
            for lin in layers[:-1]:
                q = lin(z)
                gates.append([float(v > 0) if t == 0 else float(torch.sigmoid(v / t)) for v in q])
                z = torch.relu(q)
            for k, p in enumerate(paths):
                feat = 1.0 if p[0] == widths[0] else float(x[n].flatten()[p[0]])
                for l in range(1, len(p)):
                    if p[l] != widths[l]:  # constant units have gate 1
                        feat *= gates[l - 1][p[l]]
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

    out = torch.zeros(len(paths), C, dtype=dtype, device=layers[0].weight.device)
    with torch.no_grad():
        for k, p in enumerate(paths):
            for c in range(C):
                val = 1.0
                for l in range(len(p) - 1):
                    val *= weight(l, p[l + 1], p[l])
                out[k, c] = val * weight(len(p) - 1, c, p[-1])
    return out


