"""Durable renames: what a node that crashes or loses power needs, beyond what a kill needs.

A SIGKILL keeps the page cache, so a write-then-rename survives it as it is; a kernel crash, a power
loss or a preempted VM does not: the new name can come back on an empty or torn file unless the data
are fsynced before the rename and the folder after it. Every file a sweep relies on is written that
way: the results files (rpevit.sweep.results.atomic_file) and the trial checkpoints
(rpevit.checkpoint.save). This module sits at the bottom of the layers so both can use it; so do the
words for a file lock the file system refuses (the sweep folder's lock and each checkpoint folder's claim).
"""
from __future__ import annotations

import errno
import os


def fsync_fd(fd: int) -> None:
    """fsync of an open folder; EINVAL / ENOTSUP (some network mounts cannot) is left as it is: the
    rename itself still happened. An I/O error is raised."""
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise


def held_elsewhere(err: OSError) -> bool:
    """Whether a non-blocking flock failed because another open file holds the lock (EWOULDBLOCK; EAGAIN,
    EACCES on some systems), rather than because the file system cannot lock at all."""
    return err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def flock_refused(path: os.PathLike | str, err: OSError) -> str:
    """The one-line message for a flock the file system refused (ENOLCK: an NFS mount without its lock
    service; EOPNOTSUPP / ENOSYS: Lustre mounted without `flock`, some FUSE file systems), which is not another
    process holding it: naming a holder there would send the user looking for a driver that does not exist."""
    code = errno.errorcode.get(err.errno or 0, str(err.errno))
    return (f"{path} cannot be locked ({code}: {err.strerror or err}): its file system does not support file locks "
            f"(flock); allowed: a results folder on storage with file locks (a local disk; NFS with its lock service; "
            f"Lustre mounted with -o flock): rpevit locks the sweep folder and each trial's checkpoint folder so that "
            f"no two processes run the same work")


__all__ = ["flock_refused", "fsync_fd", "held_elsewhere"]
