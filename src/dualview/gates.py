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
``nn.BatchNorm1d``/``2d`` (eval mode, with running statistics), ``nn.Dropout``/``1d``/``2d`` (eval mode),
``nn.Flatten``, ``nn.Unflatten``, ``nn.Identity``, zero/constant padding, ``nn.Upsample``, the hard-clipped
ReLUs ``nn.ReLU6`` and ``nn.Hardtanh(0, t)`` (:data:`CLIPPED_LAYERS`, below), and containers of
these (``nn.Sequential``, residual blocks whose ``forward`` adds tensors). A subclass that overrides its
base's ``forward`` is not taken for its base (a gate is recognised by what it computes). Affine layers of
your own join with :func:`register_linear_layer` (checked for affinity, undoable), or by declaring a
class attribute ``linear_layer = True`` (as the affine layers of :mod:`dualview.nets` do). Anything else
raises :class:`UnsupportedLayerError` naming the layer.

What a container's ``forward`` does between its layers is checked too, by a whitelist: during the
model's forward, :func:`instrument` tracks the tensors that depend on the input and lets through only
operations known to be linear in them (sums, reshapes, concatenation, indexing with constant indices,
zero padding, average pooling, interpolation, products with at most one input-dependent factor, ...).
Anything else (``torch.softmax``, ``F.layer_norm``, ``x.amax``, ``clamp``, ``torch.where`` on an
input-dependent mask, a product of two activations, ``F.relu`` unless a rule accepts it, ...) raises
:class:`UnsupportedLayerError` naming the operation, the module and the line of code. An in-place ReLU's
input read again after the ReLU is given the ReLU's output, as in the real network.

Hard-clipped ReLUs (:data:`CLIPPED_LAYERS`: ``nn.ReLU6``, ``nn.Hardtanh(min_val=0, max_val=t)``) are piecewise
linear: ``min(max(q, 0), t) = q * G + t * H`` with the gate ``G = 1{0 < q < t}`` (the pass-through piece) and
the *saturated* piece ``H = 1{q >= t}``, a constant. Both are fixed by ``x`` (the ties at ``q = 0`` and
``q = t`` as PyTorch's backward takes them: slope 0), so with them held fixed the network is affine again and
the dual view is exact: :attr:`GateRecord.gates` holds ``G``, :attr:`GateRecord.saturated` holds ``H``, and
:func:`run_with_gates` outputs ``q * G + t * H`` at such a site (pass ``saturated=``). They are accepted by
the rules that declare :attr:`Rule.clipped` (recording, imposing gates, the surrogate backward of excitation
pullbacks), hence by switched projections, Insens and gated linear models; path counts, kernels and gated
networks are defined for ReLU networks and refuse them. A Hardtanh with ``min_val != 0`` is refused.

SiLU and GELU (:data:`SMOOTH_LAYERS`) are *not* piecewise linear: ``q * sigmoid(q)`` and ``q * Phi(q)`` switch
nothing on or off, no gates held fixed make the network affine, and no switched or gated linear model
reproduces ``f(x)``: the exact dual view does not apply. Only rules that declare :attr:`Rule.smooth` (the
surrogate backward of excitation pullbacks, which defines a backward pass, not a linear model) accept
them, and with them torchvision's squeeze-and-excitation block ``x * s(x)`` (a channel gate, handed to
:meth:`Rule.channel_gate`) and ``StochasticDepth`` (the identity in eval mode). Everything else (recording and
imposing gates, gated linear models, switched projections, Insens, path counts, kernels) refuses them by name.
"""
from __future__ import annotations

import contextlib
import copy
import math
import traceback
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
    "GATE_LAYERS", "CLIPPED_LAYERS", "SMOOTH_LAYERS",
    "POOL_GATE_LAYERS", "GateRecord", "check_eval", "check_reproduces",
    "unregister_linear_layer", "full_precision", "tf32_off",
    "clip_ceiling", "Rule", "Record", "ImposeGates", "instrument", "record_gates", "run_with_gates",
    "active_share", "model_output", "SelectOutput", "LEAKY_LAYERS", "leaky_slope",
]


class UnsupportedLayerError(TypeError):
    """A model contains a layer (or a functional call) whose gates dualview cannot see."""


#: The modules whose calls are gates: each unit passes or blocks its pre-activation.
GATE_LAYERS: tuple[type[nn.Module], ...] = (nn.ReLU,)
#: Hard-clipped ReLUs ``min(max(q, 0), t)`` (``nn.ReLU6``; ``nn.Hardtanh`` only with ``min_val = 0``): a
#: gate ``1{0 < q < t}`` plus a constant saturated piece ``t * 1{q >= t}``, accepted by rules with
#: ``clipped = True``.
CLIPPED_LAYERS: tuple[type[nn.Module], ...] = (nn.Hardtanh,)
#: Smooth self-gated activations ``q * g(q)`` (``nn.SiLU``: ``g = sigmoid``; ``nn.GELU``: ``g = Phi``, the
#: normal CDF): no exact dual view; accepted only by rules with ``smooth = True`` (the surrogate backward).
SMOOTH_LAYERS: tuple[type[nn.Module], ...] = (nn.SiLU, nn.GELU)
#: Leaky ReLUs ``max(q, 0) + a min(q, 0)`` (``nn.LeakyReLU``: slope ``a = negative_slope``; ``nn.PReLU``: a learnt
#: slope, one or one per channel): a gate whose off state has slope ``a`` instead of 0, gate values in
#: ``{a, 1}``; accepted by rules with ``leaky = True`` (recorded and imposed gates, gated linear models, switched
#: projections, Insens, path counts).
LEAKY_LAYERS: tuple[type[nn.Module], ...] = (nn.LeakyReLU, nn.PReLU)
#: The max-pools: each window passes its winner, a gate over the window (the winners are recorded).
POOL_GATE_LAYERS: tuple[type[nn.Module], ...] = (nn.MaxPool1d, nn.MaxPool2d)
_LINEAR_LAYERS: list[type[nn.Module]] = [
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Flatten, nn.Unflatten,
    nn.Identity, nn.ZeroPad1d, nn.ZeroPad2d, nn.ConstantPad1d, nn.ConstantPad2d, nn.Upsample,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d,
]
_EVAL_ONLY: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


class register_linear_layer(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Declare module classes as affine layers (``f(x) = A x + b``, the same ``A`` and ``b`` for every
    input: no input-dependent switching, no normalisation by statistics of the input), so models
    containing them are supported.

    Registration is checked: on random inputs a registered module must satisfy
    ``f(a x + (1 - a) y) = a f(x) + (1 - a) f(y)`` (an affine map), else ``UnsupportedLayerError``
    (a normalisation such as ``nn.LayerNorm`` fails it). Pass ``example`` (a module instance and an
    input batch, ``(module, x)``) to check on your shapes; without it a class is checked when a model
    holding it is first instrumented. Undo with :func:`unregister_linear_layer`, or use it as a
    context manager: ``with register_linear_layer(MyLayer): ...`` registers for the block only.
    """

    def __init__(self, *classes: type[nn.Module], example: tuple[nn.Module, Tensor] | None = None) -> None:
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
                raise TypeError(f"register_linear_layer expects nn.Module classes, got {cls!r}")
        if example is not None:
            _check_affine(*example)
        self.added = [cls for cls in dict.fromkeys(classes) if cls not in _LINEAR_LAYERS]
        _LINEAR_LAYERS.extend(self.added)
        _UNVERIFIED.update(c for c in self.added if example is None or not isinstance(example[0], c))

    def __enter__(self) -> "register_linear_layer":
        return self

    def __exit__(self, *exc) -> None:
        unregister_linear_layer(*self.added)


def unregister_linear_layer(*classes: type[nn.Module]) -> None:
    """Undo :func:`register_linear_layer` for ``classes`` (the built-in layers cannot be removed)."""
    for cls in classes:
        if cls in _BUILTIN_LINEAR:
            raise ValueError(f"{cls.__name__} is a built-in linear layer of dualview; "
                             "it cannot be unregistered")
        if cls in _LINEAR_LAYERS:
            _LINEAR_LAYERS.remove(cls)
        _UNVERIFIED.discard(cls)


_BUILTIN_LINEAR = frozenset(_LINEAR_LAYERS)
_UNVERIFIED: set[type[nn.Module]] = set()  # registered classes not yet checked on an instance


def _check_affine(module: nn.Module, x: Tensor, label: str | None = None) -> None:
    """Raise unless ``module`` is affine on random inputs shaped like ``x`` (checked in float64 on a copy)."""
    m = copy.deepcopy(module).double().eval()
    for sub in m.modules():  # a copy made inside instrument() carries its hooks: a plain module is checked
        sub._forward_hooks.clear()
        sub._forward_pre_hooks.clear()
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(x.shape, generator=gen, dtype=torch.float64) for _ in range(2))
    with torch.no_grad():
        lhs, rhs = m(0.3 * a + 0.7 * b), 0.3 * m(a) + 0.7 * m(b)
    if not torch.allclose(lhs, rhs, rtol=1e-9, atol=1e-9 * float(rhs.abs().max().clamp_min(1))):
        name = label or type(module).__name__
        raise UnsupportedLayerError(
            f"'{name}' ({type(module).__name__}) was registered as a linear layer but is not affine: "
            f"f(0.3 a + 0.7 b) differs from 0.3 f(a) + 0.7 f(b) by "
            f"{float((lhs - rhs).abs().max()):.3g} on random inputs. Normalisations by statistics of the "
            "input "
            "(LayerNorm, GroupNorm, BatchNorm without running statistics) and activations are not linear; "
            "unregister it with dualview.gates.unregister_linear_layer.")


def SUPPORTED_LAYERS() -> tuple[type[nn.Module], ...]:  # noqa: N802 - reads like a constant
    """All layer classes dualview accepts (gates, max-pools and registered linear layers); classes that
    declare ``linear_layer = True`` are accepted too."""
    return GATE_LAYERS + POOL_GATE_LAYERS + tuple(_LINEAR_LAYERS)


def _supported_names() -> str:
    return ", ".join(sorted({c.__name__ for c in SUPPORTED_LAYERS()}))


def clip_ceiling(module: nn.Module, label: str = "") -> float:
    """The ceiling ``t`` of a hard-clipped ReLU ``min(max(q, 0), t)`` (``nn.ReLU6``: 6); raises
    :class:`UnsupportedLayerError` for a Hardtanh whose floor is not 0 (not a clipped ReLU)."""
    lo, hi = float(module.min_val), float(module.max_val)
    if lo != 0.0 or not hi > 0.0:
        raise UnsupportedLayerError(
            f"layer '{label or type(module).__name__}' ({type(module).__name__}) clips to [{lo:g}, {hi:g}]: "
            "dualview supports hard-clipped ReLUs min(max(q, 0), t) with t > 0 exactly (nn.ReLU6, "
            "nn.Hardtanh(0, t)), not other floors (its gates would not be those of a ReLU). Use nn.ReLU6 / "
            "nn.Hardtanh(0.0, t), or an nn.ReLU.")
    return hi


def leaky_slope(module: nn.Module, q: Tensor) -> Tensor | float:
    """The off-state slope ``a`` of a leaky ReLU call with pre-activation ``q``, broadcastable against ``q``
    (a PReLU with one slope per channel: along dimension 1); 0.0 for a ReLU."""
    if isinstance(module, nn.PReLU):
        a = module.weight.detach().to(dtype=q.dtype, device=q.device)
        return a.view(1, -1, *([1] * (q.dim() - 2))) if a.numel() > 1 else a.reshape(())
    if isinstance(module, nn.LeakyReLU):
        return float(module.negative_slope)
    return 0.0


def _leaky_refusal(label: str, module: nn.Module) -> UnsupportedLayerError:
    return UnsupportedLayerError(
        f"layer '{label}' ({type(module).__name__}) is a leaky ReLU: a gate whose off state has slope a instead "
        "of 0 (gate values in {a, 1}). dualview handles it exactly in recorded and imposed gates "
        "(record_gates, run_with_gates), gated linear models, switched projections, Insens and path counts "
        "(a path is active where its gates are on, as for ReLU), but not here: neural path kernels, gated "
        "networks and the excitation pullback's surrogate gates are defined for ReLU networks in the papers "
        "(the gradient methods of explain.attribute run on any model). Use nn.ReLU for these.")


def _smooth_blocks() -> tuple[tuple[type[nn.Module], ...], tuple[type[nn.Module], ...]]:
    """torchvision's ``(SqueezeExcitation,), (StochasticDepth,)`` (empty without torchvision)."""
    try:
        from torchvision.ops import SqueezeExcitation, StochasticDepth
    except ImportError:  # pragma: no cover - torchvision is a dependency of the book
        return (), ()
    return (SqueezeExcitation,), (StochasticDepth,)


def _smooth_refusal(label: str, module: nn.Module) -> UnsupportedLayerError:
    return UnsupportedLayerError(
        f"layer '{label}' ({type(module).__name__}) is a smooth activation q * g(q) (SiLU: g = sigmoid, "
        "GELU: g = Phi), not an on/off gate: its factor g(q) lies strictly between 0 and 1, the network is not "
        "piecewise linear (frozen at x it equals f only at x, on no region), and there are no on/off paths and "
        "no inactive state, so the exact dual view (recorded and imposed gates, gated linear models, switched "
        "projections, Insens, path counts, kernels, gated networks) does not apply. "
        "What runs: excitation pullbacks with surrogate gates (dualview.pullbacks.excitation_pullback, "
        "explain.attribute(..., 'pullback')) and the gradient-based methods of explain.attribute.")


def check_model(model: object) -> None:
    """Raise a TypeError that says what to pass instead, unless ``model`` is an eager ``nn.Module``: dualview
    sees a model's layers through module hooks and its operations through a torch-function mode, which a
    TorchScript module (``torch.jit.script`` / ``trace``) or a ``torch.compile`` wrapper hides."""
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            f"the model is a TorchScript module ({type(model).__name__}, from torch.jit.script or torch.jit.trace): "
            "its forward runs as a compiled graph, whose layers and operations dualview cannot see. Pass the "
            "eager nn.Module you scripted (the results are the same network's).")
    if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
        raise TypeError(
            "the model is a torch.compile wrapper (OptimizedModule): compiled code hides the layers and "
            "operations dualview checks. Pass the module it wraps, model._orig_mod (the same parameters).")
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")


class SelectOutput(nn.Module):
    """``model`` with one part of its output: ``SelectOutput(model, 0)`` for a model returning a tuple whose
    first item is the logits, ``SelectOutput(model, "logits")`` for a dict. dualview's methods need a model
    that returns one tensor of logits ``(N, classes)``."""

    def __init__(self, model: nn.Module, key: int | str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)[self.key]


def model_output(model: nn.Module, x: Tensor) -> Tensor:
    """``model(x)``, which must be one tensor; a tuple, list or dict output is refused with the wrapper that
    selects the logits (:class:`SelectOutput`)."""
    out = model(x)
    if isinstance(out, Tensor):
        return out
    if isinstance(out, dict):
        keys = ", ".join(repr(k) for k in out)
        example = f"SelectOutput(model, {next(iter(out))!r})" if out else "SelectOutput(model, key)"
        what = f"a dict with the keys {keys}"
    elif isinstance(out, (tuple, list)):
        example, what = "SelectOutput(model, 0)", f"a {type(out).__name__} of {len(out)} items"
    else:
        example, what = "a wrapper module", f"a {type(out).__name__}"
    raise TypeError(
        f"the model ({type(model).__name__}) returns {what}, not one tensor: dualview's methods need the logits "
        f"(N, classes) as the model's output. Wrap it so that it returns them, e.g. "
        f"dualview.gates.{example} (the item that holds the logits).")


def _checked_op_by_op(module: nn.Module) -> bool:
    """A layer of the user's own without parameters (a DropPath, a scaling, a reshaping): not refused up
    front, the guard of :func:`instrument` checks each operation of its forward (in eval mode an identity
    such as timm's DropPath computes nothing). torch's own layers are judged by their class."""
    return not type(module).__module__.startswith("torch.") and \
        not any(True for _ in module.parameters(recurse=False)) and not any(True for _ in module.children())


def check_supported(model: nn.Module, clipped: bool = False, smooth: bool = False,
                    _named: list[tuple[str, nn.Module]] | None = None, leaky: bool = False) -> None:
    """Raise :class:`UnsupportedLayerError` if ``model`` holds a layer dualview cannot handle.

    Leaf modules must be supported layers; modules with children must not own parameters of
    their own (their use would be invisible); BatchNorm and Dropout must be in eval mode. Hard-clipped
    ReLUs (:data:`CLIPPED_LAYERS`) are accepted with ``clipped=True`` only (by the computations that handle
    their saturated piece); SiLU / GELU (:data:`SMOOTH_LAYERS`), torchvision's ``SqueezeExcitation`` (whose
    inside is not checked: the rule holds its scale fixed) and ``StochasticDepth`` with ``smooth=True`` only
    (by the surrogate backward of excitation pullbacks). Leaky ReLUs (:data:`LEAKY_LAYERS`) with ``leaky=True``
    only (by the computations that handle their {a, 1} gates).
    """
    check_model(model)
    named = list(model.named_modules()) if _named is None else _named
    supported = SUPPORTED_LAYERS() + CLIPPED_LAYERS
    channel_gates, depth_drops = _smooth_blocks()
    skipped: list[str] = []  # the insides of channel gates
    for name, module in named:
        label = name or "<model>"
        if any(name.startswith(p + ".") for p in skipped):
            continue
        if smooth and type(module) in channel_gates:
            skipped.append(name)
            continue
        children = list(module.children())
        if isinstance(module, SMOOTH_LAYERS) and not children and \
                type(module).forward in (nn.SiLU.forward, nn.GELU.forward):
            if not smooth:
                raise _smooth_refusal(label, module)
            continue
        if smooth and type(module) in depth_drops:
            if module.training and module.p > 0:
                raise UnsupportedLayerError(f"layer '{label}' (StochasticDepth) is in training mode, where "
                                            "it drops rows at random: call model.eval() first.")
            continue
        if not children:
            if isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
                continue  # an empty container computes nothing
            if isinstance(module, LEAKY_LAYERS):
                if not leaky:
                    raise _leaky_refusal(label, module)
                if type(module).forward not in (nn.LeakyReLU.forward, nn.PReLU.forward):
                    raise UnsupportedLayerError(
                        f"layer '{label}' ({type(module).__name__}) subclasses a leaky ReLU but overrides its "
                        "forward: use the plain layer.")
                continue
            if isinstance(module, CLIPPED_LAYERS) and type(module).forward is nn.Hardtanh.forward:
                clip_ceiling(module, label)
                if not clipped:
                    raise UnsupportedLayerError(
                        f"layer '{label}' ({type(module).__name__}) is a hard-clipped ReLU: dualview "
                        "supports it exactly in recorded and imposed gates, excitation pullbacks, gated "
                        "linear models, switched projections and Insens (a gate plus a constant saturated "
                        "piece), but not here: path counts, neural path kernels and gated networks are "
                        "defined for ReLU networks. Use nn.ReLU for these.")
            declared = getattr(type(module), "linear_layer", False)
            if not (isinstance(module, supported) or declared) and _checked_op_by_op(module):
                if module.training:
                    raise UnsupportedLayerError(
                        f"layer '{label}' ({type(module).__name__}) is in training mode, where a layer of "
                        "your own may compute something random or input-dependent (a DropPath drops rows): "
                        "call model.eval() first.")
                continue  # no parameters, not torch's own: the guard checks what its forward computes
            if not (isinstance(module, supported) or declared):
                raise UnsupportedLayerError(
                    f"layer '{label}' ({type(module).__name__}) is not supported: dualview reads "
                    "gates only from nn.ReLU (and hard-clipped nn.ReLU6, nn.Hardtanh(0, t)) and nn.MaxPool "
                    "modules, between linear layers. "
                    f"Supported layers: {_supported_names()}. If '{label}' computes an affine map, "
                    "declare it with dualview.gates.register_linear_layer; if it is another "
                    "activation (GELU, Tanh, ...), the dual view of ReLU networks does not apply."
                )
            base = type(module) if type(module) in supported else \
                next((c for c in supported if isinstance(module, c)), None)
            if base is not None and not declared and type(module).forward is not base.forward:
                raise UnsupportedLayerError(
                    f"layer '{label}' ({type(module).__name__}) subclasses {base.__name__} but overrides its "
                    f"forward, so it need not compute what a {base.__name__} computes "
                    "(a gate is recognised by "
                    "what it computes, not by its class): use the plain layer, or make it a module whose "
                    "forward calls supported layers.")
        elif any(p is not None for p in module._parameters.values()):
            raise UnsupportedLayerError(
                f"module '{label}' ({type(module).__name__}) has parameters of its own besides its "
                "child layers, so dualview cannot see how they are used: move them into "
                "supported child layers (nn.Linear, nn.Conv2d, ...)."
            )
    check_eval(model, named)


def check_eval(model: nn.Module, _named: list[tuple[str, nn.Module]] | None = None) -> None:
    """Raise :class:`UnsupportedLayerError` unless every layer whose computation depends on the mode is in
    eval mode (BatchNorm, Dropout) and every BatchNorm has running statistics. Reads only flags and
    buffers: call it before any forward, so that a refused call leaves the model untouched."""
    check_model(model)
    for name, module in (model.named_modules() if _named is None else _named):
        label = name or "<model>"
        if isinstance(module, _EVAL_ONLY) and module.training:
            raise UnsupportedLayerError(
                f"layer '{label}' ({type(module).__name__}) is in training mode, where it is not a fixed "
                "linear map (and a forward would change its buffers): call model.eval() first.")
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and \
                (not module.track_running_stats or module.running_mean is None):
            raise UnsupportedLayerError(
                f"layer '{label}' ({type(module).__name__}) has no running statistics "
                "(track_running_stats=False), so it normalises with the statistics of each batch, also in "
                "eval mode: not a fixed linear map. Give it running statistics (train with "
                "track_running_stats=True) or fold it into the preceding layer.")


# What the guard of :func:`instrument` lets a ``forward`` apply to a tensor that depends on the input,
# by the function's name (``torch.add``, ``Tensor.add``, ``Tensor.add_`` and ``Tensor.__add__`` alike).
# torch's own affine layers are checked by their calls too (``nn.Conv2d`` calls ``F.conv2d``, ``nn.BatchNorm2d``
# ``F.batch_norm`` in eval mode: both on the list); the calls inside gates, max-pools and the affine layers
# registered or declared by users are not checked (the layer is trusted whole); calls on tensors that do not
# depend on the input (constants, parameters) are free.
_LINEAR_OPS = frozenset("""
    add sub neg positive sum mean cat concat concatenate stack hstack vstack view view_as reshape reshape_as
    flatten unflatten permute transpose swapaxes swapdims t T mT contiguous clone squeeze unsqueeze expand
    expand_as repeat tile flip fliplr flipud roll narrow chunk split tensor_split unbind movedim moveaxis
    select getitem setitem iter index_select gather take take_along_dim pad avg_pool1d avg_pool2d avg_pool3d
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d interpolate upsample upsample_nearest
    upsample_bilinear pixel_shuffle pixel_unshuffle channel_shuffle fold unfold diagonal tril triu cumsum
    diff broadcast_to sum_to_size as_strided masked_fill where to type type_as float double half bfloat16
    cpu cuda copy zero fill dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout
    batch_norm index_add scatter scatter_add index_copy index_fill masked_scatter masked_select
    iadd radd isub rsub pos
""".split())
# bilinear: linear in each argument, so at most one argument may depend on the input
_PRODUCT_OPS = frozenset("""
    mul multiply imul rmul matmul rmatmul mm bmm mv dot inner outer einsum linear conv1d conv2d conv3d
    conv_transpose1d conv_transpose2d conv_transpose3d addmm addmv baddbmm addbmm tensordot kron
""".split())
_DIVISION_OPS = frozenset("div divide true_divide truediv itruediv".split())  # only the numerator may depend
# comparisons, masks and arg-max: allowed, their (input-dependent) results may not be used as masks,
# indices or factors, nor read into Python
_SWITCH_OPS = frozenset("""
    gt lt ge le eq ne greater less greater_equal less_equal not_equal sign signbit isfinite isnan isinf
    argmax argmin argsort any all logical_not logical_and logical_or
""".split())
_META_OPS = frozenset("""
    shape dtype device ndim size dim numel nelement is_floating_point is_complex requires_grad grad_fn
    is_leaf layout names stride is_contiguous element_size storage_offset is_cuda is_cpu is_mps is_meta
    is_sparse is_quantized is_nested len repr format output_nr requires_grad_ retain_grad register_hook
    new_zeros new_ones new_empty new_full new_tensor zeros_like ones_like empty_like full_like rand_like
    randn_like randint_like get_device itemsize nbytes
""".split())
_READ_OPS = frozenset("read item tolist numpy nonzero data detach".split())
_RELU_OPS = frozenset({"relu"})


def _op_name(func: Callable) -> str:
    """``add`` for ``torch.add``, ``Tensor.add_`` and ``Tensor.__add__``; ``shape`` for ``Tensor.shape``."""
    name = getattr(func, "__name__", "") or ""
    if name in ("__get__", "__set__"):
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    if name in ("__bool__", "__float__", "__int__", "__index__", "__complex__", "__array__"):
        return "read"
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
    elif name.endswith("_") and not name.startswith("_"):
        name = name[:-1]
    return name


def _op_kind(func: Callable) -> str:
    name = _op_name(func)
    for kind, names in (("meta", _META_OPS), ("relu", _RELU_OPS), ("linear", _LINEAR_OPS),
                        ("product", _PRODUCT_OPS), ("division", _DIVISION_OPS), ("switch", _SWITCH_OPS),
                        ("read", _READ_OPS)):
        if name in names:
            return kind
    return "refused"


_KINDS: dict[Callable, str] = {}


def _tensors(args, kwargs) -> Iterator[Tensor]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, Tensor))


def _user_frame() -> str:
    """The innermost stack frame outside torch and dualview.gates: where the model's code made the call."""
    torch_dir = torch.__file__.rsplit("/", 1)[0] + "/"  # (not torchvision/)
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(torch_dir) and \
                not frame.filename.endswith("dualview/gates.py"):
            return f'{frame.filename}:{frame.lineno} ("{(frame.line or "").strip()}")'
    return "an unknown place"


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


class _Guard(TorchFunctionMode):
    """Active during the root model's forward: a whitelist of what the model's own code (the ``forward`` of
    containers and of the root) may apply to tensors that depend on the input. It tracks which tensors
    depend on the input (the root's arguments, and everything computed from them) and lets through
    operations that are linear in them (:data:`_LINEAR_OPS`; products and quotients with at most one
    dependent factor, a dependent numerator), comparisons whose results are then not used as masks,
    indices or factors, and functional ReLUs that a rule accepts. Anything else raises
    :class:`UnsupportedLayerError` naming the operation, the module and the line of code. torch's own
    affine layers are not hooked: their calls (``F.conv2d``, ``F.batch_norm``, ...) pass this list like any
    other. Calls inside gates, max-pools and registered or declared affine layers are not checked (the layer
    is known to compute what its class says)."""

    def __init__(self, rules: tuple[Rule, ...], root: nn.Module | None = None) -> None:
        super().__init__()
        self.rules = rules
        self.op_rules = [r for r in rules if type(r).linear_op is not Rule.linear_op]
        self.root = root  # named in a refusal outside every hooked module (a root that is a torch layer)
        self.stack: list[tuple[str, nn.Module, bool]] = []  # (label, module, its own calls are trusted)
        self.internal = 0  # > 0 while a rule runs: its own calls are not the model's
        self.pending: UnsupportedLayerError | None = None  # the last refusal, see __torch_function__
        self.dependent: dict[int, weakref.ref] = {}  # id -> tensor, for tensors that depend on the input
        # inputs of in-place ReLUs (overwritten in the real network): id -> (the input, the ReLU's output)
        self.stale: dict[int, tuple[weakref.ref, Tensor]] = {}

    def fresh(self, args, kwargs):
        """``args, kwargs`` with the input of an in-place ReLU, read again after the ReLU, replaced by the
        ReLU's output (what the real network's overwritten tensor holds), or ``None`` if none was read."""
        def swap(a):
            if isinstance(a, Tensor):
                entry = self.stale.get(id(a))
                return entry[1] if entry is not None and entry[0]() is a else a
            if isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
                swapped = [swap(t) for t in a]
                return type(a)(swapped) if any(x is not y for x, y in zip(swapped, a)) else a
            return a
        new_args, new_kwargs = tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}
        changed = any(x is not y for x, y in zip(new_args, args)) or \
            any(new_kwargs[k] is not kwargs[k] for k in kwargs)
        return (new_args, new_kwargs) if changed else None

    def depends(self, t: Tensor) -> bool:
        r = self.dependent.get(id(t))
        return r is not None and r() is t

    def mark(self, out) -> None:
        if isinstance(out, Tensor):
            self.dependent[id(out)] = weakref.ref(out)
        elif isinstance(out, (list, tuple)):
            for t in out:
                self.mark(t)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.internal or (self.stack and self.stack[-1][2]):
            return func(*args, **kwargs)
        kind = _KINDS.get(func)
        if kind is None:
            kind = _KINDS[func] = _op_kind(func)
        if kind == "meta":
            return func(*args, **kwargs)
        dep = [t for t in _tensors(args, kwargs) if self.depends(t)]
        if not dep:
            return func(*args, **kwargs)
        if self.stale:
            swapped = self.fresh(args, kwargs)
            if swapped is not None:
                return self.__torch_function__(func, types, *swapped)
        problem = self.problem(func, kind, args, kwargs, dep)
        if problem is None:
            out = None
            if self.op_rules and kind in ("linear", "product", "division"):
                label, owner = (self.stack[-1][:2]) if self.stack else ("<model>", self.root)
                where = f"'{label}' ({type(owner).__name__}), at {_user_frame()}"
                name = _op_name(func)
                out = _apply(self, lambda rule: rule.linear_op(name, func, args, kwargs, dep, where)
                             if rule in self.op_rules else None, f"{name} in {where}")
            if out is None:
                out = func(*args, **kwargs)
            self.mark(out)
            return out
        label, owner = (self.stack[-1][:2]) if self.stack else ("<model>", self.root)
        where = f"'{label}' ({type(owner).__name__})"
        if kind == "relu":
            inplace = getattr(func, "__name__", "").endswith("_") or \
                bool(kwargs.get("inplace", args[1] if len(args) > 1 else False))
            x = args[0]
            q = x.clone() if inplace else x  # the rule's output may depend on q, which the copy overwrites
            out = _apply(self, lambda rule: rule.functional_relu(where, q), f"functional ReLU in {where}")
            if out is not None:
                out = x.copy_(out) if inplace else out
                self.mark(out)
                return out
        # Tensor.__matmul__ & co. turn a TypeError into NotImplemented (then Python's own "unsupported
        # operand" TypeError): instrument() re-raises the pending error in its place
        if kind == "relu":
            self.pending = UnsupportedLayerError(
                f"the forward of {where} calls {_op_name(func)} as a function on a tensor that depends on the "
                f"input, at {_user_frame()}: {problem}, so this computation cannot record or impose its gates. "
                "What to do: dualview.dgn.one_relu_per_use(model) returns a copy of the model in which every "
                "F.relu / torch.relu / x.relu() call is an nn.ReLU module of its own (traced with torch.fx; the "
                "model itself is not modified); pass that copy. Or write the ReLUs as nn.ReLU modules.")
            raise self.pending
        self.pending = UnsupportedLayerError(
            f"the forward of {where} calls {_op_name(func)} as a function on a tensor that depends on the "
            f"input, at {_user_frame()}: {problem}. dualview refuses what it does not know to be linear, a "
            "gate or a supported piecewise-linear layer, because the dual view (gates, switched and gated "
            "linear models, pullbacks, Insens) would silently be wrong. What to do: apply ReLUs and max-pools "
            "through nn.ReLU / nn.MaxPool2d modules (their gates are recorded; a module may be called more "
            "than once, each call is its own gate site); other non-linearities "
            "(softmax and attention, normalisation by the input's own statistics, GELU/SiLU/tanh, clamps, "
            "max/amax, products of two activations) are outside the exact dual view of ReLU networks.")
        raise self.pending

    def problem(self, func, kind: str, args, kwargs, dep: list[Tensor]) -> str | None:
        """Why ``func`` may not be applied to the dependent tensors ``dep``, or ``None`` when it may."""
        if any(not t.is_floating_point() for t in dep) and kind != "switch":
            return ("it uses a mask, an index or an integer computed from the input (an input-dependent "
                    "selection is a switch dualview cannot see)")
        if kind == "relu":
            return "a functional ReLU: dualview sees gates only through nn.ReLU modules"
        if kind in ("linear", "switch"):
            name = _op_name(func)
            if name.startswith("dropout") or name.endswith("dropout"):
                training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                if training and p:
                    return "dropout in training mode is random, not a fixed linear map (pass training=False)"
            if name == "batch_norm":
                training = kwargs.get("training", args[5] if len(args) > 5 else False)
                if training or (len(args) > 1 and args[1] is None):
                    return "batch normalisation with the batch's own statistics is not a fixed linear map"
            return None
        if kind == "product":
            return None if len(dep) <= 1 else "it multiplies two tensors that both depend on the input"
        if kind == "division":
            first = args[0] if args else None
            return None if len(dep) == 1 and first is dep[0] else \
                "it divides by a tensor that depends on the input"
        if kind == "read":
            return ("it reads a tensor that depends on the input into Python (or detaches it), so what "
                    "follows can switch on the input unseen")
        return "it is not known to be linear in its input"


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
    ``with`` body), refuses every operation on input-dependent tensors that is not known to be linear
    (the whitelist of :class:`_Guard`; a functional ReLU only where a rule accepts it).
    Call the model itself, not a submodule, inside the block. Blocks on
    the same model (or a module of it) do not nest: combine the rules in one block instead.
    :func:`record_gates`, :func:`run_with_gates`, path counting and excitation pullbacks are built on it.
    """
    bad = [r for r in rules if not isinstance(r, Rule)]
    if bad:
        raise TypeError(f"instrument expects dualview.gates.Rule objects, got {bad!r}")
    smooth = bool(rules) and all(r.smooth for r in rules)
    leaky = bool(rules) and all(r.leaky for r in rules)
    named = list(model.named_modules()) if isinstance(model, nn.Module) else None  # one walk for the checks
    check_supported(model, clipped=bool(rules) and all(r.clipped for r in rules), smooth=smooth, _named=named,
                    leaky=leaky)
    modules = [m for _, m in named]
    if any(m in _INSTRUMENTED for m in modules):
        raise RuntimeError("dualview.gates.instrument is already active on this model (or a module of it); "
                           "do not nest the blocks: pass all rules to one block")
    guard = _Guard(rules, model)
    norm_rules = any(type(r).batch_norm is not Rule.batch_norm for r in rules)
    channel_gates, depth_drops = _smooth_blocks() if smooth else ((), ())
    supported = SUPPORTED_LAYERS() + CLIPPED_LAYERS + (SMOOTH_LAYERS + depth_drops if smooth else ()) + \
        (LEAKY_LAYERS if leaky else ())
    gate_layers = GATE_LAYERS + CLIPPED_LAYERS + (SMOOTH_LAYERS if smooth else ()) + (LEAKY_LAYERS if leaky else ())
    scales: dict[int, Tensor] = {}  # the scale of each squeeze-and-excitation call, by id of the block
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
            guard.dependent.clear()
            guard.stale.clear()
            guard.pending = None
            guard.__enter__()
            guard.mark(list(_tensors(args, {})))
        depth[0] += 1

    def leave(mod, args, out):
        depth[0] -= 1
        if depth[0] == 0:
            guard.__exit__(None, None, None)
            guard.dependent.clear()
            guard.stale.clear()

    def push(mod, args, label, trusted):
        swapped = None
        if depth[0] and guard.stale:
            swapped = guard.fresh(args, {})
            if swapped is not None:
                args = swapped[0]
        if type(mod) in _UNVERIFIED and args and isinstance(args[0], Tensor):
            guard.internal += 1
            try:
                _check_affine(mod, args[0], label)
            finally:
                guard.internal -= 1
            _UNVERIFIED.discard(type(mod))  # checked once per class
        guard.stack.append((label, mod, trusted))
        if isinstance(mod, gate_layers) and getattr(mod, "inplace", False):
            # an in-place ReLU overwrites its input: it gets a copy, so that its input keeps the
            # pre-activation for the rules; a later read of that input gets the ReLU's output instead
            captured[id(mod)] = args[0]
            copied = args[0].clone()
            guard.mark(copied)
            return (copied, *args[1:])
        return args if swapped is not None else None

    def pop(mod, args, out):
        if guard.stack and guard.stack[-1][1] is mod:
            guard.stack.pop()
        if depth[0] and any(guard.depends(t) for t in _tensors(args, {})):
            guard.mark(out)

    def at_relu(mod, args, out, label):
        q, s = captured.pop(id(mod), args[0]), site(label)
        new = _apply(guard, lambda rule: rule.relu_output(s, mod, q, out), f"ReLU call '{s}'")
        pop(mod, args, out if new is None else new)
        if getattr(mod, "inplace", False):
            guard.stale[id(q)] = (weakref.ref(q), out if new is None else new)
        return new

    def at_pool(mod, args, out, label):
        s = site(label)
        new = _apply(guard, lambda rule: rule.max_pool(s, mod, args[0], out), f"max-pool call '{s}'")
        pop(mod, args, out if new is None else new)
        return new

    def at_norm(mod, args, out, label):  # the guard checked the layer's own call (F.batch_norm, eval mode)
        if not depth[0] or not args or not isinstance(args[0], Tensor):
            return None
        x = args[0]
        if guard.stale:  # an in-place ReLU's input read again: the layer read the ReLU's output
            swapped = guard.fresh(args, {})
            x = x if swapped is None else swapped[0][0]
        new = _apply(guard, lambda rule: rule.batch_norm(mod, x, out), f"BatchNorm call '{label}'")
        if new is not None:
            guard.mark(new)
        return new

    def at_channel_gate(mod, args, out, label):  # out = x * scale, the scale recorded by its sigmoid's hook
        s = site(label)
        scale = scales.pop(id(mod), None)
        if scale is None:  # the block left before its sigmoid ran (an exception): nothing to replace
            pop(mod, args, out)
            return None
        new = _apply(guard, lambda rule: rule.channel_gate(s, mod, args[0], scale), f"channel gate '{s}'")
        pop(mod, args, out if new is None else new)
        return new

    handles = [model.register_forward_pre_hook(enter)]
    inside: list[str] = []  # the insides of channel gates: not hooked (the block is trusted as a whole)
    try:
        for name, module in named:
            label = name or "<model>"
            if inside and any(name.startswith(p + ".") for p in inside):
                continue
            if type(module) in _BUILTIN_LINEAR and type(module) is not nn.Identity:
                # torch's own affine layers (their forward is torch's, check_supported made sure) are not
                # hooked: the guard checks the few calls they make (F.conv2d, F.batch_norm in eval, ...)
                # against the whitelist like any other, and hands them an in-place ReLU's output where they
                # read its input (nn.Identity makes no call: it keeps its hooks, which do that)
                if norm_rules and isinstance(module, nn.modules.batchnorm._BatchNorm):
                    handles.append(module.register_forward_hook(partial(at_norm, label=label)))
                continue
            if type(module) in channel_gates:
                inside.append(name)
                handles.append(module.scale_activation.register_forward_hook(
                    lambda m, a, o, key=id(module): scales.__setitem__(key, o)))
            post = partial(at_relu, label=label) if isinstance(module, gate_layers) else \
                partial(at_pool, label=label) if isinstance(module, POOL_GATE_LAYERS) else \
                partial(at_channel_gate, label=label) if type(module) in channel_gates else pop
            trusted = getattr(type(module), "linear_layer", False) or type(module) in channel_gates or \
                (not any(True for _ in module.children()) and isinstance(module, supported))
            handles += [module.register_forward_pre_hook(partial(push, label=label, trusted=trusted)),
                        module.register_forward_hook(post, always_call=True)]
        handles.append(model.register_forward_hook(leave, always_call=True))
        _INSTRUMENTED.update(modules)
        try:
            yield
        except TypeError as err:
            if guard.pending is not None and err is not guard.pending:
                raise guard.pending from None
            raise
    finally:
        for h in handles:
            h.remove()
        _INSTRUMENTED.difference_update(modules)
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


def _tf32_switches() -> list[tuple[object, str, object]]:
    """``(namespace, attribute, full-precision value)`` of each switch that lets float32 matmuls and cuDNN
    convolutions run in TF32 on a CUDA GPU (10-bit mantissa; the default for convolutions on Ampere and
    later). PyTorch's per-backend ``fp32_precision`` where it has one (2.9 and later: mixing it with
    the legacy ``allow_tf32`` flags can raise), else the legacy flags."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(getattr(cudnn, "conv", None), "fp32_precision"):
        backends = (matmul, cudnn.conv, getattr(cudnn, "rnn", None))
        return [(b, "fp32_precision", "ieee") for b in backends if hasattr(b, "fp32_precision")]
    return [(matmul, "allow_tf32", False), (cudnn, "allow_tf32", False)]


def tf32_off() -> None:
    """Run float32 matmuls and convolutions in full float32 precision from now on (TF32 off; what
    :func:`dualview.setup` does on CUDA). No effect on a CPU."""
    for namespace, name, value in _tf32_switches():
        setattr(namespace, name, value)


def _tf32_on() -> bool:
    """Whether float32 matmuls or convolutions may run in TF32 on a CUDA GPU (the switches as they are)."""
    return any(getattr(namespace, name) in (True, "tf32") for namespace, name, _ in _tf32_switches())


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Inside the block (or the decorated function), TF32 is off (:func:`tf32_off`); on exit, also after an
    exception, the caller's settings are back. The dual-view objects that check themselves
    (:func:`dualview.pullbacks.gated_linear_model`, :func:`dualview.projections.switched_projections`, Insens)
    run inside it, so their self-check compares float32 with float32 even where the caller uses TF32: a
    convolution in TF32 is off by about 1e-3 of its size, which the check would take for a non-linearity."""
    switches = _tf32_switches()
    saved = [getattr(namespace, name) for namespace, name, _ in switches]
    try:
        tf32_off()
        yield
    finally:
        for (namespace, name, _), value in zip(switches, saved):
            setattr(namespace, name, value)


def check_reproduces(what: str, terms: Tensor, bias: Tensor, output: Tensor) -> None:
    """Raise :class:`UnsupportedLayerError` unless ``terms.sum(-1) + bias = output``: an
    affine model (``terms`` = weight times input, per coordinate, in the last dimension) reproduces the
    network's own output at ``x``. Tolerance: a multiple of the dtype's rounding error of that sum. Float32
    CUDA tensors computed with TF32 on miss it: then the error names TF32 and how to turn it off."""
    eps = torch.finfo(terms.dtype).eps
    lhs = terms.sum(-1) + bias
    scale = terms.abs().sum(-1) + bias.abs() + output.abs()
    tol = 64 * eps * math.sqrt(terms.shape[-1] + 1) * scale + torch.finfo(terms.dtype).tiny
    err = (lhs - output).abs()
    if not bool((err <= tol).all()):
        worst = int((err - tol).flatten().argmax())
        raise UnsupportedLayerError(
            f"{what} does not reproduce the network at x: <w, x> + b = {float(lhs.flatten()[worst]):.6g} but "
            f"the network gives {float(output.flatten()[worst]):.6g} "
            f"(tolerance {float(tol.flatten()[worst]):.2g}). "
            + (_TF32_HINT if terms.is_cuda and terms.dtype == torch.float32 and _tf32_on() else
               "The network is not affine once its gates are fixed: it computes something dualview does not "
               "see (a non-linearity it does not know). This is refused rather than returned wrong; please "
               "report the model."))


_TF32_HINT = ("TF32 is on (PyTorch's default for convolutions on this GPU: float32 products rounded to a "
              "10-bit mantissa, errors of about 1e-3), the likely cause if these numbers come from your own "
              "forward pass. Turn it off before computing them, with the two lines "
              "torch.backends.cuda.matmul.allow_tf32 = False and torch.backends.cudnn.allow_tf32 = False "
              "(or compute them inside dualview.gates.full_precision()).")


def record_gates(model: nn.Module, x: Tensor) -> GateRecord:
    """Run ``model(x)`` and record every ReLU's pre-activation and every max-pool's winners.

    Gradients flow through the recorded pre-activations (wrap the call in ``torch.no_grad()``
    when you do not need them). See :class:`GateRecord` for the naming of layers.
    """
    check_batch(x)
    rule = Record()
    with instrument(model, rule):
        out = model_output(model, x)
    return GateRecord(output=out, preactivations=rule.preactivations, pool_indices=rule.pool_indices,
                      ceilings=rule.ceilings)


def run_with_gates(model: nn.Module, x: Tensor, gates: Mapping[str, Tensor],
                   pool_indices: Mapping[str, Tensor] | None = None,
                   preactivations: dict[str, Tensor] | None = None,
                   saturated: Mapping[str, Tensor] | None = None) -> Tensor:
    """Run ``model`` on ``x`` with every ReLU replaced by a GaLU fed the given ``gates``.

    Each ReLU call ``name`` outputs ``q * gates[name]`` where ``q`` is its pre-activation on ``x``;
    gates may be bool (hard) or float (soft, e.g. ``sigmoid(beta * q_gating)``), and broadcast
    against ``q``. If ``pool_indices`` is given, every max-pool takes the given winners instead of
    its own maxima (otherwise it pools ``x``'s own values). With the model's own gates and
    winners the output equals ``model(x)``; with those of another input it is that input's active
    sub-network applied to ``x`` (Section 2.2 of :cite:`satkiewicz2025tapping`). A dict passed as
    ``preactivations`` receives the pre-activation ``q`` of every ReLU call, by name
    (rules :class:`ImposeGates` and :class:`Record`). A hard-clipped ReLU call outputs
    ``q * gates[name] + t * saturated[name]`` (``saturated``: ``record_gates(model, x).saturated`` of the
    input whose pieces are held fixed; required when the model has such calls).
    """
    check_batch(x)
    impose = ImposeGates(gates, pool_indices, saturated)
    rules = (impose,) if preactivations is None else (Record(preactivations, winners=False), impose)
    with instrument(model, *rules):
        out = model_output(model, x)
    impose.check_complete()
    return out


def active_share(model: nn.Module, x: Tensor, batch_size: int = 500,
                 per_layer: bool = True) -> dict[str, Tensor] | Tensor:
    """Per input, the share of active gates (ReLU units with ``q > 0``; hard-clipped ones with ``0 < q < t``).

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
            for name, g in record_gates(model, chunk).gates.items():
                parts.setdefault(name, []).append(g.flatten(1).sum(1).cpu())
                sizes[name] = g[0].numel()
    on = {k: torch.cat(v).double() for k, v in parts.items()}
    if per_layer:
        return {k: on[k] / sizes[k] for k in on}
    return sum(on.values()) / sum(sizes.values())
