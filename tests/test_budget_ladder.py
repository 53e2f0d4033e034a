"""The budget ladder (rpevit/tasks/budget_ladder.py): a shorter wsd run branched off a longer one's
checkpoint gives exactly the row a separate run gives (float64), the schedule's defining property, and
the refusals of rungs that cannot share a trunk."""
from __future__ import annotations

import math

import pytest
import torch

from rpevit import checkpoint
from rpevit.config import ConfigError, TrialConfig
from rpevit.tasks.budget_ladder import Branch, TrunkPaused, branch_epoch, check_ladder, ladder_cost
from rpevit.tasks.schedule import cooldown_start, lr_factor, warmup_cosine, warmup_stable_decay
from rpevit.tasks.train import train_and_evaluate

TIMING = {"train_s_per_epoch", "images_per_s", "infer_ms_per_sample", "peak_mem_mb", "peak_mem_kind", "hostname",
          "started_at", "finished_at", "epoch_s", "git_commit", "torch_threads", "cpu_model", "python_version"}
LADDER = {"dataset": "digits", "train_subset": 96, "batch_size": 16, "dim": 16, "heads": 2, "depth": 2,
          "num_features": 8, "redraw_interval": 2, "redraw_until": 0.8, "dtype": "float64", "eval_draws": 2,
          "drop_path": 0.2, "lr_schedule": "wsd", "cooldown_fraction": 0.2, "warmup_epochs": 0.5}


def test_wsd_shares_every_step_before_the_cooldown_and_decays_to_zero():
    short, long = warmup_stable_decay(50, 5, 0.2), warmup_stable_decay(200, 5, 0.2)
    start = cooldown_start(50, 0.2)
    assert start == 40
    assert [short(s) for s in range(start + 1)] == [long(s) for s in range(start + 1)]  # 1.0 at the cool-down's start
    assert short(4) == 1.0 and short(0) == pytest.approx(0.2) and short(39) == 1.0
    assert short(45) == pytest.approx(1 - math.sqrt(0.5)) and short(49) < short(48) < short(41) < 1.0
    assert all(long(s) == 1.0 for s in range(5, 160))
    cosine = warmup_cosine(50, 5)
    assert cosine(20) < 1.0  # the cosine run depends on its length from the warm-up's end


def row_differences(a: dict, b: dict) -> list[str]:
    out = []
    for key, value in a.items():
        if key in TIMING or key.endswith("_s"):
            continue
        other = b[key]
        if isinstance(value, float) and (math.isnan(value) and math.isnan(other)):
            continue
        if value != other:
            out.append(f"{key}: {value!r} != {other!r}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("attention, pe", [("favor", "rope"), ("softmax", "luo_rpe")])
def test_a_branched_rung_equals_a_separate_run(attention, pe, tmp_path):
    trunk = TrialConfig.from_dict({**LADDER, "attention": attention, "pe": pe, "epochs": 10})
    rung = trunk.replace(epochs=5)
    separate = train_and_evaluate(rung, log=None, checkpoint_dir=tmp_path / "separate")
    plain_trunk = train_and_evaluate(trunk, log=None)
    lines: list[str] = []
    trunk_row = train_and_evaluate(trunk, log=lines.append, checkpoint_dir=tmp_path / "trunk",
                                   branches=[Branch(rung, tmp_path / "rung")])
    assert row_differences(plain_trunk, trunk_row) == []  # writing a branch changes nothing in the trunk
    state = checkpoint.load(tmp_path / "rung" / checkpoint.CHECKPOINT_NAME)
    assert state["epoch"] == 4 and state["fingerprint"]["epochs"] == 5 and len(state["history"]) == 4
    assert any("wrote the 5-epoch rung's checkpoint after epoch 4" in line for line in lines)
    resumed: list[str] = []
    branched = train_and_evaluate(rung, log=resumed.append, checkpoint_dir=tmp_path / "rung")
    assert any("resumed from" in line and "after epoch 4" in line for line in resumed)
    assert row_differences(separate, branched) == []
    assert branched["test_acc"] == separate["test_acc"] and branched["epochs_done"] == 5
    curves = [checkpoint.load(tmp_path / run / checkpoint.CHECKPOINT_NAME)["history"] for run in ("separate", "rung")]
    assert [len(curve) for curve in curves] == [5, 5]  # the epoch curve: 4 epochs of the trunk's, then its own
    assert [row_differences(a, b) for a, b in zip(*curves)] == [[]] * 5


@pytest.mark.slow
def test_a_trunk_paused_at_its_last_branch_continues_to_the_same_row(tmp_path):
    """sweep.py --rungs-first: the trunk stops after the epoch its last rung branches from (8 of 20 here, rungs
    of 5 and 10 epochs), writes every rung's checkpoint, and its next run continues to exactly the row (and
    writes exactly the rung checkpoints) of a trunk that never paused (float64)."""
    trunk = TrialConfig.from_dict({**LADDER, "attention": "favor", "pe": "luo_rpe", "epochs": 20})
    rungs = [trunk.replace(epochs=10), trunk.replace(epochs=5)]
    plain = train_and_evaluate(trunk, log=None, checkpoint_dir=tmp_path / "plain",
                               branches=[Branch(r, tmp_path / f"plain-{r.epochs}") for r in rungs])
    branches = [Branch(r, tmp_path / f"rung-{r.epochs}") for r in rungs]
    lines: list[str] = []
    with pytest.raises(TrunkPaused, match="paused after epoch 8 of 20") as paused:
        train_and_evaluate(trunk, log=lines.append, checkpoint_dir=tmp_path / "trunk", branches=branches,
                           pause_at_branch=True)
    assert paused.value.epoch == 8 and any("paused after epoch 8 of 20" in line for line in lines)
    state = checkpoint.load(tmp_path / "trunk" / checkpoint.CHECKPOINT_NAME)
    assert state["epoch"] == 8 and len(state["history"]) == 8  # after epoch 8 (1-based count): no epoch 9 trained
    for rung in rungs:  # the rungs' checkpoints, as the unpaused trunk wrote them
        ours = checkpoint.load(tmp_path / f"rung-{rung.epochs}" / checkpoint.CHECKPOINT_NAME)
        theirs = checkpoint.load(tmp_path / f"plain-{rung.epochs}" / checkpoint.CHECKPOINT_NAME)
        assert ours["epoch"] == theirs["epoch"] == (4 if rung.epochs == 5 else 8)
        assert all(torch.equal(ours["model"][k], theirs["model"][k]) for k in theirs["model"])
    again: list[str] = []  # asked to pause again (a --resume of round 1): nothing trains, the rungs keep theirs
    with pytest.raises(TrunkPaused, match="paused after epoch 8"):
        train_and_evaluate(trunk, log=again.append, checkpoint_dir=tmp_path / "trunk", branches=branches,
                           pause_at_branch=True)
    assert sum("has a checkpoint of its own" in line for line in again) == 2
    assert checkpoint.load(tmp_path / "trunk" / checkpoint.CHECKPOINT_NAME)["epoch"] == 8
    continued: list[str] = []
    row = train_and_evaluate(trunk, log=continued.append, checkpoint_dir=tmp_path / "trunk")
    assert any("resumed from" in line and "after epoch 8" in line for line in continued)
    assert row_differences(plain, row) == [] and row["test_acc"] == plain["test_acc"] and row["epochs_done"] == 20


def test_pause_at_branch_needs_a_checkpoint_folder():
    with pytest.raises(ConfigError, match="pause_at_branch is set without a checkpoint_dir"):
        train_and_evaluate(cfg(), log=None, branches=[Branch(cfg(epochs=5), None)], pause_at_branch=True)


@pytest.mark.slow
def test_a_rung_with_its_own_checkpoint_is_never_overwritten(tmp_path):
    trunk = TrialConfig.from_dict({**LADDER, "attention": "softmax", "pe": "ape", "epochs": 10})
    rung = trunk.replace(epochs=5)
    train_and_evaluate(rung, log=None, checkpoint_dir=tmp_path / "rung")  # the rung finished on its own
    before = (tmp_path / "rung" / checkpoint.CHECKPOINT_NAME).read_bytes()
    lines: list[str] = []
    train_and_evaluate(trunk, log=lines.append, branches=[Branch(rung, tmp_path / "rung")])
    assert (tmp_path / "rung" / checkpoint.CHECKPOINT_NAME).read_bytes() == before
    assert any("has a checkpoint of its own" in line for line in lines)


def cfg(**changes) -> TrialConfig:
    return TrialConfig.from_dict({**LADDER, "attention": "favor", "pe": "ape", "epochs": 10, **changes})


def test_branch_epoch_is_the_rungs_cooldown_start():
    assert branch_epoch(cfg(epochs=20), cfg(epochs=5), 7) == 4
    assert branch_epoch(cfg(epochs=20), cfg(epochs=10), 7) == 8
    assert ladder_cost([5, 10, 20], 0.2) == 23.0


@pytest.mark.parametrize("changes, field", [
    ({"lr_schedule": "cosine"}, "lr_schedule"),
    ({"cooldown_fraction": 0.3}, "cooldown_fraction"),  # 0.3 x 5 epochs: not a whole epoch
    ({"redraw_until": 0.5}, "redraw_until"),  # the draw would freeze inside the shared stretch
    ({"warmup_epochs": 1.0}, "warmup_epochs"),  # > 10% of the 5-epoch rung: cut differently per rung
])
def test_rungs_that_cannot_share_a_trunk_are_refused_naming_the_field(changes, field):
    with pytest.raises(ConfigError, match=f"field '{field}' has value"):
        check_ladder([cfg(epochs=20, **changes), cfg(epochs=5, **changes)])


def test_rungs_must_differ_only_in_epochs():
    with pytest.raises(ConfigError, match="field 'lr' has value .*rungs differ only in epochs"):
        check_ladder([cfg(epochs=20, lr=1e-3), cfg(epochs=5, lr=2e-3)])
    check_ladder([cfg(epochs=20), cfg(epochs=10), cfg(epochs=5)])  # a valid ladder passes
