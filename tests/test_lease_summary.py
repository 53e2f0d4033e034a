"""benchmarks/lease/summary.py: a lease's returned files as one page, every figure from the files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "lease" / "summary.py"

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4" time="12.5">
<testcase classname="tests.test_gpu" name="test_a" time="1"/>
<testcase classname="tests.test_gpu" name="test_b[softmax-ape-off]" time="1"><failure message="x">boom</failure></testcase>
<testcase classname="tests.test_gpu" name="test_c" time="1"><skipped message="no cuda"/></testcase>
<testcase classname="tests.test_gpu" name="test_d" time="1"><error message="y">setup</error></testcase>
</testsuite></testsuites>"""


def bench(solo_compiled: float, packed: float, hours: float) -> dict:
    def row(mode: str, ips: float) -> dict:
        return {"mode": mode, "images_per_s": ips, "images_per_s_samples": [ips * 0.9, ips, ips * 1.2],
                "step_ms": 10.0, "tflops": 1.0, "utilisation": 0.01, "compile_fallback": ""}
    profiled = {**row("solo compiled (on)", solo_compiled),
                "profile": {"steps": 5, "wall_ms_per_step": 17.5, "device_busy_fraction": 0.42,
                            "device_busy_from": "device-side events", "launches_per_step": 812.0,
                            "syncs_per_step": 0.2, "region_cpu_ms_per_step": {"step_inputs": 1.25, "optimizer": 0.5}}}
    return {"device": "Test GPU <b>|x", "models": {"gpu": {
        "rows": [row("solo eager", 1000.0), profiled,
                 row("4 packed processes, fused k=5 + compiled", packed)],
        "projected_all12_cifar10_hours": hours}}}


def run(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, cwd=ROOT)


def test_counts_rows_and_goals_come_from_the_files(tmp_path):
    (tmp_path / "1_pytest_gpu.xml").write_text(JUNIT)
    (tmp_path / "2_throughput.json").write_text(json.dumps(bench(7000.0, 50000.0, 2.5)))
    (tmp_path / "3_throughput.json").write_text(json.dumps(bench(21000.0, 60000.0, 0.8)))
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "SUMMARY.md").read_text()
    assert "| 1_pytest_gpu.xml | 4 | 1 | 1 | 1 | 1 | 12 |" in page
    assert "test\\_b\\[softmax-ape-off\\]" in page or "test_b\\[softmax-ape-off\\]" in page
    assert "7,000 (6,300-8,400, n=3)" in page and "7.00x" in page
    # the best of the two files against each goal: 21,000 >= 20,000 met, 60,000 < 100,000 not, 0.8 h <= 1 met
    assert "| >= 20,000 | 21,000 | yes |" in page
    assert "| >= 100,000 | 60,000 | no |" in page
    assert "| <= 1 | 0.80 | yes |" in page
    assert "<b>" not in page  # a device name from the file is inert Markdown
    assert "| 2_throughput.json | gpu | solo compiled (on) | 17.50 | 42% | 812 | 0.2 | step_inputs 1.25; optimizer 0.50 |" in page


def test_a_device_busy_counted_the_old_way_is_not_shown(tmp_path):
    """A profile from before device_busy_from (the two leases of 2026-11-26) summed each kernel twice: its
    busy fraction is not printed, and the page says why."""
    old = bench(7000.0, 50000.0, 2.5)
    del old["models"]["gpu"]["rows"][1]["profile"]["device_busy_from"]
    (tmp_path / "2_throughput.json").write_text(json.dumps(old))
    assert run(tmp_path).returncode == 0
    page = (tmp_path / "SUMMARY.md").read_text()
    assert "| 17.50 | not shown: counted twice | 812 |" in page and "42%" not in page
    assert "each kernel counted once as a device event and once under the op that launched it" in page


def test_the_device_busy_time_sums_device_side_events_only():
    """A kernel's time is on its device event and again as the self device time of the CPU op that
    launched it (torch.autograd.profiler links kernels to their frontend op): only the first counts."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from step_profile import device_busy_us
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    table = [SimpleNamespace(key="aten::mm", device_type=DeviceType.CPU, self_device_time_total=300.0),
             SimpleNamespace(key="sm90_gemm_kernel", device_type=DeviceType.CUDA, self_device_time_total=300.0),
             SimpleNamespace(key="cudaLaunchKernel", device_type=DeviceType.CPU, self_device_time_total=0.0),
             SimpleNamespace(key="Memcpy HtoD", device_type=DeviceType.CUDA, self_device_time_total=20.0)]
    assert device_busy_us(table) == 320.0


def test_an_empty_folder_and_a_linked_file_are_refused(tmp_path):
    done = run(tmp_path)
    assert done.returncode == 1 and "holds no *pytest*.xml or *throughput*.json" in done.stderr
    target = tmp_path / "elsewhere.xml"
    target.write_text(JUNIT)
    os.symlink(target, tmp_path / "1_pytest_gpu.xml")
    done = run(tmp_path)
    assert done.returncode == 1 and "symbolic link" in done.stderr and not (tmp_path / "SUMMARY.md").exists()


@pytest.mark.skipif(not (ROOT / "results" / "gpu_h200" / "lease_2026-11-26").is_dir(), reason="lease folder absent")
def test_the_committed_summary_is_what_the_files_give(tmp_path):
    import shutil

    lease = ROOT / "results" / "gpu_h200" / "lease_2026-11-26"
    copy = tmp_path / lease.name
    shutil.copytree(lease, copy)
    assert run(copy).returncode == 0
    assert (copy / "SUMMARY.md").read_text() == (lease / "SUMMARY.md").read_text()


# -- issue 60: a cut test run reads as cut; a failed benchmark mode is a row, not a lost page ---------------

COLLECTED = [f"tests/test_gpu.py::{name}" for name in ("test_a", "test_b[softmax-ape-off]", "test_c", "test_d",
                                                      "test_e[mnist-49tok-favor+rope-cudagraphs]", "test_f")]


def test_a_run_cut_at_its_time_limit_says_how_many_of_the_collected_tests_ran_and_which_did_not(tmp_path):
    """The XML holds the 4 tests that ran; 6 were collected before the run (pytest --collect-only -q, as
    gpu_lease.sh writes it: the ids, then a count line): the page says 4 of 6 ran, cut, and names the 2."""
    (tmp_path / "pytest_gpu.xml").write_text(JUNIT)
    (tmp_path / "pytest_gpu.collected").write_text("\n".join(COLLECTED) + "\n\n6 tests collected in 4.1s\n")
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "SUMMARY.md").read_text()
    assert "| pytest_gpu.xml | 4 | 1 | 1 | 1 | 1 | 12 |" in page
    assert ("- pytest_gpu.xml: 4 of 6 collected ran; cut at the time limit. Not run: "
            "test_e\\[mnist-49tok-favor+rope-cudagraphs\\], test_f.") in page


def test_a_complete_run_and_a_run_that_left_no_xml_are_told_apart(tmp_path):
    (tmp_path / "1_pytest_gpu.xml").write_text(JUNIT)
    (tmp_path / "1_pytest_gpu.collected").write_text("\n".join(COLLECTED[:4]) + "\n")
    (tmp_path / "2_pytest_gpu.collected").write_text("\n".join(COLLECTED) + "\n")  # killed before its XML
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "SUMMARY.md").read_text()
    assert "- 1_pytest_gpu.xml: 4 of 4 collected ran." in page and "cut at the time limit" not in page
    assert "- 2_pytest_gpu.xml: 0 of 6 collected ran: no XML came back" in page


def test_a_benchmark_mode_that_failed_is_a_row_with_its_error_and_the_page_is_still_written(tmp_path):
    """Issue 60: an MPS row with an error and no rate raised KeyError and lost the whole page."""
    data = bench(7000.0, 50000.0, 2.5)
    rows = data["models"]["gpu"]["rows"]
    rows.append({"mode": "4 packed processes under MPS, fused k=5 + compiled",
                 "error": "RuntimeError: nvidia-cuda-mps-control is not on this machine's PATH: no MPS here"})
    rows[0] = {"mode": "solo eager", "error": "TimeoutError: | cut"}  # even the ratios' base
    (tmp_path / "throughput.json").write_text(json.dumps(data))
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "SUMMARY.md").read_text()
    assert ("| throughput.json | gpu | 4 packed processes under MPS, fused k=5 + compiled | failed: RuntimeError: "
            "nvidia-cuda-mps-control is not on this machine's PATH: no MPS here | - | - | - | - | - |") in page
    assert "| solo eager | failed: TimeoutError: \\| cut |" in page
    assert "| >= 100,000 | 50,000 | no |" in page  # the goals from the rows that measured
    assert "1.00x of solo compiled (on)" in page  # no solo eager rate: the first measured mode is the base


def test_the_short_lease_s_ratios_are_to_its_fused_baseline_and_say_so(tmp_path):
    data = bench(7000.0, 50000.0, 2.5)
    rows = data["models"]["gpu"]["rows"]
    rows[0]["mode"] = "fused k=5 + compiled (cudagraphs)"  # the short lease's first mode
    (tmp_path / "throughput.json").write_text(json.dumps(data))
    assert run(tmp_path).returncode == 0
    page = (tmp_path / "SUMMARY.md").read_text()
    assert "| 50.00x of fused k=5 + compiled (cudagraphs) |" in page
    assert "Where a file has no solo eager row, its ratios are to the mode the cell names" in page


def test_unnamed_entries_of_a_stopped_run_are_not_passes_and_unmeasured_goals_say_so(tmp_path):
    """A run stopped by SIGINT can leave <testcase/> entries without a name (the lease of 2026-11-27 had 6):
    counted apart, never as passed. A goal with no mode of its kind reads 'not measured', not 0; a busy
    fraction over 100% (overlapping device events) is not shown as one."""
    stopped = JUNIT.replace('<testcase classname="tests.test_gpu" name="test_a" time="1"/>',
                            '<testcase classname="tests.test_gpu" name="test_a" time="1"/><testcase time="0.002" />'
                            '<testcase time="0.003" />')
    (tmp_path / "pytest_gpu.xml").write_text(stopped)
    data = bench(7000.0, 50000.0, 2.5)
    rows = data["models"]["gpu"]["rows"]
    rows[:] = [rows[2], {**rows[1], "mode": "fused k=5 + whole step in one graph (graph)",
                         "profile": {**rows[1]["profile"], "device_busy_fraction": 5.32}}]
    (tmp_path / "throughput.json").write_text(json.dumps(data))
    assert run(tmp_path).returncode == 0
    page = (tmp_path / "SUMMARY.md").read_text()
    assert "| pytest_gpu.xml | 4 | 1 | 1 | 1 | 1 | 12 |" in page  # the 2 unnamed entries are not tests that passed
    assert "2 more test entries without a name (stopped before they reported): not counted as run" in page
    assert "| 40 | one compiled trial, images/s | >= 20,000 | not measured | - |" in page
    assert "| 60 | one fused group, images/s | >= 80,000 | 7,000 | no |" in page
    assert "not shown: device events overlap (532% of wall)" in page


def unescaped_pipes(line: str) -> int:
    """The `|` that split a Markdown table row (an escaped `\\|` is text inside a cell)."""
    count, i = 0, 0
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        count += line[i] == "|"
        i += 1
    return count


def test_a_pipe_or_newline_in_a_returned_file_cannot_forge_table_columns(tmp_path):
    """Every table cell built from a returned file escapes `|` (and a line break is a space): a model named
    'gpu | 999,999 | fake' stays one cell, so no forged figure can appear as a column of its own."""
    forged = "gpu | 999,999 | fake\n| x | y |"
    row = {"mode": "solo eager | 1 | 2", "images_per_s": 10.0, "step_ms": 1.0, "tflops": 1.0, "utilisation": 0.1,
           "compile_fallback": "a|b",
           "profile": {"wall_ms_per_step": 1.0, "launches_per_step": 1.0, "syncs_per_step": 0.0,
                       "region_cpu_ms_per_step": {"r | 9": 1.0}}}
    failed = {"mode": "m | 3", "error": "e | 4"}
    (tmp_path / "2_throughput.json").write_text(json.dumps(
        {"device": "H100", "models": {forged: {"rows": [row, failed]}}}))
    (tmp_path / "1_pytest_gpu.xml").write_text(
        '<testsuite name="pytest" tests="1"><testcase classname="t" name="test_x | 5 | 6">'
        '<failure message="x">boom</failure></testcase></testsuite>')
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "SUMMARY.md").read_text()
    lines = page.splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith(("| 1_pytest_gpu.xml", "| 2_throughput.json"))]
    assert len(rows) == 4, page  # the XML row, two mode rows, one profile row: no forged extra row
    for i in rows:
        header = next(h for h in lines[:i][::-1] if h.startswith("| file"))  # the table's own header
        assert unescaped_pipes(lines[i]) == unescaped_pipes(header), f"columns forged: {lines[i]!r}"
    assert "999,999" not in [c.strip() for i in rows for c in lines[i].split(" | ")]


def test_a_failed_test_whose_teardown_also_errs_is_not_subtracted_twice_from_the_passes(tmp_path):
    """pytest writes both <failure> and <error> into one testcase when its call fails and its teardown errs."""
    both = JUNIT.replace('name="test_b[softmax-ape-off]" time="1"><failure message="x">boom</failure>',
                         'name="test_b[softmax-ape-off]" time="1"><failure message="x">boom</failure>'
                         '<error message="z">teardown</error>')
    (tmp_path / "pytest_gpu.xml").write_text(both)
    assert run(tmp_path).returncode == 0
    assert "| pytest_gpu.xml | 4 | 1 | 1 | 2 | 1 | 12 |" in (tmp_path / "SUMMARY.md").read_text()



def test_each_benchmark_file_says_alone_or_contended_from_what_it_recorded(tmp_path):
    """An audit: the lease page's throughput tables said neither alone nor contended. throughput.py records
    what ran beside it (run_conditions) at its start and end; the page says it per file, and that a file
    written before records none."""
    alone = {**bench(7000.0, 50000.0, 2.5), "conditions": {
        "start": {"load_avg_1min": 0.5, "cpus": 16, "other_gpu_processes": 0},
        "end": {"load_avg_1min": 3.25, "cpus": 16, "other_gpu_processes": 0}}}
    shared = {**alone, "conditions": {"start": {**alone["conditions"]["start"], "other_gpu_processes": 2},
                                      "end": alone["conditions"]["end"]}}
    (tmp_path / "1_throughput.json").write_text(json.dumps(alone))
    (tmp_path / "2_throughput.json").write_text(json.dumps(shared))
    (tmp_path / "3_throughput.json").write_text(json.dumps(bench(7000.0, 50000.0, 2.5)))
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "SUMMARY.md").read_text()
    assert ("`1_throughput.json`: alone on the GPU (no other compute process listed by nvidia-smi at start or end); "
            "1-min load average 0.50 then 3.25 on 16 CPUs") in page
    assert "`2_throughput.json`: contended on the GPU: 2 other compute process(es) at start, 0 at end" in page
    assert "`3_throughput.json`: conditions not recorded" in page
