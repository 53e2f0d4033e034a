"""Per-trial overhead of the sweep runner: the same sweep of many tiny trials, a fresh worker
process per trial (`--no-reuse`, the old behaviour) against reused workers (the default).

    .venv/bin/python benchmarks/sweep_overhead.py                      # 100 tiny kernel_mse trials
    .venv/bin/python benchmarks/sweep_overhead.py --task train --trials 40 --modes reuse

Each mode runs the whole sweep through `rpevit.sweep.runner` on its own embedded Ray, in a fresh
results folder. Printed per mode: wall time of the Tune run (Tuner.fit), the summed in-trial time
(finished_at - started_at of every trial), the trials that ran at once (`slots`), and

    overhead per trial = (wall x slots - summed in-trial time) / trials,

the slot-seconds a trial costs outside its task (worker start-up, Tune's bookkeeping, reporting,
idle slots), then the ratio fresh / reused. `start-up` is the part before the first trial started
(the first workers importing torch, Tune setting up), `after start-up` the overhead per trial
without it: what each further trial adds. `total` adds Ray's own start and shutdown (once per
sweep). Run it on an otherwise idle machine: the figures are wall-clock times.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from rpevit.analysis.common import write_text_file
from rpevit.sweep.runner import SweepOptions, execute_sweep
from rpevit.sweep.summary import SweepOutcome
from rpevit.sweep.space import Space, expand_space

MODES = {"fresh": False, "reuse": True}  # mode -> SweepOptions.reuse
TASKS: dict[str, dict[str, Any]] = {  # tiny trials: milliseconds (kernel_mse) or about a second (train)
    "kernel_mse": {"task": "kernel_mse", "kmse_dim": 8, "kmse_features": 8, "kmse_draws": 200},
    "train": {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 200, "epochs": 1,
              "batch_size": 50, "eval_draws": 0},
}


def tiny_space(task: str, trials: int, cpus: float, mode: str) -> Space:
    """`trials` distinct tiny trials of `task` (one per seed)."""
    return expand_space({"name": f"overhead_{task}_{mode}", "fixed": TASKS[task], "grid": {"seed": list(range(trials))},
                         "resources": {"cpus_per_trial": cpus}}, source=f"sweep_overhead ({task})")


def measure(task: str, trials: int, cpus: float, mode: str, results_dir: Path) -> tuple[SweepOutcome, float]:
    """(the runner's outcome, total seconds including Ray's start and shutdown)."""
    opts = SweepOptions(results_dir=results_dir, dashboard=False, reuse=MODES[mode], progress_every_s=1e9)
    t0 = time.time()
    outcome = execute_sweep(tiny_space(task, trials, cpus, mode), opts)
    total = time.time() - t0
    if outcome.exit_code != 0 or outcome.trials_ran != trials:
        raise SystemExit(f"mode {mode}: the sweep did not finish cleanly ({outcome}); see {results_dir}")
    return outcome, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(TASKS), default="kernel_mse")
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--cpus-per-trial", type=float, default=1.0)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--results-dir", type=Path, default=None, help="default: a new folder under the temp dir")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = p.parse_args()
    results_dir = args.results_dir or Path(tempfile.mkdtemp(prefix="sweep_overhead_"))
    figures: dict[str, dict[str, float]] = {}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for mode in args.modes:
        print(f"--- {mode}: {args.trials} {args.task} trials ---", flush=True)
        outcome, total = measure(args.task, args.trials, args.cpus_per_trial, mode, results_dir)
        figures[mode] = {"wall_s": outcome.wall_s, "in_trial_s": outcome.trial_s, "slots": outcome.slots,
                         "overhead_s_per_trial": outcome.overhead_s_per_trial, "startup_s": outcome.startup_s,
                         "steady_overhead_s_per_trial": outcome.steady_overhead_s_per_trial, "total_s": total}
    print(f"\nsweep overhead: {args.trials} tiny {args.task} trials, {args.cpus_per_trial:g} CPU each, on "
          f"{socket.gethostname()} ({os.cpu_count()} CPUs); load average before: {load}")
    print(f"{'mode':<8} {'slots':>5} {'wall s':>8} {'in-trial s':>10} {'overhead s/trial':>16} {'start-up s':>10} "
          f"{'after start-up s/trial':>22} {'total s':>8}")
    for mode, f in figures.items():
        print(f"{mode:<8} {f['slots']:>5} {f['wall_s']:>8.1f} {f['in_trial_s']:>10.1f} "
              f"{f['overhead_s_per_trial']:>16.3f} {f['startup_s']:>10.1f} {f['steady_overhead_s_per_trial']:>22.3f} "
              f"{f['total_s']:>8.1f}")
    if set(figures) == set(MODES):
        ratio = figures["fresh"]["overhead_s_per_trial"] / figures["reuse"]["overhead_s_per_trial"]
        print(f"overhead per trial, fresh / reused: {ratio:.1f}x; wall, fresh / reused: "
              f"{figures['fresh']['wall_s'] / figures['reuse']['wall_s']:.1f}x")
    if args.json:  # atomic and never through a link (write_text_file: one line where a link is there)
        write_text_file(args.json, json.dumps({"task": args.task, "trials": args.trials, **figures}, indent=1))


if __name__ == "__main__":
    main()
