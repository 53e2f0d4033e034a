"""Cayley-STRING and sparse-S Cayley-STRING: orthogonality, relativity, dense brute force, f = 1."""
from __future__ import annotations

import pytest
import torch

from rpevit.config import ConfigError, TrialConfig
from rpevit.models import build_model
from rpevit.pe.cayley_string import CayleyString, SparseCayleyString, cayley_orthogonal
from rpevit.pe.rope import AxialRoPE
from tests.string_reference import assert_is_rope_times_p, assert_logits_depend_on_offset_only

BASE = {"dataset": "digits", "dim": 32, "heads": 2}  # head dim 16, 4 x 4 grid


def make(cls, **options):
    """The encoding as BASE's config would build it in layer 1 (options: its own, or the seed)."""
    return cls(grid=(4, 4), heads=2, head_dim=16, layer=1, **options)


def randomise(pe, scale=0.7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        pe.skew_entries.copy_(scale * torch.randn(pe.skew_entries.shape, generator=gen))
    return pe


def test_cayley_orthogonal_matches_definition():
    s = torch.randn(3, 8, 8, dtype=torch.float64)
    s = s - s.transpose(-1, -2)
    p = cayley_orthogonal(s)
    eye = torch.eye(8, dtype=torch.float64)
    assert torch.allclose(p, (eye - s) @ torch.linalg.inv(eye + s), atol=1e-12)
    assert torch.allclose(p.transpose(-1, -2) @ p, eye.expand(3, 8, 8), atol=1e-12)
    assert torch.allclose(torch.linalg.det(p), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("cls,extra", [
    (CayleyString, {}),
    (SparseCayleyString, {"string_sparsity": 0.3, "cayley_solver": "dense"}),
    (SparseCayleyString, {"string_sparsity": 0.3, "cayley_solver": "sparse"}),
])
def test_orthogonal_relative_and_brute_force(cls, extra):
    pe = randomise(make(cls, **extra))
    p = pe.orthogonal()
    assert (p.transpose(-1, -2) @ p - torch.eye(16)).abs().max() < 1e-5
    q, k = torch.randn(2, 2, 16, 16, dtype=torch.float64), torch.randn(2, 2, 16, 16, dtype=torch.float64)
    assert_is_rope_times_p(pe, p, q, k)
    assert_logits_depend_on_offset_only(pe, q, k)


def test_init_is_axial_rope():
    pe = make(CayleyString)
    rope = AxialRoPE(grid=(4, 4), heads=2, head_dim=16)
    q, k = torch.randn(2, 2, 2, 16, 16)
    assert torch.allclose(pe.orthogonal(), torch.eye(16).expand(2, 16, 16))
    for a, b in zip(pe.encode_qk(q, k), rope.encode_qk(q, k)):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("solver", ["dense", "sparse"])
def test_full_sparsity_reproduces_dense_cayley(solver):
    dense = randomise(make(CayleyString))
    sparse = make(SparseCayleyString, string_sparsity=1.0, cayley_solver=solver)
    assert torch.equal(sparse.rows, dense.rows.expand(2, -1)) and torch.equal(sparse.cols, dense.cols.expand(2, -1))
    with torch.no_grad():
        sparse.skew_entries.copy_(dense.skew_entries)
    assert torch.allclose(sparse.orthogonal(), dense.orthogonal(), atol=1e-5)
    q, k = torch.randn(2, 3, 2, 16, 16)
    for a, b in zip(sparse.encode_qk(q, k), dense.encode_qk(q, k)):
        assert torch.allclose(a, b, atol=1e-5)


def test_sparse_pattern_fraction_seeded_and_above_diagonal():
    pe = make(SparseCayleyString, string_sparsity=0.2)
    count = round(0.2 * 16 * 15 / 2)
    assert pe.rows.shape == (2, count) and pe.skew_entries.shape == (2, count)
    assert bool((pe.rows < pe.cols).all())
    for h in range(2):
        pairs = set(zip(pe.rows[h].tolist(), pe.cols[h].tolist()))
        assert len(pairs) == count  # no duplicates
    assert not torch.equal(pe.rows[0], pe.rows[1]) or not torch.equal(pe.cols[0], pe.cols[1])
    again = make(SparseCayleyString, string_sparsity=0.2)
    assert torch.equal(again.rows, pe.rows) and torch.equal(again.cols, pe.cols)
    other = make(SparseCayleyString, string_sparsity=0.2, seed=1)
    assert not (torch.equal(other.rows, pe.rows) and torch.equal(other.cols, pe.cols))
    s = pe.skew()
    assert torch.count_nonzero(s) == 0  # init 0: P = I
    assert make(SparseCayleyString, string_sparsity=1e-4).rows.shape == (2, 1)  # at least one entry


def test_solver_choice_and_bad_sparsity():
    assert make(SparseCayleyString, cayley_solver="sparse").solver == "sparse"
    assert make(SparseCayleyString, cayley_solver="dense").solver == "dense"
    with pytest.raises(ConfigError, match="string_sparsity.*1.5"):
        TrialConfig.from_dict({**BASE, "pe": "sparse_cayley_string", "string_sparsity": 1.5})
    with pytest.raises(ConfigError, match="cayley_solver"):
        TrialConfig.from_dict({**BASE, "pe": "sparse_cayley_string", "cayley_solver": "lu"})


@pytest.mark.slow
@pytest.mark.parametrize("pe,extra", [
    ("cayley_string", {}),
    ("sparse_cayley_string", {"cayley_solver": "dense"}),
    ("sparse_cayley_string", {"cayley_solver": "sparse"}),
])
def test_gradients_reach_skew_entries_in_model(pe, extra):
    cfg = TrialConfig.from_dict({**BASE, "pe": pe, **extra, "string_sparsity": 0.2})
    model = build_model(cfg, 1, 10)
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.arange(4))
    loss.backward()
    for block in model.blocks:
        grad = block.attn.encodings[0].skew_entries.grad
        assert grad is not None and grad.abs().sum() > 0


def test_sparse_and_dense_solver_give_same_model_gradients():
    grads = []
    for solver in ("dense", "sparse"):
        cfg = TrialConfig.from_dict({**BASE, "pe": "sparse_cayley_string", "cayley_solver": solver,
                                     "string_sparsity": 0.3})
        model = build_model(cfg, 1, 10)
        for block in model.blocks:
            randomise(block.attn.encodings[0], scale=0.5, seed=block.attn.encodings[0].layer)
        torch.manual_seed(0)
        model(torch.randn(4, 1, 8, 8)).square().sum().backward()
        grads.append(torch.cat([b.attn.encodings[0].skew_entries.grad.flatten() for b in model.blocks]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "favor", "relu"])
def test_runs_with_every_backend(attention):
    cfg = TrialConfig.from_dict({**BASE, "pe": "cayley_string", "attention": attention})
    out = build_model(cfg, 1, 10)(torch.randn(2, 1, 8, 8))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_every_op_has_a_flop_handle():
    from rpevit.flops import count_flops

    cfg = TrialConfig.from_dict({**BASE, "pe": "cayley_string", "depth": 1})
    total, unsupported = count_flops(build_model(cfg, 1, 10), torch.randn(1, 1, 8, 8))
    assert unsupported == {} and total > 0


@pytest.mark.parametrize("pe_name", ["cayley_string", "sparse_cayley_string", "reflection_string"])
@pytest.mark.parametrize("attention", ["softmax", "favor"])
def test_folding_p_into_the_projection_equals_applying_it_to_q_and_k(pe_name, attention):
    """The ViT folds P into the q/k weights; the result must equal P applied to every token."""
    from einops import rearrange

    cfg = TrialConfig.from_dict({"pe": pe_name, "attention": attention, "dim": 32, "heads": 2,
                                 "depth": 1, "string_sparsity": 0.5})
    attn = build_model(cfg, 1, 10).blocks[0].attn.double()
    pe = attn.encodings[0]
    with torch.no_grad():
        for name, param in pe.named_parameters():
            param.normal_(0, 0.3)  # a P far from the identity
    x = torch.randn(3, 16, 32, dtype=torch.float64)
    q, k, v = rearrange(attn.qkv(x), "b n (three h d) -> three b h n d", three=3, h=2)
    q, k = pe.encode_qk(q, k)
    direct = attn.proj(rearrange(attn.backend(q, k, v), "b h n d -> b n (h d)"))
    assert pe.head_transform() is not None
    torch.testing.assert_close(attn(x), direct, atol=1e-10, rtol=1e-10)
