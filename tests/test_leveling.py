"""Feature leveling: hard-concrete routing gates, the leveling network and its training, pruning, level splits."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import data, levels, train
from dualview import leveling as lv


def trained_like(model: lv.FeatureLevelingNet, seed: int, dead_layer: int | None = None) -> lv.FeatureLevelingNet:
    """Give a network random weights and a random mix of routing decisions (some layers dead)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        for k, hc in enumerate(model.routing):
            la = 4 * torch.randn(hc.n, generator=g, dtype=hc.log_alpha.dtype)
            if dead_layer is not None and k == dead_layer:
                la = -torch.ones_like(la)
            hc.log_alpha.copy_(la)
    return model.eval()


# ------------------------------------------------------------------ hard-concrete routing gates


@pytest.mark.parametrize("log_alpha", [-2.0, 0.0, 1.5])
def test_hard_concrete_point_masses_match_closed_forms(log_alpha):
    torch.manual_seed(0)
    hc = lv.HardConcreteRouting(1, init_log_alpha=log_alpha).double()
    n = 40_000
    z = hc.sample((n,))[:, 0]
    for empirical, exact in [((z == 0).double().mean(), hc.prob_zero().detach()[0]),
                             ((z == 1).double().mean(), hc.prob_one().detach()[0])]:
        sd = math.sqrt(float(exact) * (1 - float(exact)) / n)
        assert abs(empirical - exact) < 5 * sd, (empirical, exact)
    assert ((z >= 0) & (z <= 1)).all()
    # closed forms written out with the book's constants
    s0 = torch.sigmoid(torch.tensor(2 / 3 * math.log(0.1 / 1.1) - log_alpha, dtype=torch.float64))
    assert torch.isclose(hc.prob_zero()[0], s0)


def test_expected_l0_matches_monte_carlo():
    torch.manual_seed(1)
    hc = lv.HardConcreteRouting(5).double()
    with torch.no_grad():
        hc.log_alpha.copy_(torch.tensor([-3.0, -1.0, 0.0, 1.0, 3.0]))
    z = hc.sample((40_000,))
    mc = (z != 0).double().sum(1).mean()
    sd = (z != 0).double().sum(1).std() / math.sqrt(len(z))
    assert abs(mc - hc.expected_l0()) < 5 * sd


def test_deterministic_routing_gates_and_gradients():
    hc = lv.HardConcreteRouting(3)
    with torch.no_grad():
        hc.log_alpha.copy_(torch.tensor([-5.0, 0.0, 5.0]))
    hc.eval()
    torch.testing.assert_close(hc(), torch.tensor([0.0, 0.5, 1.0]))
    hc.train()
    hc.expected_l0().backward()
    assert hc.log_alpha.grad is not None and (hc.log_alpha.grad > 0).all()


@pytest.mark.parametrize("kwargs", [dict(n=0), dict(n=2.5), dict(n=3, temperature=0.0), dict(n=3, gamma=0.1),
                                    dict(n=3, zeta=1.0)])
def test_hard_concrete_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        lv.HardConcreteRouting(**kwargs)


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
    # in training, a sampled routing gate of exactly 0 or 1 sends the feature one way only
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
    for hc in model.routing:
        shape = (6, hc.n) if per_sample else (hc.n,)
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
    pruned = levels.prune(model)
    torch.testing.assert_close(pruned(x), model(x))
    summary = lv.routing_summary(model)
    assert pruned.depth == summary.depth
    if dead is not None:
        assert pruned.depth <= dead


def test_pruning_on_real_digits(digits_small):
    x = digits_small[0]
    model = trained_like(lv.FeatureLevelingNet([64, 20, 10], 10).double(), 3, dead_layer=1)
    pruned = levels.prune(model)
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
    assert levels.prune(model).architecture == "10-28-32*-1"
    with torch.no_grad():
        model.routing[0].log_alpha.fill_(-5.0)
    assert levels.prune(model).architecture == "13*-1"
    x = torch.randn(4, 13)
    torch.testing.assert_close(levels.prune(model.eval())(x), model(x))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_level_contributions_add_up_and_gradients_add_up(seed):
    model = trained_like(lv.FeatureLevelingNet([5, 6, 4], 3).double(), seed)
    x = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    contrib = levels.level_contributions(model, x)
    assert contrib.shape == (7, 3, 3)
    torch.testing.assert_close(contrib.sum(1) + model.glm.bias, model(x))
    target = torch.arange(7) % 3
    grads = levels.level_gradients(model, x, target)
    full = torch.func.vmap(torch.func.jacrev(lambda v: model(v[None])[0]))(x)  # (N, out, in)
    torch.testing.assert_close(grads.sum(1), full[torch.arange(7), target])
    # level 1 is linear: its gradient is the GLM weight row of the inputs routed to it
    z0 = model.routing_gates()[0]
    torch.testing.assert_close(grads[:, 0], model.glm.weight[target, :5] * (z0 == 0))
    # the pruned network has the same split; levels behind a layer whose routing gates are all closed
    # receive a constant input, which pruning folds into the GLM bias
    pruned = levels.prune(model)
    kept = levels.level_contributions(pruned, x)
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
    torch.testing.assert_close(levels.level_contributions(model, x).sum(1) + model.glm.bias, model(x))
    with pytest.raises(ValueError, match="expected images"):
        model(torch.rand(2, 3, 8, 8))


def test_l0_penalty_is_the_closed_form_and_its_sign_routes_fewer_features_deeper():
    torch.manual_seed(0)
    model = lv.FeatureLevelingNet([3, 5, 4], 2)
    with torch.no_grad():
        for g in model.routing:
            g.log_alpha.uniform_(-4, 4)
    per_layer = []  # reference: sum_j (1 - P(z_j = 0)) per layer, one routing gate at a time, from the closed form
    for g in model.routing:
        total = 0.0
        for a in g.log_alpha.tolist():
            total += 1 - 1 / (1 + math.exp(-(g.temperature * math.log(-g.gamma / g.zeta) - a)))
        per_layer.append(total)
    assert lv.l0_penalty(model).item() == pytest.approx(sum(per_layer) / len(per_layer), rel=1e-6)
    assert lv.l0_penalty(model).item() >= 0
    x, y = data.make_ixor(512, seed=0)
    deeper = {}
    for lam in (0.0, 2.0):
        torch.manual_seed(0)
        net = lv.FeatureLevelingNet([3, 8], 2, init_log_alpha=0.0)
        hist = lv.fit_leveling(net, (x, y), epochs=3, lam=lam, batch_size=64, progress=False)
        deeper[lam] = sum(hist.records["deeper"][-1])
    assert deeper[2.0] < deeper[0.0], deeper


def test_training_routes_and_reduces_penalty():
    x, y = data.make_ixor(512, seed=0)
    torch.manual_seed(0)
    model = lv.FeatureLevelingNet([3, 8], 2, init_log_alpha=0.0)
    hist = lv.fit_leveling(model, (x, y), epochs=3, lam=0.5, batch_size=64, progress=False)
    assert len(hist.loss) == len(hist.records["deeper"]) == 3 and hist.penalty[-1] < hist.penalty[0]
    # the recorded routing gates are each epoch's test-time gates: they count the recorded features routed deeper
    assert [[int(z.sum()) for z in zs] for zs in hist.records["routing"]] == hist.records["deeper"]
    assert all(torch.equal(a, b) for a, b in zip(hist.records["routing"][-1], model.routing_gates()))
    net = lv.FeatureLevelingNet([3, 4], 1)
    reg = lv.fit_leveling(net, (x, y.double()), epochs=1, task="regression", test=(x, y.double()), progress=False)
    net.eval()  # the recorded test metric is the RMSE of the trained network, in eval mode
    with torch.no_grad():
        rmse = (net(x.to(next(net.parameters()).dtype)).reshape(-1).double() - y.double()).pow(2).mean().sqrt().item()
    assert reg.test_rmse[-1] == pytest.approx(rmse, rel=1e-6)


def test_warmup_starts_without_penalty_and_finetune_fixes_the_routing():
    x, y = data.make_ixor(256, seed=0)

    def trained(**kwargs):
        torch.manual_seed(0)
        model = lv.FeatureLevelingNet([3, 8], 2, init_log_alpha=0.0, rule="complement")
        return model, lv.fit_leveling(model, (x, y), batch_size=64, progress=False, **kwargs)

    # warmup: the penalty weight is 0 in the first epoch, whatever lam is
    a, _ = trained(epochs=1, lam=1000.0, warmup=2)
    b, _ = trained(epochs=1, lam=0.0)
    c, _ = trained(epochs=1, lam=1000.0)
    for p, q, r in zip(a.parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q)
    assert not torch.equal(a.routing[0].log_alpha, c.routing[0].log_alpha)
    # finetune: the routing gates are fixed at their test-time values, so log_alpha gets no gradient and no
    # penalty, while the weights go on learning
    start = [hc.log_alpha.detach().clone() for hc in c.routing] + [c.glm.weight.detach().clone()]
    model, hist = trained(epochs=1, lam=1000.0, finetune=2)
    assert len(hist.loss) == len(hist.penalty) == len(hist.records["deeper"]) == 3
    assert all(torch.equal(hc.log_alpha, la) for hc, la in zip(model.routing, start))
    assert not torch.equal(model.glm.weight, start[-1])


# ------------------------------------------------------------------ bad inputs


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="widths"):
        lv.FeatureLevelingNet([784], 10)
    with pytest.raises(ValueError, match="widths"):
        lv.FeatureLevelingNet([784, 0], 10)
    model = lv.FeatureLevelingNet([4, 3], 2)
    with pytest.raises(ValueError, match="expected inputs with 4 features"):
        model(torch.randn(2, 5))
    with pytest.raises(ValueError, match="one tensor of routing gates per hidden layer"):
        model(torch.randn(2, 4), routing=[torch.ones(4), torch.ones(3)])
    with pytest.raises(ValueError, match="must end in 4 routing gates"):
        model(torch.randn(2, 4), routing=[torch.ones(3)])
    with pytest.raises(TypeError, match="FeatureLevelingNet"):
        levels.prune(nn.Linear(3, 2))
    with pytest.raises(TypeError, match="feature-leveling network"):
        levels.level_contributions(nn.Linear(3, 2), torch.randn(1, 3))
    with pytest.raises(ValueError, match="target"):
        levels.level_gradients(model.eval(), torch.randn(2, 4), 5)
    with pytest.raises(ValueError, match="task"):
        lv.fit_leveling(model, (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), 1, task="ranking")
    with pytest.raises(ValueError, match="lam"):
        lv.fit_leveling(model, (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), 1, lam=-1.0)
    with pytest.raises(TypeError, match="pair"):
        train.evaluate(model, torch.randn(3, 4))
    with pytest.raises(TypeError, match="feature-leveling network"):
        lv.fit_leveling(nn.Linear(4, 2), (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), 1)
