"""Which layers the dual view accepts, and the checks of a model and of its inputs (see :mod:`dualview.gates`)."""
from __future__ import annotations

import contextlib
import copy

import torch
from torch import Tensor, nn

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
#: The transformer layers ``nn.LayerNorm`` (normalises by its input's own statistics) and ``nn.MultiheadAttention``
#: (multiplies input-dependent softmax weights and values): not piecewise linear, no exact dual view; accepted
#: only by rules with ``smooth = True`` (the surrogate backward, :mod:`dualview.attention`).
TRANSFORMER_LAYERS: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.MultiheadAttention)
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


def _transformer_refusal(label: str, module: nn.Module) -> UnsupportedLayerError:
    what = "attention: it multiplies two tensors that depend on the input (softmax weights and values)" \
        if isinstance(module, nn.MultiheadAttention) else \
        "a normalisation by its input's own mean and variance"
    return UnsupportedLayerError(
        f"layer '{label}' ({type(module).__name__}) is {what}. It is not piecewise linear: no gates held fixed "
        "make the network affine, so the exact dual view (recorded and imposed gates, gated linear models, "
        "switched projections, Insens, path counts, kernels, gated networks) does not apply. What runs: "
        "excitation pullbacks, with the follow-up's surrogate rules (LayerNorm's mean and variance held fixed, "
        "attention's softmax weights held fixed; dualview.pullbacks.excitation_pullback, "
        "explain.attribute(..., 'pullback')), and the gradient-based methods of explain.attribute.")


def _check_transformer_layer(label: str, module: nn.Module) -> None:
    """What the surrogate rules of LayerNorm and attention cover: the plain layers, attention without extra
    key/value biases, in eval mode."""
    base = nn.MultiheadAttention if isinstance(module, nn.MultiheadAttention) else nn.LayerNorm
    what = None
    if type(module).forward is not base.forward:
        what = f"subclasses {base.__name__} but overrides its forward (use the plain layer)"
    elif base is nn.MultiheadAttention and (module.bias_k is not None or module.add_zero_attn):
        what = "has add_bias_kv=True or add_zero_attn=True, which the attention rule does not cover"
    elif base is nn.MultiheadAttention and module.training and module.dropout > 0:
        what = "is in training mode, where it drops attention weights at random: call model.eval() first"
    if what is not None:
        raise UnsupportedLayerError(f"layer '{label}' ({type(module).__name__}) {what}.")


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
    such as timm's DropPath computes nothing). torch's and dualview's own layers are judged by their class."""
    return not type(module).__module__.startswith(("torch.", "dualview.")) and \
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
    only (by the computations that handle their {a, 1} gates). ``nn.LayerNorm`` and ``nn.MultiheadAttention``
    (:data:`TRANSFORMER_LAYERS`, the attention's inside not checked: the rule re-implements it) with
    ``smooth=True`` only, and then containers may own parameters (a ViT's class token and position embedding):
    the guard of :func:`instrument` checks every operation of their ``forward``.
    """
    check_model(model)
    named = list(model.named_modules()) if _named is None else _named
    for name, module in named:  # named first, before a container's own parameters (a ViT's class token)
        registered = type(module) in _LINEAR_LAYERS or getattr(type(module), "linear_layer", False)
        if isinstance(module, TRANSFORMER_LAYERS) and not registered:  # (registered: checked for affinity)
            if not smooth:
                raise _transformer_refusal(name or "<model>", module)
            _check_transformer_layer(name or "<model>", module)
    supported = SUPPORTED_LAYERS() + CLIPPED_LAYERS
    channel_gates, depth_drops = _smooth_blocks()
    skipped: list[str] = []  # the insides of channel gates
    for name, module in named:
        label = name or "<model>"
        if any(name.startswith(p + ".") for p in skipped):
            continue
        if smooth and (type(module) in channel_gates or isinstance(module, TRANSFORMER_LAYERS)):
            skipped.append(name)  # (a LayerNorm has no inside)
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
        elif not smooth and any(p is not None for p in module._parameters.values()):
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
