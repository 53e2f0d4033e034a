"""Declared comparisons (rpevit/sweep/declaration.py) and their confirmatory table
(rpevit/analysis/confirmatory.py): refusals, the record in the sweep folder, and the table over
exactly the declared seeds and rows that started after the declaration."""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import numpy as np
import pytest

from rpevit.analysis import confirmatory, stats
from rpevit.analysis.common import fmt
from rpevit.sweep import declaration
from rpevit.sweep.declaration import DeclarationError, parse
from rpevit.sweep.space import SpaceError, expand_space
from tests.analysis_rows import config_row, write_sweep

DECLARE = {"metric": "judged", "seeds": [0, 1, 2], "families": [
    {"name": "gap", "comparisons": [[{"attention": "softmax", "pe": "ape"}, {"attention": "favor", "pe": "ape"}],
                                    [{"attention": "softmax", "pe": "rope"}, {"attention": "favor", "pe": "rope"}]]}]}
SPACE = {"name": "d", "fixed": {"dataset": "digits", "epochs": 1},
         "grid": {"attention": ["softmax", "favor"], "pe": ["ape", "rope"]}, "seeds": [0, 1, 2], "declare": DECLARE}


def space(**changes):
    return expand_space({**SPACE, **changes}, source="x.yaml")


def test_a_valid_declaration_is_checked_against_the_space():
    s = space()
    assert s.declaration.metric == "judged" and s.declaration.seeds == (0, 1, 2)
    assert len(s.declaration.families[0].comparisons) == 2


@pytest.mark.parametrize("declare, match", [
    ({**DECLARE, "metric": "val_acc"}, "'declare.metric' has value 'val_acc'; allowed: judged"),
    ({**DECLARE, "seeds": [0]}, "'declare.seeds' has value \\[0\\]; allowed: a list of at least 2"),
    ({**DECLARE, "extra": 1}, "'declare.extra'"),
    ({**DECLARE, "families": [{"name": "g", "comparisons": [[{"attention": "softmax", "seed": 0},
                                                            {"attention": "favor"}]]}]}, "'seed' is not one"),
    ({**DECLARE, "families": [{"name": "g", "comparisons": [[{"attention": "softmax"}]]}]}, "a pair \\[a, b\\]"),
])
def test_a_bad_block_is_refused_in_one_line(declare, match):
    with pytest.raises(SpaceError, match=match):
        space(declare=declare)


def test_sides_must_select_one_cell_holding_every_declared_seed():
    typo = {**DECLARE, "families": [{"name": "g", "comparisons": [[{"attention": "softmax", "pe": "apee"},
                                                                    {"attention": "favor", "pe": "ape"}]]}]}
    with pytest.raises(SpaceError, match="matches no trial of the space"):
        space(declare=typo)
    wide = {**DECLARE, "families": [{"name": "g", "comparisons": [[{"attention": "softmax"},
                                                                    {"attention": "favor", "pe": "ape"}]]}]}
    with pytest.raises(SpaceError, match="matches trials that differ in pe"):
        space(declare=wide)
    with pytest.raises(SpaceError, match="has no trial with seed\\(s\\) \\[3\\]"):
        space(declare={**DECLARE, "seeds": [0, 1, 2, 3]})


def test_the_record_is_fixed_once_rows_exist(tmp_path):
    decl = parse(DECLARE, "x")
    assert "recorded" in declaration.record(tmp_path, decl, rows_exist=False, redeclare=False)
    assert declaration.record(tmp_path, decl, rows_exist=True, redeclare=False) is None  # unchanged: nothing to do
    changed = parse({**DECLARE, "seeds": [0, 1, 2, 3, 4]}, "x")  # seeds added after a look
    with pytest.raises(DeclarationError, match="changed after trials of this sweep ran"):
        declaration.record(tmp_path, changed, rows_exist=True, redeclare=False)
    assert "exploratory" in declaration.record(tmp_path, changed, rows_exist=True, redeclare=True)
    entries = json.loads((tmp_path / declaration.DECLARATION_FILE).read_text())["declarations"]
    assert [e["declaration"]["seeds"] for e in entries] == [[0, 1, 2], [0, 1, 2, 3, 4]]


def test_a_declaration_added_after_rows_exist_is_refused(tmp_path):
    with pytest.raises(DeclarationError, match="was added after trials"):
        declaration.record(tmp_path, parse(DECLARE, "x"), rows_exist=True, redeclare=False)


def test_a_planted_or_damaged_record_is_refused(tmp_path):
    (tmp_path / declaration.DECLARATION_FILE).write_text("{not json")
    with pytest.raises(DeclarationError, match="cannot be read"):
        declaration.read_record(tmp_path)
    (tmp_path / declaration.DECLARATION_FILE).unlink()
    (tmp_path / declaration.DECLARATION_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DeclarationError, match="not a regular file"):
        declaration.read_record(tmp_path)
    (tmp_path / declaration.DECLARATION_FILE).unlink()
    os.mkfifo(tmp_path / declaration.DECLARATION_FILE)  # opened once, never waited on (no check-then-read window)
    with pytest.raises(DeclarationError, match="not a regular file"):
        declaration.read_record(tmp_path)


ACC = {("softmax", "ape"): [0.90, 0.91, 0.92, 0.60], ("favor", "ape"): [0.80, 0.81, 0.82, 0.99],
       ("softmax", "rope"): [0.90, 0.85, 0.95], ("favor", "rope"): [0.89, 0.86, 0.92]}


def rows(started_at: float, seeds=(0, 1, 2, 3)) -> list[dict]:
    out = []
    for (attention, pe), accs in ACC.items():
        for seed, acc in zip(seeds, accs):
            out.append({**config_row(dataset="digits", epochs=1, attention=attention, pe=pe, seed=seed,
                                     redraw_interval=100),
                        "test_acc": acc if attention == "softmax" else 0.1, "test_acc_draw_mean": acc,
                        "started_at": started_at, "finished_at": started_at + 1})
    return out


def test_the_table_uses_only_declared_seeds_after_the_declaration(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "d", rows(time.time() + 10))
    decl, _, families, set_aside = confirmatory.judge(folder)
    (name, outcomes), = families
    ape, rope = outcomes
    assert ape.values_a == (0.90, 0.91, 0.92) and ape.values_b == (0.80, 0.81, 0.82)  # seed 3 is not declared
    assert ape.nominal.point == pytest.approx(10.0) and ape.k == 2
    assert ape.resolved and ape.verdict(3) == "resolved: attention=softmax pe=ape higher"
    assert not rope.resolved and rope.verdict(3) == "not resolved with 3 seeds"
    assert ape.holm.level == pytest.approx(1 - 0.05 / 2)  # the smaller p is judged at alpha / k
    assert set_aside["a seed outside the declared ones"] == 2
    text = confirmatory.build(folder)
    assert "Holm within each family" in text and "resolved: attention=softmax pe=ape higher" in text


def test_rows_that_started_before_the_declaration_are_not_confirmatory(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    write_sweep(folder, "d", rows(time.time() - 3600))  # ran an hour before the comparisons were declared
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=True, redeclare=True)
    _, _, families, set_aside = confirmatory.judge(folder)
    assert all(not o.complete and "incomplete: 0 and 0 of the 3" in o.verdict(3) for o in families[0][1])
    assert set_aside["started before the declaration was recorded (or no start time)"] == 12


def declared_without(tmp_path, pe: str, seed: int):
    """A folder declared before its rows ran, every row but (softmax and favor) x `pe` x `seed`; its folder and
    first family's two items (ape, rope)."""
    folder = tmp_path / "d"
    folder.mkdir()
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "d", [r for r in rows(time.time() + 10) if not (r["pe"] == pe and r["seed"] == seed)])
    _, _, families, _ = confirmatory.judge(folder)
    return folder, families[0][1]


def test_an_incomplete_cell_gets_no_verdict(tmp_path):
    _, (ape, rope) = declared_without(tmp_path, "ape", 2)
    assert not ape.complete and not ape.resolved and ape.verdict(3).startswith("incomplete: 2 and 2 of the 3")
    # the complete item's "not resolved" could change once its family is complete only if Holm would resolve it
    # were the incomplete item to come in at p = 0 (a review read "for now" on items no later step could resolve)
    best = stats.holm([rope.nominal.p, 0.0])[0]
    assert rope.complete and rope.could_resolve == (best <= 0.05)
    assert rope.verdict(3) == ("not resolved with 3 seeds (for now: 1 item of its family incomplete, counted as not "
                               "rejected)" if best <= 0.05 else "not resolved with 3 seeds (final whatever the 1 "
                               "incomplete item of its family gives: Holm would not resolve it even were it to take "
                               "the first steps)")


def test_a_not_resolved_item_reads_for_now_only_where_holm_would_resolve_it_in_the_best_case():
    """k = 3, one item incomplete. Best case: it comes in at p = 0 and takes Holm's first step; the next level is
    alpha/2. p = 0.02 is then resolved (for now); p = 0.03 and 0.04, though each 95% interval excludes 0, are not
    (0.03 > 0.025): final. A review found the 95%-interval rule printing "for now" on such items."""
    def family(ps):
        return stats.holm([*ps, 0.0])

    assert family([0.03, 0.04])[:2] == pytest.approx([0.06, 0.06])  # neither can ever be rejected
    assert family([0.02, 0.04])[0] == pytest.approx(0.04)  # rejected in the best case
    holm = stats.Interval(1.0, -0.2, 2.2, (5, 5), 0.9833, 0.03, 8.0)
    kw = dict(family="gap", a="a", b="b", values_a=(), values_b=(), holm=holm, k=3, complete=True, pending=1,
              nominal=stats.Interval(1.0, 0.05, 1.95, (5, 5), 0.95, 0.03, 8.0))
    never = confirmatory.Outcome(could_resolve=False, **kw)
    could = confirmatory.Outcome(could_resolve=True, **kw)
    assert could.verdict(5) == ("not resolved with 5 seeds (for now: 1 item of its family incomplete, counted as "
                                "not rejected)")
    assert never.verdict(5) == ("not resolved with 5 seeds (final whatever the 1 incomplete item of its family "
                                "gives: Holm would not resolve it even were it to take the first steps)")
    assert replace(never, pending=2).verdict(5).endswith("items of its family give: Holm would not resolve it even "
                                                         "were they to take the first steps)")
    assert replace(never, pending=0).verdict(5) == "not resolved with 5 seeds"


def test_judge_family_sets_could_resolve_from_the_best_case_of_the_incomplete_items(tmp_path):
    """Through judge on written rows: two complete items and one cell short of a seed. Each complete item's
    could_resolve equals Holm's verdict over its family with the incomplete item at p = 0."""
    folder = tmp_path / "d"
    folder.mkdir()
    three = {**DECLARE, "families": [{"name": "gap", "comparisons": [
        [{"attention": "softmax", "pe": "ape"}, {"attention": "favor", "pe": "ape"}],
        [{"attention": "softmax", "pe": "rope"}, {"attention": "favor", "pe": "rope"}],
        [{"attention": "softmax", "pe": "ape"}, {"attention": "softmax", "pe": "rope"}]]}]}
    declaration.record(folder, parse(three, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "d", [r for r in rows(time.time() + 10)
                              if not (r["attention"], r["pe"], r["seed"]) == ("softmax", "rope", 2)])
    _, _, families, _ = confirmatory.judge(folder)
    (_, items), = families
    assert [o.complete for o in items] == [True, False, False]
    ape = items[0]
    best = stats.holm([ape.nominal.p, 0.0, 0.0])[0]
    assert ape.could_resolve == (best <= 0.05)
    assert best <= 0.05 and ape.verdict(3) == (  # resolved already: "for now" says it stays so whatever the rest gives
        "resolved: attention=softmax pe=ape higher (for now: its Holm level may fall, its interval narrow, while 2 "
        "items of its family are incomplete; resolved stays resolved)")
    assert ape.pending == 2


def test_an_incomplete_item_shows_no_interim_estimate_and_a_resolved_one_says_its_level_may_fall(tmp_path):
    """An independent review: the detailed table printed an incomplete item's interim interval (the second look
    the declaration rules out), and a resolved item beside an incomplete one read as final though its Holm
    level can still fall (the incomplete one, judged later, may take a step before it); it cannot be reversed."""
    folder, (ape, rope) = declared_without(tmp_path, "rope", 2)
    assert ape.resolved and ape.verdict(3) == ("resolved: attention=softmax pe=ape higher (for now: its Holm level "
                                               "may fall, its interval narrow, while 1 item of its family is "
                                               "incomplete; resolved stays resolved)")
    text = confirmatory.build(folder)
    row, = [line for line in text.splitlines() if line.startswith("| attention=softmax pe=rope")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:8] == ["—"] * 6 and cells[8].startswith("incomplete: 2 and 2 of the 3"), cells  # nor a p
    assert "from the first that is not resolved on, every item is shown at that step's level" in text


def test_a_folder_without_a_declaration_says_so(tmp_path):
    write_sweep(tmp_path / "d", "d", rows(time.time()))
    with pytest.raises(DeclarationError, match="declared no comparisons"):
        confirmatory.judge(tmp_path / "d")


# ---------------------------------------------------------------- contrasts, trends, two metrics (issue 58)
LADDER = {"name": "l", "fixed": {"dataset": "digits", "lr_schedule": "wsd", "warmup_epochs": 0.5}, "branch": "epochs",
          "grid": {"attention": ["softmax", "favor"], "pe": ["ape", "rope"], "epochs": [10, 5]}, "seeds": [0, 1, 2]}
GAP_APE = [{"attention": "softmax", "pe": "ape"}, {"attention": "favor", "pe": "ape"}]
GAP_ROPE = [{"attention": "softmax", "pe": "rope"}, {"attention": "favor", "pe": "rope"}]
CONTRAST = {"name": "narrowing", "for_each": "epochs", "secondary_metric": "test_acc", "contrasts": [[GAP_APE, GAP_ROPE]]}
TREND = {"name": "trend", "trend": {"field": "epochs", "from": 5, "to": 10}, "comparisons": [GAP_APE, GAP_ROPE]}


def ladder(*families):
    return expand_space({**LADDER, "declare": {"metric": "judged", "seeds": [0, 1, 2], "families": list(families)}},
                        source="x.yaml")


def test_a_contrast_and_a_trend_are_declared_and_checked_against_the_space():
    s = ladder(CONTRAST, TREND)
    contrast, trend = s.declaration.families
    assert contrast.kind == "contrast" and contrast.size == 1 and contrast.metrics("judged") == ("judged", "test_acc")
    assert len(contrast.sides()) == 4 and contrast.contrasts[0][1][1] == {"attention": "favor", "pe": "rope"}
    assert trend.kind == "trend" and trend.trend.start == 5 and trend.trend.end == 10 and trend.size == 2
    assert declaration.family_levels(trend, [{"epochs": 10}, {"epochs": 5}]) == [{"epochs": 5}, {"epochs": 10}]
    again = parse(s.declaration.to_dict(), "declaration.json")  # the record round-trips exactly
    assert again == s.declaration and again.digest() == s.declaration.digest()


def test_a_family_without_the_new_keys_serialises_as_before():
    """The digest of a declaration recorded before contrasts existed must not move (its study resumes)."""
    assert set(parse(DECLARE, "x").to_dict()["families"][0]) == {"name", "for_each", "comparisons"}


@pytest.mark.parametrize("family, match", [
    ({**CONTRAST, "contrasts": [[GAP_APE]]}, "contrasts\\[0\\]' has value .*allowed: \\[\\[a1, b1\\], \\[a2, b2\\]\\]"),
    ({**CONTRAST, "contrasts": [[GAP_APE, GAP_APE]]}, "allowed: two different pairs"),
    ({**CONTRAST, "comparisons": [GAP_APE]}, "either comparisons or contrasts"),
    ({**CONTRAST, "secondary_metric": "val_acc"}, "secondary_metric' has value 'val_acc'; allowed: judged"),
    ({**CONTRAST, "secondary_metric": "judged"}, "a metric other than the family's primary one"),
    ({**CONTRAST, "trend": TREND["trend"]}, "a trend of comparisons"),
    ({**TREND, "trend": {"field": "epochs", "from": 5}}, "trend' has value .*allowed: a mapping \\{field"),
    ({**TREND, "trend": {"field": "epochs", "from": 5, "to": 5}}, "two different values"),
    ({**TREND, "trend": {"field": "seed", "from": 5, "to": 10}}, "field' has value 'seed'"),
    ({**TREND, "for_each": "epochs"}, "other than seed, data_dir and the family's for_each"),
    ({**TREND, "comparisons": [[{"attention": "softmax", "epochs": 5}, {"attention": "favor"}]]},
     "sides without 'epochs'"),
    ({**TREND, "trend": {"field": "epochs", "from": 5, "to": 8}}, "at epochs=8 matches no trial of the space"),
    # an end names the rungs in every generated table and sentence: a string where epochs are numbers (an
    # audit put HTML and a heading into confirmatory.md and PROGRESS.md through one) is refused at parse
    ({**TREND, "trend": {"field": "epochs", "from": 5, "to": "10 <img src=x>\n# H"}},
     r"trend\.to' has value .*allowed: an integer"),
    ({**TREND, "trend": {"field": "epochs", "from": True, "to": 10}}, r"trend\.from' has value True; allowed: an integer"),
    ({**TREND, "comparisons": [[{"attention": "softmax"}, {"attention": "favor"}]],
      "trend": {"field": "lr", "from": 0.001, "to": "nan"}}, r"trend\.to' has value 'nan'; allowed: a finite number"),
    ({**TREND, "comparisons": [[{"pe": "ape"}, {"pe": "rope"}]],
      "trend": {"field": "attention", "from": "softmax", "to": "fa`vor"}}, r"trend\.to' has value .*allowed: a value of the text"),
])
def test_a_bad_contrast_or_trend_is_refused_in_one_line(family, match):
    with pytest.raises(SpaceError, match=match):
        ladder(family)


def ladder_rows(started_at: float, drop: tuple = ()) -> list[dict]:
    """softmax/favor x ape/rope x epochs 5, 10 x seeds 0-2 with constructed accuracies: softmax a + 0.01 seed;
    favor's fresh-draw mean 0.10 (ape) or 0.04 (rope) below softmax at 5 epochs, half that at 10; favor's
    training draw (test_acc) 0.02 above its fresh-draw mean. `drop`: (attention, pe, epochs, seed) left out."""
    out = []
    for attention in ("softmax", "favor"):
        for pe, gap in (("ape", 0.10), ("rope", 0.04)):
            for epochs in (5, 10):
                for seed in range(3):
                    if (attention, pe, epochs, seed) in drop:
                        continue
                    base = 0.80 + 0.05 * (epochs == 10) + 0.01 * seed
                    judged = base - (gap / (1 + (epochs == 10)) + 0.003 * seed * (pe == "ape") if attention == "favor" else 0)
                    own = judged + 0.02 if attention == "favor" else judged
                    out.append({**config_row(dataset="digits", epochs=epochs, attention=attention, pe=pe, seed=seed,
                                             redraw_interval=100, lr_schedule="wsd", warmup_epochs=0.5),
                                "test_acc": own, "test_acc_draw_mean": judged,
                                "started_at": started_at, "finished_at": started_at + 1})
    return out


def judged_ladder(tmp_path, rows):
    folder = tmp_path / "l"
    folder.mkdir(parents=True)
    declaration.record(folder, ladder(CONTRAST, TREND).declaration, rows_exist=False, redeclare=False)
    write_sweep(folder, "l", rows)
    return confirmatory.judge(folder), folder


def test_a_contrast_of_gaps_is_judged_on_both_metrics_at_each_rung(tmp_path):
    (decl, _, families, _), folder = judged_ladder(tmp_path, ladder_rows(time.time() + 10))
    names = [name for name, _ in families]
    assert names[:4] == ["narrowing (epochs = 5; judged accuracy, primary)", "narrowing (epochs = 5; training draw (test_acc))",
                         "narrowing (epochs = 10; judged accuracy, primary)", "narrowing (epochs = 10; training draw (test_acc))"]
    (contrast,) = families[0][1]
    # by hand at 5 epochs, in points: gap(ape) per seed 10, 10.3, 10.6 (mean 10.3); gap(rope) 4 -> contrast 6.3
    assert contrast.kind == "contrast" and contrast.complete and contrast.nominal.point == pytest.approx(6.3)
    sm = [80, 81, 82]
    cells = [sm, [80 - 10, 81 - 10.3, 82 - 10.6], sm, [76, 77, 78]]
    expected = stats_of(cells)
    assert (contrast.nominal.lo, contrast.nominal.hi) == pytest.approx((expected.lo, expected.hi))
    assert contrast.resolved and contrast.verdict(3).startswith("resolved: gap 2 (softmax+rope − favor+rope) smaller")
    (on_training_draw,) = families[1][1]  # favor's training draw is 2 points higher in every cell: same contrast
    assert on_training_draw.metric == "test_acc" and on_training_draw.nominal.point == pytest.approx(6.3)
    text = confirmatory.build(folder)
    assert "gap 1 − gap 2 at its Holm level" in text and "the fresh-draw penalty" in text
    assert "Paired by seed because the rungs of one seed share its initialisation and data order" in text


def stats_of(cells):
    from rpevit.analysis import stats
    return stats.contrast(cells, [1, -1, -1, 1])


def test_a_trend_is_paired_by_seed_and_needs_every_rung_of_a_seed(tmp_path):
    (_, _, families, _), _ = judged_ladder(tmp_path, ladder_rows(time.time() + 10))
    trend = dict(families)["trend (epochs 5 → 10)"]
    ape, rope = trend
    # gap(ape) per seed at 5: 10 + 0.3 s, at 10: 5 + 0.3 s -> change -5 on every seed (no spread: a point interval)
    assert ape.kind == "trend" and ape.nominal.point == pytest.approx(-5.0) and ape.nominal.n == (3,)
    assert ape.values_a == pytest.approx((0.05, 0.053, 0.056)) and ape.resolved
    assert ape.verdict(3) == ("resolved: the gap falls from the shorter budget to the longer (signed, in points: 10.3 "
                              "at the shorter budget, 5.3 at the longer)")
    assert rope.nominal.point == pytest.approx(-2.0)
    (_, _, families, _), _ = judged_ladder(tmp_path / "cut", ladder_rows(time.time() + 10, drop={("favor", "ape", 10, 1)}))
    ape = dict(families)["trend (epochs 5 → 10)"][0]
    assert not ape.complete and ape.verdict(3) == ("incomplete: 2 of the 3 declared seeds with every rung (no verdict "
                                                   "before n is reached)")


def test_a_trend_shows_each_ends_gap_with_welch_and_says_where_it_falls_below_0(tmp_path):
    """A publication rehearsal: the trend's 'mean gap' columns were one-sample intervals over per-seed gaps
    (pairing softmax and FAVOR+ runs by seed, which are independent), so the same gap read 0.611 [-0.137, 1.36]
    beside the comparison table's 0.611 [0.103, 1.12]; and 'the gap falls' was said of a gap that fell through 0
    to the other side, which grew in size. Now each end's gap is Welch's interval of its two cells (the same as
    a comparison of them), and the verdict names the signed ends and where one is below 0."""
    from rpevit.analysis.stats import welch

    (_, _, families, _), _ = judged_ladder(tmp_path / "a", ladder_rows(time.time() + 10))
    ape = dict(families)["trend (epochs 5 → 10)"][0]
    softmax_10, favor_10 = [0.85, 0.86, 0.87], [0.80, 0.807, 0.814]
    assert ape.gaps[0].text() == welch(np.array(softmax_10) * 100, np.array(favor_10) * 100).text()
    assert [g.n for g in ape.gaps] == [(3, 3), (3, 3)]
    assert confirmatory.outcome_row(ape, 3)[2:4] == [g.text() for g in ape.gaps]
    assert ape.direction == "the gap falls"

    ahead = [{**r, "test_acc_draw_mean": r["test_acc_draw_mean"] + 0.10, "test_acc": r["test_acc"] + 0.10}
             if (r["attention"], r["pe"], r["epochs"]) == ("favor", "ape", 10) else r for r in ladder_rows(time.time() + 10)]
    (_, _, families, _), _ = judged_ladder(tmp_path / "b", ahead)
    ape = dict(families)["trend (epochs 5 → 10)"][0]
    assert ape.resolved and ape.gaps[0].point == pytest.approx(-4.7)
    assert ape.verdict(3) == ("resolved: the gap falls from the shorter budget to the longer (signed, in points: 10.3 "
                              "at the shorter budget, -4.7 at the longer; below 0 at the longer: its second cell ahead)")
    assert ape.direction == "the gap falls, to below 0"


def test_a_family_with_a_secondary_metric_gets_both_verdicts_side_by_side(tmp_path):
    (_, _, families, _), folder = judged_ladder(tmp_path, ladder_rows(time.time() + 10))
    text = confirmatory.build(folder)
    assert "### narrowing (epochs = 5): both declared metrics side by side" in text
    assert ("| item | judged accuracy: at its Holm level | judged accuracy: verdict | training draw (test_acc): at its "
            "Holm level | training draw (test_acc): verdict | judged accuracy − training draw (test_acc) (points) |") in text
    # favor's training draw is 2 points above its fresh-draw mean in every cell: the contrast is the same on both
    # metrics, so the difference of the two estimates is 0 (a gap alone would differ by the 2-point penalty)
    row = next(line for line in text.splitlines() if line.startswith("| (softmax+ape − favor+ape) − (softmax+rope"))
    assert row.endswith("| 0 |")
    assert text.count("the fresh-draw penalty") >= 3  # the header and one sentence per side-by-side table


def test_a_contrast_shows_each_signed_gap_and_says_when_gap_2_is_below_0(tmp_path):
    """A reviewer: 'smaller' is signed, the question is 'narrower'; with the RPE's gap below 0 (the linear backend
    ahead) a resolved positive contrast is no narrowing. Each gap is shown (Welch, 95%) beside the contrast, the
    verdict names both signed points, and the headline says 'reverses' only where that gap's interval is below 0
    (a publication rehearsal: it said so of a point below 0 whose interval included 0); the side-by-side column is
    named as a difference of penalties for a contrast, not one penalty."""
    from rpevit.analysis import headline
    from rpevit.analysis.stats import welch

    (decl, _, families, _), folder = judged_ladder(tmp_path / "a", ladder_rows(time.time() + 10))
    (contrast,) = families[0][1]
    gap_ape = welch(np.array([80, 81, 82.0]), np.array([70, 70.7, 71.4]))
    assert [g.point for g in contrast.gaps] == pytest.approx([gap_ape.point, 4.0])
    assert contrast.verdict(3).endswith(f"(signed: gap 1 {fmt(gap_ape.point, 3)}, gap 2 4 points)")
    assert headline._verdict(contrast, 3, True) == "narrows the gap"
    row = confirmatory.outcome_row(contrast, 3)
    assert row[2:4] == [g.text() for g in contrast.gaps]
    text = confirmatory.build(folder)
    assert "the difference of the two random-feature cells' fresh-draw penalties" in text

    ahead = [{**r, "test_acc_draw_mean": r["test_acc_draw_mean"] + 0.06, "test_acc": r["test_acc"] + 0.06}
             if (r["attention"], r["pe"]) == ("favor", "rope") else r for r in ladder_rows(time.time() + 10)]
    (_, _, families, _), _ = judged_ladder(tmp_path / "b", ahead)
    (contrast,) = families[0][1]
    assert contrast.gaps[1].point == pytest.approx(-2.0) and contrast.resolved
    assert "gap 2 < 0: its second cell ahead" in contrast.verdict(3)
    assert contrast.gaps[1].hi > 0 and contrast.direction == "gap 2 smaller, below 0"  # -2, interval includes 0
    assert headline._verdict(contrast, 3, True) == ("narrows the gap (with the RPE the gap's sign is not resolved: its "
                                                    "95% interval includes 0)")
    assert headline._verdict(contrast, 3, False) == ("excludes 0 (exploratory: narrows; with the RPE the gap's sign is "
                                                     "not resolved: its 95% interval includes 0)")
    further = [{**r, "test_acc_draw_mean": r["test_acc_draw_mean"] + 0.10, "test_acc": r["test_acc"] + 0.10}
               if (r["attention"], r["pe"]) == ("favor", "rope") else r for r in ladder_rows(time.time() + 10)]
    (_, _, families, _), _ = judged_ladder(tmp_path / "c", further)
    (contrast,) = families[0][1]
    assert contrast.gaps[1].hi < 0 and contrast.resolved
    assert headline._verdict(contrast, 3, True) == ("reverses the gap (with the RPE the linear backend is ahead, 95% "
                                                    "Welch)")


def test_a_trend_states_its_premise_as_checked_on_the_rows(tmp_path):
    """A reviewer: the trend's method says a seed's rungs share a trunk, while some trunks were trained again from
    epoch 0; the shared-epochs check (budget_ladder.shared_epochs) now stands in the method, from the rows."""
    (_, _, _, _), folder = judged_ladder(tmp_path, ladder_rows(time.time() + 10))
    line = [ln for ln in confirmatory.build(folder).splitlines() if ln.startswith("- The trend's premise")]
    assert len(line) == 1 and "Not checked: no two rungs of one configuration" in line[0]  # these rows: no epoch rows


@pytest.mark.parametrize("study", ["cifar10_ladder_cpu", "mnist_headline_cpu", "cifar10_ladder40_cpu"])
def test_each_items_holm_adjusted_p_is_at_most_alpha_exactly_where_it_is_resolved(study):
    """A reviewer could not see the order Holm took the items in, nor a verdict's margin (a trend 'not resolved,
    final' at p 0.0505 against 0.05): each table now gives p and the Holm-adjusted p. Brute force over the
    committed studies: the adjusted p (stats.holm over the family, incomplete items at p = 1) is at most alpha
    exactly for the resolved items, and the i-th smallest p's adjusted value is (k - i + 1) p where Holm's steps
    have not stopped earlier."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "results" / study
    decl, _, families, _ = confirmatory.judge(folder)
    checked = 0
    for _, outcomes in families:
        shown = confirmatory.p_values(outcomes)
        for o, (p_text, adjusted_text) in zip(outcomes, shown):
            if not o.complete:
                assert (p_text, adjusted_text) == ("—", "—")
                continue
            assert float(p_text) == pytest.approx(o.nominal.p, rel=5e-3)
            assert (float(adjusted_text) <= decl.alpha) == o.resolved, (o.label, adjusted_text, o.verdict(5))
            checked += 1
        raw = sorted(o.nominal.p if o.complete else 1.0 for o in outcomes)
        k, running, by_definition = len(outcomes), 0.0, []
        for i, p in enumerate(raw):  # Holm's adjusted p by its definition, against stats.holm
            running = max(running, min(1.0, (k - i) * p))
            by_definition.append(running)
        assert stats.holm(raw) == pytest.approx(by_definition)
    assert checked > 0
    text = (folder / "confirmatory.md").read_text(encoding="utf-8")
    assert "| p (two-sided) | p, Holm-adjusted | verdict |" in text
    assert "not simultaneous confidence intervals" in text and "nothing is corrected across rungs" in text
