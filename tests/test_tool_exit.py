"""rpevit.tool_exit: a tool ends with sys.exit's code and its flushed output, and without the interpreter's
teardown (where pyarrow's and torch's thread pools sometimes abort after the tool's last line)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TOOL = """
import atexit, sys
from rpevit.tool_exit import run_tool
atexit.register(lambda: print("teardown ran", file=sys.stderr))  # the teardown: skipped
def main():
    print("last line", end="")  # unflushed, as a pipe buffers it
    {body}
run_tool(main)
"""


def run_body(body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(TOOL).format(body=body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize("body, code, stderr", [
    ("return None", 0, ""),
    ("return 2", 2, ""),
    ("raise SystemExit(3)", 3, ""),
    ("raise SystemExit(None)", 0, ""),
    ("raise SystemExit('error: x is 5; allowed: 1 to 4')", 1, "error: x is 5; allowed: 1 to 4\n"),
])
def test_a_tool_exits_as_sys_exit_would_with_its_output_flushed_and_no_teardown(body, code, stderr):
    done = run_body(body)
    assert (done.returncode, done.stdout, done.stderr) == (code, "last line", stderr)


def test_a_reader_of_stdout_that_has_gone_ends_it_with_120_as_the_interpreter_does_not_a_traceback():
    """Its last line is still in the buffer (stdout to a pipe, PYTHONUNBUFFERED unset) when exit_now flushes it."""
    code = textwrap.dedent(TOOL).format(body="import time; time.sleep(1.0)")  # `true` has exited by then
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "TOOL": code}
    done = subprocess.run(["bash", "-c", f"{sys.executable} -c \"$TOOL\" | true; echo ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert done.stdout.strip() == "120" and done.stderr == "", (done.stdout, done.stderr)


def test_an_error_in_argparse_is_its_usage_and_exit_2():
    done = run_body("import argparse; argparse.ArgumentParser(prog='t').parse_args(['--bad'])")
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == "t: error: unrecognized arguments: --bad"
    assert "teardown ran" not in done.stderr


def test_a_bug_keeps_its_traceback():
    done = run_body("raise KeyError('k')")
    assert done.returncode == 1 and "Traceback" in done.stderr and "KeyError: 'k'" in done.stderr


TOOLS = sorted(f"analysis/{p.name}" for p in (REPO / "analysis").glob("*.py")) + [
    "rpevit/sweep/compact.py", "rpevit/sweep/snapshot.py", "rpevit/sweep/migrate.py", "sweep.py",
    *(f"benchmarks/lease/{name}.py" for name in ("curves", "merge_rungs", "plan", "summary"))]


@pytest.mark.parametrize("script", TOOLS)
def test_every_tool_that_reads_parquet_ends_through_run_tool(script):
    """Its `__main__` block ends in run_tool, so none of them ends in the teardown that can abort."""
    last = (REPO / script).read_text(encoding="utf-8").rstrip().splitlines()[-1]
    assert last.strip().startswith("run_tool(") and "main" in last, (script, last)
