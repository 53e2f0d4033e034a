"""What a run of a sweep did, computed from the Parquet rows (`compute_summary`), apart from how it is
printed (`print_summary`): the result table of the space's trials, this run's throughput (time
spent outside the trials), the files, the exit code, and the command that continues the sweep.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpevit.sweep import deadline as deadlines
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import EPOCHS_FILE, TRIALS_FILE, select_keys, trial_seconds, unix_seconds
from rpevit.sweep.store import driver_trials
from rpevit.sweep.space import Space


@dataclass
class SweepOutcome:
    """What one run of the runner did: its exit code, and the numbers of its throughput line."""
    exit_code: int
    wall_s: float = 0.0  # Tuner.fit(), from the first trial's start-up to the last row
    trial_s: float = 0.0  # sum over the trials that ran of finished_at - started_at
    trials_ran: int = 0
    slots: int = 0  # trials the resources let run at once
    startup_s: float = math.nan  # from Tuner.fit() to the first trial's start (workers starting, imports)

    @property
    def overhead_s_per_trial(self) -> float:
        """Slot-seconds per trial spent outside the trials: (wall x slots - in-trial time) / trials."""
        return self.overhead_after(0.0)

    @property
    def steady_overhead_s_per_trial(self) -> float:
        """The same without the one-time start-up: what each further trial adds."""
        return self.overhead_after(self.startup_s)

    def overhead_after(self, seconds: float) -> float:
        busy = (self.wall_s - seconds) * self.slots - self.trial_s
        return busy / self.trials_ran if self.trials_ran else math.nan


@dataclass
class DeadlineReport:
    """What a run with --deadline did, for the summary."""
    deadline: deadlines.Deadline
    ran: list[int]  # the trials (indices into the space) it started
    left: list[int]  # those it left because they would not end before the deadline
    estimate: str  # the estimates the plan used, in words


@dataclass
class ResumeInfo:
    """What the printed `--resume` command repeats (SweepOptions' fields of the same names)."""
    results_dir: str | Path = "results"
    data_dir: str | None = None
    resume_flags: tuple[str, ...] = ()


@dataclass
class SweepSummary:
    """Everything the summary says, as data."""
    outcome: SweepOutcome
    metric_title: str = ""  # the value column's heading ("" when there is no table)
    table: list[tuple[str, str, str]] = field(default_factory=list)  # (trial label, status, value or error)
    throughput: str = ""  # this run's wall time and time outside the trials, in words ("" if nothing ran)
    counts: tuple[int, int, int] = (0, 0, 0)  # ok, failed, not run
    files: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (trial label, error)
    deadline_line: str = ""
    continue_command: str = ""  # "" when nothing is left to run
    continue_note: str = ""


def judged_value(row: dict, metric: str) -> Any:
    """The accuracy a row is ranked by: test_acc_draw_mean where the row has one (random-feature
    models, judged over fresh draws), else `metric` (rpevit.analysis.common.judged_accuracy's rule)."""
    draw_mean = row.get("test_acc_draw_mean")
    if metric == "test_acc" and isinstance(draw_mean, float) and math.isfinite(draw_mean):
        return draw_mean
    return row.get(metric, "")


def compute_summary(out_dir: Path, space: Space, wall_s: float, slots: int = 0, started_after: float = 0.0,
                    resume: ResumeInfo | None = None, deadline: DeadlineReport | None = None) -> SweepSummary:
    """The summary of this space's trials and of this run (its trials: those started after
    `started_after`, a Unix time). With a deadline, trials it left are not a failure (exit code 0
    if nothing failed)."""
    table, _ = select_keys(driver_trials(out_dir), space.keys)  # never rows of an older space
    resume = resume or ResumeInfo()
    left = {space.keys[i] for i in deadline.left} if deadline is not None else set()
    if table.empty:
        missing = set(space.keys)
        summary = SweepSummary(SweepOutcome(0 if deadline is not None and missing <= left else 1, wall_s, slots=slots),
                               counts=(0, 0, len(missing)))
        _add_continue(summary, space, resume, deadline, missing)
        return summary
    labels = {k: space.label(i) for i, k in enumerate(space.keys)}
    metric = next((m for m in ("test_acc", "final_val_acc") if m in table.columns), None)
    judged = metric == "test_acc" and "test_acc_draw_mean" in table.columns
    rows = []
    for row in table.itertuples(index=False):
        value = judged_value(row._asdict(), metric) if metric else ""
        shown = f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else str(value)
        rows.append((labels.get(row.trial_key, row.trial_key), row.status,
                     shown if row.status == OK else str(row.error)[:100]))
    not_run = set(space.keys) - set(table["trial_key"])
    failed = table[table["status"] == FAILED]
    summary = SweepSummary(
        SweepOutcome(0 if (len(failed) == 0 and not_run <= left) else 1, wall_s, slots=slots),
        metric_title="test acc (draw mean where random features: judged)" if judged else metric or "", table=rows,
        counts=(int((table["status"] == OK).sum()), len(failed), len(not_run)),
        files=[str(out_dir / name) for name in (TRIALS_FILE, EPOCHS_FILE) if (out_dir / name).exists()],
        failures=[(labels.get(r.trial_key, r.trial_key), str(r.error)) for r in failed.itertuples(index=False)])
    summary.throughput = _throughput(summary.outcome, table, space, wall_s, slots, started_after)
    if not_run or deadline is not None:
        _add_continue(summary, space, resume, deadline, not_run)
    return summary


def _throughput(outcome: SweepOutcome, table: Any, space: Space, wall_s: float, slots: int,
                started_after: float) -> str:
    """This run's throughput line; fills outcome's trial_s, trials_ran and startup_s."""
    if wall_s <= 0:
        return ""
    if space.exclusive and space.timing.interleave:  # members share one worker: their spans overlap by design
        return (f"wall time {wall_s:.1f} s (interleaved timing: the variants ran in rounds in one worker, so there "
                f"is no per-trial overhead figure)")
    if "started_at" not in table.columns:
        return ""
    ran = table[(table["status"] == OK) & (unix_seconds(table["started_at"]) >= started_after)]
    unit, note = "trials", ""
    if space.fuse is not None:  # a group's members share one span: count it once
        members = len(ran)
        ran = ran.drop_duplicates(["started_at", "finished_at"])
        unit, note = "fused groups", (f" ({members} trials; the members of a group share one start-end span, "
                                      f"counted once)")
    outcome.trial_s = float(trial_seconds(ran).sum())
    outcome.trials_ran = len(ran)
    if len(ran):
        outcome.startup_s = float(unix_seconds(ran["started_at"]).min() - started_after)
    return (f"wall time {wall_s:.1f} s; sum of in-trial times {outcome.trial_s:.1f} s over {len(ran)} {unit}{note}; "
            f"{slots} at a time: {outcome.overhead_s_per_trial:.2f} s per {unit[:-1]} outside the {unit} "
            f"((wall x {slots} - in-trial) / {unit}; {outcome.startup_s:.1f} s of it before the first started)")


def _add_continue(summary: SweepSummary, space: Space, resume: ResumeInfo, deadline: DeadlineReport | None,
                  not_run: set[str]) -> None:
    """The deadline's one-line account (what ran, what was left, the estimate) and the command that continues."""
    if deadline is not None:
        summary.deadline_line = (f"deadline {deadline.deadline.describe()}: ran {len(deadline.ran)} trial(s), left "
                                 f"{len(deadline.left)} that would not end before it; estimate: {deadline.estimate}")
    if not not_run:
        return
    summary.continue_command = deadlines.resume_command(space.source, space.name, resume.results_dir,
                                                        resume.data_dir, resume.resume_flags,
                                                        deadline=deadline is not None)
    if deadline is not None:
        summary.continue_note = (f"  ({deadlines.NEW_DEADLINE}: the next deadline, e.g. 90m or 2026-11-23T18:00, "
                                 f"local time; leave --deadline out to run all {len(not_run)} left)")


def print_summary(summary: SweepSummary, deadline: bool = False) -> None:
    """The summary as the runner prints it (failures on stderr)."""
    if not summary.table:
        print("no trial finished" + ("; " if not deadline else ""), end="" if not deadline else "\n")
        _print_continue(summary)
        return
    print(f"\n{'trial':<48} {'status':<7} {summary.metric_title}")
    for label, status, shown in summary.table:
        print(f"{label[:48]:<48} {status:<7} " + shown)
    if summary.throughput:
        print(summary.throughput)
    ok, failed, missing = summary.counts
    print(f"\n{ok} ok, {failed} failed, {missing} not run; results: {', '.join(summary.files)}")
    if missing or deadline:
        _print_continue(summary)
    if summary.failures:
        print("failures:", file=sys.stderr)
        for label, error in summary.failures:
            print(f"  {label}: {error}", file=sys.stderr)


def _print_continue(summary: SweepSummary) -> None:
    if summary.deadline_line:
        print(summary.deadline_line)
    if summary.continue_command:
        print(f"continue with: {summary.continue_command}")
        if summary.continue_note:
            print(summary.continue_note)


def summarize(out_dir: Path, space: Space, wall_s: float, slots: int = 0, started_after: float = 0.0,
              resume: ResumeInfo | None = None, deadline: DeadlineReport | None = None) -> SweepOutcome:
    """Compute and print the summary; returns the outcome (exit code and throughput figures)."""
    summary = compute_summary(out_dir, space, wall_s, slots, started_after, resume, deadline)
    print_summary(summary, deadline=deadline is not None)
    return summary.outcome
