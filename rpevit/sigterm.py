"""SIGTERM ends a sweep driver at any moment as Ctrl-C does: every `finally` runs (ray.shutdown(), the
sweep lock), one line goes to stderr, and the exit status is 143 (128 + SIGTERM, what a shell reports
for a process SIGTERM ended), whatever the driver was doing when the signal came.

What stands in the way, each handled here or where it happens:

- Python's default for SIGTERM kills the process without cleanup, and importing torch, pandas and
  Ray takes seconds: sweep.py calls `install()` before its own imports.
- A SystemExit raised inside an import is not always an exit: torch's C extension imports numpy as
  optional and clears whatever error that import raised, so a SIGTERM landing there left numpy half
  imported (numpy.exceptions in sys.modules, not on numpy) and the driver went on to a RecursionError
  in scipy's import, status 1 (seen in CI). While the driver imports nothing has started (no Ray, no
  lock, no rows), so until sweep.py calls `imports_done()` our handler writes its line and exits 143
  at once (os._exit) instead of raising. Ray is imported later, with the sweep lock held: the runner
  imports it inside `held()`, so a SIGTERM then ends the driver right after the import, not inside it.
- `ray.init()` must not be cut midway (a SystemExit raised inside it is swallowed in some of its
  callbacks, with a traceback on stderr, or leaves a half-started core worker that aborts), and it
  installs a handler of its own that exits with status 15; the native failure handler of Ray's core
  worker would dump stacks and abort (status 134). rpevit.sweep.session imports Ray with that native
  handler off for the driver and runs `ray.init()` inside `held()`: a SIGTERM then ends the driver
  right after ray.init() returns (a second one at once), and no other SIGTERM handler is installed.
- Ray turns a SystemExit raised inside one of its calls (ray.wait in Tune's loop) into SystemExit(1):
  `received()` tells sweep.py's exit path that the run ended because of SIGTERM.
- A Python handler runs only between bytecodes: a driver waiting inside Ray's C++ (a cluster that
  accepts the connection but never answers) would never run it. `install()` also starts a watcher
  thread on Python's wakeup fd, where the signal's number lands at once: GRACE_S after a SIGTERM the
  driver has not ended, it exits 143 from there (the reaper ends an embedded Ray's processes, the
  kernel releases the sweep lock, results files are only ever replaced whole).

This module imports nothing heavy, so that sweep.py can install it first.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

EXIT_CODE = 128 + signal.SIGTERM  # 143
LINE = ("sweep.py: SIGTERM received, stopping (Ray is shut down, the sweep lock released): finished trials keep "
        "their rows, the others continue from their last checkpoint with --resume (exit 143)\n")
GRACE_S = 30.0  # after a SIGTERM, the longest the driver may take to unwind before it exits without unwinding
_received = False
_handled = 0  # SIGTERMs our handler ran for
_holding = False  # inside held(): the first SIGTERM is noted, not raised
_watching = False
_importing = False  # from install() until imports_done(): nothing to unwind, exit at once (module docstring)


def received() -> bool:
    """Whether this process got SIGTERM (through any handler inside `noticed()`, or ours)."""
    return _received


def note() -> None:
    """Record SIGTERM; the first time, say so in one line (os.write: safe inside a signal handler)."""
    global _received
    if not _received:
        _received = True
        try:
            os.write(2, LINE.encode())
        except OSError:
            pass


def _on_sigterm(signum: int, _frame: object) -> None:
    global _handled
    _handled += 1
    note()
    if _importing:
        os._exit(EXIT_CODE)
    if not (_holding and _handled == 1):  # held: the block ends first, unless SIGTERM comes again
        raise SystemExit(EXIT_CODE)


def imports_done() -> None:
    """The driver has imported what it imports at start and begins its work: from now on a SIGTERM
    raises SystemExit(143), so that every `finally` runs (before this, our handler exits at once)."""
    global _importing
    _importing = False


def install() -> None:
    """Our handler for SIGTERM from now on, and the watcher that ends a driver stuck inside C code
    GRACE_S after a SIGTERM (main thread only, where Python runs signal handlers). Until
    `imports_done()` the handler exits 143 at once, as nothing has started that needs unwinding."""
    global _watching, _importing
    if threading.current_thread() is not threading.main_thread():
        return
    _importing = True
    signal.signal(signal.SIGTERM, _on_sigterm)
    if not _watching:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        threading.Thread(target=_watch, args=(read_end,), name="sigterm-watch", daemon=True).start()
        _watching = True


def _watch(read_end: int) -> None:
    """Wait for SIGTERM's number on the wakeup fd; GRACE_S later, exit 143 if the driver still runs."""
    while signal.SIGTERM not in os.read(read_end, 64):
        pass
    time.sleep(GRACE_S)
    note()
    os._exit(EXIT_CODE)


@contextmanager
def unwinding() -> Iterator[None]:
    """Our handler for a block, the previous one restored after it (main thread only). Work that
    needs unwinding begins here, so the imports are done whoever called install()."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    imports_done()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def held() -> Iterator[None]:
    """Our handler for a block that must not be cut midway (ray.init()): a SIGTERM during it is noted
    and ends the driver as soon as the block returns (SystemExit 143); a second one ends it at once.
    Handlers that code inside the block installs for SIGTERM (ray.init() installs one that exits with
    status 15) are not installed: `signal.signal` keeps ours for SIGTERM for the block (only the main
    thread can install handlers, and it is running the block). Main thread only."""
    global _holding
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    install_handler = signal.signal

    def keep_ours(signum: int, handler: object) -> object:
        if signum == signal.SIGTERM:
            return signal.getsignal(signum)
        return install_handler(signum, handler)

    with unwinding():
        _holding, signal.signal = True, keep_ours
        try:
            yield
        finally:
            _holding, signal.signal = False, install_handler
    if _received:
        raise SystemExit(EXIT_CODE)
