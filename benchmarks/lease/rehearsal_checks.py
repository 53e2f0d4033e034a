"""What benchmarks/gpu_rehearsal.sh requires of the files a rehearsed call brought back.

    python benchmarks/lease/rehearsal_checks.py bench OUT/throughput.json   # the short lease's benchmark
    python benchmarks/lease/rehearsal_checks.py plan OUT/lease_plan.txt     # the main call's plan

Exit 0 and one line when the file is what the lease needs, else exit 1 naming each problem. Here rather
than inline in the shell script so that the rules are tested (tests/test_lease_timeline.py) and read once.

- bench: the short lease asks whether packed processes gain over one process, without and with MPS (the
  question the 2026-11-27 lease left open, and the packed rate call 2's plan uses), so its benchmark runs
  the packed processes first (`--modes packed mps fused whole ...`, gpu_lease.sh run_bench; no MPS on a
  CPU), then the fused group and the same group with the whole step in one graph, before any solo mode;
  every mode measured a rate; the two fused modes, and only they, are profiled.
- plan: benchmarks/lease/plan.py admitted at least one whole group, and its last line is what
  gpu_lease.sh reads (`EPOCHS SECONDS`).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

PLAN_LINE = re.compile(r"lease plan: (\d+) of (\d+) fused group\(s\) of \d+ fit")


def bench_problems(data: dict) -> list[str]:
    """What is wrong with a short lease's benchmark file (benchmarks/throughput.py --json), if anything."""
    models = data.get("models") or {}
    if len(models) != 1:
        return [f"one model expected, found {sorted(models)}"]
    rows = next(iter(models.values())).get("rows") or []
    modes = [str(r.get("mode", "?")) for r in rows]
    problems = []
    packed = [i for i, m in enumerate(modes) if " packed processes, fused k=" in m]
    fused = [i for i, m in enumerate(modes) if m.startswith("fused k=") and "whole step in one graph" not in m]
    whole = [i for i, m in enumerate(modes) if m.startswith("fused k=") and "whole step in one graph" in m]
    solo = [i for i, m in enumerate(modes) if m.startswith("solo")]
    if not (packed and packed[0] == 0 and fused and whole and max(packed) < fused[0] < whole[0]
            and all(whole[0] < i for i in solo)):
        problems.append("the packed processes must come first, then the fused group and the same group with the "
                        f"whole step in one graph, before any solo mode; the order was {modes}")
    failed = [f"{r.get('mode')}: {r.get('error')}" for r in rows if "images_per_s" not in r]
    if failed:
        problems.append(f"modes without a rate: {failed}")
    profiled = [m for m, r in zip(modes, rows) if r.get("profile")]
    if profiled != [modes[i] for i in fused[:1] + whole[:1]]:
        problems.append(f"only the two fused modes are profiled; profiled were {profiled}")
    return problems


def plan_problems(text: str) -> list[str]:
    """What is wrong with plan.py's output for a main call, if anything."""
    match = PLAN_LINE.search(text)
    if match is None:
        return ["no `lease plan: N of M fused group(s) ... fit` line"]
    problems = [] if int(match.group(1)) >= 1 else [f"the plan admits no group: {match.group(0)}"]
    last = text.strip().splitlines()[-1].split()
    if len(last) != 2 or not last[0].isdigit():
        problems.append(f"its last line is not `EPOCHS SECONDS`: {' '.join(last)!r}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("bench", "plan"):
        print("usage: rehearsal_checks.py bench THROUGHPUT_JSON | plan LEASE_PLAN_TXT", file=sys.stderr)
        return 2
    kind, path = argv[0], Path(argv[1])
    try:
        text = path.read_text()
        problems = bench_problems(json.loads(text)) if kind == "bench" else plan_problems(text)
    except (OSError, ValueError) as err:
        problems = [f"{path} unreadable: {type(err).__name__}: {err}"]
    for problem in problems:
        print(f"error: {kind}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{kind}: {path} is what the lease needs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
