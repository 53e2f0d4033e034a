"""SweepOptions: how to run a space (folders, resume, Ray address, resources, deadline), as sweep.py's
flags give them. Apart from the runner (runner.py), which takes them, and the Tune layer (tune_run.py),
which reads them, so that neither imports the other for the type.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpevit.sweep import deadline as deadlines
from rpevit.sweep.summary import ResumeInfo


@dataclass
class SweepOptions:
    results_dir: str | Path = "results"
    data_dir: str | None = None
    resume: bool = False
    retry_failed: bool = False
    address: str | None = None  # None: $RAY_ADDRESS, else an embedded local Ray
    cpus_per_trial: float | None = None  # None: the space's resources
    gpus_per_trial: float | None = None
    max_concurrent: int | None = None
    dashboard: bool = True
    max_failures: int = 1  # Tune retries per trial, each from the trial's last checkpoint
    progress_every_s: float = 30.0
    reuse: bool = True  # run trial after trial in warm workers (Tune reuse_actors); False: a process per trial
    deadline: "deadlines.Deadline | float | str | None" = None  # start only what ends before it (deadline.py): a
    # Deadline, a Unix time or a --deadline text (parsed when the run starts)
    deadline_estimate: float | None = None  # seconds per epoch of one Tune trial when no row says (deadline.py)
    resume_flags: tuple[str, ...] = ()  # sweep.py's flags repeated in the resume line (sweep.resume_flags)
    redeclare: bool = False  # record a changed `declare:` block although rows exist (they become exploratory)
    rungs_first: bool = False  # budget ladders: trunks pause at their last branch until every shorter trial ran

    def resume_info(self) -> ResumeInfo:
        return ResumeInfo(self.results_dir, self.data_dir, self.resume_flags)
