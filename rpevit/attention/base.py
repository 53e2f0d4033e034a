"""What every attention backend takes: q, k, v (b h n d) after the q/k hook, and optionally the
score-hook modulation c_ij >= 0 that multiplies the (unnormalised) attention weights.

Backends implement `forward(q, k, v, modulation=None) -> (b h n d)` and handle both modulation
kinds their own efficient way (softmax: an additive float mask; kernelized: FFT Toeplitz sums or
feature tensor products). The dense forms below are the brute-force definitions the tests use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Union

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from rpevit.config import TrialConfig


def relative_offsets(grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
    """(N, N) index into a (2H-1)(2W-1) table of offset r_j - r_i, row-major (dy, dx)."""
    h, w = grid
    ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[None, :] - ys[:, None] + (h - 1)
    dx = xs[None, :] - xs[:, None] + (w - 1)
    return dy * (2 * w - 1) + dx


@dataclass
class RelativeBias:
    """Luo et al. 2021: c_ij = exp(b[h, r_j - r_i]); `table` is b, shape (h, 2H-1, 2W-1)."""

    table: Tensor
    grid: tuple[int, int]

    def dense_log(self) -> Tensor:
        """log c as an (h, N, N) matrix (the softmax float mask and the brute-force reference)."""
        idx = relative_offsets(self.grid, self.table.device)
        return self.table.flatten(1)[:, idx]

    def dense(self) -> Tensor:
        """c as an (h, N, N) matrix, up to a per-head factor (which cancels in normalised attention)."""
        log_c = self.dense_log()
        return torch.exp(log_c - log_c.amax(dim=(-2, -1), keepdim=True))


@dataclass
class LowRankModulation:
    """c_ij = sum_l f[.., i, l] g[.., j, l] >= 0; f, g of shape (h, N, L) or (b, h, N, L)."""

    f: Tensor
    g: Tensor

    def dense(self) -> Tensor:
        return torch.einsum("...il,...jl->...ij", self.f, self.g)


Modulation = Union[RelativeBias, LowRankModulation]


def normalize_rows(weights: Tensor) -> Tensor:
    """Rows of non-negative weights -> rows of attention probabilities."""
    return weights / weights.sum(dim=-1, keepdim=True)


def softmax_attention_matrix(q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
    """Exact (b h n n) attention: A_ij proportional to exp(q_i^T k_j / sqrt(d)) c_ij; the dense reference."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    if modulation is not None:
        weights = weights * modulation.dense().to(weights.dtype)
    return normalize_rows(weights)


def total_variation(a: Tensor, b: Tensor) -> Tensor:
    """Total-variation distance 1/2 sum_j |a_ij - b_ij| between attention rows: (..., n, n) -> (..., n)."""
    return 0.5 * (a - b).abs().sum(dim=-1)


class AttentionBackend(nn.Module):
    """Base class of the backends; subclasses define forward(q, k, v, modulation=None).

    `layer` lets random features differ per layer while all come from the trial seed.
    """

    linear_time: ClassVar[bool] = False

    def __init__(self, cfg: "TrialConfig", *, layer: int = 0) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.heads = cfg.heads
        self.layer = layer

    @property
    def random_features(self) -> bool:
        """True if the output depends on a random draw (judged over fresh draws, `use_draw`)."""
        return False

    @classmethod
    def check_config(cls, cfg: "TrialConfig", source: str) -> None:
        """Raise ConfigError if this backend cannot run with cfg."""

    def attention_matrix(self, q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
        """The (b h n n) row-stochastic matrix A this backend applies to v (forward = A v), densely.

        O(N^2): for fidelity metrics and tests on small N, never on the training path.
        """
        raise NotImplementedError
