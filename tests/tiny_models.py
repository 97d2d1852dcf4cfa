"""The small models the unit tests build, one definition each (imported as ``from tiny_models import ...``;
pytest puts tests/ on the path).

``conv_net``: the tiny CNN of many tests, two convolutional blocks and a linear head, with the options the
tests vary; ``spread_batchnorm``: BatchNorm statistics and affine parameters away from 0 and 1, so that a
BatchNorm's factor and shift are tested too, not an identity."""
from __future__ import annotations

import torch
from torch import nn


def conv_net(in_channels: int = 1, widths: tuple[int, int] = (3, 4), classes: int = 3, *, side: int = 8,
             padding_mode: str = "zeros", batchnorm: bool = False, pool: str = "max", second_padding: int = 1,
             head_pool: nn.Module | None = None, hidden: int | None = None, dropout: float | None = None,
             bias: bool = True, seed: int | None = None, dtype: torch.dtype | None = None) -> nn.Sequential:
    """A flat ``nn.Sequential`` in eval mode, for inputs of shape (n, in_channels, side, side):

        Conv2d(in_channels, widths[0], 3, padding=1, padding_mode), [BatchNorm2d], ReLU, MaxPool2d(2) or
        AvgPool2d(2) (``pool``), Conv2d(widths[0], widths[1], 3, padding=second_padding), ReLU, [head_pool],
        Flatten, [Linear(., hidden), ReLU, [Dropout(dropout)]], Linear(., classes)

    ``bias`` for every convolution and linear layer; the parameters drawn after ``torch.manual_seed(seed)`` if
    a seed is given (else from the global generator), in layer order; then converted to ``dtype`` if given."""
    if seed is not None:
        torch.manual_seed(seed)
    layers = [nn.Conv2d(in_channels, widths[0], 3, padding=1, padding_mode=padding_mode, bias=bias)]
    layers += [nn.BatchNorm2d(widths[0])] if batchnorm else []
    layers += [nn.ReLU(), {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}[pool](2),
               nn.Conv2d(widths[0], widths[1], 3, padding=second_padding, bias=bias), nn.ReLU()]
    layers += [head_pool] if head_pool is not None else []
    layers.append(nn.Flatten())
    with torch.no_grad():  # the head's input size, from a forward pass in eval mode (no statistic changes)
        features = nn.Sequential(*layers).eval()(torch.zeros(1, in_channels, side, side)).shape[1]
    if hidden is not None:
        layers += [nn.Linear(features, hidden, bias=bias), nn.ReLU()]
        layers += [nn.Dropout(dropout)] if dropout is not None else []
        features = hidden
    net = nn.Sequential(*layers, nn.Linear(features, classes, bias=bias))
    return (net.to(dtype) if dtype is not None else net).eval()


def spread_batchnorm(net: nn.Module, mean: float = 0.5, var: tuple[float, float] = (0.5, 2.0),
                     weight: tuple[float, float] | None = (0.5, 1.5), bias: float | None = 0.3) -> nn.Module:
    """Every BatchNorm of ``net`` (``net`` itself if it is one) with its running mean drawn uniformly in
    [-mean, mean], its running variance in ``var``, its weight in ``weight`` and its bias in [-bias, bias]
    (None: left as it is), drawn in that order, module after module. Returns ``net``."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-mean, mean)
                m.running_var.uniform_(*var)
                if weight is not None:
                    m.weight.uniform_(*weight)
                if bias is not None:
                    m.bias.uniform_(-bias, bias)
    return net
