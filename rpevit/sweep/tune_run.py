"""The Tune layer of a sweep: the pending trials as Tune trials (one per trial, per fused group of
seeds, or one for an interleaved timing run), run by Tuner.fit() on the started Ray with the Parquet
writer and the progress printer as callbacks; with --deadline, only those the estimates say end in
time (deadline.py). Called by runner.execute_sweep with the lock held and the Ray session started.

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
from rpevit.sweep.options import SweepOptions
from rpevit.sweep.plan import SweepPlan
from rpevit.sweep.protocol import NOTE, SPEC_KEY, SUMMARY, Member, TrialSpec, members_of
from rpevit.sweep.results import TRIALS_FILE, ResultsWriteError
from rpevit.sweep.store import read_rows
from rpevit.sweep.writer import ParquetResults
from rpevit.sweep.space import Resources, Space
from rpevit.sweep.summary import DeadlineReport, judged_value
from rpevit.sweep.trainable import StartBarrier, run_trial

NO_TUNE_LOGGERS_ENV = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"  # no per-trial CSV / JSON / TensorBoard files
TUNE_ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"  # would warn once per trial about them


def run_tuner(space: Space, plan: SweepPlan, opts: SweepOptions, out_dir: Path) -> tuple[int, float]:
    """Build the Tune trials of the pending trials and run them on the started Ray, with the
    Parquet writer and progress printer as callbacks; returns (how many ran at once, the Unix
    time Tuner.fit() started)."""
    cpus, gpus, max_concurrent = (plan.resources.cpus_per_trial, plan.resources.gpus_per_trial,
                                  plan.resources.max_concurrent)
    reserved, bundle = _bundle(space, plan.resources)
    if space.exclusive:
        print(f"{space.task} trials time: each reserves a whole node ({reserved:g} CPU{', ' if gpus else ''}"
              f"{f'{gpus:g} GPU' if gpus else ''}) and runs with {max(1, int(cpus))} thread(s); timing: repeats "
              f"{space.timing.repeats}, interleave {space.timing.interleave}, warm-up {space.timing.warmup}",
              flush=True)
    items = tune_trials(space, plan.configs, plan.pending, checkpoint_root=out_dir / "trials", cpus=cpus, gpus=gpus,
                        reserved_cpus=reserved)
    if space.fuse:
        print(f"fuse: {space.fuse}: {len(plan.pending)} trials run as {len(items)} fused group(s), one Tune trial "
              f"each (members differ only in seed)", flush=True)
    slots = session.slots(bundle, max_concurrent, len(items))
    # With no more trials than slots no worker would run a second trial, and Tune would only hand
    # a trial whose own worker is still starting to another trial's finished one (defeating SPREAD).
    reuse = opts.reuse and len(items) > slots
    barrier, warmups = _warmup_trials(slots if reuse else 0)
    if warmups:
        print(f"Tune's table below counts {len(items) + len(warmups)} trials: the {len(items)} of this sweep and "
              f"{len(warmups)} warm-up trial(s) that only start one worker per slot (no rows)", flush=True)
    trainable = tune.with_resources(run_trial, tune.PlacementGroupFactory([bundle], strategy="SPREAD"))
    writer = ParquetResults(out_dir, space.name, {space.keys[i]: plan.configs[i] for i in plan.pending},
                            {k: i for i, k in enumerate(space.keys)}, task=space.task)
    progress = Progress(len(items), opts.progress_every_s)
    tuner = tune.Tuner(
        trainable,
        param_space={SPEC_KEY: tune.grid_search([spec.to_dict() for spec in warmups + items])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=max_concurrent or None, reuse_actors=reuse,
            trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(
            name=time.strftime("run-%Y%m%d-%H%M%S"), storage_path=str(out_dir / "ray"),
            failure_config=tune.FailureConfig(max_failures=opts.max_failures),
            callbacks=[writer, progress], log_to_file=True, verbose=0),
    )
    fit_started = time.time()
    try:
        with session.temporary_environ({NO_TUNE_LOGGERS_ENV: "1"}), _quiet(TUNE_ANALYSIS_LOGGER):  # Parquet is the result
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
    return slots, fit_started


def _bundle(space: Space, res: Resources) -> tuple[float, dict[str, float]]:
    """(CPUs a Tune trial reserves, its placement bundle): a timing trial reserves a whole node."""
    reserved = session.node_cpus(res.gpus_per_trial) if space.exclusive else res.cpus_per_trial
    return reserved, {"CPU": reserved, **({"GPU": res.gpus_per_trial} if res.gpus_per_trial > 0 else {})}


def run_before_deadline(space: Space, plan: SweepPlan, opts: SweepOptions, out_dir: Path,
                        deadline: deadlines.Deadline) -> tuple[int, float | None, DeadlineReport]:
    """Run, in rounds, the pending Tune trials that the estimates say end before the deadline
    (rpevit.sweep.deadline): each round is planned before its Tuner.fit() from the rows measured so
    far, the time left and the start-up the last round measured; once its trials have finished, what
    is left is planned again, so time the estimates overstated is used. When nothing is known the
    first round is one probe. Returns (slots, Unix time the first Tuner.fit() started or None if
    nothing started, the report)."""
    res = plan.resources
    pending, ran, slots_used, t0, notes = list(plan.pending), [], 0, None, []
    startup, rounds = deadlines.STARTUP_S, 0
    while pending:
        decision, admitted, left = plan_deadline_round(space, plan, opts, out_dir, deadline, pending,
                                                       probe=rounds == 0, startup_s=startup)
        notes.append("probe: 1 Tune trial" if decision.probe else decision.estimate_text(decision.admitted
                                                                                         or decision.left))
        print_deadline_plan(decision, admitted, round_number=rounds + 1)
        if not admitted:
            break
        used, started = run_tuner(space, SweepPlan(plan.configs, admitted, res), opts, out_dir)
        startup = measured_startup(out_dir, [space.keys[i] for i in admitted], started) or startup
        slots_used, t0, ran, pending, rounds = max(slots_used, used), t0 if t0 is not None else started, \
            ran + admitted, left, rounds + 1
    return slots_used, t0, DeadlineReport(deadline, ran, pending, "; then ".join(notes))


def plan_deadline_round(space: Space, plan: SweepPlan, opts: SweepOptions, out_dir: Path,
                        deadline: deadlines.Deadline, pending: list[int], *, probe: bool,
                        startup_s: float = deadlines.STARTUP_S,
                        slots: int | None = None) -> tuple[deadlines.DeadlinePlan, list[int], list[int]]:
    """(the plan of one round, the trials it starts, the trials it leaves: indices into the space) for
    the pending trials; `slots` None: as many as the started Ray holds."""
    res = plan.resources
    specs = tune_trials(space, plan.configs, pending, checkpoint_root=out_dir / "trials",
                        cpus=res.cpus_per_trial, gpus=res.gpus_per_trial, reserved_cpus=0.0)
    index = {key: i for i, key in enumerate(space.keys)}
    units = [deadlines.Unit(tuple((m.trial_key, m.cfg) for m in spec.members),
                            "fused" if spec.fused else "interleaved" if len(spec.members) > 1 else "single")
             for spec in specs]
    if slots is None:
        slots = session.slots(_bundle(space, res)[1], res.max_concurrent, len(units))
    estimator = deadlines.Estimator.from_folder(out_dir, space.task, opts.deadline_estimate)
    decision = deadlines.plan_units(units, estimator, slots=slots, now=time.time(), deadline=deadline,
                                    checkpoint_root=out_dir / "trials", probe=probe, startup_s=startup_s)
    members = [[index[key] for key, _ in unit.members] for unit in units]
    admitted = sorted(i for u in decision.admitted for i in members[u])
    return decision, admitted, sorted(i for u in decision.left for i in members[u])


def print_deadline_plan(decision: deadlines.DeadlinePlan, admitted: list[int], round_number: int = 1) -> None:
    """One line: how many Tune trials (and trials) start, when the last should end, the estimate."""
    units = len(decision.admitted) + len(decision.left)
    finish = (f", the last predicted to end at {time.strftime('%H:%M:%S', time.localtime(decision.finish_at))}"
              if math.isfinite(decision.finish_at) else "")
    what = "deadline plan" if round_number == 1 else f"deadline plan, round {round_number} (after the last finished)"
    print(f"{what}: starting {len(decision.admitted)} of {units} Tune trial(s) ({len(admitted)} trial(s)){finish}; "
          f"leaving {len(decision.left)} that would not end before the deadline; estimate: "
          f"{decision.estimate_text() if decision.probe else decision.estimate_text(decision.admitted or decision.left)}",
          flush=True)


def measured_startup(out_dir: Path, keys: list[str], fit_started: float) -> float | None:
    """Seconds from Tuner.fit() to the first of these trials starting in its worker (their rows'
    earliest started_at), at least PER_TRIAL_S; None without such a row."""
    rows = [r for r in read_rows(out_dir / TRIALS_FILE) if r.get("trial_key") in set(keys)]
    starts = [t for t in (deadlines.unix_time(r.get("started_at")) for r in rows) if math.isfinite(t)]
    return max(deadlines.PER_TRIAL_S, min(starts) - fit_started) if starts else None


def nothing_fits(space: Space, plan: SweepPlan, opts: SweepOptions, out_dir: Path,
                 deadline: deadlines.Deadline) -> DeadlineReport | None:
    """Before Ray starts: the report of a run that starts nothing, when even as many slots as Tune
    trials would admit none (the deadline is too near for the start-up, or every trial is longer
    than the time left); None when something may fit (Ray then starts and the rounds decide)."""
    decision, admitted, left = plan_deadline_round(space, plan, opts, out_dir, deadline, list(plan.pending),
                                                   probe=True, slots=max(1, len(plan.pending)))
    if admitted:
        return None
    print_deadline_plan(decision, admitted)
    print("nothing fits before the deadline, even with every Tune trial on a slot of its own: Ray is not started",
          flush=True)
    return DeadlineReport(deadline, [], left, decision.estimate_text(decision.left))


def tune_trials(space: Space, configs: list[dict[str, Any]], pending: list[int], *, checkpoint_root: Path,
                cpus: float, gpus: float, reserved_cpus: float) -> list[TrialSpec]:
    """The Tune trials (grid points) for the pending trials: one each, except that an interleaved
    timing space runs all its pending variants in one Tune trial (rounds inside one worker), and a
    `fuse: seeds` space one per group of pending seeds of one recipe (space.groups)."""
    member = {i: Member(space.keys[i], space.label(i), configs[i]) for i in pending}
    timing = space.timing if space.exclusive else None
    if timing and timing.interleave:
        groups = [[member[i] for i in pending]]
    else:
        groups = [[member[i] for i in g] for g in space.groups(pending)]
    fused = space.fuse is not None
    branches: dict[str, tuple[Member, ...]] = {}
    if space.branch is not None:  # each ladder's longest pending trial first, carrying the shorter ones
        ladders = space.ladders(pending)
        branches = {space.keys[ladder[0]]: tuple(member[i] for i in ladder[1:]) for ladder in ladders}
        trunks = [[member[ladder[0]]] for ladder in ladders]
        groups = trunks + [g for g in groups if g[0].trial_key not in branches]
    return [TrialSpec(name=_spec_name(g, fused, timing), members=tuple(g), checkpoint_root=str(checkpoint_root),
                      cpus_per_trial=cpus, gpus_per_trial=gpus, reserved_cpus=reserved_cpus, timing=timing,
                      fused=fused, branches=branches.get(g[0].trial_key, ())) for g in groups]


def _spec_name(members: list[Member], fused: bool, timing: Any) -> str:
    """The Tune trial's name and folder: the sweep trial's key, or what a group holds."""
    if fused:
        seeds = "-".join(str(m.cfg["seed"]) for m in members)
        return f"fused-{members[0].trial_key}-seeds-{seeds}"[:120]
    return members[0].trial_key if len(members) == 1 else f"interleaved-{len(members)}-{members[0].trial_key}"


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
    """Prints running/pending/done/failed and the best judged test accuracy of the finished trials (every_s, and per trial end)."""

    def __init__(self, total: int, every_s: float) -> None:
        self.total, self.every_s = total, every_s
        self.best: tuple[float, str] = (-math.inf, "")
        self.last = 0.0
        self.notes: set[str] = set()
        self.shown = ""  # the last line printed, without its time

    def on_trial_result(self, iteration, trials, trial, result, **info):
        """Best = the highest judged test accuracy of the finished trials (summary rows): the mean over
        fresh draws for random-feature models, whose one-draw val_acc ranks a lottery (issue 31). A
        trial's NOTE (TensorBoard skipped, ...) is printed, each distinct line once."""
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
        self.show(trials, force=True)

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
        best = f"{self.best[0]:.4f} ({self.best[1]})" if self.best[1] else "-"
        groups = [_group_label(members_of(t)) for t in trials
                  if t.status == "RUNNING" and len(members_of(t)) > 1 and TrialSpec.from_tune_config(t.config).fused]
        running = f" | running groups: {'; '.join(groups)}" if groups else ""
        line = (f"running {count('RUNNING')} | pending {count('PENDING', 'PAUSED')} | done {count('TERMINATED')} | "
                f"failed {count('ERROR')} | of {self.total} | best judged test acc {best}{running}")
        if force and line == self.shown:
            return
        self.last, self.shown = time.monotonic(), line
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def _group_label(members: tuple[Member, ...]) -> str:
    """'attention=favor pe=rope, seeds 0 1 2': a fused group's shared label and its seeds."""
    shared = " ".join(part for part in members[0].label.split() if not part.startswith("seed="))
    return f"{shared or members[0].trial_key}, seeds {' '.join(str(m.cfg['seed']) for m in members)}"
