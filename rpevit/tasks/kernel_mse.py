"""The `kernel_mse` task: Monte Carlo and closed-form error of random-feature softmax-kernel estimators.

For one pair x, y in R^d (|x| = |y| = kmse_norm, angle kmse_angle, orientation drawn from the
seed) the estimate of K = exp(x^T y) from m features is the mean of m per-row values

    positive:  Z(w) = exp(w^T z - (|x|^2 + |y|^2) / 2),           z = x + y
    trig:      Z(w) = exp((|x|^2 + |y|^2) / 2) cos(w^T delta),    delta = x - y

(exactly what `positive_random_features` / `trig_random_features` give as phi(x)^T phi(y)). Its
MSE = bias^2 + Var / m-type terms follows from three moments of the row distribution:
mean = E Z(w), second = E Z(w)^2 and cross = E Z(w_a) Z(w_b) for two distinct rows of one
orthogonal block (cross = mean^2 for iid rows, which removes the covariance term):

    Var(estimate) = [m (second - mean^2) + P (cross - mean^2)] / m^2,
    P = ordered pairs of distinct rows sharing a block,   MSE = (mean - K)^2 + Var.

Closed forms of the moments (derivations in the docstrings below):
- gaussian (iid N(0, I)): E exp(w^T z) = exp(|z|^2/2), E cos(w^T delta) = exp(-|delta|^2/2);
  this reproduces Lemma 2 of Choromanski et al. 2021 (Performers).
- orthogonal (Haar directions, chi_d norms): same mean/second; cross is an exact, absolutely
  convergent double series (`orthogonal_gaussian_cross_series`). Beside it the Performer paper's
  Theorem 2 upper bound for positive features with m <= d (`mse_bound`; a bound, not exact).
- rademacher (iid +-1): E exp(w^T z) = prod_i cosh(z_i) <= exp(|z|^2/2): the positive estimator is
  biased low; E cos(w^T delta) = prod_i cos(delta_i): the trig one is biased too. Both depend on
  the coordinates, not only on norms and angle, so they are evaluated at the x, y drawn.
- orthogonal_rademacher (Hadamard rows, `orthogonal_rademacher`): same mean/second as rademacher
  (each row is iid +-1); two rows agree on a uniform random D/2-subset S, so cross is an average
  of products over D/2-subsets (`mean_subset_product`).
The m -> infinity limit of the MSE is bias^2 (0 for Gaussian rows; the Rademacher floor otherwise).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from scipy.special import gammaln
from torch import Tensor

from rpevit import metrics
from rpevit.attention.features import (haar_orthogonal, iid_gaussian, orthogonal_gaussian,
                                       positive_random_features, trig_random_features)
from rpevit.attention.rademacher import iid_rademacher, next_power_of_two, orthogonal_rademacher
from rpevit.config import TrialConfig, field_error
from rpevit.registry import TaskMetrics, register_task

PROJECTIONS: dict[str, Callable[..., Tensor]] = {
    "gaussian": iid_gaussian,
    "orthogonal": orthogonal_gaussian,
    "rademacher": iid_rademacher,
    "orthogonal_rademacher": orthogonal_rademacher,
}


# ---------------------------------------------------------------- the pair and the Monte Carlo
@contextmanager
def single_thread() -> Iterator[None]:
    """Thousands of tiny (d x d) QRs: extra threads only add contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pair_at_angle(d: int, norm: float, angle: float, *, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """x, y in R^d (float64) with |x| = |y| = norm and angle(x, y) = angle, in a Haar-random orientation."""
    q = haar_orthogonal(d, generator=generator)
    u, v = q[:, 0], q[:, 1]
    return norm * u, norm * (math.cos(angle) * u + math.sin(angle) * v)


def sample_estimates(x: Tensor, y: Tensor, m: int, estimator: str, projection: str, draws: int, *,
                     generator: torch.Generator) -> Tensor:
    """(draws,) independent estimates phi(x)^T phi(y) of exp(x^T y), each from a fresh (m, d) projection."""
    d = x.shape[-1]
    make = PROJECTIONS[projection]
    if projection in ("gaussian", "rademacher"):  # iid entries: one batched draw
        w = make(draws * m, d, generator=generator, dtype=torch.float64).reshape(draws, m, d)
    else:  # orthogonal blocks: one matrix per draw
        with single_thread():
            w = torch.stack([make(m, d, generator=generator, dtype=torch.float64) for _ in range(draws)])
    xs, ys = x.expand(draws, 1, d), y.expand(draws, 1, d)
    if estimator == "positive":
        phi_x, phi_y = positive_random_features(xs, w), positive_random_features(ys, w)
    else:
        phi_x, phi_y = trig_random_features(xs, w), trig_random_features(ys, w)
    return (phi_x * phi_y).sum(dim=-1).reshape(draws)


# ---------------------------------------------------------------- closed forms
@dataclass
class RowMoments:
    """mean = E Z(w), second = E Z(w)^2, cross = E Z(w_a) Z(w_b) for distinct rows of one block."""
    mean: float
    second: float
    cross: float
    block: int  # rows per orthogonal block (1: iid rows, no covariance)


def same_block_pairs(m: int, block: int) -> int:
    """Ordered pairs (a != b) of m rows that share a block, blocks of `block` rows filled in order."""
    full, rest = divmod(m, block)
    return full * block * (block - 1) + rest * (rest - 1)


def estimator_error(mom: RowMoments, m: int, kernel: float) -> dict[str, float]:
    """bias, variance and MSE of the mean of m rows, and the m -> infinity limit of the MSE."""
    pairs = same_block_pairs(m, mom.block)
    var = (m * (mom.second - mom.mean**2) + pairs * (mom.cross - mom.mean**2)) / m**2
    bias = mom.mean - kernel
    return {"bias_closed": bias, "var_closed": var, "mse_closed": bias**2 + var, "limit_mse": bias**2}


def orthogonal_gaussian_cross_series(s: float, d: int, sign: float) -> float:
    """sum_{j,k >= 0} (sign s)^(j+k) / (j! k!) * (d/2)_j (d/2)_k / (d/2)_(j+k), (a)_n rising factorials.

    = E f(w_a) f(w_b) for two orthogonal rows w = r u (r ~ chi_d, (u_a, u_b) a Haar orthonormal pair)
    with f = exp(w^T z) (sign +1, s = |z|^2/2) or f = cos(w^T delta) (sign -1, s = |delta|^2/2).
    Derivation: expand both functions in powers; only even powers survive; (u_a^T e, u_b^T e) are the
    first two coordinates of a uniform unit vector, E v1^2j v2^2k = (1/2)_j (1/2)_k / (d/2)_(j+k);
    E r^2j = 2^j (d/2)_j; and (2j)! = 4^j j! (1/2)_j. With the Pochhammer ratio replaced by 1 the sum
    is exp(2 s) (resp. exp(-2 s)), the iid value; the ratio <= 1 is the orthogonal variance reduction.
    Absolutely convergent (bounded by exp(2 s)), summed in float64 until the terms are negligible.
    """
    if s == 0.0:
        return 1.0
    n = int(max(60, 4 * s + 12 * math.sqrt(s) + 40))
    j = np.arange(n)[:, None].astype(np.float64)
    k = np.arange(n)[None, :].astype(np.float64)
    half = d / 2.0
    lpoch = lambda a, q: gammaln(a + q) - gammaln(a)  # noqa: E731
    log_terms = ((j + k) * math.log(s) - gammaln(j + 1) - gammaln(k + 1)
                 + lpoch(half, j) + lpoch(half, k) - lpoch(half, j + k))
    signs = np.where((j + k) % 2 == 1, sign, 1.0)
    return float((signs * np.exp(log_terms)).sum())


def mean_subset_product(c: np.ndarray, k: int) -> float:
    """Average of prod_{i in S} c_i over all k-subsets S of the entries of c (e_k(c) / binom(n, k)).

    Stable recursion on the normalised elementary symmetric polynomials:
    E_k(n) = (n - k)/n E_k(n - 1) + k/n c_n E_(k-1)(n - 1).
    """
    avg = np.zeros(k + 1)
    avg[0] = 1.0
    for n, value in enumerate(c, start=1):
        top = min(k, n)
        for q in range(top, 0, -1):
            avg[q] = ((n - q) * avg[q] + q * value * avg[q - 1]) / n
    return float(avg[k])


def row_moments(x: np.ndarray, y: np.ndarray, estimator: str, projection: str) -> RowMoments:
    """Closed-form moments of one row's Z(w) (module docstring) for float64 vectors x, y."""
    d = len(x)
    sq = float(x @ x + y @ y)
    if estimator == "positive":
        z, scale = x + y, math.exp(-sq / 2)  # Z = scale * exp(w^T z)
    else:
        z, scale = x - y, math.exp(sq / 2)  # Z = scale * cos(w^T delta)
    if projection in ("gaussian", "orthogonal"):
        s = float(z @ z) / 2
        mean = math.exp(float(x @ y))  # = scale * exp(+-s) exactly: unbiased (no roundoff bias^2 ~ 1e-32)
        if estimator == "positive":
            second = scale**2 * math.exp(4 * s)
        else:
            second = scale**2 * (1 + math.exp(-4 * s)) / 2
        if projection == "gaussian":
            return RowMoments(mean, second, mean**2, 1)
        sign = 1.0 if estimator == "positive" else -1.0
        return RowMoments(mean, second, scale**2 * orthogonal_gaussian_cross_series(s, d, sign), d)
    if estimator == "positive":
        mean, second = scale * np.prod(np.cosh(z)), scale**2 * np.prod(np.cosh(2 * z))
        pair = np.cosh(2 * z)  # E exp((w_a + w_b)^T z) | S = prod_{S} cosh(2 z_i)
    else:
        mean, second = scale * np.prod(np.cos(z)), scale**2 * (1 + np.prod(np.cos(2 * z))) / 2
        pair = np.cos(2 * z)  # E cos(w_a^T z) cos(w_b^T z) | S = prod_{S} cos(2 z_i) (S or its complement)
    if projection == "rademacher":
        return RowMoments(float(mean), float(second), float(mean) ** 2, 1)
    size = next_power_of_two(d)
    if size == 1:
        return RowMoments(float(mean), float(second), float(mean) ** 2, 1)
    padded = np.concatenate([pair, np.ones(size - d)])  # zero padding: cosh(0) = cos(0) = 1
    return RowMoments(float(mean), float(second), scale**2 * mean_subset_product(padded, size // 2), size)


def performer_orthogonal_bound(x: np.ndarray, y: np.ndarray, m: int, mse_iid: float) -> float:
    """Theorem 2 of Choromanski et al. 2021 (positive features, m <= d): an upper bound on the MSE,
    MSE_iid - 2 (m - 1) / (m (d + 2)) (exp(x^T y) - exp(-(|x|^2 + |y|^2)/2))^2."""
    d = len(x)
    if m > d:
        return math.nan
    gap = math.exp(float(x @ y)) - math.exp(-float(x @ x + y @ y) / 2)
    return mse_iid - 2 * (m - 1) / (m * (d + 2)) * gap**2


def closed_form(x: np.ndarray, y: np.ndarray, m: int, estimator: str, projection: str) -> dict[str, float]:
    """Closed-form bias, variance, MSE and its m -> infinity limit; plus the Performer bound (or NaN)."""
    kernel = math.exp(float(x @ y))
    out = estimator_error(row_moments(x, y, estimator, projection), m, kernel)
    out["mse_bound"] = math.nan
    if projection == "orthogonal" and estimator == "positive":
        iid = estimator_error(row_moments(x, y, estimator, "gaussian"), m, kernel)["mse_closed"]
        out["mse_bound"] = performer_orthogonal_bound(x, y, m, iid)
    return out


# ---------------------------------------------------------------- the task
def monte_carlo_error(estimates: Tensor, kernel: float) -> dict[str, float]:
    """mse = bias^2 + var exactly (population variance over draws), and the standard error of the mse."""
    err2 = (estimates - kernel).square()
    return {"mse_mc": err2.mean().item(), "mse_mc_se": (err2.std() / math.sqrt(len(err2))).item(),
            "bias_mc": (estimates.mean() - kernel).item(), "var_mc": estimates.var(unbiased=False).item()}


METRICS = TaskMetrics(
    headline={"mse_mc": float, "mse_closed": float},
    other={"kernel_true": float, "mse_mc_se": float, "bias_mc": float, "var_mc": float, "bias_closed": float,
           "var_closed": float, "limit_mse": float, "mse_bound": float, "x_dot_y": float, "sum_norm_sq": float,
           "diff_norm_sq": float},
)


def check_config(cfg: TrialConfig, source: str) -> None:
    """kmse_dim >= 2 (x and y span a plane) and an angle in [0, pi] (pi itself allowed)."""
    if cfg.kmse_dim < 2:
        raise field_error(source, "kmse_dim", cfg.kmse_dim, "an integer >= 2 (x and y span a plane)")
    if cfg.kmse_angle > math.pi:
        raise field_error(source, "kmse_angle", cfg.kmse_angle, "radians in [0, pi]")


@register_task("kernel_mse", METRICS, check=check_config)
def kernel_mse_point(cfg: TrialConfig, *, checkpoint_dir: str | Path | None = None,
                     on_epoch: Callable | None = None, log: Callable[[str], None] | None = print) -> dict:
    """One (projection, estimator, m, norm, angle) point; `checkpoint_dir`/`on_epoch` unused (seconds)."""
    g = torch.Generator().manual_seed(cfg.seed)
    x, y = pair_at_angle(cfg.kmse_dim, cfg.kmse_norm, cfg.kmse_angle, generator=g)
    kernel = math.exp(float(x @ y))
    estimates = sample_estimates(x, y, cfg.kmse_features, cfg.kmse_estimator, cfg.kmse_projection,
                                 cfg.kmse_draws, generator=g)
    row = {**monte_carlo_error(estimates, kernel),
           **closed_form(x.numpy(), y.numpy(), cfg.kmse_features, cfg.kmse_estimator, cfg.kmse_projection)}
    if log:
        log(f"kernel_mse {cfg.kmse_projection}/{cfg.kmse_estimator} d={cfg.kmse_dim} m={cfg.kmse_features} "
            f"|x|={cfg.kmse_norm:g} angle={cfg.kmse_angle:.3f}: K={kernel:.4g} mse_mc={row['mse_mc']:.4g} "
            f"+- {row['mse_mc_se']:.2g} mse_closed={row['mse_closed']:.4g} limit={row['limit_mse']:.3g}")
    return {**cfg.resolved().to_dict(), "kernel_true": kernel, **row,
            "x_dot_y": float(x @ y), "sum_norm_sq": float((x + y) @ (x + y)),
            "diff_norm_sq": float((x - y) @ (x - y)), **metrics.environment(torch.device("cpu"))}
