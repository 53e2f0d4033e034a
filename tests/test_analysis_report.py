"""rpevit/analysis/report.py: the gathered report, its studies and its thread-hours."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rpevit.analysis import common, gap_closure, report
from rpevit.sweep.results import TRIALS_FILE
from tests.analysis_rows import ENV, bench_rows, config_row, kernel_rows, png_ok, train_rows, write_sweep

REPO = Path(__file__).resolve().parent.parent


def test_thread_hours_count_each_tune_trial_once():
    t0 = pd.Timestamp("2026-11-22 08:00", tz="UTC")
    at = lambda minutes: t0 + pd.Timedelta(minutes=minutes)  # noqa: E731
    frame = pd.DataFrame({  # two members timed in one worker (overlapping spans), and a 2-thread trial
        "tune_trial_id": ["a", "a", "b"], "torch_threads": [1, 1, 2],
        "started_at": [at(0), at(1), at(0)], "finished_at": [at(30), at(60), at(90)]})
    assert report.thread_hours(frame) == pytest.approx(1.0 + 3.0)
    older = frame.assign(started_at=report.unix_seconds(frame["started_at"]),  # float seconds, no trial ids
                         finished_at=report.unix_seconds(frame["finished_at"])).drop(columns="tune_trial_id")
    assert report.thread_hours(older) == pytest.approx(0.5 + 59 / 60 + 3.0)
    assert math.isnan(report.thread_hours(frame.drop(columns="started_at")))


@pytest.mark.slow
def test_report_gathers_every_section(tmp_path):
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", train_rows())
    write_sweep(parent / "scaling", "scaling", bench_rows())
    write_sweep(parent / "kmse", "kmse", kernel_rows()[:8])
    rotinv = parent / "rotinv"
    rotinv.mkdir()
    (rotinv / "rotinv_concentration.md").write_text("# rotinv random mode\n\n| m | x |\n|---|---|\n| 4 | 0.25 |\n")
    subprocess.run([sys.executable, str(REPO / "analysis" / "report.py"), str(parent)], check=True,
                   capture_output=True, cwd=tmp_path)
    text = (parent / "report.md").read_text()
    for heading in ("## Accuracy and gap closure", "## Efficiency", "## Token scaling", "## Kernel MSE",
                    "## Rotation-invariant RPE",
                    "## Environment"):
        assert heading in text
    assert ENV["git_commit"] in text and ENV["torch_version"] in text
    assert "| thread-hours in trials | resumed after a stop |" in text
    assert "| 4 | 0.25 |" in text and "_from rotinv/rotinv_concentration.md_" in text
    assert pd.read_parquet(parent / "main" / TRIALS_FILE)["status"].eq("ok").all()
    for png in ("gap_closure.png", "efficiency_pareto.png", "token_scaling.png", "kernel_mse_vs_m_0.png"):
        assert png_ok(parent / png) and f"]({png})" in text


# ---- issue 31, item 4: a user's own sweep under results/ stays out of the published report
@pytest.mark.slow
def test_report_reads_only_the_studies_it_lists_and_names_the_others(tmp_path):
    parent = tmp_path / "results"
    write_sweep(parent / "study", "study", train_rows())
    smoke = [{**config_row(attention="softmax", pe="none", seed=s, dataset="digits"), "test_acc": 0.5 + s / 100}
             for s in range(2)]  # a variant only the smoke folder has
    write_sweep(parent / "smoke", "smoke", smoke)
    (parent / common.STUDIES_FILE).write_text("# the published studies\nstudy\n\nmissing  # not run yet\n")
    assert common.trial_files(parent) == [parent / "study" / TRIALS_FILE]
    text = report.build_report(parent)
    assert "| study | train | 15 |" in text and "| smoke |" not in text
    assert "| softmax | none |" not in text and "| softmax | ape |" in text  # no smoke row in any table
    assert "_not read: smoke (not listed in STUDIES" in text.split("## Environment")[0]
    assert "listed in STUDIES but holding no trials.parquet: missing" in text
    assert "not read: smoke" in gap_closure.build(parent)  # each script says so too
    (parent / common.STUDIES_FILE).unlink()  # no list: every folder, as before
    assert "| smoke | train | 2 |" in report.build_report(parent)
