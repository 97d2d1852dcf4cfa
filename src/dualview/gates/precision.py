"""Float precision for the identity checks: TF32 off, and the check that a decomposition reproduces its output."""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import Tensor

from dualview.gates.layers import UnsupportedLayerError

def _tf32_switches() -> list[tuple[object, str, object]]:
    """``(namespace, attribute, full-precision value)`` of each switch that lets float32 matmuls and cuDNN
    convolutions run in TF32 on a CUDA GPU (10-bit mantissa; the default for convolutions on Ampere and
    later). PyTorch's per-backend ``fp32_precision`` where it has one (2.9 and later: mixing it with
    the legacy ``allow_tf32`` flags can raise), else the legacy flags."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(getattr(cudnn, "conv", None), "fp32_precision"):
        backends = (matmul, cudnn.conv, getattr(cudnn, "rnn", None))
        return [(b, "fp32_precision", "ieee") for b in backends if hasattr(b, "fp32_precision")]
    return [(matmul, "allow_tf32", False), (cudnn, "allow_tf32", False)]


def tf32_off() -> None:
    """Run float32 matmuls and convolutions in full float32 precision from now on (TF32 off; what
    :func:`dualview.setup` does on CUDA). No effect on a CPU."""
    for namespace, name, value in _tf32_switches():
        setattr(namespace, name, value)


def _tf32_on() -> bool:
    """Whether float32 matmuls or convolutions may run in TF32 on a CUDA GPU (the switches as they are)."""
    return any(getattr(namespace, name) in (True, "tf32") for namespace, name, _ in _tf32_switches())


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Inside the block (or the decorated function), TF32 is off (:func:`tf32_off`); on exit, also after an
    exception, the caller's settings are back. The dual-view objects that check themselves
    (:func:`dualview.pullbacks.gated_linear_model`, :func:`dualview.projections.switched_projections`, Insens)
    run inside it, so their self-check compares float32 with float32 even where the caller uses TF32: a
    convolution in TF32 is off by about 1e-3 of its size, which the check would take for a non-linearity."""
    switches = _tf32_switches()
    saved = [getattr(namespace, name) for namespace, name, _ in switches]
    try:
        tf32_off()
        yield
    finally:
        for (namespace, name, _), value in zip(switches, saved):
            setattr(namespace, name, value)


def check_reproduces(what: str, terms: Tensor, bias: Tensor, output: Tensor) -> None:
    """Raise :class:`UnsupportedLayerError` unless ``terms.sum(-1) + bias = output``: an
    affine model (``terms`` = weight times input, per coordinate, in the last dimension) reproduces the
    network's own output at ``x``. Tolerance: a multiple of the dtype's rounding error of that sum. Float32
    CUDA tensors computed with TF32 on miss it: then the error names TF32 and how to turn it off."""
    eps = torch.finfo(terms.dtype).eps
    lhs = terms.sum(-1) + bias
    scale = terms.abs().sum(-1) + bias.abs() + output.abs()
    tol = 64 * eps * math.sqrt(terms.shape[-1] + 1) * scale + torch.finfo(terms.dtype).tiny
    err = (lhs - output).abs()
    if not bool((err <= tol).all()):
        worst = int((err - tol).flatten().argmax())
        raise UnsupportedLayerError(
            f"{what} does not reproduce the network at x: <w, x> + b = {float(lhs.flatten()[worst]):.6g} but "
            f"the network gives {float(output.flatten()[worst]):.6g} "
            f"(tolerance {float(tol.flatten()[worst]):.2g}). "
            + (_TF32_HINT if terms.is_cuda and terms.dtype == torch.float32 and _tf32_on() else
               "The network is not affine once its gates are fixed: it computes something dualview does not "
               "see (a non-linearity it does not know). This is refused rather than returned wrong; please "
               "report the model."))


_TF32_HINT = ("TF32 is on (PyTorch's default for convolutions on this GPU: float32 products rounded to a "
              "10-bit mantissa, errors of about 1e-3), the likely cause if these numbers come from your own "
              "forward pass. Turn it off before computing them, with the two lines "
              "torch.backends.cuda.matmul.allow_tf32 = False and torch.backends.cudnn.allow_tf32 = False "
              "(or compute them inside dualview.gates.full_precision()).")
