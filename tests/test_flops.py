"""FLOP counting: fvcore plus our handles against a hand count; nothing left uncounted."""
from __future__ import annotations

import pytest
import torch

from rpevit.config import TrialConfig
from rpevit.flops import count_flops
from rpevit.models import build_model


def test_flops_match_hand_count_for_a_tiny_vit() -> None:
    cfg = TrialConfig.from_dict({"dim": 8, "depth": 1, "heads": 2, "mlp_ratio": 2.0, "pe": "ape"})
    model = build_model(cfg, in_chans=1, num_classes=10)
    flops, unsupported = count_flops(model, torch.randn(3, 1, 8, 8))
    n, c, h, d, hidden = 16, 8, 2, 4, 16  # 8x8 digits, patch 2 -> 16 tokens
    hand = (
        n * c * (1 * 2 * 2)  # patch embedding conv: one MAC per weight per output pixel
        + n * c * 3 * c  # qkv
        + h * n * n * (d + d)  # q k^T and attn v (SDPA)
        + n * c * c  # output projection
        + n * c * hidden + n * hidden * c  # MLP
        + 3 * 5 * n * c  # three LayerNorms, fvcore counts 5 per element with affine
        + c * 10  # head after mean pooling
    )
    assert unsupported == {}
    assert flops == hand == 14800


def test_flops_scale_quadratically_in_tokens_for_softmax() -> None:
    """Per-token costs grow like N, SDPA like N^2, the head is per image: checks the SDPA handle."""

    def total(image: int) -> int:
        cfg = TrialConfig.from_dict({"task": "bench", "dataset": "cifar10", "image_size": image,
                                     "patch_size": 4, "dim": 16, "depth": 1, "heads": 2})
        flops, unsupported = count_flops(build_model(cfg, 3, 10), torch.randn(1, 3, image, image))
        assert unsupported == {}
        return flops

    sdpa = lambda n: 2 * n * n * 16  # noqa: E731  (heads x head_dim = 16)
    head = 16 * 10
    per_token = (total(16) - sdpa(16) - head) / 16  # 16 tokens
    assert total(32) == round(per_token * 64 + sdpa(64) + head)  # 64 tokens


@pytest.mark.parametrize("attention", ["softmax", "favor", "relu"])
@pytest.mark.parametrize("pe", ["ape", "rope", "luo_rpe", "circulant_string", "rope_mixed"])
def test_flops_are_whole_numbers_for_every_variant(attention: str, pe: str) -> None:
    """fvcore's einsum handle returns floats: the count was printed as 17952.0 for some variants (issue 59)."""
    cfg = TrialConfig.from_dict({"dim": 8, "depth": 1, "heads": 2, "mlp_ratio": 2.0, "pe": pe,
                                 "attention": attention, "num_features": 8})
    flops, unsupported = count_flops(build_model(cfg, in_chans=1, num_classes=10), torch.randn(3, 1, 8, 8))
    assert type(flops) is int and flops > 0 and unsupported == {}
