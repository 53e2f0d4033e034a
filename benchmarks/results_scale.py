"""How the results layer scales with the sweep (issue 42): the driver's cost per trial end and the
analysis report's time against the number of rows, with their growth exponents.

    PYTHONPATH=. .venv/bin/python benchmarks/results_scale.py                    # 10^3 .. 10^5 epoch rows
    PYTHONPATH=. .venv/bin/python benchmarks/results_scale.py --epoch-rows 1000 10000 100000 1000000 \
        --baseline-rev 22166eb                                                    # and the old writer

Rows are the committed MNIST study (results/mnist_converged_cpu: 153 trials, 10 epoch rows each)
replicated with new seeds (so new trial keys, as a longer sweep of the same space would have) to
the sizes asked (epoch rows; a tenth as many trials). For each size, in a fresh folder:

1. the sweep so far, laid out as the store holds it after that many trial ends (one flush each):
   the parts a tiered merge leaves (rpevit.sweep.store: for each level l, the base-F digit l of the
   flush count gives the parts of F^l flushes each), written as Arrow parts of the real schema. (An
   earlier version wrote the sweep so far in 8 large flushes; they merged into one part of the whole
   size, which the next small parts of its level then merged with: a rewrite of every row inside
   the timed window that a sweep growing one trial at a time does only once per F^levels flushes);
2. `--trials-timed` more trial ends at that size, each exactly as Tune drives the callback: 10
   on_trial_result epoch reports and the summary report that flushes (parts written, tiered merges).
   Printed: the mean and the worst wall time of one trial end (all 11 callbacks), and the largest
   merge the window did (in flushes: F^level); then as many trial ends again under tracemalloc: the
   memory the driver keeps per finished trial;
3. the end of the Tuner run (writer.finish: the store compacted into trials.parquet / epochs.parquet);
4. `python analysis/report.py` over a parent folder holding the study (a subprocess: imports and
   figures included, as a user runs it);
5. with `--baseline-rev REV` (sizes up to `--baseline-max`): the writer of commit REV (22166eb: the
   writer before the store, which rewrote both files at every flush) run side by side in the same
   run: its tree is extracted with `git archive` into a temporary folder, and a subprocess
   (benchmarks/results_scale_probe.py with that tree first on PYTHONPATH) opens a copy of the
   compacted folder with REV's ParquetResults and times `--baseline-trials` trial ends driven the
   same way. The ratio old / new is printed per size.

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
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import pyarrow.parquet as pq

from rpevit.config import field_types
from rpevit.sweep import migrate, store
from rpevit.sweep.protocol import EPOCH, SUMMARY, Report
from rpevit.sweep.results import EPOCHS_FILE, SPACE_FILE, TRIALS_FILE, atomic_file, to_table, write_table_atomic
from rpevit.sweep.space import seeded_keys
from rpevit.sweep.writer import ParquetResults

REPO = Path(__file__).resolve().parent.parent
STUDY = REPO / "results" / "mnist_converged_cpu"


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


def end_trial(writer: Any, key: str, epoch_reports: list[dict], summary_report: dict) -> None:
    """One trial's reports, as Tune hands them to the driver's callback: its epochs, then its summary."""
    trial = SimpleNamespace(trial_id=f"t-{key}")
    for result in epoch_reports:
        writer.on_trial_result(0, [], trial, result)
    writer.on_trial_result(0, [], trial, summary_report)


def trial_rows(batch: list[tuple[str, dict, dict, list[dict]]]) -> tuple[list[dict], list[dict]]:
    """The epoch rows and trial rows a batch of finished trials gives, as the writer queues them."""
    epoch_rows = [{"sweep": STUDY.name, **row, "trial_key": key} for key, _, _, history in batch for row in history]
    rows = [{"sweep": STUDY.name, **summary, "trial_key": key, "status": "ok", "error": "", "error_traceback": "",
             "tune_trial_id": f"t-{key}"} for key, _, summary, _ in batch]
    return epoch_rows, rows


def lay_out_sweep_so_far(folder: Path, schemas: dict[str, Any], chosen: list, flushes: int) -> None:
    """The parts the store holds after `flushes` trial ends of one flush each (chosen[:flushes], in
    order): the tiered merge (store.PartLog.merge_tail) leaves, for each level l, base-F digit l of
    the flush count in parts of F^l flushes, oldest and largest first. Written directly (a sweep of
    10^5 trial ends would take the benchmark as long as the sweep's own writing)."""
    fanin, level = store.MERGE_FANIN, 0
    while fanin ** (level + 1) <= flushes:
        level += 1
    done = 0
    for lvl in range(level, -1, -1):
        size = fanin ** lvl
        for _ in range((flushes // size) % fanin):
            epoch_rows, rows = trial_rows(chosen[done:done + size])
            for kind, kind_rows in ((EPOCHS_FILE, epoch_rows), (TRIALS_FILE, rows)):
                part = store.Part.named(folder, kind, lvl, done + 1, done + size)
                part.path.parent.mkdir(parents=True, exist_ok=True)
                write_table_atomic(to_table(kind_rows, schemas[kind]), part.path)
            done += size
    assert done == flushes, (done, flushes)


def counting_merges(log: store.PartLog) -> list[int]:
    """Wrap `log.merge_tail` to record the level of every part a merge writes (the benchmark's own
    bookkeeping; the store is unchanged)."""
    levels: list[int] = []
    merge_tail = log.merge_tail

    def counted(kind: str) -> None:
        before = {p.path for p in log.parts[kind]}
        merge_tail(kind)
        levels.extend(p.level for p in log.parts[kind] if p.path not in before)

    log.merge_tail = counted  # type: ignore[method-assign]
    return levels


def as_json_report(report: dict) -> dict:
    """A Tune result with datetimes as Unix seconds (what trials send; the study's rows read them back
    as datetimes), for the baseline probe."""
    row = {k: (v.timestamp() if isinstance(v, datetime) else v) for k, v in report["row"].items()}
    return {**report, "row": row}


def one_size(parent: Path, epoch_rows: int, timed: int, trials: list[dict], epochs: dict[str, list[dict]],
             baseline: Baseline | None) -> dict[str, float]:
    prefill = max(epoch_rows // 10 - 2 * timed, 1)  # then `timed` trial ends timed, `timed` more traced
    chosen = replicated(trials, epochs, prefill + 2 * timed)
    folder = parent / STUDY.name
    keys = [c[0] for c in chosen]
    (folder).mkdir(parents=True)
    write_json(folder / SPACE_FILE, {"name": STUDY.name, "source": "benchmark", "key_scheme": migrate.KEY_SCHEME,
                                     "trial_keys": keys})
    configs = {key: values for key, values, _, _ in chosen}
    order = {k: i for i, k in enumerate(keys)}
    writer = ParquetResults(folder, STUDY.name, configs, order, task="train")
    t0 = time.perf_counter()
    lay_out_sweep_so_far(folder, writer.schemas, chosen, prefill)
    writer.parts = store.PartLog(folder)  # the driver that wrote them: its list of live parts, read once
    prefill_s = time.perf_counter() - t0
    merged_levels = counting_merges(writer.parts)

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
    largest_merge = store.MERGE_FANIN ** max(merged_levels, default=0) if merged_levels else 0
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
    old_ms = math.nan
    if baseline is not None and stored[0] <= baseline.max_rows:
        old_ms = baseline_trial_end_ms(baseline.tree, folder, parent / "baseline", reports[:baseline.trials])
    return {"epoch_rows": stored[0], "trials": stored[1], "prefill_s": prefill_s,
            "trial_end_ms": 1000 * float(np.mean(costs)), "worst_ms": 1000 * float(np.max(costs)),
            "largest_merge": largest_merge, "mb_per_trial": kept_per_trial, "finish_s": finish_s,
            "report_s": report_s, "old_ms": old_ms}


class Baseline(NamedTuple):
    """The writer timed side by side: its extracted tree, the largest size it runs at, its trial ends."""
    tree: Path
    max_rows: int
    trials: int


def write_json(path: Path, value: Any) -> None:
    """`value` as JSON at `path` through rpevit's atomic_file: atomic and never through a symbolic link (one
    there is refused, LinkRefused, one line; what it points at is untouched)."""
    with atomic_file(path) as handle:
        handle.write(json.dumps(value).encode())


def check_rev(rev: str) -> str:
    """--baseline-rev goes to `git archive` as its tree-ish: one starting with '-' would be read as an option
    (`--output=/path` writes the archive anywhere), so it is refused in one line."""
    if not rev or rev.startswith("-"):
        sys.exit(f"--baseline-rev has value {rev!r}; allowed: a commit of this clone (a hash, tag or branch, not "
                 f"starting with '-'), e.g. 22166eb (the writer before the store)")
    return rev


def extract_tree(rev: str, into: Path) -> Path:
    """The `rpevit` package of commit `rev` of this repository, extracted (git archive) under `into`.
    `rev` is checked (check_rev) and passed after --end-of-options: never read as an option of git archive."""
    check_rev(rev)
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "--end-of-options", rev,
                                  "rpevit"],
                                 check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        detail = err.stderr.decode(errors="replace").strip() if isinstance(err, subprocess.CalledProcessError) else err
        sys.exit(f"--baseline-rev {rev!r}: cannot extract rpevit/ from this repository's history ({detail}); "
                 f"allowed: a commit of this clone, e.g. 22166eb (the writer before the store)")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def baseline_trial_end_ms(tree: Path, folder: Path, scratch: Path, reports: list) -> float:
    """The mean time of one trial end of `tree`'s ParquetResults on a copy of the compacted `folder`,
    in a subprocess whose `rpevit` is that tree's (benchmarks/results_scale_probe.py)."""
    copy = scratch / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("trials"))
    feed = scratch / "reports.json"
    write_json(feed, [[key, [as_json_report(r) for r in epoch_reports], as_json_report(summary)]
                      for key, epoch_reports, summary in reports])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)])}
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "results_scale_probe.py"), str(copy), str(feed)],
                         check=True, env=env, capture_output=True, text=True, cwd=scratch)
    shutil.rmtree(copy, ignore_errors=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["trial_end_ms"])


def exponent(sizes: list[float], times: list[float]) -> float:
    """Least-squares slope of log(time) on log(size)."""
    return float(np.polyfit(np.log(sizes), np.log(times), 1)[0]) if len(sizes) > 1 else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epoch-rows", type=int, nargs="+", default=[1_000, 10_000, 100_000],
                        help="sizes of the sweep in epoch rows (10 per trial)")
    parser.add_argument("--trials-timed", type=int, default=64, help="trial ends timed at each size")
    parser.add_argument("--keep", type=Path, help="leave the generated folders under this path")
    parser.add_argument("--baseline-rev", help="also time the writer of this commit side by side (22166eb: the "
                        "writer before the store)")
    parser.add_argument("--baseline-max", type=int, default=100_000,
                        help="largest size (epoch rows) the baseline writer is timed at")
    parser.add_argument("--baseline-trials", type=int, default=3, help="trial ends timed for the baseline writer")
    args = parser.parse_args()
    for name in ("trials_timed", "baseline_trials"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: allowed: an integer >= 1")
    if args.baseline_rev is not None:
        check_rev(args.baseline_rev)  # before the study rows are built: a bad rev stops at once
    trials, epochs = study_rows()
    scratch = Path(tempfile.mkdtemp(prefix="results_scale_baseline_"))
    try:
        baseline = None
        if args.baseline_rev:
            baseline = Baseline(extract_tree(args.baseline_rev, scratch / "tree"), args.baseline_max,
                                args.baseline_trials)
        rows = run_sizes(args, trials, epochs, baseline)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    sizes = [r["epoch_rows"] for r in rows]
    print(f"growth exponent (log time / log epoch rows): driver per trial end "
          f"{exponent(sizes, [r['trial_end_ms'] for r in rows]):.2f}, report.py "
          f"{exponent(sizes, [r['report_s'] for r in rows]):.2f}", end="", flush=True)
    old = [(r["epoch_rows"], r["old_ms"]) for r in rows if not math.isnan(r["old_ms"])]
    if len(old) > 1:
        print(f", the {args.baseline_rev} writer per trial end {exponent(*map(list, zip(*old))):.2f}", end="")
    print(f"; peak RSS of this process (generated rows included) "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)


def run_sizes(args: argparse.Namespace, trials: list[dict], epochs: dict[str, list[dict]],
              baseline: Baseline | None) -> list[dict[str, float]]:
    """One row per size, printed as it is measured (Markdown)."""
    old = f" | {args.baseline_rev} writer ms per trial end (x new)" if baseline else ""
    print(f"| epoch rows | trials | driver ms per trial end (mean / worst) | largest merge in the window (flushes) "
          f"| driver MB per trial | compaction s | report.py s{old} |", flush=True)
    print("|---" * (7 + bool(baseline)) + "|", flush=True)
    rows = []
    for size in args.epoch_rows:
        parent = Path(tempfile.mkdtemp(prefix=f"results_scale_{size}_", dir=args.keep))
        try:
            r = one_size(parent / "results", size, args.trials_timed, trials, epochs, baseline)
        finally:
            if args.keep is None:
                shutil.rmtree(parent, ignore_errors=True)
        rows.append(r)
        cell = ""
        if baseline:
            cell = " | —" if math.isnan(r["old_ms"]) else f" | {r['old_ms']:,.0f} ({r['old_ms'] / r['trial_end_ms']:,.0f}x)"
        print(f"| {r['epoch_rows']:,} | {r['trials']:,} | {r['trial_end_ms']:.1f} / {r['worst_ms']:.1f} "
              f"| {r['largest_merge']:,} | {r['mb_per_trial']:.3f} | {r['finish_s']:.2f} | {r['report_s']:.1f}{cell} |",
              flush=True)
    return rows


if __name__ == "__main__":
    main()
