"""Stored configs hold what ran, and trials are keyed by it (issue 31, items 2 and 17): the recipe's
placeholders (`patch_size 0`, `batch_size 0`, `lr 0`, `warmup_epochs -1`, `augment auto`,
`rotinv_basis auto`) resolve before keys are hashed and rows are written; results of the older
scheme are brought over (rpevit/sweep/migrate.py) without losing or double-counting a row."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from rpevit import checkpoint
from rpevit.analysis import common
from rpevit.cli import main as cli_main
from rpevit.config import ConfigError, TrialConfig, resolve_values
from rpevit.sweep import migrate
from rpevit.sweep.protocol import EPOCH, SUMMARY, Report
from rpevit.sweep.results import EPOCHS_FILE, SPACE_FILE, TRIALS_FILE
from rpevit.sweep.writer import ParquetResults
from rpevit.sweep.plan import plan_sweep
from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.space import expand_space, trial_key

DIGITS_RECIPE = {"image_size": 8, "patch_size": 2, "batch_size": 16, "lr": 2e-3, "warmup_epochs": 1.0, "augment": "none"}
TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 64, "epochs": 1}


def test_resolve_values_fills_the_recipe_and_each_encodings_auto_options():
    resolved = resolve_values({"dataset": "digits"})
    assert {k: resolved[k] for k in DIGITS_RECIPE} == DIGITS_RECIPE
    assert resolve_values({"dataset": "cifar10", "warmup_epochs": 0.0})["warmup_epochs"] == 0.0  # 0 = no warm-up
    assert resolve_values({"dataset": "cifar10", "batch_size": 32})["batch_size"] == 32  # given values stay
    assert resolve_values({"pe": "rotinv", "rotinv_mode": "random"})["rotinv_basis"] == "monomial"
    assert resolve_values({"pe": "ape+rotinv"})["rotinv_basis"] == "bernstein"
    assert resolve_values({"pe": "rope"})["rotinv_basis"] == "auto"  # not rotinv: nothing to resolve
    kept = resolve_values({"device": "auto", "amp": "auto", "luo_path": "auto", "cayley_solver": "auto"})
    assert [kept[k] for k in ("device", "amp", "luo_path", "cayley_solver")] == ["auto"] * 4  # how, not what
    cfg = TrialConfig(dataset="digits")
    assert cfg.resolved().resolved() == cfg.resolved() and cfg.resolved().grid == cfg.grid


def test_a_space_keys_the_resolved_config_so_two_spellings_are_one_trial():
    space = expand_space({"name": "s", "fixed": TINY,
                          "grid": {"batch_size": [0, 16], "patch_size": [0, 2], "lr": [0.0, 2e-3]}}, source="s.yaml")
    assert len(space.trials) == 1 and space.duplicates_dropped == 7  # 8 spellings of one computation
    (config,) = space.trials
    assert {k: config[k] for k in DIGITS_RECIPE} == DIGITS_RECIPE
    requested = {**TrialConfig().to_dict(), **TINY}  # the first spelling: every placeholder
    assert space.keys[0] == trial_key(config) and space.legacy_keys == {space.keys[0]: trial_key(requested)}


@pytest.mark.slow
def test_the_cli_row_stores_what_ran(capsys):
    argv = ["--dataset", "digits", "--dim", "16", "--depth", "1", "--heads", "2", "--train-subset", "64",
            "--epochs", "1", "--quiet"]
    assert cli_main(argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert {k: row[k] for k in DIGITS_RECIPE} == DIGITS_RECIPE


@pytest.mark.slow
def test_a_checkpoint_written_under_placeholders_continues_under_the_values_they_resolve_to(tmp_path):
    from rpevit.tasks.train import train_and_evaluate as train

    placeholder = TrialConfig.from_dict(TINY)
    train(placeholder, checkpoint_dir=tmp_path, log=None)
    state = checkpoint.load(tmp_path / checkpoint.CHECKPOINT_NAME)
    checkpoint.check_matches(state, placeholder.resolved(), tmp_path)  # batch 16 = the recipe it ran with
    with pytest.raises(checkpoint.CheckpointError, match="'batch_size' has value 32 here but 16"):
        checkpoint.check_matches(state, placeholder.replace(batch_size=32), tmp_path)


# ---------------------------------------------------------------- results of the older key scheme
def old_scheme_folder(tmp_path):
    """A sweep folder as the older code wrote it: placeholder configs keyed by their placeholders,
    plus a second spelling of seed 0's computation (batch_size 16 given), each with a row, epoch
    rows and a checkpoint folder; space.json without a key scheme."""
    out = tmp_path / "old"
    requested = [{**TrialConfig.from_dict({**TINY, "seed": s}).to_dict()} for s in (0, 1)]
    requested.append({**requested[0], "batch_size": 16})
    keys = [trial_key(c) for c in requested]
    assert len(set(keys)) == 3
    writer = ParquetResults(out, "old", dict(zip(keys, requested)), {k: i for i, k in enumerate(keys)})
    for i, (key, config) in enumerate(zip(keys, requested)):
        trial = SimpleNamespace(trial_id=f"t{i}")
        writer.on_trial_result(0, [], trial, Report(EPOCH, key, {"epoch": 0, "train_loss": 1.0 + i}).to_tune())
        writer.on_trial_result(0, [], trial, Report(SUMMARY, key, {**config, "test_acc": 0.5 + i / 10}).to_tune())
        (out / "trials" / key).mkdir(parents=True)
        (out / "trials" / key / "marker").write_text(key)
    writer.on_experiment_end([])
    (out / SPACE_FILE).write_text(json.dumps({"name": "old", "source": "old.yaml", "trial_keys": keys}))
    return out, requested, keys


def test_the_analysis_reads_an_older_folder_resolved_without_double_counting(tmp_path):
    out, _, keys = old_scheme_folder(tmp_path)
    frame = common.load_trials(out)
    assert len(frame) == 2  # the second spelling of seed 0 is the same computation: counted once
    assert set(frame["batch_size"]) == {16} and set(frame["patch_size"]) == {2} and set(frame["augment"]) == {"none"}
    assert set(frame[migrate.STORED_KEY]) == set(keys[:2])  # matched to the older space.json by stored key
    assert pd.read_parquet(out / TRIALS_FILE)["trial_key"].tolist() == keys  # nothing written


def test_the_driver_migrates_an_older_folder_once_and_keeps_the_originals(tmp_path):
    out, requested, old_keys = old_scheme_folder(tmp_path)
    space = expand_space({"name": "old", "fixed": TINY, "grid": {"seed": [0, 1]}}, source="old.yaml")
    message = migrate.migrate_folder(out, space)
    assert "2 row(s)" in message and "1 duplicate row(s)" in message
    trials = pd.read_parquet(out / TRIALS_FILE)
    assert trials["trial_key"].tolist() == space.keys and set(trials["batch_size"]) == {16}
    assert trials["test_acc"].tolist() == [0.5, 0.6]  # the first spelling's row is the one kept
    epochs = pd.read_parquet(out / EPOCHS_FILE)
    assert epochs["trial_key"].tolist() == space.keys  # re-keyed; the dropped spelling's epochs stay behind
    assert epochs["train_loss"].tolist() == [1.0, 2.0]
    for new, old in zip(space.keys, old_keys):
        assert (out / "trials" / new / "marker").read_text() == old  # checkpoint folders follow their trials
    kept = pd.read_parquet(out / (TRIALS_FILE + migrate.BACKUP_SUFFIX))
    assert kept["trial_key"].tolist() == old_keys  # the originals, all three rows
    assert json.loads((out / SPACE_FILE).read_text())["key_scheme"] == migrate.KEY_SCHEME
    assert migrate.migrate_folder(out, space) is None  # once
    plan = plan_sweep(space, out, resume=True, retry_failed=False, data_dir=None, resources=space.resources)
    assert plan.pending == []  # resumed: both trials done, nothing reruns


def test_a_resumed_sweep_of_an_older_folder_migrates_and_reports_it(tmp_path, capsys):
    out, _, _ = old_scheme_folder(tmp_path)
    space = expand_space({"name": "old", "fixed": TINY, "grid": {"seed": [0, 1]}}, source="old.yaml")
    assert run_sweep(space, SweepOptions(results_dir=tmp_path, resume=True, dashboard=False)) == 0
    printed = capsys.readouterr().out
    assert "brought to resolved configs" in printed and "0 to run" in printed
    assert not math.isnan(pd.read_parquet(out / TRIALS_FILE)["test_acc"].iloc[0])


def test_options_of_an_encoding_the_trial_does_not_use_do_not_make_another_trial():
    unused = expand_space({"name": "u", "fixed": TINY, "grid": {"rotinv_draws": [4, 8]}}, source="u.yaml")
    assert len(unused.trials) == 1 and unused.trials[0]["rotinv_draws"] == TrialConfig().rotinv_draws
    used = expand_space({"name": "r", "fixed": {**TINY, "pe": "rotinv", "rotinv_mode": "random"},
                         "grid": {"rotinv_draws": [4, 8]}}, source="r.yaml")
    assert [t["rotinv_draws"] for t in used.trials] == [4, 8]
    shared = resolve_values({"pe": "rope", "rope_base": 50.0})  # rope_base is rope's (and circulant's) own
    assert shared["rope_base"] == 50.0


# ---------------------------------------------------------------- issue 39: keys from files, ok rows first
def rewrite_rows(path, change) -> None:
    """Rewrite a results file's rows through `change(rows) -> rows` (a crafted or damaged file)."""
    from rpevit.sweep.results import to_table, trials_schema, epochs_schema, write_table_atomic
    from rpevit.sweep.store import read_rows

    schema = trials_schema("train") if path.name == TRIALS_FILE else epochs_schema("train")
    write_table_atomic(to_table(change(read_rows(path)), schema), path)


@pytest.mark.parametrize("where", [TRIALS_FILE, EPOCHS_FILE, SPACE_FILE])
def test_a_key_that_is_a_path_stops_the_migration_in_one_line_and_moves_nothing(tmp_path, capsys, where):
    out, requested, keys = old_scheme_folder(tmp_path)
    victim = tmp_path / "victims" / "precious_dir"
    victim.mkdir(parents=True)
    (victim / "thesis.tex").write_text("years of work")
    bad = "../../victims/precious_dir"  # trials/<bad> is the victim: a placeholder config resolves to a new key
    if where == TRIALS_FILE:
        rewrite_rows(out / TRIALS_FILE, lambda rows: rows + [{**rows[1], "seed": 5, "trial_key": bad}])
        row = 4
    elif where == EPOCHS_FILE:
        rewrite_rows(out / EPOCHS_FILE, lambda rows: [{**rows[0], "trial_key": bad}] + rows)
        row = 1
    else:
        (out / SPACE_FILE).write_text(json.dumps({"name": "old", "source": "old.yaml", "trial_keys": [*keys, bad]}))
        row = 4
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    folders = sorted(p.name for p in (out / "trials").iterdir())

    assert migrate.main([str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / where}, row {row} has trial_key '{bad}'" in err, err
    assert "allowed: 16 lowercase hex digits" in err and "nothing was moved" in err
    assert (victim / "thesis.tex").read_text() == "years of work"  # not moved into the sweep folder
    assert sorted(p.name for p in (out / "trials").iterdir()) == folders
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".sweep.lock"}
    assert after == {k: v for k, v in before.items() if k != ".sweep.lock"}  # no file rewritten, no backup made

    space = expand_space({"name": "old", "fixed": TINY, "grid": {"seed": [0, 1]}}, source="old.yaml")
    with pytest.raises(ConfigError, match="has trial_key '../../victims/precious_dir'"):
        run_sweep(space, SweepOptions(results_dir=tmp_path, resume=True, dashboard=False))  # sweep.py --resume
    assert (victim / "thesis.tex").exists()


def test_a_migrated_folder_with_a_key_that_is_a_path_is_refused_before_anything_runs(tmp_path):
    out, _, _ = old_scheme_folder(tmp_path)
    space = expand_space({"name": "old", "fixed": TINY, "grid": {"seed": [0, 1]}}, source="old.yaml")
    migrate.migrate_folder(out, space)
    rewrite_rows(out / TRIALS_FILE, lambda rows: rows + [{**rows[0], "trial_key": "../../etc"}])
    with pytest.raises(ConfigError, match=r"row 3 has trial_key '../../etc'"):
        plan_sweep(space, out, resume=True, retry_failed=False, data_dir=None, resources=space.resources)


def test_every_path_a_trial_key_names_is_checked(tmp_path):
    from rpevit.sweep.deadline import Estimator, Unit, unit_estimate
    from rpevit.sweep.protocol import TrialSpec
    from rpevit.sweep.results import trial_folder
    from rpevit.sweep.tensorboard_events import tensorboard_dir

    good = trial_key(TrialConfig.from_dict(TINY).to_dict())
    assert trial_folder(tmp_path, good) == tmp_path / good
    spec = TrialSpec(name="x", checkpoint_root=str(tmp_path / "trials"))
    for bad in ("../x", "/etc", "", "ABCDEF0123456789", good + "0", None):
        with pytest.raises(ConfigError, match="allowed: 16 lowercase hex digits"):
            trial_folder(tmp_path, bad)
        with pytest.raises(ConfigError):
            tensorboard_dir(spec.checkpoint_root, bad)
    with pytest.raises(ConfigError):
        unit_estimate(Unit((("../../x", TINY),)), Estimator([], "train", has_epochs=True), tmp_path)


def test_an_epoch_row_is_stored_under_its_trials_key_whatever_the_row_says(tmp_path):
    out, _, keys = old_scheme_folder(tmp_path)
    writer = ParquetResults(out, "old", {}, {k: i for i, k in enumerate(keys)})
    trial = SimpleNamespace(trial_id="t9")
    row = {"epoch": 7, "train_loss": 0.5, "trial_key": "../../x"}  # e.g. a history row of a crafted checkpoint
    writer.on_trial_result(0, [], trial, Report(EPOCH, keys[0], row).to_tune())
    writer.on_experiment_end([])
    epochs = pd.read_parquet(out / EPOCHS_FILE)
    assert set(epochs["trial_key"]) == set(keys) and (epochs["epoch"] == 7).sum() == 1


def test_a_migration_killed_between_its_writes_is_finished_by_the_next_run_from_the_originals(tmp_path, monkeypatch):
    """Killed after it rewrote epochs.parquet and before trials.parquet: the next run reads the originals it kept
    (it read the re-keyed epochs, dropped every re-keyed trial's epoch rows and overwrote the kept original)."""
    out, _, old_keys = old_scheme_folder(tmp_path)
    space = expand_space({"name": "old", "fixed": TINY, "grid": {"seed": [0, 1]}}, source="old.yaml")
    real_write = migrate.write_table_atomic

    class Killed(Exception):
        pass

    def killed_at_the_trials(table, path) -> None:
        if path.name == TRIALS_FILE:
            raise Killed
        real_write(table, path)

    monkeypatch.setattr(migrate, "write_table_atomic", killed_at_the_trials)
    with pytest.raises(Killed):
        migrate.migrate_folder(out, space)
    monkeypatch.setattr(migrate, "write_table_atomic", real_write)
    assert "2 row(s)" in migrate.migrate_folder(out, space)
    epochs = pd.read_parquet(out / EPOCHS_FILE)
    assert epochs["trial_key"].tolist() == space.keys and epochs["train_loss"].tolist() == [1.0, 2.0]
    assert pd.read_parquet(out / (EPOCHS_FILE + migrate.BACKUP_SUFFIX))["trial_key"].tolist() == old_keys
    assert pd.read_parquet(out / TRIALS_FILE)["trial_key"].tolist() == space.keys


def failed_first_folder(tmp_path):
    """old_scheme_folder with seed 0's first spelling failed: its second spelling (batch_size 16 given,
    test_acc 0.7) is the same computation, finished."""
    out, requested, keys = old_scheme_folder(tmp_path)
    rewrite_rows(out / TRIALS_FILE, lambda rows: [{**rows[0], "status": "failed", "error": "RuntimeError: boom",
                                                  "test_acc": None}] + rows[1:])
    return out, requested, keys


def test_migration_keeps_the_ok_row_over_a_failed_one_of_the_same_computation(tmp_path):
    out, _, old_keys = failed_first_folder(tmp_path)
    space = expand_space({"name": "old", "fixed": TINY, "grid": {"seed": [0, 1]}}, source="old.yaml")
    message = migrate.migrate_folder(out, space)
    assert "1 duplicate row(s)" in message
    trials = pd.read_parquet(out / TRIALS_FILE)
    assert trials["trial_key"].tolist() == space.keys
    assert trials["status"].tolist() == ["ok", "ok"] and trials["test_acc"].tolist() == [0.7, 0.6]
    epochs = pd.read_parquet(out / EPOCHS_FILE)
    assert dict(zip(epochs["trial_key"], epochs["train_loss"])) == dict(zip(space.keys, [3.0, 2.0]))  # the kept row's
    assert (out / "trials" / space.keys[0] / "marker").read_text() == old_keys[2]  # its checkpoint folder too
    kept = pd.read_parquet(out / (TRIALS_FILE + migrate.BACKUP_SUFFIX))
    assert kept["status"].tolist() == ["failed", "ok", "ok"]  # the failed one stays in the original
    plan = plan_sweep(space, out, resume=True, retry_failed=True, data_dir=None, resources=space.resources)
    assert plan.pending == []  # finished: nothing to retry


def test_the_analysis_counts_the_ok_row_of_a_computation_stored_twice(tmp_path):
    out, _, _ = failed_first_folder(tmp_path)
    frame = common.load_trials(out)
    assert len(frame) == 2 and sorted(frame["test_acc"]) == [0.6, 0.7]
