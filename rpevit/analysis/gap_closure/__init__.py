"""How much of the softmax-vs-Performer accuracy gap each position encoding closes, draw-aware.

    python analysis/gap_closure.py RESULTS_DIR

A variant is (dataset, attention, pe, qk_norm, redraw): qk_norm is 'none' or 'l2', redraw a label
('off' when redraw_interval is 0 or the attention draws no random features, else 'every N until F').
Per dataset, from the current `train` trials (rows listed in each folder's space.json):

- a verdict per Performer configuration (backend b, qk_norm, redraw), generated from the numbers;
- accuracy per variant: the training-draw test_acc and, over `eval_draws` fresh random-feature
  draws, their mean / std / min, the accuracy of the draw-averaged probabilities, and the same
  weights evaluated with exact softmax attention, each mean [95% t interval] (n seeds);
- attention fidelity: mean total-variation distance of the attention rows to exact softmax rows;
- for each Performer configuration and encoding pe (every pe but ape)

    G = (acc[b + pe] - acc[b + ape]) / (acc[softmax + ape] - acc[b + ape])

  (0: no better than ape, 1: the whole gap closed, > 1: better than softmax + ape) with its
  Fieller interval, the gain acc[b + pe] - acc[b + ape], and beside them the same-encoding gap
  acc[softmax + pe] - acc[b + pe] (Welch): G measures b + pe against softmax with ape, which hides
  how far b + pe stays below softmax with the same encoding.

Both on the draw-mean accuracy, by which random-feature backends are judged (common.judged_accuracy:
one draw is a lottery; softmax and relu-identity have no draws and use their exact test_acc), and on
the training draw, the accuracy with the features the model finished training with. The baseline
softmax+ape, and the softmax+pe of a same-encoding gap, is the one with the same qk_norm, else
qk_norm none (the tables say which). Intervals are t-based (rpevit.analysis.stats): Welch for
differences, Fieller for G; the groups are independent seeds (no pairing is assumed).

Verdicts: one Holm family per configuration and accuracy: the gap, and per encoding its G (tested
as G = 0, i.e. Welch's test of the gain) and its same-encoding gap, k = 1 + 2 x encodings. Each is
judged on its interval at its Holm level (stats.judge_family); an effect is claimed only where that
interval excludes 0, else "not resolved with n seeds". G is judged only where the gap itself is
resolved and positive at its Holm level; there a G interval above 0 "narrows" the gap, and is read
against 1 as well (its bound against 1 is Welch's test of b + pe against softmax + ape at the same
level): below 1 "not fully", above 1 "overshoots", else "G = 1 not excluded", which is no evidence of
closing the gap (no test of closing is defined). A resolved gain without such a G raises or lowers
b + ape, saying why: no resolved gap, or G unbounded at its (stricter) Holm level. Where the gap has an
interval but is not resolved at its Holm level, G at 95% is still shown, labelled exploratory (table:
compute.EXPLORATORY_G; figure: a dashed outline). With one seed nothing is claimed; G is then shown
without an interval when the gap is at least MIN_GAP.

Rows written before a column existed read as NaN (shown as —). Writes gap_closure.md and
gap_closure.png into RESULTS_DIR. The numbers are computed in compute.py, written in words and tables
in text.py and drawn in figure.py; this module joins them (`build`).
"""
from __future__ import annotations

from pathlib import Path

from rpevit.analysis.common import VARIANT, devices_text, read_trials, script_main
from rpevit.analysis.gap_closure.compute import (DRAW_MEAN, FIDELITY, MIN_GAP, SOURCES, TRAIN_DRAW, Assessment,
                                                 Closure, Config, Gap, accuracies, assess, effect, float_list,
                                                 measure, per_seed)
from rpevit.analysis.gap_closure.figure import G_AXIS_LIMIT, draw_bar, gap_closure_title, plot_gap_closure
from rpevit.analysis.gap_closure.text import closure_section, count_text, dataset_section, disagreement, verdict


def build(results_dir: Path) -> str | None:
    """Markdown section (and gap_closure.png) for the train trials under results_dir; None if there are none."""
    trials = read_trials(results_dir, ["train"]).without_rotation_study()
    frame = trials.frame
    if frame.empty or "test_acc" not in frame.columns:
        return None
    seeds = per_seed(frame)
    assessed = assess(seeds)
    parts = ["## Accuracy and gap closure", "", trials.note(), ""]
    for dataset in sorted(seeds["dataset"].unique()):
        parts += dataset_section(dataset, frame, seeds, assessed)
    if any(a.closures for a in assessed[TRAIN_DRAW].values()):
        parts += closure_section(assessed)
        plot_gap_closure(assessed, results_dir / "gap_closure.png", devices_text(frame))
    return "\n".join(parts)


def main() -> None:
    script_main(__doc__, build, "gap_closure.md", "Gap closure", "train trials with test_acc")


__all__ = ["DRAW_MEAN", "FIDELITY", "G_AXIS_LIMIT", "MIN_GAP", "SOURCES", "TRAIN_DRAW", "VARIANT", "Assessment",
           "Closure", "Config", "Gap", "accuracies", "assess", "build", "count_text", "disagreement", "draw_bar",
           "effect", "float_list", "main", "measure", "per_seed", "gap_closure_title", "plot_gap_closure", "verdict"]
