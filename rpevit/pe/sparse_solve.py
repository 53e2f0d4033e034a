"""Solve (I + S) X = B for a sparse skew-symmetric S, with gradients by implicit differentiation.

S (per head, shape d x d) is stored by its learned above-diagonal entries: `values` (h, k) at
`rows`, `cols` (h, k) with rows < cols; S[r, c] = v and S[c, r] = -v.

Why conjugate gradients on I - S^2: for skew S, (I + S)^T (I + S) = (I - S)(I + S) = I - S^2 =
I + S^T S is symmetric positive definite with eigenvalues 1 + lambda^2 in [1, 1 + |S|^2], so

    (I + S)^-1 = (I - S)(I - S^2)^-1        (I + S and I - S commute)

and CG on I - S^2 converges for every S, in at most d/2 + 1 steps in exact arithmetic (the
eigenvalues +-i lambda of S pair up). Its rate per product with S equals GMRES's on the
segment 1 + i[-|S|, |S|] without GMRES's orthogonalisation. Each step costs two sparse
products S @ Z: O(nnz * columns). The backward pass is one more solve with
(I + S)^T = I - S, i.e. (I - S)^-1 = (I + S)(I - S^2)^-1: the same CG.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor
from torch.autograd.function import once_differentiable


def skew_from_entries(values: Tensor, rows: Tensor, cols: Tensor, dim: int) -> Tensor:
    """Dense (h, d, d) skew-symmetric S with S[r, c] = v, S[c, r] = -v (differentiable in v)."""
    heads = values.shape[0]
    upper = values.new_zeros(heads, dim * dim).scatter(1, (rows * dim + cols).expand_as(values), values)
    upper = rearrange(upper, "h (r c) -> h r c", r=dim)
    return upper - upper.transpose(-1, -2)


def skew_sparse_operator(values: Tensor, rows: Tensor, cols: Tensor, dim: int) -> Tensor:
    """Block-diagonal sparse COO matrix (h d, h d) holding every head's S: one kernel per product.

    Coalesced COO: converting to CSR costs extra and was not consistently faster on CPU.
    """
    heads, k = values.shape
    offset = (torch.arange(heads, device=values.device) * dim)[:, None]
    r, c = (rows.expand(heads, k) + offset).flatten(), (cols.expand(heads, k) + offset).flatten()
    coo = torch.sparse_coo_tensor(
        torch.stack([torch.cat([r, c]), torch.cat([c, r])]),
        torch.cat([values.flatten(), -values.flatten()]),
        (heads * dim, heads * dim),
        check_invariants=False,  # indices are in range by construction
    )
    return coo.coalesce()


@dataclass
class SolveInfo:
    iterations: int
    relative_residual: float


def _default_tol(dtype: torch.dtype) -> float:
    return max(10 * torch.finfo(dtype).eps, 1e-12)


def column_dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-column inner products <a, b> over the d axis of (h, d, c): shape (h, 1, c)."""
    return (a * b).sum(dim=1, keepdim=True)


def normal_equations_cg(
    skew: Tensor, rhs: Tensor, *, tol: float | None = None, max_iter: int | None = None
) -> tuple[Tensor, SolveInfo]:
    """Z = (I - S^2)^-1 rhs by conjugate gradients, every column of every head at once.

    skew: sparse (h d, h d) operator from `skew_sparse_operator`; rhs: (h, d, c).
    Stops when every column's residual |r| <= tol |rhs|; warns (never silently) if it cannot.
    """
    tiny = torch.finfo(rhs.dtype).tiny
    tol = _default_tol(rhs.dtype) if tol is None else tol
    max_iter = 2 * rhs.shape[1] + 10 if max_iter is None else max_iter

    def normal_operator(z: Tensor) -> Tensor:  # (I - S^2) z = z + S^T S z
        return z - _sparse_apply(skew, _sparse_apply(skew, z))

    z = torch.zeros_like(rhs)
    residual, direction = rhs.clone(), rhs.clone()
    rr = column_dot(residual, residual)
    rhs_norm2 = rr.clamp_min(tiny)
    iterations = 0
    while iterations < max_iter and bool((rr > tol**2 * rhs_norm2).any()):
        a_dir = normal_operator(direction)
        alpha = rr / column_dot(direction, a_dir).clamp_min(tiny)
        z = z + alpha * direction
        residual = residual - alpha * a_dir
        rr_new = column_dot(residual, residual)
        direction = residual + (rr_new / rr.clamp_min(tiny)) * direction
        rr = rr_new
        iterations += 1
    rel = float((rr / rhs_norm2).max().sqrt()) if rhs.numel() else 0.0
    if rel > tol:
        warnings.warn(f"sparse Cayley CG stopped after {iterations} steps at relative residual {rel:.2e} > {tol:.1e}")
    return z, SolveInfo(iterations, rel)


def _sparse_apply(skew: Tensor, z: Tensor) -> Tensor:
    """S z for the block-diagonal operator and z (h, d, c)."""
    out = skew @ rearrange(z, "h d c -> (h d) c")
    return rearrange(out, "(h d) c -> h d c", h=z.shape[0])


def _full_precision(like: Tensor) -> torch.autocast:
    """Autocast off for the CG. Under bf16 autocast every S @ z product comes out in bf16: the
    recursive residual still reports convergence (~1e-6) while X is off by ~1e-2 (measured, d=32)."""
    return torch.autocast(like.device.type, enabled=False)


def _at_least_float32(t: Tensor) -> Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _CayleySparseSolve(torch.autograd.Function):
    """X = (I + S)^-1 B; backward: Y = (I - S)^-1 dX, dB = Y, dS = -Y X^T on the learned entries."""

    @staticmethod
    def forward(ctx, values: Tensor, rows: Tensor, cols: Tensor, rhs: Tensor, info: list):
        dim = rhs.shape[1]
        with _full_precision(rhs):
            skew = skew_sparse_operator(_at_least_float32(values.detach()), rows, cols, dim)
            z, solve_info = normal_equations_cg(skew, _at_least_float32(rhs.detach()))
            x = z - _sparse_apply(skew, z)  # (I - S) z
        info.append(solve_info)
        ctx.save_for_backward(values, rows, cols, x)
        ctx.skew = skew
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_x: Tensor):
        values, rows, cols, x = ctx.saved_tensors
        with _full_precision(grad_x):
            z, _ = normal_equations_cg(ctx.skew, _at_least_float32(grad_x).contiguous())
            y = z + _sparse_apply(ctx.skew, z)  # (I + S) z = (I - S)^-1 grad_x
        heads = values.shape[0]
        rows, cols = rows.expand(heads, -1), cols.expand(heads, -1)

        def gather(a: Tensor, idx: Tensor) -> Tensor:  # a (h, d, c), idx (h, k) -> (h, k, c)
            return a.gather(1, idx[..., None].expand(-1, -1, a.shape[-1]))

        # dL/dS = -Y X^T; v enters at (r, c) with + and at (c, r) with -
        grad_values = (gather(y, cols) * gather(x, rows) - gather(y, rows) * gather(x, cols)).sum(-1)
        return grad_values, None, None, y, None


def cayley_solve_sparse(
    values: Tensor, rows: Tensor, cols: Tensor, rhs: Tensor, info: list | None = None
) -> Tensor:
    """(I + S)^-1 rhs with S given by its above-diagonal entries; rhs (h, d, c).

    Gradients flow to `values` and `rhs`. `info`, if given, receives a SolveInfo per solve.
    """
    return _CayleySparseSolve.apply(values, rows, cols, rhs, [] if info is None else info)


def cayley_solve_dense(values: Tensor, rows: Tensor, cols: Tensor, rhs: Tensor) -> Tensor:
    """Same as `cayley_solve_sparse` through a dense LU (torch.linalg.solve), autograd's gradient."""
    dim = rhs.shape[1]
    eye = torch.eye(dim, dtype=rhs.dtype, device=rhs.device)
    return torch.linalg.solve(eye + skew_from_entries(values, rows, cols, dim), rhs)
