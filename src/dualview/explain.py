"""One verb for every attribution method: ``attribute(model, x, target, method=...)``.

As in Captum, every method takes a batch ``x`` ``(N, C, H, W)`` (or any ``(N, ...)`` for the gradient
family) and the class ``target`` (one for all samples or one per sample) and returns a map shaped like
``x``, so that methods are interchangeable in figures and in metrics (Chapter 9):

* ``"gradient"``: the input gradient of the target logit (the hard-gated pullback, Chapter 6);
* ``"gradient_x_input"``: gradient times input minus ``baseline`` (default 0: gradient times input);
* ``"integrated_gradients"``: Captum's Integrated Gradients :cite:`sundararajan2017axiomatic` (``baseline``,
  ``n_steps``);
* ``"smoothgrad"``: Captum's NoiseTunnel over the plain (signed) gradient :cite:`smilkov2017smoothgrad`
  (``n_samples``, ``noise``: the noise's standard deviation; noise from torch's global generator, so seed
  first);
* ``"lrp"``: Zennit's LRP :cite:`bach2015pixel,anders2021software` with the composite ``EpsilonGammaBox``
  (epsilon in the dense layers, gamma in the convolutions, the z^B rule with the input's bounds in the first
  layer) or ``"epsilon_plus_flat"`` (flat rule in the first layer: a blob that ignores the image);
* ``"pullback"``: the excitation pullback :cite:`satkiewicz2025tapping` (``temperature``,
  ``pool_temperature``; :func:`dualview.pullbacks.excitation_pullback`);
* ``"pullback_x_input"``: pullback times input minus ``baseline`` (default 0), as ``"gradient_x_input"``;
* ``"insens"``: Insens :cite:`szymanski2020switched` (:func:`dualview.projections.insens`),
  *class-agnostic*: the ``target`` is checked and ignored;
* ``"intensity"``: ``|x - baseline|``, a trivial baseline that knows nothing of the network;
* ``"edges"``: the Sobel edge magnitude of the channel-mean image, on every channel, another.

:func:`quantus_explain_func` adapts the verb to Quantus' ``explain_func`` convention (NumPy in, NumPy out).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from dualview import projections, pullbacks
from dualview.gates import UnsupportedLayerError, check_batch, check_eval
from dualview.metrics import target_classes

__all__ = ["METHODS", "CLASS_AGNOSTIC", "attribute", "edge_map", "quantus_explain_func"]

METHODS: tuple[str, ...] = ("gradient", "gradient_x_input", "integrated_gradients", "smoothgrad", "lrp", "pullback",
                            "pullback_x_input", "insens", "intensity", "edges")
"""The names ``attribute`` accepts, in the order the book's tables list them."""

CLASS_AGNOSTIC: frozenset[str] = frozenset({"insens", "intensity", "edges"})
"""Methods whose map does not depend on the target class."""

_OPTIONS: dict[str, set[str]] = {
    "gradient": set(), "gradient_x_input": {"baseline"}, "integrated_gradients": {"baseline", "n_steps"},
    "smoothgrad": {"n_samples", "noise"}, "lrp": {"composite", "low", "high", "epsilon", "gamma"},
    "pullback": {"temperature", "pool_temperature"},
    "pullback_x_input": {"temperature", "pool_temperature", "baseline"},
    "insens": {"chunk_size"}, "intensity": {"baseline"}, "edges": set(),
}


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


def _lrp(model: nn.Module, x: Tensor, t: Tensor, composite: str = "epsilon_gamma_box", low: float = 0.0,
         high: float = 1.0, epsilon: float = 1e-6, gamma: float = 0.25) -> Tensor:
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonGammaBox, EpsilonPlusFlat

    preprocess, net = _zoo_parts(model)
    residual = [n for n, m in net.named_modules() if type(m).__name__ in ("BasicBlock", "Bottleneck", "FCResNet")]
    norms = [n for n, m in net.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if residual or norms:
        raise UnsupportedLayerError(
            f"LRP here covers plain conv nets only: the model has {'residual blocks ' + repr(residual[:2]) if residual else ''}"
            f"{' and ' if residual and norms else ''}{'BatchNorm layers ' + repr(norms[:2]) if norms else ''}; Zennit "
            "needs canonizers for those (merging BatchNorm, splitting the residual sum), which this verb does not set up")
    with torch.no_grad():
        z = preprocess(x)
        if z.shape != x.shape:
            raise UnsupportedLayerError(f"LRP needs an element-wise preprocessing layer; {type(preprocess).__name__} "
                                        f"maps {tuple(x.shape)} to {tuple(z.shape)}")
        lo = preprocess(torch.full_like(x[:1], low))
        hi = preprocess(torch.full_like(x[:1], high))
        lo, hi = torch.minimum(lo, hi), torch.maximum(lo, hi)
    if composite == "epsilon_gamma_box":
        comp = EpsilonGammaBox(low=lo, high=hi, epsilon=epsilon, gamma=gamma)
    elif composite == "epsilon_plus_flat":
        comp = EpsilonPlusFlat(epsilon=epsilon)
    else:
        raise ValueError(f"composite must be 'epsilon_gamma_box' or 'epsilon_plus_flat', got {composite!r}")
    with torch.enable_grad(), Gradient(model=net, composite=comp) as attributor:
        # the relevance starts as the target logit itself (Bach et al.'s R = f(x)) and flows down to the input
        logits, relevance = attributor(z.clone(), lambda out: torch.nn.functional.one_hot(t, out.shape[1]).to(out) * out)
    # relevance is a per-pixel amount: an element-wise affine preprocessing passes it through unchanged
    return relevance.detach()


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
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    unknown = set(options) - _OPTIONS[method]
    if unknown:
        raise TypeError(f"method {method!r} takes the options {sorted(_OPTIONS[method]) or 'none'}, "
                        f"got {sorted(unknown)}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_batch(x, floating=True)
    check_eval(model)  # before any forward, for every method: a refused call leaves the model untouched
    x = x.detach()
    with torch.no_grad():
        logits = model(x)
    if logits.dim() != 2:
        raise ValueError(f"the model must return logits of shape (N, classes), got {tuple(logits.shape)}")
    t = target_classes(target, logits)
    if method in ("gradient", "gradient_x_input"):
        g = pullbacks.input_gradient(model, x, t)
        return g * (x - _baseline(x, options.get("baseline", 0.0))) if method == "gradient_x_input" else g
    if method in ("pullback", "pullback_x_input"):
        v = pullbacks.excitation_pullback(model, x, t, temperature=options.get("temperature", pullbacks.DEFAULT_TEMPERATURE),
                                          pool_temperature=options.get("pool_temperature"))
        return v * (x - _baseline(x, options.get("baseline", 0.0))) if method == "pullback_x_input" else v
    if method == "integrated_gradients":
        from captum.attr import IntegratedGradients

        with torch.enable_grad():
            steps = options.get("n_steps", 32)
            out = IntegratedGradients(model).attribute(x, baselines=_baseline(x, options.get("baseline", 0.0)), target=t,
                                                       n_steps=steps, internal_batch_size=max(len(x), 256))
        return out.detach()
    if method == "smoothgrad":
        from captum.attr import NoiseTunnel, Saliency

        with torch.enable_grad():
            out = NoiseTunnel(Saliency(model)).attribute(x, nt_type="smoothgrad", nt_samples=options.get("n_samples", 16),
                                                         nt_samples_batch_size=max(1, 256 // len(x)),
                                                         stdevs=options.get("noise", 0.15), target=t, abs=False)
        return out.detach()
    if method == "lrp":
        if x.dim() != 4:
            raise ValueError(f"LRP needs images (N, C, H, W), got shape {tuple(x.shape)}")
        return _lrp(model, x, t, **options)
    if method == "insens":
        return projections.insens(model, x, chunk_size=options.get("chunk_size")).omega
    if method == "intensity":
        return (x - _baseline(x, options.get("baseline", 0.0))).abs()
    return edge_map(x)[:, None].expand_as(x).clone()   # "edges"


def quantus_explain_func(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, method: str = "gradient",
                         device: str | torch.device | None = None, **options: Any) -> np.ndarray:
    """:func:`attribute` in Quantus' ``explain_func`` convention: NumPy inputs and targets in, NumPy maps out.

    Pass it as ``explain_func`` with ``explain_func_kwargs={"method": ..., **options}``.
    """
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    x = torch.as_tensor(np.asarray(inputs), dtype=torch.float32, device=dev)
    t = torch.as_tensor(np.asarray(targets), dtype=torch.long, device=dev)
    return attribute(model, x, t, method=method, **options).detach().cpu().numpy()
