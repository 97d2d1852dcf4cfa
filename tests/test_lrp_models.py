"""LRP (explain.attribute(..., "lrp"), Zennit with canonizers) and the gradient and pullback verbs on
torchvision models people have (random weights, eval mode, 64 x 64 inputs): each runs and is checked against an
independent computation, or is refused by name; the user's model is never changed."""
from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from torch import nn

from dualview import explain, gates

FIVE = ("resnet18", "vgg11_bn", "densenet121", "mobilenet_v2", "efficientnet_b0")


def torchvision_model(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, num_classes=10)
    if name == "vgg11_bn":  # VGG's 25088 x 4096 head is 100 M weights: a narrower head, same features
        model.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 32), nn.ReLU(), nn.Dropout(), nn.Linear(32, 10))
    return model.to(dtype).eval()


def bias_free(model: nn.Module) -> nn.Module:
    """Random BatchNorm scales (statistics with zero mean and shift, so the merged layers stay bias-free) and no
    biases: every rule of the composites then conserves relevance, and LRP-epsilon is gradient x input."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.bias.zero_()
                m.running_mean.zero_()
            elif isinstance(m, (nn.Linear, nn.Conv2d)) and m.bias is not None:
                m.bias.zero_()
    return model


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks for m in model.modules())
    assert all(not hasattr(m, "canonizer_sum") for m in model.modules())


@pytest.mark.parametrize("name", ["resnet18", "vgg11_bn"])
def test_lrp_with_canonizers_is_gradient_x_input_and_conserves(name):
    model = bias_free(torchvision_model(name, torch.float64))
    x = torch.rand(2, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    before = state(model)
    xg = x.clone().requires_grad_(True)
    logits = model(xg)
    t = logits.argmax(1)
    (grad,) = torch.autograd.grad(logits[torch.arange(2), t].sum(), xg)
    # LRP-epsilon (epsilon -> 0) on a bias-free ReLU network is gradient x input (Ancona et al. 2018): this checks
    # the BatchNorm merging, the residual Sum of the ResNetCanonizer and the pooling rules against autograd
    eps = explain.attribute(model, x, t, method="lrp", composite="epsilon", epsilon=1e-12)
    assert (eps - grad * x).abs().max() <= 1e-5 * (grad * x).abs().max()  # the stabilisers' 1e-6 aside
    # the default composite (z^B first, gamma in convolutions) conserves relevance on a bias-free network
    r = explain.attribute(model, x, t, method="lrp")
    logit = logits[torch.arange(2), t].detach()
    assert torch.allclose(r.flatten(1).sum(1), logit, rtol=1e-4)
    assert not torch.allclose(r, eps, atol=1e-3 * eps.abs().max())  # and it is another map
    assert_unchanged(model, before)


def test_lrp_input_bounds_are_the_callers_explicit_choice():
    model = torchvision_model("resnet18")
    mean = torch.tensor(explain.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(explain.IMAGENET_STD).view(1, 3, 1, 1)
    pixels = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    x = (pixels - mean) / std
    with pytest.raises(ValueError, match="normalised=True"):  # (0, 1) bounds do not hold a normalised input
        explain.attribute(model, x, 0, method="lrp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the random head's biases absorb relevance (warned, tested below)
        r = explain.attribute(model, x, 0, method="lrp", normalised=True)
        same = explain.attribute(model, x, 0, method="lrp", low=((0 - mean) / std).flatten().tolist(),
                                 high=((1 - mean) / std).flatten().tolist())
    assert torch.equal(r, same)
    with pytest.raises(ValueError, match="not both"):
        explain.attribute(model, x, 0, method="lrp", normalised=True, low=-3.0)


def test_lrp_warns_with_the_ratio_when_biases_take_relevance():
    model = torchvision_model("vgg11_bn")
    with torch.no_grad():
        model.classifier[0].bias.fill_(-1.0)  # a large negative shift absorbs most of the relevance
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with pytest.warns(UserWarning, match=r"relevance sum / target logit ranges over \[-?\d"):
        explain.attribute(model, x, 0, method="lrp")


class ResidualMLP(nn.Module):
    """A residual sum written in forward, which no canonizer knows (relevance sum / logit was 3.22)."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten, self.fc1, self.relu, self.fc2, self.head = (
            nn.Flatten(), nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 3))

    def forward(self, x):
        h = self.relu(self.fc1(self.flatten(x)))
        return self.head(self.relu(h + self.fc2(h)))


class GeluCalledReLU(nn.ReLU):
    def forward(self, x):
        return nn.functional.gelu(x)


def refusals() -> dict[str, tuple[nn.Module, str]]:
    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(image_size=64, patch_size=16, num_layers=1, num_heads=2,
                                               hidden_dim=32, mlp_dim=64, num_classes=10)
    return {
        "residual MLP": (ResidualMLP(), r"'' .*ResidualMLP|ResidualMLP.* add.*residual sum"),
        "vit_b_16-like": (vit, "LayerNorm|GELU|MultiheadAttention"),
        "densenet121": (torchvision_model("densenet121"), "BatchNorm"),
        "mobilenet_v2": (torchvision_model("mobilenet_v2"), "ReLU6"),
        "efficientnet_b0": (torchvision_model("efficientnet_b0"), "SiLU"),
        "ReLU subclass": (nn.Sequential(nn.Conv2d(3, 4, 3), GeluCalledReLU(), nn.Flatten(),
                                        nn.Linear(4 * 14 * 62, 3)), "GeluCalledReLU"),
    }


@pytest.mark.parametrize("case", ["residual MLP", "vit_b_16-like", "densenet121", "mobilenet_v2", "efficientnet_b0",
                                  "ReLU subclass"])
def test_lrp_refuses_by_name_what_zennit_cannot_canonize(case):
    model, pattern = refusals()[case]
    model.eval()
    size = {"residual MLP": (4, 4), "ReLU subclass": (16, 64)}.get(case, (64, 64))
    x = torch.rand(2, 3, *size)
    before = state(model)
    with pytest.raises(gates.UnsupportedLayerError, match=pattern):
        explain.attribute(model, x, 0, method="lrp")
    assert_unchanged(model, before)


@pytest.mark.parametrize("name", FIVE)
def test_gradient_and_pullback_on_torchvision_models(name):
    model = torchvision_model(name)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    t = torch.tensor([1, 7])
    before = state(model)
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xg)[torch.arange(2), t].sum(), xg)
    for method in ("gradient", "pullback"):
        try:
            out = explain.attribute(model, x, t, method=method)
        except gates.UnsupportedLayerError as err:
            # refused: only networks with a non-ReLU non-linearity may be, and the error names the layer
            assert name in ("mobilenet_v2", "efficientnet_b0", "densenet121"), (name, method, err)
            assert any(word in str(err) for word in ("ReLU6", "SiLU", "Hardtanh", "Sigmoid", "relu", "'")), err
            continue
        assert out.shape == x.shape and torch.isfinite(out).all()
        if method == "gradient":
            assert torch.allclose(out, grad, rtol=1e-5, atol=1e-6 * grad.abs().max()), (name, method)
        else:
            assert not torch.allclose(out, grad, atol=1e-3 * grad.abs().max())  # a surrogate, not the gradient
    assert_unchanged(model, before)
