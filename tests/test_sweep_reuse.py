"""Reused sweep workers (Tune reuse_actors) and timing trials that have the node to themselves.

- Two different trials run one after the other in one reused worker process give exactly the
  results of fresh processes (reuse off), epoch by epoch.
- The per-run reset puts back what a trial could leave behind: threads, RNGs, peak memory.
- Bench trials never overlap, reserve the whole node, are warmed up and repeated; interleaved
  repeats run in rounds in one worker, and a variant that raises fails alone.
"""
from __future__ import annotations

import random
import resource
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import ray
import torch

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.sweep import session, trainable
from rpevit.sweep.protocol import TrialSpec
from rpevit.sweep.results import TRIALS_FILE
from rpevit.sweep.writer import ParquetResults
from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.launch_plan import node_cpus, slots_on, tune_trials
from rpevit.sweep.space import expand_space
from rpevit.tasks.bench import combine_repeats

TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 200, "epochs": 2,
        "batch_size": 25, "lr": 3.0e-3, "eval_batch_size": 256, "drop_path": 0.1, "eval_draws": 2}
# different in everything a leak could show through: attention backend (random features), encoding,
# seed, width, dropout, label smoothing
TRIAL_A = {"attention": ["favor"], "pe": ["rope"], "seed": [3], "mlp_ratio": [3.0], "dropout": [0.1]}
TRIAL_B = {"attention": ["softmax"], "pe": ["ape"], "seed": [5], "label_smoothing": [0.0]}
COMPARED = ("test_acc", "final_val_acc", "log_likelihood", "f1", "precision", "recall", "test_acc_draw_mean",
            "test_acc_softmax_swap", "attn_tv_to_softmax", "params", "flops", "n_train")
BENCH = {"dataset": "cifar10", "image_size": 8, "patch_size": 4, "dim": 16, "depth": 1, "heads": 2,
         "bench_batch": 2, "bench_warmup": 1, "bench_iters": 2}


@pytest.fixture
def two_cpu_ray():
    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def rows(results: Path, name: str, file: str = TRIALS_FILE) -> pd.DataFrame:
    return pd.read_parquet(results / name / file)


@pytest.mark.slow
def test_two_trials_in_one_reused_worker_equal_their_fresh_process_runs(tmp_path, two_cpu_ray):
    space = {"fixed": TINY, "grid": [TRIAL_A, TRIAL_B], "resources": {"cpus_per_trial": 1, "max_concurrent": 1}}
    for name, reuse in (("reused", True), ("fresh", False)):
        opts = SweepOptions(results_dir=tmp_path, dashboard=False, reuse=reuse)
        assert run_sweep(expand_space({**space, "name": name}, source=f"{name}.yaml"), opts) == 0
    reused, fresh = (rows(tmp_path, n).set_index("trial_key") for n in ("reused", "fresh"))
    assert reused["pid"].nunique() == 1, "both trials should run in one reused worker"
    assert len(fresh) == 2 and fresh["pid"].nunique() == 2 and not set(fresh["pid"]) & set(reused["pid"])
    assert list(reused.sort_values("started_at")["attention"]) == ["favor", "softmax"]  # A first, B after it
    for key in fresh.index:
        for name in COMPARED:  # exactly equal (NaN where a metric does not apply: in both)
            mine, theirs = reused.loc[key, name], fresh.loc[key, name]
            assert mine == theirs or (pd.isna(mine) and pd.isna(theirs)), (key, name, mine, theirs)
        assert reused.loc[key, "torch_threads"] == fresh.loc[key, "torch_threads"] == 1
    epochs = [rows(tmp_path, n, "epochs.parquet").set_index(["trial_key", "epoch"]).sort_index()
              for n in ("reused", "fresh")]
    for name in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert (epochs[0][name] == epochs[1][name]).all(), name


class _NoRayContext:
    """What place_on_devices asks Ray's runtime context outside a Ray worker: no GPU ids, a node id."""

    def get_accelerator_ids(self):
        return {}

    def get_node_id(self):
        return "node-0"


def test_trial_scope_resets_threads_rngs_and_peak_memory(monkeypatch):
    """The real rpevit.sweep.gpus.place_on_devices (only Ray's runtime context is stood in for): a
    previous trial's 3 threads are put back to the trial's 1 CPU, and the RNGs to its seed."""
    monkeypatch.setattr(ray, "get_runtime_context", _NoRayContext)
    cfg = TrialConfig.from_dict({"seed": 7})
    spec = TrialSpec("t", cpus_per_trial=1, gpus_per_trial=0, reserved_cpus=2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # what a previous trial may leave
        with trainable.trial_scope(cfg, spec) as placement:
            assert torch.get_num_threads() == 1
            first = (random.random(), np.random.rand(), torch.rand(3))
        torch.set_num_threads(3)
        random.seed(99), np.random.seed(99), torch.manual_seed(99)  # what a previous trial may leave
        with trainable.trial_scope(cfg, spec) as placement:
            assert torch.get_num_threads() == 1
            again = (random.random(), np.random.rand(), torch.rand(3))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])
    assert placement["torch_threads"] == 1 and placement["reserved_cpus"] == 2.0
    assert placement["cuda_device"] == -1 and placement["ray_gpu_ids"] == ""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("peak RSS reset needs Linux /proc/self/clear_refs")
    trainable.reset_peak_memory()  # the peak is now the current RSS
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    block = np.ones(64 * 2**20 // 8)  # 64 MiB touched, then freed
    del block
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >= before + 60 * 1024
    trainable.reset_peak_memory()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < before + 30 * 1024


def test_cached_dataset_arrays_are_never_handed_out_for_writing(monkeypatch):
    from rpevit import data

    monkeypatch.setattr(data, "_array_cache", None)
    data.cache_arrays()
    splits = data.load_splits("digits", train_subset=100)
    cached = data.load_arrays("digits")
    assert not cached["x_test"].flags.writeable
    splits.x_test.zero_()  # a trial writing into its tensors
    assert data.load_splits("digits", train_subset=100).x_test.sum() > 0


def test_timing_trials_reserve_the_largest_node_that_has_their_gpus(monkeypatch):
    nodes = [{"Alive": True, "Resources": {"CPU": 64.0}}, {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}},
             {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}, {"Alive": False, "Resources": {"CPU": 99.0}}]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    live = session.live_nodes()  # what the planner places Tune trials on: the live nodes only
    assert live == [n["Resources"] for n in nodes[:3]]
    assert node_cpus(live, 0) == 64 and node_cpus(live, 1) == 16  # a CPU-only head node cannot hold it
    assert slots_on(live, {"CPU": 16.0, "GPU": 1.0}, 0, 100) == 1  # one timing trial per (large enough) node
    assert slots_on(live, {"CPU": 1.0, "GPU": 0.25}, 0, 100) == 8 + 4 and slots_on(live, {"CPU": 1.0}, 5, 100) == 5


def test_timing_schedule_orders_rounds_and_warm_up():
    assert trainable.timing_schedule(["a", "b", "c"], 2, True, warmup=True) == [
        ("a", -1), ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)]
    assert trainable.timing_schedule(["a", "b"], 2, False, warmup=False) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_combine_repeats_takes_medians_and_keeps_derived_columns_consistent():
    runs = [{"forward_ms": f, "forward_backward_ms": 3 * f, "train_step_ms": 4 * f, "infer_ms": f / 2,
             "bench_batch": 8, "peak_mem_mb": m} for f, m in ((1.0, 10.0), (3.0, 30.0), (2.0, 20.0))]
    row = combine_repeats(runs)
    assert (row["forward_ms"], row["train_step_ms"], row["backward_ms"]) == (2.0, 8.0, 4.0)
    assert row["images_per_s"] == pytest.approx(8 / 8e-3) and row["infer_ms_per_sample"] == 1.0 / 8
    assert (row["train_step_ms_min"], row["train_step_ms_max"], row["timing_repeats"]) == (4.0, 12.0, 3)
    assert row["peak_mem_mb"] == 30.0


def test_interleaved_group_runs_rounds_and_records_a_raising_variant_alone(tmp_path, monkeypatch):
    space = expand_space({"name": "group", "task": "bench", "fixed": BENCH, "grid": {"pe": ["ape", "rope", "none"]},
                          "timing": {"repeats": 2, "interleave": True}}, source="group.yaml")
    (item,) = tune_trials(space, space.trials, list(range(3)), checkpoint_root=tmp_path / "trials", cpus=1,
                          gpus=0, reserved_cpus=2)
    calls, reports = [], []

    def fake_bench(cfg: TrialConfig, log=None, **_) -> dict:
        calls.append((cfg.pe, log is not None))
        if cfg.pe == "rope" and len(calls) > 3:
            raise MemoryError("N too large")
        return {**cfg.to_dict(), "forward_ms": 1.0, "forward_backward_ms": 2.0, "train_step_ms": float(len(calls)),
                "infer_ms": 0.5, "peak_mem_mb": 1.0}

    monkeypatch.setitem(registry.TASKS, "bench", fake_bench)
    monkeypatch.setattr(trainable, "place_on_devices", lambda cpus, gpus: {
        "hostname": "h", "node_id": "n0", "pid": 1, "ray_gpu_ids": "", "torch_threads": int(cpus)})
    monkeypatch.setattr(trainable.tune, "report", reports.append)
    monkeypatch.setitem(trainable._process, "timed_runs", 0)
    trainable.run_timed(item)
    # warm-up (untimed: no log), round 1 over all three, round 2 where rope raises and is dropped
    assert calls == [("ape", False), ("ape", True), ("rope", True), ("none", True), ("ape", True), ("rope", True),
                     ("none", True)]
    writer = ParquetResults(tmp_path, "group", dict(zip(space.keys, space.trials)),
                            {k: i for i, k in enumerate(space.keys)}, task="bench")
    for result in reports:
        writer.on_trial_result(0, [], SimpleNamespace(trial_id="t0"), result)
    writer.on_experiment_end([])
    table = pd.read_parquet(tmp_path / TRIALS_FILE).set_index("pe")
    assert table.loc["rope", "status"] == "failed" and "MemoryError: N too large" in table.loc["rope", "error"]
    assert table.loc["ape", "train_step_ms"] == 3.5 and table.loc["none", "train_step_ms"] == 5.5  # runs 2,5 / 4,7
    assert (table.loc[["ape", "none"], "timing_repeats"] == 2).all() and table.loc["ape", "reserved_cpus"] == 2
    assert table.loc[["ape", "none"], "process_warm"].all() and table.loc["ape", "timing_interleaved"]


@pytest.mark.slow
def test_bench_trials_have_the_node_to_themselves(tmp_path, two_cpu_ray):
    space = expand_space({"name": "alone", "task": "bench", "fixed": BENCH, "grid": {"pe": ["ape", "rope", "none"]},
                          "resources": {"cpus_per_trial": 1}, "timing": {"repeats": 2}}, source="alone.yaml")
    assert run_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False)) == 0
    table = rows(tmp_path, "alone").sort_values("started_at")
    assert len(table) == 3 and set(table["status"]) == {"ok"}
    # 1 CPU each would let two run at once on 2 CPUs; each reserved both, so none overlapped
    assert (table["started_at"].iloc[1:].to_numpy() >= table["finished_at"].iloc[:-1].to_numpy()).all()
    assert (table["reserved_cpus"] == 2).all() and (table["torch_threads"] == 1).all()
    assert table["pid"].nunique() == 1  # one worker, reused, warmed up once
    assert (table["timing_repeats"] == 2).all() and table["process_warm"].all()
    assert (table["train_step_ms_min"] <= table["train_step_ms"]).all()
    assert (table["train_step_ms"] <= table["train_step_ms_max"]).all()
