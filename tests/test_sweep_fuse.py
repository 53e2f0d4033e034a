"""`fuse: seeds` in a space: groups, the dry-run view, refusals, and a real Ray sweep in which each
group is one Tune trial whose members land as their own rows, resume, and grow by new seeds only."""
from __future__ import annotations

import pandas as pd
import pytest
import ray

from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.launch_plan import tune_trials
from rpevit.sweep.space import SpaceError, expand_space
from tests.test_sweep_ray import fresh_ray  # noqa: F401 - the fixture: no Ray left from another test

TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 96, "epochs": 1, "batch_size": 32,
        "num_features": 8, "redraw_interval": 2, "eval_draws": 2}


def fused_space(seeds=(0, 1, 2), **extra):
    return expand_space({"name": "fused", "fixed": TINY, "grid": {"attention": ["softmax", "favor"]},
                         "seeds": list(seeds), "fuse": "seeds", **extra}, source="fused.yaml")


def test_groups_are_the_seeds_of_one_recipe_and_the_dry_run_shows_them():
    space = fused_space()
    assert space.groups() == [[0, 1, 2], [3, 4, 5]]
    assert space.groups([1, 2, 4]) == [[1, 2], [4]]  # pending trials only: a resume fuses what is left
    lines = space.table().splitlines()
    assert lines[0].split()[:3] == ["#", "trial_key", "group"]
    assert [line.split()[2] for line in lines[1:]] == ["g0"] * 3 + ["g1"] * 3
    specs = tune_trials(space, space.trials, list(range(6)), checkpoint_root="/tmp/x", cpus=1, gpus=0,
                        reserved_cpus=1)
    assert [len(s.members) for s in specs] == [3, 3] and all(s.fused for s in specs)
    assert specs[0].name.endswith("seeds-0-1-2")
    unfused = expand_space({"fixed": TINY, "seeds": [0, 1]}, source="plain.yaml")
    assert unfused.groups() == [[0], [1]] and "group" not in unfused.table().splitlines()[0]


@pytest.mark.parametrize("value,task,match", [("lr", "train", "allowed: seeds"), ("seeds", "bench", "fused-group runner"),
                                               ("seeds", "kernel_mse", "fused-group runner")])
def test_fuse_refuses_what_it_cannot_do(value, task, match):
    with pytest.raises(SpaceError, match=match):
        expand_space({"task": task, "fixed": {"dataset": "digits"}, "fuse": value}, source="bad.yaml")


def test_fuse_refuses_dropout_at_load_time():
    with pytest.raises(SpaceError, match="'dropout'"):
        fused_space(fixed={**TINY, "dropout": 0.1})


@pytest.mark.slow
def test_a_fused_sweep_writes_member_rows_resumes_and_adds_only_new_seeds(tmp_path, fresh_ray):
    ray.init(num_cpus=2, include_dashboard=False)
    space = fused_space(seeds=(0, 1))
    assert run_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False)) == 0
    trials = pd.read_parquet(tmp_path / "fused" / "trials.parquet")
    assert sorted(trials["trial_key"]) == sorted(space.keys) and set(trials["status"]) == {"ok"}
    assert set(trials["fused_members"]) == {2}
    # the two members of a group ran together in one process
    for attention, group in trials.groupby("attention"):
        assert group["pid"].nunique() == 1 and group["started_at"].nunique() == 1, attention
    epochs = pd.read_parquet(tmp_path / "fused" / "epochs.parquet")
    assert len(epochs) == 4 and not epochs.duplicated(["trial_key", "epoch"]).any()
    first = trials.set_index("trial_key")["test_acc"]

    grown = fused_space(seeds=(0, 1, 2))  # a seed added later: only the new members run
    assert run_sweep(grown, SweepOptions(results_dir=tmp_path, dashboard=False, resume=True)) == 0
    trials = pd.read_parquet(tmp_path / "fused" / "trials.parquet")
    assert sorted(trials["trial_key"]) == sorted(grown.keys) and set(trials["status"]) == {"ok"}
    new = trials[trials["seed"] == 2]
    assert set(new["fused_members"]) == {1}  # a group of the new seed alone
    again = trials.set_index("trial_key")["test_acc"]
    assert all(again[k] == v for k, v in first.items())  # nothing that was done ran again
