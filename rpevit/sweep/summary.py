"""What a run of a sweep did, computed from the Parquet rows (`compute_summary`), apart from how it is
printed (`print_summary`): the result table of the space's variants (ranked by the judged accuracy,
mean over seeds with its 95% t interval, rpevit.analysis.stats), this run's throughput (time spent
outside the trials), the files, the exit code, the command that continues the sweep, and what to
run next (TensorBoard, the analysis of this folder and where its figures land).
"""
from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rpevit.analysis.common import has_random_features, judged_accuracy
from rpevit.analysis.stats import Interval, mean_interval
from rpevit.sweep import deadline as deadlines
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import EPOCHS_FILE, TENSORBOARD_DIR, TRIALS_FILE, select_keys, trial_seconds, unix_seconds
from rpevit.sweep.store import driver_trials
from rpevit.sweep.space import Space

REPORT_SCRIPT = Path(__file__).resolve().parents[2] / "analysis" / "report.py"  # the analysis of a sweep folder


INTERRUPTED_EXIT = 130  # 128 + SIGINT: what a shell reports for a program Ctrl-C ended
PERCENT = 100.0  # accuracies are fractions in the rows; the summary shows them in percent, as report.md does


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
class VariantRow:
    """One variant of the space (its trials differ only in seed): the judged accuracy over its ok seeds
    and, for a random-feature variant, the accuracy of its training draw beside it."""
    label: str
    judged: Interval  # mean [95% t interval] (n) of the judged accuracy; NaN point without an ok seed
    training_draw: Interval | None = None  # random-feature variants: test_acc, the one draw they trained with
    ok: int = 0
    failed: int = 0
    not_run: int = 0

    @property
    def status(self) -> str:
        counts = ((self.ok, OK), (self.failed, FAILED), (self.not_run, "not run"))
        return ", ".join(f"{n} {what}" for n, what in counts if n)


@dataclass
class SweepSummary:
    """Everything the summary says, as data."""
    outcome: SweepOutcome
    metric_title: str = ""  # the judged column's heading ("" when the task has no accuracy)
    table: list[VariantRow] = field(default_factory=list)  # ranked, best first
    trial_table: list[tuple[str, str]] = field(default_factory=list)  # (trial label, status): tasks without accuracy
    throughput: str = ""  # this run's wall time and time outside the trials, in words ("" if nothing ran)
    counts: tuple[int, int, int] = (0, 0, 0)  # ok, failed, not run
    files: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (trial label, error)
    retry_command: str = ""  # with failures: the --resume --retry-failed command (a plain --resume keeps them)
    deadline_line: str = ""
    continue_command: str = ""  # "" when nothing is left to run
    continue_note: str = ""
    next_steps: list[tuple[str, str]] = field(default_factory=list)  # (command, what it gives)
    interrupted: bool = False  # Ctrl-C ended the run: exit 130, the trials it stopped are "not run" (--resume)


def judged_value(row: dict, metric: str) -> Any:
    """The accuracy a row is ranked by: test_acc_draw_mean where the row has one (random-feature
    models, judged over fresh draws), else `metric` (rpevit.analysis.common.judged_accuracy's rule)."""
    draw_mean = row.get("test_acc_draw_mean")
    if metric == "test_acc" and isinstance(draw_mean, float) and math.isfinite(draw_mean):
        return draw_mean
    return row.get(metric, "")


def compute_summary(out_dir: Path, space: Space, wall_s: float, slots: int = 0, started_after: float = 0.0,
                    resume: ResumeInfo | None = None, deadline: DeadlineReport | None = None,
                    interrupted: bool = False) -> SweepSummary:
    """The summary of this space's trials and of this run (its trials: those started after
    `started_after`, a Unix time). With a deadline, trials it left are not a failure (exit code 0
    if nothing failed). Interrupted (Ctrl-C): exit code 130 whatever ran, and the --resume command."""
    summary = _compute_summary(out_dir, space, wall_s, slots, started_after, resume, deadline)
    if interrupted:
        summary.interrupted, summary.outcome.exit_code = True, INTERRUPTED_EXIT
    return summary


def _compute_summary(out_dir: Path, space: Space, wall_s: float, slots: int, started_after: float,
                     resume: ResumeInfo | None, deadline: DeadlineReport | None) -> SweepSummary:
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
    not_run = set(space.keys) - set(table["trial_key"])
    failed = table[table["status"] == FAILED]
    summary = SweepSummary(
        SweepOutcome(0 if (len(failed) == 0 and not_run <= left) else 1, wall_s, slots=slots),
        counts=(int((table["status"] == OK).sum()), len(failed), len(not_run)),
        files=[str(out_dir / name) for name in (TRIALS_FILE, EPOCHS_FILE) if (out_dir / name).exists()],
        failures=[(labels.get(r.trial_key, r.trial_key), str(r.error)) for r in failed.itertuples(index=False)])
    if len(failed):  # a plain --resume counts a failed trial as done: say what reruns it
        summary.retry_command = deadlines.resume_command(space.source, space.name, resume.results_dir, resume.data_dir,
                                                         (*resume.resume_flags, "--retry-failed"))
    if "test_acc" in table.columns or "final_val_acc" in table.columns:
        summary.metric_title, summary.table = variant_table(table, space)
    else:
        summary.trial_table = [(labels.get(r.trial_key, r.trial_key), r.status) for r in table.itertuples(index=False)]
    summary.throughput = _throughput(summary.outcome, table, space, wall_s, slots, started_after)
    if not_run or deadline is not None:
        _add_continue(summary, space, resume, deadline, not_run)
    summary.next_steps = next_steps(out_dir)
    return summary


def variant_table(table: pd.DataFrame, space: Space) -> tuple[str, list[VariantRow]]:
    """(heading, rows): one row per variant of the space (its trials differ only in seed), ranked by
    the judged accuracy's mean over the ok seeds, best first (variants without one last, in space
    order). Judged: test_acc_draw_mean for random-feature rows (one draw is a lottery), test_acc
    otherwise (rpevit.analysis.common.judged_accuracy); final_val_acc for tasks with no test_acc."""
    ok = table[table["status"] == OK]
    if "test_acc" in table.columns:
        judged, heading = judged_accuracy(ok), "judged test acc"
    else:
        judged, heading = pd.to_numeric(ok["final_val_acc"], errors="coerce"), "final_val_acc"
    random_features = has_random_features(ok)
    status = dict(zip(table["trial_key"], table["status"]))
    groups: dict[str, list[int]] = {}
    for i, trial in enumerate(space.trials):
        groups.setdefault(_without_seed(space, i), []).append(i)
    rows = []
    for label, members in groups.items():
        keys = [space.keys[i] for i in members]
        mine = ok["trial_key"].isin(keys)
        rf = bool(random_features[mine].any())
        rows.append(VariantRow(
            label, mean_interval(judged[mine]),
            mean_interval(pd.to_numeric(ok.loc[mine, "test_acc"], errors="coerce")) if rf else None,
            ok=int(mine.sum()), failed=sum(status.get(k) == FAILED for k in keys),
            not_run=sum(k not in status for k in keys)))
    rank = lambda r: -r.judged.point if math.isfinite(r.judged.point) else math.inf  # noqa: E731
    return heading, sorted(rows, key=rank)


def _without_seed(space: Space, index: int) -> str:
    """The trial's label without its seed: the variant it is a seed of."""
    trial = space.trials[index]
    fields = [n for n in space.varying_fields() if n != "seed"]
    return " ".join(f"{n}={trial[n]}" for n in fields) or space.name


def next_steps(out_dir: Path) -> list[tuple[str, str]]:
    """What to run next on this folder: TensorBoard where trials wrote epoch curves, and the analysis
    report (tables with intervals, and the figures beside it)."""
    folder = _shown_path(out_dir)
    steps = []
    if (out_dir / TENSORBOARD_DIR).is_dir():
        steps.append((f"tensorboard --logdir {shlex.quote(str(Path(folder) / TENSORBOARD_DIR))}",
                      "the epoch curves of every trial, at http://localhost:6006"))
    steps.append((f"python {shlex.quote(_shown_path(REPORT_SCRIPT))} {shlex.quote(folder)}",
                  f"tables with 95% intervals over seeds in {Path(folder) / 'report.md'}, its figures (*.png) "
                  f"beside it"))
    return steps


def _shown_path(path: Path) -> str:
    """The path relative to the working directory where it lies below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


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
    if not len(ran):  # no per-trial figure to give ("nan s per trial" said nothing)
        return f"wall time {wall_s:.1f} s; no trial of this run finished ok, so there is no per-trial overhead figure"
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
    if summary.interrupted:
        print(f"\ninterrupted (Ctrl-C): the trials it stopped have no row and count as not run; --resume continues "
              f"them from their last epoch checkpoint (exit {INTERRUPTED_EXIT})")
    if not summary.table and not summary.trial_table:
        print("no trial finished" + ("; " if not deadline else ""), end="" if not deadline else "\n")
        _print_continue(summary)
        return
    print()
    print(format_variant_table(summary) if summary.table else
          "\n".join(f"{label[:60]:<60} {status}" for label, status in [("trial", "status"), *summary.trial_table]))
    if summary.throughput:
        print(summary.throughput)
    ok, failed, missing = summary.counts
    print(f"\n{ok} ok, {failed} failed, {missing} not run; results: {', '.join(summary.files)}")
    if missing or deadline or summary.interrupted:
        _print_continue(summary)
    if summary.failures:
        print("failures:", file=sys.stderr)
        for label, error in summary.failures:
            print(f"  {label}: {error}", file=sys.stderr)
        if summary.retry_command:
            print(f"a --resume keeps a failed trial's row and does not run it again; to rerun the failed trials (each "
                  f"from its last epoch checkpoint): {summary.retry_command}", file=sys.stderr)
    if summary.next_steps:
        print("next:")
        for command, what in summary.next_steps:
            print(f"  {command}\n      {what}")


def format_variant_table(summary: SweepSummary) -> str:
    """The ranked variants: judged accuracy mean [95% t interval] (n) over seeds, the training draw of
    random-feature variants beside it, and what ran of each."""
    random_features = any(r.training_draw is not None for r in summary.table)
    head = ["rank", "variant", f"{summary.metric_title} in %: mean [95% interval] (n seeds)"]
    head += ["training draw, %"] if random_features else []
    lines = [[*head, "trials"]]
    for rank, row in enumerate(summary.table, 1):
        cells = [str(rank) if math.isfinite(row.judged.point) else "-", row.label,
                 row.judged.text(scale=PERCENT, digits=4)]
        cells += [row.training_draw.text(scale=PERCENT, digits=4) if row.training_draw is not None else ""] \
            if random_features else []
        lines.append([*cells, row.status])
    widths = [max(len(line[j]) for line in lines) for j in range(len(lines[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    if random_features:
        table.append("judged: a random-feature model by its mean accuracy over fresh draws (test_acc_draw_mean); its "
                     "training draw (test_acc, the one draw it trained with) is beside it, not ranked: one draw is a "
                     "lottery (docs/random_features.md)")
    return "\n".join(table)


def _print_continue(summary: SweepSummary) -> None:
    if summary.deadline_line:
        print(summary.deadline_line)
    if summary.continue_command:
        print(f"continue with: {summary.continue_command}")
        if summary.continue_note:
            print(summary.continue_note)


def summarize(out_dir: Path, space: Space, wall_s: float, slots: int = 0, started_after: float = 0.0,
              resume: ResumeInfo | None = None, deadline: DeadlineReport | None = None,
              interrupted: bool = False) -> SweepOutcome:
    """Compute and print the summary; returns the outcome (exit code and throughput figures)."""
    summary = compute_summary(out_dir, space, wall_s, slots, started_after, resume, deadline, interrupted)
    print_summary(summary, deadline=deadline is not None)
    return summary.outcome
