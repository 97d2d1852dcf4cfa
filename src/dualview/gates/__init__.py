"""Gates: the on/off states of the ReLUs of a network, recorded for a batch or imposed from outside.

A ReLU computes ``z = q * 1{q > 0}``: its pre-activation ``q`` times its *gate* ``G = 1{q > 0}``
(Table 4 of the duality paper :cite:`lakshminarayanan2022explicitising`). :func:`record_gates`
records the pre-activations and gates of every ReLU of a model for a batch, and the winners of every
max-pooling window (a max-pool is a gate that lets one input of each window through).
:func:`run_with_gates` runs a model with gates given from outside: every ReLU becomes a *gated linear
unit* (GaLU) ``z = q * G`` with ``G`` supplied, every max-pool takes the supplied winners. With the
model's own gates the output is unchanged; with the gates of an input ``x`` held fixed, the map
``x' -> run_with_gates(model, x', G(x))`` is affine: the *active sub-network* of ``x``.

Both are built on one instrumentation primitive, :func:`instrument`, in the style of Zennit's
composites: a context manager that hooks a model and names its gates, with small :class:`Rule`
objects plugged in that say what happens at each gate (:class:`Record`, :class:`ImposeGates`; the
surrogate backward of excitation pullbacks is :class:`dualview.surrogates.SurrogateBackward`).

Supported layers (:data:`SUPPORTED_LAYERS`): ``nn.Linear``, ``nn.Conv1d``/``2d`` (any padding mode),
``nn.ReLU``, ``nn.MaxPool1d``/``2d``, ``nn.AvgPool1d``/``2d``, ``nn.AdaptiveAvgPool1d``/``2d``,
``nn.BatchNorm1d``/``2d`` (eval mode, with running statistics), ``nn.Dropout``/``1d``/``2d`` (eval mode),
``nn.Flatten``, ``nn.Unflatten``, ``nn.Identity``, zero/constant padding, ``nn.Upsample``, the hard-clipped
ReLUs ``nn.ReLU6`` and ``nn.Hardtanh(0, t)`` (:data:`CLIPPED_LAYERS`, below), and containers of
these (``nn.Sequential``, residual blocks whose ``forward`` adds tensors). A subclass that overrides its
base's ``forward`` is not taken for its base (a gate is recognised by what it computes). Affine layers of
your own join with :func:`register_linear_layer` (checked for affinity, undoable), or by declaring a
class attribute ``linear_layer = True`` (as the affine layers of :mod:`dualview.nets` do). Anything else
raises :class:`UnsupportedLayerError` naming the layer.

What a container's ``forward`` does between its layers is checked too, by a whitelist: during the
model's forward, :func:`instrument` tracks the tensors that depend on the input and lets through only
operations known to be linear in them (sums, reshapes, concatenation, indexing with constant indices,
zero padding, average pooling, interpolation, products with at most one input-dependent factor, ...).
Anything else (``torch.softmax``, ``F.layer_norm``, ``x.amax``, ``clamp``, ``torch.where`` on an
input-dependent mask, a product of two activations, ``F.relu`` unless a rule accepts it, ...) raises
:class:`UnsupportedLayerError` naming the operation, the module and the line of code. An in-place ReLU's
input read again after the ReLU is given the ReLU's output, as in the real network.

Hard-clipped ReLUs (:data:`CLIPPED_LAYERS`: ``nn.ReLU6``, ``nn.Hardtanh(min_val=0, max_val=t)``) are piecewise
linear: ``min(max(q, 0), t) = q * G + t * H`` with the gate ``G = 1{0 < q < t}`` (the pass-through piece) and
the *saturated* piece ``H = 1{q >= t}``, a constant. Both are fixed by ``x`` (the ties at ``q = 0`` and
``q = t`` as PyTorch's backward takes them: slope 0), so with them held fixed the network is affine again and
the dual view is exact: :attr:`GateRecord.gates` holds ``G``, :attr:`GateRecord.saturated` holds ``H``, and
:func:`run_with_gates` outputs ``q * G + t * H`` at such a site (pass ``saturated=``). They are accepted by
the rules that declare ``Rule.clipped`` (recording, imposing gates, the surrogate backward of excitation
pullbacks), hence by switched projections, Insens and gated linear models; path counts, kernels and gated
networks are defined for ReLU networks and refuse them. A Hardtanh with ``min_val != 0`` is refused.

SiLU and GELU (:data:`SMOOTH_LAYERS`) are *not* piecewise linear: ``q * sigmoid(q)`` and ``q * Phi(q)`` switch
nothing on or off, no gates held fixed make the network affine, and no switched or gated linear model
reproduces ``f(x)``: the exact dual view does not apply. Only rules that declare ``Rule.smooth`` (the
surrogate backward of excitation pullbacks, which defines a backward pass, not a linear model) accept
them, and with them torchvision's squeeze-and-excitation block ``x * s(x)`` (a channel gate, handed to
:meth:`Rule.channel_gate`) and ``StochasticDepth`` (the identity in eval mode). Everything else (recording and
imposing gates, gated linear models, switched projections, Insens, path counts, kernels) refuses them by name.
So do ``nn.LayerNorm`` and ``nn.MultiheadAttention`` (:data:`TRANSFORMER_LAYERS`), which the same rules
hand to :meth:`Rule.layer_norm` and :meth:`Rule.attention` (the follow-up's rules, :mod:`dualview.attention`).
"""
from __future__ import annotations

from dualview.gates.guard import _op_kind, _op_name  # noqa: F401  (the guard's plumbing, for tests)
from dualview.gates.instrument import active_share, instrument, record_gates, run_with_gates
from dualview.gates.layers import (
    CLIPPED_LAYERS, GATE_LAYERS, LEAKY_LAYERS, POOL_GATE_LAYERS, SMOOTH_LAYERS, SUPPORTED_LAYERS, TRANSFORMER_LAYERS,
    SelectOutput,
    UnsupportedLayerError, check_batch, check_eval, check_model, check_supported, clip_ceiling, leaky_slope,
    model_output, register_linear_layer, unregister_linear_layer,
)
from dualview.gates.precision import _tf32_on, _tf32_switches, check_reproduces, full_precision, tf32_off  # noqa: F401
from dualview.gates.rules import GateRecord, ImposeGates, Record, Rule

__all__ = [
    "SUPPORTED_LAYERS", "UnsupportedLayerError", "register_linear_layer", "check_supported", "check_batch",
    "GATE_LAYERS", "CLIPPED_LAYERS", "SMOOTH_LAYERS", "LEAKY_LAYERS", "TRANSFORMER_LAYERS",
    "POOL_GATE_LAYERS", "GateRecord", "check_eval", "check_reproduces", "check_model",
    "unregister_linear_layer", "full_precision", "tf32_off", "leaky_slope",
    "clip_ceiling", "Rule", "Record", "ImposeGates", "instrument", "record_gates", "run_with_gates",
    "active_share", "model_output", "SelectOutput",
]

# the package's names are documented and shown as dualview.gates.<name> (where a reader of the book calls them)
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
