"""The budget-ladder report (rpevit/analysis/budget_ladder.py) on constructed rows: per-budget means with
their n, Kendall's tau of the rankings (by hand), the per-seed taus paired by seed and their mean's interval,
which widens with seed noise and holds the figure printed with it, and a highest mean that names the variants it
is tied with (Holm over its k - 1 differences to the others)."""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pandas as pd
import pytest

from rpevit.analysis import budget_ladder, stats
from rpevit.analysis.common import fmt
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
    tau = budget_ladder.tau_interval(table, 5, 20, ladder)
    # rankings at 5: softmax+ape > softmax+rope > favor+ape > favor+rope; at 20 favor+rope passes favor+ape:
    # 5 concordant pairs, 1 discordant of 6: tau = (5 - 1) / 6; every seed shifts every variant alike, so each
    # seed's own ranking is the means' and the per-seed taus are all 4/6: an interval of one point
    assert tau.variants == 4 and tau.of_means == pytest.approx(4 / 6)
    assert budget_ladder.seed_taus(ladder, 5, 20) == pytest.approx({0: 4 / 6, 1: 4 / 6, 2: 4 / 6})
    iv = tau.per_seed
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((4 / 6, 4 / 6, 4 / 6)) and iv.n == (3,)
    assert budget_ladder.tau_interval(table, 5, 10, ladder).of_means == pytest.approx(1.0)
    assert "tau of each seed's own ranking" in text and "0: 0.667, 1: 0.667, 2: 0.667" in text
    assert "| 5 → 20 epochs | 0.667 [0.667, 0.667] (n=3 seeds) | 0: 0.667, 1: 0.667, 2: 0.667 | 0.667 | 4 |" in text
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
    quiet = budget_ladder.tau_interval(budget_ladder.per_budget(quiet_rows), 5, 10, quiet_rows).per_seed
    loud = budget_ladder.tau_interval(budget_ladder.per_budget(noisy), 5, 10, noisy).per_seed
    qlo, qhi, nlo, nhi = quiet.lo, quiet.hi, loud.lo, loud.hi
    assert (nhi - nlo) > (qhi - qlo) and -1.0 <= nlo <= nhi <= 1.0
    per_seed = list(budget_ladder.seed_taus(noisy, 5, 10).values())
    from rpevit.analysis import stats
    iv = stats.mean_interval(per_seed)  # by hand: the t interval of the three per-seed taus, clipped to [-1, 1]
    assert (nlo, nhi) == pytest.approx((max(-1, iv.lo), min(1, iv.hi))) and loud.point == pytest.approx(iv.point)
    # without the rows there is no per-seed figure, only the tau of the means
    bare = budget_ladder.tau_interval(budget_ladder.per_budget(noisy), 5, 10)
    assert math.isnan(bare.per_seed.point) and math.isfinite(bare.of_means)


def test_a_tau_interval_clipped_to_its_range_says_what_it_was():
    """A review: ANSWERS' preamble says every interval is printed as computed, and '0.906 [0.763, 1]' was a t
    interval whose upper bound, 1.05, had been clipped to tau's range without a word."""
    iv = stats.Interval(0.9, 0.75, 1.05, (3,))
    clipped = budget_ladder.LadderTau(dataclasses.replace(iv, hi=1.0), 0.9, 4, None, iv)
    assert budget_ladder.per_seed_text(clipped) == ("0.9 [0.75, 1] (n=3 seeds; the t interval [0.75, 1.05] clipped "
                                                    "to tau's range [-1, 1])")
    inside = budget_ladder.LadderTau(stats.Interval(0.9, 0.8, 0.95, (3,)), 0.9, 4)
    assert budget_ladder.per_seed_text(inside) == "0.9 [0.8, 0.95] (n=3 seeds)"
    quiet_rows = budget_ladder.ladder_rows(pd.DataFrame(noisy_rows(0.001)))
    assert budget_ladder.tau_interval(budget_ladder.per_budget(quiet_rows), 5, 10, quiet_rows).unclipped is None
    loud_rows = budget_ladder.ladder_rows(pd.DataFrame(noisy_rows(0.06)))
    loud = budget_ladder.tau_interval(budget_ladder.per_budget(loud_rows), 5, 10, loud_rows)
    raw = stats.mean_interval(list(budget_ladder.seed_taus(loud_rows, 5, 10).values()))
    assert (loud.unclipped is not None) == (raw.lo < -1 or raw.hi > 1)


def test_the_highest_mean_names_the_variants_it_is_not_resolved_from(tmp_path):
    close = [dict(r, test_acc=r["test_acc"] + (0.0095 if (r["attention"], r["pe"]) == ("softmax", "rope") else 0),
                  test_acc_draw_mean=r["test_acc"] + (0.0095 if (r["attention"], r["pe"]) == ("softmax", "rope") else 0))
             for r in rows(0.005)]  # softmax+rope 1.05 points under softmax+ape at 5 epochs, seeds +-0.5
    out = write_sweep(tmp_path / "tie", "tie", close)
    text = budget_ladder.summary(out)
    assert "5 epochs (0.225M images): softmax+ape" in text
    assert "not resolved from softmax+rope (1.05 points behind" in text


# five variants, four seeds: at 5 epochs every seed ranks them alike; at 10 epochs each seed swaps adjacent
# pairs (seed 3 two of them) by 2 points each way, too little to move any mean past the next (10 apart)
FIVE = [("softmax", "ape"), ("softmax", "rope"), ("favor", "ape"), ("favor", "rope"), ("relu", "ape")]
SWAPS = {0: [(0, 1)], 1: [(1, 2)], 2: [(2, 3)], 3: [(0, 1), (3, 4)]}


def swapped_rows() -> list[dict]:
    out = []
    for seed, pairs in SWAPS.items():
        at10 = [90.0, 80.0, 70.0, 60.0, 50.0]
        for i, j in pairs:
            at10[i], at10[j] = at10[j] - 2, at10[i] + 2
        for epochs, accs in ((5, (60.0, 55.0, 50.0, 45.0, 40.0)), (10, at10)):
            for (attention, pe), acc in zip(FIVE, accs):
                out.append({**config_row(dataset="cifar10", attention=attention, pe=pe, epochs=epochs, seed=seed,
                                         lr_schedule="wsd", redraw_interval=10),
                            "test_acc": acc / 100, "test_acc_draw_mean": acc / 100, "n_train": 45000})
    return out


def test_the_printed_tau_is_the_per_seed_mean_inside_its_own_interval(tmp_path):
    """The figure printed with the interval is the mean of the per-seed taus (what the interval is of), not the
    tau of the rankings of the means, which here is 1 and lies outside it; that one is shown apart, labelled."""
    ladder = budget_ladder.ladder_rows(pd.DataFrame(swapped_rows()))
    per_seed = budget_ladder.seed_taus(ladder, 5, 10)
    assert per_seed == pytest.approx({0: 0.8, 1: 0.8, 2: 0.8, 3: 0.6})  # one / two discordant pairs of 10
    out = write_sweep(tmp_path / "swapped", "swapped", swapped_rows())
    summary = budget_ladder.summary(out)
    row = next(line for line in budget_ladder.build(out).splitlines() if line.startswith("| 5 → 10 epochs"))
    for text in (summary.split("5 → 10 epochs ", 1)[1], row):  # the first figure with an interval in each
        point, lo, hi = map(float, re.search(r"(\S+) \[(\S+), (\S+)\]", text).groups())
        assert point == pytest.approx(0.75) and lo <= point <= hi, text
    assert "5 → 10 epochs 0.75 [0.591, 0.909] (n=4 seeds), the rankings of the means: tau 1 (5 variants; no pair " \
           "of variants swaps order)" in summary  # seeds' rankings swap, the means' do not
    tau = budget_ladder.tau_interval(budget_ladder.per_budget(ladder), 5, 10, ladder)
    assert tau.of_means == pytest.approx(1.0) and tau.per_seed.point == pytest.approx(0.75)
    assert tau.per_seed.lo <= tau.per_seed.point <= tau.per_seed.hi < 1.0 and tau.per_seed.n == (4,)


def test_a_variant_resolved_from_the_top_at_95_but_not_under_holm_over_the_k_minus_1_is_tied(tmp_path):
    """The top is picked from the data, so its k - 1 differences to the others are one Holm family: favor+ape,
    2.8 points behind, excludes 0 at a plain 95% but not at its Holm level, and is listed as not resolved."""
    behind = {("softmax", "ape"): 0.0, ("favor", "ape"): 2.8, ("softmax", "rope"): 1.0, ("favor", "rope"): 0.5,
              ("relu", "ape"): 10.0}
    close = [{**config_row(dataset="cifar10", attention=a, pe=p, epochs=epochs, seed=seed, lr_schedule="wsd",
                           redraw_interval=10),
              "test_acc": (71 + epochs + d - gap) / 100, "test_acc_draw_mean": (71 + epochs + d - gap) / 100,
              "n_train": 45000}
             for (a, p), gap in behind.items() for epochs in (5, 10) for seed, d in enumerate((-1.0, 0.0, 1.0))]
    from rpevit.analysis import stats
    top, favor = [76.0, 77.0, 78.0], [73.2, 74.2, 75.2]
    # relu+ape (p tiny) is rejected at 1 - 0.05/4; favor+ape's p (about 0.027) fails at 1 - 0.05/3
    assert stats.welch(top, favor).excludes(0.0) and not stats.welch(top, favor, 1 - 0.05 / 3).excludes(0.0)
    text = budget_ladder.summary(write_sweep(tmp_path / "holm", "holm", close))
    at5 = text.split("5 epochs (0.225M images): ", 1)[1].split(";", 1)[0]
    assert at5.startswith("softmax+ape 76 [")
    holm = stats.welch(top, favor, 1 - 0.05 / 3)
    assert (f"not resolved from favor+ape (2.8 points behind, 2.8 [" in at5
            and f"Holm [{fmt(holm.lo, 3)}, {fmt(holm.hi, 3)}])" in at5), at5
    assert "favor+rope (" in at5 and "softmax+rope (" in at5 and "relu+ape" not in at5
    assert "(Holm over its 4 differences to the others)" in at5
    assert "judged by Holm over those k - 1 comparisons" in text and "exploratory" in text


def test_one_budget_is_not_a_ladder(tmp_path):
    out = write_sweep(tmp_path / "one", "one", [r for r in rows() if r["epochs"] == 5])
    assert budget_ladder.build(out) is None
    assert math.isnan(budget_ladder.tau_interval(budget_ladder.per_budget(
        budget_ladder.ladder_rows(pd.DataFrame(rows()))), 5, 7).of_means)
    assert np.isfinite(budget_ladder.kendall_tau(np.arange(3.0), np.arange(3.0)))


def test_the_summary_sentence_carries_every_budget_tau_and_best_mean(tmp_path):
    out = write_sweep(tmp_path / "ladder", "ladder", rows())
    text = budget_ladder.summary(out)
    assert "5 → 20 epochs 0.667 [0.667, 0.667] (n=3 seeds), the rankings of the means: tau 0.667 (4 variants; " \
        in text and "5 → 10 epochs 1 [" in text
    assert "20 epochs (0.9M images): softmax+ape 80 [" in text and "(n=3) of 4 variants" in text
    few = write_sweep(tmp_path / "two", "two", [r for r in rows() if r["attention"] == "softmax"])
    assert "5 → 10 epochs not defined (2 variants at both, 3 needed)" in budget_ladder.summary(few)
    assert budget_ladder.summary(write_sweep(tmp_path / "one", "one", [r for r in rows() if r["epochs"] == 5])) is None


def test_the_pairs_that_swap_are_named_with_their_distance_at_both_budgets(tmp_path):
    """Issue 58, item 6: a ranking's stability is read with the pairs that swap and how far apart they are
    (a swap of means a fraction of a point apart is seed noise). favor+ape leads favor+rope by 5 points at 5
    epochs and 2 at 10, and trails it by 1 at 20; no other pair swaps."""
    ladder = budget_ladder.ladder_rows(pd.DataFrame(noisy_rows(0.004)))
    table = budget_ladder.per_budget(ladder)
    swap, = budget_ladder.swapped_pairs(ladder, table, 5, 20)
    assert (swap.ahead, swap.behind) == ("favor+ape", "favor+rope")
    by = {(v, e): g["acc"].to_numpy() for (v, e), g in ladder.groupby(["variant", "epochs"])}
    for budget, iv in ((5, swap.shorter), (20, swap.longer)):
        a, b = by["favor+ape", budget], by["favor+rope", budget]
        se = math.sqrt(a.var(ddof=1) / 3 + b.var(ddof=1) / 3)  # Welch by hand
        df = se ** 4 / ((a.var(ddof=1) / 3) ** 2 / 2 + (b.var(ddof=1) / 3) ** 2 / 2)
        half = __import__("scipy.stats").stats.t.ppf(0.975, df) * se
        assert (iv.point, iv.lo, iv.hi) == pytest.approx((a.mean() - b.mean(), a.mean() - b.mean() - half,
                                                          a.mean() - b.mean() + half))
    assert swap.shorter.point > 3 and swap.longer.point < 0
    assert budget_ladder.swapped_pairs(ladder, table, 5, 10) == []
    out = write_sweep(tmp_path / "ladder", "ladder", noisy_rows(0.004))
    summary = budget_ladder.summary(out)
    assert f"1 pair swap order (ahead at the shorter budget, difference there, then at the longer, Welch 95%): " \
           f"favor+ape over favor+rope by {swap.shorter.text()} points, then {swap.longer.text()}" in summary
    assert "5 → 10 epochs" in summary and "no pair of variants swaps order" in summary
    text = budget_ladder.build(out)
    assert f"| 5 → 20 epochs | favor+ape | favor+rope | {swap.shorter.text()} | {swap.longer.text()} |" in text


def test_a_seeds_rungs_are_checked_to_be_one_run_up_to_the_shorter_ones_cool_down(tmp_path):
    ladder = rows()
    out = write_sweep(tmp_path / "same", "same", ladder, epochs=[ladder_epoch_rows(r) for r in ladder])
    check = budget_ladder.shared_epochs(budget_ladder.ladder_rows(pd.DataFrame(ladder).assign(sweep="same",
                                        trial_key=[trial_key(r) for r in ladder])),
                                        budget_ladder.trial_epoch_curves(out))
    # 4 variants x 3 seeds, each with pairs 5/10 (epochs 1-4), 5/20 (1-4) and 10/20 (1-8)
    assert (check.pairs, check.epochs, check.largest, check.differing, check.without_rows) == (36, 192, 0.0, (), 0)
    assert "36 pair(s), 192 epoch rows. Identical in every one" in budget_ladder.build(out)


def test_a_sweep_whose_name_markdown_escapes_still_finds_its_epoch_rows(tmp_path):
    """The trial rows' `sweep` is made inert as read (`odd\\[x\\]`), the epoch rows' is not (`odd[x]`):
    looked up by the escaped name, every pair was counted as without epoch rows (a review)."""
    ladder = rows()
    out = write_sweep(tmp_path / "odd[x]", "odd[x]", ladder, epochs=[ladder_epoch_rows(r) for r in ladder])
    assert "36 pair(s), 192 epoch rows. Identical in every one" in budget_ladder.build(out)


def test_a_pair_that_differs_before_the_cool_down_is_named_and_one_after_it_is_not(tmp_path):
    ladder = rows()
    rung = next(i for i, r in enumerate(ladder) if (r["attention"], r["pe"], r["seed"], r["epochs"])
                == ("favor", "rope", 1, 10))
    # epoch 3 is before every rung's cool-down (5 epochs: 4); epoch 9 is in the 10-epoch rung's own cool-down
    nudged = [ladder_epoch_rows(r, {3: 0.01, 9: 5.0} if i == rung else None) for i, r in enumerate(ladder)]
    text = budget_ladder.build(write_sweep(tmp_path / "differ", "differ", ladder, epochs=nudged))
    assert "36 pair(s), 192 epoch rows. 2 pair(s) differ (largest |difference| 0.01; largest first)" in text
    assert "favor+rope seed 1: 5 vs 10 epochs (epochs 1-4, largest |difference| 0.01)" in text
    assert "favor+rope seed 1: 10 vs 20 epochs (epochs 1-8, largest |difference| 0.01)" in text
    assert "5 vs 20" not in text and "not one run up to their cool-down" in text
    only_after = [ladder_epoch_rows(r, {9: 5.0} if i == rung else None) for i, r in enumerate(ladder)]
    assert "Identical in every one" in budget_ladder.build(write_sweep(tmp_path / "after", "after", ladder,
                                                                       epochs=only_after))


def test_a_differing_pair_names_the_devices_its_epochs_ran_on_where_the_rows_record_them(tmp_path):
    """Epoch rows record their device (train epoch rows from 2026-11-30): a pair whose shared epochs ran on two
    machines says so (a trunk trained again elsewhere), from the rows, inert; rows without it say nothing."""
    ladder = rows()
    rung = next(i for i, r in enumerate(ladder) if (r["attention"], r["pe"], r["seed"], r["epochs"])
                == ("favor", "rope", 1, 10))
    nudged = [[{**e, "device_name": "cpu:x86_64 <b>Xeon</b>" if i == rung else "cpu:x86_64 AMD EPYC"}
               for e in ladder_epoch_rows(r, {3: 0.01} if i == rung else None)] for i, r in enumerate(ladder)]
    text = budget_ladder.build(write_sweep(tmp_path / "two", "two", ladder, epochs=nudged))
    assert ("favor+rope seed 1: 5 vs 10 epochs (epochs 1-4, largest |difference| 0.01; ran on cpu:x86_64 AMD EPYC "
            "vs cpu:x86_64 &lt;b&gt;Xeon&lt;/b&gt;)") in text
    same = [[{**e, "device_name": "cpu:x86_64 AMD EPYC"} for e in ladder_epoch_rows(r, {3: 0.01} if i == rung else None)]
            for i, r in enumerate(ladder)]
    assert "ran on" not in budget_ladder.build(write_sweep(tmp_path / "one", "one", ladder, epochs=same))


def test_pairs_that_differ_only_by_rounding_are_told_apart_from_the_rest_and_the_largest_come_first(tmp_path):
    """A reviewer read a pair at 1.7e-07 (float32 rounding of a loss, every accuracy equal) named first, as
    "weaker pairing" as one at 0.009: the pairs are listed largest first, and those below ROUNDING_ONLY are
    counted apart."""
    ladder = rows()
    at = {(r["attention"], r["pe"], r["seed"], r["epochs"]): i for i, r in enumerate(ladder)}
    tiny, big = at[("favor", "ape", 0, 5)], at[("favor", "rope", 1, 10)]
    nudged = [ladder_epoch_rows(r, {2: 1e-7} if i == tiny else {3: 0.01} if i == big else None)
              for i, r in enumerate(ladder)]
    out = write_sweep(tmp_path / "mixed", "mixed", ladder, epochs=nudged)
    check = budget_ladder.shared_epochs(budget_ladder.ladder_rows(pd.DataFrame(ladder).assign(
        sweep="mixed", trial_key=[trial_key(r) for r in ladder])), budget_ladder.trial_epoch_curves(out))
    assert check.differences == pytest.approx((0.01, 0.01, 1e-7, 1e-7))
    assert [d.split(":")[0] for d in check.differing] == ["favor+rope seed 1"] * 2 + ["favor+ape seed 0"] * 2
    assert check.rounding_only == 2
    text = budget_ladder.shared_epochs_text(check)
    assert "4 pair(s) differ (largest |difference| 0.01; largest first): favor+rope seed 1: 5 vs 10" in text
    assert "Of these, 2 differ only by float rounding" in text and "the other 2 share their seed's" in text
    assert text.index("favor+rope seed 1") < text.index("favor+ape seed 0")


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


def partial_rows() -> list[dict]:
    """FIVE at 5 and 10 epochs, seeds 0-4, but relu+ape only seeds 0-2 at both (a study still running): it
    rises from last to first at 10 epochs; of the other four, seed 3 swaps the first two (by 2 points each way,
    too little to move a mean past the next)."""
    out = []
    for seed in range(5):
        at10 = [90.0, 80.0, 70.0, 60.0, 95.0]
        if seed == 3:
            at10[0], at10[1] = at10[1] - 2, at10[0] + 2
        for epochs, accs in ((5, (60.0, 55.0, 50.0, 45.0, 40.0)), (10, at10)):
            for (attention, pe), acc in zip(FIVE, accs):
                if (attention, pe) == ("relu", "ape") and seed >= 3:
                    continue
                out.append({**config_row(dataset="cifar10", attention=attention, pe=pe, epochs=epochs, seed=seed,
                                         lr_schedule="wsd", redraw_interval=10),
                            "test_acc": acc / 100, "test_acc_draw_mean": acc / 100, "n_train": 45000})
    return out


def test_every_seeds_tau_ranks_the_same_variants_where_a_variant_misses_seeds(tmp_path):
    """A publication rehearsal: with relu+ape at seeds 0-2 only, seeds 0-2 ranked 5 variants (tau 0.2: relu+ape
    passes the other four) and seeds 3-4 ranked 4, so their mean averaged over two variant sets and the variants
    column (5, from the means) named neither. Every seed's tau, and the tau of the means, now ranks the four
    variants that hold every seed used at both budgets, and the column says which was left out and why."""
    ladder = budget_ladder.ladder_rows(pd.DataFrame(partial_rows()))
    assert budget_ladder.seed_taus(ladder, 5, 10) == pytest.approx({0: 1.0, 1: 1.0, 2: 1.0, 3: 4 / 6, 4: 1.0})
    tau = budget_ladder.tau_interval(budget_ladder.per_budget(ladder), 5, 10, ladder)
    assert tau.variants == 4 and tau.of_means == pytest.approx(1.0) and tau.per_seed.n == (5,)
    assert tau.per_seed.point == pytest.approx((4 + 4 / 6) / 5)
    out = write_sweep(tmp_path / "partial", "partial", partial_rows())
    assert ("| 5 → 10 epochs | 0.933 [0.748, 1] (n=5 seeds; the t interval [0.748, 1.12] clipped to tau's range [-1, 1]) | 0: 1, 1: 1, 2: 1, 3: 0.667, 4: 1 | 1 | "
            "4 (relu+ape left out: seeds 3, 4 missing) |") in budget_ladder.build(out)
    assert ("5 → 10 epochs 0.933 [0.748, 1] (n=5 seeds; the t interval [0.748, 1.12] clipped to tau's range [-1, 1]), the rankings of the means: tau 1 (4 variants, relu+ape "
            "left out: seeds 3, 4 missing; 4 pairs swap order") in budget_ladder.summary(out)  # relu+ape's, Welch


def test_a_seed_that_several_variants_miss_is_left_out_rather_than_the_variants():
    """The block keeps the most (variant, seed) cells: where two of four variants miss seed 2, dropping them
    would leave 2 variants (no tau), so seed 2 is left out and named with the variants that miss it."""
    full = [r for r in rows() if not (r["attention"] == "favor" and r["seed"] == 2)]
    block = budget_ladder.paired_block(budget_ladder.ladder_rows(pd.DataFrame(full)), 5, 20)
    assert (block.variants, block.seeds) == (("favor+ape", "favor+rope", "softmax+ape", "softmax+rope"), (0, 1))
    assert block.text() == "4 (seed 2 left out: missing for favor+ape, favor+rope)"
    every = budget_ladder.paired_block(budget_ladder.ladder_rows(pd.DataFrame(rows())), 5, 20)
    assert every.text() == "4" and every.seeds == (0, 1, 2) and every.left_out == every.seeds_left_out == ()
