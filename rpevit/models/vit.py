"""A timm-style ViT whose attention backend and position encodings are chosen by name.

Patch embedding -> (token hook) -> depth x pre-norm Block(Attention, Mlp, DropPath) -> norm ->
mean pool over patch tokens -> linear head. Inside Attention, the q/k hook rotates q and k, and
the score hook's modulation goes to the backend (docs/architecture.md, "The three hooks").

The modules take explicit arguments (timm style) and never a config. The backend and encodings
of each layer come from two callables, as timm's blocks take `attn_layer` / `norm_layer`:
`backend(layer)` and `encodings(hook_kinds, layer)`, so that every module is still built inside
its parent in the order the seeded global RNG has always seen (qkv, encodings, backend, proj):
reflection_string draws its vectors from that RNG, and every Linear's init consumes it.
`rpevit.models.factory.build_model` supplies them from a TrialConfig.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import Mlp, PatchEmbed, trunc_normal_
from torch import Tensor, nn

from rpevit.attention.base import AttentionBackend, Modulation
from rpevit.pe.base import PositionEncoding

BackendLayer = Callable[[int], AttentionBackend]  # layer index -> that layer's attention backend
EncodingLayers = Callable[[tuple[str, ...], int], nn.ModuleList]  # (hook kinds, layer) -> its encodings


def fold_head_transform(weight: Tensor, bias: Tensor, p: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Rows of the q and k projections of head h -> P_h times them; v untouched."""
    w = rearrange(weight, "(three h d) c -> three h d c", three=3, h=heads)
    b = rearrange(bias, "(three h d) -> three h d", three=3, h=heads)
    w_qk = torch.einsum("hde,thec->thdc", p, w[:2])
    b_qk = torch.einsum("hde,the->thd", p, b[:2])
    weight = rearrange(torch.cat([w_qk, w[2:]]), "three h d c -> (three h d) c")
    bias = rearrange(torch.cat([b_qk, b[2:]]), "three h d -> (three h d)")
    return weight, bias


class Attention(nn.Module):
    """qkv projection -> q/k hook -> optional qk L2 norm -> backend (with the score hook) -> proj.

    `qk_norm: l2` (Luo et al. 2021, section 3.3): q and k are scaled to unit length per head, then
    to length sqrt(tau_h sqrt(d)), so that every backend's q^T k / sqrt(d) equals tau_h cos(q, k).
    tau_h is a learned per-head temperature, stored as its log and never decayed. It starts at 1,
    Luo et al.'s normalised attention exp(cos(q, k)) with the RPE supplying sharpness, where FAVOR+
    is accurate: bounded |q| and |k| bound the estimator's variance, which grows like
    exp(|q + k|^2); a higher tau costs fidelity to softmax (docs/random_features.md, item 5, has the
    measured total variation; tests/test_training_protocol.py the bound). The model raises tau where
    sharpness pays, at that price in fidelity (the attn_tv_to_softmax metric shows it).

    `backend` and `encodings` build this layer's backend and q/k- and score-hook encodings
    (rpevit.models.factory); `layer` is passed to them (per-layer random features and patterns).
    """

    def __init__(self, dim: int, heads: int, layer: int, *, backend: BackendLayer, encodings: EncodingLayers,
                 qk_norm: str = "none", proj_drop: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.encodings = encodings(("qk", "score"), layer)
        self.qk_norm = qk_norm
        if self.qk_norm == "l2":
            self.log_temperature = nn.Parameter(torch.zeros(heads))
        self.backend = backend(layer)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.captured: list[tuple[Tensor, Tensor, Modulation | None]] | None = None  # see evaluation.attention_fidelity

    def no_weight_decay(self) -> set[str]:
        return {"log_temperature"} if self.qk_norm == "l2" else set()

    @property
    def temperature(self) -> Tensor | None:
        """tau_h (h,), the qk_norm logit scale, or None without qk_norm."""
        return self.log_temperature.exp() if self.qk_norm == "l2" else None

    def qkv_weights(self) -> tuple[Tensor, Tensor]:
        """qkv weight and bias with every encoding's head transform P folded into the q/k rows."""
        weight, bias = self.qkv.weight, self.qkv.bias
        for pe in self.encodings:
            p = pe.head_transform()
            if p is not None:
                weight, bias = fold_head_transform(weight, bias, p.to(weight.dtype), self.heads)
        return weight, bias

    def normalize_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q, k -> sqrt(tau_h sqrt(d)) q / |q|, same for k (identity without qk_norm)."""
        if self.qk_norm != "l2":
            return q, k
        length = (self.temperature * self.head_dim ** 0.5).sqrt().to(q.dtype)[:, None, None]  # h 1 1
        return F.normalize(q, dim=-1) * length, F.normalize(k, dim=-1) * length

    def attention_inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, "Modulation | None"]:
        """q, k, v (b h n d) and the modulation exactly as the backend receives them."""
        qkv = F.linear(x, *self.qkv_weights())
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.heads)
        modulation = None
        for pe in self.encodings:
            q, k = pe.rotate(q, k)
            modulation = pe.modulation() or modulation
        q, k = self.normalize_qk(q, k)
        return q, k, v, modulation

    def forward(self, x: Tensor) -> Tensor:
        q, k, v, modulation = self.attention_inputs(x)
        if self.captured is not None:
            self.captured.append((q.detach(), k.detach(), modulation))
        out = self.backend(q, k, v, modulation)
        return self.proj_drop(self.proj(rearrange(out, "b h n d -> b n (h d)")))


def draw_path_mask(batch: int, keep: float, *, dtype: torch.dtype, device: torch.device | str,
                   generator: torch.Generator | None = None) -> Tensor:
    """(batch, 1, 1) stochastic-depth mask: Bernoulli(keep) / keep, drawn exactly as timm's drop_path
    draws it (an empty tensor of x's dtype filled by bernoulli_), so a mask drawn here from the
    generator timm would use equals the one timm would have drawn inside the forward."""
    return torch.empty((batch, 1, 1), dtype=dtype, device=device).bernoulli_(keep, generator=generator).div_(keep)


class DropPath(nn.Module):
    """Stochastic depth per sample (timm's DropPath) that can also apply a mask drawn outside.

    Why outside: a compiled or vmapped training step must not draw random numbers inside the
    graph (compiled RNG differs from eager; vmap cannot give each member its own generator), so
    the trainer draws every site's mask beforehand (`ViT.draw_path_masks`) from the generator
    the eager forward would use, in the order it would use it, and passes them in. Without a
    mask, in training, it draws one itself from the global RNG, as timm does.
    """

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        if mask is None:
            mask = draw_path_mask(x.shape[0], 1.0 - self.drop_prob, dtype=x.dtype, device=x.device)
        return x * mask


class Block(nn.Module):
    """Pre-norm block: x + DropPath(Attention(LN x)), then x + DropPath(Mlp(LN x)).

    `masks` (2, b, 1, 1): the two stochastic-depth masks of this block (attention, MLP) drawn by
    the trainer, or None to draw them here.
    """

    def __init__(self, dim: int, heads: int, layer: int, *, backend: BackendLayer, encodings: EncodingLayers,
                 mlp_ratio: float = 2.0, drop_path: float = 0.0, dropout: float = 0.0, qk_norm: str = "none") -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, layer, backend=backend, encodings=encodings, qk_norm=qk_norm,
                              proj_drop=dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=dropout)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, masks: Tensor | None = None) -> Tensor:
        attn_mask, mlp_mask = (None, None) if masks is None else (masks[0], masks[1])
        x = x + self.drop_path(self.attn(self.norm1(x)), attn_mask)
        return x + self.drop_path(self.mlp(self.norm2(x)), mlp_mask)


class ViT(nn.Module):
    """Patch embedding, token-hook encodings (layer -1), `depth` blocks, mean pooling, linear head.

    `drop_path` is the stochastic-depth rate of the last block, rising linearly from 0 (timm).
    """

    def __init__(self, *, img_size: int, patch_size: int, in_chans: int, num_classes: int, backend: BackendLayer,
                 encodings: EncodingLayers, dim: int = 64, depth: int = 4, heads: int = 4, mlp_ratio: float = 2.0,
                 drop_path: float = 0.1, dropout: float = 0.0, qk_norm: str = "none", init: str = "trunc_normal") -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=dim)
        self.token_encodings = encodings(("token",), -1)
        rates = torch.linspace(0, drop_path, depth).tolist()
        self.blocks = nn.Sequential(*(
            Block(dim, heads, i, backend=backend, encodings=encodings, mlp_ratio=mlp_ratio, drop_path=rates[i],
                  dropout=dropout, qk_norm=qk_norm)
            for i in range(depth)
        ))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        if init == "trunc_normal":
            self.apply(_init_weights)
        elif init != "torch_default":  # torch_default: every layer keeps the initialisation its constructor drew
            raise ValueError(f"field 'init' has value {init!r}; allowed: trunc_normal, torch_default")

    def forward_features(self, images: Tensor, path_masks: Tensor | None = None) -> Tensor:
        x = self.patch_embed(images)  # b n c, row-major patches as pe.base.grid_positions
        for pe in self.token_encodings:
            x = pe.add_to_tokens(x)
        for i, block in enumerate(self.blocks):
            x = block(x, None if path_masks is None else path_masks[2 * i:2 * i + 2])
        return self.norm(x)

    def forward(self, images: Tensor, path_masks: Tensor | None = None) -> Tensor:
        """Logits (b, classes). `path_masks` (2 depth, b, 1, 1): every stochastic-depth mask of this
        forward, from `draw_path_masks`; None: drawn inside (eval ignores them)."""
        return self.head(self.forward_features(images, path_masks).mean(dim=1))

    def draw_path_masks(self, batch: int, *, dtype: torch.dtype, device: torch.device | str,
                        generator: torch.Generator | None = None) -> Tensor:
        """(2 depth, batch, 1, 1) masks in the order the eager forward draws them (block by block,
        attention then MLP; a site with rate 0 draws nothing and gets ones). `dtype` is the dtype of
        the residual branch there (bf16 under autocast), as timm's draw would have it.

        Each site draws Bernoulli(keep) in place into its row, from the generator, in that order: the
        same numbers as timm's separate draw of a (batch, 1, 1) tensor. The 1 / keep of every site is
        applied by one multiplication with a per-site column computed once (`_path_scales`, the same
        `ones.div_(keep)` bits timm's division gives), so a step costs sites + 2 ops per model, not 3
        per site (tests/test_step_ops.py).
        """
        masks = torch.ones((2 * len(self.blocks), batch, 1, 1), dtype=dtype, device=device)
        for j, keep in enumerate(self._path_keeps()):
            if keep < 1.0:
                masks[j].bernoulli_(keep, generator=generator)
        return masks.mul_(self._path_scales(dtype, torch.device(device)))

    def _path_keeps(self) -> list[float]:
        """Keep probability of each stochastic-depth site (two per block), in draw order."""
        return [1.0 - block.drop_path.drop_prob for block in self.blocks for _ in range(2)]

    def _path_scales(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """(sites, 1, 1, 1) column of 1 / keep per site in `dtype`, rounded as timm's `mask.div_(keep)`
        rounds it (1 where nothing is drawn); computed once per dtype and device."""
        cache = self.__dict__.setdefault("_path_scale_cache", {})
        if (dtype, device) not in cache:
            ones = [torch.ones((1, 1, 1), dtype=dtype, device=device) for _ in self._path_keeps()]
            cache[dtype, device] = torch.stack([one.div_(keep) if keep < 1.0 else one
                                                for one, keep in zip(ones, self._path_keeps())])
        return cache[dtype, device]

    def no_weight_decay(self) -> set[str]:
        """Names of parameters AdamW must not decay (timm's convention, read by make_optimizer).

        Biases and norm gains (every parameter with ndim <= 1), every parameter of a position
        encoding (absolute tables, Luo bias tables, RoPE-mixed frequencies, STRING generators,
        reflection vectors, rotinv coefficients: decaying them pulls the encoding towards "no
        position"), and whatever a submodule declares in its own `no_weight_decay()`.
        """
        names = {name for name, p in self.named_parameters() if p.ndim <= 1}
        for prefix, module in self.named_modules():
            if isinstance(module, PositionEncoding):
                names |= {f"{prefix}.{name}" for name, _ in module.named_parameters()}
            elif module is not self and hasattr(module, "no_weight_decay"):
                names |= {f"{prefix}.{name}" for name in module.no_weight_decay()}
        return names

    def attention_layers(self) -> list[Attention]:
        return [block.attn for block in self.blocks]


def _init_weights(m: nn.Module) -> None:
    """timm's ViT init: trunc-normal(0.02) linear weights, zero biases, unit LayerNorms."""
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


__all__ = ["Attention", "Block", "DropPath", "ViT", "PositionEncoding", "draw_path_mask"]
