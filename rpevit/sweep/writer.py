"""`ParquetResults`: the Tune callback in the driver that turns the rows trials report (protocol.Report)
and the failures Tune sees into trials.parquet and epochs.parquet, rewritten atomically through
results.py (schemas, atomic writes, reading back, damaged files: see its docstring)."""
from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

from rpevit.config import TrialConfig, field_types
from rpevit.sweep.protocol import EPOCH, FAILED, OK, SUMMARY, VARIANT_FAILED, Report, members_of
from rpevit.sweep.results import (EPOCHS_FILE, TRIALS_FILE, TRIALS_LOST, DamagedResults, ResultsWriteError, is_missing,
                                  epochs_schema, read_rows, read_table_or_set_aside, remove_stale_temps, set_aside,
                                  to_table, trial_folder, trials_schema, write_table_atomic)

EPOCH_FLUSH_S = 10.0  # epoch rows are batched; trial rows (and pending epochs) flush at once


class ParquetResults(Callback):
    """Collects epoch and summary rows from trials, and failures from Tune, into Parquet."""

    def __init__(self, out_dir: Path, sweep: str, trials: dict[str, dict[str, Any]],
                 order: dict[str, int], task: str | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.sweep = sweep
        self.trials = trials  # trial_key -> config dict
        self.order = order  # trial_key -> index in the space
        self.write_error: ResultsWriteError | None = None  # set when a flush failed: the sweep is stopping
        remove_stale_temps(self.out_dir)  # a sweep starts or resumes here, under its lock
        table, _ = read_table_or_set_aside(self.out_dir / TRIALS_FILE, TRIALS_LOST)
        self.trial_rows = {r["trial_key"]: r for r in (table.to_pylist() if table is not None else [])}
        try:
            self.epoch_rows = {(r["trial_key"], int(r["epoch"])): r for r in read_rows(self.out_dir / EPOCHS_FILE)}
            rebuilt = None
        except DamagedResults as err:
            moved = set_aside(err.path, err.reason)
            self.epoch_rows = {}
            rebuilt = self.rebuild_epochs()
            print(f"warning: {err}; set aside as {moved.name} (kept, not read again); rebuilt "
                  f"{len(self.epoch_rows)} epoch row(s) of {rebuilt} trial(s) from their checkpoints (trials without "
                  f"one report theirs again when they run)", file=sys.stderr, flush=True)
        known = [c.get("task") for c in trials.values()] + [r.get("task") for r in self.trial_rows.values()]
        self.task = task or next((t for t in known if t), TrialConfig.task)
        self._dirty_epochs = False
        self._last_flush = 0.0
        if rebuilt is not None:
            self.flush()

    def rebuild_epochs(self) -> int:
        """Epoch rows from the history in each trial's checkpoint (`trials/<key>/checkpoint.pt`), for the
        trials this writer knows a config of (the space's pending ones, and every one with a row); loaded
        safely and only where the checkpoint matches that config (rpevit.checkpoint). Returns how many
        trials gave rows."""
        from rpevit import checkpoint

        names = set(field_types())
        configs = {**self.trial_rows, **self.trials}
        found = 0
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
                self.epoch_rows[(key, int(row["epoch"]))] = {"sweep": self.sweep, **row, "trial_key": key}
            found += bool(history)
        return found

    # ---- Tune hooks (driver thread) ----
    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        report = Report.from_tune(result)
        if report is None:
            return
        key, row = report.trial_key, report.row
        if report.kind == EPOCH:
            self.epoch_rows[(key, int(row["epoch"]))] = {"sweep": self.sweep, **row, "trial_key": key}
            self._dirty_epochs = True
            if time.monotonic() - self._last_flush > EPOCH_FLUSH_S:
                self.flush()
        elif report.kind == SUMMARY:
            self.trial_rows[key] = {"sweep": self.sweep, **row, "trial_key": key, "status": OK,
                                    "error": "", "error_traceback": "", "tune_trial_id": trial.trial_id}
            self.flush()
        elif report.kind == VARIANT_FAILED:  # one variant of a multi-variant (interleaved timing) trial
            self.record_failure(key, report.error, report.traceback, trial.trial_id, 1)
            self.flush()

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        """Every member of the Tune trial without a row of its own fails with Tune's error."""
        traceback = re.sub(r"\x1b\[[0-9;]*m", "", _error_text(trial))  # no terminal colours
        lines = [ln for ln in traceback.strip().splitlines() if ln.strip()]
        for member in members_of(trial):
            key = member.trial_key
            if key not in self.trial_rows or self.trial_rows[key].get("tune_trial_id") != trial.trial_id:
                self.record_failure(key, lines[-1] if lines else "unknown error (no error file)", traceback,
                                    trial.trial_id, max(1, traceback.count("Failure # ")))  # one entry per try
        self.flush()

    def record_failure(self, key: str, error: str, traceback: str, tune_trial_id: str, attempts: int) -> None:
        self.trial_rows[key] = {
            "sweep": self.sweep, **self.trials[key], "trial_key": key, "status": FAILED, "error": error,
            "error_traceback": traceback[-10000:], "tune_trial_id": tune_trial_id, "attempts": attempts,
            "epochs_done": sum(1 for k, _ in self.epoch_rows if k == key),
        }

    def on_experiment_end(self, trials, **info) -> None:
        if self.write_error is None:
            self.flush()
        # else: Tune is cleaning up after the failed write, whose error is on its way to the runner

    # ---- writing ----
    def flush(self) -> None:
        """Rewrite both files; ResultsWriteError (one line: the folder, the OS error) when the folder
        cannot take them. The rows stay in memory either way."""
        try:
            self._write()
        except OSError as err:  # disk full, read-only folder, quota, ...
            self.write_error = ResultsWriteError(self.out_dir, err)
            raise self.write_error from None
        self.write_error = None
        self._dirty_epochs = False
        self._last_flush = time.monotonic()

    def _write(self) -> None:
        """epochs.parquet first, then trials.parquet: a trial's row is on disk only once its epoch rows
        are, so a write that fails between the two (disk full) leaves the trial without a row, and
        --resume reruns it from its checkpoint, reporting every epoch again."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.epoch_rows or self.task == "train":  # train sweeps always have an epochs file
            rows = sorted(self.epoch_rows.values(),
                          key=lambda r: (self.order.get(r["trial_key"], math.inf), int(r["epoch"])))
            write_table_atomic(to_table(rows, epochs_schema(self.task)), self.out_dir / EPOCHS_FILE)
        if self.trial_rows:
            rows = sorted(self.trial_rows.values(), key=lambda r: self.order.get(r["trial_key"], math.inf))
            for r in rows:  # rows of keys outside the current space keep their old index
                if r["trial_key"] in self.order:
                    r["trial_index"] = self.order[r["trial_key"]]
            write_table_atomic(to_table(rows, trials_schema(self.task)), self.out_dir / TRIALS_FILE)


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and Path(path).exists():
        return Path(path).read_text(errors="replace")
    error = trial.get_pickled_error() if hasattr(trial, "get_pickled_error") else None
    return repr(error) if error is not None else ""
