"""Models: DGN = DNN when the two networks share weights, soft gates tend to hard gates, permuted gates
land where stated, DLGN hyperplanes are exact, every architecture builds at paper scale, bad inputs fail."""
from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import gates, hyperplanes, models

SMALL = {
    "fc": models.fc((7, 7, 7, 7), in_shape=(1, 8, 8)),
    "conv": models.c4gap(width=5, in_shape=(3, 8, 8)),
    "conv-circular-bn": models.conv_gap((4, 4, 4), in_shape=(1, 8, 8), padding_mode="circular", batch_norm=True),
    "vgg-max": models.vgg((4, 4, "P", 6, "P", 6, 6, "P"), in_shape=(3, 16, 16)),
    "vgg-avg": models.vgg((4, 4, "P", 6, "P", 6, 6, "P"), in_shape=(3, 16, 16), pool="avg"),
    "resnet20": models.resnet(20),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tiny networks run faster on one thread (no OpenMP synchronisation); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _digits_images(digits_small, n=12):
    """Real 8x8 digits as (n, 1, 8, 8) float64 images."""
    return digits_small[0][:n].view(-1, 1, 8, 8)


def _randomize_bn(net: nn.Module, gen: torch.Generator) -> None:
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)


def _input(arch, n, seed, digits=None):
    if digits is not None and arch.in_shape == (1, 8, 8):
        return digits[:n]
    return torch.rand(n, *arch.in_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("real", [False, True])
def test_dgn_sharing_weights_and_input_equals_the_dnn(name, real, digits_small):
    arch = SMALL[name]
    torch.manual_seed(0)
    dnn = models.build(arch, "dnn").double()
    with torch.no_grad():
        _randomize_bn(dnn, torch.Generator().manual_seed(1))
    dnn.eval()
    dgn = models.build(arch, "dgn", pretrained=dnn).double()  # gating network: a copy of the DNN, hard gates
    dgn.value.load_state_dict(dnn.state_dict())           # value network: the same weights
    dgn.eval()
    x = _input(arch, 6, seed=2, digits=_digits_images(digits_small) if real else None)
    with torch.no_grad():
        assert torch.equal(dgn(x), dnn(x))
    assert dgn.mode == "pg" and dgn.kind == "dgn" and dgn.gate_fn == "hard"


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_hard_gates_are_the_limit_of_soft_gates(seed):
    torch.manual_seed(seed)
    arch = SMALL["fc"]
    soft = models.build(arch, "dgn", value_input="ones").double().eval()
    hard = copy.deepcopy(soft)
    hard.gate_fn = "hard"
    x = torch.rand(5, *arch.in_shape, dtype=torch.float64)
    errors = []
    with torch.no_grad():
        target = hard(x)
        for beta in (1.0, 10.0, 1e3, 1e5, 1e9):
            soft.beta = beta
            errors.append((soft(x) - target).abs().max().item())
    # each gate sigmoid(beta q) tends to 1{q > 0}; the output error need not shrink monotonically
    # (paths of both signs), but it vanishes in the limit
    assert errors[-1] < 1e-6 < errors[0] and min(errors[2:]) < errors[0], errors


@settings(max_examples=10, deadline=None)
@given(perm=st.permutations(range(4)), ones=st.booleans(), seed=st.integers(0, 1000))
def test_permuted_gates_are_applied_in_the_stated_order(perm, ones, seed):
    torch.manual_seed(seed)
    arch = SMALL["conv"]
    dgn = models.build(arch, "dgn", gate="hard", permutation=perm, value_input="ones" if ones else "x").double()
    x = torch.rand(3, *arch.in_shape, dtype=torch.float64)
    with torch.no_grad():
        trace = dgn.trace(x)
        ref = models.gated_forward_reference(dgn, x)
    torch.testing.assert_close(trace.output, ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the forward pass itself (not only the trace) applies the permutation
        torch.testing.assert_close(dgn(x), ref, rtol=1e-12, atol=1e-12)
    for l, i in enumerate(perm):
        assert torch.equal(trace.gates[l], (trace.gating_preactivations[i] > 0).double())
        assert torch.equal(trace.value_outputs[l], trace.value_preactivations[l] * trace.gates[l])


def test_reverse_within_blocks_and_permutations_of_unequal_layers():
    vgg = models.vgg16()
    assert models.reverse_within_blocks(vgg) == (1, 0, 3, 2, 6, 5, 4, 9, 8, 7, 12, 11, 10)
    assert [len(b) for b in models.site_blocks(vgg)] == [2, 2, 3, 3, 3]
    r110 = models.resnet(110)
    assert [len(b) for b in models.site_blocks(r110)] == [1, 36, 36, 36]
    perm = models.reverse_within_blocks(r110)
    assert perm[0] == 0 and perm[1] == 36 and perm[37] == 72
    with pytest.raises(ValueError, match="same shape"):
        models.build(models.fc((8, 6, 8, 8), in_shape=(1, 4, 4)), "dgn", permutation=(1, 0, 2, 3))
    with pytest.raises(ValueError, match="same shape"):
        models.build(SMALL["vgg-max"], "dlgn", permutation=(2, 1, 0, 3, 4))   # crosses a pooling
    with pytest.raises(ValueError, match="permutation of range"):
        models.build(SMALL["fc"], "dgn", permutation=(0, 0, 1, 2))
    assert len(models.sample_permutations(4)) == 23
    assert len(set(models.sample_permutations(4, 6, seed=3))) == 6
    with pytest.raises(ValueError):
        models.sample_permutations(4, 24)


@pytest.mark.parametrize("real", [False, True])
def test_dlgn_effective_hyperplanes_reproduce_the_gating_preactivations(real, digits_small):
    torch.manual_seed(3)
    arch = SMALL["fc"]
    dlgn = models.build(arch, "dlgn").double().eval()
    x = _input(arch, 10, seed=4, digits=_digits_images(digits_small) if real else None)
    planes = hyperplanes.effective_hyperplanes(dlgn)
    ref = hyperplanes.effective_hyperplanes_reference(dlgn)
    with torch.no_grad():
        q = dlgn.gating_preactivations(x)
    for l, (w, b) in enumerate(zip(planes.weight, planes.bias)):
        torch.testing.assert_close(w, ref.weight[l], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b, ref.bias[l], rtol=1e-10, atol=1e-12)
    for qa, qb in zip(planes.preactivations(x), q):
        torch.testing.assert_close(qa, qb, rtol=1e-10, atol=1e-12)
    # the local hyperplane of a DLGN unit is the same at every input: the effective one
    w_loc, b_loc = hyperplanes.local_hyperplanes(dlgn, x, site=2, units=[0, 3])
    torch.testing.assert_close(w_loc, planes.weight[2][[0, 3]].expand(len(x), 2, -1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b_loc, planes.bias[2][[0, 3]].expand(len(x), 2), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["conv", "conv-circular-bn", "vgg-avg"])
def test_conv_dlgn_hyperplanes_and_shallow_gating(name):
    torch.manual_seed(5)
    arch = SMALL[name]
    for gating in ("deep", "shallow"):
        dlgn = models.build(arch, "dlgn", gating=gating).double()
        with torch.no_grad():
            _randomize_bn(dlgn, torch.Generator().manual_seed(6))
        dlgn.eval()
        x = torch.rand(4, *arch.in_shape, dtype=torch.float64)
        planes = hyperplanes.effective_hyperplanes(dlgn)
        with torch.no_grad():
            for qa, qb in zip(planes.preactivations(x), dlgn.gating_preactivations(x)):
                torch.testing.assert_close(qa, qb.flatten(1), rtol=1e-10, atol=1e-11)


def test_dgn_local_hyperplanes_are_exact_but_change_with_the_input(digits_small):
    torch.manual_seed(7)
    arch = SMALL["fc"]
    dgn = models.build(arch, "dgn").double().eval()
    x = _input(arch, 12, 0, digits=_digits_images(digits_small))
    w, b = hyperplanes.local_hyperplanes(dgn, x, site=3, units=[1, 2])
    q = dgn.gating_preactivations(x)[3][:, [1, 2]]
    torch.testing.assert_close((w * x.flatten(1)[:, None]).sum(-1) + b, q.detach())
    # the gating network restricted to x's own gates is linear: its weight is the product of the
    # weight matrices with the gating ReLUs of x frozen (dualview.gates)
    rec = gates.record_gates(dgn.gating.net, x[:1])
    inner = nn.Sequential(OrderedDict(list(dgn.gating.net.named_children())[:-2]))  # up to the input of the last ReLU (site 3)
    lower = {k: v for k, v in rec.gates.items() if k != "relu4"}
    jac = torch.func.jacrev(lambda z: gates.run_with_gates(inner, z, lower))(x[:1])
    torch.testing.assert_close(w[0], jac[0, [1, 2], 0].flatten(1))
    assert not torch.allclose(w[0], w[1])  # a DGN's gates are not one hyperplane


def test_pretrained_gates_are_frozen_copied_and_stay_in_eval_mode():
    arch = SMALL["vgg-avg"]
    dnn = models.build(arch, "dnn")
    before = copy.deepcopy(dnn.state_dict())
    pg = models.build(arch, "dgn", pretrained=dnn)
    pg.train()
    assert not pg.gating.training and pg.value.training
    assert all(not p.requires_grad for p in pg.gating.parameters())
    assert all(p.requires_grad for p in pg.value.parameters())
    x = torch.rand(4, *arch.in_shape)
    pg(x).sum().backward()
    assert all(p.grad is None for p in pg.gating.parameters())
    assert all(torch.equal(v, dnn.state_dict()[k]) for k, v in before.items())
    assert dnn.training and all(p.requires_grad for p in dnn.parameters())
    st_model = models.build(arch, "dlgn")
    assert st_model.mode == "st" and st_model.gate_fn == "soft" and st_model.beta == 10.0


def test_dnn_and_gating_networks_are_recordable_linear_networks_have_no_gates():
    arch = SMALL["resnet20"]
    dnn = models.build(arch, "dnn").eval()
    x = torch.rand(2, 3, 32, 32)
    rec = gates.record_gates(dnn, x)
    assert len(rec.names) == len(models.site_shapes(arch)) == 19
    dgn = models.build(arch, "dgn").eval()
    assert len(gates.record_gates(dgn.gating.net, x).names) == 19
    assert gates.record_gates(models.build(arch, "linear").eval(), x).names == []
    with pytest.raises(gates.UnsupportedLayerError):
        gates.check_supported(dgn)  # the value network's GaLUs are not ReLUs


PAPER_SCALE = [
    (models.fc(), ["dnn", "dgn", "dlgn"]),
    (models.c4gap(128), ["dgn", "dlgn"]),
    (models.conv1(512), ["dnn", "linear"]),
    (models.vgg16(pool="avg"), ["linear", "dgn"]),
    (models.vgg16(pool="max"), ["linear", "dlgn"]),
    (models.resnet(110), ["dgn", "dlgn"]),
]


@pytest.mark.parametrize("arch,kinds", PAPER_SCALE, ids=[a.name + "-" + a.pool for a, _ in PAPER_SCALE])
def test_paper_scale_architectures_run_forward_and_backward(arch, kinds):
    torch.manual_seed(0)
    x = torch.rand(2, *arch.in_shape)
    for kind in kinds:
        perm = models.reverse_within_blocks(arch) if kind in ("dgn", "dlgn") else None
        net = models.build(arch, kind, permutation=perm, value_input="ones" if kind == "dlgn" else "x")
        out = net(x)
        assert out.shape == (2, 10) and torch.isfinite(out).all()
        out.sum().backward()
        if not isinstance(net, models.GatedNetwork):
            assert all(p.grad is not None for p in net.parameters())
        else:
            assert all(p.grad is not None for p in net.value.parameters())
            assert any(p.grad is not None for p in net.gating.parameters())  # soft gates pass gradients


def test_vgg16_shallow_gating_and_the_dual_lifting_ladder():
    x = torch.rand(2, 3, 32, 32)
    sf = models.build(models.vgg16(pool="avg"), "dlgn", gating="shallow", value_input="ones")
    sf(x).sum().backward()
    assert len(sf.gating.branches) == 13
    ladder = hyperplanes.dual_lifting_ladder(SMALL["vgg-max"], models.conv1(6, in_shape=(3, 16, 16)))
    assert [m.name for m in ladder] == ["CONV1-LIN", "VGG-LIN", "CONV1", "VGG-LIN-MAX", "VGG-AVG", "VGG",
                                        "DLGN-SHALLOW", "DLGN", "DLGN-MAX"]
    xs = torch.rand(2, 3, 16, 16)
    for m in ladder:
        assert m.model(xs).shape == (2, 10)
    dlgn_max = ladder[-1].model.eval()
    with pytest.raises(ValueError, match="max-pooling"):
        hyperplanes.effective_hyperplanes(dlgn_max)


def test_documented_errors():
    arch = SMALL["fc"]
    with pytest.raises(ValueError, match="kind"):
        models.build(arch, "cnn")
    with pytest.raises(ValueError, match="value_input"):
        models.build(arch, "dgn", value_input="zeros")
    with pytest.raises(ValueError, match="gate"):
        models.build(arch, "dgn", gate="relu")
    with pytest.raises(ValueError, match="only apply to gated networks"):
        models.build(arch, "dnn", value_input="ones")
    with pytest.raises(ValueError, match="use kind='dlgn'"):
        models.build(arch, "dgn", gating="shallow")
    with pytest.raises(ValueError, match="beta"):
        models.build(arch, "dgn", beta=0)
    with pytest.raises(TypeError, match="Architecture"):
        models.build("FC4", "dgn")
    with pytest.raises(ValueError, match="gate sites"):
        models.build(arch, "dgn", pretrained=models.build(models.fc((7, 7), in_shape=(1, 8, 8)), "dnn"))
    with pytest.raises(ValueError, match="linear network"):
        models.build(arch, "dlgn", pretrained=models.build(arch, "dnn"))
    with pytest.raises(ValueError, match="6n \\+ 2"):
        models.resnet(21)
    with pytest.raises(ValueError, match="'P'"):
        models.conv_gap((4, "P", 4))
    with pytest.raises(ValueError, match="positive integer"):
        models.fc(())
    with pytest.raises(ValueError, match="pool"):
        models.vgg((4, "P"), pool="min")
    with pytest.raises(RuntimeError, match="without a gate"):
        models.build(arch, "dgn").value(torch.rand(1, 1, 8, 8))
    dgn = models.build(arch, "dgn").eval()
    with pytest.raises(ValueError, match="ReLUs"):
        hyperplanes.effective_hyperplanes(dgn)
    with pytest.raises(TypeError, match="GatedNetwork"):
        hyperplanes.effective_hyperplanes(models.build(arch, "dnn"))
    bn = models.build(SMALL["conv-circular-bn"], "dlgn")  # in training mode
    with pytest.raises(ValueError, match="model.eval"):
        hyperplanes.effective_hyperplanes(bn)
    with pytest.raises(ValueError, match="max_entries"):
        hyperplanes.effective_hyperplanes(models.build(models.fc(), "dlgn").eval(), max_entries=1000)
    with pytest.raises(ValueError, match="units"):
        hyperplanes.local_hyperplanes(dgn, torch.rand(2, 1, 8, 8), site=0, units=[99])
    inplace = models.build(arch, "dnn")
    inplace.relu2 = nn.ReLU(inplace=True)
    with pytest.raises(ValueError, match="in-place"):
        models.build(arch, "dgn", pretrained=inplace)
    with pytest.raises(ValueError, match="site must lie"):
        hyperplanes.local_hyperplanes(dgn, torch.rand(2, 1, 8, 8), site=4, units=[0])
    with pytest.raises(ValueError, match="ResNets"):
        models.build(models.resnet(20), "dlgn", gating="shallow")
