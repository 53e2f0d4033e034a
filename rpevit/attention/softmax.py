"""Exact softmax attention through `scaled_dot_product_attention` (flash / memory-efficient on GPU)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor

from rpevit.attention.base import (AttentionBackend, LowRankModulation, Modulation, RelativeBias,
                                   softmax_attention_matrix)
from rpevit.registry import register_attention


def low_rank_softmax_attention(q: Tensor, k: Tensor, v: Tensor, modulation: LowRankModulation) -> Tensor:
    """softmax attention with weights e_ij c_ij, c_ij = sum_l f_il g_jl, exactly and without log c.

    One SDPA call on the values [g_l v, g_l] (all l) gives N_il = sum_j s_ij g_jl v_j and
    D_il = sum_j s_ij g_jl (s = softmax, whose normaliser cancels); out_i = sum_l f_il N_il /
    sum_l f_il D_il. Exact for any c >= 0, even where c_ij = 0 or f, g change sign.
    """
    f, g = (x if x.dim() == 4 else x.unsqueeze(0) for x in (modulation.f, modulation.g))
    v_one = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # b h n (d+1)
    values = einsum(g.to(v.dtype), v_one, "b h n l, b h n e -> b h n l e")
    attended = F.scaled_dot_product_attention(q, k, rearrange(values, "b h n l e -> b h n (l e)"))
    attended = rearrange(attended, "b h n (l e) -> b h n l e", e=v_one.shape[-1])
    out = einsum(f.to(v.dtype), attended, "b h n l, b h n l e -> b h n e")
    return out[..., :-1] / out[..., -1:]


@register_attention("softmax")
class SoftmaxAttention(AttentionBackend):
    """softmax(q k^T / sqrt(d) + log c) v; a relative bias enters as an additive float mask."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, modulation: Modulation | None = None) -> Tensor:
        if isinstance(modulation, LowRankModulation):
            return low_rank_softmax_attention(q, k, v, modulation)
        mask = modulation.dense_log().to(q.dtype) if isinstance(modulation, RelativeBias) else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def attention_matrix(self, q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
        return softmax_attention_matrix(q, k, modulation)
