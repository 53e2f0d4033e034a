"""The seed-paired check beside the declared Welch tests (rpevit.analysis.seed_pairing), against a hand
computation with scipy and through confirmatory.build on written rows."""
from __future__ import annotations

import time

import numpy as np
import pytest
from scipy import stats as sps

from rpevit.analysis import confirmatory, seed_pairing, stats
from rpevit.sweep import declaration
from rpevit.sweep.declaration import parse
from tests.analysis_rows import config_row, write_sweep


def test_per_seed_combines_the_cells_at_the_seeds_every_cell_holds():
    a, b, c = {0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.4, 1: 0.45, 2: 0.5, 3: 0.9}, {1: 0.1, 2: 0.2}
    assert seed_pairing.per_seed([(1.0, a), (-1.0, b)]).tolist() == pytest.approx([0.1, 0.15, 0.2])
    # seed 0 is not in c, seed 3 only in b: (a - b) - 2c at seeds 1 and 2
    assert seed_pairing.per_seed([(1.0, a), (-1.0, b), (-2.0, c)]).tolist() == pytest.approx([-0.05, -0.2])
    assert seed_pairing.per_seed([]).size == 0


def outcome(a: dict[int, float], b: dict[int, float], complete: bool = True, alpha: float = 0.05,
            m: int = 2) -> confirmatory.Outcome:
    va, vb = np.array(list(a.values())) * 100, np.array(list(b.values())) * 100
    return confirmatory.Outcome(family="gap", a="a", b="b", values_a=tuple(a.values()), values_b=tuple(b.values()),
                                nominal=stats.welch(va, vb), holm=stats.welch(va, vb, 1 - alpha / m), k=2,
                                complete=complete, a_short="softmax+ape", b_short="favor+ape",
                                by_seed=((1.0, a), (-1.0, b)))


def test_a_correlated_pair_is_resolved_paired_and_not_by_welch_at_the_holm_level_by_hand():
    """Seeds that move both cells together: Welch sees the spread of each cell (2 points), the paired test the
    spread of the differences (0.1 points). k = 2 with the other item incomplete (p = 1): the complete one takes
    Holm's first step, level 1 - 0.05/2, in both tests."""
    a = {5: 0.70, 6: 0.72, 7: 0.74}
    b = {s: v - d for (s, v), d in zip(a.items(), (0.010, 0.011, 0.012))}
    declared = outcome(a, b)
    assert not declared.resolved
    missing = outcome({5: 0.7}, {5: 0.6}, complete=False)
    result, = seed_pairing.paired([declared, missing], 0.05)
    d = np.array([1.0, 1.1, 1.2])
    half = sps.t.ppf(1 - 0.05 / 2 / 2, 2) * d.std(ddof=1) / np.sqrt(3)
    assert (result.paired.point, result.paired.lo, result.paired.hi) == pytest.approx((1.1, 1.1 - half, 1.1 + half))
    assert result.paired.level == pytest.approx(0.975) and result.paired.n == (3,)
    assert result.paired.p == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue)
    assert result.paired_resolved and not result.declared_resolved and result.differs
    line = seed_pairing.text([("gap (epochs = 10)", [declared, missing])], 0.05)
    assert "of 1 complete comparison(s) and contrast(s)" in line and "narrower than the declared one for 1" in line
    assert ("differs for 1: softmax+ape − favor+ape (gap (epochs = 10)): declared " + declared.holm.text()
            + " not resolved, paired " + result.paired.text() + " resolved") in line


def test_an_anticorrelated_pair_is_wider_paired_and_agreeing_verdicts_are_said_in_one_clause():
    a = {5: 0.70, 6: 0.72, 7: 0.74}
    b = {s: v - 0.20 + 2 * (v - 0.72) * -1 for s, v in a.items()}  # b falls where a rises: differences spread
    declared = outcome(a, b, m=1)
    result, = seed_pairing.paired([declared], 0.05)
    assert result.paired.hi - result.paired.lo > declared.holm.hi - declared.holm.lo
    same = outcome({5: 0.70, 6: 0.72, 7: 0.74}, {5: 0.50, 6: 0.52, 7: 0.545}, m=1)
    assert seed_pairing.text([("f", [same])], 0.05).endswith("and the verdict is the same for every one.")
    assert seed_pairing.text([("f", [outcome({5: 0.7}, {5: 0.6}, complete=False)])], 0.05) == ""


DECLARE = {"seeds": [0, 1, 2, 3, 4], "metric": "test_acc",
           "families": [{"name": "gap", "comparisons": [[{"attention": "softmax", "pe": "ape"},
                                                         {"attention": "favor", "pe": "ape"}]]}]}


def test_the_confirmatory_page_carries_the_line_and_the_declared_verdict_stays_the_answer(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    start = time.time() + 10
    rows = []
    for seed, shift in enumerate((-0.02, -0.01, 0.0, 0.01, 0.02)):  # a seed moves both cells: paired resolves it
        for attention, acc in (("softmax", 0.80), ("favor", 0.795)):
            rows.append({**config_row(attention=attention, pe="ape", seed=seed), "test_acc": acc + shift + seed * 1e-4
                         * (attention == "favor"), "test_acc_draw_mean": acc + shift, "started_at": start})
    write_sweep(folder, "d", rows)
    text = confirmatory.build(folder)
    (o,), = [outcomes for _, outcomes in confirmatory.judge(folder)[2]]
    assert not o.resolved
    assert "- Seed pairing (exploratory, not the declared test):" in text and "differs for 1" in text
    assert "| attention=softmax pe=ape | attention=favor pe=ape |" in text and "| not resolved with 5 seeds |" in text
