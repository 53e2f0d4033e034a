"""Issue 41, item 2: the defaults follow what validation chose, on the dataset each serves. A config that
leaves init, grad_clip, lr, the redraw schedule or luo_scale alone runs the joint choice of its dataset's
published validation study (results/<knob>_val_<dataset>/), recomputed here from the committed rows; a
dataset a knob was not validated on is named in NOT_VALIDATED, with what it runs instead. Old results keep
their keys: a row or checkpoint without a field ran the field's first default (config.FIRST_DEFAULTS)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rpevit.analysis.answers_sources import is_published
from rpevit.analysis.answers_validation import current_validation_folders
from rpevit.analysis.validation_choice import JOINT, chosen_for_every_variant
from rpevit.config import FIRST_DEFAULTS, TrialConfig, recorded_values
from rpevit.data import DATASET_SPECS
from rpevit.sweep.migrate import resolved_frame
from rpevit.sweep.space import load_space, trial_key

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
# (dataset, knob) pairs no published study chose on validation, with the reason; each must have no published
# study (a study published later fails this test until its choice becomes the default and leaves the list).
NOT_VALIDATED = {
    **{("cifar100", knob): "no CIFAR-100 validation study: CIFAR-10's values" for knob in JOINT},
}


def default_values(dataset: str, knob: tuple[str, ...]) -> tuple:
    """What a config of `dataset` that leaves the knob's fields alone runs (luo_scale: a luo_rpe trial)."""
    resolved = TrialConfig.from_dict({"dataset": dataset, "pe": "luo_rpe"}).resolved()
    return tuple(getattr(resolved, name) for name in knob)


def published_choices() -> dict[tuple[str, tuple[str, ...]], tuple[str, tuple]]:
    found = {}
    for folder in current_validation_folders(RESULTS):  # the published ones not chosen again: a folder of one's own
        # named *_val_* is not published
        chosen = chosen_for_every_variant(folder)
        if chosen is not None:
            dataset, knob, value = chosen
            assert (dataset, knob) not in found, f"two published studies choose {knob} on {dataset}"
            found[(dataset, knob)] = (folder.name, value)
    return found


def test_every_default_is_its_datasets_published_validation_choice():
    found = published_choices()
    assert {("mnist", k) for k in JOINT} | {("digits", k) for k in JOINT} | {("cifar10", k) for k in JOINT} \
        <= set(found)  # the studies this project published, read
    for (dataset, knob), (folder, chosen) in found.items():
        assert (dataset, knob) not in NOT_VALIDATED, f"{folder} is published: its choice is now {dataset}'s default"
        assert default_values(dataset, knob) == pytest.approx(chosen), (folder, knob)
    for dataset in DATASET_SPECS:
        for knob in JOINT:
            assert (dataset, knob) in found or (dataset, knob) in NOT_VALIDATED, (dataset, knob)


def test_datasets_without_their_own_choice_run_what_not_validated_says():
    assert default_values("cifar100", JOINT[0]) == default_values("cifar10", JOINT[0])
    assert default_values("cifar100", JOINT[1]) == default_values("cifar10", JOINT[1])


def test_a_placeholder_and_its_value_are_one_trial_and_an_explicit_value_wins():
    leave = {"dataset": "mnist", "attention": "favor", "pe": "luo_rpe"}
    explicit = {**leave, "init": "torch_default", "grad_clip": 1.0, "lr": 4e-3, "redraw_interval": 1, "luo_scale": 3.0}
    assert trial_key(TrialConfig.from_dict(leave).resolved().to_dict()) == \
        trial_key(TrialConfig.from_dict(explicit).resolved().to_dict())
    other = TrialConfig.from_dict({**leave, "init": "trunc_normal", "grad_clip": 0.0, "redraw_interval": 0,
                                   "luo_scale": 10.0}).resolved()
    assert (other.init, other.grad_clip, other.redraw_interval, other.luo_scale) == ("trunc_normal", 0.0, 0, 10.0)


def test_a_row_written_before_a_field_existed_resolves_to_what_its_code_ran():
    """mnist_converged_cpu's rows have no init column: they ran trunc_normal (the only init then), not the
    MNIST recipe's torch_default; their keys stay those space.json lists."""
    row = {"dataset": "mnist", "attention": "softmax", "pe": "ape", "seed": 0, "grad_clip": 1.0, "lr": 2e-3,
           "redraw_interval": 0, "luo_scale": 10.0}
    frame = pd.DataFrame([{**row, "trial_key": trial_key(TrialConfig.from_dict({**row, "init": "trunc_normal"})
                                                         .resolved().to_dict())}])
    resolved = resolved_frame(frame)
    assert resolved["trial_key"].tolist() == frame["trial_key"].tolist() and "init" not in resolved
    assert recorded_values({})["init"] == "trunc_normal" == FIRST_DEFAULTS["init"]
    assert recorded_values({"init": "torch_default"})["init"] == "torch_default"


@pytest.mark.parametrize("folder", sorted(p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.glob("**/space.json")
                                          if not p.parent.relative_to(RESULTS).parts[0] in ("gpu_h100", "gpu_h200",
                                                                                            "pilots")
                                          and is_published(RESULTS, p.parent)))  # not a sweep of one's own
def test_every_committed_study_space_still_expands_to_the_keys_it_ran(folder):
    """A moved default must not change what a committed study's space file means: each still expands to the
    trial keys its rows were stored under. (Left out: GPU leases and pilots, run with --set/--only
    overrides that space.json does not record.)"""
    listed = json.loads((RESULTS / folder / "space.json").read_text())
    assert set(load_space(ROOT / listed["source"]).keys) == set(listed["trial_keys"]), folder


def test_the_cifar10_ladder_waits_for_its_luo_scale_and_then_runs_it():
    """cifar10_ladder_cpu.yaml names luo_scale explicitly (a moved default must not move a running study's
    keys), so it must equal what validation chose on CIFAR-10 once that is published; until then the ladder
    must not have run (no folder of it under results/)."""
    ladder = load_space(ROOT / "search_spaces" / "cifar10_ladder_cpu.yaml")
    scales = {t["luo_scale"] for t in ladder.trials if t["pe"] == "luo_rpe"}
    if ("cifar10", ("luo_scale",)) in NOT_VALIDATED:
        assert not [p for p in RESULTS.glob("**/cifar10_ladder_cpu") if p.is_dir()], \
            "the ladder ran before luo_scale was chosen on CIFAR-10's validation split"
    else:
        assert scales == {default_values("cifar10", ("luo_scale",))[0]}, scales


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in RESULTS.glob("*/declaration.json")
                                          if is_published(RESULTS, p.parent)))
def test_every_declared_study_runs_its_datasets_validated_settings(folder):
    """A declared study writes its recipe, redraw schedule and luo_scale out in its space (a moved default must not
    move a running study's keys), so each written value must be what its dataset's validation study chose: every
    trial of the space that ran equals the same trial with those fields left to the defaults (which
    test_every_default_is_its_datasets_published_validation_choice ties to the validation rows)."""
    listed = json.loads((RESULTS / folder / "space.json").read_text())
    fields = [name for knob in JOINT for name in knob]
    trials = load_space(ROOT / listed["source"]).trials
    assert trials, folder
    for trial in trials:
        ran = TrialConfig.from_dict(trial).resolved()
        left = TrialConfig.from_dict({k: v for k, v in trial.items() if k not in fields}).resolved()
        written = {name: getattr(ran, name) for name in fields}
        assert written == pytest.approx({name: getattr(left, name) for name in fields}), (folder, trial["attention"],
                                                                                          trial["pe"], written)
