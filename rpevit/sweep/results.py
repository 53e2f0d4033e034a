"""Driver-side results: trials.parquet (one row per trial) and epochs.parquet (per trial-epoch).

The files' schemas, atomic writes, reading back and the current rows; no Ray here (the analysis
reads through this module too). The Tune callback that writes them during a sweep is writer.py's
`ParquetResults`: it rewrites the two files
atomically (temporary file + os.replace), so a kill never leaves a torn file. Rows are keyed by
trial_key (and epoch) and the files are read back on `--resume`, so nothing is duplicated.

The files have a fixed, typed schema per task (`trials_schema(task)`, `epochs_schema(task)`, from
the metrics each task declares with `register_task`): every
metric column is present whether or not any trial produced it (nullable; NaN where a metric does
not apply), integers stay int64 when a failed trial leaves them empty, `started_at` /
`finished_at` are UTC timestamps, and config columns follow the TrialConfig type hints. Two
sweeps of one task therefore have identical schemas and union without `union_by_name`; a
column no schema knows is kept, appended after the fixed ones (tests keep that list empty).

Rows of trials that are not in the sweep's current space (its YAML was edited since they ran)
stay in the files; `current_rows()` filters them by the trial keys of `space.json`.

Damaged files (issue 31, items 12 and 13). A trials.parquet / epochs.parquet that cannot be read
(truncated, random bytes, empty, a folder, another table) raises `DamagedResults`, one line naming
the file and why. The driver (under the sweep lock) sets such a file aside as
`<name>.damaged-<time>` (kept, never read again) and goes on with what is left: the trials it held
have no row, so `--resume` reruns them from their checkpoints (a finished one is only evaluated
again); a damaged epochs.parquet is rebuilt from the epoch histories in the trial checkpoints.
The analysis never renames anything: it names the file and skips its folder
(rpevit.analysis.common). A write that fails (disk full, a read-only folder) raises
`ResultsWriteError`, one line naming the folder and the OS error; the runner stops the sweep
there and prints the command that continues it (deadline.resume_command). Rows not yet written are not
lost: each trial's epochs are in its checkpoint, and `--resume` reports them again.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import numbers
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rpevit import registry
from rpevit.config import ConfigError, field_types
from rpevit.registry import TaskMetrics

TRIALS_FILE = "trials.parquet"
EPOCHS_FILE = "epochs.parquet"
SPACE_FILE = "space.json"
TENSORBOARD_DIR = "tensorboard"  # <sweep>/tensorboard/<trial_key>/: one event file per trial (trainable.EpochBoard)
KEY_SCHEME = "resolved"  # space.json's "key_scheme" once a folder's keys hash resolved configs (migrate.py)
STORED_KEY = "stored_trial_key"  # in memory only: the key a row was stored under (migrate.resolved_frame)

F64, I64, STR, BOOL = pa.float64(), pa.int64(), pa.string(), pa.bool_()
TIMESTAMP = pa.timestamp("us", tz="UTC")
F64_LIST = pa.list_(pa.float64())

IDENTITY_COLUMNS = (("sweep", STR), ("trial_index", I64), ("trial_key", STR), ("status", STR), ("error", STR))
HEADLINE_CONFIG = ("task", "dataset", "attention", "pe", "seed")
ENVIRONMENT_COLUMNS = (("device_name", STR), ("torch_version", STR), ("ray_version", STR),
                       ("rpevit_version", STR), ("git_commit", STR), ("python_version", STR))
PLACEMENT_COLUMNS = (("node_id", STR), ("hostname", STR), ("pid", I64), ("ray_gpu_ids", STR),
                     ("cuda_device", I64), ("torch_threads", I64), ("reserved_cpus", F64))
BOOKKEEPING_COLUMNS = (("epochs_done", I64), ("resumed_from_epoch", I64), ("attempts", I64),
                       ("started_at", TIMESTAMP), ("finished_at", TIMESTAMP), ("tune_trial_id", STR),
                       ("error_traceback", STR))
EPOCH_IDENTITY_COLUMNS = (("sweep", STR), ("trial_key", STR), ("epoch", I64))
_ARROW_OF_HINT = {int: I64, float: F64, str: STR, bool: BOOL, list[float]: F64_LIST}


def config_columns() -> list[tuple[str, pa.DataType]]:
    """TrialConfig fields with Arrow types from their type hints: new fields appear by themselves."""
    return [(name, _ARROW_OF_HINT[hint]) for name, hint in field_types().items()]


def task_metrics(task: str) -> TaskMetrics:
    """The metrics `task` declares at registration (rpevit.registry.register_task); none if unknown."""
    registry.load_all()
    return registry.METRICS.get(task, TaskMetrics())


def _arrow(columns: dict[str, type]) -> list[tuple[str, pa.DataType]]:
    return [(name, _ARROW_OF_HINT[hint]) for name, hint in columns.items()]


def trials_schema(task: str) -> pa.Schema:
    """The fixed schema of a trials.parquet of `task` (unknown tasks: no task metrics)."""
    metrics = task_metrics(task)
    headline, rest = _arrow(metrics.headline), _arrow(metrics.other)
    config = dict(config_columns())
    columns = [*IDENTITY_COLUMNS, *((n, config[n]) for n in HEADLINE_CONFIG), *headline,
               *((n, t) for n, t in config.items() if n not in HEADLINE_CONFIG), *rest,
               *ENVIRONMENT_COLUMNS, *PLACEMENT_COLUMNS, *BOOKKEEPING_COLUMNS]
    seen: set[str] = set()
    unique = [(n, t) for n, t in columns if not (n in seen or seen.add(n))]
    return pa.schema(unique)


def epochs_schema(task: str) -> pa.Schema:
    """The fixed schema of an epochs.parquet of `task`: trial and epoch, then the task's epoch metrics."""
    return pa.schema([*EPOCH_IDENTITY_COLUMNS, *_arrow(task_metrics(task).epoch)])


def to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows -> a table of exactly `schema` (missing values null), plus any unknown columns after it."""
    columns = {f.name: pa.array([_coerce(r.get(f.name), f.type) for r in rows], type=f.type) for f in schema}
    extra = sorted({k for r in rows for k in r} - set(schema.names))
    fields = list(schema)
    for name in extra:
        values = [r.get(name) for r in rows]
        try:
            array = pa.array(values, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            array = pa.array([None if v is None else str(v) for v in values], type=STR)
        columns[name] = array
        fields.append(pa.field(name, array.type))
    return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields))


def is_missing(value: Any) -> bool:
    return value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def _coerce(value: Any, kind: pa.DataType) -> Any:
    """One value -> the Python value Arrow stores in a column of `kind`; None where it does not fit
    (a results file must always be writable: one odd value must not stop the driver's bookkeeping)."""
    if isinstance(value, np.generic):
        value = value.item()
    if kind == F64:
        if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None
        return float(value)
    if is_missing(value):
        return None
    if kind == I64:
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return None
    if kind == STR:
        return value if isinstance(value, str) else str(value)
    if kind == TIMESTAMP:
        if isinstance(value, pd.Timestamp):
            value = value.to_pydatetime()
        if isinstance(value, dt.datetime):
            return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return dt.datetime.fromtimestamp(float(value), tz=dt.timezone.utc)
        return None
    if kind == F64_LIST:
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, (list, tuple)):
            return None
        return [_coerce(v, F64) for v in value]
    if kind == BOOL:
        return bool(value) if isinstance(value, (bool, numbers.Integral)) else None
    return value


# ---- trial keys: the one form a key read from a file may take before it names a folder ----
KEY_LENGTH = 16  # hex digits of a trial key (rpevit.sweep.space.trial_key: a sha1 of the resolved config, cut)
TRIAL_KEY = re.compile(rf"[0-9a-f]{{{KEY_LENGTH}}}")
KEY_ALLOWED = f"{KEY_LENGTH} lowercase hex digits, as sweep.py makes them (a key names the trial's folders)"


class BadTrialKey(ConfigError):
    """A trial key read from a file (trials.parquet, epochs.parquet, space.json, a checkpoint) that is
    not one sweep.py makes: it would become a path (`trials/<key>`, `tensorboard/<key>`), and
    `../../x` would then name a folder anywhere. Nothing is moved or written on it."""


def check_trial_key(key: Any, where: str) -> str:
    """`key`, or BadTrialKey (one line: where it was read, the key, what is allowed)."""
    if not (isinstance(key, str) and TRIAL_KEY.fullmatch(key)):
        shown = repr(key) if len(repr(key)) <= 120 else repr(key)[:117] + "..."
        raise BadTrialKey(f"{where} has trial_key {shown}; allowed: {KEY_ALLOWED}; nothing was moved or written "
                          f"(a file that holds such a key was not written by sweep.py: restore it from a backup, or "
                          f"remove that row)")
    return key


def check_key_column(keys: Any, path: Path) -> None:
    """Every trial_key of a results file's rows (in file order), checked: BadTrialKey names the file,
    the first bad row (counting from 1) and its key."""
    for number, key in enumerate(keys, 1):
        if not (isinstance(key, str) and TRIAL_KEY.fullmatch(key)):
            check_trial_key(key, f"{path}, row {number}")


def trial_folder(parent: Path, key: str) -> Path:
    """`parent/<key>` (a trial's checkpoint or TensorBoard folder), only for a key of the one allowed form."""
    return Path(parent) / check_trial_key(key, f"a trial folder under {parent}")


# ---- atomic, no-follow writes: every results file and every analysis output ----
class LinkRefused(ConfigError):
    """A file rpevit would write is a symbolic link: writing would change whatever it points at."""


def temp_name(path: Path, pid: int | None = None) -> Path:
    """Where atomic_file writes before os.replace."""
    return path.with_name(f".{path.name}.{os.getpid() if pid is None else pid}.tmp")


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces `path` at once when the block ends without error
    (temporary file beside it, then os.replace): a kill never leaves a torn file, a failed write leaves
    the old one. Never through a symbolic link: `path` being a link is refused (LinkRefused, one line),
    the temporary file is created with O_EXCL | O_NOFOLLOW (a planted one is not written through), and
    os.replace swaps the directory entry, not what a link points at."""
    path = Path(path)
    if path.is_symlink():
        raise LinkRefused(f"{path} is a symbolic link (to {os.readlink(path)!r}); allowed: a regular file or nothing "
                          f"there: rpevit never writes through a link (it would overwrite what it points at); "
                          f"remove the link")
    tmp = temp_name(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileExistsError:  # our own pid's leftover (a write of this process that died) or a planted entry
        tmp.unlink()  # removes the entry itself, never what a link there points at
        fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        try:  # a torn temp file of a write that failed (disk full): nothing to keep
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """`text` (UTF-8) into `path` through atomic_file."""
    with atomic_file(path) as handle:
        handle.write(text.encode("utf-8"))


_TEMP = re.compile(rf"\.({'|'.join(re.escape(n) for n in (TRIALS_FILE, EPOCHS_FILE, SPACE_FILE))})\.(\d+)\.tmp")


def remove_stale_temps(out_dir: Path) -> list[Path]:
    """Delete the temp files a killed driver left in a sweep folder (`.trials.parquet.<pid>.tmp`, the
    same for epochs.parquet and space.json) when no live process has that pid; returns them. Only
    those names: nothing else in the folder is touched. Called when a sweep (or resume) starts."""
    if not Path(out_dir).is_dir():
        return []
    with os.scandir(out_dir) as entries:
        stale = [Path(e.path) for e in entries if (found := _TEMP.fullmatch(e.name))
                 and not e.is_dir(follow_symlinks=False) and not _alive(int(found.group(2)))]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, from a write of this process that raised: stale too
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's live process
        return True
    return True


REQUIRED_COLUMNS = {TRIALS_FILE: ("trial_key", "status"), EPOCHS_FILE: ("trial_key", "epoch")}


class DamagedResults(ConfigError):
    """A trials.parquet / epochs.parquet that cannot be read as one; the message names it and why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path} cannot be read as a sweep's {Path(path).name} ({reason})")


class ResultsWriteError(ConfigError):
    """The driver could not write a results file (disk full, a read-only folder, ...): one line naming
    the folder and the OS error, and (`command`) how to continue the sweep once that is fixed."""

    def __init__(self, folder: Path, err: OSError, command: str | None = None) -> None:
        self.folder, self.err, self.command = Path(folder), err, command
        what = os.strerror(err.errno) if err.errno else (err.strerror or str(err))
        name = errno_name(err.errno)
        super().__init__(f"cannot write the results of this sweep to {folder} ({name + ': ' if name else ''}{what}); "
                         f"the sweep stopped and starts no further trials; nothing is lost (a trial without a row "
                         f"runs again from its checkpoint): free space or make the folder writable, then continue "
                         f"with {command or '--resume'}")


def errno_name(number: int | None) -> str:
    import errno as errno_module

    return errno_module.errorcode.get(number, "") if number else ""


def one_line(err: BaseException, limit: int = 200) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:limit]


def read_results_table(path: Path) -> pa.Table | None:
    """The table of a trials.parquet / epochs.parquet, None where there is no such file; DamagedResults
    where there is one that cannot be read as one (truncated, random bytes, empty, a folder, a table
    without the columns every such file has)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    if path.is_dir():
        raise DamagedResults(path, "it is a folder, not a Parquet file")
    try:
        table = pq.read_table(path, use_pandas_metadata=True)
    except (pa.ArrowException, OSError, ValueError, EOFError) as err:  # ArrowInvalid, thrift errors, ...
        raise DamagedResults(path, one_line(err)) from err
    missing = [c for c in REQUIRED_COLUMNS.get(path.name, ()) if c not in table.column_names]
    if missing:
        raise DamagedResults(path, f"a Parquet table without the column(s) {', '.join(missing)}")
    if path.name == TRIALS_FILE:
        check_number_columns(table, path)
    return table


_NUMBER_KINDS = (F64, I64, TIMESTAMP, BOOL)


def check_number_columns(table: pa.Table, path: Path) -> None:
    """DamagedResults where a column the schema of the file's task(s) declares a number (a metric, an
    int or float config field, a time) is stored as text: sweep.py never writes that, and every mean,
    interval and sort over it would fail or mislead. (Older writers' float times and text lists are
    fine: those are numbers, or not declared numbers.)"""
    tasks = set(table.column("task").unique().to_pylist()) if "task" in table.column_names else set()
    declared = {f.name for task in (tasks or {"train"}) if isinstance(task, str)
                for f in trials_schema(task) if f.type in _NUMBER_KINDS}
    for field in table.schema:
        if field.name in declared and (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
                                       or pa.types.is_binary(field.type)):
            value = next((v for v in table.column(field.name).to_pylist() if v is not None), None)
            shown = repr(value) if value is None or len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise DamagedResults(path, f"column {field.name!r} holds text (such as {shown}), where the file sweep.py "
                                       f"writes holds numbers")


def set_aside(path: Path, reason: str) -> Path:
    """Rename a damaged results file (or folder) to `<name>.damaged-<time>` beside it, keeping it; returns
    the new path. ConfigError (one line) where even that is not possible."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = path.with_name(f"{path.name}.damaged-{stamp}"), 1
    while os.path.lexists(target):
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    try:
        os.rename(path, target)
    except OSError as err:
        raise ConfigError(f"{path} cannot be read as a sweep's {path.name} ({reason}) and cannot be set aside "
                          f"({err.strerror or err}); allowed: a readable file or none: move it out of the way "
                          f"(keep it), then run the same command again") from err
    return target


def read_table_or_set_aside(path: Path, consequence: str) -> tuple[pa.Table | None, Path | None]:
    """(the table, None), or for a damaged file (None, where it was set aside) after one line on stderr
    naming it, why, where it went and `consequence` (what the sweep does about it). Driver only, under
    the sweep's lock: nothing else may be writing the folder."""
    try:
        return read_results_table(path), None
    except DamagedResults as err:
        moved = set_aside(err.path, err.reason)
        print(f"warning: {err}; set aside as {moved.name} (kept, not read again); {consequence}", file=sys.stderr,
              flush=True)
        return None, moved


TRIALS_LOST = ("the trials it held have no row now, so this run (with --resume) runs them again from their "
               "checkpoints: a finished one is only evaluated again")


def write_table_atomic(table: pa.Table, path: Path) -> None:
    with atomic_file(path) as handle:
        pq.write_table(table, handle)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows as Arrow stores them (ints stay ints, timestamps datetimes), not via pandas floats;
    DamagedResults for a file that cannot be read."""
    table = read_results_table(path)
    return table.to_pylist() if table is not None else []


def driver_trials(out_dir: Path) -> pd.DataFrame:
    """The sweep's trials.parquet as a frame (empty without one), every row of it. Driver only: a
    damaged file is set aside (read_table_or_set_aside) and its trials count as not run; a row whose
    trial_key is not one sweep.py makes stops the driver (BadTrialKey) before anything runs. (The
    analysis reads rows with rpevit.analysis.common.load_trials: the current, successful ones.)"""
    path = Path(out_dir) / TRIALS_FILE
    table, _ = read_table_or_set_aside(path, TRIALS_LOST)
    if table is None:
        return pd.DataFrame()
    check_key_column(table.column("trial_key").to_pylist(), path)  # keys name folders: refused before any is used
    return table.to_pandas()


def unix_seconds(times: pd.Series) -> pd.Series:
    """Unix seconds of a `started_at` / `finished_at` column: timestamps (now), float seconds (older files), or
    both mixed in one object column (rows of several sweeps, written by different versions, read together)."""
    if pd.api.types.is_datetime64_any_dtype(times):
        return (times - pd.Timestamp(0, unit="s", tz="UTC")).dt.total_seconds()
    if times.dtype == object:
        return times.map(lambda t: math.nan if pd.isna(t) else t.timestamp() if isinstance(t, pd.Timestamp)
                         else float(t)).astype(float)
    return times.astype(float)


def trial_seconds(frame: pd.DataFrame) -> pd.Series:
    """finished_at - started_at of each row, in seconds (a resumed trial counts from its resume)."""
    return unix_seconds(frame["finished_at"]) - unix_seconds(frame["started_at"])


def current_keys(results_dir: str | os.PathLike) -> list[str] | None:
    """Trial keys of the sweep's current space, from `space.json` (None: no space.json there)."""
    folder = Path(results_dir)
    folder = folder.parent if folder.suffix == ".parquet" else folder
    path = folder / SPACE_FILE
    if not path.exists():
        return None
    try:
        keys = json.loads(path.read_text())["trial_keys"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} cannot be read as a sweep's space.json ({err}); allowed: the file "
                         f"sweep.py writes (a JSON object with a 'trial_keys' list)") from err
    if not isinstance(keys, list):
        raise ValueError(f"{path}: 'trial_keys' has value {keys!r}; allowed: a list of trial keys")
    return keys


def space_key_scheme(results_dir: str | os.PathLike) -> str | None:
    """The key scheme a folder's space.json records: KEY_SCHEME, or None (written before keys hashed
    resolved configs, or no readable space.json; rpevit.sweep.migrate)."""
    folder = Path(results_dir)
    folder = folder.parent if folder.suffix == ".parquet" else folder
    try:
        scheme = json.loads((folder / SPACE_FILE).read_text(encoding="utf-8")).get("key_scheme")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return scheme if isinstance(scheme, str) else None


def select_keys(frame: pd.DataFrame, keys: list[str] | set[str] | None,
                column: str = "trial_key") -> tuple[pd.DataFrame, int]:
    """(rows whose `column` (trial_key) is in keys, how many were set aside); everything if keys is None."""
    if keys is None or frame.empty or column not in frame.columns:
        return frame, 0
    mask = frame[column].isin(set(keys))
    return frame[mask], int((~mask).sum())


def current_rows(frame: pd.DataFrame, results_dir: str | os.PathLike) -> tuple[pd.DataFrame, int]:
    """(the rows of `frame` that belong to the sweep's current space, how many were set aside).

    `results_dir` is the sweep folder (or its trials/epochs Parquet path); its `space.json` lists
    the trial keys of the space the sweep last ran with. Rows of other keys are from an earlier
    version of the YAML (say, another `epochs`): they stay in the files but are neither done for
    the current space nor part of its analysis. Without a space.json nothing is set aside. The
    kept frame keeps the original index. A space.json of the older key scheme lists the keys rows were
    stored under (STORED_KEY, kept by rpevit.sweep.migrate.resolved_frame).
    """
    keys = current_keys(results_dir)
    older = space_key_scheme(results_dir) != KEY_SCHEME and STORED_KEY in frame.columns
    return select_keys(frame, keys, STORED_KEY if older else "trial_key")  # older space.json: stored keys
