"""rpevit/analysis/gap_closure/ on rows written by the real Parquet writer: G, Holm verdicts, the
draw-aware tables and the gap-closure figure."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from rpevit.analysis import common, efficiency, gap_closure, stats
from rpevit.sweep.results import TRIALS_FILE
from tests.analysis_rows import ACCURACIES, assert_readable_and_inside, config_row, png_ok, train_rows, write_sweep


# ---------------------------------------------------------------- helpers
def judged(point: float, lo: float, hi: float, p_adjusted: float = 0.01, p: float = 0.001,
           n: tuple = (3, 3, 3)) -> stats.Judged:
    interval = stats.Interval(point, lo, hi, n, level=0.99, p=p)
    return stats.Judged(interval, interval, p_adjusted, k=3)


def test_effect_of_an_encoding_from_its_holm_verdict():
    resolved = gap_closure.Gap(state="resolved")
    up, down = stats.Interval(0.01), stats.Interval(-0.01)  # the gain at the same level: its sign
    effect = gap_closure.effect
    assert effect(resolved, judged(0.4, 0.2, 0.6), up) == "narrows (not fully)"
    # an interval holding 1 does not show the gap closed: it narrows it, G = 1 not excluded
    assert effect(resolved, judged(0.9, 0.5, 1.2), up) == effect(resolved, judged(1.3, 0.3, 9.8), up) == \
        "narrows (G = 1 not excluded)"
    assert effect(resolved, judged(1.3, 1.1, 1.5), up) == "narrows (overshoots)"
    assert effect(resolved, judged(-0.5, -0.8, -0.1), down) == "widens"
    # Holm does not reject: no effect, whatever the point says; the seed counts are named
    unresolved = judged(0.4, 0.2, 0.6, p_adjusted=0.2, n=(3, 5, 3))
    assert effect(resolved, unresolved, up) == "not resolved with 3, 5 and 3 seeds"
    assert effect(resolved, judged(0.1, math.nan, math.nan, p=math.nan), up) == "no interval (one seed)"
    # a resolved gain without a resolved gap (or with an unbounded G) raises or lowers b+ape: no G claim
    assert effect(gap_closure.Gap(state="not resolved"), judged(0.4, 0.2, 0.6), up) == "raises"
    assert effect(resolved, judged(3.0, -math.inf, math.inf), down) == "lowers"


def test_effect_phrases_never_say_closes_and_name_why_a_gain_is_no_G():
    """A reviewer's reading: 'closes it (G interval at its Holm level above 0, reaching 1)' said of G 0.706,
    Holm [0.464, 1.12]: not excluding 1 is no evidence of closing. And 'raises favor+ape (no resolved gap for
    a G)' was said in a family whose gap is resolved (G was only unbounded at its own, stricter Holm level)."""
    from rpevit.analysis.gap_closure.compute import EFFECT_PHRASE, effect_phrase, fallback_why

    assert not any("closes" in phrase for phrase in EFFECT_PHRASE.values())
    assert effect_phrase("narrows (G = 1 not excluded)", "favor") == \
        "narrows it (G = 1, full closure, not excluded at its Holm level)"
    assert effect_phrase("narrows (not fully)", "favor") == "narrows it (not fully: G below 1 at its Holm level)"
    assert effect_phrase("narrows (overshoots)", "favor") == "narrows it (overshoots: G above 1 at its Holm level)"
    unbounded = judged(3.0, -math.inf, math.inf)
    assert fallback_why(gap_closure.Gap(state="resolved"), unbounded) == "G unbounded at its Holm level"
    assert fallback_why(gap_closure.Gap(state="not resolved"), unbounded) == "no resolved gap for a G"
    assert effect_phrase("raises", "favor", fallback_why(gap_closure.Gap(state="ahead"), unbounded)) == \
        "raises favor+ape (no gap to close: favor+ape ahead of softmax+ape)"


# one Performer configuration measured from accuracies by hand (no softmax+rope: the family is the gap and rope's G)
CONFIG = ("d", "favor", "none", "off")


def family_of(soft: list[float], base: list[float], pe: list[float]) -> gap_closure.Assessment:
    acc = {("d", "softmax", "ape", "none", "off"): np.array(soft), ("d", "favor", "ape", "none", "off"): np.array(base),
           ("d", "favor", "rope", "none", "off"): np.array(pe)}
    return gap_closure.measure(acc, CONFIG, ["rope"])


def test_a_G_interval_reaching_1_narrows_the_gap_and_is_never_worded_as_closing_it():
    """Gap 10 points, resolved; G 0.8, Holm [0.602, 1.03]: above 0, holds 1. It said 'closes it'."""
    from rpevit.analysis.gap_closure import text as words

    a = family_of([0.90, 0.91, 0.92], [0.80, 0.81, 0.82], [0.88, 0.89, 0.90])
    rope = a.closures["rope"]
    assert a.gap.state == "resolved" and rope.G_holm.interval.lo > 0 and rope.G_holm.interval.hi > 1
    verdict = words.effect_list(a, "favor")
    assert "narrows it (G = 1, full closure, not excluded at its Holm level): rope (G 0.8 [0.602, 1.03]" in verdict
    assert "closes" not in verdict
    table = words.gap_table({CONFIG: a})
    assert "| narrows it, G = 1, full closure, not excluded at its Holm level (k=2) |" in table
    assert "closes" not in table


def test_a_resolved_gap_with_G_unbounded_at_its_holm_level_says_so_not_no_resolved_gap():
    """Gap 5 [0.845, 9.16] resolved at its Holm level (95%); rope's gain is the stronger test, so G is judged
    at 97.5%, where the gap's interval holds 0 and Fieller's G is unbounded."""
    from rpevit.analysis.gap_closure import text as words

    a = family_of([0.84, 0.86, 0.88], [0.80, 0.81, 0.82], [0.95, 0.951, 0.952])
    rope = a.closures["rope"]
    assert a.gap.state == "resolved" and rope.G_holm.interval.unbounded and rope.effect == "raises"
    verdict = words.effect_list(a, "favor")
    assert "raises favor+ape (G unbounded at its Holm level): rope" in verdict
    assert "no resolved gap" not in verdict
    assert "| raises b+ape, G unbounded at its Holm level (k=2) |" in words.gap_table({CONFIG: a})
    unresolved = family_of([0.90, 0.97, 0.83], [0.880, 0.882, 0.884], [0.970, 0.971, 0.972])
    assert unresolved.gap.state == "not resolved" and unresolved.closures["rope"].effect == "raises"
    assert "raises favor+ape (no resolved gap for a G): rope" in words.effect_list(unresolved, "favor")


def test_a_G_at_95_without_a_gap_resolved_at_its_holm_level_is_labelled_exploratory(tmp_path, figures):
    """Gap 5 points, 95% [0.845, 9.16] but not resolved at its Holm level (97.5%): G 0.6 [-0.207, 3.57] at 95%
    stood beside 'G undefined: gap not resolved' and 'so G is not defined'. It is labelled, in the table,
    the verdict and the figure (a dashed outline, not a filled bar), and a resolved gap's G is not."""
    from rpevit.analysis.gap_closure import text as words

    label = "G at 95% only (exploratory; the gap is not resolved at its Holm level)"
    a = family_of([0.84, 0.86, 0.88], [0.80, 0.81, 0.82], [0.82, 0.84, 0.86])
    rope = a.closures["rope"]
    assert a.gap.state == "not resolved" and rope.G.bounded and a.gap.nominal.excludes(0)
    assert words.G_cell(rope, a.gap) == f"{rope.G.text()}; {label}"
    table = words.gap_table({CONFIG: a})
    assert f"| 0.6 [-0.207, 3.57] (n=3,3,3); {label} |" in table and "G undefined" not in table
    assert "| not resolved with 3 seeds; no resolved gap for a G (k=2) |" in table
    verdict = words.effect_list(a, "favor")
    assert "not defined" not in verdict
    assert ": not resolved with 3 seeds, so no G at its Holm level (the G at 95% in the table and figure is " \
           "exploratory only)." in verdict
    resolved = family_of([0.90, 0.91, 0.92], [0.80, 0.81, 0.82], [0.88, 0.89, 0.90])
    assert words.G_cell(resolved.closures["rope"], resolved.gap) == resolved.closures["rope"].G.text()
    assert "exploratory" not in words.effect_list(resolved, "favor")
    gap_closure.plot_gap_closure({gap_closure.DRAW_MEAN: {CONFIG: a}, gap_closure.TRAIN_DRAW: {CONFIG: resolved}},
                                 tmp_path / "g.png")
    fig = figures[-1]
    ax = fig.axes[0]
    bars = [p for c in ax.containers if hasattr(c, "patches") for p in c.patches]
    outline = [b for b in bars if b.get_facecolor()[3] == 0]
    assert len(bars) == 2 and len(outline) == 1 and outline[0].get_linestyle() == "--"
    assert outline[0].get_height() == pytest.approx(rope.G.point)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("exploratory" in t and "not resolved at its Holm level" in t for t in legend), legend
    tick = ax.get_xticklabels()[0].get_text().replace("\n", " ")
    assert "draw mean: G exploratory: gap not resolved at its Holm level" in tick, tick
    assert_readable_and_inside(fig)


# ---------------------------------------------------------------- scripts end to end
def assessed(out: Path) -> dict:
    return gap_closure.assess(gap_closure.per_seed(common.load_trials(out, task="train")))


def closure(result: dict, metric: str, backend: str, pe: str, qk: str = "none", redraw: str = "off"):
    return result[metric][("digits", backend, qk, redraw)].closures[pe]


def test_gap_closure_by_hand(tmp_path):
    out = write_sweep(tmp_path / "main", "main", train_rows())
    result = assessed(out)
    favor = closure(result, gap_closure.TRAIN_DRAW, "favor", "rope")
    acc = {key: np.array(v) for key, v in ACCURACIES.items()}
    assert favor.G.point == pytest.approx(0.05 / 0.11)
    expected = stats.closure_ratio(acc[("favor", "rope")], acc[("favor", "ape")], acc[("softmax", "ape")])
    assert (favor.G.lo, favor.G.hi) == pytest.approx((expected.lo, expected.hi))
    assert favor.G.lo < favor.G.point < favor.G.hi
    # family: the gap (p ~ 2e-4) and rope's G (Welch p of the gain ~ 4e-3), no softmax+rope: k = 2, both resolved
    assert result[gap_closure.TRAIN_DRAW][("digits", "favor", "none", "off")].k == 2
    assert favor.effect == "narrows (not fully)" and favor.G_holm.interval.level == pytest.approx(0.95)
    relu = result[gap_closure.TRAIN_DRAW][("digits", "relu", "none", "off")]
    assert math.isnan(relu.closures["rope"].G.point) and relu.gap.state == "not resolved"
    assert relu.gap.point == 0.0  # the same three accuracies: exactly no gap, not rounding noise
    text = gap_closure.build(out)
    assert "| 0.455 [0.27, 0.635] (n=3,3,3) |" in text  # G to 3 significant figures, its interval and n
    assert "| digits | relu | none | off | rope | softmax+ape (qk_norm none) | 0 [" in text
    assert "— (gap not resolved)" in text and "raises b+ape, no resolved gap for a G (k=2)" in text
    assert "91 [88.52, 93.48] (n=3)" in text  # softmax+ape accuracy 91%: mean +- t(2) x 0.01 / sqrt(3)
    assert png_ok(out / "gap_closure.png")


def test_same_encoding_gap_with_unequal_seed_counts_by_hand(tmp_path):
    """softmax+rope with 5 seeds beside favor+rope with 3: the same-encoding gap is Welch's, judged by
    Holm in the family of the gap, rope's G and this gap (k = 3)."""
    soft_rope = [0.93, 0.95, 0.94, 0.92, 0.96]
    rows = [r for r in train_rows() if r["attention"] != "relu"]
    rows += [{**config_row(attention="softmax", pe="rope", seed=seed, dataset="digits"), "test_acc": acc}
             for seed, acc in enumerate(soft_rope)]
    out = write_sweep(tmp_path / "five", "five", rows)
    assessment = assessed(out)[gap_closure.TRAIN_DRAW][("digits", "favor", "none", "off")]
    rope = assessment.closures["rope"]
    favor_rope = ACCURACIES[("favor", "rope")]
    # s^2/n: 0.00025 / 5 and 0.0001 / 3; df = (5e-5 + 3.33e-5)^2 / ((5e-5)^2 / 4 + (3.33e-5)^2 / 2) = 5.88
    se2 = 0.00025 / 5 + 0.0001 / 3
    df = se2**2 / ((0.00025 / 5) ** 2 / 4 + (0.0001 / 3) ** 2 / 2)
    assert rope.same.n == (5, 3) and rope.same.point == pytest.approx(0.09) and rope.same.df == pytest.approx(df)
    half = sps.t.ppf(0.975, df) * math.sqrt(se2)
    assert (rope.same.lo, rope.same.hi) == pytest.approx((0.09 - half, 0.09 + half))
    assert rope.same.p == pytest.approx(sps.ttest_ind(soft_rope, favor_rope, equal_var=False).pvalue)
    assert assessment.k == 3 and rope.same_ref == "softmax+rope (qk_norm none)"
    p = [assessment.gap.nominal.p, rope.G_holm.nominal.p, rope.same.p]
    assert [assessment.gap.judged.interval.level, rope.G_holm.interval.level, rope.same_holm.interval.level] == \
        pytest.approx(stats.holm_levels(p))
    text = gap_closure.build(out)
    assert f"| softmax+rope (qk_norm none) | {rope.same.text(scale=100)} |" in text and "(n=5,3)" in text
    assert "same-encoding gap softmax+pe − favor+pe (points): rope 9 [" in text and "softmax+rope ahead" in text


def test_gap_closure_bar_beyond_the_axis_names_its_interval_end():
    """A tiny gap gives G intervals that run to 20 or more; the axis stops at G_AXIS_LIMIT and the end is written;
    a G with an unbounded (Fieller) interval gets no bar, only the word: no finite bar or end could stand for it."""
    plt = common.pyplot()
    fig, ax = plt.subplots()
    ax.set_ylim(-gap_closure.G_AXIS_LIMIT, gap_closure.G_AXIS_LIMIT)
    drawn = gap_closure.draw_bar(ax, 0.0, 0.2, stats.Interval(3.2, 1.4, 23.4), "C0", None, "luo_rpe")
    gap_closure.draw_bar(ax, 1.0, 0.2, stats.Interval(-0.4, -0.9, 1.1), "C1", None, None)
    unbounded = gap_closure.draw_bar(ax, 2.0, 0.2, stats.Interval(7.0, -math.inf, math.inf), "C2", None, "rope")
    texts = [t.get_text() for t in ax.texts]
    bars = len(ax.patches)
    plt.close(fig)
    assert drawn and not unbounded and texts == ["23.4", "unbounded"] and bars == 2


def test_gap_closure_with_one_seed_says_no_interval(tmp_path):
    rows = [r for r in train_rows() if r["seed"] == 0]
    out = write_sweep(tmp_path / "one", "one", rows)
    text = gap_closure.build(out)
    favor = (0.85 - 0.80) / (0.90 - 0.80)
    assert f"{favor:.3g} (no interval, n=1,1,1)" in text
    assert "one seed, no interval" in text and "no interval (one seed): rope" in text
    assert "closes" not in text.split("### Gap closure")[0]  # nothing is claimed from one seed
    assert "Holm over k = 0" not in text and "nothing is Holm-corrected" in text  # issue 43, item 9
    assert "(1 seed per variant, " in text and " 1 seeds" not in text


def test_count_text_says_one_in_the_singular():
    assert gap_closure.count_text([1], "epochs") == "1 epoch" and gap_closure.count_text([1, 1], "seeds") == "1 seed"
    assert gap_closure.count_text([3], "epochs") == "3 epochs" and gap_closure.count_text([1, 3], "seeds") == "1–3 seeds"


# favor (qk none, redraw every 100 until 0.8): training draw as ACCURACIES, draw mean 0.71 (ape) / 0.81 (rope);
# softmax+ape has no draws, its draw-aware accuracy is test_acc 0.91 -> draw-mean G = 0.10 / 0.20 = 0.5.
# favor (qk l2, same redraw): no softmax+ape with qk l2 -> no gap measured (never against qk none: issue 41).
DRAW_MEANS = {("favor", "ape", "none"): [0.70, 0.72, 0.71], ("favor", "rope", "none"): [0.80, 0.82, 0.81],
              ("favor", "luo_rpe", "none"): [0.60, 0.61, 0.62],
              ("favor", "ape", "l2"): [0.90, 0.92, 0.91], ("favor", "rope", "l2"): [0.95, 0.96, 0.94]}
TRAIN_ACC = {("favor", "luo_rpe"): [0.70, 0.71, 0.69]}  # widens the training-draw gap: G = -0.1 / 0.11
REDRAW = "every 100 until 0.8"


def draw_rows() -> list[dict]:
    """Rows with the draw-aware columns; softmax and relu-identity have NaN draw keys (no random features)."""
    rows = []
    for (attention, pe), accs in ACCURACIES.items():
        for seed, acc in enumerate(accs):
            if attention == "relu":  # deterministic ReLU: no draws, no redraw
                extra = {"relu_projection": "identity", "redraw_interval": 100}
            else:
                extra = {"redraw_interval": 100} if attention == "favor" else {}
            rows.append(draw_row(attention, pe, seed, acc, "none", extra))
    for (attention, pe, qk), means in DRAW_MEANS.items():
        for seed, mean in enumerate(means):
            acc = TRAIN_ACC.get((attention, pe), ACCURACIES.get((attention, pe)))[seed]
            if qk == "l2" or pe == "luo_rpe":
                rows.append(draw_row(attention, pe, seed, acc, qk, {"redraw_interval": 100}))
    for row in rows:
        key = (row["attention"], row["pe"], row["qk_norm"])
        if key in DRAW_MEANS:
            mean = DRAW_MEANS[key][row["seed"]]
            row.update(test_acc_draw_mean=mean, test_acc_draw_std=0.01, test_acc_draw_min=mean - 0.02,
                       test_acc_draw_ensemble=mean + 0.01, test_acc_softmax_swap=0.5, attn_tv_to_softmax=0.3,
                       attn_tv_per_layer=[0.2, 0.4])
    return rows


def draw_row(attention: str, pe: str, seed: int, acc: float, qk: str, extra: dict) -> dict:
    nan = float("nan")
    return {**config_row(attention=attention, pe=pe, seed=seed, dataset="digits", epochs=3, **extra),
            "qk_norm": qk, "redraw_until": 0.8, "eval_draws": 4, "test_acc": acc,
            "test_acc_draw_mean": nan, "test_acc_draw_std": nan, "test_acc_draw_min": nan,
            "test_acc_draw_ensemble": nan, "test_acc_softmax_swap": nan,
            "attn_tv_to_softmax": 0.0 if attention == "softmax" else 0.1, "attn_tv_per_layer": [0.0, 0.0]}


def test_draw_aware_gap_closure_by_hand(tmp_path):
    out = write_sweep(tmp_path / "draws", "draws", draw_rows())
    result = assessed(out)
    train = closure(result, gap_closure.TRAIN_DRAW, "favor", "rope", redraw=REDRAW)
    draw = closure(result, gap_closure.DRAW_MEAN, "favor", "rope", redraw=REDRAW)
    assert train.G.point == pytest.approx(0.05 / 0.11) and train.effect == "narrows (not fully)"
    assert draw.G.point == pytest.approx((0.81 - 0.71) / (0.91 - 0.71)) and draw.effect == "narrows (not fully)"
    luo = closure(result, gap_closure.TRAIN_DRAW, "favor", "luo_rpe", redraw=REDRAW)
    assert luo.G.point == pytest.approx(-0.10 / 0.11) and luo.effect == "widens"
    l2 = result[gap_closure.DRAW_MEAN][("digits", "favor", "l2", REDRAW)]
    # like with like: no softmax+ape with qk_norm l2 in these rows, so no gap (never against qk_norm none)
    assert l2.gap.baseline == "— (no softmax+ape with qk_norm l2)" and l2.gap.why.startswith("no softmax+ape accuracy")
    # relu with relu_projection identity is its own deterministic backend, redraw off despite redraw_interval
    assert ("digits", "relu-identity", "none", "off") in result[gap_closure.DRAW_MEAN]
    text = gap_closure.build(out)
    assert "| favor | rope | none | every 100 until 0.8 | 3 | 85 [82.52, 87.48] (n=3) |" in text  # training draw
    assert "| 81 [78.52, 83.48] (n=3) |" in text and "| 1 [1, 1] (n=3) |" in text  # draw mean 81%, draw std 1
    # fidelity: per-layer TV averaged over the 3 seeds that have it
    assert "| favor | ape | none | every 100 until 0.8 | 3 | 0.3 [0.3, 0.3] (n=3) | 0.2, 0.4 (n=3) |" in text
    assert "| softmax | ape | none | off | 3 | 0 [0, 0] (n=3) | 0, 0 (n=3) |" in text
    draw_table = text[text.index("#### On the draw mean"):text.index("#### On the training draw")]
    train_table = text[text.index("#### On the training draw"):]
    assert "| 0.5 [" in draw_table and "| 0.455 [" in train_table  # G on each accuracy


def test_verdict_says_no_gap_and_names_closing_encodings(tmp_path):
    out = write_sweep(tmp_path / "draws", "draws", draw_rows())
    text = gap_closure.build(out)
    verdict = text[text.index("### digits: verdict"):text.index("### digits: accuracy per variant")]
    assert verdict.startswith("### digits: verdict (3 seeds per variant, 3 epochs)")
    favor = next(line for line in verdict.split("\n- ") if line.startswith(f"**favor, qk_norm none, redraw {REDRAW}**"))
    draw, train = favor.split("\n  - ")[1:3]
    assert draw.startswith("draw mean, judged (`test_acc_draw_mean`), Holm over k = 3: gap softmax+ape − favor+ape "
                           "(points) = 20 [")
    assert "narrows it (not fully: G below 1 at its Holm level): rope (G 0.5 [" in draw
    assert "gap softmax+ape − favor+ape (points) = 11 [" in train and "(n=3,3; 98.3%): a gap." in train
    assert "narrows it (not fully: G below 1 at its Holm level): rope (G 0.455 [" in train
    assert "widens it (G interval at its Holm level below 0): luo_rpe (G -0.909 [" in train
    assert "draw mean and training draw agree" in favor
    relu = next(line for line in verdict.split("\n- ") if line.startswith("**relu-identity"))
    assert "gap softmax+ape − relu-identity+ape (points) = 0 [" in relu
    assert "not resolved with 3 seeds, so no G at its Holm level" in relu and "(G " not in relu  # no G without a gap
    assert "raises relu-identity+ape (no resolved gap for a G): rope (gain in points 3 [" in relu
    l2 = next(line for line in verdict.split("\n- ") if line.startswith("**favor, qk_norm l2"))
    assert "qk_norm none" not in l2 and "no softmax+ape" in l2


def test_disagreement_names_the_backend_that_is_ahead():
    ahead = gap_closure.Assessment(gap_closure.Gap(judged(-0.2, -0.3, -0.1), state="ahead"))
    gap = gap_closure.Assessment(gap_closure.Gap(judged(0.4, 0.3, 0.6), state="resolved"))
    assert gap_closure.disagreement(gap, ahead, "favor") == (
        "the two disagree on the gap: a gap on the draw mean, favor+ape ahead of softmax+ape on the training draw")


def test_old_parquet_without_draw_columns_still_reports(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    rows = [{**r, "status": "ok", "task": "train", "trial_key": f"k{i}"} for i, r in enumerate(train_rows())]
    frame = pd.DataFrame(rows).drop(columns=["qk_norm", "redraw_until"], errors="ignore")
    frame.assign(redraw_interval=[100 if a == "favor" else 0 for a in frame["attention"]]).to_parquet(out / TRIALS_FILE)
    text = gap_closure.build(out)
    assert "| favor | rope | none | every 100 | 3 | 85 [" in text and "| — | — |" in text
    assert "draw mean, judged (`test_acc_draw_mean`), not measured (no favor+ape accuracy (rows written before" in text
    assert "0.455 [" in text and "_no attn_tv_to_softmax in these rows" in text
    assert "_no space.json in .: all rows there kept_" in text and "set aside" not in text
    assert "| softmax | ape | none | off | 3 | 2.1 |" in efficiency.build(out)


def test_per_layer_fidelity_read_from_rows_written_as_text(tmp_path):
    """Rows from before the typed schema hold attn_tv_per_layer as printed text: it still averages."""
    out = tmp_path / "text"
    out.mkdir()
    rows = [{**r, "status": "ok", "task": "train", "trial_key": f"k{i}"} for i, r in enumerate(draw_rows())]
    frame = pd.DataFrame(rows)
    frame["attn_tv_per_layer"] = ["[0. 0.]" if a == "softmax" else "[0.2, 0.4]" for a in frame["attention"]]
    frame.to_parquet(out / TRIALS_FILE)
    text = gap_closure.build(out)
    assert "| favor | ape | none | every 100 until 0.8 | 3 | 0.3 [0.3, 0.3] (n=3) | 0.2, 0.4 (n=3) |" in text
    assert "| softmax | ape | none | off | 3 | 0 [0, 0] (n=3) | 0, 0 (n=3) |" in text
    assert gap_closure.float_list("[0.1, x]") is None and gap_closure.float_list("[]") is None


def test_per_layer_fidelity_says_how_many_seeds_it_averages():
    """MNIST's 5-seed cells had per-layer TV only in seeds 3-4: 'TV per layer (mean)' averaged those 2 without
    saying so. It is the mean over the seeds whose rows have it (each seed's rows averaged first), with n."""
    from rpevit.analysis.gap_closure import text as words

    rows = [draw_row("favor", "ape", seed, 0.7, "none", {"redraw_interval": 100}) for seed in range(5)]
    rows.append(draw_row("favor", "ape", 4, 0.7, "none", {"redraw_interval": 100}))  # seed 4 run twice
    for row, layers in zip(rows, [None, None, None, [0.2, 0.4], [0.4, 0.8], [0.4, 0.8]]):
        row["attn_tv_per_layer"] = layers
    frame = pd.DataFrame(rows)
    seeds = gap_closure.per_seed(frame)
    table = words.fidelity_table(frame, seeds)
    assert "| favor | ape | none | every 100 until 0.8 | 5 | 0.1 [0.1, 0.1] (n=5) | 0.3, 0.6 (n=2) |" in table, table
    assert "n seeds that have it" in table.split("\n")[0]


def test_gap_closure_figure_names_its_interval_and_n_and_keeps_everything_inside(tmp_path, figures):
    rows = train_rows() + [{**config_row(attention="favor", pe="luo_rpe", seed=0, dataset="digits"), "test_acc": 0.9}]
    gap_closure.build(write_sweep(tmp_path / "three", "three", rows))  # favor+luo_rpe: one seed, a bar, no whisker
    caption = figures[-1]._suptitle.get_text()
    assert "95% Fieller interval" in caption and "n = 3 seeds" in caption, caption
    assert "none where a group has fewer than 2 seeds" in caption, caption
    bars = [c for c in figures[-1].axes[0].containers if hasattr(c, "patches")]
    assert len(bars) == 2 and sum(c.errorbar is None for c in bars) == 1  # favor: rope, luo_rpe (no draw means)
    assert_readable_and_inside(figures[-1])
    gap_closure.build(write_sweep(tmp_path / "one", "one", [r for r in train_rows() if r["seed"] == 0]))
    fig = figures[-1]
    caption = fig._suptitle.get_text()
    assert "95%" not in caption and "no whiskers" in caption, caption
    assert not [c for ax in fig.axes for c in ax.containers if getattr(c, "errorbar", None) is not None]
    assert_readable_and_inside(fig)


def test_gap_closure_axis_fits_the_bars_and_the_legend_names_only_what_is_drawn(tmp_path, figures, capsys):
    """Issue 43, item 7: a fixed +-5 axis drew G = 0.45 [0.2, 0.7] as a sliver; the legend named a
    'hatched: training draw' and encodings with no bar; the script named no PNG it wrote."""
    rows = train_rows() + [{**config_row(attention="favor", pe="luo_rpe", seed=0, dataset="digits"), "test_acc": 0.9}]
    out = write_sweep(tmp_path / "three", "three", rows)
    gap_closure.build(out)
    fig = figures[-1]
    ax = fig.axes[0]
    bars = [p for c in ax.containers if hasattr(c, "patches") for p in c.patches]
    ends = [v for c in ax.containers if getattr(c, "errorbar", None) is not None
            for seg in c.errorbar.lines[2][0].get_segments() for v in seg[:, 1]]
    low, high = ax.get_ylim()
    assert -1 < low <= min(0.0, *ends) and max(1.0, *ends, *(b.get_height() for b in bars)) <= high < 3, (low, high)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["luo_rpe", "rope", "hatched: training draw"], labels  # no draw-mean rows: no solid bars
    assert f"wrote {out / 'gap_closure.png'}" in capsys.readouterr().out


def test_a_gap_closure_figure_without_any_bar_says_why_and_has_no_legend(tmp_path, figures):
    """One seed and a gap below MIN_GAP: no G anywhere; no legend of absent bars, the caption says why."""
    rows = [{**r, "test_acc": 0.9 if r["attention"] == "softmax" else 0.899} for r in train_rows() if r["seed"] == 0]
    gap_closure.build(write_sweep(tmp_path / "none", "none", rows))
    fig = figures[-1]
    assert not fig.legends and "no G bar" in fig._suptitle.get_text()
    assert fig.axes[0].get_ylim()[1] < 2  # 0 and 1 shown, not +-5


def test_an_interval_past_the_range_of_accuracy_is_said_under_the_table():
    """Seeds of one variant at 99%, 98% and 40% (a collapse): the t(2) interval of the mean passes 100%,
    and the draw std's passes below 0; the table prints them as computed and one line under it says so,
    with the count and the widest, where a table without such an interval gets no line."""
    acc = [0.99, 0.98, 0.40]
    rows = pd.DataFrame({"dataset": "mnist", "attention": "favor", "pe": "rope", "qk_norm": "none",
                         "redraw": "off", "seed": [0, 1, 2], **{c: acc for c in gap_closure.compute.ACCURACY_COLUMNS}})
    rows["test_acc_draw_std"] = [0.001, 0.002, 0.30]
    hi = np.mean(acc) + sps.t.ppf(0.975, 2) * np.std(acc, ddof=1) / math.sqrt(3)
    assert hi > 1  # the premise: the plain t bound is past 100%
    table = gap_closure.text.accuracy_table(rows)
    assert f"{common.fmt(100 * hi, 4)}]" in table  # printed as computed, not cut
    note = gap_closure.text.past_range_note(rows)
    # five accuracy columns pass 100%, the std column passes 0: six; the widest is the accuracy one
    assert note.startswith("_6 intervals above pass the 0-100%") and f"{common.fmt(100 * hi, 4)}] (n=3)" in note
    tight = rows.assign(**{c: [0.99, 0.98, 0.985] for c in gap_closure.compute.ACCURACY_COLUMNS})
    assert gap_closure.text.past_range_note(tight) == ""


def test_the_gap_closure_figure_names_the_device_its_rows_ran_on(tmp_path, figures):
    rows = [{**r, "device_name": "NVIDIA H200"} for r in train_rows()]
    gap_closure.build(write_sweep(tmp_path / "dev", "dev", rows))
    title = figures[-1]._suptitle.get_text()
    assert "device: NVIDIA H200" in title and "whiskers" in title
    assert gap_closure.gap_closure_title([], "device: X").endswith("\ndevice: X")
