"""Soft gates and the surrogate backward pass of excitation pullbacks.

A ReLU's gate is ``1{q > 0}``; its *soft gate* at temperature ``tau`` is ``sigmoid(q / tau)``
(the excitation function of Hypothesis 1 of :cite:`satkiewicz2025tapping`; ``tau = 0`` is the hard
gate). The excitation pullback is an ordinary backward pass in which every ReLU's derivative
``1{q > 0}`` is replaced by its soft gate (Listing 1 there) and every max-pool's derivative by that of
softmax pooling at the same temperature (Listing 2), the forward pass being unchanged.

SiLU and GELU are not ReLUs and the paper's theory does not cover them (its Section 6.3, Limitations:
they need a "certain refinement of the computation of Gamma"). Both are *self-gated*, ``q * g(q)`` with
``g = sigmoid`` (SiLU) or ``g = Phi``, the standard normal CDF (GELU), so their surrogate takes the gate
itself as the unit's excitation: the backward pass multiplies by ``sigmoid(q / tau)`` or ``Phi(q / tau)``
(:func:`smooth_gate`) instead of the true derivative ``g(q) + q g'(q)``, i.e. it differentiates
``q * stopgrad(g(q / tau))``. This is the choice of the authors' follow-up code (repository
``314-Foundation/SemanticPullbacks``, file ``lib/surrogates.py``: ``SurrogateSiLU`` returns
``F.sigmoid(x / temperature)``, ``SurrogateGELU`` ``normal_cdf(x, temperature)``, applied as
``x * grad.detach()``), with its default temperatures 1.6 (SiLU) and 1.0 (GELU) (``lib/defaults.py``; 1.0 is
GELU's own gate). Squeeze-and-excitation blocks ``x * s(x)`` (EfficientNet) get their channel gate ``s(x)``
held fixed in the backward pass: our own choice (that code has no rule for them and differentiates through
``s``). This is a surrogate backward, NOT an exact dual view: such a network is not piecewise linear (frozen
at ``x`` it equals ``f`` only at ``x``, on no region), and it has no on/off paths and no inactive state
(:mod:`dualview.gates` refuses them everywhere else).

The follow-up's rules for ReLU networks (``surrogate="normal_cdf"``). The authors' current code (repository
``314-Foundation/SemanticPullbacks``, ``lib/surrogates.py`` and ``lib/defaults.py``, as of August 2026, with the
paper's v6) changed two things against the seed paper's Listings 1-2: a ReLU's surrogate derivative is
``Phi(q / tau)``, the normal CDF, at ``tau = 0.6`` (``SurrogateReLU.backward_gradient`` returns
``normal_cdf(x, temperature)``, its ``F.sigmoid(x / temperature)`` line commented out; as
``sigmoid(1.702 u)`` is close to ``Phi(u)``, ``Phi(q / 0.6)`` is about ``sigmoid(q / 0.35)``, a slightly softer
gate than the seed paper's ``sigmoid(q / 0.3)``), and a max-pool's
backward is softmax pooling at ``tau = 0.3`` with the softmax weights held fixed (``SoftMaxPool2d`` detaches
``weights``: the gradient ``w_i`` instead of Listing 2's ``w_i (1 + (x_i - soft) / tau)``). Both are an option
here (:data:`SURROGATES`, :data:`SURROGATE_TEMPERATURES`); the seed paper's ``sigmoid(q / 0.3)`` with Listing 2's
pool stays the default. The rules for LayerNorm and attention of the same code are in :mod:`dualview.attention`.

This module holds those pieces: :func:`soft_gates`, :func:`surrogate_relu`, :func:`soft_max_pool` and
:func:`surrogate_max_pool` as functions, and :class:`SurrogateBackward`, the
:class:`dualview.gates.Rule` that installs them on every ReLU and max-pool of a model inside
:func:`dualview.gates.instrument` (:func:`dualview.pullbacks.excitation_backward` uses it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.utils import _pair

from dualview.attention import ATTENTION_TEMPERATURE, attention_surrogate, layer_norm_surrogate
from dualview.gates import Rule

__all__ = ["SURROGATES", "SURROGATE_TEMPERATURES", "POOL_TEMPERATURES", "check_temperature", "check_surrogate",
           "relu_gate", "soft_gates", "clipped_soft_gate", "SMOOTH_TEMPERATURES", "smooth_gate",
           "surrogate_relu", "soft_max_pool",
           "surrogate_max_pool", "SurrogateBackward"]


def check_temperature(temperature: float, what: str = "temperature") -> float:
    """A temperature is a finite number ``>= 0`` (0: the hard gate); returns it as a float, or raises ``ValueError``."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0 \
            or math.isinf(temperature):
        raise ValueError(
            f"{what} must be a finite number >= 0 (0 = the hard gate, i.e. the plain gradient), got {temperature!r}"
        )
    return float(temperature)


SURROGATES: tuple[str, ...] = ("sigmoid", "normal_cdf")
"""The ReLU surrogates: ``"sigmoid"``, the seed paper's ``sigmoid(q / tau)`` (Listing 1 of
:cite:`satkiewicz2025tapping`, max-pools by Listing 2); ``"normal_cdf"``, the authors' current code's ``Phi(q / tau)``
(``lib/surrogates.py`` of ``314-Foundation/SemanticPullbacks``, max-pools with their softmax weights held
fixed)."""

SURROGATE_TEMPERATURES: dict[str, float] = {"sigmoid": 0.3, "normal_cdf": 0.6}
"""The ReLU temperature of each surrogate: the seed paper's 0.3 (Section 5.2), the follow-up code's 0.6
(``lib/defaults.py``)."""

POOL_TEMPERATURES: dict[str, float | None] = {"sigmoid": None, "normal_cdf": 0.3}
"""The max-pool temperature of each surrogate (``None``: the ReLUs' temperature, as in the seed paper; the
follow-up code's ``nn.MaxPool2d: 0.3``)."""


def check_surrogate(surrogate: str) -> str:
    """``surrogate`` if it is one of :data:`SURROGATES`, else ``ValueError`` naming them."""
    if surrogate not in SURROGATES:
        raise ValueError(f"surrogate must be one of {', '.join(map(repr, SURROGATES))} (the seed paper's "
                         f"sigmoid(q / tau), the follow-up code's Phi(q / tau)), got {surrogate!r}")
    return surrogate


def _normal_cdf(q: Tensor, tau: float) -> Tensor:
    return 0.5 * (1 + torch.erf(q / (tau * math.sqrt(2))))


def relu_gate(q: Tensor, temperature: float, surrogate: str = "sigmoid") -> Tensor:
    """A ReLU unit's soft gate: ``sigmoid(q / tau)`` (``surrogate="sigmoid"``, Hypothesis 1 of
    :cite:`satkiewicz2025tapping`) or ``Phi(q / tau)``, the standard normal CDF (``"normal_cdf"``, the follow-up
    code's ``normal_cdf(x, temperature) = 0.5 (1 + erf(x / (sqrt(2) temperature)))``); ``tau = 0``: the hard gate
    ``q > 0`` as floats."""
    t, s = check_temperature(temperature), check_surrogate(surrogate)
    if t == 0:
        return (q > 0).to(q.dtype)
    return torch.sigmoid(q / t) if s == "sigmoid" else _normal_cdf(q, t)


def soft_gates(preactivations: Mapping[str, Tensor], temperature: float,
               surrogate: str = "sigmoid") -> dict[str, Tensor]:
    """``sigmoid(q / temperature)`` for every pre-activation ``q`` (Hypothesis 1, comment 5, of
    :cite:`satkiewicz2025tapping`; ``surrogate="normal_cdf"``: ``Phi(q / temperature)``, :func:`relu_gate`);
    ``temperature = 0`` gives the hard gates ``q > 0`` as floats."""
    t, s = check_temperature(temperature), check_surrogate(surrogate)
    return {k: relu_gate(q, t, s) for k, q in preactivations.items()}


# --------------------------------------------------------------------------------------------------
# Surrogate ReLU (Listing 1)


class _SurrogateReLU(torch.autograd.Function):
    """Forward ``relu(z)``; backward multiplies the incoming gradient by ``sigmoid(z / tau)`` (``normal=True``:
    by ``Phi(z / tau)``)."""

    @staticmethod
    def forward(ctx, z: Tensor, temperature: float,  # type: ignore[override]
                out: list | None = None, normal: bool = False) -> Tensor:
        ctx.save_for_backward(z)
        ctx.temperature, ctx.normal = temperature, normal
        return F.relu(z) if out is None else out[0].detach()  # out: relu(z) computed already (no second pass)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        (z,) = ctx.saved_tensors
        t = ctx.temperature
        if t == 0:
            return torch.ops.aten.threshold_backward(grad_output, z, 0), None, None, None
        if ctx.normal:
            return grad_output * _normal_cdf(z, t), None, None, None
        # grad * sigmoid(z / t) in one fused pass: the derivative of softplus with beta = 1 / t is
        # sigmoid(beta z); above the threshold it returns grad, where sigmoid(beta z) rounds to 1 anyway
        threshold = 11.0 if z.dtype == torch.float16 else 40.0 if z.dtype == torch.float64 else 20.0
        return torch.ops.aten.softplus_backward(grad_output, z, 1.0 / t, threshold), None, None, None


class _SurrogateClippedReLU(torch.autograd.Function):
    """Forward ``min(max(z, 0), t)``; backward multiplies the incoming gradient by
    ``sigmoid(z / tau) - sigmoid((z - t) / tau)`` (``tau = 0``: ``1{0 < z < t}``, PyTorch's own
    derivative; ``surrogate="normal_cdf"``: ``Phi`` for ``sigmoid``)."""

    @staticmethod
    def forward(ctx, z: Tensor, temperature: float, ceiling: float,  # type: ignore[override]
                out: list | None = None, surrogate: str = "sigmoid") -> Tensor:
        ctx.save_for_backward(z)
        ctx.temperature, ctx.ceiling, ctx.surrogate = temperature, ceiling, surrogate
        return F.hardtanh(z, 0.0, ceiling) if out is None else out[0].detach()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        (z,) = ctx.saved_tensors
        gate = clipped_soft_gate(z, ctx.ceiling, ctx.temperature, ctx.surrogate)
        return grad_output * gate, None, None, None, None


def clipped_soft_gate(q: Tensor, ceiling: float, temperature: float, surrogate: str = "sigmoid") -> Tensor:
    """The soft gate of a hard-clipped ReLU ``min(max(q, 0), t) = relu(q) - relu(q - t)``: the difference of
    its two ReLUs' soft gates, ``sigmoid(q / tau) - sigmoid((q - t) / tau)`` (``surrogate="normal_cdf"``: with
    ``Phi``), in ``(0, 1)``; ``tau = 0`` gives the hard gate ``1{0 < q < t}`` (as floats)."""
    tau = check_temperature(temperature)
    if tau == 0:
        return ((q > 0) & (q < ceiling)).to(q.dtype)
    return relu_gate(q, tau, surrogate) - relu_gate(q - ceiling, tau, surrogate)


SMOOTH_TEMPERATURES: dict[type[nn.Module], float] = {nn.SiLU: 1.6, nn.GELU: 1.0}
"""Default temperatures of the smooth activations' gates (``lib/defaults.py`` of
``314-Foundation/SemanticPullbacks``)."""


def smooth_gate(module: nn.Module, q: Tensor, temperature: float | None = None) -> Tensor:
    """The surrogate gate of a SiLU (``sigmoid(q / tau)``) or GELU (``Phi(q / tau)``, the standard normal CDF)
    unit: the factor that the excitation pullback's backward pass multiplies by. ``temperature=None``: the
    default of :data:`SMOOTH_TEMPERATURES`; 0: the hard gate ``1{q > 0}`` (as floats)."""
    base = next((c for c in SMOOTH_TEMPERATURES if isinstance(module, c)), None)
    if base is None:
        raise TypeError(f"smooth_gate expects an nn.SiLU or nn.GELU, got {type(module).__name__}")
    tau = SMOOTH_TEMPERATURES[base] if temperature is None else check_temperature(temperature)
    if tau == 0:
        return (q > 0).to(q.dtype)
    if base is nn.SiLU:
        return torch.sigmoid(q / tau)
    return _normal_cdf(q, tau)


class _HeldFactor(torch.autograd.Function):
    """Forward: the layer's own output ``out``; backward: the incoming gradient times ``factor`` (with respect
    to ``q``): the derivative of ``q * stopgrad(factor)``."""

    @staticmethod
    def forward(ctx, q: Tensor, factor: Tensor, out: list) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(factor)
        return out[0].detach()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        (factor,) = ctx.saved_tensors
        return grad_output * factor, None, None


def surrogate_relu(z: Tensor, temperature: float, surrogate: str = "sigmoid") -> Tensor:
    """``relu(z)`` whose derivative is ``sigmoid(z / temperature)`` (Listing 1 of :cite:`satkiewicz2025tapping`;
    ``surrogate="normal_cdf"``: ``Phi(z / temperature)``, the follow-up code's ``SurrogateReLU``).

    ``temperature = 0`` gives the hard gate ``1{z > 0}``, i.e. the ordinary ReLU gradient.
    """
    return _SurrogateReLU.apply(z, check_temperature(temperature), None,
                                check_surrogate(surrogate) == "normal_cdf")


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
    C = x4.shape[-3]
    flat = x4.reshape(-1, C, H, W)  # unfold's loop runs over images, not over images x channels
    kw = dict(kernel_size=spec.kernel, dilation=spec.dilation, stride=spec.stride)
    cols = F.unfold(F.pad(flat, pads), **kw)  # (N, C * K, L), channel-major
    vals = cols.view(cols.shape[0] * C, -1, cols.shape[-1])
    mask = F.unfold(F.pad(flat.new_ones(1, 1, H, W), pads), **kw) > 0
    return vals, mask, (oh, ow), (H + 2 * ph + eh, W + 2 * pw + ew)


def soft_max_pool(
    x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, *,
    temperature: float, one_d: bool = False,
) -> Tensor:
    """Softmax pooling: each window outputs ``sum_i x_i softmax(x / temperature)_i`` (Listing 2).

    Same window geometry as ``F.max_pool2d`` (``one_d=True``: ``F.max_pool1d``); padded positions
    are excluded (weight 0), where Listing 2 would pool the zeros of its padding. Differentiable by
    autograd; tends to max-pooling as ``temperature -> 0``.
    """
    t = check_temperature(temperature)
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
    """Forward: max-pooling (``out``: the layer's own output, not computed again). Backward: the gradient of
    :func:`soft_max_pool` (closed form); ``fixed_weights=True``: with the softmax weights held fixed (the
    follow-up code's ``SoftMaxPool2d``), each input gets the incoming gradient times its weight ``w_i``."""

    @staticmethod
    def forward(ctx, x: Tensor, spec: _PoolSpec, temperature: float,  # type: ignore[override]
                out: list | None = None, fixed_weights: bool = False) -> Tensor:
        ctx.spec, ctx.temperature, ctx.fixed_weights = spec, temperature, fixed_weights
        if out is None:
            pooled = torch.ops.aten.max_pool2d(_as_2d(x, spec), list(spec.kernel), list(spec.stride),
                                               list(spec.padding), list(spec.dilation), spec.ceil_mode)
            pooled = pooled.squeeze(-2) if spec.one_d else pooled
        else:
            pooled = out[0].detach()
        # the maxima are kept as a copy (a quarter of the input for 2x2 windows): code that changes the output
        # in place (y += c, an in-place ReLU after the pool) must not change what the backward pass reads
        ctx.save_for_backward(x, pooled.clone())
        return pooled

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        x, pooled = ctx.saved_tensors
        spec, t = ctx.spec, ctx.temperature
        x4 = _as_2d(x, spec)
        vals, mask, (oh, ow), padded = _windows(x4, spec)
        # softmax over each window (dim 1), element-wise: the window's max (the forward's output) keeps exp <= 1
        e = torch.exp(((vals - pooled.reshape(vals.shape[0], 1, -1)) / t).masked_fill(~mask, float("-inf")))
        total = e.sum(1, keepdim=True)
        g = grad_output.reshape(vals.shape[0], 1, -1) / total
        if ctx.fixed_weights:  # d/dx_i sum_j x_j stopgrad(w_j) = w_i
            gv = g * e
        else:  # d/dx_i sum_j x_j w_j = w_i (1 + (x_i - soft) / t)
            soft = (vals * e).sum(1, keepdim=True) / total  # sum_i x_i w_i, w_i = e_i / total
            gv = g * e * (1 + (vals - soft) / t)
        C = x4.shape[-3]
        gx = F.fold(gv.reshape(-1, C * gv.shape[1], gv.shape[2]), padded, kernel_size=spec.kernel,
                    dilation=spec.dilation, stride=spec.stride)
        (ph, pw), (H, W) = spec.padding, x4.shape[-2:]
        gx = gx[..., ph:ph + H, pw:pw + W].reshape(x.shape)
        return gx, None, None, None, None


def surrogate_max_pool(
    x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, *,
    temperature: float, one_d: bool = False, fixed_weights: bool = False,
) -> Tensor:
    """Max-pooling forward, softmax-pooling backward (straight-through; Section 5.3 and Listing 2).

    ``temperature = 0`` is plain max-pooling (forward and backward). ``fixed_weights=True``: the backward of
    ``sum_i x_i stopgrad(softmax(x / temperature)_i)`` instead, the follow-up code's (``SoftMaxPool2d`` of
    ``314-Foundation/SemanticPullbacks``, ``lib/surrogates.py``, detaches its ``weights``).
    """
    t = check_temperature(temperature)
    if t == 0:
        fn = F.max_pool1d if one_d else F.max_pool2d
        return fn(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode)
    spec = _PoolSpec.of(kernel_size, stride, padding, dilation, ceil_mode, one_d)
    return _SurrogateMaxPool.apply(x, spec, t, None, bool(fixed_weights))


# --------------------------------------------------------------------------------------------------
# The rule


class SurrogateBackward(Rule):
    """The rule of excitation pullbacks (Section 5.2-5.3 of :cite:`satkiewicz2025tapping`): forward
    unchanged; every ReLU's derivative becomes ``sigmoid(q / temperature)`` (ReLUs a ``forward`` applies as
    functions included) and every max-pool's that of softmax pooling at ``pool_temperature`` (default:
    ``temperature``; 0 keeps max-pools hard). Counts the calls it patched. A hard-clipped ReLU
    ``min(max(q, 0), t) = relu(q) - relu(q - t)`` (``nn.ReLU6``) gets the difference of its two ReLUs'
    surrogate derivatives, ``sigmoid(q / tau) - sigmoid((q - t) / tau)`` (:func:`clipped_soft_gate`; our
    extension of Listing 1, which covers ReLUs only). A SiLU or GELU unit's derivative becomes its gate
    :func:`smooth_gate` at ``smooth_temperature`` (default: :data:`SMOOTH_TEMPERATURES`), and a
    squeeze-and-excitation block ``x * s(x)`` passes the gradient to ``x`` only, times ``s(x)`` held fixed
    (see the module's docstring: a surrogate, not an exact dual view). An eval-mode BatchNorm whose parameters
    need no gradient passes it times its per-channel factor ``weight / sqrt(running_var + eps)``: PyTorch's own
    derivative, with less kept for the backward pass (its input is not), so that the pullback's graph holds no
    more than the gradient's although each ReLU keeps its pre-activation.

    ``surrogate="normal_cdf"``: the follow-up code's rules (module docstring): ``Phi`` for ``sigmoid`` at the
    ReLUs, max-pools with their softmax weights held fixed, ``pool_temperature`` by default
    :data:`POOL_TEMPERATURES` (0.3). ``nn.LayerNorm`` and ``nn.MultiheadAttention`` get the follow-up's rules of
    :mod:`dualview.attention` (mean and variance held fixed; softmax weights held fixed, the gradient through the
    values with the weights of ``softmax(s / attention_temperature)``, default 1).
    """

    clipped = True
    smooth = True

    def __init__(self, temperature: float, pool_temperature: float | None = None,
                 smooth_temperature: float | None = None, surrogate: str = "sigmoid",
                 attention_temperature: float | None = None) -> None:
        self.temperature = check_temperature(temperature)
        self.surrogate = check_surrogate(surrogate)
        pool_default = POOL_TEMPERATURES[surrogate]
        self.pool_temperature = check_temperature(pool_temperature, "pool_temperature") if pool_temperature \
            is not None else self.temperature if pool_default is None else pool_default
        self.smooth_temperature = None if smooth_temperature is None else \
            check_temperature(smooth_temperature, "smooth_temperature")
        self.attention_temperature = ATTENTION_TEMPERATURE if attention_temperature is None else \
            check_temperature(attention_temperature, "attention_temperature")
        if self.attention_temperature == 0:
            raise ValueError("attention_temperature must be > 0 (the softer softmax's temperature; 1: the "
                             "network's own attention weights)")
        self.relu_calls = self.pool_calls = self.functional_relu_calls = self.smooth_calls = 0
        self.layer_norm_calls = self.attention_calls = 0
        self._normal = self.surrogate == "normal_cdf"

    def relu(self, site, module, q):
        return self.relu_output(site, module, q, None)

    def relu_output(self, site, module, q, out):
        if isinstance(module, (nn.SiLU, nn.GELU)):  # instrument checked it is the plain layer
            self.smooth_calls += 1
            if out is None:
                out = F.silu(q) if isinstance(module, nn.SiLU) else F.gelu(q, approximate=module.approximate)
            return _HeldFactor.apply(q, smooth_gate(module, q.detach(), self.smooth_temperature), [out])
        self.relu_calls += 1
        if isinstance(module, nn.Hardtanh):  # a hard-clipped ReLU (instrument checked its floor is 0)
            return _SurrogateClippedReLU.apply(q, self.temperature, float(module.max_val),
                                               None if out is None else [out], self.surrogate)
        return _SurrogateReLU.apply(q, self.temperature, None if out is None else [out], self._normal)

    def max_pool(self, site, module, x, out):
        self.pool_calls += 1
        if self.pool_temperature == 0:
            return None
        return _SurrogateMaxPool.apply(x, _PoolSpec.of_module(module), self.pool_temperature, [out], self._normal)

    def layer_norm(self, site, module, x, out):
        self.layer_norm_calls += 1
        return layer_norm_surrogate(module, x, out)

    def attention(self, site, module, args, kwargs, out):
        self.attention_calls += 1
        return attention_surrogate(module, args, kwargs, out, self.attention_temperature, site)

    def channel_gate(self, site, module, x, scale):
        return _HeldFactor.apply(x, scale.detach(), [x * scale])

    def batch_norm(self, module, x, out):
        # In eval mode a BatchNorm is x * s + c per channel, s = weight / sqrt(running_var + eps), so the
        # input's gradient is the output's times s. PyTorch's backward saves the layer's whole input (for the
        # weight's gradient); with the parameters frozen (excitation_pullback freezes them for its pass) a
        # backward that multiplies by s saves only s: one activation less per BatchNorm, about what the
        # surrogate ReLUs' saved pre-activations add (the forward is the layer's own; the gradient agrees to
        # rounding). Anything that may need the parameters' gradients keeps PyTorch's backward.
        if not x.requires_grad or any(p is not None and p.requires_grad for p in (module.weight, module.bias)):
            return None
        with torch.no_grad():
            s = torch.rsqrt(module.running_var + module.eps)
            if module.weight is not None:
                s = s * module.weight
        return _HeldFactor.apply(x, s.to(out.dtype).view(1, -1, *([1] * (x.dim() - 2))), [out])

    def functional_relu(self, where, q):
        self.functional_relu_calls += 1
        return _SurrogateReLU.apply(q, self.temperature, None, self._normal)
