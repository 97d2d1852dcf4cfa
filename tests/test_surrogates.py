"""Tests of dualview.surrogates: soft gates, the surrogate ReLU and soft max-pooling against autograd and
closed forms, and the SurrogateBackward rule inside gates.instrument."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import gates, surrogates


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 4), s=st.integers(1, 3), p=st.integers(0, 2), d=st.integers(1, 2),
       ceil=st.booleans(), h=st.integers(6, 11), w=st.integers(6, 11), tau=st.floats(0.05, 3.0),
       seed=st.integers(0, 1000))
def test_soft_pool_backward_is_gradient_of_softmax_pooling(k, s, p, d, ceil, h, w, tau, seed):
    assume(p <= k // 2)  # torch requires padding <= kernel / 2
    assume(d * (k - 1) + 1 <= min(h, w) + 2 * p)  # at least one window
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, h, w, dtype=torch.float64, generator=gen, requires_grad=True)
    kw = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    hard = F.max_pool2d(x, **kw)
    sur = surrogates.surrogate_max_pool(x, **kw, temperature=tau)
    soft = surrogates.soft_max_pool(x, **kw, temperature=tau)
    assert torch.equal(sur, hard)  # forward: max-pooling
    assert soft.shape == hard.shape
    g = torch.randn(hard.shape, dtype=torch.float64, generator=gen)
    (a,) = torch.autograd.grad(sur, x, g)
    (b,) = torch.autograd.grad(soft, x, g)
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)  # backward: softmax pooling's gradient


@pytest.mark.parametrize("k, size, one_d", [(2, (8, 8), False), (2, (7, 9), False), (3, (9, 6), False),
                                             ((2, 3), (8, 9), False), (2, (1, 10), True), (3, (1, 11), True)])
def test_pool_backward_on_windows_side_by_side(k, size, one_d):
    # windows side by side (stride = kernel, no padding, the pools of VGG and LeNet): the closed-form backward
    # must give softmax pooling's gradient (autograd through soft_max_pool), also where the input does not
    # divide into windows (the rest gets no gradient) and for activations large against tau
    gen = torch.Generator().manual_seed(sum(size))
    shape = (2, 3, size[1]) if one_d else (2, 3, *size)
    for scale in (1.0, 200.0):
        x = (scale * torch.randn(shape, dtype=torch.float64, generator=gen)).requires_grad_(True)
        kw = dict(kernel_size=k, one_d=one_d)
        sur = surrogates.surrogate_max_pool(x, **kw, temperature=0.3)
        soft = surrogates.soft_max_pool(x, **kw, temperature=0.3)
        hard = (F.max_pool1d if one_d else F.max_pool2d)(x, k)
        assert torch.equal(sur, hard)
        g = torch.randn(hard.shape, dtype=torch.float64, generator=gen)
        (a,) = torch.autograd.grad(sur, x, g)
        (b,) = torch.autograd.grad(soft, x, g)
        assert torch.isfinite(a).all()
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12 * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_general_pool_backward_with_padding_far_below_zero(dtype):
    # padded positions (padding, ceil_mode's overhang) must weigh nothing also where a window's maximum lies far
    # below zero (exp of (0 - max) / tau overflows): finite, and softmax pooling's gradient
    gen = torch.Generator().manual_seed(5)
    for kw in (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, stride=2, ceil_mode=True)):
        x = (torch.randn(2, 3, 5, 5, dtype=torch.float64, generator=gen) - 100).to(dtype).requires_grad_(True)
        sur = surrogates.surrogate_max_pool(x, **kw, temperature=0.3)
        soft = surrogates.soft_max_pool(x, **kw, temperature=0.3)
        g = torch.randn(sur.shape, dtype=torch.float64, generator=gen).to(dtype)
        (a,) = torch.autograd.grad(sur, x, g)
        (b,) = torch.autograd.grad(soft, x, g)
        assert torch.isfinite(a).all()
        # float32: both sides round (x_i - max) / tau with |x| near 100, about 1e-5 absolute
        tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-3, atol=1e-4)
        assert torch.allclose(a, b, **tol)


def test_pool_output_changed_in_place_afterwards():
    # the surrogate pool keeps its own copy of the maxima: an in-place change of its output (y += c, an in-place
    # ReLU after the pool) leaves the backward pass as it would be without the in-place change
    from dualview import pullbacks

    class Net(nn.Module):
        def __init__(self, inplace):
            super().__init__()
            self.inplace = inplace
            self.conv, self.pool = nn.Conv2d(1, 2, 3, padding=1), nn.MaxPool2d(2)
            self.relu, self.fc = nn.ReLU(inplace=inplace), nn.Linear(2 * 3 * 3, 3)

        def forward(self, x):
            y = self.pool(self.conv(x))
            if self.inplace:
                y += 0.5
            else:
                y = y + 0.5
            return self.fc(self.relu(y).flatten(1))

    torch.manual_seed(0)
    a, b = Net(True).eval(), Net(False).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 1, 6, 6)
    assert torch.allclose(pullbacks.excitation_pullback(a, x, 1), pullbacks.excitation_pullback(b, x, 1),
                          rtol=0, atol=1e-7)


def test_soft_pool_reference_values_and_limits():
    x = torch.tensor([[[[1.0, 2.0], [0.0, -1.0]]]], dtype=torch.float64)
    tau = 0.5
    w = torch.softmax(x.flatten() / tau, 0)
    assert torch.allclose(surrogates.soft_max_pool(x, 2, temperature=tau).flatten(), (w * x.flatten()).sum())
    assert torch.allclose(surrogates.soft_max_pool(x, 2, temperature=1e-3), F.max_pool2d(x, 2))
    # padding is excluded, not pooled as zeros: an all-negative window stays negative
    neg = -torch.ones(1, 1, 3, 3, dtype=torch.float64)
    assert torch.allclose(surrogates.soft_max_pool(neg, 3, stride=1, padding=1, temperature=0.3), -torch.ones_like(neg))


@settings(max_examples=20, deadline=None)
@given(tau=st.floats(0.05, 3.0), seed=st.integers(0, 1000))
def test_surrogate_relu_forward_is_relu_and_backward_is_the_soft_gate(tau, seed):
    z = torch.randn(40, dtype=torch.float64, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    out = surrogates.surrogate_relu(z, tau)
    assert torch.equal(out, torch.relu(z))
    (g,) = torch.autograd.grad(out.sum(), z)
    assert torch.allclose(g, 1 / (1 + torch.exp(-z.detach() / tau)), rtol=1e-12, atol=0)  # sigmoid by hand
    (g0,) = torch.autograd.grad(surrogates.surrogate_relu(z, 0).sum(), z)
    assert torch.equal(g0, (z > 0).double())  # temperature 0: the hard gate


def test_soft_gates():
    q = {"a": torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)}
    assert torch.equal(surrogates.soft_gates(q, 0)["a"], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    expected = torch.tensor([1 / (1 + 2.718281828459045 ** 2), 0.5, 1 / (1 + 2.718281828459045 ** -4)],
                            dtype=torch.float64)
    assert torch.allclose(surrogates.soft_gates(q, 0.5)["a"], expected, rtol=1e-12, atol=0)


def test_rule_counts_and_leaves_the_forward_unchanged():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(18, 3)).double().eval()
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    rule = surrogates.SurrogateBackward(0.3, pool_temperature=0)
    with torch.no_grad():
        ref = net(x)
    with gates.instrument(net, rule), torch.no_grad():
        out = net(x)
        out2 = net(x)
    assert torch.equal(out, ref) and torch.equal(out2, ref)
    assert (rule.relu_calls, rule.pool_calls, rule.functional_relu_calls) == (2, 2, 0)
    assert rule.temperature == 0.3 and rule.pool_temperature == 0.0
    assert surrogates.SurrogateBackward(0.2).pool_temperature == 0.2  # the ReLU's temperature by default


def test_errors():
    x = torch.rand(2, 3, 14, 14)
    with pytest.raises(ValueError, match="temperature > 0"):
        surrogates.soft_max_pool(x, 2, temperature=0)
    for bad in (-0.1, float("nan"), float("inf"), "0.3", True):
        with pytest.raises(ValueError, match="temperature"):
            surrogates.check_temperature(bad)
        with pytest.raises(ValueError, match="temperature"):
            surrogates.soft_gates({}, bad)
    with pytest.raises(ValueError, match="pool_temperature"):
        surrogates.SurrogateBackward(0.3, pool_temperature=-1)
    with pytest.raises(ValueError, match="max_pool2d expects"):
        surrogates.soft_max_pool(torch.rand(5), 2, temperature=0.3)


# --------------------------------------------------------------------------------------------------
# The follow-up's rules (surrogate="normal_cdf"): the authors' current code, 314-Foundation/SemanticPullbacks


def _phi(z: torch.Tensor) -> torch.Tensor:
    """The standard normal CDF, from scipy (independent of the library's erf formula)."""
    from scipy.stats import norm

    return torch.from_numpy(norm.cdf(z.detach().numpy()))


@settings(max_examples=20, deadline=None)
@given(tau=st.floats(0.05, 3.0), seed=st.integers(0, 1000))
def test_normal_cdf_surrogate_relu_backward_is_phi(tau, seed):
    z = torch.randn(40, dtype=torch.float64, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    out = surrogates.surrogate_relu(z, tau, surrogate="normal_cdf")
    assert torch.equal(out, torch.relu(z))
    (g,) = torch.autograd.grad(out.sum(), z)
    assert torch.allclose(g, _phi(z / tau), rtol=1e-10, atol=1e-15)
    assert torch.allclose(surrogates.relu_gate(z.detach(), tau, "normal_cdf"), _phi(z / tau), rtol=1e-10, atol=1e-15)
    assert torch.allclose(surrogates.soft_gates({"a": z.detach()}, tau, "normal_cdf")["a"], _phi(z / tau),
                          rtol=1e-10, atol=1e-15)


def test_normal_cdf_clipped_gate():
    q = torch.linspace(-3, 9, 49, dtype=torch.float64)
    got = surrogates.clipped_soft_gate(q, 6.0, 0.6, "normal_cdf")
    assert torch.allclose(got, _phi(q / 0.6) - _phi((q - 6) / 0.6), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("k, s, p", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_fixed_weight_pool_backward_is_the_follow_ups_soft_pool(k, s, p):
    # the follow-up's SoftMaxPool2d: sum_i x_i * stopgrad(softmax(x / tau)_i) over each window (no padding in
    # the windows here, where its F.unfold would pool zeros), straight-through beside the hard max-pool
    gen = torch.Generator().manual_seed(k + s + p)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, generator=gen, requires_grad=True)
    out = surrogates.surrogate_max_pool(x, k, s, p, temperature=0.3, fixed_weights=True)
    hard = F.max_pool2d(x, k, s, p)
    assert torch.equal(out, hard)
    g = torch.randn(hard.shape, dtype=torch.float64, generator=gen)
    (got,) = torch.autograd.grad(out, x, g)
    cols = F.unfold(x, k, stride=s, padding=p).view(2, 3, k * k, -1)
    padmask = F.unfold(torch.ones(1, 1, 9, 9, dtype=torch.float64), k, stride=s, padding=p).view(1, 1, k * k, -1)
    w = torch.softmax((cols / 0.3).masked_fill(padmask == 0, float("-inf")), 2).detach()
    soft = (cols * w).sum(2).view_as(hard)
    (ref,) = torch.autograd.grad(soft, x, g)
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12)
    (listing2,) = torch.autograd.grad(surrogates.surrogate_max_pool(x, k, s, p, temperature=0.3), x, g)
    assert not torch.allclose(got, listing2)  # not the seed paper's pool backward


def test_normal_cdf_pullback_is_the_follow_ups_formula():
    # a CNN with ReLUs (module and functional), a max-pool and a ReLU6, pulled back with the follow-up's rules
    # at their defaults (ReLU: Phi(z / 0.6), max-pool: fixed softmax weights at 0.3), against a forward written
    # out with the follow-up's FGI construction: y = x * stopgrad(gate) - stopgrad(x * gate) + stopgrad(relu(x))
    from dualview import explain, pullbacks

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.relu, self.pool = nn.Conv2d(2, 4, 3), nn.ReLU(), nn.MaxPool2d(2)
            self.c2, self.clip, self.fc = nn.Conv2d(4, 4, 3), nn.ReLU6(), nn.Linear(4 * 9, 3)

        def forward(self, x):
            h = self.pool(self.relu(self.c1(x)))
            return self.fc(F.relu(self.clip(self.c2(h)) - 1).flatten(1))

    torch.manual_seed(0)
    net = Net().double().eval()
    x = torch.randn(3, 2, 12, 12, dtype=torch.float64) * 3

    def fgi(z, gate, forward):
        mul = z * gate.detach()
        return mul - mul.detach() + forward.detach()

    def soft_pool(z):
        cols = F.unfold(z, 2, stride=2).view(z.shape[0], z.shape[1], 4, -1)
        soft = (cols * torch.softmax(cols / 0.3, 2).detach()).sum(2).view(*z.shape[:2], 5, 5)
        return F.max_pool2d(z, 2).detach() + (soft - soft.detach())

    xg = x.clone().requires_grad_(True)
    q1 = net.c1(xg)
    h = soft_pool(fgi(q1, _phi(q1 / 0.6), torch.relu(q1)))
    q2 = net.c2(h)
    c = fgi(q2, _phi(q2 / 0.6) - _phi((q2 - 6) / 0.6), F.relu6(q2)) - 1
    out = net.fc(fgi(c, _phi(c / 0.6), torch.relu(c)).flatten(1))
    (ref,) = torch.autograd.grad(out[:, 1].sum(), xg)

    got = pullbacks.excitation_pullback(net, x, 1, surrogate="normal_cdf")
    assert torch.allclose(got, ref, rtol=1e-9, atol=1e-12)
    assert torch.equal(got, pullbacks.excitation_pullback(net, x, 1, temperature=0.6, pool_temperature=0.3,
                                                          surrogate="normal_cdf"))
    assert torch.equal(got, explain.attribute(net, x, 1, "pullback", surrogate="normal_cdf"))
    # the default stays the seed paper's sigmoid(z / 0.3), and differs
    paper = pullbacks.excitation_pullback(net, x, 1)
    assert torch.equal(paper, pullbacks.excitation_pullback(net, x, 1, temperature=0.3, surrogate="sigmoid"))
    assert not torch.allclose(paper, got, rtol=1e-3)
    gates_phi = pullbacks.excitation_gates(nn.Sequential(net.c1, net.relu), x, surrogate="normal_cdf")
    assert torch.allclose(gates_phi["1"], _phi(net.c1(x) / 0.6), rtol=1e-10, atol=1e-15)


def test_surrogate_errors():
    with pytest.raises(ValueError, match="'sigmoid', 'normal_cdf'"):
        surrogates.check_surrogate("gauss")
    with pytest.raises(ValueError, match="surrogate must be"):
        surrogates.SurrogateBackward(0.3, surrogate="erf")
    net = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 2)).eval()
    from dualview import pullbacks

    with pytest.raises(ValueError, match="surrogate must be"):
        pullbacks.excitation_pullback(net, torch.rand(2, 3), 0, surrogate="Phi")
    rule = surrogates.SurrogateBackward(0.6, surrogate="normal_cdf")
    assert rule.pool_temperature == 0.3 and surrogates.SurrogateBackward(0.6).pool_temperature == 0.6
