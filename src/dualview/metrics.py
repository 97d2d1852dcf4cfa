"""Metrics of attribution maps: how faithful a ranking of pixels is, and how smooth a map is.

:func:`deletion_curve` (deletion or insertion of the top-ranked pixels, a faithfulness measure) and
the scale-free smoothness measures :func:`total_variation` and :func:`high_frequency_share`, with which
Chapter 6 compares excitation pullbacks (:mod:`dualview.pullbacks`) and plain gradients, a question
the paper :cite:`satkiewicz2025tapping` answers by eye only. :func:`target_classes` reads the
``target`` argument that attributions and metrics share (one class for all samples or one per sample).

The field's other metrics come from Quantus :cite:`hedstrom2023quantus`; :func:`quantus_scores` runs one
of its metric objects on tensors and returns one score per sample (Chapter 9).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from dualview.gates import check_batch, model_output

__all__ = ["target_classes", "DeletionCurve", "deletion_curve", "total_variation", "high_frequency_share",
           "quantus_scores"]


def target_classes(target: int | Sequence[int] | Tensor, logits: Tensor) -> Tensor:
    """The class of every sample as a ``(N,)`` long tensor: ``target`` is one class for all samples or one
    per sample, checked against the ``(N, classes)`` ``logits``."""
    t = torch.as_tensor(target, device=logits.device)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"target must hold integer class indices, got dtype {t.dtype}")
    n, num_classes = logits.shape[0], logits.shape[1]
    t = t.long().reshape(-1)
    if t.numel() == 1:
        t = t.expand(n)
    if t.numel() != n:
        raise ValueError(f"target has {t.numel()} entries for a batch of {n}: give one class per sample or one for all")
    if bool(((t < 0) | (t >= num_classes)).any()):
        raise ValueError(f"target classes must lie in [0, {num_classes}), got {t.tolist()}")
    return t


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
    check_batch(x, floating=True)
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
        with torch.no_grad():  # scores only: no autograd graph (faster, far less memory on big batches)
            out = model_output(model, torch.where(mask, base, x) if mode == "deletion" else torch.where(mask, x, base))
        if tg is None:
            tg = target_classes(target, out)
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
# Quantus


def _trapezoid_auc(values, dx: int = 1, batched: bool = False):
    return np.trapezoid(np.asarray(values), dx=dx, axis=1 if batched else -1)


def quantus_scores(metric: Any, model: nn.Module, x: Tensor, target: int | Sequence[int] | Tensor,
                   maps: Tensor | None = None, explain_func: Callable | None = None,
                   explain_func_kwargs: dict | None = None, softmax: bool = True) -> Any:
    """Run the Quantus metric object ``metric`` on a batch and return its scores.

    ``x``: ``(N, C, H, W)``; ``target``: one class for all or one per sample; ``maps``: the attribution
    maps shaped like ``x`` (metrics that re-explain, such as MPRT, random logit and max-sensitivity, need
    ``explain_func`` and its kwargs instead, e.g. :func:`dualview.explain.quantus_explain_func`).
    ``softmax``: the model's output the metric reads (probabilities, or logits with ``False``). Returns
    what Quantus returns for the batch: a ``(N,)`` array for most metrics, a dict (layer -> ``(N,)`` scores)
    for MPRT, and for ROAD a ``(N, P)`` 0/1 array (still classified correctly after imputing each of the
    ``P`` percentages of top pixels) instead of Quantus' average, so that intervals can be taken over samples.
    A NaN or infinite score (e.g. faithfulness correlation on a softmax probability saturated at 1.0, whose
    perturbations change nothing) raises ``ValueError`` naming the samples, instead of reaching an average.

    Quantus 0.6 integrates curves with ``np.trapz``, which NumPy 2.4 removed; where it is missing, its
    helper ``calculate_auc`` is pointed at ``np.trapezoid`` (the same trapezoid rule) before the call.
    """
    import quantus.helpers.utils as quantus_utils

    if not hasattr(np, "trapz"):
        quantus_utils.calculate_auc = _trapezoid_auc
    check_batch(x, floating=True)
    with torch.no_grad():
        logits = model_output(model, x)
    t = target_classes(target, logits)
    if maps is not None and maps.shape != x.shape:
        raise ValueError(f"maps must be shaped like x {tuple(x.shape)}, got {tuple(maps.shape)}")
    if maps is None and explain_func is None:
        raise ValueError("give the attribution maps or an explain_func that computes them")
    device = str(x.device)
    if type(metric).__name__ == "ROAD":  # keep the per-sample results Quantus would average away
        metric.custom_postprocess = lambda **kwargs: None
    scores = metric(model=model, x_batch=x.detach().cpu().numpy(), y_batch=t.cpu().numpy(),
                    a_batch=None if maps is None else maps.detach().cpu().numpy(), device=device,
                    explain_func=explain_func, explain_func_kwargs=explain_func_kwargs or {},
                    batch_size=len(x), softmax=softmax)
    if type(metric).__name__ == "ROAD":
        result = np.concatenate([np.asarray(batch, dtype=np.float64) for batch in metric.evaluation_scores])
    elif isinstance(scores, dict):
        result = {k: np.asarray(v, dtype=np.float64) for k, v in scores.items()}
    else:
        result = np.asarray(scores, dtype=np.float64)
    for key, arr in (result.items() if isinstance(result, dict) else [(None, result)]):
        per_sample = np.atleast_1d(arr).reshape(len(np.atleast_1d(arr)), -1)
        bad = np.flatnonzero(~np.isfinite(per_sample).all(1))
        if len(bad):
            where = f" (layer {key!r})" if key is not None else ""
            raise ValueError(
                f"{type(metric).__name__}{where} returned NaN or infinite scores for {len(bad)} of {len(per_sample)} "
                f"samples (indices {bad[:10].tolist()}{' ...' if len(bad) > 10 else ''}). A correlation is "
                "undefined when the model's output never changes under the perturbations, e.g. a softmax "
                "probability saturated at exactly 1.0: score the logits (softmax=False) or leave those samples "
                "out and say so.")
    return result
