"""Run a validated Space on Ray Tune: resources, GPU spreading, resume, failures, progress, summary.

Resume is our own bookkeeping, keyed by trial_key: trials with a row in trials.parquet are done
(failed ones too, unless retry_failed), every other trial is handed to a fresh Tuner and
continues from its checkpoint directory. This survives a SIGKILL of the driver at any moment
(no Tune experiment state needs to have been saved) and edits of unrelated code.

Guarantees the runner adds around that (README, "Reliability"):

- one driver per sweep folder: an exclusive flock on `<out>/.sweep.lock`, released by the kernel
  when the driver dies, so a second driver stops at once and a killed one never blocks `--resume`;
- only rows of the current space's trial keys count (an edited YAML's old rows are set aside);
- the embedded Ray listens on 127.0.0.1 only and its processes end with the driver (reaper.py).

Throughput: Tune reuses workers (`reuse_actors`, SweepOptions.reuse; trainable.py resets the
process state between trials) and writes no per-trial logger files, so a tiny trial costs a
fraction of a second outside the task instead of a process start; the summary prints that
figure. Timing tasks (registry.TIMING_TASKS) reserve a whole node per trial instead (see space.py).
"""
from __future__ import annotations

import json
import logging
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import ray
from ray import tune
from ray.tune import Callback

from rpevit.checkpoint import CHECKPOINT_NAME
from rpevit.data import FOLDERLESS_DATASETS, resolve_data_dir
from rpevit.sweep import deadline as deadlines
from rpevit.sweep import reaper
from rpevit.sweep.gpus import NOSET_ENV
from rpevit.sweep import migrate
from rpevit.sweep.lock import sweep_dir, sweep_lock
from rpevit.sweep.protocol import FAILED, OK, SPEC_KEY, SUMMARY, Member, TrialSpec, members_of
from rpevit.sweep.results import (EPOCHS_FILE, SPACE_FILE, TRIALS_FILE, ParquetResults, ResultsWriteError,
                                  driver_trials, select_keys, trial_seconds, unix_seconds)
from rpevit.sweep.space import Resources, Space, SpaceError, check_name
from rpevit.sweep.trainable import StartBarrier, run_trial

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node IP is 127.0.0.1 (ray_constants)
LOOPBACK = ("127.0.0.1", "::1", "localhost")
NO_TUNE_LOGGERS_ENV = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"  # no per-trial CSV / JSON / TensorBoard files
TUNE_ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"  # would warn once per trial about them


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
    resume_flags: tuple[str, ...] = ()  # flags that select the space's trials (--set, --only), for the resume line


def prepare_trials(space: Space, opts: SweepOptions) -> list[dict[str, Any]]:
    """Trial configs as they run: data_dir made absolute (trials run with their own cwd); left
    empty for datasets that read no folder (digits), whose config refuses a data_dir."""
    out = []
    for cfg in space.trials:
        if cfg["dataset"] in FOLDERLESS_DATASETS:
            out.append(dict(cfg))
            continue
        chosen = opts.data_dir or cfg["data_dir"] or None
        out.append({**cfg, "data_dir": str(resolve_data_dir(chosen))})
    return out


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


def run_sweep(space: Space, opts: SweepOptions) -> int:
    """Run every pending trial of the space; 0 if all succeeded, 1 if any failed."""
    return execute_sweep(space, opts).exit_code


def execute_sweep(space: Space, opts: SweepOptions) -> SweepOutcome:
    """run_sweep, returning the throughput figures too (benchmarks/sweep_overhead.py)."""
    check_name(space.name, "sweep name")  # also for callers that set space.name themselves
    out_dir = sweep_dir(opts.results_dir, space.name)
    with sweep_lock(out_dir):  # one driver per sweep (rpevit.sweep.lock)
        return _run_locked(space, opts, out_dir)


@dataclass
class SweepPlan:
    """What this run of a sweep will do, decided before Ray starts: the trials it runs and on what."""
    configs: list[dict[str, Any]]  # every trial's config as it runs (prepare_trials), in space order
    pending: list[int]  # indices into configs of the trials without a row yet
    resources: Resources  # the space's resources with the command line's overrides


def _run_locked(space: Space, opts: SweepOptions, out_dir: Path) -> SweepOutcome:
    """The steps of a sweep, top-down: plan (resume bookkeeping, resources), record the space,
    start or join Ray, check the trial fits, run the Tuner (with a deadline: what fits), print the summary."""
    deadline = deadlines.as_deadline(opts.deadline)  # a --deadline text is parsed now (sweep.py did it already)
    deadlines.check_estimate(opts.deadline_estimate, deadline)
    migrated = migrate.migrate_folder(out_dir, space)  # results of the older key scheme (rpevit.sweep.migrate)
    if migrated:
        print(migrated, flush=True)
    plan = plan_sweep(space, opts, out_dir)
    write_space_file(out_dir, space)
    res = plan.resources
    print(f"sweep {space.name!r}: {len(space.trials)} trials, {len(space.trials) - len(plan.pending)} already "
          f"done, {len(plan.pending)} to run; {res.cpus_per_trial:g} CPU + {res.gpus_per_trial:g} GPU per trial; "
          f"results in {out_dir}")
    if deadline is not None:
        print(f"deadline {deadline.describe()}: only trials predicted to end before it start", flush=True)
    if not plan.pending:
        return summarize(out_dir, space, wall_s=0.0, opts=opts)
    with _ray(opts, res.gpus_per_trial) as started_ray:
        _check_fits(res.cpus_per_trial, res.gpus_per_trial, fixed_cluster=started_ray and not _address(opts))
        if deadline is None:
            slots, t0 = run_tuner(space, plan, opts, out_dir)
            report = None
        else:
            slots, t0, report = run_before_deadline(space, plan, opts, out_dir, deadline)
        wall = time.time() - t0 if t0 is not None else 0.0
    return summarize(out_dir, space, wall_s=wall, slots=slots, started_after=t0 or 0.0, opts=opts, deadline=report)


def plan_sweep(space: Space, opts: SweepOptions, out_dir: Path) -> SweepPlan:
    """Resume bookkeeping: refuse to overwrite a started sweep without --resume; trials with a row of
    the current space are done (failed ones too, unless retry_failed); the rest are pending."""
    everything = driver_trials(out_dir)
    started = not everything.empty or any((out_dir / "trials").glob(f"*/{CHECKPOINT_NAME}"))
    if started and not opts.resume:
        raise SpaceError(f"{out_dir} already holds results of sweep {space.name!r}; pass --resume to "
                         f"continue it, or choose another --name / --results-dir")
    if opts.resume and not started:
        print(f"nothing to resume, starting: {out_dir} holds no results of sweep {space.name!r} yet", flush=True)
    previous, set_aside = select_keys(everything, space.current_keys)
    if set_aside:
        print(f"set aside {set_aside} row(s) of trials that are not in the current space (its YAML changed "
              f"since they ran): kept in {TRIALS_FILE}, not counted as done, not in the summary", flush=True)
    finished = set()
    if not previous.empty:
        keep = [OK] if opts.retry_failed else [OK, FAILED]
        finished = set(previous.loc[previous["status"].isin(keep), "trial_key"])
    given = {"cpus_per_trial": opts.cpus_per_trial, "gpus_per_trial": opts.gpus_per_trial,
             "max_concurrent": opts.max_concurrent}
    res = Resources.from_dict({**vars(space.resources), **{k: v for k, v in given.items() if v is not None}},
                              source=f"{space.source} + command line")
    return SweepPlan(configs=prepare_trials(space, opts),
                     pending=[i for i, key in enumerate(space.keys) if key not in finished], resources=res)


def write_space_file(out_dir: Path, space: Space) -> None:
    """space.json (atomically): the trial keys analysis uses to tell current rows from stale ones."""
    tmp = out_dir / f".{SPACE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"name": space.name, "source": space.source, "key_scheme": migrate.KEY_SCHEME,
                               "trial_keys": space.current_keys}, indent=1))
    os.replace(tmp, out_dir / SPACE_FILE)


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
    slots = _slots(bundle, max_concurrent, len(items))
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
        with _environ({NO_TUNE_LOGGERS_ENV: "1"}), _quiet(TUNE_ANALYSIS_LOGGER):  # Parquet is the result
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
    writer.flush()
    return slots, fit_started


def _bundle(space: Space, res: Resources) -> tuple[float, dict[str, float]]:
    """(CPUs a Tune trial reserves, its placement bundle): a timing trial reserves a whole node."""
    reserved = _node_cpus(res.gpus_per_trial) if space.exclusive else res.cpus_per_trial
    return reserved, {"CPU": reserved, **({"GPU": res.gpus_per_trial} if res.gpus_per_trial > 0 else {})}


@dataclass
class DeadlineReport:
    """What a run with --deadline did, for the summary."""
    deadline: deadlines.Deadline
    ran: list[int]  # the trials (indices into the space) it started
    left: list[int]  # those it left because they would not end before the deadline
    estimate: str  # the estimates the plan used, in words


def run_before_deadline(space: Space, plan: SweepPlan, opts: SweepOptions, out_dir: Path,
                        deadline: deadlines.Deadline) -> tuple[int, float | None, DeadlineReport]:
    """Run the pending Tune trials that the estimates say end before the deadline (rpevit.sweep.deadline):
    the plan is made once, before Tuner.fit(); when nothing is known yet, one trial runs first as a
    probe and the rest is planned once from its row. Returns (slots, Unix time the first Tuner.fit()
    started or None if nothing started, the report)."""
    res = plan.resources
    _, bundle = _bundle(space, res)
    pending, ran, slots_used, t0, notes = list(plan.pending), [], 0, None, []
    for first in (True, False):
        specs = tune_trials(space, plan.configs, pending, checkpoint_root=out_dir / "trials",
                            cpus=res.cpus_per_trial, gpus=res.gpus_per_trial, reserved_cpus=0.0)
        index = {key: i for i, key in enumerate(space.keys)}
        units = [deadlines.Unit(tuple((m.trial_key, m.cfg) for m in spec.members),
                                "fused" if spec.fused else "interleaved" if len(spec.members) > 1 else "single")
                 for spec in specs]
        estimator = deadlines.Estimator.from_folder(out_dir, space.task, opts.deadline_estimate)
        decision = deadlines.plan_units(units, estimator, slots=_slots(bundle, res.max_concurrent, len(units)),
                                        now=time.time(), deadline=deadline, checkpoint_root=out_dir / "trials",
                                        probe=first)
        members = [[index[key] for key, _ in unit.members] for unit in units]
        admitted = sorted(i for u in decision.admitted for i in members[u])
        pending = sorted(i for u in decision.left for i in members[u])
        notes.append("probe: 1 Tune trial" if decision.probe else decision.estimate_text(decision.admitted
                                                                                         or decision.left))
        finish = (f", the last predicted to end at {time.strftime('%H:%M:%S', time.localtime(decision.finish_at))}"
                  if math.isfinite(decision.finish_at) else "")
        print(f"deadline plan: starting {len(decision.admitted)} of {len(units)} Tune trial(s) ({len(admitted)} "
              f"trial(s)){finish}; leaving {len(decision.left)} that would not end before the deadline; "
              f"estimate: {notes[-1] if not decision.probe else decision.estimate_text()}", flush=True)
        if admitted:
            used, started = run_tuner(space, SweepPlan(plan.configs, admitted, res), opts, out_dir)
            slots_used, t0, ran = max(slots_used, used), t0 if t0 is not None else started, ran + admitted
        if not (decision.probe and pending):
            break
    return slots_used, t0, DeadlineReport(deadline, ran, pending, "; then ".join(notes))


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
    return [TrialSpec(name=_spec_name(g, fused, timing), members=tuple(g), checkpoint_root=str(checkpoint_root),
                      cpus_per_trial=cpus, gpus_per_trial=gpus, reserved_cpus=reserved_cpus, timing=timing,
                      fused=fused) for g in groups]


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


def _node_cpus(gpus: float) -> float:
    """CPUs of the largest live node that has the trial's GPUs: what a timing trial reserves, so no
    other trial of the sweep shares its node (on a mixed cluster timing trials run on the largest
    such nodes only, which keeps their rows comparable)."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    fitting = [r for r in nodes if r.get("GPU", 0.0) >= gpus] or nodes
    return max(r.get("CPU", 0.0) for r in fitting)


def _slots(bundle: dict[str, float], max_concurrent: int, n_trials: int) -> int:
    """How many Tune trials run at once: bundles that fit per live node, summed, capped."""
    fit = 0
    for node in ray.nodes():
        if node.get("Alive"):
            have = node["Resources"]
            fit += min(int(have.get(r, 0.0) / need + 1e-9) for r, need in bundle.items() if need > 0)
    return max(1, min(fit, max_concurrent or fit, n_trials))


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


@contextmanager
def _environ(changes: dict[str, str]) -> Iterator[None]:
    """Environment variables set for a block and restored after it."""
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _address(opts: SweepOptions) -> str | None:
    return opts.address or os.environ.get("RAY_ADDRESS")


def _check_fits(cpus: float, gpus: float, fixed_cluster: bool) -> None:
    """On the embedded (non-autoscaling) Ray, a trial bigger than the machine would wait forever."""
    have = ray.cluster_resources()
    for name, need in (("cpus_per_trial", cpus), ("gpus_per_trial", gpus)):
        avail = have.get(name.split("s_")[0].upper(), 0.0)
        if fixed_cluster and need > avail:
            raise SpaceError(f"{name} has value {need:g} but this machine has {avail:g}; allowed: <= {avail:g} "
                             f"(--{name.replace('_', '-')}, or join a bigger cluster with --address)")


@contextmanager
def _ray(opts: SweepOptions, gpus: float) -> Iterator[bool]:
    """Ray for one sweep: joined (--address / $RAY_ADDRESS), or embedded and ours to shut down;
    yields whether this call started it (False if Ray was already up, e.g. in tests)."""
    if ray.is_initialized():
        yield False
        return
    address = _address(opts)
    watchdog = None if address else _start_reaper()
    previous_handler = None
    try:
        _init_ray(opts, gpus, address, owner=watchdog[1] if watchdog else None)
        if threading.current_thread() is threading.main_thread():
            # Ray's core replaced the SIGTERM handler by one that aborts (no cleanup): `kill <driver>`
            # should unwind like Ctrl-C instead, through ray.shutdown() below
            previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        yield True
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        clean = False
        try:
            ray.shutdown()
            clean = True
        finally:
            if watchdog is not None:  # closing the pipe wakes the reaper; CLEAN: Ray went down itself
                try:
                    if clean:
                        watchdog[0].stdin.write(reaper.CLEAN)
                    watchdog[0].stdin.close()
                    watchdog[0].wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _start_reaper() -> tuple[subprocess.Popen, str] | None:
    """The watchdog that ends this embedded Ray's processes when the driver dies (see reaper.py)."""
    if not sys.platform.startswith("linux"):
        return None
    token = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k != reaper.OWNER_ENV}
    proc = subprocess.Popen([sys.executable, reaper.__file__, token], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)  # not in the driver's group: Ctrl-C is the driver's
    return proc, token


@contextmanager
def _local_environment(owner: str | None) -> Iterator[None]:
    """Settings that the embedded Ray's processes inherit at start-up, restored afterwards.

    LOCAL_ONLY_ENV=0 makes Ray pick 127.0.0.1 as the node IP, and Ray 2.5x+ then binds gcs_server,
    raylet, agents, workers and the driver to loopback instead of 0.0.0.0 / the machine's address
    (`ray.init(_node_ip_address="127.0.0.1")` does not do it: Ray replaces a loopback address by
    the routable one). The driver read ray_constants at import, so its copy is set as well.
    """
    from ray._private import ray_constants

    changes = {LOCAL_ONLY_ENV: "0", **({reaper.OWNER_ENV: owner} if owner else {})}
    saved_flag = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if saved_flag is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with _environ(changes):
            yield
    finally:
        if saved_flag is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag


def _init_ray(opts: SweepOptions, gpus: float, address: str | None, owner: str | None) -> None:
    """Join a cluster, or start an embedded Ray that listens on 127.0.0.1 only."""
    env = {NOSET_ENV: "1"} if 0 < gpus < 1 else {}  # see rpevit.sweep.gpus
    runtime_env = {"env_vars": env} if env else None
    if address:
        ctx = ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        with _local_environment(owner):
            ctx = ray.init(include_dashboard=opts.dashboard, dashboard_host="127.0.0.1",
                           runtime_env=runtime_env, log_to_driver=False)
        node_ip = ray.util.get_node_ip_address()
        if node_ip not in LOOPBACK:
            print(f"warning: the embedded Ray runs on {node_ip}, not 127.0.0.1: its ports may be reachable "
                  f"from the network", file=sys.stderr, flush=True)
    url = getattr(ctx, "dashboard_url", None)
    resources = ray.cluster_resources()
    token_file = private_token_file()
    auth = ("" if not url or os.environ.get("RAY_AUTH_MODE", "token") == "disabled" else
            f"  (Ray token auth: open the URL and paste the token from $RAY_AUTH_TOKEN or {token_file} when asked)")
    where = f"joined {address}" if address else "started locally on 127.0.0.1"
    print(f"ray {where}: {resources.get('CPU', 0):g} CPU, {resources.get('GPU', 0):g} GPU, "
          f"{len(ray.nodes())} node(s); dashboard: {'http://' + url if url else 'off'}{auth}", flush=True)


RAY_TOKEN_FILE = Path("~/.ray/auth_token")  # where Ray >= 2.5x writes its dashboard token


def private_token_file(path: Path = RAY_TOKEN_FILE) -> Path:
    """Ray writes its auth token readable by every user (0644): anyone on the machine could then use
    the dashboard and submit jobs. Make it the owner's alone (0600); returns the path."""
    path = path.expanduser()
    try:
        if path.is_file() and not path.is_symlink() and path.stat().st_uid == os.getuid():
            path.chmod(0o600)
    except OSError as err:
        print(f"warning: could not make {path} private ({err.strerror or err}); chmod 600 it by hand",
              file=sys.stderr, flush=True)
    return path


class Progress(Callback):
    """Prints running/pending/done/failed and the best judged test accuracy of the finished trials (every_s, and per trial end)."""

    def __init__(self, total: int, every_s: float) -> None:
        self.total, self.every_s = total, every_s
        self.best: tuple[float, str] = (-math.inf, "")
        self.last = 0.0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        """Best = the highest judged test accuracy of the finished trials (summary rows): the mean over
        fresh draws for random-feature models, whose one-draw val_acc ranks a lottery (issue 31)."""
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
        if not force and time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        trials = [t for t in trials if members_of(t)]  # not the warm-up trials
        count = lambda *s: sum(t.status in s for t in trials)  # noqa: E731
        best = f"{self.best[0]:.4f} ({self.best[1]})" if self.best[1] else "-"
        groups = [_group_label(members_of(t)) for t in trials
                  if t.status == "RUNNING" and len(members_of(t)) > 1 and TrialSpec.from_tune_config(t.config).fused]
        running = f" | running groups: {'; '.join(groups)}" if groups else ""
        print(f"[{time.strftime('%H:%M:%S')}] running {count('RUNNING')} | pending "
              f"{count('PENDING', 'PAUSED')} | done {count('TERMINATED')} | failed "
              f"{count('ERROR')} | of {self.total} | best judged test acc {best}{running}", flush=True)


def judged_value(row: dict, metric: str) -> Any:
    """The accuracy a row is ranked by: test_acc_draw_mean where the row has one (random-feature
    models, judged over fresh draws), else `metric` (rpevit.analysis.common.judged_accuracy's rule)."""
    draw_mean = row.get("test_acc_draw_mean")
    if metric == "test_acc" and isinstance(draw_mean, float) and math.isfinite(draw_mean):
        return draw_mean
    return row.get(metric, "")


def _group_label(members: tuple[Member, ...]) -> str:
    """'attention=favor pe=rope, seeds 0 1 2': a fused group's shared label and its seeds."""
    shared = " ".join(part for part in members[0].label.split() if not part.startswith("seed="))
    return f"{shared or members[0].trial_key}, seeds {' '.join(str(m.cfg['seed']) for m in members)}"


def summarize(out_dir: Path, space: Space, wall_s: float, slots: int = 0, started_after: float = 0.0,
              opts: SweepOptions | None = None, deadline: DeadlineReport | None = None) -> SweepOutcome:
    """Print the result table of this space's trials, the throughput of this run (its trials: those
    started after `started_after`, a Unix time), where the files are, and how to continue. With a
    deadline, trials it left are not a failure (exit code 0 if nothing failed)."""
    table, _ = select_keys(driver_trials(out_dir), space.keys)  # never rows of an older space
    opts = opts or SweepOptions()
    left = {space.keys[i] for i in deadline.left} if deadline is not None else set()
    if table.empty:
        missing = set(space.keys)
        print("no trial finished" + ("; " if deadline is None else ""), end="" if deadline is None else "\n")
        _print_continue(space, opts, deadline, missing)
        return SweepOutcome(0 if deadline is not None and missing <= left else 1, wall_s, slots=slots)
    labels = {k: space.label(i) for i, k in enumerate(space.keys)}
    metric = next((m for m in ("test_acc", "final_val_acc") if m in table.columns), None)
    judged = metric == "test_acc" and "test_acc_draw_mean" in table.columns
    print(f"\n{'trial':<48} {'status':<7} {'test acc (draw mean where random features: judged)' if judged else metric or ''}")
    for row in table.itertuples(index=False):
        value = judged_value(row._asdict(), metric) if metric else ""
        shown = f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else str(value)
        line = f"{labels.get(row.trial_key, row.trial_key)[:48]:<48} {row.status:<7} "
        print(line + (shown if row.status == OK else str(row.error)[:100]))
    not_run = set(space.keys) - set(table["trial_key"])
    missing = len(not_run)
    failed = table[table["status"] == FAILED]
    outcome = SweepOutcome(0 if (len(failed) == 0 and not_run <= left) else 1, wall_s, slots=slots)
    interleaved = space.exclusive and space.timing.interleave
    if wall_s > 0 and interleaved:  # members share one worker: their start-end spans overlap by design
        print(f"wall time {wall_s:.1f} s (interleaved timing: the variants ran in rounds in one worker, so there "
              f"is no per-trial overhead figure)")
    elif wall_s > 0 and "started_at" in table.columns:
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
        print(f"wall time {wall_s:.1f} s; sum of in-trial times {outcome.trial_s:.1f} s over {len(ran)} {unit}{note}; "
              f"{slots} at a time: {outcome.overhead_s_per_trial:.2f} s per {unit[:-1]} outside the {unit} "
              f"((wall x {slots} - in-trial) / {unit}; {outcome.startup_s:.1f} s of it before the first started)")
    files = [str(out_dir / name) for name in (TRIALS_FILE, EPOCHS_FILE) if (out_dir / name).exists()]
    print(f"\n{int((table['status'] == OK).sum())} ok, {len(failed)} failed, {missing} not run; "
          f"results: {', '.join(files)}")
    if missing or deadline is not None:
        _print_continue(space, opts, deadline, not_run)
    if len(failed):
        print("failures:", file=sys.stderr)
        for row in failed.itertuples(index=False):
            print(f"  {labels.get(row.trial_key, row.trial_key)}: {row.error}", file=sys.stderr)
    return outcome


def _print_continue(space: Space, opts: SweepOptions, deadline: DeadlineReport | None, not_run: set[str]) -> None:
    """The deadline's one-line account (what ran, what was left, the estimate) and the command that continues."""
    if deadline is not None:
        print(f"deadline {deadline.deadline.describe()}: ran {len(deadline.ran)} trial(s), left {len(deadline.left)} "
              f"that would not end before it; estimate: {deadline.estimate}")
    if not not_run:
        return
    command = deadlines.resume_command(space.source, space.name, opts.results_dir, opts.data_dir, opts.resume_flags,
                                       deadline=deadline is not None)
    print(f"continue with: {command}")
    if deadline is not None:
        print(f"  ({deadlines.NEW_DEADLINE}: the next deadline, e.g. 90m or 2026-11-23T18:00, local time; leave "
              f"--deadline out to run all {len(not_run)} left)")


