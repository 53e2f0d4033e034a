"""A model built under `dtype: float64` is float64 throughout (issue 39, defect 12): every table and
draw an encoding or backend makes at build time is computed in the trial's dtype, not in float32 and
cast; and a float32 model is exactly what it was before (the same float32 values).
"""
from __future__ import annotations

import math

import pytest
import torch

from rpevit import registry
from rpevit.attention.features import iid_gaussian, orthogonal_gaussian
from rpevit.attention.kernelized import FavorAttention, ReluAttention, projection_seed
from rpevit.config import TrialConfig
from rpevit.models import build_model
from rpevit.pe.base import grid_positions
from rpevit.pe.circulant_string import CirculantString
from rpevit.pe.rope import AxialRoPE, MixedRoPE, axial_frequencies
from rpevit.training import default_dtype

registry.load_all()
CONTEXT = dict(grid=(4, 4), heads=2, head_dim=8)
FLOAT64 = TrialConfig.from_dict({"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": 1,
                                 "num_features": 8, "dtype": "float64"})


def test_mixed_rope_built_in_float64_rotates():
    """Failed with 'expected scalar type Float but found Double' (positions were float32)."""
    with default_dtype(FLOAT64):
        pe = MixedRoPE(**CONTEXT)
    assert pe.positions.dtype == pe.frequencies.dtype == torch.float64
    q = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    rq, _ = pe.rotate(q, q)
    angles = (pe.positions.unsqueeze(0).unsqueeze(2) * pe.frequencies.detach().unsqueeze(1)).sum(-1)  # h n d/2
    pairs = q.reshape(1, 2, 16, 4, 2)
    expected = torch.stack([pairs[..., 0] * angles.cos() - pairs[..., 1] * angles.sin(),
                            pairs[..., 0] * angles.sin() + pairs[..., 1] * angles.cos()], dim=-1).reshape(1, 2, 16, 8)
    torch.testing.assert_close(rq, expected, rtol=1e-13, atol=1e-13)


def test_axial_rope_angles_are_computed_in_float64():
    with default_dtype(FLOAT64):
        pe = AxialRoPE(**CONTEXT)
    theta = 100.0 ** (-4.0 * torch.arange(2, dtype=torch.float64) / 8)
    zeros = torch.zeros(2, dtype=torch.float64)
    frequencies = torch.cat([torch.stack([theta, zeros], -1), torch.stack([zeros, theta], -1)])  # d/2, 2
    exact = grid_positions((4, 4)).double() @ frequencies.T
    assert pe.angles.dtype == torch.float64
    assert torch.equal(pe.angles, exact)


def test_circulant_coefficients_are_float64_draws():
    with default_dtype(FLOAT64):
        pe = CirculantString(**CONTEXT)
    assert pe.coefficients.dtype == torch.float64
    assert pe.coefficients.detach().float().double().ne(pe.coefficients.detach()).any()  # not float32 cast up


@pytest.mark.parametrize("backend_class,options", [(FavorAttention, {}), (FavorAttention, {"feature_type": "iid"}),
                                                   (ReluAttention, {})])
def test_projections_are_drawn_in_float64_and_redrawn_in_float64(backend_class, options):
    with default_dtype(FLOAT64):
        backend = backend_class(heads=2, head_dim=8, num_features=8, seed=3, layer=1, redraw_interval=2, **options)
    sample = iid_gaussian if options.get("feature_type") == "iid" else orthogonal_gaussian

    def exact(draw: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(projection_seed(3, 1, draw))
        return sample(8, 8, generator=generator, dtype=torch.float64)

    assert backend.projection.dtype == torch.float64
    assert torch.equal(backend.projection, exact(0))
    for _ in range(3):  # steps 0, 1, 2: the third redraws (draw 1)
        backend.advance_step()
    assert torch.equal(backend.projection, exact(1))


def test_float32_builds_are_unchanged():
    """Under float32 every table is the float64 computation rounded once, as before."""
    pe = AxialRoPE(**CONTEXT)
    assert pe.angles.dtype == torch.float32
    reference = grid_positions((4, 4)).float() @ axial_frequencies(8, 100.0).float().T
    assert torch.equal(pe.angles, reference)
    backend = FavorAttention(heads=2, head_dim=8, num_features=8, seed=3, layer=1)
    generator = torch.Generator().manual_seed(projection_seed(3, 1, 0))
    assert torch.equal(backend.projection, orthogonal_gaussian(8, 8, generator=generator, dtype=torch.float32))


@pytest.mark.parametrize("pe", ["rope", "rope_mixed", "circulant_string", "rotinv"])
def test_every_floating_buffer_and_parameter_is_float64(pe):
    cfg = FLOAT64.replace(pe=pe, attention="favor")
    with default_dtype(cfg):
        model = build_model(cfg, 1, 10)
        logits = model(torch.randn(2, 1, 8, 8))
    assert logits.dtype == torch.float64 and torch.isfinite(logits).all()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point():
            assert tensor.dtype == torch.float64, name
    assert math.isfinite(logits.sum().item())
