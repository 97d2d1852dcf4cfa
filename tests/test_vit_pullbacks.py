"""Excitation pullbacks of ViT-style models (issue 39, finding 4): LayerNorm with its mean and variance held fixed,
attention with its softmax weights held fixed and the gradient through the values (the follow-up code's rules,
``314-Foundation/SemanticPullbacks``, ``lib/surrogates.py``). Checked against an independent re-implementation:
a functional forward of the same ViT, written out per head, in which the detaching and the surrogates are
explicit, so that its plain autograd input gradient is the pullback. The exact dual view still refuses
attention and LayerNorm by name."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dualview import attention, explain, gates, paths, projections, pullbacks


class Block(nn.Module):
    def __init__(self, d: int, heads: int, act: nn.Module, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=batch_first)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), act, nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        if not self.batch_first:
            h = h.transpose(0, 1)
        a = self.attn(h, h, h, need_weights=False)[0]
        x = x + (a if self.batch_first else a.transpose(0, 1))
        return x + self.mlp(self.ln2(x))


class TinyViT(nn.Module):
    """Patch embedding, class token, position embedding, pre-norm blocks, final LayerNorm, linear head."""

    def __init__(self, d=16, heads=2, depth=2, patch=4, image=12, classes=5, act=None, batch_first=True):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.pos = nn.Parameter(0.3 * torch.randn(1, (image // patch) ** 2 + 1, d))
        self.blocks = nn.Sequential(*[Block(d, heads, act or nn.GELU(), batch_first) for _ in range(depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    """Random LayerNorm affines and biases too (their defaults, 1 and 0, would hide a missing weight)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (0.5 if p.dim() < 2 else 1 / math.sqrt(
                p[0].numel())))
    return model.eval()


# --------------------------------------------------------------------------------------------------
# The reference: the same ViT written out as functions, the follow-up's rules as explicit stopgrads


def _st(forward_value, backward_value):
    """Forward ``forward_value``, backward that of ``backward_value`` (a straight-through estimator)."""
    return forward_value.detach() + (backward_value - backward_value.detach())


def ref_layer_norm(ln, h):
    mu = h.mean(-1, keepdim=True).detach()
    var = ((h - mu) ** 2).mean(-1, keepdim=True).detach()
    return (h - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def ref_attention(mha, h, tau):
    """Multi-head self-attention of ``h`` (N, L, E), one head at a time: forward with softmax(s), backward with
    the fixed weights softmax(s / tau) times the values."""
    e, heads = mha.embed_dim, mha.num_heads
    dh = e // heads
    w, b = mha.in_proj_weight, mha.in_proj_bias
    q, k, v = (h @ w[i * e:(i + 1) * e].T + b[i * e:(i + 1) * e] for i in range(3))
    outs = []
    for j in range(heads):
        sl = slice(j * dh, (j + 1) * dh)
        s = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(dh)
        own = torch.softmax(s, -1).detach() @ v[..., sl]
        softer = torch.softmax(s / tau, -1).detach() @ v[..., sl]
        outs.append(_st(own, softer))
    return torch.cat(outs, -1) @ mha.out_proj.weight.T + mha.out_proj.bias


def ref_activation(act, h, relu_tau):
    if isinstance(act, nn.GELU):  # the follow-up's SurrogateGELU at its default temperature 1: Phi(h)
        return h * (0.5 * (1 + torch.erf(h / math.sqrt(2)))).detach()
    gate = 0.5 * (1 + torch.erf(h / (relu_tau * math.sqrt(2))))  # SurrogateReLU: Phi(h / 0.6)
    return _st(torch.relu(h), h * gate.detach())


def reference_pullback(spec, x, target, tau=1.0, relu_tau=0.6, surrogate=True):
    """``spec``: the parts of a ViT (see :func:`spec_of_tiny` / :func:`spec_of_torchvision`). With
    ``surrogate=False`` the plain forward (no stopgrads): its gradient is the plain input gradient."""
    x = x.detach().clone().requires_grad_(True)
    ln = ref_layer_norm if surrogate else (lambda m, h: F.layer_norm(h, m.normalized_shape, m.weight, m.bias, m.eps))
    att = (lambda m, h: ref_attention(m, h, tau)) if surrogate else \
        (lambda m, h: m(h, h, h, need_weights=False)[0] if m.batch_first else
         m(h.transpose(0, 1), h.transpose(0, 1), h.transpose(0, 1), need_weights=False)[0].transpose(0, 1))
    act = (lambda a, h: ref_activation(a, h, relu_tau)) if surrogate else (lambda a, h: a(h))
    z = F.conv2d(x, spec["patch"].weight, spec["patch"].bias, stride=spec["patch"].stride)
    z = z.flatten(2).transpose(1, 2)
    z = torch.cat([spec["cls"].expand(len(x), -1, -1), z], 1) + spec["pos"]
    for ln1, mha, ln2, fc1, a, fc2 in spec["blocks"]:
        z = z + att(mha, ln(ln1, z))
        z = z + fc2(act(a, fc1(ln(ln2, z))))
    logits = spec["head"](ln(spec["norm"], z)[:, 0])
    (g,) = torch.autograd.grad(logits[:, target].sum(), x)
    return g, logits.detach()


def spec_of_tiny(m: TinyViT):
    return {"patch": m.patch, "cls": m.cls, "pos": m.pos, "norm": m.norm, "head": m.head,
            "blocks": [(b.ln1, b.attn, b.ln2, b.mlp[0], b.mlp[1], b.mlp[2]) for b in m.blocks]}


def spec_of_torchvision(m):
    blocks = [(b.ln_1, b.self_attention, b.ln_2, b.mlp[0], b.mlp[1], b.mlp[3]) for b in m.encoder.layers]
    return {"patch": m.conv_proj, "cls": m.class_token, "pos": m.encoder.pos_embedding, "norm": m.encoder.ln,
            "head": m.heads.head, "blocks": blocks}


@pytest.fixture
def images():
    return torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_first", [True, False])
def test_tiny_vit_pullback_matches_the_written_out_rules(images, batch_first):
    model = _randomise(TinyViT(batch_first=batch_first).double(), 0)
    before = _state(model)
    v = pullbacks.excitation_pullback(model, images, 2)
    ref, logits = reference_pullback(spec_of_tiny(model), images, 2)
    plain, _ = reference_pullback(spec_of_tiny(model), images, 2, surrogate=False)
    with torch.no_grad():
        assert torch.allclose(logits, model(images), rtol=1e-12, atol=1e-12)  # the reference is the same network
    assert torch.allclose(pullbacks.input_gradient(model, images, 2), plain, rtol=1e-10, atol=1e-12)
    assert torch.allclose(v, ref, rtol=1e-10, atol=1e-12)
    assert (v - plain).norm() > 0.05 * plain.norm()  # the rules change the map: the check can fail
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_softer_attention_and_the_relu_surrogate_of_the_follow_up(images):
    # a ReLU MLP with surrogate="normal_cdf" (Phi(h / 0.6)) and attention's softer softmax at tau = 2
    model = _randomise(TinyViT(act=nn.ReLU()).double(), 3)
    v = pullbacks.excitation_pullback(model, images, [0, 1, 4], surrogate="normal_cdf", attention_temperature=2.0)
    for n, t in enumerate([0, 1, 4]):
        ref, _ = reference_pullback(spec_of_tiny(model), images[n:n + 1], t, tau=2.0, relu_tau=0.6)
        assert torch.allclose(v[n:n + 1], ref, rtol=1e-10, atol=1e-12)
    at_one = pullbacks.excitation_pullback(model, images, [0, 1, 4], surrogate="normal_cdf")
    assert (v - at_one).norm() > 0.01 * at_one.norm()  # the temperature is used
    # the same through the one verb
    same = explain.attribute(model, images, [0, 1, 4], "pullback", surrogate="normal_cdf", attention_temperature=2.0)
    assert torch.equal(same, v)


def test_torchvision_vision_transformer(images):
    from torchvision.models.vision_transformer import VisionTransformer

    model = _randomise(VisionTransformer(image_size=12, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16,
                                         mlp_dim=32, num_classes=5).double(), 5)
    xg = images.clone().requires_grad_(True)
    with pullbacks.excitation_backward(model) as report:
        out = model(xg)
        (v,) = torch.autograd.grad(out[:, 3].sum(), xg)
    assert (report.layer_norm_calls, report.attention_calls, report.smooth_calls) == (5, 2, 2)
    ref, _ = reference_pullback(spec_of_torchvision(model), images, 3)
    assert torch.allclose(v, ref, rtol=1e-10, atol=1e-12)
    assert torch.allclose(pullbacks.excitation_pullback(model, images, 3), ref, rtol=1e-10, atol=1e-12)


def test_float32_and_attention_weights_returned_detached():
    model = _randomise(TinyViT(), 7)
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(2))
    v = pullbacks.excitation_pullback(model, x, 1)
    ref, _ = reference_pullback(spec_of_tiny(model), x, 1)
    assert torch.allclose(v, ref, rtol=1e-4, atol=1e-6 * float(ref.abs().max()))
    mha = model.blocks[0].attn
    h = torch.randn(2, 5, 16, requires_grad=True)
    out = mha(h, h, h)
    new = attention.attention_surrogate(mha, (h, h, h), {}, out, 1.0, "attn")
    assert torch.equal(new[0], out[0]) and new[1] is not None and not new[1].requires_grad


def test_the_attention_rule_checks_itself():
    # an output the module's parameters do not reproduce (here another input's) is refused, not pulled back
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    h, other = torch.randn(2, 2, 4, 8).unbind(0)
    with pytest.raises(gates.UnsupportedLayerError, match="could not be recomputed"):
        attention.attention_surrogate(mha, (h, h, h), {}, mha(other, other, other), 1.0, "attn")
    with pytest.raises(gates.UnsupportedLayerError, match="mask"):
        attention.attention_surrogate(mha, (h, h, h), {"attn_mask": torch.zeros(4, 4)}, mha(h, h, h), 1.0, "a")


def test_layer_norm_rule_holds_the_statistics_fixed():
    ln = _randomise(nn.LayerNorm((3, 4)).double(), 1)
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    out = ln(x)
    y = attention.layer_norm_surrogate(ln, x, out)
    assert torch.equal(y, out)
    g = torch.randn_like(out)
    (got,) = torch.autograd.grad(y, x, g)
    var = x.detach().var(dim=(2, 3), unbiased=False, keepdim=True)
    assert torch.allclose(got, g * ln.weight / torch.sqrt(var + ln.eps), rtol=1e-12)


class AttentionOnly(nn.Module):
    """Attention without LayerNorm, to see which layer a refusal names."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.attn(x, x, x)[0].mean(1))


@pytest.mark.parametrize("call", ["record_gates", "gated_linear_model", "insens", "count_paths", "switched"])
def test_the_exact_dual_view_refuses_attention_and_layer_norm_by_name(images, call):
    vit = _randomise(TinyViT().double(), 0)
    seq = torch.randn(2, 4, 8, dtype=torch.float64)
    attn_only = AttentionOnly().double().eval()
    for model, x, name in ((vit, images, "LayerNorm"), (attn_only, seq, "MultiheadAttention")):
        fn = {"record_gates": lambda: gates.record_gates(model, x),
              "gated_linear_model": lambda: pullbacks.gated_linear_model(model, x, 0, {}),
              "insens": lambda: projections.insens(model, x),
              "count_paths": lambda: paths.count_paths(model, input_shape=tuple(x.shape[1:])),
              "switched": lambda: projections.switched_projections(model, x)}[call]
        with pytest.raises(gates.UnsupportedLayerError, match=rf"\({name}\).*not piecewise linear"):
            fn()
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    # the pullback of the attention-only model runs, and is the value path alone
    v = pullbacks.excitation_pullback(attn_only, seq, 1)
    mha = attn_only.attn
    x = seq.clone().requires_grad_(True)
    e = mha.embed_dim
    vals = x @ mha.in_proj_weight[2 * e:].T + mha.in_proj_bias[2 * e:]
    with torch.no_grad():
        w = mha(x, x, x, average_attn_weights=False)[1]  # (N, heads, L, L), the module's own softmax weights
    o = torch.cat([w[:, j] @ vals[..., 4 * j:4 * j + 4] for j in range(2)], -1)
    out = attn_only.head((o @ mha.out_proj.weight.T + mha.out_proj.bias).mean(1))
    (ref,) = torch.autograd.grad(out[:, 1].sum(), x)
    assert torch.allclose(v, ref, rtol=1e-10, atol=1e-12)


class KeywordAttention(AttentionOnly):
    def forward(self, x):
        return self.head(self.attn(query=x, key=x, value=x, need_weights=False)[0].mean(1))


def test_attention_called_with_keywords():
    # inputs passed as keywords: the rule still applies, and what follows is still checked by the guard
    seq = torch.randn(2, 4, 8, dtype=torch.float64)
    a = AttentionOnly().double().eval()
    b = KeywordAttention().double().eval()
    b.load_state_dict(a.state_dict())
    with pullbacks.excitation_backward(b) as report:
        b(seq)
    assert report.attention_calls == 1
    assert torch.allclose(pullbacks.excitation_pullback(b, seq, 2), pullbacks.excitation_pullback(a, seq, 2),
                          rtol=1e-12, atol=1e-14)


class HandAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.head((torch.softmax(q @ k.transpose(1, 2), -1) @ v).mean(1))


class FunctionalNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x):
        return self.lin(F.layer_norm(x, (8,)).mean(1))


class OwnLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(2 * x)


def test_what_the_pullback_still_refuses():
    seq = torch.randn(2, 4, 8)
    for model, match in ((HandAttention(), "softmax.*write them with nn.MultiheadAttention"),
                         (FunctionalNorm(), "layer_norm.*nn.LayerNorm"),
                         (nn.Sequential(OwnLayerNorm(8), nn.Flatten(), nn.Linear(32, 3)), "overrides its forward"),
                         (nn.Sequential(nn.MultiheadAttention(8, 2, add_bias_kv=True)), "add_bias_kv")):
        with pytest.raises(gates.UnsupportedLayerError, match=match):
            pullbacks.excitation_pullback(model.eval(), seq, 0)
    train = AttentionOnly()
    train.attn.dropout = 0.1
    train.eval().attn.train()
    with pytest.raises(gates.UnsupportedLayerError, match="training mode"):
        pullbacks.excitation_pullback(train, seq, 0)
    with pytest.raises(ValueError, match="attention_temperature"):
        pullbacks.excitation_pullback(AttentionOnly().eval(), seq, 0, attention_temperature=0)
