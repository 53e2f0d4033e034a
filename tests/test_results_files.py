"""rpevit/sweep/results.py: only the current space's rows count; a fixed, typed Parquet schema; damaged
and unwritable result files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.sweep import session, store
from rpevit.sweep.protocol import EPOCH, SPEC_KEY, SUMMARY, Member, Report, TrialSpec
from rpevit.sweep.writer import ParquetResults
from rpevit.sweep.results import (EPOCHS_FILE, TRIALS_FILE, DamagedResults, current_rows, read_results_table,
                                  epochs_schema, trials_schema)
from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.space import expand_space

ROOT = Path(__file__).resolve().parents[1]
TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 100, "epochs": 1,
        "batch_size": 50, "eval_batch_size": 256, "eval_draws": 0}
PLACEMENT = {"node_id": "n0", "hostname": "h", "pid": 123, "ray_gpu_ids": "", "cuda_device": -1,
             "torch_threads": 1, "resumed_from_epoch": 0, "started_at": 1.7e9, "finished_at": 1.7e9 + 5}


@pytest.fixture(scope="module")
def train_rows() -> tuple[dict, list[dict]]:
    """One real summary row and its epoch rows of the train task (about a second)."""
    registry.load_all()
    epochs: list[dict] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        row = registry.TASKS["train"](TrialConfig.from_dict(TINY), log=None,
                                      on_epoch=lambda r, _c: epochs.append(dict(r)))
    finally:
        torch.set_num_threads(threads)
    return row, epochs


def fail(writer: ParquetResults, key: str, tmp: Path) -> None:
    """What Tune hands the callback for a trial that raised (twice: tried, retried)."""
    error_file = tmp / f"{key}.txt"
    error_file.write_text("Failure # 1\nTraceback ...\nValueError: boom\nFailure # 2\nValueError: boom\n")
    trial = SimpleNamespace(config={SPEC_KEY: TrialSpec(key, (Member(key, key, {}),)).to_dict()},
                            error_file=str(error_file), trial_id=f"id-{key}")
    writer.on_trial_error(0, [], trial)


class Launched(Exception):
    """Raised where Ray would start (see `stop_before_ray`)."""


@pytest.fixture
def stop_before_ray(monkeypatch) -> None:
    """run_sweep raises Launched where Ray would start: what counts as done is decided by then."""
    def no_ray(*_args, **_kwargs):
        raise Launched

    monkeypatch.setattr(session, "ray_session", no_ray)


def sweep_of(tmp: Path, name: str, pes: list[str]):
    space = expand_space({"name": name, "fixed": TINY, "grid": {"pe": pes}}, source=f"{name}.yaml")
    writer = ParquetResults(tmp / name, name, dict(zip(space.keys, space.trials)),
                            {k: i for i, k in enumerate(space.keys)}, task=space.task)
    return space, writer


def test_every_sweep_of_a_task_writes_the_same_typed_schema(tmp_path, train_rows) -> None:
    row, epochs = train_rows
    mixed, writer = sweep_of(tmp_path, "mixed", ["ape", "rope"])
    key = mixed.keys[0]
    for epoch in epochs:
        writer.on_trial_result(0, [], SimpleNamespace(trial_id="t0"),
                               Report(EPOCH, key, epoch).to_tune())
    writer.on_trial_result(0, [], SimpleNamespace(trial_id="t0"),
                           Report(SUMMARY, key, {**row, **PLACEMENT, "trial_key": key}).to_tune())
    fail(writer, mixed.keys[1], tmp_path)
    failed, writer = sweep_of(tmp_path, "all_failed", ["ape", "rope", "none"])
    for key in failed.keys:
        fail(writer, key, tmp_path)
    # during the sweep: parts of the task's schema (all_failed has no epoch rows, so no epoch part)
    for name, kind, schema in (("mixed", TRIALS_FILE, trials_schema("train")), ("all_failed", TRIALS_FILE,
                               trials_schema("train")), ("mixed", EPOCHS_FILE, epochs_schema("train"))):
        parts = store.listed_parts(tmp_path / name, kind)
        assert parts and all(pq.read_schema(p.path).remove_metadata().equals(schema) for p in parts), (name, kind)
    for name in ("mixed", "all_failed"):
        ParquetResults(tmp_path / name, name, {}, {}, task="train")  # a resumed driver compacts what a run left

    schemas = [pq.read_schema(tmp_path / name / TRIALS_FILE).remove_metadata() for name in ("mixed", "all_failed")]
    assert schemas[0].equals(schemas[1]) and schemas[0].equals(trials_schema("train")), \
        set(schemas[0].names) ^ set(schemas[1].names)
    schema = schemas[1]  # the all-failed sweep: every metric column, typed
    for name, kind in {"test_acc": pa.float64(), "params": pa.int64(), "flops": pa.int64(),
                       "n_train": pa.int64(), "pid": pa.int64(), "epochs_done": pa.int64(),
                       "seed": pa.int64(), "lr": pa.float64(), "pe": pa.string(),
                       "started_at": pa.timestamp("us", tz="UTC"), "attn_tv_per_layer": pa.list_(pa.float64()),
                       "test_acc_draw_mean": pa.float64(), "attn_tv_to_softmax": pa.float64()}.items():
        assert schema.field(name).type == kind, (name, schema.field(name).type)
    for name in ("mixed", "all_failed"):
        assert pq.read_schema(tmp_path / name / EPOCHS_FILE).remove_metadata().equals(epochs_schema("train"))
    # the union a duckdb `read_parquet([...])` (no union_by_name) sees
    both = pa.concat_tables([pq.read_table(tmp_path / n / TRIALS_FILE) for n in ("mixed", "all_failed")])
    assert both.num_rows == 5
    frame = pq.read_table(tmp_path / "mixed" / TRIALS_FILE).to_pandas()
    ok = frame[frame["status"] == "ok"].iloc[0]
    assert ok["params"] == row["params"] and ok["flops"] == row["flops"] and ok["test_acc"] == row["test_acc"]
    assert ok["started_at"] == pd.Timestamp(1.7e9, unit="s", tz="UTC")
    bad = frame[frame["status"] == "failed"].iloc[0]
    assert bad["error"] == "ValueError: boom" and bad["attempts"] == 2 and pd.isna(bad["params"])


def test_every_task_row_fits_its_schema_without_extra_columns(train_rows) -> None:
    """A metric a task adds must be declared in its TaskMetrics too, or sweeps drift again."""
    row, epochs = train_rows
    bench = registry.TASKS["bench"](TrialConfig.from_dict(
        {"task": "bench", "dataset": "cifar10", "image_size": 16, "patch_size": 4, "dim": 16, "depth": 1,
         "heads": 2, "bench_batch": 4, "bench_warmup": 1, "bench_iters": 2}), log=None)
    kmse = registry.TASKS["kernel_mse"](TrialConfig.from_dict(
        {"task": "kernel_mse", "kmse_dim": 8, "kmse_features": 4, "kmse_draws": 50}), log=None)
    for task, summary in (("train", row), ("bench", bench), ("kernel_mse", kmse)):
        unknown = (set(summary) | set(PLACEMENT)) - set(trials_schema(task).names)
        assert not unknown, (task, unknown)
    assert not {k for e in epochs for k in e} - set(epochs_schema("train").names)


def test_a_part_run_with_only_keeps_the_other_parts_rows_current(tmp_path, train_rows, stop_before_ray,
                                                                 capsys) -> None:
    """`sweep.py --only pe=ape`, then `--only pe=rope`, then the whole space, into one folder: no
    run sets the others' rows aside, space.json always lists the whole space, done is done."""
    row, _ = train_rows
    spec = {"name": "parts", "fixed": TINY, "grid": {"pe": ["ape", "rope"]}}
    whole = expand_space(spec, source="parts.yaml")
    ape = expand_space(spec, source="parts.yaml", only={"pe": "ape"})
    rope = expand_space(spec, source="parts.yaml", only={"pe": "rope"})
    assert ape.keys == whole.keys[:1] and rope.keys == whole.keys[1:] and ape.current_keys == whole.keys

    with pytest.raises(Launched):
        run_sweep(ape, SweepOptions(results_dir=tmp_path))
    writer = ParquetResults(tmp_path / "parts", "parts", dict(zip(ape.keys, ape.trials)), {ape.keys[0]: 0},
                            task="train")  # the ape part's trial finished
    writer.on_trial_result(0, [], SimpleNamespace(trial_id="t0"),
                           Report(SUMMARY, ape.keys[0], {**row, "trial_key": ape.keys[0]}).to_tune())
    capsys.readouterr()
    for part, says in ((rope, "1 trials, 0 already done, 1 to run"), (whole, "2 trials, 1 already done, 1 to run")):
        with pytest.raises(Launched):
            run_sweep(part, SweepOptions(results_dir=tmp_path, resume=True))
        out = capsys.readouterr().out
        assert says in out and "set aside" not in out, out
        assert json.loads((tmp_path / "parts" / "space.json").read_text())["trial_keys"] == whole.keys
        kept, aside = current_rows(pd.read_parquet(tmp_path / "parts" / TRIALS_FILE), tmp_path / "parts")
        assert list(kept["trial_key"]) == ape.keys and aside == 0


def test_resume_after_a_yaml_edit_uses_only_the_current_space(tmp_path, train_rows, stop_before_ray,
                                                              capsys) -> None:
    row, _ = train_rows
    old, writer = sweep_of(tmp_path, "edited", ["ape", "rope"])  # the space as it was: epochs 1
    for i, key in enumerate(old.keys):
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               Report(SUMMARY, key, {**row, **old.trials[i], "trial_key": key}).to_tune())
    (tmp_path / "edited" / "space.json").write_text(json.dumps({"trial_keys": old.keys}))
    new = expand_space({"name": "edited", "fixed": {**TINY, "epochs": 2}, "grid": {"pe": ["ape", "rope"]}},
                       source="edited.yaml")  # `epochs` edited: new trial keys

    with pytest.raises(Launched):
        run_sweep(new, SweepOptions(results_dir=tmp_path, resume=True))
    out = capsys.readouterr().out
    assert "set aside 2 row(s)" in out and "2 trials, 0 already done, 2 to run" in out, out

    stored = pd.read_parquet(tmp_path / "edited" / TRIALS_FILE)
    assert len(stored) == 2  # the old rows are kept in the file ...
    kept, aside = current_rows(stored, tmp_path / "edited")  # ... and filtered by the new space.json
    assert kept.empty and aside == 2
    assert json.loads((tmp_path / "edited" / "space.json").read_text())["trial_keys"] == new.keys

    # once the new trials have rows, the summary shows them alone
    writer = ParquetResults(tmp_path / "edited", "edited", dict(zip(new.keys, new.trials)),
                            {k: i for i, k in enumerate(new.keys)}, task="train")
    for i, key in enumerate(new.keys):
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"n{i}"),
                               Report(SUMMARY, key, {**row, **new.trials[i], "trial_key": key}).to_tune())
    assert run_sweep(new, SweepOptions(results_dir=tmp_path, resume=True)) == 0
    out = capsys.readouterr().out
    assert "set aside 2 row(s)" in out and "2 ok, 0 failed, 0 not run" in out
    kept, aside = current_rows(pd.read_parquet(tmp_path / "edited" / TRIALS_FILE), tmp_path / "edited")
    assert sorted(kept["trial_key"]) == sorted(new.keys) and aside == 2
    assert current_rows(stored, tmp_path / "elsewhere")[1] == 0  # no space.json: nothing to filter by


# ---- issue 31, items 16 and 18: temp files of killed writers; a malformed space.json in analysis
def test_a_sweep_start_removes_the_temp_files_killed_writers_left_and_only_those(tmp_path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    dead = 2**22 + 12345  # above any pid_max: no live process has it
    stale = [folder / f".{name}.{dead}.tmp" for name in (TRIALS_FILE, EPOCHS_FILE, "space.json")]
    for path in stale:
        path.write_bytes(b"torn write")
    live = folder / f".{TRIALS_FILE}.1.tmp"  # pid 1 is alive: maybe another writer's, kept
    others = [folder / "notes.tmp", folder / f".{TRIALS_FILE}.tmp", folder / f"{TRIALS_FILE}.{dead}.tmp",
              folder / f"{TRIALS_FILE}.bak"]
    for path in [live, *others]:
        path.write_bytes(b"keep")
    space, writer = sweep_of(tmp_path, "s", ["ape"])  # the driver's writer, made when a sweep (re)starts
    assert not any(path.exists() for path in stale)
    assert live.exists() and all(path.read_bytes() == b"keep" for path in others)


def test_analysis_says_which_space_json_is_malformed_in_one_line(tmp_path, train_rows) -> None:
    from rpevit.analysis.common import read_trials

    row, _ = train_rows
    space, writer = sweep_of(tmp_path, "s", ["ape"])
    writer.on_trial_result(0, [], SimpleNamespace(trial_id="t0"),
                           Report(SUMMARY, space.keys[0], {**row, "trial_key": space.keys[0]}).to_tune())
    path = tmp_path / "s" / "space.json"
    for text in ("{not json", '["a list"]', '{"trial_keys": "abc"}', '{"name": "s"}', b"\xff\xfe"):
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(SystemExit) as exit_info:
            read_trials(tmp_path)
        message = str(exit_info.value.code)
        assert message.startswith("error: ") and "\n" not in message and str(path) in message, message
        assert "allowed: the JSON object sweep.py writes" in message, message
    path.write_text(json.dumps({"trial_keys": space.keys}))
    assert len(read_trials(tmp_path).frame) == 1


# ---- issue 31, item 12: damaged trials.parquet / epochs.parquet
DAMAGE = {
    "truncated": lambda path, good: path.write_bytes(good[: len(good) // 2]),
    "random": lambda path, good: path.write_bytes(bytes(range(256)) * 8),
    "empty": lambda path, good: path.write_bytes(b""),
    "a folder": lambda path, good: path.mkdir(),
    "another table": lambda path, good: pq.write_table(pa.table({"x": [1, 2]}), path),
}


def damage(path: Path, kind: str) -> bytes:
    """Replace a results file by a damaged one; returns the good bytes."""
    good = path.read_bytes()
    path.unlink()
    DAMAGE[kind](path, good)
    return good


def finished_sweep(tmp: Path, name: str, row: dict, epochs: list[dict], pes=("ape", "rope")):
    """A sweep folder as a finished run leaves it: a row and epoch rows per trial, and space.json."""
    space, writer = sweep_of(tmp, name, list(pes))
    for i, key in enumerate(space.keys):
        for epoch in epochs:
            writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"), Report(EPOCH, key, epoch).to_tune())
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               Report(SUMMARY, key, {**row, **space.trials[i], **PLACEMENT, "trial_key": key}).to_tune())
    writer.on_experiment_end([])  # the run's end: its parts compacted into trials.parquet / epochs.parquet
    (tmp / name / "space.json").write_text(json.dumps({"trial_keys": space.keys}))
    return space


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_analysis_names_a_damaged_trials_file_and_skips_only_its_folder(tmp_path, train_rows, kind, capsys) -> None:
    from rpevit.analysis import common, efficiency, gap_closure, kernel_mse, report, string_study

    row, epochs = train_rows
    finished_sweep(tmp_path, "good", row, epochs)
    finished_sweep(tmp_path, "bad", row, epochs)
    bad = tmp_path / "bad" / TRIALS_FILE
    damage(bad, kind)
    for module in (gap_closure, efficiency, string_study, kernel_mse):  # the scripts, given the bad folder
        with pytest.raises(SystemExit) as stop:
            module.build(tmp_path / "bad")
        message = str(stop.value.code)
        assert message.startswith(f"error: {bad} cannot be read as a sweep's trials.parquet") and "\n" not in message
        assert "--resume" in message, message
    capsys.readouterr()
    common._WARNED.clear()
    text = report.build_report(tmp_path)  # the parent: the bad folder is skipped, the rest reported
    assert "| good | train | 2 | 0 |" in text and "| bad | ? | — | — | skipped: trials.parquet cannot be read |" in text
    assert "## Accuracy and gap closure" in text and "skipped, trials.parquet cannot be read: bad" in text
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {bad} cannot be read") and "--resume" in err, err
    assert os.path.lexists(bad)  # the analysis never moves a file


@pytest.mark.slow
def test_report_script_skips_a_damaged_folder_without_a_traceback(tmp_path, train_rows) -> None:
    import subprocess
    import sys

    row, epochs = train_rows
    finished_sweep(tmp_path, "good", row, epochs)
    finished_sweep(tmp_path, "bad", row, epochs)
    damage(tmp_path / "bad" / TRIALS_FILE, "truncated")
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(repo / "analysis" / "report.py"), str(tmp_path)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert [ln for ln in done.stderr.splitlines() if ln.startswith("warning:")] == [done.stderr.strip()]
    one = subprocess.run([sys.executable, str(repo / "analysis" / "gap_closure.py"), str(tmp_path / "bad")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert one.returncode == 1 and one.stderr.count("\n") == 1 and one.stderr.startswith("error: "), one.stderr


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_resume_sets_a_damaged_trials_file_aside_and_reruns_its_trials(tmp_path, train_rows, stop_before_ray,
                                                                       kind, capsys) -> None:
    row, epochs = train_rows
    space = finished_sweep(tmp_path, "s", row, epochs)
    folder = tmp_path / "s"
    good = damage(folder / TRIALS_FILE, kind)
    before = {p.name for p in folder.iterdir()}
    with pytest.raises(Launched):  # the plan is made: both trials run again (from their checkpoints)
        run_sweep(space, SweepOptions(results_dir=tmp_path, resume=True))
    out, err = capsys.readouterr()
    assert "2 trials, 0 already done, 2 to run" in out, out
    assert err.count("\n") == 1 and err.startswith(f"warning: {folder / TRIALS_FILE} cannot be read"), err
    aside = [p for p in folder.iterdir() if p.name.startswith(f"{TRIALS_FILE}.damaged-")]
    assert len(aside) == 1 and aside[0].name in err and not os.path.lexists(folder / TRIALS_FILE)
    if kind != "a folder":
        assert aside[0].read_bytes() != good or kind == "another table"  # the damaged file itself, kept
    assert {p.name for p in folder.iterdir()} - before - {aside[0].name} <= {".sweep.lock"}
    writer = ParquetResults(folder, "s", dict(zip(space.keys, space.trials)), {k: i for i, k in enumerate(space.keys)},
                            task="train")  # what the run starts with: no trial rows, the epoch rows kept
    assert writer.standing == {} and [writer.epochs_done(k) for k in space.keys] == [len(epochs)] * 2


@pytest.mark.slow
def test_a_damaged_epochs_file_is_set_aside_and_rebuilt_from_the_checkpoints(tmp_path, capsys) -> None:
    space = expand_space({"name": "e", "fixed": {**TINY, "epochs": 2}, "grid": {"pe": ["ape", "rope"]}},
                         source="e.yaml")
    folder = tmp_path / "e"
    writer = ParquetResults(folder, "e", dict(zip(space.keys, space.trials)), {k: i for i, k in enumerate(space.keys)},
                            task="train")
    histories = {}
    for i, (key, cfg) in enumerate(zip(space.keys, space.trials)):
        history: list[dict] = []
        row = registry.TASKS["train"](TrialConfig.from_dict(cfg), checkpoint_dir=folder / "trials" / key, log=None,
                                      on_epoch=lambda r, _c, h=history: h.append(dict(r)))
        histories[key] = history
        for epoch in history:
            writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"), Report(EPOCH, key, epoch).to_tune())
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               Report(SUMMARY, key, {**row, **PLACEMENT, "trial_key": key}).to_tune())
    writer.on_experiment_end([])  # compacted: the run's epochs.parquet
    expected = pd.read_parquet(folder / EPOCHS_FILE)
    damage(folder / EPOCHS_FILE, "random")
    capsys.readouterr()
    ParquetResults(folder, "e", {}, {k: i for i, k in enumerate(space.keys)}, task="train")  # a --resume's writer
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "set aside as epochs.parquet.damaged-" in err
    assert "rebuilt 4 epoch row(s) of 2 trial(s) from their checkpoints" in err, err
    rebuilt = pd.read_parquet(folder / EPOCHS_FILE)
    pd.testing.assert_frame_equal(rebuilt, expected)
    assert len(list(folder.glob(f"{EPOCHS_FILE}.damaged-*"))) == 1
    assert len(pd.read_parquet(folder / TRIALS_FILE)) == 2  # the trial rows untouched


# ---- issue 31, item 13: the results folder fills up (or turns read-only) mid-sweep
@pytest.mark.slow
def test_a_full_disk_stops_the_sweep_in_one_line_and_resume_finishes_it(tmp_path, monkeypatch, capsys) -> None:
    import errno
    import sys

    import ray

    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    import sweep as sweep_cli

    ray.shutdown()
    yaml = tmp_path / "full.yaml"
    yaml.write_text("name: full\ntask: train\nfixed: {dataset: digits, dim: 16, depth: 1, heads: 2, train_subset: 100, "
                    "epochs: 2, batch_size: 50, eval_draws: 0}\ngrid: {pe: [ape, rope, none]}\n"
                    "resources: {cpus_per_trial: 1, gpus_per_trial: 0, max_concurrent: 1}\n")
    argv = ["--space", str(yaml), "--results-dir", str(tmp_path / "res"), "--no-dashboard"]
    real, writes = store.write_table_atomic, []

    def disk_full_after_two(table, path):  # the first trial's epoch rows land, its row does not: the disk is full
        writes.append(path)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(table, path)

    monkeypatch.setattr(store, "write_table_atomic", disk_full_after_two)  # the sweep's writer's parts (a Tune callback)
    assert sweep_cli.main(argv) == 2
    out, err = capsys.readouterr()
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    folder = tmp_path / "res" / "full"
    assert len(errors) == 1 and "Traceback" not in out + err, err
    assert f"cannot write the results of this sweep to {folder} (ENOSPC: No space left on device)" in errors[0]
    assert errors[0].endswith(f"continue with python sweep.py --space {yaml} --name full --results-dir "
                              f"{tmp_path / 'res'} --no-dashboard --resume"), errors[0]
    assert len(list((folder / "trials").iterdir())) == 1  # no further trial started
    assert not list(folder.glob(".*.tmp")) + list(folder.glob("parts/.*.tmp"))  # no torn temp file left behind

    monkeypatch.setattr(store, "write_table_atomic", real)
    assert sweep_cli.main([*argv, "--resume"]) == 0
    trials = pd.read_parquet(folder / TRIALS_FILE)
    epochs = pd.read_parquet(folder / EPOCHS_FILE)
    assert len(trials) == 3 and set(trials["status"]) == {"ok"}
    assert len(epochs) == 6 and not epochs.duplicated(["trial_key", "epoch"]).any()


# ---- issue 39: one no-follow atomic writer for every results file and analysis output
def test_the_atomic_writer_never_writes_through_a_link(tmp_path) -> None:
    from rpevit.sweep.results import LinkRefused, atomic_file, temp_name, write_text_atomic

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "space.json"
    temp_name(target).symlink_to(victim)  # a planted temp file of this pid: removed, never written through
    write_text_atomic(target, "{}")
    assert target.read_text() == "{}" and victim.read_text() == "precious" and not temp_name(target).exists()
    link = tmp_path / "report.md"
    link.symlink_to(victim)
    with pytest.raises(LinkRefused, match="report.md is a symbolic link .*allowed: a regular file or nothing"):
        write_text_atomic(link, "x")
    assert victim.read_text() == "precious" and link.is_symlink()
    with pytest.raises(RuntimeError):  # a write that fails leaves the old file and no temp file
        with atomic_file(target) as handle:
            handle.write(b"half")
            raise RuntimeError("disk full")
    assert target.read_text() == "{}" and not temp_name(target).exists()


def test_the_atomic_writer_never_writes_into_a_linked_folder(tmp_path) -> None:
    """A planted link at the folder a file is written in (a study folder under RESULTS_DIR pointing
    elsewhere) is refused before anything is written there; a folder the user names on the command line
    is resolved (named_folder), so a link the user chose is followed on purpose and writes work."""
    from rpevit.sweep.results import LinkRefused, write_text_atomic

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    results = tmp_path / "results"
    results.mkdir()
    (results / "study").symlink_to(elsewhere)
    with pytest.raises(LinkRefused, match="study is a symbolic link .*allowed: a real folder to write in"):
        write_text_atomic(results / "study" / "report.md", "x")
    assert list(elsewhere.iterdir()) == []
    from rpevit.sweep.results import named_folder

    chosen = tmp_path / "my-results-link"
    chosen.symlink_to(results)
    write_text_atomic(named_folder(str(chosen)) / "report.md", "y")
    assert (results / "report.md").read_text() == "y"


def test_the_atomic_writer_makes_its_data_and_its_rename_durable(tmp_path, monkeypatch) -> None:
    """fsync of the data before the rename and of the folder after it: what a crash or power loss needs
    (a SIGKILL keeps the page cache, so only this order shows it). Fails without the fsyncs."""
    import os
    import stat

    from rpevit.sweep import results

    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "data")
        real_fsync(fd)

    def replace(src, dst, **dir_fds) -> None:  # atomic_file renames relative to its open folder
        calls.append("rename")
        real_replace(src, dst, **dir_fds)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with results.atomic_file(tmp_path / "trials.parquet") as handle:
        handle.write(b"rows")
    assert calls == ["data", "rename", "folder"]
    assert (tmp_path / "trials.parquet").read_bytes() == b"rows"


READ_AND_EXIT = """import sys
from pathlib import Path
from rpevit.sweep.results import TRIALS_FILE, read_results_table
from rpevit.sweep.store import compacted_through
path = Path(sys.argv[1])
compacted_through(path)  # the footer read the store makes before the rows
assert read_results_table(path, TRIALS_FILE).num_rows == 2
sys.exit(0)  # at once: the interpreter's exit meets whatever Arrow's threads still hold
"""


@pytest.mark.slow
def test_a_process_that_reads_results_and_exits_at_once_exits_0(tmp_path, train_rows) -> None:
    """Arrow reading a Python file object frees its chunks on Arrow's I/O threads; a process that exited
    right after a read aborted when one of them still held a chunk ('terminate called without an active
    exception', -6): 8 of 12 such processes in a row here, and CI's `--dry-run` test on 2026-11-30. Ten in a
    row, each must exit 0 (one at a time: eight at once on two cores never aborted)."""
    row, epochs = train_rows
    finished_sweep(tmp_path, "s", row, epochs)
    path = tmp_path / "s" / TRIALS_FILE
    assert pq.read_table(path).num_rows == 2  # what the processes read: the file as Arrow reads it by path
    for attempt in range(10):
        proc = subprocess.run([sys.executable, "-c", READ_AND_EXIT, str(path)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, (attempt, proc.stderr[-500:])


def test_a_results_file_read_from_arrow_memory_equals_arrow_reading_it_by_path(tmp_path, train_rows) -> None:
    """read_results_table reads the one descriptor it opened into memory Arrow owns (arrow_bytes): the
    same table as pq.read_table of the path, and a file cut short reads as damaged, not as fewer rows."""
    row, epochs = train_rows
    finished_sweep(tmp_path, "s", row, epochs)
    for kind in (TRIALS_FILE, EPOCHS_FILE):
        path = tmp_path / "s" / kind
        plain = pq.read_table(path)
        read = store.read_table(path)
        assert read.schema.equals(plain.schema, check_metadata=False)
        pd.testing.assert_frame_equal(read.to_pandas(), plain.to_pandas())  # NaN where NaN
        good = path.read_bytes()
        path.write_bytes(good[: len(good) - 9])  # the footer's length and magic gone
        with pytest.raises(DamagedResults, match=kind):
            read_results_table(path, kind)
        path.write_bytes(good)
