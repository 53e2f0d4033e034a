"""Reflection STRING: q_i -> RoPE(r_i) P q_i with P a product of Householder reflections.

H(v) = I - 2 v v^T / |v|^2 is orthogonal, so any product P is, and RoPE(r) P is a STRING
(relative: (RoPE(r_i) P q)^T (RoPE(r_j) P k) = q^T P^T RoPE(r_j - r_i) P k). The head's d
coordinates split into disjoint blocks of `reflection_block` (0 = one block, the whole head);
each block gets `reflection_count` learned reflections, accumulated in compact WY form,
P x = x - V^T (T (V x)). P is built once per forward from the WY form (O(d^2 * count)) and
folded into the q/k projection by the ViT, so the per-token work is RoPE's; `householder_product`
applies P to tokens directly in O(N d * count) where no projection is there to fold into.
Init: v ~ N(0, I) from the global (seeded) RNG, so P starts as a random orthogonal map, not I
(an odd number of reflections cannot make I).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from einops import rearrange
from torch import Tensor, nn

from rpevit.config import ConfigError
from rpevit.pe.rope import ROPE_BASE, AxialRoPE
from rpevit.registry import Option, register_pe

if TYPE_CHECKING:
    from rpevit.config import TrialConfig

REFLECTION_BLOCK = Option("reflection_block", int, 0, "coordinates per Householder block (reflection_string)", ge=0,
                          note="0 = the whole head")
REFLECTION_COUNT = Option("reflection_count", int, 2, "Householder reflections per block (reflection_string)",
                          ge=1, le=4096)


def householder_wy_rows(vectors: Tensor) -> Tensor:
    """W = T^T V (h, k, c, s) with H(v_0) ... H(v_{c-1}) = I - V^T T V (compact WY form).

    vectors V: (h, k, c, s), rows v_t, any norms. T is upper triangular with
    T^-1 = striu(V V^T) + diag(|v_t|^2 / 2) (Joffrain et al. 2006, "Accumulating Householder
    transformations, revisited"), so W is one triangular solve: no per-reflection loop.
    """
    # float32 with autocast off: torch.linalg.solve_triangular has no bf16 / fp16 kernel, and under
    # bf16 autocast the Gram product would come out in bf16 (`amp: bf16` failed here before)
    with torch.autocast(vectors.device.type, enabled=False):
        if vectors.dtype in (torch.float16, torch.bfloat16):
            vectors = vectors.float()
        gram = vectors @ vectors.transpose(-1, -2)  # h k c c
        t_inverse = gram.triu() - 0.5 * torch.diag_embed(gram.diagonal(dim1=-2, dim2=-1))
        return torch.linalg.solve_triangular(t_inverse.transpose(-1, -2), vectors, upper=False)


def householder_product(x: Tensor, vectors: Tensor) -> Tensor:
    """P x with P = H(v_0) H(v_1) ... H(v_{c-1}) per head and block: x - (x V^T) W, O(N d c).

    x: (... h n d); vectors: (h, blocks, c, block) with blocks * block = d.
    """
    rows = householder_wy_rows(vectors)
    x = rearrange(x, "... h n (k s) -> ... h k n s", k=vectors.shape[1])
    x = x - (x @ vectors.transpose(-1, -2)) @ rows  # two thin matmuls of rank c
    return rearrange(x, "... h k n s -> ... h n (k s)")


@register_pe("reflection_string", options=(ROPE_BASE, REFLECTION_BLOCK, REFLECTION_COUNT), colour="C6",
             family="Cayley and reflection STRING", groups=("string",), order=8)
class ReflectionString(AxialRoPE):

    def __init__(self, *, reflection_block: int = REFLECTION_BLOCK.default,
                 reflection_count: int = REFLECTION_COUNT.default, **context: Any) -> None:
        super().__init__(**context)
        block = reflection_block or self.head_dim
        self.reflection_vectors = nn.Parameter(
            torch.randn(self.heads, self.head_dim // block, reflection_count, block)
        )

    @classmethod
    def check_config(cls, cfg: TrialConfig, source: str) -> None:
        super().check_config(cfg, source)
        if cfg.reflection_block and cfg.head_dim % cfg.reflection_block:
            raise ConfigError(
                f"{source}: field 'reflection_block' has value {cfg.reflection_block}; allowed: 0 (whole head) "
                f"or a divisor of the head dim {cfg.head_dim} (dim={cfg.dim}, heads={cfg.heads})"
            )

    def orthogonal(self) -> Tensor:
        """The dense (h, d, d) P = H(v_0) ... H(v_{c-1}) per block, from the WY form."""
        eye = torch.eye(self.head_dim, dtype=self.reflection_vectors.dtype, device=self.reflection_vectors.device)
        columns = householder_product(eye.expand(self.heads, -1, -1), self.reflection_vectors)  # rows: P e_i
        return columns.transpose(-1, -2)

    def head_transform(self) -> Tensor:
        return self.orthogonal()
