"""The analysis scripts end to end on small results written by the real Parquet writer.

Train / bench rows carry constructed numbers (so the expected G, means and slopes are known by
hand); kernel_mse rows come from real tiny runs of the task. Every row goes through
rpevit.sweep.results.ParquetResults, exactly as a sweep writes it.
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rpevit import metrics
from rpevit.config import TrialConfig
from rpevit.sweep.results import TRIALS_FILE, ParquetResults
from rpevit.sweep.space import trial_key
from rpevit.tasks import kernel_mse as kmse_task

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "analysis"))

import common  # noqa: E402
import efficiency  # noqa: E402
import gap_closure  # noqa: E402
import kernel_mse  # noqa: E402
import report  # noqa: E402

ENV = metrics.environment(torch.device("cpu"))


def write_sweep(out_dir: Path, name: str, rows: list[dict]) -> Path:
    """Feed summary rows to the driver-side writer as Tune would, one on_trial_result per trial."""
    keys = [trial_key(r) for r in rows]
    writer = ParquetResults(out_dir, name, dict(zip(keys, rows)), {k: i for i, k in enumerate(keys)})
    for i, (key, row) in enumerate(zip(keys, rows)):
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               {"row_kind": "summary", "trial_key": key, "row": row})
    writer.on_experiment_end([])
    return out_dir


def config_row(**fields) -> dict:
    return {**TrialConfig.from_dict(fields).to_dict(), **ENV}


# softmax+ape 0.91, favor+ape 0.80, favor+rope 0.85 -> G = 0.05 / 0.11; relu+ape = softmax+ape -> no gap
ACCURACIES = {
    ("softmax", "ape"): [0.90, 0.92, 0.91],
    ("favor", "ape"): [0.80, 0.81, 0.79],
    ("favor", "rope"): [0.85, 0.86, 0.84],
    ("relu", "ape"): [0.91, 0.90, 0.92],
    ("relu", "rope"): [0.93, 0.94, 0.95],
}
COST = {"softmax": (2.0, 1.0e6), "favor": (1.5, 0.8e6), "relu": (1.0, 0.7e6)}  # train s/epoch, FLOPs


def train_rows() -> list[dict]:
    rows = []
    for (attention, pe), accs in ACCURACIES.items():
        for seed, acc in enumerate(accs):
            seconds, flops = COST[attention]
            rows.append({**config_row(attention=attention, pe=pe, seed=seed, dataset="digits"),
                         "test_acc": acc, "train_s_per_epoch": seconds + 0.1 * seed, "flops": flops,
                         "infer_ms_per_sample": seconds / 10, "params": 1000, "aic": 100.0 + seed, "bic": 120.0})
    return rows


def bench_rows() -> list[dict]:
    """softmax time ~ N^2, favor time ~ N (slopes 2 and 1 by construction)."""
    rows = []
    for image, tokens in ((8, 16), (16, 64), (32, 256), (64, 1024)):
        for attention, power in (("softmax", 2), ("favor", 1)):
            t = 1e-3 * tokens**power
            rows.append({**config_row(task="bench", attention=attention, pe="rope", dataset="cifar10",
                                      image_size=image, patch_size=2),
                         "tokens": tokens, "forward_ms": t, "train_step_ms": 3 * t, "infer_ms": 0.5 * t})
    return rows


def kernel_rows() -> list[dict]:
    """Real task rows: m in {2, 4} at one pair, and three pairs at m = 4."""
    rows = []
    points = [(2, 1.0, 0.8), (4, 1.0, 0.8), (4, 0.5, 0.0), (4, 1.5, 3.0)]
    for projection in kmse_task.PROJECTIONS:
        for estimator in ("positive", "trig"):
            for m, norm, angle in points:
                cfg = TrialConfig.from_dict({"task": "kernel_mse", "kmse_projection": projection, "kmse_dim": 8,
                                             "kmse_estimator": estimator, "kmse_features": m, "kmse_norm": norm,
                                             "kmse_angle": angle, "kmse_draws": 200})
                rows.append(kmse_task.run(cfg, log=None))
    return rows


def png_ok(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------- helpers
def test_bootstrap_interval_covers_the_mean_and_is_undefined_for_one_seed():
    point, lo, hi = common.bootstrap([np.array([0.8, 0.9, 1.0, 0.85])], np.mean)
    assert point == pytest.approx(0.8875) and 0.8 <= lo < point < hi <= 1.0
    assert common.bootstrap([np.array([0.7, 0.7])], np.mean)[1:] == (0.7, 0.7)
    one = common.bootstrap([np.array([0.5])], np.mean)
    assert one[0] == 0.5 and math.isnan(one[1]) and math.isnan(one[2])


def test_pareto_front_and_loglog_slope():
    cost = np.array([1.0, 2.0, 3.0, 2.5])
    acc = np.array([0.5, 0.8, 0.9, 0.7])  # the 4th is dominated by the 2nd
    assert efficiency.pareto_front(cost, acc).tolist() == [True, True, True, False]
    n = np.array([16.0, 64.0, 256.0])
    assert efficiency.loglog_slope(n, 3 * n**1.5) == pytest.approx(1.5)


# ---------------------------------------------------------------- scripts end to end
def test_gap_closure_by_hand(tmp_path):
    out = write_sweep(tmp_path / "main", "main", train_rows())
    rows = gap_closure.gap_rows(gap_closure.accuracies(common.load_trials(out, task="train")))
    favor = next(r for r in rows if r["backend"] == "favor" and r["pe"] == "rope")
    assert favor["G"] == pytest.approx(0.05 / 0.11)
    assert favor["lo"] < favor["G"] < favor["hi"]
    relu = next(r for r in rows if r["backend"] == "relu" and r["pe"] == "rope")
    assert math.isnan(relu["G"]) and relu["note"].startswith("G undefined")
    text = gap_closure.build(out)
    assert "0.455 [" in text  # G to 3 significant figures, with its interval
    assert "| digits | relu | rope | — |" in text and "G undefined" in text
    assert "91 [" in text  # softmax+ape accuracy 91%
    assert png_ok(out / "gap_closure.png")


def test_gap_closure_with_one_seed_says_no_interval(tmp_path):
    rows = [r for r in train_rows() if r["seed"] == 0]
    out = write_sweep(tmp_path / "one", "one", rows)
    text = gap_closure.build(out)
    favor = (0.85 - 0.80) / (0.90 - 0.80)
    assert f"{favor:.3g} (no interval)" in text


def test_efficiency_tables_and_slopes(tmp_path):
    parent = tmp_path / "all"
    write_sweep(parent / "main", "main", train_rows())
    write_sweep(parent / "scaling", "scaling", bench_rows())
    text = efficiency.build(parent)  # a parent folder holding two sweeps
    assert "| softmax | ape | 3 | 2.1 |" in text  # seeds, mean train s/epoch (2.0, 2.1, 2.2)
    slopes = efficiency.scaling_slopes(common.load_trials(parent, task="bench")).set_index("attention")
    assert slopes.loc["softmax", "forward_ms slope (all N)"] == pytest.approx(2.0)
    assert slopes.loc["favor", "train_step_ms slope (largest 3 N)"] == pytest.approx(1.0)
    assert png_ok(parent / "efficiency_pareto.png") and png_ok(parent / "token_scaling.png")


def test_kernel_mse_report_numbers(tmp_path):
    rows = kernel_rows()
    out = write_sweep(tmp_path / "kmse", "kmse", rows)
    text = kernel_mse.build(out)
    frame = common.load_trials(out, task="kernel_mse")
    assert len(frame) == len(rows) == 32
    one = frame[(frame["kmse_projection"] == "rademacher") & (frame["kmse_estimator"] == "positive")
                & (frame["kmse_features"] == 2)].iloc[0]
    assert f"{common.fmt(one['mse_closed'], 3)} / {common.fmt(one['mse_mc'], 3)}" in text
    assert common.fmt(one["limit_mse"], 3) in text and one["limit_mse"] > 0
    # extremes at m = 4 over the three pairs: the largest positive Gaussian MSE is at |x| = 1.5
    at4 = frame[(frame["kmse_features"] == 4) & (frame["kmse_projection"] == "gaussian")
                & (frame["kmse_estimator"] == "positive")]
    top = at4.loc[at4["mse_closed"].idxmax()]
    assert top["kmse_norm"] == 1.0 and top["kmse_angle"] == 0.8  # |x + y|^2 = 2(1 + cos 0.8) is the largest
    assert f"| 4 | positive | gaussian | 3 | \\|x\\|=1, {math.degrees(0.8):.0f}°: {common.fmt(top['mse_closed'], 3)}" in text
    assert "| trig | gaussian | 3 | 1 |" in text  # x = y at angle 0: the trig estimator is exact, no z
    assert png_ok(out / "kernel_mse_vs_m_0.png")


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
    for heading in ("## Accuracy and gap closure", "## Efficiency", "## Kernel MSE", "## Rotation-invariant RPE",
                    "## Environment"):
        assert heading in text
    assert ENV["git_commit"] in text and ENV["torch_version"] in text
    assert "| 4 | 0.25 |" in text and "_from rotinv/rotinv_concentration.md_" in text
    assert pd.read_parquet(parent / "main" / TRIALS_FILE)["status"].eq("ok").all()
    for png in ("gap_closure.png", "efficiency_pareto.png", "token_scaling.png", "kernel_mse_vs_m_0.png"):
        assert png_ok(parent / png) and f"]({png})" in text
