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
interval excludes 0, else "not resolved with n seeds". G is defined only where the gap itself is
resolved and positive; there, G's Holm interval is read against 1 as well (its bound against 1 is
Welch's test of b + pe against softmax + ape at the same level). With one seed nothing is claimed;
G is then shown without an interval when the gap is at least MIN_GAP.

Rows written before a column existed read as NaN (shown as —). Writes gap_closure.md and
gap_closure.png into RESULTS_DIR.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis.common import (VARIANT, column, fmt, judged_accuracy, markdown_table, pyplot, read_trials,
                                    save_figure, script_main, with_variant)
from rpevit.analysis.stats import (Comparison, Interval, Judged, closure_ratio, judge_family, mean_interval, seeds_text,
                                   welch)

BASELINE_ATTENTION, BASELINE_PE = "softmax", "ape"
MIN_GAP = 0.005  # 0.5 points of accuracy: below it a single-seed gap gets no G (one seed has no interval)
TRAIN_DRAW, DRAW_MEAN = "test_acc", "acc_draw"  # the two accuracies G is computed on
SHORT = {DRAW_MEAN: "draw mean", TRAIN_DRAW: "training draw"}
SOURCES = {DRAW_MEAN: "draw mean, judged (`test_acc_draw_mean`)", TRAIN_DRAW: "training draw (`test_acc`)"}
SOURCE_NOTE = ("Draw mean: mean accuracy over fresh draws (softmax and relu-identity: their exact test_acc); "
               "random-feature backends are judged on it. Training draw: accuracy with the random features the "
               "model finished training with. Gaps and gains in accuracy points; every interval is 95% (t-based: "
               "Welch for differences, Fieller for G) with the seed counts n of its groups (G: b+pe, b+ape, "
               "softmax+ape). The Holm columns judge each comparison at its Holm level within the family of its "
               "configuration and accuracy (k comparisons): an effect is claimed only where that interval "
               "excludes 0.")
ACCURACY_COLUMNS = {"test_acc": "test acc (training draw)", "test_acc_draw_mean": "draw mean",
                    "test_acc_draw_std": "draw std (mean over seeds)", "test_acc_draw_min": "draw min",
                    "test_acc_draw_ensemble": "draw ensemble", "test_acc_softmax_swap": "softmax swap"}
FIDELITY, PER_LAYER = "attn_tv_to_softmax", "attn_tv_per_layer"
GAP_OUTCOME = {"resolved": "a gap", "not resolved": "gap not resolved", "ahead": "{backend}+ape ahead of softmax+ape",
               "one seed": "one seed", "missing": "not measured"}
NO_INTERVAL = "no interval (one seed)"
# Effect of an encoding, in the order the verdict lists them, with the phrase it uses ({b}: the backend).
EFFECT_PHRASE = {"more than closes": "more than closes it (G interval above 1)",
                 "closes": "closes it (G interval above 0, reaching 1)",
                 "partly closes": "closes part of it (G interval between 0 and 1)",
                 "widens": "widens it (G interval below 0)",
                 "raises": "raises {b}+ape (no resolved gap for a G)",
                 "lowers": "lowers {b}+ape (no resolved gap for a G)",
                 "not resolved": "{effect} (Holm interval includes 0)",
                 NO_INTERVAL: NO_INTERVAL,
                 "not measured": "not measured"}
EFFECT_ORDER = tuple(EFFECT_PHRASE)
GAP = "gap"  # the key of the gap in a Holm family (encodings: ("G", pe) and ("same", pe))

Variant = tuple[str, str, str, str, str]  # VARIANT values
Config = tuple[str, str, str, str]  # (dataset, backend, qk_norm, redraw): one Performer configuration
Accuracies = dict[Variant, np.ndarray]
NONE = Interval(math.nan)


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
    """acc[softmax + ape] - acc[b + ape] of one configuration on one accuracy, and its Holm verdict."""

    judged: Judged | None = None
    baseline: str = "—"  # which softmax+ape: 'softmax+ape (qk_norm l2)'
    state: str = "missing"  # resolved | not resolved | ahead (b+ape above softmax+ape) | one seed | missing
    why: str = ""

    @property
    def nominal(self) -> Interval:
        return self.judged.nominal if self.judged else NONE

    @property
    def point(self) -> float:
        return self.nominal.point

    def text(self, backend: str, holm: bool = True) -> str:
        """'gap softmax+ape − favor+ape (points) = 0.47 [-0.3, 1.2] (n=3,3; 99.5%)', Holm level or 95%."""
        shown = self.judged.interval if holm and self.judged else self.nominal
        return f"gap softmax+ape − {backend}+ape (points) = {shown.text(scale=100)}"


@dataclass
class Closure:
    """One encoding on one accuracy: G, the gain over b+ape and the same-encoding gap at 95% (nominal),
    their Holm verdicts, and the plain-language effect."""

    G: Interval = NONE
    gain: Interval = NONE
    same: Interval = NONE
    same_ref: str = "—"  # which softmax+pe: 'softmax+rope (qk_norm none)'
    G_holm: Judged | None = None  # G (its p: Welch's test of the gain) at its Holm level
    gain_holm: Interval = NONE  # the gain at G's Holm level
    same_holm: Judged | None = None
    effect: str = "not measured"


def softmax_reference(acc: Accuracies, dataset: str, pe: str, qk_norm: str) -> tuple[Variant | None, str]:
    """softmax+pe with the same qk_norm: the exact-attention reference, like with like. None where the
    study has no such row (a qk_norm l2 backend is never compared with softmax without it: that would
    measure qk_norm and the backend at once)."""
    key = (dataset, BASELINE_ATTENTION, pe, qk_norm, "off")
    if key in acc:
        return key, f"softmax+{pe} (qk_norm {qk_norm})"
    return None, f"— (no softmax+{pe} with qk_norm {qk_norm})"


def baseline(acc: Accuracies, dataset: str, qk_norm: str) -> tuple[Variant | None, str]:
    """softmax+ape with the same qk_norm (none: no gap is measured for this configuration)."""
    return softmax_reference(acc, dataset, BASELINE_PE, qk_norm)


def gap_state(judged: Judged) -> tuple[str, str]:
    """(state, why) from the gap's Holm verdict: resolved (> 0), ahead (< 0), not resolved; one seed."""
    if not math.isfinite(judged.nominal.p):
        return "one seed", "one seed: no interval"
    if judged.resolved:
        return ("resolved", "") if judged.interval.point > 0 else ("ahead", "Holm interval below 0")
    return "not resolved", f"not resolved with {seeds_text(judged.interval.n)}: Holm interval includes 0"


def effect(gap: Gap, G: Judged, gain: Interval) -> str:
    """An encoding's effect from its Holm verdict: only a resolved G = 0 test (G interval, equivalently
    the gain's, excludes 0) is an effect. With a resolved gap and a bounded G interval it is read as
    a closure (against 0 and 1); otherwise as raising or lowering b+ape."""
    if not math.isfinite(G.nominal.p):
        return NO_INTERVAL
    if not G.resolved:
        return f"not resolved with {seeds_text(G.interval.n)}"
    up = gain.point > 0
    if gap.state == "resolved" and G.interval.bounded:
        if not up:
            return "widens"
        return "more than closes" if G.interval.lo > 1 else "partly closes" if G.interval.hi < 1 else "closes"
    return "raises" if up else "lowers"


def effect_phrase(effect_word: str, backend: str) -> str:
    """The verdict's phrase for an effect word (its EFFECT_PHRASE entry, with the backend and seed counts)."""
    category = next(e for e in EFFECT_ORDER if effect_word.startswith(e))
    return EFFECT_PHRASE[category].format(b=backend, effect=effect_word)


@dataclass
class Assessment:
    """One configuration on one accuracy: its gap, each encoding's closure, and its Holm family size k."""

    gap: Gap
    closures: dict[str, Closure] = field(default_factory=dict)
    k: int = 0


def family(acc: Accuracies, config: Config, pes: list[str]) -> tuple[dict[object, Comparison], dict[str, str]]:
    """The comparisons of one verdict family (the gap, each encoding's G and same-encoding gap) and
    each encoding's softmax reference label."""
    dataset, backend, qk_norm, redraw = config
    soft = acc[baseline(acc, dataset, qk_norm)[0]]
    base = acc[(dataset, backend, BASELINE_PE, qk_norm, redraw)]
    comparisons: dict[object, Comparison] = {GAP: partial(welch, soft, base)}
    refs = {}
    for pe in pes:
        values = acc.get((dataset, backend, pe, qk_norm, redraw))
        if values is None:
            continue
        comparisons[("G", pe)] = partial(closure_ratio, values, base, soft)
        ref_key, refs[pe] = softmax_reference(acc, dataset, pe, qk_norm)
        if ref_key is not None:
            comparisons[("same", pe)] = partial(welch, acc[ref_key], values)
    return comparisons, refs


def measure(acc: Accuracies, config: Config, pes: list[str]) -> Assessment:
    """One configuration on one accuracy: its Holm family judged, the gap's state, each encoding's closure."""
    dataset, backend, qk_norm, redraw = config
    soft_key, label = baseline(acc, dataset, qk_norm)
    base = acc.get((dataset, backend, BASELINE_PE, qk_norm, redraw))
    if soft_key is None or base is None:
        gap = Gap(baseline=label, why=f"no {'softmax' if soft_key is None else backend}+ape accuracy")
        return Assessment(gap, {pe: Closure() for pe in pes})
    comparisons, refs = family(acc, config, pes)
    judged = judge_family(comparisons)
    gap = Gap(judged[GAP], label, *gap_state(judged[GAP]))
    with_G = ((gap.state in ("resolved", "not resolved") and gap.point > 0)
              or (gap.state == "one seed" and gap.point >= MIN_GAP))
    closures = {}
    for pe in pes:
        G = judged.get(("G", pe))
        if G is None:
            closures[pe] = Closure()
            continue
        values = acc[(dataset, backend, pe, qk_norm, redraw)]
        gain_holm = welch(values, base, G.interval.level)
        same = judged.get(("same", pe))
        closures[pe] = Closure(G.nominal if with_G else NONE, welch(values, base), same.nominal if same else NONE,
                               refs[pe], G, gain_holm, same, effect(gap, G, gain_holm))
    return Assessment(gap, closures, judged[GAP].k)


def configurations(acc: Accuracies) -> dict[Config, list[str]]:
    """Each Performer configuration -> its encodings other than ape (from the training-draw accuracies)."""
    configs: dict[Config, list[str]] = {}
    for dataset, attention, pe, qk_norm, redraw in sorted(acc):
        if attention != BASELINE_ATTENTION:
            pes = configs.setdefault((dataset, attention, qk_norm, redraw), [])
            if pe != BASELINE_PE:
                pes.append(pe)
    return configs


def assess(seeds: pd.DataFrame) -> dict[str, dict[Config, Assessment]]:
    """accuracy source -> configuration -> Assessment, over the configurations the training draw has."""
    accs = {metric: accuracies(seeds, metric) for metric in SOURCES}
    out: dict[str, dict[Config, Assessment]] = {metric: {} for metric in SOURCES}
    for config, pes in configurations(accs[TRAIN_DRAW]).items():
        for metric, acc in accs.items():
            out[metric][config] = assessed = measure(acc, config, pes)
            if metric == DRAW_MEAN and assessed.gap.state == "missing":
                assessed.gap.why += " (rows written before draw-aware evaluation, or eval_draws 0)"
    return out


# ---------------------------------------------------------------- verdict
def closure_item(pe: str, closure: Closure, gap: Gap) -> str:
    """'rope (G -2 [-3.2, -1] (n=3,3,3; 99.5%))', or the gain where G is not defined."""
    if gap.state == "resolved" and closure.G_holm is not None:
        return f"{pe} (G {closure.G_holm.interval.text()})"
    return f"{pe} (gain in points {closure.gain_holm.text(scale=100)})"


def same_encoding_text(assessment: Assessment, backend: str) -> str:
    """'same-encoding gap softmax+pe − favor+pe (points): rope 1.4 [..] (n=3,3; 99.5%): softmax+rope ahead; ...'."""
    items = []
    for pe, c in assessment.closures.items():
        if c.same_holm is None:
            continue
        ref = c.same_ref.split(" ")[0]
        word = c.same_holm.word(f"{ref} ahead", f"{backend}+{pe} ahead")
        items.append(f"{pe} {c.same_holm.interval.text(scale=100)}: {word}")
    return f"same-encoding gap softmax+pe − {backend}+pe (points): " + "; ".join(items) if items else ""


SUB = "\n    - "  # a sub-bullet under an accuracy's bullet of the verdict


def effect_list(assessment: Assessment, backend: str) -> str:
    """The gap and each encoding's effect at its Holm level, or why they are not measured."""
    gap = assessment.gap
    if gap.state == "missing":
        return f"not measured ({gap.why})."
    head = {"resolved": f"{gap.text(backend)}: a gap",
            "ahead": f"no gap to close: {backend}+ape is ahead of softmax+ape, {gap.text(backend)}",
            "not resolved": f"{gap.text(backend)}: {gap.why.split(':')[0]}, so G is not defined",
            "one seed": f"{gap.text(backend)}: one seed, no interval"}[gap.state]
    head = (f"Holm over k = {assessment.k}: {head}" if assessment.k else
            f"no comparison has an interval (one seed), so nothing is Holm-corrected: {head}")
    groups: dict[str, list[str]] = {}
    for pe, c in sorted(assessment.closures.items(), key=lambda kv: EFFECT_ORDER.index(
            next(e for e in EFFECT_ORDER if kv[1].effect.startswith(e)))):
        groups.setdefault(effect_phrase(c.effect, backend), []).append(closure_item(pe, c, gap))
    said = [f"{phrase}: {', '.join(items)}" for phrase, items in groups.items()]
    same = same_encoding_text(assessment, backend)
    body = "; ".join(said) if said else "no encoding other than ape measured"
    return f"{head}.{SUB}encodings: {body}." + (f"{SUB}{same}." if same else "")


def outcome(assessment: Assessment, backend: str, pe: str | None = None) -> str:
    """Short label of the gap (pe None) or of one encoding's effect, for spotting disagreements."""
    if pe is None:
        return GAP_OUTCOME[assessment.gap.state].format(backend=backend)
    return assessment.closures[pe].effect


def disagreement(first: Assessment, second: Assessment, backend: str) -> str:
    """Where the draw-mean (first) and training-draw (second) verdicts differ, in words."""
    if first.gap.state == "missing" or second.gap.state == "missing":
        return "draw mean not measured: nothing to compare"
    gap_first, gap_second = outcome(first, backend), outcome(second, backend)
    if gap_first != gap_second:
        return f"the two disagree on the gap: {gap_first} on the draw mean, {gap_second} on the training draw"
    differ = [f"{pe} ({outcome(first, backend, pe)} vs {outcome(second, backend, pe)})" for pe in first.closures
              if outcome(first, backend, pe) != outcome(second, backend, pe)]
    if differ:
        return "the two disagree (draw mean vs training draw) on: " + ", ".join(differ)
    return "draw mean and training draw agree"


def count_text(values: list, unit: str) -> str:
    """'3 seeds', '1 seed', '2–3 seeds' (unit given in the plural); for the verdict header."""
    if not values:
        return f"{unit} not recorded"
    lo, hi = min(values), max(values)
    if lo == hi:
        return f"{fmt(lo)} {unit[:-1] if lo == 1 else unit}"
    return f"{fmt(lo)}–{fmt(hi)} {unit}"


def verdict(dataset: str, frame: pd.DataFrame, seeds: pd.DataFrame, assessed: dict[str, dict[Config, Assessment]]
            ) -> str:
    """Plain-language verdict for one dataset, every sentence generated from the numbers."""
    ds_seeds = seeds[seeds["dataset"] == dataset]
    n_seeds = ds_seeds.dropna(subset=[TRAIN_DRAW]).groupby(list(VARIANT)).size().tolist()
    epochs = pd.to_numeric(column(frame[frame["dataset"] == dataset], "epochs"), errors="coerce").dropna()
    lines = [f"### {dataset}: verdict ({count_text(n_seeds, 'seeds')} per variant, "
             f"{count_text(sorted(set(epochs.astype(int))), 'epochs')})", "",
             "Each accuracy's bullet is one Holm family of k comparisons (the gap, and per encoding G and the "
             "same-encoding gap); its intervals are at each comparison's Holm level (shown beside n, the seed "
             "counts of the groups), and an effect is claimed only where that interval excludes 0.", ""]
    configs = [c for c in assessed[TRAIN_DRAW] if c[0] == dataset]
    if not configs:
        return "\n".join(lines + ["No Performer variant in these rows: nothing to compare with softmax.", ""])
    for config in configs:
        _, backend, qk_norm, redraw = config
        draw, train = assessed[DRAW_MEAN][config], assessed[TRAIN_DRAW][config]
        lines += [f"- **{backend}, qk_norm {qk_norm}, redraw {redraw}** (baseline {train.gap.baseline})",
                  f"  - {SOURCES[DRAW_MEAN]}, {effect_list(draw, backend)}",
                  f"  - {SOURCES[TRAIN_DRAW]}, {effect_list(train, backend)}",
                  f"  - {disagreement(draw, train, backend)}."]
    return "\n".join(lines + [""])


# ---------------------------------------------------------------- tables
def accuracy_table(seeds: pd.DataFrame) -> str:
    """Per variant: every accuracy, mean [95% t interval] (n seeds), in %."""
    rows = [[*key[1:], int(g[TRAIN_DRAW].notna().sum()),
             *(mean_interval(g[c].to_numpy(float)).text(scale=100, digits=4) for c in ACCURACY_COLUMNS)]
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
    rows = [[*key[1:], int(g[FIDELITY].notna().sum()), mean_interval(g[FIDELITY].to_numpy(float)).text(),
             per_layer_text(layers.get_group(key)) if key in layers.groups else "—"]
            for key, g in seeds.groupby(list(VARIANT))]
    return markdown_table([*VARIANT[1:], "seeds", "TV to softmax [95%] (n)", "TV per layer (mean)"], rows)


def G_cell(closure: Closure, gap: Gap) -> str:
    """G [95%] (n), or why it is not defined."""
    if math.isfinite(closure.G.point):
        return closure.G.text()
    if gap.state == "missing" or closure.G_holm is None:
        return "—"
    return f"— ({GAP_OUTCOME[gap.state].format(backend='b')})"


def holm_cell(judged: Judged | None, word: str) -> str:
    return "—" if judged is None else f"{word} (k={judged.k})"


def gap_table(assessed: dict[Config, Assessment]) -> str:
    """One row per (configuration, pe) on one accuracy: gap, G, gain, same-encoding gap, Holm verdicts."""
    rows = []
    for config, a in assessed.items():
        for pe, c in a.closures.items():
            same_word = c.same_holm.word("softmax ahead", "b ahead") if c.same_holm else ""
            G_word = effect_phrase(c.effect, "b").split(" (")[0]
            if c.effect.startswith("not resolved") and a.gap.state != "resolved":
                G_word += "; G undefined: " + GAP_OUTCOME[a.gap.state].format(backend="b")
            rows.append([*config, pe, a.gap.baseline, a.gap.nominal.text(scale=100), G_cell(c, a.gap),
                         c.gain.text(scale=100), c.same_ref, c.same.text(scale=100),
                         holm_cell(c.G_holm, G_word), holm_cell(c.same_holm, same_word)])
    return markdown_table(["dataset", "backend b", "qk_norm", "redraw", "pe", "baseline",
                           "gap softmax+ape − b+ape [95%] (n)", "G [95%] (n)", "gain b+pe − b+ape [95%] (n)",
                           "same-encoding reference", "same-encoding gap softmax+pe − b+pe [95%] (n)",
                           "Holm: G (gain)", "Holm: same-encoding gap"], rows)


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
        ds = seeds[seeds["dataset"] == dataset]
        parts += [verdict(dataset, frame, seeds, assessed),
                  f"### {dataset}: accuracy per variant (%), mean [95% t interval] (n seeds)", "",
                  accuracy_table(ds), "",
                  f"### {dataset}: attention fidelity, mean total-variation distance to exact softmax rows", "",
                  fidelity_table(frame[frame["dataset"] == dataset], ds), ""]
    if any(a.closures for a in assessed[TRAIN_DRAW].values()):
        parts += ["### Gap closure G = (acc[b+pe] - acc[b+ape]) / (acc[softmax+ape] - acc[b+ape]), "
                  "beside the same-encoding gap acc[softmax+pe] - acc[b+pe]", "", SOURCE_NOTE, ""]
        for metric, label in SOURCES.items():
            parts += [f"#### On the {label}", "", gap_table(assessed[metric]), ""]
        parts += ["![gap closure](gap_closure.png)", ""]
        plot_gap_closure(assessed, results_dir / "gap_closure.png")
    return "\n".join(parts)


# ---------------------------------------------------------------- figure
G_AXIS_LIMIT = 5.0
FONT = {"tick": 9, "label": 10, "title": 11, "note": 8}  # points; the figure is ~13 in wide, shown at page width


def interval_caption(intervals: list[Interval]) -> str:
    """What the whiskers are, with the seed counts n of the groups behind them; no whiskers with one seed;
    no bars at all: why (the notes under the configurations say it for each)."""
    bounded = [iv for iv in intervals if iv.bounded]
    counts = sorted({k for iv in bounded for k in iv.n})
    if not intervals:
        return "no G bar: no configuration has a finite G on either accuracy (why: under each configuration)"
    if not bounded:
        return "no whiskers: fewer than 2 seeds in a group, so no interval"
    n = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}–{counts[-1]}"
    missing = " (none where a group has fewer than 2 seeds)" if len(bounded) < len(intervals) else ""
    return (f"whiskers: 95% Fieller interval of G, per comparison (not Holm-adjusted), n = {n} seeds per group"
            f"{missing}")


def plot_gap_closure(assessed: dict[str, dict[Config, Assessment]], path: Path) -> Path:
    """Bars of G per configuration and pe, one panel per dataset (stacked): draw mean solid, training draw
    hatched, with 95% Fieller intervals where every group has 2 or more seeds (the caption says so, with
    n). A configuration whose gap gives no G on an accuracy gets one note saying why inside its slot
    instead of a bar per encoding; a single missing G is marked 'n/a', and a G whose interval is
    unbounded (the gap not resolved at 95%) 'unbounded', without a bar: no finite bar could stand for
    it. The axis holds 0, 1 and every bar with its whiskers (g_axis_range), but stops at +-G_AXIS_LIMIT,
    so one tiny gap's huge interval does not flatten every other bar; an interval end beyond it is
    written at the edge. The legend names only what is drawn. Everything is drawn inside the axes."""
    plt = pyplot()
    datasets = sorted({c[0] for c in assessed[TRAIN_DRAW]})
    fig, axes = plt.subplots(len(datasets), 1, figsize=(13, 4.8 * len(datasets)), squeeze=False, layout="constrained")
    all_pes = sorted({pe for a in assessed[TRAIN_DRAW].values() for pe in a.closures})
    colours = {pe: f"C{j}" for j, pe in enumerate(all_pes)}
    drawn: list[Interval] = []
    kinds: set[tuple[str, str]] = set()  # (metric, pe) of every bar drawn: the legend's entries
    for ax, dataset in zip(axes[:, 0], datasets):
        configs = [c for c in assessed[TRAIN_DRAW] if c[0] == dataset]
        ax.set_xlim(-0.5, len(configs) - 0.5)
        in_panel = len(drawn)
        pes = sorted({pe for c in configs for pe in assessed[TRAIN_DRAW][c].closures})
        width = 0.8 / max(1, 2 * len(pes))
        ticks = []
        for i, config in enumerate(configs):
            notes = []
            for k, (metric, hatch) in enumerate(((DRAW_MEAN, None), (TRAIN_DRAW, "//"))):
                assessment = assessed[metric][config]
                closures = assessment.closures
                if not any(math.isfinite(c.G.point) and not c.G.unbounded for c in closures.values()):
                    notes.append(f"{SHORT[metric]}: {no_G_reason(assessment, config[1])}")
                    continue
                for j, pe in enumerate(pes):
                    if pe not in closures:
                        continue
                    xpos = i + (2 * j + k - (2 * len(pes) - 1) / 2) * width
                    if draw_bar(ax, xpos, width, closures[pe].G, colours[pe], hatch, None):
                        drawn.append(closures[pe].G)
                        kinds.add((metric, pe))
            _, b, q, r = config
            ticks.append("\n".join([b, f"qk_norm {q}", f"redraw {r}".replace(" until", "\nuntil"),
                                    *(line for note in notes for line in textwrap.wrap(f"[{note}]", 24))]))
        ax.set_ylim(*g_axis_range(drawn[in_panel:]))
        ax.axhline(0, color="k", lw=0.8)
        ax.axhline(1, color="k", lw=0.8, ls="--")
        ax.set_xticks(range(len(configs)), ticks, fontsize=FONT["tick"])
        ax.tick_params(axis="y", labelsize=FONT["tick"])
        ax.set_ylabel("gap closure G\n(1 = softmax+ape reached, 0 = b+ape)", fontsize=FONT["label"])
        ax.set_title(f"{dataset}: G of each Performer configuration b and encoding pe", fontsize=FONT["title"])
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colours[pe], label=pe) for pe in all_pes if any(k[1] == pe for k in kinds)]
    handles += [Patch(facecolor="white", edgecolor="k", label="solid: draw mean (judged)")] * any(
        k[0] == DRAW_MEAN for k in kinds)
    handles += [Patch(facecolor="white", edgecolor="k", hatch="//", label="hatched: training draw")] * any(
        k[0] == TRAIN_DRAW for k in kinds)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=FONT["tick"],
                   frameon=False)
    fig.suptitle(interval_caption(drawn), fontsize=FONT["label"])
    return save_figure(fig, path)


def g_axis_range(bars: list[Interval]) -> tuple[float, float]:
    """The G axis of a panel: 0 and 1 (the two reference lines) and each bar with its finite whisker ends,
    within +-G_AXIS_LIMIT, padded by 10% where not cut there: a small G with a small interval is readable,
    not a flat line."""
    values = [0.0, 1.0] + [v for iv in bars for v in (iv.point, iv.lo, iv.hi) if math.isfinite(v)]
    lo, hi = max(min(values), -G_AXIS_LIMIT), min(max(values), G_AXIS_LIMIT)
    pad = 0.1 * (hi - lo)
    # a side cut at the limit ends there, where draw_bar writes the whisker's true end
    return lo - pad * (lo > -G_AXIS_LIMIT), hi + pad * (hi < G_AXIS_LIMIT)


def no_G_reason(assessment: Assessment, backend: str) -> str:
    """Why a configuration shows no G bar on an accuracy, in a few words (from the gap's state)."""
    gap = assessment.gap
    if gap.state == "missing":
        return "no G, " + (gap.why.split(" (")[0] or "not measured")
    if gap.state == "one seed":
        return f"no G, one seed and a gap below {fmt(100 * MIN_GAP)} points"
    if any(c.G.unbounded for c in assessment.closures.values()):
        return "G unbounded: gap not resolved at 95%"
    return "no G, " + GAP_OUTCOME[gap.state].format(backend=backend)


def draw_bar(ax, xpos: float, width: float, G: Interval, color: str, hatch: str | None, label: str | None) -> bool:
    """One G bar with its interval, or an 'n/a' / 'unbounded' label; True if a bar (and so its legend label)
    was drawn. Whiskers only for a bounded interval (every group with 2 or more seeds)."""
    if not math.isfinite(G.point) or G.unbounded:  # no G, or any G of either sign is compatible with the seeds
        ax.annotate("unbounded" if G.unbounded else "n/a", (xpos, 0.0), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=FONT["note"], rotation=90)  # just above 0, at any scale
        return False
    err = [[G.point - G.lo], [G.hi - G.point]] if G.bounded else None
    ax.bar(xpos, G.point, width, yerr=err, capsize=2, color=color, hatch=hatch, alpha=0.6 if hatch else 1.0,
           label=label)
    for end in (G.lo, G.hi):
        if math.isfinite(end) and abs(end) > G_AXIS_LIMIT:
            ax.annotate(f"{end:.3g}", (xpos, math.copysign(G_AXIS_LIMIT, end)), xytext=(2, 0),
                        textcoords="offset points", ha="left", va="top" if end > 0 else "bottom",
                        fontsize=FONT["note"], rotation=90, annotation_clip=False)
    return True


def main() -> None:
    script_main(__doc__, build, "gap_closure.md", "Gap closure", "train trials with test_acc")


if __name__ == "__main__":
    main()
