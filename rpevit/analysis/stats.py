"""Intervals and verdicts over seeds: t intervals, Welch differences, Fieller ratios, Holm families.

Why not the percentile bootstrap the analysis used before: with 3 seeds a resample holds only 27
equally likely index triples, so its 95% interval is (nearly) the lowest-to-highest seed and
ignores that a 3-sample standard deviation is itself uncertain (the t(2) multiplier is 4.30, not
1.96). For normal seeds it covers the true mean about 68% of the time, not 95% (at most 75%, the
chance that 3 seeds straddle the mean; tests/test_stats.py simulates both). The intervals here are
the t-based ones:

- `mean_interval`: one-sample t, n - 1 degrees of freedom.
- `welch`: a difference of two means, Welch's standard error and Welch-Satterthwaite df (no equal
  variance assumed; unequal n allowed: a cell with 5 seeds beside one with 3).
- `closure_ratio`: G = (mean x - mean base) / (mean ref - mean base) by Fieller's theorem: the set
  of g whose pivot x - (1 - g) base - g ref is not rejected by a Welch-type t test. Its df is the
  Satterthwaite df of that pivot at each g, so the set contains 0 exactly when Welch's test of x
  against base does not reject, and 1 exactly when Welch's test of x against ref does not. When
  the denominator is not resolved at the level, the set is unbounded; it is reported as
  unbounded, never as a finite interval.

Several claims made from one set of seeds (a verdict family) are corrected with Holm's step-down
procedure (`holm`, `holm_levels`, `judge_family`): each comparison's interval is recomputed at
level 1 - alpha / m, m its Holm divisor, so that the interval excludes 0 exactly when Holm rejects.
A rejected comparison's interval is its own 1 - alpha/m interval, not a simultaneous confidence
set in the strict sense (those are wider, Strassburger and Bretz 2008); the decision is Holm's.
An effect is claimed only when that interval excludes 0; otherwise the verdict says "not resolved
with n seeds". Every interval carries the seed counts n of its groups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence, TypeVar

import numpy as np
from scipy import optimize, stats

from rpevit.analysis.common import fmt

ALPHA = 0.05  # family-wise error rate of every verdict family
LEVEL = 1 - ALPHA  # level of the per-comparison intervals in the tables
_MAX_STEPS = 200  # doublings when searching a Fieller bound: reaches far beyond any finite float ratio


@dataclass(frozen=True)
class Interval:
    """A point estimate with its interval at `level`, the seed counts n of its groups, the two-sided
    p-value of "the quantity is 0" and the t degrees of freedom. lo and hi are NaN when there is no
    interval (a group with fewer than 2 seeds), -inf and +inf when it is unbounded (Fieller)."""

    point: float
    lo: float = math.nan
    hi: float = math.nan
    n: tuple[int, ...] = ()
    level: float = LEVEL
    p: float = math.nan
    df: float = math.nan

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def unbounded(self) -> bool:
        return math.isinf(self.lo) or math.isinf(self.hi)

    def excludes(self, value: float = 0.0) -> bool:
        """True when the (bounded) interval lies wholly on one side of value."""
        return self.bounded and (self.lo > value or self.hi < value)

    def n_text(self) -> str:
        return "n=" + ",".join(str(k) for k in self.n)

    def text(self, scale: float = 1.0, digits: int = 3) -> str:
        """'0.47 [0.19, 0.75] (n=3,3)'; the level is added when it is not 95%: '(n=3,3; 99.5%)'."""
        if not math.isfinite(self.point):
            return "—"
        level = "" if math.isclose(self.level, LEVEL) else f"; {fmt(100 * self.level, 3)}%"
        point = fmt(self.point * scale, digits)
        if self.unbounded:
            return f"{point} [unbounded] ({self.n_text()}{level})"
        if not self.bounded:
            return f"{point} (no interval, {self.n_text()})"
        return f"{point} [{fmt(self.lo * scale, digits)}, {fmt(self.hi * scale, digits)}] ({self.n_text()}{level})"


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be a confidence level in (0, 1), got {level!r}")


def finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The finite values as a flat float array (NaN marks a seed without the metric)."""
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def _quantile(level: float, df: float) -> float:
    return float(stats.t.ppf(0.5 + level / 2, df))


def _t(point: float, se: float, df: float, n: tuple[int, ...], level: float) -> Interval:
    """point +- t(df) se, and the p-value of point = 0. With se 0 (every seed equal) the interval
    is the point itself: nothing varies, so there is nothing to widen it by."""
    if se == 0:
        return Interval(point, point, point, n, level, 0.0 if point != 0 else 1.0, df)
    q = _quantile(level, df)
    p = float(2 * stats.t.sf(abs(point) / se, df))
    return Interval(point, point - q * se, point + q * se, n, level, p, df)


def satterthwaite(u: Sequence[float], n: Sequence[int]) -> float:
    """Welch-Satterthwaite df of a sum of independent squared standard errors u_i with n_i - 1 df each."""
    total = sum(u)
    denom = sum(ui * ui / (ni - 1) for ui, ni in zip(u, n))
    return float(total * total / denom) if denom > 0 else math.inf


def _difference(x: float, y: float) -> float:
    """x - y, exactly 0 when the two means agree to rounding (equal seeds summed in another order)."""
    return 0.0 if math.isclose(x, y, rel_tol=1e-12, abs_tol=0.0) else x - y


def mean_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> Interval:
    """Mean of the finite values with its one-sample t interval (n - 1 df); no interval for n < 2."""
    _check_level(level)
    x = finite(values)
    n = (len(x),)
    if len(x) == 0:
        return Interval(math.nan, n=n, level=level)
    if len(x) < 2:
        return Interval(float(x.mean()), n=n, level=level)
    return _t(float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))), len(x) - 1, n, level)


def welch(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, level: float = LEVEL) -> Interval:
    """mean(a) - mean(b) with Welch's interval: standard error sqrt(s_a^2/n_a + s_b^2/n_b) and
    Welch-Satterthwaite df; p is Welch's two-sided p-value (scipy's ttest_ind(equal_var=False)).
    No interval when either group has fewer than 2 seeds (one seed carries no spread)."""
    _check_level(level)
    a, b = finite(a), finite(b)
    n = (len(a), len(b))
    if min(n) == 0:
        return Interval(math.nan, n=n, level=level)
    point = _difference(float(a.mean()), float(b.mean()))
    if min(n) < 2:
        return Interval(point, n=n, level=level)
    u = [a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)]
    return _t(point, math.sqrt(sum(u)), satterthwaite(u, n), n, level)


def contrast(groups: Sequence[Sequence[float] | np.ndarray], coefficients: Sequence[float],
             level: float = LEVEL) -> Interval:
    """sum_i c_i mean(group_i) over independent groups, with the Welch-Satterthwaite interval: standard
    error sqrt(sum_i c_i^2 s_i^2 / n_i), df by Satterthwaite over the terms u_i = c_i^2 s_i^2 / n_i. A
    difference of two gaps (a1 - b1) - (a2 - b2) is the contrast (1, -1, -1, 1) of four cells; (1, -1) is
    Welch's difference (`welch`). A cell that occurs twice must be passed once, with its coefficients
    summed (its two terms are not independent). No interval when any group has fewer than 2 seeds."""
    _check_level(level)
    if len(groups) != len(coefficients) or not groups:
        raise ValueError(f"contrast needs one coefficient per group, got {len(groups)} groups and "
                         f"{len(coefficients)} coefficients")
    xs = [finite(g) for g in groups]
    n = tuple(len(x) for x in xs)
    if min(n) == 0:
        return Interval(math.nan, n=n, level=level)
    point = float(sum(c * float(x.mean()) for c, x in zip(coefficients, xs)))
    if min(n) < 2:
        return Interval(point, n=n, level=level)
    u = [c * c * float(x.var(ddof=1)) / len(x) for c, x in zip(coefficients, xs)]
    return _t(point, math.sqrt(sum(u)), satterthwaite(u, n), n, level)

def closure_ratio(x: Sequence[float] | np.ndarray, base: Sequence[float] | np.ndarray,
                  ref: Sequence[float] | np.ndarray, level: float = LEVEL) -> Interval:
    """G = (mean x - mean base) / (mean ref - mean base) with Fieller's interval (module docstring).

    The interval is {g : (N - g D)^2 <= t(df(g))^2 v(g)}, N and D the two differences of means,
    v(g) = s_x^2/n_x + (1 - g)^2 s_base^2/n_base + g^2 s_ref^2/n_ref the variance of the pivot
    (the shared base group makes N and D correlated; v accounts for it) and df(g) its
    Satterthwaite df. p is Welch's p-value of x against base (the test of G = 0). Unbounded
    (lo -inf, hi +inf) when D is not resolved at the level: then every large |g| is compatible
    with the seeds, of either sign."""
    _check_level(level)
    groups = [finite(x), finite(base), finite(ref)]
    n = tuple(len(g) for g in groups)
    if min(n) == 0:
        return Interval(math.nan, n=n, level=level)
    mx, mb, mr = (float(g.mean()) for g in groups)
    N, D = _difference(mx, mb), _difference(mr, mb)
    G = N / D if D != 0 else math.nan
    if min(n) < 2:
        return Interval(G, n=n, level=level)
    c = [float(g.var(ddof=1)) / len(g) for g in groups]
    p = welch(groups[0], groups[1]).p

    def excess(g: float) -> float:
        """(N - g D)^2 - t^2 v(g): <= 0 inside the interval."""
        u = [c[0], (1 - g) ** 2 * c[1], g * g * c[2]]
        v = sum(u)
        return (N - g * D) ** 2 - (_quantile(level, satterthwaite(u, n)) ** 2 * v if v > 0 else 0.0)

    u_inf = [0.0, c[1], c[2]]  # the pivot's variance over g^2 as |g| grows: that of D alone
    if D * D <= _quantile(level, satterthwaite(u_inf, n)) ** 2 * sum(u_inf):
        return Interval(G, -math.inf, math.inf, n, level, p)
    return Interval(G, _bound(excess, G, -1.0), _bound(excess, G, 1.0), n, level, p)


def _bound(excess: Callable[[float], float], start: float, direction: float) -> float:
    """The root of excess nearest to start in direction (excess(start) <= 0; excess > 0 far out)."""
    step = max(abs(start), 1.0) * 1e-3
    inside = start
    for _ in range(_MAX_STEPS):
        out = start + direction * step
        if excess(out) > 0:
            lo, hi = sorted((inside, out))
            return float(optimize.brentq(excess, lo, hi, xtol=1e-12 * max(1.0, abs(start)), rtol=1e-12))
        inside, step = out, step * 2
    return direction * math.inf  # not reached for a bounded set: the leading coefficient is positive


# ---------------------------------------------------------------- Holm families
def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: sorted p_(1) <= ... <= p_(k) become
    min(1, max_{j <= i} (k - j + 1) p_(j)). NaN (no test: a group with one seed) stays NaN and
    does not count in k."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), math.nan)
    idx = [i for i in np.argsort(p, kind="stable") if math.isfinite(p[i])]
    k, running = len(idx), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (k - rank) * p[i]))
        out[i] = running
    return out.tolist()


def holm_divisors(pvalues: Sequence[float], alpha: float = ALPHA) -> list[int]:
    """Per p-value, the m of the level 1 - alpha/m its interval is shown at, consistent with Holm's
    steps: m = k - rank + 1 for each rejected one (rank in increasing p); every one from the first
    step that fails on gets the failing step's m, so its interval includes 0 (its p is at least that
    step's). 0 for NaN p-values."""
    p = np.asarray(pvalues, dtype=float)
    out = [0] * len(p)
    idx = [i for i in np.argsort(p, kind="stable") if math.isfinite(p[i])]
    k, failed = len(idx), None
    for rank, i in enumerate(idx):
        m = k - rank
        if failed is None and p[i] > alpha / m:
            failed = m
        out[i] = m if failed is None else failed
    return out


def holm_levels(pvalues: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The confidence level 1 - alpha/m of each comparison (holm_divisors); NaN where p is NaN."""
    return [1 - alpha / m if m else math.nan for m in holm_divisors(pvalues, alpha)]


@dataclass(frozen=True)
class Judged:
    """One comparison of a family: its interval at its Holm level, the same at 1 - alpha (nominal, for
    tables), its Holm-adjusted p and the family size k."""

    interval: Interval
    nominal: Interval
    p_adjusted: float
    k: int
    alpha: float = ALPHA

    @property
    def resolved(self) -> bool:
        """Holm rejects "it is 0" (equivalently: the interval excludes 0)."""
        return math.isfinite(self.p_adjusted) and self.p_adjusted <= self.alpha

    def word(self, positive: str, negative: str) -> str:
        """positive / negative by the sign when resolved, else 'not resolved with n seeds'."""
        if not math.isfinite(self.interval.point):
            return "not measured"
        if not math.isfinite(self.interval.p):
            return f"no interval ({self.interval.n_text()})"
        if self.resolved:
            return positive if self.interval.point > 0 else negative
        return f"not resolved with {seeds_text(self.interval.n)}"


Comparison = Callable[[float], Interval]  # a comparison computed at a given level
K = TypeVar("K", bound=Hashable)


def judge_family(comparisons: Mapping[K, Comparison], alpha: float = ALPHA) -> dict[K, Judged]:
    """Holm over the comparisons of one verdict family: each recomputed at its Holm level."""
    nominal = {key: compare(1 - alpha) for key, compare in comparisons.items()}
    p = [iv.p for iv in nominal.values()]
    adjusted, divisors = holm(p), holm_divisors(p, alpha)
    k = sum(math.isfinite(x) for x in p)
    return {key: Judged(comparisons[key](1 - alpha / m) if m else iv, iv, adj, k, alpha)
            for (key, iv), adj, m in zip(nominal.items(), adjusted, divisors)}


def seeds_text(n: Sequence[int]) -> str:
    """'3 seeds' when every group has 3, else '3 and 5 seeds' / '3, 3 and 5 seeds'."""
    counts = [str(k) for k in n] or ["0"]
    if len(set(counts)) == 1:
        return f"{counts[0]} seed{'' if counts[0] == '1' else 's'}"
    return f"{', '.join(counts[:-1])} and {counts[-1]} seeds"
