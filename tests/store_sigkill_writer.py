"""The processes tests/test_results_store_sigkill.py kills with SIGKILL (not a test module).

Run as `python tests/store_sigkill_writer.py`, it imports the store once (the sweep package imports
torch: seconds), then forks one process per line it reads on stdin (a JSON order) and reports its pid
and how it ended. Each forked process is one life of a sweep's driver on a results folder:

- role "writer": rpevit.sweep.writer.ParquetResults, as a `--resume` builds it (stale temp files
  removed, parts a killed driver left compacted), driven through its Tune hooks: trial n (key
  `n` in 16 hex digits) reports EPOCHS rows then its summary (which flushes), for the trials after
  the last one with a trial row; every `compact_every` trials, on_experiment_end (a Tuner run's end:
  compaction). MERGE_FANIN is set small so tiered merges happen every few flushes.
- role "compactor": `python -m rpevit.sweep.compact FOLDER` (compact.main, under the sweep lock).

Each life announces on stdout (one os.write per line: lines of processes never interleave) `begin n`
before it writes trial n's rows, `flushed n` once on_trial_result returned for its summary (its rows
are in files by then), and `hit park|run` when it reaches the file operation the order aims at: the
`occurrence`-th os.replace / os.unlink whose description `<replace|unlink> <file name> after <file
name of the operation before>` matches the regex `target`. With `park` it sleeps there (before the
operation) until killed; otherwise it goes on, and the test kills it a few milliseconds later,
wherever it is (inside a Parquet write, a read, a merge); or it kills the life at a random moment
after one of its `begin` lines, aimed at no operation. A life that has done its work says `done`
and sleeps: every life ends by the test's SIGKILL, so no pid it kills can have been reused.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from rpevit.sweep import compact as compact_cli
from rpevit.sweep import store
from rpevit.sweep.protocol import EPOCH, SUMMARY, Report
from rpevit.sweep.results import TRIALS_FILE, epochs_schema, trials_schema
from rpevit.sweep.writer import ParquetResults

EPOCHS = 3  # epoch rows per trial
MAX_TRIALS = 4096
KEYS = [f"{n:016x}" for n in range(MAX_TRIALS + 1)]  # KEYS[n]: trial n's key (n >= 1)


def epoch_loss(n: int, epoch: int) -> float:
    """The value trial n's epoch row carries (exact in float64): which row a reader shows is visible."""
    return n * 1000.0 + epoch


def trial_acc(n: int) -> float:
    return n + 0.25


def say(line: str) -> None:
    os.write(1, f"{os.getpid()} {line}\n".encode())


def sleep_until_killed() -> None:
    while True:
        time.sleep(3600)


def aim(target: str, occurrence: int, park: bool) -> None:
    """Announce (and with `park`, stop before) the occurrence-th file operation matching `target`."""
    pattern, seen, previous = re.compile(target), [0], [""]
    real_replace, real_unlink = os.replace, os.unlink

    def step(kind: str, path) -> None:
        name = Path(path).name
        if pattern.search(f"{kind} {name} after {previous[0]}"):
            seen[0] += 1
            if seen[0] == occurrence:
                say("hit park" if park else "hit run")
                if park:
                    sleep_until_killed()
        previous[0] = name

    def replace(source, target_path, **kwargs):
        step("replace", target_path)
        return real_replace(source, target_path, **kwargs)

    def unlink(path, **kwargs):
        step("unlink", path)
        return real_unlink(path, **kwargs)

    os.replace, os.unlink = replace, unlink


def write(folder: Path, trials: int, compact_every: int, fanin: int) -> None:
    """One driver life: resume the folder (ParquetResults), then `trials` trials through the Tune hooks."""
    store.MERGE_FANIN = fanin
    configs = {key: {} for key in KEYS[1:]}
    order = {key: n for n, key in enumerate(KEYS[1:], 1)}
    writer = ParquetResults(folder, "kill", configs, order, task="train")
    stored = store.read_table(folder / TRIALS_FILE, columns=[])
    done = [int(k, 16) for k in stored.column("trial_key").to_pylist()] if stored is not None else []
    first = max(done, default=0) + 1  # trials without a trial row run again (as --resume reruns them)
    for n in range(first, first + trials):
        say(f"begin {n}")
        tune_trial = SimpleNamespace(trial_id=f"t{n}")
        for epoch in range(EPOCHS):
            row = {"epoch": epoch, "train_loss": epoch_loss(n, epoch)}
            writer.on_trial_result(epoch, [], tune_trial, Report(EPOCH, KEYS[n], row).to_tune())
        writer.on_trial_result(EPOCHS, [], tune_trial, Report(SUMMARY, KEYS[n], {"test_acc": trial_acc(n)}).to_tune())
        say(f"flushed {n}")
        if n % compact_every == 0:
            writer.on_experiment_end([])


def life(order: dict) -> None:
    folder = Path(order["folder"])
    if order.get("target"):
        aim(order["target"], order["occurrence"], order["park"])
    if order["role"] == "writer":
        write(folder, order["trials"], order["compact_every"], order["fanin"])
    else:
        sys.stdout = open(os.devnull, "w")  # compact's line; this process's lines go through say()
        code = compact_cli.main([str(folder)])
        if code != 0:
            raise SystemExit(f"compact exited {code}")
    say("done")
    sleep_until_killed()


def main() -> None:
    epochs_schema("train"), trials_schema("train")  # the task registry's imports, once, not in every life
    say("ready")
    for line in sys.stdin:
        order = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                life(order)
            except BaseException:  # noqa: BLE001 - reported on stderr; the test sees the exit code
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(3)
            os._exit(0)
        os.write(1, f"{os.getpid()} pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, f"{os.getpid()} exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    main()
