"""The Hutchinson estimate of Insens (projections.insens_estimate) against exact Insens and exact switched
weights (projections.insens, projections.switched_projections) on small networks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dualview import projections


def small_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 4 * 4, 12), nn.ReLU(), nn.Linear(12, 3),
    ).double().eval()


def test_intervals_cover_the_exact_insens_and_norms_over_seeds():
    # 30 seeds (network, image and probes each): the 95 % intervals must cover the exact values in >= 90 %
    # of (seed, pixel) and (seed, neuron) cases; a biased estimate or a too-small error bar fails this
    hits_omega, hits_norm = [], []
    for seed in range(30):
        model = small_net(seed)
        x = torch.rand(1, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        exact = projections.insens(model, x, structure=False)
        norms = projections.switched_projections(model, x).sq_norm
        est = projections.insens_estimate(model, x, probes=64, groups=16, chunk=64,
                                          generator=torch.Generator().manual_seed(1000 + seed))
        assert torch.equal(est.n_inactive, exact.n_inactive) and torch.equal(est.n_cut_off, exact.n_cut_off)
        lo, hi = est.interval(0.95)
        slack = 1e-12 * exact.omega.abs().max()  # a zero-width interval of an exact estimate covers
        hits_omega.append(((exact.omega >= lo - slack) & (exact.omega <= hi + slack)).flatten())
        lo, hi = est.sq_norm_interval(0.95)
        live = norms > 0
        hits_norm.append(((norms >= lo - 1e-12 * norms) & (norms <= hi + 1e-12 * norms))[live])
    cover_omega = torch.cat(hits_omega).double().mean().item()
    cover_norm = torch.cat(hits_norm).double().mean().item()
    assert cover_omega >= 0.90, f"Insens intervals cover the exact map in {cover_omega:.1%} of pixels"
    assert cover_norm >= 0.90, f"|w|^2 intervals cover the exact norms in {cover_norm:.1%} of neurons"
    assert cover_omega <= 0.995  # and they are not vacuous


def test_estimate_converges_as_probes_grow():
    model = small_net(0)
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    exact = projections.insens(model, x, structure=False).omega
    norms = projections.switched_projections(model, x).sq_norm
    errors = {}
    for probes in (16, 1024):
        est = projections.insens_estimate(model, x, probes=probes, groups=16, chunk=64,
                                          generator=torch.Generator().manual_seed(probes))
        errors[probes] = ((est.omega - exact).norm() / exact.norm()).item()
    # at 1024 probes every live neuron's norm is within 4 of its standard errors (a t-variable's 4-sigma)
    live = norms > 0
    assert ((est.sq_norm - norms).abs() <= 4 * est.sq_norm_se + 1e-12 * norms)[live].double().mean() > 0.99
    # Monte-Carlo error falls like 1 / sqrt(probes): 64 times the probes, 8 times less error (allow 4)
    assert errors[1024] < errors[16] / 4, errors
    assert errors[1024] < 0.05


def test_exact_when_every_switched_weight_has_one_coordinate():
    # a diagonal first layer: each hidden neuron sees one pixel, so (w . r)^2 = w_j^2 for every Rademacher r
    lin = nn.Linear(5, 5).double()
    with torch.no_grad():
        lin.weight.copy_(torch.diag(torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0])))
    model = nn.Sequential(lin, nn.ReLU(), nn.Linear(5, 2)).double().eval()
    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    est = projections.insens_estimate(model, x, probes=8, groups=4)
    exact = projections.insens_reference(model, x).omega
    assert torch.allclose(est.omega, exact, atol=1e-12) and est.omega_se.abs().max() < 1e-12


def test_bad_settings_get_clear_errors():
    model, x = small_net(0), torch.rand(1, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="divide probes"):
        projections.insens_estimate(model, x, probes=10, groups=4)
    with pytest.raises(ValueError, match="probes must be a positive int"):
        projections.insens_estimate(model, x, probes=0)
    with pytest.raises(ValueError, match="level"):
        projections.insens_estimate(model, x, probes=8, groups=4).interval(1.5)


def test_forward_mode_passes_show_no_torch_warning():
    # PyTorch's first forward-mode pass in a process warns that torch.jit.script is deprecated (its own
    # decompositions); the library silences exactly that warning, so a fresh process must show none
    import subprocess
    import sys

    code = ("import torch; from torch import nn; from dualview import projections\n"
            "net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)).eval()\n"
            "projections.insens_estimate(net, torch.rand(2, 4), probes=4, groups=2)\n"
            "projections.insens(net, torch.rand(2, 4))\n")
    run = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_noisy_estimate_says_so():
    import warnings

    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                        nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).eval()
    x = torch.randn(4, 1, 8, 8)
    with pytest.warns(UserWarning, match=r"probes=8 .* mostly noise. Raise probes"):
        few = projections.insens_estimate(net, x, probes=8, groups=4)
    assert float(few.relative_se.median()) > projections.NOISY_ESTIMATE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        many = projections.insens_estimate(net, x, probes=512, groups=4)
    assert float(many.relative_se.max()) < 0.1
