"""Issue 59, the adversary's fourth round, on the results store: what a malformed, planted or oversized
file under a sweep folder may do (nothing but be named, and set aside whole by the driver), and the
small things around it.

- item 1: a part whose trial_key is int64 made `python -m rpevit.sweep.compact` rewrite 20 trial rows as
  2 and delete the parts (store._concat cast every table to the newest part's types: keys, started_at
  and epoch nulled or turned to text). A file whose columns do not hold what its kind's schema declares is
  damaged: every reader names it, the driver sets it aside whole, the compact tool rewrites nothing;
- item 5: a FIFO in parts/ hung report.py, the snapshot, the compact tool and the driver: only regular
  files are opened (a hang fails these tests, it does not hang them: a FIFO's other end is opened after a
  timeout, or the process is killed);
- item 7: a snapshot into a finished sweep's own folder; 2,000 exclude entries (53 s); a stale temp file
  after a --resume with nothing to run; a 137 KB part that took 3.4 GB once read.
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rpevit.sweep import compact as compact_cli
from rpevit.sweep import results, session, store
from rpevit.sweep import snapshot as snapshot_cli
from rpevit.sweep.declaration import DECLARATION_FILE
from rpevit.sweep.lock import LOCK_FILE
from rpevit.sweep.results import (DECLARATION_NAME, EPOCHS_FILE, MAX_READ_BYTES, SPACE_FILE, TIMESTAMP, TRIALS_FILE,
                                  TRIALS_LOST, BadTrialKey, DamagedResults, current_keys, declared_types,
                                  epochs_schema, read_results_table, to_table, trials_schema, write_table_atomic)

REPO = Path(__file__).resolve().parent.parent
KEYS = [f"{i:016x}" for i in range(1, 21)]
T0 = 1_767_225_600.0  # 2026-01-01 UTC
TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 100, "epochs": 1,
        "batch_size": 50, "eval_batch_size": 256, "eval_draws": 0}


def trial_rows(keys=KEYS) -> list[dict]:
    return [{"sweep": "s", "task": "train", "trial_key": k, "status": "ok", "test_acc": i / 100,
             "started_at": T0 + i, "finished_at": T0 + i + 5} for i, k in enumerate(keys)]


def epoch_rows(keys=KEYS) -> list[dict]:
    return [{"sweep": "s", "trial_key": k, "epoch": e, "train_loss": i + e / 10} for i, k in enumerate(keys)
            for e in range(2)]


def folder_with_rows(folder: Path, compacted: bool = True) -> Path:
    """A sweep folder holding 20 trials (and 2 epochs each): one flush per trial, then (`compacted`) a
    compaction, as a driver leaves it."""
    log = store.PartLog(folder)
    for trial, k in zip(trial_rows(), KEYS):
        sequence = log.next_sequence()
        log.append(EPOCHS_FILE, to_table([r for r in epoch_rows() if r["trial_key"] == k], epochs_schema("train")),
                   sequence)
        log.append(TRIALS_FILE, to_table([trial], trials_schema("train")), sequence)
    if compacted:
        store.compact(folder)
    (folder / SPACE_FILE).write_text(json.dumps({"name": "s", "trial_keys": KEYS}))
    return folder


def planted_part(folder: Path, kind: str) -> Path:
    """The path of a part newer than every other (live until a compaction holds it)."""
    newest = max([store.compacted_through(folder / k) for k in store.KINDS]
                 + [p.last for k in store.KINDS for p in store.listed_parts(folder, k)])
    (folder / store.PARTS_DIR).mkdir(exist_ok=True)
    return store.Part.named(folder, kind, 0, newest + 10, newest + 10).path


def int64_key_part(folder: Path) -> Path:
    """The adversary's part: a trial row of the right schema but for trial_key int64 and started_at as a
    float (what a hand-made table of one row looks like)."""
    table = to_table(trial_rows(["00000000000000ff"]), trials_schema("train"))
    table = table.set_column(table.schema.get_field_index("trial_key"), "trial_key", pa.array([5], pa.int64()))
    table = table.set_column(table.schema.get_field_index("started_at"), "started_at", pa.array([T0 + 99.5]))
    path = planted_part(folder, TRIALS_FILE)
    pq.write_table(table, path)
    return path


def assert_same(got: pa.Table, expected: pa.Table) -> None:
    """Equal schemas (with their metadata) and values (NaN equal to NaN)."""
    assert got.schema.equals(expected.schema, check_metadata=True)
    pd.testing.assert_frame_equal(got.to_pandas(), expected.to_pandas())


def stored(folder: Path, kind: str = TRIALS_FILE) -> pa.Table:
    return pq.read_table(folder / kind)


# ---- item 1: a malformed part is named, set aside whole by the driver, never merged
def test_the_compact_tool_refuses_a_part_whose_trial_key_is_int64_and_keeps_every_row(tmp_path, capsys):
    folder = folder_with_rows(tmp_path / "s")
    before = {kind: stored(folder, kind) for kind in store.KINDS}
    bad = int64_key_part(folder)
    data = bad.read_bytes()
    assert compact_cli.main([str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {bad} cannot be read as a part of a sweep's "
                                                                 f"{TRIALS_FILE} (column 'trial_key' holds int64"), err
    assert "nothing in" in err and "was rewritten or removed" in err and "--resume" in err
    assert bad.read_bytes() == data  # the part is where it was, whole
    for kind in store.KINDS:  # and the compacted files are untouched: 20 trials, not 2
        assert stored(folder, kind).equals(before[kind])
    assert stored(folder).num_rows == 20


def test_every_reader_names_the_malformed_part(tmp_path):
    from rpevit.analysis import gap_closure

    folder = folder_with_rows(tmp_path / "s")
    bad = int64_key_part(folder)
    with pytest.raises(DamagedResults, match=f"{bad.name} cannot be read as a part .*'trial_key' holds int64"):
        store.read_table(folder / TRIALS_FILE)
    with pytest.raises(SystemExit) as stop:  # what report.py, gap_closure.py, ... print: one line naming the part
        gap_closure.build(folder)
    message = str(stop.value.code)
    assert message.startswith(f"error: {bad} cannot be read") and "\n" not in message and "--resume" in message
    with pytest.raises(DamagedResults, match=bad.name):
        snapshot_cli.snapshot(folder, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_the_driver_sets_a_malformed_part_aside_whole_and_keeps_every_other_row(tmp_path, capsys):
    folder = folder_with_rows(tmp_path / "s", compacted=False)  # the rows are in parts, as after a kill
    bad = int64_key_part(folder)
    data = bad.read_bytes()
    table, damaged = store.driver_table(folder / TRIALS_FILE, TRIALS_LOST)  # what a driver starts with
    assert [moved.name.startswith(bad.name + ".damaged-") for _, moved in damaged] == [True]
    assert damaged[0][1].read_bytes() == data  # kept whole
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {bad} cannot be read") and "set aside as" in err
    assert sorted(table.column("trial_key").to_pylist()) == KEYS
    store.compact(folder)
    trials = stored(folder)
    assert sorted(trials.column("trial_key").to_pylist()) == KEYS  # 20 rows, each with its times
    assert trials.schema.field("started_at").type == TIMESTAMP and trials.column("started_at").null_count == 0
    epochs = stored(folder, EPOCHS_FILE)
    assert epochs.num_rows == 40 and epochs.schema.field("epoch").type == pa.int64()


def test_a_union_is_brought_to_the_schema_never_to_the_newest_tables_types():
    """The second guard, under read_results_table: store.union of good tables and a malformed newest one
    keeps every good row as it was (before: 20 trials as 2, started_at nulled, epoch as text)."""
    good = to_table(trial_rows(), trials_schema("train"))
    bad = to_table(trial_rows(["00000000000000ff"]), trials_schema("train"))
    bad = bad.set_column(bad.schema.get_field_index("trial_key"), "trial_key", pa.array([5], pa.int64()))
    bad = bad.set_column(bad.schema.get_field_index("started_at"), "started_at", pa.array([T0 + 99.5]))
    both = store.union([good, bad], TRIALS_FILE)
    assert both.column("trial_key").to_pylist() == KEYS + ["5"]
    assert both.schema.field("started_at").type == TIMESTAMP
    assert [t.timestamp() for t in both.column("started_at").to_pylist()] == [T0 + i for i in range(20)] + [T0 + 99.5]

    epochs = to_table(epoch_rows(), epochs_schema("train"))
    text = to_table(epoch_rows(["00000000000000ff"]), epochs_schema("train"))
    text = text.set_column(text.schema.get_field_index("epoch"), "epoch", pa.array(["0", "1"]))
    both = store.union([epochs, text], EPOCHS_FILE)
    assert both.schema.field("epoch").type == pa.int64() and both.num_rows == 42
    assert both.column("epoch").to_pylist() == [e for _ in range(21) for e in range(2)]
    odd = pa.table({"trial_key": [KEYS[0]], "status": ["ok"], "mine": ["x"]})  # a column no schema declares
    mixed = store.union([pa.table({"trial_key": [KEYS[1]], "status": ["ok"], "mine": [1]}), odd], TRIALS_FILE)
    assert mixed.column("mine").to_pylist() == ["1", "x"]  # typed differently: kept as text, no row lost


def _replaced(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    index = table.schema.get_field_index(name)
    if index < 0:
        return table.append_column(name, array)
    return table.set_column(index, name, array)


REFUSED = {  # kind, column, stored as, what the message says
    "trial_key int64": (TRIALS_FILE, "trial_key", pa.array([5], pa.int64()), "'trial_key' holds int64"),
    "trial_key all null": (TRIALS_FILE, "trial_key", pa.nulls(1), "'trial_key' holds null"),
    "status int64": (TRIALS_FILE, "status", pa.array([1], pa.int64()), "'status' holds int64"),
    "test_acc text": (TRIALS_FILE, "test_acc", pa.array(["0.9"]), "'test_acc' holds text (such as '0.9')"),
    "started_at text": (TRIALS_FILE, "started_at", pa.array(["yesterday"]), "'started_at' holds text"),
    "seed text": (TRIALS_FILE, "seed", pa.array(["0"]), "'seed' holds text (such as '0')"),
    "pe int64": (TRIALS_FILE, "pe", pa.array([3], pa.int64()), "'pe' holds int64"),
    "epoch text": (EPOCHS_FILE, "epoch", pa.array(["0"]), "'epoch' holds text"),
    "epoch double": (EPOCHS_FILE, "epoch", pa.array([0.0]), "'epoch' holds double"),
    "epoch key int64": (EPOCHS_FILE, "trial_key", pa.array([5], pa.int64()), "'trial_key' holds int64"),
    "train_loss text": (EPOCHS_FILE, "train_loss", pa.array(["low"]), "'train_loss' holds text"),
}
READ = {  # what this or an earlier sweep.py wrote: read as it is
    "started_at float seconds": (TRIALS_FILE, "started_at", pa.array([T0])),
    "started_at ns timestamp": (TRIALS_FILE, "started_at", pa.array([np.datetime64("2026-01-01", "ns")])),
    "attempts all null": (TRIALS_FILE, "attempts", pa.nulls(1)),
    "attempts double (pandas)": (TRIALS_FILE, "attempts", pa.array([1.0])),
    "epoch int32": (EPOCHS_FILE, "epoch", pa.array([0], pa.int32())),
    "pe large_string": (TRIALS_FILE, "pe", pa.array(["ape"], pa.large_string())),
    "pe dictionary": (TRIALS_FILE, "pe", pa.array(["ape"]).dictionary_encode()),
    "an unknown column": (TRIALS_FILE, "my_note", pa.array([{"a": 1}])),
}


def _one_row(kind: str) -> pa.Table:
    rows = trial_rows(KEYS[:1]) if kind == TRIALS_FILE else epoch_rows(KEYS[:1])[:1]
    return to_table(rows, trials_schema("train") if kind == TRIALS_FILE else epochs_schema("train"))


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_file_whose_column_does_not_hold_what_the_schema_declares_is_damaged(tmp_path, case):
    kind, name, array, words = REFUSED[case]
    folder = tmp_path / "s"
    folder.mkdir()
    path = planted_part(folder, kind)
    pq.write_table(_replaced(_one_row(kind), name, array), path)
    for columns in (None, [], ["trial_key"]):  # checked on the footer, whatever a reader asks for
        with pytest.raises(DamagedResults, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
            read_results_table(path, kind=kind, columns=columns)
        assert str(err.value).startswith(f"{path} cannot be read as a part of a sweep's {kind} (")
        assert "\n" not in str(err.value)
    pq.write_table(_replaced(_one_row(kind), name, array), folder / kind)  # the compacted file alike
    with pytest.raises(DamagedResults, match=f"{kind} cannot be read as a sweep's {kind}"):
        read_results_table(folder / kind)


@pytest.mark.parametrize("case", list(READ))
def test_older_and_equivalent_types_are_read_as_they_are_and_meet_new_rows(tmp_path, case):
    kind, name, array = READ[case]
    path = tmp_path / kind
    written = _replaced(_one_row(kind), name, array)
    pq.write_table(written, path)
    assert_same(read_results_table(path), pq.read_table(path, use_pandas_metadata=True))
    other = to_table(trial_rows(KEYS[1:2]) if kind == TRIALS_FILE else epoch_rows(KEYS[1:2])[:1],
                     trials_schema("train") if kind == TRIALS_FILE else epochs_schema("train"))
    both = store.union([read_results_table(path), other], kind)
    others = other.column(name).null_count if name in other.column_names else other.num_rows
    assert both.column("trial_key").to_pylist() == KEYS[:2]
    assert both.column(name).null_count == array.null_count + others  # no value turned into a null


def test_duplicate_column_names_are_damaged(tmp_path):
    path = tmp_path / TRIALS_FILE
    table = pa.table([pa.array([KEYS[0]]), pa.array(["ok"]), pa.array([0.5]), pa.array(["x"])],
                     names=["trial_key", "status", "test_acc", "test_acc"])
    pq.write_table(table, path)
    with pytest.raises(DamagedResults, match="column 'test_acc' appears more than once"):
        read_results_table(path)


def test_one_type_per_column_name_across_the_tasks():
    """store._concat brings a column to the one type its name has in every registered task's schema."""
    for kind in store.KINDS:
        assert {n: t for n, t in declared_types(kind).items() if len(t) > 1} == {}


def test_the_compaction_refuses_a_part_whose_key_names_a_folder_outside_and_writes_nothing(tmp_path):
    folder = folder_with_rows(tmp_path / "s")
    before = stored(folder)
    path = planted_part(folder, EPOCHS_FILE)
    write_table_atomic(to_table(epoch_rows(["../../../etc"]), epochs_schema("train")), path)
    with pytest.raises(BadTrialKey, match=f"{path}, row 1 has trial_key '../../../etc'"):
        store.compact(folder)
    assert path.exists() and stored(folder).equals(before) and stored(folder, EPOCHS_FILE).num_rows == 40


# ---- item 5: a FIFO is never opened
@contextmanager
def released_after(fifo: Path, seconds: float):
    """A reader stuck opening `fifo` (open() of a FIFO waits for a writer) is let go after `seconds`:
    its other end is opened and closed, so the reader sees an empty file and the test fails instead of
    hanging."""
    stop = threading.Event()

    def release():
        while not stop.wait(seconds):
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds only while a reader waits
            except OSError:
                continue
            os.close(fd)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


HANG_S = 15.0


def fifo_part(folder: Path, kind: str = TRIALS_FILE) -> Path:
    path = planted_part(folder, kind)
    os.mkfifo(path)
    return path


def test_a_fifo_in_parts_is_named_by_every_reader_of_the_store_without_waiting(tmp_path):
    folder = folder_with_rows(tmp_path / "s")
    before = {kind: stored(folder, kind) for kind in store.KINDS}
    fifo = fifo_part(folder)
    t0 = time.monotonic()
    with released_after(fifo, HANG_S):
        with pytest.raises(DamagedResults, match=f"{fifo.name} cannot be read .*it is a named pipe \\(FIFO\\)"):
            store.read_table(folder / TRIALS_FILE)
        with pytest.raises(DamagedResults, match="named pipe"):
            snapshot_cli.snapshot(folder, tmp_path / "copy")
        with pytest.raises(DamagedResults, match="named pipe"):
            store.compact(folder)  # what the compact tool and a driver's start run
        store.PartLog(folder)  # the driver's appender: lists parts, opens none
        table, damaged = store.driver_table(folder / TRIALS_FILE, TRIALS_LOST)  # the driver: sets it aside
    assert time.monotonic() - t0 < HANG_S
    assert table.num_rows == 20 and [m.name.startswith(fifo.name + ".damaged-") for _, m in damaged] == [True]
    assert not os.path.lexists(fifo)
    for kind in store.KINDS:
        assert stored(folder, kind).equals(before[kind])


def test_every_reader_of_space_json_refuses_a_fifo_and_names_it(tmp_path):
    """space.json has one reader (results.read_space_file); before it, the analysis's (common.space_keys,
    which report.py, progress and the continuing commands use) and the migration's opened a FIFO there and
    hung (each failed this test after HANG_S with a JSON error, not "named pipe")."""
    from rpevit.analysis import common
    from rpevit.sweep import migrate

    folder = folder_with_rows(tmp_path / "s")
    (folder / SPACE_FILE).unlink()
    os.mkfifo(folder / SPACE_FILE)
    t0 = time.monotonic()
    with released_after(folder / SPACE_FILE, HANG_S):
        with pytest.raises(SystemExit, match=r"space.json: it is a named pipe.*delete the file to keep every row"):
            common.space_keys(folder)
        with pytest.raises(SystemExit, match="named pipe"):
            common.current_rows(pd.DataFrame({"trial_key": KEYS}), folder)
        assert migrate._read_space_file(folder) is None  # the runner rewrites it from the space right after
        assert results.space_key_scheme(folder) is None
    assert time.monotonic() - t0 < HANG_S


@pytest.mark.parametrize("name", ["STUDIES", "sub/rotinv_concentration.md"])
def test_a_fifo_as_a_text_file_the_report_reads_is_named_not_opened(tmp_path, name):
    """results/STUDIES (read by every script that reads a parent folder) and rotinv_concentration.md (copied
    into report.md) were opened with read_text: a FIFO of either name hung report.py (failed before)."""
    from rpevit.analysis import common, report

    fifo = tmp_path / name
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with released_after(fifo, HANG_S):
        with pytest.raises(SystemExit, match=f"^error: {re.escape(str(fifo))}: it is a named pipe") as caught:
            common.listed_studies(tmp_path) if name == "STUDIES" else report.rotinv_section(tmp_path)
    assert time.monotonic() - t0 < HANG_S and "allowed: " in str(caught.value) and "\n" not in str(caught.value)
    os.unlink(fifo)
    fifo.write_bytes(b"# \xff\n")  # not UTF-8: named too
    undecodable = f"^error: {re.escape(str(fifo))} cannot be read \\('utf-8' codec can't decode"
    with pytest.raises(SystemExit, match=undecodable):
        common.listed_studies(tmp_path) if name == "STUDIES" else report.rotinv_section(tmp_path)


@pytest.mark.parametrize("text, says", [
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"name": "s"}', "field 'trial_keys' has value 'None'"),
    ('{"trial_keys": ["a", 7]}', "field 'trial_keys' has value '[7]' among its items"),
    ('{"trial_keys": ', "cannot be read as a sweep's space.json (JSONDecodeError"),
    ("\udcff", "cannot be read as a sweep's space.json ("),
])
def test_the_space_json_reader_names_what_is_wrong_and_what_is_allowed(tmp_path, text, says):
    (tmp_path / SPACE_FILE).write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=re.escape(says)) as caught:
        results.read_space_file(tmp_path / TRIALS_FILE)  # a Parquet path means its folder
    assert str(tmp_path / SPACE_FILE) in str(caught.value) and "allowed: the JSON object sweep.py writes" in str(
        caught.value) and "\n" not in str(caught.value)
    assert results.space_key_scheme(tmp_path) is None and store._space_order(tmp_path) == {}


def test_a_fifo_as_a_compacted_file_or_space_json_is_never_opened(tmp_path):
    folder = folder_with_rows(tmp_path / "s", compacted=False)
    (folder / SPACE_FILE).unlink()
    os.mkfifo(folder / SPACE_FILE)
    t0 = time.monotonic()
    with released_after(folder / SPACE_FILE, HANG_S):
        with pytest.raises(ValueError, match="space.json: it is a named pipe"):
            current_keys(folder)  # the analysis's reader of space.json
        done = store.compact(folder)  # space.json orders the rows: a FIFO orders none
        assert [c.rows for c in done] == [40, 20]
    os.unlink(folder / SPACE_FILE)
    os.rename(folder / TRIALS_FILE, tmp_path / "kept.parquet")
    os.mkfifo(folder / TRIALS_FILE)
    with released_after(folder / TRIALS_FILE, HANG_S):
        assert store.compacted_through(folder / TRIALS_FILE) == 0
        with pytest.raises(DamagedResults, match=f"{folder / TRIALS_FILE} cannot be read .* named pipe"):
            store.read_table(folder / TRIALS_FILE)
    assert time.monotonic() - t0 < 2 * HANG_S


def _run(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """A command of this repository in its own process, killed after `timeout` (a hang fails the test)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


@pytest.mark.slow
def test_the_commands_answer_a_fifo_in_parts_in_one_line(tmp_path):
    """report.py, the snapshot and the compact tool, each a process: one `error:` line naming the FIFO."""
    folder = folder_with_rows(tmp_path / "s")
    fifo = fifo_part(folder)
    for args in (["analysis/report.py", str(folder)], ["-m", "rpevit.sweep.snapshot", str(folder), str(tmp_path / "c")],
                 ["-m", "rpevit.sweep.compact", str(folder)]):
        done = _run(args)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert done.returncode != 0 and "Traceback" not in done.stderr, (args, done.stderr)
        assert lines[-1].startswith(f"error: {fifo} cannot be read") and "named pipe (FIFO)" in lines[-1], (args, lines)
        assert os.path.lexists(fifo)  # only a driver sets it aside


DRIVER = """
import json, sys
from pathlib import Path
from rpevit.sweep import session
from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep.space import expand_space

class Launched(Exception):
    pass

def no_ray(*args, **kwargs):
    raise Launched

session.ray_session = no_ray  # stop where Ray would start: what is done has been decided by then
space = expand_space(json.loads(sys.argv[2]), source="s.yaml")
try:
    print("exit", run_sweep(space, SweepOptions(results_dir=Path(sys.argv[1]), resume=True)))
except Launched:
    print("launched")
"""


def driver_folder(root: Path) -> tuple[dict, Path, list[str]]:
    """A finished two-trial sweep of `TINY` (rows compacted), as the driver would resume it."""
    from rpevit.sweep.space import expand_space

    spec = {"name": "s", "fixed": TINY, "grid": {"pe": ["ape", "rope"]}}
    space = expand_space(spec, source="s.yaml")
    folder = root / "s"
    log = store.PartLog(folder)
    sequence = log.next_sequence()
    log.append(EPOCHS_FILE, to_table(epoch_rows(space.keys), epochs_schema("train")), sequence)
    rows = [{**row, **config} for row, config in zip(trial_rows(space.keys), space.trials)]
    log.append(TRIALS_FILE, to_table(rows, trials_schema("train")), sequence)
    store.compact(folder, {k: i for i, k in enumerate(space.keys)}, "train")
    return spec, folder, space.keys


@pytest.mark.slow
def test_the_driver_sets_a_fifo_in_parts_aside_instead_of_waiting_under_its_lock(tmp_path):
    spec, folder, keys = driver_folder(tmp_path)
    fifo = fifo_part(folder)
    done = _run(["-c", DRIVER, str(tmp_path), json.dumps(spec)])
    assert done.returncode == 0 and "exit 0" in done.stdout, (done.stdout, done.stderr)
    assert "2 trials, 2 already done, 0 to run" in done.stdout
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and str(fifo) in warnings[0] and "named pipe" in warnings[0], done.stderr
    assert not os.path.lexists(fifo) and len(list((folder / store.PARTS_DIR).glob(fifo.name + ".damaged-*"))) == 1


# ---- item 7: a part's cost in memory is bounded before its rows are decoded
@pytest.mark.parametrize("store_schema", [True, False], ids=["declared a dictionary", "declared text"])
def test_a_part_that_would_balloon_in_memory_is_refused_before_its_rows_are_decoded(tmp_path, store_schema):
    folder = tmp_path / "s"
    folder.mkdir()
    # one 1 MiB text repeated: stored once in the part's dictionary, 300 MiB once each row holds it
    rows = 300
    value = pa.array(["x" * 2**20])
    table = _replaced(to_table(trial_rows(KEYS[:1]) * rows, trials_schema("train")), "error",
                      pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), value))
    path = planted_part(folder, TRIALS_FILE)
    pq.write_table(table, path, compression="zstd", store_schema=store_schema)
    assert path.stat().st_size * 1024 < rows * 2**20 and rows * 2**20 > MAX_READ_BYTES
    with pytest.raises(DamagedResults, match=r"its 300 rows would take at least 30\d MiB in memory, from [\d,]+ "
                                             r"bytes on disk; allowed: at most 256 MiB"):
        read_results_table(path, kind=TRIALS_FILE)
    # many rows of one value: the footer alone says what they would take
    rows = 20_000_000
    zeros = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int8)), pa.array([0], pa.int64()))
    keys = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int8)), pa.array([KEYS[0]]))
    path = planted_part(folder, EPOCHS_FILE)
    pq.write_table(pa.table({"trial_key": keys, "epoch": zeros}), path, compression="zstd", store_schema=store_schema)
    del zeros, keys
    assert path.stat().st_size < 2**20
    with pytest.raises(DamagedResults, match="its 20,000,000 rows would take at least"):
        read_results_table(path, kind=EPOCHS_FILE)


def test_a_large_file_a_sweep_writes_is_read(tmp_path):
    """The bound leaves room: 10^5 trial rows replicated from a committed study (the most compressible
    file a sweep writes: 133x its size in memory) read as pyarrow reads them."""
    study = pq.read_table(REPO / "results" / "mnist_converged_cpu" / TRIALS_FILE)
    n = 100_000
    table = study.take(pa.array(np.arange(n) % study.num_rows))
    table = _replaced(table, "trial_key", pa.array([f"{i:016x}" for i in range(n)]))
    path = tmp_path / TRIALS_FILE
    pq.write_table(table, path)
    assert_same(read_results_table(path), pq.read_table(path, use_pandas_metadata=True))


# ---- item 7: a snapshot into a finished sweep's own folder, or into another study's copy
def test_a_snapshot_into_a_sweeps_own_folder_or_another_studys_copy_is_refused(tmp_path, capsys):
    source = folder_with_rows(tmp_path / "running", compacted=False)
    finished = folder_with_rows(tmp_path / "finished")  # a finished sweep: no parts/, its lock file stays
    (finished / LOCK_FILE).write_text("123\n")
    (finished / DECLARATION_FILE).write_text('{"question": "theirs"}')
    (finished / SPACE_FILE).write_text(json.dumps({"name": "finished", "trial_keys": KEYS}))
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "trials").mkdir(parents=True)
    other = tmp_path / "other_copy"  # an earlier copy of another study
    other.mkdir()
    (other / SPACE_FILE).write_text(json.dumps({"name": "other", "trial_keys": []}))
    declared = tmp_path / "declared"  # a copy holding a declaration the sweep does not have
    declared.mkdir()
    (declared / DECLARATION_FILE).write_text('{"question": "another"}')
    cases = [(finished, f"holds {LOCK_FILE}, so it is a sweep's own folder"),
             (checkpoints, "holds trials/, so it is a sweep's own folder"),
             (other, "holds a copy of sweep 'other', and"),
             (declared, f"{declared / DECLARATION_FILE} is not {source}'s")]
    for dest, words in cases:
        files = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        assert snapshot_cli.main([str(source), str(dest)]) == 2, dest
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, (dest, err)
        assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == files  # nothing written
    again = tmp_path / "copy"
    assert snapshot_cli.main([str(source), str(again)]) == 0 and snapshot_cli.main([str(source), str(again)]) == 0
    assert pq.read_table(again / TRIALS_FILE).num_rows == 20  # an earlier copy of the same sweep is refreshed


# ---- item 7: the temp files a killed driver left go even when --resume has nothing to run
def test_resume_with_nothing_to_run_removes_the_temp_files_a_killed_driver_left(tmp_path, monkeypatch, capsys):
    from rpevit.sweep.runner import SweepOptions, run_sweep
    from rpevit.sweep.space import expand_space

    def no_ray(*_args, **_kwargs):
        raise AssertionError("nothing to run: Ray must not start")

    monkeypatch.setattr(session, "ray_session", no_ray)
    spec, folder, keys = driver_folder(tmp_path)
    dead = 2**22 + 12345  # above pid_max's default: no live process has it
    stale = [folder / f".{TRIALS_FILE}.{dead}.tmp", folder / f".{SPACE_FILE}.{dead}.tmp",
             folder / f".{DECLARATION_FILE}.{dead}.tmp",
             folder / store.PARTS_DIR / f".trials-L0-0000000000000001-0000000000000001.parquet.{dead}.tmp"]
    (folder / store.PARTS_DIR).mkdir()
    for path in stale:
        path.write_bytes(b"torn")
    alive = folder / f".{TRIALS_FILE}.{os.getppid()}.tmp"  # a live process's: kept
    alive.write_bytes(b"being written")
    assert run_sweep(expand_space(spec, source="s.yaml"), SweepOptions(results_dir=tmp_path, resume=True)) == 0
    assert "2 trials, 2 already done, 0 to run" in capsys.readouterr().out
    assert [p for p in stale if os.path.lexists(p)] == [] and alive.exists()
    assert DECLARATION_NAME == DECLARATION_FILE


# ---- item 7: exclude entries are looked up, not matched pair by pair
def test_2000_exclude_entries_over_10000_trials_take_a_second_not_a_minute():
    from rpevit.sweep import space as sweep_space

    lrs = [round(1e-4 * (i + 1), 6) for i in range(100)]
    spec = {"name": "ex", "fixed": {"dataset": "digits", "epochs": 1}, "grid": {"lr": lrs, "seed": list(range(100))},
            "exclude": [{"lr": lrs[i % 100], "seed": (i * 7) % 100} for i in range(2000)]}
    parts = sweep_space._read_spec(spec, "ex.yaml", "ex")
    t0 = time.perf_counter()
    values = sweep_space._value_sets(parts, "ex.yaml")
    took = time.perf_counter() - t0
    excluded = {(e["lr"], e["seed"]) for e in spec["exclude"]}
    assert len(values) == 10_000 - len(excluded) and not any((v["lr"], v["seed"]) in excluded for v in values)
    assert took < 15, took  # pair by pair: about 250 s on the 2-core machine (53 s on the adversary's)


def test_indexed_exclusion_equals_matching_each_trial_against_each_entry():
    from rpevit.sweep import space as sweep_space
    from rpevit.sweep.space import SpaceError

    rng = random.Random(5)
    pool = {"lr": [1, 1.0, 0.5, 2], "seed": [0, 1, 2, True], "pe": ["ape", "rope", ["rope"]],  # a list: unhashable
            "qk_norm": [True, False, 1]}
    for _ in range(300):
        trials = [{k: rng.choice(v) for k, v in pool.items() if rng.random() < 0.8} for _ in range(rng.randint(1, 12))]
        exclude = [{k: rng.choice(pool[k]) for k in rng.sample(sorted(pool), rng.randint(1, 3))}
                   for _ in range(rng.randint(1, 5))]
        full = [{**sweep_space._DEFAULTS, **t} for t in trials]
        unmatched = [e for e in exclude if not any(all(f[k] == v for k, v in e.items()) for f in full)]
        try:
            kept = sweep_space._without_excluded(trials, exclude, "x.yaml")
        except SpaceError as err:
            assert unmatched and f"exclude entry {unmatched[0]} matches no trial" in str(err)
            continue
        assert not unmatched
        assert kept == [t for t, f in zip(trials, full) if not any(all(f[k] == v for k, v in e.items())
                                                                    for e in exclude)]
