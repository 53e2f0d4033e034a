"""The three position-encoding hooks (docs/architecture.md), as one base class.

A position encoding declares `hook`:
- "token": `add_to_tokens(x)` adds a vector to each patch embedding (built once per model);
- "qk":    `rotate(q, k)` maps q_i -> T(r_i) q_i, k_j -> T(r_j) k_j per head, BEFORE any
           kernel feature map (built once per attention layer). A STRING T(r) = RoPE(r) P also
           returns its position-independent P from `head_transform()`; the ViT folds P into the
           q/k projection weights (P(Wx + b) = (PW)x + Pb, exact for every backend), so P costs
           one d x d x dim product per head per forward instead of one per token;
- "score": `modulation()` returns the multiplicative weights c_ij of the attention matrix as a
           `Modulation` (rpevit.attention.base), which applies itself to the backend's primitive
           (exact softmax or linear attention): Luo et al.'s `RelativeBias` (pe/relative_bias.py)
           or any low-rank c_ij = sum_l f_il g_jl (`LowRankModulation`, e.g. pe/rotation_invariant.py).
Positions are integer patch coordinates (x, y) on the H x W grid, row-major token order.

An encoding is constructed with keyword arguments only: the layer context (`grid`, `heads`,
`head_dim`, `layer`, `seed`, and `dim` where a subclass declares it) and its own options, each
declared beside it as an `rpevit.registry.Option` (`@register_pe(name, options=(ROPE_BASE,))`), which
becomes the TrialConfig field of that name, and taken under that name with the Option's default
(`rope_base: float = ROPE_BASE.default`). `rpevit.models.factory.build_encodings` reads a subclass's
`__init__` signature and passes exactly those, so a new encoding declares what it needs and nothing
else (its options pass through `**context` up to this class).
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from rpevit.attention.base import Modulation
    from rpevit.config import TrialConfig


def grid_positions(grid: tuple[int, int]) -> Tensor:
    """(N, 2) tensor of (x, y) patch coordinates in row-major token order, in the default dtype (the
    trial's `dtype` while a model is built), so that tables computed from it follow that dtype."""
    h, w = grid
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([xs.flatten(), ys.flatten()], dim=-1).to(torch.get_default_dtype())


class PositionEncoding(nn.Module):
    """Base class: identity for every hook. Subclasses set `hook` and override one method."""

    hook: ClassVar[str] = "none"
    pe_name: ClassVar[str] = ""  # set by @register_pe

    def __init__(self, *, grid: tuple[int, int], heads: int, head_dim: int, layer: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.grid = tuple(grid)
        self.heads = heads
        self.head_dim = head_dim
        self.dim = heads * head_dim  # the model width: heads x head dim (validated in the config)
        self.layer = layer
        self.seed = seed
        self.register_buffer("positions", grid_positions(self.grid), persistent=False)

    @classmethod
    def check_config(cls, cfg: "TrialConfig", source: str) -> None:
        """Raise ConfigError if this encoding cannot run with cfg (e.g. head dim parity)."""

    @classmethod
    def quadratic_on_kernelized(cls, values: dict[str, Any]) -> bool:
        """Whether, with these config values, this encoding makes a kernelized (O(N)) backend quadratic in the
        tokens N (an N x N matrix per head): the token-scaling analysis counts a variant as O(N) only where its
        backend's `linear_time` holds and this is False. A score hook is an N x N modulation unless its class
        says otherwise (a low-rank or FFT path); the other hooks act per token."""
        return cls.hook == "score"

    @classmethod
    def resolve_options(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The values this encoding's `auto` options take in a config (a full config dict): what the
        stored results say ran (rpevit.config.resolve_values). None by default."""
        return {}

    def seed_generator(self, salt: int = 0) -> torch.Generator:
        """A CPU generator from the trial seed, distinct per layer and class: fixed random patterns.

        crc32, not hash(): Python salts str hashes per process, which made patterns irreproducible.
        The key (seed, layer, class name, salt) is part of every saved result: changing it changes
        the patterns of rope_mixed, sparse_cayley_string and random-mode rotinv.
        """
        key = repr((self.seed, self.layer, type(self).__name__, salt)).encode()
        return torch.Generator().manual_seed(zlib.crc32(key))

    def add_to_tokens(self, x: Tensor) -> Tensor:  # x: b n c
        return x

    def head_transform(self) -> Tensor | None:
        """A per-head orthogonal P (h, d, d) applied to q and k before `rotate`, or None."""
        return None

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:  # q, k: b h n d
        return q, k

    def encode_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """The whole q/k hook, P then T(r), on q and k directly (the ViT folds P instead)."""
        p = self.head_transform()
        if p is not None:
            p = p.to(q.dtype).transpose(-1, -2)
            q, k = q @ p, k @ p
        return self.rotate(q, k)

    def modulation(self) -> "Modulation | None":
        return None
