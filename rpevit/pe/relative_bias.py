"""`luo_rpe` (score hook): Luo et al. 2021 relative bias c_ij = exp(b[r_j - r_i]).

A learned table b per head over all (2H-1)(2W-1) 2-D offsets, per layer, zero-initialised (c = 1:
training starts from the plain backend). Softmax adds b as a float mask; kernelized backends
multiply their weights by exp(b) with block-Toeplitz FFT sums (rpevit.attention.toeplitz) or the
explicit masked matrix (`luo_path`). Both live in `RelativeBias`, the modulation this encoding
hands to whichever backend runs (rpevit.attention.base.Modulation).

b is stored as b = luo_scale * raw. b is a logit: locality needs |b| of a few units, but Adam
moves each parameter by about lr per step whatever its gradient, so with lr 1e-3 and the ~1-2k
steps of a short run a directly stored table moves by at most ~1 and stays near uniform. That was
why luo_rpe trailed every other encoding (digits, 15 epochs, 3 seeds, mean test accuracy:
softmax 0.786, favor 0.768, relu 0.794 with luo_scale 1; 0.965, 0.961, 0.965 with luo_scale 10;
softmax+ape 0.905, softmax+rope 0.940). Zero weight decay on the table (no_weight_decay) mattered
little; an ALiBi-like distance-decaying initialisation alone reached 0.820.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rpevit.attention.base import (Modulation, dense_linear_attention, relative_offsets, under_vmap,
                                   written_out_softmax_attention)
from rpevit.attention.toeplitz import fast_fft_size, toeplitz_dense_matrix, toeplitz_fft_matvec
from rpevit.pe.base import PositionEncoding
from rpevit.registry import Option, register_pe

# `luo_path: auto` follows measurements: luo_crossover.json beside this file holds, per device kind
# (cpu, cuda), the N from which the FFT path's training step was faster than the dense path's in the
# token-scaling study (analysis/token_scaling.py --write-crossover writes it; docs/mechanisms.md).
CROSSOVER_FILE = Path(__file__).with_name("luo_crossover.json")
LUO_PATH = Option("luo_path", str, "auto", "luo_rpe on kernelized backends: FFT Toeplitz sums or the dense matrix "
                  "(auto: by token count)", choices=("auto", "fft", "dense"))
# luo_scale 0 (the default) is the dataset's value, what its validation split chose for every backend
# alike (rpevit.analysis.validation_choice; tests/test_defaults_follow_validation.py compares the two):
# digits 300 (results/luo_scale_val_digits_recipe, at digits' validated recipe: softmax and relu; favor at 1000,
# the choice of results/luo_scale_val_digits at the recipe before, diverged on every seed), MNIST 3
# (results/luo_scale_val_mnist: softmax, favor and relu; 100 and 1000 diverged), CIFAR-10 100
# (results/luo_scale_val_cifar10: softmax, favor and relu; favor at 1000 diverged in one seed of two);
# CIFAR-100 has no study of its own and runs CIFAR-10's. The earlier 10 was chosen on test.
LUO_SCALE_BY_DATASET = {"digits": 300.0, "mnist": 3.0, "cifar10": 100.0, "cifar100": 100.0}
LUO_SCALE = Option("luo_scale", float, 0.0, "the Luo bias table is luo_scale x a raw parameter "
                   "(rpevit/pe/relative_bias.py)", gt=0, dataset_default=0.0,
                   note="the dataset's value, which docs/usage.md says where validation chose: " + ", ".join(
                       f"{name} {value:g}" for name, value in LUO_SCALE_BY_DATASET.items()), cost_free=True)

# A device kind the table has no entry for takes the FFT path from this many tokens on (the rule before
# the table: an extrapolated CPU crossing at head dim 32; docs/mechanisms.md has the measurements).
LUO_FFT_MIN_TOKENS = 10_000


def _read_crossover_file() -> dict[str, dict]:
    return json.loads(CROSSOVER_FILE.read_text()) if CROSSOVER_FILE.exists() else {}


_CROSSOVER = _read_crossover_file()  # read once, at import: a compiled forward must not touch files


def crossover_table() -> dict[str, dict]:
    """The committed dense/FFT crossover per device kind ({} when the file is absent)."""
    return _CROSSOVER


def auto_luo_path(tokens: int, device_type: str) -> str:
    """The path `auto` takes at N tokens on a device kind: "fft" from the measured crossover on, "dense"
    below it (fft_from_tokens: the smallest measured N from which FFT was faster at every larger one, so a middle
    N where FFT won alone does not count). Where dense was at least as fast at the largest measured N
    (fft_from_tokens null), dense up to the largest measured N and fft beyond it (the dense path's memory grows as N^2, the FFT path's as N); a device
    kind with no entry: fft from LUO_FFT_MIN_TOKENS."""
    entry = crossover_table().get(device_type)
    if entry is None:
        return "fft" if tokens >= LUO_FFT_MIN_TOKENS else "dense"
    start = entry["fft_from_tokens"]
    if start is None:
        return "fft" if tokens > max(entry["measured_tokens"]) else "dense"
    return "fft" if tokens >= start else "dense"


@dataclass
class RelativeBias(Modulation):
    """Luo et al. 2021: c_ij = exp(b[h, r_j - r_i]); `table` is b, shape (h, 2H-1, 2W-1).

    `path` (kernelized backends): "fft", "dense", or "auto" (the measured crossover: auto_luo_path).
    """

    table: Tensor
    grid: tuple[int, int]
    path: str = "auto"

    def dense_log(self) -> Tensor:
        """log c as an (h, N, N) matrix (the softmax float mask and the brute-force reference)."""
        idx = relative_offsets(self.grid, self.table.device)
        return self.table.flatten(1)[:, idx]

    def dense(self) -> Tensor:
        """c as an (h, N, N) matrix, up to a per-head factor (which cancels in normalised attention)."""
        log_c = self.dense_log()
        return torch.exp(log_c - log_c.amax(dim=(-2, -1), keepdim=True))

    def softmax_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(d) + b): b enters SDPA as an additive float mask; under vmap (a fused
        seed group, where every member has its own b) through `biased_softmax_attention` instead."""
        bias = self.dense_log().to(q.dtype)
        if under_vmap(q):
            return biased_softmax_attention(q, k, v, bias)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    def linear_attention(self, phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
        """numerator_i = phi(q_i)^T sum_j c_ij phi(k_j) v_j^T, denominator_i = phi(q_i)^T sum_j c_ij phi(k_j).

        The table max is subtracted before exp: a per-head constant factor that cancels, keeping the
        weights positive and <= 1. `fft`: one Toeplitz FFT sum over F = m (d + 1) channels (the
        numerator's m d and the denominator's m together); `dense`: the explicit masked matrix.
        """
        path = self.path if self.path != "auto" else auto_luo_path(phi_q.shape[-2], phi_q.device.type)
        table = self.table.to(phi_q.dtype)
        weights = torch.exp(table - table.amax(dim=(-2, -1), keepdim=True).detach())  # h, 2H-1, 2W-1
        if path == "dense":
            return dense_linear_attention(phi_q, phi_k, v, toeplitz_dense_matrix(weights, self.grid))
        return fft_linear_attention(phi_q, phi_k, v, weights, self.grid)


def biased_softmax_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d) + bias) v written out (never SDPA).

    Why: under vmap a per-member float attn_mask goes through SDPA's batching rule, which mishandles
    the bias on CUDA's memory-efficient kernel (pytorch/pytorch#161310, fixed after torch 2.11). Its
    cost against SDPA: benchmarks/luo_softmax_path.py.
    """
    return written_out_softmax_attention(q, k, v, bias)


LUO_FFT_CHUNK_BYTES = 256 * 2**20  # working set of one chunk of the FFT path (see fft_linear_attention)


def fft_chunk_features(phi_q: Tensor, v: Tensor, grid: tuple[int, int], budget: int = LUO_FFT_CHUNK_BYTES) -> int:
    """How many of the m features one FFT pass carries so that its padded, transformed channels
    (b h m_chunk (d+1) on a P x Q grid, complex, float32 at least) stay within `budget` bytes."""
    b, h, _, m = phi_q.shape
    p, q = (fast_fft_size(2 * n - 1) for n in grid)
    per_feature = b * h * (v.shape[-1] + 1) * p * q * 2 * max(phi_q.element_size(), 4) * 2  # spectrum + grid
    return max(1, min(m, budget // max(1, per_feature)))


def fft_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, weights: Tensor, grid: tuple[int, int],
                         chunk: int | None = None) -> Tensor:
    """Luo-modulated linear attention with block-Toeplitz FFT sums, numerator and normaliser in one pass
    (v with a column of ones: F = m (d + 1) channels), in chunks of the m features.

    out_i = sum_m phi(q_i)_m sum_j c_ij phi(k_j)_m [v_j, 1] is a sum over the features, so it splits
    exactly into chunks of features; each chunk's channels are transformed, summed and contracted
    before the next, so memory is bounded by the chunk (`fft_chunk_features`) and not by m (d + 1).
    With gradients, each chunk is recomputed in the backward pass (activation checkpointing) rather
    than kept: the saved activations are then bounded too. Chunked = unchunked up to the order of
    the sum over features (tests/test_pe_relative_bias.py, float64).
    """
    chunk = chunk or fft_chunk_features(phi_q, v, grid)
    v_one = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # b h n (d+1)
    m = phi_q.shape[-1]
    if chunk >= m:
        out = _fft_chunk(phi_q, phi_k, v_one, weights, grid)
    else:
        recompute = torch.is_grad_enabled() and not under_vmap(phi_q)
        out = None
        for start in range(0, m, chunk):
            part = (phi_q[..., start:start + chunk], phi_k[..., start:start + chunk], v_one, weights, grid)
            piece = checkpoint(_fft_chunk, *part, use_reentrant=False) if recompute else _fft_chunk(*part)
            out = piece if out is None else out + piece
    return out[..., :-1] / out[..., -1:]


def _fft_chunk(phi_q: Tensor, phi_k: Tensor, v_one: Tensor, weights: Tensor, grid: tuple[int, int]) -> Tensor:
    """sum_m phi(q_i)_m sum_j c_ij phi(k_j)_m [v_j, 1] over this chunk's features: (b h n (d+1))."""
    per_token = rearrange(einsum(phi_k, v_one, "b h n m, b h n e -> b h n m e"), "b h n m e -> b h n (m e)")
    summed = toeplitz_fft_matvec(weights, per_token, grid)
    summed = rearrange(summed, "b h n (m e) -> b h n m e", e=v_one.shape[-1])
    return einsum(phi_q, summed, "b h n m, b h n m e -> b h n e")


@register_pe("luo_rpe", options=(LUO_PATH, LUO_SCALE), colour="C1", order=2)
class LuoRelativeBias(PositionEncoding):
    hook = "score"

    @classmethod
    def quadratic_on_kernelized(cls, values: dict[str, Any]) -> bool:
        """The dense path is the N x N matrix; the FFT path O(N log N) (`auto`: by N, so not counted as dense)."""
        return values.get("luo_path", LUO_PATH.default) == "dense"

    def __init__(self, *, luo_scale: float = LUO_SCALE_BY_DATASET["digits"], luo_path: str = LUO_PATH.default,
                 **context: Any) -> None:
        super().__init__(**context)
        # luo_scale's default: what the default config (digits) resolves 0 to; 0 is a config's "the dataset's value"
        if not luo_scale > 0:
            raise ValueError(f"luo_scale has value {luo_scale!r}; allowed: a positive scale (0 is a config's "
                             f"'the dataset's value', resolved by TrialConfig.resolved() before a layer is built)")
        h, w = self.grid
        self.scale = luo_scale
        self.path = luo_path
        self.raw_table = nn.Parameter(torch.zeros(self.heads, 2 * h - 1, 2 * w - 1))

    @classmethod
    def resolve_options(cls, values: dict[str, Any]) -> dict[str, Any]:
        """luo_scale 0: the dataset's validated value (LUO_SCALE_BY_DATASET)."""
        scale = values["luo_scale"]
        return {"luo_scale": LUO_SCALE_BY_DATASET[values["dataset"]] if scale == LUO_SCALE.dataset_default else scale}

    @property
    def table(self) -> torch.Tensor:
        """b (h, 2H-1, 2W-1) = luo_scale * raw_table."""
        return self.scale * self.raw_table

    def modulation(self) -> RelativeBias:
        return RelativeBias(self.table, self.grid, self.path)
