"""The lease's study plan: which whole fused groups of a space fit before the lease's deadline.

    python benchmarks/lease/plan.py --deadline-s 840 --throughput throughput.json [SWEEP FLAGS]
    python benchmarks/lease/plan.py --exact --space search_spaces/cifar10_rungs_gpu.yaml --only epochs=3 ...

Chooses the longest budget (epochs, from EPOCH_LADDER, at most the space's) at which every group of
the space ends before the deadline, else the shortest, at which some do; prints the plan and, on the
last line, `EPOCHS SECONDS`: the budget (`--set epochs=EPOCHS`) and `--deadline-estimate` (seconds per
epoch of one Tune trial, what sweep.py plans with). The plan is rpevit.sweep.deadline's, the one
sweep.py makes, given the lease's real deadline and slots (4 fused groups per GPU). Exits 2, naming
why, when it admits nothing, so that a lease never launches a sweep that would start no group.

`--exact` (a declared study's rung, gpu_lease.sh rung): the budget is the space's own, never a shorter
one (a shorter budget is not the declared rung), and the plan exits 2 unless EVERY group fits before the
deadline, naming how many do and what would fit (a part of the rung, e.g. `--only attention=softmax`).

The estimate: a fused group of k members trains k x n_train images per epoch at a quarter of the
measured rate of four packed processes of compiled fused groups (benchmarks/throughput.py's row, on
the GPU protocol's CIFAR-10 model, which costs more per image than the MNIST model: an over-estimate),
plus the validation pass and the compilation spread over the epochs. Without a measured rate (the
benchmark failed, or a CPU rehearsal) the fallback is the eager solo rate the first H100 lease
measured for that model (4,700 images/s, issue 40), divided by 4 for the packing: pessimistic too.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rpevit.config import ConfigError  # noqa: E402
from rpevit.sweep import deadline as deadlines  # noqa: E402
from rpevit.sweep.launch_plan import deadline_units, tune_trials  # noqa: E402 (no Ray: the planner)
from rpevit.sweep.space import load_space, parse_overrides  # noqa: E402

FALLBACK_IMAGES_PER_S = 4700.0  # solo eager, GPU protocol CIFAR-10 model, H100 (the first lease)
PACKED_ROW = "4 packed processes, fused k=3 + compiled"  # benchmarks/throughput.py's mode name
PACKED_MODE = re.compile(r"4 packed processes, fused k=(\d+) \+ compiled")  # the same, of any k; not under MPS
FUSED_MODE = re.compile(r"fused k=(\d+) \+ compiled \((\w+)\)")  # one process of one fused group (a short lease's row)
COMPILE_S = 90.0  # one compilation of a fused group's step (forward + backward), once per batch shape
VALIDATION_S = 3.0  # one epoch's validation and fidelity pass
EPOCH_LADDER = (30, 20, 15, 10, 8, 6, 5, 4, 3, 2, 1)  # budgets tried, longest first, up to the space's own
TRAIN_IMAGES = {"mnist": 60_000, "cifar10": 50_000, "cifar100": 50_000, "digits": 1_797}  # before validation


def measured_rate(path: Path | None, members: int = 3, compile_mode: str | None = None) -> tuple[float, str]:
    """Images/s of ONE of four packed compiled fused groups of `members`, and where the figure comes from.

    The benchmark packs groups of k = 3 (the long lease) or k = 5 (the short one, whose question is k = 5
    with and without MPS). A row of k > members is scaled by members / k: a launch-bound step takes about
    as long for k members as for fewer, so a smaller group trains at least that fraction of the images
    (the H100: k = 3 at 0.78 of k = 5's rate, above 3/5): pessimistic, as the fallback is. The row under
    MPS is not used: the sweep's packed trials run without it.

    A file without a packed row (the 2026-11-27 lease measured one fused process only) gives the rate of
    one fused process / 4: four groups sharing the GPU are assumed to gain nothing over one process, which
    is pessimistic (packing added 10% on the H100 and 2.1x under `compile: on` on the H200, 2026-11-26).
    Where rows of several compile modes exist, the space's own mode (`compile_mode`) is preferred; a rate
    of another mode is used and said to be one."""
    fallback = FALLBACK_IMAGES_PER_S / 4, f"fallback {FALLBACK_IMAGES_PER_S:g} images/s / 4"
    if path is None:
        return fallback[0], f"{fallback[1]} (no benchmark figure given)"
    try:
        rows = json.loads(Path(path).read_text())["models"]["gpu"]["rows"]
    except (OSError, KeyError, TypeError, ValueError) as err:
        return fallback[0], f"{fallback[1]} ({path} unreadable: {type(err).__name__})"
    rated = [row for row in rows if isinstance(row, dict) and isinstance(row.get("mode"), str)
             and isinstance(row.get("images_per_s"), (int, float)) and row["images_per_s"] > 0]
    for pattern, shared in ((PACKED_MODE, ""), (FUSED_MODE, " (one process's rate shared by 4 groups: packing "
                                                            "assumed to add nothing)")):
        found = sorted((row.get("compile") != compile_mode if compile_mode else False,
                        abs(int(match.group(1)) - members), int(match.group(1)), i)
                       for i, row in enumerate(rated) if (match := pattern.fullmatch(row["mode"])))
        if found:
            _, _, k, i = found[0]  # the space's compile mode first, then the group size nearest the space's
            row = rated[i]
            rate, text = row["images_per_s"] / 4, f"{path}: {row['mode']} / 4{shared}"
            if k > members:
                rate, text = rate * members / k, f"{text} x {members}/{k}"
            if compile_mode and row.get("compile") not in (None, compile_mode):
                text += f"; measured with compile {row['compile']}, the space runs compile {compile_mode}"
            return rate, text
    return fallback[0], f"{fallback[1]} ({path} has no '{PACKED_ROW}' row (nor one of another k) with a rate)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(ROOT / "search_spaces" / "all12.yaml"))
    parser.add_argument("--deadline-s", type=float, required=True, help="seconds from now to the lease's deadline")
    parser.add_argument("--throughput", default=None, help="benchmarks/throughput.py's JSON from this lease")
    parser.add_argument("--slots", type=int, default=4, help="Tune trials at once (4 x 0.25 GPU)")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--exact", action="store_true",
                        help="the space's own budget only (a declared rung): exit 2 unless every group fits")
    args = parser.parse_args()
    try:
        space = load_space(args.space, parse_overrides(args.set), only=parse_overrides(args.only, "--only"))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    specs = tune_trials(space, space.trials, list(range(len(space.trials))), checkpoint_root=Path("/nonexistent"),
                        cpus=1, gpus=0.25, reserved_cpus=0.0)
    members = max(len(spec.members) for spec in specs)
    first = space.trials[0]
    rate, source = measured_rate(Path(args.throughput) if args.throughput else None, members, first.get("compile"))
    n_train = round(TRAIN_IMAGES[first["dataset"]] * (1 - first["val_fraction"]))
    budgets = sorted({int(t["epochs"]) for t in space.trials})
    if args.exact and len(budgets) > 1:
        print(f"error: --exact plans one declared budget; the space has epochs {', '.join(map(str, budgets))}; "
              f"allowed: one of them with --only epochs=N", file=sys.stderr)
        return 2
    ladder = [budgets[0]] if args.exact else [e for e in EPOCH_LADDER if e <= int(first["epochs"])] or [int(first["epochs"])]
    now = time.time()
    for epochs in ladder:  # the longest budget at which every group fits, else the shortest, partly
        per_epoch = members * n_train / rate + VALIDATION_S + COMPILE_S / epochs
        units = [deadlines.Unit(tuple((key, {**cfg, "epochs": epochs}) for key, cfg in unit.members), unit.kind)
                 for unit in deadline_units(specs)]
        estimator = deadlines.Estimator([], space.task, has_epochs=True, fallback_s=per_epoch)
        plan = deadlines.plan_units(units, estimator, slots=args.slots, now=now,
                                    deadline=deadlines.Deadline(now + args.deadline_s),
                                    checkpoint_root=Path("/nonexistent"), probe=False)
        if not plan.left:
            break
    print(f"lease plan: {len(plan.admitted)} of {len(units)} fused group(s) of {members} fit in "
          f"{args.deadline_s / 60:.1f} min on {args.slots} slots at {epochs} epochs; {per_epoch:.1f} s per epoch "
          f"of a group ({members} x {n_train} images at {rate:,.0f} images/s, {source}; + {VALIDATION_S:g} s "
          f"validation, + {COMPILE_S:g} s compile / {epochs} epochs)"
          + (f"; the last ends {(plan.finish_at - now) / 60:.1f} min from now" if math.isfinite(plan.finish_at) else ""))
    if args.exact and plan.left:
        print(f"error: the rung epochs={epochs} needs every group before the deadline; {len(plan.admitted)} of "
              f"{len(units)} fit in {args.deadline_s:.0f} s; allowed: a later deadline, a faster measured rate, or "
              f"a part of the rung that fits (e.g. --only attention=softmax, then attention=favor in another lease)",
              file=sys.stderr)
        return 2
    if not plan.admitted:
        print("error: the plan admits no group even at 1 epoch: a later deadline", file=sys.stderr)
        return 2
    print(f"{epochs} {per_epoch:.2f}")  # what gpu_lease.sh reads: --set epochs=E, --deadline-estimate S
    return 0


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool  # the teardown can abort (rpevit/tool_exit.py)

    run_tool(main)
