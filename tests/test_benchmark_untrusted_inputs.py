"""What the benchmark tools read from a file is untrusted, and where they work is theirs alone.

- throughput.py --table: a `members` that is not a whole number is refused naming the file, the field, the
  value and what is allowed (it went raw into a Markdown header line), a file's name is escaped, and the JSON
  is read as a regular file only (a link is not read through, a FIFO not waited on);
- lease/merge_rungs.py: a lease's space.json (it came back from another machine) is read by
  results.read_space_file: a link or a FIFO is refused in one line, and its trial keys must be text;
- lease/summary.py: a FIFO among the returned files is refused at once (it passed the old link-and-size
  check, and reading it blocked forever);
- gpu_lease.sh: its fixed LEASE_DIR (shared by the calls of one lease) is refused where it is a link or a
  folder others can write, and is made with mode 700;
- tests/all12_cells.py --json: never written through a link.

A FIFO that a pre-fix reader would block on is read in a thread: the test fails after FIFO_WAIT_S seconds and
releases the reader (a writer opened and closed: it reads end of file), so no test hangs.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.test_compile_cpu_choice import throughput_module
from tests.test_lease_merge_rungs import H100, NAME, lease, merge_rungs, space  # noqa: F401 - space: a fixture

ROOT = Path(__file__).resolve().parent.parent
FIFO_WAIT_S = 30


def summary_module():
    sys.path.insert(0, str(ROOT / "benchmarks" / "lease"))
    try:
        import summary
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "lease"))
    return summary


def promptly(call: Callable[[], Any], fifo: Path) -> dict[str, Any]:
    """{'value': ...} or {'error': ...} of call() run in a thread; the test fails where it is still running after
    FIFO_WAIT_S (blocked opening `fifo`), and the blocked reader is released first."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - SystemExit too: what the call said is the result
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(FIFO_WAIT_S)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader's open returns, then reads EOF
        thread.join(10)
        pytest.fail(f"still blocked reading the FIFO {fifo} after {FIFO_WAIT_S} s")
    return box


def one_line(err: BaseException) -> str:
    message = str(err.code if isinstance(err, SystemExit) else err)
    assert "\n" not in message.strip(), message
    return message


# ------------------------------------------------------------------ benchmarks/throughput.py --table
def variants_file(path: Path, members: Any = 1) -> Path:
    rows = [{"variant": "softmax+ape", "solo_images_per_s": 100.0, "fused_images_per_s": 150.0, "members": members,
             "speedup": 1.5}, {"variant": "favor+ape", "error": "RuntimeError: x | y"}]
    path.write_text(json.dumps({"models": {"cpu": {"variants": rows}}}))
    return path


@pytest.mark.parametrize("members", ["3 <img src=x onerror=alert(1)>\n# H", 2.5, True, None, 0, [3]])
def test_a_members_that_is_not_a_whole_number_is_refused_naming_the_file_field_and_value(tmp_path, members):
    path = variants_file(tmp_path / "run.json", members)
    with pytest.raises(SystemExit) as stopped:
        throughput_module().variants_table([str(path)])
    message = one_line(stopped.value)
    assert str(path) in message and "members" in message and repr(members)[:20] in message, message
    assert "allowed: a whole number" in message


def test_the_file_name_and_the_error_text_are_escaped_in_the_table(tmp_path):
    path = variants_file(tmp_path / "run|x <img src=x onerror=alert(1)>\n# H.json", members=3)
    table = throughput_module().variants_table([str(path)])
    head = table.splitlines()[0]
    assert "<img" not in table and "\n# H" not in table
    assert head.count("|") - head.count("\\|") == 5, head  # 4 cells (variant, and the file's 3): 5 bars, no more
    assert "fused k=3 + compiled img/s" in head and "x \\| y" in table
    assert len(table.splitlines()) == 2 + 12  # the header, its rule, one row per all12 variant


def test_a_linked_json_is_not_read_through(tmp_path):
    target = variants_file(tmp_path / "elsewhere.json")
    link = tmp_path / "run.json"
    link.symlink_to(target)
    with pytest.raises(SystemExit) as stopped:
        throughput_module().variants_table([str(link)])
    message = one_line(stopped.value)
    assert str(link) in message and "symbolic link" in message, message


def test_a_fifo_json_is_refused_at_once(tmp_path):
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    throughput = throughput_module()
    box = promptly(lambda: throughput.variants_table([str(fifo)]), fifo)
    assert isinstance(box.get("error"), SystemExit), box
    message = one_line(box["error"])
    assert str(fifo) in message and "named pipe" in message, message


# ------------------------------------------------------------------ benchmarks/lease/merge_rungs.py
def test_a_linked_space_json_of_a_lease_is_refused_and_nothing_written(tmp_path, space, capsys):
    a = lease(tmp_path / "gpu_h100", "lease_2026-12-01", space, H100, 3)
    elsewhere = tmp_path / "elsewhere.json"
    os.replace(a / "space.json", elsewhere)  # the very space.json, read through a link: still refused
    (a / "space.json").symlink_to(elsewhere)
    into = tmp_path / "merged" / NAME
    assert merge_rungs.main([str(a), "--into", str(into)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(a / "space.json") in err and "symbolic link" in err, err
    assert not into.exists()


def test_a_fifo_space_json_of_a_lease_is_refused_at_once(tmp_path, space, capsys):
    a = lease(tmp_path / "gpu_h100", "lease_2026-12-01", space, H100, 3)
    (a / "space.json").unlink()
    os.mkfifo(a / "space.json")
    into = tmp_path / "merged" / NAME
    box = promptly(lambda: merge_rungs.main([str(a), "--into", str(into)]), a / "space.json")
    assert box.get("value") == 2, box
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "named pipe" in err, err
    assert not into.exists()


def test_trial_keys_that_are_not_text_are_refused_naming_the_field(tmp_path, space, capsys):
    a = lease(tmp_path / "gpu_h100", "lease_2026-12-01", space, H100, 3)
    held = json.loads((a / "space.json").read_text())
    (a / "space.json").write_text(json.dumps({**held, "trial_keys": [1, 2]}))
    into = tmp_path / "merged" / NAME
    assert merge_rungs.main([str(a), "--into", str(into)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "field 'trial_keys'" in err and "allowed: " in err, err
    assert not into.exists()


# ------------------------------------------------------------------ benchmarks/lease/summary.py
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="1" time="1">
<testcase classname="tests.test_gpu" name="test_a" time="1"/></testsuite></testsuites>"""


@pytest.mark.parametrize("fifo_name", ["1_pytest_gpu.xml", "1_pytest_gpu.collected", "2_throughput.json"])
def test_a_fifo_among_the_returned_files_is_refused_at_once(tmp_path, fifo_name):
    (tmp_path / "1_pytest_gpu.xml").write_text(JUNIT)
    fifo = tmp_path / fifo_name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    summary = summary_module()
    box = promptly(lambda: summary.summary(tmp_path), fifo)
    assert isinstance(box.get("error"), SystemExit), box
    message = one_line(box["error"])
    assert str(fifo) in message and "named pipe" in message and "allowed: " in message, message


# ------------------------------------------------------------------ benchmarks/gpu_lease.sh's LEASE_DIR
def gpu_lease(lease_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "LEASE_DIR")}
    env.update(LEASE_DIR=str(lease_dir), LEASE_BUDGET_S="810", LEASE_PYTHON=sys.executable)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh"), "budget"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_linked_lease_dir_is_refused_and_nothing_is_made_where_it_points(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    link = tmp_path / "lease"
    link.symlink_to(theirs)
    done = gpu_lease(link)
    assert done.returncode == 2 and "LEASE_DIR" in done.stderr and "symbolic link" in done.stderr, done.stderr
    assert list(theirs.iterdir()) == []


def test_a_lease_dir_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "lease"
    shared.mkdir()
    shared.chmod(0o777)
    done = gpu_lease(shared)
    assert done.returncode == 2 and "others cannot write" in done.stderr, done.stderr
    assert list(shared.iterdir()) == []


def test_a_missing_lease_dir_is_made_for_this_user_alone(tmp_path):
    fresh = tmp_path / "lease"
    done = gpu_lease(fresh)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700 and (fresh / "out").is_dir()
    assert gpu_lease(fresh).returncode == 0  # the next call of the lease uses the same folder


# ------------------------------------------------------------------ tests/all12_cells.py --json
def test_all12_cells_json_is_never_written_through_a_link(tmp_path):
    from tests import all12_cells

    victim = tmp_path / "victim.txt"
    victim.write_text("original\n")
    link = tmp_path / "cells.json"
    link.symlink_to(victim)
    with pytest.raises(SystemExit):
        all12_cells.main(["--device", "cpu", "--only", "no-such-cell", "--json", str(link)])
    assert victim.read_text() == "original\n" and link.is_symlink()
    plain = tmp_path / "plain.json"  # and without a link it is written as before (no cell matched: exit 1)
    assert all12_cells.main(["--device", "cpu", "--only", "no-such-cell", "--json", str(plain)]) == 1
    assert json.loads(plain.read_text())["cells"] == []


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA GH200 480GB", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA L40S", 362.0), ("NVIDIA A10", 125.0),
    ("NVIDIA A10G", None), ("NVIDIA L40", None), ("Tesla T4", None)])
def test_a_gpu_peak_is_matched_by_its_model_never_by_a_substring_of_another(name, tflops):
    """An audit: the peak was the first key found as a substring, so an H100 PCIe or NVL got the SXM part's 989
    TFLOP/s (utilisation understated by a quarter) and an A10G the A10's; a GPU with no peak on file has none."""
    found = throughput_module().gpu_peak_tflops(name)
    assert (found[0] if found else None) == tflops


def test_the_benchmark_records_what_ran_beside_it():
    """run_conditions, recorded at a run's start and end (the lease page says alone or contended from it): the
    1-minute load average against the CPUs, and other GPU compute processes only where nvidia-smi can say."""
    import torch

    recorded = throughput_module().run_conditions(torch.device("cpu"))
    assert set(recorded) == {"load_avg_1min", "cpus", "other_gpu_processes"}
    assert recorded["load_avg_1min"] >= 0 and recorded["cpus"] >= 1 and recorded["other_gpu_processes"] is None
