"""Sparse CG Cayley solve vs the dense LU, and its implicit-differentiation gradient."""
from __future__ import annotations

import pytest
import torch

from rpevit.pe.sparse_solve import (
    cayley_solve_dense,
    cayley_solve_sparse,
    normal_equations_cg,
    skew_from_entries,
    skew_sparse_operator,
)


def random_skew_entries(heads: int, dim: int, count: int, scale: float = 1.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = torch.triu_indices(dim, dim, offset=1)
    picks = torch.stack([torch.randperm(rows.numel(), generator=gen)[:count] for _ in range(heads)])
    values = scale * torch.randn(heads, count, generator=gen, dtype=torch.float64)
    return values, rows[picks], cols[picks]


def test_skew_from_entries_places_mirrored_entries():
    values, rows, cols = random_skew_entries(2, 6, 5)
    s = skew_from_entries(values, rows, cols, 6)
    assert torch.equal(s, -s.transpose(-1, -2))
    for h in range(2):
        for v, r, c in zip(values[h], rows[h], cols[h]):
            assert s[h, r, c] == v and s[h, c, r] == -v
    assert torch.count_nonzero(s) == 2 * values.numel()


def test_sparse_operator_equals_dense_block_diagonal():
    values, rows, cols = random_skew_entries(3, 7, 9)
    dense = torch.block_diag(*skew_from_entries(values, rows, cols, 7))
    assert torch.allclose(skew_sparse_operator(values, rows, cols, 7).to_dense(), dense)


@pytest.mark.parametrize("dim,count,scale", [(8, 3, 1.0), (12, 66, 0.5), (16, 20, 3.0)])
def test_sparse_solve_equals_dense_solve(dim, count, scale):
    values, rows, cols = random_skew_entries(3, dim, count, scale)
    rhs = torch.randn(3, dim, 5, dtype=torch.float64)
    info: list = []
    x = cayley_solve_sparse(values, rows, cols, rhs, info)
    s = skew_from_entries(values, rows, cols, dim)
    brute = torch.linalg.inv(torch.eye(dim, dtype=torch.float64) + s) @ rhs
    assert torch.allclose(x, brute, atol=1e-10)
    assert torch.allclose(cayley_solve_dense(values, rows, cols, rhs), brute, atol=1e-10)
    assert info[0].relative_residual <= 1e-12


def test_cg_converges_within_half_dim_steps():
    """I - S^2 has at most d/2 + 1 distinct eigenvalues, so CG ends in <= d/2 + 1 steps (+ roundoff)."""
    dim = 20
    values, rows, cols = random_skew_entries(2, dim, dim * (dim - 1) // 2, scale=2.0)
    rhs = torch.randn(2, dim, 3, dtype=torch.float64)
    z, info = normal_equations_cg(skew_sparse_operator(values, rows, cols, dim), rhs, tol=1e-10)
    s = skew_from_entries(values, rows, cols, dim)
    eye = torch.eye(dim, dtype=torch.float64)
    assert torch.allclose((eye - s @ s) @ z, rhs, atol=1e-8)
    assert info.iterations <= dim // 2 + 1 + 3


def test_sparse_solve_gradcheck():
    values, rows, cols = random_skew_entries(2, 6, 7, scale=0.8)
    rhs = torch.randn(2, 6, 3, dtype=torch.float64)
    values.requires_grad_()
    rhs.requires_grad_()
    assert torch.autograd.gradcheck(lambda v, b: cayley_solve_sparse(v, rows, cols, b), (values, rhs))


def test_sparse_gradient_equals_dense_path_gradient():
    values, rows, cols = random_skew_entries(3, 10, 15, scale=1.5)
    rhs = torch.eye(10, dtype=torch.float64).expand(3, -1, -1).clone()
    weight = torch.randn(3, 10, 10, dtype=torch.float64)
    grads = []
    for solve in (cayley_solve_sparse, cayley_solve_dense):
        v, b = values.clone().requires_grad_(), rhs.clone().requires_grad_()
        (solve(v, rows, cols, b) * weight).sum().backward()
        grads.append((v.grad, b.grad))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-10)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-10)
    assert grads[0][0].abs().min() > 0  # every learned entry gets a gradient


def test_float32_sparse_solve_is_accurate():
    values, rows, cols = random_skew_entries(4, 32, 50, scale=1.0)
    values = values.float()
    rhs = torch.eye(32).expand(4, -1, -1)
    info: list = []
    x = cayley_solve_sparse(values, rows, cols, rhs, info)
    assert torch.allclose(x, cayley_solve_dense(values, rows, cols, rhs), atol=1e-5)
    assert info[0].relative_residual <= 10 * torch.finfo(torch.float32).eps


@pytest.mark.slow
def test_flop_handle_counts_sparse_products_at_cg_bound():
    from rpevit.config import TrialConfig
    from rpevit.flops import count_flops
    from rpevit.models import build_model

    counts = {}
    for solver in ("dense", "sparse"):
        cfg = TrialConfig.from_dict({"dataset": "digits", "pe": "sparse_cayley_string", "cayley_solver": solver,
                                     "dim": 32, "heads": 2, "depth": 1, "string_sparsity": 0.25})
        counts[solver], unsupported = count_flops(build_model(cfg, 1, 10), torch.randn(1, 1, 8, 8))
        assert unsupported == {}
    d, h, k = 16, 2, round(0.25 * 120)
    lu = h * (d**3 // 3 + d * d * d)  # linalg_solve(I + S, I - S): d right-hand sides
    cg = (2 * (d // 2 + 1) + 1) * h * 2 * k * d  # (2 steps + 1) products, 2k entries, d columns
    assert counts["sparse"] - counts["dense"] == cg - lu
