"""Tests of dualview.pullbacks: surrogate backward, restoration, oracles (Zennit, autograd, explicit paths)."""
from __future__ import annotations

import copy
import weakref

import pytest
import torch
import torch.nn.functional as F
import torchvision
import zennit.composites as zc
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import gates, paths, pullbacks as pb, surrogates, zoo
from dualview.gates import UnsupportedLayerError
from tiny_models import conv_net as tiny_conv_net
from tiny_models import spread_batchnorm


# ------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def resnet20() -> nn.Module:
    return zoo.load_pretrained("resnet20")


@pytest.fixture(scope="module")
def cifar_batch() -> torch.Tensor:
    from dualview import data

    d = data.load_cifar10("test")
    return d.x[torch.arange(0, 10000, 2500)]  # 4 real CIFAR-10 test images, of 4 classes


def conv_net(seed: int = 0, dtype=torch.float32) -> nn.Sequential:
    """For 3x14x14 inputs: a BatchNorm whose statistics and affine parameters are away from 0 and 1 (its factor
    is tested too) and an overlapping max pool."""
    net = tiny_conv_net(3, (6, 8), 5, side=14, batchnorm=True, second_padding=0,
                        head_pool=nn.MaxPool2d(3, stride=2, padding=1), hidden=16, seed=seed)
    return spread_batchnorm(net, var=(0.3, 3.0), weight=(0.5, 2.0)).to(dtype)


def zennit_pullback(model: nn.Module, x: torch.Tensor, target, temperature: float) -> torch.Tensor:
    """The oracle: Zennit's ReLUBetaSmooth rule (beta = 1 / temperature) on every nn.ReLU."""
    composite = zc.BetaSmooth(beta_smooth=1.0 / temperature)
    xg = x.clone().requires_grad_(True)
    t = torch.as_tensor(target).reshape(-1).expand(len(x))
    with composite.context(model) as modified:
        out = modified(xg)
        (g,) = torch.autograd.grad(out.gather(1, t[:, None]).sum(), xg)
    return g


def snapshot(model: nn.Module) -> dict:
    hooks = {}
    for name, m in model.named_modules():
        hooks[name] = tuple(len(d) for d in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks,
                                             m._forward_hooks_always_called, m._forward_hooks_with_kwargs))
    return dict(
        state={k: v.clone() for k, v in model.state_dict().items()},
        modules=[(n, type(m), id(m)) for n, m in model.named_modules()],
        hooks=hooks,
        forward={n: m.__dict__.get("forward") for n, m in model.named_modules()},
        training=[m.training for m in model.modules()],
    )


def assert_restored(model: nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["modules"] == before["modules"]
    assert after["hooks"] == before["hooks"]
    assert after["forward"] == before["forward"]
    assert after["training"] == before["training"]
    assert before["state"].keys() == after["state"].keys()
    assert all(torch.equal(before["state"][k], after["state"][k]) for k in before["state"])
    assert torch._C._len_torch_function_stack() == 0


# ------------------------------------------------------------------------------------------------
# the oracle: Zennit's ReLUBetaSmooth


def test_equals_zennit_on_pretrained_resnet20(resnet20, cifar_batch):
    target = torch.arange(len(cifar_batch)) % 10
    for tau in (0.3,):  # the temperature range is covered on the random conv net below
        ours = pb.excitation_pullback(resnet20, cifar_batch, target, temperature=tau)
        ref = zennit_pullback(resnet20, cifar_batch, target, tau)
        assert torch.allclose(ours, ref, rtol=1e-4, atol=1e-6 * ref.abs().max())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), tau=st.floats(0.05, 2.0), target=st.integers(0, 4))
def test_equals_zennit_on_random_conv_net(seed, tau, target):
    net = conv_net(seed, torch.float64)
    x = torch.randn(3, 3, 14, 14, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    # Zennit does not touch max-pools: compare with our max-pools kept hard
    ours = pb.excitation_pullback(net, x, target, temperature=tau, pool_temperature=0)
    ref = zennit_pullback(net, x, target, tau)
    assert torch.allclose(ours, ref, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# tau -> 0 is the plain gradient


def plain_gradient(model, x, target):
    xg = x.clone().requires_grad_(True)
    out = model(xg)
    t = torch.as_tensor(target).reshape(-1).expand(len(x))
    return torch.autograd.grad(out.gather(1, t[:, None]).sum(), xg)[0]


def test_zero_temperature_is_plain_gradient(resnet20, cifar_batch):
    ref = plain_gradient(resnet20, cifar_batch, 3)
    assert torch.equal(pb.input_gradient(resnet20, cifar_batch, 3), ref)
    with pb.excitation_backward(resnet20, temperature=0.0):  # patched, hard gates
        patched = plain_gradient(resnet20, cifar_batch, 3)
    assert torch.equal(patched, ref)
    small = pb.excitation_pullback(resnet20, cifar_batch, 3, temperature=1e-8)
    assert (small - ref).norm() < 1e-5 * ref.norm()


def test_zero_temperature_with_max_pools():
    net = conv_net(1, torch.float64)
    x = torch.randn(4, 3, 14, 14, dtype=torch.float64)
    ref = plain_gradient(net, x, 2)
    assert torch.equal(pb.excitation_pullback(net, x, 2, temperature=0.0), ref)
    close = pb.excitation_pullback(net, x, 2, temperature=1e-8)
    assert (close - ref).norm() < 1e-5 * ref.norm()


def test_pretrained_mnist_cnns_forward_unchanged_and_pullback_differs():
    x = torch.rand(3, 1, 28, 28)
    for name in ("mnist-cnn-20-50-500", "mnist-lenet5", "advertorch-lenet5-clean"):
        net = zoo.load_pretrained(name)
        before = snapshot(net)
        with torch.no_grad():
            ref = net(x)
        with pb.excitation_backward(net) as report:
            with torch.no_grad():
                out = net(x)
        assert torch.equal(out, ref)
        assert report.relu_calls == len(report.relu_modules) >= 3 and report.pool_calls == 2
        assert_restored(net, before)
        p = pb.excitation_pullback(net, x, 1)
        g = pb.input_gradient(net, x, 1)
        assert p.shape == x.shape and not torch.allclose(p, g)


# ------------------------------------------------------------------------------------------------
# restoration


def test_model_restored_after_block_and_after_exception(resnet20, cifar_batch):
    before = snapshot(resnet20)
    with pb.excitation_backward(resnet20):
        resnet20(cifar_batch[:2])
    assert_restored(resnet20, before)
    with pytest.raises(KeyError):
        with pb.excitation_backward(resnet20):
            resnet20(cifar_batch[:2])
            raise KeyError("user error inside the block")
    assert_restored(resnet20, before)
    with pytest.raises(RuntimeError):
        with pb.excitation_backward(resnet20):
            resnet20(torch.rand(2, 5, 32, 32))  # wrong number of channels: fails inside forward
    assert_restored(resnet20, before)
    # and the model still computes ordinary gradients afterwards
    assert torch.equal(plain_gradient(resnet20, cifar_batch, 0), pb.input_gradient(resnet20, cifar_batch, 0))


def test_parameters_requires_grad_restored_also_after_an_error():
    # the pullback switches the parameters' requires_grad off for its own call (only the input's gradient is
    # needed) and must leave every flag as it found it, also a parameter the user froze, also after an error
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    net[0].bias.requires_grad_(False)
    flags = [p.requires_grad for p in net.parameters()]
    x = torch.rand(2, 1, 8, 8)
    v = pb.excitation_pullback(net, x, 1)
    assert [p.requires_grad for p in net.parameters()] == flags
    with pytest.raises(RuntimeError):
        pb.excitation_pullback(net, torch.rand(2, 2, 8, 8), 1)    # wrong channels: fails inside forward
    assert [p.requires_grad for p in net.parameters()] == flags
    # same values as a pullback taken with every flag on (the flags change what autograd saves, not the result)
    for p in net.parameters():
        p.requires_grad_(True)
    assert torch.allclose(v, pb.excitation_pullback(net, x, 1), rtol=0, atol=1e-7)
    loss = net(x).sum()
    loss.backward()                                              # weight gradients still work afterwards
    assert net[0].weight.grad is not None


class _Held:
    __slots__ = ("t", "__weakref__")


def held_bytes(fn) -> int:
    """Bytes the autograd graph of ``fn`` holds when its backward pass starts (each storage once; tensors saved
    by nodes that the forward dropped again do not count)."""
    refs, at_backward = [], []

    def pack(t):
        h = _Held()
        h.t = t
        refs.append(weakref.ref(h))
        return h

    def unpack(h):
        if not at_backward:
            live = {r().t.untyped_storage().data_ptr(): r().t.untyped_storage().nbytes()
                    for r in refs if r() is not None}
            at_backward.append(sum(live.values()))
        return h.t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    return at_backward[0]


def test_pullback_holds_no_more_memory_than_the_gradient(resnet20, cifar_batch):
    # The cause of the pullback's old overhead (1.2x the gradient): each surrogate ReLU keeps its pre-activation
    # for the backward pass, one activation more per ReLU than the gradient keeps (the C allocator then gave the
    # memory back and took it again on every call). Eval-mode BatchNorm's backward, a per-channel factor with
    # the parameters frozen, keeps none of its input: the graph holds no more than the gradient's.
    for net, x in ((resnet20, cifar_batch), (conv_net(2), torch.randn(4, 3, 14, 14))):
        gradient = held_bytes(lambda: pb.input_gradient(net, x, 1))
        pullback = held_bytes(lambda: pb.excitation_pullback(net, x, 1))
        relu_inputs = held_bytes(lambda: pb.excitation_pullback(net, x, 1, temperature=1e-3))
        assert pullback <= 1.01 * gradient, (pullback, gradient)
        assert relu_inputs == pullback  # any temperature, the same tensors
    # with the BatchNorm shortcut off (parameters that need gradients), the graph holds each BatchNorm's input
    net = conv_net(2)
    x = torch.randn(4, 3, 14, 14, requires_grad=True)
    with pb.excitation_backward(net):
        trainable = held_bytes(lambda: net(x)[:, 1].sum().backward())
    assert trainable > held_bytes(lambda: pb.excitation_pullback(net, x.detach(), 1))


def test_batch_norm_keeps_its_own_backward_when_parameters_need_gradients():
    # the per-channel BatchNorm backward is used only when nothing needs the parameters' gradients: inside
    # excitation_backward with trainable parameters every parameter gradient equals Zennit's (the oracle)
    net = conv_net(3, torch.float64)
    x = torch.randn(3, 3, 14, 14, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with pb.excitation_backward(net, temperature=0.4, pool_temperature=0):
        ours = torch.autograd.grad(net(x)[:, 2].sum(), list(net.parameters()))
    with zc.BetaSmooth(beta_smooth=1 / 0.4).context(net) as modified:
        ref = torch.autograd.grad(modified(x)[:, 2].sum(), list(net.parameters()))
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(ours, ref))
    assert ours[2].abs().sum() > 0 and ours[3].abs().sum() > 0  # the BatchNorm's weight and bias


def test_nested_blocks_refused(resnet20):
    before = snapshot(resnet20)
    with pb.excitation_backward(resnet20):
        with pytest.raises(RuntimeError, match="already active"):
            with pb.excitation_backward(resnet20):
                pass
    assert_restored(resnet20, before)


def test_user_code_inside_block_is_not_guarded(resnet20, cifar_batch):
    with pb.excitation_backward(resnet20):
        out = resnet20(cifar_batch[:2])
        y = torch.relu(out - out.mean())  # a functional relu outside the forward: ordinary torch, no error
    torch.testing.assert_close(y, (out - out.mean()).clamp_min(0), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# soft max-pooling


def test_max_pool_1d_module():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1, padding_mode="circular"), nn.ReLU(), nn.MaxPool1d(2),
                        nn.Flatten(), nn.Linear(4 * 5, 3)).double().eval()
    x = torch.randn(3, 2, 10, dtype=torch.float64)
    soft_twin = lambda z: net[3:](surrogates.soft_max_pool(net[1](net[0](z)), 2, temperature=0.3, one_d=True))  # noqa: E731
    xg = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(soft_twin(xg)[:, 1].sum(), xg)
    ours = pb.excitation_pullback(net, x, 1, temperature=0.0, pool_temperature=0.3)
    assert torch.allclose(ours, ref, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# torchvision architectures (random weights: no ImageNet weights offline)


def canonical_densenet(net: torchvision.models.DenseNet) -> nn.Sequential:
    """The same function as ``net`` with its functional last ReLU as an nn.ReLU module."""
    return nn.Sequential(net.features, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), net.classifier).eval()


def test_densenet_functional_relu_gets_the_surrogate():
    torch.manual_seed(0)
    net = torchvision.models.DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2,
                                      num_classes=7).eval()
    x = torch.rand(2, 3, 32, 32)
    before = snapshot(net)
    with pb.excitation_backward(net) as report:
        xg = x.clone().requires_grad_(True)
        net(xg)[:, 3].sum().backward()
    assert report.functional_relu_calls == 1
    assert_restored(net, before)
    ref = pb.excitation_pullback(canonical_densenet(net), x, 3)
    assert torch.allclose(xg.grad, ref, rtol=1e-5, atol=1e-7)
    # the last gate is not left hard: ignoring it would give a different answer
    assert torch.allclose(pb.excitation_pullback(net, x, 3), ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("arch", ["resnet50", "vgg11_bn", "densenet121"])
def test_torchvision_architectures(arch):
    torch.manual_seed(0)
    net = getattr(torchvision.models, arch)(weights=None).eval()
    x = torch.rand(1, 3, 32, 32)
    before = snapshot(net)
    xg = x.clone().requires_grad_(True)
    ref_out = net(xg)
    (g,) = torch.autograd.grad(ref_out[:, 5].sum(), xg)
    with pb.excitation_backward(net) as report:
        out = net(xg)
        (p,) = torch.autograd.grad(out[:, 5].sum(), xg)
    assert torch.equal(out, ref_out)  # forward unchanged
    assert report.pool_calls == len(report.pool_modules) >= 1
    assert report.relu_calls >= len(report.relu_modules) > 0  # ResNet50 reuses its ReLU modules
    assert report.functional_relu_calls == (1 if arch == "densenet121" else 0)
    assert_restored(net, before)
    assert p.shape == x.shape and torch.isfinite(p).all() and not torch.allclose(p, g)


# ------------------------------------------------------------------------------------------------
# the theory: gating-induced pullbacks and path-space linearity


def test_pullback_is_the_gated_linear_model_of_the_excitation_gates(resnet20, cifar_batch):
    net = copy.deepcopy(resnet20).double()
    x = cifar_batch[:2].double()
    target = torch.arange(len(x)) % 10
    for tau in (0.0, 0.3):
        lam = pb.excitation_gates(net, x, tau)
        lin = pb.gated_linear_model(net, x, target, lam)
        v = pb.excitation_pullback(net, x, target, temperature=tau)
        assert torch.allclose(v, lin.weight, rtol=1e-9, atol=1e-12)
        # f_Lambda(x) = <v_Lambda(x), x> + bias (the augmented coordinate)
        assert torch.allclose((v * x).flatten(1).sum(1) + lin.bias, lin.output, rtol=1e-9, atol=1e-9)
    with torch.no_grad():  # hard gates (tau = 0): f_G is f itself
        f = net(x).gather(1, target[:, None])[:, 0]
    hard = pb.gated_linear_model(net, x, target, pb.excitation_gates(net, x, 0.0))
    assert torch.allclose(hard.output, f, rtol=1e-9, atol=1e-9)


def test_pullback_with_hard_pools_is_gated_linear_model_on_mnist_cnn():
    net = zoo.load_pretrained("mnist-cnn-20-50-500").double()
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    rec = gates.record_gates(net, x)
    lin = pb.gated_linear_model(net, x, 7, pb.excitation_gates(net, x, 0.3), rec.pool_indices)
    v = pb.excitation_pullback(net, x, 7, temperature=0.3, pool_temperature=0)
    assert torch.allclose(v, lin.weight, rtol=1e-9, atol=1e-12)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), tau=st.floats(0.05, 2.0))
def test_path_space_linearity(seed, tau):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    phi = paths.neural_path_features(net, x, temperature=tau)
    assert torch.allclose(phi, paths.neural_path_features_reference(net, x, temperature=tau), rtol=1e-12, atol=0)
    omega = paths.neural_path_values(net)
    lam = pb.excitation_gates(net, x, tau)
    with torch.no_grad():
        f_tau = gates.run_with_gates(net, x, lam)
    assert torch.allclose(phi @ omega, f_tau, rtol=1e-10, atol=1e-12)  # Eq. 19
    # Eq. 20: the pullback is the sum of tau_p * omega_p over the paths starting at each input
    v = pb.excitation_pullback(net, x, 1, temperature=tau)
    start = paths.path_index(net)[:, 0]
    tau_p = paths.path_activity(net, x, temperature=tau)
    v_paths = torch.zeros(5, 5, dtype=x.dtype).index_add_(1, start, tau_p * omega[:, 1])
    assert torch.allclose(v_paths[:, :4], v, rtol=1e-10, atol=1e-12)
    # zero temperature: the hard gates, so <phi_0, omega> is the network itself (Chapter 1)
    with torch.no_grad():
        assert torch.allclose(paths.neural_path_features(net, x, temperature=0.0) @ omega, net(x), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# counterfactual ascent


def test_projected_gradient_ascent(resnet20, cifar_batch):
    x = cifar_batch[:2]
    radius, step = pb.rescale_norm(100, x.shape[1:]), pb.rescale_norm(20, x.shape[1:])
    assert abs(radius - 100 * (3072 / 150528) ** 0.5 / 2) < 1e-12
    for method in ("pullback", "gradient"):
        r = pb.projected_gradient_ascent(resnet20, x, 2, method=method, step_size=step, radius=radius, steps=3,
                                         bounds=(0.0, 1.0))
        assert r.target_logit.shape == r.predicted.shape == r.distance.shape == (4, 2)
        assert torch.all(r.distance <= radius * (1 + 1e-5)) and torch.all(r.distance[0] == 0)
        assert r.x.min() >= 0 and r.x.max() <= 1 and torch.allclose(r.delta, r.x - x)
        assert torch.all(r.gain[-1] > 0)
        assert r.success.dtype == torch.bool and r.path is None
        kept = pb.projected_gradient_ascent(resnet20, x, 2, method=method, step_size=step, radius=radius,
                                            steps=3, bounds=(0.0, 1.0), keep_path=True)
        assert kept.path.shape == (4, *x.shape) and torch.equal(kept.path[0], x) and torch.equal(kept.path[-1], r.x)
        for k in (1, 2):  # step k of the kept path is where a k-step ascent ends
            alone = pb.projected_gradient_ascent(resnet20, x, 2, method=method, step_size=step, radius=radius,
                                                 steps=k, bounds=(0.0, 1.0))
            torch.testing.assert_close(kept.path[k], alone.x, rtol=0, atol=1e-6)
        torch.testing.assert_close(kept.distance, (kept.path - x).flatten(2).norm(dim=2))


# ------------------------------------------------------------------------------------------------
# bad inputs


class FunctionalGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return F.gelu(self.fc(x))


class FunctionalPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)

    def forward(self, x):
        return F.max_pool2d(self.conv(x), 2).flatten(1)


class FunctionalRelu(nn.Module):
    def __init__(self, inplace: bool):
        super().__init__()
        self.a, self.b, self.inplace = nn.Linear(4, 6), nn.Linear(6, 3), inplace

    def forward(self, x):
        h = self.a(x)
        if self.inplace:
            F.relu(h, inplace=True)
            return self.b(h)
        return self.b(h.relu())


def test_functional_relu_equals_module_relu():
    x = torch.randn(4, 4, dtype=torch.float64)
    for inplace in (False, True):
        net = FunctionalRelu(inplace).double()
        twin = nn.Sequential(net.a, nn.ReLU(), net.b)
        assert torch.allclose(pb.excitation_pullback(net, x, 2), pb.excitation_pullback(twin, x, 2), rtol=1e-12)


def test_errors():
    net = conv_net()
    x = torch.rand(2, 3, 14, 14)
    with pytest.raises(UnsupportedLayerError, match="Hardswish"):  # (SiLU / GELU modules: test_silu_gelu.py)
        pb.excitation_pullback(nn.Sequential(nn.Linear(4, 3), nn.Hardswish()), torch.rand(2, 4), 0)
    with pytest.raises(UnsupportedLayerError, match="gelu"):
        pb.excitation_pullback(FunctionalGelu(), torch.rand(2, 4), 0)
    with pytest.raises(UnsupportedLayerError, match="max_pool2d"):
        pb.excitation_pullback(FunctionalPool(), torch.rand(2, 1, 8, 8), 0)
    with pytest.raises(UnsupportedLayerError, match="training mode"):
        pb.excitation_pullback(copy.deepcopy(net).train(), x, 0)
    with pytest.raises(UnsupportedLayerError, match="return_indices"):
        with pb.excitation_backward(nn.Sequential(nn.MaxPool2d(2, return_indices=True))):
            pass
    for bad in (-0.1, float("nan"), float("inf"), "0.3", True):
        with pytest.raises(ValueError, match="temperature"):
            pb.excitation_pullback(net, x, 0, temperature=bad)
    with pytest.raises(ValueError, match="pool_temperature"):
        pb.excitation_pullback(net, x, 0, pool_temperature=-1)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        pb.excitation_pullback(net, x, 5)
    with pytest.raises(ValueError, match="one class per sample"):
        pb.excitation_pullback(net, x, [0, 1, 2])
    with pytest.raises(TypeError, match="integer"):
        pb.excitation_pullback(net, x, torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="unsqueeze"):
        pb.excitation_pullback(net, torch.rand(3), 0)
    with pytest.raises(TypeError, match="floating"):
        pb.excitation_pullback(net, torch.ones(2, 3, 12, 12, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="method"):
        pb.projected_gradient_ascent(net, x, 0, method="lrp")
    with pytest.raises(ValueError, match="bounds"):
        pb.projected_gradient_ascent(net, x, 0, bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="value_range"):
        pb.rescale_norm(1.0, (3, 32, 32), value_range=0)
    with pytest.raises(TypeError, match="Sequential"):
        paths.neural_path_features(net, x, temperature=0.3)


def test_the_max_pool_surrogate_is_on_by_default():
    """``pool_temperature=None`` means "the ReLU's temperature": the default call equals the explicit one,
    and differs from hard pools (the paper's Listing 2 softens max-pools too). Checked against Zennit's
    ReLU rule on a network without max-pools, where the pool setting must not matter."""
    net = conv_net(3, torch.float64)
    x = torch.rand(4, 3, 16, 16, dtype=torch.float64)
    default = pb.excitation_pullback(net, x, 2, temperature=0.3)
    explicit = pb.excitation_pullback(net, x, 2, temperature=0.3, pool_temperature=0.3)
    hard = pb.excitation_pullback(net, x, 2, temperature=0.3, pool_temperature=0)
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)
    assert (default - hard).abs().max() > 1e-3 * hard.abs().max()
    no_pools = nn.Sequential(*[m for m in net if not isinstance(m, nn.MaxPool2d)][:-3], nn.Flatten(),
                             nn.LazyLinear(5)).double()
    no_pools(x)  # materialise the lazy layer
    torch.testing.assert_close(pb.excitation_pullback(no_pools, x, 1, temperature=0.3),
                               zennit_pullback(no_pools, x, 1, 0.3), rtol=1e-10, atol=1e-12)


def test_model_restored_after_a_keyboard_interrupt(resnet20, cifar_batch):
    before = snapshot(resnet20)
    with pytest.raises(KeyboardInterrupt):
        with pb.excitation_backward(resnet20):
            resnet20(cifar_batch[:2])
            raise KeyboardInterrupt
    assert_restored(resnet20, before)
    assert torch._C._len_torch_function_stack() == 0
