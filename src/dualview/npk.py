"""The neural path kernel of any supported network, and what to do with a kernel.

The *neural path kernel* (NPK) of a network is the Gram matrix of its neural path features,
``NPK(x, x') = <phi(x), phi(x')>`` (Section 2 of :cite:`lakshminarayanan2022explicitising`). Its
closed form depends on the architecture, one theorem each:

* fully connected networks, Theorem 3.1: :mod:`dualview.npk_fc` (a product of base kernels);
* circular convolutional networks with global average pooling, Theorem 3.2: :mod:`dualview.npk_conv`
  (a sum over rotations);
* fully connected ResNets, Theorem 3.3: :mod:`dualview.npk_resnet` (a sum over sub-networks).

:func:`npk` picks the form from the network, so a reader can ask for "the NPK of this model" without
knowing which theorem applies. The module also holds the kernel machines the chapters feed it to:
cosine normalisation (:func:`normalize_kernel`) and kernel ridge classification
(:func:`kernel_ridge_classify`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dualview.gates import UnsupportedLayerError
from dualview.nets import FCResNet
from dualview.npk_conv import npk_conv
from dualview.npk_fc import npk_fc
from dualview.npk_resnet import npk_resnet
from dualview.paths import fc_layers

__all__ = ["npk", "normalize_kernel", "KernelRidgeResult", "kernel_ridge_classify"]


def _form(model: nn.Module, gates: nn.Module | None):
    """The theorem's function for ``model``, or :class:`UnsupportedLayerError`."""
    if isinstance(model, FCResNet):
        if gates is not None:
            raise ValueError("gates (a gating network) are supported for fully connected and convolutional "
                             "networks; a ResNet's NPK uses its own gates")
        return npk_resnet
    try:
        fc_layers(model)
    except TypeError:
        pass
    else:
        return npk_fc
    if any(isinstance(m, (nn.Conv1d, nn.Conv2d)) for m in model.modules()):
        return npk_conv  # npk_conv checks the circular padding and global average pooling itself
    raise UnsupportedLayerError(
        f"no closed-form NPK for a {type(model).__name__}: npk knows fully connected ReLU networks "
        "(Sequential([Flatten], Linear, ReLU, ..., Linear); Theorem 3.1), circular convolutional networks "
        "with global average pooling (Theorem 3.2) and dualview.nets.FCResNet (Theorem 3.3). For any other "
        "ReLU network, dualview.paths.neural_path_features gives the features of a tiny one explicitly."
    )


def npk(model: nn.Module, x1: Tensor, x2: Tensor | None = None, *, gates: nn.Module | None = None,
        diag: bool = False, block: int = 500, **options) -> Tensor:
    """The NPK of ``model`` between the inputs ``x1`` and ``x2`` (``x2=None``: the Gram matrix of ``x1``).

    The form is picked from the network: :func:`dualview.npk_fc.npk_fc` for a fully connected ReLU
    network, :func:`dualview.npk_conv.npk_conv` for a circular convolutional one,
    :func:`dualview.npk_resnet.npk_resnet` for a :class:`dualview.nets.FCResNet`. ``gates`` is a gating
    network whose gates switch ``model``'s paths (a deep gated network with fixed gates: ``model`` is
    its value network); ``options`` go to the form's function (e.g. ``bias_paths``, ``normalize``,
    ``chunk_size`` of the fully connected form).

    ``diag=True`` returns only the diagonal ``NPK(x_i, x_i)``, shape ``(N1,)``, computed ``block``
    inputs at a time, so its memory and work grow like ``N1 * block`` instead of ``N1^2``: what
    cosine normalisation of a test-versus-train kernel needs.
    """
    form = _form(model, gates)
    if gates is not None:
        options["gating"] = gates
    if not diag:
        return form(model, x1, x2, **options)
    if x2 is not None:
        raise ValueError("diag=True gives NPK(x_i, x_i) of the inputs x1: leave x2 out")
    if not (isinstance(block, int) and block >= 1):
        raise ValueError(f"block must be a positive number of inputs, got {block!r}")
    return torch.cat([form(model, b, **options).diagonal() for b in x1.split(block)])


def normalize_kernel(K: Tensor, diag1: Tensor, diag2: Tensor | None = None) -> Tensor:
    """Cosine normalisation ``K(x, x') / sqrt(K(x, x) K(x', x'))`` (``diag2`` defaults to ``diag1``)."""
    diag2 = diag1 if diag2 is None else diag2
    if K.shape != (diag1.numel(), diag2.numel()):
        raise ValueError(f"K has shape {tuple(K.shape)} but the diagonals have {diag1.numel()} and {diag2.numel()} entries")
    if bool((diag1 <= 0).any()) or bool((diag2 <= 0).any()):
        raise ValueError("a kernel diagonal entry is <= 0 (an input with no active path?): cannot normalise")
    return K / torch.sqrt(diag1.reshape(-1, 1) * diag2.reshape(1, -1))


@dataclass
class KernelRidgeResult:
    """Predicted labels and scores of a kernel ridge classifier."""

    predictions: Tensor
    scores: Tensor


def kernel_ridge_classify(
    K_train: Tensor, y_train: Tensor, K_test: Tensor, ridge: float = 1e-3, num_classes: int | None = None
) -> KernelRidgeResult:
    """Kernel ridge regression on centred one-hot targets, then the arg-max class.

    ``K_train`` is ``(N, N)`` on the training inputs, ``K_test`` ``(M, N)`` between test and training
    inputs. ``ridge`` is relative to the mean of ``K_train``'s diagonal. Solved in float64 with a
    Cholesky factorisation.
    """
    n = K_train.shape[0]
    if K_train.shape != (n, n) or K_test.dim() != 2 or K_test.shape[1] != n or y_train.shape != (n,):
        raise ValueError(
            f"need K_train (N, N), y_train (N,), K_test (M, N); got {tuple(K_train.shape)}, "
            f"{tuple(y_train.shape)}, {tuple(K_test.shape)}"
        )
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    C = int(num_classes or int(y_train.max()) + 1)
    K = K_train.double()
    Y = torch.nn.functional.one_hot(y_train.long(), C).double() - 1.0 / C
    lam = ridge * K.diagonal().mean()
    L = torch.linalg.cholesky(K + lam * torch.eye(n, dtype=K.dtype, device=K.device))
    alpha = torch.cholesky_solve(Y.to(K.device), L)
    scores = K_test.double() @ alpha
    return KernelRidgeResult(predictions=scores.argmax(1), scores=scores)
