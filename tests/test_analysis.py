"""The analysis scripts end to end on small results written by the real Parquet writer.

Train / bench rows carry constructed numbers (so the expected G, means and slopes are known by
hand); kernel_mse rows come from real tiny runs of the task. Every row goes through
rpevit.sweep.results.ParquetResults, exactly as a sweep writes it.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sps

from rpevit import metrics
from rpevit.analysis import common, efficiency, gap_closure, kernel_mse, report, stats, string_study
from rpevit.config import TrialConfig
from rpevit.sweep.protocol import SUMMARY, Report
from rpevit.sweep.results import TRIALS_FILE, ParquetResults
from rpevit.sweep.space import trial_key
from rpevit.tasks import kernel_mse as kmse_task

REPO = Path(__file__).resolve().parent.parent

ENV = metrics.environment(torch.device("cpu"))


def write_sweep(out_dir: Path, name: str, rows: list[dict]) -> Path:
    """Feed summary rows to the driver-side writer as Tune would, one on_trial_result per trial."""
    keys = [trial_key(r) for r in rows]
    writer = ParquetResults(out_dir, name, dict(zip(keys, rows)), {k: i for i, k in enumerate(keys)})
    for i, (key, row) in enumerate(zip(keys, rows)):
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               Report(SUMMARY, key, row).to_tune())
    writer.on_experiment_end([])
    return out_dir


def config_row(**fields) -> dict:
    """A stored row's config; redraw_interval 0 (one training draw) unless given, as these rows were
    built before the default became 100."""
    return {**TrialConfig.from_dict({"redraw_interval": 0, **fields}).to_dict(), **ENV}


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


# ---------------------------------------------------------------- helpers
def judged(point: float, lo: float, hi: float, p_adjusted: float = 0.01, p: float = 0.001,
           n: tuple = (3, 3, 3)) -> stats.Judged:
    interval = stats.Interval(point, lo, hi, n, level=0.99, p=p)
    return stats.Judged(interval, interval, p_adjusted, k=3)


def test_effect_of_an_encoding_from_its_holm_verdict():
    resolved = gap_closure.Gap(state="resolved")
    up, down = stats.Interval(0.01), stats.Interval(-0.01)  # the gain at the same level: its sign
    effect = gap_closure.effect
    assert effect(resolved, judged(0.4, 0.2, 0.6), up) == "partly closes"
    assert effect(resolved, judged(0.9, 0.5, 1.2), up) == effect(resolved, judged(1.3, 0.3, 9.8), up) == "closes"
    assert effect(resolved, judged(1.3, 1.1, 1.5), up) == "more than closes"
    assert effect(resolved, judged(-0.5, -0.8, -0.1), down) == "widens"
    # Holm does not reject: no effect, whatever the point says; the seed counts are named
    unresolved = judged(0.4, 0.2, 0.6, p_adjusted=0.2, n=(3, 5, 3))
    assert effect(resolved, unresolved, up) == "not resolved with 3, 5 and 3 seeds"
    assert effect(resolved, judged(0.1, math.nan, math.nan, p=math.nan), up) == "no interval (one seed)"
    # a resolved gain without a resolved gap (or with an unbounded G) raises or lowers b+ape: no G claim
    assert effect(gap_closure.Gap(state="not resolved"), judged(0.4, 0.2, 0.6), up) == "raises"
    assert effect(resolved, judged(3.0, -math.inf, math.inf), down) == "lowers"


def test_pareto_front():
    cost = np.array([1.0, 2.0, 3.0, 2.5])
    acc = np.array([0.5, 0.8, 0.9, 0.7])  # the 4th is dominated by the 2nd
    assert efficiency.pareto_front(cost, acc).tolist() == [True, True, True, False]
    assert efficiency.pareto_front(np.append(cost, 0.1), np.append(acc, np.nan)).tolist()[-1] is False


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
    assert favor.effect == "partly closes" and favor.G_holm.interval.level == pytest.approx(0.95)
    relu = result[gap_closure.TRAIN_DRAW][("digits", "relu", "none", "off")]
    assert math.isnan(relu.closures["rope"].G.point) and relu.gap.state == "not resolved"
    assert relu.gap.point == 0.0  # the same three accuracies: exactly no gap, not rounding noise
    text = gap_closure.build(out)
    assert "| 0.455 [0.27, 0.635] (n=3,3,3) |" in text  # G to 3 significant figures, its interval and n
    assert "| digits | relu | none | off | rope | softmax+ape (qk_norm none) | 0 [" in text
    assert "— (gap not resolved)" in text and "raises b+ape (k=2)" in text
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


# favor (qk none, redraw every 100 until 0.8): training draw as ACCURACIES, draw mean 0.71 (ape) / 0.81 (rope);
# softmax+ape has no draws, its draw-aware accuracy is test_acc 0.91 -> draw-mean G = 0.10 / 0.20 = 0.5.
# favor (qk l2, same redraw): no softmax+ape with qk l2 -> baseline qk none; ape's draw mean 0.91 = softmax.
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
    assert train.G.point == pytest.approx(0.05 / 0.11) and train.effect == "partly closes"
    assert draw.G.point == pytest.approx((0.81 - 0.71) / (0.91 - 0.71)) and draw.effect == "partly closes"
    luo = closure(result, gap_closure.TRAIN_DRAW, "favor", "luo_rpe", redraw=REDRAW)
    assert luo.G.point == pytest.approx(-0.10 / 0.11) and luo.effect == "widens"
    l2 = result[gap_closure.DRAW_MEAN][("digits", "favor", "l2", REDRAW)]
    assert l2.gap.baseline == "softmax+ape (qk_norm none)" and l2.gap.state == "not resolved"
    # relu with relu_projection identity is its own deterministic backend, redraw off despite redraw_interval
    assert ("digits", "relu-identity", "none", "off") in result[gap_closure.DRAW_MEAN]
    text = gap_closure.build(out)
    assert "| favor | rope | none | every 100 until 0.8 | 3 | 85 [82.52, 87.48] (n=3) |" in text  # training draw
    assert "| 81 [78.52, 83.48] (n=3) |" in text and "| 1 [1, 1] (n=3) |" in text  # draw mean 81%, draw std 1
    assert "| favor | ape | none | every 100 until 0.8 | 3 | 0.3 [0.3, 0.3] (n=3) | 0.2, 0.4 |" in text  # fidelity
    assert "| softmax | ape | none | off | 3 | 0 [0, 0] (n=3) | 0, 0 |" in text
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
    assert "closes part of it (G interval between 0 and 1): rope (G 0.5 [" in draw
    assert "gap softmax+ape − favor+ape (points) = 11 [" in train and "(n=3,3; 98.3%): a gap." in train
    assert "closes part of it (G interval between 0 and 1): rope (G 0.455 [" in train
    assert "widens it (G interval below 0): luo_rpe (G -0.909 [" in train
    assert "draw mean and training draw agree" in favor
    relu = next(line for line in verdict.split("\n- ") if line.startswith("**relu-identity"))
    assert "gap softmax+ape − relu-identity+ape (points) = 0 [" in relu
    assert "not resolved with 3 seeds, so G is not defined" in relu and "(G " not in relu  # no G without a gap
    assert "raises relu-identity+ape (no resolved gap for a G): rope (gain in points 3 [" in relu
    l2 = next(line for line in verdict.split("\n- ") if line.startswith("**favor, qk_norm l2"))
    assert "(baseline softmax+ape (qk_norm none))" in l2
    assert "the two disagree on the gap: gap not resolved on the draw mean, a gap on the training draw" in l2


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
    assert "| favor | ape | none | every 100 until 0.8 | 3 | 0.3 [0.3, 0.3] (n=3) | 0.2, 0.4 |" in text
    assert "| softmax | ape | none | off | 3 | 0 [0, 0] (n=3) | 0, 0 |" in text
    assert gap_closure.float_list("[0.1, x]") is None and gap_closure.float_list("[]") is None


def test_stale_rows_are_set_aside_and_counted(tmp_path):
    current = train_rows()
    stale = [{**r, "seed": 7 + i, "test_acc": 0.1} for i, r in enumerate([r for r in current if r["pe"] == "rope"][:3])]
    out = write_sweep(tmp_path / "main", "main", current + stale)
    keys = [trial_key(r) for r in current]
    (out / "space.json").write_text(json.dumps({"name": "main", "source": "space.yaml", "trial_keys": keys}))
    trials = common.read_trials(out, ["train"])
    assert len(trials.frame) == len(current) and trials.set_aside == 3 and trials.frame["seed"].max() == 2
    text = gap_closure.build(out)
    assert "_3 rows set aside: not in the current space.json_" in text and "0.455 [" in text
    assert "_3 rows set aside" in efficiency.build(out)
    report_text = report.build_report(out)
    assert "| main | train | 15 | 0 | 3 |" in report_text  # status table: current rows ok, 3 set aside


def test_efficiency_tables_leave_token_scaling_to_its_section(tmp_path):
    parent = tmp_path / "all"
    write_sweep(parent / "main", "main", train_rows())
    write_sweep(parent / "scaling", "scaling", bench_rows())
    text = efficiency.build(parent)  # a parent folder holding two sweeps
    assert "| softmax | ape | none | off | 3 | 2.1 |" in text  # seeds, mean train s/epoch (2.0, 2.1, 2.2)
    assert "Token scaling" not in text and "bench trials alone" not in text  # N-varying bench rows: not a cost table
    assert png_ok(parent / "efficiency_pareto.png") and not (parent / "token_scaling.png").exists()


def test_efficiency_takes_times_from_bench_rows_and_labels_contended_train_times(tmp_path):
    start = 1.7e9  # Unix seconds, as the trainable reports them
    rows = []
    for attention, offsets in (("softmax", (0, 10)), ("favor", (0, 5))):  # favor's two seeds overlap
        for seed, offset in enumerate(offsets):
            rows.append({**config_row(attention=attention, pe="ape", seed=seed, dataset="digits"), "test_acc": 0.9,
                         "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2, "peak_mem_mb": 900.0, "n_train": 1000,
                         "hostname": "h", "started_at": start + 100 * (attention == "favor") + offset,
                         "finished_at": start + 100 * (attention == "favor") + offset + 8})
    # a bench row of softmax+ape's model (digits' default 8 px / patch 2, given explicitly): 5 ms per image
    bench = [{**config_row(task="bench", attention="softmax", pe="ape", dataset="digits", image_size=8, patch_size=2,
                           bench_batch=10), "tokens": 16, "train_step_ms": 50.0, "infer_ms_per_sample": 0.05,
              "peak_mem_mb": 300.0}]
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", rows)
    write_sweep(parent / "cost", "cost", bench)
    costs = efficiency.variant_costs(common.load_trials(parent, "train"), common.load_trials(parent, "bench"))
    costs = costs.set_index("attention")
    assert costs.loc["softmax", "timing"] == efficiency.BENCH_TIMING
    assert costs.loc["softmax", "train_s_per_epoch"] == pytest.approx(5.0)  # 5 ms x 1000 images
    assert (costs.loc["softmax", "infer_ms_per_sample"], costs.loc["softmax", "peak_mem_mb"]) == (0.05, 300.0)
    assert costs.loc["favor", "timing"] == efficiency.CONTENDED and costs.loc["favor", "train_s_per_epoch"] == 2.0
    text = efficiency.build(parent)
    assert "| 5 | 0.05 | 300 |" in text and efficiency.CONTENDED in text and "not comparable" in text
    # without the bench row: softmax's seeds ran one after the other, favor's side by side
    alone = efficiency.variant_costs(common.load_trials(parent / "main", "train")).set_index("attention")
    assert alone.loc["softmax", "timing"] == efficiency.ONE_AT_A_TIME and alone.loc["softmax", "train_s_per_epoch"] == 2


def test_pareto_accuracy_of_a_random_feature_model_is_its_draw_mean(tmp_path):
    """One draw is a lottery: the accuracy-vs-cost plot places favor at its mean over fresh draws."""
    rows = [{**r, "test_acc_draw_mean": r["test_acc"] - 0.3} if r["attention"] == "favor" else r for r in train_rows()]
    write_sweep(tmp_path / "main", "main", rows)
    costs = efficiency.variant_costs(common.load_trials(tmp_path, "train"))
    for _, r in costs.iterrows():
        if r["attention"] == "relu":  # random projection, no draw mean recorded: no fallback to its one draw
            assert math.isnan(r[efficiency.JUDGED_ACC])
        else:
            expected = r["test_acc"] - 0.3 if r["attention"] == "favor" else r["test_acc"]
            assert r[efficiency.JUDGED_ACC] == pytest.approx(expected)
    assert set(costs["attention"]) == {"favor", "relu", "softmax"}


def test_bench_rows_match_train_variants_on_the_options_their_classes_take(tmp_path):
    """An option no class of the variant takes (rotinv_basis for softmax+ape) must not keep a bench row
    from matching; one it takes (rotinv_basis for rotinv) must."""
    rows, bench = [], []
    for pe in ("ape", "rotinv"):
        rows.append({**config_row(pe=pe, dataset="digits", rotinv_basis="monomial"), "test_acc": 0.9,
                     "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2, "n_train": 1000})
        bench.append({**config_row(task="bench", pe=pe, dataset="digits", rotinv_basis="bernstein", image_size=8,
                                   patch_size=2, bench_batch=10), "tokens": 16, "train_step_ms": 50.0,
                      "infer_ms_per_sample": 0.05})
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", rows)
    write_sweep(parent / "cost", "cost", bench)
    costs = efficiency.variant_costs(common.load_trials(parent, "train"), common.load_trials(parent, "bench"))
    timing = dict(zip(costs["pe"], costs["timing"]))
    assert timing["ape"] == efficiency.BENCH_TIMING and timing["rotinv"] != efficiency.BENCH_TIMING
    assert "rotinv_basis" in efficiency.model_fields("softmax", "rotinv")
    assert "rotinv_basis" not in efficiency.model_fields("softmax", "ape+rope")
    assert "num_features" in efficiency.model_fields("favor", "ape")


def test_cost_ratios_divide_bench_times_by_softmax_ape_and_rope_and_skip_contended_ones(tmp_path):
    rows, bench = [], []
    for attention, pe, ms in (("softmax", "ape", 5.0), ("softmax", "rope", 6.0), ("softmax", "cayley_string", 9.0),
                              ("favor", "ape", None)):
        rows.append({**config_row(attention=attention, pe=pe, seed=0, dataset="digits"), "test_acc": 0.9,
                     "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2, "peak_mem_mb": 900.0, "n_train": 1000})
        if ms is not None:  # favor has no bench row: its (train-trial) time gets no ratio
            bench.append({**config_row(task="bench", attention=attention, pe=pe, dataset="digits", image_size=8,
                                       patch_size=2, bench_batch=10), "tokens": 16, "train_step_ms": 10 * ms,
                          "infer_ms_per_sample": ms / 100, "peak_mem_mb": 300.0})
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", rows)
    write_sweep(parent / "cost", "cost", bench)
    costs = efficiency.cost_ratios(efficiency.variant_costs(common.load_trials(parent, "train"),
                                                            common.load_trials(parent, "bench"))).set_index("pe")
    assert costs.loc["cayley_string", "train x softmax+ape"] == pytest.approx(9 / 5)
    assert costs.loc["cayley_string", "train x rope"] == pytest.approx(9 / 6)
    assert costs.loc["rope", "infer x softmax+ape"] == pytest.approx(6 / 5)
    softmax_ape = costs[costs["attention"] == "softmax"].loc["ape"]
    assert softmax_ape["train x softmax+ape"] == pytest.approx(1.0)
    favor = costs[costs["attention"] == "favor"].iloc[0]
    assert math.isnan(favor["train x softmax+ape"]) and math.isnan(favor["train x rope"])
    text = efficiency.build(parent)
    assert "train x rope" in text and "18.7x on CIFAR-10" in text
    assert "Token scaling" not in text  # one model size: a cost bench, no slope to fit
    alone = efficiency.bench_cost_table(common.load_trials(parent, "bench")).set_index("pe")
    assert alone.loc["cayley_string", "train x rope"] == pytest.approx(1.5)  # 90 ms / 60 ms per step
    assert alone.loc["cayley_string", "train_ms_per_image"] == pytest.approx(9.0)
    assert alone.loc["ape", "infer x softmax+ape"] == pytest.approx(1.0)
    assert "cost per variant, bench trials alone (cost)" in text


def test_encoding_options_that_define_variants_label_them_apart():
    frame = pd.DataFrame({"pe": ["rope", "sparse_cayley_string", "sparse_cayley_string", "sparse_cayley_string"],
                          "string_sparsity": [0.1, 0.05, 0.1, 0.1], "cayley_solver": ["auto", "auto", "auto", "sparse"],
                          "attention": "softmax"})
    labels = list(common.pe_labels(frame))
    assert labels[0] == "rope" and len(set(labels[1:])) == 3
    assert labels[1] == "sparse_cayley_string (string_sparsity=0.05, cayley_solver=auto)"
    same_f = frame[frame["string_sparsity"] == 0.05].reset_index(drop=True)
    assert list(common.pe_labels(same_f)) == ["sparse_cayley_string"]  # nothing varies: the plain name


STRING_ACC = {  # (pe, f, solver): test accuracy of seeds 0..2
    ("rope", 0.1, "auto"): [0.90, 0.91, 0.92],
    ("cayley_string", 0.1, "auto"): [0.93, 0.94, 0.95],
    ("sparse_cayley_string", 0.05, "auto"): [0.90, 0.90, 0.91],
    ("sparse_cayley_string", 0.5, "auto"): [0.92, 0.92, 0.93],
    ("sparse_cayley_string", 0.1, "auto"): [0.91, 0.91, 0.92],
    ("sparse_cayley_string", 0.1, "sparse"): [0.91, 0.92, 0.92],
}


def test_string_study_ranks_variants_against_rope_with_costs_and_the_f_sweep(tmp_path):
    rows, bench = [], []
    for (pe, f, solver), accs in STRING_ACC.items():
        options = {"pe": pe, "string_sparsity": f, "cayley_solver": solver, "dataset": "digits"}
        rows += [{**config_row(**options, seed=seed), "test_acc": acc} for seed, acc in enumerate(accs)]
        step = {"rope": 30.0, "cayley_string": 36.0}.get(pe, 33.0) * (1.5 if solver == "sparse" else 1.0)
        bench.append({**config_row(task="bench", image_size=8, patch_size=2, bench_batch=10, **options),
                      "tokens": 16, "train_step_ms": step, "infer_ms_per_sample": step / 100})
    bench.append({**config_row(task="bench", pe="ape", dataset="digits", image_size=8, patch_size=2, bench_batch=10),
                  "tokens": 16, "train_step_ms": 20.0, "infer_ms_per_sample": 0.2})  # not a STRING: ignored
    parent = tmp_path / "results"
    write_sweep(parent / "string", "string", rows)
    write_sweep(parent / "cost", "cost", bench)
    # rope's seeds trained again in another sweep (as in the converged MNIST study): each seed counts once
    again = [{**r, "rotinv_mode": "exact", "test_acc": r["test_acc"] + 0.002} for r in rows if r["pe"] == "rope"]
    write_sweep(parent / "converged", "converged", again)
    frame = common.load_trials(parent)
    table = string_study.with_costs(string_study.string_rows(frame[frame["task"] == "train"]),
                                    string_study.bench_ratios(frame[frame["task"] == "bench"]))
    ranked = string_study.variant_table(table)
    rope = ranked.set_index("variant").loc["rope"]
    assert rope["seeds"] == 3 and rope["acc"] == pytest.approx(np.mean(STRING_ACC[("rope", 0.1, "auto")]) + 0.001)
    best = ranked.iloc[0]
    assert best["variant"] == "cayley_string" and best["acc"] == pytest.approx(0.94)
    assert best["diff"].point == pytest.approx(0.029) and best["diff"].lo > 0  # its own 95% interval excludes 0,
    assert best["holm"].k == 5 and not best["holm"].resolved  # but not at its Holm level among 5 variants vs rope
    rope_seeds = np.array(STRING_ACC[("rope", 0.1, "auto")]) + 0.001
    assert best["diff"].p == pytest.approx(sps.ttest_ind(STRING_ACC[("cayley_string", 0.1, "auto")], rope_seeds,
                                                         equal_var=False).pvalue)
    assert best["train x rope"] == pytest.approx(1.2) and best["infer x rope"] == pytest.approx(1.2)
    solver_row = ranked[ranked["variant"].str.contains("cayley_solver=sparse")].iloc[0]
    assert solver_row["train x rope"] == pytest.approx(33 * 1.5 / 30)
    fs = string_study.f_table(table).set_index(["f", "solver"])
    assert fs.loc[(0.5, "auto"), "acc"] == pytest.approx(np.mean([0.92, 0.92, 0.93]))
    text = string_study.build(parent)
    assert "The highest mean is cayley_string" in text and "1.2x rope's training-step time" in text
    assert "vs rope at its Holm level: not resolved with 3 seeds" in text
    assert "No difference to rope is resolved by Holm over the k = 5 with 3 seeds." in text
    assert "highest mean at f = 0.5" in text and "The sparse solver at f = 0.1" in text
    assert "| reference notebook, epoch x rope |" in text  # digits: the notebook has no figure, so "—"
    assert (parent / "string_study_f.png").stat().st_size > 1000
    assert "## The STRING study" in report.build_report(parent)
    assert "| softmax | rope | none | off | 3 |" in efficiency.build(parent)  # seeds, each counted once
    # rope and one other STRING, no sparse rows (the converged MNIST study alone): no f table, no plot
    few = tmp_path / "few"
    write_sweep(few / "string", "string", [r for r in rows if r["pe"] in ("rope", "cayley_string")])
    text = string_study.build(few)
    assert "The highest mean is cayley_string" in text and "against f" not in text
    # alone in its family, its 95% interval decides
    assert "Holm over the k = 1: cayley_string above rope (" in text and "not resolved" not in text
    assert not (few / "string_study_f.png").exists()


def test_string_study_names_the_reference_notebooks_ratio_only_where_it_measured_one():
    ratio = string_study.notebook_ratio
    assert ratio("mnist", "cayley_string", None) == "5.5" and ratio("cifar10", "cayley_string", None) == "18.7"
    assert ratio("mnist", "sparse_cayley_string", 1.0) == ratio("cifar10", "sparse_cayley_string", 1.0) == "up to 221"
    assert ratio("cifar10", "sparse_cayley_string", 0.1) == "—"  # the notebook gave f = 1 only
    assert ratio("digits", "cayley_string", None) == "—" and ratio("mnist", "rope", None) == "—"


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


def test_rows_of_an_older_writer_with_float_times_are_read_beside_timestamped_rows(tmp_path):
    """The MNIST study's pinned commit wrote started_at as float seconds, later sweeps as timestamps; read
    together they form one object column, which every time-based column must still understand."""
    parent = tmp_path / "results"
    rows = train_rows()
    new = write_sweep(parent / "new", "new", [r for r in rows if r["attention"] != "favor"])
    old = write_sweep(parent / "old", "old", [r for r in rows if r["attention"] == "favor"])
    t0 = pd.Timestamp("2026-11-22 08:00", tz="UTC")
    for folder, begin in ((new, 0), (old, 75)):  # each: one trial after another, 10 minutes apart, 9 long
        frame = pd.read_parquet(folder / TRIALS_FILE)
        assert pd.api.types.is_datetime64_any_dtype(frame["started_at"])
        start = pd.Series([t0 + pd.Timedelta(minutes=begin + 10 * i) for i in range(len(frame))],
                          dtype=frame["started_at"].dtype)
        times = {"started_at": start, "finished_at": start + pd.Timedelta(minutes=9)}
        if folder == old:
            times = {c: report.unix_seconds(v) for c, v in times.items()}
        frame.assign(**times).to_parquet(folder / TRIALS_FILE)
    both = common.load_trials(parent, "train")
    assert both["started_at"].dtype == object
    assert report.unix_seconds(both["started_at"]).notna().all()
    mixed = pd.Series([pd.Timestamp(5, unit="s", tz="UTC"), 7.5, None, pd.NaT], dtype=object)
    assert report.unix_seconds(mixed).tolist()[:2] == [5.0, 7.5] and report.unix_seconds(mixed)[2:].isna().all()
    costs = efficiency.variant_costs(both).set_index(["attention", "pe"])
    assert costs.loc[("softmax", "ape"), "timing"] == efficiency.ONE_AT_A_TIME
    assert costs.loc[("favor", "ape"), "timing"] == efficiency.CONTENDED  # old's first trial overlaps new's last
    assert "## Efficiency" in efficiency.build(parent)


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


def test_a_studies_line_that_is_not_a_folder_name_stops_in_one_line(tmp_path):
    write_sweep(tmp_path / "study", "study", train_rows()[:3])
    for line in ("../elsewhere", "a/b", ".hidden", "two words"):
        (tmp_path / common.STUDIES_FILE).write_text(f"study\n{line}\n")
        with pytest.raises(SystemExit) as stop:
            common.read_trials(tmp_path)
        message = str(stop.value.code)
        assert message.startswith("error: ") and "\n" not in message and "line 2" in message, message
        assert repr(line) in message and str(tmp_path / common.STUDIES_FILE) in message


# ---- issue 31, item 6: figures a reader can read
MIN_FONT_PT = 8


@pytest.fixture
def figures(monkeypatch) -> list:
    """Every figure the analysis saves, kept for inspection (saved as before)."""
    kept = []

    def keep(fig, path):
        kept.append(fig)
        return common.save_figure(fig, path)

    for module in (gap_closure, efficiency, string_study, kernel_mse):
        monkeypatch.setattr(module, "save_figure", keep)
    return kept


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


def test_pareto_points_sit_neither_on_an_axis_edge_nor_under_another(tmp_path, figures):
    rows = [{**r, "test_acc": {"ape": 0.80, "rope": 0.801}[r["pe"]] + r["seed"] / 1000}
            if r["attention"] == "favor" else r for r in train_rows()]  # favor+ape and favor+rope: one spot
    rows += [{**r, "pe": "luo_rpe", "test_acc": 0.3} for r in rows if (r["attention"], r["pe"]) == ("favor", "ape")]
    rows = [{**r, "test_acc_draw_mean": r["test_acc"]} if r["attention"] in ("favor", "relu") else r for r in rows]
    write_sweep(tmp_path / "main", "main", rows)
    costs = efficiency.variant_costs(common.load_trials(tmp_path, "train"))
    assert efficiency.plot_pareto(costs, tmp_path / "pareto.png") is not None
    fig = figures[-1]
    assert_readable_and_inside(fig)
    gap = efficiency.DODGE_PT * fig.dpi / 72 * 0.95
    seen = 0
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        box = ax.get_window_extent()
        centres = []
        for points in ax.collections:
            if len(points.get_offsets()) and points.get_facecolor().shape[0] and points.get_sizes()[0] < 100:
                centres += list(points.get_offset_transform().transform(points.get_offsets()))
        for x, y in centres:  # a marker's half width clear of every edge
            assert box.x0 + gap / 2 <= x <= box.x1 - gap / 2 and box.y0 + gap / 2 <= y <= box.y1 - gap / 2, (x, y, box)
        for i, a in enumerate(centres):
            for b in centres[i + 1:]:
                assert math.hypot(a[0] - b[0], a[1] - b[1]) >= gap, (a, b)
        seen += len(centres)
    assert seen == 3 * len(costs)  # every variant drawn once per cost panel, the collapsed one too


def test_string_f_plot_draws_no_interval_from_one_seed(tmp_path, figures):
    one = pd.DataFrame({"f": [0.1, 0.5], "solver": ["auto", "auto"], "seeds": [1, 1], "acc": [0.9, 0.91],
                        "acc_text": ["", ""], "values": [np.array([0.9]), np.array([0.91])]})
    string_study.plot_f({"mnist": one}, tmp_path / "f.png")
    fig = figures[-1]
    assert "95%" not in fig._suptitle.get_text() and "no interval" in fig._suptitle.get_text()
    assert not [c for ax in fig.axes for c in ax.containers]
    assert_readable_and_inside(fig)
    three = one.assign(values=[np.array([0.9, 0.91, 0.92]), np.array([0.9, 0.92, 0.91])])
    string_study.plot_f({"mnist": three}, tmp_path / "f.png")
    assert "95% t interval" in figures[-1]._suptitle.get_text() and "n = 3 seeds" in figures[-1].axes[0].get_title()
