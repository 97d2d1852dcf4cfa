"""A small, seeded, device-agnostic training loop with progress bars, and evaluation helpers.

:func:`fit` trains a classifier (cross-entropy) or a regression network (mean squared error). Beyond
the task loss it takes what a regularised objective needs: a ``penalty`` added to the loss with a
weight that may follow a schedule over the epochs (the routing penalty of feature leveling, Eq. 8 of
:cite:`featureleveling2020`), parameter groups with their own learning rate and weight decay, a
``forward`` that may change with the epoch (e.g. fixed routing gates in the last epochs), and
``record`` to follow any quantity of the model epoch by epoch.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dualview import seed_everything

__all__ = ["TASKS", "History", "fit", "predict", "accuracy", "per_point_scores", "evaluate"]

#: What :func:`fit` can learn: ``"classification"`` (cross-entropy, integer labels) or ``"regression"``
#: (mean squared error, real targets).
TASKS = ("classification", "regression")


@dataclass
class History:
    """Per epoch: the task loss, the penalty (unweighted, when :func:`fit` has one), the training and test
    accuracies (classification; test only with test data), the test RMSE (regression, with test data),
    and ``records[name]``, one value per epoch of every quantity given to :func:`fit` as ``record``."""

    loss: list[float] = field(default_factory=list)
    train_accuracy: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)
    penalty: list[float] = field(default_factory=list)
    test_rmse: list[float] = field(default_factory=list)
    records: dict[str, list[Any]] = field(default_factory=dict)


def _xy(data) -> tuple[Tensor, Tensor]:
    if hasattr(data, "x") and hasattr(data, "y"):
        return data.x, data.y
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return data[0], data[1]
    raise TypeError("data must be an ImageData (with .x and .y) or a pair (x, y) of tensors")


def _check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return task


def _to_model(x: Tensor, p: Tensor) -> Tensor:
    """``x`` on the device of parameter ``p``, and in its dtype if ``x`` is floating point."""
    return x.to(device=p.device, dtype=p.dtype) if x.is_floating_point() else x.to(p.device)


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, batch_size: int = 1000) -> Tensor:
    """Model outputs for ``x`` computed in batches, in eval mode, on the model's device (and dtype)."""
    p = next(model.parameters())
    was_training = model.training
    model.eval()
    outs = [model(_to_model(chunk, p)).cpu() for chunk in x.split(batch_size)]
    model.train(was_training)
    return torch.cat(outs)


def accuracy(model: nn.Module, data, batch_size: int = 1000) -> float:
    """Share of correctly classified samples of ``data`` (ImageData or ``(x, y)``)."""
    x, y = _xy(data)
    return (predict(model, x, batch_size).argmax(1) == y).float().mean().item()


def per_point_scores(model: nn.Module, data, task: str = "classification", batch_size: int = 2000) -> Tensor:
    """One score per test point, in eval mode: 1.0/0.0 for a correct/wrong prediction (classification) or
    the squared error (regression), float64. Their mean is :func:`evaluate`'s accuracy (or its RMSE
    squared); they are what :mod:`dualview.stats` bootstraps over."""
    _check_task(task)
    x, y = _xy(data)
    out = predict(model, x, batch_size)
    if task == "classification":
        return (out.argmax(1) == y.cpu()).double()
    return (out.reshape(y.shape).double() - y.cpu().double()).pow(2)


def evaluate(model: nn.Module, data, task: str = "classification", batch_size: int = 2000) -> float:
    """Test accuracy (classification) or root mean squared error (regression), in eval mode: the mean of
    :func:`per_point_scores` (its square root for regression)."""
    mean = per_point_scores(model, data, task, batch_size).mean().item()
    return mean if task == "classification" else mean ** 0.5


def _task_loss(out: Tensor, y: Tensor, task: str) -> Tensor:
    if task == "classification":
        return F.cross_entropy(out, y)
    return F.mse_loss(out.reshape(y.shape), y.to(out.dtype))


def fit(
    model: nn.Module,
    train,
    epochs: int,
    lr: float = 1e-3,
    batch_size: int = 128,
    test=None,
    optimizer: str = "adam",
    weight_decay: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    parameters: Iterable[Tensor] | Iterable[dict] | None = None,
    *,
    task: str = "classification",
    penalty: Callable[[nn.Module], Tensor] | None = None,
    penalty_weight: float | Callable[[int], float] = 1.0,
    forward: Callable[[nn.Module, Tensor, int], Tensor] | None = None,
    record: Mapping[str, Callable[[nn.Module], Any]] | None = None,
) -> History:
    """Train ``model`` on ``train`` (ImageData or ``(x, y)``) and return its history.

    ``task``: ``"classification"`` (cross-entropy) or ``"regression"`` (mean squared error).
    ``optimizer`` is ``"adam"`` or ``"sgd"`` (momentum 0.9). ``parameters`` restricts training to a
    subset (e.g. the value network of a gated network), or gives torch's parameter groups: dicts
    ``{"params": [...], "lr": ..., "weight_decay": ...}``, each group overriding ``lr`` and
    ``weight_decay``; by default all parameters are trained.

    ``penalty(model)`` is added to the loss of every batch, times ``penalty_weight``: a number, or a
    function of the epoch (0, 1, ...) for a schedule; in an epoch whose weight is 0 the penalty is
    not added at all (no gradient). ``forward(model, x, epoch)`` replaces ``model(x)`` on the training
    batches. ``record`` maps names to functions of the model, evaluated after every epoch into
    ``History.records``. Data is shuffled with a generator seeded by ``seed``; the model stays on its
    own device and dtype, and is left in eval mode.
    """
    _check_task(task)
    if epochs < 0 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 0, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    if not callable(penalty_weight) and not (isinstance(penalty_weight, numbers.Real) and penalty_weight >= 0):
        raise ValueError(f"penalty_weight must be a number >= 0 or a function of the epoch, got {penalty_weight!r}")
    weight_at = penalty_weight if callable(penalty_weight) else (lambda epoch: penalty_weight)
    x, y = _xy(train)
    p0 = next(model.parameters())
    params = list(parameters) if parameters is not None else [p for p in model.parameters() if p.requires_grad]
    # foreach=True: one call per step for all parameters instead of one per tensor, the same updates bit for
    # bit on a CPU (torch's default there is the per-tensor loop, whose overhead dominates small networks)
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=True)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay, foreach=True)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    gen = seed_everything(seed)
    hist = History(records={name: [] for name in (record or {})})
    bar = tqdm(range(epochs), desc="epochs", disable=not progress, leave=False)
    for epoch in bar:
        model.train()
        weight = float(weight_at(epoch)) if penalty is not None else 0.0
        perm = torch.randperm(len(y), generator=gen, device=gen.device)
        total, pen_total, correct = 0.0, 0.0, 0
        for idx in perm.split(batch_size):
            xb, yb = _to_model(x[idx], p0), y[idx].to(p0.device)
            out = model(xb) if forward is None else forward(model, xb, epoch)
            loss = _task_loss(out, yb, task)
            objective = loss
            if penalty is not None:
                pen = penalty(model)
                pen_total += pen.item() * len(idx)
                if weight != 0:
                    objective = loss + weight * pen
            opt.zero_grad(set_to_none=True)
            objective.backward()
            opt.step()
            total += loss.item() * len(idx)
            if task == "classification":
                correct += (out.argmax(1) == yb).sum().item()
        hist.loss.append(total / len(y))
        if penalty is not None:
            hist.penalty.append(pen_total / len(y))
        if task == "classification":
            hist.train_accuracy.append(correct / len(y))
        for name, fn in (record or {}).items():
            hist.records[name].append(fn(model))
        if test is not None and task == "classification":
            hist.test_accuracy.append(accuracy(model, test))
        elif test is not None:
            hist.test_rmse.append(evaluate(model, test, task))
        bar.set_postfix(loss=f"{hist.loss[-1]:.3f}")
    model.eval()
    return hist
