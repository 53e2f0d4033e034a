"""One driver per sweep folder: an exclusive flock on `<results-dir>/<name>/.sweep.lock`.

Two drivers on one sweep would each start their own Ray and run every pending trial twice,
against the same checkpoint files. The lock is taken before anything heavy (Ray is not even
imported here), so a second driver stops at once with the holder's pid in the message.

flock belongs to the open file: the kernel drops it when the driver exits or is killed (the fd
is close-on-exec, so Ray's processes never inherit it). A stale lock therefore cannot exist,
and the file is never removed (removing it would race a driver that is just opening it).
Takers: the runner (`execute_sweep`) before Ray starts, and the folder tools `python -m rpevit.sweep.compact` /
`migrate` (compact.run_on_folders), so they never run beside a driver; a second take, even in the same process, is
refused like a second driver.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rpevit.durable import flock_refused, held_elsewhere
from rpevit.sweep.space import SpaceError
from rpevit.sweep.store import PARTS_DIR

LOCK_FILE = ".sweep.lock"


class SweepBusy(SpaceError):
    """Another driver holds the sweep folder's lock."""


def sweep_dir(results_dir: str | os.PathLike, name: str) -> Path:
    """The folder of a sweep's results (absolute: trials run with their own working directory)."""
    return Path(results_dir).expanduser().resolve() / name


@contextmanager
def sweep_lock(out_dir: Path) -> Iterator[None]:
    """Exclusive use of out_dir for this process, or SweepBusy at once; SpaceError when the folder
    cannot be made, or holds symbolic links (see refuse_links)."""
    if Path(out_dir).is_symlink():
        raise SpaceError(f"sweep folder {out_dir} is a symbolic link (to {os.readlink(out_dir)!r}); allowed: a real "
                         f"folder (rpevit writes its results there): remove the link, or point --results-dir at the "
                         f"folder you meant")
    out_dir = Path(out_dir).resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpaceError(f"sweep folder {out_dir} cannot be created ({err.strerror or err}); allowed: a folder this "
                         f"user can write (--results-dir must be a writable folder, not a file)") from err
    try:  # O_NOFOLLOW: a planted `.sweep.lock` link would have its target truncated and overwritten
        fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        what = "is a symbolic link" if err.errno == errno.ELOOP else f"cannot be opened ({err.strerror or err})"
        raise SpaceError(f"sweep folder {out_dir}: {LOCK_FILE} {what}; allowed: a regular file this user can write, "
                         f"or nothing (remove what is there, or choose another --results-dir)") from err
    handle = os.fdopen(fd, "r+")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpaceError(f"sweep folder {out_dir}: {LOCK_FILE} is not a regular file; allowed: a regular file "
                             f"or nothing (remove it)")
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except SpaceError:
        handle.close()
        raise
    except OSError as err:
        if not held_elsewhere(err):  # the file system refused the lock: no other driver to name
            handle.close()
            raise SpaceError(flock_refused(out_dir / LOCK_FILE, err)) from err
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise SweepBusy(f"sweep folder {out_dir} is in use by another driver ({holder}); allowed: one driver "
                        f"per sweep: wait for it to end or stop it, then --resume; or choose another --name")
    try:
        refuse_links(out_dir)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock; the file stays


def refuse_links(out_dir: Path, shown: int = 3) -> None:
    """SpaceError if the sweep folder holds symbolic links where rpevit writes: its own entries,
    `trials/` and each `trials/<key>/` (log.txt, checkpoints), `parts/` (the results store). Writing through a planted link would
    truncate or append to whatever it points at. One lstat per entry; Tune's `ray/` tree is not
    entered (a link at `ray` itself is refused)."""
    links = [e for e in _entries(out_dir) if e.is_symlink()]
    trials = out_dir / "trials"
    if not trials.is_symlink():
        for entry in _entries(trials):
            if entry.is_symlink():
                links.append(entry)
            elif entry.is_dir(follow_symlinks=False):
                links.extend(e for e in _entries(Path(entry.path)) if e.is_symlink())
    parts = out_dir / PARTS_DIR
    if not parts.is_symlink():
        links.extend(e for e in _entries(parts) if e.is_symlink())
    if links:
        listed = ", ".join(f"{Path(e.path).relative_to(out_dir)} -> {os.readlink(e.path)}" for e in links[:shown])
        more = f" and {len(links) - shown} more" if len(links) > shown else ""
        raise SpaceError(f"sweep folder {out_dir} holds symbolic links ({listed}{more}); allowed: no links inside a "
                         f"sweep folder (rpevit writes log.txt, checkpoints and Parquet there, and would write "
                         f"through them): remove them")


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as found:
            return list(found)
    except (FileNotFoundError, NotADirectoryError):
        return []
