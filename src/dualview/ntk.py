"""The empirical neural tangent kernel (NTK) and its relation to the NPK.

* :func:`empirical_ntk` (with ``torch.func``) and :func:`empirical_ntk_reference` (one gradient per
  input), :func:`relative_deviation` between two kernels;
* :func:`ntk_npk_constant`: the constant of Theorem 5.1 of :cite:`lakshminarayanan2022disentangling`
  that relates the NTK of a DGN at initialisation to its NPK, and :func:`sign_init_`, the symmetric
  ``+-sigma`` initialisation it assumes.

The NTK of a deep gated network with fixed gates (:class:`dualview.dgn.GatedNetwork`) in its value
weights is ``empirical_ntk(dgn, x, params="value")``, to be compared with the NPK of those gates.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from dualview.npk_fc import DEFAULT_MEMORY_BUDGET, check_memory_budget

__all__ = [
    "sign_init_",
    "ntk_npk_constant",
    "empirical_ntk",
    "empirical_ntk_reference",
    "relative_deviation",
]

# ==================================================================================================
# The NTK/NPK constant and the empirical NTK


def sign_init_(model: nn.Module, sigma: float | Sequence[float], generator: torch.Generator | None = None) -> nn.Module:
    """Draw every weight of the Linear layers iid from ``{-sigma_l, +sigma_l}`` and zero the biases.

    Assumption 2.1 of :cite:`lakshminarayanan2022disentangling` (Assumption F.1 of
    :cite:`lakshminarayanan2022explicitising`), with one ``sigma`` for all layers or one per layer.
    Changes ``model`` in place and returns it.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    sigmas = [float(sigma)] * len(layers) if isinstance(sigma, (int, float)) else [float(s) for s in sigma]
    if len(sigmas) != len(layers):
        raise ValueError(f"need one sigma per Linear layer ({len(layers)}), got {len(sigmas)}")
    if any(s <= 0 for s in sigmas):
        raise ValueError(f"sigma must be positive, got {sigmas}")
    with torch.no_grad():
        for lin, s in zip(layers, sigmas):
            signs = torch.randint(0, 2, lin.weight.shape, generator=generator).to(lin.weight) * 2 - 1
            lin.weight.copy_(s * signs)
            if lin.bias is not None:
                lin.bias.zero_()
    return model


def ntk_npk_constant(sigmas: Sequence[float]) -> float:
    """The constant ``c`` of ``E[NTK_value] = c * NPK`` for value weights drawn from ``{-sigma_l, +sigma_l}``.

    For a path ``p`` of ``d`` weights, ``sum_theta (dv_p / dtheta)^2 = sum_l prod_{k != l} sigma_k^2``;
    cross terms between paths vanish in expectation. With one ``sigma`` for all ``d`` layers this is
    ``d * sigma^(2(d-1))`` (Theorem 2.1 of :cite:`lakshminarayanan2022disentangling`, Section 2 of
    :cite:`lakshminarayanan2022explicitising`).
    """
    s2 = [float(s) ** 2 for s in sigmas]
    if not s2 or any(v <= 0 for v in s2):
        raise ValueError(f"need one positive sigma per weight layer, got {list(sigmas)}")
    return sum(math.prod(s2[:l] + s2[l + 1:]) for l in range(len(s2)))


def _select_params(model: nn.Module, params) -> list[str]:
    names = [n for n, p in model.named_parameters()]
    if params is None:
        chosen = [n for n, p in model.named_parameters() if p.requires_grad]
    elif isinstance(params, str):
        chosen = [n for n in names if n == params or n.startswith(params.rstrip(".") + ".")]
    elif callable(params):
        chosen = [n for n in names if params(n)]
    else:
        chosen = list(params)
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise KeyError(f"the model has no parameters {unknown}; its parameters are {names}")
    if not chosen:
        raise ValueError(f"no parameters selected by params={params!r}; the model's parameters are {names}")
    return chosen


def empirical_ntk(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, *,
    params: str | Iterable[str] | Callable[[str], bool] | None = None, output: int | str | None = None,
    chunk_size: int = 64, memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """The empirical neural tangent kernel ``<d f(x)/d theta, d f(x')/d theta>`` :cite:`jacot2018neural`.

    Per-sample Jacobians with ``torch.func`` (``vmap`` over samples of ``jacrev`` of a
    ``functional_call``), ``chunk_size`` samples at a time, contracted block by block. ``params``
    selects the parameters ``theta``: ``None`` (all that require grad), a name prefix (``"value"``
    for the value network of a :class:`dualview.dgn.GatedNetwork`), a list of names, or a predicate
    on names; the others are held fixed. ``output``: for a single-output model ``None``; otherwise an output index,
    ``"trace"`` (sum over outputs of the diagonal blocks) or ``"full"`` (``(N1, N2, C, C)``). The
    Jacobians of ``x2`` are kept if they fit in ``memory_budget`` bytes, else recomputed per block.
    Returns ``(N1, N2)`` in the model's dtype.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    names = _select_params(model, params)
    all_params = dict(model.named_parameters())
    chosen = {n: all_params[n].detach() for n in names}
    fixed = {n: p.detach() for n, p in all_params.items() if n not in chosen}
    fixed.update({n: b for n, b in model.named_buffers()})
    n_params = sum(p.numel() for p in chosen.values())

    def f(p, xi):
        return functional_call(model, {**p, **fixed}, (xi.unsqueeze(0),)).reshape(-1)

    jac = vmap(jacrev(f), in_dims=(None, 0))
    with torch.no_grad():
        n_out = f(chosen, x1[0]).numel()
    if output is None and n_out != 1:
        raise ValueError(
            f"the model has {n_out} outputs: choose output=<index>, output='trace' or output='full'"
        )
    if isinstance(output, int) and not isinstance(output, bool):
        if not -n_out <= output < n_out:
            raise ValueError(f"output={output} but the model has {n_out} outputs")
        output = output % n_out
    if output not in (None, "trace", "full") and not isinstance(output, int):
        raise ValueError(f"output must be None, an int, 'trace' or 'full', got {output!r}")

    def jacobian(x: Tensor) -> Tensor:
        blocks = []
        for chunk in x.split(chunk_size):
            J = jac(chosen, chunk)
            Jf = torch.cat([J[n].flatten(2) for n in names], dim=2)  # (B, C, P)
            if isinstance(output, int):
                Jf = Jf[:, output:output + 1]
            blocks.append(Jf)
        return torch.cat(blocks)

    itemsize = next(iter(chosen.values())).dtype.itemsize
    per_sample = n_out * n_params * itemsize
    check_memory_budget(2 * chunk_size * per_sample, memory_budget, f"Jacobians of {chunk_size} samples "
                        f"({n_params:,} parameters, {n_out} outputs)", "Use a smaller chunk_size.")
    same = x2 is None
    x2 = x1 if same else x2
    n2 = x2.shape[0]
    keep_j2 = n2 * per_sample <= memory_budget
    J2 = jacobian(x2) if keep_j2 else None
    rows = []
    for c1 in x1.split(chunk_size):
        J1 = jacobian(c1)
        if J2 is not None:
            J2_blocks = [J2]
        else:
            J2_blocks = (jacobian(c2) for c2 in x2.split(chunk_size))
        cols = []
        for J2b in J2_blocks:
            if output == "full":
                cols.append(torch.einsum("icp,jdp->ijcd", J1, J2b))
            else:
                cols.append(torch.einsum("icp,jcp->ij", J1, J2b))
        rows.append(torch.cat(cols, dim=1))
    return torch.cat(rows, dim=0)


def empirical_ntk_reference(
    model: nn.Module, x1: Tensor, x2: Tensor | None = None, *,
    params: str | Iterable[str] | Callable[[str], bool] | None = None, output: int | str | None = None,
) -> Tensor:
    """Reference for :func:`empirical_ntk`: one ``torch.autograd.grad`` per sample and output, a loop over pairs."""
    names = _select_params(model, params)
    plist = [dict(model.named_parameters())[n] for n in names]
    x2 = x1 if x2 is None else x2

    def grads(x: Tensor) -> list[Tensor]:  # per sample: (C, P)
        out = []
        for n in range(x.shape[0]):
            y = model(x[n:n + 1]).reshape(-1)
            rows = []
            for c in range(y.numel()):
                g = torch.autograd.grad(y[c], plist, retain_graph=True, allow_unused=True)
                rows.append(torch.cat([(gi if gi is not None else torch.zeros_like(p)).flatten()
                                       for gi, p in zip(g, plist)]))
            out.append(torch.stack(rows))
        return out

    G1, G2 = grads(x1), grads(x2)
    C = G1[0].shape[0]
    if output == "full":
        K = torch.zeros(len(G1), len(G2), C, C, dtype=G1[0].dtype, device=G1[0].device)
    else:
        K = torch.zeros(len(G1), len(G2), dtype=G1[0].dtype, device=G1[0].device)
    for i, a in enumerate(G1):
        for j, b in enumerate(G2):
            if output == "full":
                K[i, j] = a @ b.T
            elif output == "trace" or (output is None and C == 1):
                K[i, j] = (a * b).sum()
            else:
                K[i, j] = a[output] @ b[output]
    return K.detach()


def relative_deviation(a: Tensor, b: Tensor) -> float:
    """``||a - b||_F / ||b||_F``: how far a kernel matrix ``a`` is from ``b``."""
    if a.shape != b.shape:
        raise ValueError(f"kernel matrices of different shapes: {tuple(a.shape)} and {tuple(b.shape)}")
    return float(torch.linalg.norm((a - b).double()) / torch.linalg.norm(b.double()))
