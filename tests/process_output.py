"""The output of a process a test starts, read line by line while it runs (tests/test_sweep_*.py)."""
from __future__ import annotations

import subprocess
import threading


class Output(list):
    """A process's output lines, appended by a reader thread until EOF. `whole()` waits for that EOF: a
    check made as soon as the process has exited can otherwise run before the thread appends its last line
    (seen in CI on a loaded machine: the driver printed its SIGTERM line, the check read no line)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__()
        self.reader = threading.Thread(target=lambda: self.extend(proc.stdout), daemon=True)
        self.reader.start()

    def whole(self, timeout: float = 30.0) -> str:
        self.reader.join(timeout)
        return "".join(self)
