"""Brute-force checks shared by the STRING tests: every STRING is T(r_i) = RoPE(r_i) P.

`encode_qk` must equal dense per-token matrices RoPE(r_i) P (RoPE built by applying the rotary
map to the identity), and a logit between tokens with the same q and k contents must depend on
r_j - r_i only. Used by the Cayley (dense and sparse S) and reflection tests.
"""
from __future__ import annotations

import torch

from rpevit.attention.base import relative_offsets
from rpevit.pe.rope import apply_rotary


def rope_matrices(angles: torch.Tensor, d: int) -> torch.Tensor:
    """(n, d, d) dense RoPE(r_i), float64, from the rotary map applied to the identity."""
    eye = torch.eye(d, dtype=torch.float64).expand(angles.shape[0], d, d)
    return apply_rotary(eye, angles[:, None, :].double()).transpose(-1, -2)


def assert_is_rope_times_p(pe, p: torch.Tensor, q: torch.Tensor, k: torch.Tensor, atol: float = 1e-5) -> None:
    """pe.encode_qk(q, k) == (RoPE(r_i) P q_i, RoPE(r_i) P k_i) for P = p[h], token by token."""
    rq, rk = pe.encode_qk(q.float(), k.float())
    t = rope_matrices(pe.angles, q.shape[-1])[None] @ p.double()[:, None]  # h n d d
    assert torch.allclose(rq.double(), torch.einsum("hnij,bhnj->bhni", t, q.double()), atol=atol)
    assert torch.allclose(rk.double(), torch.einsum("hnij,bhnj->bhni", t, k.double()), atol=atol)


def assert_logits_depend_on_offset_only(pe, q: torch.Tensor, k: torch.Tensor, atol: float = 1e-4) -> None:
    """With the first token's q and k contents at every token, logit(i, j) is a function of r_j - r_i."""
    rq, rk = pe.encode_qk(q[:, :, :1].expand_as(q).float(), k[:, :, :1].expand_as(k).float())
    logits = rq @ rk.transpose(-1, -2)
    offsets = relative_offsets(pe.grid)
    for o in offsets.unique():
        group = logits[..., offsets == o]
        assert torch.allclose(group, group[..., :1].expand_as(group), atol=atol)
