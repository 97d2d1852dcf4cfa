"""Switched linear projections and Insens: Theorem 1, the fast sweeps against the per-neuron
references, Eq. 4-8, cut-off neurons and every documented bad input."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import gates, nets
from dualview import projections as P
from dualview.gates import UnsupportedLayerError, record_gates, register_linear_layer
from dualview.receptive_fields import conv_plan
from tiny_models import conv_net as tiny_conv_net
from tiny_models import spread_batchnorm


def fc_net(widths=(6, 5, 4)) -> nn.Module:
    return nn.Sequential(nn.Flatten(), *nets.relu_mlp(list(widths))).double()


def conv_net(pool: str = "max") -> nn.Module:
    """For 2x6x6 inputs: a BatchNorm with non-trivial statistics (eval mode), a ceil-mode pool, float64."""
    return spread_batchnorm(tiny_conv_net(2, (3, 4), side=6, batchnorm=True, pool=pool, second_padding=0,
                                          head_pool=nn.MaxPool2d(2, ceil_mode=True), hidden=5, dtype=torch.float64))


def theorem1_error(p: P.SwitchedProjections) -> float:
    return (torch.einsum("nud,nd->nu", p.weight, p.x) + p.bias - p.preactivation).abs().max().item()


NETS = {"fc": (lambda: fc_net(), (6,)), "conv-max": (lambda: conv_net("max"), (2, 6, 6)),
        "conv-avg": (lambda: conv_net("avg"), (2, 6, 6))}


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 3), kind=st.sampled_from(sorted(NETS)))
def test_theorem1_and_fast_equals_reference_on_random_nets(seed, n, kind):
    torch.manual_seed(seed)
    make, shape = NETS[kind]
    net = make()
    x = torch.randn(n, *shape, dtype=torch.float64)
    fast = P.switched_projections(net, x, chunk_size=40)
    ref = P.switched_projections_reference(net, x)
    assert theorem1_error(fast) < 1e-12
    torch.testing.assert_close(fast.weight, ref.weight, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast.bias, ref.bias, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast.preactivation, ref.preactivation)
    assert fast.slices == ref.slices and fast.shapes == ref.shapes


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(sorted(NETS)), chunk=st.integers(24, 240))
def test_insens_equals_direct_eq8(seed, kind, chunk):
    torch.manual_seed(seed)
    make, shape = NETS[kind]
    net = make()
    x = torch.randn(3, *shape, dtype=torch.float64)
    fast = P.insens(net, x, chunk_size=chunk)
    ref = P.insens_reference(net, x)
    torch.testing.assert_close(fast.omega, ref.omega, rtol=1e-10, atol=1e-12)
    assert torch.equal(fast.n_inactive, ref.n_inactive) and torch.equal(fast.n_cut_off, ref.n_cut_off)
    assert fast.n_hidden == ref.n_hidden
    # and from the materialised projections: Eq. 7 per neuron, then the mean of Eq. 8
    p = P.switched_projections(net, x)
    keep = (~p.active & ~p.cut_off).unsqueeze(-1)
    direct = (p.omega() * keep).sum(1) / keep.sum(1).clamp_min(1)
    torch.testing.assert_close(fast.omega.flatten(1), direct, rtol=1e-10, atol=1e-12)


def test_decomposition_and_centre_on_real_digits(digits_small):
    torch.manual_seed(0)
    x, _ = digits_small
    net = fc_net((64, 16, 12, 10))
    p = P.switched_projections(net, x[:10])
    assert theorem1_error(p) < 1e-12
    ok = ~p.cut_off
    torch.testing.assert_close(p.decomposition().sum(-1)[ok], p.preactivation[ok])  # Eq. 5
    c = p.centre()
    on_plane = torch.einsum("nud,nud->nu", c, p.weight) + p.bias  # the centre is a root: <c, w> + b = 0
    assert on_plane[ok].abs().max() < 1e-10
    torch.testing.assert_close(p.x.unsqueeze(1) - c, p.omega(), equal_nan=True)  # Eq. 7: omega = x - c
    ref = P.switched_projections_reference(net, x[:3])
    torch.testing.assert_close(p.weight[:3], ref.weight)


def test_cut_off_neurons_are_marked_and_left_out():
    net = fc_net((3, 2, 2, 2))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))
        net[1].bias.fill_(-10.0)  # both first-layer units off for small inputs
        net[3].bias.copy_(torch.tensor([-1.0, 2.0]))
    x = torch.randn(4, 3, dtype=torch.float64)
    p = P.switched_projections(net, x)
    second = p.layer("4", p.cut_off)
    assert second.all() and not p.layer("2", p.cut_off).any()
    assert p.layer("4", p.centre()).isnan().all()
    assert (p.layer("4", p.omega()) == 0).all()
    torch.testing.assert_close(p.layer("4", p.preactivation), torch.tensor([[-1.0, 2.0]] * 4, dtype=torch.float64))
    r = P.insens(net, x)
    assert r.n_cut_off.tolist() == [1] * 4  # the inactive cut-off neuron (q = -1); the active one is not counted
    assert r.n_inactive.tolist() == [2] * 4
    ref = P.insens_reference(net, x)
    torch.testing.assert_close(r.omega, ref.omega)
    assert torch.equal(r.n_cut_off, ref.n_cut_off)
    # first layer only: omega_i = q_i w_i / |w_i|^2 = (x_i - 10) e_i, averaged over 2 neurons
    expected = torch.stack([(x[:, 0] - 10) / 2, (x[:, 1] - 10) / 2, torch.zeros(4, dtype=torch.float64)], 1)
    torch.testing.assert_close(r.omega, expected)


def test_a_neuron_at_exactly_q_0_is_inactive_and_counted():
    # Eq. 8 averages over q_i <= 0: a neuron sitting on its hyperplane (q = 0, w != 0) adds nothing to the
    # sum but counts in |I|. Weights rows (1, -1), (1, 1), (-1, -2) at x = (1, 1): q = (0, 2, -3), exactly.
    net = nn.Sequential(nn.Linear(2, 3, bias=False), nn.ReLU(), nn.Linear(3, 1)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, -1.0], [1.0, 1.0], [-1.0, -2.0]]))
    x = torch.ones(1, 2, dtype=torch.float64)
    by_hand = (-3.0 * torch.tensor([-1.0, -2.0], dtype=torch.float64) / 5.0) / 2  # (0 + q_3 w_3 / |w_3|^2) / 2
    for result in (P.insens(net, x), P.insens(net, x, structure=False), P.insens_reference(net, x)):
        assert result.n_inactive.tolist() == [2] and result.n_cut_off.tolist() == [0]
        torch.testing.assert_close(result.omega[0], by_hand, rtol=1e-14, atol=0)


def test_the_shared_insens_coefficients_are_eq8_written_out():
    """insens and insens_estimate share one coefficient block (projections._frozen): a_i = q_i / |w_i|^2 / |I| on
    the inactive neurons (q_i <= 0, w_i != 0), checked against a loop over neurons; with a stack of norms (the
    estimate's leave-one-group-out ones) each slice is the call with those norms, inactivity decided by the first."""
    from dualview.projections._frozen import inactive_coefficients

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 7, dtype=torch.float64, generator=g)
    q[0, 0] = 0.0  # on its hyperplane: inactive, counted
    sq = torch.rand(3, 7, dtype=torch.float64, generator=g) + 0.1
    sq[1, :3] = 0.0  # cut off where q <= 0
    a = inactive_coefficients(q, sq)
    ref, n_in, n_cut = torch.zeros_like(q), [0] * 3, [0] * 3
    for s in range(3):
        for i in range(7):
            if q[s, i] <= 0 and sq[s, i] > 0:
                ref[s, i], n_in[s] = q[s, i] / sq[s, i], n_in[s] + 1
            elif q[s, i] <= 0:
                n_cut[s] += 1
        ref[s] /= max(n_in[s], 1)
    torch.testing.assert_close(a.coef, ref, rtol=1e-15, atol=0)
    assert a.n_inactive.tolist() == n_in and a.n_cut_off.tolist() == n_cut
    other = sq * 2
    stacked = inactive_coefficients(q, sq, torch.stack([sq, other])).coef
    torch.testing.assert_close(stacked[0], a.coef, rtol=0, atol=0)
    torch.testing.assert_close(stacked[1], a.coef / 2, rtol=1e-15, atol=0)


def test_residual_network_and_reused_relu():
    class Block(nn.Module):
        """One ReLU module called twice (as torchvision's ResNet blocks do) and an in-place ReLU
        whose input is not read again."""

        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.relu = nn.ReLU()
            self.relu_inplace = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.b(self.relu_inplace(self.a(self.relu(x)) + x)) + self.relu(x)

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(3, 4), Block(), nn.ReLU(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    fast = P.switched_projections(net, x)
    ref = P.switched_projections_reference(net, x)
    assert fast.names == ["1.relu", "1.relu_inplace", "1.relu#1", "2"]
    torch.testing.assert_close(fast.weight, ref.weight)
    assert theorem1_error(fast) < 1e-12
    torch.testing.assert_close(P.insens(net, x).omega, P.insens_reference(net, x).omega)


@pytest.fixture(scope="module")
def mnist_cnn_and_digits():
    from dualview import data, zoo

    try:
        model = zoo.load_pretrained("mnist-cnn-20-50-500", download=False)
        x = data.load_mnist("test", download=False).x[:2]
    except FileNotFoundError as err:
        pytest.skip(f"offline data not available: {err}")
    return model, x


def test_theorem1_on_pretrained_cnn(mnist_cnn_and_digits):
    model, x = mnist_cnn_and_digits
    p = P.switched_projections(model, x)
    assert p.weight.shape == (2, 20 * 24 * 24 + 50 * 8 * 8 + 500, 784)
    scale = p.preactivation.abs().max().item()
    assert theorem1_error(p) < 1e-5 * scale  # float32
    ref = P.switched_projections_reference(model, x[:1], layers=["net.relu3"])
    torch.testing.assert_close(p.layer("net.relu3", p.weight)[:1], ref.weight, rtol=1e-4, atol=1e-6)
    fc = P.insens(model, x)
    keep = (~p.active & ~p.cut_off).unsqueeze(-1)
    direct = (p.omega() * keep).sum(1) / keep.sum(1)
    torch.testing.assert_close(fc.omega.flatten(1), direct, rtol=1e-4, atol=1e-7)
    # the share of active hidden neurons (Table 3): the neurons with q > 0 among all switched projections
    share = gates.active_share(model, x, per_layer=False)
    torch.testing.assert_close(share, p.active.double().mean(1))


def test_bad_inputs_give_clear_errors():
    net = fc_net()
    x = torch.randn(2, 6, dtype=torch.float64)
    with pytest.raises(UnsupportedLayerError, match="GELU"):
        P.insens(nn.Sequential(nn.Linear(6, 3), nn.GELU(), nn.Linear(3, 2)).double(), x)
    with pytest.raises(UnsupportedLayerError, match="training mode"):
        P.switched_projections(conv_net().train(), torch.randn(1, 2, 6, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="batch"):
        P.insens(net, torch.randn(6, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating-point"):
        P.switched_projections(net, torch.ones(2, 6, dtype=torch.long))
    with pytest.raises(TypeError, match="nn.Module"):
        P.insens(lambda z: z, x)
    with pytest.raises(KeyError, match="unknown layer"):
        P.switched_projections(net, x, layers=["fc9"])
    with pytest.raises(ValueError, match="chunk_size"):
        P.insens(net, x, chunk_size=0)
    with pytest.raises(ValueError, match="no ReLU"):
        P.insens(nn.Linear(6, 2).double(), x)
    with pytest.raises(ValueError, match="no ReLU"):
        P.switched_projections(nn.Linear(6, 2).double(), x)
    with pytest.raises(ValueError, match="batch_size"):
        gates.active_share(net, x, batch_size=0, per_layer=False)
    p = P.switched_projections(net, x)
    with pytest.raises(KeyError, match="no layer"):
        p.layer("nope", p.weight)


# --------------------------------------------------------------------------------------------------
# The receptive-field fast path of insens (structure=True, dualview.receptive_fields) against the reference


def _random_bn(net: nn.Module) -> nn.Module:
    return spread_batchnorm(net, weight=(-1.5, 1.5)).double().eval()  # negative BatchNorm weights too


class _Shift(nn.Module):
    """A point-wise affine map that declares itself so (as nets.Normalize does)."""

    pointwise = True

    def forward(self, x):
        return 2.0 * x - 0.5


register_linear_layer(_Shift)

# every layer type the fast path handles, with strides, padding, dilation, pools, point-wise maps,
# nested Sequentials, several input channels, receptive fields larger than the image, and tails
STRUCTURED = {
    "conv-pool-fc": (lambda: nn.Sequential(
        nn.Conv2d(2, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 5, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(125, 7), nn.ReLU(), nn.Linear(7, 3)), (2, 12, 12)),
    "stride-dilation-avgpool": (lambda: nn.Sequential(
        _Shift(), nn.Conv2d(1, 3, 3, stride=2, padding=2, dilation=2), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(27, 4)), (1, 12, 12)),
    "batchnorm-nested-dropout": (lambda: nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 3, (3, 2)), nn.BatchNorm2d(3), nn.ReLU()), nn.Flatten(),
        nn.Linear(330, 6), nn.ReLU(), nn.Dropout(0.2), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2)), (1, 12, 12)),
    "overlapping-pool": (lambda: nn.Sequential(
        nn.Conv2d(1, 2, 5), nn.ReLU(), nn.MaxPool2d(2, stride=1), nn.Conv2d(2, 2, 5, padding=3), nn.ReLU(),
        nn.Flatten(), nn.Linear(162, 3)), (1, 12, 12)),
    "field-over-image-height": (lambda: nn.Sequential(
        nn.Conv2d(1, 2, 5, padding=2), nn.ReLU(), nn.Conv2d(2, 2, 5, padding=2), nn.ReLU(), nn.Flatten(),
        nn.Linear(280, 3)), (1, 7, 20)),
    "groups-padded-dilated-pools": (lambda: nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, groups=2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1, dilation=2),
        nn.Conv2d(4, 3, 2), nn.ReLU(), nn.AvgPool2d(3, stride=1, padding=1), nn.Flatten(), nn.Linear(147, 3)),
        (2, 17, 17)),
    "relu-after-flatten": (lambda: nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.Flatten(), nn.ReLU(), nn.Linear(200, 3)), (1, 12, 12)),
}


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 3), kind=st.sampled_from(sorted(STRUCTURED)),
       chunk=st.sampled_from([7, 64, 1024]))
def test_insens_fast_path_equals_reference_on_random_conv_nets(seed, n, kind, chunk):
    torch.manual_seed(seed)
    make, shape = STRUCTURED[kind]
    net = _random_bn(make())
    x = torch.randn(n, *shape, dtype=torch.float64)
    x[:, :, :2] = 0.0  # zero pixels, as on real digits
    names = record_gates(net, x).names
    assert conv_plan(net, x, names) is not None, "the fast path must be taken for this network"
    fast = P.insens(net, x, chunk_size=chunk)
    ref = P.insens_reference(net, x)
    torch.testing.assert_close(fast.omega, ref.omega, rtol=1e-10, atol=1e-12)
    assert torch.equal(fast.n_inactive, ref.n_inactive) and torch.equal(fast.n_cut_off, ref.n_cut_off)
    generic = P.insens(net, x, structure=False)
    torch.testing.assert_close(fast.omega, generic.omega, rtol=1e-10, atol=1e-12)


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.relu, self.flat, self.fc = nn.Conv2d(1, 1, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(36, 2)

    def forward(self, x):
        return self.fc(self.flat(self.relu(self.conv(x)) + x))


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True), nn.Flatten(), nn.Linear(8, 2)),
    lambda: nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="circular"), nn.ReLU(), nn.Flatten(),
                          nn.Linear(72, 2)),
    lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 2)),
    lambda: _Residual(),
], ids=["ceil-mode", "circular", "global-pool", "custom-forward"])
def test_insens_declines_the_fast_path_where_fields_are_unknown_and_stays_exact(make):
    torch.manual_seed(0)
    net = make().double().eval()
    x = torch.randn(2, 1, 6, 6, dtype=torch.float64)
    assert conv_plan(net, x, record_gates(net, x).names) is None
    torch.testing.assert_close(P.insens(net, x).omega, P.insens_reference(net, x).omega, rtol=1e-10, atol=1e-12)


def test_insens_fast_path_on_the_pretrained_cnn(mnist_cnn_and_digits):
    model, x = mnist_cnn_and_digits
    assert conv_plan(model, x, record_gates(model, x).names) is not None  # Normalize is point-wise
    # against the generic sweep over all 784 pixels (itself checked against the per-neuron reference
    # above; the reference on all 15,220 neurons takes a minute, so benchmarks/insens.py runs it)
    fast, generic = P.insens(model, x), P.insens(model, x, structure=False)
    assert ((fast.omega - generic.omega).abs().max() / generic.omega.abs().max()).item() <= 1e-5
    assert torch.equal(fast.n_inactive, generic.n_inactive) and torch.equal(fast.n_cut_off, generic.n_cut_off)
