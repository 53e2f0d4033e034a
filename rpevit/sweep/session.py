"""The Ray session of one sweep: start an embedded Ray on loopback (or join a cluster), end it with
the driver, and answer what the cluster holds. The runner's other layers never start or stop Ray.

Loopback without private Ray API: Ray binds gcs_server, raylet, agents, workers and the driver to
127.0.0.1 when `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (its documented opt-out of cluster mode), which
Ray reads once, when it is first imported (`ray.init(_node_ip_address="127.0.0.1")` does not do it:
Ray replaces a loopback address by the routable one). So `prefer_loopback()` sets it before the
first `import ray` of a local sweep: sweep.py calls it before it imports the runner, and the runner
module calls it as it is imported (unless $RAY_ADDRESS names a cluster). The variable must not be
set for a driver that joins a cluster (it would then report 127.0.0.1 as its node), which is why it
is not set unconditionally. Where Ray was imported earlier in cluster mode, the embedded Ray would
listen on the machine's address: `ray_session` checks the node address after start-up and refuses
to run a sweep on it, naming the fix.

The reaper (reaper.py) ends the embedded Ray's processes when the driver dies; SIGTERM unwinds the
driver like Ctrl-C (`unwind_on_sigterm`), so `ray.shutdown()` runs and the sweep lock is released.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rpevit.sweep import reaper
from rpevit.sweep.gpus import NOSET_ENV
from rpevit.sweep.space import SpaceError

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node IP is 127.0.0.1 (read at `import ray`)
LOOPBACK = ("127.0.0.1", "::1", "localhost")
RAY_TOKEN_FILE = Path("~/.ray/auth_token")  # where Ray >= 2.5x keeps its dashboard token ($RAY_AUTH_TOKEN_PATH: there)
WORKER_NICENESS_ENV = "RAY_worker_niceness"  # Ray's nice increment for its workers (default 15); 0: the node's


def prefer_loopback(address: str | None) -> bool:
    """Ask Ray for loopback-only processes, if this process has not imported Ray yet and will not
    join a cluster (address None and no $RAY_ADDRESS); returns whether Ray will bind loopback."""
    if cluster_address(address):
        return False
    if "ray" not in sys.modules:
        os.environ.setdefault(LOCAL_ONLY_ENV, "0")
    return os.environ.get(LOCAL_ONLY_ENV) == "0"


def cluster_address(address: str | None) -> str | None:
    """The cluster to join: --address, else $RAY_ADDRESS, else None (an embedded local Ray)."""
    return address or os.environ.get("RAY_ADDRESS")


@contextmanager
def temporary_environ(changes: dict[str, str]) -> Iterator[None]:
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


@contextmanager
def unwind_on_sigterm() -> Iterator[None]:
    """`kill <driver>` unwinds like Ctrl-C (SystemExit through every `finally`: ray.shutdown(), the
    lock) for a block; the previous handler is restored after it. Main thread only (signals are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def ray_session(address: str | None, dashboard: bool, gpus_per_trial: float) -> Iterator[bool]:
    """Ray for one sweep: joined (address / $RAY_ADDRESS), or embedded on loopback and ours to shut
    down; yields whether this call started it (False if Ray was already up, e.g. in tests)."""
    import ray

    if ray.is_initialized():
        yield False
        return
    address = cluster_address(address)
    watchdog = None if address else _start_reaper()
    try:
        _init_ray(address, dashboard, gpus_per_trial, owner=watchdog[1] if watchdog else None)
        # Ray's core replaced the SIGTERM handler by one that aborts (no cleanup): put ours back
        with unwind_on_sigterm():
            yield True
    finally:
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


def _init_ray(address: str | None, dashboard: bool, gpus: float, owner: str | None) -> None:
    """Join a cluster, or start an embedded Ray that listens on 127.0.0.1 only (refused otherwise)."""
    import ray

    env = {NOSET_ENV: "1"} if 0 < gpus < 1 else {}  # see rpevit.sweep.gpus
    env[WORKER_NICENESS_ENV] = "0"  # trials at the niceness of their node's Ray (a local sweep: the driver's)
    runtime_env = {"env_vars": env}
    if address:
        ctx = ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        create_private_token()  # before Ray would write one readable by every user
        with temporary_environ({LOCAL_ONLY_ENV: "0", **({reaper.OWNER_ENV: owner} if owner else {})}):
            ctx = ray.init(include_dashboard=dashboard, dashboard_host="127.0.0.1", runtime_env=runtime_env,
                           log_to_driver=False)
        node_ip = ray.util.get_node_ip_address()
        if node_ip not in LOOPBACK:
            raise SpaceError(f"the embedded Ray listens on {node_ip}, not 127.0.0.1 (Ray was imported in this "
                             f"process before {LOCAL_ONLY_ENV}=0 was set); allowed: loopback only: set "
                             f"{LOCAL_ONLY_ENV}=0 before importing ray, or import rpevit.sweep.runner first, "
                             f"or join a cluster with --address")
    url = getattr(ctx, "dashboard_url", None)
    resources = ray.cluster_resources()
    private_token_file(token_path())
    where = f"joined {address}" if address else "started locally on 127.0.0.1"
    print(f"ray {where}: {resources.get('CPU', 0):g} CPU, {resources.get('GPU', 0):g} GPU, "
          f"{len(ray.nodes())} node(s); dashboard: {'http://' + url if url else 'off'}{dashboard_note(url)}",
          flush=True)


def dashboard_note(url: str | None) -> str:
    """How to open the dashboard: paste the token (where it is), and an SSH tunnel from another machine."""
    if not url or os.environ.get("RAY_AUTH_MODE", "token").lower() == "disabled":
        return ""
    where = ("$RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else
             f"{token_path()} (`ray get-auth-token` prints it)")
    port = url.rsplit(":", 1)[-1]
    return (f"  (token auth: paste the token from {where} when the page asks; from another machine: "
            f"ssh -L {port}:127.0.0.1:{port} <this host>, then open http://127.0.0.1:{port})")


def token_path() -> Path:
    """Where Ray reads its auth token: $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or RAY_TOKEN_FILE).expanduser()


def create_private_token(path: Path | None = None) -> None:
    """Write the token Ray will use (64 hex digits, as Ray's own) readable by the owner alone (0600),
    before an embedded Ray starts: Ray would create it readable by every user, and any user reading
    it could use the dashboard and submit jobs until rpevit narrowed it. Nothing when the token is in
    $RAY_AUTH_TOKEN, token auth is off, or the file exists (private_token_file narrows it); never
    through a symbolic link (O_NOFOLLOW | O_EXCL)."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_MODE", "token").lower() == "disabled":
        return
    path = path or token_path()
    if path.exists() or path.is_symlink():
        return
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
    except FileExistsError:  # another driver wrote it first: Ray reads that one
        return
    except OSError as err:
        print(f"warning: could not create {path} privately ({err.strerror or err}); Ray writes it instead: "
              f"chmod 600 it by hand", file=sys.stderr, flush=True)


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


def check_fits(cpus: float, gpus: float, fixed_cluster: bool) -> None:
    """On the embedded (non-autoscaling) Ray, a trial bigger than the machine would wait forever."""
    import ray

    have = ray.cluster_resources()
    for name, need in (("cpus_per_trial", cpus), ("gpus_per_trial", gpus)):
        avail = have.get(name.split("s_")[0].upper(), 0.0)
        if fixed_cluster and need > avail:
            raise SpaceError(f"{name} has value {need:g} but this machine has {avail:g}; allowed: <= {avail:g} "
                             f"(--{name.replace('_', '-')}, or join a bigger cluster with --address)")


def node_cpus(gpus: float) -> float:
    """CPUs of the largest live node that has the trial's GPUs: what a timing trial reserves, so no
    other trial of the sweep shares its node (on a mixed cluster timing trials run on the largest
    such nodes only, which keeps their rows comparable)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    fitting = [r for r in nodes if r.get("GPU", 0.0) >= gpus] or nodes
    return max(r.get("CPU", 0.0) for r in fitting)


def slots(bundle: dict[str, float], max_concurrent: int, n_trials: int) -> int:
    """How many Tune trials run at once: bundles that fit per live node, summed, capped."""
    import ray

    fit = 0
    for node in ray.nodes():
        if node.get("Alive"):
            have = node["Resources"]
            fit += min(int(have.get(r, 0.0) / need + 1e-9) for r, need in bundle.items() if need > 0)
    return max(1, min(fit, max_concurrent or fit, n_trials))
