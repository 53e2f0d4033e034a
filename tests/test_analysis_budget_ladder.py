"""The budget-ladder report (rpevit/analysis/budget_ladder.py) on constructed rows: per-budget means with
their n, Kendall's tau of the rankings (by hand), and an interval that widens with seed noise."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rpevit.analysis import budget_ladder
from tests.analysis_rows import config_row, png_ok, write_sweep

# variant -> accuracy at 5 / 10 / 20 epochs (seeds add +-0.5 points); the order of 4 variants swaps one pair at 20
MEANS = {("softmax", "ape"): (60, 70, 80), ("softmax", "rope"): (58, 69, 79), ("favor", "ape"): (55, 62, 71),
         ("favor", "rope"): (50, 60, 72)}


def rows(spread: float = 0.005) -> list[dict]:
    out = []
    for (attention, pe), accs in MEANS.items():
        for epochs, acc in zip((5, 10, 20), accs):
            for seed, d in enumerate((-spread, 0.0, spread)):
                out.append({**config_row(dataset="cifar10", attention=attention, pe=pe, epochs=epochs, seed=seed,
                                         lr_schedule="wsd", redraw_interval=10),
                            "test_acc": acc / 100 + d, "test_acc_draw_mean": acc / 100 + d, "n_train": 45000})
    return out


def test_means_per_budget_and_tau_by_hand(tmp_path):
    out = write_sweep(tmp_path / "ladder", "ladder", rows())
    text = budget_ladder.build(out)
    assert "5 epochs (0.225M images)" in text and "20 epochs (0.9M images)" in text
    assert "80 [" in text and "(n=3)" in text
    table = budget_ladder.per_budget(budget_ladder.ladder_rows(pd.concat([pd.DataFrame(rows())])))
    tau, lo, hi, k = budget_ladder.tau_interval(table, 5, 20)
    # rankings at 5: softmax+ape > softmax+rope > favor+ape > favor+rope; at 20 favor+rope passes favor+ape:
    # 5 concordant pairs, 1 discordant of 6: tau = (5 - 1) / 6
    assert k == 4 and tau == pytest.approx(4 / 6) and lo <= tau <= hi
    tau_same, *_ = budget_ladder.tau_interval(table, 5, 10)
    assert tau_same == pytest.approx(1.0)
    assert png_ok(out / "budget_ladder.png")


def test_the_tau_interval_widens_with_seed_noise():
    quiet = budget_ladder.per_budget(budget_ladder.ladder_rows(pd.DataFrame(rows(0.001))))
    noisy = budget_ladder.per_budget(budget_ladder.ladder_rows(pd.DataFrame(rows(0.05))))
    _, qlo, qhi, _ = budget_ladder.tau_interval(quiet, 5, 10)
    _, nlo, nhi, _ = budget_ladder.tau_interval(noisy, 5, 10)
    assert (nhi - nlo) > (qhi - qlo) and nlo < 0.5


def test_one_budget_is_not_a_ladder(tmp_path):
    out = write_sweep(tmp_path / "one", "one", [r for r in rows() if r["epochs"] == 5])
    assert budget_ladder.build(out) is None
    assert math.isnan(budget_ladder.tau_interval(budget_ladder.per_budget(
        budget_ladder.ladder_rows(pd.DataFrame(rows()))), 5, 7)[0])
    assert np.isfinite(budget_ladder.kendall_tau(np.arange(3.0), np.arange(3.0)))


def test_the_summary_sentence_carries_every_budget_tau_and_best_mean(tmp_path):
    out = write_sweep(tmp_path / "ladder", "ladder", rows())
    text = budget_ladder.summary(out)
    assert "5 → 20 epochs 0.667 [" in text and "(4 variants)" in text and "5 → 10 epochs 1 [" in text
    assert "20 epochs (0.9M images): softmax+ape 80 [" in text and "(n=3) of 4 variants" in text
    few = write_sweep(tmp_path / "two", "two", [r for r in rows() if r["attention"] == "softmax"])
    assert "5 → 10 epochs not defined (2 variants at both, 3 needed)" in budget_ladder.summary(few)
    assert budget_ladder.summary(write_sweep(tmp_path / "one", "one", [r for r in rows() if r["epochs"] == 5])) is None
