"""`circulant_string` (q/k hook): STRING with circulant generators (Schenck et al. 2025).

R(r) = exp(r_x L_x + r_y L_y), L_k = C_k - C_k^T with C_k circulant (first column c_k, d learned
numbers per head, layer and axis). Circulants are diagonalised by the DFT, so the L_k commute,
R(r)^T R(s) = R(s - r), and R(r) z = IFFT(exp(i (r . lambda)) FFT(z)) with i lambda_k =
FFT(c_k) - conj FFT(c_k) = 2i Im FFT(c_k): O(d log d) per token, never a d x d matrix per token.
lambda is odd in frequency, so real FFTs suffice; bins 0 and d/2 have lambda = 0 and never rotate.

Init is RoPE-like: c_k is chosen so that lambda_k equals axial RoPE frequencies base^(-4t/d) on
alternate bins (x on even, y on odd rotating bins), i.e. RoPE in the Fourier basis.
"""
from __future__ import annotations

from typing import Any

import torch
from einops import einsum
from torch import Tensor, nn

from rpevit.config import ConfigError, TrialConfig
from rpevit.pe.base import PositionEncoding
from rpevit.registry import register_pe


def circulant_spectrum(coefficients: Tensor) -> Tensor:
    """lambda = 2 Im FFT(c), over the d//2+1 real-FFT bins: (..., d) -> (..., d//2+1)."""
    return 2 * torch.fft.rfft(coefficients, dim=-1).imag


def circulant_rotate(x: Tensor, angles: Tensor) -> Tensor:
    """R z = IFFT(exp(i angles) FFT(z)) along the last axis; x (... n d), angles (... n d//2+1).

    FFTs run in float32 at least (half-precision FFTs are restricted to powers of two on GPU).
    """
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    phase = torch.polar(torch.ones_like(angles, dtype=work.dtype), angles.to(work.dtype))
    rotated = torch.fft.irfft(torch.fft.rfft(work, dim=-1) * phase, n=x.shape[-1], dim=-1)
    return rotated.to(x.dtype)


def rope_like_coefficients(heads: int, head_dim: int, base: float) -> Tensor:
    """(heads, 2, d) circulant columns whose spectra lambda_x, lambda_y are axial RoPE frequencies."""
    bins = head_dim // 2 + 1
    spectrum = torch.zeros(2, bins, dtype=torch.float64)
    for t in range((head_dim - 1) // 2):  # rotating bins 1 .. (d-1)//2
        spectrum[t % 2, t + 1] = base ** (-4.0 * (t // 2) / head_dim)
    columns = torch.fft.irfft(1j * spectrum / 2, n=head_dim, dim=-1)  # Im FFT(c) = lambda / 2
    return columns.float().expand(heads, 2, head_dim).clone()


@register_pe("circulant_string")
class CirculantString(PositionEncoding):
    hook = "qk"

    def __init__(self, *, rope_base: float = 100.0, **context: Any) -> None:
        super().__init__(**context)
        self.coefficients = nn.Parameter(rope_like_coefficients(self.heads, self.head_dim, rope_base))

    @classmethod
    def check_config(cls, cfg: TrialConfig, source: str) -> None:
        if cfg.head_dim < 3:
            raise ConfigError(
                f"{source}: field 'dim' has value {cfg.dim} (head dim {cfg.head_dim} with heads={cfg.heads}); "
                f"allowed: pe {cls.pe_name!r} needs a head dim >= 3 (smaller circulants never rotate)"
            )

    def angles(self) -> Tensor:
        """(h, n, d//2+1) rotation angle r_i . lambda of every Fourier bin."""
        return einsum(self.positions, circulant_spectrum(self.coefficients), "n k, h k f -> h n f")

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        angles = self.angles()
        return circulant_rotate(q, angles), circulant_rotate(k, angles)
