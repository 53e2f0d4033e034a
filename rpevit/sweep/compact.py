"""`python -m rpevit.sweep.compact FOLDER...`: compact sweep folders now (rpevit.sweep.store).

A sweep compacts its folder itself when each Tuner run ends, and a driver that starts on a folder a
killed one left compacts it first; this is for a folder read by other tools while no driver runs
(say a sweep stopped by its deadline, SIGTERM or a crash of the machine): afterwards trials.parquet
and epochs.parquet hold every row once, and parts/ is gone. Each folder is locked as a driver locks
it, so it never runs beside the sweep's own driver (one line, exit 2, when one holds it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from rpevit.sweep import store
from rpevit.sweep.results import TRIALS_FILE
from rpevit.tool_exit import run_tool


def describe(folder: Path, done: list[store.Compaction]) -> str:
    """One line: what compaction did to each file of the folder."""
    parts = [f"{c.kind}: {c.parts} part(s) into {c.rows} row(s)" if c.rows is not None else f"{c.kind}: no parts"
             for c in done]
    return f"{folder}: compacted ({'; '.join(parts)})"


def run_on_folders(argv: list[str] | None, description: str, action: Callable[[Path], str]) -> int:
    """The body of the folder tools (`python -m rpevit.sweep.compact | migrate FOLDER...`): for each
    folder holding a sweep's rows, action(folder)'s line, under the folder's sweep lock; a folder that
    holds none stops with a usage line, a ConfigError (another driver holds it, a bad key, ...) with one
    `error:` line and exit 2."""
    from rpevit.config import ConfigError
    from rpevit.sweep.lock import sweep_lock
    from rpevit.sweep.results import DamagedResults

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("folders", nargs="+", type=Path, help=f"sweep folders (each holding {TRIALS_FILE})")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not store.holds_rows(folder, TRIALS_FILE):
            parser.error(f"{folder} holds no {TRIALS_FILE} (nor parts of one); allowed: a sweep folder")
        try:
            with sweep_lock(folder):
                print(action(folder), flush=True)
        except DamagedResults as err:  # checked before anything is written (store.check_files)
            print(f"error: {err}; nothing in {folder} was rewritten or removed: `sweep.py ... --resume` sets it aside "
                  f"as {err.path.name}.damaged-<time> (kept) and runs again what it held, or move it out of the "
                  f"folder (keep it) and run this again", file=sys.stderr)
            return 2
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except OSError as err:  # disk full, read-only folder: the parts stay, nothing is lost
            print(f"error: cannot write {folder} ({err.strerror or err}); nothing was lost (the rows stay in its "
                  f"parts until a compaction succeeds): free space or make the folder writable, then run this again",
                  file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_on_folders(argv, __doc__.splitlines()[0], lambda folder: describe(folder, store.compact(folder)))


if __name__ == "__main__":
    run_tool(main)
