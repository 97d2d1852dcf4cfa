"""What every comparative sentence of the book rests on: seeds, confidence intervals, paired comparisons.

One run decides nothing. A chapter that says "A beats B" or "A matches B" runs the experiment over several
seeds and/or bootstraps over its test points, shows the interval, and asserts only what the interval
supports:

- :func:`over_seeds` runs one experiment for several seeds (each seeded with :func:`dualview.seed_everything`);
- :func:`mean_interval` is the Student-t interval of a mean over seeds;
- :func:`proportion_interval` is the Wilson score interval of an accuracy on ``n`` test points;
- :func:`bootstrap_interval` is the percentile bootstrap over test points (1-D scores);
- :func:`seeds_points_interval` is the interval of a mean over a ``seeds x points`` matrix (every seed scored
  on the same test points): a t interval whose variance has a seed part and a test-point part, with
  ``seeds - 1`` degrees of freedom. With 2-5 seeds a bootstrap over seeds cannot estimate the seed
  variance (it calls a true zero difference "above" or "below" in 8-15 % of experiments at a nominal 5 %);
  this interval's coverage is checked by a simulation in ``tests/test_stats.py``;
- :func:`interval` picks the right one of these for 1-D or 2-D scores;
- :func:`paired_comparison` compares two methods scored on the same test points (and seeds) through the
  interval of their difference, with a verdict: ``"above"``, ``"below"`` or ``"within noise"``;
- :func:`above`, :func:`below` and :func:`inside` turn an interval or a comparison into :class:`Evidence`:
  whether a sentence holds, and its *margin* (the interval's distance from the threshold, in half-widths);
- :func:`claim` asserts what a chapter's sentence says of such a result, records it with its margin for the
  claims report (and only prints it in a smoke run, whose sizes support no claim).

Results are small dataclasses (:class:`Interval`, :class:`Comparison`) that print as the book shows them.

Identities are checked, not compared: :func:`relative_error` is the one error measure every identity check of
the book (chapters and tests) reports.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from dualview import seed_everything, smoke_scale

__all__ = [
    "Interval",
    "Comparison",
    "over_seeds",
    "mean_interval",
    "proportion_interval",
    "bootstrap_interval",
    "seeds_points_interval",
    "interval",
    "paired_comparison",
    "relative_error",
    "Evidence",
    "above",
    "below",
    "inside",
    "claim",
]


@dataclass(frozen=True)
class Evidence:
    """What one comparative sentence rests on: whether it holds, and with how much room.

    ``margin`` is the distance of the interval's deciding end from the claim's threshold, in half-widths of
    the interval (``(low - threshold) / half_width`` for "above"): 0 at the edge, negative when the claim
    fails, 1 when the interval clears the threshold by one half-width, which is the least an asserted claim
    needs (another seed or another CPU moves an interval by about its half-width). ``None``: a check
    without an interval (an identity or a count), which has no margin to report.
    """

    holds: bool
    margin: float | None
    detail: str

    def __bool__(self) -> bool:
        return self.holds


def _deciding(x: Any, what: str) -> Interval:
    if isinstance(x, Comparison):
        return x.difference
    if isinstance(x, Interval):
        return x
    raise TypeError(f"stats.{what} takes an Interval or a Comparison (from stats.interval, "
                    f"stats.paired_comparison, ...), got {type(x).__name__}; a bare number has no interval")


def _margin(distance: float, half_width: float) -> float:
    if half_width > 0:
        return float(distance / half_width)
    return math.inf if distance > 0 else -math.inf if distance < 0 else 0.0


def _label(x: Any) -> str:
    if isinstance(x, Comparison):
        return f"{x.name_a} − {x.name_b} = {x.difference.format(4)}"
    return x.format(4)


def _side(x: Interval | Comparison, threshold: float | Interval, side: str) -> Evidence:
    """``x`` above (``side="above"``) or below ``threshold``; a threshold interval counts by its near end."""
    iv = _deciding(x, side)
    sign = 1 if side == "above" else -1
    if isinstance(threshold, Interval):
        t, hw = (threshold.high if sign > 0 else threshold.low), max(iv.half_width, threshold.half_width)
        what = f"{side} the interval {threshold.format(4)}"
    else:
        t, hw, what = float(threshold), iv.half_width, f"{side} {threshold:g}"
    distance = sign * ((iv.low if sign > 0 else iv.high) - t)
    return Evidence(distance > 0, _margin(distance, hw), f"{_label(x)} {what}")


def above(x: Interval | Comparison, threshold: float | Interval = 0.0) -> Evidence:
    """Evidence that ``x`` (an interval, or a comparison's difference ``a - b``) lies above ``threshold``:
    its lower end is above it. ``threshold`` may itself be an interval: then ``x`` lies above its upper end
    (two intervals apart), and the margin is counted in the larger of the two half-widths."""
    return _side(x, threshold, "above")


def below(x: Interval | Comparison, threshold: float | Interval = 0.0) -> Evidence:
    """Evidence that ``x`` lies below ``threshold`` (its upper end below it); see :func:`above`."""
    return _side(x, threshold, "below")


def inside(x: Interval | Comparison, low: float, high: float) -> Evidence:
    """Evidence that the whole interval of ``x`` lies inside ``[low, high]`` (e.g. "A matches B within 5 %"):
    the margin is the smaller room at either end, in half-widths."""
    iv = _deciding(x, "inside")
    room = min(iv.low - low, high - iv.high)
    return Evidence(iv.low > low and iv.high < high, _margin(room, iv.half_width),
                    f"{_label(x)} inside [{low:g}, {high:g}]")


CLAIMS_ENV = "DUALVIEW_CLAIMS"  # a JSON-lines file each claim is appended to (the notebook harness sets it)
CLAIMS_MODE_ENV = "DUALVIEW_CLAIMS_MODE"  # "report": record every claim, raise on none (make robustness)


def claim(evidence: bool | Evidence | Sequence[Evidence], message: str) -> None:
    """Assert a comparative claim of the book's prose: raise an ``AssertionError`` with ``message`` if it fails.

    ``evidence`` is what the sentence rests on: an :class:`Evidence` from :func:`above`, :func:`below` or
    :func:`inside`, or a list of them (the claim holds when every one holds; its margin is the smallest).
    A bare ``bool`` is a check without an interval: it holds or not, and has no margin (the robustness
    report lists such claims; use it for facts that do not depend on training noise).

    Every claim is recorded, with its margin, in the file named by ``$DUALVIEW_CLAIMS`` (the notebook
    harness sets it; ``python scripts/notebooks.py claims`` reports claims that fail or hold with
    margin < 1). With ``$DUALVIEW_CLAIMS_MODE=report`` (``make robustness``) a failed claim is recorded
    and printed instead of raised, so that one run lists every claim of a chapter. In a smoke run (see
    :func:`dualview.smoke_scale`), a profile's code path at sizes that run in seconds, the numbers support
    no claim, so the claim is printed with its outcome instead. Identities (an error below a tolerance)
    stay plain assert statements: they hold at every scale.
    """
    if isinstance(evidence, Evidence):
        parts = [evidence]
    elif isinstance(evidence, (bool, np.bool_)) or (isinstance(evidence, torch.Tensor) and evidence.numel() == 1
                                                     and evidence.dtype == torch.bool):
        parts = [Evidence(bool(evidence), None, "a check without an interval")]
    else:
        parts = list(evidence)
        if not parts or not all(isinstance(e, Evidence) for e in parts):
            raise TypeError("stats.claim takes a bool, an Evidence (stats.above / below / inside) or a non-empty "
                            f"list of Evidence, got {evidence!r}")
    holds = all(e.holds for e in parts)
    margins = [e.margin for e in parts]
    margin = None if any(m is None for m in margins) else min(margins)
    if smoke_scale():
        print(f"smoke scale, claim not checked ({'holds' if holds else 'fails'} here): {message}")
        return
    _record_claim(message, holds, margin, [e.detail for e in parts])
    if not holds:
        if os.environ.get(CLAIMS_MODE_ENV) == "report":
            print(f"CLAIM FAILS (recorded, not raised: {CLAIMS_MODE_ENV}=report): {message}")
            return
        raise AssertionError(message + "".join(f"\n  {e.detail}" for e in parts if not e.holds))


def _record_claim(message: str, holds: bool, margin: float | None, details: list[str]) -> None:
    path = os.environ.get(CLAIMS_ENV)
    if not path:
        return
    import json

    m = None if margin is None else (margin if math.isfinite(margin) else (1e9 if margin > 0 else -1e9))
    line = json.dumps({"message": message, "holds": bool(holds), "margin": m, "details": details})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|``: how far ``a`` is from the reference ``b``, relative to the reference's
    largest entry (``b`` all zero: the absolute error ``max |a|`` divided by the smallest positive float,
    so any difference shows as huge). ``a`` and ``b`` must have the same shape."""
    if a.shape != b.shape:
        raise ValueError(f"relative_error compares tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().clamp_min(torch.finfo(torch.float64).tiny) if b.numel() else 1.0
    return float((a - b).abs().max() / scale) if a.numel() else 0.0


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval ``[low, high]`` at confidence ``level``.

    ``n`` counts what the interval was computed over (seeds, test points, or ``"seeds x points"``),
    ``method`` names how (shown beside every number in the book).
    """

    estimate: float
    low: float
    high: float
    level: float
    n: int | str
    method: str

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        """True when ``value`` lies inside the interval (the data cannot tell it from the estimate)."""
        return self.low <= value <= self.high

    def format(self, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
        """``"93.2 [92.8, 93.6]"`` with ``digits`` decimals; ``scale=100`` turns shares into percent."""
        f = lambda v: f"{v * scale:.{digits}f}{unit}"  # noqa: E731
        return f"{f(self.estimate)} [{f(self.low)}, {f(self.high)}]"

    def __str__(self) -> str:
        return f"{self.format(digits=4)} ({self.level:.0%} CI, {self.method}, n={self.n})"


@dataclass(frozen=True)
class Comparison:
    """Two methods scored on the same test points (and seeds): the interval of ``a - b`` and its verdict."""

    difference: Interval
    name_a: str
    name_b: str

    @property
    def above(self) -> bool:
        """``a`` is above ``b`` at the interval's confidence: the whole interval of ``a - b`` is above 0."""
        return self.difference.low > 0

    @property
    def below(self) -> bool:
        """``a`` is below ``b`` at the interval's confidence."""
        return self.difference.high < 0

    @property
    def within_noise(self) -> bool:
        """The interval of ``a - b`` contains 0: this run cannot tell the two apart."""
        return not (self.above or self.below)

    @property
    def verdict(self) -> str:
        return "above" if self.above else "below" if self.below else "within noise"

    def format(self, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
        d = self.difference
        return (f"{self.name_a} − {self.name_b} = {d.format(digits, scale, unit)} "
                f"({d.level:.0%} CI, {d.method}, n={d.n}): {self.name_a} {self.verdict}"
                + ("" if self.within_noise else f" {self.name_b}"))

    def __str__(self) -> str:
        return self.format(digits=4)


def _check_level(level: float) -> None:
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ValueError(f"level must be a confidence level strictly between 0 and 1 (e.g. 0.95), got {level!r}")


def _as_array(values: Any, name: str = "values") -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError(f"{name} is empty: an interval needs at least one value")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite entries; remove or fix them before computing an interval")
    return arr


def _one_seed_as_points(x: np.ndarray) -> np.ndarray:
    """A ``(1, points)`` matrix of one seed's scores as the 1-D ``(points,)``: there is no seed to resample."""
    return x[0] if x.ndim == 2 and x.shape[0] == 1 else x


def over_seeds(run: Callable[[int], Any], seeds: int | Sequence[int], *, base: int = 0,
               progress: bool = True) -> Any:
    """Run ``run(seed)`` for every seed, each after ``dualview.seed_everything(seed)``, and stack the results.

    ``seeds`` is a list of seeds or a count ``n`` (the seeds ``base, ..., base + n - 1``). ``run`` returns a
    number, an array/tensor, or a dict of those; the result is a NumPy array with a leading seed axis (or a
    dict of such arrays with the same keys).
    """
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"seeds must be a positive count or a list of seeds, got {seeds}")
        seeds = list(range(base, base + seeds))
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty: give a count (e.g. 5) or a list of seeds")
    results = []
    iterator = seeds
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(seeds, desc="seeds", leave=False)
    for seed in iterator:
        seed_everything(int(seed))
        results.append(run(int(seed)))
    if isinstance(results[0], dict):
        return {k: np.stack([_as_array(r[k], k) for r in results]) for k in results[0]}
    return np.stack([_as_array(r) for r in results])


def mean_interval(values: Any, level: float = 0.95) -> Interval:
    """Student-t confidence interval of the mean of independent runs (e.g. one accuracy per seed).

    ``mean ± t_{(1+level)/2, n-1} · s / √n`` with ``s`` the sample standard deviation (``n - 1`` in the
    denominator). Needs at least two values.
    """
    _check_level(level)
    x = _as_array(values).ravel()
    if x.size < 2:
        raise ValueError(f"mean_interval needs at least 2 values (seeds), got {x.size}; run more seeds")
    from scipy.stats import t

    m = float(x.mean())
    half = float(t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Interval(m, m - half, m + half, level, int(x.size), "t over seeds")


def proportion_interval(successes: int, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval of a proportion ``successes / n`` (an accuracy on ``n`` independent test points).

    ``(p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)`` with ``z`` the standard normal quantile
    (Wilson 1927); unlike the normal approximation it stays inside [0, 1] and is sensible at 0 and n.
    """
    _check_level(level)
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"n must be a positive number of test points, got {n!r}")
    if not (0 <= successes <= n):
        raise ValueError(f"successes must lie in [0, n] = [0, {n}], got {successes!r}")
    from scipy.stats import norm

    z = float(norm.ppf((1 + level) / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(float(p), max(0.0, centre - half), min(1.0, centre + half), level, int(n), "Wilson")


def _resampled_means(x: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n_resamples`` bootstrap resamples of the entries of a 1-D ``x`` (index blocks near 32 MB)."""
    out = np.empty(n_resamples)
    n = x.size
    block = max(1, 4_000_000 // n)
    for start in range(0, n_resamples, block):
        b = min(block, n_resamples - start)
        out[start:start + b] = x[rng.integers(0, n, size=(b, n))].mean(axis=1)
    return out


def bootstrap_interval(values: Any, level: float = 0.95, *, n_resamples: int = 4000,
                       seed: int = 0) -> Interval:
    """Percentile-bootstrap confidence interval of a mean over test points (Efron & Tibshirani 1993, ch. 13).

    ``values`` holds one score per test point (1-D; e.g. 1/0 for a correct/wrong prediction), or one seed's
    row ``(1, points)``. The interval is the ``(1-level)/2`` and ``(1+level)/2`` quantiles of the resampled
    means; the estimate is the plain mean. It covers the choice of test points, not the training
    randomness: for several seeds use :func:`seeds_points_interval` (or :func:`interval`).
    """
    _check_level(level)
    if not (isinstance(n_resamples, int) and n_resamples >= 100):
        raise ValueError(f"n_resamples must be an int >= 100 (4000 is the default), got {n_resamples!r}")
    x = _one_seed_as_points(_as_array(values))
    if x.ndim == 2:
        raise ValueError(f"bootstrap_interval takes one score per test point (1-D), got a {x.shape[0]} seeds x "
                         f"{x.shape[1]} points matrix: with few seeds a bootstrap cannot estimate the seed "
                         "variance; use stats.seeds_points_interval (or stats.interval)")
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D (points) or 2-D (seeds x points), got shape {tuple(x.shape)}")
    means = _resampled_means(x, n_resamples, np.random.default_rng(seed))
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(x.mean()), float(low), float(high), level, int(x.size), "bootstrap over points")


def seeds_points_interval(values: Any, level: float = 0.95) -> Interval:
    """Confidence interval of the mean of a ``seeds x points`` matrix (every seed scored on the same points).

    The grand mean varies with the seeds and with the draw of test points. Its variance is estimated as
    ``v_seeds + v_points`` with ``v_seeds = var(seed means) / S`` and ``v_points = var(point means) / N``
    (sample variances, ``S`` seeds, ``N`` points): under the two-way random-effects model
    ``x_ij = mu + a_i + b_j + e_ij`` this is ``var(a)/S + var(b)/N + 2 var(e)/(SN)``, the true variance
    plus ``var(e)/(SN)``, so slightly conservative. The interval is ``mean ± t_q(S - 1) sqrt(v)``: the seed
    part is estimated from ``S`` seeds only, and the many points cannot lend it degrees of freedom
    (Satterthwaite's approximation does, and its intervals then cover a true null in only 92 % of simulated
    experiments with 3 seeds; ``tests/test_stats.py``). With 3 seeds ``t_q(2) = 4.30`` for 95 %: the interval
    is as wide as three seeds require, and conservative where the test points, not the seeds, dominate.
    Needs at least 2 seeds and 2 points.
    """
    _check_level(level)
    x = _as_array(values)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise ValueError(f"seeds_points_interval takes a seeds x points matrix with at least 2 seeds and 2 points, "
                         f"got shape {tuple(x.shape)}; for one seed use stats.bootstrap_interval over its points")
    from scipy.stats import t

    s, n = x.shape
    v_seeds = float(x.mean(axis=1).var(ddof=1)) / s
    v_points = float(x.mean(axis=0).var(ddof=1)) / n
    v = v_seeds + v_points
    m = float(x.mean())
    half = float(t.ppf((1 + level) / 2, s - 1) * math.sqrt(v))
    return Interval(m, m - half, m + half, level, f"{s} seeds x {n} points", "t over seeds and points")


def interval(values: Any, level: float = 0.95, *, n_resamples: int = 4000, seed: int = 0) -> Interval:
    """The book's interval of a mean score: :func:`bootstrap_interval` over the test points for 1-D scores
    (or one seed's row), :func:`seeds_points_interval` for a ``seeds x points`` matrix of 2 or more seeds."""
    x = _one_seed_as_points(_as_array(values))
    if x.ndim == 2:
        return seeds_points_interval(x, level)
    return bootstrap_interval(x, level, n_resamples=n_resamples, seed=seed)


def paired_comparison(a: Any, b: Any, level: float = 0.95, *, over: str = "points",
                      names: tuple[str, str] = ("A", "B"), n_resamples: int = 4000, seed: int = 0) -> Comparison:
    """Compare two methods scored on the *same* test points (and seeds) through the interval of ``a - b``.

    - ``over="points"``: ``a``, ``b`` are 1-D per-point scores; paired bootstrap over the points.
    - ``over="seeds"``: ``a``, ``b`` are 1-D per-seed results of runs that share their seeds; t interval of
      the paired differences.
    - a 2-D ``seeds x points`` pair (2 or more seeds) gets :func:`seeds_points_interval` of the differences
      (``over`` is ignored); a single seed, ``(1, points)``, is bootstrapped over its points.

    Pairing removes the variation the two methods share (the same hard test points, the same seed), so it
    detects differences that two separate intervals would hide.
    """
    xa, xb = _one_seed_as_points(_as_array(a, "a")), _one_seed_as_points(_as_array(b, "b"))
    if xa.shape != xb.shape:
        raise ValueError(f"a and b must be scored on the same points/seeds: shapes {xa.shape} and {xb.shape} differ")
    if over not in ("points", "seeds"):
        raise ValueError(f"over must be 'points' or 'seeds', got {over!r}")
    d = xa - xb
    if d.ndim == 1 and over == "seeds":
        iv = mean_interval(d, level)
    else:
        iv = interval(d, level, n_resamples=n_resamples, seed=seed)
    return Comparison(iv, *names)
