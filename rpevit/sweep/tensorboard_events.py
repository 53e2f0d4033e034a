"""TensorBoard event files of a sweep's trials (issue 31, item 3), written in the worker.

Every epoch row a trial reports also goes, as scalars at step = epoch, into an event file of its own,
`results/<sweep>/tensorboard/<dataset>-<attention>-<pe>-seed<seed>-<trial_key>/` (a fused group: one folder
per member): `tensorboard --logdir results/<sweep>/tensorboard`. TensorBoard names each run by its folder, so
the variant leads the name (the run list reads and sorts by it) and the key makes it unique; a folder named
by the key alone (before issue 59) is renamed to that when its trial runs again. The folder is rewritten from the checkpointed history whenever
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
import re
from pathlib import Path
from typing import Any, Callable

from rpevit.sweep.results import TENSORBOARD_DIR, trial_folder

EVENTS_PREFIX = "events.out.tfevents."  # the name SummaryWriter gives its event files


RUN_FIELDS = ("dataset", "attention", "pe")  # what a run's name shows first, then seed<seed>, then the key
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=]+")  # what may not stand in a folder name (a value's '/', spaces, ...)


def run_name(key: str, cfg: dict[str, Any] | None = None) -> str:
    """The TensorBoard run of a trial: 'mnist-favor-rope-seed0-<trial_key>', its variant (from its own
    config: the same name whatever space it runs in, so a resumed trial writes into the same folder)
    and its key; the key alone without a config."""
    if not cfg:
        return key
    parts = [str(cfg[name]) for name in RUN_FIELDS if cfg.get(name) is not None]
    parts += [f"seed{cfg['seed']}"] if cfg.get("seed") is not None else []
    parts = [p for p in (_UNSAFE.sub("_", p).strip("._") for p in parts) if p]
    return "-".join([*parts, key])


def tensorboard_dir(checkpoint_root: str | Path, key: str, cfg: dict[str, Any] | None = None) -> Path:
    """results/<sweep>/tensorboard/<run_name> (checkpoint_root is results/<sweep>/trials); the key is
    checked before it names a folder (results.trial_folder)."""
    by_key = trial_folder(Path(checkpoint_root).parent / TENSORBOARD_DIR, key)
    return by_key.with_name(run_name(key, cfg))


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
            by_key = self.folder.with_name(self.key)  # the folder of a run named by its key alone (older)
            for path in (self.folder.parent, self.folder, by_key):
                if path.is_symlink():
                    raise OSError(f"{path} is a symbolic link")
            if by_key != self.folder and by_key.is_dir() and not self.folder.exists():
                by_key.rename(self.folder)  # its stale event files go below: the run appears once, renamed
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
