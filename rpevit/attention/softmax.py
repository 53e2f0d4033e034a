"""Exact softmax attention through `scaled_dot_product_attention` (flash / memory-efficient on GPU)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rpevit.attention.base import AttentionBackend, LowRankModulation, Modulation, RelativeBias
from rpevit.registry import register_attention


@register_attention("softmax")
class SoftmaxAttention(AttentionBackend):
    """softmax(q k^T / sqrt(d) + log c) v; the score hook enters as an additive float mask."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, modulation: Modulation | None = None) -> Tensor:
        mask = None
        if isinstance(modulation, RelativeBias):
            mask = modulation.dense_log().to(q.dtype)
        elif isinstance(modulation, LowRankModulation):
            mask = torch.log(modulation.dense().clamp_min(torch.finfo(torch.float32).tiny)).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
