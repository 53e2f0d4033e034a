"""Driver-side results: trials.parquet (one row per trial) and epochs.parquet (per trial-epoch).

The files' schemas, rows -> Arrow tables (`to_table`), atomic writes, reading one file back and the
current rows; no Ray here (the analysis reads through this module too). How the files grow during a
sweep (append-only parts, compaction) and how they are read whole (`read_table`, `read_frame`:
compacted file plus parts, deduplicated by key) is rpevit.sweep.store; the Tune callback that
writes them is writer.py's `ParquetResults`. Every file is written through `atomic_file` (temporary
file + os.replace, never through a link), so a kill never leaves a torn file. Rows are keyed by
trial_key (and epoch) and read back on `--resume`, so nothing is duplicated.

The files have a fixed, typed schema per task (`trials_schema(task)`, `epochs_schema(task)`, from
the metrics each task declares with `register_task`): every
metric column is present whether or not any trial produced it (nullable; NaN where a metric does
not apply), integers stay int64 when a failed trial leaves them empty, `started_at` /
`finished_at` are UTC timestamps, and config columns follow the TrialConfig type hints. Two
sweeps of one task therefore have identical schemas and union without `union_by_name`; a
column no schema knows is kept, appended after the fixed ones (tests keep that list empty).

Rows of trials that are not in the sweep's current space (its YAML was edited since they ran)
stay in the files; `current_rows()` filters them by the trial keys of `space.json`.

Damaged files (issue 31, items 12 and 13). A trials.parquet / epochs.parquet (or a part of one) that
cannot be read (truncated, random bytes, empty, a folder, another table) raises `DamagedResults`,
one line naming the file and why. The driver (under the sweep lock) sets such a file aside as
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
import errno
import itertools
import json
import math
import numbers
import os
import re
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rpevit import registry
from rpevit.durable import fsync_fd
from rpevit.config import ConfigError, field_types, load_registry
from rpevit.registry import TaskMetrics

TRIALS_FILE = "trials.parquet"
EPOCHS_FILE = "epochs.parquet"
SPACE_FILE = "space.json"
MAX_SPACE_FILE_BYTES = 64 * 2**20  # a space.json of 10^6 trials is ~20 MB of keys; far above any real one
TENSORBOARD_DIR = "tensorboard"  # <sweep>/tensorboard/<trial_key>/: one event file per trial (tensorboard_events.EpochBoard)
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
    load_registry()
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
    """Rows -> a table of exactly `schema` (missing values null), plus any unknown columns after it
    (sorted by name). Column by column, Arrow-native (`arrow_column`): the values a trial sends are
    converted by Arrow in one call per column, exactly as `coerce_value` would convert each."""
    columns = {f.name: arrow_column([r.get(f.name) for r in rows], f.type) for f in schema}
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


_NONE = type(None)
_NUMPY_INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32)
_NUMPY_FLOATS = (np.float32, np.float64)
_F64_VALUES = frozenset({float, int, _NONE, *_NUMPY_FLOATS, *_NUMPY_INTS})
_FAST_TYPES = {  # Python types whose values Arrow converts to the column's type as coerce_value does
    F64: _F64_VALUES,
    I64: frozenset({int, _NONE, *_NUMPY_INTS}),
    STR: frozenset({str, _NONE}),
    BOOL: frozenset({bool, _NONE, np.bool_}),
    TIMESTAMP: frozenset({float, int, _NONE}),  # Unix seconds (time.time()), as trials send them
}
_LIST_VALUES = frozenset({list, tuple, _NONE, np.ndarray})
_UNIX_RANGE = (-62_135_596_800.0 + 86_400, 253_402_300_799.0 - 86_400)  # datetime's years 1..9999, a day inside


def arrow_column(values: list[Any], kind: pa.DataType) -> pa.Array:
    """`values` as an Arrow array of `kind`, equal to `pa.array([coerce_value(v, kind) for v in values])`
    (tests/test_results_store.py checks that on odd values). Arrow converts the column in one call
    where every value's Python type is one it converts as coerce_value does (`_FAST_TYPES`: no bool in
    a float column, no text in a number column, Unix seconds into a timestamp); a column holding any
    other value is converted value by value (rare: a failed trial's odd value)."""
    try:
        fast = _fast_column(values, kind)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        fast = None  # e.g. an int beyond int64: coerce_value decides (and raises where it always did)
    if fast is not None:
        return fast
    return pa.array([coerce_value(v, kind) for v in values], type=kind)


def _fast_column(values: list[Any], kind: pa.DataType) -> pa.Array | None:
    types = set(map(type, values))
    if kind == F64_LIST:
        if not types <= _LIST_VALUES:
            return None
        arrays = [v for v in values if type(v) is np.ndarray]
        if any(a.dtype.kind not in "fiu" or a.ndim != 1 for a in arrays):
            return None
        items = itertools.chain.from_iterable(v for v in values if type(v) in (list, tuple))
        if not set(map(type, items)) <= _F64_VALUES:
            return None
        return pa.array(values, type=kind)
    if not types <= _FAST_TYPES.get(kind, frozenset()):
        return None
    if kind == TIMESTAMP:
        return _unix_seconds_column(values)
    return pa.array(values, type=kind)  # F64 keeps NaN (not null): from_pandas stays off


def _unix_seconds_column(values: list[Any]) -> pa.Array | None:
    """Unix seconds -> UTC microseconds as datetime.fromtimestamp(s, utc) rounds them (CPython's
    _PyTime_DoubleToDenominator: the fraction of the second, scaled, rounded half to even); NaN and
    None null. None (convert value by value) where a value is infinite or outside datetime's years."""
    seconds = pa.array(values, type=F64).to_numpy(zero_copy_only=False)
    missing = np.isnan(seconds)
    finite = seconds[~missing]
    if finite.size and not (np.isfinite(finite).all() and _UNIX_RANGE[0] < finite.min()
                            and finite.max() < _UNIX_RANGE[1]):
        return None
    fraction, whole = np.modf(np.where(missing, 0.0, seconds))
    micros = np.rint(fraction * 1e6)
    whole = whole + (micros >= 1e6) - (micros < 0)
    micros = micros - 1e6 * (micros >= 1e6) + 1e6 * (micros < 0)
    stamps = whole.astype(np.int64) * 1_000_000 + micros.astype(np.int64)
    return pa.array(stamps, type=I64, mask=missing).cast(TIMESTAMP)


def is_missing(value: Any) -> bool:
    return value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def coerce_value(value: Any, kind: pa.DataType) -> Any:
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
        return [coerce_value(v, F64) for v in value]
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
    the first bad row (counting from 1) and its key. An Arrow column is checked in one pass."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        good = pc.fill_null(pc.match_substring_regex(keys, f"^{TRIAL_KEY.pattern}$"), False)
        if pc.all(good).as_py() is not False:
            return
        keys = keys.to_pylist()
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
    the old one. Never through a symbolic link, at the file or at the folder it is written in: the
    folder is opened once with O_NOFOLLOW (a linked folder is refused, LinkRefused, one line) and every
    step after that works relative to that open folder (lstat of the name, the temporary file created
    with O_EXCL | O_NOFOLLOW, os.replace, fsync), so a link swapped in between the check and the write
    changes nothing. Links above that folder are the caller's: the roots a user names are resolved where
    they are read (sweep_dir, the analysis scripts' RESULTS_DIR; the snapshot refuses a linked DEST), so
    a link the user chose still works, and the folders rpevit makes below a root are checked where they
    are made (links inside a sweep folder, its `trials/` and `parts/`, are refused by sweep_lock).
    Durable too: the data are fsynced before the rename and the folder after it, so a node that crashes
    or loses power (a SIGKILL keeps the page cache, a crash does not) never comes back with the new name
    on an empty or torn file (tests/test_results_store_sigkill.py covers kills; this, what no kill can show)."""
    path = Path(path)
    folder_fd = open_folder_nofollow(path.parent)
    try:
        name, tmp = path.name, temp_name(path).name
        try:
            st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise LinkRefused(f"{path} is a symbolic link (to {os.readlink(name, dir_fd=folder_fd)!r}); allowed: a "
                              f"regular file or nothing there: rpevit never writes through a link (it would "
                              f"overwrite what it points at); remove the link")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o644, dir_fd=folder_fd)
        except FileExistsError:  # our own pid's leftover (a write of this process that died) or a planted entry
            os.unlink(tmp, dir_fd=folder_fd)  # removes the entry itself, never what a link there points at
            fd = os.open(tmp, flags, 0o644, dir_fd=folder_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            fsync_fd(folder_fd)
        except BaseException:
            try:  # a torn temp file of a write that failed (disk full): nothing to keep
                os.unlink(tmp, dir_fd=folder_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(folder_fd)


def named_folder(text: str) -> Path:
    """A folder a user names on the command line (argparse `type=`), resolved: a link the user chose
    is followed here, once, on purpose, so atomic_file, which refuses a linked folder, writes into the
    real folder it points at; a link found below it is still refused."""
    return Path(text).expanduser().resolve()


def open_folder_nofollow(folder: Path) -> int:
    """A read-only descriptor of `folder`, refused (LinkRefused) where `folder` itself is a symbolic link."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if folder.is_symlink():
            raise LinkRefused(f"{folder} is a symbolic link (to {os.readlink(folder)!r}); allowed: a real folder to "
                              f"write in: rpevit never writes through a link (it would write wherever it points); "
                              f"remove the link, or name the folder it points at") from err
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """`text` (UTF-8) into `path` through atomic_file."""
    with atomic_file(path) as handle:
        handle.write(text.encode("utf-8"))


def temp_pattern(names: str) -> re.Pattern[str]:
    """The temp-file names atomic_file gives files whose names match the regex `names`: `.<name>.<pid>.tmp`."""
    return re.compile(rf"\.({names})\.(\d+)\.tmp")


DECLARATION_NAME = "declaration.json"  # rpevit.sweep.declaration.DECLARATION_FILE (a test checks they agree)
_TEMP = temp_pattern("|".join(re.escape(n) for n in (TRIALS_FILE, EPOCHS_FILE, SPACE_FILE, DECLARATION_NAME)))


def remove_stale_temps(out_dir: Path, temps: re.Pattern[str] = _TEMP) -> list[Path]:
    """Delete the temp files a killed driver left in a sweep folder (`.trials.parquet.<pid>.tmp`, the
    same for epochs.parquet and space.json; `temps`: other names, e.g. of the store's parts) when no
    live process has that pid; returns them. Only those names: nothing else in the folder is touched.
    Called when a sweep (or resume) starts."""
    if not Path(out_dir).is_dir():
        return []
    with os.scandir(out_dir) as entries:
        stale = [Path(e.path) for e in entries if (found := temps.fullmatch(e.name))
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

    def __init__(self, path: Path, reason: str, kind: str | None = None) -> None:
        self.path, self.reason = Path(path), reason
        what = f"a sweep's {self.path.name}" if kind in (None, self.path.name) else f"a part of a sweep's {kind}"
        super().__init__(f"{path} cannot be read as {what} ({reason})")


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


def read_results_table(path: Path, kind: str | None = None, columns: list[str] | None = None) -> pa.Table | None:
    """The table of a trials.parquet / epochs.parquet (or of a part of one: `kind` names which,
    rpevit.sweep.store), None where there is no such file; DamagedResults where there is one that
    cannot be read as one (truncated, random bytes, empty, a folder, a table without the columns every
    such file has). `columns`: only those of them the file has.

    Three checks come before any row is read, because the store merges what it reads into the files
    it keeps and deletes the parts it merged (issue 59, items 1, 5 and 7):
    - the path is opened only if it is a regular file (`open_regular`): a FIFO blocks open() until a
      writer comes, so one planted in parts/ hung every reader, the compact tool and the driver (which
      holds the sweep lock while it waits);
    - the file's declared types fit its kind's schema (`check_schema`, on the footer, whatever
      `columns` asks for): a part whose trial_key was int64 once made a compaction turn 20 trial rows
      into 2 and delete the parts; such a file is damaged, and set aside whole as a truncated one is;
    - what the rows cost in memory (`check_cost`): a 137 KB part once decoded to 3.4 GB.
    The table comes back without the file's b"pandas" metadata (`without_pandas_metadata`): names and types
    are the stored ones check_schema checked, whoever converts it to pandas (`frame_of`)."""
    path = Path(path)
    kind = kind or path.name
    if not os.path.lexists(path):
        return None
    if path.is_dir() and not path.is_symlink():  # a link, to a folder or not, is refused by open_regular
        raise DamagedResults(path, "it is a folder, not a Parquet file", kind)
    try:  # one open file for the footer and the pages: a path is opened twice by pq.read_table, and a driver
        # replacing the file between the two opens (a compaction) gave a torn read (tests/test_sweep_snapshot.py)
        with open_regular(path) as handle:
            data = arrow_bytes(handle)  # read by Arrow from its own memory: no Python object on its threads
        size = data.size
        with pq.ParquetFile(pa.BufferReader(data)) as footer:
            schema, metadata = footer.schema_arrow, footer.metadata
            names = schema.names
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise DamagedResults(path, f"column {twice[0]!r} appears more than once; allowed: the file "
                                           f"sweep.py writes (one column per name)")
            missing = [c for c in REQUIRED_COLUMNS.get(kind, ()) if c not in names]
            if missing:
                raise DamagedResults(path, f"a Parquet table without the column(s) {', '.join(missing)}")
            wanted = None if columns is None else [c for c in columns if c in names]
            text = [f.name for f in schema if _is_text(f.type) and (wanted is None or f.name in wanted)]
            if check_cost(metadata, wanted, set(text), size, path) <= read_budget(size):
                text = []  # even decoded plainly it fits: read as it is
            if kind in REQUIRED_COLUMNS:
                check_schema(schema, kind, path, footer)
        with pq.ParquetFile(pa.BufferReader(data), metadata=metadata, read_dictionary=text or None) as file:
            table = file.read(columns=wanted, use_pandas_metadata=False)  # no index columns the file names
        if text or any(pa.types.is_dictionary(f.type) for f in table.schema):
            table = _decoded(table, schema, size, path)
        table = without_pandas_metadata(table)
    except DamagedResults as err:  # named as what it was read as: a part, or the file itself
        raise DamagedResults(path, err.reason, kind) from None
    except (pa.ArrowException, OSError, ValueError, EOFError) as err:  # ArrowInvalid, thrift errors, ...
        raise DamagedResults(path, one_line(err), kind) from err
    return table


PANDAS_METADATA = b"pandas"  # what pandas.DataFrame.to_parquet stores; sweep.py's writer never does (to_table)


def without_pandas_metadata(table: pa.Table) -> pa.Table:
    """`table` without b"pandas" schema metadata (other keys, such as the store's parts_through, kept). Read
    from a file it is untrusted: Table.to_pandas renames columns by it (field_name -> name) and chooses their
    dtypes, so a text column stored as `zz_seed` passed check_schema (a name no task declares) and became
    `seed`, a column the analysis does not escape because it is declared a number."""
    metadata = table.schema.metadata
    if not metadata or PANDAS_METADATA not in metadata:
        return table
    return table.replace_schema_metadata({k: v for k, v in metadata.items() if k != PANDAS_METADATA} or None)


def frame_of(table: pa.Table, path: Path) -> pd.DataFrame:
    """A results table (of the file or folder `path`) as a pandas frame whose columns are exactly its stored
    field names, in order: no metadata from a file renames a column or chooses its dtype
    (without_pandas_metadata, ignore_metadata). DamagedResults naming `path` and the column otherwise."""
    frame = without_pandas_metadata(table).to_pandas(ignore_metadata=True)
    stored, read = list(table.column_names), list(frame.columns)
    if read != stored:
        i = next((i for i, (a, b) in enumerate(zip(stored, read)) if a != b), min(len(stored), len(read)))
        field, became = (stored[i] if i < len(stored) else None), (read[i] if i < len(read) else None)
        raise DamagedResults(path, f"column {field!r} is read as {became!r}; allowed: the file sweep.py writes, "
                                   f"its columns read by their stored names")
    return frame


# ---- what a results file may be before its rows are read ----
MAX_READ_BYTES = 256 * 2**20  # any results file may take this much memory once read ...
MAX_READ_BYTES_PER_BYTE = 1024  # ... or this many times its size on disk (committed studies: at most 4x; a
# 10^5-trial file of repeated rows, the most compressible a sweep writes: 133x)


def read_budget(size: int) -> int:
    """The memory a results file of `size` bytes may take once read (MAX_READ_BYTES, MAX_READ_BYTES_PER_BYTE)."""
    return max(MAX_READ_BYTES, MAX_READ_BYTES_PER_BYTE * size)


_FILE_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"),
               (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> str | None:
    """What a file of st_mode `mode` is, where it is not a regular file (None where it is one)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@contextmanager
def open_regular(path: Path) -> Iterator[BinaryIO]:
    """`path` opened for reading only if it is a regular file, else DamagedResults saying what it is:
    open() of a FIFO blocks until a writer comes, and a device never ends; and never through a symbolic
    link (`rotinv_concentration.md -> /etc/secret` under a results folder was read into report.md). Opened
    without blocking and without following a link (O_NOFOLLOW; where there is none, the lstat taken before
    must name the file opened), then checked on the open file itself (fstat), so nothing can be swapped in
    between."""
    before = os.lstat(path) if not _NOFOLLOW else None
    if before is not None and stat.S_ISLNK(before.st_mode):
        raise DamagedResults(path, _LINK_REFUSED)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | _NOFOLLOW)
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP (EMLINK on some systems)
            raise DamagedResults(path, _LINK_REFUSED) from None
        raise
    try:
        opened = os.fstat(fd)
        if before is not None and (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise DamagedResults(path, _LINK_REFUSED)  # replaced by a link between the lstat and the open
        found = not_regular(opened.st_mode)
        if found is not None:
            raise DamagedResults(path, f"it is {found}, not a regular file; allowed: the Parquet file sweep.py writes")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb", buffering=0)  # Arrow reads whole ranges: no buffer of our own
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def arrow_bytes(handle: BinaryIO) -> pa.Buffer:
    """The whole of an open file (`open_regular`'s), copied into memory Arrow owns. Arrow given the Python
    file object itself reads it on its I/O threads (RandomAccessFile::ReadAsync) and frees each chunk there,
    which takes the GIL; a process that exits right after a read can find such a thread still holding one,
    and that thread's exit then unwinds through a destructor that may not throw: the process aborts
    ('terminate called without an active exception', exit -6; 18 of 30 processes that read one trials.parquet
    and exited did, pyarrow 26.0.1, and CI's dry-run test once). Read from its own memory, Arrow holds no
    Python object. One copy of the file, which the read needs anyway (the decoded table is bounded by
    check_cost); read through the one descriptor opened, so the footer and the pages are of one file."""
    size = os.fstat(handle.fileno()).st_size
    buffer = pa.allocate_buffer(size)
    view, done = memoryview(buffer), 0
    while done < size:  # a raw (unbuffered) file may return less than asked
        got = handle.readinto(view[done:])
        if not got:  # shorter than fstat said (truncated meanwhile): what is there, which the footer check judges
            return buffer.slice(0, done)
        done += got
    return buffer


_LINK_REFUSED = "it is a symbolic link, not a regular file (a link is never read through); allowed: a regular file"


def read_regular_bytes(path: Path, limit: int, allowed: str) -> bytes | None:
    """The bytes of `path` (None where nothing is there), if it is a regular file of at most `limit`
    bytes; ConfigError naming the file, what it is and `allowed` otherwise (a FIFO would block the
    reader, a device never end, a symbolic link would read whatever it points to: open_regular)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    try:
        with open_regular(path) as handle:
            data = handle.read(limit + 1)
    except DamagedResults as err:
        raise ConfigError(f"{path}: {err.reason.split(';')[0]}; allowed: {allowed}") from None
    if len(data) > limit:
        raise ConfigError(f"{path} is larger than {limit:,} bytes; allowed: {allowed}")
    return data


_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def check_cost(metadata: pq.FileMetaData, columns: list[str] | None, dictionary: set[str], size: int,
               path: Path) -> int:
    """DamagedResults where the footer says reading `columns` (None: all) would take more than read_budget:
    each value's width (plus offsets for text), and for text columns their pages' decompressed size (the
    top-level ones, `dictionary`, can be read as dictionaries, so a value repeated a million times is held
    once; `_decoded` checks their plain size before it is made). Nested text stored as a dictionary is
    counted as if each value could be the whole dictionary. Returns the most the read could take with
    `dictionary` decoded plainly (each value as long as its whole dictionary): where that fits the budget,
    the file is read plainly (a sweep's files are small; no dictionary round trip)."""
    budget, total, worst = read_budget(size), 0, 0
    leaves = metadata.schema
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            path_in = column.path_in_schema
            top = next((n for n in (columns if columns is not None else [path_in.split(".")[0]])
                        if path_in == n or path_in.startswith(n + ".")), None)
            if top is None:
                continue
            values = max(column.num_values, group.num_rows)
            physical = column.physical_type
            if physical == "BYTE_ARRAY":
                data = column.total_uncompressed_size
                plain = data * values if column.has_dictionary_page else data
                if path_in != top or top not in dictionary:  # nested text: not read as a dictionary
                    data = plain
                total += values * 9 + data
                worst += values * 9 + plain
            elif physical == "FIXED_LEN_BYTE_ARRAY":
                total += values * (leaves.column(c).length + 1)
                worst += values * (leaves.column(c).length + 1)
            else:
                total += values * (_WIDTHS.get(physical, 8) + 1)
                worst += values * (_WIDTHS.get(physical, 8) + 1)
            if total > budget:
                raise DamagedResults(path, _too_costly(total, metadata.num_rows, size, budget))
    return worst


def _too_costly(cost: int, rows: int, size: int, budget: int) -> str:
    return (f"its {rows:,} rows would take at least {cost / 2**20:,.0f} MiB in memory, from {size:,} bytes on disk; "
            f"allowed: at most {budget / 2**20:,.0f} MiB (the larger of {MAX_READ_BYTES / 2**20:,.0f} MiB and "
            f"{MAX_READ_BYTES_PER_BYTE}x the file's size): sweep.py never writes such a file")


def _is_text(kind: pa.DataType) -> bool:
    kind = kind.value_type if pa.types.is_dictionary(kind) else kind
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _decoded(table: pa.Table, schema: pa.Schema, size: int, path: Path) -> pa.Table:
    """`table`, read with its text columns as dictionaries, with those columns in the types the file
    declares (schema). The plain size of every text dictionary is summed first, and DamagedResults raised
    where the whole would exceed read_budget: a value a million rows repeat is a million copies once the
    column is decoded, here or where the store brings it to the schema's plain text (store._concat)."""
    plain, dictionary = 0, []
    for i, field in enumerate(table.schema):
        declared = schema.field(field.name).type if field.name in schema.names else field.type
        if pa.types.is_dictionary(field.type) and _is_text(field.type):
            if not pa.types.is_dictionary(declared):
                dictionary.append((i, declared))
            for chunk in table.column(i).chunks:
                lengths = pc.binary_length(chunk.dictionary).fill_null(0)
                plain += int(pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0) + 9 * len(chunk)
        else:
            plain += table.column(i).nbytes
    budget = read_budget(size)
    if plain > budget:
        raise DamagedResults(path, _too_costly(plain, table.num_rows, size, budget))
    for i, declared in dictionary:
        table = table.set_column(i, table.schema.field(i).with_type(declared), table.column(i).cast(declared))
    return table


_NUMBER_KINDS = (F64, I64, TIMESTAMP, BOOL)
_KIND_WORDS = {STR: "text", I64: "integers", F64: "numbers", BOOL: "booleans",
               TIMESTAMP: "timestamps (or Unix seconds: older files)",
               F64_LIST: "lists of numbers (or text: older files)"}


_DECLARED: dict[tuple, dict[str, set[pa.DataType]]] = {}


def declared_types(kind: str) -> dict[str, set[pa.DataType]]:
    """Column name -> the type(s) the schemas of every registered task declare for it, in a `kind`
    (TRIALS_FILE / EPOCHS_FILE) file. Kept per set of registered tasks and TrialConfig class: every file
    read asks (the schemas take milliseconds to build)."""
    load_registry()
    from rpevit.config import trial_config_class

    key = (kind, id(trial_config_class()), tuple((t, id(m)) for t, m in registry.METRICS.items()))
    if key not in _DECLARED:
        out: dict[str, set[pa.DataType]] = {}
        for task in list(registry.METRICS) or ["train"]:
            for f in (trials_schema(task) if kind == TRIALS_FILE else epochs_schema(task)):
                out.setdefault(f.name, set()).add(f.type)
        _DECLARED[key] = out
    return _DECLARED[key]


def fits_declared(actual: pa.DataType, declared: pa.DataType, key: bool = False) -> bool:
    """Whether a column stored as `actual` holds what a column `declared` by the schema holds, as this
    or an earlier sweep.py wrote it (every such type converts to `declared` without loss of a row: ints
    of any width, float seconds for times, text for lists), or only nulls. `key`: a column rows are told
    apart by (trial_key, status, epoch), which must hold its own kind of values, never nulls alone."""
    actual = actual.value_type if pa.types.is_dictionary(actual) else actual
    types = pa.types
    number = types.is_integer(actual) or types.is_floating(actual)
    if types.is_null(actual):
        return not key
    if declared == STR:
        return _is_text(actual)
    if declared == I64:
        return types.is_integer(actual) or (not key and types.is_floating(actual))
    if declared == F64:
        return number
    if declared == BOOL:
        return types.is_boolean(actual)
    if declared == TIMESTAMP:
        return types.is_timestamp(actual) or number
    if declared == F64_LIST:
        if types.is_list(actual) or types.is_large_list(actual) or types.is_fixed_size_list(actual):
            item = actual.value_type
            return types.is_integer(item) or types.is_floating(item) or types.is_null(item)
        return _is_text(actual)
    return actual == declared


def check_schema(schema: pa.Schema, kind: str, path: Path, file: pq.ParquetFile | None = None) -> None:
    """DamagedResults naming the first column whose stored type does not hold what the schema of a `kind`
    file declares (fits_declared), e.g. a trial_key stored as int64: read beside other files, its rows
    would be brought to one type, value by value, and keys turned to nulls merge. A column the schema
    declares a number but that holds text names a value of it (read from `file`). Columns no task
    declares are kept whatever they hold."""
    declared, keys = declared_types(kind), REQUIRED_COLUMNS[kind]
    for field in schema:
        allowed = declared.get(field.name)
        if not allowed or any(fits_declared(field.type, t, field.name in keys) for t in allowed):
            continue
        wanted = sorted(allowed, key=str)[0]
        if wanted in _NUMBER_KINDS and _is_text(field.type):
            raise DamagedResults(path, _text_in_numbers(field.name, file))
        raise DamagedResults(path, f"column {field.name!r} holds {field.type}, where the file sweep.py writes holds "
                                   f"{_KIND_WORDS.get(wanted, str(wanted))} ({wanted}); allowed: the file sweep.py "
                                   f"writes")


def _text_in_numbers(name: str, file: pq.ParquetFile | None) -> str:
    """Why a number column stored as text is refused, with its first value (read alone: check_cost has
    passed)."""
    values = file.read(columns=[name]).column(name).to_pylist() if file is not None else []
    value = next((v for v in values if v is not None), None)
    shown = repr(value) if value is None or len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return f"column {name!r} holds text (such as {shown}), where the file sweep.py writes holds numbers"


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


TRIALS_LOST = ("the trials it held have no row now, so this run (with --resume) runs them again from their "
               "checkpoints: a finished one is only evaluated again")


def write_table_atomic(table: pa.Table, path: Path) -> None:
    with atomic_file(path) as handle:
        pq.write_table(table, handle)


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


SPACE_ALLOWED = "the JSON object sweep.py writes, with a 'trial_keys' list of trial keys"


def read_space_file(results_dir: str | os.PathLike) -> dict[str, Any] | None:
    """A sweep folder's `space.json` (`results_dir`: the folder, or its trials/epochs Parquet path) as the
    JSON object sweep.py writes, its 'trial_keys' a list of strings; None where there is none.

    The one reader of space.json: the analysis, the compaction's row order, the migration, and the commands
    results/README.md gives to continue a study all read it here, so each gets the same checks: a regular
    file only (a FIFO there would block the reader, issue 59 item 5), at most MAX_SPACE_FILE_BYTES, UTF-8
    JSON. Anything else: ConfigError naming the file, what is wrong and what is allowed."""
    folder = Path(results_dir)
    path = (folder.parent if folder.suffix == ".parquet" else folder) / SPACE_FILE
    try:
        data = read_regular_bytes(path, MAX_SPACE_FILE_BYTES, SPACE_ALLOWED)
        if data is None:
            return None
        space = json.loads(data)
    except ConfigError:  # a FIFO, a device, too large: it names the file, what it is and SPACE_ALLOWED
        raise
    except (OSError, ValueError, RecursionError) as err:  # unreadable, not UTF-8, not JSON
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        raise ConfigError(f"{path} cannot be read as a sweep's {SPACE_FILE} ({reason}); allowed: "
                          f"{SPACE_ALLOWED}") from None
    if not isinstance(space, dict):
        raise ConfigError(f"{path} holds a JSON {type(space).__name__}, not an object; allowed: {SPACE_ALLOWED}")
    keys = space.get("trial_keys")
    if not (isinstance(keys, list) and all(isinstance(key, str) for key in keys)):
        shown = keys if not isinstance(keys, list) else [k for k in keys if not isinstance(k, str)][:1]
        raise ConfigError(f"{path}: field 'trial_keys' has value {str(shown)[:80]!r}"
                          f"{' among its items' if isinstance(keys, list) else ''}; allowed: {SPACE_ALLOWED}")
    return space


def current_keys(results_dir: str | os.PathLike) -> list[str] | None:
    """Trial keys of the sweep's current space, from `space.json` (None: no space.json there); ConfigError
    (read_space_file) for one that is not what sweep.py writes."""
    space = read_space_file(results_dir)
    return None if space is None else space["trial_keys"]


def space_key_scheme(results_dir: str | os.PathLike) -> str | None:
    """The key scheme a folder's space.json records: KEY_SCHEME, or None (written before keys hashed
    resolved configs, or no readable space.json; rpevit.sweep.migrate)."""
    try:
        scheme = (read_space_file(results_dir) or {}).get("key_scheme")
    except ValueError:  # ConfigError: unreadable, read as no scheme (current_keys says what is wrong)
        return None
    return scheme if isinstance(scheme, str) else None


def select_keys(frame: pd.DataFrame, keys: list[str] | set[str] | None,
                column: str = "trial_key") -> tuple[pd.DataFrame, int]:
    """(rows whose `column` (trial_key) is in keys, how many were set aside); everything if keys is None."""
    if keys is None or frame.empty or column not in frame.columns:
        return frame, 0
    mask = frame[column].astype(object).isin(set(keys))  # a hash table of Python str: 10^5 keys in milliseconds
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
    return rows_of_space(frame, current_keys(results_dir), space_key_scheme(results_dir))


def rows_of_space(frame: pd.DataFrame, keys: list[str] | set[str] | None, scheme: str | None) -> tuple[pd.DataFrame, int]:
    """current_rows, given the keys and key scheme its space.json holds: a space.json of the older scheme
    lists the keys rows were stored under (STORED_KEY)."""
    older = scheme != KEY_SCHEME and STORED_KEY in frame.columns
    return select_keys(frame, keys, STORED_KEY if older else "trial_key")
