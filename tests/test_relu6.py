"""Hard-clipped ReLUs (nn.ReLU6, nn.Hardtanh(0, t)) in the dual view, exactly (issue 26).

``min(max(q, 0), t) = q * G + t * H`` with the gate ``G = 1{0 < q < t}`` and the saturated piece ``H = 1{q >= t}``:
with both held fixed the network is affine. Every check compares with a computation written out here by hand
(a forward with the pieces fixed, autograd through the real network, a materialised Jacobian)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dualview import dgn, explain, gates, npk, paths, projections, pullbacks

def widen(model: nn.Sequential) -> nn.Sequential:
    """float64, eval, weights tripled: the pre-activations reach past the ceilings."""
    with torch.no_grad():
        for m in model:
            if hasattr(m, "weight"):
                m.weight.mul_(3.0)
    return model.double().eval()


def mlp(ceiling: float = 6.0) -> nn.Sequential:
    clip = nn.ReLU6 if ceiling == 6.0 else (lambda: nn.Hardtanh(0.0, ceiling))
    torch.manual_seed(0)
    return widen(nn.Sequential(nn.Linear(5, 8), clip(), nn.Linear(8, 8), clip(), nn.Linear(8, 3)))


def cnn() -> nn.Sequential:
    torch.manual_seed(1)
    return widen(nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU6(), nn.Conv2d(4, 4, 3, padding=1),
                               nn.ReLU6(inplace=True), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, 3)))


def spread(shape, scale, seed=2):
    """Inputs spread wide enough that every unit meets all three pieces somewhere in the batch."""
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def pieces(model, x):
    rec = gates.record_gates(model, x)
    ceil = rec.ceilings
    for k, q in rec.preactivations.items():
        t = ceil[k]
        assert (q <= 0).any() and ((q > 0) & (q < t)).any() and (q >= t).any(), f"{k}: a piece never occurs"
    return rec


def by_hand_mlp(model, x, g, h):
    """The MLP with each clipped layer's pieces fixed: z = q * G + t * H."""
    lin = [m for m in model if isinstance(m, nn.Linear)]
    t = [float(m.max_val) for m in model if isinstance(m, nn.Hardtanh)]
    z, qs = x, []
    for k in range(2):
        q = z @ lin[k].weight.T + lin[k].bias
        qs.append(q)
        z = q * g[k] + t[k] * h[k]
    return z @ lin[2].weight.T + lin[2].bias, qs


def by_hand_cnn(model, x, g, h):
    c1, _, c2, _, _, _, fc = model
    q1 = F.conv2d(x, c1.weight, c1.bias, padding=1)
    z1 = q1 * g[0] + 6.0 * h[0]
    q2 = F.conv2d(z1, c2.weight, c2.bias, padding=1)
    z2 = q2 * g[1] + 6.0 * h[1]
    return F.avg_pool2d(z2, 2).flatten(1) @ fc.weight.T + fc.bias, [q1, q2]


CASES = [(mlp, (40, 5), 4.0, by_hand_mlp), (lambda: mlp(2.5), (40, 5), 2.0, by_hand_mlp),
         (cnn, (6, 2, 4, 4), 4.0, by_hand_cnn)]


@pytest.mark.parametrize("make,shape,scale,hand", CASES)
def test_gates_and_saturation_are_the_pieces_and_the_forward_is_unchanged(make, shape, scale, hand):
    model, x = make(), spread(shape, scale)
    rec = pieces(model, x)
    with torch.no_grad():
        out = model(x.clone())
    torch.testing.assert_close(rec.output, out, rtol=0, atol=0)
    # by hand: gate = 0 < q < t, saturated = q >= t, and the network is q * G + t * H with them
    g = [((q > 0) & (q < rec.ceilings[k])).double() for k, q in rec.preactivations.items()]
    h = [(q >= rec.ceilings[k]).double() for k, q in rec.preactivations.items()]
    for k, gk, hk in zip(rec.names, g, h):
        torch.testing.assert_close(rec.gates[k].double(), gk)
        torch.testing.assert_close(rec.saturated[k].double(), hk)
    torch.testing.assert_close(hand(model, x, g, h)[0], out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make,shape,scale,hand", CASES)
def test_switched_linear_model_is_the_gradient_and_reproduces_the_network(make, shape, scale, hand):
    """(a) w . x + b = model(x) and w = autograd's gradient through the real network, per logit."""
    model, x = make(), spread(shape, scale)
    rec = pieces(model, x)
    xg = x.clone().requires_grad_(True)
    out = model(xg)
    for target in range(3):
        (grad,) = torch.autograd.grad(out[:, target].sum(), xg, retain_graph=True)
        glm = pullbacks.gated_linear_model(model, x, target, {k: v.double() for k, v in rec.gates.items()})
        torch.testing.assert_close(glm.weight, grad, rtol=1e-10, atol=1e-12)
        lhs = (glm.weight * x).flatten(1).sum(1) + glm.bias
        torch.testing.assert_close(lhs, out[:, target].detach(), rtol=1e-10, atol=1e-10)
    # the hidden neurons' switched weights: autograd per neuron (the reference) and Theorem 1
    p, ref = projections.switched_projections(model, x), projections.switched_projections_reference(model, x)
    torch.testing.assert_close(p.weight, ref.weight, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(p.bias, ref.bias, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close((p.weight * p.x[:, None]).sum(-1) + p.bias, p.preactivation, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("make,shape,scale,hand", CASES)
def test_imposed_pieces_of_another_input_match_a_hand_written_forward(make, shape, scale, hand):
    """(b) run_with_gates(model, x, G(x'), saturated=H(x')) is the network with x''s pieces fixed, applied to x."""
    model, x, other = make(), spread(shape, scale), spread(shape, scale, seed=7)
    rec = pieces(model, other)
    out = gates.run_with_gates(model, x, rec.gates, saturated=rec.saturated)
    g = [v.double() for v in rec.gates.values()]
    h = [v.double() for v in rec.saturated.values()]
    expected = hand(model, x, g, h)[0]
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        assert (out - model(x)).abs().max() > 1e-3  # the pieces of x' are not those of x: a real test
    with pytest.raises(KeyError, match="saturated"):  # without the constant pieces: refused, not guessed
        gates.run_with_gates(model, x, rec.gates)


@pytest.mark.parametrize("make,shape,scale,hand", CASES)
@pytest.mark.parametrize("structure", [True, False])
def test_insens_equals_the_materialised_jacobian(make, shape, scale, hand, structure):
    """(c) Insens (Eq. 7-8): the mean over q_i <= 0 (the paper's inactive state; saturated units excluded) of
    q_i w_i / |w_i|^2, with w_i rows of the Jacobian of the hand-written frozen network."""
    model, x = make(), spread(shape, scale)[:4]
    rec = gates.record_gates(model, x)
    g = [v.double() for v in rec.gates.values()]
    h = [v.double() for v in rec.saturated.values()]
    omega = torch.zeros_like(x)
    n_inactive = []
    for s in range(len(x)):
        def hidden(z, s=s):
            qs = hand(model, z[None], [v[s:s + 1] for v in g], [v[s:s + 1] for v in h])[1]
            return torch.cat([q.flatten() for q in qs])
        jac = torch.func.jacrev(hidden)(x[s]).reshape(-1, x[s].numel())  # (U, d)
        q = hidden(x[s])
        sq = jac.square().sum(1)
        inactive = (q <= 0) & (sq > 0)
        n_inactive.append(int(inactive.sum()))
        omega[s] = ((q[inactive] / sq[inactive])[:, None] * jac[inactive]).sum(0).view_as(x[s]) / inactive.sum()
    assert all(k > 0 for k in n_inactive)
    result = projections.insens(model, x, structure=structure)
    torch.testing.assert_close(result.omega, omega, rtol=1e-9, atol=1e-12)
    assert result.n_inactive.tolist() == n_inactive
    torch.testing.assert_close(projections.insens_reference(model, x).omega, omega, rtol=1e-9, atol=1e-12)


def test_ties_follow_pytorchs_backward():
    """At q = 0 and q = t the slope is 0 (PyTorch's hardtanh backward); the output at q = t is t (saturated)."""
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU6(), nn.Linear(3, 1)).double().eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3))
        model[0].bias.zero_()
    x = torch.tensor([[0.0, 6.0, 3.0]], dtype=torch.float64)
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.relu6(xg).sum(), xg)
    assert grad.tolist() == [[0.0, 0.0, 1.0]]
    rec = gates.record_gates(model, x)
    assert rec.gates["1"].tolist() == [[False, False, True]] and rec.saturated["1"].tolist() == [[False, True, False]]
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xg).sum(), xg)
    glm = pullbacks.gated_linear_model(model, x, 0, {k: v.double() for k, v in rec.gates.items()})
    torch.testing.assert_close(glm.weight, grad, rtol=0, atol=0)
    torch.testing.assert_close(glm.output, model(x)[:, 0].detach())


def test_excitation_pullback_of_a_clipped_relu_is_its_gated_linear_model():
    """The surrogate backward (sigmoid(q/tau) - sigmoid((q - t)/tau) at each ReLU6) equals the weight of the gated
    linear model with those soft gates held fixed; at tau = 0 both are the gradient."""
    model, x = mlp(), spread((40, 5), 4.0)
    for tau in (0.3, 0.0):
        v = pullbacks.excitation_pullback(model, x, 1, temperature=tau)
        soft = pullbacks.excitation_gates(model, x, tau)
        q = gates.record_gates(model, x).preactivations["1"]
        torch.testing.assert_close(soft["1"], torch.sigmoid(q / tau) - torch.sigmoid((q - 6) / tau) if tau else
                                   ((q > 0) & (q < 6)).double())
        glm = pullbacks.gated_linear_model(model, x, 1, soft)
        torch.testing.assert_close(v, glm.weight, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make,name", [
    (lambda: nn.Sequential(nn.Linear(4, 6), nn.Hardtanh(), nn.Linear(6, 2)), r"\[-1, 1\]"),
    (lambda: nn.Sequential(nn.Linear(4, 6), nn.Hardtanh(-2.0, 0.0), nn.Linear(6, 2)), "clips"),
])
def test_hardtanh_with_another_floor_is_refused(make, name):
    with pytest.raises(gates.UnsupportedLayerError, match=name):
        gates.record_gates(make().eval(), torch.randn(2, 4))


def test_functions_for_relu_networks_refuse_clipped_relus():
    """Path counts, kernels and gated networks are defined for ReLU networks: a ReLU6 is refused by name."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU6(), nn.Linear(6, 6), nn.ReLU6(), nn.Linear(6, 2)).eval()
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="ReLU6"):
        paths.count_paths(model, x)
    with pytest.raises(TypeError, match="ReLU6"):
        paths.neural_path_features(model, x)
    with pytest.raises(gates.UnsupportedLayerError, match="ReLU network"):
        npk.npk(model, x, x)
    with pytest.raises(gates.UnsupportedLayerError, match="ReLU6"):
        dgn.GatedNetwork(model, model)


def test_mobilenet_v2_runs_through_pullbacks_and_gated_linear_models():
    """(d) torchvision's MobileNetV2 (random weights, eval, 64 x 64): its ReLU6s are gates plus constants; the
    pullback equals the gated linear model of the soft gates, the hard-gated one is the gradient and
    reproduces the logit (each object checks itself too)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(num_classes=10).double().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # BatchNorm with fresh statistics is the identity: inputs of scale 20 drive units past the ceiling
    x = 20 * torch.randn(1, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rec = gates.record_gates(model, x)
    assert len(rec.ceilings) == 35 and set(rec.ceilings.values()) == {6.0}
    assert any(bool(h.any()) for h in rec.saturated.values())  # some units saturate: the constant piece matters
    v = explain.attribute(model, x, 3, "pullback")
    glm = pullbacks.gated_linear_model(model, x, 3, pullbacks.excitation_gates(model, x))
    torch.testing.assert_close(v, glm.weight, rtol=1e-8, atol=1e-12)
    hard = pullbacks.gated_linear_model(model, x, 3, {k: g.double() for k, g in rec.gates.items()})
    xg = x.clone().requires_grad_(True)
    out = model(xg)
    (grad,) = torch.autograd.grad(out[:, 3].sum(), xg)
    torch.testing.assert_close(hard.weight, grad, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close((hard.weight * x).flatten(1).sum(1) + hard.bias, out[:, 3].detach(),
                               rtol=1e-9, atol=1e-9)
    for k, value in model.state_dict().items():
        assert torch.equal(value, before[k]), k
    assert all(m.inplace for m in model.modules() if isinstance(m, nn.ReLU6))
