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

:func:`excitation_backward` installs that surrogate backward on a model inside a ``with`` block: it is
:func:`dualview.gates.instrument` with the rule :class:`dualview.surrogates.SurrogateBackward`, in the
spirit of Zennit's ``composite.context``, and removes every hook on exit, also on an exception. ReLUs
that a ``forward`` applies as a *function* (``F.relu``, ``torch.relu``, ``x.relu()``, in place or not,
e.g. the last ReLU of torchvision's DenseNet) get the surrogate too; any other functional
non-linearity there (``F.gelu``, ``F.max_pool2d``, ``clamp``, ...) and any unsupported layer raise
:class:`~dualview.gates.UnsupportedLayerError`. Hard-clipped ReLUs (``nn.ReLU6``, ``nn.Hardtanh(0, t)``, e.g.
MobileNetV2's) are supported exactly: ``min(max(q, 0), t) = relu(q) - relu(q - t)`` gets the surrogate
derivative ``sigmoid(q / tau) - sigmoid((q - t) / tau)`` and, in gated linear models, its constant saturated
piece ``t * 1{q >= t}`` held fixed at ``x`` (see :mod:`dualview.gates`). SiLU and GELU (and torchvision's
squeeze-and-excitation blocks and StochasticDepth, i.e. EfficientNet) get the surrogate gates of
:mod:`dualview.surrogates` (``sigmoid(q / tau)``, ``Phi(q / tau)``, after the authors' follow-up code
``314-Foundation/SemanticPullbacks``): a pullback is then still a well-defined backward pass, but NOT an exact
dual view (the network is not piecewise linear, no switched linear model reproduces ``f(x)``), so
:func:`excitation_gates` and :func:`gated_linear_model` refuse them. Hardswish is refused.

Side by side with the seed paper's rules, the authors' current ones (``surrogate="normal_cdf"``: the ReLU's
derivative ``Phi(z / 0.6)``, max-pools with their softmax weights held fixed; :mod:`dualview.surrogates`), and,
beyond the seed papers, ViT-style models: ``nn.LayerNorm`` with its mean and variance held fixed and
``nn.MultiheadAttention`` with its softmax weights held fixed, the gradient through the values
(``attention_temperature``, default 1; :mod:`dualview.attention`), again a surrogate, not an exact dual view.

On top: :func:`excitation_pullback` and :func:`input_gradient` (batched, one target per sample),
:func:`projected_gradient_ascent` (the counterfactuals of Section 5.1), and the objects of the theory
(:func:`excitation_gates`, :func:`gated_linear_model`). The soft path features of Eq. 18 are
:func:`dualview.paths.neural_path_features` with a ``temperature``; the faithfulness and smoothness
measures of Chapter 6 are in :mod:`dualview.metrics`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from dualview.gates import CLIPPED_LAYERS, GATE_LAYERS, POOL_GATE_LAYERS, UnsupportedLayerError, model_output, \
    check_batch, check_eval, check_reproduces, full_precision, instrument, record_gates, \
    run_with_gates
from dualview.metrics import target_classes
from dualview.surrogates import POOL_TEMPERATURES, SURROGATE_TEMPERATURES, SurrogateBackward, check_surrogate, \
    check_temperature, clipped_soft_gate, soft_gates

__all__ = [
    "DEFAULT_TEMPERATURE",
    "PAPER_INPUT_NUMEL",
    "PatchReport",
    "excitation_backward",
    "excitation_pullback",
    "input_gradient",
    "rescale_norm",
    "AscentResult",
    "projected_gradient_ascent",
    "excitation_gates",
    "GatedLinearModel",
    "gated_linear_model",
]

DEFAULT_TEMPERATURE: float = SURROGATE_TEMPERATURES["sigmoid"]
"""The paper's temperature ``tau`` of ``sigmoid(z / tau)``, for ReLUs and max-pools (Section 5.2-5.3)."""

PAPER_INPUT_NUMEL: int = 3 * 224 * 224
"""Number of input coordinates of the paper's images (3 x 224 x 224, values in [-1, 1])."""


# --------------------------------------------------------------------------------------------------
# The context manager


@dataclass(frozen=True)
class PatchReport:
    """What :func:`excitation_backward` patched: the ReLU and max-pool modules, and the calls seen so far
    (``functional_relu_calls``: ReLUs a ``forward`` applies as functions, e.g. DenseNet's last one, over all
    forward passes inside the block). ``rule`` is the :class:`~dualview.surrogates.SurrogateBackward` at work.
    """

    rule: SurrogateBackward
    relu_modules: list[str]
    pool_modules: list[str]

    @property
    def relu_calls(self) -> int:
        return self.rule.relu_calls

    @property
    def pool_calls(self) -> int:
        return self.rule.pool_calls

    @property
    def functional_relu_calls(self) -> int:
        return self.rule.functional_relu_calls

    @property
    def smooth_calls(self) -> int:
        """SiLU / GELU calls given their surrogate gate."""
        return self.rule.smooth_calls

    @property
    def layer_norm_calls(self) -> int:
        """``nn.LayerNorm`` calls given their surrogate backward (mean and variance held fixed)."""
        return self.rule.layer_norm_calls

    @property
    def attention_calls(self) -> int:
        """``nn.MultiheadAttention`` calls given their surrogate backward (softmax weights held fixed)."""
        return self.rule.attention_calls


@contextlib.contextmanager
def excitation_backward(
    model: nn.Module,
    temperature: float | None = None,
    pool_temperature: float | None = None,
    smooth_temperature: float | None = None,
    surrogate: str = "sigmoid",
    attention_temperature: float | None = None,
) -> Iterator[PatchReport]:
    """Inside the block, ``model``'s backward pass computes excitation pullbacks (Section 5.2-5.3).

    Every ReLU's derivative becomes ``sigmoid(z / temperature)`` and every max-pool's derivative that
    of softmax pooling at ``pool_temperature`` (default: ``temperature``; 0 keeps the max-pool hard);
    forward outputs are unchanged. Works on any model that :func:`dualview.gates.check_supported`
    accepts, plus functional ReLUs in ``forward`` (torchvision's ResNet50, VGG11_BN and DenseNet121,
    the zoo's CIFAR ResNets and MNIST CNNs, in eval mode). Call the model itself (not a submodule)
    inside the block; blocks do not nest. On exit every hook is removed, also on an exception;
    parameters and modules are never touched. Yields a :class:`PatchReport`. SiLU / GELU units multiply the
    gradient by their surrogate gate at ``smooth_temperature``
    (:func:`dualview.surrogates.smooth_gate`; not an exact dual view, see the module's docstring).
    ``temperature=None``: the surrogate's (:data:`dualview.surrogates.SURROGATE_TEMPERATURES`: 0.3 for the seed
    paper's ``"sigmoid"``, 0.6 for the follow-up's ``"normal_cdf"``, whose max-pools default to 0.3 and hold
    their softmax weights fixed). ``nn.LayerNorm`` and ``nn.MultiheadAttention`` get the follow-up's rules
    (:mod:`dualview.attention`, ``attention_temperature`` default 1).
    """
    surrogate = check_surrogate(surrogate)
    tau = SURROGATE_TEMPERATURES[surrogate] if temperature is None else temperature
    rule = SurrogateBackward(tau, pool_temperature, smooth_temperature, surrogate, attention_temperature)
    named = [(name or "<model>", m) for name, m in model.named_modules()]
    for label, m in named:
        if isinstance(m, POOL_GATE_LAYERS) and m.return_indices:
            raise UnsupportedLayerError(
                f"max-pool '{label}' has return_indices=True; excitation pullbacks need a plain max-pool")
    report = PatchReport(rule, [label for label, m in named if isinstance(m, GATE_LAYERS + CLIPPED_LAYERS)],
                         [label for label, m in named if isinstance(m, POOL_GATE_LAYERS)])
    with instrument(model, rule):  # checks the model (check_supported with clipped and smooth)
        yield report


# --------------------------------------------------------------------------------------------------
# Pullbacks


def _pullback_and_logits(
    model: nn.Module, x: Tensor, target, temperature: float | None, pool_temperature: float | None,
    smooth_temperature: float | None = None, surrogate: str = "sigmoid", attention_temperature: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(pullback, logits, targets)``: the pullback of ``logits[n, target[n]]`` for every sample ``n``."""
    check_batch(x, floating=True)
    surrogate = check_surrogate(surrogate)
    t = SURROGATE_TEMPERATURES[surrogate] if temperature is None else check_temperature(temperature)
    check_eval(model)  # before any forward: a refused call leaves the model untouched
    xg = x.detach().clone().requires_grad_(True)
    pool = POOL_TEMPERATURES[surrogate] if pool_temperature is None else pool_temperature
    plain = t == 0 and not pool and smooth_temperature is None and attention_temperature is None
    ctx = contextlib.nullcontext() if plain else \
        excitation_backward(model, t, pool_temperature, smooth_temperature, surrogate, attention_temperature)
    # only the input's gradient is needed: with the parameters' requires_grad off for the call, autograd saves
    # no layer inputs for weight gradients (less memory, faster on a CPU); restored afterwards, also on errors
    frozen = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(False)
        with torch.enable_grad(), ctx:
            logits = model_output(model, xg)
            if logits.dim() != 2:
                raise ValueError(f"the model must return logits of shape (N, classes), got {tuple(logits.shape)}")
            tg = target_classes(target, logits)
            selected = logits.gather(1, tg[:, None]).sum()
            (grad,) = torch.autograd.grad(selected, xg)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return grad, logits.detach(), tg


def excitation_pullback(
    model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor,
    temperature: float | None = None, pool_temperature: float | None = None,
    smooth_temperature: float | None = None, surrogate: str = "sigmoid",
    attention_temperature: float | None = None,
) -> Tensor:
    """The excitation pullback of the class neuron ``target`` at each input (Hypothesis 1, Section 5.2).

    ``x``: a batch ``(N, ...)``; ``target``: one class for all or one per sample. Returns a tensor
    shaped like ``x``: the backward pass of the logit with the surrogate ReLU / max-pool derivatives of
    :func:`excitation_backward`. ``temperature = 0`` (and ``pool_temperature`` 0 or None) is the plain
    input gradient. Samples are independent (the model must be in eval mode).

    SiLU / GELU models: every SiLU (GELU) unit's derivative becomes its gate ``sigmoid(q / tau_s)`` (``Phi(q /
    tau_s)``), ``tau_s = smooth_temperature`` (default 1.6 for SiLU, 1.0 for GELU, the follow-up code's;
    :func:`dualview.surrogates.smooth_gate`), and a squeeze-and-excitation block ``x * s(x)`` passes the
    gradient to ``x`` times ``s(x)`` held fixed. This is exactly the gradient of the network in which each
    such unit computes ``q * stopgrad(gate(q))`` and each block ``x * stopgrad(s(x))`` (same forward), NOT a
    gated linear model of the network: it is not piecewise linear, and nothing linear reproduces ``f(x)``.

    ``surrogate``: ``"sigmoid"`` (the seed paper's, the default) or ``"normal_cdf"`` (the authors' current code:
    ``Phi(z / tau)`` at the ReLUs, max-pools with fixed softmax weights at 0.3); ``temperature=None`` is the
    surrogate's own (0.3 or 0.6). ViT-style models (``nn.LayerNorm``, ``nn.MultiheadAttention``, GELU, a class
    token): LayerNorm's mean and variance and attention's softmax weights are held fixed, the gradient flowing
    through the values with the weights of ``softmax(s / attention_temperature)`` (default 1;
    :mod:`dualview.attention`): the follow-up's rules, a surrogate as for SiLU / GELU.
    """
    return _pullback_and_logits(model, x, target, temperature, pool_temperature, smooth_temperature, surrogate,
                                attention_temperature)[0]


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
    ``target_logit[k]``, ``predicted[k]`` (argmax class) and ``distance[k] = ||x_k - x_0||_2``;
    ``path[k]`` the images ``x_k`` themselves (only with ``keep_path=True``, else ``None``).
    """

    x: Tensor
    delta: Tensor
    target: Tensor
    target_logit: Tensor
    predicted: Tensor
    distance: Tensor
    path: Tensor | None = None

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
    method: str = "pullback", temperature: float | None = None, pool_temperature: float | None = None,
    surrogate: str = "sigmoid",
    step_size: float = 20.0, radius: float = 100.0, steps: int = 10,
    bounds: tuple[float, float] | None = (-1.0, 1.0), keep_path: bool = False,
) -> AscentResult:
    """Steps of fixed L2 length ``step_size`` along the pullback (or the plain gradient) of the target logit,
    each followed by projection onto the L2 ball of ``radius`` around ``x`` and clamping to ``bounds``.

    The defaults are the paper's (Section 5.1: steps of norm 20, radius 100, 10 steps, images in
    [-1, 1] at 3x224x224); for other inputs rescale the norms with :func:`rescale_norm` and pass the
    model's input range as ``bounds`` (``None``: no clamping). ``method``: ``"pullback"`` or ``"gradient"``.
    ``keep_path=True`` also returns every intermediate image (``steps + 1`` times the memory of ``x``).
    ``surrogate`` and ``temperature``: as for :func:`excitation_pullback`.
    """
    if method not in ("pullback", "gradient"):
        raise ValueError(f"method must be 'pullback' or 'gradient', got {method!r}")
    if steps < 0 or step_size < 0 or radius < 0:
        raise ValueError(f"need steps, step_size, radius >= 0; got {steps}, {step_size}, {radius}")
    if bounds is not None and not bounds[0] < bounds[1]:
        raise ValueError(f"bounds must be (low, high) with low < high, got {bounds}")
    check_batch(x, floating=True)
    check_eval(model)
    tau, ptau = (temperature, pool_temperature) if method == "pullback" else (0.0, 0.0)
    surrogate = check_surrogate(surrogate)
    x0 = x.detach()
    xk = x0.clone()
    logits_hist, pred_hist, dist_hist, path = [], [], [], []
    tg = None
    for k in range(steps + 1):
        if keep_path:
            path.append(xk.detach())
        if k < steps:
            d, logits, tg = _pullback_and_logits(model, xk, target if tg is None else tg, tau, ptau,
                                                 surrogate=surrogate)
        else:
            with torch.no_grad():
                logits = model_output(model, xk)
        if tg is None:
            tg = target_classes(target, logits)
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
                        predicted=torch.stack(pred_hist), distance=torch.stack(dist_hist),
                        path=torch.stack(path) if keep_path else None)


# --------------------------------------------------------------------------------------------------
# The theory: excitation gates and gated linear models


def excitation_gates(model: nn.Module, x: Tensor, temperature: float | None = None,
                     surrogate: str = "sigmoid") -> dict[str, Tensor]:
    """The excitation function ``Gamma(x) = sigmoid(Z(x) / tau)`` of every ReLU call (Hypothesis 1, comment 5;
    ``surrogate="normal_cdf"``: ``Phi(Z(x) / tau)``, ``temperature=None``: the surrogate's, 0.3 or 0.6).

    Keys as :func:`dualview.gates.record_gates` names the ReLU calls; ``temperature = 0`` gives the
    hard gates ``Z(x) > 0`` as floats. A hard-clipped ReLU call (ceiling ``t``) gets
    ``sigmoid(Z / tau) - sigmoid((Z - t) / tau)`` (:func:`dualview.surrogates.clipped_soft_gate`; hard:
    ``0 < Z < t``). Detached from the graph.
    """
    surrogate = check_surrogate(surrogate)
    tau = SURROGATE_TEMPERATURES[surrogate] if temperature is None else temperature
    with torch.no_grad():
        rec = record_gates(model, x)
    gates = soft_gates(rec.preactivations, tau, surrogate)
    for k, t in rec.ceilings.items():
        gates[k] = clipped_soft_gate(rec.preactivations[k], t, tau, surrogate)
    return gates


@dataclass
class GatedLinearModel:
    """``f_Lambda(x') = <weight, x'> + bias`` with the gates ``Lambda`` held fixed (Eq. 4-7 of the paper).

    ``weight`` is the gating-induced pullback ``v_Lambda`` (shaped like the input); ``bias`` its
    coordinate on the augmented constant input, ``f_Lambda(0)``; ``output = f_Lambda(x)``.
    """

    weight: Tensor
    bias: Tensor
    output: Tensor


@full_precision()
def gated_linear_model(
    model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor, gates: Mapping[str, Tensor],
    pool_indices: Mapping[str, Tensor] | None = None, saturated: Mapping[str, Tensor] | None = None,
) -> GatedLinearModel:
    """The Lambda-induced network's class neuron ``target`` at ``x`` as an explicit linear model.

    ``gates`` (one tensor per ReLU call, as :func:`excitation_gates` or ``record_gates(...).gates``
    give them) are held fixed, so ``x' -> run_with_gates(model, x', gates)`` is affine; its
    gradient is ``v_Lambda`` (Section 2.5 of :cite:`satkiewicz2025tapping`). Max-pools take
    ``pool_indices`` if given, else the winners of ``x`` itself (held fixed too, so the map is affine).
    Hard-clipped ReLUs (``nn.ReLU6``) add their constant saturated piece ``t * saturated[name]``, by default
    ``x``'s own (``record_gates(model, x).saturated``): it goes into the bias.

    Self-check: the result must reproduce the Lambda-network's output at ``x``,
    ``<weight, x> + bias = f_Lambda(x)`` within a tolerance set by the dtype; if not (a layer that is
    not affine once the gates are fixed), ``UnsupportedLayerError`` is raised instead of a wrong model.
    """
    check_batch(x, floating=True)
    check_eval(model)
    if pool_indices is None or saturated is None:
        with torch.no_grad():
            rec = record_gates(model, x)
        pool_indices = rec.pool_indices or None if pool_indices is None else pool_indices
        saturated = rec.saturated if saturated is None else saturated
    xg = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        out = run_with_gates(model, xg, gates, pool_indices, saturated=saturated)
        tg = target_classes(target, out)
        sel = out.gather(1, tg[:, None])[:, 0]
        (v,) = torch.autograd.grad(sel.sum(), xg)
    with torch.no_grad():
        zero = run_with_gates(model, torch.zeros_like(x), gates, pool_indices, saturated=saturated)
        zero = zero.gather(1, tg[:, None])[:, 0]
    sel = sel.detach()
    check_reproduces("the gated linear model", (v * x).flatten(1), zero, sel)
    return GatedLinearModel(weight=v, bias=zero, output=sel)

