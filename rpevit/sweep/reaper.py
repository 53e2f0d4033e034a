"""Ends an embedded Ray's processes as soon as the sweep driver that started them dies.

Why: Ray ties gcs_server and raylet to the driver (PR_SET_PDEATHSIG) and its workers follow their
raylet, but after a SIGKILL of the driver the DashboardAgent and RuntimeEnvAgent first try to
report the raylet's death to the (dead) GCS, with a fixed 60 s timeout; for that minute they hold
ports, memory and the session folder. Ray has no setting for this, so the Ray session (session.py) starts this
watchdog, as a child of the driver, before `ray.init()`:

    python rpevit/sweep/reaper.py TOKEN      (stdin: a pipe from the driver)

While the driver lives, the watchdog records the driver's descendants started after itself,
every POLL_S (pid and start time, from /proc): the processes of the embedded Ray. When the
driver's end of the pipe closes without the driver having written CLEAN first (it died: SIGKILL,
OOM, a crash), it sends SIGTERM to the recorded processes that still run (same pid *and* start
time: never a recycled pid) and to any process started with `RPEVIT_RAY_OWNER=TOKEN` in its
environment (session.py sets it for Ray; it catches workers started after the last poll), waits
GRACE_S and SIGKILLs what is left. After a clean `ray.shutdown()` the driver writes CLEAN, and
only token processes that are somehow left are ended. Processes older than the watchdog, and
those neither descended from the driver nor carrying the token (other Ray sessions, the user's
processes), are never touched. Linux only (/proc); elsewhere the runner does not start it.

Standard library only: it must start fast and must not import Ray or torch.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time

OWNER_ENV = "RPEVIT_RAY_OWNER"
POLL_S = 0.25
GRACE_S = 1.0
CLEAN = b"clean\n"  # written by the driver after ray.shutdown() returned


def process_table() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, start time in clock ticks) of every process visible in /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                after_name = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry.name)] = (int(after_name[1]), after_name[19])  # fields 4 (ppid), 22 (starttime)
    return table


def descendants(root: int, table: dict[int, tuple[int, bytes]]) -> dict[int, bytes]:
    """pid -> start time of every descendant of root in a process table."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _start) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return found


def with_token(token: str, table: dict[int, tuple[int, bytes]]) -> dict[int, bytes]:
    """pid -> start time of this user's processes whose initial environment has OWNER_ENV=token.

    (Processes that retitle themselves with setproctitle may have overwritten that memory; the
    descendant records cover those.)"""
    needle = f"{OWNER_ENV}={token}".encode()
    uid, found = os.getuid(), {}
    for pid, (_ppid, start) in table.items():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found[pid] = start
        except OSError:  # gone meanwhile, or not readable: not ours to end
            continue
    return found


def still_running(targets: dict[int, bytes]) -> dict[int, bytes]:
    """The targets that run now as the same process (same start time), zombies excluded."""
    alive = {}
    for pid, start in targets.items():
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                after_name = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if after_name[19] == start and after_name[0] != b"Z":
            alive[pid] = start
    return alive


def reap(targets: dict[int, bytes], grace_s: float = GRACE_S) -> int:
    """SIGTERM the targets, SIGKILL those still running after grace_s; how many needed SIGKILL."""
    targets = {p: s for p, s in targets.items() if p != os.getpid()}
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        targets = still_running(targets)
        if not targets:
            return 0
        for pid in targets:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while wait_s and time.monotonic() < deadline and still_running(targets):
            time.sleep(0.05)
    return len(targets)


def watch(token: str, driver: int, stdin_fd: int, poll_s: float = POLL_S) -> dict[int, bytes]:
    """Record the driver's new descendants until stdin reaches EOF; then everything to end."""
    table = process_table()
    born = int(table[os.getpid()][1]) if os.getpid() in table else 0
    known: dict[int, bytes] = {}
    received = b""
    while True:
        ready, _, _ = select.select([stdin_fd], [], [], poll_s)
        if ready:
            data = os.read(stdin_fd, 65536)
            if not data:
                break
            received += data
            continue
        table = process_table()
        known = {p: s for p, s in known.items() if table.get(p, (0, b""))[1] == s}  # forget ended ones
        known.update({p: s for p, s in descendants(driver, table).items() if int(s) >= born})
    tokened = with_token(token, process_table())
    return tokened if CLEAN in received else {**known, **tokened}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0]:
        print("usage: reaper.py TOKEN  (stdin: a pipe that closes when the driver ends)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle, not ours
    reap(watch(argv[0], os.getppid(), sys.stdin.fileno()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
