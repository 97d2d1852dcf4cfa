"""Kernels: the NPK product form against explicit path features, chunking, the empirical NTK against
autograd, the NTK-NPK constant, kernel ridge, and every documented bad input."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import dgn, nets, npk, npk_fc, ntk
from dualview.gates import UnsupportedLayerError
from dualview.stats import relative_error


def fc_net(widths, bias=True, dtype=torch.float64) -> nn.Sequential:
    return nets.relu_mlp(widths, bias=bias).to(dtype)


# --- the product form (Theorem 3.1) against the explicit NPF Gram matrix -----------------------------

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), d_in=st.integers(1, 5), hidden=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       n=st.integers(1, 6), bias=st.booleans())
def test_product_form_equals_explicit_gram_random(seed, d_in, hidden, n, bias):
    torch.manual_seed(seed)
    net = fc_net([d_in, *hidden, 2], bias=bias)
    x = torch.randn(n, d_in, dtype=torch.float64)
    x2 = torch.randn(n + 1, d_in, dtype=torch.float64)
    # Theorem 3.1: input paths only
    torch.testing.assert_close(npk_fc.npk_fc(net, x, x2, bias_paths=False),
                               npk_fc.npf_gram_reference(net, x, x2, input_paths_only=True), rtol=1e-12, atol=1e-12)
    # the default follows the network's biases: the Gram matrix of all path features (bias paths included)
    torch.testing.assert_close(npk_fc.npk_fc(net, x, x2), npk_fc.npf_gram_reference(net, x, x2),
                               rtol=1e-12, atol=1e-12)
    # overlap = NPK / <x, x'> for bias-free features
    torch.testing.assert_close(npk_fc.npk_fc(net, x, x2, bias_paths=False),
                               (x @ x2.T) * npk_fc.overlap_fc(net, x, x2), rtol=1e-12, atol=1e-12)


def test_product_form_on_real_digits(digits_small):
    x, _ = digits_small
    torch.manual_seed(0)
    for bias in (False, True):
        net = fc_net([64, 5, 4, 3, 10], bias=bias)
        assert relative_error(npk_fc.npk_fc(net, x), npk_fc.npf_gram_reference(net, x)) < 1e-12
        assert relative_error(npk_fc.npk_fc(net, x, bias_paths=False),
                       npk_fc.npf_gram_reference(net, x, input_paths_only=True)) < 1e-12


def test_dgn_gates_from_another_network_match_explicit_features(digits_small):
    x, _ = digits_small
    x = x[:6]
    torch.manual_seed(1)
    value, gating = fc_net([64, 3, 3, 1], bias=False), fc_net([64, 3, 3, 1])
    g = npk_fc.fc_gates(gating, x)
    phi = npk_fc.neural_path_features_from_gates_reference(x, g)
    torch.testing.assert_close(npk_fc.npk_fc(value, x, gating=gating), phi @ phi.T, rtol=1e-12, atol=1e-12)


def test_features_from_own_gates_match_paths_module():
    torch.manual_seed(2)
    net = fc_net([3, 4, 2, 2], bias=False)
    x = torch.randn(5, 3, dtype=torch.float64)
    from dualview.paths import neural_path_features
    torch.testing.assert_close(npk_fc.neural_path_features_from_gates_reference(x, npk_fc.fc_gates(net, x)),
                               neural_path_features(net, x))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(2, 4), perm_seed=st.integers(0, 100))
def test_layer_permutation_invariance(seed, depth, perm_seed):
    torch.manual_seed(seed)
    net = fc_net([4] + [3] * depth + [1])
    x = torch.randn(5, 4, dtype=torch.float64)
    g = npk_fc.fc_gates(net, x)
    perm = torch.randperm(depth, generator=torch.Generator().manual_seed(perm_seed)).tolist()
    gp = [g[k] for k in perm]
    assert torch.equal(npk_fc.npk_from_gates(x, gp), npk_fc.npk_from_gates(x, g))
    phi, phi_p = (npk_fc.neural_path_features_from_gates_reference(x, gg) for gg in (g, gp))
    torch.testing.assert_close(phi_p @ phi_p.T, phi @ phi.T, rtol=1e-12, atol=1e-12)
    # concatenating the gates in one layer gives a sum of the base kernels
    phi_c = npk_fc.neural_path_features_from_gates_reference(x, [torch.cat(g, 1)])
    torch.testing.assert_close(phi_c @ phi_c.T, (x @ x.T) * npk_fc.layer_kernels(g).sum(0), rtol=1e-12, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n1=st.integers(1, 30), n2=st.integers(1, 30), chunk=st.integers(1, 12),
       normalize=st.booleans())
def test_chunked_equals_unchunked(seed, n1, n2, chunk, normalize):
    torch.manual_seed(seed)
    net = fc_net([6, 5, 7, 2])
    x1, x2 = torch.randn(n1, 6, dtype=torch.float64), torch.randn(n2, 6, dtype=torch.float64)
    for fn in (npk_fc.npk_fc, npk_fc.overlap_fc):
        full = fn(net, x1, x2, normalize=normalize)
        # the chunks sum the same float64 terms in another order: equal to rounding
        # (an entry near 0 after cancellation is equal up to an absolute rounding error, not a relative one)
        torch.testing.assert_close(fn(net, x1, x2, normalize=normalize, chunk_size=chunk), full, rtol=1e-12,
                                   atol=1e-13)
    torch.testing.assert_close(npk_fc.npk_fc(net, x1, x2, batch_size=3), npk_fc.npk_fc(net, x1, x2))


def test_gram_of_x1_is_symmetric_and_normalised_factors():
    torch.manual_seed(3)
    net = fc_net([6, 8, 8, 2], bias=False)
    x = torch.randn(9, 6, dtype=torch.float64)
    K = npk_fc.npk_fc(net, x)
    torch.testing.assert_close(K, K.T)
    torch.testing.assert_close(npk_fc.npk_fc(net, x, normalize=True), K / 64)
    base = npk_fc.layer_kernels(npk_fc.fc_gates(net, x), normalize=True)
    assert base.shape == (2, 9, 9) and float(base.max()) <= 1.0


def test_float32_and_dtype_option():
    torch.manual_seed(4)
    net = fc_net([6, 8, 8, 2], dtype=torch.float32)
    x = torch.randn(5, 6)
    assert npk_fc.npk_fc(net, x).dtype == torch.float64
    K32 = npk_fc.npk_fc(net, x, dtype=torch.float32)
    assert K32.dtype == torch.float32
    torch.testing.assert_close(K32.double(), npk_fc.npk_fc(net, x), rtol=1e-5, atol=1e-4)


# --- the empirical NTK --------------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), n1=st.integers(1, 5), n2=st.integers(1, 5), chunk=st.integers(1, 4))
def test_ntk_equals_autograd_reference(seed, n1, n2, chunk):
    torch.manual_seed(seed)
    fixed = dgn.GatedNetwork(fc_net([3, 4, 4, 1], bias=True), fc_net([3, 4, 4, 1]))
    x1, x2 = torch.randn(n1, 3, dtype=torch.float64), torch.randn(n2, 3, dtype=torch.float64)
    for params in ("value", None):
        fast = ntk.empirical_ntk(fixed, x1, x2, params=params, chunk_size=chunk)
        slow = ntk.empirical_ntk_reference(fixed, x1, x2, params=params)
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


def test_ntk_multi_output_and_recompute_path():
    torch.manual_seed(5)
    net = fc_net([3, 5, 3])
    x1, x2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    for output in (1, -1, "trace", "full"):
        ref = ntk.empirical_ntk_reference(net, x1, x2, output=output)
        torch.testing.assert_close(ntk.empirical_ntk(net, x1, x2, output=output, chunk_size=2), ref)
    # a tiny budget forces recomputing the Jacobians of x2 block by block
    small = 2 * 2 * 3 * sum(p.numel() for p in net.parameters()) * 8
    torch.testing.assert_close(ntk.empirical_ntk(net, x1, x2, output="trace", chunk_size=2, memory_budget=small),
                               ntk.empirical_ntk_reference(net, x1, x2, output="trace"))
    names = ["0.weight"]
    torch.testing.assert_close(ntk.empirical_ntk(net, x1, output=0, params=names),
                               ntk.empirical_ntk_reference(net, x1, output=0, params=names))


def test_ntk_npk_constant_formula():
    assert ntk.ntk_npk_constant([0.5] * 3) == pytest.approx(3 * 0.5 ** 4)
    s = [0.3, 0.2, 0.7]
    assert ntk.ntk_npk_constant(s) == pytest.approx(0.2**2 * 0.7**2 + 0.3**2 * 0.7**2 + 0.3**2 * 0.2**2)


def test_ntk_diagonal_term_is_exact_and_wide_ntk_is_close_to_constant_times_npk(digits_small):
    x, _ = digits_small
    x = x[:8]
    torch.manual_seed(6)
    w, d = 256, 3
    gating = fc_net([64, w, w, 1])
    value = ntk.sign_init_(fc_net([64, w, w, 1], bias=False), w ** -0.5, torch.Generator().manual_seed(0))
    torch.testing.assert_close(value[0].weight.abs(), torch.full_like(value[0].weight, w ** -0.5))
    K_ntk = ntk.empirical_ntk(dgn.GatedNetwork(value, gating), x, params="value")
    target = ntk.ntk_npk_constant([w ** -0.5] * d) * npk_fc.npk_fc(value, x, gating=gating)
    assert ntk.relative_deviation(K_ntk, target) < 0.3


# --- kernel methods -----------------------------------------------------------------------------

def test_kernel_ridge_and_normalisation(digits_small):
    x, y = digits_small
    K = x @ x.T
    Kn = npk.normalize_kernel(K, K.diagonal())
    torch.testing.assert_close(Kn.diagonal(), torch.ones(len(x), dtype=torch.float64))
    res = npk.kernel_ridge_classify(Kn, y, Kn, ridge=1e-8)
    assert (res.predictions == y).all()  # interpolates its training set
    assert res.scores.shape == (len(x), 10)


# --- bad input ----------------------------------------------------------------------------------

def test_unsupported_layers_give_clear_errors():
    x = torch.randn(3, 4)
    with pytest.raises(UnsupportedLayerError, match="GELU"):
        npk_fc.npk_fc(nn.Sequential(nn.Linear(4, 3), nn.GELU(), nn.Linear(3, 1)), x)
    conv = nn.Sequential(nn.Conv1d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4, 1))
    with pytest.raises(UnsupportedLayerError, match="fully connected"):
        npk_fc.npk_fc(conv, x.unsqueeze(1)[:, :, :])
    with pytest.raises(UnsupportedLayerError, match="fully connected"):
        npk_fc.fc_gates(conv, torch.randn(3, 1, 6))


def test_mismatched_shapes_give_clear_errors():
    net = fc_net([4, 3, 1])
    with pytest.raises(ValueError, match="features per sample"):
        npk_fc.npk_fc(net, torch.randn(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="hidden widths"):
        npk_fc.npk_fc(net, torch.randn(3, 4, dtype=torch.float64), gating=fc_net([4, 5, 1]))
    g = [torch.ones(3, 2), torch.ones(3, 2)]
    with pytest.raises(ValueError, match="one row per sample"):
        npk_fc.npk_from_gates(torch.randn(4, 4), g)
    with pytest.raises(ValueError, match="same layers and widths"):
        npk_fc.overlap_from_gates(g, [torch.ones(2, 2)])
    with pytest.raises(ValueError, match="together with gates2"):
        npk_fc.npk_from_gates(torch.randn(3, 4), g, x2=torch.randn(3, 4))
    with pytest.raises(ValueError, match="one flag per weight layer"):
        npk_fc.npk_from_gates(torch.randn(3, 4), g, bias=[True])
    with pytest.raises(ValueError, match="have no bias"):
        npk_fc.npk_fc(fc_net([4, 3, 1], bias=False), torch.randn(2, 4, dtype=torch.float64), bias_paths=True)
    with pytest.raises(ValueError, match="chunk_size"):
        npk_fc.npk_from_gates(torch.randn(3, 4), g, chunk_size=0)
    with pytest.raises(ValueError, match="different shapes"):
        ntk.relative_deviation(torch.ones(2, 2), torch.ones(3, 3))
    with pytest.raises(ValueError, match="K_train"):
        npk.kernel_ridge_classify(torch.eye(3), torch.zeros(2, dtype=torch.long), torch.ones(1, 3))
    with pytest.raises(ValueError, match="diagonal"):
        npk.normalize_kernel(torch.zeros(2, 2), torch.zeros(2))


def test_too_large_without_chunking_is_a_clear_error():
    n = 12_000
    x, g = torch.zeros(n, 2), [torch.zeros(n, 1)]
    with pytest.raises(npk_fc.MemoryBudgetError, match="chunk_size"):
        npk_fc.npk_from_gates(x, g)
    with pytest.raises(npk_fc.MemoryBudgetError, match="chunk_size"):
        npk_fc.overlap_from_gates(g)
    small = torch.zeros(50, 2), [torch.zeros(50, 1)]
    with pytest.raises(npk_fc.MemoryBudgetError, match="smaller chunk_size"):
        npk_fc.npk_from_gates(*small, chunk_size=40, memory_budget=1000)
    assert npk_fc.npk_from_gates(*small, chunk_size=1, memory_budget=1000).shape == (50, 50)


def test_ntk_bad_input():
    net = fc_net([3, 4, 2])
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="2 outputs"):
        ntk.empirical_ntk(net, x)
    with pytest.raises(ValueError, match="has 2 outputs"):
        ntk.empirical_ntk(net, x, output=5)
    with pytest.raises(KeyError, match="no parameters"):
        ntk.empirical_ntk(net, x, output=0, params=["nope"])
    with pytest.raises(ValueError, match="no parameters selected"):
        ntk.empirical_ntk(net, x, output=0, params="value")
    with pytest.raises(npk_fc.MemoryBudgetError, match="smaller chunk_size"):
        ntk.empirical_ntk(net, x, output=0, memory_budget=10)
    with pytest.raises(ValueError, match="value_input"):
        dgn.GatedNetwork(net, net, value_input="zeros")
    with pytest.raises(ValueError, match="one sigma per Linear"):
        ntk.sign_init_(net, [0.1])


def test_fixed_gates_stays_eval_and_uses_gating_gates():
    torch.manual_seed(7)
    value, gating = fc_net([3, 4, 1]), fc_net([3, 4, 1])
    fixed = dgn.GatedNetwork(value, gating).train()
    assert fixed.value.training and not fixed.gating.training
    x = torch.randn(5, 3, dtype=torch.float64)
    G = (gating[0](x) > 0).double()
    torch.testing.assert_close(fixed(x), value[2](value[0](x) * G))
    ones = dgn.GatedNetwork(value, gating, value_input="ones")
    torch.testing.assert_close(ones(x), value[2](value[0](torch.ones_like(x)) * G))


# ---------------------------------------------------------------------------------------------------
# npk.npk: one entry point that picks the theorem from the network


def _three_networks():
    torch.manual_seed(0)
    fc = nets.relu_mlp([6, 5, 4, 3], bias=False).double()
    conv = nets.circular_convnet(2, [3, 3], num_outputs=1).double()
    res = nets.FCResNet(6, 4, 2, 2).double()
    return {"fc": (fc, torch.randn(7, 6, dtype=torch.float64)),
            "conv": (conv, torch.randn(7, 2, 5, dtype=torch.float64)),
            "resnet": (res, torch.randn(7, 6, dtype=torch.float64))}


def test_npk_entry_point_picks_each_theorem_and_its_diagonal():
    from dualview import npk_conv, npk_resnet
    forms = {"fc": npk_fc.npk_fc, "conv": npk_conv.npk_conv_reference, "resnet": npk_resnet.npk_resnet_reference}
    for kind, (model, x) in _three_networks().items():
        if kind == "resnet":  # its slow reference costs about 6 s per pair of inputs: 4 inputs, not 7
            x = x[:4]
        n, half = len(x), len(x) // 2
        want = forms[kind](model, x[:half], x[half:])   # the conv and resnet forms against their slow references
        assert relative_error(npk.npk(model, x[:half], x[half:]), want) < 1e-10, kind
        full = forms[kind](model, x, None)
        diag = npk.npk(model, x, diag=True, block=3)    # blocks of at most 3 inputs, never the n x n matrix
        assert diag.shape == (n,) and relative_error(diag, full.diagonal()) < 1e-10, kind


def test_npk_entry_point_with_a_gating_network_and_bad_input():
    torch.manual_seed(1)
    value, gating = (nets.relu_mlp([6, 5, 4, 1], bias=False).double() for _ in range(2))
    x = torch.randn(5, 6, dtype=torch.float64)
    with_gates = npk.npk(value, x, gates=gating)
    assert relative_error(with_gates, npk_fc.npk_fc(value, x, gating=gating)) < 1e-12
    assert relative_error(with_gates, npk.npk(value, x)) > 1e-3     # the gates are really the gating network's
    with pytest.raises(UnsupportedLayerError, match="no closed-form NPK"):
        npk.npk(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 1)), x)
    with pytest.raises(ValueError, match="leave x2 out"):
        npk.npk(value, x, x, diag=True)
    with pytest.raises(ValueError, match="block must be"):
        npk.npk(value, x, diag=True, block=0)
    res = nets.FCResNet(6, 4, 2, 2).double()
    with pytest.raises(ValueError, match="ResNet's NPK uses its own gates"):
        npk.npk(res, x, gates=res)
