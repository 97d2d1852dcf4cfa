"""Surrogate backward passes through LayerNorm and attention: excitation pullbacks of ViT-style models.

Beyond the seed papers. :cite:`satkiewicz2025tapping` defines excitation pullbacks for ReLU networks; the
authors' current code (repository ``314-Foundation/SemanticPullbacks``, ``lib/surrogates.py`` and
``lib/defaults.py``, as of August 2026, with the paper's v6) extends them to transformers with two more rules,
which this module implements (:class:`dualview.surrogates.SurrogateBackward` applies them inside
:func:`dualview.gates.instrument`):

* **LayerNorm** (``SurrogateLayerNorm``): the mean and the variance are held fixed in the backward pass,
  ``y = (x - stopgrad(mu)) * stopgrad(1 / sqrt(var + eps)) * w + b``, so the gradient passes each feature
  times ``w / sqrt(var + eps)`` (a per-token affine map, like an eval-mode BatchNorm), not through the
  statistics (:func:`layer_norm_surrogate`).
* **Attention** (``SurrogatePVTAttention``): the softmax weights are held fixed and the gradient flows through
  the value path only, with the weights of a softer softmax at temperature ``tau``,
  ``out = stopgrad(softmax(s / tau)) @ V`` in the backward pass, ``softmax(s) @ V`` in the forward
  (``s = Q K^T / sqrt(d)``), ``tau = 1`` by default (``lib/defaults.py``): the network's own weights. Queries and
  keys get no gradient (:func:`attention_surrogate`, for ``nn.MultiheadAttention``).

Both are surrogates, like those of SiLU and GELU (:mod:`dualview.surrogates`): a backward pass with a stated
rule, NOT an exact dual view. LayerNorm divides by a statistic of its input, attention multiplies two
input-dependent tensors: neither is piecewise linear, and no gates held fixed make the network affine, so
recorded and imposed gates, gated linear models, switched projections, Insens, path counts and kernels refuse
them by name (:func:`dualview.gates.check_supported`).

One deviation, stated: the authors' code has a second attention rule for ``nn.MultiheadAttention``
(``SurrogateMultiheadAttention``: queries and keys scaled by ``1 / tau`` before the input projection, every
gradient kept; at its default ``tau = 1`` that is the module's own derivative). We apply the value-path rule
above, the one of their PVT models, to ``nn.MultiheadAttention`` too (one rule for attention, the one that holds
the softmax weights fixed as the max-pool rule does); ``attention_temperature`` scales the attention logits
``s`` (not the inputs).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dualview.gates import UnsupportedLayerError

__all__ = ["ATTENTION_TEMPERATURE", "layer_norm_surrogate", "attention_surrogate"]

ATTENTION_TEMPERATURE: float = 1.0
"""The follow-up code's temperature of attention's softer softmax (``lib/defaults.py``: ``nn.MultiheadAttention:
1.0``, ``PVTAttention: 1.0``): the network's own softmax weights."""


def layer_norm_surrogate(module: nn.LayerNorm, x: Tensor, out: Tensor) -> Tensor:
    """``out = module(x)`` whose backward pass holds the mean and variance of ``x`` fixed: the gradient of
    ``(x - stopgrad(mu)) * stopgrad(rsqrt(var + eps)) * weight + bias`` (the follow-up code's
    ``SurrogateLayerNorm``; biased variance over the normalised dimensions, as ``nn.LayerNorm``)."""
    dims = tuple(range(x.dim() - len(module.normalized_shape), x.dim()))
    with torch.no_grad():
        var, mean = torch.var_mean(x, dim=dims, correction=0, keepdim=True)
        inv_std = torch.rsqrt(var + module.eps)
    z = (x - mean) * inv_std
    if module.weight is not None:
        z = z * module.weight
    if module.bias is not None:
        z = z + module.bias
    return out.detach() + (z - z.detach())  # the layer's own forward, z's backward


_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
         "is_causal")


def _heads(t: Tensor, n_heads: int) -> Tensor:
    """``(N, L, E) -> (N, heads, L, E / heads)``."""
    n, length, e = t.shape
    return t.view(n, length, n_heads, e // n_heads).transpose(1, 2)


def attention_surrogate(module: nn.MultiheadAttention, args: tuple, kwargs: dict, out: tuple,
                        temperature: float, label: str = "") -> tuple:
    """``out = module(*args, **kwargs)`` whose attention output's backward pass is that of
    ``stopgrad(softmax(s / temperature)) @ V`` (the follow-up code's ``SurrogatePVTAttention``; ``s = Q K^T /
    sqrt(d)`` per head): the softmax weights held fixed, the gradient through the value projection only. The
    attention weights (``need_weights=True``) come back detached.

    Self-check: the module's output is recomputed from its parameters with the softmax at temperature 1; if it
    differs (a configuration this re-implementation does not cover), ``UnsupportedLayerError`` is raised.
    """
    bound = dict(zip(_ARGS, args)) | kwargs
    query, key, value = bound["query"], bound["key"], bound["value"]
    if bound.get("attn_mask") is not None or bound.get("key_padding_mask") is not None or bound.get("is_causal"):
        raise UnsupportedLayerError(
            f"attention layer '{label}' (nn.MultiheadAttention) is called with a mask (attn_mask, "
            "key_padding_mask or is_causal): the excitation pullback's attention rule covers unmasked attention "
            "(ViT-style encoders).")
    if query.dim() != 3:
        raise UnsupportedLayerError(f"attention layer '{label}' (nn.MultiheadAttention) got an unbatched "
                                    f"query of shape {tuple(query.shape)}: pass a batch (N, L, E).")
    if not module.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    e, n_heads = module.embed_dim, module.num_heads
    if module._qkv_same_embed_dim:
        w_q, w_k, w_v = module.in_proj_weight.split(e)
    else:
        w_q, w_k, w_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
    b_q, b_k, b_v = (None,) * 3 if module.in_proj_bias is None else module.in_proj_bias.split(e)
    v = _heads(F.linear(value, w_v, b_v), n_heads)  # the value path: differentiated
    with torch.no_grad():
        q, k = _heads(F.linear(query, w_q, b_q), n_heads), _heads(F.linear(key, w_k, b_k), n_heads)
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        weights = torch.softmax(logits, dim=-1)
        soft = weights if temperature == 1 else torch.softmax(logits / temperature, dim=-1)

    def merged(w: Tensor, vals: Tensor) -> Tensor:
        o = (w @ vals).transpose(1, 2).reshape(query.shape[0], query.shape[1], e)
        o = F.linear(o, module.out_proj.weight, module.out_proj.bias)
        return o if module.batch_first else o.transpose(0, 1)

    surrogate = merged(soft, v)
    own = out[0].detach()
    with torch.no_grad():
        again = surrogate.detach() if temperature == 1 else merged(weights, v.detach())
        tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(own.dtype, 2e-2)
        if again.shape != own.shape or not torch.allclose(again, own, rtol=tol,
                                                          atol=tol * float(own.abs().max().clamp_min(1))):
            raise UnsupportedLayerError(
                f"attention layer '{label}' (nn.MultiheadAttention): its output could not be recomputed from its "
                "parameters (the excitation pullback's attention rule re-implements plain multi-head attention), "
                "so its surrogate backward would be wrong. Use a plain nn.MultiheadAttention in eval mode.")
    attention = own + (surrogate - surrogate.detach())  # the module's own forward, the surrogate's backward
    return (attention, None if out[1] is None else out[1].detach())
