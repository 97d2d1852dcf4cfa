"""Device-agnostic code: no library function makes a tensor on the default device next to inputs on another.

On a GPU, ``torch.zeros(n)`` inside a function given a CUDA model makes a CPU tensor, and the next operation
with the model's tensors fails (or, worse, silently copies). A CPU-only machine cannot see this: every tensor
is on the CPU. So the guard below moves the *default* device instead: inside :func:`device_guard` the default
device is ``meta`` (``with torch.device("meta")``), the inputs and models stay on the CPU, and a factory call
without ``device=`` (``torch.zeros``, ``ones``, ``empty``, ``full``, ``arange``, ``eye``, ``tensor``, ``rand*``,
``linspace``, ...) makes a meta tensor, which fails the next operation with a CPU tensor, as it would on a GPU.
Some operations do not fail on a meta operand (indexing with a meta index, a matmul with a meta matrix give CPU
results), so a ``TorchFunctionMode`` also records every such factory call whose caller is library code, with its
file and line; the test fails when it records anything. Each function's output is compared with its output
outside the guard, so a meta tensor cannot slip into a result either.

One representative function of every library module runs here (``MODULES`` must list them all). Functions that
build networks themselves and then move them (``zoo.load_pretrained``, ``sweep.train_gated``, ``levels.prune``)
run with the recorder alone: a network built on the meta default device has no values to move (a limit of the
meta device, not a mistake of the code).
"""
from __future__ import annotations

import contextlib
import dataclasses
import linecache
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import dualview
from tiny_models import conv_net

LIBRARY = Path(dualview.__file__).resolve().parent
TORCH = Path(torch.__file__).resolve().parent
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.eye, torch.tensor, torch.as_tensor,
             torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace, torch.logspace,
             torch.scalar_tensor}


DISPATCH = {TORCH / "overrides.py", TORCH / "utils" / "_device.py"}  # how torch reaches the mode, not callers


def _library_caller() -> str | None:
    """``module.py:line`` of the code that called the factory, if it is library code (a factory called by
    torch itself, e.g. inside ``nn.Linear(...)``, or in a module's ``__init__``, makes parameters and buffers
    on the default device, which ``module.to(device)`` moves with the module)."""
    frame = sys._getframe(2)
    while frame is not None and Path(frame.f_code.co_filename).resolve() in DISPATCH:
        frame = frame.f_back
    if frame is None or not Path(frame.f_code.co_filename).resolve().is_relative_to(LIBRARY):
        return None
    if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), nn.Module):
        return None  # a module's own parameters and buffers: made like torch's layers, moved by .to()
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


#: Factory calls in library code whose tensors stay on the host by design (read back with ``.tolist()``, never
#: combined with the inputs): ``(file, code on the line)``. They are made on the CPU, as in a real run.
HOST_SIDE = {("metrics.py", "torch.linspace(0, 0.5, 11)")}


class FactoryRecorder(TorchFunctionMode):
    """Records the factory calls without ``device=`` made by library code (a tensor given to ``as_tensor``
    keeps its device, so that one is fine)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        keeps_device = func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)
        if func in FACTORIES and kwargs.get("device") is None and not keeps_device:
            where = _library_caller()
            if where and any(where.startswith(f + ":") and code in linecache.getline(str(LIBRARY / f), int(
                    where.split(":")[1])) for f, code in HOST_SIDE):
                kwargs = {**kwargs, "device": "cpu"}
            elif where:
                self.calls.append(f"{where} torch.{func.__name__}(...) without device=")
        return func(*args, **kwargs)


@contextlib.contextmanager
def device_guard(meta_default: bool = True):
    """Inside: the default device is ``meta`` (unless ``meta_default=False``) and factory calls without
    ``device=`` in library code are recorded in the yielded recorder's ``calls``."""
    recorder = FactoryRecorder()
    with torch.device("meta") if meta_default else contextlib.nullcontext(), recorder:
        yield recorder


def _leaves(obj):
    """The tensors and numbers in a result (tensors, numbers, dataclasses, dicts, lists, tuples, modules)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, nn.Module):
        yield from obj.state_dict().values()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name))
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)
    elif isinstance(obj, (int, float, np.ndarray, np.number)) and not isinstance(obj, bool):
        yield obj


def check(fn, *args, meta_default: bool = True, seed: int = 0, atol: float = 1e-8, **kwargs):
    """Run ``fn`` outside and inside the guard; it must not fail inside, record nothing and give the same
    result (every tensor on the CPU), up to ``atol``."""
    dualview.seed_everything(seed)
    expected = fn(*args, **kwargs)
    dualview.seed_everything(seed)
    with device_guard(meta_default) as recorder:
        try:
            got = fn(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as error:
            pytest.fail(f"{fn.__module__}.{fn.__qualname__} fails when the default device is not the inputs' "
                        f"device: {error}\nfactory calls without device= in the library: {recorder.calls}")
    assert not recorder.calls, f"{fn.__module__}.{fn.__qualname__} makes tensors without device=: {recorder.calls}"
    got_leaves, expected_leaves = list(_leaves(got)), list(_leaves(expected))
    assert len(got_leaves) == len(expected_leaves)
    for g, e in zip(got_leaves, expected_leaves):
        if isinstance(e, torch.Tensor):
            assert g.device.type == "cpu", f"{fn.__qualname__} returned a tensor on {g.device}"
            assert torch.allclose(g.double(), e.double(), atol=atol, equal_nan=True)
        else:
            assert np.allclose(g, e, atol=atol, equal_nan=True)
    return got


# --------------------------------------------------------------------------------------------------
# The guard can fail


def planted_mistake(x: torch.Tensor) -> torch.Tensor:
    return x + torch.zeros(x.shape[1])  # no device=: the default device's, not x's


def test_the_guard_catches_a_factory_without_device(monkeypatch):
    x = torch.randn(3, 4)
    with device_guard(), pytest.raises(RuntimeError, match="meta"):
        planted_mistake(x)
    # the recorder names library lines: plant the same mistake in a library function and it is named
    from dualview import stats

    def relative_error(a, b):
        return float((a - b + torch.zeros(a.shape)).abs().max())

    relative_error.__code__ = relative_error.__code__.replace(co_filename=str(LIBRARY / "stats.py"))
    monkeypatch.setattr(stats, "relative_error", relative_error)
    with device_guard(meta_default=False) as recorder:
        stats.relative_error(x, x)
    assert recorder.calls and recorder.calls[0].startswith("stats.py:") and "torch.zeros" in recorder.calls[0]
    with device_guard() as recorder:  # and a correct function passes
        x + torch.zeros(x.shape[1], device=x.device)
    assert not recorder.calls


# --------------------------------------------------------------------------------------------------
# One representative function per module


def fc_net():
    from dualview import nets

    dualview.seed_everything(0)
    return nets.relu_mlp([6, 5, 4, 3]).double().eval()


def images(n=4, c=1, side=8):
    return torch.rand(n, c, side, side, generator=torch.Generator().manual_seed(1))


# Each run_<module>() prepares its inputs and models (on the CPU, outside the guard) and returns the call to check.


def run_architectures():
    from dualview.architectures import Architecture, LinearSite, gate_sites, replace_gate_sites

    net = Architecture.fc((4, 4), in_shape=(1, 3, 3)).network()
    return lambda: (replace_gate_sites(net, LinearSite), len(gate_sites(net)))


def run_data():
    from dualview import data

    x, y, index = images(), torch.arange(4), torch.tensor([2, 0])
    return lambda: data.ImageData(x, y, data.MNIST_CLASSES, "test")[index].to("cpu").x


def run_dgn():
    from dualview import dgn
    from dualview.architectures import Architecture

    arch = Architecture.fc((5, 5, 5), in_shape=(1, 3, 3))
    soft = dgn.build(arch, "dgn", value_input="ones", permutation=(2, 0, 1)).double()
    pg = dgn.build(arch, "dgn", pretrained=dgn.build(arch, "dnn"), permutation=(1, 2, 0)).double()
    x = torch.randn(4, 1, 3, 3, dtype=torch.float64)
    return lambda: (soft.trace(x), pg(x), dgn.gated_forward_reference(pg, x))


def run_download(tmp_path):
    from dualview import download

    (tmp_path / "f.bin").write_bytes(b"dualview")
    return lambda: len(download.file_digest(tmp_path / "f.bin", "sha256"))


def run_explain():
    from dualview import explain

    net, x = conv_net(), images()
    return lambda: [explain.attribute(net, x, 1, method=m) for m in ("gradient", "pullback", "insens", "edges")]


def run_gates():
    from dualview import gates

    net, x = fc_net(), torch.randn(5, 6, dtype=torch.float64)

    def call():
        rec = gates.record_gates(net, x)
        return rec.gates, gates.run_with_gates(net, x, rec.gates), gates.active_share(net, x)
    return call


def run_hyperplanes():
    from dualview import dgn, hyperplanes
    from dualview.architectures import Architecture

    model = dgn.build(Architecture.fc((5, 5), in_shape=(1, 3, 3)), "dlgn").double()
    x = torch.randn(3, 1, 3, 3, dtype=torch.float64)
    return lambda: (hyperplanes.effective_hyperplanes(model), hyperplanes.local_hyperplanes(model, x, 1, [0, 2]))


def run_leveling():
    from dualview import leveling

    model, x = leveling.FeatureLevelingNet([6, 5, 4], 3).eval(), torch.randn(4, 6)
    return lambda: (model(x), leveling.l0_penalty(model), leveling.routing_summary(model))


def run_levels():
    from dualview import leveling, levels

    model, x = leveling.FeatureLevelingNet([6, 5, 4], 3).eval(), torch.randn(4, 6)
    return lambda: levels.level_contributions(levels.prune(model), x)


def run_metrics():
    from dualview import metrics

    net, x = conv_net(), images()
    scores = torch.rand(x.shape[0], *x.shape[2:])
    return lambda: (metrics.deletion_curve(net, x, 1, scores), metrics.total_variation(scores))


def run_nets():
    from dualview import nets

    conv, res, x = nets.circular_convnet(1, [3, 3], dims=2), nets.fc_resnet(6, 5, 2, 2), torch.randn(3, 6)
    xi = images()
    return lambda: (conv(xi), res(x))


def run_npk():
    from dualview import npk

    net, x = fc_net(), torch.randn(5, 6, dtype=torch.float64)
    return lambda: npk.npk(net, x)


def run_npk_conv():
    from dualview import nets, npk_conv

    model = nets.circular_convnet(1, [2, 2], num_outputs=1, dims=1).double()
    x = torch.randn(3, 1, 5, dtype=torch.float64)
    return lambda: (npk_conv.npk_conv(model, x), npk_conv.npk_conv_reference(model, x))


def run_npk_fc():
    from dualview import npk_fc

    net, x = fc_net(), torch.randn(5, 6, dtype=torch.float64)
    return lambda: (npk_fc.npk_fc(net, x), npk_fc.npf_gram_reference(net, x))


def run_npk_resnet():
    from dualview import nets, npk_resnet

    model, x = nets.fc_resnet(4, 3, 1, 2).double(), torch.randn(3, 4, dtype=torch.float64)
    return lambda: (npk_resnet.npk_resnet(model, x), npk_resnet.npk_resnet_reference(model, x))


def run_ntk():
    from dualview import ntk

    net, x = fc_net(), torch.randn(4, 6, dtype=torch.float64)
    return lambda: (ntk.empirical_ntk(net, x, output="full"), ntk.empirical_ntk_reference(net, x, output="full"))


def run_paths():
    from dualview import paths

    net, x = fc_net(), torch.randn(4, 6, dtype=torch.float64)
    return lambda: (paths.neural_path_features(net, x), paths.neural_path_values(net),
                    paths.neural_path_features_reference(net, x), paths.neural_path_values_reference(net),
                    paths.path_activity(net, x, temperature=0.5),
                    paths.count_paths(net, x).total)


def run_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dualview import plot

    x = images()

    def call():
        fig = plot.image_grid(x, ncols=2)
        plt.close(fig)
        return 0
    return call


def run_exercises():
    from dualview import exercises, paths

    # the student's answer: the library's own count, so the check runs its comparison on random networks
    return lambda: exercises.check("ex-paths-count", paths.fc_path_count).correct


def run_glue():
    from dualview import glue

    value = torch.ones(3).sum()  # made by the caller, on the CPU

    def glue_a_tensor():
        glue.glue("device_check", value, display=False)
        return glue.values["device_check"]
    return glue_a_tensor


def run_projections():
    from dualview import projections

    net, x = conv_net(), images(2)
    return lambda: (projections.switched_projections(net, x), projections.insens(net, x, structure=False))


def run_pullbacks():
    from dualview import pullbacks

    net, x = conv_net(), images(2)
    return lambda: (pullbacks.excitation_pullback(net, x, 1),
                    pullbacks.projected_gradient_ascent(net, x, 1, steps=2).x)


def run_attention():
    from dualview import pullbacks

    class Tiny(nn.Module):  # a LayerNorm and an attention between two linear layers: the surrogates of both
        def __init__(self):
            super().__init__()
            self.embed, self.norm = nn.Linear(4, 8), nn.LayerNorm(8)
            self.attn, self.head = nn.MultiheadAttention(8, 2, batch_first=True), nn.Linear(8, 3)

        def forward(self, x):
            h = self.norm(self.embed(x.flatten(2).transpose(1, 2)))
            return self.head(self.attn(h, h, h, need_weights=False)[0].mean(1))

    net, x = Tiny().eval(), images(2)[:, :, :2, :2].expand(2, 4, 2, 2).contiguous()
    return lambda: pullbacks.excitation_pullback(net, x, 1)


def run_receptive_fields():
    from dualview import projections

    net, x = conv_net(), images(2)  # insens of a plain Sequential conv net takes the receptive-field path
    return lambda: projections.insens(net, x, structure=True)


def run_splits():
    from dualview import data, splits

    d = data.ImageData(images(40), torch.arange(40) % 4, data.MNIST_CLASSES[:4], "test")
    return lambda: (splits.train_test_split(d, 8, seed=0)[1].x, splits.subset_per_class(d, 3, seed=1).x)


def run_stats():
    from dualview import stats

    scores = (torch.rand(3, 50, generator=torch.Generator().manual_seed(0)) > 0.3).double()
    return lambda: (stats.interval(scores).estimate,
                    stats.relative_error(scores, scores + 1))


def run_scoreboard():
    from dualview import scoreboard, stats

    scores = (torch.rand(3, 50, generator=torch.Generator().manual_seed(1)) > 0.3).double()

    def score_a_row():
        row = scoreboard.row("device_check", "a claim", "a paper", stats.interval(scores),
                             section="device-check", expect="above", threshold=0.5)
        return row.margin
    return score_a_row


def run_surrogates():
    from dualview import surrogates

    q = torch.randn(4, 5)
    return lambda: (surrogates.soft_gates({"q": q}, 0.3), surrogates.surrogate_relu(q, 0.3))


def run_sweep():
    from dualview import sweep

    return lambda: sweep.train_gated(0, "dgn-allones", [1, 0, 2, 3], n_train=100, epochs=1, widths=[8] * 4,
                                     device="cpu")["accuracy"]


def run_train():
    from dualview import train

    x, y = torch.randn(40, 6), torch.arange(40) % 3
    nets = [fc_net().float(), fc_net().float()]  # one per call: fit changes the model

    def call():
        model = nets.pop()
        train.fit(model, (x, y), epochs=1, batch_size=16, progress=False)
        return model, train.per_point_scores(model, (x, y))
    return call


def run_zoo():
    from dualview import zoo

    x = images(2, side=28)
    return lambda: zoo.load_pretrained("mnist-cnn-20-50-500", device="cpu", download=False)(x)


MODULES = {
    "architectures": run_architectures, "attention": run_attention, "data": run_data, "dgn": run_dgn, "download": run_download,
    "exercises": run_exercises, "explain": run_explain, "gates": run_gates, "glue": run_glue, "hyperplanes": run_hyperplanes, "leveling": run_leveling,
    "levels": run_levels, "metrics": run_metrics, "nets": run_nets, "npk": run_npk, "npk_conv": run_npk_conv,
    "npk_fc": run_npk_fc, "npk_resnet": run_npk_resnet, "ntk": run_ntk, "paths": run_paths, "plot": run_plot,
    "projections": run_projections, "pullbacks": run_pullbacks, "receptive_fields": run_receptive_fields,
    "scoreboard": run_scoreboard, "splits": run_splits, "stats": run_stats, "surrogates": run_surrogates, "sweep": run_sweep, "train": run_train,
    "zoo": run_zoo,
}
BUILDS_ITS_OWN_NETWORK = {"sweep", "zoo", "levels"}  # built, then moved: checked with the recorder alone


def test_every_module_has_a_representative():
    modules = {p.stem for p in LIBRARY.glob("*.py")} | {p.name for p in LIBRARY.iterdir() if (p / "__init__.py").exists()}
    assert sorted(MODULES) == sorted(modules - {"__init__"})


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_tensor_is_made_on_the_default_device_next_to_inputs_on_another(module, tmp_path):
    from dualview import data

    if module == "zoo" and not (data.data_dir() / "weights").is_dir():
        pytest.skip("no offline weights (DUALVIEW_DATA) for zoo.load_pretrained")
    call = MODULES[module](tmp_path) if module == "download" else MODULES[module]()
    # a training run inside a TorchFunctionMode may sum in another order (no multi-tensor Adam), and a
    # network at chance level after one epoch can flip a few of its 450 test predictions
    check(call, meta_default=module not in BUILDS_ITS_OWN_NETWORK, atol=0.05 if module == "sweep" else 1e-8)
