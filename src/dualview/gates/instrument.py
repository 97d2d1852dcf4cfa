"""The instrumentation primitive :func:`instrument` (hooks, gate names, the guard, the rules) and the calls built
on it: :func:`record_gates`, :func:`run_with_gates`, :func:`active_share`."""
from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from functools import partial
from typing import Callable, Iterator, Mapping, Tuple

import torch
from torch import Tensor, nn

from dualview.gates.guard import _apply, _Guard, _tensors
from dualview.gates.layers import (
    _BUILTIN_LINEAR, _UNVERIFIED, CLIPPED_LAYERS, GATE_LAYERS, LEAKY_LAYERS, POOL_GATE_LAYERS, SMOOTH_LAYERS,
    SUPPORTED_LAYERS, TRANSFORMER_LAYERS, _check_affine, _smooth_blocks, check_batch, check_supported, model_output,
)
from dualview.gates.rules import GateRecord, ImposeGates, Record, Rule

_INSTRUMENTED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()  # the modules of the blocks now open

#: A hook of the map: ``("pre", f)`` a forward pre-hook; ``("post", f)`` a forward hook, run also when the forward
#: raises; ``("returned", f)`` a forward hook run only when the forward returns.
_Hook = Tuple[str, Callable]


@contextlib.contextmanager
def instrument(model: nn.Module, *rules: Rule) -> Iterator[None]:
    """The one instrumentation primitive: inside the block, every forward pass of ``model`` applies the
    ``rules`` at its gates; on exit every hook is removed, also after a ``BaseException`` such as
    ``KeyboardInterrupt``. Parameters and modules are never touched.

    It checks the model (:func:`check_supported`), names each ReLU / max-pool *call* (``name``,
    ``name#1``, ... for a module called more than once in one forward), hands an in-place ReLU's input
    over before it is overwritten, and, during the model's own forward only (not in the rest of the
    ``with`` body), refuses every operation on input-dependent tensors that is not known to be linear
    (the whitelist of :class:`_Guard`; a functional ReLU only where a rule accepts it).
    Call the model itself, not a submodule, inside the block. Blocks on
    the same model (or a module of it) do not nest: combine the rules in one block instead.
    :func:`record_gates`, :func:`run_with_gates`, path counting and excitation pullbacks are built on it.
    The block's state and its hooks are an :class:`_Instrumentation`.
    """
    session = _Instrumentation(model, rules)
    try:
        session.attach()
        try:
            yield
        except TypeError as err:
            pending = session.guard.pending
            if pending is not None and err is not pending:
                raise pending from None
            raise
    finally:
        session.remove()


class _Instrumentation:
    """One :func:`instrument` block, as in Zennit's Composite: which hook goes on which module is decided once, up
    front, from the model's modules (:attr:`hooks`, a map module -> hooks); :meth:`attach` registers them and
    :meth:`remove` takes every one off again. The hooks are its methods, over the block's state:

    * ``guard``: the op guard (:class:`_Guard`; on during the root's forward: the tensors that depend on the input,
      the stack of modules being run);
    * ``depth``: how deep the root's forward is (its hooks run again when a module calls the root);
    * ``calls``: the site counter, each label's calls in this forward (``name``, ``name#1``, ...);
    * ``captured``: the inputs of in-place gates, kept before the gate overwrites them (by id of the gate);
    * ``scales``: the scale of each squeeze-and-excitation call, recorded by its sigmoid (by id of the block).
    """

    def __init__(self, model: nn.Module, rules: tuple[Rule, ...]) -> None:
        bad = [r for r in rules if not isinstance(r, Rule)]
        if bad:
            raise TypeError(f"instrument expects dualview.gates.Rule objects, got {bad!r}")
        smooth = bool(rules) and all(r.smooth for r in rules)
        leaky = bool(rules) and all(r.leaky for r in rules)
        named = list(model.named_modules()) if isinstance(model, nn.Module) else None  # one walk for the checks
        check_supported(model, clipped=bool(rules) and all(r.clipped for r in rules), smooth=smooth, _named=named,
                        leaky=leaky)
        self.modules = [m for _, m in named]
        if any(m in _INSTRUMENTED for m in self.modules):
            raise RuntimeError("dualview.gates.instrument is already active on this model (or a module of it); "
                               "do not nest the blocks: pass all rules to one block")
        self.guard = _Guard(rules, model)
        self.depth = 0
        self.calls: Counter[str] = Counter()
        self.captured: dict[int, Tensor] = {}
        self.scales: dict[int, Tensor] = {}
        self.gate_layers = GATE_LAYERS + CLIPPED_LAYERS + (SMOOTH_LAYERS if smooth else ()) + \
            (LEAKY_LAYERS if leaky else ())
        self.hooks = self._hook_map(model, named, rules, smooth, leaky)
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    # ----------------------------------------------------------------------------------------------
    # The hook map, decided up front

    def _hook_map(self, model: nn.Module, named: list[tuple[str, nn.Module]], rules: tuple[Rule, ...],
                  smooth: bool, leaky: bool) -> dict[nn.Module, list[_Hook]]:
        """Which hooks go on which module, in the order they run: the root's forward starts (``enter``) and ends
        (``leave``) the guard's watch; every module that is not one of torch's own affine layers is pushed on the
        guard's stack and popped after, gates, max-pools and channel gates applying the rules on their way out."""
        norm_rules = any(type(r).batch_norm is not Rule.batch_norm for r in rules)
        channel_gates, depth_drops = _smooth_blocks() if smooth else ((), ())
        transformer = TRANSFORMER_LAYERS if smooth else ()
        supported = SUPPORTED_LAYERS() + CLIPPED_LAYERS + (SMOOTH_LAYERS + depth_drops if smooth else ()) + \
            (LEAKY_LAYERS if leaky else ()) + transformer
        hooks: dict[nn.Module, list[_Hook]] = {model: [("pre", self.enter)]}
        inside: list[str] = []  # the insides of channel gates: not hooked (the block is trusted as a whole)
        for name, module in named:
            label = name or "<model>"
            if inside and any(name.startswith(p + ".") for p in inside):
                continue
            if type(module) in _BUILTIN_LINEAR and type(module) is not nn.Identity:
                # torch's own affine layers (their forward is torch's, check_supported made sure) are not
                # hooked: the guard checks the few calls they make (F.conv2d, F.batch_norm in eval, ...)
                # against the whitelist like any other, and hands them an in-place ReLU's output where they
                # read its input (nn.Identity makes no call: it keeps its hooks, which do that)
                if norm_rules and isinstance(module, nn.modules.batchnorm._BatchNorm):
                    hooks.setdefault(module, []).append(("returned", partial(self.at_norm, label=label)))
                continue
            if isinstance(module, transformer):
                inside.append(name)  # an attention's inside is the rule's (a LayerNorm has none)
                hooks.setdefault(module, []).extend([("pre", partial(self.push, label=label, trusted=True)),
                                                     ("post_kwargs", partial(self.at_transformer, label=label))])
                continue
            if type(module) in channel_gates:
                inside.append(name)
                hooks.setdefault(module.scale_activation, []).append(
                    ("returned", partial(self.record_scale, key=id(module))))
            post = partial(self.at_relu, label=label) if isinstance(module, self.gate_layers) else \
                partial(self.at_pool, label=label) if isinstance(module, POOL_GATE_LAYERS) else \
                partial(self.at_channel_gate, label=label) if type(module) in channel_gates else self.pop
            trusted = getattr(type(module), "linear_layer", False) or type(module) in channel_gates or \
                (not any(True for _ in module.children()) and isinstance(module, supported))
            hooks.setdefault(module, []).extend([("pre", partial(self.push, label=label, trusted=trusted)),
                                                 ("post", post)])
        hooks[model].append(("post", self.leave))
        return hooks

    def attach(self) -> None:
        """Register the hook map's hooks (each handle kept for :meth:`remove`) and mark the modules as taken."""
        for module, entries in self.hooks.items():
            for kind, hook in entries:
                self.handles.append(
                    module.register_forward_pre_hook(hook) if kind == "pre" else
                    module.register_forward_hook(hook, with_kwargs=True, always_call=True) if kind == "post_kwargs"
                    else module.register_forward_hook(hook, always_call=kind == "post"))
        _INSTRUMENTED.update(self.modules)

    def remove(self) -> None:
        """Take every hook off, free the modules, and turn the guard off if a forward was left half-way."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        _INSTRUMENTED.difference_update(self.modules)
        if self.depth > 0:  # a BaseException left the forward before its last hook ran
            self.guard.__exit__(None, None, None)
            self.depth = 0

    # ----------------------------------------------------------------------------------------------
    # The hooks

    def site(self, label: str) -> str:
        """This call's site name: ``label`` for a module's first call in the forward, then ``label#1``, ..."""
        k = self.calls[label]
        self.calls[label] += 1
        return label if k == 0 else f"{label}#{k}"

    def enter(self, mod, args):  # the root model's forward starts: names restart, the guard is on
        guard = self.guard
        if self.depth == 0:
            self.calls.clear()
            guard.dependent.clear()
            guard.stale.clear()
            guard.pending = None
            guard.__enter__()
            guard.mark(list(_tensors(args, {})))
        self.depth += 1

    def leave(self, mod, args, out):
        self.depth -= 1
        if self.depth == 0:
            self.guard.__exit__(None, None, None)
            self.guard.dependent.clear()
            self.guard.stale.clear()

    def push(self, mod, args, label, trusted):
        guard, swapped = self.guard, None
        if self.depth and guard.stale:
            swapped = guard.fresh(args, {})
            if swapped is not None:
                args = swapped[0]
        if type(mod) in _UNVERIFIED and args and isinstance(args[0], Tensor):
            guard.internal += 1
            try:
                _check_affine(mod, args[0], label)
            finally:
                guard.internal -= 1
            _UNVERIFIED.discard(type(mod))  # checked once per class
        guard.stack.append((label, mod, trusted))
        if isinstance(mod, self.gate_layers) and getattr(mod, "inplace", False):
            # an in-place ReLU overwrites its input: it gets a copy, so that its input keeps the
            # pre-activation for the rules; a later read of that input gets the ReLU's output instead
            self.captured[id(mod)] = args[0]
            copied = args[0].clone()
            guard.mark(copied)
            return (copied, *args[1:])
        return args if swapped is not None else None

    def pop(self, mod, args, out):
        guard = self.guard
        if guard.stack and guard.stack[-1][1] is mod:
            guard.stack.pop()
        if self.depth and any(guard.depends(t) for t in _tensors(args, {})):
            guard.mark(out)

    def at_relu(self, mod, args, out, label):
        q, s = self.captured.pop(id(mod), args[0]), self.site(label)
        new = _apply(self.guard, lambda rule: rule.relu_output(s, mod, q, out), f"ReLU call '{s}'")
        self.pop(mod, args, out if new is None else new)
        if getattr(mod, "inplace", False):
            self.guard.stale[id(q)] = (weakref.ref(q), out if new is None else new)
        return new

    def at_pool(self, mod, args, out, label):
        s = self.site(label)
        new = _apply(self.guard, lambda rule: rule.max_pool(s, mod, args[0], out), f"max-pool call '{s}'")
        self.pop(mod, args, out if new is None else new)
        return new

    def at_norm(self, mod, args, out, label):  # the guard checked the layer's own call (F.batch_norm, eval mode)
        if not self.depth or not args or not isinstance(args[0], Tensor):
            return None
        x = args[0]
        if self.guard.stale:  # an in-place ReLU's input read again: the layer read the ReLU's output
            swapped = self.guard.fresh(args, {})
            x = x if swapped is None else swapped[0][0]
        new = _apply(self.guard, lambda rule: rule.batch_norm(mod, x, out), f"BatchNorm call '{label}'")
        if new is not None:
            self.guard.mark(new)
        return new

    def at_transformer(self, mod, args, kwargs, out, label):  # a LayerNorm or an attention (smooth rules only)
        guard, s = self.guard, self.site(label)
        if out is None or (self.depth and not any(guard.depends(t) for t in _tensors(args, kwargs))):
            self.pop(mod, args, out)  # the forward raised; or nothing here depends on the input
            return None
        if guard.stale:
            swapped = guard.fresh(args, kwargs)
            args, kwargs = (args, kwargs) if swapped is None else swapped
        if isinstance(mod, nn.LayerNorm):
            new = _apply(guard, lambda rule: rule.layer_norm(s, mod, args[0], out), f"LayerNorm call '{s}'")
        else:
            new = _apply(guard, lambda rule: rule.attention(s, mod, args, kwargs, out), f"attention call '{s}'")
        self.pop(mod, args, out if new is None else new)
        guard.mark(out if new is None else new)  # (also where the inputs came as keywords)
        return new

    def record_scale(self, mod, args, out, key):  # a channel gate's sigmoid: its output is the block's scale
        self.scales[key] = out

    def at_channel_gate(self, mod, args, out, label):  # out = x * scale, the scale recorded by its sigmoid's hook
        s = self.site(label)
        scale = self.scales.pop(id(mod), None)
        if scale is None:  # the block left before its sigmoid ran (an exception): nothing to replace
            self.pop(mod, args, out)
            return None
        new = _apply(self.guard, lambda rule: rule.channel_gate(s, mod, args[0], scale), f"channel gate '{s}'")
        self.pop(mod, args, out if new is None else new)
        return new


def record_gates(model: nn.Module, x: Tensor) -> GateRecord:
    """Run ``model(x)`` and record every ReLU's pre-activation and every max-pool's winners.

    Gradients flow through the recorded pre-activations (wrap the call in ``torch.no_grad()``
    when you do not need them). See :class:`GateRecord` for the naming of layers.
    """
    check_batch(x)
    rule = Record()
    with instrument(model, rule):
        out = model_output(model, x)
    return GateRecord(output=out, preactivations=rule.preactivations, pool_indices=rule.pool_indices,
                      ceilings=rule.ceilings)


def run_with_gates(model: nn.Module, x: Tensor, gates: Mapping[str, Tensor],
                   pool_indices: Mapping[str, Tensor] | None = None,
                   preactivations: dict[str, Tensor] | None = None,
                   saturated: Mapping[str, Tensor] | None = None) -> Tensor:
    """Run ``model`` on ``x`` with every ReLU replaced by a GaLU fed the given ``gates``.

    Each ReLU call ``name`` outputs ``q * gates[name]`` where ``q`` is its pre-activation on ``x``;
    gates may be bool (hard) or float (soft, e.g. ``sigmoid(beta * q_gating)``), and broadcast
    against ``q``. If ``pool_indices`` is given, every max-pool takes the given winners instead of
    its own maxima (otherwise it pools ``x``'s own values). With the model's own gates and
    winners the output equals ``model(x)``; with those of another input it is that input's active
    sub-network applied to ``x`` (Section 2.2 of :cite:`satkiewicz2025tapping`). A dict passed as
    ``preactivations`` receives the pre-activation ``q`` of every ReLU call, by name
    (rules :class:`ImposeGates` and :class:`Record`). A hard-clipped ReLU call outputs
    ``q * gates[name] + t * saturated[name]`` (``saturated``: ``record_gates(model, x).saturated`` of the
    input whose pieces are held fixed; required when the model has such calls).
    """
    check_batch(x)
    impose = ImposeGates(gates, pool_indices, saturated)
    rules = (impose,) if preactivations is None else (Record(preactivations, winners=False), impose)
    with instrument(model, *rules):
        out = model_output(model, x)
    impose.check_complete()
    return out


def active_share(model: nn.Module, x: Tensor, batch_size: int = 500,
                 per_layer: bool = True) -> dict[str, Tensor] | Tensor:
    """Per input, the share of active gates (ReLU units with ``q > 0``; hard-clipped ones with ``0 < q < t``).

    ``per_layer=True``: one share per ReLU call, ``{name: (N,) tensor}``; ``per_layer=False``: the
    share over all hidden units of every ReLU call together, a ``(N,)`` tensor (the share of active
    neurons of Table 3 of :cite:`szymanski2020switched`). Processes
    ``x`` in chunks of ``batch_size`` without keeping pre-activations, so it runs on whole test sets.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    parts: dict[str, list[Tensor]] = {}
    sizes: dict[str, int] = {}
    with torch.no_grad():
        for chunk in x.split(batch_size):
            for name, g in record_gates(model, chunk).gates.items():
                parts.setdefault(name, []).append(g.flatten(1).sum(1).cpu())
                sizes[name] = g[0].numel()
    on = {k: torch.cat(v).double() for k, v in parts.items()}
    if per_layer:
        return {k: on[k] / sizes[k] for k in on}
    return sum(on.values()) / sum(sizes.values())
