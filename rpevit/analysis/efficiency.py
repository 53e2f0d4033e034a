"""What each variant costs.

    python analysis/efficiency.py RESULTS_DIR

From `train` trials, per dataset and (attention, pe): train s/epoch, inference ms/sample, peak
memory, FLOPs per image, parameters, AIC, BIC and test accuracy (means over seeds), and an
accuracy-vs-cost plot with the Pareto front marked (no other variant is at least as accurate AND
at most as costly; a random-feature model's accuracy there is its mean over fresh draws). Times and
memory come from `bench` rows of the same model where there are any (a bench trial has its node to
itself: train s/epoch = its training-step time per image x the train rows' images per epoch);
otherwise from the train rows, and the `timing` column says when those trials ran side by side with
others (contended: their times are not comparable).
From `bench` trials at one model size: each variant's cost alone on the machine. Bench sweeps that
vary the token count N are token_scaling.py's.
Writes efficiency.md and efficiency_pareto.png into RESULTS_DIR.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis.common import (VARIANT, column, cost_options, fmt, judged_accuracy, markdown_table, pyplot,
                                    read_trials, save_figure, script_main, with_variant)
from rpevit.analysis.stats import mean_interval
from rpevit.analysis.token_scaling import scaling_rows

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.data import DATASET_SPECS
from rpevit.sweep.results import is_missing, unix_seconds

TIME_COLUMNS = ("train_s_per_epoch", "infer_ms_per_sample", "peak_mem_mb")  # measured: bench rows when there are
JUDGED_ACC = "judged_acc"  # common.judged_accuracy: the draw mean for random-feature models, else test_acc
JUDGED_LO, JUDGED_HI = "judged_acc_lo", "judged_acc_hi"  # its 95% t interval over seeds (NaN with one seed)
MIN_ACC_SPAN = 1.0  # accuracy points: the shortest accuracy axis, so one point (or a tight cluster) is not magnified
COST_COLUMNS = (*TIME_COLUMNS, "flops", "params", "aic", "bic", "test_acc", "test_acc_draw_mean", JUDGED_ACC)
PARETO_Y_SPAN = 5.0  # accuracy points shown below the best; variants further down sit at the edge as ▼
LOG_AXIS_MIN_RATIO = 10.0  # a cost spanning less than this factor is drawn on a linear axis (readable ticks)
# config fields that change what one image costs: a bench row stands for a train variant when all the
# ones that apply to it agree (shape fields always; an option only if the variant's classes take it)
SHAPE_FIELDS = ("image_size", "patch_size", "dim", "depth", "heads", "mlp_ratio", "amp")
BENCH_TIMING = "bench (alone)"
CONTENDED = "train, contended (trials ran side by side)"
ONE_AT_A_TIME = "train (one trial at a time)"
UNKNOWN_TIMES = "train, possibly contended (no start/end times)"
PARETO_COSTS = (("flops", "FLOPs per image"), ("train_s_per_epoch", "train s / epoch"),
                ("infer_ms_per_sample", "inference ms / sample"))
# (label, attention, pe) of the rows each variant's times are divided by, per dataset
REFERENCES = (("softmax+ape", "softmax", "ape"), ("rope", "softmax", "rope"))
RATIO_TIMES = (("train", "train_s_per_epoch"), ("infer", "infer_ms_per_sample"))
NOTEBOOK_REFERENCE = ("For comparison, the reference notebook this project started from (plain PyTorch on a laptop "
                      "CPU) "
                      "measured Cayley-STRING at 5.5x RoPE's time per epoch on MNIST and 18.7x on CIFAR-10, and "
                      "sparse Cayley-STRING at f = 1 up to 221x.")


def pareto_front(cost: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Boolean mask of the points no other point dominates (cost <= and acc >=, one strictly); a point
    without a cost or an accuracy (NaN) is never on the front."""
    keep = np.isfinite(cost) & np.isfinite(acc)
    for i in range(len(cost)):
        dominated = (cost <= cost[i]) & (acc >= acc[i]) & ((cost < cost[i]) | (acc > acc[i]))
        keep[i] = keep[i] and not dominated.any()
    return keep


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
    judged = groups[JUDGED_ACC].agg(lambda v: mean_interval(v.to_numpy(float)))  # the plot's whiskers
    table[JUDGED_LO], table[JUDGED_HI] = judged.map(lambda iv: iv.lo), judged.map(lambda iv: iv.hi)
    if "n_train" in frame.columns:  # images per epoch: turns a bench step time into seconds per epoch
        table["n_train"] = groups["n_train"].mean()
    table["timing"] = groups["overlapped"].agg(lambda o: UNKNOWN_TIMES if o.isna().any() else
                                               CONTENDED if o.astype(bool).any() else ONE_AT_A_TIME)
    table = table.reset_index()
    bench = cost_bench_rows(bench) if bench is not None else None
    if bench is not None and not bench.empty:
        measured = bench_costs(bench)
        shapes = groups[[c for c in model_field_names() if c in frame.columns]].agg(lambda v: tuple(v.unique()))
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


def cost_bench_rows(bench: pd.DataFrame) -> pd.DataFrame:
    """The bench rows of cost sweeps (one model size per sweep: bench_*_cpu.yaml), without those of
    token-scaling sweeps, whose batches and sizes are chosen for the scaling, not for a study's model."""
    return bench[~bench.index.isin(scaling_rows(bench).index)] if not bench.empty else bench


def bench_cost_table(bench: pd.DataFrame) -> pd.DataFrame:
    """Per cost-bench sweep (one model size: bench_mnist_cpu.yaml, ...) and variant: median training-step
    time, its time per image, inference ms per sample, FLOPs, params, peak memory, and the step and
    inference times divided by those of the same sweep's softmax+ape and softmax+rope (qk_norm none)."""
    cost = cost_bench_rows(bench)
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
    host = column(frame, "hostname", "").astype(object).fillna("")  # a column of NaNs only is float64
    for _, g in frame[frame["started_at"].notna() & frame["finished_at"].notna()].groupby(host):
        start, end = unix_seconds(g["started_at"]).to_numpy(), unix_seconds(g["finished_at"]).to_numpy()
        out[g.index] = (overlaps(start, end) > 1).tolist()  # each row overlaps itself
    return out


def overlaps(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval i, how many j (itself included) have start_j < end_i and start_i < end_j. Where every
    interval has start < end, that is #(start_j < end_i) - #(end_j <= start_i) (two binary searches,
    O(n log n) for 10^5 trials); otherwise pair by pair, in blocks."""
    if np.all(start < end):
        starts, ends = np.sort(start), np.sort(end)
        return np.searchsorted(starts, end, side="left") - np.searchsorted(ends, start, side="right")
    counts = np.empty(len(start), dtype=np.int64)
    for lo in range(0, len(start), 1024):
        s, e = start[lo:lo + 1024, None], end[lo:lo + 1024, None]
        counts[lo:lo + 1024] = ((s < end[None, :]) & (start[None, :] < e)).sum(axis=1)
    return counts


def bench_costs(bench: pd.DataFrame) -> pd.DataFrame:
    """Median training ms per image, inference ms per sample and peak memory per bench model."""
    b = with_resolved_shape(with_variant(bench))
    b["train_ms_per_image"] = b["train_step_ms"] / b["bench_batch"]
    keys = [*VARIANT, *(c for c in model_field_names() if c in b.columns)]
    values = [c for c in ("train_ms_per_image", "infer_ms_per_sample", "peak_mem_mb") if c in b.columns]
    return b.groupby(keys, dropna=False)[values].median().reset_index()


def model_field_names() -> tuple[str, ...]:
    """Config fields that change what one image costs: the shape, and every option a registered backend
    or encoding takes that is not `cost_free` (common.cost_options), so a bench row stands for a train
    variant when the ones that apply to it agree."""
    return (*SHAPE_FIELDS, *cost_options())


@functools.lru_cache(maxsize=None)
def model_fields(attention: str, pe: str) -> tuple[str, ...]:
    """The model_field_names() that change the cost of (attention, pe): the shape, and the options that the
    backend's and the encodings' classes declare (rpevit.registry.init_parameters), so that a
    rotinv option recorded differently in two sweeps does not keep softmax+ape rows apart."""
    registry.load_all()
    classes = [registry.ATTENTIONS.get(attention.removesuffix("-identity"))]
    classes += [registry.POSITION_ENCODINGS.get(name) for name in pe.split(" (")[0].split("+")]
    declared = {name for cls in classes if cls is not None for name in registry.init_parameters(cls)}
    return tuple(f for f in model_field_names() if f in SHAPE_FIELDS or f in declared)


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
        mask &= field_matches(measured, name, values[0])
    return measured[mask].iloc[0] if mask.any() else None


@functools.cache
def field_defaults() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(TrialConfig)}


def field_matches(rows: pd.DataFrame, name: str, wanted: object) -> np.ndarray:
    """Per row: whether its config field `name` equals `wanted`, where a value a row lacks (no such
    column, or NaN: the row was written before the field existed) is the field's default, which is
    what such a row ran (a new field's default keeps the old behaviour). Without this, a sweep that
    records a newer field beside older ones would stop its neighbours' bench rows from matching."""
    default = field_defaults().get(name)
    wanted = default if is_missing(wanted) else wanted
    if name not in rows.columns:
        return np.full(len(rows), wanted == default)
    return (rows[name].where(rows[name].notna(), default) == wanted).to_numpy(bool)


def build(results_dir: Path) -> str | None:
    """Markdown section (and PNGs) for the train and bench trials under results_dir; None if neither."""
    trials = read_trials(results_dir, ["train", "bench"]).without_rotation_study()
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
            parts += ["Accuracy (the mean over fresh draws for random-feature models) against cost. Colour: "
                      "attention; marker: encoding; light: qk_norm l2; black rim: random features never redrawn. "
                      "Ringed, numbered and named above each panel: the Pareto front (no variant is both at least "
                      f"as accurate and at most as costly). Variants more than {fmt(PARETO_Y_SPAN)} points below "
                      "the best sit in the strip under each panel (a broken accuracy axis); markers that would "
                      "cover each other are set side by side by a marker width, not moved in cost. Whiskers: the "
                      "95% t interval of the accuracy over seeds. A time axis says where its times come from: bench "
                      f"trials, each alone, or the sweep's own trials ({CONTENDED_MARK} beside a point whose time is "
                      "the sweep's own among bench times).", "",
                      "![accuracy vs cost](efficiency_pareto.png)", ""]
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
    return "\n".join(parts)


def variant_label(r: pd.Series) -> str:
    """attention+pe, with qk_norm and redraw only where they differ from the defaults (none, off)."""
    extra = [f"qk {r['qk_norm']}"] * (r["qk_norm"] != "none") + [f"redraw {r['redraw']}"] * (r["redraw"] != "off")
    return f"{r['attention']}+{r['pe']}" + (f" ({', '.join(extra)})" if extra else "")


ATTENTION_COLOURS = {"softmax": "C0", "favor": "C1", "relu": "C2", "relu-identity": "C3"}
PE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p", "d", "H", "8")
MARKER_SIZE = 55  # points^2: about 7.5 pt across
DODGE_PT = 8.0  # markers closer than this (points) on the page are set side by side, DODGE_PT apart
FONT = {"tick": 9, "label": 10, "title": 10, "note": 8}


def pe_family(pe: str) -> str:
    """The encoding without its variant options: 'sparse_cayley_string (string_sparsity=0.1, ...)' -> its name."""
    return pe.split(" (")[0]


def short_label(r: pd.Series) -> str:
    """A point's name on the plot: attention+pe, with f (and a sparse solve) for sparse Cayley, qk l2 and
    'no redraw' where they apply."""
    parts = [f"{r['attention']}+{pe_family(r['pe'])}"]
    if "string_sparsity=" in r["pe"]:
        parts.append("f=" + r["pe"].split("string_sparsity=")[1].split(",")[0].rstrip(")"))
    parts += ["sparse solve"] * ("cayley_solver=sparse" in r["pe"])
    parts += ["qk l2"] * (r["qk_norm"] != "none") + ["no redraw"] * not_redrawn(r)
    return " ".join(parts)


def not_redrawn(r: pd.Series) -> bool:
    """A random-feature variant trained on one draw (redraw off)."""
    return r["attention"] in ("favor", "relu") and r["redraw"] == "off"


def dodge(points: np.ndarray, step: float = DODGE_PT, bounds: tuple[float, float, float, float] | None = None
          ) -> np.ndarray:
    """(dx, dy) offsets (page points, as `points`) that set markers which would cover each other around their
    spot: each point takes the nearest free place of a hexagonal ring pattern (0; 6 places at `step`; 12 at
    2 step; ...; sideways places before vertical ones) that keeps it `step` from every point placed before
    it and inside `bounds` (x0, y0, x1, y1: the axes less a marker's half width), so coincident points form
    a small cluster where they are and none is pushed onto an axis edge. Points already apart keep offset 0."""
    rings = [(0.0, 0.0)]
    for ring in range(1, 8):
        rings += [(ring * step * math.cos(a), ring * step * math.sin(a))
                  for a in np.linspace(0, 2 * math.pi, 6 * ring, endpoint=False)]
    rings.sort(key=lambda d: d[0] ** 2 + 4 * d[1] ** 2)  # sideways first: an accuracy axis may be short
    offsets = np.zeros((len(points), 2))
    placed: list[np.ndarray] = []
    for i, point in enumerate(points):
        if not np.isfinite(point).all():
            continue
        for dx, dy in rings:
            candidate = point + (dx, dy)
            if bounds is not None and (dx or dy) and not (bounds[0] <= candidate[0] <= bounds[2]
                                                          and bounds[1] <= candidate[1] <= bounds[3]):
                continue
            if all(math.hypot(*(candidate - other)) >= step * 0.999 for other in placed):
                offsets[i] = (dx, dy)
                break
        placed.append(point + offsets[i])
    return offsets


def plot_pareto(costs: pd.DataFrame, path: Path) -> Path | None:
    """One panel per dataset and cost that has positive values; accuracy is JUDGED_ACC, so a random-feature
    model sits at its mean over fresh draws; log cost axes where the cost spans LOG_AXIS_MIN_RATIO or more.
    Colour: attention; marker: encoding; light face: qk_norm l2; black rim: random features never redrawn.
    The accuracy axis spans PARETO_Y_SPAN points below the best, so a collapsed variant (a redraw-off model on
    fresh draws: 20-30 %) does not squash the front: such variants are drawn at their own accuracy in a strip
    below (a broken axis), none on an axis edge. Markers that would cover each other are set side by side
    (`dodge`: an offset of a marker width on the page, not a change of cost); the Pareto front is ringed,
    joined and labelled. None if no cost has any values."""
    metrics = [(c, label) for c, label in PARETO_COSTS if c in costs.columns and (costs[c] > 0).any()]
    if not metrics:
        return None
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.transforms import offset_copy

    datasets = sorted(costs["dataset"].unique())
    families = sorted({pe_family(pe) for pe in costs["pe"]})
    markers = {f: PE_MARKERS[i % len(PE_MARKERS)] for i, f in enumerate(families)}
    fig = plt.figure(figsize=(4.4 * len(metrics), 5.2 * len(datasets) + 1.2), layout="constrained")
    grid = fig.add_gridspec(2 * len(datasets), len(metrics), height_ratios=[4, 1.2] * len(datasets))
    panels = []
    for d, dataset in enumerate(datasets):
        g = costs[costs["dataset"] == dataset].reset_index(drop=True)
        acc = 100 * g[JUDGED_ACC].to_numpy(float)
        whiskers = 100 * g[[JUDGED_LO, JUDGED_HI]].to_numpy(float) if JUDGED_LO in g else np.full((len(g), 2), np.nan)
        top = np.nanmax(acc) if np.isfinite(acc).any() else math.nan
        floor = np.nanmin(acc[acc >= top - PARETO_Y_SPAN]) if math.isfinite(top) else math.nan  # lowest near the best
        low = acc < floor
        y_range = accuracy_range(acc[~low], whiskers[~low])
        for m, (col, label) in enumerate(metrics):
            ax = fig.add_subplot(grid[2 * d, m])
            strip = fig.add_subplot(grid[2 * d + 1, m], sharex=ax)
            cost = g[col].to_numpy(float)
            shown = np.isfinite(cost) & (cost > 0) & np.isfinite(acc)
            positive = cost[shown]
            if not len(positive):  # nothing to place: say so inside the panel
                ax.text(0.5, 0.5, f"no {label} with an accuracy", ha="center", va="center", transform=ax.transAxes,
                        fontsize=FONT["note"])
                ax.set_title(f"{dataset}: accuracy against {label}", fontsize=FONT["title"])
                strip.set_visible(False)
                continue
            log = positive.max() / positive.min() >= LOG_AXIS_MIN_RATIO
            ax.set_xscale("log" if log else "linear")
            if log:
                ax.set_xlim(positive.min() / 1.25, positive.max() * 1.25)
            else:
                span = max(positive.max() - positive.min(), 0.05 * positive.max())
                ax.set_xlim(positive.min() - 0.08 * span, positive.max() + 0.08 * span)
            ax.set_ylim(*y_range)
            ax.set_title(f"{dataset}: accuracy against {label}", fontsize=FONT["title"])
            label, marked = axis_label(label, col, column(g, "timing", ""), shown)
            ax.tick_params(labelsize=FONT["tick"])
            strip.tick_params(labelsize=FONT["tick"])
            if m == 0:
                ax.set_ylabel("test accuracy %\n(draw mean for random features)", fontsize=FONT["label"])
            if (low & shown).any():
                strip.set_ylim(*accuracy_range(acc[low & shown], whiskers[low & shown], fraction=0.25, least=2.0))
                ax.spines["bottom"].set_visible(False)
                strip.spines["top"].set_visible(False)
                ax.tick_params(axis="x", which="both", bottom=False, labelbottom=False)
                for axis, y in ((ax, 0), (strip, 1)):  # the break marks of the broken accuracy axis
                    axis.plot([0, 1], [y, y], transform=axis.transAxes, ls=(0, (4, 3)), color="0.5", lw=0.8,
                              clip_on=False)
                strip.set_xlabel(textwrap.fill(f"{label}{' (log)' if log else ''}", 48), fontsize=FONT["label"])
                if m == 0:
                    strip.set_ylabel(f"more than {fmt(PARETO_Y_SPAN)}\npoints below", fontsize=FONT["note"])
            else:
                strip.set_visible(False)
                ax.set_xlabel(textwrap.fill(f"{label}{' (log)' if log else ''}", 48), fontsize=FONT["label"])
            panels.append((ax, strip, g, cost, acc, shown, low, marked))
    whiskers = JUDGED_LO in costs and bool(np.isfinite(costs[JUDGED_LO].to_numpy(float)).any())
    fig.legend(handles=pareto_legend(costs, markers, families, whiskers=whiskers,
                                     marked=any(panel[-1].any() for panel in panels)),
               loc="outside lower center", ncol=4, fontsize=FONT["tick"], frameon=False)
    fig.draw_without_rendering()  # the layout is final: page positions for the dodge
    for ax, strip, g, cost, acc, shown, low, marked in panels:
        front = pareto_front(np.where(shown, cost, np.nan), acc)
        moved: dict[int, np.ndarray] = {}  # point -> its dodge offset (page points)
        for axis, rows in ((ax, shown & ~low), (strip, shown & low)):
            idx = np.flatnonzero(rows)
            if not len(idx):
                continue
            page = axis.transData.transform(np.column_stack([cost[idx], acc[idx]])) * 72 / fig.dpi
            box = axis.get_window_extent()
            half = DODGE_PT / 2
            bounds = (box.x0 * 72 / fig.dpi + half, box.y0 * 72 / fig.dpi + half, box.x1 * 72 / fig.dpi - half,
                      box.y1 * 72 / fig.dpi - half)
            offsets = dict(zip(idx, dodge(page, bounds=bounds)))
            moved.update(offsets)
            for i in idx:
                r = g.loc[i]
                colour = ATTENTION_COLOURS.get(r["attention"], "C4")
                where = offset_copy(axis.transData, fig=fig, x=offsets[i][0], y=offsets[i][1], units="points")
                face = colour if r["qk_norm"] == "none" else (*plt.matplotlib.colors.to_rgb(colour), 0.2)
                axis.scatter(cost[i], acc[i], s=MARKER_SIZE, marker=markers[pe_family(r["pe"])], transform=where,
                             facecolors=[face], edgecolors="k" if not_redrawn(r) else colour,
                             linewidths=1.8 if not_redrawn(r) else 1.0, zorder=3)
                lo, hi = (100 * r.get(JUDGED_LO, math.nan), 100 * r.get(JUDGED_HI, math.nan))
                if math.isfinite(lo) and math.isfinite(hi):  # the seeds' 95% t interval of the accuracy
                    axis.errorbar(cost[i], acc[i], yerr=[[acc[i] - lo], [hi - acc[i]]], fmt="none", ecolor=colour,
                                  elinewidth=0.9, capsize=2.5, transform=where, zorder=2)
                if marked[i]:  # a contended time beside times measured alone
                    axis.annotate(CONTENDED_MARK, (cost[i], acc[i]), xycoords=where, xytext=(5, -3),
                                  textcoords="offset points", fontsize=FONT["note"], zorder=5)
        on_front = np.flatnonzero(front)
        on_front = on_front[np.argsort(cost[on_front])]
        for number, i in enumerate(on_front, 1):  # numbered rings; the names go under the panel's title
            axis = strip if low[i] else ax
            where = offset_copy(axis.transData, fig=fig, x=moved[i][0], y=moved[i][1], units="points")
            axis.scatter(cost[i], acc[i], s=3.2 * MARKER_SIZE, facecolors="none", edgecolors="k", transform=where,
                         zorder=4)
            axis.annotate(str(number), (cost[i], acc[i]), xycoords=where, xytext=(0, 7), textcoords="offset points",
                          ha="center", va="bottom", fontsize=FONT["note"], fontweight="bold", zorder=5)
        names = [f"{n} {short_label(g.loc[i])}" for n, i in enumerate(on_front, 1)]
        ax.set_title(ax.get_title() + "\n" + textwrap.fill("Pareto front: " + ", ".join(names), 62),
                     fontsize=FONT["title"])
        order = np.flatnonzero(front & ~low)
        order = order[np.argsort(cost[order])]
        ax.plot(cost[order], acc[order], "k--", lw=0.8, zorder=2)
    return save_figure(fig, path)


CONTENDED_MARK = "†"  # beside a point whose time is the sweep's own (contended) among bench times


def accuracy_range(acc: np.ndarray, whiskers: np.ndarray, fraction: float = 0.08,
                   least: float = 0.0) -> tuple[float, float]:
    """An accuracy axis (points) holding every accuracy and its whiskers within 0-100 (a t interval of
    two seeds can reach past them: its whisker runs off the axis), at least MIN_ACC_SPAN long, so a single
    point or a tight cluster is not magnified into a difference; padded by `fraction` of its span, at
    least `least` points, so no marker sits on an edge."""
    values = np.concatenate([acc[np.isfinite(acc)], whiskers[np.isfinite(whiskers)]])
    if not len(values):
        return 0.0, 100.0
    lo, hi = max(0.0, float(values.min())), min(100.0, float(values.max()))  # a whisker past 0 or 100 runs off
    if hi - lo < MIN_ACC_SPAN:
        middle = (lo + hi) / 2
        lo, hi = middle - MIN_ACC_SPAN / 2, middle + MIN_ACC_SPAN / 2
    margin = max(least, fraction * (hi - lo))
    return lo - margin, hi + margin


def axis_label(label: str, col: str, timing: pd.Series, shown: np.ndarray) -> tuple[str, np.ndarray]:
    """(the cost axis' label, which points to mark CONTENDED_MARK): a time says where it was measured:
    bench trials alone, or the sweep's own trials (contended when they ran side by side)."""
    none = np.zeros(len(timing), dtype=bool)
    kinds = set(timing[shown])
    if col not in TIME_COLUMNS or not kinds:
        return label, none
    if kinds == {BENCH_TIMING}:
        return f"{label} (bench trials, each alone)", none
    own = {CONTENDED: "contended: trials ran side by side, not comparable", ONE_AT_A_TIME: "one trial at a time",
           UNKNOWN_TIMES: "possibly contended"}
    if BENCH_TIMING not in kinds:
        return f"{label} (the sweep's own times, {'; '.join(own[k] for k in sorted(kinds))})", none
    return (f"{label} (bench alone; {CONTENDED_MARK} the sweep's own times, contended)",
            (timing != BENCH_TIMING).to_numpy(bool) & shown)


def pareto_legend(costs: pd.DataFrame, markers: dict[str, str], families: list[str], *, whiskers: bool,
                  marked: bool) -> list:
    """Legend entries for what the figure shows, nothing else: the attentions and encodings present, qk_norm
    faces where both kinds are, the black rim where a variant never redrew, whiskers and marks if drawn."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", ms=8, color=c, label=a) for a, c in ATTENTION_COLOURS.items()
               if a in set(costs["attention"])]
    handles += [Line2D([], [], ls="", marker=markers[f], ms=8, color="0.35", label=f) for f in families]
    if set(costs["qk_norm"]) - {"none"}:
        handles += [Line2D([], [], ls="", marker="o", ms=8, markerfacecolor="0.35", markeredgecolor="0.35",
                           label="filled: qk_norm none")] * ("none" in set(costs["qk_norm"]))
        handles += [Line2D([], [], ls="", marker="o", ms=8, markerfacecolor="0.88", markeredgecolor="0.35",
                           label="light: qk_norm l2")]
    if any(not_redrawn(r) for _, r in costs.iterrows()):
        handles.append(Line2D([], [], ls="", marker="o", ms=8, markerfacecolor="0.35", markeredgecolor="k", mew=2,
                              label="black rim: features never redrawn"))
    if whiskers:
        handles.append(Line2D([], [], ls="-", marker="|", ms=6, color="0.35", lw=0.9,
                              label="whiskers: 95% t interval over seeds"))
    if marked:
        handles.append(Line2D([], [], ls="", marker=f"${CONTENDED_MARK}$", ms=7, color="k",
                              label="time measured beside other trials"))
    handles.append(Line2D([], [], ls="--", marker="o", ms=11, markerfacecolor="none", markeredgecolor="k", color="k",
                          lw=0.8, label="ringed, numbered: Pareto front (named above)"))
    return handles


def main() -> None:
    script_main(__doc__, build, "efficiency.md", "Efficiency", "train or bench trials")


if __name__ == "__main__":
    main()
