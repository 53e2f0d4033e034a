"""The STRING study: which STRING variant is most accurate, at what cost relative to RoPE, and how
accuracy moves with the sparsity f of sparse-S Cayley-STRING.

    python analysis/string_study.py RESULTS_DIR

From the current `train` trials under exact softmax attention (qk_norm none) whose encoding is a
STRING or the rotation-invariant RPE (rope, circulant_string, cayley_string, reflection_string,
sparse_cayley_string at each f and solver, rotinv: the encodings whose registration declares the group
"string" or "string_study", `string_pes`), per dataset:

- accuracy per variant, mean [95% t interval] (n seeds), and the difference to rope with its 95%
  Welch interval (the seeds of the two variants are independent samples), judged by Holm over the
  family of every distinct variant's difference to rope (rpevit.analysis.stats; a variant whose runs
  repeat another's seed for seed, same_runs, is judged once, with it): a variant is called above
  or below rope only where its Holm-level interval excludes 0, else "not resolved with n seeds";
- cost relative to rope: training-step and inference time divided by rope's, from `bench` trials
  of the same model (each with the machine to itself), where present, computed by the efficiency
  section's own code (efficiency.with_ratios): the ratio of medians, with the 95% interval of the
  ratio of geometric means over bench trials (Welch on log times) where both sides have 2 or more
  trials, and the same note where a ratio rests on one trial;
- beside them, the per-epoch cost ratios to RoPE that the reference notebook this project started
  from measured (plain PyTorch on a laptop CPU; NOTEBOOK_X_ROPE), the figures the issue asked to
  be compared with;
- accuracy against f for the dense-solver rows, and the sparse-solver row beside the dense row of
  the same f, each row's solve read from its `cayley_solver` as the encoding resolves it ("auto" is
  the dense LU; a value the option does not allow is shown under its own label and counted as
  neither, with one line naming it: resolved_solver) (the two paths compute the same P: their
  accuracies should agree within seed noise;
  one comparison at 95%, paired by seed over the seeds both ran: a one-sample t interval of the
  per-seed differences; said in words where every one of them is exactly 0, identical runs; Welch
  only where the two share no seed);
- a verdict in words generated from those numbers.

Writes string_study.md and string_study_f.png into RESULTS_DIR.
"""
from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis import variants
from rpevit.analysis.common import (code_span, devices_text, fmt, markdown_table, pyplot, raw_text, read_trials,
                                   save_figure, script_main, with_variant)
from rpevit.analysis.efficiency import (RATIO_INTERVAL, REFERENCES, SHAPE_FIELDS, cost_bench_rows, field_matches,
                                        model_field_names, model_fields, with_ratios, with_resolved_shape)
from rpevit.analysis.efficiency.compute import BENCH_RATIO_TIMES, per_trial
from rpevit.analysis.efficiency.text import ratio_cell, ratio_note
from rpevit.analysis.stats import Interval, Judged, judge_family, mean_interval, welch
from rpevit.pe.cayley_string import CAYLEY_SOLVER
from rpevit.sweep.results import is_missing

REFERENCE = variants.STRING_REFERENCE
SPARSE = "sparse_cayley_string"
# efficiency.with_ratios' label for rope as a reference: its columns are "train x rope" / "infer x rope" (each
# with RATIO_INTERVAL beside it), the names this module's tables, verdict and efficiency.text.ratio_note read
RATIO_LABEL = next(label for label, attention, pe in REFERENCES if attention == "softmax" and pe == REFERENCE)
RATIOS = tuple(f"{kind} x {RATIO_LABEL}" for kind, _ in BENCH_RATIO_TIMES)  # ("train x rope", "infer x rope")
SHAPE_KEY = "_shape"  # bench_ratios' group of one dataset and shape, the `within` of with_ratios
# What `auto` resolves to in SparseCayleyString (rpevit/pe/cayley_string.py): the dense LU at every f and head
# dim, in every version of that module (until 5066756 through sparse_solver_is_faster, which returned False
# everywhere: the dense LU won every measured cell; since then directly). A row records the requested value
# only, so this is how a row's solve is known; tests/test_analysis_string_study.py pins it to the module's own
# `solver`, so a change of the rule there fails until it is made here too.
AUTO_SOLVER = "dense"

# Per-epoch training time relative to RoPE measured by the reference notebook (plain PyTorch on a
# laptop CPU), keyed by (dataset or None for any dataset, pe, string_sparsity or None for any f).
# Its sparse f = 1 figure is a maximum over its runs, with no dataset given: "up to 221".
NOTEBOOK_X_ROPE: dict[tuple[str | None, str, float | None], str] = {
    ("mnist", "cayley_string", None): "5.5",
    ("cifar10", "cayley_string", None): "18.7",
    (None, SPARSE, 1.0): "up to 221 (dataset not given)",
}


def string_pes() -> tuple[str, ...]:
    """The encodings of the study: those that declare the group "string" (a STRING, rope among them) or
    "string_study" (compared beside them: rotinv) where they register (rpevit.analysis.variants)."""
    return variants.in_group(variants.STRING) + variants.in_group(variants.STRING_STUDY)


def notebook_ratio(dataset: str, pe: str, f: float | None) -> str:
    """The reference notebook's epoch-time ratio to RoPE for this variant, or "—" where it has none."""
    for (d, name, sparsity), text in NOTEBOOK_X_ROPE.items():
        if d in (None, dataset) and name == pe and (sparsity is None or f == sparsity):
            return text
    return "—"


def string_rows(train: pd.DataFrame) -> pd.DataFrame:
    """Softmax rows (qk_norm none) of the STRING encodings, with `variant` (pe and its defining options)."""
    if train.empty:
        return train
    rows = train[(train["attention"] == "softmax") & train["pe"].isin(string_pes())]
    rows = rows[rows.get("qk_norm", pd.Series("none", index=rows.index)).fillna("none") == "none"]
    out = with_resolved_shape(rows)
    out["variant"] = with_variant(rows)["pe"].to_numpy()
    return one_row_per_seed(out.reset_index(drop=True))


def one_row_per_seed(rows: pd.DataFrame) -> pd.DataFrame:
    """A seed trained in two sweeps (MNIST rope: the converged study and the STRING study) counts
    once, with its test accuracy averaged, as gap_closure.per_seed does: two rows of one seed are not
    two samples, and counting both would narrow the intervals."""
    keys = ["dataset", "variant", "seed"]
    out = rows.drop_duplicates(keys).reset_index(drop=True)
    mean = rows.groupby(keys, dropna=False)["test_acc"].mean()
    out["test_acc"] = mean.reindex(pd.MultiIndex.from_frame(out[keys])).to_numpy()
    return out


def bench_ratios(bench: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, pe and model fields of the softmax bench rows (qk_norm none): training-step and inference
    time divided by those of rope's row of the same dataset and shape (SHAPE_FIELDS), RATIOS, each with its
    RATIO_INTERVAL beside it. Computed by efficiency.with_ratios, the code of the efficiency section's bench
    tables, so the two sections give one figure for one ratio and the same interval: the ratio of medians over
    bench trials, and the 95% interval of the ratio of geometric means (ratio_interval, Welch on log times)
    where both sides have 2 or more trials (None for rope's own row, 1 by definition). A field that does not
    apply to an encoding (efficiency.model_fields) is blanked before grouping (without_unused_fields): two
    sweeps that record such a field differently still give rope one row per shape, the one reference
    with_ratios divides by (it gives no ratio where a shape has two)."""
    bench = cost_bench_rows(bench)
    if bench.empty:
        return pd.DataFrame()
    b = with_resolved_shape(bench[(bench["attention"] == "softmax") & bench["pe"].isin(string_pes())])
    b = b[b.get("qk_norm", pd.Series("none", index=b.index)).fillna("none") == "none"]
    if b.empty:
        return pd.DataFrame()
    fields = [c for c in model_field_names() if c in b.columns]
    keys = ["dataset", "pe", *fields]
    times = [col for _, col in BENCH_RATIO_TIMES]
    grouped = without_unused_fields(b, fields).groupby(keys, dropna=False)
    table = grouped[times].median().join(per_trial(grouped, times)).reset_index()
    table = table.assign(attention="softmax", qk_norm="none")  # the rows with_ratios looks the reference up by
    shape = ["dataset", *(c for c in SHAPE_FIELDS if c in table.columns)]
    table[SHAPE_KEY] = table.groupby(shape, dropna=False).ngroup()
    ratios = with_ratios(table, SHAPE_KEY, BENCH_RATIO_TIMES)
    return ratios[[*keys, *RATIOS, *(name + RATIO_INTERVAL for name in RATIOS)]]


def without_unused_fields(rows: pd.DataFrame, fields: list[str]) -> pd.DataFrame:
    """rows with each of `fields` that does not change the cost of the row's encoding (not in
    efficiency.model_fields("softmax", pe)) set to None: such a field is no part of the model, so rows that
    differ only there are one model (with_costs matches on the fields that apply only, as here)."""
    out = rows.copy()
    for pe in out["pe"].unique():
        unused = [f for f in fields if f not in model_fields("softmax", pe)]
        if unused:
            out[unused] = out[unused].astype(object)
            out.loc[out["pe"] == pe, unused] = None
    return out


def with_costs(rows: pd.DataFrame, ratios: pd.DataFrame) -> pd.DataFrame:
    """rows with the bench ratios of their model (RATIOS and their RATIO_INTERVAL columns): same dataset and
    pe, and equal in the model fields that apply to the encoding (efficiency.model_fields); NaN (interval
    None) where no bench row matches."""
    intervals = [name + RATIO_INTERVAL for name in RATIOS]
    out = rows.assign(**{name: math.nan for name in RATIOS})
    for name in intervals:
        out[name] = pd.Series([None] * len(out), index=out.index, dtype=object)
    if ratios.empty:
        return out
    for i, row in out.iterrows():
        mask = (ratios["dataset"] == row["dataset"]) & (ratios["pe"] == row["pe"])
        for name in model_fields("softmax", row["pe"]):
            mask &= field_matches(ratios, name, row.get(name))
        if mask.any():
            found = ratios.loc[mask].iloc[0]
            for name in (*RATIOS, *intervals):
                out.at[i, name] = found[name]
    return out


def shared_interval(intervals: pd.Series | None) -> Interval | None:
    """The ratio interval of a variant: the one its rows all carry (with_costs gives each row its bench row's,
    so rows of one model hold the same object); None where they carry none or several (a variant over
    several models: its ratio is a median of theirs, which no one interval is of), or have no such column
    (rows not through with_costs)."""
    values = [] if intervals is None else list(intervals)
    first = values[0] if values else None
    return first if isinstance(first, Interval) and all(v is first for v in values) else None


def variant_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per variant: seeds, accuracy mean and interval, difference to rope (95% Welch), its Holm verdict
    (`holm`: stats.Judged within the family of every distinct variant's difference to rope), `same_as` (the
    variant whose runs it repeats seed for seed, same_runs; it shares that one's verdict) and cost ratios
    (RATIOS, with their bench-trial intervals in RATIO_INTERVAL columns: shared_interval)."""
    ref = rows.loc[rows["pe"] == REFERENCE, "test_acc"].to_numpy(float)
    groups = {variant: g for variant, g in rows.groupby("variant", sort=False)}
    twins = same_runs({v: g for v, g in groups.items() if g["pe"].iloc[0] != REFERENCE})
    family = judge_family({v: partial(welch, g["test_acc"].to_numpy(float), ref)
                           for v, g in groups.items() if g["pe"].iloc[0] != REFERENCE and v not in twins}) \
        if len(ref) else {}
    out = []
    for variant, g in groups.items():
        acc = g["test_acc"].to_numpy(float)
        first = g.iloc[0]
        f = first["string_sparsity"] if first["pe"] == SPARSE else None
        holm = family.get(twins.get(variant, variant))
        out.append({"variant": variant, "pe": first["pe"], "seeds": len(acc), "acc": acc.mean(),
                    "acc_text": mean_interval(acc).text(scale=100, digits=4),
                    "diff": holm.nominal if holm else Interval(math.nan), "holm": holm,
                    "same_as": twins.get(variant),
                    **{name: g[name].median() for name in RATIOS},
                    **{name + RATIO_INTERVAL: shared_interval(g.get(name + RATIO_INTERVAL)) for name in RATIOS},
                    "notebook x rope": notebook_ratio(first["dataset"], first["pe"], f)})
    return pd.DataFrame(out).sort_values("acc", ascending=False).reset_index(drop=True)


def same_runs(groups: dict[str, pd.DataFrame]) -> dict[str, str]:
    """Variant -> the first variant before it (in `groups`' order) with the same seeds and, seed for seed, the
    same test accuracy to the last bit: the same runs under two names (sparse-S Cayley at f = 1 computes dense
    Cayley-STRING's P; the sparse and dense solves at one f can agree exactly). Counting such a pair twice in
    the Holm family would make it larger than the number of distinct models and every level stricter for
    nothing, so each is judged once and the copy shares the verdict (twin_text says so)."""
    seen: dict[tuple, str] = {}
    twins = {}
    for variant, g in groups.items():
        runs = tuple(sorted(zip(g["seed"].tolist(), g["test_acc"].astype(float).tolist()))) \
            if "seed" in g.columns else (variant,)
        if runs in seen:
            twins[variant] = seen[runs]
        else:
            seen[runs] = variant
    return twins


def twin_text(row: pd.Series) -> str:
    """' (the same runs as cayley_string, seed for seed: judged once)' for a variant same_runs paired, else ''."""
    same = row.get("same_as")
    return f" (the same runs as {same}, seed for seed: judged once)" if isinstance(same, str) else ""


def distinct(table: pd.DataFrame) -> list[pd.Series]:
    """The rows with a Holm verdict that count in the family: one per distinct model (not a same_runs copy)."""
    return [r for _, r in table.iterrows() if r["holm"] is not None and not twin_text(r)]


def holm_word(holm: Judged | None) -> str:
    """'above rope' / 'below rope' where Holm resolves the difference, else 'not resolved with n seeds'."""
    return "—" if holm is None else holm.word("above rope", "below rope")


def resolved_solver(value: object) -> str | None:
    """The solve a sparse-S Cayley row ran, "dense" or "sparse", from its recorded `cayley_solver`: "auto" is
    AUTO_SOLVER (the dense LU, whatever the row's f), "dense" and "sparse" are themselves, a missing value is
    the option's default (what a row written without the field ran, as efficiency.field_matches reads it).
    None for a value the option does not allow (a forged or damaged results file): counted as neither
    solve, since the dense rows are the f curve and the comparison the sparse solver is checked against."""
    value = CAYLEY_SOLVER.default if is_missing(value) else value
    if not isinstance(value, str) or value not in CAYLEY_SOLVER.choices:
        return None
    return AUTO_SOLVER if value == "auto" else value


def solver_label(solver: object) -> str:
    """The f table's solver cell: the recorded value, with what it resolves to where that is not the value
    itself ("auto (dense)"), or "(not an allowed value)" where it resolves to nothing."""
    solve = resolved_solver(solver)
    if solve is None:
        return f"{solver} (not an allowed value)"
    return solve if solve == solver else f"{solver} ({solve})"


def solves(fs: pd.DataFrame, solve: str) -> pd.DataFrame:
    """The f_table rows whose solver resolves to `solve` ("dense" or "sparse"; resolved_solver)."""
    return fs[fs["solver"].map(resolved_solver) == solve]


def f_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Sparse-S Cayley rows by f and solver (the recorded cayley_solver, a missing one as the option's
    default): accuracy mean, interval and seeds; `resolved`, the solve it ran (resolved_solver: "dense",
    "sparse", or None for a value the option does not allow); `by_seed`, seed -> test accuracy (the mean
    where a seed has two rows), what the solver check pairs on."""
    sparse = rows[rows["pe"] == SPARSE]
    solver = sparse["cayley_solver"] if "cayley_solver" in sparse.columns else pd.Series(None, index=sparse.index)
    sparse = sparse.assign(cayley_solver=solver.astype(object).where(solver.notna(), CAYLEY_SOLVER.default))
    out = []
    for (f, solver), g in sparse.groupby(["string_sparsity", "cayley_solver"]):
        acc = g["test_acc"].to_numpy(float)
        out.append({"f": f, "solver": solver, "resolved": resolved_solver(solver), "seeds": len(acc),
                    "acc": acc.mean(), "acc_text": mean_interval(acc).text(scale=100, digits=4), "values": acc,
                    "by_seed": g.groupby("seed")["test_acc"].mean().to_dict()})
    table = pd.DataFrame(out, columns=["f", "solver", "resolved", "seeds", "acc", "acc_text", "values", "by_seed"])
    table["resolved"] = pd.Series([r["resolved"] for r in out], index=table.index, dtype=object)  # None, not NaN
    return table


def solver_note(fs: pd.DataFrame) -> str:
    """One line naming the cayley_solver values of fs that the option does not allow, which the f table shows
    under their own label and the verdict, the f curve and the solver check count as neither solve; '' where
    there is none. Said, not raised: a report of committed results must not stop at one forged value."""
    unknown = fs[fs["solver"].map(resolved_solver).isna()]
    if unknown.empty:
        return ""
    found = "; ".join(f"{code_span(raw_text(solver))} at f = {', '.join(fmt(f, 3) for f in g['f'])}"
                      for solver, g in unknown.groupby(unknown["solver"].astype(str)))
    return (f"Counted as neither solve: {SPARSE} rows whose field '{CAYLEY_SOLVER.name}' has a value it does not "
            f"allow ({found}); allowed: {', '.join(CAYLEY_SOLVER.choices)} (auto: the {AUTO_SOLVER} solve).")


def solver_check(sparse: dict, dense: dict, values_sparse, values_dense) -> str:
    """The sparse solver against the dense one at the same f, in words (one check, 95%): the two paths
    compute the same P, so a seed run by both is one paired observation. Over the seeds both ran: where
    every per-seed difference is exactly 0, the runs are identical and no interval is drawn; else the
    one-sample t interval of the per-seed differences (n = shared seeds). Welch only where no seed is
    shared. sparse / dense: seed -> accuracy; values_*: every row's accuracy, for Welch."""
    sparse, dense = ({s: v for s, v in d.items() if math.isfinite(v)} for d in (sparse, dense))
    shared = sorted(set(sparse) & set(dense))
    if not shared:
        d = welch(values_sparse, values_dense)
        return f"difference, points, Welch (the two solvers share no seed): {d.text(scale=100)}: one check, 95%"
    diffs = np.array([sparse[s] - dense[s] for s in shared], float)
    alone = len(set(sparse) ^ set(dense))
    left = f"; {alone} seed{'' if alone == 1 else 's'} run by one solver only left out" if alone else ""
    if np.all(diffs == 0):
        return f"identical seed for seed: difference 0 in each of the {len(shared)} seeds{left}"
    d = mean_interval(diffs)
    return f"difference, points, paired by seed: {d.text(scale=100)}: one check, 95%{left}"


def verdict(dataset: str, table: pd.DataFrame, fs: pd.DataFrame) -> str:
    """Plain words from the numbers: the highest mean and which differences to rope Holm resolves, the
    cost of the highest mean, the f means, the solver check. No effect is claimed that Holm does not resolve."""
    lines = [f"**{dataset}.**"]
    best = table.iloc[0]
    judged = distinct(table)
    k = judged[0]["holm"].k if judged else 0
    if best["pe"] == REFERENCE:
        lines.append(f"rope itself has the highest mean ({best['acc_text']}).")
    elif best["holm"] is None:  # no rope rows in this dataset: nothing to compare with
        lines.append(f"The highest mean is {best['variant']} ({best['acc_text']}); no rope rows to compare it with.")
    else:
        holm = best["holm"]
        lines.append(f"The highest mean is {best['variant']} ({best['acc_text']}), "
                     f"{holm.interval.text(scale=100)} points vs rope at its Holm level: "
                     f"{holm_word(holm)}.")
        if math.isfinite(best["train x rope"]):
            train, infer = (cost_text(best, name) for name in RATIOS)
            lines.append(f"It costs {train} rope's training-step time and {infer} its inference time "
                         f"(bench, alone{one_trial_text(best)}).")
    resolved = [f"{r['variant']} {holm_word(r['holm'])} ({r['holm'].interval.text(scale=100)})"
                for r in judged if r["holm"].resolved]
    if judged:
        counts = sorted({n for r in judged for n in r["holm"].interval.n})
        seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        rest = len(judged) - len(resolved)
        if not resolved:
            lines.append(f"No difference to rope is resolved by Holm over the k = {k} with {seeds} seeds.")
        else:
            lines.append(f"Differences to rope resolved by Holm over the k = {k}: {'; '.join(resolved)}"
                         + (f"; the other {rest} not resolved with {seeds} seeds." if rest else "."))
    copies = [f"{r['variant']} repeats {r['same_as']}" for _, r in table.iterrows() if twin_text(r)]
    if copies:
        lines.append(f"Judged once, as the same runs seed for seed (the same accuracy in every seed): "
                     f"{'; '.join(copies)}.")
    dense = solves(fs, "dense").sort_values("f")
    if dense["f"].nunique() > 1:
        top = dense.loc[dense["acc"].idxmax()]
        lines.append(f"Across f = {', '.join(fmt(f, 3) for f in dense['f'].unique())}, mean accuracy spans "
                     f"{fmt(100 * dense['acc'].min(), 4)}-{fmt(100 * dense['acc'].max(), 4)}% (highest mean at f = "
                     f"{fmt(top['f'], 3)}).")
    for _, row in solves(fs, "sparse").iterrows():
        twin = dense[dense["f"] == row["f"]]
        if len(twin):
            check = solver_check(row["by_seed"], twin["by_seed"].iloc[0], row["values"], twin["values"].iloc[0])
            lines.append(f"The sparse solver at f = {fmt(row['f'], 3)} reaches {row['acc_text']} against "
                         f"{twin['acc_text'].iloc[0]} with the dense solve ({check}).")
    return " ".join(lines)


def cost_text(row: pd.Series, name: str) -> str:
    """A ratio as the verdict says it: '1.07x', with its 95% bench-trial interval where it has one
    ('1.07x [1.01, 1.12] (n=3,3)'; the point stays the ratio of medians, as in the table)."""
    interval = row.get(name + RATIO_INTERVAL)
    text = f"{fmt(row[name], 3)}x"
    if isinstance(interval, Interval) and interval.bounded:
        text += f" [{fmt(interval.lo, 3)}, {fmt(interval.hi, 3)}] ({interval.n_text()})"
    return text


def one_trial_text(row: pd.Series) -> str:
    """'; no interval: one bench trial on a side' where a ratio of the row rests on one bench trial of the
    variant or of rope (efficiency.compute.ratio_interval gives none), else ''."""
    intervals = [row.get(name + RATIO_INTERVAL) for name in RATIOS]
    plain = any(isinstance(iv, Interval) and not iv.bounded for iv in intervals)
    return "; no interval: one bench trial on a side" if plain else ""


def f_title(what: str, devices: str) -> str:
    """The f plot's suptitle: what its bars are and the devices of its rows (common.devices_text)."""
    return f"sparse-S Cayley-STRING: accuracy against f (mean over seeds; {what}; {devices})"


def plot_f(per_dataset: dict[str, pd.DataFrame], path: Path, devices: str = "device unknown") -> Path | None:
    """Accuracy against f (log axis) of the dense-solve rows (solves), mean over seeds with its 95% t interval
    where f has 2 or more seeds (none
    drawn with one: the title says which): one panel per dataset, each with its own accuracy axis (a shared one
    flattens every curve: the datasets sit ~40 points apart). The title names `devices` (of the rows drawn)."""
    curves = {d: solves(fs, "dense").sort_values("f") for d, fs in per_dataset.items()}
    curves = {d: dense for d, dense in curves.items() if len(dense) > 1}
    if not curves:
        return None
    plt = pyplot()
    colour = variants.colour(variants.PE, SPARSE)  # the curve is sparse-S Cayley's, as in every figure
    fig, axes = plt.subplots(1, len(curves), figsize=(4.8 * len(curves), 4.2), squeeze=False)
    with_interval = False
    for ax, (dataset, dense) in zip(axes[0], curves.items()):
        intervals = [mean_interval(v) for v in dense["values"]]
        f, acc = dense["f"].to_numpy(float), 100 * dense["acc"].to_numpy(float)
        ax.plot(f, acc, "o-", color=colour)
        bounded = [i for i, iv in enumerate(intervals) if iv.bounded]
        if bounded:
            with_interval = True
            ax.errorbar(f[bounded], acc[bounded], fmt="none", ecolor=colour, capsize=3,
                        yerr=[[100 * (intervals[i].point - intervals[i].lo) for i in bounded],
                              [100 * (intervals[i].hi - intervals[i].point) for i in bounded]])
        ax.set_xscale("log")
        ax.set_xticks(list(f), [fmt(x, 3) for x in f])
        ax.minorticks_off()
        ax.margins(x=0.08, y=0.1)
        ax.tick_params(labelsize=9)
        ax.set_xlabel("f, fraction of learned entries of S (log)", fontsize=10)
        ax.set_ylabel("test accuracy %", fontsize=10)
        counts = sorted({len(v) for v in dense["values"]})
        seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        missing = "" if len(bounded) == len(intervals) else "; no bar where f has one seed"
        ax.set_title(f"{dataset} (n = {seeds} seeds per f{missing})", fontsize=10)
    what = "bars: 95% t interval over seeds" if with_interval else "one seed per f: no interval"
    fig.suptitle(f_title(what, devices), fontsize=10)
    return save_figure(fig, path)


def study_tables(frame: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Per dataset: (variant_table, f_table) of the STRING rows among the train and bench rows of frame, with
    their bench costs; empty where there is no STRING variant beside rope."""
    if frame.empty:
        return {}
    rows = string_rows(frame[frame["task"] == "train"])
    if rows.empty or not (rows["pe"] != REFERENCE).any():
        return {}
    rows = with_costs(rows, bench_ratios(frame[frame["task"] == "bench"]))
    return {dataset: (variant_table(g), f_table(g)) for dataset, g in rows.groupby("dataset")}


def bench_devices(frame: pd.DataFrame, dataset: str) -> str:
    """common.devices_text of the bench rows bench_ratios reads for `dataset` (softmax, a STRING encoding or rope,
    cost sweeps): the devices the cost columns of its table were timed on."""
    bench = cost_bench_rows(frame[frame["task"] == "bench"]) if "task" in frame.columns else frame.iloc[:0]
    if bench.empty:
        return devices_text(bench)
    return devices_text(bench[(bench["dataset"] == dataset) & (bench["attention"] == "softmax")
                              & bench["pe"].isin(string_pes())])


def f_devices(frame: pd.DataFrame, datasets: list[str]) -> str:
    """common.devices_text of the sparse-S Cayley train rows of `datasets`: those the f plot draws."""
    rows = string_rows(frame[frame["task"] == "train"])
    return devices_text(rows[(rows["pe"] == SPARSE) & rows["dataset"].isin(datasets)])


def build(results_dir: Path) -> str | None:
    """Markdown section (and the f plot) for the STRING rows under results_dir; None without any."""
    trials = read_trials(results_dir, ["train", "bench"]).without_rotation_study()
    tables = study_tables(trials.frame)
    if not tables:
        return None
    parts, per_dataset = ["## The STRING study (softmax attention)", "", trials.note(), ""], {}
    for dataset, (table, fs) in tables.items():
        per_dataset[dataset] = fs
        shown = [[r["variant"], r["seeds"], r["acc_text"], r["diff"].text(scale=100),
                  holm_word(r["holm"]) + (f": {r['holm'].interval.text(scale=100)}, k={r['holm'].k}"
                                          if r["holm"] is not None else "") + twin_text(r),
                  *(ratio_cell(r[name], r[name + RATIO_INTERVAL]) for name in RATIOS),
                  r["notebook x rope"]] for _, r in table.iterrows()]
        parts += [verdict(dataset, table, fs), "",
                  f"### {dataset}: accuracy and cost relative to rope (cost: bench trials alone, "
                  f"{bench_devices(trials.frame, dataset)})", "",
                  markdown_table(["variant", "seeds", "test acc % [95%] (n)", "vs rope, points [95% Welch] (n)",
                                  "Holm vs rope, at its Holm level (k)", "train step x rope", "inference x rope",
                                  "reference notebook, epoch x rope"], shown), ""]
        if not fs.empty:
            shown_fs = [[r["f"], solver_label(r["solver"]), r["seeds"], r["acc_text"]] for _, r in fs.iterrows()]
            parts += [f"### {dataset}: sparse-S Cayley-STRING against f", "",
                      markdown_table(["f", "solver", "seeds", "test acc % [95%] (n)"], shown_fs), ""]
            parts += [solver_note(fs), ""] if solver_note(fs) else []
    ratios = ratio_note(pd.concat([table for table, _ in tables.values()], ignore_index=True))
    parts += ["Cost columns: bench trials of the same model, each with the machine to itself (— where none was "
              f"run), the ratio of medians over bench trials, as the efficiency section computes it. {ratios}"
              f"{' ' if ratios else ''}The reference notebook's ratios are its per-epoch times relative to RoPE (plain PyTorch on a "
              "laptop CPU; its sparse f = 1 figure is a maximum over its runs). Intervals: 95% t intervals over "
              "seeds (differences to rope: Welch, the two variants' seeds independent; the sparse solver against the "
              "dense one: paired by seed), each with its seed counts n. "
              "Holm: each difference to rope judged at its Holm level within the family of all k distinct variants "
              "(a variant whose runs repeat another's seed for seed is judged once, with it); "
              "a variant is called above or below rope only where that interval excludes 0.", ""]
    if plot_f(per_dataset, results_dir / "string_study_f.png", f_devices(trials.frame, list(per_dataset))) is not None:
        parts += ["![accuracy against f](string_study_f.png)", ""]
    return "\n".join(parts)


def main() -> None:
    script_main(__doc__, build, "string_study.md", "The STRING study", "STRING-study trials")


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool

    run_tool(main)
