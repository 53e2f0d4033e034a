"""The budget-ladder report (rpevit/analysis/budget_ladder.py) on constructed rows: per-budget means with
their n, Kendall's tau of the rankings (by hand), the per-seed taus paired by seed and their interval, which
widens with seed noise, and a highest mean that names the variants it is tied with."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rpevit.analysis import budget_ladder
from rpevit.sweep.space import trial_key
from tests.analysis_rows import config_row, ladder_epoch_rows, png_ok, write_sweep

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
    ladder = budget_ladder.ladder_rows(pd.concat([pd.DataFrame(rows())]))
    table = budget_ladder.per_budget(ladder)
    tau, lo, hi, k = budget_ladder.tau_interval(table, 5, 20, ladder)
    # rankings at 5: softmax+ape > softmax+rope > favor+ape > favor+rope; at 20 favor+rope passes favor+ape:
    # 5 concordant pairs, 1 discordant of 6: tau = (5 - 1) / 6; every seed shifts every variant alike, so each
    # seed's own ranking is the means' and the per-seed taus are all 4/6: an interval of one point
    assert k == 4 and tau == pytest.approx(4 / 6)
    assert budget_ladder.seed_taus(ladder, 5, 20) == pytest.approx({0: 4 / 6, 1: 4 / 6, 2: 4 / 6})
    assert lo == pytest.approx(4 / 6) and hi == pytest.approx(4 / 6)
    tau_same, *_ = budget_ladder.tau_interval(table, 5, 10, ladder)
    assert tau_same == pytest.approx(1.0)
    assert "tau of each seed's own ranking" in text and "0: 0.667, 1: 0.667, 2: 0.667" in text
    assert png_ok(out / "budget_ladder.png")


def noisy_rows(spread: float) -> list[dict]:
    """rows(), each (variant, seed) shifted by its own reproducible noise, the same at every budget of the seed
    (a seed's rungs share a trunk) plus as much of each rung's own."""
    rng = np.random.default_rng(11)
    shift = {(a, p, s): rng.normal(0, spread) for (a, p) in MEANS for s in range(3)}
    out = []
    for r in rows(0.0):
        r = dict(r)
        r["test_acc"] = r["test_acc_draw_mean"] = r["test_acc"] + shift[r["attention"], r["pe"], r["seed"]] \
            + rng.normal(0, spread)
        out.append(r)
    return out


def test_the_tau_interval_is_over_seeds_and_widens_with_seed_noise():
    quiet_rows, noisy = (budget_ladder.ladder_rows(pd.DataFrame(noisy_rows(s))) for s in (0.001, 0.06))
    _, qlo, qhi, _ = budget_ladder.tau_interval(budget_ladder.per_budget(quiet_rows), 5, 10, quiet_rows)
    tau, nlo, nhi, _ = budget_ladder.tau_interval(budget_ladder.per_budget(noisy), 5, 10, noisy)
    assert (nhi - nlo) > (qhi - qlo) and -1.0 <= nlo <= nhi <= 1.0
    per_seed = list(budget_ladder.seed_taus(noisy, 5, 10).values())
    from rpevit.analysis import stats
    iv = stats.mean_interval(per_seed)  # by hand: the t interval of the three per-seed taus, clipped to [-1, 1]
    assert (nlo, nhi) == pytest.approx((max(-1, iv.lo), min(1, iv.hi)))
    # without the rows there is no interval, only the tau of the means
    assert math.isnan(budget_ladder.tau_interval(budget_ladder.per_budget(noisy), 5, 10)[1])


def test_the_highest_mean_names_the_variants_it_is_not_resolved_from(tmp_path):
    close = [dict(r, test_acc=r["test_acc"] + (0.0095 if (r["attention"], r["pe"]) == ("softmax", "rope") else 0),
                  test_acc_draw_mean=r["test_acc"] + (0.0095 if (r["attention"], r["pe"]) == ("softmax", "rope") else 0))
             for r in rows(0.005)]  # softmax+rope 1.05 points under softmax+ape at 5 epochs, seeds +-0.5
    out = write_sweep(tmp_path / "tie", "tie", close)
    text = budget_ladder.summary(out)
    assert "5 epochs (0.225M images): softmax+ape" in text
    assert "not resolved from softmax+rope (1.05 points behind" in text


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


def test_a_seeds_rungs_are_checked_to_be_one_run_up_to_the_shorter_ones_cool_down(tmp_path):
    ladder = rows()
    out = write_sweep(tmp_path / "same", "same", ladder, epochs=[ladder_epoch_rows(r) for r in ladder])
    check = budget_ladder.shared_epochs(budget_ladder.ladder_rows(pd.DataFrame(ladder).assign(sweep="same",
                                        trial_key=[trial_key(r) for r in ladder])),
                                        budget_ladder.trial_epoch_curves(out))
    # 4 variants x 3 seeds, each with pairs 5/10 (epochs 1-4), 5/20 (1-4) and 10/20 (1-8)
    assert (check.pairs, check.epochs, check.largest, check.differing, check.without_rows) == (36, 192, 0.0, (), 0)
    assert "36 pair(s), 192 epoch rows. Identical in every one" in budget_ladder.build(out)


def test_a_pair_that_differs_before_the_cool_down_is_named_and_one_after_it_is_not(tmp_path):
    ladder = rows()
    rung = next(i for i, r in enumerate(ladder) if (r["attention"], r["pe"], r["seed"], r["epochs"])
                == ("favor", "rope", 1, 10))
    # epoch 3 is before every rung's cool-down (5 epochs: 4); epoch 9 is in the 10-epoch rung's own cool-down
    nudged = [ladder_epoch_rows(r, {3: 0.01, 9: 5.0} if i == rung else None) for i, r in enumerate(ladder)]
    text = budget_ladder.build(write_sweep(tmp_path / "differ", "differ", ladder, epochs=nudged))
    assert "36 pair(s), 192 epoch rows. 2 pair(s) differ (largest |difference| 0.01)" in text
    assert "favor+rope seed 1: 5 vs 10 epochs (epochs 1-4, largest |difference| 0.01)" in text
    assert "favor+rope seed 1: 10 vs 20 epochs (epochs 1-8, largest |difference| 0.01)" in text
    assert "5 vs 20" not in text and "not one run up to their cool-down" in text
    only_after = [ladder_epoch_rows(r, {9: 5.0} if i == rung else None) for i, r in enumerate(ladder)]
    assert "Identical in every one" in budget_ladder.build(write_sweep(tmp_path / "after", "after", ladder,
                                                                       epochs=only_after))


def test_rungs_of_another_configuration_are_not_paired_and_missing_epoch_rows_are_counted(tmp_path):
    ladder = rows()
    other = {**ladder[0], "lr": 2e-3, "epochs": 10}  # softmax+ape seed 0 at another lr: a configuration of its own
    missing = next(i for i, r in enumerate(ladder) if r["epochs"] == 20)  # its two pairs cannot be compared
    curves = [[] if i == missing else ladder_epoch_rows(r) for i, r in enumerate(ladder)]
    curves.append(ladder_epoch_rows(other, {1: 1.0}))
    text = budget_ladder.build(write_sweep(tmp_path / "mixed", "mixed", [*ladder, other], epochs=curves))
    assert "34 pair(s), 180 epoch rows. Identical in every one" in text  # 192 less the 4 + 8 of the two pairs
    assert "2 pair(s) lack some of those epoch rows and are not compared" in text
    bare = budget_ladder.build(write_sweep(tmp_path / "bare", "bare", ladder))
    assert "Not checked: no two rungs of one configuration" in bare
