"""Excitation pullbacks: a modified backward pass that reveals a ReLU network's implicit linear model.

For a class neuron ``f = <y, M(x)>`` and *any* gating function ``Lambda`` (one number in ``[0, 1]``
per ReLU unit), the Lambda-induced network ``M_Lambda(x) = Lambda_L W_L ... Lambda_1 W_1 x`` is
linear once the gates are evaluated, so ``f_Lambda(x) = <v_Lambda(x), x>`` with the *gating-induced
pullback* ``v_Lambda = y^T Lambda_L W_L ... Lambda_1 W_1`` (biases via the augmented input; Section
2.5 of :cite:`satkiewicz2025tapping`). With the network's own hard gates ``G`` this is the input
gradient. The *excitation pullback* takes the soft gates ``Lambda = sigmoid(Z(x) / tau)`` of the
network's own pre-activations ``Z(x)`` (Hypothesis 1 and Section 5.2 there, ``tau = 0.3``): it is
computed by an ordinary backward pass in which every ReLU's derivative ``1{z > 0}`` is replaced by
``sigmoid(z / tau)`` (Listing 1) and every max-pool's derivative by that of softmax pooling at the
same temperature (Listing 2), the forward pass being unchanged.

:func:`excitation_backward` installs that surrogate backward on a model inside a ``with`` block
(forward hooks on every ``nn.ReLU`` / ``nn.MaxPool1d`` / ``nn.MaxPool2d`` module, in the spirit of
Zennit's ``composite.context``) and removes every hook on exit, also on an exception. ReLUs that a
``forward`` applies as a *function* (``F.relu``, ``torch.relu``, ``x.relu()``, in place or not, e.g.
the last ReLU of torchvision's DenseNet) get the surrogate too, through a ``TorchFunctionMode``
active only during the model's forward; any other functional non-linearity there
(``F.gelu``, ``F.max_pool2d``, ``clamp``, ...) and any unsupported layer raise
:class:`~dualview.gates.UnsupportedLayerError`.

On top: :func:`excitation_pullback` and :func:`input_gradient` (batched, one target per sample),
:func:`projected_gradient_ascent` (the counterfactuals of Section 5.1), :func:`deletion_curve`
(a faithfulness measure, deletion or insertion), :func:`total_variation` and :func:`high_frequency_share`
(smoothness of maps), and the objects of the theory for small networks
(:func:`excitation_gates`, :func:`gated_linear_model`, :func:`excitation_path_features`).
"""
from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.utils import _pair
from torch.overrides import TorchFunctionMode

from dualview.gates import (
    GUARDED_FUNCTIONS,
    UnsupportedLayerError,
    check_supported,
    record_gates,
    run_with_gates,
)
from dualview.paths import fc_layers, path_index

__all__ = [
    "DEFAULT_TEMPERATURE",
    "PAPER_INPUT_NUMEL",
    "surrogate_relu",
    "soft_max_pool",
    "surrogate_max_pool",
    "PatchReport",
    "excitation_backward",
    "excitation_pullback",
    "input_gradient",
    "rescale_norm",
    "AscentResult",
    "projected_gradient_ascent",
    "DeletionCurve",
    "deletion_curve",
    "total_variation",
    "high_frequency_share",
    "excitation_gates",
    "GatedLinearModel",
    "gated_linear_model",
    "path_gates",
    "excitation_path_features",
    "excitation_path_features_reference",
]

DEFAULT_TEMPERATURE: float = 0.3
"""The paper's temperature ``tau`` of ``sigmoid(z / tau)``, for ReLUs and max-pools (Section 5.2-5.3)."""

PAPER_INPUT_NUMEL: int = 3 * 224 * 224
"""Number of input coordinates of the paper's images (3 x 224 x 224, values in [-1, 1])."""


def _check_temperature(temperature: float, what: str = "temperature") -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0 \
            or math.isinf(temperature):
        raise ValueError(
            f"{what} must be a finite number >= 0 (0 = the hard gate, i.e. the plain gradient), got {temperature!r}"
        )
    return float(temperature)


# --------------------------------------------------------------------------------------------------
# Surrogate ReLU (Listing 1)


class _SurrogateReLU(torch.autograd.Function):
    """Forward ``relu(z)``; backward multiplies the incoming gradient by ``sigmoid(z / tau)``."""

    @staticmethod
    def forward(ctx, z: Tensor, temperature: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(z)
        ctx.temperature = temperature
        return F.relu(z)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        (z,) = ctx.saved_tensors
        t = ctx.temperature
        if t == 0:
            return torch.ops.aten.threshold_backward(grad_output, z, 0), None
        return z.mul(1.0 / t).sigmoid_().mul_(grad_output), None  # in place: no extra allocations


def surrogate_relu(z: Tensor, temperature: float = DEFAULT_TEMPERATURE) -> Tensor:
    """``relu(z)`` whose derivative is ``sigmoid(z / temperature)`` (Listing 1 of :cite:`satkiewicz2025tapping`).

    ``temperature = 0`` gives the hard gate ``1{z > 0}``, i.e. the ordinary ReLU gradient.
    """
    return _SurrogateReLU.apply(z, _check_temperature(temperature))


# --------------------------------------------------------------------------------------------------
# Soft max-pooling (Listing 2)


@dataclass(frozen=True)
class _PoolSpec:
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool
    one_d: bool

    @staticmethod
    def of(kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, one_d=False) -> "_PoolSpec":
        stride = kernel_size if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else stride
        if one_d:
            as_pair = lambda v: (1, int(v[0] if isinstance(v, (tuple, list)) else v))  # noqa: E731
            pad = (0, int(padding[0] if isinstance(padding, (tuple, list)) else padding))
            return _PoolSpec(as_pair(kernel_size), as_pair(stride), pad, as_pair(dilation), bool(ceil_mode), True)
        return _PoolSpec(_pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation), bool(ceil_mode), False)

    @staticmethod
    def of_module(m: nn.Module) -> "_PoolSpec":
        return _PoolSpec.of(m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode,
                            one_d=isinstance(m, nn.MaxPool1d))

    def out_size(self, size: int, i: int) -> tuple[int, int]:
        """Output length along axis ``i`` and the extra right padding that ceil_mode needs."""
        k, s, p, d = self.kernel[i], self.stride[i], self.padding[i], self.dilation[i]
        span = d * (k - 1) + 1
        out = (size + 2 * p - span + ((s - 1) if self.ceil_mode else 0)) // s + 1
        if self.ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        extra = max(0, (out - 1) * s + span - (size + 2 * p))
        return out, extra


def _as_2d(x: Tensor, spec: _PoolSpec) -> Tensor:
    if spec.one_d:
        if x.dim() not in (2, 3):
            raise ValueError(f"max_pool1d expects (N, C, L) or (C, L), got shape {tuple(x.shape)}")
        return x.unsqueeze(-2)
    if x.dim() not in (3, 4):
        raise ValueError(f"max_pool2d expects (N, C, H, W) or (C, H, W), got shape {tuple(x.shape)}")
    return x


def _windows(x4: Tensor, spec: _PoolSpec) -> tuple[Tensor, Tensor, tuple[int, int], tuple[int, int]]:
    """Pooling windows of a 3-/4-d input: values ``(B, K, L)``, validity mask ``(1, K, L)``, out and padded sizes.

    Padded positions hold 0 and are masked out (max-pooling pads with -inf: they never win).
    """
    H, W = x4.shape[-2:]
    oh, eh = spec.out_size(H, 0)
    ow, ew = spec.out_size(W, 1)
    (ph, pw) = spec.padding
    pads = (pw, pw + ew, ph, ph + eh)
    flat = x4.reshape(-1, 1, H, W)
    kw = dict(kernel_size=spec.kernel, dilation=spec.dilation, stride=spec.stride)
    vals = F.unfold(F.pad(flat, pads), **kw)
    mask = F.unfold(F.pad(flat.new_ones(1, 1, H, W), pads), **kw) > 0
    return vals, mask, (oh, ow), (H + 2 * ph + eh, W + 2 * pw + ew)


def soft_max_pool(
    x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
    temperature: float = DEFAULT_TEMPERATURE, one_d: bool = False,
) -> Tensor:
    """Softmax pooling: each window outputs ``sum_i x_i softmax(x / temperature)_i`` (Listing 2).

    Same window geometry as ``F.max_pool2d`` (``one_d=True``: ``F.max_pool1d``); padded positions
    are excluded (weight 0), where Listing 2 would pool the zeros of its padding. Differentiable by
    autograd; tends to max-pooling as ``temperature -> 0``.
    """
    t = _check_temperature(temperature)
    if t == 0:
        raise ValueError("soft_max_pool needs temperature > 0 (temperature 0 is max-pooling itself)")
    spec = _PoolSpec.of(kernel_size, stride, padding, dilation, ceil_mode, one_d)
    x4 = _as_2d(x, spec)
    vals, mask, (oh, ow), _ = _windows(x4, spec)
    weights = torch.softmax((vals / t).masked_fill(~mask, float("-inf")), dim=1)
    pooled = (vals * weights).sum(1)
    out = pooled.view(*x4.shape[:-2], oh, ow)
    return out.squeeze(-2) if spec.one_d else out


class _SurrogateMaxPool(torch.autograd.Function):
    """Forward: max-pooling. Backward: the gradient of :func:`soft_max_pool` (closed form)."""

    @staticmethod
    def forward(ctx, x: Tensor, spec: _PoolSpec, temperature: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.spec, ctx.temperature = spec, temperature
        x4 = _as_2d(x, spec)
        out = torch.ops.aten.max_pool2d(x4, list(spec.kernel), list(spec.stride), list(spec.padding),
                                         list(spec.dilation), spec.ceil_mode)
        return out.squeeze(-2) if spec.one_d else out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        spec, t = ctx.spec, ctx.temperature
        x4 = _as_2d(x, spec)
        vals, mask, (oh, ow), padded = _windows(x4, spec)
        w = torch.softmax((vals / t).masked_fill(~mask, float("-inf")), dim=1)
        pooled = (vals * w).sum(1, keepdim=True)
        g = grad_output.reshape(vals.shape[0], 1, -1)
        # d/dx_i sum_j x_j w_j = w_i (1 + (x_i - pooled) / t)
        gv = g * w * (1 + (vals - pooled) / t)
        gx = F.fold(gv, padded, kernel_size=spec.kernel, dilation=spec.dilation, stride=spec.stride)
        (ph, pw), (H, W) = spec.padding, x4.shape[-2:]
        gx = gx[..., ph:ph + H, pw:pw + W].reshape(x.shape)
        return gx, None, None


def surrogate_max_pool(
    x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
    temperature: float = DEFAULT_TEMPERATURE, one_d: bool = False,
) -> Tensor:
    """Max-pooling forward, softmax-pooling backward (straight-through; Section 5.3 and Listing 2).

    ``temperature = 0`` is plain max-pooling (forward and backward).
    """
    t = _check_temperature(temperature)
    if t == 0:
        fn = F.max_pool1d if one_d else F.max_pool2d
        return fn(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode)
    spec = _PoolSpec.of(kernel_size, stride, padding, dilation, ceil_mode, one_d)
    return _SurrogateMaxPool.apply(x, spec, t)


# --------------------------------------------------------------------------------------------------
# The context manager


@dataclass
class PatchReport:
    """What :func:`excitation_backward` patched: module counts, and call counts seen so far.

    ``functional_relu_calls`` counts ReLUs applied as functions in a ``forward`` (e.g. DenseNet's last
    one) that received the surrogate, over all forward passes inside the block.
    """

    temperature: float
    pool_temperature: float
    relu_modules: list[str] = field(default_factory=list)
    pool_modules: list[str] = field(default_factory=list)
    relu_calls: int = 0
    pool_calls: int = 0
    functional_relu_calls: int = 0


_RELU_FUNCS = {F.relu, torch.relu, Tensor.relu}
_RELU_INPLACE_FUNCS = {F.relu_, torch.relu_, Tensor.relu_}


class _ForwardMode(TorchFunctionMode):
    """Active during the model's forward only: surrogate for functional ReLUs, errors for other non-linearities."""

    def __init__(self, report: PatchReport) -> None:
        super().__init__()
        self.report = report
        self.stack: list[tuple[str, nn.Module]] = []
        self.depth_in_gate = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.depth_in_gate or func not in GUARDED_FUNCTIONS:
            return func(*args, **kwargs)
        if func in _RELU_FUNCS or func in _RELU_INPLACE_FUNCS:
            x = args[0]
            inplace = func in _RELU_INPLACE_FUNCS or bool(kwargs.get("inplace", args[1] if len(args) > 1 else False))
            self.report.functional_relu_calls += 1
            if not inplace:
                return _SurrogateReLU.apply(x, self.report.temperature)
            out = _SurrogateReLU.apply(x.clone(), self.report.temperature)
            return x.copy_(out)
        where = f"'{self.stack[-1][0]}' ({type(self.stack[-1][1]).__name__})" if self.stack else "the model"
        raise UnsupportedLayerError(
            f"the forward of {where} calls {getattr(func, '__name__', func)} as a function; excitation "
            "pullbacks patch nn.ReLU / nn.MaxPool modules and functional ReLUs only. Use an nn.MaxPool2d "
            "module instead of a functional max-pool; other non-linearities are not ReLU gates."
        )


_ACTIVE: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


@contextlib.contextmanager
def excitation_backward(
    model: nn.Module,
    temperature: float = DEFAULT_TEMPERATURE,
    pool_temperature: float | None = None,
) -> Iterator[PatchReport]:
    """Inside the block, ``model``'s backward pass computes excitation pullbacks (Section 5.2-5.3).

    Every ReLU's derivative becomes ``sigmoid(z / temperature)`` and every max-pool's derivative that
    of softmax pooling at ``pool_temperature`` (default: ``temperature``; 0 keeps the max-pool hard);
    forward outputs are unchanged. Works on any model that :func:`dualview.gates.check_supported`
    accepts, plus functional ReLUs in ``forward`` (torchvision's ResNet50, VGG11_BN and DenseNet121,
    the zoo's CIFAR ResNets and MNIST CNNs, in eval mode). Call the model itself (not a submodule)
    inside the block. On exit every hook is removed, also on an exception; parameters and modules
    are never touched. Yields a :class:`PatchReport`.
    """
    t = _check_temperature(temperature)
    pt = t if pool_temperature is None else _check_temperature(pool_temperature, "pool_temperature")
    check_supported(model)
    if model in _ACTIVE:
        raise RuntimeError("excitation_backward is already active on this model; do not nest the blocks")
    report = PatchReport(temperature=t, pool_temperature=pt)
    mode = _ForwardMode(report)
    handles = []
    saved: dict[int, list[Tensor]] = {}
    entered = [0]

    def root_pre(mod, args):
        if entered[0] == 0:
            mode.__enter__()
        entered[0] += 1

    def root_post(mod, args, out):
        entered[0] -= 1
        if entered[0] == 0:
            mode.__exit__(None, None, None)
        return None

    for name, module in model.named_modules():
        label = name or "<model>"

        def pre(mod, args, label=label):
            mode.stack.append((label, mod))
            if isinstance(mod, nn.ReLU):
                mode.depth_in_gate += 1
                if mod.inplace:  # the in-place ReLU overwrites its pre-activation: keep a copy
                    saved.setdefault(id(mod), []).append(args[0].clone())
            elif isinstance(mod, (nn.MaxPool1d, nn.MaxPool2d)):
                mode.depth_in_gate += 1

        def post(mod, args, out, label=label):
            if mode.stack and mode.stack[-1][1] is mod:
                mode.stack.pop()
            if isinstance(mod, nn.ReLU):
                z = saved[id(mod)].pop() if mod.inplace else args[0]
                report.relu_calls += 1
                try:  # still counted as inside the gate: the surrogate's own F.relu is not a functional ReLU
                    return _SurrogateReLU.apply(z, t)
                finally:
                    mode.depth_in_gate -= 1
            if isinstance(mod, (nn.MaxPool1d, nn.MaxPool2d)):
                report.pool_calls += 1
                try:
                    return None if pt == 0 else _SurrogateMaxPool.apply(args[0], _PoolSpec.of_module(mod), pt)
                finally:
                    mode.depth_in_gate -= 1
            return None

        if isinstance(module, nn.ReLU):
            report.relu_modules.append(label)
        elif isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)):
            if module.return_indices:
                raise UnsupportedLayerError(
                    f"max-pool '{label}' has return_indices=True; excitation pullbacks need a plain max-pool"
                )
            report.pool_modules.append(label)
        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    handles.append(model.register_forward_pre_hook(root_pre, prepend=True))
    handles.append(model.register_forward_hook(root_post, always_call=True))
    _ACTIVE.add(model)
    try:
        yield report
    finally:
        for h in handles:
            h.remove()
        _ACTIVE.discard(model)
        while entered[0] > 0:  # a forward that raised before its root hook could run
            entered[0] -= 1
            if entered[0] == 0:
                mode.__exit__(None, None, None)


# --------------------------------------------------------------------------------------------------
# Pullbacks


def _targets(target: int | Sequence[int] | Tensor, n: int, num_classes: int, device) -> Tensor:
    t = torch.as_tensor(target, device=device)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"target must hold integer class indices, got dtype {t.dtype}")
    t = t.long().reshape(-1)
    if t.numel() == 1:
        t = t.expand(n)
    if t.numel() != n:
        raise ValueError(f"target has {t.numel()} entries for a batch of {n}: give one class per sample or one for all")
    if bool(((t < 0) | (t >= num_classes)).any()):
        raise ValueError(f"target classes must lie in [0, {num_classes}), got {t.tolist()}")
    return t


def _check_batch(x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a torch.Tensor input, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"expected a batch with a leading batch dimension, got shape {tuple(x.shape)}; "
                         "use x.unsqueeze(0) for a single input")
    if not x.dtype.is_floating_point:
        raise TypeError(f"inputs must be floating point, got {x.dtype}")


def _pullback_and_logits(
    model: nn.Module, x: Tensor, target, temperature: float, pool_temperature: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(pullback, logits, targets)``: the pullback of ``logits[n, target[n]]`` for every sample ``n``."""
    _check_batch(x)
    t = _check_temperature(temperature)
    xg = x.detach().clone().requires_grad_(True)
    ctx = contextlib.nullcontext() if t == 0 and not pool_temperature else \
        excitation_backward(model, t, pool_temperature)
    with torch.enable_grad(), ctx:
        logits = model(xg)
        if logits.dim() != 2:
            raise ValueError(f"the model must return logits of shape (N, classes), got {tuple(logits.shape)}")
        tg = _targets(target, x.shape[0], logits.shape[1], logits.device)
        selected = logits.gather(1, tg[:, None]).sum()
        (grad,) = torch.autograd.grad(selected, xg)
    return grad, logits.detach(), tg


def excitation_pullback(
    model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor,
    temperature: float = DEFAULT_TEMPERATURE, pool_temperature: float | None = None,
) -> Tensor:
    """The excitation pullback of the class neuron ``target`` at each input (Hypothesis 1, Section 5.2).

    ``x``: a batch ``(N, ...)``; ``target``: one class for all or one per sample. Returns a tensor
    shaped like ``x``: the backward pass of the logit with the surrogate ReLU / max-pool derivatives of
    :func:`excitation_backward`. ``temperature = 0`` (and ``pool_temperature`` 0 or None) is the plain
    input gradient. Samples are independent (the model must be in eval mode).
    """
    return _pullback_and_logits(model, x, target, temperature, pool_temperature)[0]


def input_gradient(model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor) -> Tensor:
    """The plain input gradient of the logit ``target``: the hard-gated pullback ``v_G`` (Eq. 6 and 8 of the paper)."""
    return excitation_pullback(model, x, target, temperature=0.0, pool_temperature=0.0)


# --------------------------------------------------------------------------------------------------
# Projected gradient ascent (Section 5.1)


def rescale_norm(norm: float, input_shape: Sequence[int], value_range: float = 1.0) -> float:
    """Translate an L2 norm of the paper (3x224x224 inputs in [-1, 1]) to inputs of ``input_shape``.

    Keeps the root-mean-square change per coordinate, relative to the value range:
    ``norm * sqrt(numel / 150528) * value_range / 2``. E.g. the paper's radius 100 becomes 7.1 for
    CIFAR images (3x32x32) in [0, 1] and 3.6 for MNIST digits (1x28x28) in [0, 1].
    """
    numel = math.prod(int(s) for s in input_shape)
    if norm < 0 or numel < 1 or value_range <= 0:
        raise ValueError(f"need norm >= 0, a non-empty input_shape and value_range > 0; got {norm}, "
                         f"{tuple(input_shape)}, {value_range}")
    return norm * math.sqrt(numel / PAPER_INPUT_NUMEL) * value_range / 2


@dataclass
class AscentResult:
    """Projected gradient ascent towards target logits.

    ``x``: the final images; ``delta = x - x_0``; per step ``k = 0..steps`` and sample:
    ``target_logit[k]``, ``predicted[k]`` (argmax class) and ``distance[k] = ||x_k - x_0||_2``.
    """

    x: Tensor
    delta: Tensor
    target: Tensor
    target_logit: Tensor
    predicted: Tensor
    distance: Tensor

    @property
    def success(self) -> Tensor:
        """Per sample, whether the final image is classified as the target."""
        return self.predicted[-1] == self.target

    @property
    def gain(self) -> Tensor:
        """Per step and sample, the increase of the target logit over the original image."""
        return self.target_logit - self.target_logit[0]


def projected_gradient_ascent(
    model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor, *,
    method: str = "pullback", temperature: float = DEFAULT_TEMPERATURE, pool_temperature: float | None = None,
    step_size: float = 20.0, radius: float = 100.0, steps: int = 10,
    bounds: tuple[float, float] | None = (-1.0, 1.0),
) -> AscentResult:
    """Steps of fixed L2 length ``step_size`` along the pullback (or the plain gradient) of the target logit,
    each followed by projection onto the L2 ball of ``radius`` around ``x`` and clamping to ``bounds``.

    The defaults are the paper's (Section 5.1: steps of norm 20, radius 100, 10 steps, images in
    [-1, 1] at 3x224x224); for other inputs rescale the norms with :func:`rescale_norm` and pass the
    model's input range as ``bounds`` (``None``: no clamping). ``method``: ``"pullback"`` or ``"gradient"``.
    """
    if method not in ("pullback", "gradient"):
        raise ValueError(f"method must be 'pullback' or 'gradient', got {method!r}")
    if steps < 0 or step_size < 0 or radius < 0:
        raise ValueError(f"need steps, step_size, radius >= 0; got {steps}, {step_size}, {radius}")
    if bounds is not None and not bounds[0] < bounds[1]:
        raise ValueError(f"bounds must be (low, high) with low < high, got {bounds}")
    _check_batch(x)
    tau, ptau = (temperature, pool_temperature) if method == "pullback" else (0.0, 0.0)
    x0 = x.detach()
    xk = x0.clone()
    logits_hist, pred_hist, dist_hist = [], [], []
    tg = None
    for k in range(steps + 1):
        if k < steps:
            d, logits, tg = _pullback_and_logits(model, xk, target if tg is None else tg, tau, ptau)
        else:
            with torch.no_grad():
                logits = model(xk)
        if tg is None:
            tg = _targets(target, x.shape[0], logits.shape[1], logits.device)
        logits_hist.append(logits.gather(1, tg[:, None])[:, 0])
        pred_hist.append(logits.argmax(1))
        dist_hist.append((xk - x0).flatten(1).norm(dim=1))
        if k == steps:
            break
        norm = d.flatten(1).norm(dim=1).clamp_min(torch.finfo(d.dtype).tiny).view(-1, *([1] * (x.dim() - 1)))
        xk = xk + step_size * d / norm
        delta = xk - x0
        dn = delta.flatten(1).norm(dim=1).view_as(norm)
        xk = x0 + delta * torch.clamp(radius / dn.clamp_min(torch.finfo(d.dtype).tiny), max=1.0)
        if bounds is not None:
            xk = xk.clamp(*bounds)
    return AscentResult(x=xk, delta=xk - x0, target=tg, target_logit=torch.stack(logits_hist),
                        predicted=torch.stack(pred_hist), distance=torch.stack(dist_hist))


# --------------------------------------------------------------------------------------------------
# Faithfulness: deletion curves


@dataclass
class DeletionCurve:
    """Target logit and probability after deleting the top ``fraction`` of pixels: ``(F,)`` and ``(F, N)``."""

    fractions: Tensor
    target_logit: Tensor
    probability: Tensor

    def area(self) -> Tensor:
        """Per sample, the area under the probability curve (trapezoid rule; lower = more faithful)."""
        return torch.trapezoid(self.probability, self.fractions.to(self.probability), dim=0)


@torch.no_grad()
def deletion_curve(
    model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor, scores: Tensor,
    baseline: float | Tensor = 0.0, fractions: Sequence[float] | Tensor | None = None,
    mode: str = "deletion",
) -> DeletionCurve:
    """Delete (or insert) pixels in decreasing order of ``scores`` and record the target's logit and probability.

    ``x``: ``(N, C, H, W)``; ``scores``: ``(N, H, W)`` (one score per pixel, e.g. the channel sum of
    pullback times input). ``mode="deletion"``: the top ``fraction`` of pixels take ``baseline`` (a number or
    a ``(C,)`` colour), the rest keep ``x`` (a lower curve = a more faithful ranking). ``mode="insertion"``:
    the image starts as the baseline and the top ``fraction`` of pixels take their values from ``x`` (a higher
    curve = a more faithful ranking). Ties are broken by pixel order. ``fractions`` default to 0, 0.05, ..., 0.5.
    """
    _check_batch(x)
    if x.dim() != 4 or scores.shape != (x.shape[0], *x.shape[2:]):
        raise ValueError(f"need x of shape (N, C, H, W) and scores of shape (N, H, W); got {tuple(x.shape)} "
                         f"and {tuple(scores.shape)}")
    if mode not in ("deletion", "insertion"):
        raise ValueError(f"mode must be 'deletion' or 'insertion', got {mode!r}")
    fr = torch.linspace(0, 0.5, 11) if fractions is None else torch.as_tensor(fractions, dtype=torch.float64)
    n, c, h, w = x.shape
    order = scores.reshape(n, -1).argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(h * w, device=x.device).expand(n, -1))
    base = torch.as_tensor(baseline, dtype=x.dtype, device=x.device).reshape(1, -1, 1, 1)
    logit_rows, prob_rows = [], []
    tg = None
    for f in fr.tolist():
        mask = (rank < round(f * h * w)).view(n, 1, h, w)
        out = model(torch.where(mask, base, x) if mode == "deletion" else torch.where(mask, x, base))
        if tg is None:
            tg = _targets(target, n, out.shape[1], out.device)
        logit_rows.append(out.gather(1, tg[:, None])[:, 0])
        prob_rows.append(out.softmax(1).gather(1, tg[:, None])[:, 0])
    return DeletionCurve(fr.float(), torch.stack(logit_rows), torch.stack(prob_rows))


# --------------------------------------------------------------------------------------------------
# Smoothness of attribution maps


def _as_maps(maps: Tensor) -> Tensor:
    if maps.dim() == 3:
        maps = maps[:, None]
    if maps.dim() != 4:
        raise ValueError(f"need maps of shape (N, H, W) or (N, C, H, W), got {tuple(maps.shape)}")
    return maps


def total_variation(maps: Tensor) -> Tensor:
    """Normalised (anisotropic) total variation of each map: ``sum |m[i+1,j] - m[i,j]| + |m[i,j+1] - m[i,j]|``
    over pixels and channels, divided by ``sum |m|``. Scale-free; 0 for a constant map, close to 4 for a
    checkerboard. Lower = smoother. ``maps``: ``(N, H, W)`` or ``(N, C, H, W)``; returns ``(N,)``.
    """
    m = _as_maps(maps)
    tv = (m[..., 1:, :] - m[..., :-1, :]).abs().flatten(1).sum(1) + (m[..., :, 1:] - m[..., :, :-1]).abs().flatten(1).sum(1)
    return tv / m.abs().flatten(1).sum(1).clamp_min(torch.finfo(m.dtype).tiny)


def high_frequency_share(maps: Tensor, cutoff: float = 0.5) -> Tensor:
    """Share of each map's spectral power (2-D DFT, summed over channels) at radial frequency above
    ``cutoff`` times the Nyquist frequency: ``sqrt(fx^2 + fy^2) > cutoff * 0.5`` cycles per pixel. Scale-free;
    0 for a constant map, 1 for a checkerboard. Lower = smoother. ``maps``: ``(N, H, W)`` or ``(N, C, H, W)``.
    """
    m = _as_maps(maps)
    h, w = m.shape[-2:]
    power = torch.fft.fft2(m).abs().square().sum(1)                                  # (N, H, W)
    fy, fx = torch.fft.fftfreq(h, device=m.device), torch.fft.fftfreq(w, device=m.device)
    radius = (fy[:, None].square() + fx[None, :].square()).sqrt()
    high = (radius > cutoff * 0.5).to(power.dtype)
    return (power * high).flatten(1).sum(1) / power.flatten(1).sum(1).clamp_min(torch.finfo(power.dtype).tiny)


# --------------------------------------------------------------------------------------------------
# The theory on small networks: excitation gates, gated linear models, soft path features


def excitation_gates(model: nn.Module, x: Tensor, temperature: float = DEFAULT_TEMPERATURE) -> dict[str, Tensor]:
    """The excitation function ``Gamma(x) = sigmoid(Z(x) / tau)`` of every ReLU call (Hypothesis 1, comment 5).

    Keys as :func:`dualview.gates.record_gates` names the ReLU calls; ``temperature = 0`` gives the
    hard gates ``Z(x) > 0`` as floats. Detached from the graph.
    """
    t = _check_temperature(temperature)
    with torch.no_grad():
        rec = record_gates(model, x)
    if t == 0:
        return {k: (q > 0).to(q.dtype) for k, q in rec.preactivations.items()}
    return {k: torch.sigmoid(q / t) for k, q in rec.preactivations.items()}


@dataclass
class GatedLinearModel:
    """``f_Lambda(x') = <weight, x'> + bias`` with the gates ``Lambda`` held fixed (Eq. 4-7 of the paper).

    ``weight`` is the gating-induced pullback ``v_Lambda`` (shaped like the input); ``bias`` its
    coordinate on the augmented constant input, ``f_Lambda(0)``; ``output = f_Lambda(x)``.
    """

    weight: Tensor
    bias: Tensor
    output: Tensor


def gated_linear_model(
    model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor, gates: Mapping[str, Tensor],
    pool_indices: Mapping[str, Tensor] | None = None,
) -> GatedLinearModel:
    """The Lambda-induced network's class neuron ``target`` at ``x`` as an explicit linear model.

    ``gates`` (one tensor per ReLU call, as :func:`excitation_gates` or ``record_gates(...).gates``
    give them) are held fixed, so ``x' -> run_with_gates(model, x', gates)`` is affine; its
    gradient is ``v_Lambda`` (Section 2.5 of :cite:`satkiewicz2025tapping`). Max-pools take
    ``pool_indices`` if given (else they pool ``x`` itself).
    """
    _check_batch(x)
    xg = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        out = run_with_gates(model, xg, gates, pool_indices)
        tg = _targets(target, x.shape[0], out.shape[1], out.device)
        sel = out.gather(1, tg[:, None])[:, 0]
        (v,) = torch.autograd.grad(sel.sum(), xg)
    with torch.no_grad():
        zero = run_with_gates(model, torch.zeros_like(x), gates, pool_indices).gather(1, tg[:, None])[:, 0]
    return GatedLinearModel(weight=v, bias=zero, output=sel.detach())


def _augmented_soft_gates(model: nn.Module, x: Tensor, temperature: float) -> list[Tensor]:
    layers = fc_layers(model)
    x = x.flatten(1)
    if x.shape[1] != layers[0].in_features:
        raise ValueError(f"input has {x.shape[1]} features per sample, the network expects {layers[0].in_features}")
    ones = x.new_ones(x.shape[0], 1)
    lam = excitation_gates(model, x, temperature)
    return [torch.cat([x, ones], 1)] + [torch.cat([g.to(x.dtype), ones], 1) for g in lam.values()]


def path_gates(model: nn.Module, x: Tensor, temperature: float = DEFAULT_TEMPERATURE) -> Tensor:
    """``tau_p(x) = prod_l sigmoid(z_l[p_l] / temperature)`` for every path: ``(N, P)`` (Eq. 13-15).

    The product of the soft gates along each path of a fully connected network, paths as
    :func:`dualview.paths.path_index` lists them (constant units have gate 1); ``temperature = 0``
    gives the path activity of Chapter 1 as floats.
    """
    vecs = _augmented_soft_gates(model, x, temperature)
    idx = path_index(model).to(x.device)
    gate = vecs[1][:, idx[:, 1]]
    for l, v in enumerate(vecs[2:], start=2):
        gate = gate * v[:, idx[:, l]]
    return gate


def excitation_path_features(model: nn.Module, x: Tensor, temperature: float = DEFAULT_TEMPERATURE) -> Tensor:
    """``phi_tau(x)_p = tau_p(x) x~[p_0]`` with ``tau_p = prod_l sigmoid(z_l[p_l] / temperature)`` (Eq. 18).

    For the fully connected networks of :mod:`dualview.paths`, paths as :func:`dualview.paths.path_index`
    lists them (bias paths included, constant units have gate 1). Then
    ``excitation_path_features(model, x) @ neural_path_values(model)`` is ``f_tau(x)`` (Eq. 19-20).
    ``temperature = 0`` gives the ordinary neural path features.
    """
    x_aug = torch.cat([x.flatten(1), x.new_ones(x.shape[0], 1)], 1)
    idx = path_index(model).to(x.device)
    return x_aug[:, idx[:, 0]] * path_gates(model, x, temperature)


def excitation_path_features_reference(
    model: nn.Module, x: Tensor, temperature: float = DEFAULT_TEMPERATURE
) -> Tensor:
    """Reference for :func:`excitation_path_features`: loops over samples, paths and layers."""
    vecs = _augmented_soft_gates(model, x, temperature)
    idx = path_index(model).tolist()
    out = torch.zeros(x.shape[0], len(idx), dtype=x.dtype)
    for n in range(x.shape[0]):
        for k, p in enumerate(idx):
            val = 1.0
            for l, unit in enumerate(p):
                val *= float(vecs[l][n, unit])
            out[n, k] = val
    return out
