"""Part of :mod:`dualview.projections` (see its docstring)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
import torch
from torch import Tensor, nn
from dualview import receptive_fields
from dualview.gates import full_precision, record_gates
from dualview.projections._frozen import check_input as _check, frozen_network, inactive_coefficients


# --------------------------------------------------------------------------------------------------
# Insens at ImageNet size: a random-projection estimate of the switched-weight norms


@dataclass
class InsensEstimate:
    """A Hutchinson estimate of Insens (:func:`insens_estimate`) with its error bars.

    ``sq_norm`` ``(N, U)``: the unbiased estimate of every hidden neuron's ``|w_i|^2`` (mean over the
    probes of ``(w_i . r)^2``), ``sq_norm_se`` its standard error (sample sd over probes / sqrt(probes)).
    ``omega`` ``(N, *input_shape)``: Eq. 8 with the estimated norms, jackknife bias-corrected over
    ``groups`` groups of probes; ``omega_se`` its delete-a-group jackknife standard error, per pixel.
    Counts as in :class:`InsensResult`.
    """

    omega: Tensor
    omega_se: Tensor
    sq_norm: Tensor
    sq_norm_se: Tensor
    probes: int
    groups: int
    n_inactive: Tensor
    n_cut_off: Tensor
    n_hidden: int

    @property
    def relative_se(self) -> Tensor:
        """Per input, the standard error's size relative to the estimate's: ``|omega_se| / |omega|`` (norms over
        the pixels). :func:`insens_estimate` warns when its median is above ``NOISY_ESTIMATE``."""
        return self.omega_se.flatten(1).norm(dim=1) / self.omega.flatten(1).norm(dim=1).clamp_min(1e-300)

    def interval(self, level: float = 0.95) -> tuple[Tensor, Tensor]:
        """Per-pixel interval for the exact Insens ``Omega(x)``: estimate +- t_{groups-1} * jackknife se."""
        half = _t_quantile(level, self.groups - 1) * self.omega_se
        return self.omega - half, self.omega + half

    def sq_norm_interval(self, level: float = 0.95) -> tuple[Tensor, Tensor]:
        """Per-neuron interval for the exact ``|w_i|^2``: estimate +- t_{probes-1} * se (CLT over probes)."""
        half = _t_quantile(level, self.probes - 1) * self.sq_norm_se
        return self.sq_norm - half, self.sq_norm + half

    def relative_error(self) -> Tensor:
        """The estimate's relative standard error per input, ``|omega_se| / |omega|`` (Euclidean norms)."""
        return self.omega_se.flatten(1).norm(dim=1) / self.omega.flatten(1).norm(dim=1)


def _t_quantile(level: float, df: int) -> float:
    from scipy.stats import t

    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return float(t.ppf((1 + level) / 2, df))


@full_precision()
def insens_estimate(model: nn.Module, x: Tensor, probes: int = 64, groups: int = 16, chunk: int = 8,
                    generator: torch.Generator | None = None) -> InsensEstimate:
    """Insens (Eq. 7-8 of :cite:`szymanski2020switched`) at a fixed cost: ``probes`` forward-mode passes.

    Exact Insens needs ``|w_i|^2`` for every hidden neuron, one forward-mode column per input coordinate
    (:func:`insens`; 150,528 columns at 3 x 224 x 224). Here ``|w_i|^2 = E (w_i . r)^2`` for Rademacher
    ``r`` (Hutchinson): one ``jvp`` of the frozen network along ``r`` gives ``w_i . r`` for every neuron
    at once, and the mean over ``probes`` is unbiased, with the sample variance over probes as its
    error bar (:meth:`InsensEstimate.sq_norm_interval`). Insens divides by the norms, so the plug-in map
    is biased by O(1/probes): it is bias-corrected and given a per-pixel standard error by a
    delete-a-group jackknife over ``groups`` equal groups of probes (``groups + 1`` reverse-mode passes
    ``Omega = J^T a``, batched); :meth:`InsensEstimate.interval` is the t interval on ``groups - 1``
    degrees of freedom for each pixel of the exact ``Omega(x)``. Inactive neurons, cut-off neurons
    (all probes give 0, i.e. ``w_i = 0``) and ``|I|`` are as in :func:`insens`. ``chunk`` probes
    share one batched ``jvp``; memory holds ``groups x N x U`` numbers.
    """
    _check(model, x)
    for name, value in (("probes", probes), ("groups", groups), ("chunk", chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if groups < 2 or probes % groups:
        raise ValueError(f"groups must be >= 2 and divide probes (the jackknife leaves out one equal group "
                         f"at a time); got probes={probes}, groups={groups}")
    x = x.detach()
    rec = torch.no_grad()(record_gates)(model, x)  # no graph through the parameters
    names = rec.names
    if not names:
        raise ValueError("the model has no ReLU, so Insens has no hidden neurons to average over")
    q = torch.cat([rec.preactivations[k].detach().flatten(1) for k in names], 1)

    frozen = frozen_network(model, rec, names)

    def along(tangent):
        return receptive_fields.jvp(frozen, torch.zeros_like(x), tangent)

    group_sum = x.new_zeros(groups, *q.shape)  # sum of (w_i . r)^2 over each group's probes
    fourth = x.new_zeros(q.shape)  # sum of (w_i . r)^4, for the sample variance over probes
    per_group = probes // groups
    with torch.no_grad():
        for start in range(0, probes, chunk):
            k = min(chunk, probes - start)
            where = generator.device if generator is not None else x.device  # a CPU generator serves CUDA too
            r = torch.randint(0, 2, (k, *x.shape), generator=generator, device=where).to(x) * 2 - 1
            sq = torch.func.vmap(along)(r).square()  # (k, N, U)
            group = torch.arange(start, start + k, device=x.device) // per_group
            group_sum.index_add_(0, group, sq)
            fourth += sq.square().sum(0)
    total = group_sum.sum(0)
    sq_norm = total / probes
    var = (fourth - probes * sq_norm.square()).clamp_min(0) / (probes - 1)
    # the full estimate and the groups leave-one-group-out estimates, as cotangents of J^T
    norms = torch.cat([sq_norm[None], (total - group_sum) / (probes - per_group)])  # (1 + G, N, U)
    a = inactive_coefficients(q, sq_norm, norms)
    _, pull = torch.func.vjp(frozen, x)
    with torch.no_grad():
        maps = torch.func.vmap(lambda c: pull(c)[0], chunk_size=chunk)(a.coef)  # (1 + G, N, *input)
    full, leave_out = maps[0], maps[1:]
    mean_out = leave_out.mean(0)
    omega = groups * full - (groups - 1) * mean_out  # jackknife bias correction
    omega_se = ((groups - 1) / groups * (leave_out - mean_out).square().sum(0)).sqrt()
    result = InsensEstimate(
        omega=omega, omega_se=omega_se, sq_norm=sq_norm, sq_norm_se=(var / probes).sqrt(), probes=probes,
        groups=groups, n_inactive=a.n_inactive.cpu(), n_cut_off=a.n_cut_off.cpu(),
        n_hidden=q.shape[1],
    )
    rel = result.relative_se
    if float(rel.median()) > NOISY_ESTIMATE:
        warnings.warn(
            f"insens_estimate: with probes={probes} the standard error of the maps is {float(rel.median()):.2f} of "
            f"their size at the median input (up to {float(rel.max()):.2f}): they are mostly noise. Raise probes "
            "(the error falls as 1 / sqrt(probes)) or compute Insens exactly (projections.insens) where it fits; "
            "result.relative_se has the value per input.", stacklevel=2)
    return result


#: insens_estimate warns when the median relative standard error of its maps is above this
NOISY_ESTIMATE = 0.25

