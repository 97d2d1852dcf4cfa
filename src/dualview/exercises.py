"""Self-checks for the exercises of the student notebooks: ``check("ex-paths-count", answer)``.

A check says whether an answer is right (within a tolerance) without showing the solution, and says
"not answered yet" for an empty answer (``None`` or ``...``). Expected answers are computed here, never
typed in: a function is compared with the library's implementation on random inputs; a number that
depends on a trained network is recomputed from the network and data the notebook passes to ``check``.
"""
from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable, NamedTuple

import torch

__all__ = ["Check", "check", "exercises", "fill_in"]


class Check(NamedTuple):
    """The verdict of :func:`check`: ``correct`` is True, False, or None (not answered yet)."""

    exercise: str
    correct: bool | None
    message: str

    def __repr__(self) -> str:
        mark = {True: "right", False: "not right yet", None: "not answered yet"}[self.correct]
        return f"{self.exercise}: {mark}. {self.message}".strip()

    def __bool__(self) -> bool:
        return bool(self.correct)


_CHECKS: dict[str, tuple[str, Callable[..., tuple[bool, str]]]] = {}


def _exercise(label: str, expects: str):
    def register(fn):
        _CHECKS[label] = (expects, fn)
        return fn
    return register


def exercises() -> dict[str, str]:
    """The exercises that have a self-check, by label, and what each expects as its answer."""
    return {label: expects for label, (expects, _) in _CHECKS.items()}


def check(exercise: str, answer: Any, **given: Any) -> Check:
    """Check ``answer`` to ``exercise`` (its label, e.g. ``"ex-paths-count"``); ``given`` are what the
    exercise's check needs from the notebook (a trained network, the test images), as its cell passes them."""
    if exercise not in _CHECKS:
        raise ValueError(f"no self-check for exercise {exercise!r}; the exercises with one are "
                         f"{sorted(_CHECKS)}")
    expects, fn = _CHECKS[exercise]
    if answer is None or answer is Ellipsis:
        return Check(exercise, None, f"Replace the ... of the answer cell with {expects}.")
    try:
        inspect.signature(fn).bind(answer, **given)
    except TypeError as error:
        raise ValueError(f"check({exercise!r}, answer, ...): {error}; its answer cell passes what the check "
                         f"needs ({expects})") from None
    try:
        correct, message = fn(answer, **given)
    except Exception as error:  # noqa: BLE001  (a student's function or value may fail in any way)
        return Check(exercise, False, f"The answer should be {expects}; using it raised {error!r}.")
    return Check(exercise, bool(correct), message)


def fill_in(name: str, answer: Any, expected: Any, *, rtol: float = 1e-5, atol: float = 1e-8) -> Check:
    """The self-check of a fill-in cell inside a chapter: ``answer`` (what the reader computed by hand or with
    a line of code) against ``expected`` (what the library computes, in the check cell itself). Numbers,
    tensors, arrays and tuples or lists of them are compared within ``rtol``/``atol``; booleans, integers and
    strings exactly. The verdict never shows the expected value; ``...`` or None is "not answered yet"."""
    if answer is None or answer is Ellipsis:
        return Check(name, None, "Replace the ... in the cell above with your answer and run both cells again.")
    problem = _mismatch(answer, expected, rtol, atol)
    if problem:
        return Check(name, False, problem)
    return Check(name, True, "Your answer agrees with the library's computation.")


def _mismatch(answer: Any, expected: Any, rtol: float, atol: float, where: str = "") -> str:
    """Why ``answer`` differs from ``expected`` (without showing it), or "" when they agree."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(answer, (tuple, list)) or len(answer) != len(expected):
            return f"Give {len(expected)} values{where}, as a tuple."
        for k, (a, e) in enumerate(zip(answer, expected)):
            if problem := _mismatch(a, e, rtol, atol, f" (item {k})"):
                return problem
        return ""
    if isinstance(expected, (str, bool)):
        return "" if answer == expected and type(answer) is type(expected) else f"Not right yet{where}."
    try:
        got = torch.as_tensor(answer, dtype=torch.float64)
        want = torch.as_tensor(expected, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return f"Expected a number or an array of numbers{where}, got {type(answer).__name__}."
    if got.shape != want.shape:
        return f"Your answer{where} has shape {tuple(got.shape)}; the expected one has {tuple(want.shape)}."
    if isinstance(expected, numbers.Integral) and not isinstance(expected, bool):
        return "" if got.item() == want.item() else f"Not right yet{where}: a count is exact."
    if not torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=False):
        return f"Not right yet{where} (tolerance: relative {rtol:g}, absolute {atol:g})."
    return ""


def _number(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"expected one number, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _close(answer: Any, expected: float, rel: float = 1e-6, abs_: float = 0.0) -> bool:
    return math.isclose(_number(answer), expected, rel_tol=rel, abs_tol=abs_)


@_exercise("ex-paths-count", "a function paths(widths) of the layer sizes [d_in, w_1, ..., C] that returns "
                             "the number of paths, bias paths included")
def _check_paths_count(answer) -> tuple[bool, str]:
    from dualview.paths import fc_path_count

    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        depth = int(torch.randint(2, 6, (1,), generator=gen, device="cpu"))
        widths = [int(w) for w in torch.randint(1, 10, (depth,), generator=gen, device="cpu")]
        if not _close(answer(list(widths)), fc_path_count(widths, bias=True), rel=0):
            return False, f"Your function gives a different count for the layer sizes {widths}."
    return True, "Your function agrees with dualview.paths.fc_path_count on 30 random networks."


@_exercise("ex-patterns", "the number of distinct gate patterns (an int); pass the network and the test "
                          "images as check(..., model=..., x=...)")
def _check_patterns(answer, *, model: torch.nn.Module, x: torch.Tensor) -> tuple[bool, str]:
    from dualview.gates import record_gates

    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            record = record_gates(model, x)
    finally:
        model.train(was_training)
    pattern = torch.cat([(q > 0).flatten(1) for q in record.preactivations.values()], dim=1)
    expected = len(torch.unique(pattern, dim=0))
    if _close(answer, expected, rel=0):
        return True, f"That is the number of distinct patterns among these {len(x)} images."
    return False, f"Count the distinct rows of the concatenated gates of all {len(x)} images."


@_exercise("ex-resnet-count", "a tuple (number of paths, share of paths through all four blocks, share of "
                              "paths that skip block 2)")
def _check_resnet_count(answer) -> tuple[bool, str]:
    from dualview.paths import resnet_path_count

    if len(answer) != 3:
        return False, "Give three numbers: (paths, share through all blocks, share skipping block 2)."
    total = resnet_path_count(784, 100, 2, 4)
    through_all = 784 * 100 ** ((4 + 2) * 2 - 1) / total  # the sub-network with all four blocks
    skip_2 = resnet_path_count(784, 100, 2, 3) / total  # the ResNet without block 2
    parts = ["the number of paths", "the share through all blocks", "the share skipping block 2"]
    wrong = [part for part, a, e in zip(parts, answer, (total, through_all, skip_2)) if not _close(a, e, rel=1e-4)]
    if wrong:
        return False, "Check " + " and ".join(wrong) + " (relative tolerance 1e-4)."
    return True, "All three agree with dualview.paths.resnet_path_count (relative tolerance 1e-4)."


@_exercise("ex-dgn-temperature", "a function slope(q, temperature) returning the derivative of "
                                 "sigmoid(q / temperature) with respect to q, elementwise on a tensor q")
def _check_soft_gate_slope(answer) -> tuple[bool, str]:
    gen = torch.Generator().manual_seed(0)
    for temperature in (0.1, 0.25, 1.0, 3.0):
        q = torch.randn(50, generator=gen, dtype=torch.float64, device="cpu") * 2 * temperature
        q.requires_grad_()
        (expected,) = torch.autograd.grad(torch.sigmoid(q / temperature).sum(), q)
        got = torch.as_tensor(answer(q.detach().clone(), temperature), dtype=torch.float64)
        if got.shape != q.shape or not torch.allclose(got, expected, rtol=1e-5, atol=1e-8):
            return False, f"At temperature {temperature} your slope differs from autograd's on random q."
    return True, "Your slope agrees with autograd's at four temperatures on random q (rtol 1e-5)."


@_exercise("ex-leveling-hc", "the log alpha (a number) at which P(z = 0) = P(z = 1) for the routing gates "
                             "of dualview.leveling.HardConcreteRouting")
def _check_hard_concrete_balance(answer) -> tuple[bool, str]:
    from dualview.leveling import HardConcreteRouting

    def gap(log_alpha: float) -> float:  # P(z = 0) - P(z = 1): decreasing in log alpha
        with torch.no_grad():
            gate = HardConcreteRouting(1, init_log_alpha=log_alpha)
            return float(gate.prob_zero() - gate.prob_one())

    low, high = -50.0, 50.0
    for _ in range(100):  # bisection on the library's closed forms
        mid = (low + high) / 2
        low, high = (mid, high) if gap(mid) > 0 else (low, mid)
    if _close(answer, (low + high) / 2, rel=0, abs_=1e-3):
        return True, "At that log alpha the two probabilities are equal (tolerance 1e-3)."
    side = "P(z = 0)" if gap(_number(answer)) > 0 else "P(z = 1)"
    return False, f"At your log alpha {side} is the larger of the two."


@_exercise("ex-npk-sigma", "a function constant(sigmas) of the list [sigma_1, ..., sigma_L] (one per weight layer) "
                           "returning c in E[NTK] = c * NPK")
def _check_ntk_npk_constant(answer) -> tuple[bool, str]:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):  # the constant written out: sum over layers of the product of the other layers' sigma^2
        depth = int(torch.randint(1, 6, (1,), generator=gen, device="cpu"))
        sigmas = [float(s) for s in torch.rand(depth, generator=gen, device="cpu") + 0.05]
        expected = sum(math.prod(s ** 2 for k, s in enumerate(sigmas) if k != l) for l in range(depth))
        if not _close(answer(list(sigmas)), expected, rel=1e-6):
            return False, f"For sigmas {[round(s, 3) for s in sigmas]} your constant differs."
    return True, "Your constant agrees with the sum over layers on 20 random depths and sigmas."


@_exercise("ex-conv-pool", "a function factor(d_in) returning the factor by which global average pooling "
                           "multiplies the NPK, compared with global sum pooling")
def _check_pool_factor(answer) -> tuple[bool, str]:
    for d_in in (1, 2, 7, 40, 196):
        if not _close(answer(d_in), 1.0 / d_in ** 2, rel=1e-9):
            return False, f"At d_in = {d_in} your factor is not the one the two features' 1/d_in give."
    return True, "Right: each of the two features carries one factor 1/d_in."


@_exercise("ex-npk-diag", "the average over the inputs of overlap(x, x)^(1/(L-1)) / w (a number); pass the "
                          "network and the inputs as check(..., model=..., x=...)")
def _check_geometric_share(answer, *, model: torch.nn.Module, x: torch.Tensor) -> tuple[bool, str]:
    from dualview.gates import record_gates

    with torch.no_grad():
        rec = record_gates(model.eval(), x)
    counts = torch.stack([g.flatten(1).double().sum(1) for g in rec.gates.values()], 1)  # (N, L - 1) gates on
    widths = torch.tensor([g[0].numel() for g in rec.gates.values()], dtype=torch.float64)
    expected = float(((counts / widths).prod(1) ** (1 / counts.shape[1])).mean())
    if _close(answer, expected, rel=1e-6):
        return True, f"That is the geometric mean of the layers' active shares, averaged over {len(x)} inputs."
    return False, "overlap(x, x) is the product of the per-layer counts of gates on; take its (L-1)-th root / w."
