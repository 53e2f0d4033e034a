"""What every attention backend takes: q, k, v (b h n d) after the q/k hook, and optionally the
score-hook modulation c_ij >= 0 that multiplies the (unnormalised) attention weights.

The score hook is dispatched in one place, the `Modulation` interface: a modulation knows how to
apply itself to the two primitives the backends are built on, exact softmax attention
(`softmax_attention(q, k, v)`) and linear attention over non-negative features
(`linear_attention(phi_q, phi_k, v)`), and gives its dense N x N form (`dense()`, the brute-force
reference). Backends never look at a modulation's type, so a new score-hook encoding is one file:
its `Modulation` subclass next to its `PositionEncoding` (rpevit/pe/relative_bias.py for Luo et
al.'s bias; `LowRankModulation` below for any c_ij = sum_l f_il g_jl, e.g. rotinv).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

if TYPE_CHECKING:
    from rpevit.config import TrialConfig


def relative_offsets(grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
    """(N, N) index into a (2H-1)(2W-1) table of offset r_j - r_i, row-major (dy, dx)."""
    h, w = grid
    ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[None, :] - ys[:, None] + (h - 1)
    dx = xs[None, :] - xs[:, None] + (w - 1)
    return dy * (2 * w - 1) + dx


class Modulation(ABC):
    """Multiplicative attention weights c_ij >= 0 of a score-hook encoding, applied per backend primitive."""

    @abstractmethod
    def dense(self) -> Tensor:
        """c as an (h, N, N) or (b, h, N, N) matrix, up to a per-row factor (cancels after normalising)."""

    @abstractmethod
    def softmax_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """out_i = sum_j e_ij c_ij v_j / sum_j e_ij c_ij with e_ij = exp(q_i^T k_j / sqrt(d)): (b h n d)."""

    @abstractmethod
    def linear_attention(self, phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
        """out_i = sum_j a_ij c_ij v_j / sum_j a_ij c_ij with a_ij = phi_q,i^T phi_k,j: (b h n d)."""


def linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
    """D^-1 phi(Q) (phi(K)^T [V, 1]) for phi_q, phi_k (b h n m) and v (b h n d): O(N m d).

    The ones column carries the denominator phi(q_i)^T sum_j phi(k_j) through the same two
    matmuls as the numerator (two bmm calls in all, no N x N matrix).
    """
    v_one = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # b h n (d+1)
    kv = phi_k.transpose(-1, -2) @ v_one  # b h m (d+1)
    out = phi_q @ kv  # b h n (d+1)
    return out[..., :-1] / out[..., -1:]


def dense_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, c: Tensor) -> Tensor:
    """out_i = sum_j a_ij c_ij v_j / sum_j a_ij c_ij with a_ij = phi_q,i^T phi_k,j, through the N x N
    matrix: O(N^2 (m + d)) against the linear path's O(N m d) (or O(N m L d) with a rank-L modulation),
    so the cheaper of the two below some N. phi (b h n m), v (b h n d), c (h n n) or (b h n n)."""
    scores = einsum(phi_q, phi_k, "b h i m, b h j m -> b h i j") * c.to(phi_q.dtype)
    return einsum(scores, v, "b h i j, b h j d -> b h i d") / scores.sum(dim=-1, keepdim=True)


def low_rank_features(phi: Tensor, factor: Tensor) -> Tensor:
    """phi (x) f per token: (b h n m), (h n L) or (b h n L) -> (b h n (m L))."""
    if factor.dim() == 3:
        factor = factor.unsqueeze(0)
    product = einsum(phi, factor.to(phi.dtype), "b h n m, b h n l -> b h n m l")
    return rearrange(product, "b h n m l -> b h n (m l)")


@dataclass
class LowRankModulation(Modulation):
    """c_ij = sum_l f[.., i, l] g[.., j, l] >= 0; f, g of shape (h, N, L) or (b, h, N, L).

    `path` (kernelized backends): "lowrank", c folded into the features (linear in N, m L features
    per token), or "dense", the N x N matrix c (quadratic in N, m features): one function, two costs;
    dense does fewer operations below N = 2 m L (d + 1) / (m + d + 1) (docs/mechanisms.md).
    """

    f: Tensor
    g: Tensor
    path: str = "lowrank"

    def dense(self) -> Tensor:
        return torch.einsum("...il,...jl->...ij", self.f, self.g)

    def softmax_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Exactly and without log c: one SDPA call on the values [g_l v, g_l] (all l) gives
        N_il = sum_j s_ij g_jl v_j and D_il = sum_j s_ij g_jl (s = softmax, whose normaliser
        cancels); out_i = sum_l f_il N_il / sum_l f_il D_il. Exact for any c >= 0, even where
        c_ij = 0 or f, g change sign."""
        f, g = (x if x.dim() == 4 else x.unsqueeze(0) for x in (self.f, self.g))
        v_one = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # b h n (d+1)
        values = einsum(g.to(v.dtype), v_one, "b h n l, b h n e -> b h n l e")
        attended = exact_softmax_attention(q, k, rearrange(values, "b h n l e -> b h n (l e)"))
        attended = rearrange(attended, "b h n (l e) -> b h n l e", e=v_one.shape[-1])
        out = einsum(f.to(v.dtype), attended, "b h n l, b h n l e -> b h n e")
        return out[..., :-1] / out[..., -1:]

    def linear_attention(self, phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
        """c folded into the features as phi(q_i) (x) f_i and phi(k_j) (x) g_j: still linear in N
        (`path` "lowrank"); or the dense matrix c (`path` "dense")."""
        if self.path == "dense":
            return dense_linear_attention(phi_q, phi_k, v, self.dense())
        return linear_attention(low_rank_features(phi_q, self.f), low_rank_features(phi_k, self.g), v)


def under_vmap(x: Tensor) -> bool:
    """Whether x is a member's slice inside torch.func.vmap (a fused seed group's forward). Dynamo
    traces this check, so the compiled, vmapped step takes the same branch as the eager one."""
    return torch._C._functorch.is_batchedtensor(x)


def written_out_softmax_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d) [+ bias]) v written out: two matmuls and a softmax, never SDPA.

    For the fused groups, where SDPA under vmap goes wrong on CUDA (see `exact_softmax_attention` and
    `RelativeBias.softmax_attention`). Their N is small (49-64 tokens), where the (N, N) scores cost
    little; the logits and the softmax run in float32 at least (SDPA's kernels accumulate there too).
    Equal to SDPA in float64 (tests/test_pe_relative_bias.py).
    """
    work = torch.promote_types(q.dtype, torch.float32)
    scores = (q @ k.transpose(-1, -2)).to(work) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias.to(work)
    return scores.softmax(dim=-1).to(v.dtype) @ v


def exact_softmax_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) v: SDPA, except in a fused group's eager step on CUDA.

    Why: SDPA has no batching rule for its fused CUDA kernels, so under vmap it runs its math kernel,
    whose backward under bf16 autocast fails ("expected input and grad types to match", an NVIDIA H200
    with torch 2.11, tests/test_gpu.py::test_fused_group_and_compiled_step_train_on_cuda). That step is
    written out instead. The compiled fused step keeps SDPA (inductor lowers it; it passed on that
    GPU), and so does every other run, so no CPU result changes.
    """
    if q.is_cuda and under_vmap(q) and not torch.compiler.is_compiling():
        return written_out_softmax_attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v)


def normalize_rows(weights: Tensor) -> Tensor:
    """Rows of non-negative weights -> rows of attention probabilities."""
    return weights / weights.sum(dim=-1, keepdim=True)


def softmax_attention_matrix(q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
    """Exact (b h n n) attention: A_ij proportional to exp(q_i^T k_j / sqrt(d)) c_ij; the dense reference."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    if modulation is not None:
        weights = weights * modulation.dense().to(weights.dtype)
    return normalize_rows(weights)


def total_variation(a: Tensor, b: Tensor) -> Tensor:
    """Total-variation distance 1/2 sum_j |a_ij - b_ij| between attention rows: (..., n, n) -> (..., n)."""
    return 0.5 * (a - b).abs().sum(dim=-1)


class AttentionBackend(nn.Module):
    """Base class of the backends; subclasses define forward(q, k, v, modulation=None).

    Constructed with keyword arguments only: the layer context (`heads`, `head_dim`, `layer`, and
    `seed` where a subclass declares it) and the subclass's own options, each declared as an
    `rpevit.registry.Option` in `@register_attention(name, options=...)` (a TrialConfig field of that
    name), so `rpevit.models.factory.build_attention` can fill them from a config while tests and
    benchmarks build a backend without one. A subclass takes its options with the Options' defaults
    and passes the rest on as `**context`.
    `layer` lets random features differ per layer while all come from the trial seed.
    A backend holds no learned parameters (buffers only): the final evaluation swaps exact softmax attention
    in for it (rpevit.evaluation.with_softmax_attention), and config validation refuses one that has any.
    `linear_time`: O(N) in the tokens, read by the token-scaling analysis (which variants count as O(N)).
    """

    linear_time: ClassVar[bool] = False

    def __init__(self, *, heads: int, head_dim: int, layer: int = 0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.heads = heads
        self.layer = layer

    @property
    def random_features(self) -> bool:
        """True if the output depends on a random draw (judged over fresh draws, `use_draw`)."""
        return False

    @classmethod
    def draws_random_features(cls, config: Mapping[str, Any]) -> bool:
        """Whether a trial of this backend with `config` (a config dict or a stored row) depends on a
        random draw: what the analysis judges by the mean over fresh draws. False here; see
        RandomFeatureBackend."""
        return False

    @classmethod
    def check_config(cls, cfg: "TrialConfig", source: str) -> None:
        """Raise ConfigError if this backend cannot run with cfg."""

    def attention_matrix(self, q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
        """The (b h n n) row-stochastic matrix A this backend applies to v (forward = A v), densely.

        O(N^2): for fidelity metrics and tests on small N, never on the training path.
        """
        raise NotImplementedError


class RandomFeatureBackend(AttentionBackend, ABC):
    """A backend whose output depends on a random draw of its feature projection (FAVOR+, Performer-
    ReLU with a random projection). What the rest of the system relies on, declared here:

    - `projection`: the current draw, a persistent buffer (checkpoints and eval reuse it);
    - `draw_projection(draw, salt)`: the draw-th projection, reproducible from the trial seed and the
      layer; salt 0 the training draws, other salts the fresh draws of the evaluation;
    - `use_draw(projection)`: swap a draw in (rpevit.evaluation judges a model over fresh draws);
    - `advance_step()`: one training step begins (redraw where due; the trainer calls it outside the
      compiled forward: rpevit.attention.kernelized.advance_random_features);
    - `draws_random_features(config)`: True for the configs that draw (the analysis then ranks rows
      by their mean over fresh draws: rpevit.analysis.common.has_random_features).
    A new backend of this kind, in one file, is judged, redrawn and reported as FAVOR+ is.
    """

    projection: Tensor

    @classmethod
    def draws_random_features(cls, config: Mapping[str, Any]) -> bool:
        return True

    @abstractmethod
    def draw_projection(self, draw: int, salt: int = 0) -> Tensor:
        """The draw-th projection of this layer (reproducible)."""

    @abstractmethod
    def use_draw(self, projection: Tensor) -> None:
        """Make `projection` the current draw."""

    @abstractmethod
    def advance_step(self) -> None:
        """One training step begins: redraw if due, then count the step."""
