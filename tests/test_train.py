"""The training loop and its evaluation helpers: accuracy counted by hand, batched prediction in eval
mode, seeded training that learns, one optimisation step of the penalty hook and of parameter groups
against the update written out by hand, the penalty schedule, the epoch-dependent forward and the
records, regression, per-point scores, and the documented bad inputs."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dualview import data, leveling, train


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
    with pytest.raises(ValueError, match="task"):
        train.fit(net, data, epochs=1, task="ranking", progress=False)
    with pytest.raises(ValueError, match="penalty_weight"):
        train.fit(net, data, epochs=1, penalty=lambda m: m.weight.sum(), penalty_weight=-1.0, progress=False)


def _batch():
    g = torch.Generator().manual_seed(4)
    return torch.randn(8, 3, generator=g), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])


def _sgd_step_by_hand(net: nn.Module, x, y, lr_of, decay_of, penalty=None, weight=0.0) -> dict[str, torch.Tensor]:
    """One SGD step written out: p - lr (grad + weight_decay p); the first momentum step is the gradient."""
    ref = copy.deepcopy(net)
    objective = F.cross_entropy(ref(x), y) + (weight * penalty(ref) if penalty is not None else 0.0)
    grads = torch.autograd.grad(objective, list(ref.parameters()))
    return {name: (p - lr_of(name) * (gr + decay_of(name) * p)).detach()
            for (name, p), gr in zip(ref.named_parameters(), grads)}


def test_penalty_is_added_to_the_loss_with_its_weight_and_recorded_unweighted():
    x, y = _batch()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    l2 = lambda m: m[0].weight.pow(2).sum()  # noqa: E731
    expected = _sgd_step_by_hand(net, x, y, lambda n: 0.1, lambda n: 0.0, penalty=l2, weight=0.5)
    loss0, pen0 = F.cross_entropy(net(x), y).item(), l2(net).item()
    hist = train.fit(net, (x, y), epochs=1, lr=0.1, batch_size=8, optimizer="sgd", penalty=l2, penalty_weight=0.5,
                     progress=False)
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name])
    # the history holds the task loss and the penalty without its weight
    assert hist.loss == pytest.approx([loss0]) and hist.penalty == pytest.approx([pen0])
    # without the penalty the first layer moves differently: the check above sees the penalty
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    train.fit(plain, (x, y), epochs=1, lr=0.1, batch_size=8, optimizer="sgd", progress=False)
    assert not torch.allclose(plain[0].weight, net[0].weight)


def test_parameter_groups_have_their_own_learning_rate_and_weight_decay():
    x, y = _batch()
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    first = lambda name: name.startswith("0.")  # noqa: E731
    expected = _sgd_step_by_hand(net, x, y, lambda n: 0.5 if first(n) else 0.1, lambda n: 0.2 if first(n) else 0.01)
    groups = [{"params": net[0].parameters(), "lr": 0.5, "weight_decay": 0.2}, {"params": net[2].parameters()}]
    train.fit(net, (x, y), epochs=1, lr=0.1, weight_decay=0.01, batch_size=8, optimizer="sgd", parameters=groups,
              progress=False)
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name])


def test_penalty_schedule_forward_and_records_follow_the_epochs():
    x, y = _batch()
    torch.manual_seed(2)
    net = nn.Linear(3, 2)
    net.register_parameter("extra", nn.Parameter(torch.tensor([2.0])))  # reached by the penalty only
    seen = []

    def forward(m, xb, epoch):
        seen.append(epoch)
        return m(xb)

    hist = train.fit(net, (x, y), epochs=3, lr=0.1, batch_size=4, penalty=lambda m: m.extra.pow(2).sum(),
                     penalty_weight=lambda epoch: 0.0 if epoch == 1 else 1.0, forward=forward,
                     record={"extra": lambda m: m.extra.item()}, progress=False)
    assert seen == [0, 0, 1, 1, 2, 2]  # two batches per epoch
    extra = hist.records["extra"]
    assert 2.0 > extra[0] > extra[2], extra
    # weight 0 in epoch 1: the penalty is not added at all, so Adam's momentum does not move its parameter
    assert extra[1] == extra[0]
    assert len(hist.penalty) == len(hist.loss) == 3 and hist.penalty[1] == pytest.approx(extra[0] ** 2)


def test_regression_learns_and_records_the_test_rmse():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.3
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    hist = train.fit(net, (x, y), epochs=30, lr=0.05, batch_size=32, test=(x[:64], y[:64]), task="regression",
                     progress=False)
    assert hist.loss[-1] < 0.01 * hist.loss[0] and not hist.train_accuracy and not hist.test_accuracy
    with torch.no_grad():
        rmse = (net(x[:64])[:, 0] - y[:64]).pow(2).mean().sqrt().item()
    assert hist.test_rmse[-1] == pytest.approx(rmse, rel=1e-5)


def test_per_point_scores_average_to_evaluate():
    x, y = data.make_ixor(300, seed=5)
    torch.manual_seed(0)
    model = leveling.FeatureLevelingNet([3, 4], 2, init_log_alpha=0.0).eval()
    s = train.per_point_scores(model, (x, y))
    assert s.shape == (300,) and set(s.unique().tolist()) <= {0.0, 1.0}
    assert abs(s.mean().item() - train.evaluate(model, (x, y))) < 1e-12
    reg = leveling.FeatureLevelingNet([3, 4], 1).eval()
    e = train.per_point_scores(reg, (x, y.double()), "regression")
    assert abs(e.mean().sqrt().item() - train.evaluate(reg, (x, y.double()), "regression")) < 1e-9


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_fit_foreach_optimizers_give_the_per_tensor_loops_updates_bit_for_bit(optimizer, monkeypatch):
    """fit builds its optimizers with foreach=True for speed; the comment there says the updates equal the
    per-tensor loop's exactly: weights after training with each must be equal."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x, y = torch.rand(96, 1, 8, 8), torch.randint(0, 3, (96,))
    trained, built = {}, []
    for foreach in (True, False):
        model = copy.deepcopy(net)
        if not foreach:
            for name in ("Adam", "SGD"):
                cls = getattr(torch.optim, name)
                monkeypatch.setattr(torch.optim, name, lambda *a, _cls=cls, **k: built.append(k.pop("foreach"))
                                    or _cls(*a, **k, foreach=False))
        groups = [{"params": model[0].parameters(), "lr": 1e-3, "weight_decay": 1e-4},
                  {"params": model[3].parameters()}]
        train.fit(model, (x, y), epochs=3, lr=3e-3, batch_size=16, optimizer=optimizer, weight_decay=5e-4,
                  parameters=groups, progress=False)
        trained[foreach] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.equal(trained[True], torch.cat([p.detach().flatten() for p in net.parameters()]))
    assert built == [True]  # fit asked for foreach, and the second run really used the per-tensor loop
    assert torch.equal(trained[True], trained[False])
