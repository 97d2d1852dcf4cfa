"""The plain networks of dualview.nets: layer structure of the fully connected ReLU network, and its errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dualview import nets


def test_relu_mlp_structure_and_output():
    net = nets.relu_mlp([5, 4, 3, 2], bias=False)
    kinds = [type(m).__name__ for m in net]
    assert kinds == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert all(m.bias is None for m in net if isinstance(m, nn.Linear))
    assert len({id(m) for m in net if isinstance(m, nn.ReLU)}) == 2  # one instance per use
    x = torch.randn(7, 5)
    by_hand = torch.relu(torch.relu(x @ net[0].weight.T) @ net[2].weight.T) @ net[4].weight.T
    torch.testing.assert_close(net(x), by_hand)
    closed = nets.relu_mlp([5, 4, 2], output_relu=True)
    assert isinstance(closed[-1], nn.ReLU) and (closed(x) >= 0).all()


@pytest.mark.parametrize("widths", [[5], [5, 0, 2], [5, 2.0, 2], [True, 3]])
def test_relu_mlp_rejects_bad_widths(widths):
    with pytest.raises(ValueError, match="widths must list"):
        nets.relu_mlp(widths)


def test_two_conv_has_the_papers_hidden_neurons():
    # Table 1 of the switched-projections paper: 38,144 hidden neurons on a 28 x 28 input
    from dualview import gates

    net = nets.two_conv().eval()
    with torch.no_grad():
        assert sum(gates.record_gates(net, torch.randn(2, 1, 28, 28)).num_gates().values()) == 38_144
        assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
        assert nets.two_conv(3, 32, 2)(torch.randn(1, 3, 32, 32)).shape == (1, 2)
    with pytest.raises(ValueError, match="multiple of 4"):
        nets.two_conv(size=30)
