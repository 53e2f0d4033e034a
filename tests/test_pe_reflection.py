"""Reflection STRING: Householder products vs dense matrices, orthogonality, relativity, config."""
from __future__ import annotations

import pytest
import torch

from rpevit.config import ConfigError, TrialConfig
from rpevit.models import build_model
from rpevit.pe.reflection_string import ReflectionString, householder_product
from tests.string_reference import assert_is_rope_times_p, assert_logits_depend_on_offset_only

BASE = {"dataset": "digits", "dim": 32, "heads": 2, "pe": "reflection_string"}  # head dim 16


def householder_matrix(v: torch.Tensor) -> torch.Tensor:
    return torch.eye(v.numel(), dtype=v.dtype) - 2 * torch.outer(v, v) / (v @ v)


@pytest.mark.parametrize("block,count", [(16, 1), (16, 3), (4, 2), (8, 5)])
def test_householder_product_equals_dense_block_product(block, count):
    heads, d = 2, 16
    vectors = torch.randn(heads, d // block, count, block, dtype=torch.float64)
    x = torch.randn(3, heads, 5, d, dtype=torch.float64)
    for h in range(heads):
        blocks = []
        for b in range(d // block):
            p = torch.eye(block, dtype=torch.float64)
            for t in range(count):
                p = p @ householder_matrix(vectors[h, b, t])  # P = H(v_0) H(v_1) ...
            blocks.append(p)
        dense = torch.block_diag(*blocks)
        assert torch.allclose(householder_product(x, vectors)[:, h], x[:, h] @ dense.T, atol=1e-12)


@pytest.mark.parametrize("block,count", [(0, 2), (4, 3), (8, 1)])
def test_orthogonal_relative_and_brute_force(block, count):
    pe = ReflectionString(grid=(4, 4), heads=2, head_dim=16, reflection_block=block, reflection_count=count)
    p = pe.orthogonal()
    assert (p.transpose(-1, -2) @ p - torch.eye(16)).abs().max() < 1e-5
    size = block or 16
    mask = torch.block_diag(*[torch.ones(size, size)] * (16 // size)).bool()
    if block:
        assert p[:, ~mask].abs().max() == 0  # acts on disjoint blocks only
    assert torch.allclose(torch.linalg.det(p.double()), torch.full((2,), (-1.0) ** (count * (16 // size)),
                                                                   dtype=torch.float64), atol=1e-5)
    q, k = torch.randn(2, 2, 2, 16, 16)
    assert_is_rope_times_p(pe, p, q, k)
    assert_logits_depend_on_offset_only(pe, q, k)


def test_block_must_divide_head_dim():
    with pytest.raises(ConfigError, match="reflection_block.*6.*divisor of the head dim 16"):
        TrialConfig.from_dict({**BASE, "reflection_block": 6})
    with pytest.raises(ConfigError, match="reflection_count"):
        TrialConfig.from_dict({**BASE, "reflection_count": 0})


def test_gradients_reach_reflection_vectors():
    model = build_model(TrialConfig.from_dict({**BASE, "reflection_block": 8}), 1, 10)
    model(torch.randn(3, 1, 8, 8)).logsumexp(-1).sum().backward()
    for block in model.blocks:
        grad = block.attn.encodings[0].reflection_vectors.grad
        assert grad is not None and grad.abs().sum() > 0


@pytest.mark.parametrize("attention", ["softmax", "favor", "relu"])
def test_runs_with_every_backend(attention):
    out = build_model(TrialConfig.from_dict({**BASE, "attention": attention}), 1, 10)(torch.randn(2, 1, 8, 8))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_every_op_has_a_flop_handle():
    from rpevit.flops import count_flops

    cfg = TrialConfig.from_dict({**BASE, "reflection_block": 4, "depth": 1})
    total, unsupported = count_flops(build_model(cfg, 1, 10), torch.randn(1, 1, 8, 8))
    assert unsupported == {} and total > 0
