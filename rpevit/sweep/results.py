"""Driver-side results: trials.parquet (one row per trial) and epochs.parquet (per trial-epoch).

A `ray.tune.Callback` receives every row the trials report and rewrites the two files
atomically (temporary file + os.replace), so a kill never leaves a torn file. Rows are keyed by
trial_key (and epoch) and the files are read back on `--resume`, so nothing is duplicated.
"""
from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from ray.tune import Callback

TRIALS_FILE = "trials.parquet"
EPOCHS_FILE = "epochs.parquet"
OK, FAILED = "ok", "failed"
LEADING_COLUMNS = ("sweep", "trial_index", "trial_key", "status", "error", "task", "dataset", "attention", "pe",
                   "seed", "test_acc", "final_val_acc")
EPOCH_FLUSH_S = 10.0  # epoch rows are batched; trial rows (and pending epochs) flush at once


def write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    return pd.read_parquet(path).to_dict("records") if path.exists() else []


def load_trials(out_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(out_dir / TRIALS_FILE) if (out_dir / TRIALS_FILE).exists() else pd.DataFrame()


class ParquetResults(Callback):
    """Collects epoch and summary rows from trials, and failures from Tune, into Parquet."""

    def __init__(self, out_dir: Path, sweep: str, trials: dict[str, dict[str, Any]],
                 order: dict[str, int], on_change: Callable[[], None] | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.sweep = sweep
        self.trials = trials  # trial_key -> config dict
        self.order = order  # trial_key -> index in the space
        self.on_change = on_change
        self.trial_rows = {r["trial_key"]: r for r in read_rows(self.out_dir / TRIALS_FILE)}
        self.epoch_rows = {(r["trial_key"], int(r["epoch"])): r for r in read_rows(self.out_dir / EPOCHS_FILE)}
        self._dirty_epochs = False
        self._last_flush = 0.0

    # ---- Tune hooks (driver thread) ----
    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        kind, row = result.get("row_kind"), result.get("row")
        if kind == "epoch":
            key = result["trial_key"]
            self.epoch_rows[(key, int(row["epoch"]))] = {"sweep": self.sweep, "trial_key": key, **row}
            self._dirty_epochs = True
            if time.monotonic() - self._last_flush > EPOCH_FLUSH_S:
                self.flush()
        elif kind == "summary":
            key = result["trial_key"]
            self.trial_rows[key] = {"sweep": self.sweep, **row, "trial_key": key, "status": OK,
                                    "error": "", "error_traceback": "", "tune_trial_id": trial.trial_id}
            self.flush()

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        key = trial.config["t"]["trial_key"]
        traceback = re.sub(r"\x1b\[[0-9;]*m", "", _error_text(trial))  # no terminal colours
        lines = [ln for ln in traceback.strip().splitlines() if ln.strip()]
        self.trial_rows[key] = {
            "sweep": self.sweep, **self.trials[key], "trial_key": key, "status": FAILED,
            "error": lines[-1] if lines else "unknown error (no error file)",
            "error_traceback": traceback[-10000:], "tune_trial_id": trial.trial_id,
            "attempts": max(1, traceback.count("Failure # ")),  # Tune logs one entry per try
            "epochs_done": sum(1 for k, _ in self.epoch_rows if k == key),
        }
        self.flush()

    def on_experiment_end(self, trials, **info) -> None:
        self.flush()

    # ---- writing ----
    def flush(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.trial_rows:
            rows = sorted(self.trial_rows.values(), key=lambda r: self.order.get(r["trial_key"], math.inf))
            for r in rows:
                r["trial_index"] = self.order.get(r["trial_key"], -1)
            write_parquet_atomic(_frame(rows, LEADING_COLUMNS), self.out_dir / TRIALS_FILE)
        if self.epoch_rows:
            rows = sorted(self.epoch_rows.values(),
                          key=lambda r: (self.order.get(r["trial_key"], math.inf), int(r["epoch"])))
            write_parquet_atomic(_frame(rows), self.out_dir / EPOCHS_FILE)
        self._dirty_epochs = False
        self._last_flush = time.monotonic()
        if self.on_change is not None:
            self.on_change()


def _frame(rows: list[dict[str, Any]], leading: tuple[str, ...] = ()) -> pd.DataFrame:
    """Rows with differing keys -> one frame; object columns mixing types become strings."""
    frame = pd.DataFrame(rows)
    first = [c for c in leading if c in frame.columns]
    frame = frame[first + [c for c in frame.columns if c not in first]]
    for col in frame.columns[frame.dtypes == object]:
        values = frame[col].dropna()
        if len({type(v) for v in values}) > 1:
            frame[col] = frame[col].map(lambda v: v if v is None or isinstance(v, str) else str(v))
    return frame


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and Path(path).exists():
        return Path(path).read_text(errors="replace")
    error = trial.get_pickled_error() if hasattr(trial, "get_pickled_error") else None
    return repr(error) if error is not None else ""
