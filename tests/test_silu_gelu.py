"""Excitation pullbacks through SiLU and GELU (issue 26): a surrogate backward, not an exact dual view.

A SiLU (GELU) unit's derivative becomes its gate ``sigmoid(q / tau)`` (``Phi(q / tau)``), a
squeeze-and-excitation block's scale is held fixed, the forward unchanged. Every pullback is compared with
autograd through a network written out here by hand, in which each such unit computes ``silu(q)`` forward
but passes ``gate(q)`` backward (``held``), and each ReLU ``relu(q)`` forward but ``sigmoid(q / 0.3)``
backward. The exact dual view keeps refusing them."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dualview import dgn, explain, gates, npk, paths, projections, pullbacks
from tiny_models import spread_batchnorm


def held(q, out, gate):
    """``out`` forward, ``d/dq = gate`` backward (gate held fixed): autograd of ``q * stopgrad(gate)`` plus a
    constant that makes the value ``out``."""
    return out.detach() + (q - q.detach()) * gate.detach()


def silu_gate(q, tau=1.6):
    return torch.sigmoid(q / tau)


def gelu_gate(q, tau=1.0):
    return 0.5 * (1 + torch.erf(q / (tau * math.sqrt(2))))


def relu_surrogate(q, tau=0.3):
    return held(q, F.relu(q), torch.sigmoid(q / tau))


def mlp(act: type[nn.Module]) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), act(), nn.Linear(8, 8), act(), nn.Linear(8, 3)).double().eval()


def mlp_by_hand(model, x, gate):
    act = F.silu if gate is silu_gate else F.gelu
    h = x
    for i in (0, 2):
        q = model[i](h)
        h = held(q, act(q), gate(q))
    return model[4](h)


def cnn() -> nn.Sequential:
    """SiLU (in place), ReLU and GELU in one network, with a BatchNorm in eval mode and average pooling."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.SiLU(inplace=True),
                          nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.GELU(),
                          nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, 3))
    return spread_batchnorm(model, weight=None, bias=None).double().eval()


def cnn_by_hand(model, x):
    q = model[1](model[0](x))
    h = held(q, F.silu(q), silu_gate(q))
    h = relu_surrogate(model[3](h))
    q = model[5](h)
    h = held(q, F.gelu(q), gelu_gate(q))
    return model[9](F.avg_pool2d(h, 2).flatten(1))


def autograd_pullback(forward, x, target):
    xg = x.clone().requires_grad_(True)
    out = forward(xg)
    (v,) = torch.autograd.grad(out.gather(1, torch.as_tensor(target)[:, None]).sum(), xg)
    return v, out.detach()


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [m.training for m in model.modules()]


def assert_unchanged(model, before):
    state, modes = before
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert [m.training for m in model.modules()] == modes


X_MLP = 2 * torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
T_MLP = [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("act, gate", [(nn.SiLU, silu_gate), (nn.GELU, gelu_gate)])
def test_mlp_pullback_is_the_hand_written_surrogate_backward(act, gate):
    model = mlp(act)
    before = snapshot(model)
    v = explain.attribute(model, X_MLP, T_MLP, "pullback")
    ref, out = autograd_pullback(lambda z: mlp_by_hand(model, z, gate), X_MLP, T_MLP)
    torch.testing.assert_close(out, model(X_MLP), rtol=1e-12, atol=1e-12)  # the forward is the network's
    torch.testing.assert_close(v, ref, rtol=1e-10, atol=1e-12)
    grad, _ = autograd_pullback(model, X_MLP, T_MLP)
    assert (v - grad).norm() > 1e-3 * grad.norm()  # a surrogate: not the gradient
    assert_unchanged(model, before)


def test_silu_at_temperature_one_is_the_derivative_of_q_times_stopgrad_sigmoid():
    """With ``smooth_temperature=1`` the SiLU's gate is its own sigmoid: ``q * sigmoid(q).detach()`` is the
    SiLU forward, and its gradient is the pullback."""
    model = mlp(nn.SiLU)

    def by_hand(z):
        for i in (0, 2):
            q = model[i](z)
            z = q * torch.sigmoid(q).detach()
        return model[4](z)

    v = pullbacks.excitation_pullback(model, X_MLP, T_MLP, smooth_temperature=1.0)
    torch.testing.assert_close(v, autograd_pullback(by_hand, X_MLP, T_MLP)[0], rtol=1e-10, atol=1e-12)


def test_cnn_mixing_relu_silu_and_gelu():
    """ReLU units keep their own surrogate sigmoid(q / 0.3); SiLU (in place) and GELU get theirs."""
    model = cnn()
    before = snapshot(model)
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with pullbacks.excitation_backward(model) as report:
        xg = x.clone().requires_grad_(True)
        out = model(xg)
    assert report.smooth_calls == 2 and report.relu_calls == 1
    v = explain.attribute(model, x, [2, 0, 1], "pullback")
    ref, ref_out = autograd_pullback(lambda z: cnn_by_hand(model, z), x, [2, 0, 1])
    torch.testing.assert_close(ref_out, out.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v, ref, rtol=1e-10, atol=1e-12)
    assert_unchanged(model, before)
    assert model[2].inplace


def test_squeeze_excitation_scale_is_held_fixed():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(4)
    se = torchvision.ops.SqueezeExcitation(4, 2, activation=nn.SiLU)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.SiLU(), se, nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 3)).double().eval()
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def by_hand(z):
        q = model[0](z)
        h = held(q, F.silu(q), silu_gate(q))
        s = torch.sigmoid(se.fc2(F.silu(se.fc1(h.mean((2, 3), keepdim=True)))))
        return model[5](model[3](h * s.detach()).flatten(1))

    v = explain.attribute(model, x, [1, 2], "pullback")
    ref, out = autograd_pullback(by_hand, x, [1, 2])
    torch.testing.assert_close(out, model(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v, ref, rtol=1e-10, atol=1e-12)


def test_efficientnet_b0_pullback_runs_and_leaves_the_model_unchanged():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(num_classes=10).eval()
    before = snapshot(model)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    v = explain.attribute(model, x, [3, 7], "pullback")
    assert v.shape == x.shape and bool(torch.isfinite(v).all()) and v.abs().sum() > 0
    assert_unchanged(model, before)
    assert all(m.inplace for m in model.modules() if isinstance(m, nn.SiLU))
    with pytest.raises(gates.UnsupportedLayerError, match="smooth activation"):
        explain.attribute(model, x, [3, 7], "insens")
    assert_unchanged(model, before)


@pytest.mark.parametrize("act", [nn.SiLU, nn.GELU])
def test_the_exact_dual_view_still_refuses_them(act):
    """Not piecewise linear: recorded gates, gated linear models, switched projections, Insens, path counts,
    NPK and gated networks refuse SiLU and GELU by name (a functional F.gelu inside a forward is refused even
    by pullbacks: tests/test_pullbacks.py::test_errors)."""
    model = mlp(act).float()
    x = torch.randn(3, 5)
    name = act.__name__
    for call in (lambda: gates.record_gates(model, x), lambda: pullbacks.excitation_gates(model, x),
                 lambda: pullbacks.gated_linear_model(model, x, 0, {}),
                 lambda: projections.switched_projections(model, x), lambda: projections.insens(model, x),
                 lambda: dgn.GatedNetwork(model, model)):
        with pytest.raises(gates.UnsupportedLayerError, match=name):
            call()
    with pytest.raises(gates.UnsupportedLayerError, match="ReLU network"):  # kernels of ReLU networks only
        npk.npk(model, x, x)
    with pytest.raises(TypeError, match=name):
        paths.count_paths(model, x)


def test_bad_smooth_temperature_is_refused():
    with pytest.raises(ValueError, match="smooth_temperature"):
        explain.attribute(mlp(nn.SiLU), X_MLP, 0, "pullback", smooth_temperature=-1.0)
