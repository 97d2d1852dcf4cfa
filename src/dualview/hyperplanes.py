"""Primal linearity: the gates of a deep linearly gated network (DLGN) are hyperplanes.

A DLGN's gating network has no ReLUs, so each gate site computes an affine map of the input,
``q_l(x) = W_eff x + b_eff``, and every gating unit switches on a half-space (Section 5 of
:cite:`lakshminarayanan2022explicitising`):

* :func:`effective_hyperplanes` gives ``(W_eff, b_eff)`` exactly, from one batched forward pass
  (:func:`effective_hyperplanes_reference` multiplies the layers out);
* :func:`local_hyperplanes` gives the hyperplane of a unit *at* an input, which a DGN's ReLU gating
  changes from input to input;
* :func:`dual_lifting_ladder` builds the models of Figure 4 there, ordered by interpretability.

The networks themselves come from :func:`dualview.dgn.build`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor, nn

from dualview.architectures import Architecture, site_shapes
from dualview.dgn import DeepGating, GatedNetwork, build

__all__ = [
    "Hyperplanes",
    "effective_hyperplanes",
    "effective_hyperplanes_reference",
    "local_hyperplanes",
    "LadderModel",
    "dual_lifting_ladder",
]


# --------------------------------------------------------------------------------------------------
# Primal linearity: the gates of a DLGN are hyperplanes


@dataclass
class Hyperplanes:
    """The affine maps ``q_l(x) = weight[l] @ x.flatten() + bias[l]`` of the gate sites.

    ``weight[l]`` has shape ``(units_l, d_in)`` and ``bias[l]`` ``(units_l,)``; ``sites`` says which
    gate sites they belong to. Unit ``u`` of site ``l`` switches on exactly on the input half-space
    ``<weight[l][u], x> + bias[l][u] > 0`` (for a DLGN).
    """

    sites: list[int]
    weight: list[Tensor] = field(default_factory=list)
    bias: list[Tensor] = field(default_factory=list)

    def preactivations(self, x: Tensor) -> list[Tensor]:
        """``W_eff x + b_eff`` for a batch ``x``: one ``(N, units_l)`` tensor per site."""
        flat = x.flatten(1).to(self.weight[0].dtype)
        return [flat @ w.T + b for w, b in zip(self.weight, self.bias)]


def _linear_gating(model: GatedNetwork) -> None:
    if not isinstance(model, GatedNetwork):
        raise TypeError(f"expected a GatedNetwork (build(arch, 'dlgn')), got {type(model).__name__}")
    if not model.gating.affine:
        what = "ReLUs (a DGN)" if not model.gating.linear else "max-pooling (a DLGN-MAX)"
        raise ValueError(f"the gating network of this model has {what}: its pre-activations are only "
                         "piecewise linear. Use local_hyperplanes(model, x, site, units) for the hyperplane "
                         "at x, or build a DLGN with average pooling")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.gating.modules()):
        raise ValueError("batch norm in training mode mixes the samples of a batch, so the gating network is "
                         "not a fixed linear map: call model.eval() first")


def effective_hyperplanes(model: GatedNetwork, sites: Sequence[int] | None = None,
                          max_entries: int = 50_000_000) -> Hyperplanes:
    """The exact effective hyperplanes ``(W_eff, b_eff)`` of the gate sites of a DLGN.

    A DLGN's gating network is affine (primal linearity, Section 5 of
    :cite:`lakshminarayanan2022explicitising`), so ``b_eff = q(0)`` and column ``i`` of ``W_eff`` is
    ``q(e_i) - q(0)``: one batched forward pass of the ``d_in + 1`` inputs ``0, e_1, ..., e_d``.
    ``max_entries`` guards against asking for ``units x d_in`` matrices that do not fit in memory
    (pick fewer ``sites``).
    """
    _linear_gating(model)
    shapes = site_shapes(model.arch)
    sites = list(range(len(shapes))) if sites is None else [int(s) for s in sites]
    if any(not 0 <= s < len(shapes) for s in sites):
        raise ValueError(f"sites must lie in range({len(shapes)}), got {sites}")
    d = model.arch.in_features
    entries = d * sum(math.prod(shapes[s]) for s in sites)
    if entries > max_entries:
        raise ValueError(f"the requested hyperplanes have {entries:,} entries (units x d_in = {d} inputs), more "
                         f"than max_entries={max_entries:,}: choose fewer sites or raise max_entries")
    p = next(model.gating.parameters())
    basis = torch.cat([torch.zeros(1, d, dtype=p.dtype, device=p.device),
                       torch.eye(d, dtype=p.dtype, device=p.device)]).view(d + 1, *model.arch.in_shape)
    with torch.no_grad():
        q = model.gating_preactivations(basis)
    out = Hyperplanes(sites)
    for s in sites:
        flat = q[s].flatten(1)
        out.bias.append(flat[0].clone())
        out.weight.append((flat[1:] - flat[0]).T.contiguous())
    return out


def effective_hyperplanes_reference(model: GatedNetwork) -> Hyperplanes:
    """Effective hyperplanes of an FC DLGN as explicit matrix products, layer by layer:
    ``W_eff_l = W_l W_eff_{l-1}``, ``b_eff_l = W_l b_eff_{l-1} + b_l`` (the slow, obvious reference)."""
    _linear_gating(model)
    if model.arch.family != "fc" or not isinstance(model.gating, DeepGating):
        raise ValueError("the reference covers fully connected DLGNs with deep gating")
    linears = [m for m in model.gating.net.modules() if isinstance(m, nn.Linear)][:-1]
    out = Hyperplanes(list(range(len(linears))))
    W = torch.eye(model.arch.in_features, dtype=linears[0].weight.dtype, device=linears[0].weight.device)
    b = torch.zeros(model.arch.in_features, dtype=W.dtype, device=W.device)
    with torch.no_grad():
        for layer in linears:
            W = layer.weight @ W
            b = layer.weight @ b + (layer.bias if layer.bias is not None else 0)
            out.weight.append(W.clone())
            out.bias.append(b.clone())
    return out


def local_hyperplanes(model: GatedNetwork, x: Tensor, site: int, units: Sequence[int]) -> tuple[Tensor, Tensor]:
    """The hyperplane of gating units ``units`` of ``site`` *at* each input: ``(weight, bias)`` with
    ``weight[n, u] = d q_{site, u}(x_n) / d x`` of shape ``(N, U, d_in)`` and
    ``bias[n, u] = q(x_n) - <weight[n, u], x_n>``.

    For a DLGN these are the same for every input (they equal :func:`effective_hyperplanes`); for a
    DGN they change from input to input, because the gating ReLUs switch. One backward pass over
    ``U`` stacked copies of the batch.
    """
    if not isinstance(model, GatedNetwork):
        raise TypeError(f"expected a GatedNetwork, got {type(model).__name__}")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.gating.modules()):
        raise ValueError("batch norm in training mode couples the samples: call model.eval() first")
    n_sites = len(site_shapes(model.arch))
    if not 0 <= site < n_sites:
        raise ValueError(f"site must lie in range({n_sites}) (the gate layers of {model.arch.name}), got {site}")
    units_t = torch.as_tensor(list(units), dtype=torch.long, device=x.device)
    U, N = len(units_t), x.shape[0]
    xs = x.detach().repeat(U, *([1] * (x.dim() - 1))).requires_grad_(True)   # copy u of the batch for unit u
    q = model.gating_preactivations(xs)[site].flatten(1)                      # (U*N, units)
    if units_t.numel() == 0 or int(units_t.max()) >= q.shape[1] or int(units_t.min()) < 0:
        raise ValueError(f"units must be non-empty indices below {q.shape[1]} (units of site {site}), got {list(units)}")
    picked = q.view(U, N, -1).gather(2, units_t.view(U, 1, 1).expand(U, N, 1))[..., 0]   # (U, N)
    (grad,) = torch.autograd.grad(picked.sum(), xs)
    weight = grad.view(U, N, -1).transpose(0, 1)                              # (N, U, d)
    bias = picked.detach().T - (weight * x.detach().flatten(1)[:, None, :]).sum(-1)
    return weight.detach(), bias


# --------------------------------------------------------------------------------------------------
# The interpretability-accuracy ladder (Figure 4 of the duality paper)


@dataclass
class LadderModel:
    """One model of Figure 4 of :cite:`lakshminarayanan2022explicitising`.

    ``rank`` is its place in the interpretability order of Eq. (2) there (1 = most interpretable:
    shallow linear; 6 = deep + max-pool + ReLU); ``path`` is ``"conventional"`` (grey) or
    ``"dual lifting"`` (green); a DLGN keeps the rank of the linear model it lifts.
    """

    name: str
    level: str
    rank: int
    path: str
    model: nn.Module


def dual_lifting_ladder(deep: Architecture, shallow: Architecture, value_input: str = "ones") -> list[LadderModel]:
    """The models of Figure 4 for a deep VGG-style architecture ``deep`` (its ``pool`` is ignored:
    both poolings are built) and a shallow one ``shallow`` (CONV1):

    conventional: CONV1-LIN (shallow linear), VGG-LIN (deep linear, average pooling), CONV1 (shallow
    + ReLU), VGG-LIN-MAX (deep linear + max-pool), VGG-AVG (deep + ReLU), VGG (deep + max-pool +
    ReLU); dual lifting: DLGN-SHALLOW, DLGN, DLGN-MAX (standalone training, soft gates,
    ``value_input`` to the value network, ones as in the paper).
    """
    if deep.family != "vgg" or shallow.family != "conv":
        raise ValueError(f"the ladder needs a 'vgg' deep and a 'conv' shallow architecture, got {deep.family!r} "
                         f"and {shallow.family!r}")
    avg, mx = deep.with_(pool="avg"), deep.with_(pool="max")
    return [
        LadderModel("CONV1-LIN", "shallow linear", 1, "conventional", build(shallow, "linear")),
        LadderModel("VGG-LIN", "deep linear", 2, "conventional", build(avg, "linear")),
        LadderModel("CONV1", "shallow + ReLU", 3, "conventional", build(shallow, "dnn")),
        LadderModel("VGG-LIN-MAX", "deep linear + max-pool", 4, "conventional", build(mx, "linear")),
        LadderModel("VGG-AVG", "deep + ReLU", 5, "conventional", build(avg, "dnn")),
        LadderModel("VGG", "deep + max-pool + ReLU", 6, "conventional", build(mx, "dnn")),
        LadderModel("DLGN-SHALLOW", "shallow linear", 1, "dual lifting",
                    build(avg, "dlgn", gating="shallow", value_input=value_input)),
        LadderModel("DLGN", "deep linear", 2, "dual lifting", build(avg, "dlgn", value_input=value_input)),
        LadderModel("DLGN-MAX", "deep linear + max-pool", 4, "dual lifting",
                    build(mx, "dlgn", value_input=value_input)),
    ]
