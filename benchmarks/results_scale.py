"""How the results layer scales with the sweep (issue 42): the driver's cost per trial end and the
analysis report's time against the number of rows, with their growth exponents.

    PYTHONPATH=. .venv/bin/python benchmarks/results_scale.py                    # 10^3 .. 10^5 epoch rows
    PYTHONPATH=. .venv/bin/python benchmarks/results_scale.py --epoch-rows 1000 10000 100000 1000000

Rows are the committed MNIST study (results/mnist_converged_cpu: 153 trials, 10 epoch rows each)
replicated with new seeds (so new trial keys, as a longer sweep of the same space would have) to
the sizes asked (epoch rows; a tenth as many trials). For each size, in a fresh folder:

1. the sweep so far: every trial's rows go through the REAL driver callback
   (rpevit.sweep.writer.ParquetResults: queued as on_trial_result queues them, then its flush path
   (rows -> Arrow parts; a few large flushes, to reach the size in seconds);
2. `--trials-timed` more trial ends at that size, each exactly as Tune drives the callback: 10
   on_trial_result epoch reports and the summary report that flushes (parts written, tiered merges).
   Printed: the mean and the worst wall time of one trial end (all 11 callbacks); then as many
   trial ends again under tracemalloc: the memory the driver keeps per finished trial;
3. the end of the Tuner run (writer.finish: the store compacted into trials.parquet / epochs.parquet);
4. `python analysis/report.py` over a parent folder holding the study (a subprocess: imports and
   figures included, as a user runs it).

The exponent is the slope of log(time) against log(epoch rows), fitted by least squares over the
sizes. Wall-clock times: say whether the machine was otherwise idle.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from rpevit.config import field_types
from rpevit.sweep import migrate, store
from rpevit.sweep.protocol import EPOCH, SUMMARY, Report
from rpevit.sweep.results import EPOCHS_FILE, SPACE_FILE, TRIALS_FILE
from rpevit.sweep.space import seeded_keys
from rpevit.sweep.writer import ParquetResults

REPO = Path(__file__).resolve().parent.parent
STUDY = REPO / "results" / "mnist_converged_cpu"
PREFILL_FLUSHES = 8  # the sweep so far is written in this many flushes


def study_rows() -> tuple[list[dict], dict[str, list[dict]]]:
    """The committed study: its ok trial rows, and each trial's epoch rows by trial_key."""
    trials = [r for r in pq.read_table(STUDY / TRIALS_FILE).to_pylist() if r["status"] == "ok"]
    epochs: dict[str, list[dict]] = {}
    for row in pq.read_table(STUDY / EPOCHS_FILE).to_pylist():
        epochs.setdefault(row["trial_key"], []).append(row)
    return [t for t in trials if t["trial_key"] in epochs], epochs


def replicated(trials: list[dict], epochs: dict[str, list[dict]], count: int
               ) -> list[tuple[str, dict, dict, list[dict]]]:
    """`count` trials: (key, config, summary row, epoch rows), the study's trials again with seeds
    beyond theirs (replica r: seed + 1000 r), keys as sweep.py makes them (rpevit.sweep.space)."""
    names = set(field_types())
    out = []
    replicas = math.ceil(count / len(trials))
    for row in trials:
        config = migrate.resolved_config(row)
        seeds = [int(config["seed"]) + 1000 * r for r in range(replicas)]
        for seed, key in zip(seeds, seeded_keys(config, seeds)):
            values = {k: v for k, v in row.items() if k in names}
            values["seed"] = seed
            summary = {**row, **values, "trial_key": key}
            for drop in ("sweep", "trial_index", "status", "error", "error_traceback", "tune_trial_id"):
                summary.pop(drop, None)
            out.append((key, values, summary, [{**e, "trial_key": key} for e in epochs[row["trial_key"]]]))
    out.sort(key=lambda t: (t[1]["seed"], t[0]))  # replica by replica, as a sweep would add seeds
    return out[:count]


def end_trial(writer: ParquetResults, key: str, epoch_reports: list[dict], summary_report: dict) -> None:
    """One trial's reports, as Tune hands them to the driver's callback: its epochs, then its summary."""
    trial = SimpleNamespace(trial_id=f"t-{key}")
    for result in epoch_reports:
        writer.on_trial_result(0, [], trial, result)
    writer.on_trial_result(0, [], trial, summary_report)


def one_size(parent: Path, epoch_rows: int, timed: int, trials: list[dict], epochs: dict[str, list[dict]]
             ) -> dict[str, float]:
    prefill = max(epoch_rows // 10 - 2 * timed, 1)  # then `timed` trial ends timed, `timed` more traced
    chosen = replicated(trials, epochs, prefill + 2 * timed)
    folder = parent / STUDY.name
    keys = [c[0] for c in chosen]
    (folder).mkdir(parents=True)
    (folder / SPACE_FILE).write_text(json.dumps({"name": STUDY.name, "source": "benchmark",
                                                 "key_scheme": migrate.KEY_SCHEME, "trial_keys": keys}))
    configs = {key: values for key, values, _, _ in chosen}
    order = {k: i for i, k in enumerate(keys)}
    writer = ParquetResults(folder, STUDY.name, configs, order, task="train")
    t0 = time.perf_counter()
    step = math.ceil(prefill / PREFILL_FLUSHES)
    for start in range(0, prefill, step):  # the sweep so far, through the writer's queue and flush path
        for key, _, summary, history in chosen[start:min(start + step, prefill)]:
            for row in history:
                writer._add_epoch(key, row)
            writer._add_trial({"sweep": STUDY.name, **summary, "trial_key": key, "status": "ok", "error": "",
                               "error_traceback": "", "tune_trial_id": f"t-{key}"})
        writer.flush()
    prefill_s = time.perf_counter() - t0

    reports = [(key, [Report(EPOCH, key, row).to_tune() for row in history], Report(SUMMARY, key, summary).to_tune())
               for key, _, summary, history in chosen[prefill:]]
    trial_count = len(chosen)
    del chosen, configs  # the generated rows are this benchmark's, not the driver's: Python's GC would walk them
    gc.collect()
    costs = []
    for key, epoch_reports, summary_report in reports[:timed]:  # trial ends at this size, as Tune calls the callback
        t = time.perf_counter()
        end_trial(writer, key, epoch_reports, summary_report)
        costs.append(time.perf_counter() - t)
    gc.collect()
    tracemalloc.start()  # what the driver keeps per finished trial (not timed: tracing slows Python down)
    before = tracemalloc.get_traced_memory()[0]
    for key, epoch_reports, summary_report in reports[timed:]:
        end_trial(writer, key, epoch_reports, summary_report)
    gc.collect()
    kept_per_trial = (tracemalloc.get_traced_memory()[0] - before) / (len(reports) - timed) / 2**20
    tracemalloc.stop()

    t = time.perf_counter()
    writer.on_experiment_end([])  # the Tuner run ends: the store compacted
    finish_s = time.perf_counter() - t
    stored = pq.read_metadata(folder / EPOCHS_FILE).num_rows, pq.read_metadata(folder / TRIALS_FILE).num_rows
    assert stored == (10 * trial_count, trial_count), stored  # every row once

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    subprocess.run([sys.executable, str(REPO / "analysis" / "report.py"), str(parent)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report_s = time.perf_counter() - t
    return {"epoch_rows": stored[0], "trials": stored[1], "prefill_s": prefill_s,
            "trial_end_ms": 1000 * float(np.mean(costs)), "worst_ms": 1000 * float(np.max(costs)),
            "mb_per_trial": kept_per_trial, "finish_s": finish_s, "report_s": report_s}


def exponent(sizes: list[float], times: list[float]) -> float:
    """Least-squares slope of log(time) on log(size)."""
    return float(np.polyfit(np.log(sizes), np.log(times), 1)[0]) if len(sizes) > 1 else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epoch-rows", type=int, nargs="+", default=[1_000, 10_000, 100_000],
                        help="sizes of the sweep in epoch rows (10 per trial)")
    parser.add_argument("--trials-timed", type=int, default=64, help="trial ends timed at each size")
    parser.add_argument("--keep", type=Path, help="leave the generated folders under this path")
    args = parser.parse_args()
    trials, epochs = study_rows()
    rows = []
    print("| epoch rows | trials | driver ms per trial end (mean / worst) | driver MB per trial | compaction s "
          "| report.py s |", flush=True)
    print("|---|---|---|---|---|---|", flush=True)
    for size in args.epoch_rows:
        parent = Path(tempfile.mkdtemp(prefix=f"results_scale_{size}_", dir=args.keep))
        try:
            r = one_size(parent / "results", size, args.trials_timed, trials, epochs)
        finally:
            if args.keep is None:
                shutil.rmtree(parent, ignore_errors=True)
        rows.append(r)
        print(f"| {r['epoch_rows']:,} | {r['trials']:,} | {r['trial_end_ms']:.1f} / {r['worst_ms']:.1f} "
              f"| {r['mb_per_trial']:.3f} | {r['finish_s']:.2f} | {r['report_s']:.1f} |", flush=True)
    sizes = [r["epoch_rows"] for r in rows]
    print(f"growth exponent (log time / log epoch rows): driver per trial end "
          f"{exponent(sizes, [r['trial_end_ms'] for r in rows]):.2f}, report.py "
          f"{exponent(sizes, [r['report_s'] for r in rows]):.2f}; peak RSS of this process (generated rows included) "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
