"""Gates: the on/off states of the ReLUs of a network, recorded for a batch or imposed from outside.

A ReLU computes ``z = q * 1{q > 0}``: its pre-activation ``q`` times its *gate* ``G = 1{q > 0}``
(Lakshminarayanan & Singh; Table 4 of the duality paper :cite:`lakshminarayanan2022explicitising`).
This module

* records the pre-activations and gates of every ReLU of a model for a batch
  (:func:`record_gates`), and the winners of every max-pooling window (a max-pool is a gate that
  lets exactly one input of each window through);
* runs a model with gates given from outside (:func:`run_with_gates`): every ReLU becomes a
  *gated linear unit* (GaLU) ``z = q * G`` with ``G`` supplied, and every max-pool takes the
  supplied winners. With the model's own gates the output is unchanged; with the gates of an input
  ``x`` held fixed, the map ``x' -> run_with_gates(model, x', G(x))`` is affine: it is the
  *active sub-network* of ``x``.

Supported layers (see :data:`SUPPORTED_LAYERS`): ``nn.Linear``, ``nn.Conv1d``, ``nn.Conv2d`` (any
padding mode, including circular), ``nn.ReLU``, ``nn.MaxPool1d``, ``nn.MaxPool2d``, ``nn.AvgPool1d``,
``nn.AvgPool2d``, ``nn.AdaptiveAvgPool1d``, ``nn.AdaptiveAvgPool2d``, ``nn.BatchNorm1d``,
``nn.BatchNorm2d`` (eval mode), ``nn.Dropout`` (eval mode), ``nn.Flatten``, ``nn.Identity``, and
containers of these (``nn.Sequential``, residual blocks whose ``forward`` adds tensors).
Linear layers of your own join with :func:`register_linear_layer`, or by declaring a class attribute
``linear_layer = True`` (as the affine layers of :mod:`dualview.nets` do).

Anything else raises :class:`UnsupportedLayerError` naming the layer: an unknown module, an
activation other than ReLU (``nn.GELU``, ``nn.Tanh``, ...), BatchNorm or Dropout in training mode,
and a *functional* non-linearity called inside a ``forward`` (``F.relu``, ``torch.relu``,
``x.relu()``, ``F.max_pool2d``, ``torch.tanh``, ``x.clamp(...)``, ...), which a module hook
cannot see. The functional check intercepts a fixed list of functions (:data:`GUARDED_FUNCTIONS`); a
non-linearity computed some other way (say ``x * (x > 0)``) cannot be detected.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = [
    "SUPPORTED_LAYERS",
    "UnsupportedLayerError",
    "GateRecord",
    "register_linear_layer",
    "check_supported",
    "record_gates",
    "run_with_gates",
    "active_share",
    "instrument",
    "GATE_LAYERS",
    "POOL_GATE_LAYERS",
    "GUARDED_FUNCTIONS",
]


class UnsupportedLayerError(TypeError):
    """A model contains a layer (or a functional call) whose gates dualview cannot see."""


#: The modules whose calls are gates: each unit passes or blocks its pre-activation.
GATE_LAYERS: tuple[type[nn.Module], ...] = (nn.ReLU,)
#: The max-pools: each window passes its winner, a gate over the window (the winners are recorded).
POOL_GATE_LAYERS: tuple[type[nn.Module], ...] = (nn.MaxPool1d, nn.MaxPool2d)
_LINEAR_LAYERS: list[type[nn.Module]] = [
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.Dropout,
    nn.Flatten,
    nn.Identity,
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
GUARDED_FUNCTIONS: frozenset[Callable] = frozenset(
    {
        F.relu, F.relu_, torch.relu, torch.relu_, Tensor.relu, Tensor.relu_,
        F.relu6, F.gelu, F.silu, F.elu, F.selu, F.leaky_relu, F.softplus, F.hardtanh, F.mish,
        torch.tanh, Tensor.tanh, torch.sigmoid, Tensor.sigmoid, F.sigmoid, F.tanh,
        torch.clamp, torch.clamp_min, torch.clip, Tensor.clamp, Tensor.clamp_min, Tensor.clip,
        torch.maximum, torch.minimum,
        F.max_pool1d, F.max_pool2d, F.max_pool3d, torch.max_pool1d, torch.max_pool2d,
        F.max_pool1d_with_indices, F.max_pool2d_with_indices, F.adaptive_max_pool2d,
    }
)


class _Guard(TorchFunctionMode):
    """Refuses functional non-linearities outside the supported modules that own them."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, nn.Module]] = []
        self.internal = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in GUARDED_FUNCTIONS and not self.internal:
            owner = self.stack[-1] if self.stack else ("<model>", None)
            if not isinstance(owner[1], GATE_LAYERS + POOL_GATE_LAYERS):
                where = f"'{owner[0]}' ({type(owner[1]).__name__})" if owner[1] is not None else "the model"
                raise UnsupportedLayerError(
                    f"the forward of {where} calls {getattr(func, '__name__', func)} as a function; "
                    "dualview sees gates only through modules. Replace the call by an nn.ReLU / "
                    "nn.MaxPool2d module attribute (one instance per use) so its gates can be "
                    "recorded; other activations are not ReLU gates."
                )
        return func(*args, **(kwargs or {}))


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

    def active_share(self) -> dict[str, Tensor]:
        """Per sample, the share of gates that are on in each ReLU layer: ``{name: (N,)}``."""
        return {k: (q > 0).flatten(1).double().mean(1) for k, q in self.preactivations.items()}

    def num_gates(self) -> dict[str, int]:
        """Number of gates (ReLU units) per layer, for one input."""
        return {k: q[0].numel() for k, q in self.preactivations.items()}


def _pool_with_indices(module: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    fn = F.max_pool1d if isinstance(module, nn.MaxPool1d) else F.max_pool2d
    return fn(x, module.kernel_size, module.stride, module.padding, module.dilation,
              ceil_mode=module.ceil_mode, return_indices=True)


def _gather_pool(x: Tensor, indices: Tensor) -> Tensor:
    """Take, for every window, the input at the given winner index (a fixed selection, linear in x)."""
    flat = x.flatten(2)
    return flat.gather(2, indices.flatten(2)).view(indices.shape)


@contextlib.contextmanager
def instrument(
    model: nn.Module,
    on_gate: Callable[[str, nn.Module, Tensor], Tensor | None],
    on_pool: Callable[[str, nn.Module, Tensor, Tensor], Tensor | None],
) -> Iterator[None]:
    """The one instrumentation primitive: a context manager that hooks every module of ``model`` for
    the forward passes run inside it, and removes every hook on exit (also after a ``BaseException``
    such as ``KeyboardInterrupt``).

    It checks the model (:func:`check_supported`), names each ReLU / max-pool *call* (``name``,
    ``name#1``, ... for a module called more than once), hands an in-place ReLU's input over before
    it is overwritten, and guards against functional non-linearities inside ``forward``
    (:data:`GUARDED_FUNCTIONS`). What happens at a gate is plugged in: ``on_gate(name, module, q)`` is
    called at each ReLU call with its pre-activation and may return a replacement output;
    ``on_pool(name, module, x, out)`` likewise at each max-pool call. :func:`record_gates` and
    :func:`run_with_gates` are built on it, and so is path counting in :mod:`dualview.paths`.
    """
    check_supported(model)
    guard = _Guard()
    calls: Counter[str] = Counter()
    captured: dict[int, Tensor] = {}
    handles = []

    def site(name: str) -> str:
        k = calls[name]
        calls[name] += 1
        return name if k == 0 else f"{name}#{k}"

    for name, module in model.named_modules():
        label = name or "<model>"

        def pre(mod, args, label=label):
            guard.stack.append((label, mod))
            if isinstance(mod, GATE_LAYERS) and getattr(mod, "inplace", False):
                captured[id(mod)] = args[0].clone()  # in-place ReLU overwrites its input

        def post(mod, args, out, label=label):
            guard.stack.pop()
            if isinstance(mod, GATE_LAYERS) or isinstance(mod, POOL_GATE_LAYERS):
                guard.internal += 1
                try:
                    if isinstance(mod, GATE_LAYERS):
                        q = captured.pop(id(mod), args[0])
                        new = on_gate(site(label), mod, q)
                    else:
                        new = on_pool(site(label), mod, args[0], out)
                finally:
                    guard.internal -= 1
                return new
            return None

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        with guard:
            yield
    finally:
        for h in handles:
            h.remove()


def record_gates(model: nn.Module, x: Tensor) -> GateRecord:
    """Run ``model(x)`` and record every ReLU's pre-activation and every max-pool's winners.

    Gradients flow through the recorded pre-activations (wrap the call in ``torch.no_grad()``
    when you do not need them). See :class:`GateRecord` for the naming of layers.
    """
    _check_input(x)
    pre: dict[str, Tensor] = {}
    pools: dict[str, Tensor] = {}

    def on_gate(name, module, q):
        pre[name] = q
        return None

    def on_pool(name, module, inp, out):
        pools[name] = _pool_with_indices(module, inp)[1]
        return None

    with instrument(model, on_gate, on_pool):
        out = model(x)
    return GateRecord(output=out, preactivations=pre, pool_indices=pools)


def run_with_gates(
    model: nn.Module,
    x: Tensor,
    gates: Mapping[str, Tensor],
    pool_indices: Mapping[str, Tensor] | None = None,
    preactivations: dict[str, Tensor] | None = None,
) -> Tensor:
    """Run ``model`` on ``x`` with every ReLU replaced by a GaLU fed the given ``gates``.

    Each ReLU call ``name`` outputs ``q * gates[name]`` where ``q`` is its pre-activation on ``x``;
    gates may be bool (hard) or float (soft, e.g. ``sigmoid(beta * q_gating)``), and broadcast
    against ``q``. If ``pool_indices`` is given, every max-pool takes the given winners instead of
    its own maxima (otherwise it pools ``x``'s own values). With the model's own gates and
    winners the output equals ``model(x)``; with those of another input it is that input's active
    sub-network applied to ``x`` (Section 2.2 of :cite:`satkiewicz2025tapping`). A dict passed as
    ``preactivations`` receives the pre-activation ``q`` of every ReLU call, by name.
    """
    _check_input(x)
    missing: list[str] = []
    seen: set[str] = set()

    def on_gate(name, module, q):
        seen.add(name)
        if preactivations is not None:
            preactivations[name] = q
        if name not in gates:
            missing.append(name)
            return None
        g = gates[name]
        try:
            return q * g.to(dtype=q.dtype, device=q.device)
        except RuntimeError as e:
            raise ValueError(
                f"gates['{name}'] has shape {tuple(g.shape)}, which does not broadcast against the "
                f"pre-activation of shape {tuple(q.shape)}"
            ) from e

    def on_pool(name, module, inp, out):
        seen.add(name)
        if pool_indices is None:
            return None
        if name not in pool_indices:
            missing.append(name)
            return None
        idx = pool_indices[name].to(inp.device)
        if idx.shape[0] != inp.shape[0] and idx.shape[0] == 1:
            idx = idx.expand(inp.shape[0], *idx.shape[1:])
        if idx.shape[0] != inp.shape[0] or idx.shape[1:] != out.shape[1:]:
            raise ValueError(
                f"pool_indices['{name}'] has shape {tuple(idx.shape)}, expected "
                f"{(inp.shape[0], *out.shape[1:])} (or a leading 1 to share across the batch)"
            )
        return _gather_pool(inp, idx)

    with instrument(model, on_gate, on_pool):
        out = model(x)
    if missing:
        raise KeyError(
            f"no gates given for {missing}; pass a mapping with one entry per ReLU / max-pool call "
            "as record_gates(model, x) names them"
        )
    extra = (set(gates) | set(pool_indices or {})) - seen
    if extra:
        raise KeyError(f"gates given for {sorted(extra)}, which the forward pass never reached")
    return out


def _check_input(x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a torch.Tensor input, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(
            f"expected a batch of inputs with a leading batch dimension, got shape {tuple(x.shape)}; "
            "use x.unsqueeze(0) for a single input"
        )


def active_share(
    model: nn.Module, x: Tensor, batch_size: int = 500, per_layer: bool = True
) -> dict[str, Tensor] | Tensor:
    """Per input, the share of active gates (ReLU units with ``q > 0``).

    ``per_layer=True``: one share per ReLU call, ``{name: (N,) tensor}``; ``per_layer=False``: the
    share over all hidden units of every ReLU call together, a ``(N,)`` tensor (the share of active
    neurons of Table 3 of :cite:`szymanski2020switched`). Processes
    ``x`` in chunks of ``batch_size`` without keeping pre-activations, so it runs on whole test sets.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    parts: dict[str, list[Tensor]] = {}
    with torch.no_grad():
        for chunk in x.split(batch_size):
            for name, q in record_gates(model, chunk).preactivations.items():
                parts.setdefault(name, []).append((q > 0).flatten(1).sum(1).cpu())
    on = {k: torch.cat(v).double() for k, v in parts.items()}
    with torch.no_grad():
        sizes = record_gates(model, x[:1]).num_gates()
    if per_layer:
        return {k: on[k] / sizes[k] for k in on}
    return sum(on.values()) / sum(sizes.values())
