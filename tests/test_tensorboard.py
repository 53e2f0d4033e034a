"""Issue 31, item 3: TensorBoard event files per trial, written by the trial itself (the worker).

The trainable's own entry points (run_single, run_fused) run tiny real digits trials here, with
Tune's `report` replaced by a list (no Ray needed); the event files are read back with
tensorboard's EventAccumulator, orphan purging off so that a duplicated step would show.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # a hard dependency

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.sweep import trainable
from rpevit.sweep.protocol import EPOCH, SUMMARY, Member, TrialSpec
from rpevit.sweep.results import TENSORBOARD_DIR
from rpevit.sweep.tensorboard_events import EVENTS_PREFIX, EpochBoard, tensorboard_dir
from rpevit.sweep.space import trial_key

TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 100, "batch_size": 50,
        "eval_batch_size": 256, "eval_draws": 0, "drop_path": 0.0}
SCALARS = ("train_loss", "train_acc", "val_loss", "val_acc", "lr", "epoch_s", "attn_tv_to_softmax")


class Killed(Exception):
    """Stands for the driver or worker dying after an epoch was checkpointed."""


@pytest.fixture
def reports(monkeypatch) -> list[dict]:
    """What the trial sends to the driver, in order; no Ray (placement is a fixed row)."""
    sent: list[dict] = []
    monkeypatch.setattr(trainable.tune, "report", lambda result: sent.append(result))
    monkeypatch.setattr(trainable, "place_on_devices", lambda cpus, gpus: {
        "node_id": "n0", "hostname": "h", "pid": 1, "ray_gpu_ids": "", "cuda_device": -1, "torch_threads": 1})
    registry.load_all()
    return sent


def member(**fields) -> Member:
    cfg = TrialConfig.from_dict({**TINY, **fields}).to_dict()
    return Member(trial_key(cfg), " ".join(f"{k}={v}" for k, v in fields.items()), cfg)


def events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of every scalar event in the folder, duplicates included."""
    acc = EventAccumulator(str(folder), purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def epoch_rows(sent: list[dict], key: str) -> dict[int, dict]:
    return {r["row"]["epoch"]: r["row"] for r in sent if r["kind"] == EPOCH and r["trial_key"] == key}


@pytest.mark.slow
def test_a_resumed_trial_has_every_epoch_once_in_its_event_file(tmp_path, reports, monkeypatch):
    one = member(attention="favor", pe="rope", epochs=3, seed=0)
    spec = TrialSpec(one.trial_key, (one,), checkpoint_root=str(tmp_path / "sweep" / "trials"))
    real_report = trainable.tune.report

    def dies_after_epoch_2(result):  # epoch 2 is checkpointed and in the event file: then the worker dies
        real_report(result)
        if result["kind"] == EPOCH and result["row"]["epoch"] == 2:
            raise Killed

    monkeypatch.setattr(trainable.tune, "report", dies_after_epoch_2)
    with pytest.raises(Killed):
        trainable.run_single(spec, one)
    folder = tensorboard_dir(spec.checkpoint_root, one.trial_key, one.cfg)  # <variant>-<trial_key> (issue 59)
    assert [step for step, _ in events(folder)["val_acc"]] == [1, 2]

    monkeypatch.setattr(trainable.tune, "report", real_report)
    reports.clear()
    trainable.run_single(spec, one)  # the resume: re-reports epochs 1 and 2 from the checkpoint, trains 3
    assert [r["kind"] for r in reports] == [EPOCH, EPOCH, EPOCH, SUMMARY]
    rows = epoch_rows(reports, one.trial_key)
    written = events(folder)
    assert set(SCALARS) <= set(written), sorted(written)  # favor: attn_tv_to_softmax is finite
    for tag in SCALARS:
        assert [step for step, _ in written[tag]] == [1, 2, 3], (tag, written[tag])
        assert [value for _, value in written[tag]] == pytest.approx([rows[e][tag] for e in (1, 2, 3)], rel=1e-6)
    assert len([p for p in folder.iterdir() if p.name.startswith(EVENTS_PREFIX)]) == 1


@pytest.mark.slow
def test_each_member_of_a_fused_group_has_its_own_event_file(tmp_path, reports):
    seeds = [member(attention="softmax", pe="ape", epochs=2, seed=s) for s in (0, 1)]
    spec = TrialSpec("group", tuple(seeds), checkpoint_root=str(tmp_path / "sweep" / "trials"), fused=True)
    trainable.run_fused(spec)
    assert sum(r["kind"] == SUMMARY for r in reports) == 2
    for one in seeds:
        written = events(tensorboard_dir(spec.checkpoint_root, one.trial_key, one.cfg))
        rows = epoch_rows(reports, one.trial_key)
        for tag in SCALARS:
            assert [step for step, _ in written[tag]] == [1, 2]
            assert [v for _, v in written[tag]] == pytest.approx([rows[1][tag], rows[2][tag]], rel=1e-6)
    first, second = (events(tensorboard_dir(spec.checkpoint_root, m.trial_key, m.cfg)) for m in seeds)
    assert first["train_loss"] != second["train_loss"]  # each member's own curve


def test_a_trial_without_epochs_leaves_no_event_folder(tmp_path, reports):
    one = member(task="kernel_mse", kmse_dim=4, kmse_features=2, kmse_draws=20)
    trainable.run_single(TrialSpec(one.trial_key, (one,), checkpoint_root=str(tmp_path / "sweep" / "trials")), one)
    assert [r["kind"] for r in reports] == [SUMMARY]
    assert not (tmp_path / "sweep" / TENSORBOARD_DIR).exists()


def test_only_finite_numbers_are_written(tmp_path):
    board = EpochBoard(tmp_path / "tb" / "k", "k", "label")
    board.add({"epoch": 1, "val_acc": 0.5, "attn_tv_to_softmax": float("nan"), "lr": float("inf"),
               "attn_tv_per_layer": [0.1, 0.2], "note": "text", "flag": True})
    board.close()
    assert events(tmp_path / "tb" / "k") == {"val_acc": [(1, 0.5)]}


# ---- issue 39, item 8: a TensorBoard folder that cannot be written is said, not skipped silently
@pytest.mark.slow
def test_a_linked_event_folder_is_said_in_the_trials_log_and_the_sweeps_output(tmp_path, reports, capsys):
    from rpevit.sweep.protocol import NOTE
    from rpevit.sweep.tune_run import Progress

    one = member(attention="softmax", pe="ape", epochs=1, seed=0)
    spec = TrialSpec(one.trial_key, (one,), checkpoint_root=str(tmp_path / "sweep" / "trials"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "sweep" / TENSORBOARD_DIR).mkdir(parents=True)
    (tmp_path / "sweep" / TENSORBOARD_DIR / one.trial_key).symlink_to(elsewhere)
    trainable.run_single(spec, one)
    assert [r["kind"] for r in reports] == [NOTE, EPOCH, SUMMARY]  # the trial trained on
    note = reports[0]["error"]
    assert f"no TensorBoard events for trial {one.trial_key}:" in note and "is a symbolic link" in note
    assert not list(elsewhere.iterdir())  # nothing written through the link
    log = (tmp_path / "sweep" / "trials" / one.trial_key / "log.txt").read_text()
    assert note in log
    progress = Progress(total=1, every_s=1e9)  # the driver's printer: the line in the sweep's output, once
    capsys.readouterr()
    for _ in range(2):
        progress.on_trial_result(0, [], None, reports[0])
    assert capsys.readouterr().out == f"warning: {note}\n"
