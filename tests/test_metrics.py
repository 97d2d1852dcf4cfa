"""Tests of dualview.metrics: deletion and insertion curves on a pretrained network, smoothness measures
against loops and closed forms, and the target argument's errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dualview import metrics, zoo


@pytest.fixture(scope="module")
def resnet20() -> nn.Module:
    return zoo.load_pretrained("resnet20")


@pytest.fixture(scope="module")
def cifar_batch() -> torch.Tensor:
    from dualview import data

    return data.load_cifar10("test").x[[0, 2500, 5000]]  # 3 real CIFAR-10 test images


def test_deletion_curve(resnet20, cifar_batch):
    x = cifar_batch[:3]
    scores = torch.rand(3, 32, 32)
    curve = metrics.deletion_curve(resnet20, x, [0, 1, 2], scores, baseline=torch.tensor([0.485, 0.456, 0.406]),
                              fractions=[0.0, 0.25, 1.0])
    with torch.no_grad():
        out = resnet20(x)
    assert torch.allclose(curve.target_logit[0], out[[0, 1, 2], [0, 1, 2]])
    grey = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1).expand_as(x)
    with torch.no_grad():
        assert torch.allclose(curve.target_logit[-1], resnet20(grey)[[0, 1, 2], [0, 1, 2]], atol=1e-5)
    assert curve.area().shape == (3,)


def test_insertion_curve(resnet20, cifar_batch):
    x = cifar_batch[:3]
    scores = torch.rand(3, 32, 32)
    grey = torch.tensor([0.485, 0.456, 0.406])
    ins = metrics.deletion_curve(resnet20, x, [0, 1, 2], scores, baseline=grey, fractions=[0.0, 0.3, 1.0], mode="insertion")
    dele = metrics.deletion_curve(resnet20, x, [0, 1, 2], -scores, baseline=grey, fractions=[0.0, 0.7, 1.0])
    with torch.no_grad():
        assert torch.allclose(ins.target_logit[0], resnet20(grey.view(1, 3, 1, 1).expand_as(x))[[0, 1, 2], [0, 1, 2]],
                              atol=1e-5)
        assert torch.allclose(ins.target_logit[-1], resnet20(x)[[0, 1, 2], [0, 1, 2]], atol=1e-5)
    # inserting the top 30 % by score = deleting the bottom 70 % (the top 70 % of -scores)
    assert torch.allclose(ins.target_logit[1], dele.target_logit[1], atol=1e-5)
    with pytest.raises(ValueError, match="mode"):
        metrics.deletion_curve(resnet20, x, 0, scores, mode="sideways")


def _tv_reference(m: torch.Tensor) -> float:
    c, h, w = m.shape
    tv = sum(abs(float(m[k, i + 1, j] - m[k, i, j])) for k in range(c) for i in range(h - 1) for j in range(w))
    tv += sum(abs(float(m[k, i, j + 1] - m[k, i, j])) for k in range(c) for i in range(h) for j in range(w - 1))
    return tv / float(m.abs().sum())


def test_total_variation():
    torch.manual_seed(0)
    m = torch.randn(3, 2, 7, 5, dtype=torch.float64)
    tv = metrics.total_variation(m)
    assert torch.allclose(tv, torch.tensor([_tv_reference(mi) for mi in m], dtype=m.dtype))
    assert torch.allclose(metrics.total_variation(5 * m), tv)                      # scale-free
    assert metrics.total_variation(torch.ones(1, 6, 6)).item() == 0
    board = (-1.0) ** (torch.arange(6)[:, None] + torch.arange(6)[None, :]).double()
    assert abs(metrics.total_variation(board[None]).item() - 2 * (2 * 5 * 6) / 36) < 1e-12
    with pytest.raises(ValueError):
        metrics.total_variation(torch.ones(4, 4))


def test_high_frequency_share():
    n = 16
    i = torch.arange(n, dtype=torch.float64)
    board = (-1.0) ** (i[:, None] + i[None, :])                  # Nyquist in both directions
    wave = torch.cos(2 * torch.pi * i[:, None] / n).expand(n, n)  # one cycle per image: low frequency
    hf = metrics.high_frequency_share(torch.stack([board, wave, torch.ones(n, n, dtype=torch.float64)]))
    assert torch.allclose(hf, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), atol=1e-12)
    # Parseval: the share of white noise above the cutoff is the share of frequency cells above it
    torch.manual_seed(0)
    noise = torch.randn(400, 1, n, n, dtype=torch.float64)
    f = torch.fft.fftfreq(n, dtype=torch.float64)
    cells = ((f[:, None] ** 2 + f[None, :] ** 2).sqrt() > 0.25).double().mean()
    assert abs(metrics.high_frequency_share(noise).mean() - cells) < 0.01
    assert torch.allclose(metrics.high_frequency_share(3 * noise[:2]), metrics.high_frequency_share(noise[:2]))


def test_errors(resnet20, cifar_batch):
    x = cifar_batch[:2]
    with pytest.raises(ValueError, match="scores"):
        metrics.deletion_curve(resnet20, x, 0, torch.rand(2, 3, 12, 12))
    logits = torch.zeros(2, 5)
    assert metrics.target_classes(3, logits).tolist() == [3, 3]
    assert metrics.target_classes(torch.tensor([1, 4]), logits).tolist() == [1, 4]
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        metrics.target_classes(5, logits)
    with pytest.raises(ValueError, match="one class per sample"):
        metrics.target_classes([0, 1, 2], logits)
    with pytest.raises(TypeError, match="integer"):
        metrics.target_classes(torch.tensor([0.5, 1.0]), logits)
    with pytest.raises(TypeError, match="floating"):
        metrics.deletion_curve(resnet20, x.long(), 0, torch.rand(2, 32, 32))
