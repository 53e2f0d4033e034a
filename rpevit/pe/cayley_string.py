"""Cayley-STRING (Schenck et al. 2025): q_i -> RoPE(r_i) P q_i with P = (I - S)(I + S)^-1.

Every STRING equals RoPE(r) P for an orthogonal P shared by the tokens of a head, so
(RoPE(r_i) P q)^T (RoPE(r_j) P k) = q^T P^T RoPE(r_j - r_i) P k stays relative. P is computed
ONCE per head per forward pass (one d x d solve) and returned as the `head_transform`, which the
ViT folds into the q/k projection weights: the per-token work is exactly RoPE's.
- `cayley_string`: S skew-symmetric with all d(d-1)/2 above-diagonal entries learned, init 0
  (P = I: training starts from axial RoPE).
- `sparse_cayley_string`: a fixed random pattern holding a fraction f = `string_sparsity` of
  the above-diagonal entries per head (from the trial seed), only those learned; P through a
  dense LU or the sparse CG solver of `rpevit.pe.sparse_solve` (`cayley_solver`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rpevit.config import ConfigError
from rpevit.pe.rope import ROPE_BASE, AxialRoPE
from rpevit.pe.sparse_solve import SolveInfo, cayley_solve_sparse, skew_from_entries
from rpevit.registry import Option, register_pe

STRING_SPARSITY = Option("string_sparsity", float, 0.1, "f, fraction of learned above-diagonal entries of S "
                         "(sparse_cayley_string)", gt=0, le=1)
CAYLEY_SOLVER = Option("cayley_solver", str, "auto", "sparse_cayley_string solve: dense LU or sparse CG (auto: the "
                       "measured faster)", choices=("auto", "dense", "sparse"))


def cayley_orthogonal(skew: Tensor) -> Tensor:
    """(I - S)(I + S)^-1 = (I + S)^-1 (I - S) for skew S (..., d, d): orthogonal, det +1.

    I + S is never singular (S's eigenvalues are imaginary, so I + S's have real part 1), so the
    solve skips its singularity check: that check is a host synchronisation on a GPU, which a
    compiled training step must not contain.
    """
    eye = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device)
    return torch.linalg.solve_ex(eye + skew, eye - skew, check_errors=False).result


class _StringBase(AxialRoPE):
    """RoPE(r) P: `rotate` is RoPE's, P = `self.orthogonal()` (h, d, d) is the head transform."""

    def head_transform(self) -> Tensor:
        return self.orthogonal()


@register_pe("cayley_string", options=(ROPE_BASE,), colour="C4", family="Cayley and reflection STRING",
             groups=("string",), order=6)
class CayleyString(_StringBase):

    def __init__(self, **context: Any) -> None:
        super().__init__(**context)
        d = self.head_dim
        rows, cols = torch.triu_indices(d, d, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.skew_entries = nn.Parameter(torch.zeros(self.heads, rows.numel()))

    def skew(self) -> Tensor:
        return skew_from_entries(self.skew_entries, self.rows, self.cols, self.head_dim)

    def orthogonal(self) -> Tensor:
        return cayley_orthogonal(self.skew())


SPARSE_SOLVE_NOT_FUNCTIONAL = ("the sparse CG solve works on sparse tensors for a data-dependent number of "
                               "iterations and logs them, so it has no vmap rule and breaks a compiled graph")


@register_pe("sparse_cayley_string", options=(ROPE_BASE, STRING_SPARSITY, CAYLEY_SOLVER), colour="C5",
             family="Cayley and reflection STRING", groups=("string",), order=7)
class SparseCayleyString(_StringBase):

    def __init__(self, *, string_sparsity: float = STRING_SPARSITY.default, cayley_solver: str = CAYLEY_SOLVER.default,
                 **context: Any) -> None:
        super().__init__(**context)
        d, h = self.head_dim, self.heads
        upper_rows, upper_cols = torch.triu_indices(d, d, offset=1)
        count = max(1, round(string_sparsity * upper_rows.numel()))
        gen = self.seed_generator()
        picks = torch.stack([torch.randperm(upper_rows.numel(), generator=gen)[:count] for _ in range(h)])
        picks = picks.sort(dim=1).values  # row-major order: f = 1 lists the entries as cayley_string
        self.register_buffer("rows", upper_rows[picks])  # (h, k), persistent: part of the model
        self.register_buffer("cols", upper_cols[picks])
        self.skew_entries = nn.Parameter(torch.zeros(h, count))
        # `auto` is the dense LU: it won every measured cell on the CPU (docs/mechanisms.md, STRING)
        self.solver = "sparse" if cayley_solver == "sparse" else "dense"
        self.solve_log: list[SolveInfo] = []  # CG iterations / residual of the latest sparse solve
        # read by rpevit.models.stacked.vmap_blockers: a fused group then steps its members in turn
        self.vmap_blocker = (SPARSE_SOLVE_NOT_FUNCTIONAL if self.solver == "sparse" else None)

    @classmethod
    def check_config(cls, cfg: Any, source: str) -> None:
        super().check_config(cfg, source)
        if cfg.compile != "off" and cfg.cayley_solver == "sparse":
            raise ConfigError(f"{source}: field 'compile' has value {cfg.compile!r} with cayley_solver 'sparse'; "
                              f"allowed: compile 'off' for the sparse solver ({SPARSE_SOLVE_NOT_FUNCTIONAL}), "
                              f"or cayley_solver 'dense' / 'auto'")

    def skew(self) -> Tensor:
        return skew_from_entries(self.skew_entries, self.rows, self.cols, self.head_dim)

    def orthogonal(self) -> Tensor:
        if self.solver == "dense":
            return cayley_orthogonal(self.skew())
        eye = torch.eye(self.head_dim, dtype=self.skew_entries.dtype, device=self.skew_entries.device)
        self.solve_log.clear()
        identity = eye.expand(self.heads, -1, -1)
        inverse = cayley_solve_sparse(self.skew_entries, self.rows, self.cols, identity, self.solve_log)
        return 2 * inverse - eye  # (I + S)^-1 (I - S) = 2 (I + S)^-1 - I
