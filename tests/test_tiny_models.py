"""The shared test models (tests/tiny_models.py) are the networks they say they are."""
from __future__ import annotations

import torch
from torch import nn

from tiny_models import conv_net, spread_batchnorm


def test_conv_net_is_the_network_written_out():
    torch.manual_seed(5)
    by_hand = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3), nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1), nn.Flatten(), nn.Linear(8 * 3 * 3, 16), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(16, 5)).double().eval()
    built = conv_net(3, (6, 8), 5, side=14, batchnorm=True, second_padding=0, hidden=16, dropout=0.1, seed=5,
                     head_pool=nn.MaxPool2d(3, stride=2, padding=1), dtype=torch.float64)
    assert repr(built) == repr(by_hand) and not built.training
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), by_hand.state_dict().values()))
    assert conv_net()(torch.rand(2, 1, 8, 8)).shape == (2, 3)


def test_spread_batchnorm_draws_in_its_ranges():
    bn = spread_batchnorm(nn.Sequential(nn.BatchNorm2d(500)), mean=0.5, var=(0.3, 3.0), weight=(0.5, 2.0))[0]
    assert bn.running_mean.abs().max() <= 0.5 and bn.running_var.min() >= 0.3 and bn.running_var.max() <= 3.0
    assert bn.weight.min() >= 0.5 and bn.weight.max() <= 2.0 and bn.bias.abs().max() <= 0.3
    assert bn.running_var.std() > 0.5 and bn.weight.requires_grad
    kept = spread_batchnorm(nn.BatchNorm1d(4), weight=None, bias=None)
    assert torch.equal(kept.weight, torch.ones(4)) and torch.equal(kept.bias, torch.zeros(4))
