"""rpevit/sweep/store.py: the append-only results store (issue 42). The union a reader sees holds every
row once by the documented rules; tiered merges and compaction keep rows; compaction is idempotent;
a kill before any file operation of a flush, a merge or a compaction loses or repeats no row; links
under parts/ are refused; the committed studies read identically through the store; the columnar
to_table equals the value-by-value conversion it replaced."""
from __future__ import annotations

import datetime as dt
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rpevit.sweep import compact as compact_cli
from rpevit.sweep import store
from rpevit.sweep.lock import refuse_links
from rpevit.sweep.results import (BOOL, EPOCHS_FILE, F64, F64_LIST, I64, STR, TIMESTAMP, TRIALS_FILE, DamagedResults,
                                  arrow_column, coerce_value, epochs_schema, read_results_table, remove_stale_temps,
                                  to_table, trials_schema, write_table_atomic)
from rpevit.sweep.space import SpaceError

REPO = Path(__file__).resolve().parent.parent
KEYS = [f"{i:016x}" for i in range(1, 7)]  # trial keys of the form sweep.py makes


# ---- a scripted sweep: each flush holds epoch rows and trial rows, with repeats of earlier keys
def flushes() -> list[dict[str, list[dict]]]:
    """Rows of 9 flushes. Every row has a unique id (train_loss / test_acc), so which row a reader
    chose is visible. Repeats: epochs reported again (a resumed trial), a failed row after an ok one
    (must not hide it), an ok row after a failed one, and failed twice (the later wins)."""
    out, ident = [], iter(range(1, 10_000))
    for i in range(9):
        key = KEYS[i % len(KEYS)]
        epochs = [{"trial_key": key, "epoch": e, "train_loss": float(next(ident))} for e in range(2)]
        status = "failed" if i in (0, 3, 6, 7) else "ok"
        trials = [{"trial_key": key, "status": status, "test_acc": float(next(ident))}]
        if i == 8:  # a late failed row of KEYS[2], which finished ok in flush 2
            trials.append({"trial_key": KEYS[2], "status": "failed", "test_acc": float(next(ident))})
        out.append({EPOCHS_FILE: epochs, TRIALS_FILE: trials})
    return out


def brute(batches: list[dict[str, list[dict]]], kind: str) -> list[tuple]:
    """The rows a reader must see after `batches`, by the documented rules, one per key, plainly."""
    chosen: dict = {}
    for batch in batches:
        for row in batch[kind]:
            if kind == EPOCHS_FILE:
                chosen[(row["trial_key"], row["epoch"])] = row["train_loss"]
            else:
                old = chosen.get(row["trial_key"])
                if old is None or row["status"] == "ok" or old[0] != "ok":
                    chosen[row["trial_key"]] = (row["status"], row["test_acc"])
    if kind == EPOCHS_FILE:
        return [(k, e, v) for (k, e), v in chosen.items()]
    return [(k, s, v) for k, (s, v) in chosen.items()]


def seen(folder: Path, kind: str) -> list[tuple]:
    """The rows store.read_table gives, as brute() lists them (in the reader's order)."""
    table = store.read_table(folder / kind)
    if table is None:
        return []
    if kind == EPOCHS_FILE:
        return list(zip(*(table.column(c).to_pylist() for c in ("trial_key", "epoch", "train_loss"))))
    return list(zip(*(table.column(c).to_pylist() for c in ("trial_key", "status", "test_acc"))))


def schema(kind: str) -> pa.Schema:
    return trials_schema("train") if kind == TRIALS_FILE else epochs_schema("train")


def append(log: store.PartLog, batch: dict[str, list[dict]]) -> None:
    """One driver flush, as ParquetResults._append does it."""
    sequence = log.next_sequence()
    for kind in store.KINDS:
        log.append(kind, to_table(batch[kind], schema(kind)), sequence)
        log.merge_tail(kind)


@pytest.fixture
def fanin_2(monkeypatch):
    """Merges every 2 parts of a level: a few flushes reach level 3."""
    monkeypatch.setattr(store, "MERGE_FANIN", 2)


# ---- the union and its rules
def test_the_union_holds_each_key_once_by_the_documented_rules_in_first_appearance_order(tmp_path):
    log, batches = store.PartLog(tmp_path), flushes()
    for batch in batches:
        append(log, batch)
    assert seen(tmp_path, EPOCHS_FILE) == brute(batches, EPOCHS_FILE)  # in order, too: first appearance
    assert seen(tmp_path, TRIALS_FILE) == brute(batches, TRIALS_FILE)
    trials = dict((k, (s, v)) for k, s, v in seen(tmp_path, TRIALS_FILE))
    assert trials[KEYS[2]][0] == "ok"  # the late failed row did not hide the finished one
    assert trials[KEYS[1]] == ("ok", batches[1][TRIALS_FILE][0]["test_acc"])  # a later failed row did not either
    assert trials[KEYS[0]] == ("failed", batches[6][TRIALS_FILE][0]["test_acc"])  # failed twice: the later row


def test_deduplicated_picks_rows_as_a_plain_loop_does_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        keys = [KEYS[int(k)] if k < len(KEYS) else None for k in rng.integers(0, len(KEYS) + 1, n)]
        status = [["ok", "failed", None][int(s)] for s in rng.integers(0, 3, n)]
        epoch = [int(e) if e < 4 else None for e in rng.integers(0, 5, n)]
        ids = list(range(n))
        trials = store.deduplicated(pa.table({"trial_key": keys, "status": status, "id": ids}), TRIALS_FILE)
        chosen: dict = {}
        for k, s, i in zip(keys, status, ids):
            if k not in chosen or s == "ok" or status[chosen[k]] != "ok":
                chosen[k] = i
        assert trials.column("id").to_pylist() == list(chosen.values())
        epochs = store.deduplicated(pa.table({"trial_key": keys, "epoch": epoch, "id": ids}), EPOCHS_FILE)
        latest: dict = {}
        for k, e, i in zip(keys, epoch, ids):
            latest[(k, e)] = i
        assert epochs.column("id").to_pylist() == list(latest.values())


@pytest.mark.slow
def test_tiered_merges_keep_every_row_and_bound_the_parts(tmp_path, fanin_2):
    log, batches = store.PartLog(tmp_path), flushes() + flushes()[:7]  # 16 flushes: one level-4 part per kind
    for i, batch in enumerate(batches, 1):
        append(log, batch)
        for kind in store.KINDS:
            assert seen(tmp_path, kind) == brute(batches[:i], kind), (i, kind)
            live = store.live_parts(store.listed_parts(tmp_path, kind), 0)
            assert len(live) == bin(i).count("1")  # a binary counter: one part per set bit
    assert [p.level for p in store.listed_parts(tmp_path, TRIALS_FILE)] == [4]


def test_compaction_keeps_every_row_removes_the_parts_and_is_idempotent(tmp_path, fanin_2):
    log, batches = store.PartLog(tmp_path), flushes()
    for batch in batches[:5]:
        append(log, batch)
    done = store.compact(tmp_path)
    assert [(c.kind, c.rows) for c in done] == [(EPOCHS_FILE, 10), (TRIALS_FILE, 5)]
    assert not (tmp_path / store.PARTS_DIR).exists()
    files = {kind: (tmp_path / kind).read_bytes() for kind in store.KINDS}
    for kind in store.KINDS:
        assert sorted(seen(tmp_path, kind)) == sorted(brute(batches[:5], kind))
        assert pq.read_schema(tmp_path / kind).remove_metadata().equals(schema(kind))
    assert [c.rows for c in store.compact(tmp_path)] == [None, None]  # nothing new: nothing rewritten
    assert {kind: (tmp_path / kind).read_bytes() for kind in store.KINDS} == files
    log = store.PartLog(tmp_path)  # the next run appends after the compacted file
    for batch in batches[5:]:
        append(log, batch)
    for kind in store.KINDS:
        assert sorted(seen(tmp_path, kind)) == sorted(brute(batches, kind))
    store.compact(tmp_path)
    for kind in store.KINDS:
        assert sorted(seen(tmp_path, kind)) == sorted(brute(batches, kind))
        assert sorted(seen(tmp_path, kind)) == sorted(_plain(tmp_path / kind, kind))  # the file alone holds them


def _plain(path: Path, kind: str) -> list[tuple]:
    table = pq.read_table(path)
    names = ("trial_key", "epoch", "train_loss") if kind == EPOCHS_FILE else ("trial_key", "status", "test_acc")
    return list(zip(*(table.column(c).to_pylist() for c in names)))


def test_compaction_orders_rows_by_the_space_and_renumbers_trial_index(tmp_path):
    log, batches = store.PartLog(tmp_path), flushes()
    for batch in batches:
        append(log, batch)
    order = {k: i for i, k in enumerate(reversed(KEYS))}
    store.compact(tmp_path, order, "train")
    trials = pq.read_table(tmp_path / TRIALS_FILE)
    assert trials.column("trial_key").to_pylist() == list(reversed(KEYS))
    assert trials.column("trial_index").to_pylist() == list(range(len(KEYS)))
    epochs = pq.read_table(tmp_path / EPOCHS_FILE)
    expected = sorted(((order[k], e) for k, e, _ in brute(batches, EPOCHS_FILE)))
    assert [(order[k], e) for k, e in zip(epochs.column("trial_key").to_pylist(),
                                          epochs.column("epoch").to_pylist())] == expected


# ---- a kill at any moment: before each file operation of flushes, merges and a compaction
class Killed(BaseException):
    """The process dies here (no except clause of the code under test catches it)."""


class KillAt:
    """Lets `at` file operations (os.replace: a file appears or is replaced; os.unlink: one goes) happen,
    then kills the process before the next; once killed, no further operation reaches the folder
    (a temp file of the interrupted write may go: nobody reads temp files)."""

    def __init__(self, monkeypatch, at: int) -> None:
        self.at, self.count, self.killed = at, 0, False
        self.real_replace, self.real_unlink = os.replace, os.unlink
        monkeypatch.setattr(os, "replace", self.replace)
        monkeypatch.setattr(os, "unlink", self.unlink)

    def _step(self, path) -> None:
        if self.killed or self.count == self.at:
            if not (self.killed and Path(path).name.startswith(".")):
                self.killed = True
                raise Killed(path)
        self.count += 1

    def replace(self, source, target, **kwargs):
        self._step(target)
        return self.real_replace(source, target, **kwargs)

    def unlink(self, path, **kwargs):
        if self.killed and Path(path).name.startswith("."):
            return self.real_unlink(path, **kwargs)
        self._step(path)
        return self.real_unlink(path, **kwargs)


def run_sweep_steps(folder: Path, batches, acked: list[int]) -> None:
    """Flushes (with merges), a compaction at the middle (as a Tuner run's end), more flushes, a final
    compaction; acked[0] counts the flushes whose rows were written (both kinds)."""
    log = store.PartLog(folder)
    for i, batch in enumerate(batches):
        if i == 4:
            store.compact(folder)
            log = store.PartLog(folder)
        append(log, batch)
        acked[0] += 1
    store.compact(folder)


def check_exactly_once(folder: Path, batches, acked: int) -> None:
    """Each kind reads as the rows of its first m flushes (by the rules), m >= the acknowledged
    flushes; trial rows never ahead of epoch rows (epochs are written first)."""
    done = {}
    for kind in store.KINDS:
        got = sorted(seen(folder, kind))
        found = [m for m in range(acked, len(batches) + 1) if got == sorted(brute(batches[:m], kind))]
        assert found, (kind, acked, got)
        done[kind] = found
    assert min(done[TRIALS_FILE]) <= max(done[EPOCHS_FILE])


@pytest.mark.slow
def test_a_kill_before_any_file_operation_loses_or_repeats_no_row(tmp_path, monkeypatch, fanin_2):
    batches = flushes()
    clean = tmp_path / "clean"
    with monkeypatch.context() as m:
        counter = KillAt(m, at=10**9)
        run_sweep_steps(clean, batches, [0])
    total = counter.count
    assert total > 40  # flushes, merges at three levels, two compactions
    for at in range(total):
        folder = tmp_path / f"kill{at}"
        acked = [0]
        with monkeypatch.context() as m:
            KillAt(m, at)
            with pytest.raises(Killed):
                run_sweep_steps(folder, batches, acked)
        check_exactly_once(folder, batches, acked[0])
        log = store.PartLog(folder)  # the next driver: appends after what is there, then compacts
        for batch in batches[acked[0]:]:
            append(log, batch)
        store.compact(folder)
        for kind in store.KINDS:
            assert sorted(seen(folder, kind)) == sorted(brute(batches, kind)), (at, kind)
            assert sorted(_plain(folder / kind, kind)) == sorted(brute(batches, kind)), (at, kind)
        assert not (folder / store.PARTS_DIR).exists() or not [p for p in (folder / store.PARTS_DIR).iterdir()
                                                                  if not p.name.startswith(".")], at


def test_a_reader_reads_again_when_a_compaction_removes_the_parts_it_listed(tmp_path, monkeypatch):
    log, batches = store.PartLog(tmp_path), flushes()
    for batch in batches:
        append(log, batch)
    real, calls = store.read_results_table, []

    def compaction_right_after(path, *args, **kwargs):  # the driver compacts between the reader's two reads
        table = real(path, *args, **kwargs)
        calls.append(Path(path).name)
        if len(calls) == 1:
            store.compact(tmp_path)
        return table

    monkeypatch.setattr(store, "read_results_table", compaction_right_after)
    assert seen(tmp_path, TRIALS_FILE) == brute(batches, TRIALS_FILE)  # read again: the compacted file (there
    # was none when it was first read, and the parts listed then are gone: without reading again, no rows)
    assert calls[0] == TRIALS_FILE and not (tmp_path / store.PARTS_DIR).exists()  # the parts it listed went


def test_a_file_replaced_while_it_is_read_is_read_whole_as_it_was_opened(tmp_path, monkeypatch):
    """A reader opens a compacted file once for its footer and its pages: pq.read_table(path) opened the path
    twice, and a compaction replacing the file between the two opens gave a torn read (DamagedResults,
    "Page was smaller than expected"; seen beside a real writer in tests/test_sweep_snapshot.py). Here the
    file is replaced right after the reader opened it: the reader reads what it opened, whole."""
    path = tmp_path / TRIALS_FILE
    rows = brute(flushes(), TRIALS_FILE)
    first = to_table([{"trial_key": k, "status": s, "test_acc": v} for k, s, v in rows], schema(TRIALS_FILE))
    later = to_table([{"trial_key": KEYS[0], "status": "ok", "test_acc": 0.5}], schema(TRIALS_FILE))
    write_table_atomic(first, path)
    real, opened = os.open, []  # the reader's one open (results.open_regular: a regular file only, issue 59)

    def replaced_once_opened(where, *args, **kwargs):
        handle = real(where, *args, **kwargs)
        if Path(where) == path and not opened:
            opened.append(where)
            write_table_atomic(later, path)  # a compaction replaces the file now
        return handle

    monkeypatch.setattr(os, "open", replaced_once_opened)
    for columns in (None, ["trial_key", "status", "test_acc"]):
        opened.clear()
        write_table_atomic(first, path)
        table = read_results_table(path, columns=columns)
        assert opened and table.column("test_acc").to_pylist() == [v for _, _, v in rows], columns
    assert read_results_table(path).num_rows == 1  # the file that replaced it, on the next read


def test_the_temp_file_of_a_part_a_killed_driver_was_writing_is_removed_by_the_next(tmp_path):
    """A driver killed inside a part's write leaves `.<part>.<pid>.tmp`; the next driver removes it when
    that pid is dead (here: our own pid, whose writes have all ended) and keeps a live writer's. (The
    pattern once captured the part name's own groups, so the pid was read from the wrong one: ValueError,
    and every --resume of such a folder stopped.)"""
    parts = tmp_path / store.PARTS_DIR
    parts.mkdir()
    name = "epochs-L0-0000000000000001-0000000000000001.parquet"
    dead, alive = parts / f".{name}.{os.getpid()}.tmp", parts / f".{name}.{os.getppid()}.tmp"
    dead.write_bytes(b"torn")
    alive.write_bytes(b"being written")
    assert remove_stale_temps(parts, store.PART_TEMPS) == [dead]
    assert not dead.exists() and alive.exists()


def test_a_damaged_part_is_named_and_the_driver_sets_it_aside(tmp_path, capsys):
    log, batches = store.PartLog(tmp_path), flushes()
    for batch in batches[:3]:
        append(log, batch)
    bad = store.listed_parts(tmp_path, TRIALS_FILE)[1]
    bad.path.write_bytes(b"not parquet")
    with pytest.raises(DamagedResults, match=bad.path.name):
        store.read_table(tmp_path / TRIALS_FILE)
    table, damaged = store.driver_table(tmp_path / TRIALS_FILE, "its trials run again")
    assert [t.name.startswith(bad.path.name + ".damaged-") for _, t in damaged] == [True]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and bad.path.name in err and "its trials run again" in err
    assert sorted(table.column("trial_key").to_pylist()) == sorted({KEYS[0], KEYS[2]})  # the other parts' rows


# ---- links
def test_links_under_parts_or_at_parts_are_refused(tmp_path):
    log = store.PartLog(tmp_path)
    append(log, flushes()[0])
    victim = tmp_path / "victim.parquet"
    victim.write_bytes(b"precious")
    link = tmp_path / store.PARTS_DIR / "trials-L0-0000000000000001-0000000000000001.parquet"
    link.symlink_to(victim)
    with pytest.raises(SpaceError, match="parts/trials-L0-0000000000000001"):
        refuse_links(tmp_path)
    link.unlink()
    refuse_links(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / store.PARTS_DIR).symlink_to(tmp_path / store.PARTS_DIR)
    with pytest.raises(SpaceError, match="parts ->"):
        refuse_links(other)
    assert victim.read_bytes() == b"precious"


def test_compact_command_compacts_a_folder_in_one_line(tmp_path, capsys):
    folder = tmp_path / "s"
    log = store.PartLog(folder)
    for batch in flushes()[:3]:
        append(log, batch)
    assert compact_cli.main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert out == f"{folder}: compacted ({EPOCHS_FILE}: 3 part(s) into 6 row(s); {TRIALS_FILE}: 3 part(s) into 3 row(s))\n"
    assert not (folder / store.PARTS_DIR).exists()
    with pytest.raises(SystemExit):
        compact_cli.main([str(tmp_path / "empty")])
    assert "holds no trials.parquet" in capsys.readouterr().err


# ---- the committed studies read identically through the store
def committed_files() -> list[Path]:
    return sorted((REPO / "results").glob("**/*.parquet"))


@pytest.mark.parametrize("path", committed_files(), ids=lambda p: str(p.relative_to(REPO / "results")))
def test_committed_studies_read_identically_through_the_store(path):
    plain = pq.read_table(path, use_pandas_metadata=True)
    through = store.read_table(path)
    assert through.schema.equals(plain.schema, check_metadata=True)
    pd.testing.assert_frame_equal(through.to_pandas(), plain.to_pandas())  # NaN equal to NaN
    assert store.read_frame(path.parent, path.name).equals(plain.to_pandas())


# ---- to_table column by column equals the value-by-value conversion
ODD_VALUES = [None, math.nan, math.inf, -math.inf, 0, 1, -1, 2**53 + 1, 2**63 - 1, 2**63, -2**70, True, False,
              0.5, -0.5, 1e300, 1.7e9 + 0.1234565, 1.7e9 + 0.9999996, -1.5e-7, -0.0000005, 1e12, 3e11, -7e10,
              np.int32(3), np.int64(-4), np.uint32(5), np.uint64(2**63 + 5), np.float32(0.1), np.float64(2.5),
              np.bool_(True), "text", "", b"bytes", [1.0, 2], (3, np.float32(4.5)), [True], np.array([1.0, 2.0]),
              np.array([1, 2]), np.array([[1.0]]), np.array(["a"]), dt.datetime(2024, 1, 2, 3, 4, 5, 6),
              dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc), pd.Timestamp("2024-05-06 07:08:09.123456"), {"a": 1},
              pd.NaT]


def _converted(values, kind):
    try:
        return pa.array([coerce_value(v, kind) for v in values], type=kind)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as err:
        return type(err)


def test_arrow_columns_equal_the_value_by_value_conversion_on_odd_values():
    rng = np.random.default_rng(1)
    kinds = (F64, I64, STR, BOOL, TIMESTAMP, F64_LIST)
    tried = 0
    for kind in kinds:
        homogeneous = [[v] * 3 for v in ODD_VALUES]
        mixes = [[ODD_VALUES[int(i)] for i in rng.integers(0, len(ODD_VALUES), int(rng.integers(1, 6)))]
                 for _ in range(300)]
        for values in homogeneous + mixes + [[]]:
            expected = _converted(values, kind)
            if isinstance(expected, type):
                with pytest.raises(expected):
                    arrow_column(values, kind)
                continue
            got = arrow_column(values, kind)
            assert _same_with_nan(got, expected), (kind, values, got, expected)
            tried += 1
    assert tried > 1000


def test_arrow_timestamps_round_unix_seconds_as_datetime_does():
    rng = np.random.default_rng(2)
    seconds = np.concatenate([rng.uniform(-3e9, 4e9, 3000), np.round(rng.uniform(0, 2e9, 1000), 6),
                              rng.integers(0, 2**31, 500) + 0.5e-6, -(rng.integers(0, 2**31, 500) + 0.5e-6)])
    values = [float(s) for s in seconds]
    assert arrow_column(values, TIMESTAMP).to_pylist() == \
        [dt.datetime.fromtimestamp(v, tz=dt.timezone.utc) for v in values]


def _same_with_nan(got: pa.Array, expected: pa.Array) -> bool:
    def norm(values):
        return [("nan",) if isinstance(v, float) and math.isnan(v) else
                [("nan",) if isinstance(x, float) and math.isnan(x) else x for x in v] if isinstance(v, list) else v
                for v in values]
    return got.type == expected.type and norm(got.to_pylist()) == norm(expected.to_pylist())


def test_rows_an_older_writer_typed_otherwise_meet_new_rows_in_the_new_types():
    """A compacted file from before timestamps were typed (started_at as float seconds) and a new part
    (timestamp) cannot be concatenated as they are: the older table is brought to the newest table's types
    value by value (results.to_table), and its times keep their instants."""
    from rpevit.sweep.results import trials_schema

    stamp = trials_schema("train").field("started_at").type
    old = pa.table({"trial_key": ["a"], "status": ["ok"], "started_at": pa.array([1767225600.0])})
    new = pa.table({"trial_key": ["b"], "status": ["ok"],
                    "started_at": pa.array([dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc)], stamp)})
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)):
        pa.concat_tables([old, new], promote_options="permissive")  # what the fallback is for
    both = store.union([old, new], "trials.parquet")
    assert both.schema.field("started_at").type == stamp and both.column("trial_key").to_pylist() == ["a", "b"]
    assert [t.timestamp() for t in both.column("started_at").to_pylist()] == [1767225600.0, 1767225601.0]
