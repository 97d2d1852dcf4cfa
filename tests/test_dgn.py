"""DGN: DGN = DNN when the two networks share weights, soft gates tend to hard gates, permuted gates
land where stated, fixed gates from any network pair, DLGN hyperplanes are exact, every architecture
builds at paper scale, bad inputs fail."""
from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import dgn, gates, hyperplanes, nets
from dualview.architectures import Architecture, site_blocks, site_shapes

SMALL = {
    "fc": Architecture.fc((7, 7, 7, 7), in_shape=(1, 8, 8)),
    "conv": Architecture.c4gap(width=5, in_shape=(3, 8, 8)),
    "conv-circular-bn": Architecture.conv_gap((4, 4, 4), in_shape=(1, 8, 8), padding_mode="circular", batch_norm=True),
    "vgg-max": Architecture.vgg((4, 4, "P", 6, "P", 6, 6, "P"), in_shape=(3, 16, 16)),
    "vgg-avg": Architecture.vgg((4, 4, "P", 6, "P", 6, 6, "P"), in_shape=(3, 16, 16), pool="avg"),
    "resnet20": Architecture.resnet(20),
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
    dnn = dgn.build(arch, "dnn").double()
    with torch.no_grad():
        _randomize_bn(dnn, torch.Generator().manual_seed(1))
    dnn.eval()
    pg = dgn.build(arch, "dgn", pretrained=dnn).double()  # gating network: a copy of the DNN, hard gates
    pg.value.load_state_dict(dnn.state_dict())           # value network: the same weights
    pg.eval()
    x = _input(arch, 6, seed=2, digits=_digits_images(digits_small) if real else None)
    with torch.no_grad():
        assert torch.equal(pg(x), dnn(x))
    assert pg.mode == "pg" and pg.kind == "dgn" and pg.temperature == 0


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_hard_gates_are_the_limit_of_soft_gates(seed):
    torch.manual_seed(seed)
    arch = SMALL["fc"]
    soft = dgn.build(arch, "dgn", value_input="ones").double().eval()
    hard = copy.deepcopy(soft)
    hard.temperature = 0.0
    x = torch.rand(5, *arch.in_shape, dtype=torch.float64)
    errors = []
    with torch.no_grad():
        target = hard(x)
        for temperature in (1.0, 0.1, 1e-3, 1e-5, 1e-9):
            soft.temperature = temperature
            errors.append((soft(x) - target).abs().max().item())
    # each gate sigmoid(q / temperature) tends to 1{q > 0}; the output error need not shrink monotonically
    # (paths of both signs), but it vanishes in the limit
    assert errors[-1] < 1e-6 < errors[0] and min(errors[2:]) < errors[0], errors


@settings(max_examples=10, deadline=None)
@given(perm=st.permutations(range(4)), ones=st.booleans(), seed=st.integers(0, 1000))
def test_permuted_gates_are_applied_in_the_stated_order(perm, ones, seed):
    torch.manual_seed(seed)
    arch = SMALL["conv"]
    net = dgn.build(arch, "dgn", temperature=0, permutation=perm, value_input="ones" if ones else "x").double()
    x = torch.rand(3, *arch.in_shape, dtype=torch.float64)
    with torch.no_grad():
        trace = net.trace(x)
        ref = dgn.gated_forward_reference(net, x)
    torch.testing.assert_close(trace.output, ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the forward pass itself (not only the trace) applies the permutation
        torch.testing.assert_close(net(x), ref, rtol=1e-12, atol=1e-12)
    for l, i in enumerate(perm):
        assert torch.equal(trace.gates[l], (trace.gating_preactivations[i] > 0).double())
        assert torch.equal(trace.value_outputs[l], trace.value_preactivations[l] * trace.gates[l])


def _pooled_convnet() -> nn.Sequential:
    """A network of our own (not from an Architecture): batch norm, max-pooling, two equal gate layers."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(64, 3)).double()


def test_fixed_gates_of_any_network_pair_follow_the_gates_reference(digits_small):
    torch.manual_seed(11)
    value, gating = _pooled_convnet(), _pooled_convnet()
    with torch.no_grad():
        _randomize_bn(gating, torch.Generator().manual_seed(12))
    before = copy.deepcopy((value.state_dict(), gating.state_dict()))
    x = _digits_images(digits_small)
    for perm in (None, (0, 2, 1)):
        fixed = dgn.GatedNetwork(value, gating, permutation=perm).eval()   # hard, frozen gates
        with torch.no_grad():
            torch.testing.assert_close(fixed(x), dgn.gated_forward_reference(fixed, x), rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the same gates by hand: G(x) of the gating network, imposed on the value network
        own = gates.run_with_gates(value.eval(), x, gates.record_gates(gating.eval(), x).gates)
        torch.testing.assert_close(dgn.GatedNetwork(value, gating)(x), own, rtol=1e-12, atol=1e-12)
    # the networks passed in are copied, never modified; a batch-norm value network trains in train mode
    assert all(torch.equal(a, b) for d0, d1 in zip(before, (value.state_dict(), gating.state_dict()))
               for a, b in zip(d0.values(), d1.values()))
    assert all(p.requires_grad for p in gating.parameters()) and fixed.value is not value
    st_net = dgn.GatedNetwork(value.train(), gating, temperature=0.1, frozen=False).train()
    st_net(x).sum().backward()
    assert st_net.mode == "st" and st_net.gating.training
    assert all(p.grad is not None for p in st_net.value.parameters())
    head = st_net.gating.net[-1]  # the gating network's own output layer sets no gate
    assert all((p.grad is not None) != any(p is h for h in head.parameters()) for p in st_net.gating.parameters())
    assert all(p.grad is None for p in value.parameters())


def test_temperature_is_the_inverse_of_the_papers_beta():
    st_model = dgn.build(SMALL["fc"], "dgn")  # standalone: the papers' soft gates, beta = 10
    q = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    assert st_model.temperature == 0.1 and torch.equal(st_model.gate(q), torch.sigmoid(10 * q))
    st_model.temperature = 0
    assert torch.equal(st_model.gate(q), (q > 0).float())


def test_gated_network_refuses_networks_it_cannot_pair():
    a, b, wide = nets.relu_mlp([4, 5, 5, 2]), nets.relu_mlp([4, 5, 2]), nets.relu_mlp([4, 5, 6, 2])
    with pytest.raises(ValueError, match="same architecture"):
        dgn.GatedNetwork(a, b)
    with pytest.raises(ValueError, match="permutation of range"):
        dgn.GatedNetwork(a, a, permutation=(0, 0))
    with pytest.raises(ValueError, match="same shape"):
        dgn.GatedNetwork(wide, wide, permutation=(1, 0))(torch.randn(3, 4))
    with pytest.raises(gates.UnsupportedLayerError, match="value network.*GELU"):
        dgn.GatedNetwork(nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.Linear(5, 2)), b)
    inplace_gating = nn.Sequential(nn.Linear(4, 5), nn.ReLU(inplace=True), nn.Linear(5, 2))
    paired = dgn.GatedNetwork(b, inplace_gating)  # the copy's in-place ReLUs are turned off, the user's kept
    assert inplace_gating[1].inplace
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(paired(x), b[2](b[0](x) * (inplace_gating[0](x) > 0)))
    with pytest.raises(gates.UnsupportedLayerError, match="no gate sites"):
        dgn.GatedNetwork(nn.Linear(4, 2), nn.Linear(4, 2))

    class Twice(nn.Module):  # one ReLU module used twice: its two calls would need two gates
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2, self.relu, self.out = nn.Linear(4, 5), nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 2)

        def forward(self, x):
            return self.out(self.relu(self.lin2(self.relu(self.lin1(x)))))

    with pytest.raises(RuntimeError, match="once per forward pass"):
        dgn.GatedNetwork(Twice(), Twice())(torch.randn(3, 4))
    with pytest.raises(TypeError, match="nn.Module"):
        dgn.GatedNetwork(a, "gating")


def test_reverse_within_blocks_and_permutations_of_unequal_layers():
    vgg = Architecture.vgg16()
    assert dgn.reverse_within_blocks(vgg) == (1, 0, 3, 2, 6, 5, 4, 9, 8, 7, 12, 11, 10)
    assert [len(b) for b in site_blocks(vgg)] == [2, 2, 3, 3, 3]
    r110 = Architecture.resnet(110)
    assert [len(b) for b in site_blocks(r110)] == [1, 36, 36, 36]
    perm = dgn.reverse_within_blocks(r110)
    assert perm[0] == 0 and perm[1] == 36 and perm[37] == 72
    with pytest.raises(ValueError, match="same shape"):
        dgn.build(Architecture.fc((8, 6, 8, 8), in_shape=(1, 4, 4)), "dgn", permutation=(1, 0, 2, 3))
    with pytest.raises(ValueError, match="same shape"):
        dgn.build(SMALL["vgg-max"], "dlgn", permutation=(2, 1, 0, 3, 4))   # crosses a pooling
    with pytest.raises(ValueError, match="permutation of range"):
        dgn.build(SMALL["fc"], "dgn", permutation=(0, 0, 1, 2))
    assert len(dgn.sample_permutations(4)) == 23
    assert len(set(dgn.sample_permutations(4, 6, seed=3))) == 6
    with pytest.raises(ValueError):
        dgn.sample_permutations(4, 24)


@pytest.mark.parametrize("real", [False, True])
def test_dlgn_effective_hyperplanes_reproduce_the_gating_preactivations(real, digits_small):
    torch.manual_seed(3)
    arch = SMALL["fc"]
    dlgn = dgn.build(arch, "dlgn").double().eval()
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
        dlgn = dgn.build(arch, "dlgn", gating=gating).double()
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
    net = dgn.build(arch, "dgn").double().eval()
    x = _input(arch, 12, 0, digits=_digits_images(digits_small))
    w, b = hyperplanes.local_hyperplanes(net, x, site=3, units=[1, 2])
    q = net.gating_preactivations(x)[3][:, [1, 2]]
    torch.testing.assert_close((w * x.flatten(1)[:, None]).sum(-1) + b, q.detach())
    # the gating network restricted to x's own gates is linear: its weight is the product of the
    # weight matrices with the gating ReLUs of x frozen (dualview.gates)
    rec = gates.record_gates(net.gating.net, x[:1])
    inner = nn.Sequential(OrderedDict(list(net.gating.net.named_children())[:-2]))  # up to the input of the last ReLU (site 3)
    lower = {k: v for k, v in rec.gates.items() if k != "relu4"}
    jac = torch.func.jacrev(lambda z: gates.run_with_gates(inner, z, lower))(x[:1])
    torch.testing.assert_close(w[0], jac[0, [1, 2], 0].flatten(1))
    assert not torch.allclose(w[0], w[1])  # a DGN's gates are not one hyperplane


def test_pretrained_gates_are_frozen_copied_and_stay_in_eval_mode():
    arch = SMALL["vgg-avg"]
    dnn = dgn.build(arch, "dnn")
    before = copy.deepcopy(dnn.state_dict())
    pg = dgn.build(arch, "dgn", pretrained=dnn)
    pg.train()
    assert not pg.gating.training and pg.value.training
    assert all(not p.requires_grad for p in pg.gating.parameters())
    assert all(p.requires_grad for p in pg.value.parameters())
    x = torch.rand(4, *arch.in_shape)
    pg(x).sum().backward()
    assert all(p.grad is None for p in pg.gating.parameters())
    assert all(torch.equal(v, dnn.state_dict()[k]) for k, v in before.items())
    assert dnn.training and all(p.requires_grad for p in dnn.parameters())
    st_model = dgn.build(arch, "dlgn")
    assert st_model.mode == "st" and st_model.temperature == 0.1  # the papers' soft gates sigmoid(10 q)


def test_dnn_and_gating_networks_are_recordable_linear_networks_have_no_gates():
    arch = SMALL["resnet20"]
    dnn = dgn.build(arch, "dnn").eval()
    x = torch.rand(2, 3, 32, 32)
    rec = gates.record_gates(dnn, x)
    assert len(rec.names) == len(site_shapes(arch)) == 19
    net = dgn.build(arch, "dgn").eval()
    assert len(gates.record_gates(net.gating.net, x).names) == 19
    assert gates.record_gates(dgn.build(arch, "linear").eval(), x).names == []
    with pytest.raises(gates.UnsupportedLayerError):
        gates.check_supported(net)  # the value network's GaLUs are not ReLUs


PAPER_SCALE = [
    (Architecture.fc(), ["dnn", "dgn", "dlgn"]),
    (Architecture.c4gap(128), ["dgn", "dlgn"]),
    (Architecture.conv1(512), ["dnn", "linear"]),
    (Architecture.vgg16(pool="avg"), ["linear", "dgn"]),
    (Architecture.vgg16(pool="max"), ["linear", "dlgn"]),
    (Architecture.resnet(110), ["dgn", "dlgn"]),
]


@pytest.mark.parametrize("arch,kinds", PAPER_SCALE, ids=[a.name + "-" + a.pool for a, _ in PAPER_SCALE])
def test_paper_scale_architectures_run_forward_and_backward(arch, kinds):
    torch.manual_seed(0)
    x = torch.rand(2, *arch.in_shape)
    for kind in kinds:
        perm = dgn.reverse_within_blocks(arch) if kind in ("dgn", "dlgn") else None
        net = dgn.build(arch, kind, permutation=perm, value_input="ones" if kind == "dlgn" else "x")
        out = net(x)
        assert out.shape == (2, 10) and torch.isfinite(out).all()
        out.sum().backward()
        if not isinstance(net, dgn.GatedNetwork):
            assert all(p.grad is not None for p in net.parameters())
        else:
            assert all(p.grad is not None for p in net.value.parameters())
            assert any(p.grad is not None for p in net.gating.parameters())  # soft gates pass gradients


def test_vgg16_shallow_gating_and_the_dual_lifting_ladder():
    x = torch.rand(2, 3, 32, 32)
    sf = dgn.build(Architecture.vgg16(pool="avg"), "dlgn", gating="shallow", value_input="ones")
    sf(x).sum().backward()
    assert len(sf.gating.branches) == 13
    ladder = hyperplanes.dual_lifting_ladder(SMALL["vgg-max"], Architecture.conv1(6, in_shape=(3, 16, 16)))
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
        dgn.build(arch, "cnn")
    with pytest.raises(ValueError, match="value_input"):
        dgn.build(arch, "dgn", value_input="zeros")
    with pytest.raises(ValueError, match="hard gates"):
        dgn.build(arch, "dgn", temperature="relu")
    with pytest.raises(ValueError, match="only apply to gated networks"):
        dgn.build(arch, "dnn", value_input="ones")
    with pytest.raises(ValueError, match="use kind='dlgn'"):
        dgn.build(arch, "dgn", gating="shallow")
    with pytest.raises(ValueError, match="temperature"):
        dgn.build(arch, "dgn", temperature=-0.1)
    with pytest.raises(TypeError, match="Architecture"):
        dgn.build("FC4", "dgn")
    with pytest.raises(ValueError, match="gate sites"):
        dgn.build(arch, "dgn", pretrained=dgn.build(Architecture.fc((7, 7), in_shape=(1, 8, 8)), "dnn"))
    with pytest.raises(ValueError, match="linear network"):
        dgn.build(arch, "dlgn", pretrained=dgn.build(arch, "dnn"))
    with pytest.raises(ValueError, match="6n \\+ 2"):
        Architecture.resnet(21)
    with pytest.raises(ValueError, match="'P'"):
        Architecture.conv_gap((4, "P", 4))
    with pytest.raises(ValueError, match="positive integer"):
        Architecture.fc(())
    with pytest.raises(ValueError, match="pool"):
        Architecture.vgg((4, "P"), pool="min")
    with pytest.raises(RuntimeError, match="without a gate"):
        dgn.build(arch, "dgn").value(torch.rand(1, 1, 8, 8))
    net = dgn.build(arch, "dgn").eval()
    with pytest.raises(ValueError, match="ReLUs"):
        hyperplanes.effective_hyperplanes(net)
    with pytest.raises(TypeError, match="GatedNetwork"):
        hyperplanes.effective_hyperplanes(dgn.build(arch, "dnn"))
    bn = dgn.build(SMALL["conv-circular-bn"], "dlgn")  # in training mode
    with pytest.raises(ValueError, match="model.eval"):
        hyperplanes.effective_hyperplanes(bn)
    with pytest.raises(ValueError, match="max_entries"):
        hyperplanes.effective_hyperplanes(dgn.build(Architecture.fc(), "dlgn").eval(), max_entries=1000)
    with pytest.raises(ValueError, match="units"):
        hyperplanes.local_hyperplanes(net, torch.rand(2, 1, 8, 8), site=0, units=[99])
    inplace = dgn.build(arch, "dnn")
    inplace.relu2 = nn.ReLU(inplace=True)
    with pytest.raises(ValueError, match="in-place"):  # a DeepGating reads the user's own network
        dgn.DeepGating(inplace)
    with pytest.raises(ValueError, match="site must lie"):
        hyperplanes.local_hyperplanes(net, torch.rand(2, 1, 8, 8), site=4, units=[0])
    with pytest.raises(ValueError, match="ResNets"):
        dgn.build(Architecture.resnet(20), "dlgn", gating="shallow")


def _relu_calls(model: nn.Module, x: torch.Tensor) -> int:
    """ReLU module calls in one forward pass, counted by hooks (an independent count of the gate sites)."""
    calls = []
    hooks = [m.register_forward_hook(lambda *a: calls.append(1)) for m in model.modules() if isinstance(m, nn.ReLU)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return len(calls)


def test_gated_network_from_a_torchvision_resnet():
    """resnet18 calls each block's in-place ReLU twice: from_model gives every call its own gate site, and with
    value and gating copies of the same network the gated network is the network. Yours is never modified."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).double().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [m.inplace for m in model.modules() if isinstance(m, nn.ReLU)]
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="once per forward"):  # the plain constructor cannot gate it
        dgn.GatedNetwork(model, model)(x)
    net = dgn.GatedNetwork.from_model(model)
    assert _relu_calls(model, x) == 17
    assert net.gating.num_sites == len(net._value_sites) == 17
    with torch.no_grad():
        torch.testing.assert_close(net(x), model(x), rtol=1e-12, atol=1e-12)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    mixed = dgn.GatedNetwork.from_model(other, model)  # value weights of other, gates of model
    assert not torch.allclose(mixed(x), model(x)) and not torch.allclose(mixed(x), other(x))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert [m.inplace for m in model.modules() if isinstance(m, nn.ReLU)] == flags and all(flags)
    assert all(not m.training for m in model.modules())


def test_one_relu_per_use_makes_functional_and_shared_relus_modules():
    import torch.nn.functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c, self.relu = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2), nn.ReLU()

        def forward(self, x):
            return self.c(self.relu(self.b(F.relu(self.a(x)))) + self.relu(self.b(x.new_zeros(1, 6))))

    torch.manual_seed(0)
    model, x = Net().double().eval(), torch.randn(3, 4, dtype=torch.float64)
    copy_ = dgn.one_relu_per_use(model)
    assert sum(isinstance(m, nn.ReLU) for m in copy_.modules()) == 3 == _relu_calls(copy_, x)
    assert copy_.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(copy_(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(gates.record_gates(copy_, x).output, model(x).detach())  # now recordable

    class Reread(nn.Module):  # an in-place ReLU whose input is read again: out of place would change it
        def __init__(self):
            super().__init__()
            self.a, self.relu = nn.Linear(4, 4), nn.ReLU(inplace=True)

        def forward(self, x):
            h = self.a(x)
            return self.relu(h) + h

    with pytest.raises(gates.UnsupportedLayerError, match="read"):
        dgn.one_relu_per_use(Reread())
