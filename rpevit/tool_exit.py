"""How a command-line tool that reads Parquet ends: its own last line, then its exit code, and nothing after.

With torch and pyarrow both loaded, a native thread pool's destructor sometimes aborts the interpreter's
teardown (SIGABRT, "terminate called without an active exception" printed after the tool's own last line;
apache/arrow#34314). It was seen about one run in twelve with the snapshot tool, and with report.py in CI on
2026-11-29: the tool had already printed its one `error:` line, and the abort added a second line and turned
exit 1 into 134. `sweep.py --dry-run` did the same 2 runs in 20 (exit 134 after its trial table). Every file
these tools write is complete (atomic renames) before they return, and sweep.py has shut Ray down and released its
lock by then (rpevit.sweep.session), so ending without the teardown loses nothing; only atexit handlers are
skipped (Ray's own shutdown among them, already done), and none of these tools relies on one.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, NoReturn


BROKEN_STDOUT = 120  # the interpreter's exit code when flushing stdout fails at exit (`python ... | head`)


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once stdout and stderr are flushed, without the interpreter's teardown.
    A reader of stdout that has gone (`| head -1`) ends it with 120 where it would have been 0, as the
    interpreter's own exit does, not with a traceback."""
    try:
        sys.stdout.flush()
    except OSError:  # BrokenPipeError: nobody reads what is left
        code = code or BROKEN_STDOUT
    try:
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(code)


def exit_code(err: SystemExit) -> int:
    """The code the interpreter would exit with for `err`, printing its message as the interpreter would:
    None is 0, an int is itself, anything else (`SystemExit("error: ...")`) is printed to stderr and is 1."""
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def run_tool(main: Callable[[], int | None]) -> NoReturn:
    """Run a tool's `main()` and end the process as `sys.exit(main())` would, without the teardown.

    An exception other than SystemExit (a bug) is left to the interpreter, so its traceback is printed as usual.
    """
    try:
        code = main()
    except SystemExit as err:
        exit_now(exit_code(err))
    exit_now(0 if code is None else code)
