"""The Tune layer of a sweep: a planned Launch (rpevit.sweep.launch_plan: the Tune trials, one per
trial, per fused group of seeds, or one for an interleaved timing run, and what each reserves) run by
Tuner.fit() on the started Ray with the Parquet writer and the progress printer as callbacks; with
--deadline, in rounds, each the Tune trials the planner admits. Called by runner.execute_sweep with the
lock held and the Ray session started. What runs is decided by the planner, without Ray; this module
only reads the nodes from Ray, turns the plan into Tune trials, runs them and reports progress.

Throughput: Tune reuses workers (`reuse_actors`, SweepOptions.reuse; trainable.py resets the
process state between trials) and writes no per-trial logger files, so a tiny trial costs a
fraction of a second outside the task instead of a process start; the summary prints that
figure. Timing tasks (registry.TIMING_TASKS) reserve a whole node per trial instead (see space.py).
"""
from __future__ import annotations

import logging
import math
import secrets
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import ray
from ray import tune
from ray.tune import Callback

from rpevit.sweep import deadline as deadlines
from rpevit.sweep import session
from rpevit.sweep.launch_plan import Launch, deadline_plan_line, pause_trunks, plan_deadline_round, plan_launch
from rpevit.sweep.options import SweepOptions
from rpevit.sweep.plan import SweepPlan
from rpevit.sweep.protocol import NOTE, PAUSED, SPEC_KEY, SUMMARY, VARIANT_FAILED, Member, TrialSpec, members_of
from rpevit.sweep.results import TRIALS_FILE, ResultsWriteError
from rpevit.sweep.store import read_rows
from rpevit.sweep.writer import ParquetResults, error_line, trial_traceback
from rpevit.sweep.space import Space
from rpevit.sweep.summary import DeadlineReport, judged_value
from rpevit.sweep.trainable import StartBarrier, run_trial

NO_TUNE_LOGGERS_ENV = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"  # no per-trial CSV / JSON / TensorBoard files
TUNE_ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"  # would warn once per trial about them
# Tune's documented switch: 0 = no traceback of every failed try on the console (~150 lines each; the Progress
# callback prints one line per failure instead, the traceback stays whole in the row's error_traceback)
TRIAL_ERRORS_ENV = "TUNE_PRINT_ALL_TRIAL_ERRORS"
TUNE_LOGGER = "ray.tune.tune"  # Tune's run loop: its Ctrl-C lines (TuneLines) come from here
INTERRUPTED_LINE = ("interrupted (Ctrl-C): stopping the running trials; every finished trial's row and every epoch "
                    "checkpoint so far is kept, and --resume continues the others from their last epoch; "
                    "Ctrl-C again stops at once")


class SweepInterrupted(Exception):
    """Tuner.fit() ended because of Ctrl-C (SIGINT): the rows so far are written; the runner prints the
    summary with what was stopped and exits 130."""


class TuneLines(logging.Filter):
    """Tune's own lines about a Ctrl-C, replaced by rpevit's: Tune's "Stop signal received ... Press
    CTRL+C ... to skip" by INTERRUPTED_LINE, its "Resume experiment with: Tuner.restore(...)" hint
    (a Python API this driver does not use; the summary prints the `--resume` command that does) and
    its "Trials did not complete" list (the summary says which) dropped. Records whether Ctrl-C came."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Stop signal received"):
            self.interrupted = True
            print(INTERRUPTED_LINE, flush=True)
            return False
        return not (message.startswith("Trials did not complete")
                    or "has been interrupted, but the most recent state was saved" in message)


@contextmanager
def _tune_lines() -> Iterator[TuneLines]:
    """TuneLines on Tune's logger for a block."""
    lines, log = TuneLines(), logging.getLogger(TUNE_LOGGER)
    log.addFilter(lines)
    try:
        yield lines
    finally:
        log.removeFilter(lines)


def run_sweep_trials(space: Space, plan: SweepPlan, opts: SweepOptions, out_dir: Path) -> tuple[int, float]:
    """Every pending trial of the plan, planned on the started Ray's nodes, in one Tuner.fit(); with
    --rungs-first and trunks that carry branches, in two: the trunks paused at their last branch with their
    shorter trials, then the paused trunks continued, with those whose shorter trials had rows before this run
    (launch_plan.pause_trunks)."""
    launch = plan_launch(space, plan, out_dir / "trials", session.live_nodes())
    if not (opts.rungs_first and any(spec.branches for spec in launch.specs)):
        return run_tuner(space, launch, opts, out_dir)
    first, held = pause_trunks(launch, space)
    trunks = sum(bool(spec.branches) for spec in first.specs)
    waiting = (f"; {len(held)} trunk(s) whose shorter trials all have rows wait for round 2" if held else "")
    print(f"--rungs-first, round 1 of 2: {trunks} trunk(s) train to their last branch and pause there; every shorter "
          f"trial runs from its trunk's checkpoint{waiting}", flush=True)
    paused = PausedTrunks()
    slots, started = run_tuner(space, first, opts, out_dir, extra_callbacks=[paused])
    index = {key: i for i, key in enumerate(space.keys)}
    left = sorted(index[key] for key in paused.keys | set(held))
    if not left:
        return slots, started
    print(f"--rungs-first, round 2 of 2: {len(left)} paused trunk(s) continue from their checkpoints to their own "
          f"budget", flush=True)
    try:
        used, _ = run_tuner(space, plan_launch(space, plan, out_dir / "trials", session.live_nodes(), pending=left),
                            opts, out_dir)
    except SweepInterrupted as stop:
        raise SweepInterrupted(max(slots, stop.args[0]), started) from None
    return max(slots, used), started


class PausedTrunks(Callback):
    """The trial keys of the trunks that paused at their last branch (--rungs-first) in one Tuner.fit()."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("kind") == PAUSED:
            self.keys.add(str(result.get("trial_key")))


def run_tuner(space: Space, launch: Launch, opts: SweepOptions, out_dir: Path,
              extra_callbacks: list[Callback] | None = None) -> tuple[int, float]:
    """Run the planned Tune trials on the started Ray, with the Parquet writer and progress printer as
    callbacks; returns (how many ran at once, the Unix time Tuner.fit() started)."""
    items = launch.specs
    _print_launch(space, launch)
    # With no more trials than slots no worker would run a second trial, and Tune would only hand
    # a trial whose own worker is still starting to another trial's finished one (defeating SPREAD).
    reuse = opts.reuse and len(items) > launch.slots
    barrier, warmups = _warmup_trials(launch.slots if reuse else 0)
    if warmups:
        print(f"Tune's table below counts {len(items) + len(warmups)} trials: the {len(items)} of this sweep and "
              f"{len(warmups)} warm-up trial(s) that only start one worker per slot (no rows)", flush=True)
    trainable = tune.with_resources(run_trial, tune.PlacementGroupFactory([launch.bundle], strategy="SPREAD"))
    writer = ParquetResults(out_dir, space.name, launch.trial_configs(space), {k: i for i, k in enumerate(space.keys)},
                            task=space.task)
    tuner = tune.Tuner(
        trainable,
        param_space={SPEC_KEY: tune.grid_search([spec.to_dict() for spec in warmups + items])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=launch.max_concurrent or None, reuse_actors=reuse,
            trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(
            name=time.strftime("run-%Y%m%d-%H%M%S"), storage_path=str(out_dir / "ray"),
            failure_config=tune.FailureConfig(max_failures=opts.max_failures),
            callbacks=[writer, Progress(len(items), opts.progress_every_s, out_dir), *(extra_callbacks or [])],
            log_to_file=True,
            verbose=0),
    )
    fit_started = time.time()
    try:
        with session.temporary_environ({NO_TUNE_LOGGERS_ENV: "1", TRIAL_ERRORS_ENV: "0"}), \
                _quiet(TUNE_ANALYSIS_LOGGER), _tune_lines() as tune_lines:  # Parquet is the result
            tuner.fit()
    except Exception:  # Tune wraps a callback's error in a TuneError holding its traceback as text
        if writer.write_error is None:
            raise
        # disk full / read-only folder (issue 31, item 13): one line (sweep.py), with the command that continues
        raise ResultsWriteError(out_dir, writer.write_error.err, deadlines.resume_command(
            space.source, space.name, opts.results_dir, opts.data_dir, opts.resume_flags)) from None
    finally:
        if barrier is not None:
            ray.kill(barrier)
    writer.finish()  # rows after Tune's experiment end, if any; the store compacted (rpevit.sweep.store)
    if tune_lines.interrupted:
        raise SweepInterrupted(launch.slots, fit_started)
    return launch.slots, fit_started


def _print_launch(space: Space, launch: Launch) -> None:
    """What a timing space reserves, and how a fused space's trials are grouped."""
    first = launch.specs[0]
    if space.exclusive:
        gpus = first.gpus_per_trial
        print(f"{space.task} trials time: each reserves a whole node ({launch.reserved_cpus:g} CPU"
              f"{', ' if gpus else ''}{f'{gpus:g} GPU' if gpus else ''}) and runs with "
              f"{max(1, int(first.cpus_per_trial))} thread(s); timing: repeats {space.timing.repeats}, interleave "
              f"{space.timing.interleave}, warm-up {space.timing.warmup}", flush=True)
    if space.fuse:
        print(f"fuse: {space.fuse}: {len(launch.trial_indices(space))} trials run as {len(launch.specs)} fused "
              f"group(s), one Tune trial each (members differ only in seed)", flush=True)


def run_before_deadline(space: Space, plan: SweepPlan, opts: SweepOptions, out_dir: Path,
                        deadline: deadlines.Deadline) -> tuple[int, float | None, DeadlineReport]:
    """Run, in rounds, the pending Tune trials that the estimates say end before the deadline
    (rpevit.sweep.deadline, planned by launch_plan.plan_deadline_round): each round is planned before
    its Tuner.fit() from the rows measured so far, the time left and the start-up the last round
    measured; once its trials have finished, what is left is planned again, so time the estimates
    overstated is used. When nothing is known the first round is one probe. Returns (slots, Unix time
    the first Tuner.fit() started or None if nothing started, the report)."""
    pending, ran, slots_used, t0, notes = list(plan.pending), [], 0, None, []
    startup, rounds = deadlines.STARTUP_S, 0
    while pending:
        planned = plan_deadline_round(space, plan, out_dir, deadline, pending, nodes=session.live_nodes(),
                                      probe=rounds == 0, estimate_s=opts.deadline_estimate, startup_s=startup)
        decision = planned.decision
        notes.append("probe: 1 Tune trial" if decision.probe else decision.estimate_text(decision.admitted
                                                                                         or decision.left))
        print(deadline_plan_line(decision, planned.admitted, round_number=rounds + 1), flush=True)
        if not planned.admitted:
            break
        used, started = run_tuner(space, planned.launch, opts, out_dir)
        startup = measured_startup(out_dir, [space.keys[i] for i in planned.admitted], started) or startup
        slots_used, t0, ran, pending, rounds = max(slots_used, used), t0 if t0 is not None else started, \
            ran + planned.admitted, planned.left, rounds + 1
    return slots_used, t0, DeadlineReport(deadline, ran, pending, "; then ".join(notes))


def measured_startup(out_dir: Path, keys: list[str], fit_started: float) -> float | None:
    """Seconds from Tuner.fit() to the first of these trials starting in its worker (their rows'
    earliest started_at), at least PER_TRIAL_S; None without such a row."""
    rows = [r for r in read_rows(out_dir / TRIALS_FILE) if r.get("trial_key") in set(keys)]
    starts = [t for t in (deadlines.unix_time(r.get("started_at")) for r in rows) if math.isfinite(t)]
    return max(deadlines.PER_TRIAL_S, min(starts) - fit_started) if starts else None


def _trial_name(trial: Any) -> str:
    """Tune's trial name and folder: the sweep trial's key (see tune_trials)."""
    return TrialSpec.from_tune_config(trial.config).name


def _warmup_trials(slots: int) -> tuple[Any, list[TrialSpec]]:
    """(barrier actor, warm-up Tune trials): one per slot, run first, each holding its worker until
    every slot has one (trainable.wait_for_workers says why); none for a single slot."""
    if slots < 2:
        return None, []
    name = f"rpevit-start-barrier-{secrets.token_hex(6)}"
    barrier = StartBarrier.options(name=name).remote(slots)
    return barrier, [TrialSpec(name=f"warmup-{i}", barrier=name) for i in range(slots)]


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The named logger shows errors only, for a block."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


class Progress(Callback):
    """Prints running/pending/done/failed (and stopped: ended by Ctrl-C or a deadline without a row; paused: a
    trunk at its last branch under --rungs-first) and the best judged test accuracy of the finished trials
    (every_s, and per trial end); one line per failure."""

    def __init__(self, total: int, every_s: float, out_dir: Path | None = None) -> None:
        self.total, self.every_s, self.out_dir = total, every_s, out_dir
        self.best: tuple[float, str] = (-math.inf, "")
        self.last = 0.0
        self.notes: set[str] = set()
        self.shown = ""  # the last line printed, without its time
        self.reported: set[str] = set()  # the trial keys that reported their end (a summary or a failure row)
        self.paused: set[str] = set()  # the trunks that paused at their last branch (--rungs-first), no row yet

    def _reported(self, trial, result) -> None:
        if result.get("kind") in (SUMMARY, VARIANT_FAILED):
            self.reported.add(result.get("trial_key"))
        elif result.get("kind") == PAUSED:
            self.paused.add(result.get("trial_key"))

    def finished(self, trial) -> bool:
        """Whether every member of the Tune trial reported its end (a row, ok or failed): Tune's TERMINATED
        alone also holds for a trial that Ctrl-C stopped."""
        return {m.trial_key for m in members_of(trial)} <= self.reported

    def on_trial_result(self, iteration, trials, trial, result, **info):
        """Best = the highest judged test accuracy of the finished trials (summary rows): the mean over
        fresh draws for random-feature models, whose one-draw val_acc ranks a lottery (issue 31). A
        trial's NOTE (TensorBoard skipped, ...) is printed, each distinct line once."""
        self._reported(trial, result)
        if result.get("kind") == NOTE:
            line = str(result.get("error", ""))
            if line and line not in self.notes:
                self.notes.add(line)
                print(f"warning: {line}", flush=True)
            return
        if result.get("kind") != SUMMARY:
            return
        acc = judged_value(result.get("row") or {}, "test_acc")
        if isinstance(acc, float) and math.isfinite(acc) and acc > self.best[0]:
            members = {m.trial_key: m.label for m in members_of(trial)}  # a group reports for each member
            self.best = (acc, result.get("label") or members.get(result.get("trial_key"), next(iter(members.values()))))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.show(trials, force=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.say_failure(trial, retried=False)
        self.show(trials, force=True)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.say_failure(trial, retried=True)

    def say_failure(self, trial, retried: bool) -> None:
        """One line per failed try: the trial, the whole error as one line, where the traceback is (Tune's own
        console traceback is off: TRIAL_ERRORS_ENV)."""
        members = members_of(trial)
        if not members:
            return
        keys = " ".join(m.trial_key for m in members)
        label = members[0].label if len(members) == 1 else _group_label(members)
        where = (f"; traceback: error_traceback in {self.out_dir / 'trials.parquet'}, the trial's lines: "
                 f"{self.out_dir / 'trials'}/<trial_key>/log.txt" if self.out_dir is not None else "")
        what = "failed; retried from its last checkpoint" if retried else "failed"
        print(f"trial {keys} ({label}) {what}: {error_line(trial_traceback(trial))}{where}", flush=True)

    def on_step_end(self, iteration, trials, **info):
        self.show(trials)

    def on_experiment_end(self, trials, **info):
        self.show(trials, force=True)

    def show(self, trials, force: bool = False) -> None:
        """The line every every_s (a heartbeat), and at once when a trial ends or fails: there only if it
        says something new (several trials ending together, then the experiment, print one line)."""
        if not force and time.monotonic() - self.last < self.every_s:
            return
        trials = [t for t in trials if members_of(t)]  # not the warm-up trials
        count = lambda *s: sum(t.status in s for t in trials)  # noqa: E731
        best = f"{100 * self.best[0]:.2f}% ({self.best[1]})" if self.best[1] else "-"  # percent, as the summary
        groups = [_group_label(members_of(t)) for t in trials
                  if t.status == "RUNNING" and len(members_of(t)) > 1 and TrialSpec.from_tune_config(t.config).fused]
        running = f" | running groups: {'; '.join(groups)}" if groups else ""
        held = lambda t: {m.trial_key for m in members_of(t)} <= self.paused  # noqa: E731
        done = sum(t.status == "TERMINATED" and self.finished(t) for t in trials)
        paused = sum(t.status == "TERMINATED" and not self.finished(t) and held(t) for t in trials)
        stopped = sum(t.status == "TERMINATED" and not self.finished(t) and not held(t) for t in trials)
        line = (f"running {count('RUNNING')} | pending {count('PENDING', 'PAUSED')} | done {done} | "
                f"failed {count('ERROR')} | {f'paused at their last branch {paused} | ' if paused else ''}"
                f"{f'stopped {stopped} | ' if stopped else ''}of {self.total} | "
                f"best judged test acc {best}{running}")
        if force and line == self.shown:
            return
        self.last, self.shown = time.monotonic(), line
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def _group_label(members: tuple[Member, ...]) -> str:
    """'attention=favor pe=rope, seeds 0 1 2': a fused group's shared label and its seeds."""
    shared = " ".join(part for part in members[0].label.split() if not part.startswith("seed="))
    return f"{shared or members[0].trial_key}, seeds {' '.join(str(m.cfg['seed']) for m in members)}"
