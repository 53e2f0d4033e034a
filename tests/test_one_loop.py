"""One training loop (issue 44): a solo trial is a group of one through `train_members`, the loop a
fused group runs, so a change to training is made once and proven once."""
from __future__ import annotations

import math

import pytest

from rpevit import checkpoint
from rpevit.config import TrialConfig
from rpevit.tasks import train as train_module
from rpevit.tasks.steppers import InTurnStep, StackedStep
from rpevit.tasks.train import train_and_evaluate
from rpevit.tasks.train_group import train_group
from tests.test_amp_cpu import TINY_MODEL

TIMING = {"train_s_per_epoch", "images_per_s", "infer_ms_per_sample", "peak_mem_mb", "git_commit"}
RECIPE = {**TINY_MODEL, "amp": "none", "attention": "favor", "pe": "rope", "drop_path": 0.1, "epochs": 2,
          "train_subset": 256, "batch_size": 64, "eval_draws": 2}


def spy_on_the_loop(monkeypatch) -> list[tuple[int, str]]:
    """Record every epoch the loop runs: (members, stepper kind)."""
    calls: list[tuple[int, str]] = []
    real = train_module.train_epoch

    def train_epoch(stepper, members, data):
        calls.append((len(members), type(stepper).__name__))
        return real(stepper, members, data)

    monkeypatch.setattr(train_module, "train_epoch", train_epoch)
    return calls


def same(a: object, b: object) -> bool:
    """Equal, a NaN equal to a NaN (a metric the run does not compute)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.slow
def test_a_solo_trial_and_a_fused_group_run_the_same_loop(monkeypatch):
    calls = spy_on_the_loop(monkeypatch)
    cfg = TrialConfig.from_dict(RECIPE)
    train_and_evaluate(cfg, log=None)
    assert calls == [(1, InTurnStep.__name__)] * 2
    calls.clear()
    outcomes = train_group([cfg.replace(seed=s) for s in (0, 1)], log=None)
    assert all(isinstance(o, dict) for o in outcomes), outcomes
    assert calls == [(2, StackedStep.__name__)] * 2


@pytest.mark.slow
def test_a_group_of_one_is_its_solo_trial_exactly(tmp_path):
    """Same loop, same stepper: every metric and every checkpoint tensor is identical, not merely close."""
    cfg = TrialConfig.from_dict({**RECIPE, "seed": 3})
    solo = train_and_evaluate(cfg, log=None, checkpoint_dir=tmp_path / "solo")
    group, = train_group([cfg], checkpoint_dirs=[tmp_path / "group"], log=None)
    assert isinstance(group, dict), group
    assert solo.keys() == group.keys()
    differ = [k for k in solo if k not in TIMING and not same(solo[k], group[k])]
    assert not differ, {k: (solo[k], group[k]) for k in differ}
    a = checkpoint.load(tmp_path / "solo" / checkpoint.CHECKPOINT_NAME)
    b = checkpoint.load(tmp_path / "group" / checkpoint.CHECKPOINT_NAME)
    assert all((a["model"][name] == b["model"][name]).all() for name in a["model"])
    strip = [{k: v for k, v in row.items() if k != "epoch_s"} for row in a["history"]]
    assert strip == [{k: v for k, v in row.items() if k != "epoch_s"} for row in b["history"]]
    assert all((a["rng"][key] == b["rng"][key]).all() for key in a["rng"])
