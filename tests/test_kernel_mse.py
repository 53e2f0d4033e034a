"""The kernel-MSE study: Rademacher/Hadamard projections and the closed-form MSEs of every estimator.

References here: Monte Carlo (statistical tolerance from its own standard error), exhaustive
enumeration over all sign vectors / permutations (exact), and Lemma 2 of the Performer paper.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from rpevit.attention.rademacher import iid_rademacher, orthogonal_rademacher, sylvester_hadamard
from rpevit.config import ConfigError, TrialConfig
from rpevit.tasks import kernel_mse as km

PROJECTIONS = ("gaussian", "orthogonal", "rademacher", "orthogonal_rademacher")
ESTIMATORS = ("positive", "trig")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- projections
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 64])
def test_sylvester_hadamard_rows_orthogonal_and_pm1(n):
    h = sylvester_hadamard(n)
    assert set(h.unique().tolist()) <= {-1.0, 1.0}
    torch.testing.assert_close(h @ h.T, n * torch.eye(n, dtype=torch.float64), rtol=0, atol=0)


@pytest.mark.parametrize("m, d", [(5, 8), (8, 8), (20, 8), (16, 16)])
def test_orthogonal_rademacher_rows_orthogonal_within_each_block(m, d):
    w = orthogonal_rademacher(m, d, generator=gen(), dtype=torch.float64)
    assert w.shape == (m, d) and set(w.unique().tolist()) == {-1.0, 1.0}
    for start in range(0, m, d):
        block = w[start:start + d]
        torch.testing.assert_close(block @ block.T, d * torch.eye(len(block), dtype=torch.float64), rtol=0, atol=0)


def test_orthogonal_rademacher_pads_to_a_power_of_two_by_dropping_columns():
    """d = 6 uses the 8-column construction: w^T x equals the padded rows applied to x padded with zeros."""
    w6 = orthogonal_rademacher(5, 6, generator=gen(3), dtype=torch.float64)
    w8 = orthogonal_rademacher(5, 8, generator=gen(3), dtype=torch.float64)
    torch.testing.assert_close(w6, w8[:, :6])
    x = torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(w6 @ x, w8 @ torch.cat([x, torch.zeros(2, dtype=torch.float64)]))


@pytest.mark.parametrize("make", [iid_rademacher, orthogonal_rademacher])
def test_rademacher_entries_uniform_pm1_marginally(make):
    """Over draws, each entry is +-1 with probability 1/2 and two entries of a row are uncorrelated."""
    draws = 3000
    g = gen(1)
    w = torch.stack([make(8, 8, generator=g, dtype=torch.float64) for _ in range(draws)])  # (draws, 8, 8)
    tol = 5 / math.sqrt(draws)  # 5 standard errors of a mean of +-1 variables
    assert w.mean(0).abs().max() < tol
    within_row = torch.einsum("rai,raj->aij", w, w) / draws - torch.eye(8, dtype=torch.float64)
    assert within_row.abs().max() < tol


def test_two_hadamard_rows_agree_on_half_the_coordinates():
    w = orthogonal_rademacher(8, 8, generator=gen(2), dtype=torch.float64)
    agree = (w[:, None, :] == w[None, :, :]).sum(-1)
    assert torch.all(agree[~torch.eye(8, dtype=torch.bool)] == 4)


# ---------------------------------------------------------------- closed forms: exact references
def pair(d: int, norm: float, angle: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x, y = km.pair_at_angle(d, norm, angle, generator=gen(seed))
    return x.numpy(), y.numpy()


def row_values(w: np.ndarray, x: np.ndarray, y: np.ndarray, estimator: str) -> np.ndarray:
    """Z(w) of each row of w, straight from the definition."""
    sq = x @ x + y @ y
    if estimator == "positive":
        return np.exp(w @ (x + y) - sq / 2)
    return np.exp(sq / 2) * np.cos(w @ (x - y))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_rademacher_moments_equal_enumeration_over_all_sign_vectors(estimator):
    x, y = pair(5, 1.3, 1.0)
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=5)))
    values = row_values(signs, x, y, estimator)
    mom = km.row_moments(x, y, estimator, "rademacher")
    assert mom.mean == pytest.approx(values.mean(), rel=1e-12)
    assert mom.second == pytest.approx((values**2).mean(), rel=1e-12)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("d", [3, 4])
def test_orthogonal_rademacher_cross_moment_equals_enumeration(estimator, d):
    """E Z(w_a) Z(w_b) over every column permutation, column sign vector and ordered row pair of H_4."""
    x, y = pair(d, 1.1, 2.0)
    h = sylvester_hadamard(4).numpy()
    total, count = 0.0, 0
    for perm in itertools.permutations(range(4)):
        for signs in itertools.product([-1.0, 1.0], repeat=4):
            w = (h[:, list(perm)] * np.array(signs))[:, :d]
            z = row_values(w, x, y, estimator)
            total += np.outer(z, z)[~np.eye(4, dtype=bool)].sum()
            count += 12
    mom = km.row_moments(x, y, estimator, "orthogonal_rademacher")
    assert mom.block == 4
    assert mom.cross == pytest.approx(total / count, rel=1e-10)


def test_mean_subset_product_equals_enumeration():
    c = np.array([0.3, -1.2, 2.0, 0.7, 1.5, -0.4])
    for k in range(7):
        brute = np.mean([np.prod(c[list(s)]) for s in itertools.combinations(range(6), k)])
        assert km.mean_subset_product(c, k) == pytest.approx(brute, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("m", [1, 3, 16])
def test_gaussian_closed_form_is_performer_lemma_2(m):
    x, y = pair(8, 1.2, 0.9)
    kernel = math.exp(x @ y)
    plus, minus = np.sum((x + y) ** 2), np.sum((x - y) ** 2)
    lemma_pos = math.exp(plus) * kernel**2 * (1 - math.exp(-plus)) / m
    lemma_trig = math.exp(plus) * kernel**-2 * (1 - math.exp(-minus)) ** 2 / (2 * m)
    assert km.closed_form(x, y, m, "positive", "gaussian")["mse_closed"] == pytest.approx(lemma_pos, rel=1e-12)
    assert km.closed_form(x, y, m, "trig", "gaussian")["mse_closed"] == pytest.approx(lemma_trig, rel=1e-12)


def test_orthogonal_series_limits_and_performer_bound():
    # large d: the Pochhammer ratio -> 1 and the series -> the iid value exp(+-2 s)
    assert km.orthogonal_gaussian_cross_series(0.7, 10**6, 1.0) == pytest.approx(math.exp(1.4), rel=1e-4)
    assert km.orthogonal_gaussian_cross_series(0.7, 10**6, -1.0) == pytest.approx(math.exp(-1.4), rel=1e-4)
    for norm, angle in [(0.5, 0.3), (1.0, 1.2), (1.5, 0.0), (1.5, 2.5)]:
        x, y = pair(16, norm, angle)
        for m in (1, 4, 16):
            out = km.closed_form(x, y, m, "positive", "orthogonal")
            iid = km.closed_form(x, y, m, "positive", "gaussian")["mse_closed"]
            assert out["mse_closed"] <= out["mse_bound"] * (1 + 1e-12) <= iid * (1 + 1e-12)
            if m == 1:
                assert out["mse_closed"] == pytest.approx(iid, rel=1e-12)


# ---------------------------------------------------------------- closed forms vs Monte Carlo
@pytest.mark.slow
@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("d, m", [(8, 1), (8, 8), (6, 15)])
def test_closed_form_mse_matches_monte_carlo(projection, estimator, d, m):
    """Within 5 Monte Carlo standard errors, at m = 1, m = d (one full block) and m > d (two blocks + rest).

    |x| = |y| = 0.5 keeps the positive estimator's tails (lognormal, sigma^2 = |x + y|^2) light
    enough for the sample standard error of the MSE to be trustworthy.
    """
    draws = 20000
    x, y = km.pair_at_angle(d, 0.5, 1.0, generator=gen(d))
    kernel = math.exp(float(x @ y))
    est = km.sample_estimates(x, y, m, estimator, projection, draws, generator=gen(100 + m))
    mc = km.monte_carlo_error(est, kernel)
    cf = km.closed_form(x.numpy(), y.numpy(), m, estimator, projection)
    assert abs(mc["mse_mc"] - cf["mse_closed"]) < 5 * mc["mse_mc_se"]
    assert abs(mc["bias_mc"] - cf["bias_closed"]) < 5 * math.sqrt(cf["var_closed"] / draws)
    assert mc["mse_mc"] == pytest.approx(mc["bias_mc"] ** 2 + mc["var_mc"], rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("projection", ["orthogonal", "orthogonal_rademacher"])
def test_monte_carlo_tells_orthogonal_from_iid_rows(projection):
    """At m = d the covariance term matters: MC matches the orthogonal closed form and rejects the iid one."""
    x, y = km.pair_at_angle(8, 1.0, 0.6, generator=gen(7))
    est = km.sample_estimates(x, y, 8, "trig", projection, 20000, generator=gen(8))
    mc = km.monte_carlo_error(est, math.exp(float(x @ y)))
    iid = "gaussian" if projection == "orthogonal" else "rademacher"
    assert abs(mc["mse_mc"] - km.closed_form(x.numpy(), y.numpy(), 8, "trig", projection)["mse_closed"]) \
        < 5 * mc["mse_mc_se"]
    assert abs(mc["mse_mc"] - km.closed_form(x.numpy(), y.numpy(), 8, "trig", iid)["mse_closed"]) \
        > 20 * mc["mse_mc_se"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_rademacher_bias_matches_monte_carlo_and_is_a_floor(estimator):
    """The iid +-1 bias is real (many SEs from 0), matches prod cosh / prod cos, and stays as m grows."""
    x, y = km.pair_at_angle(8, 1.5, 0.3 if estimator == "positive" else 2.6, generator=gen(4))
    kernel = math.exp(float(x @ y))
    draws = 20000
    est = km.sample_estimates(x, y, 32, estimator, "rademacher", draws, generator=gen(5))
    mc = km.monte_carlo_error(est, kernel)
    cf = km.closed_form(x.numpy(), y.numpy(), 32, estimator, "rademacher")
    se = math.sqrt(cf["var_closed"] / draws)
    assert abs(cf["bias_closed"]) > 10 * se  # the bias is resolvable here
    assert abs(mc["bias_mc"] - cf["bias_closed"]) < 5 * se
    if estimator == "positive":
        assert cf["bias_closed"] < 0  # cosh(t) <= exp(t^2 / 2): biased low
    far = km.closed_form(x.numpy(), y.numpy(), 10**8, estimator, "rademacher")
    assert far["limit_mse"] == pytest.approx(cf["bias_closed"] ** 2)
    assert far["mse_closed"] == pytest.approx(far["limit_mse"], rel=1e-3)


# ---------------------------------------------------------------- the task
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_task_row(projection):
    cfg = TrialConfig.from_dict({"task": "kernel_mse", "kmse_projection": projection, "kmse_dim": 8,
                                 "kmse_features": 4, "kmse_norm": 1.2, "kmse_angle": 0.8, "kmse_draws": 500})
    row = km.kernel_mse_point(cfg, log=None)
    assert row["x_dot_y"] == pytest.approx(1.44 * math.cos(0.8), rel=1e-12)
    assert row["kernel_true"] == pytest.approx(math.exp(1.44 * math.cos(0.8)), rel=1e-12)
    for key in ("mse_mc", "mse_mc_se", "bias_mc", "var_mc", "mse_closed", "bias_closed", "var_closed", "limit_mse"):
        assert math.isfinite(row[key]), key
    if projection in ("gaussian", "orthogonal"):
        assert row["limit_mse"] == 0.0 and row["bias_closed"] == 0.0  # exactly unbiased
    else:
        assert row["limit_mse"] > 0
    assert row == {**row, **km.kernel_mse_point(cfg, log=None), "git_commit": row["git_commit"]}  # seeded: reproducible


@pytest.mark.parametrize("field, value", [("kmse_dim", 1), ("kmse_angle", 4.0), ("kmse_projection", "hadamard")])
def test_bad_kernel_mse_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        TrialConfig.from_dict({"task": "kernel_mse", field: value})
