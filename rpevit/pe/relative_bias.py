"""`luo_rpe` (score hook): Luo et al. 2021 relative bias c_ij = exp(b[r_j - r_i]).

A learned table b per head over all (2H-1)(2W-1) 2-D offsets, per layer, zero-initialised (c = 1:
training starts from the plain backend). Softmax adds b as a float mask; kernelized backends
multiply their weights by exp(b) with block-Toeplitz FFT sums (rpevit.attention.toeplitz).
"""
from __future__ import annotations

import torch
from torch import nn

from rpevit.attention.base import RelativeBias
from rpevit.config import TrialConfig
from rpevit.pe.base import PositionEncoding
from rpevit.registry import register_pe


@register_pe("luo_rpe")
class LuoRelativeBias(PositionEncoding):
    hook = "score"

    def __init__(self, cfg: TrialConfig, *, layer: int = 0) -> None:
        super().__init__(cfg, layer=layer)
        h, w = cfg.grid
        self.table = nn.Parameter(torch.zeros(cfg.heads, 2 * h - 1, 2 * w - 1))

    def modulation(self) -> RelativeBias:
        return RelativeBias(self.table, self.grid)
