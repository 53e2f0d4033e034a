"""Random projections and random-feature maps of the softmax kernel exp(x^T y).

phi(x)^T phi(y) is an unbiased estimate of exp(x^T y) for both maps below when the rows of w are
marginally N(0, I_d) (iid or orthogonal-with-chi-norms). Shared by the FAVOR+ backend and the
kernel-MSE study, so names and signatures are part of the package's interface.
"""
from __future__ import annotations

import math

import torch
from einops import einsum
from torch import Tensor


def iid_gaussian(m: int, d: int, *, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """(m, d) matrix of iid N(0, 1) entries."""
    return torch.randn(m, d, generator=generator, dtype=torch.float64).to(dtype)


def haar_orthogonal(d: int, *, generator: torch.Generator | None = None, fix_signs: bool = True) -> Tensor:
    """A (d, d) orthogonal matrix from the QR of a Gaussian matrix, float64.

    Householder QR returns R with a chosen diagonal sign convention, which makes Q NOT Haar
    distributed; multiplying Q's columns by sign(diag R) removes that bias (Mezzadri 2007).
    `fix_signs=False` exists only so tests can show the bias.
    """
    q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    if fix_signs:
        q = q * torch.sign(torch.diagonal(r))[None, :]
    return q


def orthogonal_gaussian(m: int, d: int, *, generator: torch.Generator | None = None,
                        dtype: torch.dtype = torch.float32, fix_signs: bool = True) -> Tensor:
    """(m, d) rows orthogonal within each block of d, each row marginally N(0, I_d).

    Blocks of d rows of independent Haar matrices, rows rescaled to independent chi_d norms
    (the norms of Gaussian vectors), so every row is Gaussian while rows of a block are exactly
    orthogonal: the estimator stays unbiased and its variance drops (Choromanski et al. 2021).
    """
    blocks = [haar_orthogonal(d, generator=generator, fix_signs=fix_signs) for _ in range(math.ceil(m / d))]
    directions = torch.cat(blocks, dim=0)[:m]  # rows of an orthogonal matrix have unit norm
    norms = torch.randn(m, d, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (directions * norms).to(dtype)


def positive_random_features(x: Tensor, w: Tensor, *, stabilizer: str = "none") -> Tensor:
    """FAVOR+ features m^-1/2 exp(w x - |x|^2/2): x (..., n, d), w (m, d) or (..., m, d) -> (..., n, m) > 0.

    stabilizer divides by a detached exp(max) so nothing overflows; a per-row or global factor
    rescales numerator and denominator of attention alike and cancels (Choromanski et al. 2021):
    "query": by exp(max_r (w x)_r - |x|^2/2) per token, i.e. returns m^-1/2 exp(w x - max_r (w x)_r)
             (the row-constant |x|^2/2 drops out, so it is never computed);
    "key": by exp(max over tokens and features of w x), one factor for every key;
    "none": the exact features, as the unbiasedness statement reads.
    """
    projection = x @ w.transpose(-1, -2)
    if stabilizer == "query":
        offset = projection.amax(dim=-1, keepdim=True).detach()
    elif stabilizer in ("key", "none"):
        offset = 0.5 * x.pow(2).sum(dim=-1, keepdim=True)
        if stabilizer == "key":
            offset = offset + projection.amax(dim=(-2, -1), keepdim=True).detach()
    else:
        raise ValueError(f"stabilizer {stabilizer!r}; allowed: none, query, key")
    return torch.exp(projection - (offset + 0.5 * math.log(w.shape[-2])))


def trig_random_features(x: Tensor, w: Tensor) -> Tensor:
    """Trigonometric features m^-1/2 [sin(w x), cos(w x)] exp(|x|^2/2): (..., n, d) -> (..., n, 2m).

    phi(x)^T phi(y) = m^-1 sum_r cos(w_r (x - y)) exp((|x|^2 + |y|^2)/2), unbiased for exp(x^T y)
    but not positive (the reason FAVOR+ uses the positive map).
    """
    projection = einsum(x, w, "... n d, ... m d -> ... n m")
    scale = torch.exp(0.5 * x.pow(2).sum(dim=-1, keepdim=True)) / math.sqrt(w.shape[-2])
    return torch.cat([torch.sin(projection), torch.cos(projection)], dim=-1) * scale
