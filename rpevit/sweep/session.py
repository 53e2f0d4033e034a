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

The embedded Ray keeps its sessions (logs, sockets) in a folder only this user can enter
(`private_temp_dir`: Ray's own /tmp/ray/session_* are 0777). The reaper (reaper.py) ends the
embedded Ray's processes when the driver dies; SIGTERM unwinds the
driver like Ctrl-C at any moment (rpevit.sigterm), so `ray.shutdown()` runs and the sweep lock is
released: Ray is imported with its native failure-signal handler off for the driver (`import_ray`:
it would dump stacks and abort on SIGTERM), and `ray.init()` runs inside `sigterm.held()` (a SIGTERM
then ends the driver right after it, and the handler ray.init() installs, which exits with status 15,
is kept out).
"""
from __future__ import annotations

import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rpevit import sigterm
from rpevit.sweep import reaper
from rpevit.sweep.space import SpaceError

FAILURE_HANDLER_ENV = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"  # "1": no native crash handler (read at `import ray`)
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node IP is 127.0.0.1 (read at `import ray`)
LOOPBACK = ("127.0.0.1", "::1", "localhost")
RAY_TOKEN_FILE = Path("~/.ray/auth_token")  # where Ray >= 2.5x keeps its dashboard token ($RAY_AUTH_TOKEN_PATH: there)
NOSET_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # Ray's switch, read by its workers (rpevit.sweep.gpus)
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


ADDRESS_ALLOWED = ("auto (the Ray cluster `ray start --head` started on this machine), or host:port of a running "
                   "Ray head (the address `ray start --head` prints; ray://host:port for Ray Client)")
_ADDRESS = re.compile(r"(?:ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(\d{1,5})")
PROBE_TIMEOUT_S = 5.0  # a Ray head answers a TCP connect at once; Ray itself retries a dead address for minutes
PROBE_RETRY_TIMEOUT_S = 20.0  # the auth probe once more after no answer in PROBE_TIMEOUT_S: a head or driver on
# loaded cores can answer late (CI beside two training trials, 2026-12-02), and a late answer read as none
# left a token-auth head to a join that fails after ~20 s of InvalidAuthToken lines


def address_source(address: str | None) -> str:
    """How the cluster address was given: '--address' or '$RAY_ADDRESS' (for messages)."""
    return "--address" if address else "$RAY_ADDRESS"


def check_address(address: str | None) -> tuple[str, int] | None:
    """The (host, port) of the cluster to join (None for auto or an embedded Ray); SpaceError, one line,
    for anything else (`RAY_ADDRESS=bogus`, a port out of range). Checked before Ray is imported."""
    chosen = cluster_address(address)
    if chosen is None or chosen == "auto":
        return None
    found = _ADDRESS.fullmatch(chosen)
    if not found or not 0 < int(found.group(2)) < 65536:
        raise SpaceError(f"{address_source(address)} has value {chosen!r}; allowed: {ADDRESS_ALLOWED}")
    return found.group(1).strip("[]"), int(found.group(2))


def probe_address(address: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """SpaceError (one line) unless something accepts a TCP connection at the cluster address within
    timeout_s, name lookup included: Ray would retry a dead address for minutes (`127.0.0.1:1`). The
    connection is closed at once; it only asks whether anything listens there."""
    target = check_address(address)
    if target is None:
        return
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            socket.create_connection(target, timeout=timeout_s).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err)

    worker = threading.Thread(target=connect, daemon=True)  # getaddrinfo has no timeout of its own
    worker.start()
    worker.join(timeout_s + 0.5)
    if outcome and outcome[0] is None:
        return
    why = (f"nothing answered within {timeout_s:g} s" if not outcome else
           " ".join(f"{type(outcome[0]).__name__}: {outcome[0].strerror or outcome[0]}".split()))
    raise SpaceError(f"{address_source(address)} has value {cluster_address(address)!r}, but no Ray head answers "
                     f"there ({why}); allowed: {ADDRESS_ALLOWED}: start it first, or leave --address and "
                     f"$RAY_ADDRESS unset for a Ray of this sweep's own")


AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's switch: "token" turns token auth on (read when Ray is imported)
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"  # where Ray reads the token, in this order
AUTH_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # read-only; every Ray head's GCS answers it
TOKEN_ALLOWED = ("the head's token on this machine: `ray get-auth-token` on the head prints it; save it as "
                 "~/.ray/auth_token (chmod 600) or put it in $RAY_AUTH_TOKEN (docs/cluster.md, \"Token auth\")")


def local_token() -> tuple[str | None, str]:
    """(the token a Ray driver on this machine sends, where it comes from), in Ray's own order:
    $RAY_AUTH_TOKEN, else the file $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token; (None, the places
    looked at) when there is none. A file that cannot be read counts as none."""
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip(), "$RAY_AUTH_TOKEN"
    path = token_path()
    where = f"$RAY_AUTH_TOKEN_PATH ({path})" if os.environ.get(TOKEN_PATH_ENV) else str(path)
    try:
        if path.is_file():
            text = path.read_text(errors="replace").strip()
            if text:
                return text, where
    except OSError:
        pass
    return None, f"neither $RAY_AUTH_TOKEN nor {where}"


def head_answers(target: tuple[str, int], token: str | None) -> str:
    """How the Ray head's GCS at target answers one read-only gRPC call, sent with `token` (or
    none): "ok", "unauthenticated" (it runs with token auth and the token is missing or not its
    own), or "unknown" (no answer in PROBE_TIMEOUT_S and then, asked once more, in
    PROBE_RETRY_TIMEOUT_S; not a Ray head; or another Ray version's API: Ray's own join then
    decides). The call is what a Ray driver's first call is (the cluster id) on gRPC's wire format
    alone: no Ray import, so RAY_AUTH_MODE can still be set for the join after it."""
    try:
        import grpc
    except ImportError:
        return "unknown"
    host, port = target
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    metadata = [("authorization", f"Bearer {token}")] if token else None
    for timeout_s in (PROBE_TIMEOUT_S, PROBE_RETRY_TIMEOUT_S):
        try:
            with grpc.insecure_channel(where) as channel:
                channel.unary_unary(AUTH_PROBE_METHOD)(b"", timeout=timeout_s, metadata=metadata)
            return "ok"
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                continue  # late, not refused: once more, longer
            return "unauthenticated" if code == grpc.StatusCode.UNAUTHENTICATED else "unknown"
        except Exception:  # noqa: BLE001 - a probe only: anything odd leaves the decision to Ray's own join
            return "unknown"
    return "unknown"


def prepare_join(address: str | None) -> str | None:
    """Before Ray is imported for a join of host:port (not `auto`, not ray://): find out whether the
    head runs with Ray's token auth and make this driver send the token when it does. Ray turns token
    auth on for `ray start --head` whenever a token exists there (~/.ray/auth_token: every local sweep
    writes one), but a driver given an explicit address never turns it on by itself (Ray 2.60,
    ray/_private/worker.py: only `auto` does), so the join failed after ~20 s of InvalidAuthToken lines.
    Sets RAY_AUTH_MODE=token (read when Ray is imported) when the head asks for a token and the local
    one opens it, and returns the line that says so; SpaceError, one line, when the head asks for a
    token this machine does not have (or RAY_AUTH_MODE=disabled is set here); None otherwise."""
    chosen = cluster_address(address)
    target = check_address(address)
    if target is None or chosen.startswith("ray://"):
        return None
    if head_answers(target, None) != "unauthenticated":
        return None  # open, or not known: Ray's own rules
    where_given = address_source(address)
    mode = os.environ.get(AUTH_MODE_ENV)
    token, where = local_token()
    head = f"{where_given} has value {chosen!r}, a Ray head that runs with token auth (RAY_AUTH_MODE=token)"
    if mode is not None and mode.strip().lower() == "disabled":
        raise SpaceError(f"{head}, but RAY_AUTH_MODE=disabled is set here; allowed: unset RAY_AUTH_MODE (or set "
                         f"it to token) with {TOKEN_ALLOWED}")
    if token is None:
        raise SpaceError(f"{head}, but this machine has no token ({where}); allowed: {TOKEN_ALLOWED}")
    if head_answers(target, token) == "unauthenticated":
        raise SpaceError(f"{head}, but the token in {where} is not the head's (it refused it); allowed: "
                         f"{TOKEN_ALLOWED}")
    if mode is not None and mode.strip().lower() == "token":
        return None  # the user turned it on: Ray sends the token already
    if "ray" in sys.modules:  # too late for Ray to read it (tests that imported Ray): say what to do
        raise SpaceError(f"{head}; allowed: set RAY_AUTH_MODE=token before Ray is imported in this process")
    os.environ[AUTH_MODE_ENV] = "token"
    return f"ray head at {chosen} runs with token auth: joining with the token in {where} (RAY_AUTH_MODE=token)"


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


def import_ray() -> None:
    """Ray's first import in this driver process, with Ray's native failure-signal handler off for the
    driver: it would take SIGTERM from Python once the core worker starts, dump stacks and abort (exit
    134). `RAY_DISABLE_FAILURE_SIGNAL_HANDLER` (Ray's documented switch) is read when Ray is imported,
    so it is set for the import only: the Ray processes this driver starts keep their crash reports.
    A value the user set stands; an earlier import (tests) is left as it is."""
    if "ray" in sys.modules or FAILURE_HANDLER_ENV in os.environ:
        import ray  # noqa: F401
        return
    with temporary_environ({FAILURE_HANDLER_ENV: "1"}):
        import ray  # noqa: F401


@contextmanager
def ray_session(address: str | None, dashboard: bool, gpus_per_trial: float) -> Iterator[bool]:
    """Ray for one sweep: joined (address / $RAY_ADDRESS), or embedded on loopback and ours to shut
    down; yields whether this call started it (False if Ray was already up, e.g. in tests)."""
    import ray

    if ray.is_initialized():
        yield False
        return
    probe_address(address)  # bounded: a dead address is one line now, not minutes of Ray's retries
    where, address = address_source(address), cluster_address(address)
    watchdog = None if address else _start_reaper()
    with sigterm.unwinding():  # ours throughout (restored as it was after the session)
        try:
            with sigterm.held():  # SIGTERM during ray.init(): it ends right after, never midway
                _init_ray(address, dashboard, gpus_per_trial, owner=watchdog[1] if watchdog else None, where=where)
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


JOIN_TIMEOUT_S = 120.0  # joining a live cluster takes seconds; Ray waits on one that does not answer for good


@contextmanager
def bounded(seconds: float, message: str) -> Iterator[None]:
    """A block that waits inside Ray's C++ (which no signal handler interrupts, and which retries a
    head that never answers for good) may take `seconds`: then `error: message` on stderr and exit 2
    from a watcher thread. Only for joining a cluster: this driver has no Ray processes of its own to
    leave behind then, and the kernel releases the sweep lock."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            os.write(2, f"error: {message}\n".encode())
            os._exit(2)

    threading.Thread(target=watch, name="ray-join-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _init_ray(address: str | None, dashboard: bool, gpus: float, owner: str | None, where: str = "--address") -> None:
    """Join a cluster, or start an embedded Ray that listens on 127.0.0.1 only (refused otherwise)."""
    import ray

    env = {NOSET_ENV: "1"} if 0 < gpus < 1 else {}  # see rpevit.sweep.gpus
    env[WORKER_NICENESS_ENV] = "0"  # trials at the niceness of their node's Ray (a local sweep: the driver's)
    runtime_env = {"env_vars": env}
    if address:
        try:
            with bounded(JOIN_TIMEOUT_S, f"{where} has value {address!r}, but no Ray cluster answered there within "
                                         f"{JOIN_TIMEOUT_S:g} s (something listens, but not a Ray head, or `auto` "
                                         f"found a cluster that is gone); allowed: {ADDRESS_ALLOWED}"):
                ctx = ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        except ray.exceptions.AuthenticationError as err:  # token auth: a missing or foreign token (auto)
            token, source = local_token()
            raise SpaceError(f"{where} has value {address!r}, a Ray cluster that runs with token auth, and it refused "
                             f"this driver's token ({'from ' + source if token else source}: "
                             f"{' '.join(str(err).split())[:200]}); allowed: {TOKEN_ALLOWED}") from err
        except (ConnectionError, RuntimeError, ValueError) as err:  # auto without a cluster, not a Ray head, ...
            raise SpaceError(f"{where} has value {address!r}, but Ray could not join a cluster there "
                             f"({' '.join(str(err).split())[:300]}){auth_hint(address)}; allowed: "
                             f"{ADDRESS_ALLOWED}") from err
    else:
        create_private_token()  # before Ray would write one readable by every user
        temp = private_temp_dir()
        with temporary_environ({LOCAL_ONLY_ENV: "0", **({reaper.OWNER_ENV: owner} if owner else {})}):
            try:
                ctx = ray.init(include_dashboard=dashboard, dashboard_host="127.0.0.1", runtime_env=runtime_env,
                               log_to_driver=False, _temp_dir=str(temp))
            except (OSError, RuntimeError, ConnectionError, TimeoutError, ray.exceptions.RayError) as err:
                # a start that fails (its GCS never answered, a socket path too long, ...) was a raw traceback
                # of Ray's internals (issue 59): one line with what Ray said and what to do
                ray.shutdown()
                raise SpaceError(f"the embedded Ray did not start in {temp} ({' '.join(str(err).split())[:300]}); "
                                 f"allowed: a start that works: a short temp path (RAY_TMPDIR; Ray's socket paths "
                                 f"must fit 107 bytes), no RAY_AUTH_MODE / RAY_AUTH_TOKEN left over from another "
                                 f"cluster, enough free memory and disk there; or join a running cluster with "
                                 f"--address") from err
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


def auth_hint(address: str | None) -> str:
    """Where a join failed and the head may want a token this driver does not send: the words that say
    so (a head Ray's auth refused reads as "Failed to connect" in Ray's own error)."""
    target = None if address is None or address == "auto" else check_address(address)
    if target is not None and not address.startswith("ray://") and head_answers(target, None) == "unauthenticated":
        return ("; the head runs with token auth (RAY_AUTH_MODE=token) and refused this driver: run with "
                "RAY_AUTH_MODE=token and the head's token")
    return ""


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


def private_temp_dir() -> Path:
    """The embedded Ray's temp dir (its sessions: logs, sockets, spilled objects, runtime envs):
    `ray` inside `<$RAY_TMPDIR, else $TMPDIR, else /tmp>/rpevit-<uid>`, a folder of this user's with
    mode 0700. Ray makes its temp dirs world-readable and -writable (0777: `/tmp/ray/session_*`, trial
    logs included); inside a 0700 folder nobody else reaches them. Passed as ray.init(_temp_dir=...),
    the root temp directory ray.init documents; Ray chooses the same base itself. SpaceError (one line)
    for a base that is not a folder this user can write, or a `rpevit-<uid>` there that is a link or
    another user's."""
    base = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp")
    folder = base / f"rpevit-{os.getuid()}"
    allowed = (f"a folder of this user's, mode 0700 (made if missing): remove {folder} or set RAY_TMPDIR to a "
               f"folder of your own")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(folder)
    except OSError as err:
        raise SpaceError(f"the embedded Ray's temp folder {folder} cannot be made ({err.strerror or err}); "
                         f"allowed: {allowed}") from err
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise SpaceError(f"the embedded Ray's temp folder {folder} is {'a symbolic link' if stat.S_ISLNK(found.st_mode) else 'not a folder'}; "
                         f"allowed: {allowed}")
    if found.st_uid != os.getuid():
        raise SpaceError(f"the embedded Ray's temp folder {folder} belongs to user id {found.st_uid}, not this user "
                         f"({os.getuid()}); allowed: {allowed}")
    if found.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder / "ray"


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


def check_fits(cpus: float, gpus: float, fixed_cluster: bool) -> str | None:
    """On the embedded (non-autoscaling) Ray, a trial bigger than the machine would wait forever: refused. On a
    joined cluster nodes may still come (an autoscaler, a worker starting late), so a trial no live node can hold
    is not refused, but said at once (the returned warning line), rather than left to wait in silence until the
    job's time ends (a SLURM allocation whose GPUs Ray was not told of). None: it fits, or nothing to say."""
    if not fixed_cluster:
        nodes = live_nodes()
        if not nodes or any(n.get("CPU", 0.0) >= cpus and n.get("GPU", 0.0) >= gpus for n in nodes):
            return None
        largest = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)))
        return (f"warning: no node of the cluster can hold one trial now (cpus_per_trial {cpus:g}, gpus_per_trial "
                f"{gpus:g}; its {len(nodes)} live node(s), the largest {largest.get('CPU', 0.0):g} CPUs and "
                f"{largest.get('GPU', 0.0):g} GPUs): its trials wait until such a node joins. If none will (no "
                f"autoscaler), stop with Ctrl-C (rows kept) and give Ray the nodes' GPUs (ray start --num-gpus) or "
                f"lower --gpus-per-trial / --cpus-per-trial")
    import ray

    have = ray.cluster_resources()
    for name, need in (("cpus_per_trial", cpus), ("gpus_per_trial", gpus)):
        avail = have.get(name.split("s_")[0].upper(), 0.0)
        if need > avail:
            raise SpaceError(f"{name} has value {need:g} but this machine has {avail:g}; allowed: <= {avail:g} "
                             f"(--{name.replace('_', '-')}, or join a bigger cluster with --address)")
    return None


def live_nodes() -> list[dict[str, float]]:
    """The resources of every live node of the started Ray ({"CPU": 16.0, "GPU": 2.0, ...}): what the
    planner (rpevit.sweep.launch_plan) places Tune trials on."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
