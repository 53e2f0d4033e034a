"""`branch: epochs` in a space: budget ladders, the dry-run view, refusals, and a real Ray sweep whose
shorter trials resume from the checkpoints their trunk wrote, with a declared comparison recorded
before the first trial."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import ray

from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.space import SpaceError, expand_space
from rpevit.sweep.launch_plan import tune_trials
from tests.test_sweep_ray import fresh_ray  # noqa: F401 - the fixture: no Ray left from another test

TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 96, "batch_size": 32,
        "num_features": 8, "redraw_interval": 2, "redraw_until": 0.8, "eval_draws": 2, "lr_schedule": "wsd",
        "cooldown_fraction": 0.2, "warmup_epochs": 0.5}


def ladder_space(**extra):
    return expand_space({"name": "ladder", "fixed": TINY, "grid": {"attention": ["softmax", "favor"],
                                                                   "epochs": [5, 10]},
                         "seeds": [0, 1], "branch": "epochs", **extra}, source="ladder.yaml")


def test_ladders_run_their_trunks_first_and_the_dry_run_names_the_trunk():
    space = ladder_space()
    ladders = space.ladders()
    assert len(ladders) == 4 and all(space.trials[l[0]]["epochs"] == 10 and space.trials[l[1]]["epochs"] == 5
                                     for l in ladders)
    specs = tune_trials(space, space.trials, list(range(len(space.trials))), checkpoint_root="/tmp/x", cpus=1, gpus=0,
                        reserved_cpus=1)
    assert [s.members[0].cfg["epochs"] for s in specs] == [10] * 4 + [5] * 4  # every trunk before any rung
    assert all(len(s.branches) == 1 and s.branches[0].cfg["epochs"] == 5 for s in specs[:4])
    assert all(not s.branches for s in specs[4:])
    lines = space.table().splitlines()
    assert "branches from" in lines[0] and sum("(trunk)" in line for line in lines[1:]) == 4


@pytest.mark.parametrize("slots", [1, 2, 3, 8])
def test_tune_starts_each_ladders_shorter_trials_soon_after_its_trunk_in_the_spaces_priority(slots):
    """cifar10_ladder_cpu lists softmax and FAVOR+ first: a partial ladder must answer them at every rung
    before any Performer-ReLU trial runs. Each shorter trial comes slots - 1 trunks after its own trunk
    (on one slot: right after it), never before it; every Tune trial once."""
    from pathlib import Path

    from rpevit.sweep.launch_plan import branches_after_their_trunks
    from rpevit.sweep.space import load_space

    space = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / "cifar10_ladder_cpu.yaml")
    specs = tune_trials(space, space.trials, list(range(len(space.trials))), checkpoint_root="/tmp/x", cpus=1,
                        gpus=0, reserved_cpus=1)
    ordered = branches_after_their_trunks(specs, slots)
    assert sorted(s.name for s in ordered) == sorted(s.name for s in specs) and len(ordered) == 108
    trunks = [s.members[0].trial_key for s in ordered if s.branches]
    assert len(trunks) == 36 and trunks == [s.members[0].trial_key for s in specs if s.branches]  # space order
    position = {s.members[0].trial_key: i for i, s in enumerate(ordered)}
    for spec in ordered:
        if not spec.branches:
            continue
        trunk = trunks.index(spec.members[0].trial_key)
        after = trunks[min(trunk + slots - 1, len(trunks) - 1)]
        for branch in spec.branches:  # after its trunk and the slots - 1 next ones, before the trunk after those
            assert position[after] < position[branch.trial_key], (slots, trunk)
            if trunk + slots < len(trunks):
                assert position[branch.trial_key] < position[trunks[trunk + slots]], (slots, trunk)
    attention = [s.members[0].cfg["attention"] for s in ordered]
    last_softmax_favor = max(i for i, a in enumerate(attention) if a != "relu")
    first_relu = attention.index("relu")
    assert first_relu > last_softmax_favor - 3 * (slots - 1)  # only the last lagging rungs wait for relu trunks
    if slots == 1:
        assert [s.members[0].cfg["epochs"] for s in ordered[:6]] == [20, 10, 5, 20, 10, 5]
        assert first_relu == 72  # every softmax/FAVOR+ trial at every rung first


@pytest.mark.parametrize("extra, match", [
    ({"branch": "seeds"}, "'branch' has value 'seeds'; allowed: epochs"),
    ({"branch": "epochs", "fuse": "seeds"}, "allowed: one of the two"),
    ({"fixed": {**TINY, "lr_schedule": "cosine"}}, "field 'lr_schedule' has value 'cosine'"),
    ({"fixed": {**TINY, "warmup_epochs": 2.0}}, "field 'warmup_epochs' has value 2.0"),
])
def test_branch_refuses_what_cannot_share_a_trunk(extra, match):
    with pytest.raises(SpaceError, match=match):
        ladder_space(**extra)


@pytest.mark.slow
def test_a_ladder_sweep_branches_its_rungs_and_records_its_declaration_first(tmp_path, fresh_ray):
    ray.init(num_cpus=1, include_dashboard=False)
    declare = {"metric": "judged", "seeds": [0, 1], "families": [
        {"name": "gap", "for_each": "epochs", "comparisons": [[{"attention": "softmax"}, {"attention": "favor"}]]}]}
    space = ladder_space(declare=declare)
    assert run_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False, max_concurrent=1)) == 0
    trials = pd.read_parquet(tmp_path / "ladder" / "trials.parquet")
    assert sorted(trials["trial_key"]) == sorted(space.keys) and set(trials["status"]) == {"ok"}
    rungs = trials[trials["epochs"] == 5]
    assert set(rungs["resumed_from_epoch"]) == {4}  # each started from its trunk's checkpoint after epoch 4
    epochs = pd.read_parquet(tmp_path / "ladder" / "epochs.parquet")
    assert len(epochs) == 4 * 10 + 4 * 5 and not epochs.duplicated(["trial_key", "epoch"]).any()
    record = json.loads((tmp_path / "ladder" / "declaration.json").read_text())["declarations"]
    started = pd.to_datetime(trials["started_at"], utc=True).min().timestamp()
    assert len(record) == 1 and record[0]["recorded_at"] <= started
    from rpevit.analysis import confirmatory

    text = confirmatory.build(tmp_path / "ladder")
    assert "### gap (epochs = 5)" in text and "### gap (epochs = 10)" in text and "incomplete" not in text
