"""The reader's own models (issue 26): every result is right, checked against an independent computation,
or the call raises a clear error. One test per failure a new user found, with the user's small snippet."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dualview import dgn, explain, gates, npk, paths, projections, pullbacks

Unsupported = gates.UnsupportedLayerError


def mlp_with(fn):
    """Linear(4, 6), then ``fn(h)`` in forward, then a ReLU module and Linear(6, 3)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.relu, self.b = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)

        def forward(self, x):
            return self.b(self.relu(fn(self.a(x))))

    torch.manual_seed(0)
    return Net().eval()


class Attention(nn.Module):
    """Hand-written single-head self-attention over 3 tokens of width 4, then ReLU and a linear head."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.relu, self.head = nn.ReLU(), nn.Linear(12, 2)

    def forward(self, x):
        t = x.view(-1, 3, 4)
        att = torch.softmax(self.q(t) @ self.k(t).transpose(1, 2) / 2.0, dim=-1)
        return self.head(self.relu(att @ self.v(t)).flatten(1))


class TwoBranchProduct(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.ra, self.rb, self.out = nn.Linear(4, 5), nn.Linear(4, 5), nn.ReLU(), nn.ReLU(), \
            nn.Linear(5, 2)

    def forward(self, x):
        return self.out(self.ra(self.a(x)) * self.rb(self.b(x)))


class GeluCalledReLU(nn.ReLU):
    def forward(self, x):
        return F.gelu(x)


FAILURE_1 = {
    "softmax attention": lambda: Attention().eval(),
    "F.layer_norm": lambda: mlp_with(lambda h: F.layer_norm(h, h.shape[-1:])),
    "F.log_softmax": lambda: mlp_with(lambda h: F.log_softmax(h, dim=1)),
    "torch.max(a, b)": lambda: mlp_with(lambda h: torch.max(h, 0.5 * h)),
    "x.amax": lambda: mlp_with(lambda h: h - h.amax(dim=1, keepdim=True)),
    "clamp_(min=0)": lambda: mlp_with(lambda h: h.clamp_(min=0)),
    "torch.where": lambda: mlp_with(lambda h: torch.where(h > 0, h, 0.1 * h)),
    "x * (x > 0)": lambda: mlp_with(lambda h: h * (h > 0)),
    "F.hardswish": lambda: mlp_with(F.hardswish),
    "product of two ReLU branches": lambda: TwoBranchProduct().eval(),
    "BatchNorm without running stats": lambda: nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3, track_running_stats=False), nn.ReLU(), nn.Flatten(),
        nn.Linear(3 * 4 * 4, 2)).eval(),
    "nn.ReLU subclass computing GELU": lambda: nn.Sequential(nn.Linear(4, 6), GeluCalledReLU(), nn.Linear(6, 3)).eval(),
}


def _input(model):
    return torch.randn(3, 1, 6, 6) if isinstance(model[0] if isinstance(model, nn.Sequential) else None,
                                                  nn.Conv2d) else torch.randn(3, 12 if isinstance(model, Attention)
                                                                             else 4)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [m.training for m in model.modules()]


def assert_untouched(model, before):
    state, modes = before
    now = model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in state.items())
    assert [m.training for m in model.modules()] == modes


@pytest.mark.parametrize("name", list(FAILURE_1))
def test_failure_1_nonlinearities_outside_the_whitelist_are_refused_everywhere(name):
    torch.manual_seed(1)
    model = FAILURE_1[name]()
    x = _input(model)
    before = snapshot(model)
    calls = {
        "record_gates": lambda: gates.record_gates(model, x),
        "switched projections": lambda: projections.switched_projections(model, x),
        "insens": lambda: projections.insens(model, x),
        "pullback": lambda: pullbacks.excitation_pullback(model, x, 0),
        "gated linear model": lambda: pullbacks.gated_linear_model(
            model, x, 0, gates.record_gates(model, x).gates),
    }
    for what, call in calls.items():
        with pytest.raises(Unsupported) as err:
            call()
        assert len(str(err.value)) > 60, what  # a sentence that says what and what to do
    assert_untouched(model, before)


def test_failure_1_refusal_names_the_op_the_module_and_the_line():
    model = FAILURE_1["x.amax"]()
    with pytest.raises(Unsupported) as err:
        gates.record_gates(model, torch.randn(2, 4))
    msg = str(err.value)
    assert "amax" in msg and "'<model>' (Net)" in msg and "test_own_models.py" in msg


def test_failure_1_linear_glue_code_passes_and_is_right():
    """What the whitelist lets through is linear: the switched linear model of a model whose forward
    uses scaling, reshapes, concatenation, zero padding, constant masks and nearest upsampling reproduces
    the network's pre-activations, and its weights are the autograd Jacobian."""

    class Glue(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.relu1 = nn.Conv2d(1, 2, 3, padding=1), nn.ReLU()
            self.fc, self.relu2, self.out = nn.Linear(2 * 8 * 8 * 2, 5), nn.ReLU(), nn.Linear(5, 2)
            self.register_buffer("mask", (torch.arange(16 * 16) % 3 > 0).float().view(1, 1, 16, 16))
            self.scale = 0.5

        def forward(self, x):
            h = self.relu1(self.conv(F.pad(x, (1, 1, 1, 1))[..., 1:-1, 1:-1]))
            h = F.interpolate(h, scale_factor=2, mode="nearest") * self.mask
            h = torch.cat([h[..., ::2, ::2], -self.scale * h[..., 1::2, 1::2]], 1).permute(0, 1, 3, 2)
            return self.out(self.relu2(self.fc(h.flatten(1)) + 1.0))

    torch.manual_seed(3)
    model = Glue().eval()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    model.double()
    p = projections.switched_projections(model, x)
    ref = projections.switched_projections_reference(model, x)
    torch.testing.assert_close(p.weight, ref.weight)
    torch.testing.assert_close(p.bias, ref.bias)
    # independent: the Jacobian of the second pre-activation by autograd on the plain model
    jac = torch.autograd.functional.jacobian(
        lambda z: model.fc(torch.cat([(F.interpolate(model.relu1(model.conv(z)), scale_factor=2) * model.mask)[
            ..., ::2, ::2], -0.5 * (F.interpolate(model.relu1(model.conv(z)), scale_factor=2) * model.mask)[
            ..., 1::2, 1::2]], 1).permute(0, 1, 3, 2).flatten(1)) + 1.0, x[:1])
    torch.testing.assert_close(p.layer("relu2", p.weight)[0], jac[0].flatten(1))


def test_failure_1_register_linear_layer_checks_affinity_and_is_undone():
    net = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.ReLU(), nn.Linear(6, 2)).eval()
    x = torch.randn(3, 4)
    with pytest.raises(Unsupported, match="LayerNorm"):  # not registered: refused by name
        gates.record_gates(net, x)
    with gates.register_linear_layer(nn.LayerNorm):  # registered: checked on first use, and refused
        with pytest.raises(Unsupported, match="not affine"):
            gates.record_gates(net, x)
    with pytest.raises(Unsupported, match="not affine"):
        gates.register_linear_layer(nn.LayerNorm, example=(nn.LayerNorm(6), torch.randn(2, 6)))
    assert nn.LayerNorm not in gates.SUPPORTED_LAYERS()  # the block and the failed call left nothing behind

    class Shift(nn.Module):  # affine: accepted, and its switched linear model is right
        def forward(self, h):
            return 2.0 * h + 1.0

    net2 = nn.Sequential(nn.Linear(4, 6), Shift(), nn.ReLU(), nn.Linear(6, 2)).eval()
    gates.register_linear_layer(Shift)
    try:
        rec = gates.record_gates(net2, x)
        torch.testing.assert_close(rec.preactivations["2"], 2 * net2[0](x) + 1)
    finally:
        gates.unregister_linear_layer(Shift)
    assert Shift not in gates.SUPPORTED_LAYERS()
    with pytest.raises(ValueError, match="built-in"):
        gates.unregister_linear_layer(nn.Linear)


def test_failure_2_gated_linear_model_without_pool_indices_reproduces_the_network():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3 * 3 * 3, 4),
                          nn.ReLU(), nn.Linear(4, 2)).eval().double()
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    rec = gates.record_gates(model, x)
    glm = pullbacks.gated_linear_model(model, x, 1, rec.gates)  # no pool_indices
    with torch.no_grad():
        f = model(x)[:, 1]
    torch.testing.assert_close((glm.weight * x).flatten(1).sum(1) + glm.bias, f, rtol=1e-10, atol=1e-12)
    # the weight is the input gradient (x's own gates and winners: the active sub-network)
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model(xg)[:, 1].sum(), xg)
    torch.testing.assert_close(glm.weight, g)


def test_self_check_refuses_a_wrong_affine_model():
    with pytest.raises(Unsupported, match="does not reproduce"):
        gates.check_reproduces("a model", torch.tensor([[0.2, 0.0437]]), torch.tensor([0.0]), torch.tensor([0.2506]))
    gates.check_reproduces("a model", torch.tensor([[0.2, 0.0506]]), torch.tensor([0.0]), torch.tensor([0.2506]))


def test_failure_3_gated_network_with_functional_relus_is_refused():
    class FunctionalNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)

        def forward(self, x):
            return self.b(F.relu(self.a(x)))

    with pytest.raises(Unsupported, match="no gate sites"):
        dgn.GatedNetwork(FunctionalNet(), FunctionalNet())


def test_failure_3_gated_network_from_a_model_with_inplace_relus():
    torch.manual_seed(5)
    value = nn.Sequential(nn.Linear(4, 5), nn.ReLU(inplace=True), nn.Linear(5, 2))
    gating = nn.Sequential(nn.Linear(4, 5), nn.ReLU(inplace=True), nn.Linear(5, 2))
    net = dgn.GatedNetwork(value, gating)
    assert gating[1].inplace  # the user's model is not changed
    x = torch.randn(6, 4)
    with torch.no_grad():
        expected = value[2](value[0](x) * (gating[0](x) > 0))
        torch.testing.assert_close(net(x), expected)


def test_failure_4_npk_refuses_a_conv_net_with_a_skip_in_forward():
    class SkipNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv1d(1, 4, 3, padding=1, padding_mode="circular", bias=False)
            self.r1 = nn.ReLU()
            self.c2 = nn.Conv1d(4, 4, 3, padding=1, padding_mode="circular", bias=False)
            self.r2 = nn.ReLU()
            self.gap, self.flat, self.fc = nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(4, 1, bias=False)

        def forward(self, x):
            h = self.r1(self.c1(x))
            return self.fc(self.flat(self.gap(self.r2(self.c2(h)) + h)))

    with pytest.raises(Unsupported, match="skip"):
        npk.npk(SkipNet(), torch.randn(3, 1, 5))


def brute_force_window_count(h, w, k, s, ceil_mode):
    """Paths from the input through one max-pool (all inputs of every window pass), counted window by window."""
    out_h = -(-(h - k) // s) + 1 if ceil_mode else (h - k) // s + 1
    out_w = -(-(w - k) // s) + 1 if ceil_mode else (w - k) // s + 1
    total = 0
    for i in range(out_h):
        for j in range(out_w):
            total += len(range(i * s, min(i * s + k, h))) * len(range(j * s, min(j * s + k, w)))
    return total


@pytest.mark.parametrize("size,k,s,ceil_mode", [(3, 2, 2, True), (3, 2, 2, False), (7, 3, 2, True), (6, 3, 2, True)])
def test_failure_5_count_paths_with_ceil_mode_max_pools(size, k, s, ceil_mode):
    model = nn.Sequential(nn.MaxPool2d(k, s, ceil_mode=ceil_mode), nn.Flatten(), nn.Linear(1, 1)).eval()
    with torch.no_grad():
        model[2] = nn.Linear(model[:2](torch.zeros(1, 1, size, size)).shape[1], 1)
    count = paths.count_paths(model.eval(), input_shape=(1, size, size))
    assert int(count.total[-1]) == brute_force_window_count(size, size, k, s, ceil_mode)


def train_mode_bn_net():
    torch.manual_seed(6)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 3)).train()


@pytest.mark.parametrize("method", [m for m in explain.METHODS if m not in ("intensity", "edges")])
def test_failure_6_every_method_refuses_train_mode_before_any_forward(method):
    model = train_mode_bn_net()
    before = snapshot(model)
    with pytest.raises(Unsupported, match="eval"):
        explain.attribute(model, torch.rand(2, 3, 8, 8), 0, method=method)
    assert_untouched(model, before)


@pytest.mark.parametrize("call", [
    lambda m, x: gates.record_gates(m, x), lambda m, x: pullbacks.input_gradient(m, x, 0),
    lambda m, x: pullbacks.excitation_pullback(m, x, 0), lambda m, x: projections.insens(m, x),
    lambda m, x: projections.switched_projections(m, x),
    lambda m, x: pullbacks.projected_gradient_ascent(m, x, 0, steps=0),
    lambda m, x: pullbacks.gated_linear_model(m, x, 0, {"2": torch.ones(1, 4, 6, 6)}),
])
def test_failure_6_entry_points_refuse_train_mode_and_leave_the_model_untouched(call):
    model = train_mode_bn_net()
    before = snapshot(model)
    with pytest.raises(Unsupported, match="eval"):
        call(model, torch.rand(2, 3, 8, 8))
    assert_untouched(model, before)


class ReusedInplace(nn.Module):
    """Failure 8: an in-place ReLU whose input is read again (``self.relu(h) + h``)."""

    def __init__(self):
        super().__init__()
        self.a, self.relu, self.b, self.relu2, self.c = nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 5), \
            nn.ReLU(), nn.Linear(5, 2)

    def forward(self, x):
        h = self.a(x)
        return self.c(self.relu2(self.b(self.relu(h) + h)))


def test_failure_8_inplace_relu_whose_input_is_read_again():
    torch.manual_seed(8)
    model = ReusedInplace().eval().double()
    x = torch.randn(4, 4, dtype=torch.float64)
    with torch.no_grad():
        out = model(x.clone())
    # by hand: the in-place ReLU overwrites h, so the network computes c(relu(b(2 relu(a x))))
    W1, b1, W2, b2 = model.a.weight, model.a.bias, model.b.weight, model.b.bias
    q1 = x @ W1.T + b1
    g1 = (q1 > 0).double()
    q2 = (2 * q1 * g1) @ W2.T + b2
    rec = gates.record_gates(model, x)
    torch.testing.assert_close(rec.output, out)
    torch.testing.assert_close(rec.preactivations["relu"], q1.detach())
    torch.testing.assert_close(rec.preactivations["relu2"], q2.detach())
    # switched weights by hand: w1 = W1 rows, w2 = 2 W2 diag(g1) W1
    w1 = W1.detach().expand(4, 6, 4)
    w2 = torch.einsum("ij,nj,jk->nik", 2 * W2.detach(), g1, W1.detach())
    p = projections.switched_projections(model, x)
    torch.testing.assert_close(p.weight, torch.cat([w1, w2], 1))
    # Insens (Eq. 7-8) by hand from those switched weights
    q = torch.cat([q1, q2], 1).detach()
    w = torch.cat([w1, w2], 1)
    inactive = (q <= 0).double()
    omega = (inactive * q / w.square().sum(-1)).unsqueeze(-1).mul(w).sum(1) / inactive.sum(1, keepdim=True)
    torch.testing.assert_close(projections.insens(model, x).omega, omega)


@pytest.mark.parametrize("make,name", [
    (lambda: mlp_with(F.relu6), "relu6"),
    (lambda: mlp_with(lambda h: F.hardtanh(h, 0.0, 6.0)), "hardtanh"),
    (lambda: mlp_with(lambda h: h.clamp(0, 6)), "clamp"),
    (lambda: nn.Sequential(nn.Linear(4, 6), nn.Hardtanh(), nn.Linear(6, 2)), "Hardtanh"),
])
def test_hard_clipped_relus_are_refused_by_name(make, name):
    """Hard-clipped ReLUs as functions (and Hardtanh with a floor other than 0) are refused, never taken as ReLUs;
    the modules nn.ReLU6 / nn.Hardtanh(0, t) are supported exactly (tests/test_relu6.py)."""
    with pytest.raises(Unsupported, match=name):
        gates.record_gates(make().eval(), torch.randn(2, 4))
