"""The one place where a TrialConfig becomes layers: backends, encodings and the ViT.

Layers take explicit keyword arguments, as timm's `Attention(dim, num_heads, ...)` does: the
layer context (`dim`, `heads`, `head_dim`, `grid`, `layer`, `seed`) and their own options, each
declared beside the class (rpevit.registry.Option, `register_pe(..., options=...)`), which the config
makes TrialConfig fields of the same names. This module fills exactly those a registered class takes
(rpevit.registry.init_parameters: its `__init__` signatures up the `**context` chain): context from
the config and the layer index, options from the class's own config section (`attention` for
backends, `pe` for encodings). So a new variant stays one file: it declares its options, and
neither the config, the model nor this module changes; a name that is neither context, nor a core
field of its section, nor an option the class declares is refused when the layer is built (and,
by the same rule, when its config is validated).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import nn

from rpevit import registry
from rpevit.attention.base import AttentionBackend
from rpevit.config import TrialConfig, layer_arguments, layer_context  # the one rule of a layer's arguments

if TYPE_CHECKING:
    from rpevit.models.vit import ViT


def build_attention(cfg: TrialConfig, layer: int, *, name: str | None = None) -> AttentionBackend:
    """The backend cfg.attention (or `name`, e.g. "softmax" for the softmax swap) of attention layer `layer`."""
    registry.load_all()
    cfg = cfg.resolved()  # no layer sees a placeholder; idempotent (construction only, never in a forward)
    cls = registry.ATTENTIONS[name or cfg.attention]
    return cls(**layer_arguments(cls, cfg, "attention", layer))


def build_encodings(cfg: TrialConfig, hook_kinds: tuple[str, ...], layer: int) -> nn.ModuleList:
    """Instances of the encodings named in cfg.pe whose hook is one of `hook_kinds` (layer -1: the token hook)."""
    registry.load_all()
    cfg = cfg.resolved()
    classes = [registry.POSITION_ENCODINGS[name] for name in cfg.pe_names]
    return nn.ModuleList(c(**layer_arguments(c, cfg, "pe", layer)) for c in classes if c.hook in hook_kinds)


def build_model(cfg: TrialConfig, in_chans: int, num_classes: int) -> ViT:
    """Seeded construction: the same cfg.seed gives the same initial weights and random patterns."""
    from rpevit.models.vit import ViT  # timm with the first model built: validation imports the tasks, not timm

    cfg = cfg.resolved()  # layers take values, never "the dataset's" placeholders (init, redraw, luo_scale)
    torch.manual_seed(cfg.seed)
    return ViT(
        img_size=cfg.resolved_image_size, patch_size=cfg.resolved_patch_size, in_chans=in_chans,
        num_classes=num_classes, dim=cfg.dim, depth=cfg.depth, heads=cfg.heads, mlp_ratio=cfg.mlp_ratio,
        drop_path=cfg.drop_path, dropout=cfg.dropout, qk_norm=cfg.qk_norm, init=cfg.init,
        backend=functools.partial(build_attention, cfg), encodings=functools.partial(build_encodings, cfg),
    )


__all__ = ["build_attention", "build_encodings", "build_model", "layer_arguments", "layer_context"]
