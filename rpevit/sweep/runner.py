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
"""
from __future__ import annotations

import json
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

import pandas as pd
import ray
from ray import tune
from ray.tune import Callback

from rpevit.data import FOLDERLESS_DATASETS, resolve_data_dir
from rpevit.sweep import reaper
from rpevit.sweep.gpus import NOSET_ENV
from rpevit.sweep.lock import sweep_dir, sweep_lock
from rpevit.sweep.results import (EPOCHS_FILE, FAILED, OK, SPACE_FILE, TRIALS_FILE, ParquetResults, load_trials,
                                  select_keys)
from rpevit.sweep.space import Resources, Space, SpaceError, check_name
from rpevit.sweep.trainable import run_trial

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node IP is 127.0.0.1 (ray_constants)
LOOPBACK = ("127.0.0.1", "::1", "localhost")


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


def run_sweep(space: Space, opts: SweepOptions) -> int:
    """Run every pending trial of the space; 0 if all succeeded, 1 if any failed."""
    check_name(space.name, "sweep name")  # also for callers that set space.name themselves
    out_dir = sweep_dir(opts.results_dir, space.name)
    with sweep_lock(out_dir):  # one driver per sweep (rpevit.sweep.lock)
        return _run_locked(space, opts, out_dir)


def _run_locked(space: Space, opts: SweepOptions, out_dir: Path) -> int:
    everything = load_trials(out_dir)
    started = not everything.empty or any((out_dir / "trials").glob("*/checkpoint.pt"))
    if started and not opts.resume:
        raise SpaceError(f"{out_dir} already holds results of sweep {space.name!r}; pass --resume to "
                         f"continue it, or choose another --name / --results-dir")
    if opts.resume and not started:
        print(f"nothing to resume, starting: {out_dir} holds no results of sweep {space.name!r} yet", flush=True)
    previous, set_aside = select_keys(everything, space.keys)
    if set_aside:
        print(f"set aside {set_aside} row(s) of trials that are not in the current space (its YAML changed "
              f"since they ran): kept in {TRIALS_FILE}, not counted as done, not in the summary", flush=True)
    finished = set()
    if not previous.empty:
        keep = [OK] if opts.retry_failed else [OK, FAILED]
        finished = set(previous.loc[previous["status"].isin(keep), "trial_key"])
    configs = prepare_trials(space, opts)
    pending = [i for i, key in enumerate(space.keys) if key not in finished]
    given = {"cpus_per_trial": opts.cpus_per_trial, "gpus_per_trial": opts.gpus_per_trial,
             "max_concurrent": opts.max_concurrent}
    res = Resources.from_dict({**vars(space.resources), **{k: v for k, v in given.items() if v is not None}},
                              source=f"{space.source} + command line")
    cpus, gpus, max_concurrent = res.cpus_per_trial, res.gpus_per_trial, res.max_concurrent
    tmp = out_dir / f".{SPACE_FILE}.{os.getpid()}.tmp"  # atomic: analysis reads it to filter rows
    tmp.write_text(json.dumps({"name": space.name, "source": space.source, "trial_keys": space.keys}, indent=1))
    os.replace(tmp, out_dir / SPACE_FILE)
    print(f"sweep {space.name!r}: {len(space.trials)} trials, {len(space.trials) - len(pending)} already "
          f"done, {len(pending)} to run; {cpus:g} CPU + {gpus:g} GPU per trial; results in {out_dir}")
    if not pending:
        return summarize(out_dir, space, wall_s=0.0)

    with _ray(opts, gpus) as started_ray:
        _check_fits(cpus, gpus, fixed_cluster=started_ray and not _address(opts))
        items = [{"trial_key": space.keys[i], "label": space.label(i), "cfg": configs[i],
                  "checkpoint_root": str(out_dir / "trials"), "cpus_per_trial": cpus,
                  "gpus_per_trial": gpus} for i in pending]
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})}
        trainable = tune.with_resources(run_trial, tune.PlacementGroupFactory([bundle], strategy="SPREAD"))
        writer = ParquetResults(out_dir, space.name, {space.keys[i]: configs[i] for i in pending},
                                {k: i for i, k in enumerate(space.keys)}, task=space.task)
        progress = Progress(len(pending), opts.progress_every_s)
        tuner = tune.Tuner(
            trainable,
            param_space={"t": tune.grid_search(items)},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=max_concurrent or None, reuse_actors=False,
                trial_name_creator=lambda t: t.config["t"]["trial_key"],
                trial_dirname_creator=lambda t: t.config["t"]["trial_key"]),
            run_config=tune.RunConfig(
                name=time.strftime("run-%Y%m%d-%H%M%S"), storage_path=str(out_dir / "ray"),
                failure_config=tune.FailureConfig(max_failures=opts.max_failures),
                callbacks=[writer, progress], log_to_file=True, verbose=0),
        )
        t0 = time.time()
        tuner.fit()
        wall = time.time() - t0
        writer.flush()
    return summarize(out_dir, space, wall_s=wall)


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
    saved_env = {k: os.environ.get(k) for k in changes}
    saved_flag = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ.update(changes)
    if saved_flag is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
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
    auth = ("" if not url or os.environ.get("RAY_AUTH_MODE", "token") == "disabled" else
            "  (Ray token auth: paste the token of $RAY_AUTH_TOKEN or ~/.ray/auth_token when asked)")
    where = f"joined {address}" if address else "started locally on 127.0.0.1"
    print(f"ray {where}: {resources.get('CPU', 0):g} CPU, {resources.get('GPU', 0):g} GPU, "
          f"{len(ray.nodes())} node(s); dashboard: {'http://' + url if url else 'off'}{auth}", flush=True)


class Progress(Callback):
    """Prints running/pending/done/failed and the best val_acc so far (every_s, and per trial end)."""

    def __init__(self, total: int, every_s: float) -> None:
        self.total, self.every_s = total, every_s
        self.best: tuple[float, str] = (-math.inf, "")
        self.last = 0.0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        acc = result.get("val_acc")
        if isinstance(acc, float) and math.isfinite(acc) and acc > self.best[0]:
            self.best = (acc, trial.config["t"]["label"])

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
        count = lambda *s: sum(t.status in s for t in trials)  # noqa: E731
        best = f"{self.best[0]:.4f} ({self.best[1]})" if self.best[1] else "-"
        print(f"[{time.strftime('%H:%M:%S')}] running {count('RUNNING')} | pending "
              f"{count('PENDING', 'PAUSED')} | done {count('TERMINATED')} | failed "
              f"{count('ERROR')} | of {self.total} | best val_acc {best}", flush=True)


def summarize(out_dir: Path, space: Space, wall_s: float) -> int:
    """Print the result table of this space's trials and where the files are; the exit code."""
    table, _ = select_keys(load_trials(out_dir), space.keys)  # never rows of an older space
    if table.empty:
        print(f"no trial finished; continue with: python sweep.py --space {space.source} --name {space.name} "
              f"--resume")
        return 1
    labels = {k: space.label(i) for i, k in enumerate(space.keys)}
    metric = next((m for m in ("test_acc", "final_val_acc") if m in table.columns), None)
    print(f"\n{'trial':<48} {'status':<7} {metric or ''}")
    for row in table.itertuples(index=False):
        value = getattr(row, metric) if metric else ""
        shown = f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else str(value)
        line = f"{labels.get(row.trial_key, row.trial_key)[:48]:<48} {row.status:<7} "
        print(line + (shown if row.status == OK else str(row.error)[:100]))
    missing = len(set(space.keys) - set(table["trial_key"]))
    failed = table[table["status"] == FAILED]
    if wall_s > 0 and "started_at" in table.columns:
        ran = table[(table["status"] == OK) & (table["started_at"].notna())]
        trial_s = float(_seconds(ran["finished_at"] - ran["started_at"]).sum())
        print(f"wall time {wall_s:.1f} s; sum of in-trial times {trial_s:.1f} s over {len(ran)} trials")
    print(f"\n{int((table['status'] == OK).sum())} ok, {len(failed)} failed, {missing} not run; "
          f"results: {out_dir / TRIALS_FILE}, {out_dir / EPOCHS_FILE}")
    if missing:
        print(f"continue with: python sweep.py --space {space.source} --name {space.name} --resume")
    if len(failed):
        print("failures:", file=sys.stderr)
        for row in failed.itertuples(index=False):
            print(f"  {labels.get(row.trial_key, row.trial_key)}: {row.error}", file=sys.stderr)
    return 0 if (len(failed) == 0 and missing == 0) else 1


def _seconds(delta: pd.Series) -> pd.Series:
    """Durations in seconds, whether the columns were timestamps (now) or float seconds (older files)."""
    return delta.dt.total_seconds() if hasattr(delta, "dt") else delta
