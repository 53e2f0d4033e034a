"""One driver per sweep folder: an exclusive flock on `<results-dir>/<name>/.sweep.lock`.

Two drivers on one sweep would each start their own Ray and run every pending trial twice,
against the same checkpoint files. The lock is taken before anything heavy (Ray is not even
imported here), so a second driver stops at once with the holder's pid in the message.

flock belongs to the open file: the kernel drops it when the driver exits or is killed (the fd
is close-on-exec, so Ray's processes never inherit it). A stale lock therefore cannot exist,
and the file is never removed (removing it would race a driver that is just opening it).
Re-entrant within one process, so sweep.py and run_sweep() can both hold it.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from rpevit.sweep.space import SpaceError

LOCK_FILE = ".sweep.lock"
_HELD: dict[Path, IO[str]] = {}  # folder -> its open, locked lock file (this process)


class SweepBusy(SpaceError):
    """Another driver holds the sweep folder's lock."""


def sweep_dir(results_dir: str | os.PathLike, name: str) -> Path:
    """The folder of a sweep's results (absolute: trials run with their own working directory)."""
    return Path(results_dir).expanduser().resolve() / name


@contextmanager
def sweep_lock(out_dir: Path) -> Iterator[None]:
    """Exclusive use of out_dir for this process, or SweepBusy at once."""
    out_dir = Path(out_dir).resolve()
    if out_dir in _HELD:  # already ours (sweep.py took it before calling run_sweep)
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    handle = open(out_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise SweepBusy(f"sweep folder {out_dir} is in use by another driver ({holder}); allowed: one driver "
                        f"per sweep: wait for it to end or stop it, then --resume; or choose another --name")
    _HELD[out_dir] = handle
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        yield
    finally:
        del _HELD[out_dir]
        handle.close()  # releases the lock; the file stays
