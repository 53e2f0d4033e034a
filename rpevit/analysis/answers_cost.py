"""The answers' cost text (rpevit.analysis.answers): the token-scaling figures (exponents, crossovers, luo_rpe's
two paths: rpevit.analysis.token_scaling), how a bench study timed, whether a sweep's trials overlapped, and
results/ANSWERS.md's cost section with each study's cost ratios."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from rpevit.analysis import efficiency, token_scaling
from rpevit.analysis.answers_sources import TOKEN_SCALING, Sources
from rpevit.analysis.answers_wording import DATASET_NAMES, setting_text
from rpevit.analysis.common import code_span, column, fmt, markdown_table, raw_text, read_trials


def scaling_facts(sources: Sources) -> dict[str, object]:
    """The token-scaling figures the answers quote: exponent ranges, crossovers, luo_rpe's two paths."""
    table = sources.scaling
    exps = token_scaling.exponents(table)
    time_exp, mem_exp = (f"{label} exponent" for label in (token_scaling.COSTS[0][1], token_scaling.COSTS[2][1]))
    thin = exps["sizes in the fit"] < MIN_FIT_SIZES  # a top-decade fit on 2 sizes: a slope, left out of spans
    softmax = exps["variant"].str.startswith("softmax")
    # O(N) by construction (token_scaling.linear_in_tokens: the backend's linear_time, no quadratic path such as
    # luo_rpe's dense one, which is quoted apart), not by a name
    linear_names = set(table.loc[table["linear_in_tokens"], "variant"]) if "linear_in_tokens" in table else set()
    is_linear = exps["variant"].isin(linear_names)
    in_spans = softmax | is_linear
    linear, soft = exps[is_linear & ~thin], exps[softmax & ~thin]

    def span(frame: pd.DataFrame, name: str) -> str:
        if frame.empty:
            return f"(none fitted on {MIN_FIT_SIZES} or more sizes)"
        return f"{fmt(frame[name].min(), 3)}–{fmt(frame[name].max(), 3)}"

    left_out = [f"{v} ({int(n)} sizes, {top}: {fmt(e, 3)})" for v, n, top, e in
                exps.loc[in_spans & thin, ["variant", "sizes in the fit", "top decade", time_exp]]
                .itertuples(index=False)]
    return {"linear time": span(linear, time_exp), "linear memory": span(linear, mem_exp),
            "softmax time": span(soft, time_exp), "softmax memory": span(soft, mem_exp),
            "thin fits": left_out,
            "crossovers": token_scaling.crossovers(table, exps), "paths": token_scaling.luo_path_table(table)}


MIN_FIT_SIZES = 3  # an exponent quoted in a span is fitted on at least this many sizes of its top decade


def thin_fits_text(facts: dict[str, object]) -> str:
    """' (left out: fitted on fewer than 3 sizes, relu+luo_rpe (fft) (2 sizes, 2304..4096: 0.924))' or ''."""
    thin = facts["thin fits"]
    return (f" (left out, fitted on fewer than {MIN_FIT_SIZES} sizes of their top decade: {', '.join(thin)})"
            if thin else "")


def not_overtaking_text(cross: pd.DataFrame) -> str:
    """'slower than softmax+luo_rpe at every measured N (favor+luo_rpe (dense) 1.4, ... times its step at
    N = 4,096)' (the linear variants that stay slower than their softmax
    counterpart at every measured N, per counterpart), or ''."""
    slower = cross[cross["how"] == "not reached"]
    if slower.empty:
        return ""
    groups = []
    for (against, largest), g in slower.groupby(["against", "largest N"]):
        items = ", ".join(f"{v} {fmt(r, 3)}" for v, r in zip(g["variant"], g["ratio at largest N"]))
        oom = sorted({n for cell in column(g, "counterpart out of memory at N", "—") if cell != "—"
                      for n in str(cell).split(", ")}, key=int)
        beyond = f"; {against} did not fit in memory at N = {', '.join(oom)}" if oom else ""
        groups.append(f"still slower than {against} at the largest N where both ran ({items} times its step at "
                      f"N = {int(largest):,}{beyond})")
    return "; ".join(groups)


def luo_path_text(kind: str, entry: dict) -> str:
    n, dense, fft = entry["measured_tokens"], entry["dense_ms_per_image"], entry["fft_ms_per_image"]
    where = (f"the FFT path is faster from N = {entry['fft_from_tokens']}" if entry["fft_from_tokens"] is not None
             else f"the dense path is faster at every measured N (N = {n[-1]}: {fmt(dense[-1] / 1e3, 3)} s against "
                  f"{fmt(fft[-1] / 1e3, 3)} s per image)")
    return f"luo_rpe on a kernelized backend ({kind}): {where}"


def scaling_summary(sources: Sources) -> str:
    """The README's one-line form of the token-scaling answer."""
    facts = scaling_facts(sources)
    cross = facts["crossovers"]
    measured = cross[cross["how"] == "measured"]
    return (f"over the top decade of N the O(N) variants' training step grows as N^{facts['linear time']}, softmax's "
            f"as N^{facts['softmax time']}{thin_fits_text(facts)}; the linear variants overtake softmax from "
            f"N = {measured['overtakes from N'].min():,.0f}–{measured['overtakes from N'].max():,.0f} tokens"
            + (f", except these, {slower}" if (slower := not_overtaking_text(cross)) else "") + "; "
            + "; ".join(luo_path_text(k, e) for k, e in facts["paths"].items()) + ".")


def bench_protocol(folder: Path) -> str:
    """How a bench study timed, from its rows: 'the machine its rows name (cpu:x86_64 x2 threads; 2 torch
    threads), medians of 3 interleaved repeats'."""
    frame = read_trials(folder, ["bench"]).frame

    def one(name: str) -> str:
        values = sorted({setting_text(v) for v in frame[name].dropna()}) if name in frame else []
        return "/".join(values) or "?"

    interleaved = "interleaved " if "timing_interleaved" in frame and frame["timing_interleaved"].all() else ""
    return (f"the machine its rows name ({one('device_name')}; {one('torch_threads')} torch threads), medians of "
            f"{one('timing_repeats')} {interleaved}repeats")


def timing_text(frame: pd.DataFrame) -> str:
    """Whether the rows' trials overlapped one another (efficiency.overlapped, from their start/end times and
    hosts), in efficiency's words: CONTENDED, ONE_AT_A_TIME or UNKNOWN_TIMES where a row lacks the times."""
    overlapped = efficiency.overlapped(frame)
    if frame.empty or overlapped.isna().any():
        return efficiency.UNKNOWN_TIMES
    return efficiency.CONTENDED if overlapped.astype(bool).any() else efficiency.ONE_AT_A_TIME


def cost_section(sources: Sources) -> list[str]:
    """Where the efficient variants pay: token scaling (exponents, crossovers, luo_rpe's two paths) and each
    study's cost ratios, timed alone."""
    facts = scaling_facts(sources)
    lines = ["## Cost: where the efficient variants pay (measurements)", "",
             f"From `results/{TOKEN_SCALING}/` (bench trials each alone on {bench_protocol(sources.results_dir / TOKEN_SCALING)}, "
             f"per image; `results/{TOKEN_SCALING}/token_scaling.md` has every table). Measurements, not "
             "comparisons: nothing here is tested.", "",
             f"- Over each variant's top decade of N, the O(N) variants' training-step exponents span "
             f"{facts['linear time']} and their step-memory exponents {facts['linear memory']}; softmax's "
             f"training-step exponents span {facts['softmax time']} and its step-memory exponents "
             f"{facts['softmax memory']}{thin_fits_text(facts)}."]
    cross = facts["crossovers"]
    for against, g in cross[cross["how"] == "measured"].groupby("against"):
        lines.append(f"- Against {against}, the linear variants overtake from N = "
                     + ", ".join(f"{n:,.0f} ({v})" for v, n in zip(g["variant"], g["overtakes from N"])) + ".")
    if slower := not_overtaking_text(cross):
        lines.append(f"- Not overtaking within the measured N: {slower}.")
    lines += [f"- {luo_path_text(k, e)}; `luo_path: auto` reads this (`rpevit/pe/luo_crossover.json`)."
              for k, e in facts["paths"].items()]
    lines.append("")
    costs = sources.bench_costs
    for (sweep, dataset), g in costs.groupby(["sweep", "dataset"]):
        g = g[(g["qk_norm"] == "none")]
        soft_ape = g[(g["attention"] == "softmax") & (g["pe"] == "ape")]
        g = g[g["pe"].isin(("ape", "luo_rpe", "rope", "circulant_string"))
              & g["attention"].isin(("softmax", "favor", "relu"))]
        rows = [[f"{a}+{p}", redraw, fmt(r, 3)] for a, p, redraw, r in
                zip(g["attention"], g["pe"], g["redraw"], g["train x softmax+ape"])]
        if len(soft_ape) == 1 and rows:
            lines += [f"Training step relative to softmax+ape at the {DATASET_NAMES.get(dataset, dataset)} study's "
                      f"model ({code_span(f'results/{raw_text(sweep)}/')}, each bench trial alone, N = "
                      f"{fmt(soft_ape['N'].iloc[0])} tokens, "
                      f"batch {fmt(soft_ape['batch'].iloc[0])}; {efficiency.time_devices(g)}):", "",
                      markdown_table(["variant", "redraw", "train step x softmax+ape"], rows), ""]
    if any(line.startswith("Training step relative to softmax+ape") for line in lines):
        lines += [REDRAW_NOT_TIMED, ""]
    return lines


# A bench trial (rpevit/tasks/bench.py) times forward and backward steps and never redraws (redraws are the training
# loop's, rpevit/tasks/train.py): a review read the tables' redraw column as a measured cost.
REDRAW_NOT_TIMED = ("`redraw`: the schedule the variant trains with, not a timed cost: a bench trial "
                    "(`rpevit/tasks/bench.py`) times its steps without advancing the redraw schedule (the training "
                    "loop's `advance_random_features` draws new features), so a redraw's cost (a new feature matrix "
                    "per layer every `redraw_interval` steps) is in none of these ratios, and rows that differ only "
                    "in `redraw` ran the same computation.")
