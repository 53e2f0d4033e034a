"""Rotary position encodings on the 2-D patch grid (q/k hook).

Rotation plane k of a head turns (x_{2k}, x_{2k+1}) by the angle w_k . r_i, so that
(T(r_i) q)^T (T(r_j) k) = q^T T(r_j - r_i) k: the logit depends only on the relative position.
- `rope` (axial): plane k < d/4 turns by theta_k x and plane d/4 + k by theta_k y (the same d/4
  frequencies on each axis), theta_k = base^(-4k/d) for k < d/4.
- `rope_mixed` (Heo et al. 2024): every plane turns with a learned 2-D frequency w_k per head
  and layer, initialised as their reference code does (`mixed_frequencies`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from einops import rearrange
from torch import Tensor, nn

from rpevit.config import ConfigError
from rpevit.pe.base import PositionEncoding
from rpevit.registry import Option, register_pe

if TYPE_CHECKING:
    from rpevit.config import TrialConfig

ROPE_BASE = Option("rope_base", float, 100.0, "RoPE / STRING frequency base: theta_k = base^(-4k/d)", gt=0,
                   cost_free=True)  # also the STRING encodings' (circulant, Cayley, reflection)
ROPE_MIXED_BASE = Option("rope_mixed_base", float, 10.0, "RoPE-Mixed initial frequency magnitudes base^(-4k/d) (10: "
                         "Heo et al.'s reference code; rpevit/pe/rope.py)", gt=0, cost_free=True)


def axial_frequencies(head_dim: int, base: float) -> Tensor:
    """(d/2, 2) frequency vectors: the first half of the planes along x, the second along y; computed in
    float64, returned in the default dtype (the trial's `dtype` while a model is built)."""
    quarter = head_dim // 4
    theta = base ** (-4.0 * torch.arange(quarter, dtype=torch.float64) / head_dim)
    zeros = torch.zeros_like(theta)
    along_x = torch.stack([theta, zeros], dim=-1)
    along_y = torch.stack([zeros, theta], dim=-1)
    return torch.cat([along_x, along_y]).to(torch.get_default_dtype())


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate consecutive pairs of x (b h n d) by angles broadcastable to (b h n d/2)."""
    pairs = rearrange(x, "... (k two) -> ... k two", two=2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return rearrange(rotated, "... k two -> ... (k two)")


def _check_head_dim(cls: type, cfg: TrialConfig, source: str, multiple: int) -> None:
    if cfg.head_dim % multiple:
        raise ConfigError(
            f"{source}: field 'dim' has value {cfg.dim} (head dim {cfg.head_dim} with heads={cfg.heads}); "
            f"allowed: pe {cls.pe_name!r} needs a head dim divisible by {multiple}"
        )


@register_pe("rope", options=(ROPE_BASE,), colour="C2", family="rope and circulant", groups=("string",), order=3)
class AxialRoPE(PositionEncoding):
    hook = "qk"

    def __init__(self, *, rope_base: float = ROPE_BASE.default, **context: Any) -> None:
        super().__init__(**context)
        angles = self.positions @ axial_frequencies(self.head_dim, rope_base).T  # n, d/2
        self.register_buffer("angles", angles, persistent=False)

    @classmethod
    def check_config(cls, cfg: TrialConfig, source: str) -> None:
        _check_head_dim(cls, cfg, source, 4)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return apply_rotary(q, self.angles), apply_rotary(k, self.angles)


def mixed_frequencies(head_dim: int, heads: int, base: float, generator: torch.Generator) -> Tensor:
    """(heads, d/2, 2) initial 2-D frequencies of RoPE-Mixed, as Heo et al.'s reference code draws them
    (naver-ai/rope-vit, `init_random_2d_freqs`, its default theta 10): d/4 magnitudes base^(-4k/d), each
    used twice; per head one uniform random angle a, the first d/4 planes pointing along a and the other
    d/4 along a + pi/2 (at right angles). Float64 here; the module casts to the default dtype. The angle
    comes from the layer's seeded generator, not the global RNG (the distribution is theirs)."""
    quarter = head_dim // 4
    magnitude = base ** (-4.0 * torch.arange(quarter, dtype=torch.float64) / head_dim)
    angle = torch.rand(heads, 1, generator=generator, dtype=torch.float64) * 2 * math.pi  # one per head
    angles = torch.cat([angle.expand(heads, quarter), (angle + math.pi / 2).expand(heads, quarter)], dim=1)
    magnitudes = torch.cat([magnitude, magnitude])  # d/2
    return torch.stack([magnitudes * torch.cos(angles), magnitudes * torch.sin(angles)], dim=-1)


@register_pe("rope_mixed", options=(ROPE_MIXED_BASE,), colour="C8", order=4)
class MixedRoPE(PositionEncoding):
    hook = "qk"

    def __init__(self, *, rope_mixed_base: float = ROPE_MIXED_BASE.default, **context: Any) -> None:
        super().__init__(**context)
        frequencies = mixed_frequencies(self.head_dim, self.heads, rope_mixed_base, self.seed_generator())
        self.frequencies = nn.Parameter(frequencies.to(torch.get_default_dtype()))

    @classmethod
    def check_config(cls, cfg: TrialConfig, source: str) -> None:
        _check_head_dim(cls, cfg, source, 4)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        angles = torch.einsum("nc,hkc->hnk", self.positions, self.frequencies)
        return apply_rotary(q, angles), apply_rotary(k, angles)
