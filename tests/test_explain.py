"""Tests of dualview.explain (the one verb over every attribution method) against Captum, Zennit and known
answers, and of the Quantus runner in dualview.metrics on cases whose answer is known."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch import nn

from dualview import explain, gates, metrics, nets, projections, pullbacks
from tiny_models import conv_net


def small_cnn(bias: bool = True) -> nn.Module:
    return conv_net(1, (6, 8), 5, hidden=16, bias=bias, seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(1)
    return torch.rand(6, 1, 8, 8, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 4, 0])


def test_every_method_returns_a_map_shaped_like_x(batch):
    model, (x, y) = small_cnn(), batch
    for method in explain.METHODS:
        a = explain.attribute(model, x, y, method=method)
        assert a.shape == x.shape and a.dtype == x.dtype and torch.isfinite(a).all(), method


def test_gradient_family_matches_captum(batch):
    from captum.attr import InputXGradient, IntegratedGradients, Saliency

    model, (x, y) = small_cnn(), batch
    assert torch.allclose(explain.attribute(model, x, y), Saliency(model).attribute(x, target=y, abs=False))
    assert torch.allclose(explain.attribute(model, x, y, method="gradient_x_input"),
                          InputXGradient(model).attribute(x, target=y))
    ig = explain.attribute(model, x, y, method="integrated_gradients", n_steps=50, baseline=0.2)
    ref = IntegratedGradients(model).attribute(x, baselines=torch.full_like(x, 0.2), target=y, n_steps=50)
    assert torch.allclose(ig, ref)
    # completeness (Sundararajan et al., Prop. 1), an independent check: the map sums to f(x) - f(baseline)
    ig = explain.attribute(model, x, y, method="integrated_gradients", n_steps=400)
    with torch.no_grad():
        gap = model(x)[range(6), y] - model(torch.zeros_like(x))[range(6), y]
    assert torch.allclose(ig.flatten(1).sum(1), gap, rtol=2e-3, atol=2e-4)


def test_times_input_methods_multiply_by_input_minus_baseline():
    # an independent computation: autograd's gradient of the target logit, times (x - baseline) by hand
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 36, 5)).double().eval()
    x, y = torch.rand(4, 3, 6, 6, dtype=torch.float64, requires_grad=True), torch.tensor([0, 1, 2, 4])
    grad, = torch.autograd.grad(model(x)[range(4), y].sum(), x)
    x = x.detach()
    for base in (0.3, [0.5, 0.0, 1.0]):
        b = torch.as_tensor(base, dtype=x.dtype).view(1, -1, 1, 1)
        gxi = explain.attribute(model, x, y, method="gradient_x_input", baseline=base)
        assert torch.allclose(gxi, grad * (x - b))
        assert not torch.allclose(gxi, grad * x)                   # the baseline does change the map
        pxi = explain.attribute(model, x, y, method="pullback_x_input", temperature=0.5, baseline=base)
        assert torch.allclose(pxi, pullbacks.excitation_pullback(model, x, y, temperature=0.5) * (x - b))
    assert torch.equal(explain.attribute(model, x, y, method="gradient_x_input", baseline=0.0),
                       explain.attribute(model, x, y, method="gradient_x_input"))
    # on an affine model the map sums to f(x) - f(baseline), as integrated gradients' completeness says
    lin = nn.Sequential(nn.Flatten(), nn.Linear(108, 5)).double().eval()
    gxi = explain.attribute(lin, x, y, method="gradient_x_input", baseline=0.4)
    with torch.no_grad():
        gap = lin(x)[range(4), y] - lin(torch.full_like(x, 0.4))[range(4), y]
    assert torch.allclose(gxi.flatten(1).sum(1), gap)


def test_smoothgrad_without_noise_is_the_gradient_and_with_noise_averages(batch):
    model, (x, y) = small_cnn(), batch
    g = explain.attribute(model, x, y)
    assert torch.allclose(explain.attribute(model, x, y, method="smoothgrad", noise=0.0, n_samples=3), g)
    torch.manual_seed(0)
    sg = explain.attribute(model, x, y, method="smoothgrad", noise=0.3, n_samples=8)
    torch.manual_seed(0)  # the same noise, drawn by hand: one normal tensor for all copies, sample by sample
    reps = x.repeat_interleave(8, 0)
    noisy = reps + torch.normal(0.0, torch.full(reps.shape, 0.3))  # float32 noise, as Captum draws it
    ref = pullbacks.input_gradient(model, noisy, y.repeat_interleave(8)).view(6, 8, *x.shape[1:]).mean(1)
    assert torch.allclose(sg, ref)


def test_pullbacks_and_insens_call_the_library(batch):
    model, (x, y) = small_cnn(), batch
    v = explain.attribute(model, x, y, method="pullback", temperature=0.5)
    assert torch.equal(v, pullbacks.excitation_pullback(model, x, y, temperature=0.5))
    assert torch.equal(explain.attribute(model, x, y, method="pullback_x_input"),
                       pullbacks.excitation_pullback(model, x, y) * x)
    omega = projections.insens(model, x).omega
    assert torch.equal(explain.attribute(model, x, 0, method="insens"), omega)
    assert torch.equal(explain.attribute(model, x, 4, method="insens"), omega)        # class-agnostic
    assert "insens" in explain.CLASS_AGNOSTIC and "pullback" not in explain.CLASS_AGNOSTIC


def test_lrp_conserves_relevance_and_its_first_layer_rule_matters(batch):
    # no biases: every rule of EpsilonGammaBox (z^B first, gamma in convolutions, epsilon in dense layers)
    # conserves relevance, so the map sums to the target logit (where it is positive)
    model, (x, _) = small_cnn(bias=False), batch
    with torch.no_grad():
        logits = model(x)
    t = logits.argmax(1)
    r = explain.attribute(model, x, t, method="lrp", epsilon=1e-9)
    assert torch.allclose(r.flatten(1).sum(1), logits[range(6), t], rtol=1e-4)
    # the flat first-layer rule ignores the pixel values: two images with the same relevance arriving at the
    # first layer get maps that do not follow either image; z^B does follow the image
    flat = explain.attribute(model, x, t, method="lrp", composite="epsilon_plus_flat")
    assert not torch.allclose(flat, r, atol=1e-3)
    with pytest.raises(ValueError, match="composite"):
        explain.attribute(model, x, t, method="lrp", composite="alpha_beta")


def test_lrp_refuses_what_zennit_needs_canonizers_for(batch):
    resnet = nets.cifar_resnet(8).eval()
    with pytest.raises(gates.UnsupportedLayerError, match="residual"):
        explain.attribute(resnet, torch.rand(2, 3, 32, 32), 0, method="lrp")
    resize = nn.Sequential()
    resize.add_module("preprocess", nets.Resize(8))
    resize.add_module("net", small_cnn().float())
    with pytest.raises(gates.UnsupportedLayerError, match="element-wise"):
        explain.attribute(resize.eval(), torch.rand(2, 1, 16, 16), 0, method="lrp")


def test_lrp_bounds_follow_the_preprocessing():
    # a zoo-style model (preprocess, net) with a Normalize: the z^B bounds are the normalised 0 and 1
    net = small_cnn(bias=False).float()
    model = nn.Sequential()
    model.add_module("preprocess", nets.Normalize(0.5, 0.25))
    model.add_module("net", net)
    x = torch.rand(3, 1, 8, 8)
    direct = explain.attribute(net, (x - 0.5) / 0.25, 1, method="lrp", low=-2.0, high=2.0)
    assert torch.allclose(explain.attribute(model.eval(), x, 1, method="lrp"), direct, atol=1e-6)


def test_trivial_baselines():
    x = torch.zeros(1, 3, 6, 6)
    x[..., 3:] = 1.0                                     # a vertical step from 0 to 1 between columns 2 and 3
    e = explain.attribute(nn.Sequential(nn.Flatten(), nn.Linear(108, 2)), x, 0, method="edges")
    assert e.shape == x.shape and torch.equal(e[:, 0], e[:, 2])
    # Sobel: (1 + 2 + 1) * 1 on both sides of the step away from the border, 0 far from it
    assert torch.allclose(e[0, 0, 2:4, 2:4], torch.full((2, 2), 4.0)) and e[0, 0, 2:4, 0].abs().max() == 0
    inten = explain.attribute(nn.Sequential(nn.Flatten(), nn.Linear(108, 2)), x, 0, method="intensity",
                              baseline=torch.tensor([0.5, 0.0, 1.0]))
    assert torch.allclose(inten, (x - torch.tensor([0.5, 0.0, 1.0]).view(1, 3, 1, 1)).abs())


def test_bad_input_gets_a_clear_error(batch):
    model, (x, y) = small_cnn(), batch
    with pytest.raises(ValueError, match="unknown method 'saliency'"):
        explain.attribute(model, x, y, method="saliency")
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        explain.attribute(model, x, 7)
    with pytest.raises(TypeError, match="n_steps"):
        explain.attribute(model, x, y, method="gradient", n_steps=3)
    with pytest.raises(TypeError, match="floating"):
        explain.attribute(model, x.long(), y)
    mlp = nets.relu_mlp([4, 3, 2]).double()
    with pytest.raises(ValueError, match="images"):
        explain.attribute(mlp, torch.rand(2, 4, dtype=torch.float64), 0, method="lrp")
    tanh = nn.Sequential(nn.Flatten(), nn.Linear(64, 3), nn.Tanh(), nn.Linear(3, 2)).double()
    with pytest.raises(gates.UnsupportedLayerError, match="Tanh"):  # (SiLU / GELU: tests/test_silu_gelu.py)
        explain.attribute(tanh, x, 0, method="pullback")


def test_each_method_is_a_function_of_the_table_whose_parameters_are_its_options(batch):
    """The options ``attribute`` accepts are read from each method's function (one table, no parallel list);
    written out here as the module docstring documents them. Every option has a default, an unknown one is
    refused with the method's list, and a method without options says so."""
    documented = {
        "gradient": set(), "gradient_x_input": {"baseline"},
        "integrated_gradients": {"baseline", "n_steps", "chunk_size"},
        "smoothgrad": {"n_samples", "noise"}, "lrp": {"composite", "low", "high", "normalised", "epsilon", "gamma"},
        "pullback": {"temperature", "pool_temperature", "smooth_temperature", "surrogate", "attention_temperature"},
        "pullback_x_input": {"temperature", "pool_temperature", "smooth_temperature", "surrogate", "attention_temperature",
                             "baseline"},
        "insens": {"chunk_size", "progress"}, "intensity": {"baseline"}, "edges": set(),
    }
    assert list(explain._METHODS) == list(explain.METHODS) and set(explain.METHODS) == set(documented)
    for method, options in documented.items():
        assert explain._options(method) == options, method
        params = list(inspect.signature(explain._METHODS[method]).parameters.values())
        assert [p.name for p in params[:3]] == ["model", "x", "t"], method
        assert all(p.default is not inspect.Parameter.empty for p in params[3:]), method
    model, (x, y) = small_cnn(), batch
    with pytest.raises(TypeError, match=r"method 'smoothgrad' takes the options \['n_samples', 'noise'\], "
                                        r"got \['baseline'\]"):
        explain.attribute(model, x, y, method="smoothgrad", baseline=0.0)
    with pytest.raises(TypeError, match="takes the options none, got"):
        explain.attribute(model, x, y, method="edges", noise=0.1)
    with pytest.raises(ValueError, match="choose one of gradient, gradient_x_input, integrated_gradients"):
        explain.attribute(model, x, y, method="saliency")


def test_quantus_explain_func_is_the_verb_in_numpy(batch):
    model, (x, y) = small_cnn().float(), batch
    out = explain.quantus_explain_func(model, x.float().numpy(), y.numpy(), method="pullback")
    assert isinstance(out, np.ndarray)
    assert np.allclose(out, explain.attribute(model, x.float(), y, method="pullback").numpy())


# --------------------------------------------------------------------------------------------------
# metrics: a deletion curve by hand, and Quantus where the answer is known


class TwoPixelLinear(nn.Module):
    """logits (w . x, 0) on a 1 x 1 x 2 x 2 image: every deletion step is known in closed form."""

    def __init__(self, w):
        super().__init__()
        self.w = torch.tensor(w, dtype=torch.float64)

    def forward(self, x):
        s = (x.flatten(1) * self.w).sum(1)
        return torch.stack([s, torch.zeros_like(s)], 1)


def test_deletion_and_insertion_curves_by_hand():
    model = TwoPixelLinear([1.0, 2.0, 3.0, 4.0])
    x = torch.ones(1, 1, 2, 2, dtype=torch.float64)
    scores = torch.tensor([[[0.1, 0.9], [0.5, 0.3]]])          # order: pixel 1 (w=2), 2 (w=3), 3 (w=4), 0 (w=1)
    curve = metrics.deletion_curve(model, x, 0, scores, fractions=[0, 0.25, 0.5, 0.75, 1.0])
    logits = torch.tensor([10.0, 8.0, 5.0, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(curve.target_logit[:, 0], logits)
    assert torch.allclose(curve.probability[:, 0], torch.sigmoid(logits))    # softmax of (s, 0)
    area = 0.25 * (torch.sigmoid(logits)[1:] + torch.sigmoid(logits)[:-1]).sum() / 2
    assert torch.allclose(curve.area(), area.float().reshape(1).to(curve.area().dtype))
    ins = metrics.deletion_curve(model, x, 0, scores, fractions=[0, 0.25, 0.5, 0.75, 1.0], mode="insertion")
    assert torch.allclose(ins.target_logit[:, 0], torch.tensor([0.0, 2.0, 5.0, 9.0, 10.0], dtype=torch.float64))


def test_quantus_pixel_flipping_agrees_with_our_deletion_curve():
    # an MNIST-sized network, black baseline, one row of 28 pixels per Quantus step: the same curve point by point
    torch.manual_seed(0)
    model = nets.relu_mlp([784, 32, 10])
    model = nn.Sequential(nn.Flatten(), model).eval()
    x = torch.rand(5, 1, 28, 28)
    y = torch.arange(5)
    a = torch.randn(5, 1, 28, 28)                            # continuous scores: no ties to break
    import quantus

    pf = quantus.PixelFlipping(features_in_step=28, perturb_baseline=0.0, abs=False, normalise=False,
                               disable_warnings=True)
    curves = metrics.quantus_scores(pf, model, x, y, maps=a)  # (N, 28) probabilities after each step
    ours = metrics.deletion_curve(model, x, y, a[:, 0], fractions=torch.arange(1, 29) / 28)
    assert curves.shape == (5, 28)
    assert np.allclose(curves, ours.probability.T.numpy(), atol=1e-6)
    # the AUC variant integrates with the trapezoid rule (np.trapz is gone from NumPy 2.4)
    pf_auc = quantus.PixelFlipping(features_in_step=28, perturb_baseline=0.0, abs=False, normalise=False,
                                   return_auc_per_sample=True, disable_warnings=True)
    auc = metrics.quantus_scores(pf_auc, model, x, y, maps=a)
    assert np.allclose(auc, np.trapezoid(curves, axis=1), atol=1e-5)
    rp = quantus.RegionPerturbation(patch_size=7, regions_evaluation=4, perturb_baseline=0.0, normalise=False,
                                    disable_warnings=True)
    assert np.isfinite(metrics.quantus_scores(rp, model, x, y, maps=a)).all()


def test_quantus_known_answers():
    import quantus

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nets.relu_mlp([64, 16, 10])).eval()
    x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
    one_hot = torch.zeros(4, 1, 8, 8)
    one_hot[:, 0, 3, 3] = 1.0
    sparse = quantus.Sparseness(abs=True, normalise=False, disable_warnings=True)
    # Gini index: (n - 1) / n for a map with one non-zero pixel, 1/2 for a map that is 1 on half the pixels
    # (sum of (2i - n - 1) x_(i) over n sum x: the odd numbers 1, ..., 63 over 64 * 32)
    assert np.allclose(metrics.quantus_scores(sparse, model, x, y, maps=one_hot), 63 / 64)
    half = torch.zeros_like(x)
    half[..., :4] = 1.0
    assert np.allclose(metrics.quantus_scores(sparse, model, x, y, maps=half), 0.5)
    # a map that ignores the model: identical after every randomised layer (MPRT) and for every class
    mprt = quantus.MPRT(layer_order="top_down", seed=1, similarity_func=quantus.similarity_func.correlation_pearson,
                        abs=False, normalise=False, return_average_correlation=False, disable_warnings=True)
    by_layer = metrics.quantus_scores(mprt, model, x, y, explain_func=explain.quantus_explain_func,
                                      explain_func_kwargs={"method": "intensity"})
    assert len(by_layer) == 3 and all(np.allclose(v, 1.0) for v in by_layer.values())
    by_layer = metrics.quantus_scores(mprt, model, x, y, explain_func=explain.quantus_explain_func,
                                      explain_func_kwargs={"method": "gradient"})
    assert np.all(list(by_layer.values())[-1] < 0.99)          # the gradient does change
    rl = quantus.RandomLogit(num_classes=10, seed=1, similarity_func=quantus.similarity_func.correlation_pearson,
                             abs=False, normalise=False, disable_warnings=True)
    same = metrics.quantus_scores(rl, model, x, y, explain_func=explain.quantus_explain_func,
                                  explain_func_kwargs={"method": "insens"})
    assert np.allclose(same, 1.0)
    with pytest.raises(ValueError, match="maps"):
        metrics.quantus_scores(sparse, model, x, y, maps=torch.ones(4, 64))
    with pytest.raises(ValueError, match="explain_func"):
        metrics.quantus_scores(sparse, model, x, y)


def test_quantus_nan_scores_raise_instead_of_reaching_an_average():
    # a network whose softmax probability of class 0 rounds to exactly 1.0 (float32) under every perturbation:
    # the faithfulness correlation of its probabilities is 0/0; on the logits it is defined
    import quantus

    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 2)).eval()
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].weight[0] = 1.0
        model[1].bias.copy_(torch.tensor([200.0, 0.0]))
    torch.manual_seed(0)
    x, y = torch.rand(3, 1, 8, 8), torch.zeros(3, dtype=torch.long)
    a = torch.randn(3, 1, 8, 8)

    def fc():
        return quantus.FaithfulnessCorrelation(nr_runs=10, subset_size=8, perturb_baseline=0.0, abs=False,
                                               normalise=False, return_aggregate=False, disable_warnings=True)

    np.random.seed(0)
    with pytest.raises(ValueError, match=r"NaN or infinite scores for 3 of 3 samples.*softmax=False"):
        metrics.quantus_scores(fc(), model, x, y, maps=a, softmax=True)
    np.random.seed(0)
    assert np.isfinite(metrics.quantus_scores(fc(), model, x, y, maps=a, softmax=False)).all()


def test_quantus_road_keeps_per_sample_results():
    import quantus

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nets.relu_mlp([64, 16, 10])).eval()
    x = torch.rand(6, 1, 8, 8)
    with torch.no_grad():
        y = model(x).argmax(1)
    road = quantus.ROAD(percentages=[0, 50, 100], noise=0.0, abs=False, normalise=False, disable_warnings=True)
    kept = metrics.quantus_scores(road, model, x, y, maps=torch.randn_like(x))
    assert kept.shape == (6, 3) and set(np.unique(kept)) <= {0.0, 1.0}
    assert np.all(kept[:, 0] == 1.0)                         # nothing imputed: every prediction stands


def test_integrated_gradients_in_chunks_is_the_same_map(batch):
    """``chunk_size`` bounds the (input, step) pairs per pass; the map equals the unchunked call and a slow loop over
    samples and Gauss-Legendre nodes (Captum's default quadrature: nodes (u + 1) / 2, weights w / 2)."""
    model, (x, y) = small_cnn(), batch
    x, y, steps = x[:4], y[:4], 7
    whole = explain.attribute(model, x, y, "integrated_gradients", n_steps=steps, baseline=0.1, chunk_size=4 * steps)
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    ref = torch.zeros_like(x)
    for n in range(len(x)):
        for u, w in zip(nodes, weights):
            z = (0.1 + (u + 1) / 2 * (x[n] - 0.1)).detach().requires_grad_(True)
            (g,) = torch.autograd.grad(model(z[None])[0, y[n]], z)
            ref[n] += w / 2 * g * (x[n] - 0.1)
    torch.testing.assert_close(whole, ref, rtol=1e-5, atol=1e-9)  # Captum casts the weights to float32
    for size in (1, 3, 5, 13):  # fewer than the batch, not a multiple of the steps, ...
        part = explain.attribute(model, x, y, "integrated_gradients", n_steps=steps, baseline=0.1, chunk_size=size)
        torch.testing.assert_close(part, whole, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="chunk_size"):
        explain.attribute(model, x, y, "integrated_gradients", chunk_size=0)


def test_integrated_gradients_memory_is_bounded_by_the_chunk(batch):
    """The largest batch the model sees is at most ``chunk_size`` inputs (or the batch's steps, Captum's unit)."""
    model, (x, y) = small_cnn(), batch
    seen = []
    hook = model[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[0]))
    try:
        explain.attribute(model, x, y, "integrated_gradients", n_steps=50, chunk_size=10)
    finally:
        hook.remove()
    assert max(seen[1:]) <= 10 and sum(seen[1:]) == 50 * len(x)  # seen[0]: attribute's own forward


def test_insens_progress_bar_changes_nothing(batch, capsys):
    model, (x, y) = small_cnn(), batch
    plain = explain.attribute(model, x[:2], y[:2], "insens")
    shown = explain.attribute(model, x[:2], y[:2], "insens", progress=True)
    torch.testing.assert_close(shown, plain, rtol=0, atol=0)
    assert "Insens" in capsys.readouterr().err


# --- LRP's refusals name what they refuse and the fix (issue 39, finding 3) ---------------------------------
class _FunctionalHead(torch.nn.Module):
    def __init__(self, between):
        super().__init__()
        self.conv, self.relu, self.fc, self.between = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), \
            torch.nn.Linear(4, 3), between

    def forward(self, x):
        return self.fc(self.between(self.relu(self.conv(x))))


@pytest.mark.parametrize("between, advice", [
    (lambda h: h.mean((2, 3)), "nn.AdaptiveAvgPool2d"),
    (lambda h: torch.nn.functional.avg_pool2d(h, 8).flatten(1), "nn.AvgPool2d"),
    (lambda h: torch.nn.functional.interpolate(h, scale_factor=0.5, mode="bilinear").mean((2, 3)), "no LRP rule"),
])
def test_lrp_refusals_fit_what_the_forward_does(between, advice):
    model = _FunctionalHead(between).eval()
    x = torch.rand(2, 3, 8, 8)
    with pytest.raises(gates.UnsupportedLayerError, match=advice) as err:
        explain.attribute(model, x, 0, "lrp")
    assert "residual" not in str(err.value)


def test_lrp_bounds_error_names_the_channel_and_its_bounds():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    x = torch.rand(2, 3, 8, 8)
    x[:, 2] += 5.0  # only the last channel leaves [0, 1]
    with pytest.raises(ValueError, match=r"in 1 of 3 channel\(s\); channel 2 has values in \[5"):
        explain.attribute(model, x, 0, "lrp")


def test_a_functional_relu_is_pointed_to_the_helper_that_converts_it():
    class Fn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.b(torch.nn.functional.relu(self.a(x)))

    model, x = Fn().eval(), torch.randn(2, 3)
    with pytest.raises(gates.UnsupportedLayerError, match=r"one_relu_per_use\(model\)"):
        gates.record_gates(model, x)
    from dualview import dgn

    converted = dgn.one_relu_per_use(model)
    torch.testing.assert_close(gates.record_gates(converted, x).output, model(x))
