"""The append-only results store of a sweep folder: how trials.parquet and epochs.parquet grow
during a sweep without being rewritten, and how they are read.

Layout (plain files and atomic renames only, so a folder on shared storage of a cluster works):

    FOLDER/trials.parquet, FOLDER/epochs.parquet    the compacted files: every row, once
    FOLDER/parts/trials-L0-<first>-<last>.parquet    rows written since, one part per driver flush
    FOLDER/parts/epochs-L1-<first>-<last>.parquet    ... or F parts merged into one (level + 1)

Each flush of the driver (rpevit.sweep.writer) writes only its new rows, as one part per file
kind: Arrow tables of the task's schema (rpevit.sweep.results.to_table), epochs before trials.
A part covers a range of flush sequence numbers `[first, last]` (one number for a flush; numbers
increase, and are at least the flush's time in microseconds, so a compacted file restored from a
backup never hides a later part). Whenever the newest MERGE_FANIN parts of a kind share a level,
they are merged into one part of the next level (a tiered merge: each row is rewritten about
log_F(flushes) times, so a flush costs the same at 10^3 and at 10^6 rows, and a folder never holds
more than about F x log_F(flushes) parts).

Reading (`read_table`, `read_frame`, `read_rows`): the compacted file, then the live parts in
sequence order, deduplicated by key:

- epoch rows by (trial_key, epoch): the latest row wins;
- trial rows by trial_key: the latest `ok` row, else the latest row (a failed row never hides a
  finished one, as rpevit.sweep.migrate.preferred_rows rules);
- rows keep the place where their key first appeared.

A part is live unless the compacted file already holds it (its `last` is at most the sequence the
compacted file records in its Parquet metadata, THROUGH_KEY) or a merged part holds it (its range
lies inside another part's). Both rules are idempotent: reading a row twice gives the same union.

Compaction (`compact`: the driver at the end of each Tuner run and when it starts on a folder a
killed driver left; `python -m rpevit.sweep.compact FOLDER` on request) writes the union into the
compacted file atomically, recording the last sequence it holds, and only then removes the parts
(oldest first). A merge writes the merged part before removing its sources. So a SIGKILL at any
moment leaves either the old files (the union unchanged) or the new file beside parts it already
holds (ignored): no row is lost or read twice, and the next driver (under the sweep lock) or
compaction removes what is left over. After a sweep the compacted files are the results (users'
scripts read them as before); during one, `read_frame(FOLDER)` is the reader that sees every row.

Readers never lock: a reader lists the parts before it opens the compacted file, and starts again
when a listed part has gone (a merge or compaction removed it meanwhile), READ_ATTEMPTS times.

Untrusted files (issue 59). Every file is read through rpevit.sweep.results.read_results_table, which
opens only regular files (a FIFO in parts/ once hung every reader and the driver under its lock), checks
the footer's types against the schema (a part whose trial_key was int64 once turned a compaction of 20
trials into 2) and bounds what the rows take in memory, before any row is read: such a file raises
DamagedResults naming it, which the driver answers by setting it aside whole (driver_table). A compaction
checks every file it would merge first (check_files), so it writes and removes nothing when one is bad;
where tables of one kind differ in type all the same, they are brought to the schema's types (_concat).
"""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rpevit.sweep.protocol import OK
from rpevit.sweep.results import (EPOCHS_FILE, TIMESTAMP, TRIALS_FILE, TRIALS_LOST,
                                  DamagedResults, arrow_bytes, arrow_column, check_key_column, declared_types,
                                  epochs_schema, frame_of, open_regular, read_results_table, read_space_file,
                                  remove_stale_temps, set_aside, temp_pattern, trials_schema, write_table_atomic)

PARTS_DIR = "parts"
KINDS = (EPOCHS_FILE, TRIALS_FILE)  # compaction and flush order: a trial's row lands after its epochs
THROUGH_KEY = b"rpevit.parts_through"  # compacted file metadata: the last part sequence it holds
MERGE_FANIN = 8  # parts of one level merged into one of the next
READ_ATTEMPTS = 20
_PART_NAME = r"(trials|epochs)-L(\d{1,2})-(\d{16})-(\d{16})\.parquet"  # kind, level, first, last
_PART = re.compile(_PART_NAME)
_PREFIX = {TRIALS_FILE: "trials", EPOCHS_FILE: "epochs"}
_KIND_OF_PREFIX = {prefix: name for name, prefix in _PREFIX.items()}


@dataclass(frozen=True)
class Part:
    """One part file: rows of `kind` (TRIALS_FILE / EPOCHS_FILE) of the flushes first..last."""
    kind: str
    level: int
    first: int
    last: int
    path: Path

    @classmethod
    def named(cls, folder: Path, kind: str, level: int, first: int, last: int) -> "Part":
        name = f"{_PREFIX[kind]}-L{level}-{first:016d}-{last:016d}.parquet"
        return cls(kind, level, first, last, Path(folder) / PARTS_DIR / name)


def listed_parts(folder: Path, kind: str) -> list[Part]:
    """Every part file of `kind` in the folder's parts/ (live or not), by sequence; other names are
    not ours and are left alone."""
    found = []
    try:
        with os.scandir(Path(folder) / PARTS_DIR) as entries:
            for entry in entries:
                match = _PART.fullmatch(entry.name)
                if match and _KIND_OF_PREFIX[match.group(1)] == kind:
                    found.append(Part(kind, int(match.group(2)), int(match.group(3)), int(match.group(4)),
                                      Path(entry.path)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found, key=lambda p: (p.first, -p.last))


def live_parts(parts: Sequence[Part], through: int) -> list[Part]:
    """The parts whose rows are in neither the compacted file (last <= through) nor a merged part
    (a range inside another's): ranges are nested or disjoint, so one pass by first, widest first."""
    live, reach = [], through
    for part in sorted(parts, key=lambda p: (p.first, -p.last)):
        if part.last > reach:
            live.append(part)
            reach = part.last
    return live


def parts_through(table: pa.Table | pa.Schema | None) -> int:
    """The last part sequence a compacted file holds (0: none recorded, e.g. a file of an older writer)."""
    schema = table.schema if isinstance(table, pa.Table) else table
    metadata = (schema.metadata or {}) if schema is not None else {}
    try:
        return int(metadata.get(THROUGH_KEY, b"0"))
    except ValueError:
        return 0


def compacted_through(path: Path) -> int:
    """parts_through of a compacted file, from its footer alone (0 where there is none or it cannot be read,
    or is no regular file: a FIFO there would block open(), issue 59 item 5)."""
    try:
        if not os.path.lexists(path):
            return 0
        with open_regular(path) as handle:
            data = arrow_bytes(handle)  # not the Python file: Arrow's threads would hold its chunks (arrow_bytes)
        with pq.ParquetFile(pa.BufferReader(data)) as file:
            return parts_through(file.schema_arrow)
    except (pa.ArrowException, OSError, ValueError):  # DamagedResults is a ValueError
        return 0


def holds_rows(folder: Path, kind: str = TRIALS_FILE) -> bool:
    """Whether the folder has a `kind` file or a part of that kind (a sweep that has written rows)."""
    return os.path.lexists(Path(folder) / kind) or bool(listed_parts(folder, kind))


# ---- reading: the union, deduplicated ----
def read_table(path: str | os.PathLike, columns: Sequence[str] | None = None) -> pa.Table | None:
    """Every row of a sweep's trials.parquet or epochs.parquet as the folder holds it now: the
    compacted file and the live parts, deduplicated (module docstring). `path` is the folder's
    trials.parquet / epochs.parquet (which may not exist yet while parts do). None where there is
    neither; DamagedResults naming the file where one cannot be read. `columns`: read only those
    (and the key columns)."""
    path = Path(path)
    folder, kind = path.parent, path.name
    wanted = None if columns is None else list(dict.fromkeys([*_key_columns(kind), *columns]))
    for _ in range(READ_ATTEMPTS):
        listed = listed_parts(folder, kind)  # before the compacted file: a compaction after this is seen
        compacted = read_results_table(path, columns=wanted)
        tables = [compacted] if compacted is not None else []
        try:
            for part in live_parts(listed, parts_through(compacted)):
                table = read_results_table(part.path, kind=kind, columns=wanted)
                if table is None:
                    raise FileNotFoundError(part.path)
                tables.append(table)
        except (DamagedResults, FileNotFoundError) as err:
            if os.path.lexists(getattr(err, "path", None) or err.args[0]):
                raise
            continue  # merged or compacted away since it was listed: read again
        return union(tables, kind) if tables else None
    raise DamagedResults(path, f"its parts kept changing while read, {READ_ATTEMPTS} times: try again")


def read_frame(folder: str | os.PathLike, kind: str = TRIALS_FILE) -> pd.DataFrame:
    """The documented reader of a sweep folder (or of its trials.parquet / epochs.parquet path), during
    a sweep and after one: every row once (read_table), as a pandas frame; empty where there is none.

        from rpevit.sweep.store import read_frame
        trials = read_frame("results/my_sweep")            # one row per trial
        epochs = read_frame("results/my_sweep", "epochs.parquet")
    """
    folder = Path(folder)
    path = folder if folder.suffix == ".parquet" else folder / kind
    table = read_table(path)
    return frame_of(table, path) if table is not None else pd.DataFrame()


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """read_table's rows as Arrow stores them (ints stay ints, timestamps datetimes), not via pandas
    floats; DamagedResults for a file that cannot be read."""
    table = read_table(path)
    return table.to_pylist() if table is not None else []


def _key_columns(kind: str) -> tuple[str, ...]:
    return ("trial_key", "status") if kind == TRIALS_FILE else ("trial_key", "epoch")


def union(tables: Sequence[pa.Table], kind: str) -> pa.Table:
    """The tables in order (oldest first) as one, deduplicated by `kind`'s key (`deduplicated`). One
    table without duplicates comes back as it is."""
    if len(tables) == 1:
        return deduplicated(tables[0], kind)
    return deduplicated(_concat(tables, kind), kind).replace_schema_metadata(None)


_CONCAT_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


def _concat(tables: Sequence[pa.Table], kind: str) -> pa.Table:
    """Tables of one kind as one: columns one lacks are null there. Where their types differ (an older
    writer's float seconds for times), each column the schema declares is brought to the schema's type
    (`_conformed`), never to the newest table's: a malformed newest part once gave every table its int64
    trial_key (every key null: 20 trials merged into 2) and its types of started_at (nulled) and epoch
    (text). read_results_table refuses such a part before it gets here (check_schema); this is the second
    guard. A column no schema declares that tables typed differently is kept as text."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except _CONCAT_ERRORS:
        pass
    declared = declared_types(kind) if kind in KINDS else {}
    target = {name: _target(types) for name, types in declared.items()}
    as_text: set[str] = set()
    for table in tables:
        for field in table.schema:
            kind_to = target.get(field.name)
            if kind_to is not None and field.type != kind_to and not _lossless(table.column(field.name), kind_to):
                as_text.add(field.name)  # e.g. an older writer's text lists: kept as the text they are
    conformed = [_conformed(t, target, as_text) for t in tables]
    try:
        return pa.concat_tables(conformed, promote_options="permissive")
    except _CONCAT_ERRORS:  # columns no schema declares, typed differently: kept as text
        types: dict[str, set[pa.DataType]] = {}
        for table in conformed:
            for field in table.schema:
                types.setdefault(field.name, set()).add(field.type)
        odd = {n for n, t in types.items() if len(t - {pa.null()}) > 1}
        return pa.concat_tables([_conformed(t, {}, odd) for t in conformed], promote_options="permissive")


def _target(types: set[pa.DataType]) -> pa.DataType:
    return sorted(types, key=str)[0]  # one type per name across the registered tasks (tests check there is one)


def _converted(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """`column` as `kind`: a cast that loses nothing, else value by value as the writer converts a row's
    values (results.arrow_column: numbers into times are Unix seconds, never microseconds)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if not (kind == TIMESTAMP and not pa.types.is_timestamp(column.type)):
        try:
            return column.cast(kind)  # safe: raises rather than truncate or overflow
        except _CONCAT_ERRORS:
            pass
    return pa.chunked_array([arrow_column(column.to_pylist(), kind)], type=kind)


def _lossless(column: pa.ChunkedArray, kind: pa.DataType) -> bool:
    """Whether `column` converts to `kind` with no value turned into a null."""
    try:
        return _converted(column, kind).null_count == column.null_count
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return False


def _conformed(table: pa.Table, target: Mapping[str, pa.DataType], as_text: set[str]) -> pa.Table:
    """`table` with each column named in `as_text` as text, and each other one `target` names in its type."""
    for i, field in enumerate(table.schema):
        column = table.column(i)
        if field.name in as_text:
            kind = pa.string()
            if pa.types.is_string(field.type):
                continue
            converted = pa.chunked_array([pa.array([None if v is None else str(v) for v in column.to_pylist()],
                                                   type=kind)], type=kind)
        elif field.name in target and field.type != target[field.name]:
            kind = target[field.name]
            converted = _converted(column, kind)
        else:
            continue
        table = table.set_column(i, field.with_type(kind), converted)
    return table


def deduplicated(table: pa.Table, kind: str) -> pa.Table:
    """One row per key, in the order keys first appear: for epochs (trial_key, epoch) the last row,
    for trials the last `ok` row of a trial_key, else its last row. Arrow and numpy over whole columns."""
    if table.num_rows == 0:
        return table
    group = _group_ids(table, kind)
    if group.max() + 1 == table.num_rows:  # numbered 0, 1, ... by first appearance: every key once
        return table
    rank = np.arange(table.num_rows, dtype=np.int64)
    if kind == TRIALS_FILE:
        ok = pc.fill_null(pc.equal(table.column("status"), OK), False).to_numpy(zero_copy_only=False)
        rank = rank + ok.astype(np.int64) * table.num_rows  # any ok row outranks every other row
    order = np.lexsort((rank, group))  # by group, then rank: each group's chosen row is its last
    ends = np.r_[group[order][1:] != group[order][:-1], True]
    return table.take(pa.array(order[ends]))  # groups are numbered by first appearance


def _group_ids(table: pa.Table, kind: str) -> np.ndarray:
    """Per row, the number of its key in order of first appearance (nulls are a key of their own)."""
    keys = _codes(table.column("trial_key"))
    if kind == TRIALS_FILE:
        return keys
    epochs = _codes(table.column("epoch"))
    return _codes(pa.chunked_array([pa.array(keys * (int(epochs.max()) + 1) + epochs)]))


def _codes(column: pa.ChunkedArray) -> np.ndarray:
    encoded = pc.dictionary_encode(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column,
                                   null_encoding="encode")
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


# ---- the driver's side: damaged files, parts, merges, compaction ----
def driver_table(path: Path, consequence: str | None, columns: Sequence[str] | None = None
                 ) -> tuple[pa.Table | None, list[tuple[DamagedResults, Path]]]:
    """(read_table(path, columns), the damaged files set aside): each file of the union that cannot be
    read (the compacted file or a part) is renamed `<name>.damaged-<time>` beside it (kept, never read
    again), with one line on stderr naming it, why, where it went and `consequence` (None: the caller
    says it). Every trial_key is checked (BadTrialKey: keys name folders, refused before any is used).
    Driver only, under the sweep's lock."""
    damaged = []
    while True:
        try:
            table = read_table(path, columns)
        except DamagedResults as err:
            target = set_aside(err.path, err.reason)
            damaged.append((err, target))
            if consequence is not None:
                print(f"warning: {err}; set aside as {target.name} (kept, not read again); {consequence}",
                      file=sys.stderr, flush=True)
            continue
        if table is not None:
            check_key_column(table.column("trial_key"), path)
        return table, damaged


def driver_trials(out_dir: Path) -> pd.DataFrame:
    """The sweep's trial rows as a frame (empty without any), every row of the union. Driver only: a
    damaged file is set aside (driver_table) and its trials count as not run; a row whose trial_key is
    not one sweep.py makes stops the driver (BadTrialKey) before anything runs. (The analysis reads rows
    with rpevit.analysis.common.load_trials: the current, successful ones.)"""
    table, _ = driver_table(Path(out_dir) / TRIALS_FILE, TRIALS_LOST)
    return frame_of(table, Path(out_dir) / TRIALS_FILE) if table is not None else pd.DataFrame()


class PartLog:
    """The driver's appender (under the sweep lock): writes each flush's rows as level-0 parts and
    merges the newest MERGE_FANIN parts of a level into one of the next. Keeps only the list of live
    parts in memory (about F x log_F(flushes) entries), never rows."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.parts: dict[str, list[Part]] = {}
        self.last_sequence = 0
        for kind in KINDS:
            through = compacted_through(self.folder / kind)
            listed = listed_parts(self.folder, kind)
            self.parts[kind] = live_parts(listed, through)
            self.last_sequence = max([self.last_sequence, through, *(p.last for p in listed)])

    def next_sequence(self) -> int:
        """Increasing, and at least now in microseconds: a compacted file restored from a backup holds an
        older number than every part written after it."""
        self.last_sequence = max(self.last_sequence + 1, time.time_ns() // 1000)
        return self.last_sequence

    def append(self, kind: str, table: pa.Table, sequence: int) -> None:
        """`table` (rows of `kind` of flush `sequence`) as a level-0 part; OSError (disk full, ...) leaves
        nothing of it behind. Then call merge_tail(kind)."""
        (self.folder / PARTS_DIR).mkdir(parents=True, exist_ok=True)
        part = Part.named(self.folder, kind, 0, sequence, sequence)
        write_table_atomic(table, part.path)
        self.parts[kind].append(part)

    def merge_tail(self, kind: str) -> None:
        """While the newest MERGE_FANIN parts share a level: one part of the next level holds them (written
        first), then they are removed (oldest first). A kill between leaves them inside the merged one."""
        parts = self.parts[kind]
        while len(parts) >= MERGE_FANIN and len({p.level for p in parts[-MERGE_FANIN:]}) == 1:
            sources = parts[-MERGE_FANIN:]
            merged = Part.named(self.folder, kind, sources[0].level + 1, sources[0].first, sources[-1].last)
            table = union([read_results_table(p.path, kind=kind) for p in sources], kind)
            write_table_atomic(table, merged.path)
            del parts[-MERGE_FANIN:]
            parts.append(merged)
            remove_parts(sources)


# atomic_file's temp files of parts (results.remove_stale_temps, which reads the pid as the pattern's group 2:
# the name's own groups are made non-capturing, or a temp file left by a killed driver stops the next one)
PART_TEMPS = temp_pattern(_PART_NAME.replace("(", "(?:"))


def remove_parts(parts: Iterable[Part]) -> None:
    """Delete part files oldest first (a part's rows are held elsewhere by then)."""
    for part in sorted(parts, key=lambda p: (p.last, p.first)):
        part.path.unlink(missing_ok=True)


@dataclass
class Compaction:
    """What compact() did to one kind: parts absorbed, rows in the compacted file (None: not rewritten)."""
    kind: str
    parts: int
    rows: int | None


def compact(folder: Path, order: Mapping[str, int] | None = None, task: str | None = None,
            keep_empty: Sequence[str] = ()) -> list[Compaction]:
    """Rewrite each kind's live parts and compacted file into the compacted file (atomically, recording
    the last sequence it holds), then remove every part it holds (module docstring: a kill at any
    moment loses or repeats no row). Only the driver (under the sweep lock) or `python -m
    rpevit.sweep.compact` (which takes the lock) calls it.

    Rows are ordered as the writer always ordered them: by `order` (trial_key -> index in the space;
    epochs then by epoch), rows of keys outside it after, in the order they first appeared; and each
    trial row of a key in `order` gets that index as its trial_index. Without `order`, the keys of the
    folder's space.json order the rows and trial_index stays as stored. Columns follow `task`'s schema
    (its column order; unknown columns after it, by name). A kind with no parts is not rewritten, unless
    it is in `keep_empty` and has no file yet (a train sweep always has an epochs.parquet).

    First, the temp files of writes a killed process left are removed (results.remove_stale_temps: every
    caller holds the sweep lock, and a driver whose --resume has nothing to run never builds the writer
    that removed them before, issue 59 item 7), and every file to be merged is checked (`check_files`):
    a damaged one (DamagedResults) or a bad trial key (BadTrialKey) stops the compaction before anything
    is written or removed."""
    folder = Path(folder)
    remove_stale_temps(folder)
    remove_stale_temps(folder / PARTS_DIR, PART_TEMPS)
    check_files(folder)
    reindex = order is not None
    if order is None:
        order = _space_order(folder)
    if task is None:
        trials = read_table(folder / TRIALS_FILE, columns=["task"])
        task = _task_of(trials) if trials is not None else None
    done = []
    for kind in KINDS:
        path = folder / kind
        listed = listed_parts(folder, kind)
        through = compacted_through(path)  # its footer alone parsed: a folder without parts is not decoded
        live = live_parts(listed, through)
        if not live:
            if kind in keep_empty and not os.path.lexists(path) and task is not None:
                write_table_atomic(_empty(kind, task), path)
            remove_parts(listed)  # left over by a kill after the compacted file was replaced
            done.append(Compaction(kind, 0, None))
            continue
        compacted = read_results_table(path)
        through = parts_through(compacted)  # as read now (a damaged footer read 0 above: DamagedResults here)
        live = live_parts(listed, through)
        tables = ([compacted] if compacted is not None else []) + [read_results_table(p.path, kind=kind)
                                                                   for p in live]
        table = union(tables, kind)
        table = _ordered(table, kind, order, reindex, task)
        write_table_atomic(_with_through(table, max(through, *(p.last for p in listed))), path)
        remove_parts(listed)
        done.append(Compaction(kind, len(live), table.num_rows))
    _remove_empty_parts_dir(folder)
    return done


def check_files(folder: Path) -> None:
    """Every file compact() would merge (each kind's compacted file and live parts, where it has live
    parts) read for its key columns: DamagedResults for one that is not a results file of its kind
    (truncated, a FIFO, another schema, too costly: results.read_results_table), BadTrialKey for a key
    sweep.py never makes, each naming the file. So a compaction never writes rows it would have to
    refuse, and never removes a part it did not merge (issue 59, item 1)."""
    folder = Path(folder)
    for kind in KINDS:
        path = folder / kind
        live = live_parts(listed_parts(folder, kind), compacted_through(path))
        if not live:
            continue
        for file in [path, *(p.path for p in live)]:
            table = read_results_table(file, kind=kind, columns=["trial_key"])
            if table is not None:
                check_key_column(table.column("trial_key"), file)


def _with_through(table: pa.Table, through: int) -> pa.Table:
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != THROUGH_KEY}
    if through:
        metadata[THROUGH_KEY] = str(through).encode()
    return table.replace_schema_metadata(metadata or None)


def _empty(kind: str, task: str) -> pa.Table:
    schema = trials_schema(task) if kind == TRIALS_FILE else epochs_schema(task)
    return schema.empty_table()


def _task_of(table: pa.Table) -> str | None:
    if "task" not in table.column_names:
        return None
    tasks = pc.drop_null(table.column("task"))
    return tasks[0].as_py() if len(tasks) else None


def _space_order(folder: Path) -> dict[str, int]:
    """trial_key -> its index in the folder's space.json (empty where there is none or it is not one)."""
    try:  # results.read_space_file: a regular file only (a FIFO would block the compaction, issue 59 item 5)
        space = read_space_file(folder)
    except ValueError:  # ConfigError: orders nothing (the analysis's reader says what is wrong)
        return {}
    return {k: i for i, k in enumerate(space["trial_keys"])} if space is not None else {}


def _ordered(table: pa.Table, kind: str, order: Mapping[str, int], reindex: bool, task: str | None) -> pa.Table:
    """Rows by (index in `order`, epoch), stable; trial_index from `order` where reindex; the schema's
    column order (and types, where the rows carry them) first."""
    keys = table.column("trial_key").combine_chunks()
    encoded = pc.dictionary_encode(keys, null_encoding="encode")
    ranks_of_keys = np.array([order.get(k, np.iinfo(np.int64).max) for k in encoded.dictionary.to_pylist()],
                             dtype=np.int64)
    rank = ranks_of_keys[encoded.indices.to_numpy(zero_copy_only=False)] if len(ranks_of_keys) else \
        np.zeros(table.num_rows, dtype=np.int64)
    if kind == EPOCHS_FILE:
        epoch = table.column("epoch").to_numpy()  # NaN where null: sorted last
        table = table.take(pa.array(np.lexsort((epoch, rank))))
    else:
        sorted_rows = np.argsort(rank, kind="stable")
        table, rank = table.take(pa.array(sorted_rows)), rank[sorted_rows]
        if reindex and "trial_index" in table.column_names:
            stored = table.column("trial_index").combine_chunks().cast(pa.int64())
            known = rank != np.iinfo(np.int64).max
            index = pc.if_else(pa.array(known), pa.array(rank, type=pa.int64()), stored)
            table = table.set_column(table.column_names.index("trial_index"), "trial_index", index)
    if task is None:
        return table
    schema = trials_schema(task) if kind == TRIALS_FILE else epochs_schema(task)
    fixed = [n for n in schema.names if n in table.column_names]
    return table.select(fixed + sorted(set(table.column_names) - set(fixed)))


def _remove_empty_parts_dir(folder: Path) -> None:
    try:
        (Path(folder) / PARTS_DIR).rmdir()
    except OSError:  # not empty (another kind's parts, a stale temp file, not ours), or absent
        pass
