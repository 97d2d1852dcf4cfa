"""Leaky ReLUs (nn.LeakyReLU, nn.PReLU) in the dual view (issue 39, finding 3): a gate whose off state has slope a
instead of 0, gate values in {a, 1}. Checked against a forward pass written out by hand (no dualview code):
the network frozen at x, its pre-activations and gates, its switched weights, its active paths."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dualview import explain, gates, npk_fc, paths, projections, pullbacks

WIDTHS = [3, 5, 4, 2]


def _mlp(kind: str, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    acts = {"leaky": lambda w: nn.LeakyReLU(0.1), "prelu": lambda w: nn.PReLU(w),
            "prelu1": lambda w: nn.PReLU(1, init=0.3)}[kind]
    layers = []
    for a, b in zip(WIDTHS[:-2], WIDTHS[1:-1]):
        layers += [nn.Linear(a, b), acts(b)]
    net = nn.Sequential(*layers, nn.Linear(WIDTHS[-2], WIDTHS[-1])).double().eval()
    for m in net.modules():
        if isinstance(m, nn.PReLU):
            with torch.no_grad():
                m.weight.uniform_(0.05, 0.5)
    return net


def _by_hand(net: nn.Sequential, x: torch.Tensor):
    """Per input: the pre-activation, gate (q > 0) and switched weight (the frozen map from x to q) of every
    hidden neuron, layer by layer, and the output: a forward pass written out."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    slopes = [m.negative_slope if isinstance(m, nn.LeakyReLU) else m.weight.detach() for m in net
              if isinstance(m, (nn.LeakyReLU, nn.PReLU))]
    h, J = x, torch.eye(x.shape[1], dtype=x.dtype).expand(len(x), -1, -1)  # J: d h / d x
    qs, gs, ws = [], [], []
    for lin, a in zip(linears[:-1], slopes):
        q = h @ lin.weight.T + lin.bias
        w = torch.einsum("ij,njk->nik", lin.weight, J)  # q = w x + const on the frozen region
        g = q > 0
        d = torch.where(g, torch.ones_like(q), torch.as_tensor(a, dtype=q.dtype).expand_as(q))
        h, J = q * d, d[:, :, None] * w
        qs.append(q), gs.append(g), ws.append(w)
    return qs, gs, ws, h @ linears[-1].weight.T + linears[-1].bias


@pytest.mark.parametrize("kind", ["leaky", "prelu", "prelu1"])
def test_recorded_and_imposed_gates_reproduce_a_leaky_network(kind):
    net, x = _mlp(kind, 0), torch.randn(16, 3, dtype=torch.float64)
    qs, gs, _, out = _by_hand(net, x)
    rec = gates.record_gates(net, x)
    torch.testing.assert_close(rec.output, out)
    assert all(torch.equal(g, h) for g, h in zip(rec.gates.values(), gs))
    torch.testing.assert_close(gates.run_with_gates(net, x, rec.gates), out)
    # another input's gates: that input's frozen network applied to x (gate values {a, 1})
    other = torch.randn(16, 3, dtype=torch.float64)
    _, _, ws_other, _ = _by_hand(net, other)
    frozen = gates.run_with_gates(net, x, gates.record_gates(net, other).gates)
    lin = [m for m in net if isinstance(m, nn.Linear)][-1]
    zero = gates.run_with_gates(net, torch.zeros_like(x), gates.record_gates(net, other).gates)
    J_out = torch.einsum("ij,njk->nik", lin.weight, _by_hand_jacobian(net, other))
    torch.testing.assert_close(frozen - zero, torch.einsum("nij,nj->ni", J_out, x))
    del ws_other


def _by_hand_jacobian(net, x):
    _, gs, ws, _ = _by_hand(net, x)
    acts = [m for m in net if isinstance(m, (nn.LeakyReLU, nn.PReLU))]
    a = acts[-1].negative_slope if isinstance(acts[-1], nn.LeakyReLU) else acts[-1].weight.detach()
    d = torch.where(gs[-1], 1.0, torch.as_tensor(a, dtype=x.dtype).expand_as(gs[-1].double()))
    return d[:, :, None] * ws[-1]


@pytest.mark.parametrize("kind", ["leaky", "prelu"])
def test_gated_linear_model_and_insens_of_a_leaky_network(kind):
    net, x = _mlp(kind, 1), torch.randn(8, 3, dtype=torch.float64)
    qs, gs, ws, out = _by_hand(net, x)
    glm = pullbacks.gated_linear_model(net, x, 1, gates.record_gates(net, x).gates)
    lin = [m for m in net if isinstance(m, nn.Linear)][-1]
    weight = torch.einsum("j,njk->nk", lin.weight[1], _by_hand_jacobian(net, x))
    torch.testing.assert_close(glm.weight, weight)
    torch.testing.assert_close(glm.output, out[:, 1])
    # Insens (Eq. 7-8 of Szymanski et al.): the mean over inactive neurons of q w / |w|^2
    q, g, w = torch.cat(qs, 1), torch.cat(gs, 1), torch.cat(ws, 1)
    terms = torch.where(~g[:, :, None], q[:, :, None] * w / (w * w).sum(-1, keepdim=True), 0.0)
    omega = terms.sum(1) / (~g).sum(1, keepdim=True).clamp_min(1)
    torch.testing.assert_close(projections.insens(net, x).omega, omega)


def test_active_paths_of_a_leaky_network_are_those_through_on_gates():
    net, x = _mlp("leaky", 2), torch.randn(6, 3, dtype=torch.float64)
    _, gs, _, _ = _by_hand(net, x)
    active = torch.ones(6, WIDTHS[0], dtype=torch.float64)  # paths from each input unit, per input
    for g in gs:  # every weight non-zero: each on-gate passes every path reaching its neuron
        active = (active.sum(1, keepdim=True) * g.double())
    want = active.sum(1) * WIDTHS[-1]
    counts = paths.count_paths(net, x)
    torch.testing.assert_close(counts.active[:, -1], want)
    assert counts.total[-1] == paths.fc_path_count(WIDTHS)


def test_what_is_defined_for_relu_networks_refuses_leaky_ones_by_name():
    net, x = _mlp("leaky", 3), torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(gates.UnsupportedLayerError, match=r"'1' \(LeakyReLU\) is a leaky ReLU.*\{a, 1\}"):
        pullbacks.excitation_pullback(net, x, 0)
    with pytest.raises(gates.UnsupportedLayerError, match="leaky ReLU"):
        explain.attribute(net, x, 0, "pullback")
    with pytest.raises(gates.UnsupportedLayerError, match="leaky ReLU"):
        npk_fc.fc_gates(net, x)
    g = explain.attribute(net, x, 0, "gradient")  # plain autograd runs on any model
    assert g.shape == x.shape
