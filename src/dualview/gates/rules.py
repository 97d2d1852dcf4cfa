"""What happens at the gates of an instrumented model: :class:`Rule` and the two rules every computation uses,
:class:`Record` and :class:`ImposeGates`, and the record of a batch's gates, :class:`GateRecord`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch.nn.functional as F
from torch import Tensor, nn

from dualview.gates.layers import CLIPPED_LAYERS, LEAKY_LAYERS, clip_ceiling, leaky_slope

@dataclass
class GateRecord:
    """Pre-activations and gates of every ReLU, and max-pool winners, for one batch.

    ``preactivations[name]`` is the input ``q`` of the ReLU call ``name`` (shape ``(N, ...)``),
    ``gates[name] = q > 0``. A module called more than once in one forward gets one entry per
    call, named ``name``, ``name#1``, ``name#2``, ... . ``pool_indices[name]`` holds, for a
    max-pool, the flat index (within each channel's input map) of the winner of every window, as
    ``return_indices=True`` gives it. Entries are in the order the forward pass reached them.
    ``ceilings[name]`` is the ceiling ``t`` of a hard-clipped ReLU call (``nn.ReLU6``: 6), whose gate is
    ``0 < q < t`` and whose saturated piece is ``q >= t`` (:attr:`saturated`).
    """

    output: Tensor
    preactivations: dict[str, Tensor] = field(default_factory=dict)
    pool_indices: dict[str, Tensor] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)

    @property
    def gates(self) -> dict[str, Tensor]:
        """``{name: q > 0}`` for every ReLU call, ``{name: (q > 0) & (q < t)}`` for every hard-clipped ReLU
        call (bool tensors; the ties get slope 0, as in PyTorch's backward)."""
        return {k: (q > 0) & (q < self.ceilings[k]) if k in self.ceilings else q > 0
                for k, q in self.preactivations.items()}

    @property
    def saturated(self) -> dict[str, Tensor]:
        """``{name: q >= t}`` for every hard-clipped ReLU call (bool): the units that output the constant
        ``t``."""
        return {k: self.preactivations[k] >= t for k, t in self.ceilings.items()}

    @property
    def names(self) -> list[str]:
        return list(self.preactivations)

    def num_gates(self) -> dict[str, int]:
        """Number of gates (ReLU units) per layer, for one input."""
        return {k: q[0].numel() for k, q in self.preactivations.items()}


class Rule:
    """What happens at the gates of a model inside :func:`instrument` (Zennit's rules, for gates).

    Subclass it and override what you need; each method may return a replacement for the layer's
    output (``None``: keep it). ``site`` names the call as :func:`record_gates` does.
    """

    #: Whether the rule handles hard-clipped ReLUs (:data:`dualview.gates.CLIPPED_LAYERS`) at its ReLU
    #: sites: their output is ``q * G + t * H`` (:func:`dualview.gates.clip_ceiling` gives ``t``), not
    #: ``q * G``. :func:`dualview.gates.instrument` refuses models holding them unless every rule says ``True``.
    clipped: bool = False
    #: Whether the rule handles the smooth activations (:data:`dualview.gates.SMOOTH_LAYERS`, at its ReLU
    #: sites: ``module`` tells them apart), torchvision's squeeze-and-excitation blocks
    #: (:meth:`dualview.gates.Rule.channel_gate`) and ``StochasticDepth``: :func:`dualview.gates.instrument`
    #: refuses models holding them unless every rule says ``True``.
    smooth: bool = False
    #: Whether the rule handles leaky ReLUs (:data:`dualview.gates.LEAKY_LAYERS`) at its ReLU sites, whose
    #: output is ``q * (a + (1 - a) G)`` with the off-state slope ``a`` (:func:`dualview.gates.leaky_slope`):
    #: :func:`dualview.gates.instrument` refuses models holding them unless every rule says ``True``.
    leaky: bool = False

    def relu(self, site: str, module: nn.Module, q: Tensor) -> Tensor | None:
        """Called at each ReLU call (and each hard-clipped ReLU call, for rules with ``clipped = True``)
        with its pre-activation ``q``."""
        return None

    def relu_output(self, site: str, module: nn.Module, q: Tensor, out: Tensor | None) -> Tensor | None:
        """What :func:`dualview.gates.instrument` calls at each ReLU call:
        :meth:`dualview.gates.Rule.relu`, unless a rule can reuse the module's output ``out = relu(q)``
        (``None`` for an in-place ReLU, whose output overwrote ``q``)."""
        return self.relu(site, module, q)

    def max_pool(self, site: str, module: nn.Module, x: Tensor, out: Tensor) -> Tensor | None:
        """Called at each max-pool call with its input ``x`` and its output ``out``."""
        return None

    def channel_gate(self, site: str, module: nn.Module, x: Tensor, scale: Tensor) -> Tensor | None:
        """Called (rules with ``smooth = True``) at each squeeze-and-excitation call, whose output is
        ``x * scale`` with the channel gate ``scale = s(x)`` computed by the block."""
        return None

    def layer_norm(self, site: str, module: nn.Module, x: Tensor, out: Tensor) -> Tensor | None:
        """Called (rules with ``smooth = True``) at each ``nn.LayerNorm`` call with its input ``x`` and output
        ``out``; ``None`` keeps the layer's own backward."""
        return None

    def attention(self, site: str, module: nn.Module, args: tuple, kwargs: dict, out: tuple) -> tuple | None:
        """Called (rules with ``smooth = True``) at each ``nn.MultiheadAttention`` call with its arguments and
        its output ``(attention, weights)``; ``None`` keeps the layer's own backward."""
        return None

    def batch_norm(self, module: nn.Module, x: Tensor, out: Tensor) -> Tensor | None:
        """Called at each BatchNorm call (eval mode: an affine map per channel) with its input ``x`` and output
        ``out``, for rules that override it (the others leave BatchNorm unhooked): a rule may return ``out``
        with a backward pass of its own (the surrogate backward of excitation pullbacks saves memory so)."""
        return None

    def functional_relu(self, where: str, q: Tensor) -> Tensor | None:
        """Called when the ``forward`` of the module ``where`` applies a ReLU as a function (``F.relu``,
        ``x.relu()``, in place or not) to ``q``. ``None`` (the default) refuses it with
        :class:`UnsupportedLayerError`; a rule that accepts it returns the output."""
        return None

    def linear_op(self, name: str, func: Callable, args: tuple, kwargs: dict, dependent: list[Tensor],
                  where: str) -> Tensor | None:
        """Called (rules that override it) for each operation the guard lets the model's own code apply to
        tensors that depend on the input (``dependent``): linear maps, products with a constant, quotients
        by a constant, torch's own affine layers' calls. ``name`` is the operation's (``add`` for
        ``torch.add``, ``Tensor.add_`` and ``+``), ``where`` the module and the line of code. A rule may
        return a replacement for the result (path counting runs every such map with unit weights); ``None``
        keeps it."""
        return None


class Record(Rule):
    """Record the pre-activation of every ReLU call into ``preactivations`` (a dict of yours, or a new
    one), the ceiling ``t`` of every hard-clipped ReLU call into ``ceilings`` and, with ``winners=True``,
    the winners of every max-pool call into ``pool_indices``."""

    clipped = True
    leaky = True

    def __init__(self, preactivations: dict[str, Tensor] | None = None, winners: bool = True) -> None:
        self.preactivations = {} if preactivations is None else preactivations
        self.pool_indices: dict[str, Tensor] = {}
        self.ceilings: dict[str, float] = {}
        self.winners = winners

    def relu(self, site, module, q):
        self.preactivations[site] = q
        if isinstance(module, CLIPPED_LAYERS):
            self.ceilings[site] = clip_ceiling(module, site)

    def max_pool(self, site, module, x, out):
        if self.winners:
            fn = F.max_pool1d if isinstance(module, nn.MaxPool1d) else F.max_pool2d
            self.pool_indices[site] = fn(x, module.kernel_size, module.stride, module.padding, module.dilation,
                                         ceil_mode=module.ceil_mode, return_indices=True)[1]


class ImposeGates(Rule):
    """GaLU: every ReLU call ``site`` outputs ``q * gates[site]``, every hard-clipped ReLU call
    ``q * gates[site] + t * saturated[site]``; with ``pool_indices``, every max-pool passes the given winners
    instead of its own maxima. :meth:`check_complete` then says whether every call had its gates and every
    given gate was used. A leaky ReLU call outputs ``q * (a + (1 - a) gates[site])`` (its off-state slope ``a``)."""

    clipped = True
    leaky = True

    def __init__(self, gates: Mapping[str, Tensor], pool_indices: Mapping[str, Tensor] | None = None,
                 saturated: Mapping[str, Tensor] | None = None) -> None:
        self.gates, self.pool_indices, self.saturated = gates, pool_indices, saturated or {}
        self.seen: set[str] = set()
        self.missing: list[str] = []

    def relu(self, site, module, q):
        self.seen.add(site)
        clipped = isinstance(module, CLIPPED_LAYERS)
        if site not in self.gates or (clipped and site not in self.saturated):
            self.missing.append(site if site not in self.gates else f"{site} (saturated)")
            return None
        g = self.gates[site]
        try:
            g_q = g.to(dtype=q.dtype, device=q.device)
            if isinstance(module, LEAKY_LAYERS):  # gate values {a, 1}
                a = leaky_slope(module, q)
                g_q = a + (1 - a) * g_q
            out = q * g_q
            if clipped:  # the constant saturated piece t * H
                h = self.saturated[site].to(dtype=q.dtype, device=q.device)
                out = out + clip_ceiling(module, site) * h
            return out
        except RuntimeError as e:
            raise ValueError(f"gates['{site}'] (shape {tuple(g.shape)}) or saturated['{site}'] do not "
                             f"broadcast against the pre-activation of shape {tuple(q.shape)}") from e

    def max_pool(self, site, module, x, out):
        self.seen.add(site)
        if self.pool_indices is None:
            return None
        if site not in self.pool_indices:
            self.missing.append(site)
            return None
        idx = self.pool_indices[site].to(x.device)
        if idx.shape[0] != x.shape[0] and idx.shape[0] == 1:
            idx = idx.expand(x.shape[0], *idx.shape[1:])
        if idx.shape[0] != x.shape[0] or idx.shape[1:] != out.shape[1:]:
            raise ValueError(f"pool_indices['{site}'] has shape {tuple(idx.shape)}, expected "
                             f"{(x.shape[0], *out.shape[1:])} (or a leading 1 to share across the batch)")
        return x.flatten(2).gather(2, idx.flatten(2)).view(idx.shape)  # a fixed selection: linear in x

    def check_complete(self) -> None:
        """Raise ``KeyError`` if a call had no gates, or gates were given for a call never reached."""
        if self.missing:
            raise KeyError(f"no gates given for {self.missing}; pass a mapping with one entry per ReLU / "
                           "max-pool call as record_gates(model, x) names them (and, for hard-clipped ReLUs, "
                           "saturated=record_gates(model, x).saturated: their constant pieces)")
        extra = (set(self.gates) | set(self.pool_indices or {}) | set(self.saturated)) - self.seen
        if extra:
            raise KeyError(f"gates given for {sorted(extra)}, which the forward pass never reached")
