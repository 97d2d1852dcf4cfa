"""TF32 on CUDA GPUs: the library's self-checked objects compute in full float32 precision, whatever the
caller's settings, and leave those settings as they were; setup() turns TF32 off for the chapters.

PyTorch's TF32 switches are plain settings that exist (and can be read and set) on a CPU-only machine,
so everything here runs on a CPU; where a CUDA tensor is needed, ``Tensor.is_cuda`` is patched."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dualview
from dualview import gates, projections, pullbacks
from dualview.gates import UnsupportedLayerError


def switches() -> list:
    """The values of the TF32 switches the library reads and sets."""
    return [getattr(namespace, name) for namespace, name, _ in gates._tf32_switches()]


def tf32_on() -> None:
    """What a caller on an Ampere GPU may have: TF32 allowed for matmuls and convolutions."""
    for namespace, name, value in gates._tf32_switches():
        setattr(namespace, name, True if value is False else "tf32")


@pytest.fixture(autouse=True)
def restore_switches():
    """Leave PyTorch's global TF32 settings as this test found them."""
    found = switches()
    yield
    for (namespace, name, _), value in zip(gates._tf32_switches(), found):
        setattr(namespace, name, value)


def test_the_switches_cover_matmuls_and_convolutions():
    names = {(namespace, name) for namespace, name, _ in gates._tf32_switches()}
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        assert {(backends.cuda.matmul, "fp32_precision"), (backends.cudnn.conv, "fp32_precision")} <= names
    else:
        assert names == {(backends.cuda.matmul, "allow_tf32"), (backends.cudnn, "allow_tf32")}


def test_full_precision_turns_tf32_off_and_restores_the_callers_settings():
    tf32_on()
    mine = switches()
    assert gates._tf32_on()
    with gates.full_precision():
        assert not gates._tf32_on()
        with gates.full_precision():  # nested: the inner block restores the outer one's settings
            assert not gates._tf32_on()
        assert not gates._tf32_on()
    assert switches() == mine
    with pytest.raises(RuntimeError, match="inside"):
        with gates.full_precision():
            raise RuntimeError("inside")
    assert switches() == mine  # also after an exception


def test_the_legacy_flags_read_by_torch_agree_after_full_precision():
    # PyTorch (2.9 and later) raises when its legacy and per-backend settings disagree; the library
    # leaves them as it found them, so reading the legacy flags still works
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    with gates.full_precision():
        pass
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True


def test_the_two_lines_of_the_error_message_turn_tf32_off():
    tf32_on()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    assert not gates._tf32_on()


class Spy(nn.Module):
    """A small conv net that records whether TF32 was on at each of its forward passes."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Linear(12, 4), nn.ReLU(), nn.Linear(4, 2))
        self.seen: list[bool] = []
        self.fail = False

    def forward(self, x):
        self.seen.append(gates._tf32_on())
        if self.fail:
            raise RuntimeError("a forward pass that fails")
        return self.net(x)


CALLS = {
    "gated_linear_model": lambda m, x, g: pullbacks.gated_linear_model(m, x, 0, g),
    "switched_projections": lambda m, x, g: projections.switched_projections(m, x),
    "insens": lambda m, x, g: projections.insens(m, x),
    "insens_estimate": lambda m, x, g: projections.insens_estimate(
        m, x, probes=4, groups=2, generator=torch.Generator().manual_seed(0)),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_self_checked_objects_run_every_forward_with_tf32_off(call):
    torch.manual_seed(0)
    model, x = Spy().eval(), torch.randn(2, 1, 4, 4)
    own = gates.record_gates(model, x).gates
    tf32_on()
    mine = switches()
    model.seen = []
    CALLS[call](model, x, own)
    assert model.seen and not any(model.seen)
    assert switches() == mine
    model.fail, model.seen = True, []
    with pytest.raises(RuntimeError, match="a forward pass that fails"):
        CALLS[call](model, x, own)
    assert model.seen == [False] and switches() == mine  # restored after an exception too


def patch_cuda(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))


def wrong_model():
    """``<w, x> + b`` off by 1e-3 of the output, about what TF32 does to a convolution."""
    return torch.tensor([[0.2, 0.05]]), torch.tensor([0.0]), torch.tensor([0.2503])


def test_check_reproduces_names_tf32_on_a_gpu_where_it_is_on(monkeypatch):
    patch_cuda(monkeypatch)
    tf32_on()
    with pytest.raises(UnsupportedLayerError) as err:
        gates.check_reproduces("a model", *wrong_model())
    message = str(err.value)
    assert "TF32 is on" in message and "not affine" not in message
    assert "torch.backends.cuda.matmul.allow_tf32 = False" in message
    assert "torch.backends.cudnn.allow_tf32 = False" in message


def test_check_reproduces_blames_the_model_where_tf32_cannot_be_the_cause(monkeypatch):
    tf32_on()
    with pytest.raises(UnsupportedLayerError, match="not affine") as err:  # a CPU tensor
        gates.check_reproduces("a model", *wrong_model())
    assert "TF32" not in str(err.value)
    patch_cuda(monkeypatch)
    terms, bias, out = wrong_model()
    with pytest.raises(UnsupportedLayerError, match="not affine") as err:  # float64: no TF32
        gates.check_reproduces("a model", terms.double(), bias.double(), out.double())
    assert "TF32" not in str(err.value)
    with gates.full_precision(), pytest.raises(UnsupportedLayerError, match="not affine") as err:
        gates.check_reproduces("a model", *wrong_model())
    assert "TF32" not in str(err.value)


SIZES = {"cpu": dict(n=1), "gpu": dict(n=2)}


def test_setup_turns_tf32_off_on_cuda_and_says_so(capsys):
    tf32_on()
    dualview.setup("cpu", 0, "cuda", sizes=SIZES)  # a device name: no GPU is needed to set it up
    assert not gates._tf32_on()
    assert "on cuda with TF32 off" in capsys.readouterr().out


def test_setup_leaves_tf32_alone_on_a_cpu(capsys):
    tf32_on()
    mine = switches()
    dualview.setup("cpu", 0, "cpu", sizes=SIZES)
    assert switches() == mine
    assert "TF32" not in capsys.readouterr().out
