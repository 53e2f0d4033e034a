"""How much of the softmax-vs-Performer accuracy gap each position encoding closes.

    python analysis/gap_closure.py RESULTS_DIR

Per dataset, from the `train` trials: test accuracy of every (attention, pe) variant, mean over
seeds with a 95% bootstrap interval; and for each Performer backend b (every attention but
softmax) and encoding pe (every pe but ape)

    G = (acc[b + pe] - acc[b + ape]) / (acc[softmax + ape] - acc[b + ape])

(0: no better than ape, 1: the whole gap closed, > 1: better than softmax + ape). Intervals
resample the seeds of the three variants independently (conservative: no pairing is assumed).
G is left undefined, and the table says why, when the gap acc[softmax + ape] - acc[b + ape] is
not resolved: <= 0, or its 95% interval reaches 0, or (one seed, no interval) it is below
MIN_GAP. Writes gap_closure.md and gap_closure.png into RESULTS_DIR.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from common import bootstrap, fmt, interval, load_trials, markdown_table, pyplot, save_figure, script_main

BASELINE_ATTENTION, BASELINE_PE = "softmax", "ape"
MIN_GAP = 0.005  # 0.5 points of accuracy: below it a single-seed gap is not distinguishable from noise


def accuracies(frame: pd.DataFrame) -> dict[tuple[str, str, str], np.ndarray]:
    """(dataset, attention, pe) -> test accuracies of its seeds (the mean of repeated seeds first)."""
    per_seed = frame.groupby(["dataset", "attention", "pe", "seed"])["test_acc"].mean().reset_index()
    return {key: g["test_acc"].to_numpy() for key, g in per_seed.groupby(["dataset", "attention", "pe"])}


def gap_closure(pe_acc: np.ndarray, perf_ape: np.ndarray, soft_ape: np.ndarray) -> float:
    gap = soft_ape.mean() - perf_ape.mean()
    return (pe_acc.mean() - perf_ape.mean()) / gap if gap != 0 else math.nan


def gap_rows(acc: dict[tuple[str, str, str], np.ndarray]) -> list[dict]:
    """One row per (dataset, Performer backend, pe) with G, its interval, or why it is undefined."""
    rows = []
    for dataset in sorted({k[0] for k in acc}):
        soft = acc.get((dataset, BASELINE_ATTENTION, BASELINE_PE))
        backends = sorted({a for d, a, _ in acc if d == dataset and a != BASELINE_ATTENTION})
        for backend in backends:
            base = acc.get((dataset, backend, BASELINE_PE))
            for pe in sorted({p for d, a, p in acc if d == dataset and a == backend and p != BASELINE_PE}):
                row = {"dataset": dataset, "backend": backend, "pe": pe, "G": math.nan, "lo": math.nan,
                       "hi": math.nan, "gap": math.nan, "gain": math.nan, "note": ""}
                if soft is None or base is None:
                    row["note"] = f"missing {BASELINE_ATTENTION}+{BASELINE_PE} or {backend}+{BASELINE_PE}"
                    rows.append(row)
                    continue
                gap, gap_lo, _ = bootstrap([soft, base], lambda s, b: s.mean() - b.mean())
                gain = acc[(dataset, backend, pe)].mean() - base.mean()
                row.update(gap=gap, gain=gain)
                resolved = gap > 0 and (gap_lo > 0 if math.isfinite(gap_lo) else gap >= MIN_GAP)
                if not resolved:
                    why = "<= 0" if gap <= 0 else ("95% interval reaches 0" if math.isfinite(gap_lo)
                                                   else f"< {100 * MIN_GAP:g} points with one seed")
                    row["note"] = f"G undefined: gap {100 * gap:+.2f} points ({why})"
                else:
                    row["G"], row["lo"], row["hi"] = bootstrap([acc[(dataset, backend, pe)], base, soft], gap_closure)
                rows.append(row)
    return rows


def build(results_dir: Path) -> str | None:
    """Markdown section (and gap_closure.png) for the train trials under results_dir; None if there are none."""
    frame = load_trials(results_dir, task="train")
    if frame.empty or "test_acc" not in frame.columns:
        return None
    acc = accuracies(frame)
    parts = ["## Accuracy and gap closure", ""]
    for dataset in sorted({k[0] for k in acc}):
        table = []
        for (d, attention, pe), values in sorted(acc.items()):
            if d == dataset:
                table.append([attention, pe, len(values), interval(*bootstrap([values], np.mean), scale=100, digits=4)])
        parts += [f"### {dataset}: test accuracy (%), mean [95% bootstrap interval] over seeds", "",
                  markdown_table(["attention", "pe", "seeds", "test acc %"], table), ""]
    rows = gap_rows(acc)
    if rows:
        parts += ["### Gap closure G = (acc[b+pe] - acc[b+ape]) / (acc[softmax+ape] - acc[b+ape])", "",
                  markdown_table(["dataset", "backend b", "pe", "G [95% interval]", "gap softmax+ape - b+ape (points)",
                                  "gain b+pe - b+ape (points)", "note"],
                                 [[r["dataset"], r["backend"], r["pe"], interval(r["G"], r["lo"], r["hi"]),
                                   fmt(100 * r["gap"], 3), fmt(100 * r["gain"], 3), r["note"]] for r in rows]),
                  "", "![gap closure](gap_closure.png)", ""]
        plot_gap_closure(rows, results_dir / "gap_closure.png")
    return "\n".join(parts)


def plot_gap_closure(rows: list[dict], path: Path) -> Path:
    """Bars of G per (backend, pe), one panel per dataset; undefined G drawn as an 'n/a' label."""
    plt = pyplot()
    datasets = sorted({r["dataset"] for r in rows})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4.2), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        sub = [r for r in rows if r["dataset"] == dataset]
        backends, pes = sorted({r["backend"] for r in sub}), sorted({r["pe"] for r in sub})
        width = 0.8 / max(1, len(pes))
        labelled: set[str] = set()
        for j, pe in enumerate(pes):
            for i, backend in enumerate(backends):
                r = next((r for r in sub if r["backend"] == backend and r["pe"] == pe), None)
                if r is None:
                    continue
                xpos = i + (j - (len(pes) - 1) / 2) * width
                if math.isfinite(r["G"]):
                    err = None
                    if math.isfinite(r["lo"]):
                        err = [[r["G"] - r["lo"]], [r["hi"] - r["G"]]]
                    ax.bar(xpos, r["G"], width, yerr=err, capsize=3, color=f"C{j}",
                           label=None if pe in labelled else pe)
                    labelled.add(pe)
                else:
                    ax.text(xpos, 0.02, "n/a", ha="center", va="bottom", fontsize=8, rotation=90)
        ax.axhline(0, color="k", lw=0.8)
        ax.axhline(1, color="k", lw=0.8, ls="--")
        ax.set_xticks(range(len(backends)), backends)
        ax.set_ylabel("gap closure G (1 = softmax+ape reached)")
        ax.set_title(f"{dataset}: G per Performer backend and pe (95% CI)")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def main() -> None:
    script_main(__doc__, build, "gap_closure.md", "Gap closure", "train trials with test_acc")


if __name__ == "__main__":
    main()
