"""TensorBoard event files of a sweep's trials (issue 31, item 3), written in the worker.

Every epoch row a trial reports also goes, as scalars at step = epoch, into an event file of its own,
`results/<sweep>/tensorboard/<trial_key>/` (a fused group: one folder per member): `tensorboard
--logdir results/<sweep>/tensorboard`. The folder is rewritten from the checkpointed history whenever
the trial (re)starts, so a resumed or retried trial shows each epoch once. TensorBoard is optional
for a trial: without the `tensorboard` package, or when the folder cannot be written (a symbolic link
there: nothing is written through it), the trial trains on and says why in one line, through the
`say` its trainable hands the board (rpevit.sweep.trainable: the trial's log.txt and the sweep's
output). Nothing here knows Ray or Tune.
"""
from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Callable

from rpevit.sweep.results import TENSORBOARD_DIR, trial_folder

EVENTS_PREFIX = "events.out.tfevents."  # the name SummaryWriter gives its event files


def tensorboard_dir(checkpoint_root: str | Path, key: str) -> Path:
    """results/<sweep>/tensorboard/<trial_key> (checkpoint_root is results/<sweep>/trials); the key is
    checked before it names a folder (results.trial_folder)."""
    return trial_folder(Path(checkpoint_root).parent / TENSORBOARD_DIR, key)


class EpochBoard:
    """The TensorBoard event file of one trial: each epoch row's finite numbers as scalars, step = epoch.

    Opened at the trial's first epoch row (a task without epochs leaves no folder). Idempotent across
    restarts: opening removes the event files an earlier start of the trial left in its folder, and
    the trial writes its checkpointed history before its new epochs (trainable.run_single / run_fused),
    so a resumed or retried trial holds every epoch once. Only `events.out.tfevents.*` files are
    removed, and nothing is written through a symbolic link. Never fails the trial: without the
    `tensorboard` package, or when the folder cannot be written, it says so in one line (`say`, default
    print) and writes nothing more."""

    def __init__(self, folder: Path, key: str, label: str = "", say: Callable[[str], None] = print) -> None:
        self.folder, self.key, self.label, self.say = Path(folder), key, label, say
        self.writer, self.tried = None, False

    def skipped(self, why: str, this_trial: bool = True) -> None:
        """The one line on why this trial writes no events; a reason common to every trial (`this_trial`
        False) reads the same for all of them, so the driver, which prints each distinct line once,
        prints it once."""
        self.say(f"no TensorBoard events for {f'trial {self.key}' if this_trial else 'the trials'}: {why}")

    def _open(self) -> None:
        self.tried = True
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package
        except ImportError as err:
            self.skipped(f"{err}; `pip install tensorboard` for them", this_trial=False)
            return
        try:
            for path in (self.folder.parent, self.folder):
                if path.is_symlink():
                    raise OSError(f"{path} is a symbolic link")
            self.folder.mkdir(parents=True, exist_ok=True)
            with os.scandir(self.folder) as entries:
                stale = [Path(e.path) for e in entries if e.name.startswith(EVENTS_PREFIX)
                         and e.is_file(follow_symlinks=False)]
            for path in stale:  # an earlier start's epochs: this start writes them all again
                path.unlink()
            self.writer = SummaryWriter(log_dir=str(self.folder), flush_secs=5)
            if self.label:
                self.writer.add_text("trial", f"{self.label} (trial_key {self.key})", 0)
        except OSError as err:
            self.skipped(f"{self.folder} cannot take them ({err}); the trial trains on without them")
            self.writer = None

    def add(self, row: dict) -> None:
        if not self.tried:
            self._open()
        if self.writer is None or "epoch" not in row:
            return
        step = int(row["epoch"])
        for name, value in row.items():
            if name != "epoch" and isinstance(value, numbers.Real) and not isinstance(value, bool) \
                    and math.isfinite(value):
                self.writer.add_scalar(name, float(value), step)
        self.writer.flush()  # once per epoch: a live tensorboard sees the epoch now

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
