"""One verb for every attribution method: ``attribute(model, x, target, method=...)``.

As in Captum, every method takes a batch ``x`` ``(N, C, H, W)`` (or any ``(N, ...)`` for the gradient
family) and the class ``target`` (one for all samples or one per sample) and returns a map shaped like
``x``, so that methods are interchangeable in figures and in metrics (Chapter 9):

* ``"gradient"``: the input gradient of the target logit (the hard-gated pullback, Chapter 6);
* ``"gradient_x_input"``: gradient times input minus ``baseline`` (default 0: gradient times input);
* ``"integrated_gradients"``: Captum's Integrated Gradients :cite:`sundararajan2017axiomatic` (``baseline``,
  ``n_steps``; ``chunk_size``: the (input, step) pairs per forward and backward pass, see :func:`attribute`);
* ``"smoothgrad"``: Captum's NoiseTunnel over the plain (signed) gradient :cite:`smilkov2017smoothgrad`
  (``n_samples``, ``noise``: the noise's standard deviation; noise from torch's global generator, so seed
  first);
* ``"lrp"``: Zennit's LRP :cite:`bach2015pixel,anders2021software` with the composite ``EpsilonGammaBox``
  (epsilon in the dense layers, gamma in the convolutions, the z^B rule with the input's bounds in the first
  layer) or ``"epsilon_plus_flat"`` (flat rule in the first layer: a blob that ignores the image) or
  ``"epsilon"`` (epsilon everywhere); on a canonized copy (Zennit's ResNetCanonizer: BatchNorm merged,
  torchvision's residual sums as ``Sum`` layers); ``x``'s bounds are ``low``/``high`` (default 0 and 1) or
  ``normalised=True`` (ImageNet's mean and std); relevance sum / logit is checked; anything else is refused;
* ``"pullback"``: the excitation pullback :cite:`satkiewicz2025tapping` (``temperature``,
  ``pool_temperature``, ``smooth_temperature``; :func:`dualview.pullbacks.excitation_pullback`); on SiLU /
  GELU models (EfficientNet) a surrogate backward with their gates ``sigmoid(q / tau)`` / ``Phi(q / tau)``,
  not an exact dual view (:mod:`dualview.surrogates`); ``surrogate="normal_cdf"``: the authors' current rules
  (``Phi(q / 0.6)``); ViT-style models with LayerNorm and attention (``attention_temperature``;
  :mod:`dualview.attention`);
* ``"pullback_x_input"``: pullback times input minus ``baseline`` (default 0), as ``"gradient_x_input"``;
* ``"insens"``: Insens :cite:`szymanski2020switched` (:func:`dualview.projections.insens`; ``chunk_size``,
  ``progress``: a progress bar over the forward-mode sweep), *class-agnostic*: the ``target`` is checked and
  ignored;
* ``"intensity"``: ``|x - baseline|``, a trivial baseline that knows nothing of the network;
* ``"edges"``: the Sobel edge magnitude of the channel-mean image, on every channel, another.

:func:`quantus_explain_func` adapts the verb to Quantus' ``explain_func`` convention (NumPy in, NumPy out).

Each method is one small function ``(model, x, t, **options)`` in the table ``_METHODS``; its keyword
parameters are the options it takes, and :func:`attribute` checks a call's options against them.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import copy
import inspect
import warnings

import numpy as np
import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from dualview import projections, pullbacks
from dualview.gates import UnsupportedLayerError, check_batch, check_eval, model_output
from dualview.metrics import target_classes

__all__ = ["METHODS", "CLASS_AGNOSTIC", "attribute", "edge_map", "quantus_explain_func"]

CLASS_AGNOSTIC: frozenset[str] = frozenset({"insens", "intensity", "edges"})
"""Methods whose map does not depend on the target class."""


def edge_map(x: Tensor) -> Tensor:
    """Sobel gradient magnitude of the channel-mean image ``(N, C, H, W) -> (N, H, W)`` (zero padding)."""
    if x.dim() != 4:
        raise ValueError(f"edge_map needs images (N, C, H, W), got shape {tuple(x.shape)}")
    grey = x.mean(1, keepdim=True)
    kx = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=x.dtype, device=x.device).view(1, 1, 3, 3)
    gx = torch.nn.functional.conv2d(grey, kx, padding=1)
    gy = torch.nn.functional.conv2d(grey, kx.transpose(2, 3), padding=1)
    return (gx.square() + gy.square()).sqrt()[:, 0]


def _baseline(x: Tensor, value: float | Sequence[float] | Tensor) -> Tensor:
    """A baseline shaped like ``x`` from a number or a per-channel ``(C,)`` value."""
    base = torch.as_tensor(value, dtype=x.dtype, device=x.device)
    if base.dim() == 1:
        if base.numel() != x.shape[1]:
            raise ValueError(f"a per-channel baseline needs {x.shape[1]} values, got {base.numel()}")
        base = base.view(1, -1, *[1] * (x.dim() - 2))
    return base.expand_as(x).contiguous()


def _zoo_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(preprocess, net)`` of a model from :func:`dualview.zoo.load_pretrained`, else ``(Identity, model)``."""
    if isinstance(model, nn.Sequential) and hasattr(model, "preprocess") and hasattr(model, "net"):
        return model.preprocess, model.net
    return nn.Identity(), model


IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

_LRP_LEAVES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ReLU, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d, nn.Flatten, nn.Unflatten, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
)
"""Layers (exact classes) with an LRP rule in Zennit's composites that is right for them in eval mode, or that
only move numbers; BatchNorm only when a canonizer merges it into the layer before it."""

_ROUTING: frozenset[str] = frozenset({
    "flatten", "view", "reshape", "permute", "transpose", "contiguous", "squeeze", "unsqueeze", "__getitem__",
    "cat", "concat", "concatenate", "stack", "chunk", "split", "unbind", "narrow", "select", "clone", "detach",
    "to", "float", "double", "relu", "relu_", "dropout", "expand", "expand_as", "view_as", "pad",
})
"""Functions a forward may call between layers: they move, copy or select numbers (relevance follows them as the
gradient does, and is conserved), or are a ReLU, whose relevance the layer above already routes."""


def _lrp_bounds(x: Tensor, preprocess: nn.Module, low: Any, high: Any, normalised: Any) -> tuple[Tensor, Tensor]:
    """The z^B rule's pixel bounds in the network's input space, ``(1, C, H, W)`` each."""
    if normalised is not False and (low is not None or high is not None):
        raise ValueError("give either normalised= (the input's mean and std) or low=/high= (its bounds), not both")
    if normalised is not False:
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalised is True else normalised
        mean, std = _baseline(x[:1], mean), _baseline(x[:1], std)
        low, high = (0.0 - mean) / std, (1.0 - mean) / std
    low, high = _baseline(x[:1], 0.0 if low is None else low), _baseline(x[:1], 1.0 if high is None else high)
    with torch.no_grad():
        low, high = preprocess(low), preprocess(high)
    return torch.minimum(low, high), torch.maximum(low, high)


def _lrp_advice(op: str) -> str:
    """Why LRP cannot follow ``op`` between its layers, and what to do, by the kind of operation."""
    if op.startswith(("add", "sub", "rsub")):
        return ("A residual sum that no canonizer covers: Zennit's ResNetCanonizer rewrites only torchvision's "
                "BasicBlock and Bottleneck, so relevance would be copied into both branches. Use a torchvision "
                "ResNet, or write the sum as a zennit.layer.Sum module (with a stacked input).")
    if op in ("mean", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "sum"):
        return ("A functional average (or sum) over positions: Zennit's rules attach to modules, so none sees it. "
                "Write it as a module: nn.AdaptiveAvgPool2d(1) + nn.Flatten() for x.mean((2, 3)), nn.AvgPool2d for "
                "F.avg_pool2d (both have an LRP rule).")
    if op.startswith(("interpolate", "upsample", "grid_sample")):
        return ("An interpolation (F.interpolate, nn.Upsample): Zennit has no LRP rule for it, so LRP does not apply "
                "to this model. The gradient-type methods and the excitation pullback do (explain.attribute).")
    if op in ("softmax", "layer_norm", "group_norm", "matmul", "bmm", "einsum", "gelu", "silu", "sigmoid", "tanh"):
        return ("An attention, normalisation or smooth activation written in forward: no LRP rule of Zennit's "
                "composites covers it, so LRP does not apply to this model here.")
    return ("No LRP rule sees an operation written in forward; write it as a module with an LRP rule, or use "
            "another method of explain.attribute.")


class _ArithmeticGuard(TorchFunctionMode):
    """Refuses, during one forward, arithmetic on input-dependent tensors outside the layers of ``_LRP_LEAVES``
    (a residual sum or attention written in ``forward``): no LRP rule sees it, and relevance would follow the
    gradient there (a sum's relevance goes down both branches in full)."""

    def __init__(self, net: nn.Module, root: Tensor) -> None:
        from zennit.layer import Sum

        super().__init__()
        self.root, self.stack, self.handles, self.ruled = root, [("", net)], [], _LRP_LEAVES + (Sum,)
        self.refusal = ""  # the first refusal; raised after the forward (a TypeError inside would be swallowed)
        for name, module in net.named_modules():
            if name:
                self.handles.append(module.register_forward_pre_hook(
                    lambda m, a, name=name: self.stack.append((name, m))))
                self.handles.append(module.register_forward_hook(lambda m, a, o: self.stack.pop() and None))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name, owner = self.stack[-1]
        tensors = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
        live = [a for a in tensors if isinstance(a, Tensor) and (a is self.root or a.grad_fn is not None)]
        op = getattr(func, "__name__", str(func))
        if live and isinstance(out, Tensor) and type(owner) not in self.ruled and op not in _ROUTING:
            where = f"'{name}' ({type(owner).__name__})" if name else f"the forward of {type(owner).__name__}"
            self.refusal = self.refusal or f"LRP: {where} calls {op} on the input-dependent activations. " + \
                _lrp_advice(op.strip("_"))
        return out

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _lrp_canonized(net: nn.Module, z: Tensor) -> tuple[nn.Module, Tensor]:
    """A canonized copy of ``net`` (Zennit's ResNetCanonizer: BatchNorm merged into the linear layer before it,
    torchvision's residual sums as ``Sum`` modules) and its output at ``z``, once every check has passed: every
    layer has a rule, every BatchNorm is merged into the layer whose output it reads, no arithmetic outside the
    layers, and the copy computes what ``net`` computes. The caller's model is never touched."""
    from zennit.torchvision import ResNetCanonizer

    from zennit.types import Activation

    norms = (nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.instancenorm._InstanceNorm)
    first: dict[str, str] = {}  # the first layer of each class without a fitting rule
    for n, m in net.named_modules():  # other layers must only move numbers (checked in the forward)
        if isinstance(m, (Activation, nn.MultiheadAttention) + norms) and type(m) is not nn.ReLU:
            first.setdefault(type(m).__name__, n)
    others = [f"{cls} at '{n}'" for cls, n in first.items()]
    if others:
        raise UnsupportedLayerError(
            f"LRP has no rule here for {', '.join(others[:4])}{' ...' if len(others) > 4 else ''}: Zennit's "
            "composites cover ReLU networks of Linear/Conv, pooling and (merged) BatchNorm layers. Transformers (ViT, Swin) need "
            "rules for attention and LayerNorm that Zennit does not ship; other activations (ReLU6, SiLU, GELU) "
            "and squeeze-excitation products have none either")
    copy_ = copy.deepcopy(net)
    for m in copy_.modules():  # Zennit's hooks cannot follow a ReLU that overwrites its input
        if isinstance(m, nn.ReLU):
            m.inplace = False
    try:
        applied = ResNetCanonizer().apply(copy_)
    except RuntimeError as err:  # a BatchNorm paired with a layer of another width (DenseNet)
        from zennit.core import collect_leaves

        leaves, names = list(collect_leaves(net)), {m: n for n, m in net.named_modules()}
        pairs = [f"{names[bn]!r} ({bn.num_features} channels) after {names[lin]!r} ({lin.weight.shape[0]})"
                 for lin, bn in zip(leaves, leaves[1:]) if isinstance(bn, nn.modules.batchnorm._BatchNorm)
                 and isinstance(lin, (nn.Conv2d, nn.Linear)) and lin.weight.shape[0] != bn.num_features]
        raise UnsupportedLayerError(
            f"LRP: Zennit's SequentialMergeBatchNorm merges each BatchNorm into the layer listed before it, but "
            f"{pairs[0] if pairs else err} reads another tensor in forward (a pre-activation BatchNorm on a concatenation, "
            "as in DenseNet); no canonizer merges it") from err
    merged = {c.batch_norm: c.linears[0] for c in applied if hasattr(c, "batch_norm")}
    for bn in merged:  # Zennit leaves x / sqrt(1 + eps) behind; make the merged BatchNorm the identity
        bn.running_var.fill_(1 - bn.eps)
    names = {m: n for n, m in copy_.named_modules()}
    unmerged = [n for n, m in copy_.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                and m not in merged]
    if unmerged:
        raise UnsupportedLayerError(
            f"LRP: the BatchNorm layer(s) {unmerged[:3]} do not follow a linear layer, so Zennit's "
            "SequentialMergeBatchNorm cannot merge them (a pre-activation BatchNorm, as in DenseNet); "
            "Zennit would pass relevance through them unchanged, ignoring their shift")
    outputs: dict[nn.Module, Tensor] = {}
    hooks = [lin.register_forward_hook(lambda m, a, o: outputs.__setitem__(m, o)) for lin in merged.values()]
    hooks += [bn.register_forward_pre_hook(lambda m, a: outputs.__setitem__(m, a[0])) for bn in merged]
    root = z.detach().clone().requires_grad_(True)
    guard = _ArithmeticGuard(copy_, root)
    try:
        with torch.enable_grad(), guard:
            out = copy_(root)
    finally:
        guard.remove()
        for hook in hooks:
            hook.remove()
    if guard.refusal:
        raise UnsupportedLayerError(guard.refusal)
    wrong = [names[bn] for bn, lin in merged.items() if outputs.get(bn) is not outputs.get(lin)]
    if wrong:
        raise UnsupportedLayerError(
            f"LRP: BatchNorm layer(s) {wrong[:3]} come after a linear layer in the module list but do not read "
            "its output in forward (e.g. DenseNet's concatenations), so merging them would change the network")
    return copy_, out.detach()


def _lrp_conservation(relevance: Tensor, logits: Tensor, t: Tensor, net: nn.Module) -> Tensor:
    """Relevance sum over the target logit per input; raises when relevance exploded, or when a bias-free network
    (whose rules here all conserve) does not conserve it; warns when biases absorbed or added much of it."""
    logit = logits[torch.arange(len(t)), t]
    total = relevance.flatten(1).sum(1).to(logit)
    ratio = total / logit
    scale = logits.abs().mean(1)
    if not torch.isfinite(total).all() or (total.abs() > 1e3 * (logit.abs() + scale)).any():
        raise UnsupportedLayerError(
            f"LRP: the relevance sums {total.tolist()[:4]} are far beyond the target logits {logit.tolist()[:4]} "
            "(relevance exploded): a layer whose rule does not fit it; this map would be meaningless")
    biases = [m.bias for m in net.modules() if isinstance(getattr(m, "bias", None), Tensor)]
    bias_free = all(not b.any() for b in biases)
    off = (total - logit).abs() > 1e-2 * torch.maximum(logit.abs(), scale)
    if bias_free and off.any():
        raise UnsupportedLayerError(
            f"LRP: the network has no biases, so relevance must be conserved, but relevance sum / target logit is "
            f"{ratio[off].tolist()[:4]}: some layer is not covered by a conserving rule")
    if not bias_free and ((ratio - 1).abs() > 0.5).any():
        warnings.warn(f"LRP: relevance sum / target logit ranges over [{ratio.min():.3g}, {ratio.max():.3g}] "
                      "(the biases absorb or add relevance); the map is not a decomposition of the logit",
                      stacklevel=3)
    return ratio


def _lrp(model: nn.Module, x: Tensor, t: Tensor, composite: str = "epsilon_gamma_box", low: Any = None,
         high: Any = None, normalised: bool | tuple[Any, Any] = False, epsilon: float = 1e-6,
         gamma: float = 0.25) -> Tensor:
    """Zennit's LRP on a canonized copy of the network; bounds of ``x``: ``low``/``high`` (a number or one per
    channel; default 0 and 1), or ``normalised=True`` (ImageNet's mean and std) or ``normalised=(mean, std)``."""
    from zennit.composites import EpsilonGammaBox, EpsilonPlusFlat, LayerMapComposite, layer_map_base
    from zennit.rules import Epsilon
    from zennit.types import Convolution

    if x.dim() != 4:
        raise ValueError(f"LRP needs images (N, C, H, W), got shape {tuple(x.shape)}")
    preprocess, net = _zoo_parts(model)
    with torch.no_grad():
        z = preprocess(x)
    if z.shape != x.shape:
        raise UnsupportedLayerError(f"LRP needs an element-wise preprocessing layer; {type(preprocess).__name__} "
                                    f"maps {tuple(x.shape)} to {tuple(z.shape)}")
    lo, hi = _lrp_bounds(x, preprocess, low, high, normalised)
    if composite == "epsilon_gamma_box":
        slack = 1e-5 * float((hi - lo).abs().max())
        outside = ((z < lo - slack) | (z > hi + slack)).flatten(2).any(-1).any(0) if z.dim() > 2 else \
            ((z < lo - slack) | (z > hi + slack)).any(0)
        if outside.any():
            ch = int(outside.nonzero()[0])
            zc, loc, hic = (t.select(1, ch) for t in (z, lo.expand_as(z[:1]), hi.expand_as(z[:1])))
            raise ValueError(
                f"LRP: the input is outside the z^B rule's bounds in {int(outside.sum())} of {outside.numel()} "
                f"channel(s); channel {ch} has values in [{float(zc.min()):.3g}, {float(zc.max()):.3g}], its bounds "
                f"are [{float(loc.min()):.3g}, {float(hic.max()):.3g}]. If x is ImageNet-normalised pass "
                "normalised=True (or normalised=(mean, std)), else low=/high= the bounds of your input space "
                "(a number, or one per channel)")
        comp = EpsilonGammaBox(low=lo, high=hi, epsilon=epsilon, gamma=gamma)
    elif composite == "epsilon_plus_flat":
        comp = EpsilonPlusFlat(epsilon=epsilon)
    elif composite == "epsilon":
        comp = LayerMapComposite(layer_map_base(epsilon) + [((Convolution, nn.Linear), Epsilon(epsilon=epsilon))])
    else:
        raise ValueError(f"composite must be 'epsilon_gamma_box', 'epsilon_plus_flat' or 'epsilon', got {composite!r}")
    canonized, logits = _lrp_canonized(net, z)
    with torch.enable_grad(), comp.context(canonized) as hooked:
        zg = z.detach().clone().requires_grad_(True)
        out = hooked(zg)
        # the relevance starts as the target logit itself (Bach et al.'s R = f(x)) and flows down to the input
        seed = torch.nn.functional.one_hot(t, out.shape[1]).to(out) * out
        (relevance,) = torch.autograd.grad(out, zg, grad_outputs=seed.detach())
    with torch.no_grad():
        reference = net(z)
    tol = torch.finfo(reference.dtype).eps ** 0.5 * (1 + reference.abs().max())
    if (logits - reference).abs().max() > tol:
        raise UnsupportedLayerError(
            f"LRP: the canonized network computes logits {float((logits - reference).abs().max()):.3g} away from "
            "the model's own; a canonizer does not fit this architecture")
    _lrp_conservation(relevance, reference, t, canonized)
    # relevance is a per-pixel amount: an element-wise affine preprocessing passes it through unchanged
    return relevance.detach()


# --------------------------------------------------------------------------------------------------
# The methods: one small function each, ``(model, x, t, **its options)`` with ``x`` detached and checked and
# ``t`` the target classes; its keyword parameters are the options it takes (``attribute`` checks them)


def _gradient(model: nn.Module, x: Tensor, t: Tensor) -> Tensor:
    return pullbacks.input_gradient(model, x, t)


def _gradient_x_input(model: nn.Module, x: Tensor, t: Tensor, baseline: Any = 0.0) -> Tensor:
    return pullbacks.input_gradient(model, x, t) * (x - _baseline(x, baseline))


def _pullback(model: nn.Module, x: Tensor, t: Tensor, temperature: float | None = None,
              pool_temperature: float | None = None, smooth_temperature: float | None = None,
              surrogate: str = "sigmoid", attention_temperature: float | None = None) -> Tensor:
    return pullbacks.excitation_pullback(model, x, t, temperature=temperature, pool_temperature=pool_temperature,
                                         smooth_temperature=smooth_temperature, surrogate=surrogate,
                                         attention_temperature=attention_temperature)


def _pullback_x_input(model: nn.Module, x: Tensor, t: Tensor, temperature: float | None = None,
                      pool_temperature: float | None = None, smooth_temperature: float | None = None,
                      surrogate: str = "sigmoid", attention_temperature: float | None = None,
                      baseline: Any = 0.0) -> Tensor:
    v = _pullback(model, x, t, temperature, pool_temperature, smooth_temperature, surrogate, attention_temperature)
    return v * (x - _baseline(x, baseline))


def _integrated_gradients(model: nn.Module, x: Tensor, t: Tensor, baseline: Any = 0.0, n_steps: int = 32,
                          chunk_size: int | None = None) -> Tensor:
    from captum.attr import IntegratedGradients

    size = max(len(x), 256) if chunk_size is None else chunk_size
    for name, value in (("n_steps", n_steps), ("chunk_size", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    base = _baseline(x, baseline)
    per = min(len(x), size)  # inputs per call; Captum then runs size // per steps of each at a time
    ig = IntegratedGradients(model)
    with torch.enable_grad():
        parts = [ig.attribute(xs, baselines=bs, target=ts, n_steps=n_steps, internal_batch_size=size)
                 for xs, bs, ts in zip(x.split(per), base.split(per), t.split(per))]
    return torch.cat([p.detach() for p in parts])


def _smoothgrad(model: nn.Module, x: Tensor, t: Tensor, n_samples: int = 16, noise: float = 0.15) -> Tensor:
    from captum.attr import NoiseTunnel, Saliency

    with torch.enable_grad():
        out = NoiseTunnel(Saliency(model)).attribute(x, nt_type="smoothgrad", nt_samples=n_samples,
                                                     nt_samples_batch_size=max(1, 256 // len(x)),
                                                     stdevs=noise, target=t, abs=False)
    return out.detach()


def _insens(model: nn.Module, x: Tensor, t: Tensor, chunk_size: int | None = None, progress: bool = False) -> Tensor:
    return projections.insens(model, x, chunk_size=chunk_size, progress=progress).omega  # class-agnostic


def _intensity(model: nn.Module, x: Tensor, t: Tensor, baseline: Any = 0.0) -> Tensor:
    return (x - _baseline(x, baseline)).abs()


def _edges(model: nn.Module, x: Tensor, t: Tensor) -> Tensor:
    return edge_map(x)[:, None].expand_as(x).clone()


_METHODS: dict[str, Callable[..., Tensor]] = {
    "gradient": _gradient, "gradient_x_input": _gradient_x_input, "integrated_gradients": _integrated_gradients,
    "smoothgrad": _smoothgrad, "lrp": _lrp, "pullback": _pullback, "pullback_x_input": _pullback_x_input,
    "insens": _insens, "intensity": _intensity, "edges": _edges,
}

METHODS: tuple[str, ...] = tuple(_METHODS)
"""The names ``attribute`` accepts, in the order the book's tables list them."""


def _options(method: str) -> frozenset[str]:
    """The options ``method`` takes: the parameters of its function after ``(model, x, t)``."""
    return frozenset(list(inspect.signature(_METHODS[method]).parameters)[3:])


def attribute(model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor, method: str = "gradient",
              **options: Any) -> Tensor:
    """The ``method``'s attribution map of class ``target`` at each input, shaped like ``x``.

    ``model`` returns logits ``(N, classes)`` and is in eval mode; ``x`` is a floating-point batch
    ``(N, ...)`` (images ``(N, C, H, W)`` for ``"lrp"`` and ``"edges"``); ``target``: one class for all
    samples or one per sample. ``options`` are the method's settings (see the module docstring; the
    defaults: ``n_steps=32``, ``baseline=0`` (integrated gradients, the ``*_x_input`` methods and
    intensity: a number or one value per channel), ``n_samples=16``, ``noise=0.15``, ``temperature=0.3``,
    ``composite="epsilon_gamma_box"`` with ``low=0, high=1`` the bounds of ``x``). Unknown methods and
    options, targets outside ``[0, classes)`` and models a method does not cover raise errors.

    Cost of ``"integrated_gradients"``: ``n_steps x N`` forward and backward passes of one input each (the
    path integral's quadrature points), run ``chunk_size`` at a time (default ``max(N, 256)``): memory
    grows with ``chunk_size`` (activations of ``chunk_size`` inputs), never with ``n_steps``; the result does
    not depend on it. ``"insens"``'s ``chunk_size`` bounds its forward-mode sweep likewise
    (:func:`dualview.projections.insens`).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    allowed = _options(method)
    unknown = set(options) - allowed
    if unknown:
        raise TypeError(f"method {method!r} takes the options {sorted(allowed) or 'none'}, "
                        f"got {sorted(unknown)}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_batch(x, floating=True)
    check_eval(model)  # before any forward, for every method: a refused call leaves the model untouched
    x = x.detach()
    with torch.no_grad():
        logits = model_output(model, x)
    if logits.dim() != 2:
        raise ValueError(f"the model must return logits of shape (N, classes), got {tuple(logits.shape)}")
    return _METHODS[method](model, x, target_classes(target, logits), **options)


def quantus_explain_func(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, method: str = "gradient",
                         device: str | torch.device | None = None, **options: Any) -> np.ndarray:
    """:func:`attribute` in Quantus' ``explain_func`` convention: NumPy inputs and targets in, NumPy maps out.

    Pass it as ``explain_func`` with ``explain_func_kwargs={"method": ..., **options}``.
    """
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    x = torch.as_tensor(np.asarray(inputs), dtype=torch.float32, device=dev)
    t = torch.as_tensor(np.asarray(targets), dtype=torch.long, device=dev)
    return attribute(model, x, t, method=method, **options).detach().cpu().numpy()
