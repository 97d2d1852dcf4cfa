"""Part of :mod:`dualview.paths` (see its docstring)."""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Callable, Mapping
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair
from dualview.gates import LEAKY_LAYERS, POOL_GATE_LAYERS, SUPPORTED_LAYERS, ImposeGates, check_supported, instrument, \
    record_gates


# --- counting ------------------------------------------------------------------------------


def fc_path_count(widths: list[int], bias: bool | list[bool] = False) -> int:
    """Number of paths of a fully connected network with layer sizes ``widths = [d_in, w_1, ..., w_{L-1}, C]``.

    Input paths: ``d_in * w_1 * ... * w_{L-1} * C`` (every output unit counted). With biases, each
    layer ``l`` (1-based) with a bias adds the paths that start at its bias: ``w_l * ... * C``.
    """
    if len(widths) < 2 or any((not isinstance(w, int)) or w < 1 for w in widths):
        raise ValueError(f"widths must be >= 2 positive ints [d_in, ..., C], got {widths}")
    L = len(widths) - 1
    flags = [bias] * L if isinstance(bias, bool) else list(bias)
    if len(flags) != L:
        raise ValueError(f"bias needs one flag per layer ({L}), got {len(flags)}")
    return math.prod(widths) + sum(math.prod(widths[l:]) for l in range(1, L + 1) if flags[l - 1])


def conv_path_count(positions: int, kernel_taps: int, channels: list[int], fc_widths: list[int] = (),
                    num_outputs: int = 1, in_channels: int = 1) -> int:
    """Number of paths of a same-size convolutional network with a pooled (or flattened) top.

    A path starts at one of ``positions * in_channels`` input units and crosses each convolution
    through one of its ``kernel_taps`` taps into one of its ``channels[l]`` filters, then the fully
    connected units: ``positions * in_channels * prod_l (taps * c_l) * prod fc_widths * num_outputs``.
    With one input channel, ``c_l = w`` and fully connected widths ``w`` this is Proposition F.1 of
    :cite:`lakshminarayanan2022explicitising`, ``P = d_in (w_cv w)^{d_cv} w^{d_fc - 1}``.
    """
    if any(int(v) < 1 for v in [positions, kernel_taps, num_outputs, in_channels, *channels, *fc_widths]):
        raise ValueError("every size must be a positive integer")
    return positions * in_channels * math.prod(kernel_taps * c for c in channels) * math.prod(fc_widths) * num_outputs


def resnet_path_count(d_in: int, width: int, d_blk: int, b: int, num_outputs: int = 1) -> int:
    """Number of paths of the fully connected ResNet of Theorem 3.3 (:class:`dualview.nets.FCResNet`).

    Proposition G.1 of :cite:`lakshminarayanan2022explicitising`: the sub-network through ``i`` of the
    ``b`` residual blocks has ``(i + 2) d_blk - 1`` hidden layers of width ``w``, so
    ``P = d_in sum_i C(b, i) w^{(i + 2) d_blk - 1}`` (times ``num_outputs``).
    """
    if min(d_in, width, d_blk, num_outputs) < 1 or b < 0:
        raise ValueError(f"sizes must be positive (b >= 0), got d_in={d_in}, width={width}, d_blk={d_blk}, b={b}")
    return d_in * num_outputs * sum(math.comb(b, i) * width ** ((i + 2) * d_blk - 1) for i in range(b + 1))


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters (weights and biases)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@dataclass
class PathCount:
    """Paths from the input to the units of each layer.

    ``layers`` names each ReLU layer (as :func:`dualview.gates.record_gates` does) and finally
    ``"output"``. ``total[l]`` is the number of paths from any input coordinate to any unit of
    layer ``l`` (bias paths not counted); ``active[n, l]`` the number of those whose gates are all
    on for input ``n`` (including the gates of layer ``l`` itself, and max-pool windows passing
    only their winner).
    """

    layers: list[str]
    total: Tensor
    active: Tensor | None = None

    @property
    def share(self) -> Tensor:
        """Active paths as a share of all paths, ``(N, L)``."""
        if self.active is None:
            raise ValueError("no inputs were given to count_paths, so there are no active paths")
        return self.active / self.total


def _window_sum(pool: nn.Module, x: Tensor, name: str) -> Tensor:
    """Each window's sum under an average or max-pool's geometry: every input of a window passes (unit weights)."""
    if getattr(pool, "dilation", 1) not in (1, (1, 1)):
        raise ValueError(f"count_paths: dilated max-pool '{name}' is not supported")
    # divisor 1: each window's plain sum, also for windows that ceil_mode cuts at the edge
    one_d = x.dim() == 3
    as1 = (lambda v: (1, v[0] if isinstance(v, (tuple, list)) else v)) if one_d else _pair  # noqa: E731
    stride = pool.kernel_size if pool.stride is None or pool.stride == () else pool.stride
    out = F.avg_pool2d(x.unsqueeze(-2) if one_d else x, as1(pool.kernel_size), as1(stride),
                       (0, as1(pool.padding)[1]) if one_d else pool.padding, ceil_mode=pool.ceil_mode,
                       count_include_pad=True, divisor_override=1)
    return out.squeeze(-2) if one_d else out


class _SumPool(nn.Module):
    """The unit-weight version of an average pool: each window's sum."""

    linear_layer = True

    def __init__(self, pool: nn.Module, name: str) -> None:
        super().__init__()
        self.pool, self.name = pool, name

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.pool, (nn.AvgPool1d, nn.AvgPool2d)):
            return _window_sum(self.pool, x, self.name)
        out = self.pool(x)
        ins, outs = x.shape[2:], out.shape[2:]
        if any(i % o for i, o in zip(ins, outs)):
            raise ValueError(f"count_paths: adaptive pooling '{self.name}' maps {tuple(ins)} to {tuple(outs)} "
                             "with unequal windows; path counts need equal windows")
        return out * math.prod(i // o for i, o in zip(ins, outs))


def unit_network(model: nn.Module) -> nn.Module:
    """A float64 copy of ``model`` in which every edge has weight 1 and there are no biases.

    Running it on an all-ones input counts paths: each unit receives the number of paths from the
    input that reach it; running it with imposed gates on an input ``z`` sums ``z[p_0]`` over the
    active paths (Chapters 2 and 4 check kernel formulas against such path sums).
    """
    from dualview.gates import check_model

    check_model(model)
    unit = copy.deepcopy(model).double().eval()
    # a layer outside the dual view (LayerNorm, attention, GELU) is refused for what it is, not for a missing
    # unit-weight rule (checked on the eval-mode copy: the model's own mode does not matter here)
    check_supported(unit, clipped=True, leaky=True)
    for name, m in list(unit.named_modules()):
        replacement = None
        with torch.no_grad():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                # unit weight, no bias, zero mean and unit variance: the identity, exactly (a BatchNorm
                # with eps = 0 would be one too, but PyTorch 2.11 refuses eps = 0 even in eval mode)
                replacement = nn.Identity()
            elif isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d)):
                m.weight.fill_(1.0)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, (nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
                replacement = _SumPool(m, name)
            elif not list(m.children()) and \
                    not isinstance(m, _STRUCTURAL_LAYERS + POOL_GATE_LAYERS + LEAKY_LAYERS) and \
                    (type(m).__module__.startswith(("torch.", "dualview.")) or any(True for _ in m.parameters())
                     or getattr(type(m), "linear_layer", False) or isinstance(m, SUPPORTED_LAYERS())):
                # (a parameter-free layer of the user's own, a DropPath say, is counted op by op; a registered
                # or declared linear layer is trusted whole by the guard, so it needs its unit-weight rule)
                rule = _UNIT_RULES.get(type(m)) or getattr(type(m), "unit_weights", None)
                if rule is None:
                    raise TypeError(
                        f"count_paths does not know how paths cross layer '{name}' ({type(m).__name__}); "
                        "give its class a unit_weights() method, or register its unit-weight version with "
                        "dualview.paths.register_unit_rule")
                replacement = rule(m).eval()  # (a fresh module of the rule's is in training mode)
        if replacement is not None:
            parent, _, child = name.rpartition(".")
            setattr(unit.get_submodule(parent) if parent else unit, child, replacement)
    return unit


_UNIT_RULES: dict[type, Callable[[nn.Module], nn.Module]] = {}


class register_unit_rule(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Tell :func:`count_paths` how paths cross a custom linear layer (for a class you cannot edit;
    a class of your own can define a ``unit_weights()`` method instead).

    ``rule(module)`` returns the module's unit-weight version: the layer with every edge weight
    set to 1 and no offsets (e.g. a per-channel normalisation becomes ``nn.Identity()``; a fixed
    selection such as a subsampling shortcut stays as it is). Undo with :func:`unregister_unit_rule`, or use it
    as a context manager: ``with register_unit_rule(MyLayer, rule): ...`` registers for the block only (on
    exit the rule the class had before, if any, is back).
    """

    def __init__(self, cls: type[nn.Module], rule: Callable[[nn.Module], nn.Module]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"register_unit_rule expects an nn.Module class, got {cls!r}")
        if not callable(rule):
            raise TypeError(f"register_unit_rule expects a rule(module) -> unit-weight module, got {rule!r}")
        self.cls, self.rule, self.previous = cls, rule, _UNIT_RULES.get(cls)
        _UNIT_RULES[cls] = rule

    def __enter__(self) -> "register_unit_rule":
        return self

    def __exit__(self, *exc) -> None:
        if _UNIT_RULES.get(self.cls) is not self.rule:  # unregistered or replaced inside the block: leave it
            return
        if self.previous is None:
            del _UNIT_RULES[self.cls]
        else:
            _UNIT_RULES[self.cls] = self.previous


def unregister_unit_rule(*classes: type[nn.Module]) -> None:
    """Undo :func:`register_unit_rule` for ``classes`` (a class without a registered rule is left as it is)."""
    for cls in classes:
        _UNIT_RULES.pop(cls, None)


class _PathFlow(ImposeGates):
    """On a unit-weight network: impose the gates and winners of an input (or, with none given, let every
    gate and every input of a max-pool window pass), and sum each ReLU call's output."""

    def __init__(self, gates: Mapping[str, Tensor] | None, pool_indices: Mapping[str, Tensor] | None) -> None:
        super().__init__(gates or {}, pool_indices)
        self.all_on = gates is None
        self.sums: dict[str, Tensor] = {}

    def relu(self, site, module, q):
        if self.all_on:
            z = q
        elif isinstance(module, LEAKY_LAYERS):  # a path is active where its gates are on, as for ReLU
            self.seen.add(site)
            z = q * self.gates[site].to(q.dtype)
        else:
            z = super().relu(site, module, q)
        self.sums[site] = z.flatten(1).sum(1)
        return z

    def max_pool(self, site, module, x, out):
        return _window_sum(module, x, site) if self.all_on else super().max_pool(site, module, x, out)

    def linear_op(self, name, func, args, kwargs, dependent, where):
        return _unit_op(name, func, args, kwargs, dependent, where)


# torch's own layers without weights: their calls (F.pad, F.interpolate, F.dropout, ...) are counted by _unit_op
_STRUCTURAL_LAYERS = (nn.ReLU, nn.Flatten, nn.Unflatten, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
                      nn.ZeroPad1d, nn.ZeroPad2d, nn.ConstantPad1d, nn.ConstantPad2d, nn.Upsample,
                      nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d, nn.Sequential, nn.ModuleList, nn.ModuleDict)
# how the model's own code maps tensors between its layers, in unit weights (count_paths): a path crosses every
# non-zero weight once with weight 1, constants (biases) carry no paths
_STRUCTURAL = frozenset("""
    sum cat concat concatenate stack hstack vstack view view_as reshape reshape_as flatten unflatten permute
    transpose swapaxes swapdims t T mT contiguous clone squeeze unsqueeze expand expand_as repeat tile flip fliplr
    flipud roll narrow chunk split tensor_split unbind movedim moveaxis select getitem iter index_select gather
    take take_along_dim pixel_shuffle pixel_unshuffle channel_shuffle fold unfold diagonal tril triu
    broadcast_to sum_to_size as_strided to type type_as float double half bfloat16 cpu cuda dropout dropout1d
    dropout2d dropout3d alpha_dropout feature_alpha_dropout upsample_nearest
""".split())
_ADDITIVE = frozenset("add iadd radd sub isub rsub".split())
_SIGNS = frozenset("neg positive pos".split())
_SCALINGS = frozenset("mul multiply imul rmul div divide true_divide truediv itruediv".split())
_WEIGHTED = frozenset("""
    matmul rmatmul mm bmm mv dot inner outer einsum tensordot kron linear conv1d conv2d conv3d conv_transpose1d
    conv_transpose2d conv_transpose3d
""".split())


def _unit_op(name, func, args, kwargs, dependent, where):
    """The unit-weight version of one operation of the model's own code on path counts (``None``: the
    operation itself, which is structural), or a ValueError naming what count_paths cannot count."""
    inplace = name in ("iadd", "isub", "imul", "itruediv") or getattr(func, "__name__", "").endswith("_")
    dep_ids = {id(t) for t in dependent}

    def is_dep(a):
        return isinstance(a, Tensor) and id(a) in dep_ids

    if name in _STRUCTURAL:
        return None
    if name == "pad":  # a constant pad value is a bias: no paths start there
        return F.pad(*args[:2], **{k: v for k, v in kwargs.items() if k != "value"}) if \
            kwargs.get("mode", args[2] if len(args) > 2 else "constant") == "constant" else func(*args, **kwargs)
    if name in ("interpolate", "upsample"):
        mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
        if mode in ("nearest", "nearest-exact"):
            return None  # each output copies one input: unit weights already
        if mode in ("linear", "bilinear", "trilinear"):
            out = _interpolate_pattern(args, kwargs)
        else:
            raise ValueError(
                f"count_paths: the forward of {where} interpolates with mode={mode!r}; "
                "count_paths counts paths through nearest, (bi/tri)linear interpolation only. Use one of them, "
                "or count the network without this step.")
    elif name in _ADDITIVE:
        terms = [a if is_dep(a) else None for a in args[:2]]
        kept = [t for t in terms if t is not None]
        out = kept[0] if len(kept) == 1 else kept[0] + kept[1]  # a - b: the paths of a and of b
        out = out.expand(torch.broadcast_shapes(*(a.shape for a in args[:2] if isinstance(a, Tensor)))).clone()
    elif name in _SIGNS or name == "batch_norm":
        out = args[0].clone()
    elif name in _SCALINGS:
        first = args[0]
        dep = first if is_dep(first) else args[1]
        other = args[1] if dep is first else first
        out = dep * torch.ones_like(other) if isinstance(other, Tensor) else dep.clone()
    elif name == "mean":
        out = torch.sum(*args, **kwargs)
    elif name in ("avg_pool1d", "avg_pool2d", "avg_pool3d"):
        out = _functional_window_sum(func, args, kwargs)
    elif name.startswith("adaptive_avg_pool"):
        x, size = args[0], kwargs.get("output_size", args[1] if len(args) > 1 else None)
        pooled = func(x, size)
        ins, outs = x.shape[2:], pooled.shape[2:]
        if any(i % o for i, o in zip(ins, outs)):
            raise ValueError(f"count_paths: adaptive pooling in {where} maps {tuple(ins)} to {tuple(outs)} "
                             f"with unequal windows,; path counts need equal windows")
        out = pooled * math.prod(i // o for i, o in zip(ins, outs))
    elif name in _WEIGHTED:
        bias_at = {"linear": 2, "conv1d": 2, "conv2d": 2, "conv3d": 2, "conv_transpose1d": 2,
                   "conv_transpose2d": 2, "conv_transpose3d": 2}.get(name)
        new_args = [torch.ones_like(a) if isinstance(a, Tensor) and not is_dep(a) else a for a in args]
        new_kwargs = {k: torch.ones_like(v) if isinstance(v, Tensor) and not is_dep(v) else v
                      for k, v in kwargs.items()}
        if bias_at is not None:
            if len(new_args) > bias_at:
                new_args[bias_at] = None
            new_kwargs.pop("bias", None)
        out = func(*new_args, **new_kwargs)
    else:
        raise ValueError(
            f"count_paths: the forward of {where} applies {name}, which count_paths does not "
            "know how to count paths through (it would silently keep that operation's weights). Count a network "
            "whose forward uses layers (nn.Linear, nn.Conv2d, pools, nn.Flatten) and sums, views and "
            "concatenations between them.")
    if inplace:
        return args[0].copy_(out)
    return out


def _functional_window_sum(func, args, kwargs) -> Tensor:
    """F.avg_pool{1,2,3}d with its arguments, as each window's plain sum (divisor 1)."""
    params = ["input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]
    bound = dict(zip(params, args), **kwargs)
    x = bound.pop("input")
    bound["count_include_pad"] = True
    if func.__name__ == "avg_pool1d" or x.dim() == 3:
        k = bound.get("kernel_size")
        k = k[0] if isinstance(k, (tuple, list)) else k
        pool = nn.AvgPool1d(k, bound.get("stride") or None, bound.get("padding", 0), bound.get("ceil_mode", False))
        return _window_sum(pool, x, "functional avg_pool1d")
    bound["divisor_override"] = 1
    if x.dim() == 5:
        return F.avg_pool3d(x, **bound)
    return F.avg_pool2d(x, **bound)


def _interpolate_pattern(args, kwargs) -> Tensor:
    """(Bi/tri)linear interpolation with every non-zero weight 1: the interpolation of the identity along each
    spatial axis gives that axis' weights; their non-zero pattern is applied axis by axis (separable)."""
    params = ["input", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", "antialias"]
    bound = dict(zip(params, args), **kwargs)
    x = bound.pop("input")
    out_shape = F.interpolate(x[:1, :1], **bound).shape[2:]
    sizes, scales = bound.get("size"), bound.get("scale_factor")
    out = x
    for axis, (n_in, n_out) in enumerate(zip(x.shape[2:], out_shape)):
        scale = scales[axis] if isinstance(scales, (tuple, list)) else scales
        eye = torch.eye(n_in, dtype=x.dtype, device=x.device).unsqueeze(1)  # (n_in, 1, n_in): one signal each
        weights = F.interpolate(eye, size=None if scale is not None and sizes is None else n_out,
                                scale_factor=None if sizes is not None or scale is None else scale,
                                mode="linear", align_corners=bound.get("align_corners"),
                                recompute_scale_factor=bound.get("recompute_scale_factor"))
        pattern = (weights[:, 0, :] != 0).to(x.dtype)  # (n_in, n_out)
        out = torch.movedim(torch.movedim(out, 2 + axis, -1) @ pattern, -1, 2 + axis)
    return out


def count_paths(model: nn.Module, x: Tensor | None = None, input_shape: tuple[int, ...] | None = None,
                batch_size: int = 250) -> PathCount:
    """Count the paths of any supported network, and the active ones for inputs ``x``, without enumerating them.

    Runs a unit-weight copy of the network (every edge weight 1, no biases, float64) on an all-ones
    input. For the total count every gate is on and every max-pool window passes all its inputs;
    for input ``x`` the copy runs with ``x``'s gates and max-pool winners imposed (GaLU mode), so
    each unit receives the number of active paths reaching it. Give ``x`` (``(N, ...)``) or
    ``input_shape`` (one input's shape, without the batch dimension).
    """
    if x is None and input_shape is None:
        raise ValueError("give the inputs x or the input_shape of one input")
    shape = tuple(x.shape[1:]) if x is not None else tuple(input_shape)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    unit = unit_network(model).to(device)
    ones = torch.ones((1, *shape), dtype=torch.float64, device=device)

    def run(gates=None, pools=None, n=1) -> dict[str, Tensor]:  # paths reaching each layer, per input
        flow = _PathFlow(gates, pools)
        with torch.no_grad(), instrument(unit, flow):
            flow.sums["output"] = unit(ones.expand(n, *shape)).flatten(1).sum(1)
        return flow.sums

    totals = run()
    active = None
    if x is not None:
        with torch.no_grad():
            recs = (record_gates(model, chunk) for chunk in x.split(batch_size))  # one chunk at a time
            active = torch.cat([torch.stack(list(run(r.gates, r.pool_indices, len(r.output)).values()), 1).cpu()
                                for r in recs])
    return PathCount(layers=list(totals), total=torch.stack([t[0] for t in totals.values()]).cpu(), active=active)
