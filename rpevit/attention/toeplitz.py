"""Block-Toeplitz sums over the 2-D patch grid: Y_i = sum_j c[r_j - r_i] X_j.

On an H x W grid the N x N matrix C_ij = c[r_j - r_i] is block-Toeplitz with Toeplitz blocks, so
C X is a 2-D cross-correlation of the (H, W) token image X with the (2H-1, 2W-1) offset table.
Embedding both in a circular convolution of size P >= 2H-1, Q >= 2W-1 (no wrap-around can
alias, every offset has its own cell) gives C X with 2-D FFTs in O(N log N * F) instead of
O(N^2 * F). Used by kernelized attention with Luo et al.'s relative bias (docs/mechanisms.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from rpevit.attention.base import relative_offsets


def fast_fft_size(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n: pocketfft / cuFFT are fastest on such sizes."""
    size = n
    while True:
        rest = size
        for p in (2, 3, 5):
            while rest % p == 0:
                rest //= p
        if rest == 1:
            return size
        size += 1


def circulant_kernel_index(grid: tuple[int, int], fft_shape: tuple[int, int],
                           device: torch.device | None = None) -> Tensor:
    """(P*Q,) index into [table.flatten(), 0] that lays the offset table out as a circular kernel.

    Y[p] = sum_q c[q - p + (H-1, W-1)] X[q] is the circular convolution of X with the kernel
    k[delta mod (P, Q)] = c[(H-1, W-1) - delta] for |delta| < (H, W), zero elsewhere.
    """
    h, w = grid
    p, q = fft_shape
    dy = torch.arange(p, device=device)
    dx = torch.arange(q, device=device)
    dy = torch.where(dy < h, dy, dy - p)  # signed shift delta_y in (-(P-1), H-1]
    dx = torch.where(dx < w, dx, dx - q)
    ty, tx = (h - 1) - dy, (w - 1) - dx  # table cell of offset -delta
    inside = ((ty >= 0) & (ty < 2 * h - 1))[:, None] & ((tx >= 0) & (tx < 2 * w - 1))[None, :]
    flat = ty[:, None] * (2 * w - 1) + tx[None, :]
    zero_slot = (2 * h - 1) * (2 * w - 1)
    return torch.where(inside, flat, torch.full_like(flat, zero_slot)).flatten()


def toeplitz_fft_matvec(weights: Tensor, x: Tensor, grid: tuple[int, int]) -> Tensor:
    """Y_i = sum_j weights[h, r_j - r_i] X_j via 2-D real FFTs.

    weights: (h, 2H-1, 2W-1) offset table c (already exponentiated); x: (b h N F), N = H * W in
    row-major order. Returns (b h N F). Cost O(b h F P Q log(P Q)).
    """
    h_grid, w_grid = grid
    fft_shape = (fast_fft_size(2 * h_grid - 1), fast_fft_size(2 * w_grid - 1))
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # half FFTs: powers of 2 only
    index = circulant_kernel_index(grid, fft_shape, weights.device)
    padded_table = torch.cat([weights.flatten(1), weights.new_zeros(weights.shape[0], 1)], dim=1)
    kernel = rearrange(padded_table[:, index], "h (p q) -> h p q", p=fft_shape[0])
    kernel_spectrum = torch.fft.rfft2(kernel.to(work.dtype))  # h, P, Q/2+1

    image = rearrange(work, "b h (y x) f -> b h f y x", y=h_grid)
    image = F.pad(image, (0, fft_shape[1] - w_grid, 0, fft_shape[0] - h_grid))  # explicit: fvcore sees P x Q
    spectrum = torch.fft.rfft2(image)
    product = spectrum * kernel_spectrum[None, :, None]
    out = torch.fft.irfft2(product, s=fft_shape)[..., :h_grid, :w_grid]
    return rearrange(out, "b h f y x -> b h (y x) f").to(x.dtype)


def toeplitz_dense_matrix(weights: Tensor, grid: tuple[int, int]) -> Tensor:
    """The explicit (h, N, N) matrix C_ij = weights[h, r_j - r_i]: the small-N path."""
    return weights.flatten(1)[:, relative_offsets(grid, weights.device)]
