"""The receptive-field plan and its squared norms (dualview.receptive_fields) against the materialised
switched weights of the generic sweep (projections.switched_projections, itself tested against the
per-neuron reference in test_projections.py), layer by layer, on random nets of each layer type."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dualview import projections as P
from dualview.gates import record_gates
from dualview.receptive_fields import conv_plan, sq_norms
from test_projections import _random_bn  # BatchNorm with random statistics, in eval mode, float64

# gates that wait for a max-pool across a Dropout, gates applied before a point-wise map, tails that
# end in a ReLU, layers after the last ReLU (spatial or tail), several patch channels, and patches
# large enough that the squared norms are summed in several slices
NETS = {
    "relu-dropout-pool-bn-pool": (lambda: nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Dropout(0.3), nn.MaxPool2d(2), nn.Conv2d(3, 4, 2), nn.ReLU(),
        nn.BatchNorm2d(4), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 5), nn.ReLU()), (2, 13, 13)),
    "spatial-after-last-relu": (lambda: nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(2, 2, 3), nn.Flatten(), nn.Linear(18, 3)),
        (1, 12, 12)),
    "wide-patches": (lambda: nn.Sequential(
        nn.Conv2d(3, 4, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(72, 30), nn.ReLU(), nn.Linear(30, 2)), (3, 24, 24)),
}


@pytest.mark.parametrize("kind", sorted(NETS))
@pytest.mark.parametrize("seed", [0, 1])
def test_sq_norms_equal_the_materialised_switched_weights(kind, seed):
    torch.manual_seed(seed)
    make, shape = NETS[kind]
    net = _random_bn(make())
    x = torch.randn(3, *shape, dtype=torch.float64)
    x[:, :, :2] = 0.0
    rec = record_gates(net, x)
    plan = conv_plan(net, x, rec.names)
    assert plan is not None
    sq = sq_norms(x, rec.gates, rec.pool_indices, plan)
    p = P.switched_projections(net, x)
    assert list(sq) == p.names
    for name in p.names:
        torch.testing.assert_close(sq[name], p.sq_norm[:, p.slices[name]], rtol=1e-10, atol=1e-12)
    ref = P.insens_reference(net, x)
    torch.testing.assert_close(P.insens(net, x).omega, ref.omega, rtol=1e-10, atol=1e-12)


def test_the_plan_leaves_out_layers_after_the_last_relu():
    x = torch.randn(1, 1, 12, 12)
    net = NETS["spatial-after-last-relu"][0]()
    plan = conv_plan(net, x, record_gates(net, x).names)
    assert plan.tail == [] and [type(m) for _, m, _ in plan.spatial] == [nn.Conv2d, nn.ReLU]
    net = NETS["relu-dropout-pool-bn-pool"][0]().eval()
    x = torch.randn(1, 2, 13, 13)
    plan = conv_plan(net, x, record_gates(net, x).names)
    assert [type(m) for _, m in plan.tail] == [nn.Linear, nn.ReLU]
    net = nn.Sequential(*net, nn.Linear(5, 2))  # an output layer after the last ReLU: no hidden neuron
    assert [type(m) for _, m in conv_plan(net, x, record_gates(net, x).names).tail] == [nn.Linear, nn.ReLU]
