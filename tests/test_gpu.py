"""Checks that need a real CUDA device; every test here is skipped without one.

Run them with `benchmarks/gpu_check.sh` (or `pytest -m gpu tests/test_gpu.py`, `-n 6` with pytest-xdist)
on a GPU machine; benchmarks/gpu_lease.sh runs them first in a lease. Every cell of all12.yaml runs
here as the sweep runs it (fused, compiled by Inductor, bf16, at 49 and 64 tokens) against its eager
solo run (tests/all12_cells.py), and the fused compiled step is checked never to wait for the GPU.
They cover what the CPU suite cannot: every attention x encoding variant under bf16 autocast on
CUDA (cuFFT takes half precision for powers of two only, so the shapes here are chosen to give
FFT sizes that are not), the train task end to end on the GPU, fractional packing of four
0.25-GPU trials on one GPU with each process capped at its share of the memory, whole-GPU trials
on the device Ray assigned, and that timing waits for the GPU (kernel launches return early).
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pandas as pd
import pytest
import ray
import torch

from rpevit import metrics
from rpevit.config import TrialConfig
from rpevit.sweep.session import NOSET_ENV
from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.space import expand_space
from rpevit.sweep.gpus import place_on_devices
from rpevit.tasks.train import train_and_evaluate
from tests.all12_cells import all12_cells, cell_id, check_cell
from tests.test_amp_cpu import (FFT_AND_SOLVE_CASES, HALF, TINY_MODEL, bf16_train_steps, case_id,
                                fft_and_solve_dtypes, sparse_cg_error_under_autocast, variant_cases)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")]

# cifar10-shaped: 32x32 / patch 4 -> an 8x8 grid, whose Luo FFT is 15 x 15 (not a power of two);
# dim 24 / 2 heads -> head dim 12, so the circulant STRING's FFT length is not one either
GPU_MODEL = {**TINY_MODEL, "dataset": "cifar10", "patch_size": 4, "dim": 24, "device": "cuda"}
GPU_CASES = variant_cases(GPU_MODEL)
SWEEP_TRIAL = {"dataset": "digits", "dim": 32, "depth": 2, "heads": 2, "train_subset": 0,
               "device": "cuda", "amp": "bf16"}


@pytest.fixture
def fresh_ray():
    """No Ray left from an earlier test (the runner starts its own, as `sweep.py` does), and this
    process's cached GPU memory handed back before trials share the GPU."""
    ray.shutdown()
    torch.cuda.empty_cache()
    yield
    ray.shutdown()


@pytest.fixture
def one_gpu(monkeypatch) -> int:
    """Ray processes started from here see only this process's first GPU (its cuda:0).

    Fractional trials claim the least-loaded visible GPU, so on a multi-GPU node four 0.25-GPU
    trials would spread out instead of sharing one; packing is what is tested here.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0] if visible else "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", first)
    return 0


def parent_index(ray_gpu_id: str) -> int:
    """This process's torch index of the GPU that Ray calls ray_gpu_id (an entry of the
    CUDA_VISIBLE_DEVICES that Ray started with, else a physical index)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ids.index(ray_gpu_id)


# -- every variant under bf16 on CUDA ---------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_variant_trains_bf16_steps_on_cuda(case: tuple[str, str, dict]) -> None:
    attention, pe, opts = case
    cfg = TrialConfig.from_dict({**GPU_MODEL, "attention": attention, "pe": pe, **opts})
    losses = bf16_train_steps(cfg, steps=3)
    assert all(math.isfinite(x) for x in losses), losses


@pytest.mark.parametrize("attention,pe,opts", FFT_AND_SOLVE_CASES)
def test_fft_and_solve_paths_run_in_float32_on_cuda(attention: str, pe: str, opts: dict) -> None:
    seen = fft_and_solve_dtypes(attention, pe, opts, "cuda")
    assert not [s for s in seen if s[1] in HALF], seen


@pytest.mark.filterwarnings("error:sparse Cayley CG stopped")
def test_sparse_cayley_cg_is_exact_to_float32_under_cuda_autocast() -> None:
    error = sparse_cg_error_under_autocast("cuda")
    assert error < 1e-5, error


@pytest.mark.slow
@pytest.mark.parametrize("attention,pe,extra", [("softmax", "ape", {}),
                                                ("favor", "ape+luo_rpe", {"luo_path": "fft"})])
def test_train_task_runs_on_cuda_under_bf16(attention: str, pe: str, extra: dict) -> None:
    cfg = TrialConfig.from_dict({"dataset": "digits", "dim": 32, "depth": 2, "heads": 2, "epochs": 2,
                                 "train_subset": 400, "device": "cuda", "amp": "bf16",
                                 "attention": attention, "pe": pe, **extra})
    row = train_and_evaluate(cfg, log=None)  # raises DivergedError on a non-finite training loss
    assert row["epochs_done"] == 2 and math.isfinite(row["log_likelihood"])
    assert row["peak_mem_kind"] == "cuda_max_allocated" and row["peak_mem_mb"] > 0
    assert row["device_name"] == torch.cuda.get_device_name(0)
    assert row["images_per_s"] > 0


# -- CUDA-synchronised timing ---------------------------------------------------------------

def _busy_gpu() -> None:
    """One kernel that keeps the GPU busy for tens of ms but returns to the host at once."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(100_000_000)  # spin cycles: ~50 ms at 2 GHz
    else:
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):
            a = a @ a
            a = a / a.norm()


def test_median_time_synchronises_with_the_gpu(monkeypatch) -> None:
    device = torch.device("cuda")
    _busy_gpu()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    _busy_gpu()
    end.record()
    end.synchronize()
    gpu_s = start.elapsed_time(end) / 1000
    launch_start = time.perf_counter()
    _busy_gpu()
    launch_s = time.perf_counter() - launch_start
    torch.cuda.synchronize()
    assert launch_s < 0.5 * gpu_s, (launch_s, gpu_s)  # else an unsynchronised timer would pass too

    calls: list[object] = []
    real = torch.cuda.synchronize

    def counting_synchronize(dev=None) -> None:
        calls.append(dev)
        real(dev)

    monkeypatch.setattr(torch.cuda, "synchronize", counting_synchronize)
    timed = metrics.median_time(_busy_gpu, device, warmup=1, iters=3)
    assert len(calls) == 2 * 3  # before and after every timed call
    assert timed >= 0.8 * gpu_s, (timed, gpu_s)


# -- fractional packing: four 0.25-GPU trials on one GPU ---------------------------------------

@pytest.mark.slow
def test_sweep_packs_four_quarter_gpu_trials_on_one_gpu(tmp_path, fresh_ray, one_gpu) -> None:
    """A real local sweep (the runner starts Ray itself, as `sweep.py` does): all four trials run
    at one moment, on the same GPU, each within its quarter of the memory."""
    space = expand_space({"name": "pack", "fixed": {**SWEEP_TRIAL, "epochs": 20},
                          "grid": {"pe": ["ape", "rope"], "attention": ["softmax", "favor"]},
                          "resources": {"cpus_per_trial": 1, "gpus_per_trial": 0.25}}, source="pack.yaml")
    assert run_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False)) == 0
    trials = pd.read_parquet(tmp_path / "pack" / "trials.parquet")
    assert len(trials) == 4 and set(trials["status"]) == {"ok"}, trials[["trial_key", "status"]]
    assert trials["started_at"].max() < trials["finished_at"].min(), trials[["started_at", "finished_at"]]
    assert trials["ray_gpu_ids"].nunique() == 1 and set(trials["cuda_device"]) == {0}
    assert set(trials["device_name"]) == {torch.cuda.get_device_name(one_gpu)}
    assert set(trials["peak_mem_kind"]) == {"cuda_max_allocated"}
    quarter_mb = 0.25 * torch.cuda.get_device_properties(one_gpu).total_memory / 2**20
    assert (trials["peak_mem_mb"] <= quarter_mb).all()


@pytest.mark.slow
def test_every_quarter_gpu_process_is_capped_at_its_share(tmp_path, fresh_ray, one_gpu) -> None:
    """Four concurrent Ray workers (0.25 GPU each, Ray told not to set CUDA_VISIBLE_DEVICES as
    the runner does) go through `place_on_devices`; each one reads its memory fraction back and
    is refused an allocation above its share while the others hold theirs."""
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False,
             runtime_env={"env_vars": {NOSET_ENV: "1"}})
    barrier = tmp_path / "barrier"
    barrier.mkdir()

    @ray.remote(num_cpus=1, num_gpus=0.25)
    def probe(barrier_dir: str) -> dict:
        placement = place_on_devices(1, 0.25)
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        held = torch.empty(int(0.1 * total), dtype=torch.uint8, device=device)  # within the share
        Path(barrier_dir, str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(Path(barrier_dir).iterdir())) < 4:  # all four alive at once
            if time.monotonic() > deadline:
                raise TimeoutError("the four 0.25-GPU workers did not run concurrently")
            time.sleep(0.05)
        try:
            torch.empty(int(0.3 * total), dtype=torch.uint8, device=device)
            refused = False
        except torch.cuda.OutOfMemoryError:
            refused = True
        del held
        return {**placement, "device": device, "fraction": torch.cuda.get_per_process_memory_fraction(device),
                "refused_above_share": refused, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    results = ray.get([probe.remote(str(barrier)) for _ in range(4)], timeout=300)
    assert len({r["pid"] for r in results}) == 4
    assert {r["device"] for r in results} == {0} and {r["cuda_device"] for r in results} == {0}
    assert all(r["fraction"] == pytest.approx(0.25) for r in results), results
    assert all(r["refused_above_share"] for r in results), results


# -- whole GPUs: the device Ray assigned ------------------------------------------------------

@pytest.mark.slow
def test_whole_gpu_trial_runs_on_the_gpu_ray_assigned(tmp_path, fresh_ray) -> None:
    space = expand_space({"name": "whole", "fixed": {**SWEEP_TRIAL, "epochs": 1},
                          "grid": {"pe": ["ape"]}, "resources": {"cpus_per_trial": 1, "gpus_per_trial": 1}},
                         source="whole.yaml")
    assert run_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False)) == 0
    trials = pd.read_parquet(tmp_path / "whole" / "trials.parquet")
    assert len(trials) == 1 and trials["status"].iloc[0] == "ok"
    row = trials.iloc[0]
    assert len(str(row["ray_gpu_ids"]).split(",")) == 1
    assert row["cuda_device"] == 0  # Ray sets CUDA_VISIBLE_DEVICES to the one GPU it assigned
    assert row["device_name"] == torch.cuda.get_device_name(parent_index(str(row["ray_gpu_ids"])))


@pytest.mark.slow
def test_whole_gpu_workers_use_exactly_their_assigned_device(fresh_ray) -> None:
    """One 1-GPU worker per GPU of the machine: each one's current CUDA device is, by UUID, the
    physical GPU that Ray assigned to it, and no two workers share one."""
    count = torch.cuda.device_count()
    ray.init(num_cpus=count, num_gpus=count, include_dashboard=False)

    @ray.remote(num_cpus=1, num_gpus=1)
    def probe() -> dict:
        placement = place_on_devices(1, 1)
        device = torch.cuda.current_device()
        time.sleep(2)  # hold the GPU, so that Ray cannot hand it to the next probe
        return {**placement, "uuid": str(torch.cuda.get_device_properties(device).uuid)}

    results = ray.get([probe.remote() for _ in range(count)], timeout=300)
    assert len({r["ray_gpu_ids"] for r in results}) == count
    for r in results:
        expected = str(torch.cuda.get_device_properties(parent_index(r["ray_gpu_ids"])).uuid)
        assert r["uuid"] == expected, r


# -- fused seed groups and the compiled step on CUDA (inductor) --------------------------------
FUSED_RUN = {"dataset": "digits", "train_subset": 256, "batch_size": 64, "epochs": 2, "dim": 32, "heads": 2,
             "depth": 2, "num_features": 16, "redraw_interval": 3, "eval_draws": 2, "device": "cuda", "amp": "bf16"}


@pytest.mark.slow
@pytest.mark.parametrize("attention,pe,compile_mode", [("softmax", "ape", "off"), ("favor", "luo_rpe", "off"),
                                                        ("softmax", "rotinv", "off"),
                                                        ("softmax", "luo_rpe", "off"),
                                                        ("softmax", "ape", "on"), ("favor", "rope", "on"),
                                                        ("relu", "cayley_string", "cudagraphs")])
def test_fused_group_and_compiled_step_train_on_cuda(attention: str, pe: str, compile_mode: str) -> None:
    """A fused group of 3 on the GPU (bf16, inductor where compiled) finishes every member with a finite
    log-likelihood, and each member's test accuracy is within 0.05 absolute (18 of digits' 360 test images)
    of its solo eager run's (same data, masks, draws; compile off, so not the fused, compiled bf16 step).

    Why a tolerance and not equality: the fused step (vmap, and inductor where compiled) orders bf16 sums
    differently from the solo step, and over 2 epochs the rounding differences feed through every update,
    so the two runs may classify a few test images differently. 0.05 is a loose bound: it catches a member
    trained or evaluated on another member's data, masks, seed or draws only where that moves its accuracy
    by more than 18 images; it does not show the runs agree "up to bf16 rounding"."""
    from rpevit.tasks.train_group import train_group

    cfgs = [TrialConfig.from_dict({**FUSED_RUN, "attention": attention, "pe": pe, "compile": compile_mode,
                                   "seed": s}) for s in range(3)]
    rows = train_group(cfgs, log=None)
    assert all(isinstance(r, dict) for r in rows), rows
    for cfg, row in zip(cfgs, rows):
        solo = train_and_evaluate(cfg.replace(compile="off"), log=None)
        # TODO(next GPU lease): a per-member check of log_likelihood against the solo run's, with a tolerance
        # measured on the GPU; not tightened here because it cannot run without one.
        assert abs(row["test_acc"] - solo["test_acc"]) < 0.05, (cfg.seed, row["test_acc"], solo["test_acc"])
        assert row["fused_members"] == 3 and math.isfinite(row["log_likelihood"])


# -- every all12.yaml cell as the sweep runs it: fused, compiled (Inductor), bf16, 49 and 64 tokens ---
ALL12_CELLS = all12_cells(depth=2, device="cuda", amp="bf16")


@pytest.mark.slow
@pytest.mark.parametrize("compile_mode", ["on", "cudagraphs"])
@pytest.mark.parametrize("cfg", ALL12_CELLS, ids=cell_id)
def test_every_all12_cell_fused_compiled_bf16_equals_its_eager_solo_run(cfg: TrialConfig, compile_mode: str) -> None:
    """3 members, 4 steps (a redraw every 2): every step's clipped gradients, every loss and the parameters
    after the last step equal the eager solo runs' up to bf16 rounding, and the compiled step did not fall
    back to eager. The same check under `cudagraphs` (all12.yaml's `on` with CUDA graphs, measured several
    times faster on an H100: results/gpu_h100/lease_2026-11-26), where steps 3 and 4 replay the recorded
    graphs, reading their inputs from captured buffers: their backward and update are compared, not only
    the warm-up step's (issue 60)."""
    result = check_cell(cfg.replace(compile=compile_mode), members=3, steps=4)
    assert not result["compile_fallback"], result
    replayed = result["grad_error_by_step"][2:]  # steps 3 and 4: replays under CUDA graphs
    assert len(replayed) == 2 and max(replayed) < result["tolerance"], result
    assert result["ok"], result  # every step's gradients, every loss, the last parameters


@pytest.mark.slow
@pytest.mark.parametrize("attention,pe,redraw", [("favor", "luo_rpe", 1), ("relu", "rope", 1),
                                                 ("softmax", "circulant_string", 100)])
def test_the_fused_compiled_step_never_waits_for_the_gpu(attention: str, pe: str, redraw: int) -> None:
    """After warm-up, a fused compiled step (random-feature schedule and redraws, drop-path masks, forward,
    backward, per-member clipping, fused AdamW, schedule) makes no synchronising CUDA call: torch's sync
    debug mode raises on any. all12.yaml redraws every step: each layer's new draw is copied from pinned
    host memory, queued behind the step, never waited for."""
    from rpevit.attention.kernelized import advance_random_features
    from rpevit.data import synthetic_splits
    from rpevit.models import build_model
    from rpevit.tasks.schedule import warmup_cosine
    from rpevit.tasks.steppers import StackedStep

    cfg = next(c for c in ALL12_CELLS if c.dataset == "cifar10" and c.attention == attention and c.pe == pe)
    cfg = cfg.replace(redraw_interval=redraw)
    device = torch.device("cuda")
    data = synthetic_splits("cifar10", 64, device)
    models = [build_model(cfg.replace(seed=s), 3, 10).to(device).train() for s in range(3)]
    stepper = StackedStep(models, cfg, device, data.normalize, warmup_cosine(100, 1))
    generators = [torch.Generator(device=device).manual_seed(s) for s in range(3)]

    def step() -> None:
        for model in models:
            advance_random_features(model)
        masks = [m.draw_path_masks(8, dtype=torch.bfloat16, device=device, generator=g)
                 for m, g in zip(models, generators)]
        stepper.step([data.x_train[:8]] * 3, [data.y_train[:8]] * 3, masks)

    for _ in range(3):  # compilation, the optimizer's state, the allocator's pools
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not stepper.forward_loss.fallback
