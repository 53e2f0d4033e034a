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


@dataclass
class LowRankModulation:
    """c_ij = sum_l f[.., i, l] g[.., j, l] >= 0; f, g of shape (h, N, L) or (b, h, N, L)."""

    f: Tensor
    g: Tensor

    def dense(self) -> Tensor:
        return torch.einsum("...il,...jl->...ij", self.f, self.g)


Modulation = Union[RelativeBias, LowRankModulation]


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

    @classmethod
    def check_config(cls, cfg: "TrialConfig", source: str) -> None:
        """Raise ConfigError if this backend cannot run with cfg."""
