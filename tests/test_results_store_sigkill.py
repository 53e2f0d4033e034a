"""The results store under real kills: a separate process writes a sweep folder through the driver's
real writer (ParquetResults: flushes of parts, tiered merges, compactions at each Tuner run's end
and when a driver resumes a killed one's folder) or compacts it (`python -m rpevit.sweep.compact`),
and is killed with SIGKILL, again and again, on the same folder. The kills are aimed
(tests/store_sigkill_writer.py): before a flush's epochs part appears, between a flush's two parts,
before a merged part appears, between a merged part and the removal of its sources, before a
compacted file is replaced, between it and the removal of its parts; half of them with the process
stopped exactly there, half a random 0-4 ms later with the process running (inside a Parquet
write, a read, the next operation); and, aimed at nothing, 0-50 ms after a trial began.

After each kill, the folder read with store.read_table (the reader everything uses) holds every row
of each trial the writer acknowledged (on_trial_result returned) exactly once, no row it never wrote,
a trial row only with all its epoch rows; every Parquet file in it reads (no torn file). The next life
is a restarted writer, as --resume builds one: it appends after the kill's leftovers. At the end the
compaction command, one more writer life and a final compaction leave the compacted files alone
holding every row once.

RPEVIT_STORE_KILLS sets the number of kills (default 40: the plan of 20 kinds of kill twice, about
40 s on a contended 2-core machine).
"""
from __future__ import annotations

import collections
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rpevit.sweep import compact as compact_cli
from rpevit.sweep import store
from rpevit.sweep.results import EPOCHS_FILE, TRIALS_FILE
from tests.store_sigkill_writer import EPOCHS, epoch_loss, trial_acc

REPO = Path(__file__).resolve().parent.parent
WRITER = Path(__file__).with_name("store_sigkill_writer.py")
KILLS = int(os.environ.get("RPEVIT_STORE_KILLS", "40"))  # the plan (20 kills) twice
LINE_TIMEOUT_S = 120.0  # a life that says nothing for this long is stuck: the test fails, naming it

# (regex over "<replace|unlink> <file> after <file of the operation before>", the moment it names)
WRITER_TARGETS = [
    (r"^replace epochs-L0-", "before a flush's epochs part appears"),
    (r"^replace trials-L0-", "between a flush's epochs part and its trials part"),
    (r"^replace \w+-L[1-9]-", "before a merged part appears"),
    (r"^unlink \S+ after \w+-L[1-9]-", "between a merged part and the removal of its sources"),
    (r"^replace (epochs|trials)\.parquet after", "before compaction replaces a compacted file"),
    (r"^unlink \S+ after (epochs|trials)\.parquet$", "between a compacted file and the removal of its parts"),
]
COMPACTOR_TARGETS = [
    (r"^replace (epochs|trials)\.parquet after", "compaction command: before a compacted file is replaced"),
    (r"^unlink \S+ after (epochs|trials)\.parquet$", "compaction command: before the parts are removed"),
]
ANYWHERE = (None, "anywhere: 0-50 ms after the k-th trial began")  # aimed at no operation: wherever it is
HELD_PARTS_LEFT = {"between a merged part and the removal of its sources",
                   "between a compacted file and the removal of its parts",
                   "compaction command: before the parts are removed"}


def kill_plan() -> list[tuple[str, tuple[str | None, str], bool]]:
    """(who, (target, moment), stopped there) of each kill, in turn: after every three writer lives
    aimed at a file operation, a compactor life, then a writer life killed at a random moment."""
    writer = [("writer", aim, park) for aim in WRITER_TARGETS for park in (True, False)]
    compactor = [("compactor", aim, park) for aim in COMPACTOR_TARGETS for park in (True, False)]
    return [life for i in range(4) for life in (*writer[3 * i:3 * i + 3], compactor[i], ("writer", ANYWHERE, False))]


PLAN = kill_plan()


class Lives:
    """The writer process (tests/store_sigkill_writer.py): it forks each life the test orders."""

    def __init__(self, log: Path) -> None:
        self.stderr = open(log, "w+b")
        self.proc = subprocess.Popen([sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        self.pending = b""
        self.acked: set[int] = set()  # trials whose summary on_trial_result returned: rows on disk
        self.begun = 0  # the highest trial any life began writing
        self.life: int | None = None  # the pid of the life running now
        try:
            self.expect("ready")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the writer process, and a life a failed check left running (no process outlives the test)."""
        if self.life is not None:
            os.kill(self.life, signal.SIGKILL)
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()

    def line(self) -> str:
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.proc.stdout], [], [], LINE_TIMEOUT_S)
            chunk = os.read(self.proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                self.fail(f"no line for {LINE_TIMEOUT_S} s" if not ready else "the writer process ended")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        words = line.decode().split(" ", 1)[1]  # "<pid> <words>"
        if words.startswith("begin "):
            self.begun = max(self.begun, int(words.split()[1]))
        elif words.startswith("flushed "):
            self.acked.add(int(words.split()[1]))
        return words

    def expect(self, start: str) -> str:
        while not (words := self.line()).startswith(start):
            pass
        return words

    def fail(self, why: str) -> None:
        self.stderr.seek(0)
        pytest.fail(f"{why}; the writer's stderr:\n{self.stderr.read().decode(errors='replace')[-4000:]}")

    def run(self, order: dict, delay_s: float = 0.0, begins: int | None = None) -> str:
        """One life: start it, SIGKILL it at its aimed operation ("hit"; `delay_s` later where it runs on),
        `delay_s` after it began its `begins`-th trial ("begin"), or once it has done its work ("done");
        returns which, after the writer reported it dead."""
        self.proc.stdin.write((json.dumps(order) + "\n").encode())
        self.proc.stdin.flush()
        pid, began = int(self.expect("pid ").split()[1]), 0
        self.life = pid
        while not (words := self.line()).startswith(("hit ", "done", "exit ")):
            if words.startswith("begin ") and (began := began + 1) == begins:
                words = "begin"
                break
        if words.startswith("exit "):
            self.life = None
            self.fail(f"life {order} ended by itself ({words})")
        if words in ("hit run", "begin"):
            time.sleep(delay_s)
        os.kill(pid, signal.SIGKILL)
        ended = self.expect(f"exit {pid} ")  # reaped: nothing of it runs on; lines before it are counted
        self.life = None
        if int(ended.split()[2]) != -signal.SIGKILL:
            self.fail(f"life {order} ended {ended}, not by the SIGKILL")
        return words


def check_union(folder: Path, acked: set[int], begun: int) -> None:
    """The folder as store.read_table reads it: each acknowledged trial's rows once, nothing never
    written, no duplicate, a trial row only with all its epochs; every Parquet file in it reads."""
    epochs, trials = store.read_table(folder / EPOCHS_FILE), store.read_table(folder / TRIALS_FILE)
    epoch_rows = list(zip(*(epochs.column(c).to_pylist() for c in ("trial_key", "epoch", "train_loss")))) \
        if epochs is not None else []
    trial_rows = list(zip(*(trials.column(c).to_pylist() for c in ("trial_key", "status", "test_acc")))) \
        if trials is not None else []
    repeated = [k for k, count in collections.Counter((k, e) for k, e, _ in epoch_rows).items() if count > 1]
    assert not repeated, f"epoch rows read twice: {repeated[:5]}"
    repeated = [k for k, count in collections.Counter(k for k, _, _ in trial_rows).items() if count > 1]
    assert not repeated, f"trial rows read twice: {repeated[:5]}"
    epochs_of = collections.defaultdict(set)
    for key, epoch, loss in epoch_rows:
        n = int(key, 16)
        assert 1 <= n <= begun and 0 <= epoch < EPOCHS and loss == epoch_loss(n, epoch), \
            f"an epoch row never written: {(key, epoch, loss)}"
        epochs_of[n].add(epoch)
    finished = set()
    for key, status, acc in trial_rows:
        n = int(key, 16)
        assert 1 <= n <= begun and status == "ok" and acc == trial_acc(n), f"a trial row never written: {key}"
        finished.add(n)
    lost = sorted(n for n in acked if n not in finished or epochs_of[n] != set(range(EPOCHS)))
    assert not lost, f"rows of acknowledged trials lost: {lost[:10]} (of {len(acked)})"
    early = sorted(n for n in finished if epochs_of[n] != set(range(EPOCHS)))
    assert not early, f"trial rows without all their epoch rows: {early[:10]}"
    gaps = sorted(n for n, seen in epochs_of.items() if seen != set(range(len(seen))))
    assert not gaps, f"epochs not a prefix of those reported (in order): {gaps[:10]}"
    for path in [folder / EPOCHS_FILE, folder / TRIALS_FILE, *parts_in(folder)]:
        if path.exists():
            pq.read_table(path)  # plain pyarrow: a torn file raises


def parts_in(folder: Path) -> list[Path]:
    return [p.path for kind in store.KINDS for p in store.listed_parts(folder, kind)]


def live_parts(folder: Path, kind: str) -> list[store.Part]:
    return store.live_parts(store.listed_parts(folder, kind), store.compacted_through(folder / kind))


def held_parts_left(folder: Path) -> bool:
    """Whether a part whose rows another file holds is still there (a kill before its removal)."""
    for kind in store.KINDS:
        if len(live_parts(folder, kind)) < len(store.listed_parts(folder, kind)):
            return True
    return False


def compact_now(folder: Path, capsys) -> None:
    assert compact_cli.main([str(folder)]) == 0
    assert capsys.readouterr().out.startswith(f"{folder}: compacted (")
    assert not parts_in(folder)


def life(folder: Path, role: str, target: str | None = None, occurrence: int = 1, park: bool = False,
         trials: int = 30, compact_every: int = 3) -> dict:
    """The order of one life (tests/store_sigkill_writer.py): merges of every 2 parts (MERGE_FANIN), a
    compaction every `compact_every` trials."""
    return {"folder": str(folder), "role": role, "target": target, "occurrence": occurrence, "park": park,
            "trials": trials, "compact_every": compact_every, "fanin": 2}


@pytest.mark.slow
def test_sigkill_at_any_moment_loses_or_repeats_no_row(tmp_path, capsys):
    folder, rng = tmp_path / "sweep", random.Random(42)
    lives = Lives(tmp_path / "writer.stderr")
    landed, left = collections.Counter(), collections.Counter()  # kills that hit their aim; what kills left
    try:
        for i in range(KILLS):
            role, (target, moment), park = PLAN[i % len(PLAN)]
            mode = "stopped there" if park else "running" if target else "anywhere"
            if role == "compactor" and not all(live_parts(folder, kind) for kind in store.KINDS):
                lives.run(life(folder, "writer", trials=2, compact_every=10**6))  # parts to compact, then killed
            order = life(folder, role, target=target, occurrence=rng.randint(1, 2 if role == "writer" else 1),
                         park=park)
            if target:
                ended = lives.run(order, delay_s=rng.uniform(0.0, 0.004))
            else:
                ended = lives.run(order, delay_s=rng.uniform(0.0, 0.05), begins=rng.randint(1, 6))
            landed[(moment, mode)] += ended != "done"
            check_union(folder, lives.acked, lives.begun)
            left["a torn temp file"] += any(p.name.endswith(".tmp") for p in folder.rglob(".*"))
            left["parts another file holds"] += held_parts_left(folder)
            if park and ended == "hit park" and moment in HELD_PARTS_LEFT:
                assert held_parts_left(folder), f"kill {i} ({moment}) left no held part: not where it was aimed"
        assert lives.acked, "no trial was acknowledged: the kills tested nothing"
        compact_now(folder, capsys)  # `python -m rpevit.sweep.compact FOLDER` on what the last kill left
        check_union(folder, lives.acked, lives.begun)
        lives.run(life(folder, "writer", trials=7))  # a --resume after all that, to its end
        check_union(folder, lives.acked, lives.begun)
        compact_now(folder, capsys)
    finally:
        lives.close()
    last = max(lives.acked)
    assert lives.acked >= set(range(last - 6, last + 1))  # the last life acknowledged its 7 trials
    expected_epochs = sorted((f"{n:016x}", e, epoch_loss(n, e)) for n in range(1, last + 1) for e in range(EPOCHS))
    expected_trials = sorted((f"{n:016x}", "ok", trial_acc(n)) for n in range(1, last + 1))
    for kind, columns, expected in [(EPOCHS_FILE, ("trial_key", "epoch", "train_loss"), expected_epochs),
                                    (TRIALS_FILE, ("trial_key", "status", "test_acc"), expected_trials)]:
        alone = pq.read_table(folder / kind)  # the compacted file by itself, as users' scripts read it
        assert sorted(zip(*(alone.column(c).to_pylist() for c in columns))) == expected, kind
        union = store.read_table(folder / kind)
        assert sorted(zip(*(union.column(c).to_pylist() for c in columns))) == expected, kind
    assert not (folder / store.PARTS_DIR).exists()  # parts and the killed lives' temp files are gone
    print(f"{KILLS} kills on one folder, {last} trials; kills that reached their aim: {dict(sorted(landed.items()))}; "
          f"kills after which the folder held {dict(left)}")
    if KILLS >= len(PLAN):
        assert len(landed) == len(set(PLAN)) and all(landed.values()), landed  # each kind of kill landed
