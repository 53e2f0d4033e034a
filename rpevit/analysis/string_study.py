"""The STRING study: which STRING variant is most accurate, at what cost relative to RoPE, and how
accuracy moves with the sparsity f of sparse-S Cayley-STRING.

    python analysis/string_study.py RESULTS_DIR

From the current `train` trials under exact softmax attention (qk_norm none) whose encoding is a
STRING or the rotation-invariant RPE (rope, circulant_string, cayley_string, reflection_string,
sparse_cayley_string at each f and solver, rotinv), per dataset:

- accuracy per variant, mean [95% bootstrap interval] over seeds, and the difference to rope with
  its interval (the seeds of the two variants resampled independently);
- cost relative to rope: training-step and inference time divided by rope's, from `bench` trials
  of the same model (each with the machine to itself; efficiency.bench_cost_table), where present;
- beside them, the per-epoch cost ratios to RoPE that the reference notebook this project started
  from measured (plain PyTorch on a laptop CPU; NOTEBOOK_X_ROPE), the figures the issue asked to
  be compared with;
- accuracy against f for the dense-solver rows, and the sparse-solver row beside the dense row of
  the same f (the two paths compute the same P: their accuracies should agree within seed noise);
- a verdict in words generated from those numbers.

Writes string_study.md and string_study_f.png into RESULTS_DIR.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis.common import (bootstrap, fmt, interval, markdown_table, mean_interval, pyplot, read_trials,
                                    save_figure, script_main, with_variant)
from rpevit.analysis.efficiency import MODEL_FIELDS, SHAPE_FIELDS, model_fields, with_resolved_shape

REFERENCE = "rope"
STRING_PES = ("rope", "circulant_string", "cayley_string", "reflection_string", "sparse_cayley_string", "rotinv")
SPARSE = "sparse_cayley_string"

# Per-epoch training time relative to RoPE measured by the reference notebook (plain PyTorch on a
# laptop CPU), keyed by (dataset or None for any dataset, pe, string_sparsity or None for any f).
# Its sparse f = 1 figure is a maximum over its runs, with no dataset given: "up to 221".
NOTEBOOK_X_ROPE: dict[tuple[str | None, str, float | None], str] = {
    ("mnist", "cayley_string", None): "5.5",
    ("cifar10", "cayley_string", None): "18.7",
    (None, SPARSE, 1.0): "up to 221",
}


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
    rows = train[(train["attention"] == "softmax") & train["pe"].isin(STRING_PES)]
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


def difference_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """mean(a) - mean(b) with a 95% bootstrap interval (seeds of a and b resampled independently)."""
    return bootstrap([a, b], lambda x, y: float(np.mean(x) - np.mean(y)))


def bench_ratios(bench: pd.DataFrame) -> pd.DataFrame:
    """Median training-step / inference times of softmax bench rows per dataset, pe and model fields,
    divided by those of rope's row of the same dataset and shape (SHAPE_FIELDS)."""
    if bench.empty:
        return pd.DataFrame()
    b = with_resolved_shape(bench[(bench["attention"] == "softmax") & bench["pe"].isin(STRING_PES)])
    b = b[b.get("qk_norm", pd.Series("none", index=b.index)).fillna("none") == "none"]
    keys = ["dataset", "pe", *(c for c in MODEL_FIELDS if c in b.columns)]
    times = b.groupby(keys, dropna=False)[["train_step_ms", "infer_ms_per_sample"]].median().reset_index()
    shape = ["dataset", *(c for c in SHAPE_FIELDS if c in times.columns)]
    refs = times.loc[times["pe"] == REFERENCE, [*shape, "train_step_ms", "infer_ms_per_sample"]]
    joined = times.merge(refs.drop_duplicates(shape), on=shape, how="left", suffixes=("", "_rope"))
    joined["train x rope"] = joined["train_step_ms"] / joined["train_step_ms_rope"]
    joined["infer x rope"] = joined["infer_ms_per_sample"] / joined["infer_ms_per_sample_rope"]
    return joined[[*keys, "train x rope", "infer x rope"]]


def with_costs(rows: pd.DataFrame, ratios: pd.DataFrame) -> pd.DataFrame:
    """rows with the bench ratios of their model: same dataset and pe, and equal in the model fields
    that apply to the encoding (efficiency.model_fields); NaN where no bench row matches."""
    out = rows.assign(**{"train x rope": math.nan, "infer x rope": math.nan})
    if ratios.empty:
        return out
    for i, row in out.iterrows():
        mask = (ratios["dataset"] == row["dataset"]) & (ratios["pe"] == row["pe"])
        for name in model_fields("softmax", row["pe"]):
            if name in ratios.columns and name in out.columns:
                mask &= ratios[name] == row[name]
        if mask.any():
            found = ratios.loc[mask].iloc[0]
            out.loc[i, ["train x rope", "infer x rope"]] = [found["train x rope"], found["infer x rope"]]
    return out


def variant_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per variant: seeds, accuracy mean and interval, difference to rope and interval, cost ratios."""
    ref = rows.loc[rows["pe"] == REFERENCE, "test_acc"].to_numpy(float)
    out = []
    for variant, g in rows.groupby("variant", sort=False):
        acc = g["test_acc"].to_numpy(float)
        diff = difference_interval(acc, ref) if len(ref) else (math.nan, math.nan, math.nan)
        first = g.iloc[0]
        f = first["string_sparsity"] if first["pe"] == SPARSE else None
        out.append({"variant": variant, "pe": first["pe"], "seeds": len(acc), "acc": acc.mean(),
                    "acc_text": mean_interval(acc, scale=100, digits=4), "diff": diff,
                    "train x rope": g["train x rope"].median(), "infer x rope": g["infer x rope"].median(),
                    "notebook x rope": notebook_ratio(first["dataset"], first["pe"], f)})
    return pd.DataFrame(out).sort_values("acc", ascending=False).reset_index(drop=True)


def f_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Sparse-S Cayley rows by f and solver: accuracy mean, interval and seeds."""
    sparse = rows[rows["pe"] == SPARSE]
    out = []
    for (f, solver), g in sparse.groupby(["string_sparsity", "cayley_solver"]):
        acc = g["test_acc"].to_numpy(float)
        out.append({"f": f, "solver": solver, "seeds": len(acc), "acc": acc.mean(),
                    "acc_text": mean_interval(acc, scale=100, digits=4), "values": acc})
    return pd.DataFrame(out, columns=["f", "solver", "seeds", "acc", "acc_text", "values"])


def verdict(dataset: str, table: pd.DataFrame, fs: pd.DataFrame) -> str:
    """Plain words from the numbers: best variant against rope, its cost, the f trend, the solver check."""
    lines = [f"**{dataset}.**"]
    best = table.iloc[0]
    point, lo, hi = best["diff"]
    if best["pe"] == REFERENCE:
        lines.append(f"rope itself is the most accurate ({best['acc_text']}).")
    else:
        clear = math.isfinite(lo) and (lo > 0 or hi < 0)
        lines.append(f"The most accurate is {best['variant']} ({best['acc_text']}), "
                     f"{fmt(100 * point, 2)} points vs rope [95%: {fmt(100 * lo, 2)}, {fmt(100 * hi, 2)}]"
                     f"{'' if clear else ': the interval includes 0, so it is not distinguishable from rope'}.")
        if math.isfinite(best["train x rope"]):
            lines.append(f"It costs {fmt(best['train x rope'], 3)}x rope's training-step time and "
                         f"{fmt(best['infer x rope'], 3)}x its inference time (bench, alone).")
    dense = fs[fs["solver"] != "sparse"].sort_values("f")
    if len(dense) > 1:
        top = dense.loc[dense["acc"].idxmax()]
        lines.append(f"Across f = {', '.join(fmt(f, 3) for f in dense['f'])}, accuracy spans "
                     f"{fmt(100 * dense['acc'].min(), 4)}-{fmt(100 * dense['acc'].max(), 4)}% (best at f = "
                     f"{fmt(top['f'], 3)}).")
    for _, row in fs[fs["solver"] == "sparse"].iterrows():
        twin = dense[dense["f"] == row["f"]]
        if len(twin):
            d, dlo, dhi = difference_interval(row["values"], twin["values"].iloc[0])
            lines.append(f"The sparse solver at f = {fmt(row['f'], 3)} reaches {row['acc_text']} against "
                         f"{twin['acc_text'].iloc[0]} with the dense solve (difference {fmt(100 * d, 2)} points "
                         f"[{fmt(100 * dlo, 2)}, {fmt(100 * dhi, 2)}]).")
    return " ".join(lines)


def plot_f(per_dataset: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Accuracy against f (log axis), mean and min-max over seeds: one panel per dataset, each with its
    own accuracy axis (a shared one flattens every curve: the datasets sit ~40 points apart)."""
    curves = {d: fs[fs["solver"] != "sparse"].sort_values("f") for d, fs in per_dataset.items()}
    curves = {d: dense for d, dense in curves.items() if len(dense) > 1}
    if not curves:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 4.2), squeeze=False)
    for ax, (dataset, dense) in zip(axes[0], curves.items()):
        lows = [100 * (v.mean() - v.min()) for v in dense["values"]]
        highs = [100 * (v.max() - v.mean()) for v in dense["values"]]
        ax.errorbar(dense["f"], 100 * dense["acc"], yerr=[lows, highs], fmt="o-", capsize=3)
        ax.set_xscale("log")
        ax.set_xticks(list(dense["f"]), [fmt(f, 3) for f in dense["f"]])
        ax.minorticks_off()
        ax.set_xlabel("f, fraction of learned entries of S (log)")
        ax.set_ylabel("test accuracy %")
        ax.set_title(dataset, fontsize=10)
    fig.suptitle("sparse-S Cayley-STRING: accuracy against f (mean over seeds, bars: min to max)", fontsize=10)
    return save_figure(fig, path)


def build(results_dir: Path) -> str | None:
    """Markdown section (and the f plot) for the STRING rows under results_dir; None without any."""
    trials = read_trials(results_dir, ["train", "bench"])
    if trials.frame.empty:
        return None
    frame = trials.frame
    rows = string_rows(frame[frame["task"] == "train"])
    if rows.empty or not (rows["pe"] != REFERENCE).any():
        return None
    rows = with_costs(rows, bench_ratios(frame[frame["task"] == "bench"]))
    parts, per_dataset = ["## The STRING study (softmax attention)", "", trials.note(), ""], {}
    for dataset, g in rows.groupby("dataset"):
        table, fs = variant_table(g), f_table(g)
        per_dataset[dataset] = fs
        shown = [[r["variant"], r["seeds"], r["acc_text"], interval(*r["diff"], digits=3, scale=100),
                  r["train x rope"], r["infer x rope"], r["notebook x rope"]] for _, r in table.iterrows()]
        parts += [verdict(dataset, table, fs), "", f"### {dataset}: accuracy and cost relative to rope", "",
                  markdown_table(["variant", "seeds", "test acc % [95%]", "vs rope, points [95%]",
                                  "train step x rope", "inference x rope", "reference notebook, epoch x rope"],
                                 shown), ""]
        if not fs.empty:
            parts += [f"### {dataset}: sparse-S Cayley-STRING against f", "",
                      markdown_table(["f", "solver", "seeds", "test acc % [95%]"],
                                     fs[["f", "solver", "seeds", "acc_text"]].itertuples(index=False)), ""]
    parts += ["Cost columns: bench trials of the same model, each with the machine to itself (— where none was "
              "run). The reference notebook's ratios are its per-epoch times relative to RoPE (plain PyTorch on a "
              "laptop CPU; its sparse f = 1 figure is a maximum over its runs). Intervals: 95% bootstrap over "
              "seeds; differences resample the two variants' seeds independently.", ""]
    if plot_f(per_dataset, results_dir / "string_study_f.png") is not None:
        parts += ["![accuracy against f](string_study_f.png)", ""]
    return "\n".join(parts)


def main() -> None:
    script_main(__doc__, build, "string_study.md", "The STRING study", "STRING-study trials")


if __name__ == "__main__":
    main()
