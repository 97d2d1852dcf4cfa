"""Gates: the on/off states of the ReLUs of a network, recorded for a batch or imposed from outside.

A ReLU computes ``z = q * 1{q > 0}``: its pre-activation ``q`` times its *gate* ``G = 1{q > 0}``
(Table 4 of the duality paper :cite:`lakshminarayanan2022explicitising`). :func:`record_gates`
records the pre-activations and gates of every ReLU of a model for a batch, and the winners of every
max-pooling window (a max-pool is a gate that lets one input of each window through).
:func:`run_with_gates` runs a model with gates given from outside: every ReLU becomes a *gated linear
unit* (GaLU) ``z = q * G`` with ``G`` supplied, every max-pool takes the supplied winners. With the
model's own gates the output is unchanged; with the gates of an input ``x`` held fixed, the map
``x' -> run_with_gates(model, x', G(x))`` is affine: the *active sub-network* of ``x``.

Both are built on one instrumentation primitive, :func:`instrument`, in the style of Zennit's
composites: a context manager that hooks a model and names its gates, with small :class:`Rule`
objects plugged in that say what happens at each gate (:class:`Record`, :class:`ImposeGates`; the
surrogate backward of excitation pullbacks is :class:`dualview.surrogates.SurrogateBackward`).

Supported layers (:data:`SUPPORTED_LAYERS`): ``nn.Linear``, ``nn.Conv1d``/``2d`` (any padding mode),
``nn.ReLU``, ``nn.MaxPool1d``/``2d``, ``nn.AvgPool1d``/``2d``, ``nn.AdaptiveAvgPool1d``/``2d``,
``nn.BatchNorm1d``/``2d`` and ``nn.Dropout`` (eval mode), ``nn.Flatten``, ``nn.Identity``, and containers
of these (``nn.Sequential``, residual blocks whose ``forward`` adds tensors). Linear layers of your own
join with :func:`register_linear_layer`, or by declaring a class attribute ``linear_layer = True`` (as
the affine layers of :mod:`dualview.nets` do). Anything else raises :class:`UnsupportedLayerError`
naming the layer: an unknown module, another activation (``nn.GELU``, ...), BatchNorm or Dropout in
training mode, and a *functional* non-linearity called inside a ``forward`` (``F.relu``,
``x.relu()``, ``F.max_pool2d``, ``x.clamp(...)``, ...; the list is :data:`GUARDED_FUNCTIONS`), which
a module hook cannot see; a rule may accept functional ReLUs, as the surrogate backward does. A
non-linearity computed some other way (say ``x * (x > 0)``) cannot be detected.
"""
from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = [
    "SUPPORTED_LAYERS", "UnsupportedLayerError", "register_linear_layer", "check_supported", "check_batch",
    "GATE_LAYERS", "POOL_GATE_LAYERS", "GUARDED_FUNCTIONS", "GateRecord",
    "Rule", "Record", "ImposeGates", "instrument", "record_gates", "run_with_gates", "active_share",
]


class UnsupportedLayerError(TypeError):
    """A model contains a layer (or a functional call) whose gates dualview cannot see."""


#: The modules whose calls are gates: each unit passes or blocks its pre-activation.
GATE_LAYERS: tuple[type[nn.Module], ...] = (nn.ReLU,)
#: The max-pools: each window passes its winner, a gate over the window (the winners are recorded).
POOL_GATE_LAYERS: tuple[type[nn.Module], ...] = (nn.MaxPool1d, nn.MaxPool2d)
_LINEAR_LAYERS: list[type[nn.Module]] = [
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.Dropout, nn.Flatten, nn.Identity,
]
_EVAL_ONLY: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.Dropout)


def register_linear_layer(*classes: type[nn.Module]) -> None:
    """Declare module classes as (affine) linear layers, so models containing them are supported.

    Use it for a layer of your own that computes an affine function of its input with no
    input-dependent switching (a normalisation, a fixed resize, a zero-padding shortcut, ...).
    """
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"register_linear_layer expects nn.Module classes, got {cls!r}")
        if cls not in _LINEAR_LAYERS:
            _LINEAR_LAYERS.append(cls)


def SUPPORTED_LAYERS() -> tuple[type[nn.Module], ...]:  # noqa: N802 - reads like a constant
    """All layer classes dualview accepts (gates, max-pools and registered linear layers); classes that
    declare ``linear_layer = True`` are accepted too."""
    return GATE_LAYERS + POOL_GATE_LAYERS + tuple(_LINEAR_LAYERS)


def _supported_names() -> str:
    return ", ".join(sorted({c.__name__ for c in SUPPORTED_LAYERS()}))


def check_supported(model: nn.Module) -> None:
    """Raise :class:`UnsupportedLayerError` if ``model`` holds a layer dualview cannot handle.

    Leaf modules must be supported layers; modules with children must not own parameters of
    their own (their use would be invisible); BatchNorm and Dropout must be in eval mode.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    supported = SUPPORTED_LAYERS()
    for name, module in model.named_modules():
        label = name or "<model>"
        children = list(module.children())
        if not children:
            if isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
                continue  # an empty container computes nothing
            if not (isinstance(module, supported) or getattr(type(module), "linear_layer", False)):
                raise UnsupportedLayerError(
                    f"layer '{label}' ({type(module).__name__}) is not supported: dualview reads "
                    "gates only from nn.ReLU and nn.MaxPool modules, between linear layers. "
                    f"Supported layers: {_supported_names()}. If '{label}' computes an affine map, "
                    "declare it with dualview.gates.register_linear_layer; if it is another "
                    "activation (GELU, Tanh, ...), the dual view of ReLU networks does not apply."
                )
            if isinstance(module, _EVAL_ONLY) and module.training:
                raise UnsupportedLayerError(
                    f"layer '{label}' ({type(module).__name__}) is in training mode, where it is "
                    "not a fixed linear map: call model.eval() first."
                )
        elif any(p is not None for p in module._parameters.values()):
            raise UnsupportedLayerError(
                f"module '{label}' ({type(module).__name__}) has parameters of its own besides its "
                "child layers, so dualview cannot see how they are used: move them into "
                "supported child layers (nn.Linear, nn.Conv2d, ...)."
            )


#: Functional non-linearities that :func:`instrument` refuses when a model's ``forward`` calls them
#: directly (a hook cannot see them). Calls made by the supported module that owns them (``nn.ReLU``
#: calls ``F.relu``, ``nn.MaxPool2d`` calls ``F.max_pool2d``) are allowed.
GUARDED_FUNCTIONS: frozenset[Callable] = frozenset({
    F.relu, F.relu_, torch.relu, torch.relu_, Tensor.relu, Tensor.relu_,
    F.relu6, F.gelu, F.silu, F.elu, F.selu, F.leaky_relu, F.softplus, F.hardtanh, F.mish,
    torch.tanh, Tensor.tanh, torch.sigmoid, Tensor.sigmoid, F.sigmoid, F.tanh,
    torch.clamp, torch.clamp_min, torch.clip, Tensor.clamp, Tensor.clamp_min, Tensor.clip,
    torch.maximum, torch.minimum,
    F.max_pool1d, F.max_pool2d, F.max_pool3d, torch.max_pool1d, torch.max_pool2d,
    F.max_pool1d_with_indices, F.max_pool2d_with_indices, F.adaptive_max_pool2d,
})
_RELU_FUNCTIONS = frozenset({F.relu, torch.relu, Tensor.relu})
_INPLACE_RELU_FUNCTIONS = frozenset({F.relu_, torch.relu_, Tensor.relu_})


@dataclass
class GateRecord:
    """Pre-activations and gates of every ReLU, and max-pool winners, for one batch.

    ``preactivations[name]`` is the input ``q`` of the ReLU call ``name`` (shape ``(N, ...)``),
    ``gates[name] = q > 0``. A module called more than once in one forward gets one entry per
    call, named ``name``, ``name#1``, ``name#2``, ... . ``pool_indices[name]`` holds, for a
    max-pool, the flat index (within each channel's input map) of the winner of every window, as
    ``return_indices=True`` gives it. Entries are in the order the forward pass reached them.
    """

    output: Tensor
    preactivations: dict[str, Tensor] = field(default_factory=dict)
    pool_indices: dict[str, Tensor] = field(default_factory=dict)

    @property
    def gates(self) -> dict[str, Tensor]:
        """``{name: q > 0}`` for every ReLU call (bool tensors)."""
        return {k: q > 0 for k, q in self.preactivations.items()}

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

    def relu(self, site: str, module: nn.Module, q: Tensor) -> Tensor | None:
        """Called at each ReLU call with its pre-activation ``q``."""
        return None

    def max_pool(self, site: str, module: nn.Module, x: Tensor, out: Tensor) -> Tensor | None:
        """Called at each max-pool call with its input ``x`` and its output ``out``."""
        return None

    def functional_relu(self, where: str, q: Tensor) -> Tensor | None:
        """Called when the ``forward`` of the module ``where`` applies a ReLU as a function (``F.relu``,
        ``x.relu()``, in place or not) to ``q``. ``None`` (the default) refuses it with
        :class:`UnsupportedLayerError`; a rule that accepts it returns the output."""
        return None


class Record(Rule):
    """Record the pre-activation of every ReLU call into ``preactivations`` (a dict of yours, or a new
    one) and, with ``winners=True``, the winners of every max-pool call into ``pool_indices``."""

    def __init__(self, preactivations: dict[str, Tensor] | None = None, winners: bool = True) -> None:
        self.preactivations = {} if preactivations is None else preactivations
        self.pool_indices: dict[str, Tensor] = {}
        self.winners = winners

    def relu(self, site, module, q):
        self.preactivations[site] = q

    def max_pool(self, site, module, x, out):
        if self.winners:
            fn = F.max_pool1d if isinstance(module, nn.MaxPool1d) else F.max_pool2d
            self.pool_indices[site] = fn(x, module.kernel_size, module.stride, module.padding, module.dilation,
                                         ceil_mode=module.ceil_mode, return_indices=True)[1]


class ImposeGates(Rule):
    """GaLU: every ReLU call ``site`` outputs ``q * gates[site]``; with ``pool_indices``, every max-pool
    passes the given winners instead of its own maxima. :meth:`check_complete` then says whether every
    call had its gates and every given gate was used."""

    def __init__(self, gates: Mapping[str, Tensor], pool_indices: Mapping[str, Tensor] | None = None) -> None:
        self.gates, self.pool_indices = gates, pool_indices
        self.seen: set[str] = set()
        self.missing: list[str] = []

    def relu(self, site, module, q):
        self.seen.add(site)
        if site not in self.gates:
            self.missing.append(site)
            return None
        g = self.gates[site]
        try:
            return q * g.to(dtype=q.dtype, device=q.device)
        except RuntimeError as e:
            raise ValueError(f"gates['{site}'] has shape {tuple(g.shape)}, which does not broadcast against "
                             f"the pre-activation of shape {tuple(q.shape)}") from e

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
                           "max-pool call as record_gates(model, x) names them")
        extra = (set(self.gates) | set(self.pool_indices or {})) - self.seen
        if extra:
            raise KeyError(f"gates given for {sorted(extra)}, which the forward pass never reached")


class _Guard(TorchFunctionMode):
    """Active during the root model's forward: refuses functional non-linearities outside the supported
    modules that own them, except functional ReLUs that a rule accepts."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        super().__init__()
        self.rules = rules
        self.stack: list[tuple[str, nn.Module]] = []
        self.internal = 0  # > 0 while a rule runs: its own calls are not the model's

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.internal or func not in GUARDED_FUNCTIONS:
            return func(*args, **kwargs)
        label, owner = self.stack[-1]
        if isinstance(owner, GATE_LAYERS + POOL_GATE_LAYERS):
            return func(*args, **kwargs)
        where = f"'{label}' ({type(owner).__name__})"
        if func in _RELU_FUNCTIONS or func in _INPLACE_RELU_FUNCTIONS:
            inplace = func in _INPLACE_RELU_FUNCTIONS or bool(kwargs.get("inplace", args[1] if len(args) > 1 else False))
            x = args[0]
            q = x.clone() if inplace else x  # the rule's output may depend on q, which the copy overwrites
            out = _apply(self, lambda rule: rule.functional_relu(where, q), f"functional ReLU in {where}")
            if out is not None:
                return x.copy_(out) if inplace else out
        raise UnsupportedLayerError(
            f"the forward of {where} calls {getattr(func, '__name__', func)} as a function; dualview sees "
            "gates only through modules. Replace the call by an nn.ReLU / nn.MaxPool2d module attribute "
            "(one instance per use) so its gates can be recorded; other activations are not ReLU gates.")


def _apply(guard: _Guard, call: Callable[[Rule], Tensor | None], site: str) -> Tensor | None:
    """Run every rule at one gate (not guarded); at most one may replace the output."""
    out = None
    guard.internal += 1
    try:
        for rule in guard.rules:
            new = call(rule)
            if new is not None:
                if out is not None:
                    raise ValueError(f"two rules replace the output of {site}; combine at most one such rule")
                out = new
    finally:
        guard.internal -= 1
    return out


_INSTRUMENTED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


@contextlib.contextmanager
def instrument(model: nn.Module, *rules: Rule) -> Iterator[None]:
    """The one instrumentation primitive: inside the block, every forward pass of ``model`` applies the
    ``rules`` at its gates; on exit every hook is removed, also after a ``BaseException`` such as
    ``KeyboardInterrupt``. Parameters and modules are never touched.

    It checks the model (:func:`check_supported`), names each ReLU / max-pool *call* (``name``,
    ``name#1``, ... for a module called more than once in one forward), hands an in-place ReLU's input
    over before it is overwritten, and, during the model's own forward only (not in the rest of the
    ``with`` body), refuses functional non-linearities (:data:`GUARDED_FUNCTIONS`) unless a rule
    accepts a functional ReLU. Call the model itself, not a submodule, inside the block. Blocks on
    the same model (or a module of it) do not nest: combine the rules in one block instead.
    :func:`record_gates`, :func:`run_with_gates`, path counting and excitation pullbacks are built on it.
    """
    check_supported(model)
    bad = [r for r in rules if not isinstance(r, Rule)]
    if bad:
        raise TypeError(f"instrument expects dualview.gates.Rule objects, got {bad!r}")
    if any(m in _INSTRUMENTED for m in model.modules()):
        raise RuntimeError("dualview.gates.instrument is already active on this model (or a module of it); "
                           "do not nest the blocks: pass all rules to one block")
    guard = _Guard(rules)
    calls: Counter[str] = Counter()
    captured: dict[int, Tensor] = {}
    depth = [0]

    def site(label: str) -> str:
        k = calls[label]
        calls[label] += 1
        return label if k == 0 else f"{label}#{k}"

    def enter(mod, args):  # the root model's forward starts: names restart, the guard is on
        if depth[0] == 0:
            calls.clear()
            guard.__enter__()
        depth[0] += 1

    def leave(mod, args, out):
        depth[0] -= 1
        if depth[0] == 0:
            guard.__exit__(None, None, None)

    def push(mod, args, label):
        guard.stack.append((label, mod))
        if isinstance(mod, GATE_LAYERS) and getattr(mod, "inplace", False):
            captured[id(mod)] = args[0].clone()  # an in-place ReLU overwrites its input

    def pop(mod, args, out):
        if guard.stack and guard.stack[-1][1] is mod:
            guard.stack.pop()

    def at_relu(mod, args, out, label):
        pop(mod, args, out)
        q, s = captured.pop(id(mod), args[0]), site(label)
        return _apply(guard, lambda rule: rule.relu(s, mod, q), f"ReLU call '{s}'")

    def at_pool(mod, args, out, label):
        pop(mod, args, out)
        s = site(label)
        return _apply(guard, lambda rule: rule.max_pool(s, mod, args[0], out), f"max-pool call '{s}'")

    handles = [model.register_forward_pre_hook(enter)]
    try:
        for name, module in model.named_modules():
            label = name or "<model>"
            post = partial(at_relu, label=label) if isinstance(module, GATE_LAYERS) else \
                partial(at_pool, label=label) if isinstance(module, POOL_GATE_LAYERS) else pop
            handles += [module.register_forward_pre_hook(partial(push, label=label)),
                        module.register_forward_hook(post, always_call=True)]
        handles.append(model.register_forward_hook(leave, always_call=True))
        _INSTRUMENTED.update(model.modules())
        yield
    finally:
        for h in handles:
            h.remove()
        _INSTRUMENTED.difference_update(model.modules())
        if depth[0] > 0:  # a BaseException left the forward before its last hook ran
            guard.__exit__(None, None, None)


def check_batch(x: Tensor, floating: bool = False) -> None:
    """Raise a clear error unless ``x`` is a tensor with a leading batch dimension (and, with
    ``floating=True``, of a floating-point dtype)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a torch.Tensor input, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"expected a batch of inputs with a leading batch dimension, got shape "
                         f"{tuple(x.shape)}; use x.unsqueeze(0) for a single input")
    if floating and not x.dtype.is_floating_point:
        raise TypeError(f"inputs must be floating point, got {x.dtype}")


def record_gates(model: nn.Module, x: Tensor) -> GateRecord:
    """Run ``model(x)`` and record every ReLU's pre-activation and every max-pool's winners.

    Gradients flow through the recorded pre-activations (wrap the call in ``torch.no_grad()``
    when you do not need them). See :class:`GateRecord` for the naming of layers.
    """
    check_batch(x)
    rule = Record()
    with instrument(model, rule):
        out = model(x)
    return GateRecord(output=out, preactivations=rule.preactivations, pool_indices=rule.pool_indices)


def run_with_gates(model: nn.Module, x: Tensor, gates: Mapping[str, Tensor],
                   pool_indices: Mapping[str, Tensor] | None = None,
                   preactivations: dict[str, Tensor] | None = None) -> Tensor:
    """Run ``model`` on ``x`` with every ReLU replaced by a GaLU fed the given ``gates``.

    Each ReLU call ``name`` outputs ``q * gates[name]`` where ``q`` is its pre-activation on ``x``;
    gates may be bool (hard) or float (soft, e.g. ``sigmoid(beta * q_gating)``), and broadcast
    against ``q``. If ``pool_indices`` is given, every max-pool takes the given winners instead of
    its own maxima (otherwise it pools ``x``'s own values). With the model's own gates and
    winners the output equals ``model(x)``; with those of another input it is that input's active
    sub-network applied to ``x`` (Section 2.2 of :cite:`satkiewicz2025tapping`). A dict passed as
    ``preactivations`` receives the pre-activation ``q`` of every ReLU call, by name
    (rules :class:`ImposeGates` and :class:`Record`).
    """
    check_batch(x)
    impose = ImposeGates(gates, pool_indices)
    rules = (impose,) if preactivations is None else (Record(preactivations, winners=False), impose)
    with instrument(model, *rules):
        out = model(x)
    impose.check_complete()
    return out


def active_share(model: nn.Module, x: Tensor, batch_size: int = 500,
                 per_layer: bool = True) -> dict[str, Tensor] | Tensor:
    """Per input, the share of active gates (ReLU units with ``q > 0``).

    ``per_layer=True``: one share per ReLU call, ``{name: (N,) tensor}``; ``per_layer=False``: the
    share over all hidden units of every ReLU call together, a ``(N,)`` tensor (the share of active
    neurons of Table 3 of :cite:`szymanski2020switched`). Processes
    ``x`` in chunks of ``batch_size`` without keeping pre-activations, so it runs on whole test sets.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    parts: dict[str, list[Tensor]] = {}
    sizes: dict[str, int] = {}
    with torch.no_grad():
        for chunk in x.split(batch_size):
            for name, q in record_gates(model, chunk).preactivations.items():
                parts.setdefault(name, []).append((q > 0).flatten(1).sum(1).cpu())
                sizes[name] = q[0].numel()
    on = {k: torch.cat(v).double() for k, v in parts.items()}
    if per_layer:
        return {k: on[k] / sizes[k] for k in on}
    return sum(on.values()) / sum(sizes.values())
