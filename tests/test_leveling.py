"""Feature leveling: hard-concrete routing gates, the leveling network, pruning, level splits, IXOR."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import leveling as lv


def trained_like(model: lv.FeatureLevelingNet, seed: int, dead_layer: int | None = None) -> lv.FeatureLevelingNet:
    """Give a network random weights and a random mix of routing decisions (some layers dead)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        for k, gate in enumerate(model.routing):
            la = 4 * torch.randn(gate.n, generator=g, dtype=gate.log_alpha.dtype)
            if dead_layer is not None and k == dead_layer:
                la = -torch.ones_like(la)
            gate.log_alpha.copy_(la)
    return model.eval()


# ------------------------------------------------------------------ hard-concrete routing gates


@pytest.mark.parametrize("log_alpha", [-2.0, 0.0, 1.5])
def test_hard_concrete_point_masses_match_closed_forms(log_alpha):
    torch.manual_seed(0)
    gate = lv.HardConcreteGate(1, init_log_alpha=log_alpha).double()
    n = 40_000
    z = gate.sample((n,))[:, 0]
    for empirical, exact in [((z == 0).double().mean(), gate.prob_zero().detach()[0]),
                             ((z == 1).double().mean(), gate.prob_one().detach()[0])]:
        sd = math.sqrt(float(exact) * (1 - float(exact)) / n)
        assert abs(empirical - exact) < 5 * sd, (empirical, exact)
    assert ((z >= 0) & (z <= 1)).all()
    # closed forms written out with the book's constants
    s0 = torch.sigmoid(torch.tensor(2 / 3 * math.log(0.1 / 1.1) - log_alpha, dtype=torch.float64))
    assert torch.isclose(gate.prob_zero()[0], s0)


def test_expected_l0_matches_monte_carlo():
    torch.manual_seed(1)
    gate = lv.HardConcreteGate(5).double()
    with torch.no_grad():
        gate.log_alpha.copy_(torch.tensor([-3.0, -1.0, 0.0, 1.0, 3.0]))
    z = gate.sample((40_000,))
    mc = (z != 0).double().sum(1).mean()
    sd = (z != 0).double().sum(1).std() / math.sqrt(len(z))
    assert abs(mc - gate.expected_l0()) < 5 * sd


def test_deterministic_gate_and_gradients():
    gate = lv.HardConcreteGate(3)
    with torch.no_grad():
        gate.log_alpha.copy_(torch.tensor([-5.0, 0.0, 5.0]))
    gate.eval()
    torch.testing.assert_close(gate(), torch.tensor([0.0, 0.5, 1.0]))
    gate.train()
    gate.expected_l0().backward()
    assert gate.log_alpha.grad is not None and (gate.log_alpha.grad > 0).all()


@pytest.mark.parametrize("kwargs", [dict(n=0), dict(n=2.5), dict(n=3, beta=0.0), dict(n=3, gamma=0.1),
                                    dict(n=3, zeta=1.0)])
def test_hard_concrete_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        lv.HardConcreteGate(**kwargs)


# ------------------------------------------------------------------ the leveling network


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 5))
def test_routing_is_mutually_exclusive(seed, n):
    model = trained_like(lv.FeatureLevelingNet([6, 5, 4], 3).double(), seed)
    x = torch.randn(n, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    parts = model.glm_inputs(x)
    # what reaches the GLM layer from each layer's input is exactly the part with routing gate 0
    h = x
    for k, z in enumerate(model.routing_gates()):
        assert set(z.unique().tolist()) <= {0.0, 1.0}
        torch.testing.assert_close(parts[k], h * (z == 0))
        assert ((parts[k] != 0) & (z == 1)).sum() == 0  # nothing routed deeper reaches the GLM
        h = model.relus[k](model.hidden[k](h * z))
    # in training, a sampled gate of exactly 0 or 1 sends the feature one way only
    model.train()
    torch.manual_seed(seed)
    z = model.routing[0].sample((1000,))
    assert ((z == 0) | (z == 1)).double().mean() > 0.2


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), rule=st.sampled_from(lv.ROUTING_RULES), per_sample=st.booleans())
def test_glm_inputs_match_the_slow_reference_with_fractional_routing_gates(seed, rule, per_sample):
    model = trained_like(lv.FeatureLevelingNet([5, 4, 3], 2, rule=rule).double(), seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 5, dtype=torch.float64, generator=g)
    # routing gates as in training: a mix of exact 0, exact 1 and fractional values, per sample or shared
    routing = []
    for gate in model.routing:
        shape = (6, gate.n) if per_sample else (gate.n,)
        z = torch.rand(shape, generator=g, dtype=torch.float64)
        z[z < 0.3] = 0.0
        z[z > 0.7] = 1.0
        routing.append(z)
    fast = model.glm_inputs(x, routing)
    slow = lv.glm_inputs_reference(model, x, routing)
    assert len(fast) == len(slow) == 3
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_binary_rule_is_exclusive_in_training_and_complement_is_not(seed):
    """Eq. 4 of the paper: a feature reaches the GLM layer iff its routing gate is exactly 0."""
    torch.manual_seed(seed)
    x = torch.randn(2000, 6, dtype=torch.float64) + 3.0  # no zero features
    binary = lv.FeatureLevelingNet([6, 5], 2, init_log_alpha=0.0).double().train()
    complement = lv.FeatureLevelingNet([6, 5], 2, init_log_alpha=0.0, rule="complement").double()
    complement.load_state_dict(binary.state_dict())
    complement.train()
    z = binary.routing[0].sample((2000,))
    fractional = (z > 0) & (z < 1)
    assert fractional.any() and (z == 0).any()
    to_glm_b = binary.glm_inputs(x, [z])[0]
    to_glm_c = complement.glm_inputs(x, [z])[0]
    # binary: the GLM copy is the feature where z == 0 and nothing else; never both ways
    torch.testing.assert_close(to_glm_b, x * (z == 0))
    assert not ((to_glm_b != 0) & (z > 0)).any()
    # complement: fractional gates send a feature both ways
    assert ((to_glm_c != 0) & fractional).sum() == fractional.sum()
    # at test time the two rules compute the same function
    binary.eval(), complement.eval()
    torch.testing.assert_close(binary(x), complement(x))
    # no gradient reaches the routing gate through the GLM copy under the binary rule (B is a step);
    # under the complement rule it is -x
    zg = z.clone().requires_grad_(True)
    assert not binary.glm_inputs(x, [zg])[0].requires_grad
    g_c, = torch.autograd.grad(complement.glm_inputs(x, [zg])[0].sum(), zg)
    torch.testing.assert_close(g_c, -x)


def test_bad_rule_is_rejected():
    with pytest.raises(ValueError, match="rule"):
        lv.FeatureLevelingNet([3, 2], 2, rule="soft")
    with pytest.raises(ValueError, match="rule"):
        lv.ConvFeatureLevelingNet(1, [2], 8, 2, rule="both")


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_all_routing_gates_one_is_the_plain_fcnn(seed):
    model = trained_like(lv.FeatureLevelingNet([5, 7, 4], 2).double(), seed)
    x = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    ones = [torch.ones(g.n, dtype=torch.float64) for g in model.routing]
    torch.testing.assert_close(model(x, routing=ones), model.hidden_part()(x))
    with torch.no_grad():
        for g in model.routing:
            g.log_alpha.fill_(10.0)
    torch.testing.assert_close(model(x), model.hidden_part()(x))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), dead=st.sampled_from([None, 0, 1, 2]))
def test_pruning_keeps_the_test_time_function(seed, dead):
    model = trained_like(lv.FeatureLevelingNet([6, 8, 5, 4], 3).double(), seed, dead_layer=dead)
    x = torch.randn(10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    pruned = lv.prune(model)
    torch.testing.assert_close(pruned(x), model(x))
    summary = lv.routing_summary(model)
    assert pruned.depth == summary.depth
    if dead is not None:
        assert pruned.depth <= dead


def test_pruning_on_real_digits(digits_small):
    x = digits_small[0]
    model = trained_like(lv.FeatureLevelingNet([64, 20, 10], 10).double(), 3, dead_layer=1)
    pruned = lv.prune(model)
    torch.testing.assert_close(pruned(x), model(x))
    d = int(model.routing_gates()[0].sum())
    assert pruned.architecture == f"{d}-20*-10"
    # parameters: d*20 + 20 (layer 1) and (64 - d + 20) * 10 + 10 (GLM)
    assert pruned.num_parameters() == d * 20 + 20 + (64 - d + 20) * 10 + 10
    assert pruned.num_parameters(bias=False) == d * 20 + (64 - d + 20) * 10


def test_architecture_string_matches_the_paper_notation():
    model = lv.FeatureLevelingNet([13, 64, 32], 1)
    with torch.no_grad():
        model.routing[0].log_alpha.copy_(torch.tensor([5.0] * 10 + [-5.0] * 3))
        model.routing[1].log_alpha.copy_(torch.tensor([5.0] * 28 + [-5.0] * 36))
    assert lv.prune(model).architecture == "10-28-32*-1"
    with torch.no_grad():
        model.routing[0].log_alpha.fill_(-5.0)
    assert lv.prune(model).architecture == "13*-1"
    x = torch.randn(4, 13)
    torch.testing.assert_close(lv.prune(model.eval())(x), model(x))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_level_contributions_add_up_and_gradients_add_up(seed):
    model = trained_like(lv.FeatureLevelingNet([5, 6, 4], 3).double(), seed)
    x = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    contrib = lv.level_contributions(model, x)
    assert contrib.shape == (7, 3, 3)
    torch.testing.assert_close(contrib.sum(1) + model.glm.bias, model(x))
    target = torch.arange(7) % 3
    grads = lv.level_gradients(model, x, target)
    full = torch.func.vmap(torch.func.jacrev(lambda v: model(v[None])[0]))(x)  # (N, out, in)
    torch.testing.assert_close(grads.sum(1), full[torch.arange(7), target])
    # level 1 is linear: its gradient is the GLM weight row of the inputs routed to it
    z0 = model.routing_gates()[0]
    torch.testing.assert_close(grads[:, 0], model.glm.weight[target, :5] * (z0 == 0))
    # the pruned network has the same split; levels behind a layer whose routing gates are all closed
    # receive a constant input, which pruning folds into the GLM bias
    pruned = lv.prune(model)
    kept = lv.level_contributions(pruned, x)
    n = kept.shape[1]
    torch.testing.assert_close(kept, contrib[:, :n])
    torch.testing.assert_close(pruned.glm.bias.expand(7, 3), model.glm.bias + contrib[:, n:].sum(1))


def test_conv_variant_routes_channels_and_matches_the_cnn():
    torch.manual_seed(0)
    model = lv.ConvFeatureLevelingNet(1, [3, 4], 8, 5).double().eval()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    assert model(x).shape == (2, 5)
    parts = model.glm_inputs(x)
    assert [p.shape[1] for p in parts] == model.level_sizes == [64, 16, 4 * 2 * 2]
    # all routing gates 1: the conv stack followed by the GLM block of the last layer
    ones = [torch.ones(g.n, dtype=torch.float64) for g in model.routing]
    plain = lv.cnn(1, [3, 4], 8, 5).double()
    with torch.no_grad():
        for k in range(2):
            plain[3 * k].load_state_dict(model.hidden[k].state_dict())
        plain[-1].weight.copy_(model.glm.weight[:, -16:])
        plain[-1].bias.copy_(model.glm.bias)
    torch.testing.assert_close(model(x, routing=ones), plain(x))
    # the input channel routed to the GLM: the 1x1 reduction sees it, the first convolution does not
    z = [torch.zeros(1, dtype=torch.float64), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)]
    out = model.glm_inputs(x, routing=z)
    torch.testing.assert_close(out[0], model.reduce[0](x).flatten(1))
    h1 = model.pools[0](model.relus[0](model.hidden[0](torch.zeros_like(x))))
    torch.testing.assert_close(out[1], model.reduce[1](h1 * torch.tensor([0.0, 1.0, 0.0]).double()[:, None, None]).flatten(1))
    torch.testing.assert_close(lv.level_contributions(model, x).sum(1) + model.glm.bias, model(x))
    with pytest.raises(ValueError, match="expected images"):
        model(torch.rand(2, 3, 8, 8))


def test_l0_penalty_is_the_closed_form_and_its_sign_routes_fewer_features_deeper():
    torch.manual_seed(0)
    model = lv.FeatureLevelingNet([3, 5, 4], 2)
    with torch.no_grad():
        for g in model.routing:
            g.log_alpha.uniform_(-4, 4)
    per_layer = []  # reference: sum_j (1 - P(z_j = 0)) per layer, gate by gate from the closed form
    for g in model.routing:
        total = 0.0
        for a in g.log_alpha.tolist():
            total += 1 - 1 / (1 + math.exp(-(g.beta * math.log(-g.gamma / g.zeta) - a)))
        per_layer.append(total)
    assert lv.l0_penalty(model).item() == pytest.approx(sum(per_layer) / len(per_layer), rel=1e-6)
    assert lv.l0_penalty(model).item() >= 0
    x, y = lv.make_ixor(512, seed=0)
    deeper = {}
    for lam in (0.0, 2.0):
        torch.manual_seed(0)
        net = lv.FeatureLevelingNet([3, 8], 2, init_log_alpha=0.0)
        hist = lv.fit_leveling(net, (x, y), epochs=3, lam=lam, batch_size=64, progress=False)
        deeper[lam] = sum(hist.deeper[-1])
    assert deeper[2.0] < deeper[0.0], deeper


def test_training_routes_and_reduces_penalty():
    x, y = lv.make_ixor(512, seed=0)
    torch.manual_seed(0)
    model = lv.FeatureLevelingNet([3, 8], 2, init_log_alpha=0.0)
    hist = lv.fit_leveling(model, (x, y), epochs=3, lam=0.5, batch_size=64, progress=False)
    assert len(hist.loss) == len(hist.deeper) == 3 and hist.penalty[-1] < hist.penalty[0]
    net = lv.FeatureLevelingNet([3, 4], 1)
    reg = lv.fit_leveling(net, (x, y.double()), epochs=1, task="regression", test=(x, y.double()), progress=False)
    net.eval()  # the recorded test metric is the RMSE of the trained network, in eval mode
    with torch.no_grad():
        rmse = (net(x.to(next(net.parameters()).dtype)).reshape(-1).double() - y.double()).pow(2).mean().sqrt().item()
    assert reg.test_metric[-1] == pytest.approx(rmse, rel=1e-6)


# ------------------------------------------------------------------ IXOR and bad inputs


def test_ixor_matches_its_definition_and_reference():
    x, y = lv.make_ixor(2000, seed=3)
    assert x.shape == (2000, 3) and y.dtype == torch.int64
    assert (x[:, :2].abs() <= 2).all() and (x[:, 2] >= 0).all() and (x[:, 2] <= 1).all()
    assert torch.equal(y, lv.ixor_labels_reference(x))
    assert abs(y.double().mean() - 0.25) < 0.05  # P(x1 x2 > 0) P(x3 > 0.5) = 1/4
    assert torch.equal(lv.make_ixor(10, seed=3)[0], lv.make_ixor(10, seed=3)[0])


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="widths"):
        lv.FeatureLevelingNet([784], 10)
    with pytest.raises(ValueError, match="widths"):
        lv.FeatureLevelingNet([784, 0], 10)
    model = lv.FeatureLevelingNet([4, 3], 2)
    with pytest.raises(ValueError, match="expected inputs with 4 features"):
        model(torch.randn(2, 5))
    with pytest.raises(ValueError, match="one gate tensor per hidden layer"):
        model(torch.randn(2, 4), routing=[torch.ones(4), torch.ones(3)])
    with pytest.raises(ValueError, match="must end in 4 gates"):
        model(torch.randn(2, 4), routing=[torch.ones(3)])
    with pytest.raises(TypeError, match="FeatureLevelingNet"):
        lv.prune(nn.Linear(3, 2))
    with pytest.raises(TypeError, match="feature-leveling network"):
        lv.level_contributions(nn.Linear(3, 2), torch.randn(1, 3))
    with pytest.raises(ValueError, match="target"):
        lv.level_gradients(model.eval(), torch.randn(2, 4), 5)
    with pytest.raises(ValueError, match="task"):
        lv.fit_leveling(model, (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), 1, task="ranking")
    with pytest.raises(ValueError, match="lam"):
        lv.fit_leveling(model, (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), 1, lam=-1.0)
    with pytest.raises(ValueError, match="positive int"):
        lv.make_ixor(0)
    with pytest.raises(TypeError, match="pair"):
        lv.evaluate(model, torch.randn(3, 4))


def test_per_point_scores_average_to_evaluate():
    x, y = lv.make_ixor(300, seed=5)
    torch.manual_seed(0)
    model = lv.FeatureLevelingNet([3, 4], 2, init_log_alpha=0.0).eval()
    s = lv.per_point_scores(model, (x, y))
    assert s.shape == (300,) and set(s.unique().tolist()) <= {0.0, 1.0}
    assert abs(s.mean().item() - lv.evaluate(model, (x, y))) < 1e-12
    reg = lv.FeatureLevelingNet([3, 4], 1).eval()
    e = lv.per_point_scores(reg, (x, y.double()), "regression")
    assert abs(e.mean().sqrt().item() - lv.evaluate(reg, (x, y.double()), "regression")) < 1e-9
