"""Chapters 3-4 kernels: the rotation sum of circular convolutional networks (Theorem 3.2 / Lemma F.1)
and the ensemble sum of residual networks (Theorem 3.3 / Lemma G.1), against explicit path
enumeration; rotation invariance; path counts (Propositions F.1, F.2, G.1); clear errors."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import data, nets, npk_conv, npk_resnet, paths
from dualview.gates import UnsupportedLayerError
from dualview.stats import relative_error


@pytest.fixture(scope="module")
def mnist1d_small() -> torch.Tensor:
    x, _ = data.load_mnist1d("test", num_samples=200)
    return x[:6].double()


# --- the rotation sum against explicit bundles ---------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(3, 7), channels=st.lists(st.integers(1, 3), min_size=1, max_size=2),
       fc=st.lists(st.integers(1, 3), max_size=1), kernel=st.sampled_from([1, 3]), head=st.sampled_from(["gap", "flatten"]),
       in_channels=st.integers(1, 2))
def test_rotation_sum_equals_bundle_gram_random_1d(seed, length, channels, fc, kernel, head, in_channels):
    torch.manual_seed(seed)
    net = nets.circular_convnet(in_channels, channels, fc, 2, kernel_size=kernel, head=head, spatial=length).double()
    x = torch.randn(3, in_channels, length, dtype=torch.float64)
    x2 = torch.randn(2, in_channels, length, dtype=torch.float64)
    b = npk_conv.bundle_features_reference(net, x)
    # the bundles reproduce the network (the dual identity), so they are the right reference
    torch.testing.assert_close(b.features @ b.values, net(x), rtol=1e-10, atol=1e-12)
    assert relative_error(npk_conv.npk_conv(net, x, x2), npk_conv.npk_conv_reference(net, x, x2)) < 1e-12
    # Proposition F.2: d_in paths per bundle with pooling; singletons without it
    assert set(b.sizes.tolist()) == ({length} if head == "gap" else {1})


@pytest.mark.parametrize("head", ["gap", "flatten"])
def test_rotation_sum_2d_and_dilation(head):
    torch.manual_seed(1)
    net = nets.circular_convnet(1, [2, 2], [2], 2, kernel_size=3, dims=2, head=head, spatial=(4, 3)).double()
    x = torch.randn(3, 1, 4, 3, dtype=torch.float64)
    assert relative_error(npk_conv.npk_conv(net, x), npk_conv.npk_conv_reference(net, x)) < 1e-12
    dil = nn.Sequential(nn.Conv1d(1, 2, 3, padding=2, dilation=2, padding_mode="circular", bias=False), nn.ReLU(),
                        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(2, 1, bias=False)).double()
    z = torch.randn(4, 1, 6, dtype=torch.float64)
    assert relative_error(npk_conv.npk_conv(dil, z), npk_conv.npk_conv_reference(dil, z)) < 1e-12


def test_rotation_sum_on_real_signals(mnist1d_small):
    torch.manual_seed(2)
    net = nets.circular_convnet(1, [2, 2], [2], 10, kernel_size=3).double()
    x = mnist1d_small[:3, :, :12]  # a window of real MNIST-1D signals keeps the enumeration small
    assert relative_error(npk_conv.npk_conv(net, x), npk_conv.npk_conv_reference(net, x)) < 1e-12


def test_lemma_f1_both_forms_and_overlap_definition():
    """Lambda computed as the count of jointly active paths per input position equals the
    explicit sum over bundles of A(x, b(i)) A(rot(x', r), b(i)), and the two forms of Lemma F.1 agree."""
    torch.manual_seed(3)
    net = nets.circular_convnet(1, [2], [2], 1, kernel_size=3).double()
    x = torch.randn(2, 1, 5, dtype=torch.float64)
    s = npk_conv.conv_structure(net, x.shape[1:])
    g = npk_conv.conv_gates(net, x, s)
    lam = npk_conv.conv_overlap(s, g)  # (2, 2, R, d)
    # explicit: activity of the path from input i through tap t and filter c to hidden unit u
    conv = net.conv1
    for a, bb, r in itertools.product(range(2), range(2), range(5)):
        rotated = npk_conv.rotate(x[bb:bb + 1], r)
        gr = npk_conv.conv_gates(net, rotated, s)
        for i in range(5):
            total = 0.0
            for t, c, u in itertools.product(range(3), range(2), range(2)):
                pos = (i - t + conv.padding[0]) % 5
                total += (g[0][a, c, pos] * gr[0][0, c, pos] * g[1][a, u] * gr[1][0, u]).item()
            assert abs(lam[a, bb, r, i].item() - total / 25) < 1e-12
    # second line of Lemma F.1, written out: rotate x instead of x', with the gates of each rotated input
    # (not the rotated gates) and the overlap counted path by path; npk_conv computes the first line
    x1, x2 = x[:1], x[1:]
    g2 = npk_conv.conv_gates(net, x2, s)
    second = 0.0
    for r in range(5):
        xr = npk_conv.rotate(x1, r)
        gr = npk_conv.conv_gates(net, xr, s)
        for i in range(5):
            overlap = 0.0
            for t, c, u in itertools.product(range(3), range(2), range(2)):
                pos = (i - t + conv.padding[0]) % 5
                overlap += (gr[0][0, c, pos] * g2[0][0, c, pos] * gr[1][0, u] * g2[1][0, u]).item()
            second += xr[0, 0, i].item() * x2[0, 0, i].item() * overlap / 25
    first = npk_conv.npk_conv(net, x1, x2)[0, 0].item()
    assert abs(first) > 1e-3 and abs(first - second) < 1e-12 * abs(first)


# --- rotation invariance -----------------------------------------------------------------------------

def test_kernel_and_output_invariant_with_pooling_not_without(mnist1d_small):
    torch.manual_seed(4)
    x = mnist1d_small
    gap = nets.circular_convnet(1, [8, 8], [8], 10, kernel_size=5).double()
    flat = nets.circular_convnet(1, [8, 8], [8], 10, kernel_size=5, head="flatten", spatial=40).double()
    for r in (1, 7, 20):
        xr = npk_conv.rotate(x, r)
        assert relative_error(gap(xr), gap(x)) < 1e-12
        assert relative_error(npk_conv.npk_conv(gap, xr, x), npk_conv.npk_conv(gap, x)) < 1e-12
        assert relative_error(flat(xr), flat(x)) > 1e-3
        assert relative_error(npk_conv.npk_conv(flat, xr, x), npk_conv.npk_conv(flat, x)) > 1e-3


def test_constant_input_and_permuted_gates_keep_invariance(mnist1d_small):
    torch.manual_seed(5)
    x = mnist1d_small
    gating = nets.circular_convnet(1, [6, 6, 6], [], 10, kernel_size=3).double()
    s = npk_conv.conv_structure(gating, x.shape[1:])
    ones = torch.ones_like(x)
    g = npk_conv.conv_gates(gating, x, s)
    perm = [g[2], g[0], g[1]]
    for r in (3, 11):
        gr = npk_conv.conv_gates(gating, npk_conv.rotate(x, r), s)
        permr = [gr[2], gr[0], gr[1]]
        base = npk_conv.npk_conv_from_gates(s, ones, g)
        assert relative_error(npk_conv.npk_conv_from_gates(s, ones, g, ones, gr), base) < 1e-12
        pbase = npk_conv.npk_conv_from_gates(s, ones, perm)
        assert relative_error(npk_conv.npk_conv_from_gates(s, ones, perm, ones, permr), pbase) < 1e-12


def test_chunked_conv_npk_equals_whole():
    torch.manual_seed(6)
    net = nets.circular_convnet(1, [3], [], 2, kernel_size=3)
    x = torch.randn(7, 1, 9)
    y = torch.randn(5, 1, 9)
    whole = npk_conv.npk_conv(net, x, y)
    torch.testing.assert_close(npk_conv.npk_conv(net, x, y, chunk_size=2), whole)
    assert whole.dtype == torch.float64 and whole.shape == (7, 5)


def test_rotate_definition():
    x = torch.arange(5.0).view(1, 1, 5)
    assert npk_conv.rotate(x, 2).flatten().tolist() == [2.0, 3.0, 4.0, 0.0, 1.0]  # rot(x, r)(i) = x(i + r)
    img = torch.arange(6.0).view(1, 1, 2, 3)
    assert npk_conv.rotate(img, (1, 1))[0, 0, 0, 0].item() == img[0, 0, 1, 1].item()


# --- the ensemble sum --------------------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), d_in=st.integers(1, 3), width=st.integers(1, 3), d_blk=st.integers(1, 2),
       b=st.integers(0, 2), outputs=st.integers(1, 2))
def test_ensemble_sum_equals_concatenated_features(seed, d_in, width, d_blk, b, outputs):
    torch.manual_seed(seed)
    net = nets.fc_resnet(d_in, width, d_blk, b, outputs).double()
    x = torch.randn(3, d_in, dtype=torch.float64)
    x2 = torch.randn(2, d_in, dtype=torch.float64)
    phi, v = npk_resnet.resnet_path_features_reference(net, x)
    torch.testing.assert_close(phi @ v, net(x), rtol=1e-10, atol=1e-12)
    ref = npk_resnet.npk_resnet_reference(net, x, x2)
    assert relative_error(npk_resnet.npk_resnet(net, x, x2), ref) < 1e-12
    terms = sum(npk_resnet.npk_resnet_subnetwork(net, x, x2, subset=J)
                for k in range(b + 1) for J in itertools.combinations(range(b), k))
    assert relative_error(terms, ref) < 1e-12
    # Proposition G.1 against the enumerated paths and the unit-weight count
    count = paths.resnet_path_count(d_in, width, d_blk, b, outputs)
    assert count == phi.shape[1] * outputs == round(paths.count_paths(net, input_shape=(d_in,)).total[-1].item())


def test_block_subsets_are_every_set_of_blocks_once():
    subsets = npk_resnet.block_subsets(3)
    assert sorted(subsets) == sorted(tuple(j for j in range(3) if mask >> j & 1) for mask in range(8))  # 2^b sets
    assert subsets[0] == () and subsets[-1] == (0, 1, 2) and all(list(s) == sorted(s) for s in subsets)
    assert npk_resnet.block_subsets(0) == [()]
    with pytest.raises(ValueError, match="number of residual blocks"):
        npk_resnet.block_subsets(-1)


def test_ensemble_sum_on_real_digits(digits_small):
    x, _ = digits_small
    x = x[:5].view(5, 8, 8)[:, 2:5, 2:4].flatten(1).double()  # 6 real pixels keep the enumeration small
    torch.manual_seed(7)
    net = nets.fc_resnet(6, 3, 1, 3).double()
    assert relative_error(npk_resnet.npk_resnet(net, x), npk_resnet.npk_resnet_reference(net, x)) < 1e-12


def test_deleting_blocks_and_path_counts():
    torch.manual_seed(8)
    net = nets.fc_resnet(4, 5, 2, 3)
    x = torch.randn(6, 4)
    full = net(x)
    assert not torch.allclose(net(x, skip=(1,)), full)
    assert len(net.subnetwork((0, 2))) == 4 * 2
    assert paths.conv_path_count(7, 3, [4, 4], [4], 1) == 7 * (3 * 4) ** 2 * 4  # Proposition F.1 (w = 4)
    conv = nets.circular_convnet(2, [3, 2], [4], 3, kernel_size=3)
    assert paths.conv_path_count(9, 3, [3, 2], [4], 3, in_channels=2) == round(
        paths.count_paths(conv, input_shape=(2, 9)).total[-1].item())


# --- clear errors --------------------------------------------------------------------------------------

def test_errors_name_the_broken_assumption():
    base = dict(kernel_size=3, padding=1, bias=False)
    zeros = nn.Sequential(nn.Conv1d(1, 2, padding_mode="zeros", **base), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                          nn.Flatten(), nn.Linear(2, 1, bias=False))
    with pytest.raises(UnsupportedLayerError, match="circular"):
        npk_conv.conv_structure(zeros, (1, 8))
    strided = nn.Sequential(nn.Conv1d(1, 2, 3, stride=2, padding=1, padding_mode="circular", bias=False), nn.ReLU(),
                            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(2, 1, bias=False))
    with pytest.raises(UnsupportedLayerError, match="stride"):
        npk_conv.conv_structure(strided, (1, 8))
    biased = nn.Sequential(nn.Conv1d(1, 2, 3, padding=1, padding_mode="circular"), nn.ReLU(),
                           nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(2, 1, bias=False))
    with pytest.raises(UnsupportedLayerError, match="bias"):
        npk_conv.conv_structure(biased, (1, 8))
    valid = nn.Sequential(nn.Conv1d(1, 2, 3, padding=0, padding_mode="circular", bias=False), nn.ReLU(),
                          nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(2, 1, bias=False))
    with pytest.raises(UnsupportedLayerError, match="padding"):
        npk_conv.conv_structure(valid, (1, 8))
    maxpool = nn.Sequential(nn.Conv1d(1, 2, 3, padding=1, padding_mode="circular", bias=False), nn.ReLU(),
                            nn.MaxPool1d(2), nn.Flatten(), nn.Linear(8, 1, bias=False))
    with pytest.raises(UnsupportedLayerError, match="MaxPool1d"):
        npk_conv.conv_structure(maxpool, (1, 8))
    with pytest.raises(UnsupportedLayerError, match="circular convolutions"):
        npk_conv.conv_structure(nn.Sequential(nn.Flatten(), nn.Linear(8, 1)), (1, 8))
    net = nets.circular_convnet(1, [2], [], 1)
    with pytest.raises(ValueError, match="shape"):
        npk_conv.npk_conv_from_gates(npk_conv.conv_structure(net, (1, 8)), torch.randn(2, 1, 7),
                                    npk_conv.conv_gates(net, torch.randn(2, 1, 8)))
    with pytest.raises(ValueError, match="spatial"):
        nets.circular_convnet(1, [2], head="flatten")
    with pytest.raises(UnsupportedLayerError, match="FCResNet"):
        npk_resnet.npk_resnet(nn.Sequential(nn.Linear(2, 1)), torch.randn(2, 2))
    with pytest.raises(ValueError, match="blocks \\[5\\]"):
        nets.fc_resnet(2, 2, 1, 2).subnetwork((5,))
    with pytest.raises(ValueError, match="d_blk"):
        nets.fc_resnet(2, 2, 0, 2)
    with pytest.raises(ValueError, match="split"):
        data.load_mnist1d("validation")
