"""rpevit/analysis/efficiency/: the Pareto front, cost tables from train and bench rows, cost ratios
and the accuracy-vs-cost figure."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from rpevit.analysis import common, efficiency, stats
from tests.analysis_rows import assert_readable_and_inside, bench_rows, config_row, png_ok, train_rows, write_sweep


def test_pareto_front():
    cost = np.array([1.0, 2.0, 3.0, 2.5])
    acc = np.array([0.5, 0.8, 0.9, 0.7])  # the 4th is dominated by the 2nd
    assert efficiency.pareto_front(cost, acc).tolist() == [True, True, True, False]
    assert efficiency.pareto_front(np.append(cost, 0.1), np.append(acc, np.nan)).tolist()[-1] is False


def test_efficiency_tables_leave_token_scaling_to_its_section(tmp_path):
    parent = tmp_path / "all"
    write_sweep(parent / "main", "main", train_rows())
    write_sweep(parent / "scaling", "scaling", bench_rows())
    text = efficiency.build(parent)  # a parent folder holding two sweeps
    assert "| softmax | ape | none | off | 3 | 2.1 |" in text  # seeds, mean train s/epoch (2.0, 2.1, 2.2)
    assert "Token scaling" not in text and "bench trials alone" not in text  # N-varying bench rows: not a cost table
    assert png_ok(parent / "efficiency_pareto.png") and not (parent / "token_scaling.png").exists()


def softmax_bench_row(pe: str, without: str = "") -> dict:
    """A bench row of softmax+pe's model (digits' default 8 px / patch 2, given explicitly): 5 ms per image;
    `without`: a config field left out, as in rows written before it existed."""
    row = {**config_row(task="bench", attention="softmax", pe=pe, dataset="digits", image_size=8, patch_size=2,
                        bench_batch=10), "tokens": 16, "train_step_ms": 50.0, "infer_ms_per_sample": 0.05,
           "peak_mem_mb": 300.0}
    return {k: v for k, v in row.items() if k != without}


def costs_by_attention(parent):
    return efficiency.variant_costs(common.load_trials(parent, "train"),
                                    common.load_trials(parent, "bench")).set_index("attention")


def test_efficiency_takes_times_from_bench_rows_and_labels_contended_train_times(tmp_path):
    start = 1.7e9  # Unix seconds, as the trainable reports them
    rows = []
    for attention, offsets in (("softmax", (0, 10)), ("favor", (0, 5))):  # favor's two seeds overlap
        for seed, offset in enumerate(offsets):
            rows.append({**config_row(attention=attention, pe="ape", seed=seed, dataset="digits"), "test_acc": 0.9,
                         "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2, "peak_mem_mb": 900.0, "n_train": 1000,
                         "hostname": "h", "started_at": start + 100 * (attention == "favor") + offset,
                         "finished_at": start + 100 * (attention == "favor") + offset + 8})
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", rows)
    write_sweep(parent / "cost", "cost", [softmax_bench_row("ape")])
    costs = costs_by_attention(parent)
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
    assert "cost per variant, bench trials alone (cost; device" in text


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


def test_field_matches_reads_a_missing_field_as_its_default():
    import pandas as pd

    rows = pd.DataFrame({"rotinv_path": ["dense", None, "lowrank"]})
    assert efficiency.field_matches(rows, "rotinv_path", "lowrank").tolist() == [False, True, True]
    assert efficiency.field_matches(rows, "rotinv_path", math.nan).tolist() == [False, True, True]  # NaN: default
    older = pd.DataFrame({"pe": ["rotinv", "rotinv"]})  # written before the field existed
    assert efficiency.field_matches(older, "rotinv_path", "lowrank").tolist() == [True, True]
    assert efficiency.field_matches(older, "rotinv_path", "dense").tolist() == [False, False]


def test_a_newer_field_in_one_sweep_keeps_an_older_sweeps_bench_rows_matching(tmp_path):
    """Rows of a sweep written before `rotinv_path` existed lack it; a sweep beside them that records it
    makes the combined frame carry NaN there. The older train rows still take their bench row's times."""
    train = [{**{k: v for k, v in config_row(attention="softmax", pe="rotinv", seed=s, dataset="digits").items()
                 if k != "rotinv_path"}, "test_acc": 0.9, "train_s_per_epoch": 2.0, "n_train": 1000} for s in range(2)]
    newer = [{**config_row(attention="favor", pe="ape", seed=0, dataset="digits"),  # records rotinv_path: lowrank
              "test_acc": 0.8, "train_s_per_epoch": 3.0, "n_train": 1000}]
    parent = tmp_path / "results"
    write_sweep(parent / "old", "old", train)
    write_sweep(parent / "cost", "cost", [softmax_bench_row("rotinv", without="rotinv_path")])
    write_sweep(parent / "new", "new", newer)
    costs = costs_by_attention(parent)
    assert costs.loc["softmax", "timing"] == efficiency.BENCH_TIMING
    assert costs.loc["softmax", "train_s_per_epoch"] == pytest.approx(5.0)  # 5 ms x 1000 images
    assert costs.loc["favor", "timing"] != efficiency.BENCH_TIMING  # no bench row of that model
    assert "rotinv_path" in common.load_trials(parent / "new", "train").columns


def test_pareto_accuracy_axis_whiskers_time_source_and_legend(tmp_path, figures):
    """Issue 43, item 7: one variant near the top magnified 0.08 points into a full axis; no seed whiskers;
    the sweep's own contended times looked like costs; the legend named qk_norm l2 and 'never redrawn'
    for rows that had neither."""
    rows = [{**r, "redraw_interval": 100} for r in train_rows()]  # every favor row redrew: no black rim
    rows = [{**r, "test_acc_draw_mean": r["test_acc"]} if r["attention"] != "softmax" else r for r in rows]
    write_sweep(tmp_path / "main", "main", rows)
    costs = efficiency.variant_costs(common.load_trials(tmp_path, "train"))
    softmax = costs[costs["attention"] == "softmax"].iloc[0]
    from rpevit.analysis.stats import mean_interval
    assert (softmax[efficiency.JUDGED_LO], softmax[efficiency.JUDGED_HI]) == pytest.approx(
        (mean_interval([0.90, 0.92, 0.91]).lo, mean_interval([0.90, 0.92, 0.91]).hi))
    efficiency.plot_pareto(costs, tmp_path / "pareto.png")
    fig = figures[-1]
    main = fig.axes[0]
    low, high = main.get_ylim()
    assert high - low >= efficiency.MIN_ACC_SPAN
    whiskers = [c for ax in fig.axes for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(whiskers) == 3 * len(costs)  # every variant has 3 seeds: a whisker in each cost panel
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "whiskers: 95% t interval over seeds" in labels
    assert not any("qk_norm" in x or "never redrawn" in x for x in labels), labels
    time_axis = next(ax.get_xlabel() for ax in fig.axes if "train s / epoch" in ax.get_xlabel())
    assert "contended" in time_axis or "one trial at a time" in time_axis, time_axis
    assert_readable_and_inside(fig)


def test_accuracy_range_is_never_shorter_than_the_minimum_span():
    low, high = efficiency.accuracy_range(np.array([72.08]), np.array([[np.nan, np.nan]]))
    assert high - low >= efficiency.MIN_ACC_SPAN and low < 72.08 < high
    low, high = efficiency.accuracy_range(np.array([50.0, 60.0]), np.array([[-30.0, 130.0], [55, 65]]))
    assert (low, high) == pytest.approx((-8.0, 108.0))  # 0-100 padded by 8%: whiskers past them run off the axis


# softmax+rope on MNIST as stored: seeds 0-4 in the converged study, seeds 0-2 again in the STRING study
TWO_SWEEP_ACC = {0: 0.9867, 1: 0.9873, 2: 0.9894, 3: 0.9869, 4: 0.9873}


def two_sweep_rows(parent) -> None:
    def row(seed: int) -> dict:
        return {**config_row(attention="softmax", pe="rope", seed=seed, dataset="digits"),
                "test_acc": TWO_SWEEP_ACC[seed], "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2,
                "flops": 2_325_120, "params": 1000, "aic": 100.0 + seed, "bic": 120.0 + seed, "n_train": 1000}
    write_sweep(parent / "converged", "converged", [row(s) for s in range(5)])
    write_sweep(parent / "string", "string", [row(s) for s in range(3)])


def test_a_seed_trained_in_two_sweeps_counts_once_in_the_cost_table_and_the_plot(tmp_path, figures):
    """Reviewer, item 1: MNIST softmax+rope showed 0.9876 (all 8 rows averaged, seeds 0-2 twice) for a
    5-seed mean of 0.98752; AIC, BIC and the plot's whiskers likewise weighted seeds 0-2 twice."""
    two_sweep_rows(tmp_path)
    from rpevit.analysis.stats import mean_interval
    values = list(TWO_SWEEP_ACC.values())
    rope = efficiency.variant_costs(common.load_trials(tmp_path, "train")).iloc[0]
    assert rope["seeds"] == 5
    assert rope["test_acc"] == pytest.approx(0.98752) and rope[efficiency.JUDGED_ACC] == pytest.approx(0.98752)
    assert (rope["aic"], rope["bic"]) == pytest.approx((102.0, 122.0))  # one per seed: 100 + mean(0..4)
    assert (rope[efficiency.JUDGED_LO], rope[efficiency.JUDGED_HI]) == pytest.approx(
        (mean_interval(values).lo, mean_interval(values).hi))
    text = efficiency.build(tmp_path)
    assert "| 98.75 |" in text and "98.76" not in text  # test_acc in %, the 5-seed mean
    panel = figures[-1].axes[0]  # the plot's point and whisker: the 5-seed mean and interval, in %
    point = next(c for c in panel.collections if len(c.get_offsets()))
    assert point.get_offsets()[0][1] == pytest.approx(98.752)
    bars = next(c for c in panel.containers if type(c).__name__ == "ErrorbarContainer")
    segment = bars.lines[2][0].get_segments()[0]
    assert (segment[0][1], segment[1][1]) == pytest.approx((100 * mean_interval(values).lo,
                                                             100 * mean_interval(values).hi))


def test_the_multiply_add_count_is_labelled_as_what_fvcore_counts(tmp_path, figures):
    """Reviewer, item 2: `flops` (fvcore: one multiply-add of a forward pass per image; elementwise ops 0)
    was headed `flops` and drawn as 'FLOPs per image', though a multiply-add is 2 FLOPs as device peaks count."""
    two_sweep_rows(tmp_path / "results")
    write_sweep(tmp_path / "results" / "cost", "cost", [{**softmax_bench_row("rope"), "flops": 2_325_120}])
    text = efficiency.build(tmp_path / "results")
    label = "multiply-adds per image, forward (fvcore; elementwise ops not counted)"
    headers = [line for line in text.splitlines() if line.startswith("| attention |")]
    assert len(headers) == 2 and all(f"| {label} |" in h and "| flops |" not in h for h in headers), headers
    assert "| 2.325e+06 |" in text  # the count as stored, not doubled
    assert "FLOPs per image" not in text and "2 FLOPs" in text  # says what a FLOP would be
    texts = [t.get_text() for ax in figures[-1].axes for t in (ax.xaxis.label, ax.title)]
    assert any("multiply-adds per image" in t and "elementwise ops not counted" in t for t in texts), texts
    assert not any("FLOPs" in t for t in texts), texts
    assert_readable_and_inside(figures[-1])


def test_cost_table_says_times_are_one_bench_run_accuracy_in_percent_and_what_aic_bic_are(tmp_path):
    """Reviewer, item 3: the header said 'means over seeds' of bench times and memory that come from one
    bench trial; test_acc was a fraction where every other table shows %; aic / bic were unexplained."""
    two_sweep_rows(tmp_path / "results")
    write_sweep(tmp_path / "results" / "cost", "cost", [softmax_bench_row("rope")])
    text = efficiency.build(tmp_path / "results")
    heading = next(line for line in text.splitlines() if line.startswith("### digits: cost per variant ("))
    assert "not a mean over seeds" in heading and "1 bench trial" in heading, heading
    header = next(line for line in text.splitlines() if line.startswith("| attention |"))
    assert "| test_acc % |" in header and "| judged_acc % |" in header and "| test_acc |" not in header
    assert "| 98.75 |" in text and "| 0.9875 |" not in text
    assert "`aic` = 2k − 2 LL" in text and "`bic` = k ln n − 2 LL" in text and "test-set" in text
    # without a bench row the times are the train trials' own: means over seeds, and the heading says so
    alone = efficiency.build(tmp_path / "results" / "converged")
    heading = next(line for line in alone.splitlines() if line.startswith("### digits: cost per variant ("))
    assert "means over seeds" in heading and "bench" not in heading, heading


# ---------------------------------------------------------------- intervals of the bench time ratios
def test_ratio_interval_is_welch_on_log_times_exponentiated_by_hand_and_by_scipy():
    """Reviewer: identical computations in one bench differ by up to ~7%, so a ratio needs its spread. The
    interval is that of the ratio of geometric means: Welch's t interval of mean log t - mean log t_ref."""
    variant, reference = [2.0, 2.2, 2.1], [1.0, 1.1, 1.05]
    got = efficiency.ratio_interval(variant, reference)
    # log variant = log 2 + log reference: equal spreads and n, so Welch's df is 2 (n - 1) = 4
    logs = np.log(reference)
    se = math.sqrt(2 * logs.var(ddof=1) / 3)
    q = sps.t.ppf(0.975, 4)
    assert got.point == pytest.approx(2.0) and got.n == (3, 3) and got.df == pytest.approx(4.0)
    assert (got.lo, got.hi) == pytest.approx((2 * math.exp(-q * se), 2 * math.exp(q * se)))
    assert got.excludes(1.0)
    # unequal n and spreads: scipy's Welch interval on the logs, exponentiated
    variant, reference = [2.0, 2.2, 2.1, 2.6], [1.0, 1.1, 1.05]
    got = efficiency.ratio_interval(variant, reference)
    ci = sps.ttest_ind(np.log(variant), np.log(reference), equal_var=False).confidence_interval(0.95)
    assert (got.lo, got.hi) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert got.point == pytest.approx(math.exp(np.log(variant).mean() - np.log(reference).mean()))


def test_ratio_interval_with_one_trial_on_either_side_has_none():
    """One bench trial carries no spread: no interval, not one made up from the trial's own repeats."""
    for variant, reference, n in (([2.0], [1.0, 1.1, 1.05], (1, 3)), ([2.0, 2.2], [1.0], (2, 1))):
        got = efficiency.ratio_interval(variant, reference)
        assert got.n == n and not got.bounded and math.isfinite(got.point)
    assert efficiency.ratio_interval([2.0], [1.0]).point == pytest.approx(2.0)


def repeated_bench_rows() -> list[dict]:
    """Bench trials of digits' model at 10 images per batch: softmax+ape 3 trials at 10, 11, 10.5 ms per step,
    rope 3 at 15, 16, 15.5, cayley_string 3 at 20, 22, 21 and circulant_string one at 25 (inference: /1000)."""
    times = {"ape": (1.0, 1.1, 1.05), "rope": (1.5, 1.6, 1.55), "cayley_string": (2.0, 2.2, 2.1),
             "circulant_string": (2.5,)}
    return [{**config_row(task="bench", attention="softmax", pe=pe, dataset="digits", image_size=8, patch_size=2,
                          bench_batch=10, seed=seed), "tokens": 16, "train_step_ms": 10 * t,
             "infer_ms_per_sample": t / 100, "peak_mem_mb": 300.0}
            for pe, ts in times.items() for seed, t in enumerate(ts)]


def table_row(section: str, attention: str, pe: str) -> dict[str, str]:
    """Header -> cell of the row of `section`'s (one) Markdown table that starts with attention | pe | none."""
    lines = section.splitlines()
    cells = lambda line: [cell.strip() for cell in line.strip().strip("|").split(" | ")]  # noqa: E731
    header = next(line for line in lines if line.startswith("| attention |"))
    row = next(line for line in lines if line.startswith(f"| {attention} | {pe} | none |"))
    return dict(zip(cells(header), cells(row)))


def test_cost_tables_show_each_ratio_with_its_interval_and_bench_trial_counts(tmp_path):
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", [{**config_row(attention="softmax", pe=pe, seed=0, dataset="digits"),
                                           "test_acc": 0.9, "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2,
                                           "n_train": 1000}
                                          for pe in ("ape", "rope", "cayley_string", "circulant_string")])
    write_sweep(parent / "cost", "cost", repeated_bench_rows())
    expected = efficiency.ratio_interval([20.0, 22.0, 21.0], [10.0, 11.0, 10.5])
    # the bench table: the point stays the ratio of medians (21 / 10.5), the interval is of the geometric means
    alone = efficiency.bench_cost_table(common.load_trials(parent, "bench")).set_index("pe")
    assert alone.loc["cayley_string", "train x softmax+ape"] == pytest.approx(2.0)
    got = alone.loc["cayley_string", "train x softmax+ape" + efficiency.RATIO_INTERVAL]
    assert (got.lo, got.hi) == pytest.approx((expected.lo, expected.hi)) and got.n == (3, 3)
    assert alone.loc["circulant_string", "train x rope" + efficiency.RATIO_INTERVAL].n == (1, 3)
    assert alone.loc["ape", "train x softmax+ape" + efficiency.RATIO_INTERVAL] is None  # its own reference
    # the train-variant table: s/epoch from the trials' ms per image x 1000 images; the scale cancels in the ratio
    costs = efficiency.cost_ratios(efficiency.variant_costs(common.load_trials(parent, "train"),
                                                            common.load_trials(parent, "bench"))).set_index("pe")
    got = costs.loc["cayley_string", "infer x softmax+ape" + efficiency.RATIO_INTERVAL]
    assert costs.loc["cayley_string", "infer x softmax+ape"] == pytest.approx(2.0)
    assert (got.lo, got.hi) == pytest.approx((expected.lo, expected.hi)) and got.n == (3, 3)
    # the Markdown cells: median ratio, interval and n; no interval with one trial; the reference plain
    text = efficiency.build(parent)
    cost, bench = text.split("bench trials alone", 1)
    cell = f"2 [{common.fmt(expected.lo)}, {common.fmt(expected.hi)}] (n=3,3)"
    for section in (cost, bench):
        cells = table_row(section, "softmax", "cayley_string")
        assert cells["train x softmax+ape"] == cells["infer x softmax+ape"] == cell, cells
        circulant = table_row(section, "softmax", "circulant_string")
        assert circulant["train x softmax+ape"] == common.fmt(25 / 10.5), circulant  # one trial: plain, said once
        reference = table_row(section, "softmax", "ape")
        assert reference["train x softmax+ape"] == reference["infer x softmax+ape"] == "1", reference
        rope = reference["train x rope"]  # softmax+ape against rope: an interval like any other variant's
        assert rope.startswith(f"{common.fmt(10.5 / 15.5)} [") and rope.endswith("(n=3,3)"), rope
    # the method text says what the bracket is
    for sentence in ("ratio of geometric means over bench trials", "Welch", "log times", "n: bench trials"):
        assert sentence in cost and sentence in bench
    # ... and counts the ratios printed plain, each resting on one bench trial on a side
    plain = "of the {} ratios rest on one bench trial on a side and are printed plain"
    assert plain.format(2 * 2 * 3) in bench, bench  # train and infer x two references x the three other variants
    assert "rest on one bench trial on a side" in cost


def test_ratios_that_all_rest_on_one_bench_trial_say_so_once_not_in_every_cell():
    """Every variant with one bench trial (the published bench sweeps): cells stay plain ratios and one line
    under the table says that none has an interval, so that a ratio near 1 is not read as resolved."""
    table = pd.DataFrame({"train x rope": [1.04, 1.0], "train x rope" + efficiency.RATIO_INTERVAL:
                          [stats.Interval(1.04, n=(1, 1)), None]})
    assert efficiency.text.shown(table, ["train x rope"])["train x rope"].tolist() == [1.04, 1.0]
    note = efficiency.text.ratio_note(table)
    assert note.startswith("No ratio here has an interval: each rests on one bench trial") and "[" not in note


def test_a_multiply_add_count_that_left_ops_out_is_shown_as_not_counted_with_the_ops_named(tmp_path, figures):
    """Before: the train and bench rows record `flops_unsupported` (ops fvcore had no count for), but the tables
    showed the short count as the variant's total and nothing said so. Now such a variant's count is — (NaN),
    a note names the variant and the ops (escaped: they are read from the results), and a complete count is
    shown as before."""
    parent = tmp_path / "results"
    two_sweep_rows(parent)  # softmax+rope, complete counts
    odd = "aten::*odd_op*,prim::PythonOp"
    favor = [{**config_row(attention="favor", pe="ape", seed=seed, dataset="digits"), "test_acc": 0.9,
              "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2, "flops": 1_000_000, "params": 1000, "n_train": 1000,
              "flops_unsupported": odd if seed == 1 else ""} for seed in range(3)]  # one seed's count is short
    write_sweep(parent / "favor", "favor", favor)
    write_sweep(parent / "cost", "cost", [{**softmax_bench_row("rope"), "flops": 2_325_120},
                                          {**softmax_bench_row("ape"), "flops": 900_000,
                                           "flops_unsupported": "aten::_fused_thing"}])
    costs = costs_by_attention(parent)
    assert math.isnan(costs.loc["favor", "flops"]) and costs.loc["favor", "flops_unsupported"] == common.md_text(odd)
    assert costs.loc["softmax", "flops"] == 2_325_120 and costs.loc["softmax", "flops_unsupported"] == ""
    alone = efficiency.bench_cost_table(common.load_trials(parent, "bench")).set_index("pe")
    assert math.isnan(alone.loc["ape", "flops"]) and alone.loc["rope", "flops"] == 2_325_120
    text = efficiency.build(parent)
    assert "| favor | ape |" in text and "1e+06" not in text and "| 2.325e+06 |" in text
    assert ("Multiply-adds not counted (— in the table and not drawn in the figure's multiply-adds panel): the "
            "counter (rpevit/flops.py) had no count for some ops these variants run, so their totals would be short: "
            r"digits favor+ape: aten::\*odd_op\*, prim::PythonOp.") in text, text
    assert r"cost softmax+ape: aten::\_fused_thing." in text and "900000" not in text and "9e+05" not in text
    assert_readable_and_inside(figures[-1])


def test_cost_tables_and_the_pareto_figure_name_the_devices_their_times_ran_on(tmp_path, figures):
    """Each cost heading, the bench tables' headings, the figure's caption and its suptitle name the devices of
    the rows whose times they show: bench rows where a variant's times are theirs, its train rows otherwise."""
    rows, bench = [], []
    for attention, pe, ms in (("softmax", "ape", 5.0), ("softmax", "rope", 6.0), ("favor", "ape", None)):
        rows.append({**config_row(attention=attention, pe=pe, seed=0, dataset="digits"), "test_acc": 0.9,
                     "train_s_per_epoch": 2.0, "infer_ms_per_sample": 0.2, "peak_mem_mb": 900.0, "n_train": 1000,
                     "device_name": "Train CPU A"})
        if ms is not None:  # favor has no bench row: its times are its train rows', on their device
            bench.append({**config_row(task="bench", attention=attention, pe=pe, dataset="digits", image_size=8,
                                       patch_size=2, bench_batch=10), "tokens": 16, "train_step_ms": 10 * ms,
                          "infer_ms_per_sample": ms / 100, "peak_mem_mb": 300.0, "device_name": "Bench GPU B"})
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", rows)
    write_sweep(parent / "cost", "cost", bench)
    train, benched = common.load_trials(parent, "train"), common.load_trials(parent, "bench")
    costs = efficiency.cost_ratios(efficiency.variant_costs(train, benched))
    both = "2 devices: Bench GPU B (2 rows); Train CPU A (1 rows)"
    assert efficiency.time_devices(costs) == both
    assert efficiency.time_devices(costs[costs["timing"] == efficiency.BENCH_TIMING]) == "device: Bench GPU B"
    assert both in efficiency.pareto_title(costs)
    assert both in efficiency.pareto_caption(costs)[0]
    text = efficiency.build(parent)
    assert "### digits: cost per variant (accuracy, aic, bic" in text and f"times on {both})" in text
    assert "bench trials alone (cost; device: Bench GPU B)" in text
    assert both in figures[-1]._suptitle.get_text()  # the figure build drew
    alone = efficiency.variant_costs(train)  # no bench rows: every time is the train rows'
    assert efficiency.time_devices(alone) == "device: Train CPU A"
    assert efficiency.time_devices(alone.drop(columns=efficiency.TIME_DEVICES)) == "device unknown"
