"""What each variant costs, computed (efficiency's tables; the prose is text.py's, the figure figure.py's).

Mean cost per variant over seeds (one value per seed: a seed trained in two sweeps counts once), times from
bench rows of the same model where there are any, ratios to softmax+ape and softmax+rope (each the ratio
of medians over bench trials, with the 95% interval of the ratio of geometric means: `ratio_interval`), the
bench cost tables, whether train trials overlapped, and the Pareto front.

`flops` in the rows is rpevit/flops.py's count: fvcore's multiply-adds of one forward pass per image
(elementwise ops count 0), not FLOPs as device peaks count them (2 per multiply-add); every table and axis
here names it MULTIPLY_ADDS and keeps the count as stored. A variant whose rows name ops the counter could not
count (`flops_unsupported`) has no count here (NaN, with the ops in FLOPS_UNSUPPORTED): its total would be short.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import numpy as np
import pandas as pd

from rpevit.analysis.common import VARIANT, column, cost_options, devices_text, judged_accuracy, with_variant
from rpevit.analysis.stats import LEVEL, Interval, finite, mean_interval, welch
from rpevit.analysis.token_scaling import scaling_rows

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.data import DATASET_SPECS
from rpevit.sweep.results import is_missing, unix_seconds

TIME_COLUMNS = ("train_s_per_epoch", "infer_ms_per_sample", "peak_mem_mb")  # measured: bench rows when there are
JUDGED_ACC = "judged_acc"  # common.judged_accuracy: the draw mean for random-feature models, else test_acc
JUDGED_LO, JUDGED_HI = "judged_acc_lo", "judged_acc_hi"  # its 95% t interval over seeds (NaN with one seed)
COST_COLUMNS = (*TIME_COLUMNS, "flops", "params", "aic", "bic", "test_acc", "test_acc_draw_mean", JUDGED_ACC)
ACCURACY_COLUMNS = ("test_acc", "test_acc_draw_mean", JUDGED_ACC)  # fractions here; the tables show them in %
# what the rows' `flops` field counts (rpevit/flops.py): the name every table header and axis of efficiency gives it
MULTIPLY_ADDS = "multiply-adds per image, forward (fvcore; elementwise ops not counted)"
# config fields that change what one image costs: a bench row stands for a train variant when all the
# ones that apply to it agree (shape fields always; an option only if the variant's classes take it)
SHAPE_FIELDS = ("image_size", "patch_size", "dim", "depth", "heads", "mlp_ratio", "amp")
BENCH_TIMING = "bench (alone)"
CONTENDED = "train, contended (trials ran side by side)"
ONE_AT_A_TIME = "train (one trial at a time)"
UNKNOWN_TIMES = "train, possibly contended (no start/end times)"
# (label, attention, pe) of the rows each variant's times are divided by, per dataset
REFERENCES = (("softmax+ape", "softmax", "ape"), ("rope", "softmax", "rope"))
RATIO_TIMES = (("train", "train_s_per_epoch"), ("infer", "infer_ms_per_sample"))
BENCH_RATIO_TIMES = (("train", "train_step_ms"), ("infer", "infer_ms_per_sample"))  # bench_cost_table's
# column suffixes: a time column's values per bench trial (a tuple per row: what the ratio intervals are of),
# and a ratio column's stats.Interval (None where there is none to give: no bench times, or the reference's row)
TRIALS = " per bench trial"
RATIO_INTERVAL = " interval"
# the rows' ops that rpevit/flops.py had no count for (comma-separated, '' for none): a variant with any has no
# `flops` in the tables here (NaN), and this column of them says which ops (uncounted_flops)
FLOPS_UNSUPPORTED = "flops_unsupported"
# variant_costs' column: the `device_name` of each row its times came from (the matched bench trials, else its train
# rows), a tuple per variant, so a heading or figure names the devices of exactly the times it shows (time_devices)
TIME_DEVICES = "time_devices"


def unsupported_ops(values: Sequence[object]) -> str:
    """The ops named in `values` (rows' FLOPS_UNSUPPORTED: comma-separated op names, '' or missing for none), all
    of them once, sorted, comma-separated; '' where no row names any."""
    return ",".join(sorted({op.strip() for value in values if isinstance(value, str) for op in value.split(",")
                            if op.strip()}))


def uncounted_flops(table: pd.DataFrame, ops: pd.Series) -> pd.DataFrame:
    """table with FLOPS_UNSUPPORTED set to `ops` (per row: unsupported_ops of its rows, aligned on the index) and
    `flops` NaN where those are not none: a count that left ops out is short, and is not shown as a total."""
    out = table.copy()
    out[FLOPS_UNSUPPORTED] = ops.reindex(out.index).fillna("").astype(str)
    if "flops" in out.columns:
        out["flops"] = out["flops"].astype(float).where(out[FLOPS_UNSUPPORTED] == "")
    return out


def pareto_front(cost: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Boolean mask of the points no other point dominates (cost <= and acc >=, one strictly); a point
    without a cost or an accuracy (NaN) is never on the front."""
    keep = np.isfinite(cost) & np.isfinite(acc)
    for i in range(len(cost)):
        dominated = (cost <= cost[i]) & (acc >= acc[i]) & ((cost < cost[i]) | (acc > acc[i]))
        keep[i] = keep[i] and not dominated.any()
    return keep


def variant_costs(frame: pd.DataFrame, bench: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean cost per variant (dataset, attention, pe, qk_norm, redraw) over its seeds: qk_norm and redraw
    schedules are separate variants, so their costs and accuracies are not averaged together. One value per
    (variant, seed) first, as gap_closure.per_seed and string_study.one_row_per_seed take it: a seed trained
    in two sweeps (MNIST softmax+rope: the converged study and the STRING study) counts once, its rows
    averaged, in the means, AIC, BIC and the interval (two rows of one seed are not two samples).
    TIME_COLUMNS come from `bench` rows of the variant's model where there are any (their medians, not a
    mean over seeds; `bench_trials`: how many; the per-trial values, in columns ending TRIALS, are what
    cost_ratios' intervals are of); `timing` says where they came from. `flops` is NaN for a variant any of whose
    rows names ops the counter could not count (uncounted_flops; they are in FLOPS_UNSUPPORTED)."""
    frame = with_resolved_shape(with_variant(frame))
    frame["overlapped"] = overlapped(frame)
    frame[JUDGED_ACC] = judged_accuracy(frame)
    frame[FLOPS_UNSUPPORTED] = column(frame, FLOPS_UNSUPPORTED, "")
    cols = [c for c in COST_COLUMNS if c in frame.columns]
    groups = frame.groupby(list(VARIANT))
    seeds = frame.groupby([*VARIANT, "seed"], dropna=False)[[*cols, *(["n_train"] * ("n_train" in frame))]].mean()
    by_seed = seeds.reset_index().groupby(list(VARIANT))
    table = uncounted_flops(by_seed[cols].mean(), groups[FLOPS_UNSUPPORTED].agg(unsupported_ops))
    table["seeds"] = groups["seed"].nunique()
    judged = by_seed[JUDGED_ACC].agg(lambda v: mean_interval(v.to_numpy(float)))  # the plot's whiskers
    table[JUDGED_LO], table[JUDGED_HI] = judged.map(lambda iv: iv.lo), judged.map(lambda iv: iv.hi)
    if "n_train" in frame.columns:  # images per epoch: turns a bench step time into seconds per epoch
        table["n_train"] = by_seed["n_train"].mean()
    table["bench_trials"] = 0
    table[TIME_DEVICES] = (groups["device_name"].agg(tuple) if "device_name" in frame
                           else pd.Series([()] * len(table), index=table.index, dtype=object))
    table["timing"] = groups["overlapped"].agg(lambda o: UNKNOWN_TIMES if o.isna().any() else
                                               CONTENDED if o.astype(bool).any() else ONE_AT_A_TIME)
    table = table.reset_index()
    bench = cost_bench_rows(bench) if bench is not None else None
    if bench is not None and not bench.empty:
        measured = bench_costs(bench)
        shapes = groups[[c for c in model_field_names() if c in frame.columns]].agg(lambda v: tuple(v.unique()))
        trials: dict[str, dict[int, tuple[float, ...]]] = {"train_s_per_epoch": {}, "infer_ms_per_sample": {}}
        for i, row in table.iterrows():
            found = matching_bench(measured, row, shapes.loc[tuple(row[list(VARIANT)])])
            if found is not None:
                per_epoch = row.get("n_train", np.nan) / 1e3  # ms per image -> s per epoch
                table.loc[i, "train_s_per_epoch"] = found["train_ms_per_image"] * per_epoch
                table.loc[i, ["infer_ms_per_sample", "peak_mem_mb"]] = found[["infer_ms_per_sample", "peak_mem_mb"]]
                table.loc[i, "bench_trials"] = found["bench_trials"]
                table.loc[i, "timing"] = BENCH_TIMING
                table.at[i, TIME_DEVICES] = found.get("device_name" + TRIALS, ())
                trials["train_s_per_epoch"][i] = tuple(np.asarray(found["train_ms_per_image" + TRIALS]) * per_epoch)
                trials["infer_ms_per_sample"][i] = found["infer_ms_per_sample" + TRIALS]
        for name, values in trials.items():
            table[name + TRIALS] = pd.Series([values.get(i) for i in table.index], index=table.index, dtype=object)
    return table


def time_devices(table: pd.DataFrame) -> str:
    """common.devices_text of the rows whose times `table` shows (its TIME_DEVICES: one name per row timed),
    'device unknown' where they record none."""
    names = [name if isinstance(name, str) else "device not recorded"
             for names in column(table, TIME_DEVICES, None) if isinstance(names, tuple) for name in names]
    return devices_text(pd.DataFrame({"device_name": names}) if names else pd.DataFrame())


def cost_ratios(costs: pd.DataFrame) -> pd.DataFrame:
    """Per row: train s/epoch and inference ms/sample divided by those of the same dataset's
    softmax+ape and softmax+rope (qk_norm none), as columns "train x softmax+ape", ... (with_ratios: the
    ratio of medians, and its interval); NaN unless both times come from bench trials (contended times
    are not comparable between variants)."""
    return with_ratios(costs, "dataset", RATIO_TIMES, costs["timing"] == BENCH_TIMING)


def with_ratios(table: pd.DataFrame, within: str, times: Sequence[tuple[str, str]],
                timed: pd.Series | None = None) -> pd.DataFrame:
    """table with, per REFERENCES (label, attention, pe) and `times` (kind, column), the column
    "{kind} x {label}": each row's time divided by that of the reference row of its `within` group
    (attention, pe, qk_norm none; exactly one, else NaN), for the rows `timed` marks (all by default;
    the reference must be one of them). Beside it, RATIO_INTERVAL: the ratio_interval of the rows'
    per-trial times (column + TRIALS, where the table has it), None for the reference's own row, whose
    ratio is 1 by definition. The point stays the ratio of the table's times (medians over trials),
    the figure every table and answer already quotes; the interval is what says whether it is resolved."""
    out = table.copy()
    timed = pd.Series(True, index=out.index) if timed is None else timed
    for label, attention, pe in REFERENCES:
        for kind, col in times:
            name = f"{kind} x {label}"
            out[name] = np.nan
            intervals: dict[object, Interval] = {}
            for _, g in out.groupby(within) if col in out.columns else ():
                ref = g[(g["attention"] == attention) & (g["pe"] == pe) & (g["qk_norm"] == "none")]
                if len(ref) != 1 or not timed[ref.index[0]]:
                    continue
                rows = g.index[timed[g.index].to_numpy(bool)]
                out.loc[rows, name] = g.loc[rows, col] / ref[col].iloc[0]
                if col + TRIALS in out.columns:
                    reference = out.at[ref.index[0], col + TRIALS]
                    intervals |= {i: ratio_interval(out.at[i, col + TRIALS], reference)
                                  for i in rows if i != ref.index[0]}
            out[name + RATIO_INTERVAL] = pd.Series([intervals.get(i) for i in out.index], index=out.index, dtype=object)
    return out


def ratio_interval(times: Sequence[float], reference: Sequence[float], level: float = LEVEL) -> Interval:
    """The ratio of the geometric means of `times` and `reference` (one value per bench trial), with the
    exponentiated Welch t interval of mean(log times) - mean(log reference) (Welch-Satterthwaite df; n:
    the trials of each side; p: Welch's p of "the ratio is 1"). Logs because timing noise scales with the
    time (a trial ~7% slower, not some ms slower), so the interval of a ratio is the exponentiated one of a
    difference, and neither side's spread is assumed to equal the other's. No interval (lo, hi NaN) when
    either side has fewer than 2 trials: one trial carries no spread, and the repeats within it (its min
    and max) are not independent trials. Non-positive or missing times are not times and are left out."""
    logs = [np.log(x[x > 0]) for x in (finite(times), finite(reference))]
    iv = welch(*logs, level=level)
    return dataclasses.replace(iv, point=math.exp(iv.point), lo=math.exp(iv.lo), hi=math.exp(iv.hi))


BENCH_COST_COLUMNS = ("train_step_ms", "train_ms_per_image", "infer_ms_per_sample", "flops", "params", "peak_mem_mb")


def cost_bench_rows(bench: pd.DataFrame) -> pd.DataFrame:
    """The bench rows of cost sweeps (one model size per sweep: bench_*_cpu.yaml), without those of
    token-scaling sweeps, whose batches and sizes are chosen for the scaling, not for a study's model."""
    return bench[~bench.index.isin(scaling_rows(bench).index)] if not bench.empty else bench


def bench_cost_table(bench: pd.DataFrame) -> pd.DataFrame:
    """Per cost-bench sweep (one model size: bench_mnist_cpu.yaml, ...) and variant: median training-step
    time, its time per image, inference ms per sample, `flops` (MULTIPLY_ADDS: fvcore's forward multiply-adds
    per image, as stored, not doubled), params, peak memory, and the step and
    inference times divided by those of the same sweep's softmax+ape and softmax+rope (qk_norm none):
    with_ratios, the ratio of medians with the interval of the ratio of geometric means over the trials. `flops`
    is NaN where a trial of the variant names ops the counter could not count (uncounted_flops). TIME_DEVICES: the
    device_name of each bench trial of the variant."""
    cost = cost_bench_rows(bench)
    if cost.empty:
        return pd.DataFrame()
    b = with_variant(cost)
    b["train_ms_per_image"] = b["train_step_ms"] / b["bench_batch"]
    b[FLOPS_UNSUPPORTED] = column(b, FLOPS_UNSUPPORTED, "")
    keys = ["sweep", *VARIANT]
    values = [c for c in BENCH_COST_COLUMNS if c in b.columns]
    grouped = b.groupby(keys, dropna=False)
    table = uncounted_flops(grouped[values].median(), grouped[FLOPS_UNSUPPORTED].agg(unsupported_ops))
    table = table.join(per_trial(grouped, [c for _, c in BENCH_RATIO_TIMES])).reset_index()
    table["batch"] = grouped["bench_batch"].first().to_numpy()
    table["N"] = grouped["tokens"].first().to_numpy()
    devices = list(grouped["device_name"].agg(tuple)) if "device_name" in b.columns else [()] * len(table)
    table[TIME_DEVICES] = pd.Series(devices, index=table.index, dtype=object)  # time_devices names them
    return with_ratios(table, "sweep", BENCH_RATIO_TIMES)


def per_trial(grouped: pd.api.typing.DataFrameGroupBy, values: Sequence[str]) -> pd.DataFrame:
    """Each group's values of `values` as tuples, one value per bench trial, in columns named value +
    TRIALS: beside the medians, the samples that with_ratios' intervals are of."""
    return grouped[[v for v in values if v in grouped.obj.columns]].agg(tuple).add_suffix(TRIALS)



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
    """Median training ms per image, inference ms per sample and peak memory per bench model,
    `bench_trials`: how many bench rows each median is of, and the two times per trial (per_trial)."""
    b = with_resolved_shape(with_variant(bench))
    b["train_ms_per_image"] = b["train_step_ms"] / b["bench_batch"]
    keys = [*VARIANT, *(c for c in model_field_names() if c in b.columns)]
    values = [c for c in ("train_ms_per_image", "infer_ms_per_sample", "peak_mem_mb") if c in b.columns]
    grouped = b.groupby(keys, dropna=False)
    trials = per_trial(grouped, ("train_ms_per_image", "infer_ms_per_sample", "device_name"))
    return grouped[values].median().assign(bench_trials=grouped.size()).join(trials).reset_index()


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

