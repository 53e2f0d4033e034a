"""Durable renames: what a node that crashes or loses power needs, beyond what a kill needs.

A SIGKILL keeps the page cache, so a write-then-rename survives it as it is; a kernel crash, a power
loss or a preempted VM does not: the new name can come back on an empty or torn file unless the data
are fsynced before the rename and the folder after it. Every file a sweep relies on is written that
way: the results files (rpevit.sweep.results.atomic_file) and the trial checkpoints
(rpevit.checkpoint.save). This module sits at the bottom of the layers so both can use it.
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


__all__ = ["fsync_fd"]
