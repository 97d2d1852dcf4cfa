"""A small, seeded, device-agnostic training loop with progress bars, and evaluation helpers."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from dualview import seed_everything

__all__ = ["History", "fit", "predict", "accuracy"]


@dataclass
class History:
    """Per-epoch training loss and accuracies (test accuracy only when test data is given)."""

    loss: list[float] = field(default_factory=list)
    train_accuracy: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)


def _xy(data) -> tuple[Tensor, Tensor]:
    if hasattr(data, "x") and hasattr(data, "y"):
        return data.x, data.y
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return data[0], data[1]
    raise TypeError("data must be an ImageData (with .x and .y) or a pair (x, y) of tensors")


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, batch_size: int = 1000) -> Tensor:
    """Model outputs for ``x`` computed in batches, in eval mode, on the model's device."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    outs = [model(chunk.to(device)).cpu() for chunk in x.split(batch_size)]
    model.train(was_training)
    return torch.cat(outs)


def accuracy(model: nn.Module, data, batch_size: int = 1000) -> float:
    """Share of correctly classified samples of ``data`` (ImageData or ``(x, y)``)."""
    x, y = _xy(data)
    return (predict(model, x, batch_size).argmax(1) == y).float().mean().item()


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
    parameters=None,
) -> History:
    """Train ``model`` with cross-entropy on ``train`` (ImageData or ``(x, y)``) and return its history.

    ``optimizer`` is ``"adam"`` or ``"sgd"`` (momentum 0.9). ``parameters`` restricts training to a
    subset (e.g. the value network of a gated network); by default all parameters are trained.
    Data is shuffled with a generator seeded by ``seed``; the model stays on its own device.
    """
    if epochs < 0 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 0, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    x, y = _xy(train)
    device = next(model.parameters()).device
    params = list(parameters) if parameters is not None else [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    gen = seed_everything(seed)
    loss_fn = nn.CrossEntropyLoss()
    hist = History()
    bar = tqdm(range(epochs), desc="epochs", disable=not progress, leave=False)
    for _ in bar:
        model.train()
        perm = torch.randperm(len(y), generator=gen)
        total, correct = 0.0, 0
        for idx in perm.split(batch_size):
            xb, yb = x[idx].to(device), y[idx].to(device)
            out = model(xb)
            loss = loss_fn(out, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            correct += (out.argmax(1) == yb).sum().item()
        hist.loss.append(total / len(y))
        hist.train_accuracy.append(correct / len(y))
        if test is not None:
            hist.test_accuracy.append(accuracy(model, test))
        bar.set_postfix(loss=f"{hist.loss[-1]:.3f}")
    model.eval()
    return hist
