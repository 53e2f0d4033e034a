"""How much of the softmax-vs-Performer accuracy gap each position encoding closes, draw-aware.

    python analysis/gap_closure.py RESULTS_DIR

A variant is (dataset, attention, pe, qk_norm, redraw): qk_norm is 'none' or 'l2', redraw a label
('off' when redraw_interval is 0 or the attention draws no random features, else 'every N until F').
Per dataset, from the current `train` trials (rows listed in each folder's space.json):

- a verdict per Performer configuration (backend b, qk_norm, redraw), generated from the numbers;
- accuracy per variant: the training-draw test_acc and, over `eval_draws` fresh random-feature
  draws, their mean / std / min, the accuracy of the draw-averaged probabilities, and the same
  weights evaluated with exact softmax attention, each mean [95% bootstrap interval] over seeds;
- attention fidelity: mean total-variation distance of the attention rows to exact softmax rows;
- for each Performer configuration and encoding pe (every pe but ape)

    G = (acc[b + pe] - acc[b + ape]) / (acc[softmax + ape] - acc[b + ape])

  on the training-draw accuracy and on the draw-mean accuracy side by side (0: no better than
  ape, 1: the whole gap closed, > 1: better than softmax + ape). A single training draw can be
  lucky or unlucky; the draw mean is what the trained weights give on average over draws. The
  deterministic backends (softmax, relu-identity) have no draws: their test_acc is exact and
  serves as their draw-mean accuracy. The baseline softmax+ape is the one with the same qk_norm,
  else qk_norm none (the table says which). Intervals resample the seeds of the three variants
  independently (conservative: no pairing is assumed). G is left undefined, and the table says
  why, when the gap is not resolved: its 95% interval reaches 0 or lies below it, or (one seed,
  no interval) it is below MIN_GAP.

Rows written before a column existed read as NaN (shown as —). Writes gap_closure.md and
gap_closure.png into RESULTS_DIR.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis.common import (VARIANT, bootstrap, column, fmt, interval, judged_accuracy, markdown_table,
                                    mean_interval, pyplot, read_trials, save_figure, script_main, with_variant)

BASELINE_ATTENTION, BASELINE_PE = "softmax", "ape"
MIN_GAP = 0.005  # 0.5 points of accuracy: below it a single-seed gap is not distinguishable from noise
TRAIN_DRAW, DRAW_MEAN = "test_acc", "acc_draw"  # the two accuracies G is computed on
SHORT = {TRAIN_DRAW: "training draw", DRAW_MEAN: "draw mean"}
SOURCES = {TRAIN_DRAW: "training draw (`test_acc`)", DRAW_MEAN: "draw mean (`test_acc_draw_mean`)"}
SOURCE_NOTE = ("Training draw: accuracy with the random features the model finished training with. Draw mean: "
               "mean accuracy over fresh draws (softmax and relu-identity: their exact test_acc). Gaps and gains "
               "in accuracy points.")
ACCURACY_COLUMNS = {"test_acc": "test acc (training draw)", "test_acc_draw_mean": "draw mean",
                    "test_acc_draw_std": "draw std (mean over seeds)", "test_acc_draw_min": "draw min",
                    "test_acc_draw_ensemble": "draw ensemble", "test_acc_softmax_swap": "softmax swap"}
FIDELITY, PER_LAYER = "attn_tv_to_softmax", "attn_tv_per_layer"
GAP_OUTCOME = {"resolved": "a gap", "zero": "no gap to close", "ahead": "{backend}+ape ahead of softmax+ape",
               "missing": "not measured"}
# Effect of an encoding, read off its G interval, in the order the verdict lists them, with the phrase it uses.
EFFECT_PHRASE = {"fully closes": "fully closes it (G interval at or above 1)",
                 "closes": "closes it (G interval above 0 and reaching 1)",
                 "partly closes": "partly closes it (G interval between 0 and 1)",
                 "widens": "widens it",
                 "no clear effect": "no clear effect (G interval includes 0)",
                 "no interval (one seed)": "no interval (one seed)"}
EFFECT_ORDER = tuple(EFFECT_PHRASE)

Variant = tuple[str, str, str, str, str]  # VARIANT values
Config = tuple[str, str, str, str]  # (dataset, backend, qk_norm, redraw): one Performer configuration
Accuracies = dict[Variant, np.ndarray]


# ---------------------------------------------------------------- per-seed numbers
def per_seed(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, seed), metrics averaged over repeated seeds; missing columns are NaN.
    Adds DRAW_MEAN: test_acc_draw_mean, or test_acc where the attention draws no random features."""
    frame = with_variant(frame)
    metrics = [*ACCURACY_COLUMNS, FIDELITY]
    for name in metrics:
        frame[name] = pd.to_numeric(column(frame, name), errors="coerce")
    frame[DRAW_MEAN] = judged_accuracy(frame)
    return frame.groupby([*VARIANT, "seed"])[[*metrics, DRAW_MEAN]].mean().reset_index()


def accuracies(seeds: pd.DataFrame, metric: str = TRAIN_DRAW) -> Accuracies:
    """Variant -> finite values of metric over its seeds (variants without any are left out)."""
    out = {}
    for key, g in seeds.groupby(list(VARIANT)):
        values = g[metric].to_numpy(float)
        if np.isfinite(values).any():
            out[key] = values[np.isfinite(values)]
    return out


# ---------------------------------------------------------------- gap and closure
@dataclass
class Gap:
    """acc[softmax + ape] - acc[b + ape] of one configuration on one accuracy, and whether it is resolved."""

    point: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    baseline: str = "—"  # which softmax+ape: 'softmax+ape (qk_norm l2)'
    state: str = "missing"  # resolved | zero (interval reaches 0) | ahead (b+ape above softmax+ape) | missing
    why: str = ""

    def text(self, backend: str) -> str:
        """'gap softmax+ape − favor+ape = 11 points [9.6, 12]' (or 'points (no interval)' with one seed)."""
        point, _, rest = interval(self.point, self.lo, self.hi, scale=100).partition(" ")
        return f"gap softmax+ape − {backend}+ape = {point} points{' ' + rest if rest else ''}"


@dataclass
class Closure:
    """G of one encoding on one accuracy: point, interval, gain over b+ape, and the plain-language effect."""

    G: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    gain: float = math.nan
    effect: str = "G undefined"


def gap_closure(pe_acc: np.ndarray, perf_ape: np.ndarray, soft_ape: np.ndarray) -> float:
    gap = soft_ape.mean() - perf_ape.mean()
    return (pe_acc.mean() - perf_ape.mean()) / gap if gap != 0 else math.nan


def baseline(acc: Accuracies, dataset: str, qk_norm: str) -> tuple[Variant | None, str]:
    """softmax+ape with the same qk_norm, else with qk_norm none: the exact-attention reference."""
    for qk in dict.fromkeys((qk_norm, "none")):
        key = (dataset, BASELINE_ATTENTION, BASELINE_PE, qk, "off")
        if key in acc:
            return key, f"softmax+ape (qk_norm {qk})"
    return None, "—"


def gap_state(point: float, lo: float, hi: float) -> tuple[str, str]:
    """(state, why): resolved only when the interval lies above 0 (one seed: point >= MIN_GAP)."""
    if math.isfinite(lo):
        if lo > 0:
            return "resolved", ""
        return ("ahead", "95% interval below 0") if hi < 0 else ("zero", "95% interval reaches 0")
    if point >= MIN_GAP:
        return "resolved", ""
    if point <= -MIN_GAP:
        return "ahead", "below 0, one seed"
    return "zero", f"< {100 * MIN_GAP:g} points with one seed"


def measure_gap(acc: Accuracies, config: Config) -> Gap:
    dataset, backend, qk_norm, redraw = config
    soft_key, label = baseline(acc, dataset, qk_norm)
    base = acc.get((dataset, backend, BASELINE_PE, qk_norm, redraw))
    if soft_key is None or base is None:
        return Gap(baseline=label, why=f"no {'softmax' if soft_key is None else backend}+ape accuracy")
    point, lo, hi = bootstrap([acc[soft_key], base], lambda s, b: s.mean() - b.mean())
    return Gap(point, lo, hi, label, *gap_state(point, lo, hi))


def effect(G: float, lo: float, hi: float) -> str:
    """From the G interval: fully closes (all of it >= 1), closes (above 0, reaching 1), partly closes (inside
    (0, 1)), widens (below 0), or no clear effect (includes 0). Only the interval decides, never G alone."""
    if not math.isfinite(lo):
        return "no interval (one seed)"
    if lo >= 1:
        return "fully closes"
    if lo > 0:
        return "closes" if hi >= 1 else "partly closes"
    return "widens" if hi < 0 else "no clear effect"


def measure_closure(acc: Accuracies, config: Config, pe: str, gap: Gap) -> Closure:
    dataset, backend, qk_norm, redraw = config
    base = acc.get((dataset, backend, BASELINE_PE, qk_norm, redraw))
    values = acc.get((dataset, backend, pe, qk_norm, redraw))
    if base is None or values is None:
        return Closure(effect="not measured")
    if gap.state != "resolved":
        return Closure(gain=values.mean() - base.mean())
    soft = acc[baseline(acc, dataset, qk_norm)[0]]
    G, lo, hi = bootstrap([values, base, soft], gap_closure)
    return Closure(G, lo, hi, values.mean() - base.mean(), effect(G, lo, hi))


def configurations(acc: Accuracies) -> dict[Config, list[str]]:
    """Each Performer configuration -> its encodings other than ape (from the training-draw accuracies)."""
    configs: dict[Config, list[str]] = {}
    for dataset, attention, pe, qk_norm, redraw in sorted(acc):
        if attention != BASELINE_ATTENTION:
            pes = configs.setdefault((dataset, attention, qk_norm, redraw), [])
            if pe != BASELINE_PE:
                pes.append(pe)
    return configs


@dataclass
class Assessment:
    """One configuration on one accuracy: its gap and the closure of each encoding."""

    gap: Gap
    closures: dict[str, Closure]


def assess(seeds: pd.DataFrame) -> dict[str, dict[Config, Assessment]]:
    """accuracy source -> configuration -> Assessment, over the configurations the training draw has."""
    accs = {metric: accuracies(seeds, metric) for metric in SOURCES}
    out: dict[str, dict[Config, Assessment]] = {metric: {} for metric in SOURCES}
    for config, pes in configurations(accs[TRAIN_DRAW]).items():
        for metric, acc in accs.items():
            gap = measure_gap(acc, config)
            if metric == DRAW_MEAN and gap.state == "missing":
                gap.why += " (rows written before draw-aware evaluation, or eval_draws 0)"
            out[metric][config] = Assessment(gap, {pe: measure_closure(acc, config, pe, gap) for pe in pes})
    return out


# ---------------------------------------------------------------- verdict
def effect_list(assessment: Assessment, backend: str) -> str:
    """'closes it: rope (G 0.45 [0.3, 0.6]); widens it: ...', or why G is not computed."""
    gap = assessment.gap
    if gap.state == "missing":
        return f"not measured ({gap.why})"
    if gap.state == "zero":
        return f"no gap to close at this schedule: {gap.text(backend)} ({gap.why})"
    if gap.state == "ahead":
        return f"no gap to close: {backend}+ape is ahead of softmax+ape, {gap.text(backend)}"
    groups = {e: [f"{pe} (G {interval(c.G, c.lo, c.hi)})" for pe, c in assessment.closures.items() if c.effect == e]
              for e in EFFECT_ORDER}
    said = [f"{EFFECT_PHRASE[e]}: {', '.join(pes)}" for e, pes in groups.items() if pes]
    return f"{gap.text(backend)}; " + ("; ".join(said) if said else "no encoding other than ape measured")


def outcome(assessment: Assessment, backend: str, pe: str | None = None) -> str:
    """Short label of the gap (pe None) or of one encoding's effect, for spotting disagreements."""
    state = assessment.gap.state
    if pe is None or state != "resolved":
        return GAP_OUTCOME[state].format(backend=backend)
    return assessment.closures[pe].effect


def disagreement(train: Assessment, draw: Assessment, backend: str) -> str:
    """Where the training-draw and draw-mean verdicts differ, in words."""
    if draw.gap.state == "missing":
        return "draw mean not measured: nothing to compare"
    gap_train, gap_draw = outcome(train, backend), outcome(draw, backend)
    if gap_train != gap_draw:
        return f"the two disagree on the gap: {gap_train} on the training draw, {gap_draw} on the draw mean"
    differ = [f"{pe} ({outcome(train, backend, pe)} vs {outcome(draw, backend, pe)})" for pe in train.closures
              if outcome(train, backend, pe) != outcome(draw, backend, pe)]
    if differ:
        return "the two disagree (training draw vs draw mean) on: " + ", ".join(differ)
    return "training draw and draw mean agree"


def count_text(values: list, unit: str) -> str:
    """'3 seeds', '2–3 seeds'; for the verdict header."""
    if not values:
        return f"{unit} not recorded"
    lo, hi = min(values), max(values)
    return f"{fmt(lo)} {unit}" if lo == hi else f"{fmt(lo)}–{fmt(hi)} {unit}"


def verdict(dataset: str, frame: pd.DataFrame, seeds: pd.DataFrame, assessed: dict[str, dict[Config, Assessment]]
            ) -> str:
    """Plain-language verdict for one dataset, every sentence generated from the numbers."""
    ds_seeds = seeds[seeds["dataset"] == dataset]
    n_seeds = ds_seeds.dropna(subset=[TRAIN_DRAW]).groupby(list(VARIANT)).size().tolist()
    epochs = pd.to_numeric(column(frame[frame["dataset"] == dataset], "epochs"), errors="coerce").dropna()
    lines = [f"### {dataset}: verdict ({count_text(n_seeds, 'seeds')} per variant, "
             f"{count_text(sorted(set(epochs.astype(int))), 'epochs')})", ""]
    configs = [c for c in assessed[TRAIN_DRAW] if c[0] == dataset]
    if not configs:
        return "\n".join(lines + ["No Performer variant in these rows: nothing to compare with softmax.", ""])
    for config in configs:
        _, backend, qk_norm, redraw = config
        train, draw = assessed[TRAIN_DRAW][config], assessed[DRAW_MEAN][config]
        lines += [f"- **{backend}, qk_norm {qk_norm}, redraw {redraw}** (baseline {train.gap.baseline})",
                  f"  - {SOURCES[TRAIN_DRAW]}: {effect_list(train, backend)}.",
                  f"  - {SOURCES[DRAW_MEAN]}: {effect_list(draw, backend)}.",
                  f"  - {disagreement(train, draw, backend)}."]
    return "\n".join(lines + [""])


# ---------------------------------------------------------------- tables
def accuracy_table(seeds: pd.DataFrame) -> str:
    """Per variant: every accuracy, mean [95% interval] over seeds, in %."""
    rows = [[*key[1:], int(g[TRAIN_DRAW].notna().sum()),
             *(mean_interval(g[c].to_numpy(float), scale=100, digits=4) for c in ACCURACY_COLUMNS)]
            for key, g in seeds.groupby(list(VARIANT))]
    return markdown_table([*VARIANT[1:], "seeds", *(f"{label} %" for label in ACCURACY_COLUMNS.values())], rows)


def float_list(value: object) -> np.ndarray | None:
    """A per-layer list as floats, or None. Rows written before results had a typed schema
    (`rpevit.sweep.results`) hold the list as its printed text, '[0.5, 0.4]' or numpy's '[0. 0.]'."""
    if isinstance(value, str):
        try:
            value = [float(x) for x in value.strip().removeprefix("[").removesuffix("]").replace(",", " ").split()]
        except ValueError:
            return None
    if isinstance(value, (list, tuple, np.ndarray)) and len(value):
        return np.asarray(value, dtype=float)
    return None


def per_layer_text(values: pd.Series) -> str:
    """Per-layer TV averaged over the variant's rows, e.g. '0.12, 0.3'; — when no row has it."""
    arrays = [a for a in map(float_list, values) if a is not None]
    if not arrays:
        return "—"
    if len({len(a) for a in arrays}) > 1:
        return "layer counts differ"
    return ", ".join(fmt(x, 2) for x in np.nanmean(np.vstack(arrays), axis=0))


def fidelity_table(frame: pd.DataFrame, seeds: pd.DataFrame) -> str:
    """Per variant: mean TV distance of the attention rows to exact softmax rows (0 = softmax itself)."""
    if not seeds[FIDELITY].notna().any():
        return f"_no {FIDELITY} in these rows (written before attention fidelity was measured)_"
    layers = with_variant(frame).assign(**{PER_LAYER: column(frame, PER_LAYER)}).groupby(list(VARIANT))[PER_LAYER]
    rows = [[*key[1:], int(g[FIDELITY].notna().sum()), mean_interval(g[FIDELITY].to_numpy(float)),
             per_layer_text(layers.get_group(key)) if key in layers.groups else "—"]
            for key, g in seeds.groupby(list(VARIANT))]
    return markdown_table([*VARIANT[1:], "seeds", "TV to softmax [95% interval]", "TV per layer (mean)"], rows)


def gap_note(gaps: dict[str, Gap]) -> str:
    """Why G is undefined on either accuracy, for the table's note column."""
    notes = [f"{SHORT[m]}: " + (f"G undefined, gap {100 * g.point:+.2f} points ({g.why})"
                                                 if g.state in ("zero", "ahead") else g.why)
             for m, g in gaps.items() if g.state != "resolved"]
    return "; ".join(notes)


def gap_table(assessed: dict[str, dict[Config, Assessment]]) -> str:
    """G and gap on the training draw and on the draw mean, one row per (configuration, pe)."""
    rows = []
    for config, train in assessed[TRAIN_DRAW].items():
        draw = assessed[DRAW_MEAN][config]
        for pe, closure in train.closures.items():
            other = draw.closures[pe]
            rows.append([config[0], config[1], config[2], config[3], pe, train.gap.baseline,
                         interval(closure.G, closure.lo, closure.hi), interval(other.G, other.lo, other.hi),
                         interval(train.gap.point, train.gap.lo, train.gap.hi, scale=100),
                         interval(draw.gap.point, draw.gap.lo, draw.gap.hi, scale=100),
                         fmt(100 * closure.gain, 3), fmt(100 * other.gain, 3),
                         gap_note({TRAIN_DRAW: train.gap, DRAW_MEAN: draw.gap})])
    return markdown_table(["dataset", "backend b", "qk_norm", "redraw", "pe", "baseline",
                           "G training draw [95%]", "G draw mean [95%]", "gap training draw (points)",
                           "gap draw mean (points)", "gain training draw (points)", "gain draw mean (points)",
                           "note"], rows)


def build(results_dir: Path) -> str | None:
    """Markdown section (and gap_closure.png) for the train trials under results_dir; None if there are none."""
    trials = read_trials(results_dir, ["train"])
    frame = trials.frame
    if frame.empty or "test_acc" not in frame.columns:
        return None
    seeds = per_seed(frame)
    assessed = assess(seeds)
    parts = ["## Accuracy and gap closure", "", trials.note(), ""]
    for dataset in sorted(seeds["dataset"].unique()):
        ds = seeds[seeds["dataset"] == dataset]
        parts += [verdict(dataset, frame, seeds, assessed),
                  f"### {dataset}: accuracy per variant (%), mean [95% bootstrap interval] over seeds", "",
                  accuracy_table(ds), "",
                  f"### {dataset}: attention fidelity, mean total-variation distance to exact softmax rows", "",
                  fidelity_table(frame[frame["dataset"] == dataset], ds), ""]
    if any(a.closures for a in assessed[TRAIN_DRAW].values()):
        parts += ["### Gap closure G = (acc[b+pe] - acc[b+ape]) / (acc[softmax+ape] - acc[b+ape])", "",
                  SOURCE_NOTE, "", gap_table(assessed), "", "![gap closure](gap_closure.png)", ""]
        plot_gap_closure(assessed, results_dir / "gap_closure.png")
    return "\n".join(parts)


# ---------------------------------------------------------------- figure
G_AXIS_LIMIT = 5.0


def plot_gap_closure(assessed: dict[str, dict[Config, Assessment]], path: Path) -> Path:
    """Bars of G per configuration and pe, one panel per dataset: training draw solid, draw mean hatched;
    undefined G drawn as an 'n/a' label. The axis stops at +-G_AXIS_LIMIT, so one tiny gap's huge interval does not
    flatten every other bar; an interval end beyond it is written at the edge."""
    plt = pyplot()
    datasets = sorted({c[0] for c in assessed[TRAIN_DRAW]})
    widest = max(sum(c[0] == d for c in assessed[TRAIN_DRAW]) for d in datasets)
    fig, axes = plt.subplots(1, len(datasets), figsize=(max(6.5, 1.8 * widest) * len(datasets), 5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        configs = [c for c in assessed[TRAIN_DRAW] if c[0] == dataset]
        ax.set_ylim(-G_AXIS_LIMIT, G_AXIS_LIMIT)
        pes = sorted({pe for c in configs for pe in assessed[TRAIN_DRAW][c].closures})
        width = 0.8 / max(1, 2 * len(pes))
        labelled: set[str] = set()
        for i, config in enumerate(configs):
            for j, pe in enumerate(pes):
                for k, (metric, hatch) in enumerate(((TRAIN_DRAW, None), (DRAW_MEAN, "//"))):
                    closure = assessed[metric][config].closures.get(pe)
                    if closure is None:
                        continue
                    xpos = i + (2 * j + k - (2 * len(pes) - 1) / 2) * width
                    label = f"{pe} ({'training draw' if k == 0 else 'draw mean'})"
                    if draw_bar(ax, xpos, width, closure, f"C{j}", hatch, None if label in labelled else label):
                        labelled.add(label)
        ax.axhline(0, color="k", lw=0.8)
        ax.axhline(1, color="k", lw=0.8, ls="--")
        ticks = [f"{b}\nqk {q}\nredraw {r}".replace(" until", "\nuntil") for _, b, q, r in configs]
        ax.set_xticks(range(len(configs)), ticks, fontsize=7)
        ax.set_ylabel("gap closure G (1 = softmax+ape reached)")
        ax.set_title(f"{dataset}: G per Performer configuration and pe (95% CI)")
        if labelled:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save_figure(fig, path)


def draw_bar(ax, xpos: float, width: float, closure: Closure, color: str, hatch: str | None, label: str | None) -> bool:
    """One G bar with its interval, or an 'n/a' label; True if a bar (and so its legend label) was drawn."""
    if not math.isfinite(closure.G):
        ax.text(xpos, 0.02, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
        return False
    err = [[closure.G - closure.lo], [closure.hi - closure.G]] if math.isfinite(closure.lo) else None
    ax.bar(xpos, closure.G, width, yerr=err, capsize=2, color=color, hatch=hatch,
           alpha=0.6 if hatch else 1.0, label=label)
    for end in (closure.lo, closure.hi):
        if math.isfinite(end) and abs(end) > G_AXIS_LIMIT:
            ax.annotate(f"{end:.3g}", (xpos, math.copysign(G_AXIS_LIMIT, end)), xytext=(2, 0),
                        textcoords="offset points", ha="left", va="top" if end > 0 else "bottom", fontsize=6,
                        rotation=90, annotation_clip=False)
    return True


def main() -> None:
    script_main(__doc__, build, "gap_closure.md", "Gap closure", "train trials with test_acc")


if __name__ == "__main__":
    main()
