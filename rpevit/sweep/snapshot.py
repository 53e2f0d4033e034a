"""`python -m rpevit.sweep.snapshot SWEEP_FOLDER DEST`: a sweep's rows so far, written whole into DEST,
while its driver runs or after it stopped.

Why: a long study (days on a 2-core CPU, or a cluster job that meets its time limit) is published in
pieces: its rows so far are committed at each stop while it continues. Copying trials.parquet by hand
misses every row still in parts/ (the store keeps a running sweep's new rows there until it compacts,
rpevit.sweep.store), and `python -m rpevit.sweep.compact` needs the sweep lock, so the driver stopped.
This reads what `read_frame` reads (the compacted file and the live parts, deduplicated; readers never
lock and are safe beside a running driver) and writes DEST/trials.parquet and DEST/epochs.parquet whole,
with the sweep's space.json and declaration.json beside them: DEST reads as a compacted sweep folder.

- Trials are read before epochs: the driver writes a flush's epoch rows before its trial rows, so every
  trial row in DEST has all the epoch rows it had when it was written (a running trial may have more
  epoch rows than trial rows: those of its epochs so far).
- Checkpoints, logs, Ray's and TensorBoard's files are not copied (never commit checkpoints).
- Every write is atomic and never through a link (rpevit.sweep.results.atomic_file); a sweep folder that
  holds links is refused, as a driver refuses it, and so is a DEST that is the sweep folder itself or a
  sweep's own folder (it has parts/, .sweep.lock, trials/ or tensorboard/: its parts would be read into the
  copy's rows, or a finished sweep's results replaced), a DEST holding a copy of another sweep, and a DEST
  holding a side file the sweep lacks (it would stay beside rows it does not describe).
- Only regular files are opened (a FIFO in parts/ or as space.json would block the copy forever), and
  each Parquet file is checked before its rows are read (rpevit.sweep.results.read_results_table).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from rpevit.config import ConfigError
from rpevit.sweep import store
from rpevit.sweep.declaration import DECLARATION_FILE
from rpevit.sweep.lock import LOCK_FILE, refuse_links
from rpevit.sweep.protocol import OK
from rpevit.sweep.results import (EPOCHS_FILE, MAX_SPACE_FILE_BYTES, SPACE_FILE, TENSORBOARD_DIR, TRIALS_FILE,
                                  atomic_file, read_regular_bytes, read_results_table, write_table_atomic)

SIDE_FILES = (SPACE_FILE, DECLARATION_FILE)  # copied when the sweep folder has them
MAX_SIDE_FILE_BYTES = MAX_SPACE_FILE_BYTES
# what only a sweep's own folder holds (a copy holds none): its parts would be read as rows of the copy, and a
# finished sweep's compacted files and declaration.json would be replaced by another sweep's (issue 59, item 7)
SWEEP_MARKS = ((f"{store.PARTS_DIR}/", "its parts would be read as rows of the copy"),
               (LOCK_FILE, "a driver ran there: the copy would replace that sweep's own results"),
               ("trials/", "its checkpoints: the copy would replace that sweep's own results"),
               (f"{TENSORBOARD_DIR}/", "its curves: the copy would replace that sweep's own results"))


@dataclass(frozen=True)
class Snapshot:
    """What snapshot() wrote: trial rows (and how many ok), epoch rows, the side files copied."""
    dest: Path
    trials: int
    ok: int
    epochs: int
    copied: tuple[str, ...]

    def line(self, source: Path) -> str:
        side = f", {', '.join(self.copied)}" if self.copied else ""
        return (f"{source} -> {self.dest}: {self.trials} trial row(s) ({self.ok} ok, {self.trials - self.ok} not ok), "
                f"{self.epochs} epoch row(s){side}")


def check_folders(source: Path, dest: Path) -> None:
    """ConfigError (one line, naming the folder) for a pair snapshot() must not write."""
    if not any(store.holds_rows(source, kind) for kind in store.KINDS):
        raise ConfigError(f"{source} holds no {TRIALS_FILE} or {EPOCHS_FILE} (nor parts of them); allowed: a sweep "
                          f"folder that has written rows")
    refuse_links(source)
    if dest.is_symlink():
        raise ConfigError(f"destination {dest} is a symbolic link (to {os.readlink(dest)!r}); allowed: a folder or "
                          f"nothing there: snapshots never write through a link")
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"destination {dest} exists and is not a folder; allowed: a folder or nothing there")
    if dest.resolve() == source.resolve():
        raise ConfigError(f"destination {dest} is the sweep folder itself; allowed: another folder (the snapshot "
                          f"would replace the driver's own files)")
    planted = [name for name in (*store.KINDS, *SIDE_FILES) if (dest / name).is_symlink()]
    if planted:
        raise ConfigError(f"destination {dest / planted[0]} is a symbolic link (to {os.readlink(dest / planted[0])!r}); "
                          f"allowed: a regular file or nothing there: snapshots never write through a link")
    for mark, why in SWEEP_MARKS:
        if os.path.lexists(dest / mark):
            raise ConfigError(f"destination {dest} holds {mark}, so it is a sweep's own folder; allowed: a folder for "
                              f"copies ({why})")


def check_same_sweep(source: Path, dest: Path, names: set[str], side: dict[str, bytes]) -> None:
    """ConfigError (one line) where DEST already holds another sweep's copy, or a side file the sweep folder
    lacks: a snapshot replaces trials.parquet, epochs.parquet and the side files the sweep has, so such a
    file would stay beside rows it does not describe (a snapshot of one study into another's folder once
    left that study's declaration.json over the first one's rows, and its answers read as declared).
    `names`: the sweep's names (its space.json's and its rows' `sweep`)."""
    stale = [name for name in SIDE_FILES if name not in side and os.path.lexists(dest / name)]
    if stale:
        raise ConfigError(f"destination {dest / stale[0]} is not {source}'s ({source} has no {stale[0]}): it would "
                          f"stay beside rows it does not describe; allowed: a folder without it (move it away, keep "
                          f"it) or a new folder")
    held = _sweep_names(dest, read_rows=True)
    if names and held and not names & held:
        raise ConfigError(f"destination {dest} holds a copy of sweep {sorted(held)[0]!r}, and {source} is sweep "
                          f"{sorted(names)[0]!r}; allowed: a new folder, or one holding an earlier copy of the same "
                          f"sweep (a copy never mixes two studies' files)")


def _sweep_names(folder: Path, read_rows: bool, space: bytes | None = None, trials: pa.Table | None = None
                 ) -> set[str]:
    """The sweep names a folder's files give: its space.json's `name` (`space`: its bytes, read already) and
    the `sweep` column of its trials (`trials`, or read from the folder when read_rows). A file that cannot
    be read gives none (it is about to be replaced)."""
    names: set[str] = set()
    try:
        if space is None:
            space = read_regular_bytes(folder / SPACE_FILE, MAX_SIDE_FILE_BYTES, "")
        found = json.loads(space).get("name") if space else None
        if isinstance(found, str) and found:
            names.add(found)
    except (ValueError, AttributeError, RecursionError, OSError):  # ConfigError is a ValueError
        pass
    if trials is None and read_rows:
        try:
            trials = read_results_table(folder / TRIALS_FILE, columns=["sweep"])
        except (ValueError, OSError):  # DamagedResults: replaced by the copy
            trials = None
    if trials is not None and "sweep" in trials.column_names:
        names |= {n for n in pc.unique(trials.column("sweep")).to_pylist() if isinstance(n, str) and n}
    return names


def snapshot(source: str | os.PathLike, dest: str | os.PathLike) -> Snapshot:
    """Write `source`'s rows so far (module docstring) into `dest`; ConfigError (DamagedResults,
    LinkRefused, ...) before anything is written where a folder or file is refused or unreadable."""
    source, dest = Path(source), Path(dest)
    check_folders(source, dest)
    trials = store.read_table(source / TRIALS_FILE)  # before the epochs: module docstring
    epochs = store.read_table(source / EPOCHS_FILE)
    side = {}
    for name in SIDE_FILES:  # regular files only: a FIFO would block the copy (issue 59, item 5)
        data = read_regular_bytes(source / name, MAX_SIDE_FILE_BYTES,
                                  f"the file the sweep wrote (a regular file of at most {MAX_SIDE_FILE_BYTES:,} bytes)")
        if data is not None:
            side[name] = data
    check_same_sweep(source, dest, _sweep_names(source, False, side.get(SPACE_FILE, b""), trials), side)
    dest.mkdir(parents=True, exist_ok=True)
    tables = {TRIALS_FILE: trials, EPOCHS_FILE: epochs}
    for kind in store.KINDS:  # epochs first, as the driver writes them
        if tables[kind] is not None:
            write_table_atomic(tables[kind], dest / kind)
    for name, data in side.items():
        with atomic_file(dest / name) as handle:
            handle.write(data)
    ok = int(pc.sum(pc.equal(trials.column("status"), pa.scalar(OK))).as_py() or 0) if trials is not None else 0
    return Snapshot(dest, trials.num_rows if trials is not None else 0, ok,
                    epochs.num_rows if epochs is not None else 0, tuple(side))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help=f"the sweep folder (its {TRIALS_FILE} and parts/), running or not")
    parser.add_argument("dest", type=Path, help="the folder the copies go to (made if missing)")
    args = parser.parse_args(argv)
    try:
        done = snapshot(args.source, args.dest)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # disk full, read-only destination: the sweep folder is only ever read
        print(f"error: cannot write {args.dest} ({err.strerror or err}); the sweep folder was only read: free space "
              f"or choose another destination, then run this again", file=sys.stderr)
        return 2
    print(done.line(args.source), flush=True)
    return 0


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool

    run_tool(main)
