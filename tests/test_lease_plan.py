"""The GPU lease's plan (benchmarks/lease/plan.py) and its benchmark's FLOP convention.

The first lease planned no study work (issue 40: a deadline 14 min away and 200-epoch trials admit
nothing). The lease now asks the sweep's own planner (rpevit.sweep.deadline) with its real deadline and
an estimate from its benchmark (or a pessimistic fallback), and refuses to launch a sweep that would start
nothing. benchmarks/throughput.py counts FLOPs as a datasheet peak does (a multiply-add is 2 FLOPs), where
fvcore counts 1: utilisation was 2x too low.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "benchmarks" / "lease" / "plan.py"
STUDY = ["--only", "dataset=mnist"]


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PLAN), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_lease_deadline_admits_whole_groups_even_at_the_fallback_rate():
    """13 minutes left when the second call plans (25 - 12), no benchmark figure: the pessimistic fallback still
    admits groups; the estimate is the last line, as gpu_lease.sh reads it."""
    result = plan("--deadline-s", "780", *STUDY)
    assert result.returncode == 0, result.stderr
    assert "fused group(s) of 3 fit in 13.0 min on 4 slots at " in result.stdout
    admitted = int(result.stdout.split("lease plan: ")[1].split(" of ")[0])
    assert 1 <= admitted <= 12
    assert "fallback 4700 images/s / 4 (no benchmark figure given)" in result.stdout
    epochs, seconds = result.stdout.strip().splitlines()[-1].split()  # `EPOCHS SECONDS`, as gpu_lease.sh reads it
    assert int(epochs) >= 1 and float(seconds) > 0


@pytest.mark.slow
def test_a_measured_packed_rate_is_used_and_a_hopeless_deadline_refused(tmp_path):
    rows = {"models": {"gpu": {"rows": [{"mode": "4 packed processes, fused k=3 + compiled",
                                         "images_per_s": 100_000.0}]}}}
    (tmp_path / "t.json").write_text(json.dumps(rows))
    fast = plan("--deadline-s", "780", "--throughput", str(tmp_path / "t.json"), *STUDY)
    assert fast.returncode == 0 and "lease plan: 12 of 12" in fast.stdout, fast.stdout + fast.stderr
    assert "4 packed processes, fused k=3 + compiled / 4" in fast.stdout
    hopeless = plan("--deadline-s", "60", *STUDY)
    assert hopeless.returncode == 2 and "admits no group" in hopeless.stderr


def test_throughput_counts_a_multiply_add_as_two_flops():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert throughput.FLOPS_PER_MULTIPLY_ADD == 2
    assert "fused k=3 + compiled (on)" in [name for name, _ in throughput.plan_modes(
        "tiny", bench_args(throughput, compile="on", fused=[3, 5], packed=4), None)]


def bench_args(throughput, modes: list[str] | None = None, mps: bool = False, **values) -> object:
    """benchmarks/throughput.py's parsed arguments, as main() leaves them (modes in their run order)."""
    defaults = {"steps": 1, "warmup": 1, "samples": 3, "profile_steps": 0,
                "profile_modes": ["eager", "compiled", "fused"]}
    return type("Args", (), {**defaults, **values, "mps": mps, "modes": throughput.mode_order(modes, mps)})()


def test_the_short_lease_s_benchmark_runs_its_question_first_and_profiles_one_mode(monkeypatch):
    """Issue 60: the short lease's benchmark measured solo eager and compiled (known) first, profiled each, and
    its time ran out before the packed processes under MPS. --modes puts the fused group (the one-process
    baseline), then the packed processes without and with MPS first; --profile-modes profiles the fused one."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = bench_args(throughput, modes=["fused", "packed", "mps", "eager", "compiled"], compile="cudagraphs",
                      fused=[5], packed=4, profile_steps=5, profile_modes=["fused"])
    plan = throughput.plan_modes("tiny", args, None)
    assert [name for name, _ in plan] == ["fused k=5 + compiled (cudagraphs)", "4 packed processes, fused k=5 + compiled",
                                          "4 packed processes under MPS, fused k=5 + compiled", "solo eager",
                                          "solo compiled (cudagraphs)"]
    profiled = []
    monkeypatch.setattr(throughput, "measure", lambda *a, profile=0, **k: profiled.append(profile) or {})
    for _, run in (plan[0], plan[3], plan[4]):  # the in-process modes
        run()
    assert profiled == [5, 0, 0]
    assert throughput.mode_order(None, True) == ["eager", "compiled", "fused", "packed", "mps"]  # --mps alone: as before
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--modes", "fused", "mps",
                              "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--modes mps) with --device cpu" in refused.stderr


def test_a_packed_rate_of_larger_groups_is_scaled_down_to_the_space_s_and_mps_is_not_used(tmp_path):
    """The short lease packs groups of 5 (its question); the sweep runs groups of 3: the plan takes the k=5 rate
    x 3/5 (a pessimistic bound for a launch-bound step), never the rate under MPS, which the sweep does not use."""
    sys.path.insert(0, str(PLAN.parent))
    try:
        import plan as lease_plan
    finally:
        sys.path.remove(str(PLAN.parent))
    rows = [{"mode": "4 packed processes under MPS, fused k=5 + compiled", "images_per_s": 90_000.0},
            {"mode": "4 packed processes, fused k=5 + compiled", "images_per_s": 50_000.0},
            {"mode": "4 packed processes, fused k=5 + compiled", "error": "RuntimeError: x"}]
    (tmp_path / "k5.json").write_text(json.dumps({"models": {"gpu": {"rows": rows}}}))
    rate, why = lease_plan.measured_rate(tmp_path / "k5.json", members=3)
    assert rate == pytest.approx(50_000 / 4 * 3 / 5) and why.endswith("4 packed processes, fused k=5 + compiled / 4 x 3/5")
    rows.append({"mode": lease_plan.PACKED_ROW, "images_per_s": 40_000.0})  # a k=3 row: the space's own size wins
    (tmp_path / "k35.json").write_text(json.dumps({"models": {"gpu": {"rows": rows}}}))
    assert lease_plan.measured_rate(tmp_path / "k35.json", members=3)[0] == 10_000.0


def test_the_packed_mode_under_mps_is_timed_after_the_plain_one_and_says_why_it_cannot_run(monkeypatch):
    """--mps adds the packed processes under NVIDIA MPS right after the same processes without it; where the
    machine has no MPS control program, the mode fails with that reason (the benchmark reports it and goes on)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = bench_args(throughput, compile="cudagraphs", fused=[5], packed=4, mps=True)
    names = [name for name, _ in throughput.plan_modes("tiny", args, None)]
    assert names[-2:] == ["4 packed processes, fused k=5 + compiled",
                          "4 packed processes under MPS, fused k=5 + compiled"]
    monkeypatch.setattr(throughput.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control is not on this machine's PATH"):
        throughput.packed_mps("tiny", 2, 3, "on", None, 1, 1, 3)
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--mps", "--device", "cpu"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--mps (or --modes mps) with --device cpu" in refused.stderr


def test_the_fallback_rate_says_why_a_benchmark_figure_was_not_used(tmp_path):
    sys.path.insert(0, str(PLAN.parent))
    try:
        import plan as lease_plan
    finally:
        sys.path.remove(str(PLAN.parent))
    fallback = lease_plan.FALLBACK_IMAGES_PER_S / 4
    assert lease_plan.measured_rate(None) == (fallback, "fallback 4700 images/s / 4 (no benchmark figure given)")
    (tmp_path / "bad.json").write_text("{not json")
    rate, why = lease_plan.measured_rate(tmp_path / "bad.json")
    assert rate == fallback and "unreadable: JSONDecodeError" in why
    (tmp_path / "norow.json").write_text(json.dumps({"models": {"gpu": {"rows": [
        {"mode": lease_plan.PACKED_ROW, "images_per_s": "fast"}]}}}))
    rate, why = lease_plan.measured_rate(tmp_path / "norow.json")
    assert rate == fallback and "has no '4 packed processes" in why
    (tmp_path / "ok.json").write_text(json.dumps({"models": {"gpu": {"rows": [
        {"mode": lease_plan.PACKED_ROW, "images_per_s": 8000.0}]}}}))
    assert lease_plan.measured_rate(tmp_path / "ok.json")[0] == 2000.0


def test_a_lease_budget_too_short_is_refused_in_one_line():
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh"), "budget"], capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "LEASE_BUDGET_S": "300"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "LEASE_BUDGET_S=300" in done.stderr


def test_the_step_profile_counts_each_steps_ops_and_regions():
    """benchmarks/step_profile.py on a CPU run of known ops: one mm in `step_inputs` and two adds in
    `train_step` per step come back as 1 and 2 calls per step, in their regions, with no launches."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from step_profile import format_profile, profile_steps
    finally:
        sys.path.pop(0)
    import torch
    from torch.profiler import record_function

    a = torch.randn(64, 64)

    def run(first: int, count: int) -> None:
        for _ in range(count):
            with record_function("step_inputs"):
                b = torch.mm(a, a)
            with record_function("train_step"):
                torch.add(torch.add(b, 1.0), 2.0)

    p = profile_steps(run, 0, 4, torch.device("cpu"), lambda device: None)
    calls = {t["op"]: t["calls_per_step"] for t in p["top_self_cpu"]}
    assert p["steps"] == 4 and calls.get("aten::mm") == 1.0 and calls.get("aten::add") == 2.0
    assert set(p["region_cpu_ms_per_step"]) == {"step_inputs", "train_step"}
    assert p["launches_per_step"] == 0 and p["aten_ops_per_step"] >= 3 and "device_busy_fraction" not in p
    assert "launches" in format_profile(p)


CHILD = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
import throughput
barrier = sys.argv[1]
try:
    os.mkdir(Path(barrier).parent / "first")  # the first child to get here fails, as a compile error would
except FileExistsError:
    start = time.time()
    print(throughput.wait_for_others(barrier, 2, timeout_s=120), round(time.time() - start))
    sys.exit(0)
sys.exit(3)
"""


@pytest.mark.slow
def test_a_packed_process_that_fails_stops_the_others_waiting_at_once(tmp_path):
    """Issue 60 (the lease review): a packed process that died while compiling left the others in wait_for_others
    until its 600-s timeout, past the benchmark's end: no mode got a rate. The parent now tells them at once."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(bench=str(ROOT / "benchmarks")))
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    start = time.monotonic()
    children, outputs = throughput.run_packed_children([sys.executable, str(script), str(barrier)], 2, dict(os.environ),
                                                       str(barrier))
    assert time.monotonic() - start < 60
    assert sorted(child.returncode for child in children) == [0, 3]
    survivor = next(out for child, out in zip(children, outputs) if child.returncode == 0)
    assert survivor[-1].split()[0] == "False", survivor
