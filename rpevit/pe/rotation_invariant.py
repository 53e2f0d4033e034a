"""Rotation-invariant RPE: A_ij proportional to exp(q_i^T k_j / sqrt(d)) * p(|c_i - c_j|^2).

p(t) = sum_{k=0..K} a_k t^k, K = `rotinv_degree`, with two parametrisations (`rotinv_basis`;
`auto`, the default, is bernstein in exact mode and monomial in random mode):
- monomial: a_k = softplus(raw_k) > 0 per head, so p(t) >= a_0 > 0 for every t >= 0, in both
  modes; the price: p is non-decreasing in t, it cannot decay with distance (no locality);
- bernstein: p(t) = sum_k b_k C(K, k) s^k (1 - s)^(K - k), s = t / T, T = 2 (the largest
  squared distance on any grid), b_k = exp(BERNSTEIN_LOG_SCALE raw_k) > 0: positive on the whole
  grid, free to decay or grow, and p = 1 at the start (raw = 0, b = 1, partition of unity). Its
  monomial coefficients a = M b change sign, so a single random-mode draw could go negative:
  exact mode only. log b is scaled for the reason luo_scale scales the Luo table: locality needs
  b_0 / b_K of order e^3, and Adam moves raw by about lr per step.
  Why exp(10 raw) rather than softplus(raw), and how each basis compares: measured in
  docs/string_and_rotinv.md.
Coordinates: c = (r - grid centre) / max(H - 1, W - 1), so c lies in [-1/2, 1/2]^2 and
t = |c_i - c_j|^2 in [0, 2] on every grid (at most 2 for a square grid's corners).

The modulation is a LowRankModulation c_ij = sum_l f_il g_jl (hook "score"), built by parallel
post-processing of the coordinates, never an N x N matrix:
- exact: t_ij = phi(c_i) . psi(c_j) with phi = (|c|^2, 1, -2x, -2y), psi = (1, |c|^2, x, y);
  by the multinomial theorem t^k = sum_{|alpha| = k} (k! / alpha!) phi_i^alpha psi_j^alpha,
  so L = C(K + 4, 4) features (15 for K = 2);
- random: w ~ N(0, I_2) (`rotinv_draws` per head, a fixed buffer from the trial seed),
  z = w^T c. Since w^T(c_j - c_i) ~ N(0, t), E[(z_j - z_i)^(2k)] = (2k - 1)!! t^k; and
  (z_j - z_i)^(2k) = sum_r C(2k, r) z_j^r (-z_i)^(2k - r). Grouping by the power r of z_j gives
  L = m (2K + 1) features whose per-draw value sum_k a_k (z_j - z_i)^(2k) / (2k-1)!! is >= a_0 > 0
  and whose mean over draws has expectation p(t) exactly (rotation invariant in distribution).
On a kernelized backend the modulation multiplies the m features by the L factors (`rotinv_path`
lowrank, linear in N) or enters as the dense N x N matrix (`rotinv_path` dense): the same attention,
and the dense form does fewer operations below a few hundred tokens (docs/mechanisms.md).
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from rpevit.attention.base import LowRankModulation
from rpevit.config import ConfigError
from rpevit.pe.base import PositionEncoding
from rpevit.registry import Option, register_pe

if TYPE_CHECKING:
    from rpevit.config import TrialConfig

ROTINV_MODE = Option("rotinv_mode", str, "exact", "rotinv: exact low-rank expansion or random Gaussian projections",
                     choices=("exact", "random"))
ROTINV_DEGREE = Option("rotinv_degree", int, 2, "rotinv: degree of p in |c_i - c_j|^2", ge=0,
                       le=16)  # exact mode: C(degree + 4, 4) factors per token, 4845 at 16
ROTINV_BASIS = Option("rotinv_basis", str, "auto", "rotinv: form of p (auto: bernstein in exact mode, monomial in "
                      "random mode)", choices=("auto", "monomial", "bernstein"))
ROTINV_DRAWS = Option("rotinv_draws", int, 16, "rotinv: Gaussian projections of the random mode", ge=1,
                      le=4096)
ROTINV_PATH = Option("rotinv_path", str, "lowrank", "rotinv on kernelized backends: the modulation folded into the "
                     "features (linear in N) or the dense N x N matrix (fewer operations below a few hundred tokens: "
                     "docs/mechanisms.md)", choices=("lowrank", "dense"))


def centred_coordinates(grid: tuple[int, int]) -> Tensor:
    """(N, 2) patch coordinates (x, y), row-major, centred and scaled into [-1/2, 1/2]^2."""
    h, w = grid
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    xy = torch.stack([xs.flatten() - (w - 1) / 2, ys.flatten() - (h - 1) / 2], dim=-1).double()
    return (xy / max(h - 1, w - 1, 1)).to(torch.get_default_dtype())  # the trial's dtype while building


BERNSTEIN_RANGE = 2.0  # t = |c_i - c_j|^2 <= 2 for centred coordinates in [-1/2, 1/2]^2
BERNSTEIN_LOG_SCALE = 10.0  # b_k = exp(BERNSTEIN_LOG_SCALE * raw_k): log b moves 10x faster than raw


def resolved_basis(basis: str, mode: str) -> str:
    """`auto` -> bernstein in exact mode (can decay: measured better), monomial in random mode."""
    if basis != "auto":
        return basis
    return "bernstein" if mode == "exact" else "monomial"


def bernstein_to_monomial(degree: int, t_max: float = BERNSTEIN_RANGE) -> Tensor:
    """M (K+1, K+1), a = M b: sum_k b_k C(K,k) s^k (1-s)^(K-k) with s = t / t_max, in powers of t.

    C(K,k) s^k (1-s)^(K-k) = sum_i C(K,k) C(K-k,i) (-1)^i s^(k+i), so M[j, k] collects j = k + i.
    """
    m = torch.zeros(degree + 1, degree + 1, dtype=torch.float64)
    for k in range(degree + 1):
        for j in range(k, degree + 1):
            i = j - k
            m[j, k] = math.comb(degree, k) * math.comb(degree - k, i) * (-1) ** i / t_max**j
    return m


def double_factorial_odd(k: int) -> int:
    """(2k - 1)!! = 1 * 3 * ... * (2k - 1); 1 for k = 0. E[G^(2k)] for G ~ N(0, 1)."""
    return math.prod(range(1, 2 * k, 2))


def multinomial_exponents(degree: int) -> tuple[Tensor, Tensor, Tensor]:
    """All alpha in N^4 with |alpha| <= degree: exponents (L, 4), |alpha| (L,), |alpha|!/alpha! (L,)."""
    rows = [a for k in range(degree + 1) for a in itertools.product(range(k + 1), repeat=4) if sum(a) == k]
    exps = torch.tensor(rows, dtype=torch.float64)
    order = exps.sum(-1).long()
    coef = torch.tensor([math.factorial(sum(a)) / math.prod(math.factorial(e) for e in a) for a in rows])
    return exps, order, coef.double()


def distance_monomials(coords: Tensor, degree: int) -> tuple[Tensor, Tensor, Tensor]:
    """(|alpha|!/alpha!) phi_i^alpha (N, L), psi_j^alpha (N, L) and |alpha| (L,): f = a[:, |alpha|] * the first."""
    exps, order, multinom = (t.to(coords.device) for t in multinomial_exponents(degree))
    xy = coords.double()
    sq = (xy * xy).sum(-1, keepdim=True)
    ones = torch.ones_like(sq)
    phi = torch.cat([sq, ones, -2 * xy], dim=-1)  # N 4
    psi = torch.cat([ones, sq, xy], dim=-1)
    phi_pow = torch.pow(phi[:, None, :], exps).prod(-1)  # N L
    psi_pow = torch.pow(psi[:, None, :], exps).prod(-1)
    return phi_pow * multinom, psi_pow, order


def exact_distance_features(coords: Tensor, coefficients: Tensor) -> tuple[Tensor, Tensor]:
    """f, g (h, N, L) with sum_l f_il g_jl = sum_k a_k |c_i - c_j|^(2k) exactly.

    coords: (N, 2); coefficients a: (h, K + 1).
    """
    phi_pow, psi_pow, order = distance_monomials(coords, coefficients.shape[-1] - 1)
    return _exact_combine(coefficients, phi_pow.to(coefficients.dtype), psi_pow.to(coefficients.dtype), order)


def _exact_combine(a: Tensor, phi_pow: Tensor, psi_pow: Tensor, order: Tensor) -> tuple[Tensor, Tensor]:
    return a[:, order][:, None, :] * phi_pow, psi_pow.expand(a.shape[0], -1, -1)


def binomial_selector(degree: int) -> Tensor:
    """(K+1, 2K+1, 2K+1): selector[k, r, 2k - r] = C(2k, r) / (2k-1)!!, zero elsewhere.

    The binomial expansion (z_j - z_i)^(2k) / (2k-1)!! = sum_r selector[k, r, 2k - r] z_j^r (-z_i)^(2k - r).
    """
    selector = torch.zeros(degree + 1, 2 * degree + 1, 2 * degree + 1, dtype=torch.float64)
    for k in range(degree + 1):
        for r in range(2 * k + 1):
            selector[k, r, 2 * k - r] = math.comb(2 * k, r) / double_factorial_odd(k)
    return selector


def projection_powers(coords: Tensor, projections: Tensor, degree: int) -> tuple[Tensor, Tensor]:
    """(-z_i)^e and z_j^r for e, r = 0 .. 2K, (h, N, m, 2K + 1) each, with z = w^T c."""
    z = einsum(coords.to(projections.dtype), projections, "n c, h m c -> h n m")
    powers = torch.arange(2 * degree + 1, device=z.device, dtype=z.dtype)
    return (-z)[..., None] ** powers, z[..., None] ** powers


def random_projection_features(coords: Tensor, coefficients: Tensor, projections: Tensor) -> tuple[Tensor, Tensor]:
    """f, g (h, N, m (2K + 1)): the mean over the m draws w of sum_k a_k (w^T (c_j - c_i))^(2k) / (2k-1)!!.

    coords: (N, 2); coefficients a: (h, K + 1); projections w: (h, m, 2), isotropic Gaussian.
    """
    degree = coefficients.shape[-1] - 1
    neg_pow, z_pow = projection_powers(coords, projections.to(coefficients.dtype), degree)
    return _random_combine(coefficients, neg_pow, z_pow, binomial_selector(degree).to(coefficients))


def _random_combine(a: Tensor, neg_pow: Tensor, z_pow: Tensor, selector: Tensor) -> tuple[Tensor, Tensor]:
    mix = einsum(a, selector, "h k, k r e -> h r e") / neg_pow.shape[2]  # the mean over m draws
    f = einsum(neg_pow, mix, "h n m e, h r e -> h n m r")
    return rearrange(f, "h n m r -> h n (m r)"), rearrange(z_pow, "h n m r -> h n (m r)")


@register_pe("rotinv", options=(ROTINV_MODE, ROTINV_DEGREE, ROTINV_BASIS, ROTINV_DRAWS, ROTINV_PATH), colour="C9",
             groups=("string_study",), order=9)
class RotationInvariantRPE(PositionEncoding):
    hook = "score"

    @classmethod
    def quadratic_on_kernelized(cls, values: dict[str, Any]) -> bool:
        """The low-rank path folds the modulation into the features (linear in N); dense is the N x N matrix."""
        return values.get("rotinv_path", ROTINV_PATH.default) == "dense"

    def __init__(self, *, rotinv_mode: str = ROTINV_MODE.default, rotinv_degree: int = ROTINV_DEGREE.default,
                 rotinv_basis: str = ROTINV_BASIS.default, rotinv_draws: int = ROTINV_DRAWS.default,
                 rotinv_path: str = ROTINV_PATH.default, **context: Any) -> None:
        super().__init__(**context)
        self.mode = rotinv_mode
        self.path = rotinv_path
        degree, heads = rotinv_degree, self.heads
        self.register_buffer("coordinates", centred_coordinates(self.grid), persistent=False)
        if resolved_basis(rotinv_basis, rotinv_mode) == "bernstein":  # raw = 0, b = 1: p = 1, no modulation at first
            basis = bernstein_to_monomial(degree).to(torch.get_default_dtype())
            self.register_buffer("basis", basis, persistent=False)
            self.raw_coefficients = nn.Parameter(torch.zeros(heads, degree + 1))
        else:  # a_0 = 1, a_k = 0.1: p varies by under 2x over [0, 2] at K = 2, a mild start
            start = torch.full((heads, degree + 1), 0.1)
            start[:, 0] = 1.0
            self.basis = None
            self.raw_coefficients = nn.Parameter(torch.log(torch.expm1(start)))  # softplus^-1
        if self.mode == "exact":
            phi_pow, psi_pow, order = distance_monomials(self.coordinates, degree)
            self.register_buffer("order", order, persistent=False)
            self.register_buffer("phi_monomials", phi_pow.to(torch.get_default_dtype()), persistent=False)
            self.register_buffer("psi_monomials", psi_pow.to(torch.get_default_dtype()), persistent=False)
        else:
            w = torch.randn(heads, rotinv_draws, 2, generator=self.seed_generator())
            self.register_buffer("projections", w)  # fixed: part of the model (checkpoints), from the seed
            self.register_buffer("selector", binomial_selector(degree).to(torch.get_default_dtype()), persistent=False)

    @classmethod
    def resolve_options(cls, values: dict[str, Any]) -> dict[str, Any]:
        return {"rotinv_basis": resolved_basis(values["rotinv_basis"], values["rotinv_mode"])}

    @classmethod
    def check_config(cls, cfg: TrialConfig, source: str) -> None:
        if resolved_basis(cfg.rotinv_basis, cfg.rotinv_mode) == "bernstein" and cfg.rotinv_mode == "random":
            raise ConfigError(
                f"{source}: field 'rotinv_basis' has value 'bernstein' with rotinv_mode 'random'; allowed: "
                f"'bernstein' with rotinv_mode 'exact', or 'monomial' (its signed coefficients could make "
                f"a random draw negative)"
            )

    def coefficients(self) -> Tensor:
        """(h, K + 1) monomial coefficients a_k of p: softplus(raw) > 0, or M b with b = exp(scale raw) (Bernstein)."""
        if self.basis is None:
            return F.softplus(self.raw_coefficients)
        return torch.exp(BERNSTEIN_LOG_SCALE * self.raw_coefficients) @ self.basis.T

    def modulation(self) -> LowRankModulation:
        a = self.coefficients()
        if self.mode == "exact":
            return LowRankModulation(*_exact_combine(a, self.phi_monomials, self.psi_monomials, self.order), self.path)
        # powers of w^T c from the buffer each call (cheap: h N m (2K+1)), so a loaded checkpoint's w is used
        neg_pow, z_pow = projection_powers(self.coordinates, self.projections, self.selector.shape[0] - 1)
        return LowRankModulation(*_random_combine(a, neg_pow, z_pow, self.selector), self.path)
