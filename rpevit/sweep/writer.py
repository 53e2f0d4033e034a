"""`ParquetResults`: the Tune callback in the driver that turns the rows trials report (protocol.Report)
and the failures Tune sees into trials.parquet and epochs.parquet. Each flush appends only its new
rows, as parts of the append-only store (rpevit.sweep.store: parts, merges, compaction, reading), so
a trial's end costs the same at the thousandth trial and at the hundred-thousandth; the store is
compacted into the two files when a Tuner run ends (and when a driver starts on a folder a killed one
left). Schemas, atomic writes, damaged files: rpevit.sweep.results.

The callback keeps no rows: only what its bookkeeping needs per trial of this run (the status and
Tune trial of the row that stands for it, the epochs it reported, as bits), a few hundred bytes a
trial, and the rows of the flush being written."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from ray.tune import Callback

from rpevit.config import TrialConfig, field_types
from rpevit.sweep import store
from rpevit.sweep.protocol import EPOCH, FAILED, OK, SUMMARY, VARIANT_FAILED, Report, members_of
from rpevit.sweep.results import (EPOCHS_FILE, TRIALS_FILE, TRIALS_LOST, ResultsWriteError, epochs_schema,
                                  is_missing, read_regular_bytes, remove_stale_temps, to_table, trial_folder,
                                  trials_schema)

EPOCH_FLUSH_S = 10.0  # epoch rows are batched; trial rows (and pending epochs) flush at once
EPOCH_BITS = 1 << 16  # epochs 0 .. 65535 are counted in one int's bits per trial; others in a set


class ParquetResults(Callback):
    """Collects epoch and summary rows from trials, and failures from Tune, into Parquet."""

    def __init__(self, out_dir: Path, sweep: str, trials: dict[str, dict[str, Any]],
                 order: dict[str, int], task: str | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.sweep = sweep
        self.trials = trials  # trial_key -> config dict (the trials this run may run)
        self.order = order  # trial_key -> index in the space
        self.write_error: ResultsWriteError | None = None  # set when a flush failed: the sweep is stopping
        self.pending: dict[str, list[dict[str, Any]]] = {kind: [] for kind in store.KINDS}  # the next flush's rows
        self.standing: dict[str, tuple[Any, Any]] = {}  # key -> (status, tune_trial_id) of the row that counts
        self.epoch_bits: dict[str, int] = {}  # key -> bit e set for each epoch e it has a row of
        self.odd_epochs: dict[str, set[int]] = {}  # epochs outside 0 .. EPOCH_BITS - 1
        remove_stale_temps(self.out_dir)  # a sweep starts or resumes here, under its lock
        remove_stale_temps(self.out_dir / store.PARTS_DIR, store.PART_TEMPS)
        stored, _ = store.driver_table(self.out_dir / TRIALS_FILE, TRIALS_LOST, columns=["task", "tune_trial_id"])
        self._know_stored(stored)
        known = [c.get("task") for c in trials.values()]
        if stored is not None and "task" in stored.column_names:
            known += pc.unique(pc.drop_null(stored.column("task"))).to_pylist()
        self.task = task or next((t for t in known if t), TrialConfig.task)
        self.schemas = {EPOCHS_FILE: epochs_schema(self.task), TRIALS_FILE: trials_schema(self.task)}
        epochs, damaged = store.driver_table(self.out_dir / EPOCHS_FILE, None, columns=[])
        self._know_epochs(epochs)
        if damaged:
            rows, found = self.rebuild_epochs()
            for err, moved in damaged:
                print(f"warning: {err}; set aside as {moved.name} (kept, not read again); rebuilt {rows} epoch "
                      f"row(s) of {found} trial(s) from their checkpoints (trials without one report theirs again "
                      f"when they run)", file=sys.stderr, flush=True)
        self.parts = store.PartLog(self.out_dir)
        self._last_flush = 0.0
        if damaged or any(self.parts.parts.values()):  # rebuilt rows, or parts a killed driver left
            self.finish()

    def _know_stored(self, table) -> None:
        """The standing row (status, Tune trial) of each trial of this run that has one already."""
        if table is None:
            return
        mine = table.filter(pc.is_in(table.column("trial_key"), value_set=_keys(self.trials)))
        trial_ids = mine.column("tune_trial_id").to_pylist() if "tune_trial_id" in mine.column_names \
            else [None] * mine.num_rows
        for key, status, trial_id in zip(mine.column("trial_key").to_pylist(), mine.column("status").to_pylist(),
                                         trial_ids):
            self.standing[key] = (status, trial_id)

    def _know_epochs(self, table) -> None:
        """The epochs already stored of each trial of this run (epochs_done counts them, as before)."""
        if table is None:
            return
        mine = table.filter(pc.is_in(table.column("trial_key"), value_set=_keys(self.trials)))
        for key, epoch in zip(mine.column("trial_key").to_pylist(), mine.column("epoch").to_pylist()):
            if epoch is not None:
                self._see_epoch(key, int(epoch))

    def _see_epoch(self, key: str, epoch: int) -> None:
        if 0 <= epoch < EPOCH_BITS:
            self.epoch_bits[key] = self.epoch_bits.get(key, 0) | (1 << epoch)
        else:
            self.odd_epochs.setdefault(key, set()).add(epoch)

    def epochs_done(self, key: str) -> int:
        """How many distinct epochs `key` has rows of (stored before this run, or reported in it)."""
        return self.epoch_bits.get(key, 0).bit_count() + len(self.odd_epochs.get(key, ()))

    def rebuild_epochs(self) -> tuple[int, int]:
        """Epoch rows from the history in each trial's checkpoint (`trials/<key>/checkpoint.pt`), for the
        trials this writer knows a config of (the space's pending ones, and every one with a row); loaded
        safely and only where the checkpoint matches that config (rpevit.checkpoint). Queued for the next
        flush; returns (rows, trials that gave rows)."""
        from rpevit import checkpoint

        names = set(field_types())
        stored = store.read_table(self.out_dir / TRIALS_FILE)
        configs = {**{r["trial_key"]: r for r in (stored.to_pylist() if stored is not None else [])}, **self.trials}
        rows = found = 0
        for key, values in configs.items():
            path = trial_folder(self.out_dir / "trials", key) / checkpoint.CHECKPOINT_NAME
            if not path.is_file() or path.is_symlink():
                continue
            try:
                cfg = TrialConfig.from_dict({n: v for n, v in values.items() if n in names and not is_missing(v)})
                state = checkpoint.load(path)
                checkpoint.check_matches(state, cfg, path, extend_epochs=True)
                history = [dict(row) for row in state["history"]]
            except Exception:  # noqa: BLE001 - a checkpoint that cannot give rows gives none; its trial reruns
                continue
            for row in history:  # the key is this trial's, whatever a checkpoint's row says
                self._add_epoch(key, row)
            rows += len(history)
            found += bool(history)
        return rows, found

    def _add_epoch(self, key: str, row: dict[str, Any]) -> None:
        self.pending[EPOCHS_FILE].append({"sweep": self.sweep, **row, "trial_key": key})
        self._see_epoch(key, int(row["epoch"]))

    # ---- Tune hooks (driver thread) ----
    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        report = Report.from_tune(result)
        if report is None:
            return
        key, row = report.trial_key, report.row
        if report.kind == EPOCH:
            self._add_epoch(key, row)
            if time.monotonic() - self._last_flush > EPOCH_FLUSH_S:
                self.flush()
        elif report.kind == SUMMARY:
            self._add_trial({"sweep": self.sweep, **row, "trial_key": key, "status": OK, "error": "",
                             "error_traceback": "", "tune_trial_id": trial.trial_id,
                             "attempts": tries(trial)})
            self.flush()
        elif report.kind == VARIANT_FAILED:  # a fused or interleaved member, or a diverged trial (not retried)
            self.record_failure(key, report.error, report.traceback, trial.trial_id, tries(trial))
            self.flush()

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        """Every member of the Tune trial without a row of its own fails with Tune's error."""
        traceback = trial_traceback(trial)
        for member in members_of(trial):
            key = member.trial_key
            if key not in self.standing or self.standing[key][1] != trial.trial_id:
                self.record_failure(key, error_line(traceback), traceback,
                                    trial.trial_id, max(1, traceback.count("Failure # ")))  # one entry per try
        self.flush()

    def record_failure(self, key: str, error: str, traceback: str, tune_trial_id: str, attempts: int) -> None:
        self._add_trial({
            "sweep": self.sweep, **self.trials[key], "trial_key": key, "status": FAILED,
            "error": " ".join(error.split())[:ERROR_CHARS],
            "error_traceback": traceback[-10000:], "tune_trial_id": tune_trial_id, "attempts": attempts,
            "epochs_done": self.epochs_done(key),
        })

    def _add_trial(self, row: dict[str, Any]) -> None:
        """Queue a trial row (its trial_index: the key's place in the space, for keys in it) and keep
        which row stands for the key, by the store's rule: an ok row is never replaced by a failed one."""
        key = row["trial_key"]
        if key in self.order:
            row["trial_index"] = self.order[key]
        self.pending[TRIALS_FILE].append(row)
        if row["status"] == OK or self.standing.get(key, (None,))[0] != OK:
            self.standing[key] = (row["status"], row.get("tune_trial_id"))

    def on_experiment_end(self, trials, **info) -> None:
        if self.write_error is None:
            self.finish()
        # else: Tune is cleaning up after the failed write, whose error is on its way to the runner

    # ---- writing ----
    def flush(self) -> None:
        """Append the rows reported since the last flush as parts (epochs before trials: a trial's row is
        on disk only once its epoch rows are, so a write that fails between the two leaves the trial
        without a row, and --resume reruns it from its checkpoint, reporting every epoch again).
        ResultsWriteError (one line: the folder, the OS error) when the folder cannot take them; rows
        not written stay queued."""
        self._writing(self._append)
        self._last_flush = time.monotonic()

    def finish(self) -> None:
        """flush(), then compact the store into trials.parquet and epochs.parquet (rows in the space's
        order, trial_index from it; a train sweep always has an epochs.parquet)."""
        self.flush()
        self._writing(self._compact)

    def _writing(self, step) -> None:
        try:
            step()
        except OSError as err:  # disk full, read-only folder, quota, ...
            self.write_error = ResultsWriteError(self.out_dir, err)
            raise self.write_error from None
        self.write_error = None

    def _append(self) -> None:
        if not any(self.pending.values()):
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        sequence = self.parts.next_sequence()
        for kind in store.KINDS:
            if self.pending[kind]:
                self.parts.append(kind, to_table(self.pending[kind], self.schemas[kind]), sequence)
                self.pending[kind] = []
                self.parts.merge_tail(kind)

    def _compact(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        store.compact(self.out_dir, self.order, self.task, keep_empty=(EPOCHS_FILE,) if self.task == "train" else ())
        self.parts = store.PartLog(self.out_dir)


def _keys(keys: Any) -> pa.Array:
    return pa.array(list(keys), type=pa.string())


MAX_ERROR_FILE_BYTES = 16 * 2**20  # Tune's error.txt of one trial: a traceback per failure, far below
ERROR_CHARS = 2000  # a trial row's `error`: the whole message of the exception that ended it, as one line
# the line that starts an exception's message in a traceback: `rpevit.data.DataError: ...`, `ValueError: ...`
# (Ray's `ray.exceptions.RayTaskError(DataError): ray::ImplicitFunc.train() ...` too; continuation lines of a
# message, `Tried https://...`, `<urlopen error ...>`, `); put mnist.npz ...`, do not match)
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:\([\w.]+\))?: \S")


def tries(trial) -> int:
    """How many times Tune ran the trial: its failed tries (Tune's `num_failures`, counted before each retry under
    --max-failures) plus the one that reported. An ok row of a trial retried after a killed worker or a lost node
    says so here, not only through `resumed_from_epoch` (which a --resume of a stopped sweep sets too)."""
    return int(getattr(trial, "num_failures", 0) or 0) + 1


def trial_traceback(trial) -> str:
    """Tune's error text of a failed trial (its error file), without terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", _error_text(trial))


def error_line(traceback: str) -> str:
    """The error of a traceback as one line: the last exception's type and its WHOLE message (from its
    first line to the end, whitespace joined), not the traceback's last line, which for a message of
    several lines (a download error quoting the server's answers) was a fragment such as `); put
    mnist.npz ...`. The traceback itself is kept whole in the row's error_traceback."""
    lines = [line.rstrip() for line in traceback.strip().splitlines()]
    if not any(line.strip() for line in lines):
        return "unknown error (no error file)"
    start = next((i for i in range(len(lines) - 1, -1, -1) if _EXCEPTION_LINE.match(lines[i])), None)
    if start is None:  # no exception line: the last non-empty line, as before
        return next(line.strip() for line in reversed(lines) if line.strip())
    return " ".join(" ".join(lines[start:]).split())[:ERROR_CHARS]


def _error_text(trial) -> str:
    """Tune's text error file of a trial ("" where there is none: error_line then says so). Never its pickled
    twin (error.pkl, `Trial.get_pickled_error`): a file is untrusted and is never unpickled, and Ray writes the
    text file, with the same error, every time it writes the pickle (Trial.handle_error)."""
    path = getattr(trial, "error_file", None)
    if not path:
        return ""
    try:  # a regular file only: a FIFO there would block the driver's callback
        data = read_regular_bytes(Path(path), MAX_ERROR_FILE_BYTES, "the error file Tune writes")
    except (OSError, ValueError) as err:  # ConfigError is a ValueError: the reason stands in for the text
        return f"{type(err).__name__}: {err}"
    return (data or b"").decode("utf-8", errors="replace")
