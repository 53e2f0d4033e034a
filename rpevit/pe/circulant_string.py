"""`circulant_string` (q/k hook): STRING with circulant generators (Schenck et al. 2025).

R(r) = exp(r_x L_x + r_y L_y), L_k = C_k - C_k^T with C_k circulant (first column c_k, d learned
numbers per head, layer and axis). Circulants are diagonalised by the DFT, so the L_k commute,
R(r)^T R(s) = R(s - r), and R(r) z = IDFT(exp(i (r . lambda)) DFT(z)) with i lambda_k =
DFT(c_k) - conj DFT(c_k) = 2i Im DFT(c_k): never a d x d matrix per token. lambda is odd in
frequency, so the d//2+1 bins of a real transform suffice; bins 0 and d/2 have lambda = 0.

The transforms are real matrix products with cos/sin tables (`real_dft_tables`), not complex FFTs:
O(d^2) per token instead of O(d log d) (not timed against an FFT), and they keep complex tensors out of the
compiled, vmapped training step (Inductor falls back for complex ops, and its CUDA path has had
crashes and a silent wrong result there: pytorch/pytorch#185396, #181625, #172826, #174891). With
X = z C - i z S (C_tf = cos 2 pi f t / d, S_tf = sin 2 pi f t / d), the rotated spectrum
X e^{i theta} and the inverse z'_t = sum_f w_f Re(X'_f e^{2 pi i f t / d}) / d (w = 1 at bins 0
and d/2, else 2, as irfft weighs them) are exactly the rfft/irfft path
(tests/test_pe_circulant.py: float64, against the complex FFTs and matrix_exp).

Init is RoPE-like: c_k is chosen so that lambda_k equals axial RoPE frequencies base^(-4t/d) on
alternate bins (x on even, y on odd rotating bins), i.e. RoPE in the Fourier basis.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from einops import einsum
from torch import Tensor, nn

from rpevit.config import ConfigError
from rpevit.pe.base import PositionEncoding
from rpevit.pe.rope import ROPE_BASE
from rpevit.registry import register_pe

if TYPE_CHECKING:
    from rpevit.config import TrialConfig


def real_dft_tables(d: int, dtype: torch.dtype, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """(d, d//2+1) tables C_tf = cos(2 pi f t / d) and S_tf = sin(2 pi f t / d) of the real DFT.

    The phase f t is reduced mod d in integers before the angle is formed, so the tables are exact to
    the dtype's rounding at every d (no growth of the angle's error with f t)."""
    t = torch.arange(d, device=device)
    phase = (t[:, None] * torch.arange(d // 2 + 1, device=device)[None, :]) % d
    angle = phase.to(dtype) * (2 * math.pi / d)
    return torch.cos(angle), torch.sin(angle)


def circulant_spectrum(coefficients: Tensor) -> Tensor:
    """lambda = 2 Im DFT(c) = -2 c S over the d//2+1 bins: (..., d) -> (..., d//2+1)."""
    _, sin = real_dft_tables(coefficients.shape[-1], coefficients.dtype, coefficients.device)
    return -2 * coefficients @ sin


def circulant_rotate(x: Tensor, angles: Tensor) -> Tensor:
    """R z = IDFT(exp(i angles) DFT(z)) along the last axis; x (... n d), angles (... n d//2+1).

    Real arithmetic only (module docstring). Half-precision inputs are rotated in float32 with
    autocast off (a bf16 DFT loses ~2 digits over d terms) and returned in their dtype.
    """
    d = x.shape[-1]
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    with torch.autocast(x.device.type, enabled=False):
        z, theta = x.to(work), angles.to(work)
        cos, sin = real_dft_tables(d, work, x.device)
        re, minus_im = z @ cos, z @ sin  # X_f = re - i minus_im
        c, s = torch.cos(theta), torch.sin(theta)
        rot_re, rot_im = re * c + minus_im * s, re * s - minus_im * c  # X_f e^{i theta_f}
        weight = torch.tensor([1.0 if f == 0 or 2 * f == d else 2.0 for f in range(d // 2 + 1)],  # irfft's
                              dtype=work, device=x.device) / d
        rotated = (rot_re * weight) @ cos.T - (rot_im * weight) @ sin.T
    return rotated.to(x.dtype)


def rope_like_coefficients(heads: int, head_dim: int, base: float) -> Tensor:
    """(heads, 2, d) circulant columns whose spectra lambda_x, lambda_y are axial RoPE frequencies."""
    bins = head_dim // 2 + 1
    spectrum = torch.zeros(2, bins, dtype=torch.float64)
    for t in range((head_dim - 1) // 2):  # rotating bins 1 .. (d-1)//2
        spectrum[t % 2, t + 1] = base ** (-4.0 * (t // 2) / head_dim)
    columns = torch.fft.irfft(1j * spectrum / 2, n=head_dim, dim=-1)  # Im FFT(c) = lambda / 2
    return columns.to(torch.get_default_dtype()).expand(heads, 2, head_dim).clone()  # the trial's dtype


@register_pe("circulant_string", options=(ROPE_BASE,), colour="C3", family="rope and circulant", groups=("string",),
             order=5)
class CirculantString(PositionEncoding):
    hook = "qk"

    def __init__(self, *, rope_base: float = ROPE_BASE.default, **context: Any) -> None:
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
        """(h, n, d//2+1) rotation angle r_i . lambda of every Fourier bin, in the parameters' dtype
        (autocast off: a bf16 angle of ~10 rad is off by ~0.04 rad)."""
        with torch.autocast(self.coefficients.device.type, enabled=False):
            spectrum = circulant_spectrum(self.coefficients)
            return einsum(self.positions.to(spectrum.dtype), spectrum, "n k, h k f -> h n f")

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        angles = self.angles()
        return circulant_rotate(q, angles), circulant_rotate(k, angles)
