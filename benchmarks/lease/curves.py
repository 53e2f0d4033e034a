"""Per-epoch curves of a lease's sweep, one line per variant (mean over its seeds), the device named.

    python benchmarks/lease/curves.py RESULTS/all12 OUT.png "NVIDIA H100 80GB HBM3"

Reads trials.parquet and epochs.parquet as the analysis does (rpevit.sweep.results); the figure's title
names the device the rows ran on (their device_name column, else the name given), so a figure never
travels without it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rpevit.analysis.common import output_file  # noqa: E402
from rpevit.sweep.results import read_results_table  # noqa: E402


def main(folder: str, out: str, device: str) -> int:
    epochs_table = read_results_table(Path(folder) / "epochs.parquet")
    trials_table = read_results_table(Path(folder) / "trials.parquet")
    if epochs_table is None or epochs_table.num_rows == 0:
        print(f"curves: no epoch rows in {folder} yet")
        return 0
    trials = trials_table.to_pandas() if trials_table is not None else pd.DataFrame()
    if trials.empty:
        print(f"curves: no trial rows in {folder} yet (a group's rows come when it finishes)")
        return 0
    if trials["device_name"].notna().any():
        device = ", ".join(sorted(set(trials["device_name"].dropna().astype(str))))
    epochs = epochs_table.to_pandas().merge(trials[["trial_key", "attention", "pe", "seed"]], on="trial_key")
    epochs["variant"] = epochs["attention"].astype(str) + "+" + epochs["pe"].astype(str)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant, rows in epochs.groupby("variant"):
        mean = rows.groupby("epoch")[["val_acc", "train_loss"]].mean()
        axes[0].plot(mean.index, mean["val_acc"], marker="o", label=f"{variant} (n={rows['seed'].nunique()})")
        axes[1].plot(mean.index, mean["train_loss"], marker="o", label=variant)
    axes[0].set(xlabel="epoch", ylabel="validation accuracy (mean over seeds)")
    axes[1].set(xlabel="epoch", ylabel="training loss (mean over seeds)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{Path(folder).name}: per-epoch curves on {device}")
    fig.tight_layout()
    # through output_file (atomic, never through a link: a link at OUT stops with one line, its target untouched)
    with output_file(Path(out)) as handle:
        fig.savefig(handle, format=Path(out).suffix.lstrip(".") or "png", dpi=110)
    plt.close(fig)
    print(f"curves: {out} ({epochs['variant'].nunique()} variants, device {device})")
    return 0


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool  # the teardown can abort (rpevit/tool_exit.py)

    run_tool(lambda: main(*sys.argv[1:4]))
