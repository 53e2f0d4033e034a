"""What each variant costs.

    python analysis/efficiency.py RESULTS_DIR

From `train` trials, per dataset and (attention, pe): train s/epoch, inference ms/sample, peak
memory, forward multiply-adds per image (the rows' `flops`: fvcore's count, elementwise ops 0; 2 FLOPs
each as device peaks count; not counted, —, with a note naming the ops, for a variant whose rows name
ops the counter could not count in `flops_unsupported`), parameters, AIC, BIC and test accuracy in %
(means over seeds, a seed trained in two sweeps counted once; times and memory from bench rows are
those rows', not seed means), and an accuracy-vs-cost plot with the Pareto front marked (no other variant is at least as accurate AND
at most as costly; a random-feature model's accuracy there is its mean over fresh draws). Times and
memory come from `bench` rows of the same model where there are any (a bench trial has its node to
itself: train s/epoch = its training-step time per image x the train rows' images per epoch);
otherwise from the train rows, and the `timing` column says when those trials ran side by side with
others (contended: their times are not comparable).
From `bench` trials at one model size: each variant's cost alone on the machine. Bench sweeps that
vary the token count N are token_scaling.py's.
Writes efficiency.md and efficiency_pareto.png into RESULTS_DIR. The numbers are computed in compute.py,
written as Markdown in text.py and drawn in figure.py; this module joins them (`build`).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from rpevit.analysis.common import read_trials, script_main
from rpevit.analysis.efficiency.compute import (BENCH_COST_COLUMNS, BENCH_TIMING, CONTENDED, COST_COLUMNS,
                                                FLOPS_UNSUPPORTED, JUDGED_ACC, JUDGED_HI, JUDGED_LO, MULTIPLY_ADDS,
                                                ONE_AT_A_TIME, RATIO_INTERVAL, REFERENCES, SHAPE_FIELDS,
                                                TIME_COLUMNS, TIME_DEVICES, TRIALS, UNKNOWN_TIMES, bench_cost_table,
                                                bench_costs, cost_bench_rows, cost_ratios, field_matches,
                                                matching_bench, model_field_names, model_fields, overlapped, overlaps,
                                                pareto_front, ratio_interval, time_devices, uncounted_flops,
                                                unsupported_ops, variant_costs, with_ratios, with_resolved_shape)
from rpevit.analysis.efficiency.figure import (DODGE_PT, MIN_ACC_SPAN, PARETO_Y_SPAN, accuracy_range, dodge,
                                               pareto_title, plot_pareto)
from rpevit.analysis.efficiency.text import bench_section, cost_section, pareto_caption, timing_note, uncounted_note


def build(results_dir: Path) -> str | None:
    """Markdown section (and PNGs) for the train and bench trials under results_dir; None if neither."""
    trials = read_trials(results_dir, ["train", "bench"]).without_rotation_study()
    if trials.frame.empty:
        return None
    train, bench = (trials.frame[trials.frame["task"] == task].reset_index(drop=True) for task in ("train", "bench"))
    parts = ["## Efficiency", "", trials.note(), ""]
    if not train.empty:
        costs = cost_ratios(variant_costs(train, bench))
        parts += cost_section(costs)
        if plot_pareto(costs, results_dir / "efficiency_pareto.png") is not None:
            parts += pareto_caption(costs)
    alone = bench_cost_table(bench) if not bench.empty else pd.DataFrame()
    if not alone.empty:
        parts += bench_section(alone, bench)
    return "\n".join(parts)


def main() -> None:
    script_main(__doc__, build, "efficiency.md", "Efficiency", "train or bench trials")


__all__ = ["BENCH_COST_COLUMNS", "BENCH_TIMING", "CONTENDED", "COST_COLUMNS", "DODGE_PT", "FLOPS_UNSUPPORTED",
           "JUDGED_ACC", "JUDGED_HI",
           "JUDGED_LO", "MIN_ACC_SPAN", "MULTIPLY_ADDS", "ONE_AT_A_TIME", "PARETO_Y_SPAN", "RATIO_INTERVAL",
           "REFERENCES", "SHAPE_FIELDS", "TIME_COLUMNS", "TIME_DEVICES", "TRIALS", "UNKNOWN_TIMES", "accuracy_range",
           "bench_cost_table", "bench_costs", "build", "cost_bench_rows", "cost_ratios", "dodge", "field_matches",
           "main", "matching_bench", "model_field_names", "model_fields", "overlapped", "overlaps", "pareto_front",
           "plot_pareto", "pareto_title", "ratio_interval", "time_devices", "timing_note", "uncounted_flops",
           "uncounted_note",
           "unsupported_ops", "variant_costs", "with_ratios", "with_resolved_shape"]
