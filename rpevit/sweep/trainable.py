"""The Tune function trainable: one Tune trial = one registered task run on its share of the node
(or, for a timing space with `timing.interleave`, every pending variant in rounds, see run_timed).

Workers are reused: the runner sets Tune's `reuse_actors=True`, and Tune restarts this function
in the same warm process for the next trial with the same resources (FunctionTrainable.reset_config)
instead of starting a process that imports torch, Ray Tune and rpevit again (seconds per trial on
a small machine). What a trial could leave behind for the next one is reset around every run
(`trial_scope`): the torch thread count (= the trial's CPU share), the python / numpy / torch /
CUDA RNGs (seeded from the trial's seed), the peak-memory counters (CPU max RSS through
/proc/self/clear_refs, CUDA peak statistics), the CUDA caching allocator (emptied) and memory
fraction; the trial's log file is opened for it and closed. Registries are filled at import and
never change; datasets are cached per worker as read-only arrays (`rpevit.data.cache_arrays`) and
each trial gets its own tensors. tests/test_sweep_reuse.py runs two different trials in one
reused worker and checks that each equals its fresh-process result exactly. A sweep starts with
one warm-up trial per slot (wait_for_workers), so that every slot has a worker before trials are
handed out.

Checkpoints (and a log.txt) live in a directory keyed by the trial's `trial_key` (results/<sweep>/
trials/<key>/), not in Tune's per-run trial folders, so a Tune retry (FailureConfig) and a `--resume`
after the driver was killed both continue from the last epoch of the same trial. The task writes
its checkpoint atomically after every epoch; its history holds every epoch row, which this
trainable re-reports on a resume so the driver's Parquet never misses an epoch (it dedupes).
Checkpoints are read with weights_only=True and only by the config that wrote them
(rpevit.checkpoint), so a planted or foreign checkpoint fails the trial with a message instead of
running code or being continued under another config.

Beside the trial body: each epoch row also goes to the trial's TensorBoard event file
(rpevit.sweep.tensorboard_events), and a trial is placed on its CPUs and GPU by
rpevit.sweep.gpus.place_on_devices.
"""
from __future__ import annotations

import errno
import gc
import os
import random
import time
import traceback
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import ray
import torch
from ray import tune

from rpevit import checkpoint, data, metrics, registry
from rpevit.checkpoint import CHECKPOINT_NAME  # the name every task writes in its checkpoint_dir
from rpevit.config import ConfigError, TrialConfig
from rpevit.sweep.gpus import place_on_devices
from rpevit.sweep.protocol import EPOCH, NOTE, PAUSED, SUMMARY, VARIANT_FAILED, Member, Report, TrialSpec
from rpevit.sweep.results import trial_folder
from rpevit.sweep.tensorboard_events import EpochBoard, tensorboard_dir
from rpevit.tasks.bench import combine_repeats
from rpevit.tasks.budget_ladder import Branch, TrunkPaused
from rpevit.tasks.train import DivergedError

UNTIMED = -1  # the repeat index of the untimed warm-up run in a timing schedule
WARMUP_TIMEOUT_S = 60.0  # how long warm-up trials wait for the other slots' workers
_process: dict[str, Any] = {"timed_runs": 0}  # what this worker process already did


def run_trial(config: dict[str, Any]) -> None:
    """Tune entry point: the config holds one protocol.TrialSpec (built by launch_plan.tune_trials)."""
    spec = TrialSpec.from_tune_config(config)
    if spec.barrier:
        wait_for_workers(spec.barrier)
        return
    registry.load_all()
    data.cache_arrays()
    if spec.timing is not None:
        run_timed(spec)
    elif spec.fused:
        run_fused(spec)
    else:
        run_single(spec, spec.members[0])


@ray.remote(num_cpus=0)
class StartBarrier:
    """Counts the sweep's warm-up trials that have a worker; opens when all of them have one."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived = parties, 0

    def arrive(self) -> None:
        self.arrived += 1

    def is_open(self) -> bool:
        return self.arrived >= self.parties


def wait_for_workers(name: str, timeout_s: float = WARMUP_TIMEOUT_S) -> None:
    """A warm-up trial: hold this worker until every slot's worker has started (or timeout_s).

    Why: Tune hands a finished trial's worker to the next trial and cancels the worker it was
    starting for that trial. When trials are shorter than a worker's start-up, the first worker
    therefore ran every trial while the others were started and killed over and over (each import
    of torch costing CPU). Held here, all slot workers come up; once all are cached for reuse
    they hold every slot's resources, so no worker is started in vain again.
    """
    try:
        barrier = ray.get_actor(name)
        ray.get(barrier.arrive.remote())
        deadline = time.monotonic() + timeout_s
        while not ray.get(barrier.is_open.remote()) and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - a warm-up is an optimisation: never fail the sweep for it
        pass


def run_single(spec: TrialSpec, member: Member) -> None:
    """One trial: re-report checkpointed epochs, run the task, report its summary row. The trial holds its
    checkpoint folder (checkpoint.claimed) from before it reads the checkpoint to its end, so a budget
    ladder's trunk never writes the branch of a rung that is running (rpevit/tasks/budget_ladder.py)."""
    key = member.trial_key
    cfg = TrialConfig.from_dict(member.cfg, source=f"trial {key}")
    ckpt_dir = trial_folder(Path(spec.checkpoint_root), key)
    with checkpoint.claimed(ckpt_dir):
        try:
            history = checkpointed_history(ckpt_dir, cfg)
        except checkpoint.CheckpointError as err:  # every try reads the same file: a Tune retry would fail again
            with trial_log(ckpt_dir) as log:
                fail_once(member, err, log)
            return
        with epoch_reporter(spec, member) as report:
            for row in history:  # epochs finished before a kill / retry
                report(row)
            with trial_scope(cfg, spec) as placement, trial_log(ckpt_dir) as log:
                started_at = time.time()
                log(describe(key, placement))
                ladder = {"branches": branches_of(spec), "pause_at_branch": spec.pause_at_branch} if spec.branches else {}
                try:
                    summary = registry.TASKS[cfg.task](cfg, checkpoint_dir=ckpt_dir, log=log,
                                                       on_epoch=lambda row, _dir=None: report(row), **ladder)
                except (DivergedError, checkpoint.CheckpointError) as err:
                    fail_once(member, err, log)
                    return
                except TrunkPaused as paused:  # --rungs-first: no row yet; the driver's next round continues it
                    report_paused(member, paused)
                    return
    report_summary(member, {**summary, **placement, "resumed_from_epoch": len(history),
                            "started_at": started_at, "finished_at": time.time()})


def fail_once(member: Member, err: Exception, log: Callable[[str], None]) -> None:
    """A failure that every try would repeat, reported as the trial's row (a VARIANT_FAILED report, which Tune
    does not retry) and logged with why: a diverged run resumed from its checkpoint replays the same steps and
    diverges again (resume is exact); a refused checkpoint (CheckpointError) is the same file at every try."""
    why = ("a resumed run replays the same steps" if isinstance(err, DivergedError)
           else "a retry reads the same checkpoint")
    log(f"failed: {err} (not retried: {why})")
    report_failure(member, err)


def branches_of(spec: TrialSpec) -> list[Branch]:
    """The shorter trials of a budget ladder whose checkpoints this trunk writes (space `branch: epochs`)."""
    return [Branch(TrialConfig.from_dict(m.cfg, source=f"trial {m.trial_key}"), Path(spec.checkpoint_root) / m.trial_key)
            for m in spec.branches]


def run_fused(spec: TrialSpec) -> None:
    """A fused seed group (space `fuse: seeds`): the members train as one stacked model in this
    worker (registry.GROUP_TASKS); each reports its own epochs, summary row or failure, under its own
    trial_key, and keeps its own checkpoint folder and log.txt (the group's lines go to every log).

    The worker is seeded from the first member's seed; each member's own randomness comes from
    generators seeded by its own seed inside the group runner, so this does not matter."""
    with ExitStack() as boards:  # each member's TensorBoard folder and checkpoint folder, held to the group's end
        _run_fused(spec, boards)


def _run_fused(spec: TrialSpec, boards: ExitStack) -> None:
    members, configs, resumed, reports = [], [], {}, {}
    for member in spec.members:
        cfg = TrialConfig.from_dict(member.cfg, source=f"trial {member.trial_key}")
        try:  # a foreign or broken checkpoint, or a folder another process runs in, fails its member only
            folder = trial_folder(Path(spec.checkpoint_root), member.trial_key)
            boards.enter_context(checkpoint.claimed(folder))
            history = checkpointed_history(folder, cfg)
        except ConfigError as err:
            report_failure(member, err)
            continue
        members.append(member)
        configs.append(cfg)
        resumed[member.trial_key] = len(history)
        reports[member.trial_key] = boards.enter_context(epoch_reporter(spec, member))
        for row in history:
            reports[member.trial_key](row)
    if not members:
        return
    folders = [trial_folder(Path(spec.checkpoint_root), m.trial_key) for m in members]
    run_group = registry.GROUP_TASKS[configs[0].task]
    with trial_scope(configs[0], spec) as placement, ExitStack() as logs:
        writers = [logs.enter_context(trial_log(folder, echo=i == 0)) for i, folder in enumerate(folders)]

        def log(message: str) -> None:
            for write in writers:
                write(message)

        started_at = time.time()
        log(f"fused group of {len(members)}: " + ", ".join(m.trial_key for m in members) + " - "
            + describe(members[0].trial_key, placement))
        outcomes = run_group(configs, checkpoint_dirs=folders, log=log,
                             on_epoch=lambda i, row, _dir=None: reports[members[i].trial_key](row))
    finished_at = time.time()
    for member, outcome in zip(members, outcomes):
        if isinstance(outcome, BaseException):
            report_failure(member, outcome)
        else:
            report_summary(member, {**outcome, **placement, "resumed_from_epoch": resumed[member.trial_key],
                                    "started_at": started_at, "finished_at": finished_at})


def run_timed(spec: TrialSpec) -> None:
    """Timing trials: an untimed warm-up run first in a fresh worker, then `repeats` timed runs per
    variant (in rounds over the variants when interleaved); each row is the median of its runs.

    In an interleaved group a variant that raises is recorded failed (no retry) and left out of
    later rounds, so one out-of-memory N does not cost the other variants their rows; a single
    timing trial raises as any trial does (Tune records it, and retries it per FailureConfig).
    """
    timing, members = spec.timing, {m.trial_key: m for m in spec.members}
    configs = {key: TrialConfig.from_dict(m.cfg, source=f"trial {key}") for key, m in members.items()}
    schedule = timing_schedule(list(configs), timing.repeats, timing.interleave,
                               warmup=timing.warmup and _process["timed_runs"] == 0)
    last_run = {key: i for i, (key, _) in enumerate(schedule)}
    runs: dict[str, list[dict]] = {key: [] for key in configs}
    started: dict[str, float] = {}
    warm: dict[str, bool] = {}
    failed: set[str] = set()
    for i, (key, repeat) in enumerate(schedule):
        if key in failed:
            continue
        cfg, member = configs[key], members[key]
        started.setdefault(key, time.time())
        warm.setdefault(key, _process["timed_runs"] > 0 or repeat == UNTIMED)
        try:
            with trial_scope(cfg, spec) as placement, trial_log(trial_folder(Path(spec.checkpoint_root), key)) as log:
                what = "untimed warm-up run" if repeat == UNTIMED else f"timed run {repeat + 1}/{timing.repeats}"
                log(f"{describe(key, placement)}: {what}")
                row = registry.TASKS[cfg.task](cfg, log=log if repeat != UNTIMED else None)
        except Exception as err:  # noqa: BLE001 - recorded per variant, the group goes on
            if len(members) == 1:
                raise
            failed.add(key)
            report_failure(member, err)
            continue
        _process["timed_runs"] += 1
        if repeat == UNTIMED:
            continue
        runs[key].append(row)
        if i == last_run[key]:
            report_summary(member, {**combine_repeats(runs[key]), **placement, "process_warm": warm[key],
                                    "timing_interleaved": timing.interleave, "started_at": started[key],
                                    "finished_at": time.time()})


def timing_schedule(keys: list[str], repeats: int, interleave: bool, warmup: bool) -> list[tuple[str, int]]:
    """(trial_key, repeat) in run order; repeat UNTIMED marks the untimed warm-up run of the first
    variant. Interleaved: round r times every variant once (A B C, A B C, ...); else each variant's
    repeats run back to back (A A, B B, ...)."""
    if interleave:
        timed = [(key, r) for r in range(repeats) for key in keys]
    else:
        timed = [(key, r) for key in keys for r in range(repeats)]
    return ([(keys[0], UNTIMED)] if warmup and keys else []) + timed


# ---------------------------------------------------------------- reporting to the driver
def report_epoch(key: str, row: dict) -> None:
    tune.report(Report(EPOCH, key, dict(row)).to_tune())


@contextmanager
def epoch_reporter(spec: TrialSpec, member: Member) -> Iterator[Callable[[dict], None]]:
    """report(row): one epoch row to the driver (epochs.parquet) and to the member's TensorBoard folder."""
    board = EpochBoard(tensorboard_dir(spec.checkpoint_root, member.trial_key, member.cfg), member.trial_key,
                       member.label,
                       say=lambda line: say_note(member, trial_folder(Path(spec.checkpoint_root), member.trial_key),
                                                 line))
    try:
        def report(row: dict) -> None:
            board.add(row)
            report_epoch(member.trial_key, row)

        yield report
    finally:
        board.close()


def say_note(member: Member, log_dir: Path, line: str) -> None:
    """A line about something the trial does without (no TensorBoard events, ...): the worker's output,
    the trial's log.txt, and the sweep's output (a NOTE report; the driver prints each distinct line once)."""
    print(line, flush=True)
    try:
        with trial_log(log_dir, echo=False) as log:
            log(line)
    except (ConfigError, OSError):  # the trial's own log refuses it too: the trial says so when it runs
        pass
    tune.report(Report(NOTE, member.trial_key, label=member.label, error=line).to_tune())


def report_summary(member: Member, row: dict) -> None:
    tune.report(Report(SUMMARY, member.trial_key, {**row, "trial_key": member.trial_key}, member.label).to_tune())


def report_paused(member: Member, paused: TrunkPaused) -> None:
    """A trunk that paused at its last branch (--rungs-first): the driver counts it as ended for this round, with
    no row; its epoch rows are already reported and its checkpoint is where the next round continues."""
    tune.report(Report(PAUSED, member.trial_key, {"epoch": paused.epoch}, member.label, error=str(paused)).to_tune())


def report_failure(member: Member, err: BaseException) -> None:
    """A failed member of a multi-variant trial; the driver records it like a failed Tune trial."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    tune.report(Report(VARIANT_FAILED, member.trial_key, label=member.label, error=f"{type(err).__name__}: {err}",
                       traceback=text).to_tune())


def describe(key: str, placement: dict[str, Any]) -> str:
    return (f"trial {key} on {placement['hostname']} (node {placement['node_id'][:8]}, pid {placement['pid']}, "
            f"GPU ids {placement['ray_gpu_ids'] or '-'}, {placement['torch_threads']} threads)")


@contextmanager
def trial_log(ckpt_dir: Path, echo: bool = True) -> Iterator[Callable[[str], None]]:
    """log(message): printed (unless not `echo`) and appended to <ckpt_dir>/log.txt, which is closed
    after the run.
    Never through a symbolic link (the folder or log.txt): it would append to where it points."""
    if ckpt_dir.is_symlink():
        raise ConfigError(f"trial folder {ckpt_dir} is a symbolic link (to {os.readlink(ckpt_dir)!r}); allowed: a "
                          f"real folder (the trial writes log.txt and checkpoints there): remove the link")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(ckpt_dir / "log.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        what = "is a symbolic link" if err.errno == errno.ELOOP else f"cannot be opened ({err.strerror or err})"
        raise ConfigError(f"trial log {ckpt_dir / 'log.txt'} {what}; allowed: a regular file or nothing (remove "
                          f"what is there)") from err
    with os.fdopen(fd, "a") as log_file:

        def log(message: str) -> None:
            if echo:
                print(message, flush=True)
            log_file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
            log_file.flush()

        yield log


# ---------------------------------------------------------------- process state between trials
@contextmanager
def trial_scope(cfg: TrialConfig, spec: TrialSpec) -> Iterator[dict[str, Any]]:
    """The process state one run starts from, whatever ran before it in this worker; yields the
    placement row (where it ran). Afterwards the run's garbage and cached GPU memory are freed."""
    placement = place_on_devices(spec.cpus_per_trial, spec.gpus_per_trial)
    placement["reserved_cpus"] = float(spec.reserved_cpus or spec.cpus_per_trial)
    seed_everything(cfg.seed)
    reset_peak_memory()
    try:
        yield placement
    finally:
        release_memory()


def seed_everything(seed: int) -> None:
    """python, numpy and torch (CPU and every CUDA device) RNGs from the trial's seed: a task that
    draws from a global RNG without seeding it draws the same in a fresh and in a reused worker."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def reset_peak_memory() -> None:
    """Peak memory is per run, not per process: the CPU max RSS (what `peak_mem_mb` reports on CPU)
    is reset through /proc/self/clear_refs (Linux >= 4.0; elsewhere it stays the process's peak),
    the CUDA peak statistics of every initialised device likewise."""
    metrics.reset_resident_peak()
    if torch.cuda.is_initialized():
        for device in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(device)


def release_memory() -> None:
    """The run's tensors are unreachable once the task returned: collect reference cycles and hand
    cached CUDA blocks back, so the next trial in this worker starts with the GPU memory it would
    have in a fresh process (its memory fraction is set again by place_on_devices)."""
    if torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def checkpointed_history(ckpt_dir: Path, cfg: TrialConfig) -> list[dict]:
    """Epoch rows stored in the trial's last checkpoint (empty for a fresh trial).

    Loaded safely and matched to cfg first: epochs of a foreign checkpoint must not reach the
    sweep's epochs.parquet before the task refuses that checkpoint.
    """
    path = ckpt_dir / CHECKPOINT_NAME
    if not path.exists():
        return []
    state = checkpoint.load(path)
    checkpoint.check_matches(state, cfg, path)
    return [dict(row) for row in state["history"]]
