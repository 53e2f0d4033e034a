"""The time plan of one GPU lease: when each call starts and ends, and what each part of it may take.

    python benchmarks/lease/timeline.py 810            # the timeline, as `gpu_lease.sh budget` prints it
    python benchmarks/lease/timeline.py 810 --shell    # the same numbers as shell assignments (gpu_lease.sh)

Why a plan, and why here: the device tool lends LEASE_BUDGET_S seconds of device time from t0 (the first
call's start; the 15-minute lend less the machine's start), runs each call for at most 600 s, and keeps the
machine only 30 s after a call. A call that overruns loses what it had not yet written back, and a call
that starts more than 30 s after the last one finds a bare machine. So every part of every call gets an
end, as seconds from t0 (or from its call's start where the call's start is not fixed), and
benchmarks/gpu_lease.sh runs each part under `timeout` until that end: a part that overruns is cut, never
the call or the lease. `gpu_lease.sh budget` prints this plan; the numbers it prints are the ones the
script runs with (it reads them from `--shell`), and tests/test_lease_timeline.py checks every budget from
540 to 900 s. Standard library only: it runs under the device image's own Python before anything is
unpacked.

The short lease (under LONG_FROM_S, the 15-minute lend): call 1 runs `first` (unpack, image, GPU tests)
and `bench` (the throughput benchmark) back to back; call 2, within 30 s, runs `main` (the all12 MNIST
half through sweep.py, Ray and the deadline planner), when at least MAIN_MIN_S fit, taking time from the
tests and the benchmark down to their floors if it must; else the lease is one call. The long lease
(30 minutes, as planned for issue 40): `first`, `study` (benchmark, then a sweep in the background),
`finish` (wait, collect).

LEASE_TIME_SCALE (a number > 0, default 1) multiplies every time of the plan, rounded to whole seconds:
the tests of the caps run a whole lease in seconds with it, the CPU rehearsal gives its slower CPU more.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, replace

CALL_LIMIT_S = 600  # the device tool's limit of one call
CALL_MARGIN_S = 45  # kept inside each call: the tool's start and return, a part's last seconds of cleanup
CALL_END_S = CALL_LIMIT_S - CALL_MARGIN_S  # every call's parts end by this, from the call's start
GAP_S = 30  # from a call's end to the next one's start: files back, the next call sent (the machine waits 30 s)
RETURN_S = 30  # after the last call: its files back and the machine given back
START_S = 90  # a fresh machine's start, as the lend counts it (~90 s on the leases so far): a call after the first
#               that finds a bare machine (its 30-s window missed) spent this out of LEASE_LEFT_S before it began
MIN_BUDGET_S, LONG_FROM_S, MAX_BUDGET_S = 540, 1500, 1800

UNPACK_S = 45  # .lease checked and unpacked (~45 MB xz), image.txt, the imports of sweep.py and Ray Tune
TESTS_S, TESTS_MIN_S = 240, 180  # the GPU tests (126 took 170 s with 6 workers on an H100; 150 now)
BENCH_S, BENCH_MIN_S = 200, 150  # 4 packed without and with MPS, then fused k=5 (whole: if time remains)
TEST_TIMEOUT_S = 150  # pytest-timeout per test: one hang costs one worker this, not the whole test time
TEST_COLLECT_S = 45  # collecting the GPU tests (imports torch, Ray, pandas: ~10 s), out of the tests' time
MAIN_MIN_S = 255  # call 2 at least: plan, collect, the stop's grace, and a sweep of 185 s, in which the
#                   planner (60 s of start-up + 5 s) admits one wave of 4 groups of ~115 s at the H100's rate
PLAN_S = 20  # benchmarks/lease/plan.py (imports the space; no Ray)
COLLECT_S = 30  # a snapshot of the sweep's rows (parts/ too), the curves, nvidia-smi (~10-15 s)
GRACE_S = 20  # a capped part gets its stop signal this long before its end, SIGKILL at the end: pytest
#               writes its XML, sweep.py shuts Ray down and releases its lock, the benchmark stops MPS
QUICK_GRACE_S = 5  # the same for the quick steps (image, imports, collection, plan, snapshot, curves)
GROUP_TWO_EPOCHS_S = 180  # `group` trains 2 epochs when its sweep has this long (one group: ~130 s on an H100)
LONG_TESTS_S, LONG_BENCH_S = 420, 270  # the 30-minute lease of issue 40
LONG_STUDY_MARGIN_S = 300  # the long lease's sweep deadline: this long before the budget ends


@dataclass(frozen=True)
class Part:
    name: str
    start: int  # seconds from t0
    end: int
    what: str


@dataclass(frozen=True)
class Call:
    number: int
    command: str
    parts: tuple[Part, ...]

    @property
    def start(self) -> int:
        return self.parts[0].start

    @property
    def end(self) -> int:
        return self.parts[-1].end


@dataclass(frozen=True)
class Timeline:
    budget: int
    kind: str  # "short" or "long"
    calls: tuple[Call, ...]
    shell: dict[str, int | str]  # what gpu_lease.sh reads (ends from t0, durations), scaled with the plan
    lease: dict[str, int] = field(default_factory=dict)  # the same at the lease's own scale, never scaled (rehearsal)


class BudgetError(ValueError):
    """LEASE_BUDGET_S (or LEASE_TIME_SCALE) that no plan can be made for; the message names it."""


def parse_budget(text: str) -> int:
    """LEASE_BUDGET_S's value -> whole seconds, or BudgetError naming it and what is allowed."""
    allowed = f"allowed: whole seconds from {MIN_BUDGET_S} to {MAX_BUDGET_S} (the lend less the machine's start)"
    try:
        budget = int(text)
    except ValueError:
        raise BudgetError(f"LEASE_BUDGET_S={text} is not a whole number of seconds; {allowed}") from None
    if budget < MIN_BUDGET_S:
        raise BudgetError(f"LEASE_BUDGET_S={budget} leaves no time for the GPU tests and the benchmark; {allowed}")
    if budget > MAX_BUDGET_S:
        raise BudgetError(f"LEASE_BUDGET_S={budget} is more than the device tool lends; {allowed}")
    return budget


def parse_scale(text: str) -> float:
    try:
        scale = float(text)
    except ValueError:
        scale = -1.0
    if not scale > 0 or scale > 100:
        raise BudgetError(f"LEASE_TIME_SCALE={text} is not a factor; allowed: a number above 0, at most 100 (1: the lease)")
    return scale


def parse_part(name: str, text: str | None) -> int | None:
    """LEASE_TESTS_S / LEASE_BENCH_S: a part's seconds chosen by hand (0: skip it), or None (the plan's)."""
    if text is None or text == "":
        return None
    if not text.isdigit() or int(text) > CALL_END_S - UNPACK_S:
        raise BudgetError(f"{name}={text} is not a part's length; allowed: whole seconds from 0 (skip the part) to "
                          f"{CALL_END_S - UNPACK_S}, or unset (the plan's)")
    return int(text)


def call1(tests_s: int, bench_s: int, command: str) -> Call:
    """`first` then `bench` in one call, from t0."""
    unpack = Part("unpack", 0, UNPACK_S, ".lease checked and unpacked, image.txt, the imports")
    tests = Part("tests", unpack.end, unpack.end + tests_s,
                 f"pytest -m gpu: collected, then run (-n 6, --timeout {TEST_TIMEOUT_S} s a test, SIGINT 20 s before the end)")
    bench = Part("bench", tests.end, tests.end + bench_s,
                 "throughput.py: 4 packed processes of fused k=5 (CUDA graphs) without and with MPS, then one fused process and with the whole step in one graph; solo modes if time remains")
    return Call(1, command, (unpack, tests, bench))


def main_call(number: int, start: int, end: int, command: str) -> Call:
    """`main` (or `group`): plan, sweep, collect; on a fresh machine it unpacks first, out of the sweep's time."""
    plan = Part("plan", start, start + PLAN_S, "benchmarks/lease/plan.py: epochs and estimate from this lease's rate")
    collect = Part("collect", end - COLLECT_S, end, "sweep stopped, rows (parts/ too) snapshotted, curves, nvidia-smi")
    sweep = Part("sweep", plan.end, collect.start,
                 "sweep.py all12 --only dataset=mnist --deadline (whole groups that fit); SIGTERM at the end")
    return Call(number, command, (plan, sweep, collect))


def short_lease(budget: int, tests_by_hand: int | None = None, bench_by_hand: int | None = None) -> Timeline:
    """The 15-minute lease: call 1 (`first`, `bench`), then `main` when at least MAIN_MIN_S fit. A part's
    length given by hand (LEASE_TESTS_S, LEASE_BENCH_S) is kept as given; the plan's give up time for call 2
    down to their floors, in proportion."""
    export = exports(budget, tests_by_hand, bench_by_hand)
    first = f"{export}bash benchmarks/gpu_lease.sh first; bash benchmarks/gpu_lease.sh bench"
    tests_s = TESTS_S if tests_by_hand is None else tests_by_hand
    bench_s = BENCH_S if bench_by_hand is None else bench_by_hand
    give = (tests_s - min(tests_s, TESTS_MIN_S) if tests_by_hand is None else 0,
            bench_s - min(bench_s, BENCH_MIN_S) if bench_by_hand is None else 0)
    shortfall = MAIN_MIN_S - main_seconds(budget, UNPACK_S + tests_s + bench_s)
    if 0 < shortfall <= sum(give):  # call 2 fits if the tests and the benchmark give up some time
        from_tests = -(-shortfall * give[0] // sum(give))
        tests_s, bench_s = tests_s - from_tests, bench_s - (shortfall - from_tests)
    if main_seconds(budget, UNPACK_S + tests_s + bench_s) >= MAIN_MIN_S:
        one = call1(tests_s, bench_s, first)
        start = one.end + GAP_S
        two = main_call(2, start, start + main_seconds(budget, one.end),
                        f"{exports(budget, tests_by_hand, bench_by_hand, left=True)}bash benchmarks/gpu_lease.sh main")
        calls, second = (one, two), "main"
    else:  # one call: the tests and the benchmark share what the call and the budget allow
        calls, second = (call1(*one_call_parts(budget, tests_by_hand, bench_by_hand), first),), "none"
    one = calls[0]
    sweep = calls[-1].parts[1]
    shell = {"LEASE_KIND": "short", "CALL2": second, "UNPACK_END": one.parts[0].end, "TESTS_END": one.parts[1].end,
             "BENCH_END": one.parts[2].end}
    lease = {"LEASE_MAIN_SWEEP_S": sweep.end - sweep.start - GRACE_S} if second == "main" else {}
    return Timeline(budget, "short", calls, shell, lease)


def one_call_parts(budget: int, tests_by_hand: int | None, bench_by_hand: int | None) -> tuple[int, int]:
    """The tests' and the benchmark's seconds when the lease is one call: what the call and the budget allow,
    shared in proportion to the plan's lengths (a length given by hand is kept; the other gets the rest)."""
    room = min(CALL_END_S, budget - RETURN_S) - UNPACK_S
    if tests_by_hand is not None and bench_by_hand is not None:
        return tests_by_hand, bench_by_hand
    if tests_by_hand is not None:
        return tests_by_hand, max(0, room - tests_by_hand)
    if bench_by_hand is not None:
        return max(0, room - bench_by_hand), bench_by_hand
    tests_s = room * TESTS_S // (TESTS_S + BENCH_S)
    return tests_s, room - tests_s


LEFT_PLACEHOLDER = "LEASE_LEFT_S=<budget_left_s of the last reply, less the seconds until this call is sent>"


def exports(budget: int, tests_by_hand: int | None = None, bench_by_hand: int | None = None, left: bool = False) -> str:
    """The `export ...; ` a call's command starts with: every value the plan was made from, and for a call after
    the first (`left`) the LEASE_LEFT_S the operator fills in from the last reply (the plan cannot know it)."""
    chosen = [f"LEASE_TESTS_S={tests_by_hand}"] * (tests_by_hand is not None) + \
        [f"LEASE_BENCH_S={bench_by_hand}"] * (bench_by_hand is not None) + [LEFT_PLACEHOLDER] * left
    return f"export {' '.join([f'LEASE_BUDGET_S={budget}', *chosen])}; "


def main_seconds(budget: int, call1_s: int) -> int:
    """How long call 2 may run when call 1 takes call1_s: to the budget's end less the returns, within one call."""
    return min(CALL_END_S, budget - RETURN_S - call1_s - GAP_S)


def long_lease(budget: int) -> Timeline:
    """The 30-minute lease: `first`, `study` (benchmark, a sweep until its deadline), `finish`."""
    export = exports(budget)
    unpack = Part("unpack", 0, UNPACK_S, ".lease checked and unpacked, image.txt, the imports")
    tests = Part("tests", unpack.end, unpack.end + LONG_TESTS_S, "pytest -m gpu: collected, then run")
    one = Call(1, f"{export}bash benchmarks/gpu_lease.sh first", (unpack, tests))
    start = one.end + GAP_S
    study_end = budget - LONG_STUDY_MARGIN_S
    bench = Part("bench", start, start + LONG_BENCH_S, "throughput.py, every mode, profiled")
    plan = Part("plan", bench.end, bench.end + PLAN_S, "benchmarks/lease/plan.py")
    wait = Part("sweep", plan.end, start + CALL_END_S - COLLECT_S,
                f"sweep.py in the background, --deadline t0+{study_end}; this call waits")
    two = Call(2, f"{exports(budget, left=True)}bash benchmarks/gpu_lease.sh study",
               (bench, plan, wait, Part("collect", wait.end, start + CALL_END_S, "rows so far")))
    start = two.end + GAP_S
    end = min(start + CALL_END_S, budget - RETURN_S)
    three = Call(3, f"{exports(budget, left=True)}bash benchmarks/gpu_lease.sh finish",
                 (Part("wait", start, end - COLLECT_S, "the sweep runs on"),
                  Part("collect", end - COLLECT_S, end, "rows, curves, figure")))
    shell = {"LEASE_KIND": "long", "CALL2": "study", "UNPACK_END": unpack.end, "TESTS_END": tests.end,
             "BENCH_S": LONG_BENCH_S, "STUDY_END_S": study_end}
    return Timeline(budget, "long", (one, two, three), shell, {"LEASE_STUDY_PLAN_S": study_end - plan.start})


def timeline(budget: int, tests_by_hand: int | None = None, bench_by_hand: int | None = None) -> Timeline:
    if budget >= LONG_FROM_S:
        return long_lease(budget)
    return short_lease(budget, tests_by_hand, bench_by_hand)


def scaled(plan: Timeline, scale: float) -> Timeline:
    """Every time of the plan times `scale`, in whole seconds (at least 1 for a duration)."""
    if scale == 1:
        return plan

    def at(t: int) -> int:
        return round(t * scale)

    def part(p: Part) -> Part:  # a part keeps at least a second, a skipped one (0 s) none
        return replace(p, start=at(p.start), end=at(p.end) if p.end == p.start else max(at(p.end), at(p.start) + 1))

    calls = tuple(replace(call, parts=tuple(part(p) for p in call.parts)) for call in plan.calls)
    shell = {k: (max(1, at(v)) if isinstance(v, int) else v) for k, v in plan.shell.items()}
    return Timeline(at(plan.budget), plan.kind, calls, shell, plan.lease)


def shell_values(plan: Timeline, scale: float) -> dict[str, int | str]:
    """Every number gpu_lease.sh runs with: the plan's part ends and the constants, scaled alike."""
    def at(t: int) -> int:
        return max(1, round(t * scale))

    constants = {"BUDGET_S": plan.budget, "CALL_END_S": CALL_END_S, "RETURN_S": RETURN_S, "START_S": START_S,
                 "UNPACK_S": UNPACK_S,
                 "PLAN_S": PLAN_S, "COLLECT_S": COLLECT_S, "GRACE_S": GRACE_S, "QUICK_GRACE_S": QUICK_GRACE_S, "TEST_TIMEOUT_S": TEST_TIMEOUT_S,
                 "TEST_COLLECT_S": TEST_COLLECT_S,
                 "GROUP_TWO_EPOCHS_S": GROUP_TWO_EPOCHS_S}
    return {**{k: at(v) for k, v in constants.items()}, **scaled(plan, scale).shell, **plan.lease}


def render(plan: Timeline) -> str:
    """The timeline as `gpu_lease.sh budget` prints it: each call's start, end and parts from t0."""
    calls = len(plan.calls)
    lines = [f"GPU lease of {plan.budget} s from t0 (the first call's start; the lend less the machine's start): "
             f"{plan.kind} path, {calls} call{'s' * (calls > 1)}; each call ends by {CALL_END_S} s of its own (the "
             f"device tool's limit is {CALL_LIMIT_S} s; {CALL_MARGIN_S} s kept), each part is cut at its end"]
    for call in plan.calls:
        if call.number > 1:
            lines.append(f"gap: t0+{call.start - GAP_S} -> t0+{call.start} ({GAP_S} s: files back, the next call "
                         f"sent; the machine waits only 30 s)")
        lines.append(f"call {call.number}: t0+{call.start} -> t0+{call.end} s ({call.end - call.start} s)   "
                     f"{call.command}")
        lines += [f"  {p.name:<8} t0+{p.start:<4} -> t0+{p.end:<4} {p.what if p.end > p.start else 'skipped (0 s)'}"
                  for p in call.parts]
    last = plan.calls[-1].end
    lines.append(f"back: t0+{last} -> t0+{last + RETURN_S} ({RETURN_S} s: the last files back, give_back); "
                 f"{plan.budget - last - RETURN_S} s of the budget unused")
    if plan.shell.get("CALL2") == "none":
        lines.append(f"no call 2: under {MAIN_MIN_S} s would be left for the main job after the tests and the benchmark")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("budget", help="LEASE_BUDGET_S: seconds from t0 until the machine goes back")
    parser.add_argument("--shell", action="store_true", help="print NAME=VALUE lines for gpu_lease.sh")
    args = parser.parse_args(argv)
    try:
        plan = timeline(parse_budget(args.budget), parse_part("LEASE_TESTS_S", os.environ.get("LEASE_TESTS_S")),
                        parse_part("LEASE_BENCH_S", os.environ.get("LEASE_BENCH_S")))
        scale = parse_scale(os.environ.get("LEASE_TIME_SCALE", "1"))
    except BudgetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.shell:
        print("\n".join(f"{k}={v}" for k, v in shell_values(plan, scale).items()))
    else:
        print(render(scaled(plan, scale)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
