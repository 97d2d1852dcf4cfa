"""Paths: output = <phi, v> on random networks, fast vs reference, and path counting vs brute force."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import gates, nets, paths


def random_fc(widths: list[int], bias, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    flags = [bias] * (len(widths) - 1) if isinstance(bias, bool) else bias
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b, bias=flags[k]))
        if k < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).double()


fc_shapes = st.lists(st.integers(1, 4), min_size=2, max_size=5)


@settings(max_examples=40, deadline=None)
@given(widths=fc_shapes, bias=st.booleans() | st.lists(st.booleans(), min_size=4, max_size=4),
       seed=st.integers(0, 10_000))
def test_output_is_inner_product_of_npf_and_npv(widths, bias, seed):
    widths = widths + [2]  # random depth and width, 2 outputs
    if isinstance(bias, list):
        bias = (bias * 2)[: len(widths) - 1]
    net = random_fc(widths, bias, seed)
    x = torch.randn(7, widths[0], dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    phi = paths.neural_path_features(net, x)
    v = paths.neural_path_values(net)
    assert phi.shape[1] == v.shape[0]
    torch.testing.assert_close(phi @ v, net(x), rtol=1e-10, atol=1e-10)
    # number of paths (per output) matches the closed form
    assert phi.shape[1] * widths[-1] == paths.fc_path_count(widths, bias)


@settings(max_examples=15, deadline=None)
@given(widths=st.lists(st.integers(1, 3), min_size=2, max_size=4), bias=st.booleans(), seed=st.integers(0, 999))
def test_fast_matches_reference(widths, bias, seed):
    net = random_fc(widths + [2], bias, seed)
    x = torch.randn(3, widths[0], dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(paths.neural_path_features(net, x), paths.neural_path_features_reference(net, x))
    torch.testing.assert_close(paths.neural_path_values(net), paths.neural_path_values_reference(net),
                               rtol=1e-12, atol=0)


def test_real_digits_identity(digits_small):
    """<phi, v> = f on real handwritten digits, with a network that has biases."""
    x, _ = digits_small
    net = random_fc([64, 6, 5, 10], True, 0)
    phi = paths.neural_path_features(net, x)
    torch.testing.assert_close(phi @ paths.neural_path_values(net), net(x), rtol=1e-10, atol=1e-10)


def test_activity_is_product_of_gates_and_feature_is_input_times_activity():
    net = random_fc([3, 4, 3, 2], True, 1)
    x = torch.randn(5, 3, dtype=torch.float64)
    A = paths.path_activity(net, x)
    idx = paths.path_index(net)
    g = list(gates.record_gates(net, x).gates.values())
    for n, k in itertools.product(range(5), range(idx.shape[0])):  # reference loop
        p = idx[k].tolist()
        on = all(p[l] == g[l - 1].shape[1] or bool(g[l - 1][n, p[l]]) for l in range(1, len(p)))
        assert bool(A[n, k]) == on
    xa = torch.cat([x, torch.ones(5, 1, dtype=x.dtype)], 1)
    assert torch.equal(paths.neural_path_features(net, x), xa[:, idx[:, 0]] * A)


def test_paths_never_reenter_constant_units():
    net = random_fc([3, 4, 3, 2], True, 2)
    idx = paths.path_index(net)
    widths = [3, 4, 3]
    const = torch.stack([idx[:, l] == widths[l] for l in range(3)], 1).int()
    assert (const[:, 1:] <= const[:, :-1]).all()


def test_fc_errors_name_the_layer():
    with pytest.raises(TypeError, match="Tanh"):
        paths.neural_path_features(nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 1)), torch.randn(1, 2))
    with pytest.raises(TypeError, match="Sequential"):
        paths.fc_layers(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="expects 3"):
        paths.neural_path_features(random_fc([3, 2, 1], True, 0), torch.randn(1, 4, dtype=torch.float64))
    with pytest.raises(ValueError):
        paths.fc_path_count([3])


# --- path counting -----------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(widths=st.lists(st.integers(1, 4), min_size=3, max_size=5), seed=st.integers(0, 999))
def test_count_paths_fc_matches_enumeration(widths, seed):
    net = random_fc(widths, True, seed)
    x = torch.randn(4, widths[0], dtype=torch.float64)
    counts = paths.count_paths(net, x)
    assert counts.total[-1].item() == paths.fc_path_count(widths)  # input paths only
    idx = paths.path_index(net)
    input_paths = idx[:, 0] < widths[0]
    active = paths.path_activity(net, x)[:, input_paths].sum(1) * widths[-1]
    torch.testing.assert_close(counts.active[:, -1], active.double())


def _adjacency_reference(layer: nn.Module, in_shape: tuple[int, ...]) -> torch.Tensor:
    """Which input units each output unit of a linear layer reads: a loop over input units (reference)."""
    n_in = int(torch.tensor(in_shape).prod())
    cols = []
    for i in range(n_in):
        e = torch.zeros(n_in, dtype=torch.float64)
        e[i] = 1.0
        with torch.no_grad():
            cols.append(layer(e.view(1, *in_shape)).flatten() != 0)
    return torch.stack(cols, 1).double()


def test_count_paths_conv_matches_brute_force():
    """A tiny conv net with max-pooling: counts from explicit adjacency matrices (reference)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 2, 3, padding=1)
    with torch.no_grad():
        conv.weight.uniform_(0.5, 1.0)  # no zero weights, so connectivity = non-zero Jacobian entries
    fc_layer = nn.Linear(2 * 2 * 2, 3)
    with torch.no_grad():
        fc_layer.weight.uniform_(0.5, 1.0)
    net = nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), fc_layer).double()
    x = torch.randn(5, 1, 4, 4, dtype=torch.float64)
    counts = paths.count_paths(net, x)

    A1 = _adjacency_reference(lambda z: nn.functional.conv2d(z, conv.weight.double(), padding=1), (1, 4, 4))
    pool_all = _adjacency_reference(lambda z: nn.functional.avg_pool2d(z, 2), (2, 4, 4))
    A3 = _adjacency_reference(lambda z: z.flatten(1) @ fc_layer.weight.double().T, (8,))
    ones = torch.ones(16, dtype=torch.float64)
    total_conv = A1 @ ones
    total_out = A3 @ pool_all @ total_conv
    assert counts.total[0] == total_conv.sum() and counts.total[-1] == total_out.sum()

    rec = gates.record_gates(net, x)
    for n in range(5):  # active: gates of x, and each window passes its winner only
        g = rec.gates["1"][n].flatten().double()
        win = torch.zeros(8, 32, dtype=torch.float64)
        idx = rec.pool_indices["2"][n].flatten()  # flat within channel
        for j in range(8):
            win[j, (j // 4) * 16 + idx[j]] = 1.0
        active_conv = g * total_conv
        assert counts.active[n, 0] == active_conv.sum()
        assert counts.active[n, -1] == (A3 @ win @ active_conv).sum()


def test_count_paths_through_average_pools_matches_brute_force():
    """Average pools (fixed and adaptive) pass every input of a window: counts from adjacency matrices."""
    torch.manual_seed(1)
    conv, lin = nn.Conv2d(1, 2, 3, padding=1), nn.Linear(2, 3)
    with torch.no_grad():
        conv.weight.uniform_(0.5, 1.0)
        lin.weight.uniform_(0.5, 1.0)
    net = nn.Sequential(conv, nn.ReLU(), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), lin).double()
    counts = paths.count_paths(net, input_shape=(1, 4, 4))
    A1 = _adjacency_reference(lambda z: nn.functional.conv2d(z, conv.weight.double(), padding=1), (1, 4, 4))
    pool = _adjacency_reference(lambda z: nn.functional.avg_pool2d(z, 2), (2, 4, 4))
    gap = _adjacency_reference(lambda z: nn.functional.adaptive_avg_pool2d(z, 1), (2, 2, 2))
    A3 = _adjacency_reference(lambda z: z.flatten(1) @ lin.weight.double().T, (2,))
    ones = torch.ones(16, dtype=torch.float64)
    assert counts.total[0] == (A1 @ ones).sum() and counts.total[-1] == (A3 @ gap @ pool @ A1 @ ones).sum()
    with pytest.raises(ValueError, match="unequal windows"):
        paths.count_paths(nn.Sequential(nn.Conv2d(1, 1, 1), nn.AdaptiveAvgPool2d(3)), input_shape=(1, 4, 4))


def test_count_paths_needs_input_or_shape_and_rejects_unknown_layers():
    with pytest.raises(ValueError, match="input_shape"):
        paths.count_paths(nn.Sequential(nn.Linear(2, 2)))

    class Weird(nn.Module):
        def forward(self, x):
            return x * 2

    from dualview.gates import register_linear_layer

    with register_linear_layer(Weird), pytest.raises(TypeError, match="register_unit_rule"):
        paths.count_paths(nn.Sequential(nn.Linear(2, 2), Weird()), input_shape=(2,))


class EveryOther(nn.Module):
    """A fixed linear layer of the user's own: every other unit, times 3."""

    def forward(self, x):
        return 3 * x[:, ::2]


class Select(nn.Module):
    """EveryOther's unit-weight version (the selection stays, the weight 3 becomes 1); with ``pairs``, a wrong one
    that also reads the units in between (twice the paths)."""

    def __init__(self, pairs: bool = False):
        super().__init__()
        self.pairs = pairs

    def forward(self, x):
        return x[:, ::2] + x[:, 1::2] if self.pairs else x[:, ::2]


def test_a_unit_rule_can_be_scoped_or_undone():
    """register_unit_rule has register_linear_layer's shape: a context manager that registers for its block only
    (the class's rule before it is back on exit, nested blocks included), or a call undone by
    unregister_unit_rule. Paths through Linear(4, 6), ReLU, every other unit, Linear(3, 2), by hand:
    4 x 6 = 24 to the ReLU, 4 x 3 x 2 = 24 to the output (a rule reading pairs gives 48 there)."""
    from dualview.gates import register_linear_layer

    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), EveryOther(), nn.Linear(3, 2))

    def total():
        return paths.count_paths(net, input_shape=(4,)).total.tolist()

    with register_linear_layer(EveryOther):
        with pytest.raises(TypeError, match="register_unit_rule"):
            total()
        with paths.register_unit_rule(EveryOther, lambda m: Select()):
            assert total() == [24, 24]
            with paths.register_unit_rule(EveryOther, lambda m: Select(pairs=True)):
                assert total() == [24, 48]
            assert total() == [24, 24]  # the outer block's rule is back
        with pytest.raises(TypeError, match="register_unit_rule"):
            total()
        paths.register_unit_rule(EveryOther, lambda m: Select())  # as a call: registered until undone
        assert total() == [24, 24]
        paths.unregister_unit_rule(EveryOther)
        with pytest.raises(TypeError, match="register_unit_rule"):
            total()
        paths.unregister_unit_rule(EveryOther)  # nothing registered: nothing to do
    with pytest.raises(TypeError, match="nn.Module class"):
        paths.register_unit_rule(Select(), lambda m: m)
    with pytest.raises(TypeError, match="rule"):
        paths.register_unit_rule(EveryOther, "identity")


def test_parameter_count():
    assert paths.parameter_count(random_fc([3, 4, 2], True, 0)) == 3 * 4 + 4 + 4 * 2 + 2


def test_activity_ignores_zero_inputs_and_a_zero_preactivation_closes_the_gate():
    """A(x, p) is a product of gates only: a path from an input coordinate that is exactly 0 is still
    active when its gates are on (its feature is 0, its activity is not), and a unit whose pre-activation
    is exactly 0 has gate 0 (the ReLU's derivative at 0 in torch), so every path through it is inactive."""
    net = random_fc([4, 3, 3, 2], True, 1)
    with torch.no_grad():  # hidden unit 1 of layer 1 gets q = 0 exactly: zero weights, zero bias
        net[0].weight[1] = 0.0
        net[0].bias[1] = 0.0
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[:, 0] = 0.0  # a zero pixel
    x[2] = 0.0  # an all-zero input
    A = paths.path_activity(net, x)
    idx = paths.path_index(net)
    rec = gates.record_gates(net, x)
    q = list(rec.preactivations.values())
    assert (q[0][:, 1] == 0).all() and not rec.gates[rec.names[0]][:, 1].any()
    for n, k in itertools.product(range(6), range(idx.shape[0])):  # reference: the product of gates, from q
        p = idx[k].tolist()
        on = all(p[l] == q[l - 1].shape[1] or bool(q[l - 1][n, p[l]] > 0) for l in range(1, len(p)))
        assert bool(A[n, k]) == on, (n, p)
    from_zero_pixel = idx[:, 0] == 0
    assert A[:, from_zero_pixel].any(), "paths from a zero pixel must stay active where their gates are on"
    assert not A[:, idx[:, 1] == 1].any(), "no path through a unit with q = 0 is active"
    phi = paths.neural_path_features(net, x)
    assert (phi[:, from_zero_pixel] == 0).all()


def test_unit_network_sums_the_input_over_its_paths():
    # with every weight 1 and no bias, output = sum over paths of z[p_0]: for a fully connected network,
    # sum(z) times the number of paths from one input unit to the output (the product of the hidden widths)
    torch.manual_seed(0)
    model = nets.relu_mlp([4, 3, 5, 2], bias=True).float()
    unit = paths.unit_network(model)
    z = torch.rand(6, 4, dtype=torch.float64) + 0.1           # positive: every gate of the unit network is on
    with torch.no_grad():
        out = unit(z)
    assert unit is not model and out.dtype == torch.float64 and not unit.training
    torch.testing.assert_close(out, z.sum(1, keepdim=True).expand(6, 2) * 3 * 5)
    assert all(bool((m.weight == 1).all()) and bool((m.bias == 0).all())
               for m in unit.modules() if isinstance(m, nn.Linear))
    assert not bool((model[0].weight == 1).all())             # the original is untouched


def test_unit_network_has_no_batchnorm_with_eps_zero(monkeypatch):
    # a BatchNorm of unit weight, zero mean and unit variance is the identity; PyTorch 2.11 refuses eps <= 0
    # even in eval mode, so the unit network must not get there by setting eps = 0
    torch.manual_seed(0)
    with_bn = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                            nn.Linear(12, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2)).eval()
    with torch.no_grad():
        for m in with_bn.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2)
    without_bn = nn.Sequential(*[m for m in with_bn if not isinstance(m, nn.modules.batchnorm._BatchNorm)])
    unit = paths.unit_network(with_bn)
    assert all(m.eps > 0 for m in unit.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    batch_norm = torch.nn.functional.batch_norm

    def strict(*args, **kwargs):  # PyTorch 2.11's F.batch_norm
        eps = kwargs.get("eps", args[7] if len(args) > 7 else 1e-5)
        if eps <= 0:
            raise ValueError(f"batch_norm eps must be positive, but got {eps}")
        return batch_norm(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "batch_norm", strict)
    z = torch.rand(4, 2, 4, 4, dtype=torch.float64) + 0.1
    with torch.no_grad():
        out = unit(z)
        assert torch.equal(out, paths.unit_network(without_bn)(z))  # the same paths, exactly
    assert with_bn[1].running_var.min() >= 0.5  # the original is untouched


# --- the model's own arithmetic between layers (issue 39, finding 1) ----------------------------------------
class _MeanHead(nn.Module):
    """The module-CNN pattern: conv, ReLU, a functional mean over the image, a linear head."""

    def __init__(self, scale: float = 1.0, functional_pool: bool = False) -> None:
        super().__init__()
        self.conv, self.relu, self.fc = nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Linear(2, 3)
        self.scale, self.functional_pool = scale, functional_pool

    def forward(self, x):
        h = self.relu(self.conv(x))
        if self.functional_pool:
            h = nn.functional.avg_pool2d(h, 2)
        return self.fc(self.scale * h.mean((2, 3)) / 3.0 - 1.0)


def _as_sequential(m: _MeanHead) -> nn.Sequential:
    pools = [nn.AvgPool2d(2)] if m.functional_pool else []
    seq = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), *pools, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(2, 3))
    seq[0].load_state_dict(m.conv.state_dict())
    seq[-1].load_state_dict(m.fc.state_dict())
    return seq


@pytest.mark.parametrize("functional_pool", [False, True])
def test_count_paths_through_functional_means_scalings_and_pools(functional_pool):
    torch.manual_seed(3)
    model = _MeanHead(scale=0.5, functional_pool=functional_pool).double().eval()
    reference = _as_sequential(model).double().eval()  # its counts are checked against brute force above
    x = torch.randn(6, 1, 4, 4, dtype=torch.float64)
    got, want = paths.count_paths(model, x), paths.count_paths(reference, x)
    assert got.total[-1] == want.total[-1] and got.total[-1] > 0
    torch.testing.assert_close(got.active[:, -1], want.active[:, -1])
    # and by hand: 2 channels x 16 positions x 9 taps reach the mean (padding cuts taps at the border)
    A1 = _adjacency_reference(lambda z: nn.functional.conv2d(z, model.conv.weight.abs() + 1, padding=1), (1, 4, 4))
    assert want.total[-1] == 3 * (A1 @ torch.ones(16, dtype=torch.float64)).sum()


def test_count_paths_of_a_difference_of_branches_adds_their_paths():
    class Diff(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.relu, self.out = nn.Linear(3, 4), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.relu(self.a(x)) - self.relu(self.b(x)) - 0.1)

    assert paths.count_paths(Diff(), input_shape=(3,)).total[-1] == 2 * paths.fc_path_count([3, 4, 2])


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bilinear-corners"])
def test_count_paths_through_interpolation_matches_its_jacobian(mode):
    kwargs = dict(scale_factor=2, mode=mode.split("-")[0])
    if mode == "bilinear-corners":
        kwargs = dict(size=(5, 7), mode="bilinear", align_corners=True)

    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 1, 1)

        def forward(self, x):
            return nn.functional.interpolate(self.conv(x), **kwargs).flatten(1)

    A = _adjacency_reference(lambda z: nn.functional.interpolate(z, **kwargs), (1, 3, 3))  # non-zero weights
    assert paths.count_paths(Up(), input_shape=(1, 3, 3)).total[-1] == A.sum()


def test_count_paths_refuses_what_it_cannot_count_by_name():
    class Cubic(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 1, 1)

        def forward(self, x):
            return nn.functional.interpolate(self.conv(x), scale_factor=2, mode="bicubic")

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            h = self.lin(x)
            return torch.where(torch.ones_like(h, dtype=torch.bool), h, torch.zeros_like(h))

    with pytest.raises(ValueError, match="mode='bicubic'.*nearest"):
        paths.count_paths(Cubic(), input_shape=(1, 3, 3))
    with pytest.raises(ValueError, match="test_paths.py.*applies where"):
        paths.count_paths(Masked(), input_shape=(3,))


def test_count_paths_through_transposed_convolutions_and_upsampling_matches_brute_force():
    torch.manual_seed(4)
    up, lin = nn.ConvTranspose2d(1, 2, 2, stride=2), nn.Linear(2 * 6 * 6, 3)
    with torch.no_grad():
        up.weight.uniform_(0.5, 1.0)
        lin.weight.uniform_(0.5, 1.0)
    resize = nn.Upsample(size=(6, 6), mode="bilinear")
    net = nn.Sequential(up, nn.ReLU(), resize, nn.Flatten(), lin).double().eval()
    A1 = _adjacency_reference(lambda z: nn.functional.conv_transpose2d(z, up.weight.double(), stride=2), (1, 2, 2))
    A2 = _adjacency_reference(lambda z: resize(z), (2, 4, 4))
    A3 = _adjacency_reference(lambda z: z.flatten(1) @ lin.weight.double().T, (72,))
    ones = torch.ones(4, dtype=torch.float64)
    counts = paths.count_paths(net, input_shape=(1, 2, 2))
    assert counts.total[0] == (A1 @ ones).sum() and counts.total[-1] == (A3 @ A2 @ A1 @ ones).sum()
