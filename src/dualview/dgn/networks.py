"""Part of :mod:`dualview.dgn` (see its docstring)."""
from __future__ import annotations

import contextlib
import copy
import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from dualview.architectures import (Architecture, LinearSite, gate_sites, replace_gate_sites, site_shapes)
from dualview.gates import UnsupportedLayerError, check_supported


class GaLU(nn.Module):
    """Gated linear unit ``z = q * G`` :cite:`fiat2019decoupling`: multiplies its input by a gate
    supplied from outside.

    The owning :class:`GatedNetwork` hands each GaLU its gate for one call (``self.gate``); the call
    uses it up, so a GaLU called without a gate (outside its network, or twice in one pass) is an error.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gate: Tensor | None = None

    def forward(self, q: Tensor) -> Tensor:
        g, self.gate = self.gate, None
        if g is None:
            raise RuntimeError("a GaLU was called without a gate: run the value network through its GatedNetwork "
                               "(and use one activation module per use, not one module called twice)")
        if g.shape != q.shape:
            raise ValueError(f"a gate of shape {tuple(g.shape)} reached a GaLU whose input has shape "
                             f"{tuple(q.shape)}: gates can only move between gate layers of the same shape")
        return q * g


@contextlib.contextmanager
def _site_inputs(sites: Sequence[nn.Module]) -> Iterator[list[Tensor]]:
    """Inside the block, collect the input of each of ``sites``; the list is in the order of ``sites``
    and complete after the block, which checks that every site was called exactly once."""
    captured: list = [None] * len(sites)
    calls = [0] * len(sites)

    def hook(k: int):
        def pre(module, args):
            calls[k] += 1
            captured[k] = args[0]
        return pre

    handles = [s.register_forward_pre_hook(hook(k)) for k, s in enumerate(sites)]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()
    if calls != [1] * len(sites):
        raise RuntimeError(f"every gate site must be called once per forward pass; the calls per site were "
                           f"{calls}: use one activation module per use (GatedNetwork.from_model makes "
                           "such a copy of a traceable model, e.g. a torchvision ResNet)")


# --------------------------------------------------------------------------------------------------
# Gating networks


class DeepGating(nn.Module):
    """A full network used as gating network: its ReLUs (DGN) or :class:`~dualview.architectures.LinearSite`
    identities (DLGN) are the gate sites.

    ``net`` is an ordinary network (its own output is the gating network's prediction, used to
    pretrain it); ``preactivations`` runs it and returns the input of every gate site.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = _check_network(net, "gating")
        self._sites = gate_sites(net)  # a plain list (not registered twice): the site modules of net
        self.num_sites = len(self._sites)
        if any(getattr(site, "inplace", False) for site in self._sites):
            raise ValueError("the gating network has in-place ReLUs, which overwrite the pre-activations the "
                             "gates are read from: build it with nn.ReLU() (inplace=False)")

    @property
    def linear(self) -> bool:
        """True if the gating network has no ReLUs (a DLGN); max-pooling may still make it non-linear."""
        return all(isinstance(s, LinearSite) for s in self._sites)

    @property
    def affine(self) -> bool:
        """True if every pre-activation is an affine function of the input (no ReLU, no max-pool)."""
        return self.linear and not any(isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)) for m in self.net.modules())

    def preactivations(self, x: Tensor) -> list[Tensor]:
        with _site_inputs(self._sites) as q:
            self.net(x)
        return q

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class ShallowGating(nn.Module):
    """Shallow-feature gating (DLGN-SF, Section 3.3 of :cite:`lakshminarayanan2022disentangling`;
    VGG-DLGN-SHALLOW, Figure 8 of :cite:`lakshminarayanan2022explicitising`): the pre-activations of
    gate layer ``l`` come from the input through one linear layer of their own.

    FC: ``Linear(d_in, w_l)``. Convolutional: average-pool the input down to layer ``l``'s resolution,
    then one ``k x k`` convolution to its channels (then batch norm if the architecture has it).
    """

    linear = True
    affine = True

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        if arch.family == "resnet":
            raise ValueError("shallow gating is built for FC, conv-GAP and VGG architectures, not ResNets")
        branches = []
        for shape in site_shapes(arch):
            if arch.family == "fc":
                branches.append(nn.Sequential(nn.Flatten(), nn.Linear(arch.in_features, shape[0])))
                continue
            c, h, _ = shape
            factor = arch.in_shape[1] // h
            layers: list[nn.Module] = [nn.AvgPool2d(factor)] if factor > 1 else []
            layers.append(nn.Conv2d(arch.in_shape[0], c, arch.kernel_size, padding=arch.kernel_size // 2,
                                    padding_mode=arch.padding_mode, bias=not arch.batch_norm))
            if arch.batch_norm:
                layers.append(nn.BatchNorm2d(c))
            branches.append(nn.Sequential(*layers))
        self.branches = nn.ModuleList(branches)
        self.num_sites = len(branches)

    def preactivations(self, x: Tensor) -> list[Tensor]:
        return [branch(x) for branch in self.branches]


# --------------------------------------------------------------------------------------------------
# The gated network


@dataclass
class GatedTrace:
    """Everything a :class:`GatedNetwork` computes for one batch, one list entry per gate site.

    ``gating_preactivations[l]`` is ``q^g_l``; ``gates[l]`` the gate applied at *value* site ``l``
    (``G_{pi(l)}``); ``value_preactivations[l]`` the GaLU input ``q^v_l`` and ``value_outputs[l]``
    its output ``q^v_l * gates[l]``; ``gating_outputs[l]`` the gating network's own layer output
    (``ReLU(q^g_l)`` in a DGN, ``q^g_l`` in a DLGN).
    """

    output: Tensor
    gating_preactivations: list[Tensor]
    gating_outputs: list[Tensor]
    gates: list[Tensor]
    value_preactivations: list[Tensor]
    value_outputs: list[Tensor]


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0 (0: hard gates 1{{q > 0}}; the papers' soft "
                         f"gates sigmoid(10 q) are temperature 0.1), got {temperature!r}")
    return float(temperature)


class GatedNetwork(nn.Module):
    """A DGN or DLGN: gating network, gate function, gate-layer permutation and value network of GaLUs.

    ``forward(x) = value(x_v)`` where GaLU ``l`` of the value network multiplies by ``G(q^g_{pi(l)}(x))``,
    ``G`` the hard (``temperature = 0``) or soft gate (Appendix D.1 of
    :cite:`lakshminarayanan2022explicitising`, whose ``beta`` is ``1 / temperature``), and ``x_v`` is ``x``
    or ``ones_like(x)`` (``value_input``); ``permutation[l]`` is the gating site whose gates value site
    ``l`` receives (identity if None).

    ``value`` is a network of ``nn.ReLU`` modules (one per use, as :mod:`dualview.gates` requires),
    ``gating`` one with as many ReLUs (or :class:`~dualview.architectures.LinearSite` identities), or a
    :class:`DeepGating` / :class:`ShallowGating`. Both are copied, yours are never modified; the copy of
    ``value`` gets a :class:`GaLU` in place of each ReLU, the copy of ``gating`` has its in-place ReLUs turned
    off (so torchvision models can serve as gating networks). Networks without ``nn.ReLU`` modules (a
    functional ``F.relu`` in ``forward``) are refused: their gates cannot be read or imposed;
    :meth:`from_model` first gives every ReLU call its own module (:func:`one_relu_per_use`).
    ``frozen=True`` (pretrained or fixed gates) keeps
    the gating network in eval mode without gradients: ``GatedNetwork(value, gating)`` runs ``value`` with
    the fixed gates of ``gating``, whose NTK in the value weights (``empirical_ntk(..., params="value")``)
    the NPK theorems describe (Section 2 of :cite:`lakshminarayanan2022explicitising`). :func:`build`
    makes the papers' networks from an :class:`~dualview.architectures.Architecture` (``arch``).
    """

    def __init__(self, value: nn.Module, gating: nn.Module, *, value_input: Literal["x", "ones"] = "x",
                 temperature: float = 0.0, permutation: Sequence[int] | None = None, frozen: bool = True,
                 arch: Architecture | None = None) -> None:
        super().__init__()
        if value_input not in ("x", "ones"):
            raise ValueError(f"value_input must be 'x' or 'ones', got {value_input!r}")
        for name, net in (("value", value), ("gating", gating)):
            if not isinstance(net, nn.Module):
                raise TypeError(f"{name} must be a network (an nn.Module), got {type(net).__name__}")
        gating = copy.deepcopy(gating)
        for m in gating.modules():  # our copy: in-place ReLUs (torchvision's) would overwrite the gates' input
            if isinstance(m, nn.ReLU):
                m.inplace = False
        self.gating = gating if isinstance(gating, (DeepGating, ShallowGating)) else DeepGating(gating)
        self.value = replace_gate_sites(_check_network(copy.deepcopy(value), "value"), GaLU)
        self._value_sites = [m for m in self.value.modules() if isinstance(m, GaLU)]  # in module order
        n, n_gating = len(self._value_sites), self.gating.num_sites
        if n == 0 or n_gating == 0:
            raise UnsupportedLayerError(
                f"the {'value' if n == 0 else 'gating'} network has no gate sites (no nn.ReLU module): a ReLU "
                "applied as a function in forward (F.relu, torch.relu, x.relu()) cannot be gated, so the "
                "gated network would ignore the gating network. Use one nn.ReLU module per use in both, or "
                "GatedNetwork.from_model(value, gating), which does that for traceable models.")
        if n_gating != n:
            raise ValueError(f"the value network has {n} ReLUs but the gating network {n_gating} gate sites: "
                             "both need the same architecture")
        perm = tuple(range(n)) if permutation is None else tuple(int(i) for i in permutation)
        if sorted(perm) != list(range(n)):
            raise ValueError(f"permutation must be a permutation of range({n}) (one entry per gate site), "
                             f"got {tuple(permutation)}")
        self.permutation = perm
        self.value_input = value_input
        self.temperature = _check_temperature(temperature)
        self.frozen = frozen
        self.arch = arch
        if frozen:
            self.gating.requires_grad_(False)
            self.gating.eval()

    @property
    def kind(self) -> str:
        return "dlgn" if self.gating.linear else "dgn"

    @property
    def mode(self) -> str:
        """``"pg"`` (pretrained or fixed gates: frozen gating network) or ``"st"`` (standalone: both trained)."""
        return "pg" if self.frozen else "st"

    def train(self, mode: bool = True) -> GatedNetwork:
        super().train(mode)
        if self.frozen:  # pretrained gates stay fixed, batch-norm statistics included
            self.gating.eval()
        return self

    def gate(self, q: Tensor) -> Tensor:
        """``1{q > 0}`` (``temperature = 0``) or ``sigmoid(q / temperature)``, Appendix D.1 of
        :cite:`lakshminarayanan2022explicitising`."""
        if self.temperature == 0:
            return (q > 0).to(q.dtype)
        return torch.sigmoid(q * (1 / self.temperature))  # 1 / 0.1 == 10.0 exactly: the papers' beta q

    def gating_preactivations(self, x: Tensor) -> list[Tensor]:
        """``q^g_l(x)`` for every gate site ``l`` of the gating network (unpermuted)."""
        return self.gating.preactivations(x)

    def value_gates(self, q: Sequence[Tensor]) -> list[Tensor]:
        """The gates of the value sites from the gating pre-activations ``q``: site ``l`` gets
        ``G(q[pi(l)])``. The one place where the permutation is applied."""
        return [self.gate(q[i]) for i in self.permutation]

    def _run_value(self, x: Tensor, gates: list[Tensor]) -> Tensor:
        for site, g in zip(self._value_sites, gates):
            site.gate = g
        try:
            return self.value(torch.ones_like(x) if self.value_input == "ones" else x)
        finally:
            for site in self._value_sites:
                site.gate = None

    def forward(self, x: Tensor) -> Tensor:
        return self._run_value(x, self.value_gates(self.gating_preactivations(x)))

    def trace(self, x: Tensor) -> GatedTrace:
        """Run the network and return every intermediate of :class:`GatedTrace` (for figures and tests)."""
        q = self.gating_preactivations(x)
        gates = self.value_gates(q)
        with _site_inputs(self._value_sites) as qv:
            out = self._run_value(x, gates)
        own = [qi if self.gating.linear else torch.relu(qi) for qi in q]
        return GatedTrace(out, q, own, gates, list(qv), [a * g for a, g in zip(qv, gates)])

    @classmethod
    def from_model(cls, value: nn.Module, gating: nn.Module | None = None, **options) -> GatedNetwork:
        """A gated network from models written without its conventions (torchvision's ResNets: one in-place
        ReLU module called twice per block; ``F.relu`` in ``forward``): ``value`` and ``gating`` (default: a
        copy of ``value``, the network's own gates) pass through :func:`one_relu_per_use` first. ``options``
        as for :class:`GatedNetwork`. Your models are never modified."""
        return cls(one_relu_per_use(value), one_relu_per_use(value if gating is None else gating), **options)

    def extra_repr(self) -> str:
        perm = "identity" if self.permutation == tuple(range(len(self.permutation))) else str(self.permutation)
        return (f"arch={self.arch.name if self.arch else None}, kind={self.kind}, mode={self.mode}, "
                f"value_input={self.value_input!r}, temperature={self.temperature:g}, permutation={perm}")


def _check_network(net: nn.Module, name: str) -> nn.Module:
    """``net`` (a copy of ours) must hold only layers :mod:`dualview.gates` supports; checked in eval mode,
    because batch norm in training mode is fine for training a gated network."""
    modes = [(m, m.training) for m in net.modules()]
    net.eval()
    try:
        check_supported(net)
    except TypeError as err:
        raise type(err)(f"the {name} network: {err}") from err
    finally:
        for m, training in modes:
            m.training = training
    return net


_FUNCTIONAL_RELUS = (F.relu, torch.relu, torch.relu_, torch.nn.functional.relu_)


def one_relu_per_use(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in which every ReLU *call* is a module of its own, ``nn.ReLU(inplace=False)``, as
    :class:`GatedNetwork` needs (a gate site is a module called once per forward pass).

    The copy is ``model`` traced by ``torch.fx`` (same submodules and ``state_dict`` keys, same outputs): a
    ReLU module called ``k > 1`` times gets ``k - 1`` new siblings named ``<name>_1``, ``<name>_2``, ...; a
    functional ReLU (``F.relu``, ``torch.relu``, ``x.relu()``) becomes a module ``relu_fn_<i>`` of the root;
    in-place ReLUs become out-of-place. ``model`` itself is never modified. Raises
    :class:`~dualview.gates.UnsupportedLayerError` if ``model`` cannot be traced (control flow on values), or
    if an in-place ReLU's input is read again after it (out of place, the later read would change).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    try:
        traced = torch.fx.symbolic_trace(copy.deepcopy(model))
    except Exception as err:  # fx raises many types (TraceError, TypeError, ...) for untraceable code
        raise UnsupportedLayerError(
            f"one_relu_per_use could not trace {type(model).__name__} with torch.fx "
            f"({type(err).__name__}: {err}); write it with one nn.ReLU module per use instead") from err
    graph, uses, order = traced.graph, Counter(), {n: i for i, n in enumerate(traced.graph.nodes)}
    for node in list(graph.nodes):
        module = traced.get_submodule(node.target) if node.op == "call_module" else None
        functional = (node.op == "call_function" and node.target in _FUNCTIONAL_RELUS) or \
            (node.op == "call_method" and node.target in ("relu", "relu_"))
        if type(module) is not nn.ReLU and not functional:
            continue
        name = str(getattr(node.target, "__name__", node.target))
        inplace = module.inplace if module is not None else \
            name.endswith("_") or bool(node.kwargs.get("inplace"))
        source = node.args[0]
        if inplace and isinstance(source, torch.fx.Node) and \
                any(order[user] > order[node] for user in source.users if user is not node):
            raise UnsupportedLayerError(
                f"an in-place ReLU ({node.target}) overwrites a tensor that forward reads again later: made "
                "out of place, that later read would see the pre-activation instead; write it with "
                "inplace=False")
        if module is not None:
            k = uses[node.target]
            uses[node.target] += 1
            if k == 0:
                module.inplace = False
                continue
            name = f"{node.target}_{k}"
            traced.add_submodule(name, nn.ReLU())
            node.target = name
        else:
            name = f"relu_fn_{sum(1 for n, _ in traced.named_children() if n.startswith('relu_fn_'))}"
            traced.add_submodule(name, nn.ReLU())
            with graph.inserting_before(node):
                new = graph.call_module(name, (source,))
            node.replace_all_uses_with(new)
            graph.erase_node(node)
    graph.lint()
    traced.recompile()
    return traced


