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


class _Op(torch.nn.Module):
    """One traced op: count_flops sees exactly it (its handle's count, per example of a batch of 1)."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


@pytest.mark.parametrize("name, fn, shape, hand", [
    # rfft2 over the last two dims of (1, 3, 8, 16): 3 transforms of n = 8 * 16 = 128 points, n log2 n each
    ("rfft2", lambda x: torch.fft.rfft2(x).real, (1, 3, 8, 16), 3 * 128 * 7),
    # toeplitz_fft_matvec's form: rfft2 zero-padded to s = (8, 16) from a 5 x 9 image (the padded length counts)
    ("rfft2 s", lambda x: torch.fft.rfft2(x, s=(8, 16)).real, (1, 3, 5, 9), 3 * 128 * 7),
    # irfft2 back to s = (8, 16) from (1, 3, 8, 9) bins: n is the real output's 128 points, 3 transforms
    ("irfft2 s", lambda x: torch.fft.irfft2(torch.complex(x, x), s=(8, 16)), (1, 3, 8, 9), 3 * 128 * 7),
    # 1-d rfft zero-padded to n = 32 along the last dim of (1, 4, 20): 4 transforms of 32 points
    ("rfft n", lambda x: torch.fft.rfft(x, n=32, dim=-1).real, (1, 4, 20), 4 * 32 * 5),
    # circulant_string's form: irfft to n = 16 from (1, 2, 9) bins: 2 transforms of 16 points
    ("irfft n", lambda x: torch.fft.irfft(torch.complex(x, x), n=16, dim=-1), (1, 2, 9), 2 * 16 * 4),
])
def test_fft_handle_counts_n_log2_n_per_transform(name: str, fn, shape: tuple[int, ...], hand: int) -> None:
    """The luo_rpe `fft` path's bench rows take their `flops` from this handle: a hand count of every FFT form
    rpevit calls (a count of n, or of 0, per transform fails here)."""
    flops, unsupported = count_flops(_Op(fn), torch.randn(*shape))
    assert unsupported == {}
    assert flops == hand


def test_triangular_solve_handle_counts_n_squared_over_2_per_column() -> None:
    """reflection_string's compact WY form: A (2 heads, 5 x 5) X = B (5 x 3): 2 * floor(25 / 2) * 3."""
    a = torch.eye(5) + torch.triu(torch.rand(2, 5, 5), diagonal=1)
    flops, unsupported = count_flops(_Op(lambda b: torch.linalg.solve_triangular(a, b, upper=True)),
                                     torch.randn(1, 2, 5, 3))
    assert unsupported == {}
    assert flops == 2 * (25 // 2) * 3


def test_fft_handle_reads_dims_given_as_a_list() -> None:
    """rfft2 over dims (-3, -2) of (1, 8, 16, 3): 3 transforms of 8 x 16 points (a `dim` list read as absent
    counted the default last two dims: 8 transforms of 16 x 3)."""
    flops, unsupported = count_flops(_Op(lambda x: torch.fft.rfft2(x, dim=(-3, -2)).real), torch.randn(1, 8, 16, 3))
    assert unsupported == {}
    assert flops == 3 * 128 * 7
