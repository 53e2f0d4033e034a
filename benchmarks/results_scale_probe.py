"""The baseline half of benchmarks/results_scale.py: times trial ends of whichever `rpevit` is first on
PYTHONPATH (results_scale.py puts an older commit's tree there, e.g. 22166eb, the writer before the
append-only store) on a copy of a compacted sweep folder, driving its ParquetResults exactly as the
new writer is driven: 10 on_trial_result epoch reports and the summary report of each trial.

    python benchmarks/results_scale_probe.py FOLDER REPORTS.json     # prints {"trial_end_ms": ...}

Uses only what both writers share (the constructor, on_trial_result); REPORTS.json is the file
results_scale.py wrote: [[trial_key, [epoch report, ...], summary report], ...].
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from rpevit.sweep.writer import ParquetResults


def main() -> None:
    folder, feed = Path(sys.argv[1]), Path(sys.argv[2])
    reports = json.loads(feed.read_text())
    space = json.loads((folder / "space.json").read_text())
    order = {key: i for i, key in enumerate(space["trial_keys"])}
    writer = ParquetResults(folder, folder.name, {key: {} for key, _, _ in reports}, order, task="train")
    costs = []
    for key, epoch_reports, summary in reports:
        trial = SimpleNamespace(trial_id=f"t-{key}")
        t = time.perf_counter()
        for result in epoch_reports:
            writer.on_trial_result(0, [], trial, result)
        writer.on_trial_result(0, [], trial, summary)
        costs.append(time.perf_counter() - t)
    print(json.dumps({"trial_end_ms": 1000 * float(np.mean(costs)), "trial_ends": len(costs)}))


if __name__ == "__main__":
    main()
