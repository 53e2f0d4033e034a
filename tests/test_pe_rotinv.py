"""Rotation-invariant RPE: low-rank factors vs dense p(|c_i - c_j|^2), invariance, unbiasedness."""
from __future__ import annotations

import math

import pytest
import torch

from rpevit.attention.base import LowRankModulation
from rpevit.attention.softmax import SoftmaxAttention
from rpevit.config import TrialConfig
from rpevit.models import build_model
from rpevit.pe.rotation_invariant import (
    BERNSTEIN_LOG_SCALE,
    RotationInvariantRPE,
    centred_coordinates,
    double_factorial_odd,
    exact_distance_features,
    random_projection_features,
)

BASE = {"dataset": "digits", "dim": 32, "heads": 2, "pe": "rotinv"}
GRID = (4, 4)  # BASE's patch grid


def rotinv(**options) -> RotationInvariantRPE:
    """The encoding as BASE's config (heads 2, head dim 16) would build it in layer 0."""
    return RotationInvariantRPE(grid=GRID, heads=2, head_dim=16, **options)


def brute_p(coords: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """(h, N, N) dense p(|c_i - c_j|^2) from pairwise differences."""
    t = ((coords[:, None, :] - coords[None, :, :]) ** 2).sum(-1)
    return sum(a[:, k, None, None] * t**k for k in range(a.shape[1]))


def rotation(angle: float) -> torch.Tensor:
    return torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64)


def coefficients(heads: int, degree: int) -> torch.Tensor:
    return torch.rand(heads, degree + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(degree)) + 0.1


def test_centred_coordinates_range():
    c = centred_coordinates((8, 8))
    assert torch.allclose(c.mean(0), torch.zeros(2), atol=1e-7)
    assert c.abs().max() == 0.5
    assert torch.isclose(torch.cdist(c, c).square().max(), torch.tensor(2.0))
    assert torch.equal(centred_coordinates((1, 1)), torch.zeros(1, 2))


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_exact_factorisation_equals_dense_brute_force(degree):
    coords = centred_coordinates((4, 5)).double()
    a = coefficients(3, degree)
    f, g = exact_distance_features(coords, a)
    assert f.shape == (3, 20, math.comb(degree + 4, 4))
    assert torch.allclose(LowRankModulation(f, g).dense(), brute_p(coords, a), atol=1e-12)


@pytest.mark.parametrize("angle", [0.3, 1.1, math.pi / 2, 2.5])
def test_exact_mode_rotation_invariant(angle):
    coords = centred_coordinates((5, 5)).double()
    a = coefficients(2, 2)
    before = LowRankModulation(*exact_distance_features(coords, a)).dense()
    after = LowRankModulation(*exact_distance_features(coords @ rotation(angle).T, a)).dense()
    assert torch.allclose(before, after, atol=1e-12)
    q, k, v = torch.randn(3, 2, 2, 25, 8, dtype=torch.float64)
    attn = SoftmaxAttention(heads=2, head_dim=8)
    out_before = attn(q, k, v, LowRankModulation(*exact_distance_features(coords, a)))
    out_after = attn(q, k, v, LowRankModulation(*exact_distance_features(coords @ rotation(angle).T, a)))
    assert torch.allclose(out_before, out_after, atol=1e-10)
    # and it is the attention of the definition: softmax weights times p, renormalised
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1) * before
    assert torch.allclose(out_before, (weights / weights.sum(-1, keepdim=True)) @ v, atol=1e-10)


def test_random_features_equal_per_draw_brute_force():
    coords = centred_coordinates((3, 4)).double()
    a = coefficients(2, 2)
    w = torch.randn(2, 7, 2, dtype=torch.float64)
    f, g = random_projection_features(coords, a, w)
    diff = coords[None, :, :] - coords[:, None, :]  # i j c: c_j - c_i
    proj = torch.einsum("ijc,hmc->hijm", diff, w)
    per_draw = sum(a[:, k, None, None, None] * proj ** (2 * k) / double_factorial_odd(k) for k in range(3))
    assert f.shape == (2, 12, 7 * 5)
    assert torch.allclose(LowRankModulation(f, g).dense(), per_draw.mean(-1), atol=1e-12)
    assert per_draw.min() >= a[:, 0].min() - 1e-12  # every draw alone is >= a_0 > 0


def test_random_mode_rotating_coordinates_equals_rotating_draws():
    """w^T (R c) = (R^T w)^T c: rotating the grid is a re-draw of w, same distribution."""
    coords = centred_coordinates((4, 4)).double()
    a, w, r = coefficients(1, 3), torch.randn(1, 5, 2, dtype=torch.float64), rotation(0.7)
    lhs = LowRankModulation(*random_projection_features(coords @ r.T, a, w)).dense()
    rhs = LowRankModulation(*random_projection_features(coords, a, w @ r)).dense()
    assert torch.allclose(lhs, rhs, atol=1e-12)


@pytest.mark.parametrize("angle", [0.0, 0.9])
def test_random_mode_unbiased_and_invariant_in_expectation(angle):
    """Mean over M draws vs the exact p on the unrotated grid: within 5 sample std / sqrt(M)."""
    coords = centred_coordinates((4, 4)).double()
    a = coefficients(1, 2)
    draws = 20000
    w = torch.randn(1, draws, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rotated = coords @ rotation(angle).T
    diff = rotated[None, :, :] - rotated[:, None, :]
    proj = torch.einsum("ijc,hmc->hijm", diff, w)
    per_draw = sum(a[:, k, None, None, None] * proj ** (2 * k) / double_factorial_odd(k) for k in range(3))
    mean = LowRankModulation(*random_projection_features(rotated, a, w)).dense()
    assert torch.allclose(mean, per_draw.mean(-1), atol=1e-10)
    exact = LowRankModulation(*exact_distance_features(coords, a)).dense()
    tolerance = 5 * per_draw.std(-1) / math.sqrt(draws) + 1e-12
    assert bool(((mean - exact).abs() <= tolerance).all())


@pytest.mark.parametrize("mode", ["exact", "random"])
def test_module_modulation_positive_and_matches_functions(mode):
    pe = rotinv(rotinv_mode=mode, rotinv_draws=3, rotinv_degree=2,
                rotinv_basis="monomial")  # the Bernstein path: test_bernstein_*
    with torch.no_grad():
        pe.raw_coefficients.copy_(torch.randn(2, 3, generator=torch.Generator().manual_seed(0)))
    c = pe.modulation().dense()
    a = pe.coefficients().double()
    coords = centred_coordinates(GRID).double()
    if mode == "exact":
        assert torch.allclose(c.double(), brute_p(coords, a), atol=1e-5)
    else:
        ref = LowRankModulation(*random_projection_features(coords, a, pe.projections.double())).dense()
        assert torch.allclose(c.double(), ref, atol=1e-5)
    # p >= a_0 in exact arithmetic; the float32 expansion cancels terms of size up to max(c)
    slack = 1e-5 * c.detach().abs().max().item()
    assert c.shape == (2, 16, 16) and bool((c >= a[:, :1, None].float() - slack).all()) and bool((c > 0).all())


def test_random_projections_seeded():
    a, b = rotinv(rotinv_mode="random", layer=2), rotinv(rotinv_mode="random", layer=2)
    assert torch.equal(a.projections, b.projections)
    assert not torch.equal(a.projections, rotinv(rotinv_mode="random", layer=3).projections)
    assert a.projections.shape == (2, TrialConfig.rotinv_draws, 2)  # the default number of draws


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["softmax", "favor", "relu"])
@pytest.mark.parametrize("mode", ["exact", "random"])
def test_gradients_reach_coefficients(attention, mode):
    cfg = TrialConfig.from_dict({**BASE, "attention": attention, "rotinv_mode": mode, "rotinv_draws": 4})
    model = build_model(cfg, 1, 10)
    out = model(torch.randn(3, 1, 8, 8))
    assert torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    for block in model.blocks:
        grad = block.attn.encodings[0].raw_coefficients.grad
        assert grad is not None and grad.abs().sum() > 0


@pytest.mark.parametrize("mode", ["exact", "random"])
def test_rotinv_path_changes_the_cost_not_the_model(mode):
    """favor + rotinv, float64, one seed: rotinv_path dense gives the lowrank model's logits and gradients,
    and the dense path computes fewer FLOPs at this N (16 tokens, m L = 8 x 15 or 8 x 20 features)."""
    from rpevit.flops import count_flops

    results = {}
    for path in ("lowrank", "dense"):
        cfg = TrialConfig.from_dict({**BASE, "attention": "favor", "num_features": 8, "rotinv_mode": mode,
                                     "rotinv_draws": 4, "rotinv_path": path})
        model = build_model(cfg, 1, 10).double()
        images = torch.randn(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        out = model(images)
        out.logsumexp(-1).sum().backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        flops, _ = count_flops(model.float(), images.float())
        results[path] = (out.detach(), grads, flops)
    (out_l, grads_l, flops_l), (out_d, grads_d, flops_d) = results["lowrank"], results["dense"]
    torch.testing.assert_close(out_d, out_l, rtol=1e-10, atol=1e-12)
    assert grads_d.keys() == grads_l.keys() and any("raw_coefficients" in name for name in grads_d)
    for name in grads_l:
        torch.testing.assert_close(grads_d[name], grads_l[name], rtol=1e-8, atol=1e-10, msg=name)
    assert flops_d < flops_l


def test_rotinv_path_refused_outside_its_choices():
    from rpevit.config import ConfigError

    with pytest.raises(ConfigError, match="rotinv_path.*'sparse'.*lowrank.*dense"):
        TrialConfig.from_dict({**BASE, "attention": "favor", "rotinv_path": "sparse"})


@pytest.mark.parametrize("mode", ["exact", "random"])
def test_every_op_has_a_flop_handle(mode):
    from rpevit.flops import count_flops

    cfg = TrialConfig.from_dict({**BASE, "rotinv_mode": mode, "depth": 1})
    total, unsupported = count_flops(build_model(cfg, 1, 10), torch.randn(1, 1, 8, 8))
    assert unsupported == {} and total > 0


def test_bernstein_basis_converts_to_the_same_polynomial():
    from rpevit.pe.rotation_invariant import bernstein_to_monomial

    degree, t_max = 3, 2.0
    b = torch.rand(degree + 1, dtype=torch.float64) + 0.1
    t = torch.linspace(0, t_max, 11, dtype=torch.float64)
    s = t / t_max
    direct = sum(b[k] * math.comb(degree, k) * s**k * (1 - s) ** (degree - k) for k in range(degree + 1))
    a = bernstein_to_monomial(degree, t_max) @ b
    via_monomials = sum(a[k] * t**k for k in range(degree + 1))
    torch.testing.assert_close(via_monomials, direct)


def test_bernstein_rotinv_starts_neutral_stays_positive_and_can_decay():
    pe = rotinv(rotinv_basis="bernstein", rotinv_degree=2)
    torch.testing.assert_close(pe.modulation().dense(), torch.ones(2, 16, 16), atol=1e-5, rtol=0)
    with torch.no_grad():  # b = (1, 0.01, 0.01): near 1 at distance 0, near 0.01 far away
        pe.raw_coefficients.copy_(torch.log(torch.tensor([[1.0, 0.01, 0.01]] * 2)) / BERNSTEIN_LOG_SCALE)
    c = pe.modulation().dense().double()
    coords = centred_coordinates(GRID).double()
    torch.testing.assert_close(c, brute_p(coords, pe.coefficients().double()), atol=1e-5, rtol=1e-5)
    dist = torch.cdist(coords, coords) ** 2
    assert bool((c > 0).all())
    assert c[0][dist == 0].min() > 0.99 and c[0][dist == dist.max()].max() < 0.05  # locality


def test_bernstein_random_mode_is_refused():
    from rpevit.config import ConfigError

    with pytest.raises(ConfigError, match="'rotinv_basis'.*'bernstein'.*rotinv_mode 'exact'"):
        TrialConfig.from_dict({**BASE, "rotinv_basis": "bernstein", "rotinv_mode": "random"})


def test_auto_basis_is_bernstein_in_exact_mode_and_monomial_in_random_mode():
    exact, random = rotinv(rotinv_mode="exact"), rotinv(rotinv_mode="random")
    assert exact.basis is not None and random.basis is None
    monomial = rotinv(rotinv_basis="monomial")
    assert monomial.basis is None


def test_bernstein_log_scale_speeds_up_the_coefficients():
    """b = exp(scale * raw): Adam's first step of size lr on raw moves log b by scale * lr.

    b is read back from the coefficients the module builds (a = M b, so b = M^-1 a), not recomputed
    from raw here, and compared with the literal 10 * 1e-3: a module whose scale is not 10 fails.
    Every gradient of the summed modulation on raw is positive (p grows with each b_k), so the
    first Adam step lowers every raw, and log b, by the step.
    """
    assert BERNSTEIN_LOG_SCALE == 10.0  # the literal below is this scale times lr
    pe = rotinv(rotinv_basis="bernstein")
    optimizer = torch.optim.Adam(pe.parameters(), lr=1e-3)
    pe.modulation().dense().sum().backward()
    assert bool((pe.raw_coefficients.grad > 0).all())
    optimizer.step()
    a = pe.coefficients().detach().double()  # (h, K + 1) monomial coefficients, a = b M^T
    log_b = torch.linalg.solve(pe.basis.double(), a.T).T.log()
    torch.testing.assert_close(log_b, torch.full_like(log_b, -0.01), atol=1e-5, rtol=0)
