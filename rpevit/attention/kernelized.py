"""Linear-time kernelized attention: FAVOR+ (`favor`) and Performer-ReLU (`relu`).

Both compute out_i = sum_j A_ij v_j / sum_j A_ij with A_ij = phi(q_i)^T phi(k_j) c_ij, in
O(N m d) without forming A (design.md section 3). The score-hook modulation c_ij enters as
- `RelativeBias` (Luo et al. 2021): c_ij = exp(b[r_j - r_i]); numerator and denominator are
  block-Toeplitz sums over the grid, done with 2-D FFTs (`luo_path: fft`) or with the explicit
  masked N x N matrix (`luo_path: dense`); `auto` picks by token count (LUO_FFT_MIN_TOKENS);
- `LowRankModulation`: c_ij = sum_l f_il g_jl is folded into the features as the tensor
  products phi(q_i) (x) f_i and phi(k_j) (x) g_j, which keeps the cost linear in N.
"""
from __future__ import annotations

import numpy as np
import torch
from einops import einsum, rearrange
from torch import Tensor

from rpevit.attention.base import (AttentionBackend, LowRankModulation, Modulation, RelativeBias,
                                   normalize_rows)
from rpevit.attention.features import iid_gaussian, orthogonal_gaussian, positive_random_features
from rpevit.attention.toeplitz import toeplitz_dense_matrix, toeplitz_fft_matvec
from rpevit.config import TrialConfig
from rpevit.registry import register_attention

# From this many tokens on, `luo_path: auto` uses the FFT path. Measured on the 2-core CPU with
#   .venv/bin/python benchmarks/attention_scaling.py --luo-crossover --threads 1 [--tokens 1024 4096]
# (favor+luo_rpe forward+backward, batch 1, 4 heads, head dim 32, m = 64): dense/fft time was
# 0.01-0.06 for N = 16..1024 and 0.30 at N = 4096 (3.5 s vs 11.4 s). The FFT sums run over
# F = m (d + 1) = 2112 channels on a ~4N padded grid, so they only pay off at large N; the ratio
# grew ~N^1.2 between 1024 and 4096, which puts the crossing near 11k tokens (extrapolated).
LUO_FFT_MIN_TOKENS = 10_000


def projection_seed(seed: int, layer: int, draw: int, salt: int = 0) -> int:
    """A well-mixed 63-bit seed from (trial seed, layer, redraw count): reproducible across processes."""
    state = np.random.SeedSequence([seed, layer + 1, draw, salt]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
    """D^-1 phi(Q) (phi(K)^T [V, 1]) for phi_q, phi_k (b h n m) and v (b h n d): O(N m d).

    The ones column carries the denominator phi(q_i)^T sum_j phi(k_j) through the same two
    matmuls as the numerator (two bmm calls in all, no N x N matrix).
    """
    v_one = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # b h n (d+1)
    kv = phi_k.transpose(-1, -2) @ v_one  # b h m (d+1)
    out = phi_q @ kv  # b h n (d+1)
    return out[..., :-1] / out[..., -1:]


def luo_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, bias: RelativeBias, path: str) -> Tensor:
    """Kernelized attention with c_ij = exp(b[r_j - r_i]) (Luo et al. 2021).

    numerator_i = phi(q_i)^T sum_j c_ij phi(k_j) v_j^T, denominator_i = phi(q_i)^T sum_j c_ij phi(k_j).
    The table max is subtracted before exp: a per-head constant factor that cancels, keeping the
    weights positive and <= 1. `fft`: one Toeplitz FFT sum over F = m (d + 1) channels (the
    numerator's m d and the denominator's m together); `dense`: the explicit masked matrix.
    """
    table = bias.table.to(phi_q.dtype)
    weights = torch.exp(table - table.amax(dim=(-2, -1), keepdim=True).detach())  # h, 2H-1, 2W-1
    if path == "dense":
        scores = einsum(phi_q, phi_k, "b h i m, b h j m -> b h i j") * toeplitz_dense_matrix(weights, bias.grid)
        return einsum(scores, v, "b h i j, b h j d -> b h i d") / scores.sum(dim=-1, keepdim=True)
    v_one = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # b h n (d+1)
    per_token = rearrange(einsum(phi_k, v_one, "b h n m, b h n e -> b h n m e"), "b h n m e -> b h n (m e)")
    summed = toeplitz_fft_matvec(weights, per_token, bias.grid)
    summed = rearrange(summed, "b h n (m e) -> b h n m e", e=v_one.shape[-1])
    out = einsum(phi_q, summed, "b h n m, b h n m e -> b h n e")
    return out[..., :-1] / out[..., -1:]


def low_rank_features(phi: Tensor, factor: Tensor) -> Tensor:
    """phi (x) f per token: (b h n m), (h n L) or (b h n L) -> (b h n (m L))."""
    if factor.dim() == 3:
        factor = factor.unsqueeze(0)
    product = einsum(phi, factor.to(phi.dtype), "b h n m, b h n l -> b h n m l")
    return rearrange(product, "b h n m l -> b h n (m l)")


class KernelizedAttention(AttentionBackend):
    """The shared core: features phi(q d^-1/4), phi(k d^-1/4), then linear attention with modulation.

    Subclasses define `feature_map(x, is_query) -> (b h n m)`.

    Random projections are a persistent buffer drawn from (seed, layer, redraw count), so eval
    and checkpoint resume reuse exactly the same matrix; during training they are redrawn every
    `redraw_interval` forward passes (0: never), counted by the persistent `forward_count`, but
    only during the first `redraw_until` of the training steps once the train task has set
    `total_steps` (`set_training_length`): a redraw in the last stretch of a cosine schedule
    leaves a draw the weights never adapted to, and that draw is the one evaluated.
    """

    linear_time = True
    uses_projection = True

    def __init__(self, cfg: TrialConfig, *, layer: int = 0) -> None:
        super().__init__(cfg, layer=layer)
        self.seed = cfg.seed
        self.num_features = cfg.num_features
        self.feature_type = cfg.feature_type
        self.redraw_interval = cfg.redraw_interval
        self.redraw_until = cfg.redraw_until
        self.total_steps: int | None = None  # set by the train task; None: redraw for ever
        self.luo_path = cfg.luo_path
        self.register_buffer("forward_count", torch.zeros((), dtype=torch.long))
        if self.uses_projection:
            self.register_buffer("projection", self.draw_projection(0))

    @property
    def random_features(self) -> bool:
        return self.uses_projection

    def draw_projection(self, draw: int, salt: int = 0) -> Tensor:
        """(m, d) Gaussian rows (orthogonal blocks or iid), reproducible from (seed, layer, draw, salt).

        salt 0: the training draws; other salts: the fresh draws of the draw-aware evaluation.
        """
        generator = torch.Generator().manual_seed(projection_seed(self.seed, self.layer, draw, salt))
        sample = orthogonal_gaussian if self.feature_type == "orthogonal" else iid_gaussian
        return sample(self.num_features, self.head_dim, generator=generator)

    def use_draw(self, projection: Tensor) -> None:
        """Replace the current projection (the draw-aware evaluation swaps draws in and back)."""
        self.projection.copy_(projection)

    def redraws_frozen(self, step: int) -> bool:
        """True from step redraw_until * total_steps on (never, while total_steps is unknown)."""
        return self.total_steps is not None and step >= self.redraw_until * self.total_steps

    def maybe_redraw(self) -> None:
        if self.training and self.uses_projection and self.redraw_interval > 0:
            count = int(self.forward_count)
            if count > 0 and count % self.redraw_interval == 0 and not self.redraws_frozen(count):
                self.projection.copy_(self.draw_projection(count // self.redraw_interval))
            self.forward_count += 1

    def features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """phi(q d^-1/4), phi(k d^-1/4): (q d^-1/4)^T (k d^-1/4) = q^T k / sqrt(d)."""
        scale = self.head_dim ** -0.25
        return self.feature_map(q * scale, is_query=True), self.feature_map(k * scale, is_query=False)

    def attention_matrix(self, q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
        """A_ij proportional to phi(q_i)^T phi(k_j) c_ij, densely (the definition the fast paths compute)."""
        phi_q, phi_k = self.features(q, k)
        weights = phi_q @ phi_k.transpose(-1, -2)
        if modulation is not None:
            weights = weights * modulation.dense().to(weights.dtype)
        return normalize_rows(weights)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, modulation: Modulation | None = None) -> Tensor:
        self.maybe_redraw()
        phi_q, phi_k = self.features(q, k)
        if isinstance(modulation, RelativeBias):
            n = q.shape[-2]
            path = self.luo_path if self.luo_path != "auto" else (
                "fft" if n >= LUO_FFT_MIN_TOKENS else "dense")
            return luo_linear_attention(phi_q, phi_k, v, modulation, path)
        if isinstance(modulation, LowRankModulation):
            phi_q = low_rank_features(phi_q, modulation.f)
            phi_k = low_rank_features(phi_k, modulation.g)
        return linear_attention(phi_q, phi_k, v)


@register_attention("favor")
class FavorAttention(KernelizedAttention):
    """FAVOR+ (Choromanski et al. 2021): positive orthogonal random features of the softmax kernel."""

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        return positive_random_features(x, self.projection.to(x.dtype), stabilizer="query" if is_query else "key")


@register_attention("relu")
class ReluAttention(KernelizedAttention):
    """Performer-ReLU: phi(x) = ReLU(W x) + eps with random W, or ReLU(x) + eps (`relu_projection: identity`)."""

    def __init__(self, cfg: TrialConfig, *, layer: int = 0) -> None:
        self.uses_projection = cfg.relu_projection == "random"
        super().__init__(cfg, layer=layer)
        self.eps = cfg.kernel_eps

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        if self.uses_projection:
            x = x @ self.projection.to(x.dtype).T  # b h n m
        return torch.relu(x) + self.eps


def set_training_length(model: torch.nn.Module, total_steps: int) -> None:
    """Tell every kernelized layer how many training steps the run has (for `redraw_until`)."""
    for module in model.modules():
        if isinstance(module, KernelizedAttention):
            module.total_steps = total_steps
