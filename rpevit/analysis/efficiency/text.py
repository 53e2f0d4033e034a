"""The prose and Markdown tables of efficiency (numbers from compute.py; the figure is figure.py's)."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd

from rpevit.analysis.common import VARIANT, column, fmt, markdown_table, md_text, raw_text
from rpevit.analysis.efficiency.compute import (ACCURACY_COLUMNS, BENCH_COST_COLUMNS, BENCH_TIMING, CONTENDED,
                                                COST_COLUMNS, FLOPS_UNSUPPORTED, MULTIPLY_ADDS, ONE_AT_A_TIME,
                                                RATIO_INTERVAL, RATIO_TIMES, REFERENCES, TIME_COLUMNS, UNKNOWN_TIMES,
                                                time_devices)
from rpevit.analysis.efficiency.figure import CONTENDED_MARK, PARETO_Y_SPAN
from rpevit.analysis.stats import Interval

NOTEBOOK_REFERENCE = ("For comparison, the reference notebook this project started from (plain PyTorch on a laptop "
                      "CPU) "
                      "measured Cayley-STRING at 5.5x RoPE's time per epoch on MNIST and 18.7x on CIFAR-10, and "
                      "sparse Cayley-STRING at f = 1 up to 221x.")


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



MULTIPLY_ADDS_NOTE = (f"`{MULTIPLY_ADDS}`: the rows' `flops` field (rpevit/flops.py), fvcore's count for one "
                      "forward pass of one image: one per multiply-add of the matrix-like ops (linear, matmul, "
                      "einsum, attention, FFT, solves), normalisations as fvcore counts them, and 0 for "
                      "elementwise, indexing and shape ops. Device peaks count a multiply-add as 2 FLOPs: in "
                      "FLOPs, twice these numbers.")
# what the bracket beside a ratio is (compute.ratio_interval), said under every table that shows one
RATIO_INTERVAL_NOTE = ("Beside a ratio: the 95% interval of the ratio of geometric means over bench trials "
                       "(Welch's t interval of mean log time of the variant − mean log time of the reference, "
                       "Welch–Satterthwaite df, exponentiated; log times because timing noise scales with the "
                       "time), and n: bench trials of the variant, of the reference. The point is the ratio of "
                       "medians, so with skewed trials it can lie outside that interval.")
ONE_TRIAL_NOTE = ("the repeats within one trial (`train_step_ms_min` / `_max`) are not independent trials, so they "
                  "give no interval")


def uncounted_note(table: pd.DataFrame, where: str, also: str = "") -> list[str]:
    """Where rows of `table` have FLOPS_UNSUPPORTED (compute.uncounted_flops): that their multiply-adds are not
    counted, shown as —, each variant (its `where` column, e.g. dataset or sweep, and VARIANT) with the ops the
    counter has no count for; read from the results, so inert (md_text of raw_text: the frames read here hold
    md_text's output already, common.untrusted_names, and are not escaped twice); [] where every count is complete."""
    if FLOPS_UNSUPPORTED not in table.columns or "flops" not in table.columns:
        return []
    rows = table[column(table, FLOPS_UNSUPPORTED, "").fillna("").astype(str) != ""]
    if rows.empty:
        return []
    inert = lambda text: md_text(raw_text(text))  # noqa: E731
    named = "; ".join(f"{inert(variant_name(r, where))}: {inert(r[FLOPS_UNSUPPORTED].replace(',', ', '))}"
                      for _, r in rows.iterrows())
    return [f"Multiply-adds not counted (— in the table{also}): the counter (rpevit/flops.py) had no count for "
            f"some ops these variants run, so their totals would be short: {named}.", ""]


def variant_name(r: pd.Series, where: str) -> str:
    """'<where value> attention+pe', with qk_norm and redraw where they are not none / off."""
    extra = [f"qk_norm {r['qk_norm']}"] * (str(r.get("qk_norm", "none")) != "none")
    extra += [f"redraw {r['redraw']}"] * (str(r.get("redraw", "off")) != "off")
    return f"{r[where]} {r['attention']}+{r['pe']}" + (f" ({', '.join(extra)})" if extra else "")


INFORMATION_CRITERIA_NOTE = ("`aic` = 2k − 2 LL and `bic` = k ln n − 2 LL (rpevit/metrics.py), with LL the "
                             "test-set log-likelihood of the true labels under the model's own training draw, "
                             "k its trainable parameters (`params`) and n the test images; lower is better, "
                             "and since LL is read on the test set they describe the fit, they choose nothing.")


def header(name: str) -> str:
    """A cost table's column header: accuracies say they are in %, `flops` says what it counts."""
    return f"{name} %" if name in ACCURACY_COLUMNS else MULTIPLY_ADDS if name == "flops" else name


def shown(g: pd.DataFrame, show: list[str]) -> pd.DataFrame:
    """g's `show` columns as a table prints them: accuracies (fractions in the rows) in %, ratios with
    their intervals (ratio_cell)."""
    out = g[show].copy()
    for name in ACCURACY_COLUMNS:
        if name in out.columns:
            out[name] = 100 * pd.to_numeric(out[name], errors="coerce")
    for name in ratio_columns(out):
        if name + RATIO_INTERVAL in g.columns:
            out[name] = [ratio_cell(r, iv) for r, iv in zip(g[name], g[name + RATIO_INTERVAL])]
    return out


def ratio_columns(table: pd.DataFrame) -> list[str]:
    """The "train x softmax+ape", ... columns of table that hold any ratio, in REFERENCES' order."""
    names = [f"{kind} x {label}" for label, _, _ in REFERENCES for kind, _ in RATIO_TIMES]
    return [name for name in names if name in table.columns and table[name].notna().any()]


def ratio_cell(ratio: float, interval: Interval | None) -> float | str:
    """A ratio's cell: the ratio of medians with its interval and n (Interval.text, as the report prints
    every interval: '1.04 [0.98, 1.1] (n=3,3)'), or the plain ratio where there is none (a side with one
    bench trial, said once under the table by ratio_note; the reference's own row: 1 by definition)."""
    if not isinstance(interval, Interval) or not math.isfinite(ratio) or not interval.bounded:
        return ratio
    return dataclasses.replace(interval, point=ratio).text(digits=4)


def ratio_note(table: pd.DataFrame) -> str:
    """What the ratio cells of `table` (with its RATIO_INTERVAL columns) carry, counted from them: the
    interval's method where some have one, and how many rest on a single bench trial a side and so are plain,
    once here rather than in every cell."""
    intervals = [iv for name in ratio_columns(table) if name + RATIO_INTERVAL in table.columns
                 for iv in table[name + RATIO_INTERVAL] if isinstance(iv, Interval)]
    plain = sum(not iv.bounded for iv in intervals)
    if not intervals:
        return ""
    if plain == len(intervals):
        return (f"No ratio here has an interval: each rests on one bench trial of the variant or of the reference "
                f"({ONE_TRIAL_NOTE}); a ratio near 1 is not resolved from 1.")
    rest = (f" {plain} of the {len(intervals)} ratios rest on one bench trial on a side and are printed plain "
            f"({ONE_TRIAL_NOTE})." if plain else "")
    return f"{RATIO_INTERVAL_NOTE}{rest}"


def cost_heading(dataset: str, g: pd.DataFrame) -> str:
    """A dataset's cost-table heading: accuracies, AIC and BIC are means over seeds; times and memory are
    the bench trials' of the same model (not a mean over seeds) where `timing` says so, else seed means; and the
    devices those times ran on (compute.time_devices: the rows timed, which may span devices)."""
    bench = g["timing"] == BENCH_TIMING
    if not bench.any():
        times = "times and memory: the train trials' own, means over seeds"
        return f"### {dataset}: cost per variant (means over seeds, one value per seed; {times}; {time_devices(g)})"
    counts = sorted({int(n) for n in column(g, "bench_trials", 0)[bench]})
    trials = (f"{counts[0]} bench trial{'s' * (counts[0] != 1)}" if len(counts) == 1
              else f"{counts[0]}–{counts[-1]} bench trials")
    if bench.all():
        times = f"times and memory: {trials} of the same model each, not a mean over seeds"
    else:
        times = (f"times and memory: {trials} of the same model each where `timing` is {BENCH_TIMING}, "
                 "not a mean over seeds; else the train trials' own, means over seeds")
    return (f"### {dataset}: cost per variant (accuracy, aic, bic: means over seeds, one value per seed; {times}; "
            f"times on {time_devices(g)})")


def cost_section(costs: pd.DataFrame) -> list[str]:
    """Per dataset, the cost of each variant (variant_costs with cost_ratios), and what its columns mean."""
    ratios = ratio_columns(costs)
    show = [*VARIANT[1:], *(c for c in ("seeds", *COST_COLUMNS, *ratios, "timing") if c in costs.columns)]
    parts = []
    for dataset, g in costs.groupby("dataset"):
        parts += [cost_heading(dataset, g), "",
                  markdown_table([header(c) for c in show], shown(g, show).itertuples(index=False)), ""]
    parts += [timing_note(set(costs["timing"])), ""]
    parts += [MULTIPLY_ADDS_NOTE, ""] * ("flops" in show)
    parts += uncounted_note(costs, "dataset", " and not drawn in the figure's multiply-adds panel") * ("flops" in show)
    parts += [INFORMATION_CRITERIA_NOTE, ""] * ("aic" in show or "bic" in show)
    if ratios:
        parts += [f"`train x` / `infer x` columns: this variant's train s/epoch / inference ms per sample divided "
                  f"by those of the dataset's softmax+ape or softmax+rope (bench times only: medians over the "
                  f"bench trials). {ratio_note(costs)} {NOTEBOOK_REFERENCE}", ""]
    return parts


def pareto_caption(costs: pd.DataFrame) -> list[str]:
    """What the accuracy-vs-cost figure of `costs` (the variants plotted) shows, with the devices of its times,
    and the figure."""
    return [f"Times in the figure: {time_devices(costs)}. "
            "Accuracy (the mean over fresh draws for random-feature models) against cost: "
            f"{MULTIPLY_ADDS} (2 FLOPs each as device peaks count), train s / epoch and inference ms / "
            "sample. Colour: "
            "attention; marker: encoding; light: qk_norm l2; black rim: random features never redrawn. "
            "Ringed, numbered and named above each panel: the Pareto front (no variant is both at least "
            f"as accurate and at most as costly). Variants more than {fmt(PARETO_Y_SPAN)} points below "
            "the best sit in the strip under each panel (a broken accuracy axis); markers that would "
            "cover each other are set side by side by a marker width, not moved in cost. Whiskers: the "
            "95% t interval of the accuracy over seeds. A time axis says where its times come from: bench "
            f"trials, each alone, or the sweep's own trials ({CONTENDED_MARK} beside a point whose time is "
            "the sweep's own among bench times).", "",
            "![accuracy vs cost](efficiency_pareto.png)", ""]


def bench_section(alone: pd.DataFrame, bench: pd.DataFrame) -> list[str]:
    """Per cost-bench sweep and dataset, the bench_cost_table rows (with the devices of the bench trials they are
    of: time_devices), and what they are."""
    parts = []
    for (sweep, dataset), g in alone.groupby(["sweep", "dataset"]):
        show = ["attention", "pe", "qk_norm", "redraw", "N", "batch", *BENCH_COST_COLUMNS, *ratio_columns(g)]
        parts += [f"### {dataset}: cost per variant, bench trials alone ({sweep}; {time_devices(g)})", "",
                  markdown_table([header(c) for c in show], shown(g, show).itertuples(index=False)), ""]
    parts += ["Medians of interleaved timed runs of each variant, each bench trial with the machine to itself, "
              "at the study's model and batch, with the threads its trials train with (`torch_threads` in the "
              "rows). `x softmax+ape` / `x rope`: training-step and inference time divided by those of the "
              f"same sweep's softmax+ape and softmax+rope. {ratio_note(alone)} {NOTEBOOK_REFERENCE}", ""]
    parts += [MULTIPLY_ADDS_NOTE, ""] * ("flops" in alone.columns)
    parts += uncounted_note(alone, "sweep")
    if (column(bench, "peak_mem_kind", "") == "process_max_rss").any():
        parts += ["`peak_mem_mb` on CPU is the worker process's maximum resident memory (`peak_mem_kind` "
                  "process_max_rss), reset before each run but floored by what the process already holds: "
                  "differences below that floor do not show.", ""]
    return parts
