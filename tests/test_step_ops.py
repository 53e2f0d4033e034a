"""The per-step work outside the compiled forward is cheap and unchanged: per-member gradient clipping
(foreach: a number of ops independent of the number of parameter tensors) equals the per-tensor
version and each member's solo clip_grad_norm_ in float64; stochastic-depth masks (one in-place draw
per site, one scaling) are bit for bit timm's per-site draws, in float32, float64 and bf16.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.models import build_model
from rpevit.models.vit import draw_path_mask
from rpevit.training import CLIP_EPS, clip_grad_norm_per_member

registry.load_all()
VIEWS = {"select", "view", "slice", "alias", "unsqueeze", "as_strided", "expand", "t", "detach", "_unsafe_view",
         "squeeze", "permute", "transpose", "unbind", "split"}


class CountOps(TorchDispatchMode):
    """aten ops issued (views excluded: they launch nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in VIEWS:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def per_tensor_clip(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The per-tensor implementation this replaced (2 ops per tensor): the reference."""
    per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])
    norms = torch.linalg.vector_norm(per_tensor, dim=0)
    coef = (max_norm / (norms + CLIP_EPS)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype).view(-1, *([1] * (g.ndim - 1))))
    return norms


def stacked_params(tensors: int, members: int = 3, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    params = []
    for t in range(tensors):
        p = torch.zeros(members, 1 + t % 4, 3, dtype=torch.float64, requires_grad=True)
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64) * (1 + t)
        p.grad[1] *= 1e-4  # member 1 is not clipped, the others are
        params.append(p)
    return params


def test_foreach_clip_equals_the_per_tensor_clip_and_solo_clipping():
    params = stacked_params(12)
    reference = [p.grad.clone() for p in params]
    solo = [[p.grad[m].clone().requires_grad_(False) for p in params] for m in range(3)]
    norms = clip_grad_norm_per_member(params, 1.0)
    ref_norms = per_tensor_clip(reference, 1.0)
    torch.testing.assert_close(norms, ref_norms, rtol=1e-14, atol=0)
    for p, r in zip(params, reference):
        torch.testing.assert_close(p.grad, r, rtol=1e-14, atol=0)
    for m in range(3):  # each member as clip_grad_norm_ clips a solo model
        leaves = [torch.zeros_like(g, requires_grad=True) for g in solo[m]]
        for leaf, g in zip(leaves, solo[m]):
            leaf.grad = g
        total = torch.nn.utils.clip_grad_norm_(leaves, 1.0)
        torch.testing.assert_close(total, norms[m], rtol=1e-14, atol=0)
        for leaf, p in zip(leaves, params):
            torch.testing.assert_close(leaf.grad, p.grad[m], rtol=1e-14, atol=0)
    assert norms[1] < 1.0 < norms[0]


def test_clipping_issues_the_same_ops_for_10_or_100_parameter_tensors():
    counts = []
    for tensors in (10, 100):
        params = stacked_params(tensors)
        with CountOps() as mode:
            clip_grad_norm_per_member(params, 1.0)
        counts.append(len(mode.ops))
    assert counts[0] == counts[1], counts
    assert counts[0] <= 10, counts


def timm_masks(model, batch: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Each site drawn as timm draws it (a fresh tensor, bernoulli_, div_), in the eager order."""
    masks = torch.ones((2 * len(model.blocks), batch, 1, 1), dtype=dtype)
    for i, block in enumerate(model.blocks):
        rate = block.drop_path.drop_prob
        if rate > 0:
            for j in (2 * i, 2 * i + 1):
                masks[j] = draw_path_mask(batch, 1.0 - rate, dtype=dtype, device="cpu", generator=generator)
    return masks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("drop_path,depth", [(0.1, 9), (0.37, 4), (0.5, 3)])
def test_masks_are_timms_draws_bit_for_bit(dtype, drop_path, depth):
    cfg = TrialConfig.from_dict({"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": depth,
                                 "drop_path": drop_path})
    model = build_model(cfg, 1, 10)
    for batch in (1, 7, 128):
        a, b = torch.Generator().manual_seed(batch), torch.Generator().manual_seed(batch)
        for _ in range(3):  # consecutive steps: the generators stay in step too
            assert torch.equal(model.draw_path_masks(batch, dtype=dtype, device="cpu", generator=a),
                               timm_masks(model, batch, dtype, b))
        assert torch.equal(a.get_state(), b.get_state())


def test_masks_cost_one_draw_per_site_and_two_more_ops():
    cfg = TrialConfig.from_dict({"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": 9,
                                 "drop_path": 0.1})
    model = build_model(cfg, 1, 10)
    model.draw_path_masks(8, dtype=torch.float32, device="cpu")  # the per-site scales, once
    with CountOps() as mode:
        model.draw_path_masks(8, dtype=torch.float32, device="cpu")
    sites = 2 * (9 - 1)  # block 0 has rate 0
    assert mode.ops.count("bernoulli_") == sites
    assert len(mode.ops) <= sites + 2, mode.ops
