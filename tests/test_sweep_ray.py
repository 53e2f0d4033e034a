"""Real sweeps through Ray on CPU: Parquet rows, fractional-GPU packing, multi-node spreading.

Tiny digits trials (dim 16, depth 1, 200 images); logical GPUs (`num_gpus=`) stand in for
hardware, so what is tested is Ray's placement and our bookkeeping, not CUDA.
"""
from __future__ import annotations

import pandas as pd
import pytest
import ray

from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.space import Space, expand_space

pytestmark = pytest.mark.slow  # Ray and real sweeps: `pytest -m "not slow"` leaves them out

TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 200, "epochs": 2,
        "batch_size": 64}


def tiny_space(name: str, grid: dict, **extra) -> Space:
    return expand_space({"name": name, "fixed": TINY, "grid": grid, **extra}, source=f"{name}.yaml")


@pytest.fixture
def fresh_ray():
    ray.shutdown()
    yield
    ray.shutdown()


def test_fractional_gpus_run_four_trials_concurrently_on_one_gpu(tmp_path, fresh_ray):
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)
    space = tiny_space("pack", {"pe": ["ape", "rope"], "attention": ["softmax", "favor"]},
                       resources={"cpus_per_trial": 0.5, "gpus_per_trial": 0.25})
    # ~10 s of training each, so that all four overlap despite staggered actor start-up
    space.trials = [{**t, "epochs": 5, "train_subset": 0, "dim": 32, "depth": 2} for t in space.trials]
    assert run_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False)) == 0
    trials = pd.read_parquet(tmp_path / "pack" / "trials.parquet")
    assert len(trials) == 4 and set(trials["status"]) == {"ok"}
    # all four were running at one moment: the last start precedes the first end
    assert trials["started_at"].max() < trials["finished_at"].min(), trials[["started_at", "finished_at"]]
    assert set(trials["ray_gpu_ids"]) == {"0"}  # the single (logical) GPU, shared four ways
    epochs = pd.read_parquet(tmp_path / "pack" / "epochs.parquet")
    assert len(epochs) == 4 * 5 and not epochs.duplicated(["trial_key", "epoch"]).any()


def test_trials_spread_over_the_nodes_of_a_cluster(tmp_path, fresh_ray):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 1})
    try:
        cluster.add_node(num_cpus=4, num_gpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        # either node alone could hold both trials (4 CPU, 1 GPU each): spreading puts them on both
        space = tiny_space("spread", {"pe": ["ape", "rope"]},
                           resources={"cpus_per_trial": 1, "gpus_per_trial": 0.25})
        assert run_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False)) == 0
        trials = pd.read_parquet(tmp_path / "spread" / "trials.parquet")
        assert len(trials) == 2 and set(trials["status"]) == {"ok"}
        assert trials["node_id"].nunique() == 2, trials[["trial_key", "node_id", "ray_gpu_ids"]]
        assert set(trials["ray_gpu_ids"]) == {"0"}  # each node's own GPU 0
    finally:
        ray.shutdown()
        cluster.shutdown()
