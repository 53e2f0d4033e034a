"""Run a validated Space: `execute_sweep` calls each layer, each the one owner of its concern, in order:

- the lock: one driver per sweep folder (lock.py; taken here, nowhere else, before Ray is imported,
  so a second driver stops at once);
- the plan: resume bookkeeping and resources, decided before Ray starts (plan.py); the Tune trials
  (fused groups, ladders, interleaved timing runs), what each reserves and, with --deadline, which
  start: planned by code that imports no Ray (launch_plan.py), on the nodes the started Ray lists,
  and before Ray starts for a deadline that nothing can meet;
- the Ray session: embedded on loopback or joined, the reaper, SIGTERM, shutdown (session.py);
- the Tune run: the planned Tune trials on the started Ray, in reused workers, with the Parquet
  writer and progress; with --deadline in rounds, each planned when the last has ended (tune_run.py);
- the summary, computed from the Parquet rows apart from its printing (summary.py).

Nothing here imports Ray: tune_run.py does, once the lock is held and loopback asked for.

Guarantees around that (README, "Reliability"): one driver per sweep folder; only rows of the
current space's trial keys count (an edited YAML's old rows are set aside); the embedded Ray listens
on 127.0.0.1 only and its processes end with the driver (session.py, reaper.py).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from rpevit import sigterm
from rpevit.sweep import deadline as deadlines
from rpevit.sweep import declaration, migrate, session
from rpevit.sweep.launch_plan import check_rungs_first, nothing_fits
from rpevit.sweep.lock import sweep_dir, sweep_lock
from rpevit.sweep.options import SweepOptions
from rpevit.sweep.plan import plan_sweep, write_space_file
from rpevit.sweep.results import DamagedResults
from rpevit.sweep.store import compact
from rpevit.sweep.space import Space, check_name
from rpevit.sweep.summary import SweepOutcome, summarize


def run_sweep(space: Space, opts: SweepOptions) -> int:
    """Run every pending trial of the space; 0 if all succeeded, 1 if any failed."""
    return execute_sweep(space, opts).exit_code


def compact_left_over(out_dir: Path, space: Space) -> None:
    """Compact the parts a killed (or stopped) driver left (rpevit.sweep.store), before anything else
    reads the folder: afterwards trials.parquet / epochs.parquet hold every row, in this space's order.
    Called under the lock after plan_sweep, which has set a damaged trials.parquet aside; a damaged
    epochs.parquet is left for the writer, which sets it aside and rebuilds its rows from the trials'
    checkpoints (until then the parts keep their rows and every reader sees them)."""
    try:
        compact(out_dir, {k: i for i, k in enumerate(space.keys)}, space.task)
    except DamagedResults:
        pass


def execute_sweep(space: Space, opts: SweepOptions) -> SweepOutcome:
    """run_sweep, returning the throughput figures too (benchmarks/sweep_overhead.py). The steps,
    top-down: lock, plan, record the space, start or join Ray, check the trial fits, run the Tuner
    (with a deadline: what fits), summarize. SIGTERM unwinds like Ctrl-C throughout."""
    check_name(space.name, "sweep name")  # also for callers that set space.name themselves
    deadline = deadlines.as_deadline(opts.deadline)  # a --deadline text is parsed now (sweep.py did it already)
    deadlines.check_estimate(opts.deadline_estimate, deadline)
    check_rungs_first(space, opts.rungs_first, deadline)
    res = space.resources.with_overrides(opts.cpus_per_trial, opts.gpus_per_trial, opts.max_concurrent,
                                         space.source)
    out_dir = sweep_dir(opts.results_dir, space.name)
    with sigterm.unwinding(), sweep_lock(out_dir):  # one driver per sweep (rpevit.sweep.lock); SIGTERM: rpevit.sigterm
        migrated = migrate.migrate_folder(out_dir, space)  # results of the older key scheme (rpevit.sweep.migrate)
        if migrated:
            print(migrated, flush=True)
        plan = plan_sweep(space, out_dir, resume=opts.resume, retry_failed=opts.retry_failed,
                          data_dir=opts.data_dir, resources=res)
        compact_left_over(out_dir, space)
        write_space_file(out_dir, space)
        declared = declaration.record(out_dir, space.declaration, redeclare=opts.redeclare,
                                      rows_exist=declaration.trials_began(out_dir))  # epoch rows, checkpoints too
        if declared:
            print(declared, flush=True)
        print(f"sweep {space.name!r}: {len(space.trials)} trials, {len(space.trials) - len(plan.pending)} already "
              f"done, {len(plan.pending)} to run; {res.cpus_per_trial:g} CPU + {res.gpus_per_trial:g} GPU per trial; "
              f"results in {out_dir}")
        if deadline is not None:
            print(f"deadline {deadline.describe()}: only trials predicted to end before it start", flush=True)
        if plan.pending:  # the driver prints counts only: where each trial's own lines are
            print(f"each trial's lines (epochs, evaluation stages): {out_dir / 'trials'}/<trial_key>/log.txt, "
                  f"and in the dashboard under its actor's STDOUT log (Logs, or Actors -> ImplicitFunc)", flush=True)
        if not plan.pending:
            return summarize(out_dir, space, wall_s=0.0, resume=opts.resume_info())
        idle = nothing_fits(space, plan, out_dir, deadline, opts.deadline_estimate) if deadline is not None else None
        if idle is not None:  # a Ray that would run nothing is not started (nor imported)
            return summarize(out_dir, space, wall_s=0.0, resume=opts.resume_info(), deadline=idle)
        session.prefer_loopback(opts.address)  # before Ray's first import in this process (session.py)
        session.probe_address(opts.address)  # a dead address: one line now, before Ray's import and its retries
        joined_with = session.prepare_join(opts.address)  # a token-auth head: RAY_AUTH_MODE before Ray's import
        if joined_with:
            print(joined_with, flush=True)
        with sigterm.held():  # Ray's imports are not cut midway: C code can clear a SystemExit raised inside an
            # import and leave a module half imported (rpevit.sigterm); a SIGTERM ends the driver right after them
            session.import_ray()
            from rpevit.sweep.tune_run import SweepInterrupted, run_before_deadline, run_sweep_trials
        slots, t0, report, interrupted = 0, None, None, False
        try:
            with session.ray_session(opts.address, opts.dashboard, res.gpus_per_trial) as started_ray:
                fixed_cluster = started_ray and not session.cluster_address(opts.address)
                waits = session.check_fits(res.cpus_per_trial, res.gpus_per_trial, fixed_cluster=fixed_cluster)
                if waits:
                    print(waits, file=sys.stderr, flush=True)
                if deadline is None:
                    slots, t0 = run_sweep_trials(space, plan, opts, out_dir)
                else:
                    slots, t0, report = run_before_deadline(space, plan, opts, out_dir, deadline)
        except SweepInterrupted as stop:  # Ctrl-C: Tune stopped the running trials; every row so far is written
            (slots, t0), interrupted = stop.args, True
        except KeyboardInterrupt:  # a second Ctrl-C, or one before Tune ran: stopped at once, Ray shut down
            interrupted = True
        wall = time.time() - t0 if t0 is not None else 0.0
        return summarize(out_dir, space, wall_s=wall, slots=slots, started_after=t0 or 0.0,
                         resume=opts.resume_info(), deadline=report, interrupted=interrupted)
