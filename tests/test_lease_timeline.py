"""The GPU lease's time plan (benchmarks/lease/timeline.py) and that benchmarks/gpu_lease.sh keeps to it.

Issue 60: the short lease's first call capped the benchmark alone at the call's limit, never the tests,
the benchmark and the overheads together (at LEASE_BUDGET_S 720 the call reached ~560-630 s of its 600);
`group` relied on `first` having unpacked .lease on the same machine and brought back only compacted rows.
Here `gpu_lease.sh budget` is read for every budget of a 15-minute lend, and the script is run with a stand-in
for the device's Python whose every step hangs: each part must be cut at its end in the plan, and each call
must end by it. The real Python still runs the plan, the snapshot of the rows and the curves.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEASE = ROOT / "benchmarks" / "gpu_lease.sh"
sys.path.insert(0, str(ROOT / "benchmarks" / "lease"))
try:
    import timeline
finally:
    sys.path.pop(0)

CALL = re.compile(r"^call (\d+): t0\+(\d+) -> t0\+(\d+) s \((\d+) s\)", re.M)
PART = re.compile(r"^  (\w+) +t0\+(\d+) +-> t0\+(\d+) ", re.M)
CUT = re.compile(r"lease: cut at t0\+(\d+) s \(its end: t0\+(\d+) s\): (.*)")


def lease(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LEASE), *args], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def printed_calls(budget: int, **env: str) -> list[tuple[int, int, int]]:
    """(number, start, end) of each call `gpu_lease.sh budget` prints, checking its own arithmetic."""
    done = lease("budget", env={"LEASE_BUDGET_S": str(budget), **env})
    assert done.returncode == 0, done.stderr
    calls = [tuple(int(x) for x in m.groups()) for m in CALL.finditer(done.stdout)]
    assert calls, done.stdout
    for _, start, end, length in calls:
        assert end - start == length
    return [(n, start, end) for n, start, end, _ in calls]


@pytest.mark.parametrize("budget", range(540, 901, 30))
def test_every_call_of_the_printed_timeline_ends_below_the_call_limit_and_the_last_inside_the_budget(budget):
    calls = printed_calls(budget)
    for number, start, end in calls:
        assert end - start <= 555, (number, start, end)  # the tool's 600 s, 45 s kept
    for (_, _, before), (_, start, _) in zip(calls, calls[1:]):
        assert start - before >= timeline.GAP_S  # the next call is sent after the last one's files are back
    assert calls[-1][2] + timeline.RETURN_S <= budget


@pytest.mark.parametrize("budget", [780, 810])
def test_the_lead_s_lease_has_a_main_call_whose_sweep_the_planner_can_fill(budget):
    """At the budgets of a 15-minute lend less a 90- or 120-s start: call 1 runs the tests and the benchmark,
    call 2 the main job with at least MAIN_MIN_S (the deadline planner counts 60 s of start-up before a
    wave of groups of ~115 s each)."""
    plan = timeline.timeline(budget)
    assert [c.command.split()[-1] for c in plan.calls] == ["bench", "main"]
    tests, bench = plan.calls[0].parts[1:]
    assert tests.end - tests.start >= timeline.TESTS_MIN_S and bench.end - bench.start >= timeline.BENCH_MIN_S
    two = plan.calls[1]
    assert two.end - two.start >= timeline.MAIN_MIN_S
    assert plan.lease["LEASE_MAIN_SWEEP_S"] >= 185  # benchmarks/lease/plan.py admits a wave at the H100's rate


H100_RATE = ROOT / "results" / "gpu_h100" / "lease_2026-11-26" / "throughput_packed.json"


@pytest.mark.slow
@pytest.mark.skipif(not H100_RATE.is_file(), reason="the H100 lease's benchmark file is absent")
def test_the_planner_admits_a_wave_of_groups_in_the_shortest_main_call():
    """The main call's sweep at MAIN_MIN_S, its plan step taking all of its time: at the packed rate the
    H100 lease measured, benchmarks/lease/plan.py admits whole groups (else call 2 would start nothing)."""
    plan = timeline.short_lease(690)  # the shortest budget with a main call: exactly MAIN_MIN_S
    two = plan.calls[1]
    assert two.end - two.start == timeline.MAIN_MIN_S
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lease" / "plan.py"), "--deadline-s",
                           str(plan.lease["LEASE_MAIN_SWEEP_S"]), "--throughput", str(H100_RATE), "--only",
                           "dataset=mnist"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"lease plan: [1-9]\d* of 12 fused group\(s\) of 3 fit", done.stdout), done.stdout


def test_the_parts_tile_each_call_and_the_script_reads_the_numbers_it_prints():
    for budget in (540, 690, 810, 900, 1500, 1800):
        plan = timeline.timeline(budget)
        for call in plan.calls:
            assert all(a.end == b.start for a, b in zip(call.parts, call.parts[1:])), call
            assert all(p.end >= p.start for p in call.parts), call
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lease" / "timeline.py"), "810", "--shell"],
                          capture_output=True, text=True, check=True)
    values = dict(line.split("=", 1) for line in done.stdout.split())
    one = timeline.timeline(810).calls[0]
    assert (int(values["UNPACK_END"]), int(values["TESTS_END"]), int(values["BENCH_END"])) == tuple(
        p.end for p in one.parts)
    assert values["CALL2"] == "main" and int(values["CALL_END_S"]) == 555


def test_a_short_budget_is_one_call_and_parts_given_by_hand_are_kept():
    assert [c.number for c in timeline.timeline(600).calls] == [1]
    assert printed_calls(600)[-1][2] <= 600 - timeline.RETURN_S
    calls = printed_calls(810, LEASE_BENCH_S="0")  # the benchmark skipped: call 2 gets its time
    assert calls[0][2] == timeline.UNPACK_S + timeline.TESTS_S and calls[1][2] - calls[1][1] > 400
    assert "LEASE_BENCH_S=0" in timeline.timeline(810, bench_by_hand=0).calls[0].command


@pytest.mark.parametrize("env,name", [({"LEASE_BUDGET_S": "300"}, "LEASE_BUDGET_S=300"),
                                      ({"LEASE_BUDGET_S": "9000"}, "LEASE_BUDGET_S=9000"),
                                      ({"LEASE_BUDGET_S": "8m"}, "LEASE_BUDGET_S=8m"),
                                      ({"LEASE_BUDGET_S": "810", "LEASE_TESTS_S": "-5"}, "LEASE_TESTS_S=-5"),
                                      ({"LEASE_BUDGET_S": "810", "LEASE_TIME_SCALE": "0"}, "LEASE_TIME_SCALE=0")])
def test_bad_values_are_refused_in_one_line_naming_them(env, name):
    for command in ("budget", "first"):
        done = lease(command, env=env)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert name in done.stderr and "allowed:" in done.stderr


def test_the_short_lease_has_no_study_call_and_the_long_no_bench_call():
    done = lease("study", env={"LEASE_BUDGET_S": "810"})
    assert done.returncode == 2 and "has no study call" in done.stderr and "first; bench, then main" in done.stderr
    done = lease("bench", env={"LEASE_BUDGET_S": "1800"})
    assert done.returncode == 2 and "is a call of the short lease" in done.stderr


# -- the script keeps to the plan: a stand-in device Python ---------------------------------------------

SHIM = """#!/bin/bash
# the device's python3 for these tests: the plan, the snapshot of the rows and the curves run for real;
# plan.py admits 1 epoch; sweep.py runs $FAKE_SWEEP (python code) when given; every other step hangs
case "$*" in
  *timeline.py*|*rpevit.sweep.snapshot*|*curves.py*) exec {python} "$@" ;;
  *plan.py*) echo "lease plan: 4 of 12 fused group(s) of 3 fit (stand-in)"; echo "1 60.00"; exit 0 ;;
  *sweep.py*) [[ -n ${{FAKE_SWEEP:-}} ]] && exec {python} -c "$FAKE_SWEEP" ;;
esac
exec sleep 1000
"""


def pack(folder: Path) -> Path:
    """A .lease as `prepare` writes it, of a tiny site folder."""
    site = folder / "stage"
    (site / "carried").mkdir(parents=True)
    (site / "carried" / "__init__.py").write_text("")
    out = folder / "pack"
    out.mkdir()
    with tarfile.open(out / "site.tar.xz", "w:xz") as tar:
        tar.add(site, arcname=".")
    (out / "mnist.npz").write_bytes(b"not really mnist")
    subprocess.run("sha256sum site.tar.xz mnist.npz > SHA256SUMS", shell=True, cwd=out, check=True)
    return out


@pytest.fixture
def device(tmp_path):
    """The environment of a lease on a fresh machine whose Python is the stand-in."""
    shim = tmp_path / "python3"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    return {"PATH": os.environ["PATH"], "LEASE_PYTHON": str(shim), "LEASE_DIR": str(tmp_path / "lease"),
            "OUT": str(tmp_path / "out"), "LEASE_PACK": str(pack(tmp_path)), "LEASE_BUDGET_S": "810"}


def cut(output: str, command: str) -> tuple[int, int]:
    """(when, its end) of the one step cut whose command line holds `command`."""
    found = [(int(m.group(1)), int(m.group(2))) for m in CUT.finditer(output) if command in m.group(3)]
    assert len(found) == 1, (command, output)
    return found[0]


@pytest.mark.slow
def test_when_every_step_hangs_each_part_is_cut_at_its_end_and_each_call_ends_by_its_own(device):
    """The whole short lease at 1/10 of its times (LEASE_TIME_SCALE=0.1: call 1 ends at t0+48 s, call 2 at
    t0+78 s or 56 s after its start): the tests, the benchmark and the sweep hang, and are cut. Not 1/20: the
    script's fixed seconds (bash and Python starting, the stand-in's steps) do not scale, and on two loaded cores
    (CI beside two training trials, 2026-12-02) they used the ~10 s that 1/20 leaves call 2 before its sweep's
    end, so the sweep was skipped, not cut; 1/10 leaves it ~25 s."""
    env = {**device, "LEASE_TIME_SCALE": "0.1"}
    values = dict(line.split("=", 1) for line in subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "lease" / "timeline.py"), "810", "--shell"], env=env,
        capture_output=True, text=True, check=True).stdout.split())
    start = time.monotonic()
    one = subprocess.run(["bash", "-c", f"bash {LEASE} first; bash {LEASE} bench"], env=env, capture_output=True,
                         text=True, timeout=120)
    one_s = time.monotonic() - start
    assert one_s <= int(values["BENCH_END"]) + 2, (one_s, one.stdout)
    steps = {name: cut(one.stdout, name) for name in ("pytest --collect-only", "pytest -q", "throughput.py")}
    assert steps["pytest -q"][1] == int(values["TESTS_END"]) and steps["throughput.py"][1] == int(values["BENCH_END"])
    assert all(when <= end + 1 for when, end in steps.values()), steps
    assert (Path(env["LEASE_DIR"]) / "site" / "carried" / "__init__.py").is_file()  # unpacked by `first`
    start = time.monotonic()
    two = subprocess.run(["bash", str(LEASE), "main"], env=env, capture_output=True, text=True, timeout=120)
    two_s = time.monotonic() - start
    assert two_s <= int(values["CALL_END_S"]) + 2, (two_s, two.stdout)
    sweep_when, sweep_end = cut(two.stdout, "sweep.py")
    assert sweep_end <= int(values["BUDGET_S"]) - int(values["RETURN_S"]) - int(values["COLLECT_S"])
    assert sweep_when <= sweep_end + 1 and "--deadline" in two.stdout


@pytest.mark.slow
def test_a_call_after_the_first_ends_by_the_device_time_left_when_it_is_given(device):
    """LEASE_LEFT_S (the last reply's budget_left_s, less the seconds since): a machine whose start took longer
    than the budget assumed, or a fresh machine after a missed 30-s window, leaves less than the plan says;
    the call's parts end by its start + LEASE_LEFT_S - RETURN_S, not by the plan's 555 s, and on a fresh machine
    (the device fixture's: no t0 of an earlier call) START_S sooner, since its start was spent before the command
    began (the lease review: call 2 on a cold machine planned ~90 s past the device time and lost its rows). Here
    at 1/20 scale: 20 s left, so its end is 20 - 2 - 4 = 14 s after its start."""
    env = {**device, "LEASE_TIME_SCALE": "0.05", "LEASE_LEFT_S": "20"}
    values = dict(line.split("=", 1) for line in subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "lease" / "timeline.py"), "810", "--shell"], env=env,
        capture_output=True, text=True, check=True).stdout.split())
    expected = 20 - int(values["RETURN_S"]) - int(values["START_S"])
    assert int(values["START_S"]) >= 4 and expected >= 10
    start = time.monotonic()
    done = subprocess.run(["bash", str(LEASE), "main"], env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert took <= expected + 2, (took, done.stdout)
    assert re.search(rf"main call done at t0\+\d+ s \(its end: t0\+{expected} s\)", done.stdout), done.stdout
    assert "a fresh machine" in done.stdout and "came out of LEASE_LEFT_S (20 s)" in done.stdout
    bad = subprocess.run(["bash", str(LEASE), "main"], env={**env, "LEASE_LEFT_S": "5m"}, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "LEASE_LEFT_S has value '5m'" in bad.stderr


FAKE_CUT_SWEEP = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from rpevit.sweep import store
from rpevit.sweep.results import SPACE_FILE
from tests.test_results_store import append, flushes
folder = Path({folder!r})
folder.mkdir(parents=True)
log = store.PartLog(folder)
for batch in flushes()[:3]:  # three flushes, never compacted: a sweep cut before its end
    append(log, batch)
(folder / SPACE_FILE).write_text('{{"name": "all12", "trials": {{}}}}')
sys.exit(143)  # stopped by SIGTERM
"""


@pytest.mark.slow
def test_main_on_a_fresh_machine_unpacks_the_lease_and_brings_back_the_rows_of_a_cut_sweep(device):
    """No `first` before it: `main` unpacks .lease itself; its sweep is stopped with its rows still in parts/
    (never compacted): the rows come back all the same, read through the store as the analysis reads them."""
    folder = Path(device["LEASE_DIR"]) / "results" / "all12"
    env = {**device, "LEASE_TIME_SCALE": "0.2", "FAKE_SWEEP": FAKE_CUT_SWEEP.format(root=str(ROOT), folder=str(folder))}
    done = subprocess.run(["bash", str(LEASE), "main"], env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 143, done.stdout + done.stderr
    assert (Path(device["LEASE_DIR"]) / "site" / ".unpacked").is_file()
    assert (folder / "parts").is_dir() and not (folder / "trials.parquet").exists()
    import pyarrow.parquet as pq

    out = Path(device["OUT"])
    trials = pq.read_table(out / "trials.parquet").to_pylist()
    assert len(trials) == 3 and {r["test_acc"] for r in trials} == {3.0, 6.0, 9.0}  # flushes 1-3, one key each
    assert pq.read_table(out / "epochs.parquet").num_rows == 6 and (out / "space.json").is_file()
    assert (out / "lease_plan.txt").read_text().startswith("lease plan:")


def test_a_fresh_machine_without_the_lease_pack_is_told_to_carry_it(device, tmp_path):
    env = {**device, "LEASE_PACK": str(tmp_path / "nowhere")}
    for command in ("main", "group", "bench"):
        done = subprocess.run(["bash", str(LEASE), command], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 3, (command, done.stdout, done.stderr)
        assert "carry .lease (carry=[.lease]" in done.stderr


# -- what the rehearsal requires of a call's files (benchmarks/lease/rehearsal_checks.py) -------------------

def rehearsal_checks():
    sys.path.insert(0, str(ROOT / "benchmarks" / "lease"))
    try:
        import rehearsal_checks as checks
    finally:
        sys.path.pop(0)
    return checks


def test_the_rehearsal_wants_the_short_lease_s_question_first_and_the_two_fused_profiles():
    checks = rehearsal_checks()

    def row(mode: str, profiled: bool = False) -> dict:
        return {"mode": mode, "images_per_s": 1.0, **({"profile": {"steps": 1}} if profiled else {})}

    packed, fused = row("2 packed processes, fused k=3 + compiled"), row("fused k=3 + compiled (on)", True)
    whole = row("fused k=3 + whole step in one graph (graph)", True)
    good = [packed, fused, whole, row("solo eager"), row("solo compiled (on)")]
    assert checks.bench_problems({"models": {"tiny": {"rows": good}}}) == []
    under_mps = row("2 packed processes under MPS, fused k=3 + compiled")  # a GPU's order: MPS right after packed
    assert checks.bench_problems({"models": {"tiny": {"rows": [packed, under_mps, *good[1:]]}}}) == []
    old_order = [row("solo eager", True), row("solo compiled (on)", True), fused, whole, packed]  # before issue 60
    problems = checks.bench_problems({"models": {"tiny": {"rows": old_order}}})
    assert any("must come first" in p for p in problems) and any("only the two fused" in p for p in problems)
    # the order of 2026-11-27 (fused, whole, then packed: the packed and MPS rows never came back)
    problems = checks.bench_problems({"models": {"tiny": {"rows": [fused, whole, packed, *good[3:]]}}})
    assert any("must come first" in p for p in problems)
    no_whole = [packed, fused, *good[3:]]
    assert any("must come first" in p for p in checks.bench_problems({"models": {"tiny": {"rows": no_whole}}}))
    one_profile = [packed, fused, {**whole, "profile": None}, *good[3:]]
    assert any("only the two fused" in p for p in checks.bench_problems({"models": {"tiny": {"rows": one_profile}}}))
    failed = [{"mode": "2 packed processes, fused k=3 + compiled", "error": "RuntimeError: x"}, fused, whole]
    assert any("without a rate" in p for p in checks.bench_problems({"models": {"tiny": {"rows": failed}}}))
    # what the rehearsal's short bench (gpu_lease.sh run_bench) asks throughput.py for: the order checked here
    lease = LEASE.read_text()
    assert "--modes packed fused whole eager compiled --profile-modes fused whole" in lease
    assert "--modes packed mps fused whole eager compiled" in lease and lease.count("--profile-modes fused whole") == 2


def test_the_whole_step_gpu_tests_run_first_in_a_lease():
    """The 2026-11-27 lease ran tests/test_gpu.py first and was cut before any whole-step test ran."""
    assert 'LEASE_GPU_TESTS:-tests/test_gpu_whole_step.py tests/test_gpu.py}' in LEASE.read_text()


@pytest.mark.parametrize("command", ["budget", "main", "first"])
def test_a_lease_without_its_budget_is_refused_in_one_line(command, tmp_path):
    """No default: a forgotten export planned the 30-minute lease (1800 s) on a 15-minute lend."""
    done = lease(command, env={"LEASE_DIR": str(tmp_path / "lease")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "LEASE_BUDGET_S is not set" in done.stderr


def test_the_rehearsal_wants_a_plan_that_admits_a_group():
    checks = rehearsal_checks()
    assert checks.plan_problems("lease plan: 4 of 12 fused group(s) of 3 fit in 3.2 min ...\n1 115.32\n") == []
    assert checks.plan_problems("lease plan: 0 of 12 fused group(s) of 3 fit in 2.9 min ...\n")[0].startswith(
        "the plan admits no group")
    assert checks.plan_problems("error: --only has value ...") == ["no `lease plan: N of M fused group(s) ... fit` line"]


FAKE_ADMITS_NONE = """
import os, sys
from pathlib import Path
marker = Path(os.environ["LEASE_DIR"]) / "fake_sweep_ran"
if marker.exists():
    print("the one group's sweep (stand-in)")
    sys.exit(0)
marker.touch()
print("deadline 3.25m: ran 0 trial(s), left 12 that would not end before it (stand-in)")
"""


@pytest.mark.slow
def test_call_2_on_a_fresh_machine_plans_with_the_committed_rate_and_runs_a_group_when_the_sweep_admits_none(device):
    """The lease review: on a fresh machine call 1's throughput.json is gone, so plan.py planned with its default
    rate (it admitted nothing: `group` always); and where plan.py admitted a group that sweep.py's own planner, a
    few seconds later, found too late, nothing ran and no rows came back. Now the committed rate is used, and a
    sweep that admitted no group is followed by one fused group."""
    env = {**device, "LEASE_TIME_SCALE": "0.1", "FAKE_SWEEP": FAKE_ADMITS_NONE}
    done = subprocess.run(["bash", str(LEASE), "main"], env=env, capture_output=True, text=True, timeout=120)
    assert "no rate of this lease on this machine (a fresh one): planning with the committed results/" in done.stdout
    assert "the sweep's planner admitted no group" in done.stdout and "lease: one group, sweep.py" in done.stdout
    assert (Path(env["LEASE_DIR"]) / "sweep_main.log").read_text().count("ran 0 trial(s)") == 1
    assert (Path(env["OUT"]) / "sweep.log").read_text().strip() == "the one group's sweep (stand-in)"
