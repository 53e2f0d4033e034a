"""Issue 11, items 3 and 9: only the current space's rows count; a fixed, typed Parquet schema."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.sweep import runner
from rpevit.sweep.protocol import EPOCH, SPEC_KEY, SUMMARY, Member, Report, TrialSpec
from rpevit.sweep.results import (EPOCHS_FILE, TRIALS_FILE, ParquetResults, current_rows,
                                  epochs_schema, trials_schema)
from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.space import expand_space

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

    monkeypatch.setattr(runner, "_ray", no_ray)


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
                               Report(SUMMARY, key, {**row, "trial_key": key}).to_tune())
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
                               Report(SUMMARY, key, {**row, "trial_key": key}).to_tune())
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
