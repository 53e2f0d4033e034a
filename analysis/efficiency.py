"""What each variant costs, and how its time grows with the token count N.

    python analysis/efficiency.py RESULTS_DIR

From `train` trials, per dataset and (attention, pe): train s/epoch, inference ms/sample, FLOPs per
image, parameters, AIC, BIC and test accuracy (means over seeds), and an accuracy-vs-cost plot with
the Pareto front marked (no other variant is at least as accurate AND at most as costly).
From `bench` trials (if any): time against N on log-log axes per (attention, pe), with the fitted
slope of log time on log N over all N and over the three largest N (small N is dominated by
fixed overheads, so the large-N slope is the one to compare with 1 (linear) and 2 (quadratic)).
Writes efficiency.md, efficiency_pareto.png and token_scaling.png into RESULTS_DIR.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from common import VARIANT, fmt, markdown_table, pyplot, read_trials, save_figure, script_main, with_variant

COST_COLUMNS = ("train_s_per_epoch", "infer_ms_per_sample", "flops", "params", "aic", "bic", "test_acc")
PARETO_COSTS = (("flops", "FLOPs per image"), ("train_s_per_epoch", "train s / epoch"),
                ("infer_ms_per_sample", "inference ms / sample"))
SCALING_TIMES = ("forward_ms", "train_step_ms", "infer_ms")
LARGE_N_POINTS = 3


def pareto_front(cost: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Boolean mask of the points no other point dominates (cost <= and acc >=, one strictly)."""
    keep = np.ones(len(cost), dtype=bool)
    for i in range(len(cost)):
        dominated = (cost <= cost[i]) & (acc >= acc[i]) & ((cost < cost[i]) | (acc > acc[i]))
        keep[i] = not dominated.any()
    return keep


def loglog_slope(n: np.ndarray, t: np.ndarray) -> float:
    """Least-squares slope of log t on log n (NaN with fewer than two distinct n)."""
    if len(np.unique(n)) < 2:
        return float("nan")
    return float(np.polyfit(np.log(n), np.log(t), 1)[0])


def variant_costs(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean cost per variant (dataset, attention, pe, qk_norm, redraw): qk_norm and redraw schedules are
    separate variants, so their costs and accuracies are not averaged together."""
    frame = with_variant(frame)
    cols = [c for c in COST_COLUMNS if c in frame.columns]
    table = frame.groupby(list(VARIANT))[cols].mean()
    table["seeds"] = frame.groupby(list(VARIANT)).size()
    return table.reset_index()


def scaling_groups(bench: pd.DataFrame) -> list[str]:
    """(attention, pe), and the sweep too when several bench sweeps (other models / machines) are present."""
    return (["sweep"] if bench["sweep"].nunique() > 1 else []) + ["attention", "pe"]


def scaling_slopes(bench: pd.DataFrame) -> pd.DataFrame:
    """Per variant: slopes of each timing against N, over all N and over the largest N."""
    rows = []
    times = [c for c in SCALING_TIMES if c in bench.columns]
    keys = scaling_groups(bench)
    for values, g in bench.groupby(keys):
        g = g.groupby("tokens")[times].median().reset_index().sort_values("tokens")
        row = {**dict(zip(keys, values)), "N": f"{int(g['tokens'].min())}..{int(g['tokens'].max())}"}
        for col in times:
            n, t = g["tokens"].to_numpy(float), g[col].to_numpy(float)
            row[f"{col} slope (all N)"] = loglog_slope(n, t)
            row[f"{col} slope (largest {LARGE_N_POINTS} N)"] = loglog_slope(n[-LARGE_N_POINTS:], t[-LARGE_N_POINTS:])
        rows.append(row)
    return pd.DataFrame(rows)


def build(results_dir: Path) -> str | None:
    """Markdown section (and PNGs) for the train and bench trials under results_dir; None if neither."""
    trials = read_trials(results_dir, ["train", "bench"])
    if trials.frame.empty:
        return None
    train, bench = (trials.frame[trials.frame["task"] == task].reset_index(drop=True) for task in ("train", "bench"))
    parts = ["## Efficiency", "", trials.note(), ""]
    if not train.empty:
        costs = variant_costs(train)
        show = [*VARIANT[1:], *(c for c in ("seeds", *COST_COLUMNS) if c in costs.columns)]
        for dataset, g in costs.groupby("dataset"):
            parts += [f"### {dataset}: cost per variant (means over seeds)", "",
                      markdown_table(show, g[show].itertuples(index=False)), ""]
        plot_pareto(costs, results_dir / "efficiency_pareto.png")
        parts += ["Accuracy against cost; ringed points form the Pareto front (no variant is both at least as "
                  "accurate and at most as costly).", "", "![accuracy vs cost](efficiency_pareto.png)", ""]
    if not bench.empty and "tokens" in bench.columns:
        slopes = scaling_slopes(bench)
        parts += ["### Token scaling (bench trials): slope of log time against log N", "",
                  markdown_table(list(slopes.columns), slopes.itertuples(index=False)), "",
                  "![token scaling](token_scaling.png)", ""]
        plot_scaling(bench, results_dir / "token_scaling.png")
    return "\n".join(parts)


def variant_label(r: pd.Series) -> str:
    """attention+pe, with qk_norm and redraw only where they differ from the defaults (none, off)."""
    extra = [f"qk {r['qk_norm']}"] * (r["qk_norm"] != "none") + [f"redraw {r['redraw']}"] * (r["redraw"] != "off")
    return f"{r['attention']}+{r['pe']}" + (f" ({', '.join(extra)})" if extra else "")


def plot_pareto(costs: pd.DataFrame, path: Path) -> Path:
    plt = pyplot()
    datasets = sorted(costs["dataset"].unique())
    metrics = [(c, label) for c, label in PARETO_COSTS if c in costs.columns]
    fig, axes = plt.subplots(len(datasets), len(metrics), figsize=(5 * len(metrics), 4 * len(datasets)),
                             squeeze=False)
    for row_axes, dataset in zip(axes, datasets):
        g = costs[costs["dataset"] == dataset].reset_index(drop=True)
        for ax, (col, label) in zip(row_axes, metrics):
            cost, acc = g[col].to_numpy(float), 100 * g["test_acc"].to_numpy(float)
            front = pareto_front(cost, acc)
            for i, r in g.iterrows():
                marker = {"softmax": "o", "favor": "s", "relu": "^"}.get(r["attention"], "D")
                ax.scatter(cost[i], acc[i], marker=marker, s=40, label=variant_label(r))
                if front[i]:
                    ax.scatter(cost[i], acc[i], s=160, facecolors="none", edgecolors="k")
            order = np.argsort(cost[front])
            ax.plot(cost[front][order], acc[front][order], "k--", lw=0.8)
            ax.set_xscale("log")
            ax.set_xlabel(f"{label} (log)")
            ax.set_ylabel("test accuracy %")
            ax.set_title(f"{dataset}")
        row_axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return save_figure(fig, path)


def plot_scaling(bench: pd.DataFrame, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    keys = scaling_groups(bench)
    for values, g in bench.groupby(keys):
        g = g.groupby("tokens")["forward_ms"].median().reset_index().sort_values("tokens")
        n, t = g["tokens"].to_numpy(float), g["forward_ms"].to_numpy(float)
        slope = loglog_slope(n[-LARGE_N_POINTS:], t[-LARGE_N_POINTS:])
        ax.loglog(n, t, "o-", label=f"{' '.join(map(str, values))} (slope {fmt(slope, 3)})")
    ax.set_xlabel("tokens N (log)")
    ax.set_ylabel("forward ms per batch (log)")
    ax.set_title(f"token scaling; slope fitted on the largest {LARGE_N_POINTS} N")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def main() -> None:
    script_main(__doc__, build, "efficiency.md", "Efficiency", "train or bench trials")


if __name__ == "__main__":
    main()
