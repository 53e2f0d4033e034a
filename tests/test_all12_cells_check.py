"""tests/all12_cells.py's check compares every step, not only the first (issue 60).

Under CUDA graphs a compiled step runs without a graph at step 1, records at step 2 and replays from
step 3 on; the check compared gradients at step 1 only, and losses (which a wrong backward or update
only changes a step later). Here a replay that reads stale gradient buffers from step 3 on is simulated
on the CPU (the gradients of step 2 handed to the update of step 3): the check must fail it, while the
losses of those steps still agree. Float32, eager, depth 1: the comparison is exact to rounding, fast.
"""
from __future__ import annotations

import pytest

from rpevit.tasks import steppers
from tests.all12_cells import TOLERANCE, all12_cells, cell_id, check_cell

CELL = "mnist-49tok-favor+rope"  # random features redrawn every 2 steps inside the check


@pytest.fixture(scope="module")
def cfg():
    cell = next(c for c in all12_cells(depth=1, device="cpu", amp="none") if cell_id(c) == CELL)
    return cell.replace(compile="off", grad_clip=1.0)  # the clip is where the fault below is planted


def test_every_step_s_gradients_and_the_last_parameters_are_compared_and_agree(cfg):
    result = check_cell(cfg, members=2, steps=3)
    assert len(result["grad_error_by_step"]) == 3 and result["ok"], result
    assert max(result["grad_error_by_step"]) < TOLERANCE["none"] and result["param_error"] < TOLERANCE["none"]


def test_a_stale_replay_from_step_3_on_fails_the_check_though_every_loss_agrees(cfg, monkeypatch):
    real, calls, saved = steppers.clip_grad_norm_per_member, [], []

    def stale_from_step_3(params, max_norm):
        params = list(params)
        calls.append(1)
        if len(calls) == 2:
            saved[:] = [p.grad.clone() for p in params]
        if len(calls) >= 3:  # a replayed backward whose gradient buffers still hold step 2's
            for p, old in zip(params, saved):
                p.grad.copy_(old)
        return real(params, max_norm)

    monkeypatch.setattr(steppers, "clip_grad_norm_per_member", stale_from_step_3)
    result = check_cell(cfg, members=2, steps=3)
    assert len(calls) == 3  # one fused step each (the solo copies step through solo_step)
    assert result["loss_error"] < TOLERANCE["none"]  # the losses alone never see it
    assert max(result["grad_error_by_step"][:2]) < TOLERANCE["none"] < result["grad_error_by_step"][2]
    assert result["param_error"] > TOLERANCE["none"] and not result["ok"], result


def test_the_gpu_cell_list_covers_both_datasets_and_every_variant_of_all12() -> None:
    """tests/test_gpu.py checks one cell per (dataset, attention, pe) of all12.yaml: all 24 of them, MNIST at 49
    tokens and CIFAR-10 at 64. A list, so checked on the CPU (it sat in the GPU-only module, never run here)."""
    cells = all12_cells(depth=2, device="cuda", amp="bf16")  # test_gpu.py's arguments; building needs no GPU
    ids = [cell_id(c) for c in cells]
    assert len(ids) == len(set(ids)) == 24
    variants = {f"{a}+{p}" for a in ("softmax", "favor", "relu") for p in ("ape", "luo_rpe", "circulant_string", "rope")}
    for dataset, tokens in (("mnist", 49), ("cifar10", 64)):
        assert {i.split("-", 2)[2] for i in ids if i.startswith(f"{dataset}-{tokens}tok-")} == variants
