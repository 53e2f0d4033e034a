"""Random projections and feature maps: Haar orthogonality, unbiasedness, MSE ordering, convergence in m."""
import math

import pytest
import torch

from rpevit.attention.features import (
    haar_orthogonal, iid_gaussian, orthogonal_gaussian, positive_random_features, trig_random_features,
)

D = 8


def pair(seed=0, norm=1.0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2, D, generator=g, dtype=torch.float64)
    return norm * x / x.norm(), norm * y / y.norm()


def test_shapes_dtype_and_generator_reproducibility():
    for sample in (iid_gaussian, orthogonal_gaussian):
        a = sample(20, D, generator=torch.Generator().manual_seed(1))
        b = sample(20, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        assert a.shape == (20, D) and a.dtype == torch.float32 and b.dtype == torch.float64
        torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-6)


def test_orthogonal_blocks_and_chi_norms():
    w = orthogonal_gaussian(3 * D, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for block in w.split(D):
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(torch.diagonal(gram)))
    # squared row norms are chi^2_d: mean d, variance 2d
    norms = torch.cat([orthogonal_gaussian(64, D, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                       for s in range(40)]).pow(2).sum(-1)
    n = norms.numel()
    assert n == 2560
    assert abs(norms.mean() - D) < 5 * math.sqrt(2 * D / n)
    # the sample variance too (fixed norms sqrt(d) give the right mean and variance 0): its standard error is
    # sqrt((mu4 - sigma^4) / n), with chi^2_d's fourth central moment mu4 = 12 d^2 + 48 d and sigma^4 = 4 d^2,
    # 0.59 at n = 2560 and d = 8. 6 SE (3.5) admits any seed but with odds below 1e-8; variance 0 is 27 SE off.
    variance_se = math.sqrt((8 * D**2 + 48 * D) / n)
    assert abs(norms.var() - 2 * D) < 6 * variance_se, (norms.var().item(), 2 * D, variance_se)


@pytest.mark.slow
def test_sign_fixed_qr_is_haar_and_plain_qr_is_not():
    """Under Haar measure E[Q] = 0 entrywise; plain Householder QR biases the diagonal of Q."""
    n = 3000
    g = torch.Generator().manual_seed(0)
    fixed = torch.stack([haar_orthogonal(4, generator=g) for _ in range(n)])
    plain = torch.stack([haar_orthogonal(4, generator=g, fix_signs=False) for _ in range(n)])
    se = 0.5 / math.sqrt(n)  # each entry of a 4x4 Haar matrix has variance 1/4
    assert fixed.mean(0).abs().max() < 5 * se
    assert torch.diagonal(plain.mean(0)).abs().min() > 20 * se  # the test has the power to see the bias


@pytest.mark.slow
@pytest.mark.parametrize("features", ["positive", "trig"])
@pytest.mark.parametrize("sample", [iid_gaussian, orthogonal_gaussian])
def test_estimators_are_unbiased(features, sample):
    x, y = pair(1)
    g = torch.Generator().manual_seed(2)
    draws = 2000
    w = torch.stack([sample(D, D, generator=g, dtype=torch.float64) for _ in range(draws)])  # draws, m, d
    feature_map = positive_random_features if features == "positive" else trig_random_features
    estimates = (feature_map(x[None], w) * feature_map(y[None], w)).sum(-1).flatten()
    target = torch.exp(x @ y)
    assert abs(estimates.mean() - target) < 4 * estimates.std() / math.sqrt(draws)
    assert estimates.std() > 0  # really random


def test_positive_features_are_positive_and_stabilizers_only_rescale():
    w = iid_gaussian(16, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = 5 * torch.randn(2, 6, D, dtype=torch.float64)
    plain = positive_random_features(x, w)
    assert (plain > 0).all()
    q = positive_random_features(x, w, stabilizer="query")
    torch.testing.assert_close(q / q.sum(-1, keepdim=True), plain / plain.sum(-1, keepdim=True))
    k = positive_random_features(x, w, stabilizer="key")
    torch.testing.assert_close(k / k.sum((-2, -1), keepdim=True), plain / plain.sum((-2, -1), keepdim=True))
    assert q.max() <= 1 / math.sqrt(16) + 1e-12 and k.max() <= 1 / math.sqrt(16) + 1e-12
    with pytest.raises(ValueError, match="stabilizer"):
        positive_random_features(x, w, stabilizer="rows")


def kernel_mse(sample, seed, m=D, norm=0.5, pairs=16, draws=2000):
    """Monte Carlo MSE of phi(x)^T phi(y) against exp(x^T y), averaged over random pairs |x| = |y| = norm.

    Small norms keep the lognormal tails light enough for a 2000-draw MSE estimate to be stable.
    """
    g = torch.Generator().manual_seed(seed)
    xs, ys = (norm * z / z.norm(dim=-1, keepdim=True) for z in torch.randn(2, pairs, D, generator=g, dtype=torch.float64))
    w = torch.stack([sample(m, D, generator=g, dtype=torch.float64) for _ in range(draws)])  # draws, m, d
    estimates = (positive_random_features(xs, w) * positive_random_features(ys, w)).sum(-1)  # draws, pairs
    return (estimates - torch.exp((xs * ys).sum(-1))).pow(2).mean()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_orthogonal_features_have_lower_mse_than_iid(seed):
    iid, orth = kernel_mse(iid_gaussian, seed), kernel_mse(orthogonal_gaussian, seed)
    assert orth < 0.95 * iid, (orth, iid)  # measured ratio 0.84-0.89 over seeds 0-5


@pytest.mark.slow
def test_attention_error_shrinks_as_m_grows():
    g = torch.Generator().manual_seed(3)
    n, repeats = 32, 20
    q, k = (0.25 * torch.randn(n, D, generator=g, dtype=torch.float64) for _ in range(2))  # |q| ~ 0.7
    v = torch.randn(n, D, generator=g, dtype=torch.float64)
    a = torch.exp(q @ k.T)
    exact = a @ v / a.sum(-1, keepdim=True)
    errors = []
    for m in (8, 32, 128, 512):
        w = torch.stack([orthogonal_gaussian(m, D, generator=g, dtype=torch.float64) for _ in range(repeats)])
        pq, pk = positive_random_features(q, w), positive_random_features(k, w)  # repeats, n, m
        approx = pq @ (pk.transpose(-1, -2) @ v) / (pq @ pk.sum(-2, keepdim=True).transpose(-1, -2))
        errors.append((approx - exact).pow(2).mean().item())
    assert all(b < 0.6 * a for a, b in zip(errors, errors[1:])), errors  # MSE ~ 1/m: 0.25 per step
