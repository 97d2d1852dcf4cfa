"""The guard of :func:`dualview.gates.instrument`: what a model's own code may apply to tensors that depend on
the input (a whitelist of linear operations), and the refusal of anything else, naming the line of code."""
from __future__ import annotations

import traceback
import weakref
from typing import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from dualview.gates.layers import UnsupportedLayerError
from dualview.gates.rules import Rule

# What the guard of :func:`instrument` lets a ``forward`` apply to a tensor that depends on the input,
# by the function's name (``torch.add``, ``Tensor.add``, ``Tensor.add_`` and ``Tensor.__add__`` alike).
# torch's own affine layers are checked by their calls too (``nn.Conv2d`` calls ``F.conv2d``, ``nn.BatchNorm2d``
# ``F.batch_norm`` in eval mode: both on the list); the calls inside gates, max-pools and the affine layers
# registered or declared by users are not checked (the layer is trusted whole); calls on tensors that do not
# depend on the input (constants, parameters) are free.
_LINEAR_OPS = frozenset("""
    add sub neg positive sum mean cat concat concatenate stack hstack vstack view view_as reshape reshape_as
    flatten unflatten permute transpose swapaxes swapdims t T mT contiguous clone squeeze unsqueeze expand
    expand_as repeat tile flip fliplr flipud roll narrow chunk split tensor_split unbind movedim moveaxis
    select getitem setitem iter index_select gather take take_along_dim pad avg_pool1d avg_pool2d avg_pool3d
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d interpolate upsample upsample_nearest
    upsample_bilinear pixel_shuffle pixel_unshuffle channel_shuffle fold unfold diagonal tril triu cumsum
    diff broadcast_to sum_to_size as_strided masked_fill where to type type_as float double half bfloat16
    cpu cuda copy zero fill dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout
    batch_norm index_add scatter scatter_add index_copy index_fill masked_scatter masked_select
    iadd radd isub rsub pos
""".split())
# bilinear: linear in each argument, so at most one argument may depend on the input
_PRODUCT_OPS = frozenset("""
    mul multiply imul rmul matmul rmatmul mm bmm mv dot inner outer einsum linear conv1d conv2d conv3d
    conv_transpose1d conv_transpose2d conv_transpose3d addmm addmv baddbmm addbmm tensordot kron
""".split())
_DIVISION_OPS = frozenset("div divide true_divide truediv itruediv".split())  # only the numerator may depend
# comparisons, masks and arg-max: allowed, their (input-dependent) results may not be used as masks,
# indices or factors, nor read into Python
_SWITCH_OPS = frozenset("""
    gt lt ge le eq ne greater less greater_equal less_equal not_equal sign signbit isfinite isnan isinf
    argmax argmin argsort any all logical_not logical_and logical_or
""".split())
_META_OPS = frozenset("""
    shape dtype device ndim size dim numel nelement is_floating_point is_complex requires_grad grad_fn
    is_leaf layout names stride is_contiguous element_size storage_offset is_cuda is_cpu is_mps is_meta
    is_sparse is_quantized is_nested len repr format output_nr requires_grad_ retain_grad register_hook
    new_zeros new_ones new_empty new_full new_tensor zeros_like ones_like empty_like full_like rand_like
    randn_like randint_like get_device itemsize nbytes
""".split())
_READ_OPS = frozenset("read item tolist numpy nonzero data detach".split())
_RELU_OPS = frozenset({"relu"})


def _op_name(func: Callable) -> str:
    """``add`` for ``torch.add``, ``Tensor.add_`` and ``Tensor.__add__``; ``shape`` for ``Tensor.shape``."""
    name = getattr(func, "__name__", "") or ""
    if name in ("__get__", "__set__"):
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    if name in ("__bool__", "__float__", "__int__", "__index__", "__complex__", "__array__"):
        return "read"
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
    elif name.endswith("_") and not name.startswith("_"):
        name = name[:-1]
    return name


def _op_kind(func: Callable) -> str:
    name = _op_name(func)
    for kind, names in (("meta", _META_OPS), ("relu", _RELU_OPS), ("linear", _LINEAR_OPS),
                        ("product", _PRODUCT_OPS), ("division", _DIVISION_OPS), ("switch", _SWITCH_OPS),
                        ("read", _READ_OPS)):
        if name in names:
            return kind
    return "refused"


_KINDS: dict[Callable, str] = {}


def _tensors(args, kwargs) -> Iterator[Tensor]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, Tensor))


def _user_frame() -> str:
    """The innermost stack frame outside torch and dualview.gates: where the model's code made the call."""
    torch_dir = torch.__file__.rsplit("/", 1)[0] + "/"  # (not torchvision/)
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(torch_dir) and \
                "/dualview/gates/" not in frame.filename:
            return f'{frame.filename}:{frame.lineno} ("{(frame.line or "").strip()}")'
    return "an unknown place"


class _Guard(TorchFunctionMode):
    """Active during the root model's forward: a whitelist of what the model's own code (the ``forward`` of
    containers and of the root) may apply to tensors that depend on the input. It tracks which tensors
    depend on the input (the root's arguments, and everything computed from them) and lets through
    operations that are linear in them (:data:`_LINEAR_OPS`; products and quotients with at most one
    dependent factor, a dependent numerator), comparisons whose results are then not used as masks,
    indices or factors, and functional ReLUs that a rule accepts. Anything else raises
    :class:`UnsupportedLayerError` naming the operation, the module and the line of code. torch's own
    affine layers are not hooked: their calls (``F.conv2d``, ``F.batch_norm``, ...) pass this list like any
    other. Calls inside gates, max-pools and registered or declared affine layers are not checked (the layer
    is known to compute what its class says)."""

    def __init__(self, rules: tuple[Rule, ...], root: nn.Module | None = None) -> None:
        super().__init__()
        self.rules = rules
        self.op_rules = [r for r in rules if type(r).linear_op is not Rule.linear_op]
        self.root = root  # named in a refusal outside every hooked module (a root that is a torch layer)
        self.stack: list[tuple[str, nn.Module, bool]] = []  # (label, module, its own calls are trusted)
        self.internal = 0  # > 0 while a rule runs: its own calls are not the model's
        self.pending: UnsupportedLayerError | None = None  # the last refusal, see __torch_function__
        self.dependent: dict[int, weakref.ref] = {}  # id -> tensor, for tensors that depend on the input
        # inputs of in-place ReLUs (overwritten in the real network): id -> (the input, the ReLU's output)
        self.stale: dict[int, tuple[weakref.ref, Tensor]] = {}

    def fresh(self, args, kwargs):
        """``args, kwargs`` with the input of an in-place ReLU, read again after the ReLU, replaced by the
        ReLU's output (what the real network's overwritten tensor holds), or ``None`` if none was read."""
        def swap(a):
            if isinstance(a, Tensor):
                entry = self.stale.get(id(a))
                return entry[1] if entry is not None and entry[0]() is a else a
            if isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
                swapped = [swap(t) for t in a]
                return type(a)(swapped) if any(x is not y for x, y in zip(swapped, a)) else a
            return a
        new_args, new_kwargs = tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}
        changed = any(x is not y for x, y in zip(new_args, args)) or \
            any(new_kwargs[k] is not kwargs[k] for k in kwargs)
        return (new_args, new_kwargs) if changed else None

    def depends(self, t: Tensor) -> bool:
        r = self.dependent.get(id(t))
        return r is not None and r() is t

    def mark(self, out) -> None:
        if isinstance(out, Tensor):
            self.dependent[id(out)] = weakref.ref(out)
        elif isinstance(out, (list, tuple)):
            for t in out:
                self.mark(t)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.internal or (self.stack and self.stack[-1][2]):
            return func(*args, **kwargs)
        kind = _KINDS.get(func)
        if kind is None:
            kind = _KINDS[func] = _op_kind(func)
        if kind == "meta":
            return func(*args, **kwargs)
        dep = [t for t in _tensors(args, kwargs) if self.depends(t)]
        if not dep:
            return func(*args, **kwargs)
        if self.stale:
            swapped = self.fresh(args, kwargs)
            if swapped is not None:
                return self.__torch_function__(func, types, *swapped)
        problem = self.problem(func, kind, args, kwargs, dep)
        if problem is None:
            out = None
            if self.op_rules and kind in ("linear", "product", "division"):
                label, owner = (self.stack[-1][:2]) if self.stack else ("<model>", self.root)
                where = f"'{label}' ({type(owner).__name__}), at {_user_frame()}"
                name = _op_name(func)
                out = _apply(self, lambda rule: rule.linear_op(name, func, args, kwargs, dep, where)
                             if rule in self.op_rules else None, f"{name} in {where}")
            if out is None:
                out = func(*args, **kwargs)
            self.mark(out)
            return out
        label, owner = (self.stack[-1][:2]) if self.stack else ("<model>", self.root)
        where = f"'{label}' ({type(owner).__name__})"
        if kind == "relu":
            inplace = getattr(func, "__name__", "").endswith("_") or \
                bool(kwargs.get("inplace", args[1] if len(args) > 1 else False))
            x = args[0]
            q = x.clone() if inplace else x  # the rule's output may depend on q, which the copy overwrites
            out = _apply(self, lambda rule: rule.functional_relu(where, q), f"functional ReLU in {where}")
            if out is not None:
                out = x.copy_(out) if inplace else out
                self.mark(out)
                return out
        # Tensor.__matmul__ & co. turn a TypeError into NotImplemented (then Python's own "unsupported
        # operand" TypeError): instrument() re-raises the pending error in its place
        if kind == "relu":
            self.pending = UnsupportedLayerError(
                f"the forward of {where} calls {_op_name(func)} as a function on a tensor that depends on the "
                f"input, at {_user_frame()}: {problem}, so this computation cannot record or impose its gates. "
                "What to do: dualview.dgn.one_relu_per_use(model) returns a copy of the model in which every "
                "F.relu / torch.relu / x.relu() call is an nn.ReLU module of its own (traced with torch.fx; the "
                "model itself is not modified); pass that copy. Or write the ReLUs as nn.ReLU modules.")
            raise self.pending
        self.pending = UnsupportedLayerError(
            f"the forward of {where} calls {_op_name(func)} as a function on a tensor that depends on the "
            f"input, at {_user_frame()}: {problem}. dualview refuses what it does not know to be linear, a "
            "gate or a supported piecewise-linear layer, because the dual view (gates, switched and gated "
            "linear models, pullbacks, Insens) would silently be wrong. What to do: apply ReLUs and max-pools "
            "through nn.ReLU / nn.MaxPool2d modules (their gates are recorded; a module may be called more "
            "than once, each call is its own gate site); other non-linearities "
            "(softmax and attention, normalisation by the input's own statistics, GELU/SiLU/tanh, clamps, "
            "max/amax, products of two activations) are outside the exact dual view of ReLU networks." +
            (" The excitation pullback's surrogate rules cover attention and normalisation as modules: write them "
             "with nn.MultiheadAttention and nn.LayerNorm." if self.rules and all(r.smooth for r in self.rules)
             else ""))
        raise self.pending

    def problem(self, func, kind: str, args, kwargs, dep: list[Tensor]) -> str | None:
        """Why ``func`` may not be applied to the dependent tensors ``dep``, or ``None`` when it may."""
        if any(not t.is_floating_point() for t in dep) and kind != "switch":
            return ("it uses a mask, an index or an integer computed from the input (an input-dependent "
                    "selection is a switch dualview cannot see)")
        if kind == "relu":
            return "a functional ReLU: dualview sees gates only through nn.ReLU modules"
        if kind in ("linear", "switch"):
            name = _op_name(func)
            if name.startswith("dropout") or name.endswith("dropout"):
                training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                if training and p:
                    return "dropout in training mode is random, not a fixed linear map (pass training=False)"
            if name == "batch_norm":
                training = kwargs.get("training", args[5] if len(args) > 5 else False)
                if training or (len(args) > 1 and args[1] is None):
                    return "batch normalisation with the batch's own statistics is not a fixed linear map"
            return None
        if kind == "product":
            return None if len(dep) <= 1 else "it multiplies two tensors that both depend on the input"
        if kind == "division":
            first = args[0] if args else None
            return None if len(dep) == 1 and first is dep[0] else \
                "it divides by a tensor that depends on the input"
        if kind == "read":
            return ("it reads a tensor that depends on the input into Python (or detaches it), so what "
                    "follows can switch on the input unseen")
        return "it is not known to be linear in its input"


def _apply(guard: _Guard, call: Callable[[Rule], Tensor | None], site: str) -> Tensor | None:
    """Run every rule at one gate (not guarded); at most one may replace the output."""
    out = None
    guard.internal += 1
    try:
        for rule in guard.rules:
            new = call(rule)
            if new is not None:
                if out is not None:
                    raise ValueError(f"two rules replace the output of {site}; combine at most one such rule")
                out = new
    finally:
        guard.internal -= 1
    return out
