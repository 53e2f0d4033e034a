"""`none` (no position information) and `ape` (learned absolute embedding, the token hook)."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rpevit.pe.base import PositionEncoding
from rpevit.registry import register_pe


@register_pe("none", colour="C7", order=0)
class NoPosition(PositionEncoding):
    hook = "none"


@register_pe("ape", colour="C0", order=1)
class LearnedAbsolute(PositionEncoding):
    """x_i + e_i with a learned e per patch position (ViT's APE, trunc-normal std 0.02 as in timm)."""

    hook = "token"

    def __init__(self, **context: Any) -> None:
        super().__init__(**context)
        n = self.grid[0] * self.grid[1]
        self.embedding = nn.Parameter(torch.zeros(1, n, self.dim))
        nn.init.trunc_normal_(self.embedding, std=0.02)

    def add_to_tokens(self, x: Tensor) -> Tensor:
        return x + self.embedding
