"""rpevit.analysis.stats on constructed numbers with known answers, and the coverage that motivates it.

The coverage simulation documents why the percentile bootstrap was replaced: over 3 seeds its "95%"
interval is nearly the lowest-to-highest seed and covers the true mean about 68% of the time; the
one-sample t interval covers it 95% of the time.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from rpevit.analysis import stats

T2 = 4.302652729911275  # t(2) 97.5% quantile, the multiplier a 3-seed 95% interval needs


# ---------------------------------------------------------------- intervals by hand
def test_mean_interval_of_three_seeds_uses_the_t2_multiplier():
    got = stats.mean_interval([0.8, 0.9, 1.0])
    se = 0.1 / math.sqrt(3)
    assert got.point == pytest.approx(0.9) and got.df == 2 and got.n == (3,)
    assert (got.lo, got.hi) == pytest.approx((0.9 - T2 * se, 0.9 + T2 * se))
    assert got.text() == "0.9 [0.652, 1.15] (n=3)"
    one = stats.mean_interval([0.5, math.nan])  # NaN: a seed without the metric, not counted
    assert one.point == 0.5 and not one.bounded and one.text() == "0.5 (no interval, n=1)"
    same = stats.mean_interval([0.7, 0.7])
    assert (same.lo, same.hi) == (0.7, 0.7)  # nothing varies: the interval is the point


def test_welch_df_and_interval_by_hand_agree_with_scipy():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]
    # s_a^2/n_a = 1/3, s_b^2/n_b = (20/3)/4 = 5/3: se^2 = 2, df = 2^2 / ((1/3)^2/2 + (5/3)^2/3) = 216/53
    got = stats.welch(a, b)
    assert got.point == -3.0 and got.n == (3, 4)
    assert got.df == pytest.approx(216 / 53)
    half = sps.t.ppf(0.975, 216 / 53) * math.sqrt(2)
    assert (got.lo, got.hi) == pytest.approx((-3 - half, -3 + half))
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert got.p == pytest.approx(ref.pvalue) and got.df == pytest.approx(ref.df)
    # the interval at level 1 - p just touches 0: p-value and interval say the same thing
    assert stats.welch(a, b, level=1 - got.p).hi == pytest.approx(0.0, abs=1e-9)
    assert stats.welch(a, [5.0]).text() == "-3 (no interval, n=3,1)"


def test_fieller_with_exact_reference_groups_is_the_scaled_t_interval():
    """base and ref without spread: v(g) = s_x^2/n_x for every g, so G's interval is x's t interval
    shifted by mean(base) and divided by the gap D = 2."""
    x, base, ref = [1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]
    got = stats.closure_ratio(x, base, ref)
    mean = stats.mean_interval(x)
    assert got.point == pytest.approx(1.0) and got.n == (3, 3, 3)
    assert (got.lo, got.hi) == pytest.approx((mean.lo / 2, mean.hi / 2))


def pivot_p(x, base, ref, g: float) -> float:
    """The Welch-type p-value of "G = g" written out independently of the module."""
    groups = [np.asarray(v, float) for v in (x, base, ref)]
    w = [1.0, -(1 - g), -g]
    u = [wi**2 * v.var(ddof=1) / len(v) for wi, v in zip(w, groups)]
    df = sum(u) ** 2 / sum(ui**2 / (len(v) - 1) for ui, v in zip(u, groups))
    t = sum(wi * v.mean() for wi, v in zip(w, groups)) / math.sqrt(sum(u))
    return 2 * sps.t.sf(abs(t), df)


def test_fieller_bounds_are_where_the_pivot_test_is_at_its_level():
    x, base, ref = [0.85, 0.86, 0.84, 0.86], [0.80, 0.81, 0.79], [0.90, 0.92, 0.91, 0.93, 0.90]
    got = stats.closure_ratio(x, base, ref)
    assert got.point == pytest.approx((np.mean(x) - 0.80) / (np.mean(ref) - 0.80))
    assert got.lo < got.point < got.hi
    assert pivot_p(x, base, ref, got.lo) == pytest.approx(0.05, rel=1e-6)
    assert pivot_p(x, base, ref, got.hi) == pytest.approx(0.05, rel=1e-6)
    assert got.p == pytest.approx(sps.ttest_ind(x, base, equal_var=False).pvalue)


@pytest.mark.parametrize("x", [[0.80, 0.83, 0.78], [0.82, 0.86, 0.81], [0.88, 0.95, 0.90], [0.93, 0.91, 0.97]])
def test_fieller_contains_0_and_1_exactly_when_welch_does_not_reject(x):
    base, ref = [0.80, 0.81, 0.79], [0.90, 0.92, 0.91]
    got = stats.closure_ratio(x, base, ref)
    assert got.bounded
    assert got.excludes(0.0) == (sps.ttest_ind(x, base, equal_var=False).pvalue < 0.05)
    assert got.excludes(1.0) == (sps.ttest_ind(x, ref, equal_var=False).pvalue < 0.05)


def test_fieller_is_unbounded_when_the_gap_is_not_resolved():
    x, base, ref = [0.85, 0.86, 0.84], [0.80, 0.83, 0.79], [0.81, 0.84, 0.80]  # ref - base: 0.01, noisy
    got = stats.closure_ratio(x, base, ref)
    assert math.isfinite(got.point) and got.unbounded and not got.excludes(0.0)
    assert got.text() == f"{got.point:.3g} [unbounded] (n=3,3,3)"
    assert sps.ttest_ind(ref, base, equal_var=False).pvalue > 0.05  # the gap's own test does not reject
    assert stats.closure_ratio(x, base, [0.9]).text().endswith("(no interval, n=3,3,1)")


def test_bad_level_is_refused_with_one_message():
    for call in (lambda: stats.mean_interval([1.0, 2.0], level=95),
                 lambda: stats.welch([1.0, 2.0], [1.0, 3.0], level=0.0)):
        with pytest.raises(ValueError, match=r"level must be a confidence level in \(0, 1\)"):
            call()


# ---------------------------------------------------------------- Holm
def test_holm_adjusted_p_values_and_levels_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> running max 0.06
    assert stats.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # steps 1 and 2 reject (0.005 <= 0.05/4, 0.01 <= 0.05/3); step 3 fails (0.03 > 0.05/2), so 0.04 keeps m = 2
    assert stats.holm_divisors(p) == [3, 2, 2, 4]
    assert stats.holm_levels(p) == pytest.approx([1 - 0.05 / 3, 0.975, 0.975, 1 - 0.05 / 4])
    with_nan = stats.holm([0.01, math.nan, 0.02])
    assert with_nan[0] == pytest.approx(0.02) and math.isnan(with_nan[1]) and with_nan[2] == pytest.approx(0.02)


def test_judged_family_intervals_exclude_0_exactly_when_holm_rejects():
    rng = np.random.default_rng(3)
    groups = {f"c{i}": (rng.normal(shift, 1.0, 3), rng.normal(0.0, 1.0, 4)) for i, shift in enumerate([0, 1, 3, 6, 9])}
    family = stats.judge_family({k: (lambda level, a=a, b=b: stats.welch(a, b, level)) for k, (a, b) in groups.items()})
    assert {j.k for j in family.values()} == {5}
    p = [stats.welch(a, b).p for a, b in groups.values()]
    for judged, adjusted, level in zip(family.values(), stats.holm(p), stats.holm_levels(p)):
        assert judged.p_adjusted == pytest.approx(adjusted) and judged.interval.level == pytest.approx(level)
        assert judged.interval.excludes(0.0) == judged.resolved
    assert any(j.resolved for j in family.values()) and not all(j.resolved for j in family.values())
    word = family["c0"].word("raises", "lowers")
    assert word == "not resolved with 3 and 4 seeds"


def test_seed_counts_in_words():
    assert stats.seeds_text((3, 3)) == "3 seeds" and stats.seeds_text((3, 5)) == "3 and 5 seeds"
    assert stats.seeds_text((3, 3, 5)) == "3, 3 and 5 seeds" and stats.seeds_text((1,)) == "1 seed"


# ---------------------------------------------------------------- coverage
SIMS = 4000


def percentile_bootstrap_3(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The old interval over 3 seeds with infinitely many resamples: the 2.5% and 97.5% quantiles of
    the means of all 27 equally likely resamples (what 4000 random resamples approximated)."""
    idx = np.array(list(itertools.product(range(3), repeat=3)))
    means = samples[:, idx].mean(axis=2)
    return np.quantile(means, 0.025, axis=1), np.quantile(means, 0.975, axis=1)


def test_t_interval_covers_the_mean_95_percent_of_the_time_and_the_old_bootstrap_does_not():
    rng = np.random.default_rng(20261123)
    mu = 0.9
    samples = rng.normal(mu, 0.01, size=(SIMS, 3))
    covered = [(iv.lo <= mu <= iv.hi) for iv in map(stats.mean_interval, samples)]
    assert 0.93 <= np.mean(covered) <= 0.97
    lo, hi = percentile_bootstrap_3(samples)
    assert np.mean((lo <= mu) & (mu <= hi)) < 0.85  # about 0.68: inside the seed range, without t(2)'s width


def test_welch_interval_covers_a_difference_with_unequal_n_and_spread():
    rng = np.random.default_rng(7)
    a, b = rng.normal(1.0, 1.0, size=(SIMS, 3)), rng.normal(0.5, 3.0, size=(SIMS, 5))
    covered = [(iv.lo <= 0.5 <= iv.hi) for iv in (stats.welch(x, y) for x, y in zip(a, b))]
    assert 0.93 <= np.mean(covered) <= 0.97


# ---------------------------------------------------------------- a contrast of gaps (issue 58)
def test_contrast_of_two_gaps_by_hand():
    """(a1 - b1) - (a2 - b2) of four small cells, worked out by hand: means, s^2/n, SE, Satterthwaite df, t."""
    a1, b1, a2, b2 = [90.0, 92.0, 91.0], [80.0, 83.0, 80.0], [88.0, 89.0, 90.0], [86.0, 87.0, 85.0]
    iv = stats.contrast([a1, b1, a2, b2], [1, -1, -1, 1])
    # means 91, 81, 89, 86: (91 - 81) - (89 - 86) = 7; variances 1, 3, 1, 1; u = s^2 / 3 = 1/3, 1, 1/3, 1/3
    u = [1 / 3, 1.0, 1 / 3, 1 / 3]
    se = math.sqrt(sum(u))  # sqrt(2)
    df = sum(u) ** 2 / sum(x * x / 2 for x in u)  # 4 / (1/2 (1/9 + 1 + 1/9 + 1/9)) = 4 / (2/3) = 6
    assert df == pytest.approx(6.0) and iv.df == pytest.approx(6.0)
    q = sps.t.ppf(0.975, 6.0)
    assert iv.point == pytest.approx(7.0)
    assert (iv.lo, iv.hi) == pytest.approx((7.0 - q * se, 7.0 + q * se))
    assert iv.p == pytest.approx(2 * sps.t.sf(7.0 / se, 6.0)) and iv.n == (3, 3, 3, 3)


def test_a_contrast_of_two_groups_is_welch():
    a, b = [0.91, 0.90, 0.93, 0.89], [0.80, 0.85, 0.79]
    two, welch = stats.contrast([a, b], [1, -1]), stats.welch(a, b)
    assert (two.point, two.lo, two.hi, two.df, two.p) == pytest.approx((welch.point, welch.lo, welch.hi, welch.df, welch.p))


def test_a_contrast_needs_a_coefficient_per_group_and_two_seeds_for_an_interval():
    with pytest.raises(ValueError, match="one coefficient per group"):
        stats.contrast([[1.0, 2.0]], [1, -1])
    assert not stats.contrast([[1.0], [2.0, 3.0]], [1, -1]).bounded


def test_the_contrast_interval_covers_a_difference_of_gaps_95_percent_of_the_time():
    """Brute force: four normal cells with unequal spreads and n = 5 (the declared study's n); the true
    difference of gaps is (1 - 0.2) - (0.9 - 0.5) = 0.4."""
    rng = np.random.default_rng(58)
    means, sds = (1.0, 0.2, 0.9, 0.5), (0.3, 1.0, 0.2, 0.6)
    cells = [rng.normal(m, s, size=(SIMS, 5)) for m, s in zip(means, sds)]
    truth = (means[0] - means[1]) - (means[2] - means[3])
    intervals = [stats.contrast([c[i] for c in cells], [1, -1, -1, 1]) for i in range(SIMS)]
    covered = np.mean([iv.lo <= truth <= iv.hi for iv in intervals])
    assert 0.935 <= covered <= 0.965
    # and a naive interval that ignores the df (normal quantile) covers less: the t(df) width matters at n = 5
    naive = np.mean([abs(iv.point - truth) <= 1.96 * (iv.hi - iv.point) / sps.t.ppf(0.975, iv.df)
                     for iv in intervals])
    assert naive < covered - 0.01
