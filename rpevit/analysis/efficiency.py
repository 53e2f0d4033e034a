"""What each variant costs, and how its time grows with the token count N.

    python analysis/efficiency.py RESULTS_DIR

From `train` trials, per dataset and (attention, pe): train s/epoch, inference ms/sample, peak
memory, FLOPs per image, parameters, AIC, BIC and test accuracy (means over seeds), and an
accuracy-vs-cost plot with the Pareto front marked (no other variant is at least as accurate AND
at most as costly; a random-feature model's accuracy there is its mean over fresh draws). Times and
memory come from `bench` rows of the same model where there are any (a bench trial has its node to
itself: train s/epoch = its training-step time per image x the train rows' images per epoch);
otherwise from the train rows, and the `timing` column says when those trials ran side by side with
others (contended: their times are not comparable).
From `bench` trials (if any): time against N on log-log axes per (attention, pe), with the fitted
slope of log time on log N over all N and over the three largest N (small N is dominated by
fixed overheads, so the large-N slope is the one to compare with 1 (linear) and 2 (quadratic)).
Writes efficiency.md, efficiency_pareto.png and token_scaling.png into RESULTS_DIR.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis.common import (VARIANT, column, fmt, judged_accuracy, markdown_table, pyplot, read_trials,
                                    save_figure, script_main, with_variant)

from rpevit import registry
from rpevit.data import DATASET_SPECS
from rpevit.models.factory import init_parameters
from rpevit.sweep.results import unix_seconds

TIME_COLUMNS = ("train_s_per_epoch", "infer_ms_per_sample", "peak_mem_mb")  # measured: bench rows when there are
JUDGED_ACC = "judged_acc"  # common.judged_accuracy: the draw mean for random-feature models, else test_acc
COST_COLUMNS = (*TIME_COLUMNS, "flops", "params", "aic", "bic", "test_acc", "test_acc_draw_mean", JUDGED_ACC)
PARETO_Y_SPAN = 5.0  # accuracy points shown below the best; variants further down sit at the edge as ▼
LOG_AXIS_MIN_RATIO = 10.0  # a cost spanning less than this factor is drawn on a linear axis (readable ticks)
# config fields that change what one image costs: a bench row stands for a train variant when all the
# ones that apply to it agree (shape fields always; an option only if the variant's classes take it)
SHAPE_FIELDS = ("image_size", "patch_size", "dim", "depth", "heads", "mlp_ratio", "amp")
MODEL_FIELDS = (*SHAPE_FIELDS, "num_features", "feature_type", "relu_projection", "luo_path", "string_sparsity",
                "cayley_solver", "reflection_block", "reflection_count", "rotinv_mode", "rotinv_degree",
                "rotinv_basis", "rotinv_draws")
BENCH_TIMING = "bench (alone)"
CONTENDED = "train, contended (trials ran side by side)"
ONE_AT_A_TIME = "train (one trial at a time)"
UNKNOWN_TIMES = "train, possibly contended (no start/end times)"
PARETO_COSTS = (("flops", "FLOPs per image"), ("train_s_per_epoch", "train s / epoch"),
                ("infer_ms_per_sample", "inference ms / sample"))
SCALING_TIMES = ("forward_ms", "train_step_ms", "infer_ms")
# (label, attention, pe) of the rows each variant's times are divided by, per dataset
REFERENCES = (("softmax+ape", "softmax", "ape"), ("rope", "softmax", "rope"))
RATIO_TIMES = (("train", "train_s_per_epoch"), ("infer", "infer_ms_per_sample"))
NOTEBOOK_REFERENCE = ("For comparison, the reference notebook this project started from (plain PyTorch on a laptop "
                      "CPU) "
                      "measured Cayley-STRING at 5.5x RoPE's time per epoch on MNIST and 18.7x on CIFAR-10, and "
                      "sparse Cayley-STRING at f = 1 up to 221x.")
LARGE_N_POINTS = 3


def pareto_front(cost: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Boolean mask of the points no other point dominates (cost <= and acc >=, one strictly); a point
    without a cost or an accuracy (NaN) is never on the front."""
    keep = np.isfinite(cost) & np.isfinite(acc)
    for i in range(len(cost)):
        dominated = (cost <= cost[i]) & (acc >= acc[i]) & ((cost < cost[i]) | (acc > acc[i]))
        keep[i] = keep[i] and not dominated.any()
    return keep


def loglog_slope(n: np.ndarray, t: np.ndarray) -> float:
    """Least-squares slope of log t on log n (NaN with fewer than two distinct n)."""
    if len(np.unique(n)) < 2:
        return float("nan")
    return float(np.polyfit(np.log(n), np.log(t), 1)[0])


def variant_costs(frame: pd.DataFrame, bench: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean cost per variant (dataset, attention, pe, qk_norm, redraw): qk_norm and redraw schedules are
    separate variants, so their costs and accuracies are not averaged together. TIME_COLUMNS come from
    `bench` rows of the variant's model where there are any; `timing` says where they came from."""
    frame = with_resolved_shape(with_variant(frame))
    frame["overlapped"] = overlapped(frame)
    frame[JUDGED_ACC] = judged_accuracy(frame)
    cols = [c for c in COST_COLUMNS if c in frame.columns]
    groups = frame.groupby(list(VARIANT))
    table = groups[cols].mean()
    table["seeds"] = groups["seed"].nunique()  # a seed trained in two sweeps (MNIST rope) counts once
    if "n_train" in frame.columns:  # images per epoch: turns a bench step time into seconds per epoch
        table["n_train"] = groups["n_train"].mean()
    table["timing"] = groups["overlapped"].agg(lambda o: UNKNOWN_TIMES if o.isna().any() else
                                               CONTENDED if o.astype(bool).any() else ONE_AT_A_TIME)
    table = table.reset_index()
    if bench is not None and not bench.empty:
        measured = bench_costs(bench)
        shapes = groups[[c for c in MODEL_FIELDS if c in frame.columns]].agg(lambda v: tuple(v.unique()))
        for i, row in table.iterrows():
            found = matching_bench(measured, row, shapes.loc[tuple(row[list(VARIANT)])])
            if found is not None:
                table.loc[i, "train_s_per_epoch"] = found["train_ms_per_image"] * row.get("n_train", np.nan) / 1e3
                table.loc[i, ["infer_ms_per_sample", "peak_mem_mb"]] = found[["infer_ms_per_sample", "peak_mem_mb"]]
                table.loc[i, "timing"] = BENCH_TIMING
    return table


def cost_ratios(costs: pd.DataFrame) -> pd.DataFrame:
    """Per row: train s/epoch and inference ms/sample divided by those of the same dataset's
    softmax+ape and softmax+rope (qk_norm none), as columns "train x softmax+ape", ...; NaN unless
    both times come from bench trials (contended times are not comparable between variants)."""
    out = costs.copy()
    for label, attention, pe in REFERENCES:
        for kind, col in RATIO_TIMES:
            name = f"{kind} x {label}"
            out[name] = np.nan
            if col not in out.columns:
                continue
            for dataset, g in out.groupby("dataset"):
                ref = g[(g["attention"] == attention) & (g["pe"] == pe) & (g["qk_norm"] == "none")]
                if len(ref) != 1 or ref["timing"].iloc[0] != BENCH_TIMING:
                    continue
                timed = g["timing"] == BENCH_TIMING
                out.loc[g.index[timed], name] = g.loc[timed, col] / ref[col].iloc[0]
    return out


BENCH_COST_COLUMNS = ("train_step_ms", "train_ms_per_image", "infer_ms_per_sample", "flops", "params", "peak_mem_mb")


def bench_cost_table(bench: pd.DataFrame) -> pd.DataFrame:
    """Per cost-bench sweep (one model size: bench_mnist_cpu.yaml, ...) and variant: median training-step
    time, its time per image, inference ms per sample, FLOPs, params, peak memory, and the step and
    inference times divided by those of the same sweep's softmax+ape and softmax+rope (qk_norm none)."""
    cost = bench[~bench.index.isin(scaling_rows(bench).index)]
    if cost.empty:
        return pd.DataFrame()
    b = with_variant(cost)
    b["train_ms_per_image"] = b["train_step_ms"] / b["bench_batch"]
    keys = ["sweep", *VARIANT]
    values = [c for c in BENCH_COST_COLUMNS if c in b.columns]
    table = b.groupby(keys, dropna=False)[values].median().reset_index()
    table["batch"] = b.groupby(keys, dropna=False)["bench_batch"].first().to_numpy()
    table["N"] = b.groupby(keys, dropna=False)["tokens"].first().to_numpy()
    for label, attention, pe in REFERENCES:
        for kind, col in (("train", "train_step_ms"), ("infer", "infer_ms_per_sample")):
            table[f"{kind} x {label}"] = np.nan
            for _, g in table.groupby("sweep"):
                ref = g[(g["attention"] == attention) & (g["pe"] == pe) & (g["qk_norm"] == "none")]
                if len(ref) == 1:
                    table.loc[g.index, f"{kind} x {label}"] = g[col] / ref[col].iloc[0]
    return table


def timing_note(labels: set[str]) -> str:
    """What the `timing` values of a table mean, for those it shows."""
    meaning = {
        BENCH_TIMING: "bench trials of the same model, each with its node to itself (train s/epoch = "
                      "training-step time per image x the train rows' images per epoch)",
        CONTENDED: "the train trials' own times, measured while other trials of these results ran on the same "
                   "machine: not comparable between variants (run a bench space of the same models for that)",
        ONE_AT_A_TIME: "the train trials' own times; no other trial of these results overlapped them",
        UNKNOWN_TIMES: "the train trials' own times; the rows have no start/end times to tell whether trials "
                       "overlapped",
    }
    return f"`timing`: where {', '.join(TIME_COLUMNS)} come from. " + " ".join(
        f"_{label}_: {meaning[label]}." for label in meaning if label in labels)


def with_resolved_shape(frame: pd.DataFrame) -> pd.DataFrame:
    """image_size / patch_size 0 (the dataset's default) replaced by the default, so that a bench
    row giving 28 / 7 matches a train row leaving MNIST's defaults."""
    out = frame.copy()
    for name in ("image_size", "patch_size"):
        if name in out.columns:
            default = out["dataset"].map(lambda d, n=name: getattr(DATASET_SPECS[d], n) if d in DATASET_SPECS else 0)
            out[name] = out[name].where(out[name].fillna(0) > 0, default)
    return out


def overlapped(frame: pd.DataFrame) -> pd.Series:
    """Per row: whether another trial of these results ran on its host at the same time (True),
    not (False), or unknown (NaN: no start/end times)."""
    out = pd.Series(np.nan, index=frame.index, dtype=object)
    if "started_at" not in frame.columns or "finished_at" not in frame.columns:
        return out
    host = column(frame, "hostname", "").fillna("")
    for _, g in frame[frame["started_at"].notna() & frame["finished_at"].notna()].groupby(host):
        start, end = unix_seconds(g["started_at"]).to_numpy(), unix_seconds(g["finished_at"]).to_numpy()
        both = (start[:, None] < end[None, :]) & (start[None, :] < end[:, None])
        out[g.index] = (both.sum(axis=1) > 1).tolist()  # each row overlaps itself
    return out


def bench_costs(bench: pd.DataFrame) -> pd.DataFrame:
    """Median training ms per image, inference ms per sample and peak memory per bench model."""
    b = with_resolved_shape(with_variant(bench))
    b["train_ms_per_image"] = b["train_step_ms"] / b["bench_batch"]
    keys = [*VARIANT, *(c for c in MODEL_FIELDS if c in b.columns)]
    values = [c for c in ("train_ms_per_image", "infer_ms_per_sample", "peak_mem_mb") if c in b.columns]
    return b.groupby(keys, dropna=False)[values].median().reset_index()


@functools.lru_cache(maxsize=None)
def model_fields(attention: str, pe: str) -> tuple[str, ...]:
    """The MODEL_FIELDS that change the cost of (attention, pe): the shape, and the options that the
    backend's and the encodings' classes declare (rpevit.models.factory.init_parameters), so that a
    rotinv option recorded differently in two sweeps does not keep softmax+ape rows apart."""
    registry.load_all()
    classes = [registry.ATTENTIONS.get(attention.removesuffix("-identity"))]
    classes += [registry.POSITION_ENCODINGS.get(name) for name in pe.split(" (")[0].split("+")]
    declared = {name for cls in classes if cls is not None for name in init_parameters(cls)}
    return tuple(f for f in MODEL_FIELDS if f in SHAPE_FIELDS or f in declared)


def matching_bench(measured: pd.DataFrame, variant: pd.Series, shape: pd.Series) -> pd.Series | None:
    """The bench row of a train variant's model: same VARIANT and the model fields that apply to it
    (the variant's rows must all have one model: a variant averaged over several sizes has no
    single bench row)."""
    relevant = model_fields(variant["attention"], variant["pe"])
    shape = shape[[name for name in shape.index if name in relevant]]
    if any(len(values) != 1 for values in shape):
        return None
    mask = np.ones(len(measured), dtype=bool)
    for name in VARIANT:
        mask &= (measured[name] == variant[name]).to_numpy()
    for name, values in shape.items():
        mask &= (measured[name] == values[0]).to_numpy() if name in measured.columns else False
    return measured[mask].iloc[0] if mask.any() else None


def scaling_rows(bench: pd.DataFrame) -> pd.DataFrame:
    """The bench rows of sweeps that vary the token count N (token_scaling*.yaml): a cost bench at
    one model size (bench_mnist_cpu.yaml, ...) has no slope to fit."""
    if bench.empty or "tokens" not in bench.columns:
        return bench.iloc[0:0]
    varies = bench.groupby("sweep")["tokens"].transform("nunique") > 1
    return bench[varies]


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
        costs = cost_ratios(variant_costs(train, bench))
        ratios = [f"{kind} x {label}" for label, _, _ in REFERENCES for kind, _ in RATIO_TIMES]
        ratios = [c for c in ratios if costs[c].notna().any()]
        show = [*VARIANT[1:], *(c for c in ("seeds", *COST_COLUMNS, *ratios, "timing") if c in costs.columns)]
        for dataset, g in costs.groupby("dataset"):
            parts += [f"### {dataset}: cost per variant (means over seeds)", "",
                      markdown_table(show, g[show].itertuples(index=False)), ""]
        parts += [timing_note(set(costs["timing"])), ""]
        if ratios:
            parts += [f"`train x` / `infer x` columns: this variant's train s/epoch / inference ms per sample divided "
                      f"by those of the dataset's softmax+ape or softmax+rope (bench times only). {NOTEBOOK_REFERENCE}",
                      ""]
        if plot_pareto(costs, results_dir / "efficiency_pareto.png") is not None:
            parts += ["Accuracy (the mean over fresh draws for random-feature models) against cost; ringed points "
                      "form the Pareto front (no variant is both at least as "
                      "accurate and at most as costly).", "", "![accuracy vs cost](efficiency_pareto.png)", ""]
    alone = bench_cost_table(bench) if not bench.empty else pd.DataFrame()
    if not alone.empty:
        for (sweep, dataset), g in alone.groupby(["sweep", "dataset"]):
            show = ["attention", "pe", "qk_norm", "redraw", "N", "batch", *BENCH_COST_COLUMNS,
                    *(c for c in g.columns if " x " in c and g[c].notna().any())]
            parts += [f"### {dataset}: cost per variant, bench trials alone ({sweep})", "",
                      markdown_table(show, g[show].itertuples(index=False)), ""]
        parts += ["Medians of interleaved timed runs of each variant, each bench trial with the machine to itself, "
                  "at the study's model and batch, with the threads its trials train with (`torch_threads` in the "
                  "rows). `x softmax+ape` / `x rope`: training-step and inference time divided by those of the "
                  f"same sweep's softmax+ape and softmax+rope. {NOTEBOOK_REFERENCE}", ""]
        if (column(bench, "peak_mem_kind", "") == "process_max_rss").any():
            parts += ["`peak_mem_mb` on CPU is the worker process's maximum resident memory (`peak_mem_kind` "
                      "process_max_rss), reset before each run but floored by what the process already holds: "
                      "differences below that floor do not show.", ""]
    scaling = scaling_rows(bench)
    if not scaling.empty:
        slopes = scaling_slopes(scaling)
        parts += ["### Token scaling (bench trials): slope of log time against log N", "",
                  markdown_table(list(slopes.columns), slopes.itertuples(index=False)), "",
                  "![token scaling](token_scaling.png)", ""]
        plot_scaling(scaling, results_dir / "token_scaling.png")
    return "\n".join(parts)


def variant_label(r: pd.Series) -> str:
    """attention+pe, with qk_norm and redraw only where they differ from the defaults (none, off)."""
    extra = [f"qk {r['qk_norm']}"] * (r["qk_norm"] != "none") + [f"redraw {r['redraw']}"] * (r["redraw"] != "off")
    return f"{r['attention']}+{r['pe']}" + (f" ({', '.join(extra)})" if extra else "")


def plot_pareto(costs: pd.DataFrame, path: Path) -> Path | None:
    """One panel per dataset and cost that has positive values; accuracy is JUDGED_ACC, so a random-feature
    model sits at its mean over fresh draws; log cost axes where the cost spans LOG_AXIS_MIN_RATIO or more. The
    accuracy axis spans PARETO_Y_SPAN points below the best, so a collapsed variant (a redraw-off model on fresh
    draws: 20-30 %) does not squash the front; such variants are drawn as ▼ at the lower edge and counted.
    None if no cost has any values."""
    metrics = [(c, label) for c, label in PARETO_COSTS if c in costs.columns and (costs[c] > 0).any()]
    if not metrics:
        return None
    plt = pyplot()
    datasets = sorted(costs["dataset"].unique())
    fig, axes = plt.subplots(len(datasets), len(metrics), figsize=(5 * len(metrics), 4 * len(datasets)),
                             squeeze=False)
    for row_axes, dataset in zip(axes, datasets):
        g = costs[costs["dataset"] == dataset].reset_index(drop=True)
        for ax, (col, label) in zip(row_axes, metrics):
            cost, acc = g[col].to_numpy(float), 100 * g[JUDGED_ACC].to_numpy(float)
            front = pareto_front(cost, acc)
            floor = max(np.nanmin(acc), np.nanmax(acc) - PARETO_Y_SPAN) - 0.05 * min(PARETO_Y_SPAN, np.ptp(acc))
            for i, r in g.iterrows():
                marker = {"softmax": "o", "favor": "s", "relu": "^"}.get(r["attention"], "D")
                below = acc[i] < floor
                dot = ax.scatter(np.nan if below else cost[i], acc[i], marker=marker, s=40, label=variant_label(r))
                if below:  # same colour, at the edge; the legend keeps the variant's own marker
                    ax.scatter(cost[i], floor, marker="v", s=40, color=dot.get_facecolor(), clip_on=False)
                if front[i]:
                    ax.scatter(cost[i], acc[i], s=160, facecolors="none", edgecolors="k")
            order = np.argsort(cost[front])
            ax.plot(cost[front][order], acc[front][order], "k--", lw=0.8)
            log = np.nanmax(cost) / np.nanmin(cost[cost > 0]) >= LOG_AXIS_MIN_RATIO
            ax.set_xscale("log" if log else "linear")
            ax.set_xlabel(f"{label}{' (log)' if log else ''}")
            ax.set_ylabel("test accuracy % (draw mean for random features)")
            below = int((acc < floor).sum())
            ax.set_ylim(floor, None)
            ax.set_title(dataset)
            if below:
                ax.text(0.02, 0.04, f"▼ {below} variants below {floor:.1f} %", transform=ax.transAxes, fontsize=7)
        row_axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), ncol=1 + (len(g) - 1) // 24)
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
