"""Part of :mod:`dualview.dgn` (see its docstring)."""
from __future__ import annotations

import copy
import itertools
from typing import Literal, Sequence
import torch
from torch import Tensor, nn
from dualview.architectures import (Architecture, LinearSite, gate_sites, replace_gate_sites, site_blocks,
                                    site_shapes)
from dualview.gates import record_gates, run_with_gates
from dualview.dgn.networks import DeepGating, GaLU, GatedNetwork, ShallowGating, _check_temperature


# --------------------------------------------------------------------------------------------------
# Building the papers' networks


def _check_choice(name: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _check_permutation(arch: Architecture, permutation: Sequence[int]) -> tuple[int, ...]:
    shapes = site_shapes(arch)
    n = len(shapes)
    perm = tuple(int(i) for i in permutation)
    if sorted(perm) != list(range(n)):
        raise ValueError(f"permutation must be a permutation of range({n}) (one entry per gate site of "
                         f"{arch.name}), got {tuple(permutation)}")
    for value_site, gating_site in enumerate(perm):
        if shapes[gating_site] != shapes[value_site]:
            raise ValueError(
                f"permutation sends the gates of gating layer {gating_site} (shape {shapes[gating_site]}) to "
                f"value layer {value_site} (shape {shapes[value_site]}): gates can only move between layers of "
                f"the same shape. Permute within the blocks of {arch.name} ({site_blocks(arch)}), e.g. "
                f"reverse_within_blocks(arch) = {reverse_within_blocks(arch)}"
            )
    return perm


def build(arch: Architecture, kind: Literal["dnn", "linear", "dgn", "dlgn"] = "dnn", *, value_input: Literal["x", "ones"] = "x",
          gating: Literal["deep", "shallow"] = "deep", temperature: float | None = None,
          permutation: Sequence[int] | None = None, pretrained: nn.Module | None = None) -> nn.Module:
    """Build the network ``kind`` of architecture ``arch``.

    * ``"dnn"``: the ReLU network; ``"linear"``: the same with every ReLU replaced by the identity
      (CONV1-LIN, VGG-LIN, VGG-LIN-MAX of Figure 4 of :cite:`lakshminarayanan2022explicitising`);
    * ``"dgn"`` / ``"dlgn"``: a :class:`GatedNetwork` whose gating network has ReLUs / none.
      ``value_input``: ``"x"`` or ``"ones"`` (constant input to the value network);
      ``gating="shallow"``: shallow-feature gating (DLGN only, it is linear);
      ``temperature``: 0 for hard gates ``1{q > 0}``, else soft gates ``sigmoid(q / temperature)``
      (default: 0.1, the papers' ``beta = 10``, for standalone training; 0 with ``pretrained``);
      ``permutation[l]`` is the gating layer whose gates value layer ``l`` receives (only between
      layers of equal shape); ``pretrained``: a trained DNN of the same architecture used, frozen, as
      gating network (pretrained-gates mode, PG); it is copied, never modified. Without it both
      networks are initialised at random and trained together (standalone mode, ST).
    """
    if not isinstance(arch, Architecture):
        raise TypeError(f"arch must be an Architecture (e.g. Architecture.fc(), Architecture.c4gap()), "
                        f"got {type(arch).__name__}")
    _check_choice("kind", kind, ("dnn", "linear", "dgn", "dlgn"))
    _check_choice("value_input", value_input, ("x", "ones"))
    _check_choice("gating", gating, ("deep", "shallow"))
    if kind in ("dnn", "linear"):
        options = dict(value_input=value_input == "x", gating=gating == "deep", temperature=temperature is None,
                       permutation=permutation is None, pretrained=pretrained is None)
        bad = [k for k, ok in options.items() if not ok]
        if bad:
            raise ValueError(f"{', '.join(bad)} only apply to gated networks (kind 'dgn' or 'dlgn'), not to {kind!r}")
        return arch.network(linear=kind == "linear")
    temperature = _check_temperature((0.0 if pretrained is not None else 0.1) if temperature is None else temperature)
    if gating == "shallow" and kind == "dgn":
        raise ValueError("shallow gating is linear (one linear layer per gate layer): use kind='dlgn' "
                         "(the DLGN-SF of the papers)")
    if pretrained is not None:
        if gating == "shallow":
            raise ValueError("pretrained gates come from a deep network: use gating='deep' with pretrained=")
        if not isinstance(pretrained, nn.Module):
            raise TypeError(f"pretrained must be the trained network (an nn.Module), got {type(pretrained).__name__}")
        pre_sites = gate_sites(pretrained)
        want_linear = kind == "dlgn"
        if len(pre_sites) != len(site_shapes(arch)) or any(isinstance(s, LinearSite) != want_linear for s in pre_sites):
            raise ValueError(
                f"pretrained must be a {'linear network' if want_linear else 'DNN'} of architecture {arch.name} "
                f"(build(arch, {'linear' if want_linear else 'dnn'!r}) trained), with {len(site_shapes(arch))} "
                f"gate sites; it has {len(pre_sites)}"
            )
        gating_net = pretrained
    else:
        gating_net = arch.network(linear=kind == "dlgn")
    gating_module = ShallowGating(arch) if gating == "shallow" else gating_net
    perm = _check_permutation(arch, permutation if permutation is not None else range(len(site_shapes(arch))))
    model = GatedNetwork(arch.network(), gating_module, value_input=value_input, temperature=temperature,
                         permutation=perm, frozen=pretrained is not None, arch=arch)
    reference = next(pretrained.parameters(), None) if pretrained is not None else None
    return model.to(reference.device) if reference is not None else model  # next to the pretrained gates


# --------------------------------------------------------------------------------------------------
# Gate-layer permutations


def reverse_within_blocks(arch: Architecture) -> tuple[int, ...]:
    """The permutation the papers use for VGG and ResNet: the gates of each block in reverse order
    (Figure 6 of :cite:`lakshminarayanan2022explicitising`). For FC/conv-GAP: all sites reversed."""
    perm: list[int] = []
    for block in site_blocks(arch):
        perm.extend(reversed(block))
    return tuple(perm)


def sample_permutations(n: int, k: int | None = None, seed: int = 0) -> list[tuple[int, ...]]:
    """``k`` distinct non-identity permutations of ``range(n)`` (all ``n! - 1`` if ``k`` is None),
    in a seeded random order; for FC4 / C4GAP, ``n = 4`` gives the papers' 23 permutations."""
    if n < 2 or n > 8:
        raise ValueError(f"n must be between 2 and 8 (n! permutations are listed), got {n}")
    everything = [p for p in itertools.permutations(range(n)) if p != tuple(range(n))]
    if k is None:
        k = len(everything)
    if not 1 <= k <= len(everything):
        raise ValueError(f"k must be between 1 and {len(everything)} for n = {n}, got {k}")
    order = torch.randperm(len(everything), generator=torch.Generator().manual_seed(seed))[:k]
    return [everything[i] for i in order.tolist()]


def gated_forward_reference(model: GatedNetwork, x: Tensor) -> Tensor:
    """The output of a DGN with hard gates computed with :mod:`dualview.gates` instead of GaLU modules.

    The gating network's ReLU gates are recorded with :func:`dualview.gates.record_gates`; a copy of
    the value network with ReLUs in place of GaLUs is run with :func:`dualview.gates.run_with_gates`,
    its ``l``-th ReLU (in module order) given the recorded gate of the gating network's ReLU ``pi(l)``.
    A slow, independent check of :meth:`GatedNetwork.forward`.
    """
    if model.temperature != 0 or not isinstance(model.gating, DeepGating) or model.gating.linear:
        raise ValueError("the reference covers DGNs with deep ReLU gating and hard gates (temperature 0)")
    rec = record_gates(model.gating.net, x)
    gating_names = [n for n, m in model.gating.net.named_modules() if isinstance(m, nn.ReLU)]
    relu_value = replace_gate_sites(copy.deepcopy(model.value), nn.ReLU, sites=(GaLU,))
    value_names = [n for n, m in relu_value.named_modules() if isinstance(m, nn.ReLU)]
    given = {name: rec.gates[gating_names[model.permutation[l]]] for l, name in enumerate(value_names)}
    xv = torch.ones_like(x) if model.value_input == "ones" else x
    return run_with_gates(relu_value, xv, given)
