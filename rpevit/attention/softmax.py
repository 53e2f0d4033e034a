"""Exact softmax attention through `scaled_dot_product_attention` (flash / memory-efficient on GPU; see
`exact_softmax_attention` for the one step written out)."""
from __future__ import annotations

from torch import Tensor

from rpevit.attention.base import AttentionBackend, Modulation, exact_softmax_attention, softmax_attention_matrix
from rpevit.registry import register_attention


@register_attention("softmax", colour="C0", order=0)
class SoftmaxAttention(AttentionBackend):
    """softmax(q k^T / sqrt(d)) v, or with weights e_ij c_ij as the score hook's modulation applies itself."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, modulation: Modulation | None = None) -> Tensor:
        if modulation is None:
            return exact_softmax_attention(q, k, v)
        return modulation.softmax_attention(q, k, v)

    def attention_matrix(self, q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
        return softmax_attention_matrix(q, k, modulation)
