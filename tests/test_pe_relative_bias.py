"""luo_rpe: the learned offset table, its dense form, and softmax with the bias vs the definition."""
import math

import torch

from rpevit.config import TrialConfig
from rpevit.models import build_model
from rpevit.pe.relative_bias import LuoRelativeBias, RelativeBias


def cfg(**kw):
    return TrialConfig.from_dict({**dict(image_size=8, patch_size=2, dim=16, heads=2, pe="luo_rpe"), **kw})


def luo(**options) -> LuoRelativeBias:
    """The encoding on cfg()'s 4 x 4 grid with 2 heads of dim 8, built directly."""
    return LuoRelativeBias(grid=(4, 4), heads=2, head_dim=8, layer=0, **options)


def test_table_shape_zero_init_and_modulation():
    pe = luo()
    assert pe.hook == "score"
    assert pe.table.shape == (2, 7, 7) and pe.table.requires_grad
    assert torch.count_nonzero(pe.table) == 0  # c = 1: training starts from the plain backend
    mod = pe.modulation()
    assert isinstance(mod, RelativeBias) and torch.equal(mod.table, pe.table) and mod.grid == (4, 4)


def test_table_is_luo_scale_times_the_raw_parameter():
    """b = luo_scale * raw: an Adam step of size lr on raw moves b by luo_scale * lr."""
    for scale in (1.0, 10.0):
        pe = luo(luo_scale=scale)
        with torch.no_grad():
            pe.raw_table.normal_()
        torch.testing.assert_close(pe.table, scale * pe.raw_table)
        before = pe.table.detach().clone()
        optimizer = torch.optim.Adam(pe.parameters(), lr=1e-3)
        pe.table.sum().backward()
        optimizer.step()  # Adam's first step moves every entry by lr exactly
        torch.testing.assert_close(pe.table.detach() - before, torch.full_like(before, -scale * 1e-3))


def test_dense_log_equals_offset_lookup():
    pe = luo()
    with torch.no_grad():
        pe.raw_table.normal_()
    dense = pe.modulation().dense_log()
    pos = pe.positions.long().tolist()  # (x, y)
    for i, (xi, yi) in enumerate(pos):
        for j, (xj, yj) in enumerate(pos):
            torch.testing.assert_close(dense[:, i, j], pe.table[:, yj - yi + 3, xj - xi + 3])


def test_softmax_with_bias_equals_definition():
    pe = luo()
    with torch.no_grad():
        pe.raw_table.normal_()
    from rpevit.attention.softmax import SoftmaxAttention

    q, k, v = torch.randn(3, 1, 2, 16, 8).unbind(0)
    bias = pe.modulation().dense_log()
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + bias, dim=-1)
    torch.testing.assert_close(SoftmaxAttention(heads=2, head_dim=8)(q, k, v, pe.modulation()), weights @ v)


def test_one_table_per_layer_in_the_model():
    model = build_model(cfg(depth=3), in_chans=1, num_classes=10)
    tables = [p for n, p in model.named_parameters() if n.endswith(".raw_table")]
    assert len(tables) == 3 and len({t.data_ptr() for t in tables}) == 3
