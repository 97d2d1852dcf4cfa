"""The training loop and its evaluation helpers: accuracy counted by hand, batched prediction in eval
mode, seeded training that learns, and the documented bad inputs."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dualview import train


def _fixed_classifier() -> nn.Module:
    """Logits = x itself: the prediction is the index of the largest coordinate."""
    net = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.eye(3))
    return net


def test_accuracy_counts_correct_predictions_by_hand():
    net = _fixed_classifier()
    x = torch.tensor([[5.0, 0, 0], [0, 5, 0], [0, 0, 5], [5, 0, 0], [0, 5, 0]])  # predicts 0 1 2 0 1
    y = torch.tensor([0, 1, 0, 2, 1])                                           # right, right, wrong, wrong, right
    assert train.accuracy(net, (x, y)) == pytest.approx(3 / 5)
    assert train.accuracy(net, (x, y), batch_size=2) == pytest.approx(3 / 5)  # batches do not change it
    assert train.accuracy(net, (x, torch.tensor([0, 1, 2, 0, 1]))) == 1.0


def test_predict_is_batched_in_eval_mode_and_restores_the_mode():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(7, 4)
    net.eval()
    with torch.no_grad():
        expected = net(x)
    net.train()
    out = train.predict(net, x, batch_size=3)  # dropout off: the eval-mode outputs, batch by batch
    torch.testing.assert_close(out, expected)
    assert net.training


def test_fit_is_seeded_learns_and_records_its_history():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 2, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()  # linearly separable
    test = (x[:64], y[:64])

    def run():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
        return net, train.fit(net, (x, y), epochs=5, lr=0.05, batch_size=32, test=test, seed=3, progress=False)

    net, hist = run()
    _, again = run()
    assert hist.loss == again.loss  # same seed, same shuffles, same numbers
    assert len(hist.loss) == len(hist.train_accuracy) == len(hist.test_accuracy) == 5
    assert hist.loss[-1] < 0.5 * hist.loss[0] and hist.train_accuracy[-1] > 0.9
    assert hist.test_accuracy[-1] == pytest.approx(train.accuracy(net, test))
    assert not net.training


def test_fit_rejects_bad_arguments_with_clear_errors():
    net, data = _fixed_classifier(), (torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="epochs >= 0"):
        train.fit(net, data, epochs=-1, progress=False)
    with pytest.raises(ValueError, match="optimizer must be"):
        train.fit(net, data, epochs=1, optimizer="rmsprop", progress=False)
    with pytest.raises(TypeError, match="pair"):
        train.accuracy(net, torch.randn(4, 3))
