"""Gates: recorded gates match the ReLUs, GaLU runs, and every documented bad input gives its error."""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dualview import gates, paths
from tiny_models import conv_net as tiny_conv_net
from tiny_models import spread_batchnorm


def conv_net() -> nn.Module:
    """Circular padding, a BatchNorm, an adaptive pool and a Dropout in eval mode: the layers the gates handle."""
    return tiny_conv_net(1, (4, 6), padding_mode="circular", batchnorm=True, second_padding=0,
                         head_pool=nn.AdaptiveAvgPool2d(1), hidden=5, dropout=0.5)


class Block(nn.Module):
    """A residual block that reuses one ReLU module twice (as torchvision's ResNets do)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.a(self.relu(x)) + x)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6))
def test_recorded_gates_match_relu_outputs(seed, n):
    torch.manual_seed(seed)
    net = conv_net()
    x = torch.randn(n, 1, 8, 8)
    outputs = {}
    hooks = [m.register_forward_hook(lambda mod, a, out, name=name: outputs.__setitem__(name, out.clone()))
             for name, m in net.named_modules() if isinstance(m, nn.ReLU)]
    ref = net(x)
    for h in hooks:
        h.remove()
    rec = gates.record_gates(net, x)
    assert rec.names == list(outputs)
    torch.testing.assert_close(rec.output, ref)
    for name, q in rec.preactivations.items():
        assert torch.equal(q * rec.gates[name], outputs[name])  # ReLU(q) = q * G


def test_own_gates_reproduce_output_and_frozen_gates_are_affine():
    torch.manual_seed(0)
    net = conv_net()
    x = torch.randn(4, 1, 8, 8)
    rec = gates.record_gates(net, x)
    torch.testing.assert_close(gates.run_with_gates(net, x, rec.gates, rec.pool_indices), rec.output)
    # with x's gates and pool winners frozen, the network is affine in its input
    f = lambda z: gates.run_with_gates(net, z, rec.gates, rec.pool_indices)
    a, b = torch.randn(4, 1, 8, 8), torch.randn(4, 1, 8, 8)
    lhs = f(0.3 * a + 0.7 * b)
    rhs = 0.3 * f(a) + 0.7 * f(b)
    torch.testing.assert_close(lhs, rhs, rtol=1e-5, atol=1e-5)


def test_soft_gates_and_other_inputs_gates():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    x, x2 = torch.randn(4, 3), torch.randn(4, 3)
    g2 = gates.record_gates(net, x2).gates
    out = gates.run_with_gates(net, x, g2)
    q = net[0](x)
    torch.testing.assert_close(out, net[2](q * g2["1"]))
    soft = {"1": torch.sigmoid(10 * net[0](x2))}
    torch.testing.assert_close(gates.run_with_gates(net, x, soft), net[2](q * soft["1"]))


def test_reused_and_inplace_relu_get_one_entry_per_call():
    torch.manual_seed(2)
    block = Block()
    x = torch.randn(3, 4)
    rec = gates.record_gates(block, x.clone())
    assert rec.names == ["relu", "relu#1"]
    torch.testing.assert_close(rec.preactivations["relu"], x)
    torch.testing.assert_close(gates.run_with_gates(block, x.clone(), rec.gates), rec.output)


def test_active_share_chunks_agree_with_one_batch():
    torch.manual_seed(3)
    net = conv_net()
    x = torch.randn(20, 1, 8, 8)
    rec = gates.record_gates(net, x)
    whole = {k: (q > 0).flatten(1).double().mean(1) for k, q in rec.preactivations.items()}  # one batch, by hand
    chunked = gates.active_share(net, x, batch_size=7)
    assert list(chunked) == list(whole)
    for k in whole:
        torch.testing.assert_close(whole[k], chunked[k])
    # all layers together: active units over all hidden units, per input
    on = sum((q > 0).flatten(1).sum(1) for q in rec.preactivations.values())
    units = sum(q[0].numel() for q in rec.preactivations.values())
    torch.testing.assert_close(gates.active_share(net, x, batch_size=7, per_layer=False), on.double() / units)


@pytest.mark.parametrize("layer", [nn.GELU(), nn.Tanh(), nn.Sigmoid(), nn.ELU()])  # (LeakyReLU: tests/test_leaky.py)
def test_other_activations_are_refused_by_name(layer):
    net = nn.Sequential(nn.Linear(3, 3), layer, nn.Linear(3, 1))
    with pytest.raises(gates.UnsupportedLayerError, match=type(layer).__name__):
        gates.record_gates(net, torch.randn(2, 3))


def test_unknown_module_with_parameters_is_refused():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.s

    with pytest.raises(gates.UnsupportedLayerError, match="Scale"):
        gates.record_gates(nn.Sequential(nn.Linear(3, 3), Scale()), torch.randn(2, 3))

    class Container(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.extra = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.lin(x) + self.extra

    with pytest.raises(gates.UnsupportedLayerError, match="parameters of its own"):
        gates.record_gates(Container(), torch.randn(2, 3))


@pytest.mark.parametrize("fn", [F.relu, torch.relu, lambda t: t.relu(), lambda t: t.clamp(min=0),
                                lambda t: F.max_pool1d(t.unsqueeze(1), 1).squeeze(1), torch.tanh])
def test_functional_nonlinearity_is_refused(fn):
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return fn(self.lin(x))

    with pytest.raises(gates.UnsupportedLayerError, match="as a function"):
        gates.record_gates(Functional(), torch.randn(2, 3))


def test_train_mode_batchnorm_is_refused():
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU()).train()
    with pytest.raises(gates.UnsupportedLayerError, match="eval"):
        gates.record_gates(net, torch.randn(4, 3))


def test_bad_gate_inputs():
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    x = torch.randn(4, 3)
    with pytest.raises(KeyError, match="no gates given"):
        gates.run_with_gates(net, x, {})
    with pytest.raises(KeyError, match="never reached"):
        gates.run_with_gates(net, x, {"1": torch.ones(4, 5), "9": torch.ones(1)})
    with pytest.raises(ValueError, match="broadcast"):
        gates.run_with_gates(net, x, {"1": torch.ones(4, 3)})
    with pytest.raises(ValueError, match="batch dimension"):
        gates.record_gates(net, torch.randn(3))
    with pytest.raises(TypeError):
        gates.record_gates(net, [1, 2, 3])


def test_hooks_are_removed_even_after_an_error():
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    with pytest.raises(RuntimeError):
        gates.record_gates(net, torch.randn(4, 7))  # shape error inside forward
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


def test_a_preactivation_of_exactly_zero_gives_gate_zero():
    """The gate convention G = 1{q > 0}: zero pixels under a bias-free conv, and a zero row, give q = 0
    exactly, and their gates are off (torch's ReLU has derivative 0 there, and outputs 0)."""
    conv = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, bias=False), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        conv[3].weight[0] = 0.0
        conv[3].bias[0] = 0.0
    x = torch.rand(2, 1, 4, 4)
    x[:, :, :, :2] = 0.0  # zero pixels: the conv's pre-activation is exactly 0 where its window sees only them
    rec = gates.record_gates(conv, x)
    q, g = rec.preactivations["1"], rec.gates["1"]
    assert (q == 0).any() and not g[q == 0].any() and g[q > 0].all()
    assert (rec.preactivations["4"][:, 0] == 0).all() and not rec.gates["4"][:, 0].any()
    xg = x.clone().requires_grad_(True)
    conv(xg)[:, 0].sum().backward()
    grad_relu_at_zero = torch.autograd.functional.jacobian(torch.relu, torch.zeros(1))
    assert grad_relu_at_zero.item() == 0.0  # the convention the gates follow
    torch.testing.assert_close(gates.run_with_gates(conv, x, rec.gates, rec.pool_indices), conv(x))


def test_hooks_and_guard_are_removed_after_a_keyboard_interrupt():
    """A BaseException (here a KeyboardInterrupt raised in a user's hook mid-forward) leaves no hook of
    ours and no torch-function mode behind."""
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))

    def interrupt(module, args, out):
        raise KeyboardInterrupt

    user_hook = net[2].register_forward_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        gates.record_gates(net, torch.randn(4, 3))
    assert list(net[2]._forward_hooks.values()) == [interrupt]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in (net, net[0], net[1]))
    assert not net[2]._forward_pre_hooks
    assert torch._C._len_torch_function_stack() == 0
    user_hook.remove()
    torch.relu(torch.randn(3))  # the guard no longer refuses functional calls


def test_the_hook_map_is_decided_up_front_and_every_hook_comes_off():
    """instrument's state and hooks are one object (Zennit's Composite shape): the map of which hook goes on which
    module is built before anything is registered (torch's own affine layers get none: the guard checks their
    calls), attach registers exactly that map, and the hooks come off after an ordinary error in the forward
    as after a clean exit."""
    from dualview.gates.instrument import _Instrumentation

    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.MaxPool1d(1), nn.Flatten(), nn.Linear(5, 2))
    session = _Instrumentation(net, (gates.Record(),))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())  # nothing registered yet
    kinds = {m: [kind for kind, _ in hooks] for m, hooks in session.hooks.items()}
    assert kinds == {net: ["pre", "pre", "post", "post"], net[1]: ["pre", "post"], net[2]: ["pre", "post"]}
    assert session.hooks[net][0][1] == session.enter and session.hooks[net][-1][1] == session.leave
    assert [h[1].func for h in (session.hooks[net[1]][1], session.hooks[net[2]][1])] == [session.at_relu,
                                                                                        session.at_pool]
    session.attach()
    try:
        assert {m: len(m._forward_pre_hooks) + len(m._forward_hooks) for m in net.modules() if
                m._forward_pre_hooks or m._forward_hooks} == {m: len(k) for m, k in kinds.items()}
        with pytest.raises(RuntimeError, match="already active"):
            _Instrumentation(net[1], ())
    finally:
        session.remove()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    with pytest.raises(RuntimeError):  # a shape error inside the forward
        with gates.instrument(net, gates.Record()):
            net(torch.randn(2, 4))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    assert torch._C._len_torch_function_stack() == 0
    with gates.instrument(net, gates.Record()):  # and the model may be instrumented again
        net(torch.randn(2, 3))


class LinearFnLinear(nn.Module):
    """Linear, ``fn`` applied as a function in ``forward`` (a hook cannot see it), Linear."""

    def __init__(self, fn):
        super().__init__()
        self.a, self.b, self.fn = nn.Linear(3, 4), nn.Linear(4, 2), fn

    def forward(self, x):
        return self.b(self.fn(self.a(x)))


class AbsAtFunctionalRelu(gates.Rule):
    """A rule that accepts functional ReLUs and computes |q| there (visibly not a ReLU)."""

    def __init__(self):
        self.where = []

    def functional_relu(self, where, q):
        self.where.append(where)
        return q.abs()


@pytest.mark.parametrize("fn", [lambda h: h.relu(), lambda h: (F.relu(h, inplace=True), h)[1], torch.relu_])
def test_a_rule_may_accept_functional_relus(fn):
    torch.manual_seed(4)
    net = LinearFnLinear(fn)
    x = torch.randn(5, 3)
    rule = AbsAtFunctionalRelu()
    with gates.instrument(net, rule):
        out = net(x)
    with torch.no_grad():
        assert torch.allclose(out, net.b(net.a(x).abs()))  # the rule's output replaced the ReLU's
    assert rule.where == ["'<model>' (LinearFnLinear)"]
    with pytest.raises(gates.UnsupportedLayerError, match="as a function"):  # Record keeps refusing it
        with gates.instrument(net, gates.Record(), gates.Rule()):
            net(x)


def test_guard_is_active_only_in_the_forward_and_names_restart_with_each_forward():
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 2))
    x = torch.randn(4, 3)
    rec = gates.Record()
    with gates.instrument(net, rec):
        first = net(x)
        assert torch.equal(torch.relu(first), first.clamp_min(0))  # user code in the block: plain torch
        names = list(rec.preactivations)
        net(2 * x)
    assert names == list(rec.preactivations) == ["1", "3"]
    torch.testing.assert_close(rec.preactivations["1"], net[0](2 * x))  # the second forward's, same names
    assert torch._C._len_torch_function_stack() == 0


def test_blocks_do_not_nest_and_rules_are_checked():
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    with gates.instrument(net, gates.Record()):
        for inner in (net, net[1]):
            with pytest.raises(RuntimeError, match="already active"):
                with gates.instrument(inner):
                    pass
    with gates.instrument(net[1]):
        with pytest.raises(RuntimeError, match="already active"):
            with gates.instrument(net):
                pass
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    with pytest.raises(TypeError, match="Rule"):
        with gates.instrument(net, lambda *a: None):
            pass
    g = gates.record_gates(net, torch.randn(2, 3)).gates
    with pytest.raises(ValueError, match="two rules replace"):
        with gates.instrument(net, gates.ImposeGates(g), gates.ImposeGates(g)):
            net(torch.randn(2, 3))


def _builtin_affine_layers():
    bn1, bn2 = nn.BatchNorm1d(2), nn.BatchNorm2d(2)
    for bn in (bn1, bn2):
        spread_batchnorm(bn, mean=1, bias=None)
    return [  # (layer, input shape)
        (nn.Linear(6, 4), (3, 6)), (nn.Conv1d(2, 3, 3), (3, 2, 8)),
        (nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), (3, 2, 6, 6)),
        (nn.AvgPool1d(2), (3, 2, 8)), (nn.AvgPool2d(2), (3, 2, 6, 6)), (nn.AdaptiveAvgPool1d(3), (3, 2, 8)),
        (nn.AdaptiveAvgPool2d(2), (3, 2, 6, 6)), (bn1, (3, 2, 8)), (bn1, (3, 2)), (bn2, (3, 2, 6, 6)),
        (nn.Dropout(0.3), (3, 6)), (nn.Dropout1d(0.3), (3, 2, 8)), (nn.Dropout2d(0.3), (3, 2, 6, 6)),
        (nn.Flatten(), (3, 2, 6, 6)), (nn.Unflatten(1, (2, 3)), (3, 6)), (nn.Identity(), (3, 6)),
        (nn.ZeroPad1d(1), (3, 2, 8)), (nn.ZeroPad2d((1, 0, 2, 1)), (3, 2, 6, 6)),
        (nn.ConstantPad1d(1, 0.5), (3, 2, 8)), (nn.ConstantPad2d(1, -0.5), (3, 2, 6, 6)),
        (nn.Upsample(scale_factor=2, mode="nearest"), (3, 2, 4, 4)),
        (nn.Upsample(scale_factor=2, mode="bilinear"), (3, 2, 4, 4)),
        (nn.ConvTranspose1d(2, 3, 3, stride=2), (3, 2, 5)), (nn.ConvTranspose2d(2, 3, 2, stride=2), (3, 2, 3, 3)),
        (nn.UpsamplingNearest2d(scale_factor=2), (3, 2, 3, 3)), (nn.UpsamplingBilinear2d(size=(5, 7)), (3, 2, 3, 3)),
    ]


@pytest.mark.parametrize("case", range(26))
def test_every_builtin_affine_layer_passes_the_guard_unchanged(case):
    # torch's own affine layers are not hooked: the guard checks the calls they make against its list. Each
    # must pass, with the output unchanged, its own gates reproducing it, and the hard-gated pullback through
    # the instrumentation equal to the plain gradient
    from dualview import pullbacks as pb

    torch.manual_seed(case)
    layer, shape = _builtin_affine_layers()[case]
    x = torch.randn(shape)
    width = nn.Flatten()(layer.eval()(x)).shape[1]
    net = nn.Sequential(layer, nn.ReLU(), nn.Flatten(), nn.Linear(width, 3)).eval()
    with torch.no_grad():
        plain = net(x)
    rec = gates.record_gates(net, x)
    assert torch.equal(rec.output, plain)
    assert torch.equal(gates.run_with_gates(net, x, rec.gates).detach(), plain)
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(net(xg)[:, 1].sum(), xg)
    with pb.excitation_backward(net, temperature=0.0):
        xg = x.clone().requires_grad_(True)
        (hard,) = torch.autograd.grad(net(xg)[:, 1].sum(), xg)
    assert torch.equal(hard, grad)
    frozen = pb.excitation_pullback(net, x, 1, temperature=0.0, pool_temperature=0.0, smooth_temperature=1.0)
    assert torch.allclose(frozen, grad, rtol=1e-5, atol=1e-7)


def test_the_builtin_affine_layers_are_all_covered():
    covered = {type(layer) for layer, _ in _builtin_affine_layers()}
    builtin = {c for c in gates.SUPPORTED_LAYERS() if c.__module__.startswith("torch.nn")}
    assert builtin - set(gates.GATE_LAYERS + gates.POOL_GATE_LAYERS) == covered
    assert len(_builtin_affine_layers()) == 26


def test_an_identity_reading_an_inplace_relus_input_gets_the_relus_output():
    # nn.Identity calls nothing the guard sees: it keeps its hooks, which hand it what the real network's
    # overwritten tensor holds (the ReLU's output), as every other layer gets it
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.r, self.id = nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Identity()

        def forward(self, x):
            h = self.fc(x)
            self.r(h)
            return self.id(h)  # the model's output: no later call would hand over the ReLU's output

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(5, 4)
    with torch.no_grad():
        plain = net(x)
    assert torch.equal(gates.record_gates(net, x).output, plain)


# --- models as people have them (issue 39, finding 2) -------------------------------------------------------
class _TupleNet(nn.Module):
    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        self.as_dict = as_dict

    def forward(self, x):
        out = self.net(x)
        return {"logits": out, "features": 2 * out} if self.as_dict else (out, 2 * out)


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_model_returning_a_tuple_or_dict_gets_a_clear_error_and_a_selector(as_dict):
    from dualview import explain

    torch.manual_seed(0)
    model, x = _TupleNet(as_dict).eval(), torch.randn(3, 1, 2, 2)
    hint = "SelectOutput(model, 'logits')" if as_dict else "SelectOutput(model, 0)"
    for method in explain.METHODS:
        with pytest.raises(TypeError, match=re.escape(hint)):
            explain.attribute(model, x, 1, method)
    with pytest.raises(TypeError, match="returns a dict" if as_dict else "returns a tuple of 2 items"):
        gates.record_gates(model, x)
    wrapped = gates.SelectOutput(model, "logits" if as_dict else 0)
    for method in ("gradient", "pullback", "insens"):
        torch.testing.assert_close(explain.attribute(wrapped, x, 1, method), explain.attribute(model.net, x, 1, method))


def test_scripted_and_compiled_models_are_told_what_to_pass():
    from dualview import explain

    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    x = torch.randn(2, 1, 2, 2)
    for wrapped, advice in ((torch.jit.script(net), "eager nn.Module"), (torch.jit.trace(net, x), "eager nn.Module"),
                            (torch.compile(net), "model._orig_mod")):
        for call in (lambda m: explain.attribute(m, x, 0, "pullback"), lambda m: gates.record_gates(m, x),
                     lambda m: paths.count_paths(m, input_shape=(1, 2, 2))):
            with pytest.raises(TypeError, match=re.escape(advice)):
                call(wrapped)
        assert "register_linear_layer" not in advice


class _DropPath(nn.Module):
    """timm's stochastic depth, as users write it: the identity in eval mode."""

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.p = p

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - self.p)
        return x * mask / (1 - self.p)


class _Residual(nn.Module):
    def __init__(self, drop: nn.Module) -> None:
        super().__init__()
        self.conv, self.relu, self.drop = nn.Conv2d(2, 2, 3, padding=1), nn.ReLU(), drop

    def forward(self, x):
        return x + self.drop(self.relu(self.conv(x)))


def test_identities_of_ones_own_and_transposed_convolutions_are_accepted():
    from dualview import explain

    torch.manual_seed(5)
    with_drop = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), _Residual(_DropPath()),
                              nn.ConvTranspose2d(2, 2, 2, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(2, 3)).eval()
    without = copy.deepcopy(with_drop)
    without[2].drop = nn.Identity()
    x = torch.randn(4, 1, 4, 4)
    a, b = gates.record_gates(with_drop, x), gates.record_gates(without, x)
    assert a.names == b.names and all(torch.equal(a.gates[n], b.gates[n]) for n in a.names)
    torch.testing.assert_close(gates.run_with_gates(with_drop, x, a.gates), with_drop(x))
    for method in ("pullback", "insens"):
        torch.testing.assert_close(explain.attribute(with_drop, x, 2, method), explain.attribute(without, x, 2, method))
    assert paths.count_paths(with_drop, input_shape=(1, 4, 4)).total[-1] == \
        paths.count_paths(without, input_shape=(1, 4, 4)).total[-1]
    with_drop.train()
    for m in with_drop.modules():
        if isinstance(m, nn.Conv2d):
            m.eval()
    with pytest.raises(gates.UnsupportedLayerError, match=r"'2\.drop' \(_DropPath\) is in training mode.*eval"):
        gates.record_gates(with_drop, x)
