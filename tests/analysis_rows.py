"""Rows for the analysis tests, written by the real Parquet writer, and checks on saved figures.

Train / bench rows carry constructed numbers (so the expected G, means and slopes are known by
hand); kernel_mse rows come from real tiny runs of the task. Every row goes through
rpevit.sweep.writer.ParquetResults, exactly as a sweep writes it. Used by tests/test_analysis_*.py,
tests/test_validation_choice.py and tests/test_one_file_variants.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence
from types import SimpleNamespace

import torch

from rpevit import metrics
from rpevit.config import TrialConfig
from rpevit.sweep.protocol import EPOCH, SUMMARY, Report
from rpevit.sweep.writer import ParquetResults
from rpevit.sweep.space import trial_key
from rpevit.tasks import kernel_mse as kmse_task

ENV = metrics.environment(torch.device("cpu"))


def write_sweep(out_dir: Path, name: str, rows: list[dict], failed: Sequence[tuple[dict, str]] = (),
                epochs: Sequence[Sequence[dict]] = ()) -> Path:
    """Feed summary rows to the driver-side writer as Tune would, one on_trial_result per trial;
    `failed`: (config row, error line) of trials that raised, recorded as the writer records them;
    `epochs`: per row (in order, as many as given), its epoch rows, reported before its summary."""
    keys = [trial_key(r) for r in rows]
    failed_keys = [trial_key(r) for r, _ in failed]
    configs = {**dict(zip(keys, rows)), **dict(zip(failed_keys, (r for r, _ in failed)))}
    writer = ParquetResults(out_dir, name, configs, {k: i for i, k in enumerate(configs)})
    for i, (key, per_epoch) in enumerate(zip(keys, epochs)):
        for row in per_epoch:
            writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"), Report(EPOCH, key, row).to_tune())
    for i, (key, row) in enumerate(zip(keys, rows)):
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               Report(SUMMARY, key, row).to_tune())
    for i, (key, (_, error)) in enumerate(zip(failed_keys, failed)):
        writer.record_failure(key, error, error, f"f{i}", 1)
    writer.on_experiment_end([])
    return out_dir


def config_row(**fields) -> dict:
    """A stored row's config; redraw_interval 0 (one training draw) unless given, as these rows were
    built before the default became 100."""
    return {**TrialConfig.from_dict({"redraw_interval": 0, **fields}).to_dict(), **ENV}


def ladder_epoch_rows(row: dict, nudge: dict[int, float] | None = None) -> list[dict]:
    """A trial's epoch rows (constructed numbers) as a branched ladder records them: up to the rung's cool-down
    start (epochs less round(cooldown_fraction x epochs)) the trunk's values, the same for every rung of the
    variant and seed; after it the rung's own. `nudge`: epoch -> an amount added to that epoch's train loss
    (a run that did not reproduce)."""
    branch = row["epochs"] - round(row["cooldown_fraction"] * row["epochs"])
    base = (sum(map(ord, row["attention"] + row["pe"])) % 97 + row["seed"]) / 1e4  # per variant and seed
    out = []
    for e in range(1, row["epochs"] + 1):
        own = 0.0 if e <= branch else 0.5 + row["epochs"] / 100  # the cool-down differs per rung
        out.append({"epoch": e, "train_loss": 2.0 - 0.05 * e + base + own + (nudge or {}).get(e, 0.0),
                    "train_acc": 0.1 * e, "val_loss": 2.1 - 0.05 * e + base + own, "val_acc": 0.3 + 0.01 * e + own,
                    "lr": 1e-3, "epoch_s": 1.0})
    return out


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
                rows.append(kmse_task.kernel_mse_point(cfg, log=None))
    return rows


def png_ok(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


# ---- issue 31, item 6: figures a reader can read
MIN_FONT_PT = 8


def texts_of(fig) -> list:
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def assert_readable_and_inside(fig) -> None:
    """Every text at least MIN_FONT_PT; every text placed in an axes' data (labels of bars, interval ends) inside it."""
    fig.draw_without_rendering()
    small = [(t.get_text(), t.get_fontsize()) for t in texts_of(fig) if t.get_fontsize() < MIN_FONT_PT]
    assert not small, small
    for ax in fig.axes:
        box = ax.get_window_extent().padded(1)
        for text in ax.texts:
            extent = text.get_window_extent()
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, \
                (text.get_text(), extent, box)
