"""Results written before trial keys hashed the resolved config, brought to today's form.

Until issue 31 (items 2 and 17) a row stored the config as requested, placeholders included
(`patch_size 0`, `batch_size 0`, `lr 0.0`, `warmup_epochs -1`, `augment auto`, `rotinv_basis
auto`), and its trial key hashed those placeholders, so `batch_size: 0` and `batch_size: 128` (the
CIFAR-10 recipe) were two trials of one computation. Now spaces resolve every placeholder
(rpevit.config.resolve_values) before keying, and rows hold what ran. Older results meet that here:

- the driver, under the sweep lock, rewrites an older folder once (`migrate_folder`): config
  columns resolved and keys recomputed in trials.parquet and epochs.parquet (the originals kept
  beside them as `<file>.before-resolved-keys`), checkpoint and TensorBoard folders renamed to the
  new keys; space.json then records `"key_scheme": "resolved"`. Two old rows that resolve to one
  key (the same computation run twice under two spellings) keep one (`preferred_rows`: the first ok
  row, else the first row: a failed spelling never hides a finished one, which --resume would then
  count as failed); the other stays in the kept original, so it is never counted as an independent
  sample. Every trial_key read (both Parquet files, space.json) is checked first
  (rpevit.sweep.results.check_trial_key): a key names folders that are moved, so a row keyed
  `../../x` stops the migration in one line with nothing moved;
- the analysis never writes: it resolves rows in memory (`resolved_frame`) and, for a space.json
  of the older scheme, matches rows by the key they were stored under (`stored_trial_key`).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from rpevit.config import TrialConfig, field_types, recorded_values, resolve_values
from rpevit.sweep.protocol import OK
from rpevit.sweep import store
from rpevit.sweep.results import (EPOCHS_FILE, KEY_SCHEME, SPACE_FILE, STORED_KEY, TRIALS_FILE, DamagedResults,
                                  atomic_file, check_key_column, epochs_schema, is_missing, read_results_table,
                                  read_space_file, space_key_scheme, to_table, trial_folder, trials_schema,
                                  write_table_atomic, write_text_atomic)
from rpevit.sweep.space import Space, seeded_keys, trial_key

BACKUP_SUFFIX = ".before-resolved-keys"
__all__ = ["KEY_SCHEME", "STORED_KEY", "migrate_folder", "resolved_frame", "resolved_row", "space_key_scheme"]


def resolved_config(row: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved config of a stored row (its config columns; absent or empty ones at what their
    code ran, rpevit.config.recorded_values: the first default of a field whose default moved, else
    the default); None for a row without a dataset column (nothing to resolve it against)."""
    names = field_types()
    values = {k: v for k, v in row.items() if k in names and not is_missing(v)}
    if "dataset" not in values:
        return None
    return resolve_values(recorded_values(values))


def resolved_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its config columns resolved and its trial_key recomputed from them. Only the
    columns the row has are rewritten: a column it lacks (a field added after it was written) stays
    absent rather than claiming today's default ran."""
    config = resolved_config(row)
    if config is None:
        return dict(row)
    present = {k: v for k, v in config.items() if k in row and not is_missing(row[k])}
    return {**row, **present, "trial_key": trial_key(config)}


def resolved_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Analysis-side, in memory: every row's config resolved and trial_key recomputed (resolved_row's
    values); the key it was stored under in STORED_KEY (a space.json of the older scheme lists those).
    Rows that resolve to the key of an earlier row are dropped (with one line on stderr), as
    migrate_folder drops them.

    By configuration, not by row: rows that differ only in `seed` (or not at all) resolve alike, so one
    resolve_values per configuration, checked on its first and last row (a configuration whose two
    resolve apart, or change the seed, is resolved row by row), and the keys of its seeds from one
    encoding of its other fields (rpevit.sweep.space.seeded_keys). 10^5 rows of a sweep take seconds."""
    if frame.empty or "trial_key" not in frame.columns or "dataset" not in frame.columns:
        return frame.assign(**{STORED_KEY: frame.get("trial_key", pd.Series(dtype=object))})
    names = [n for n in field_types() if n in frame.columns]
    others = [n for n in names if n != "seed"]
    alike = frame[others].groupby(others, dropna=False, sort=False).ngroup().to_numpy() if others else \
        np.zeros(len(frame), dtype=np.int64)
    groups = list(pd.Series(np.arange(len(frame))).groupby(alike).indices.values())
    ends = frame.iloc[[g[0] for g in groups] + [g[-1] for g in groups]][[*names, "trial_key"]].to_dict("records")
    seeds = frame["seed"].astype(object).where(frame["seed"].notna(), None).tolist() if "seed" in names else \
        [None] * len(frame)
    resolved_keys = frame["trial_key"].to_numpy(dtype=object, copy=True)
    values: dict[str, np.ndarray] = {}  # the columns resolving changed (Python values, as resolved_row sees them)

    def writable(name: str) -> np.ndarray:
        if name not in values:
            values[name] = frame[name].to_numpy(dtype=object, copy=True)
        return values[name]

    for rows, first, last in zip(groups, ends[:len(groups)], ends[len(groups):]):
        found = _resolve_alike(first, last, [seeds[i] for i in rows])
        if found is None:  # resolution depends on the seed here: row by row, as resolved_row does
            for i, row in zip(rows, frame.iloc[rows][[*names, "trial_key"]].to_dict("records")):
                row = resolved_row(row)
                for name in names:
                    writable(name)[i] = row[name]
                resolved_keys[i] = row["trial_key"]
            continue
        changed, keys = found
        for name, value in changed.items():
            if type(first[name]) is not type(value) or first[name] != value:  # alike rows hold one value here
                writable(name)[rows] = value
        resolved_keys[rows] = keys
    out = frame.copy()
    for name in ("trial_key", *(n for n in names if n in values)):  # config columns only
        column = pd.Series(resolved_keys if name == "trial_key" else values[name], index=frame.index)
        try:
            out[name] = column.astype(frame[name].dtype)
        except (TypeError, ValueError):
            out[name] = column
    out[STORED_KEY] = frame["trial_key"].to_numpy()
    if out["trial_key"].is_unique:
        return out
    statuses = frame["status"].tolist() if "status" in frame.columns else [None] * len(frame)
    kept = set(preferred_rows(out["trial_key"].tolist(), statuses).values())
    twice = pd.Series([i not in kept for i in range(len(out))], index=out.index)  # one computation: counted once
    if twice.any():
        print(f"warning: {int(twice.sum())} row(s) repeat the resolved config of another row (one computation "
              f"stored under two spellings of its config): each is counted once, by its ok row where it has one",
              file=sys.stderr, flush=True)
        out = out[~twice]
    return out


def _resolve_alike(first: dict[str, Any], last: dict[str, Any], seeds: list[Any]
                   ) -> tuple[dict[str, Any], list[str]] | None:
    """For rows that differ only in seed (first and last of them given, their seeds in order): (the
    config columns resolution sets, as resolved_row sets them on each, the rows' keys), from one
    resolution. None where each row must be resolved on its own: they have no dataset, or first and
    last resolve apart, or resolution changes a seed."""
    config, other = resolved_config(first), resolved_config(last)
    if config is None or other is None:
        return None
    if {k: v for k, v in config.items() if k != "seed"} != {k: v for k, v in other.items() if k != "seed"}:
        return None
    if any(not is_missing(r.get("seed")) and r.get("seed") != c["seed"] for r, c in ((first, config), (last, other))):
        return None
    present = {k: config[k] for k in config if k in first and not is_missing(first[k]) and k != "seed"}
    return present, seeded_keys(config, [TrialConfig.seed if is_missing(s) else s for s in seeds])


def preferred_rows(keys: Sequence[str], statuses: Sequence[Any]) -> dict[str, int]:
    """key -> the index of the row that stands for it among rows that resolve to one key: its first ok
    row, else its first row (a failed second spelling must not hide a finished one). In the order
    the keys first appear."""
    chosen: dict[str, int] = {}
    for i, (key, status) in enumerate(zip(keys, statuses)):
        if key not in chosen or (status == OK and statuses[chosen[key]] != OK):
            chosen[key] = i
    return chosen


def migrate_folder(out_dir: Path, space: Space | None = None) -> str | None:
    """Rewrite a sweep folder of the older key scheme (driver only, under the sweep lock); returns one
    line saying what moved, or None when there was nothing to do. space.legacy_keys also renames the
    checkpoint folders of trials that had not written a row yet."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or space_key_scheme(out_dir) == KEY_SCHEME:
        return None
    trials_path, epochs_path = out_dir / TRIALS_FILE, out_dir / EPOCHS_FILE
    try:
        store.compact(out_dir)  # parts a writer left (no space.json yet): the rows below are then all in the files
        trial_rows, epoch_rows = (original_rows(path) for path in (trials_path, epochs_path))
    except DamagedResults:
        return None  # the driver sets a damaged file aside and rebuilds (rpevit.sweep.results); nothing to migrate
    for path, rows in ((trials_path, trial_rows), (epochs_path, epoch_rows)):  # before anything moves
        check_key_column([r["trial_key"] for r in rows], path)
    space_file = _read_space_file(out_dir)
    if space_file is not None:
        check_key_column(space_file["trial_keys"], out_dir / SPACE_FILE)
    resolved = [resolved_row(row) for row in trial_rows]
    chosen = preferred_rows([r["trial_key"] for r in resolved], [r.get("status") for r in trial_rows])
    kept = {key: resolved[i] for key, i in chosen.items()}
    owner = {key: trial_rows[i]["trial_key"] for key, i in chosen.items()}  # new key -> stored key of its row
    dropped = len(trial_rows) - len(kept)  # second spellings of one computation: in the kept original only
    renamed = {old: new for new, old in owner.items()}  # the kept rows' folders first: they win a rename
    for row, new in zip(trial_rows, resolved):
        renamed.setdefault(row["trial_key"], new["trial_key"])
    if space is not None:
        for new_key, old_key in space.legacy_keys.items():
            renamed.setdefault(old_key, new_key)
    changed = {old: new for old, new in renamed.items() if old != new}
    rows_changed = any(_differs(new, old) for new, old in zip(resolved, trial_rows))
    folders = _rename_folders(out_dir, changed)
    if rows_changed or dropped:
        for path in (epochs_path, trials_path):
            if path.is_file() and not backup(path).is_file():  # one made by an interrupted run is the original
                with open(path, "rb") as source, atomic_file(backup(path)) as copy:
                    shutil.copyfileobj(source, copy)
        task = next((r.get("task") for r in trial_rows if r.get("task")), None) or (space.task if space else "train")
        if epoch_rows:
            epochs = {}
            for row in epoch_rows:
                key = changed.get(row["trial_key"], row["trial_key"])
                if owner.get(key, row["trial_key"]) != row["trial_key"]:
                    continue  # the epochs of a dropped second spelling stay in the kept original
                epochs.setdefault((key, int(row["epoch"])), {**row, "trial_key": key})
            write_table_atomic(to_table(list(epochs.values()), epochs_schema(task)), epochs_path)
        write_table_atomic(to_table(list(kept.values()), trials_schema(task)), trials_path)
    _rewrite_space_keys(out_dir, space_file, changed)
    if not (rows_changed or dropped or folders):
        return None
    extra = f"; {dropped} duplicate row(s) of one computation kept only in the original" if dropped else ""
    return (f"{out_dir}: results of the older key scheme brought to resolved configs: {len(kept)} row(s), "
            f"{len(changed)} key(s) changed, {folders} checkpoint folder(s) renamed{extra} (originals kept as "
            f"*{BACKUP_SUFFIX})")


def backup(path: Path) -> Path:
    """Where the migration keeps a results file's original: `<file>.before-resolved-keys`."""
    return path.with_name(path.name + BACKUP_SUFFIX)


def original_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a migration starts from: the original an earlier run kept and was killed before its end
    (it rewrites epochs.parquet, then trials.parquet, then space.json: a kill between them left files
    already re-keyed beside ones that are not, and a second run that read those dropped the epoch rows of
    every re-keyed trial and overwrote the kept original with them), else the file's rows (compacted)."""
    kept = backup(path)
    if kept.is_file():
        table = read_results_table(kept, kind=path.name)
        return table.to_pylist() if table is not None else []
    return store.read_rows(path) if path.is_file() else []


def _differs(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether resolving changed a row (its key or a config value; empty equals empty)."""
    for name in ("trial_key", *field_types()):
        a, b = new.get(name), old.get(name)
        if not (a == b or (is_missing(a) and is_missing(b))):
            return True
    return False


def _rename_folders(out_dir: Path, changed: dict[str, str]) -> int:
    """trials/<old> and tensorboard/<old> -> <new> where the new one does not exist yet (no links)."""
    moved = 0
    for parent in (out_dir / "trials", out_dir / "tensorboard"):
        for old, new in changed.items():
            source, target = trial_folder(parent, old), trial_folder(parent, new)
            if source.is_dir() and not source.is_symlink() and not target.exists():
                os.replace(source, target)
                moved += parent.name == "trials"
    return moved


def _read_space_file(out_dir: Path) -> dict[str, Any] | None:
    """space.json as a dict with a 'trial_keys' list (results.read_space_file: a FIFO is never opened); None
    where there is none or it is not one (the runner rewrites it from the space right after)."""
    try:
        return read_space_file(out_dir)
    except ValueError:  # ConfigError
        return None


def _rewrite_space_keys(out_dir: Path, space: dict[str, Any] | None, changed: dict[str, str]) -> None:
    """space.json's keys mapped to the new scheme, and the scheme recorded (the runner rewrites it
    from the space right after; the analysis may read it first)."""
    if space is None:
        return
    space = {**space, "trial_keys": list(dict.fromkeys(changed.get(k, k) for k in space["trial_keys"])),
             "key_scheme": KEY_SCHEME}
    write_text_atomic(out_dir / SPACE_FILE, json.dumps(space, indent=1))


def main(argv: list[str] | None = None) -> int:
    """`python -m rpevit.sweep.migrate FOLDER...`: migrate sweep folders now, without running a sweep
    (`sweep.py --resume` does the same on its own folder). Each folder is locked as a driver locks it."""
    from rpevit.sweep.compact import run_on_folders

    return run_on_folders(argv, main.__doc__.splitlines()[0], lambda folder: migrate_folder(folder) or
                          f"{folder}: already in the resolved key scheme, nothing to do")


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool

    run_tool(main)
