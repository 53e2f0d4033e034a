"""Rademacher random projections: iid +-1 entries, and exactly orthogonal rows from a Hadamard matrix.

Same signature style as `features.py` (m rows of dimension d), so the kernel-MSE study feeds
them to the same feature maps. Unlike Gaussian rows they are NOT rotation invariant: with +-1
rows E[exp(w^T z)] = prod_i cosh(z_i) != exp(|z|^2 / 2), so the positive softmax-kernel estimator
is biased, by an amount that depends on the coordinates of z (rpevit/tasks/kernel_mse.py).
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor


def next_power_of_two(d: int) -> int:
    return 1 << max(0, (d - 1).bit_length())


@functools.lru_cache(maxsize=8)
def sylvester_hadamard(n: int) -> Tensor:
    """(n, n) Hadamard matrix of the Sylvester construction, H_ij = (-1)^popcount(i & j), float64.

    H H^T = n I, and the entrywise product of rows a and b is row a XOR b: for a != b it holds
    n/2 entries +1 and n/2 entries -1 (what the closed-form MSE of `orthogonal_rademacher` uses).
    """
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size {n}; allowed: a power of two")
    idx = torch.arange(n)
    bits = idx[:, None] & idx[None, :]
    parity = torch.zeros(n, n, dtype=torch.long)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return (1 - 2 * parity).to(torch.float64)


def random_signs(shape: tuple[int, ...], *, generator: torch.Generator | None = None) -> Tensor:
    """Independent uniform +-1 entries, float64."""
    return (2 * torch.randint(0, 2, shape, generator=generator) - 1).to(torch.float64)


def iid_rademacher(m: int, d: int, *, generator: torch.Generator | None = None,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """(m, d) matrix of iid +-1 entries (mean 0, variance 1, like N(0, 1) entries)."""
    return random_signs((m, d), generator=generator).to(dtype)


def orthogonal_rademacher(m: int, d: int, *, generator: torch.Generator | None = None,
                          dtype: torch.dtype = torch.float32) -> Tensor:
    """(m, d) +-1 matrix whose rows are exactly orthogonal within each block of D = 2^ceil(log2 d).

    Per block: D distinct rows of the Sylvester Hadamard matrix in random order, a random column
    permutation and a random sign per column. The column signs make every row iid +-1 on its own
    (the same marginal as `iid_rademacher`); the permutation makes the set where two rows agree a
    uniformly random D/2-subset. Blocks are independent. For d not a power of two the first d
    columns are returned: w^T x then equals the D-dimensional rows applied to x padded with zeros.
    """
    size = next_power_of_two(d)
    hadamard = sylvester_hadamard(size)
    blocks = []
    for _ in range(math.ceil(m / size)):
        rows = torch.randperm(size, generator=generator)
        cols = torch.randperm(size, generator=generator)
        blocks.append(hadamard[rows][:, cols] * random_signs((size,), generator=generator)[None, :])
    return torch.cat(blocks, dim=0)[:m, :d].to(dtype)
