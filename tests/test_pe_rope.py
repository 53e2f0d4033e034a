"""RoPE (axial) and RoPE-mixed: rotary maps equal dense block-diagonal rotations; config checks."""
import math
import subprocess
import sys

import pytest
import torch

from rpevit.config import ConfigError, TrialConfig
from rpevit.pe.rope import AxialRoPE, MixedRoPE, apply_rotary, axial_frequencies, mixed_frequencies


def dense_rotary(angles):
    """Block-diagonal d x d matrix of 2 x 2 rotations by `angles` (d/2,)."""
    d = 2 * angles.shape[0]
    m = torch.zeros(d, d, dtype=torch.float64)
    for k, a in enumerate(angles.tolist()):
        c, s = math.cos(a), math.sin(a)
        m[2 * k: 2 * k + 2, 2 * k: 2 * k + 2] = torch.tensor([[c, -s], [s, c]])
    return m


def cfg(pe, dim=16, heads=2):
    return TrialConfig.from_dict(dict(image_size=8, patch_size=2, dim=dim, heads=heads, pe=pe))


CONTEXT = dict(grid=(4, 4), heads=2, head_dim=8)  # what cfg(...) gives an encoding: 8 x 8 image, patch 2


def test_apply_rotary_equals_dense_rotation():
    angles = torch.randn(5, 4, dtype=torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64)
    expected = torch.stack([dense_rotary(a) @ v for a, v in zip(angles, x)])
    torch.testing.assert_close(apply_rotary(x, angles), expected)


def test_axial_frequencies_split_planes_between_axes():
    f = axial_frequencies(16, 100.0)
    assert f.shape == (8, 2)
    torch.testing.assert_close(f[:4, 0], 100.0 ** (-4 * torch.arange(4) / 16.0))
    assert torch.equal(f[:4, 1], torch.zeros(4)) and torch.equal(f[4:, 0], torch.zeros(4))
    torch.testing.assert_close(f[4:, 1], f[:4, 0])


@pytest.mark.parametrize("name,cls", [("rope", AxialRoPE), ("rope_mixed", MixedRoPE)])
def test_rotations_are_orthogonal_and_relative(name, cls):
    pe = cls(**CONTEXT, layer=0)
    q = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    rq, rk = pe.rotate(q, q)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))  # orthogonal per token
    # q^T T(r_i)^T T(r_j) k = q^T T(r_j - r_i) k: the same pair at two token pairs with equal offset
    pos = pe.positions.tolist()
    i, j = pos.index([0.0, 0.0]), pos.index([1.0, 2.0])
    i2, j2 = pos.index([2.0, 1.0]), pos.index([3.0, 3.0])
    a, b = torch.randn(2, 8, dtype=torch.float64)
    x = torch.zeros(1, 2, 16, 8, dtype=torch.float64)
    x[0, :, i], x[0, :, i2], x[0, :, j], x[0, :, j2] = a, a, b, b
    r, _ = pe.rotate(x, x)
    logit = lambda s, t: (r[0, :, s] * r[0, :, t]).sum(-1)  # noqa: E731  per head
    torch.testing.assert_close(logit(i, j), logit(i2, j2), atol=1e-5, rtol=1e-5)  # float32 angles
    assert (logit(i, j) - a @ b).abs().max() > 1e-3  # the position really enters


def test_rope_mixed_frequencies_learned_per_head_and_seeded():
    pe = MixedRoPE(**CONTEXT, layer=1)
    assert pe.frequencies.shape == (2, 4, 2) and pe.frequencies.requires_grad
    assert not torch.equal(pe.frequencies[0], pe.frequencies[1])
    torch.testing.assert_close(MixedRoPE(**CONTEXT, layer=1).frequencies, pe.frequencies)
    assert not torch.equal(MixedRoPE(**CONTEXT, layer=2).frequencies, pe.frequencies)


@pytest.mark.slow
def test_rope_mixed_directions_reproducible_across_processes():
    """Fixed random patterns must not depend on Python's per-process string-hash salt."""
    code = ("from rpevit.pe.rope import MixedRoPE;"
            "print(MixedRoPE(grid=(4, 4), heads=2, head_dim=8, layer=1).frequencies.sum().item())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(s)}).stdout.strip() for s in (1, 2)}
    assert len(outs) == 1, outs


def test_head_dim_checks():
    with pytest.raises(ConfigError, match="'dim'.*'rope'.*divisible by 4"):
        cfg("rope", dim=12, heads=2)  # head dim 6
    with pytest.raises(ConfigError, match="'dim'.*'rope_mixed'.*divisible by 4"):
        cfg("rope_mixed", dim=12, heads=2)  # head dim 6: d/4 magnitudes, each used twice


def reference_init_random_2d_freqs(dim: int, num_heads: int, angles: list[float], theta: float = 10.0) -> torch.Tensor:
    """Heo et al.'s `init_random_2d_freqs` (naver-ai/rope-vit, models/vit_rope.py), written out with the
    per-head angle given instead of torch.rand(1): returns (2, heads, dim/2), x then y components."""
    freqs_x, freqs_y = [], []
    mag = 1 / (theta ** (torch.arange(0, dim, 4)[: (dim // 4)].double() / dim))
    for i in range(num_heads):
        a = torch.tensor([angles[i]], dtype=torch.float64)
        freqs_x.append(torch.cat([mag * torch.cos(a), mag * torch.cos(torch.pi / 2 + a)], dim=-1))
        freqs_y.append(torch.cat([mag * torch.sin(a), mag * torch.sin(torch.pi / 2 + a)], dim=-1))
    return torch.stack([torch.stack(freqs_x, dim=0), torch.stack(freqs_y, dim=0)], dim=0)


@pytest.mark.parametrize("head_dim, heads", [(16, 4), (32, 3), (64, 2)])
def test_rope_mixed_starts_where_heo_et_al_start(head_dim, heads):
    """Issue 41: base 10, d/4 magnitudes 10^(-4k/d) each used twice, one random angle per head with the two
    halves of the planes at right angles (the earlier init: base 100, d/2 magnitudes, a direction per plane)."""
    generator = torch.Generator().manual_seed(5)
    ours = mixed_frequencies(head_dim, heads, 10.0, generator)
    angles = (torch.rand(heads, 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
              * 2 * math.pi).flatten().tolist()
    reference = reference_init_random_2d_freqs(head_dim, heads, angles)  # (2, h, d/2)
    torch.testing.assert_close(ours, reference.permute(1, 2, 0), rtol=0, atol=1e-15)
    magnitudes = ours.norm(dim=-1)
    torch.testing.assert_close(magnitudes[0, : head_dim // 4], 10.0 ** (-4 * torch.arange(head_dim // 4,
                                                                                          dtype=torch.float64) / head_dim))
    first, second = ours[:, : head_dim // 4], ours[:, head_dim // 4:]
    torch.testing.assert_close((first * second).sum(-1), torch.zeros(heads, head_dim // 4, dtype=torch.float64),
                               atol=1e-15, rtol=0)  # the two halves at right angles


def test_rope_mixed_is_not_position_blind_at_the_start():
    """At head dim 16 on a 7x7 grid every plane turns by more than a radian across the grid at the start
    (the earlier base-100 init left four of eight planes under 0.085 rad: nearly position-blind)."""
    pe = MixedRoPE(grid=(7, 7), heads=4, head_dim=16, layer=0)
    angles = torch.einsum("nc,hkc->hnk", pe.positions, pe.frequencies.detach())
    assert (angles.amax(dim=1) - angles.amin(dim=1)).min() > 1.0
    assert pe.frequencies.detach().norm(dim=-1).min().item() == pytest.approx(10 ** (-12 / 16), rel=1e-6)  # 0.178
