"""Gap closure, computed: per-seed accuracies, each Performer configuration's gap to softmax+ape, each
encoding's G, gain and same-encoding gap with their Holm verdicts (gap_closure's numbers; its prose is
text.py's, its figure figure.py's; the definitions are in the package docstring).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from rpevit.analysis.common import VARIANT, column, judged_accuracy, with_variant
from rpevit.analysis.stats import Comparison, Interval, Judged, closure_ratio, judge_family, seeds_text, welch

BASELINE_ATTENTION, BASELINE_PE = "softmax", "ape"
MIN_GAP = 0.005  # 0.5 points of accuracy: below it a single-seed gap gets no G (one seed has no interval)
TRAIN_DRAW, DRAW_MEAN = "test_acc", "acc_draw"  # the two accuracies G is computed on
SHORT = {DRAW_MEAN: "draw mean", TRAIN_DRAW: "training draw"}
SOURCES = {DRAW_MEAN: "draw mean, judged (`test_acc_draw_mean`)", TRAIN_DRAW: "training draw (`test_acc`)"}
ACCURACY_COLUMNS = {"test_acc": "test acc (training draw)", "test_acc_draw_mean": "draw mean",
                    "test_acc_draw_std": "draw std (mean over seeds)", "test_acc_draw_min": "draw min",
                    "test_acc_draw_ensemble": "draw ensemble", "test_acc_softmax_swap": "softmax swap"}
FIDELITY, PER_LAYER = "attn_tv_to_softmax", "attn_tv_per_layer"
GAP_OUTCOME = {"resolved": "a gap", "not resolved": "gap not resolved", "ahead": "{backend}+ape ahead of softmax+ape",
               "one seed": "one seed", "missing": "not measured"}
NO_INTERVAL = "no interval (one seed)"
# Effect of an encoding, in the order the verdict lists them, with the phrase it uses ({b}: the backend; {why}:
# why a resolved gain is read as raising or lowering b+ape, not as a G, fallback_why). A G interval above 0 at
# its Holm level narrows the gap; against 1 it says only whether G = 1 is excluded there: no test of "closes
# it" is defined, so not excluding 1 is never worded as closing the gap.
EFFECT_PHRASE = {"narrows (overshoots)": "narrows it (overshoots: G above 1 at its Holm level)",
                 "narrows (G = 1 not excluded)": "narrows it (G = 1, full closure, not excluded at its Holm level)",
                 "narrows (not fully)": "narrows it (not fully: G below 1 at its Holm level)",
                 "widens": "widens it (G interval at its Holm level below 0)",
                 "raises": "raises {b}+ape ({why})",
                 "lowers": "lowers {b}+ape ({why})",
                 "not resolved": "{effect} (Holm interval includes 0)",
                 NO_INTERVAL: NO_INTERVAL,
                 "not measured": "not measured"}
# Why a resolved gain is no G claim: the gap itself is not resolved (or b+ape is ahead), or it is resolved at
# its own Holm level but G's Fieller interval at G's (stricter) Holm level is unbounded.
NO_RESOLVED_GAP = "no resolved gap for a G"
G_UNBOUNDED = "G unbounded at its Holm level"
NO_GAP_AHEAD = "no gap to close: {b}+ape ahead of softmax+ape"
# A G at 95% where the gap is not resolved at its Holm level: shown, but only as this (table and figure alike).
EXPLORATORY_G = "G at 95% only (exploratory; the gap is not resolved at its Holm level)"
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
    why: str = ""  # raises / lowers: why it is no G claim (fallback_why); '' otherwise


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
    narrowing (or widening) the gap, and against 1: below it (not fully), above it (overshoots), or 1 not
    excluded, which is no evidence that the gap is closed; otherwise as raising or lowering b+ape
    (fallback_why says why)."""
    if not math.isfinite(G.nominal.p):
        return NO_INTERVAL
    if not G.resolved:
        return f"not resolved with {seeds_text(G.interval.n)}"
    up = gain.point > 0
    if gap.state == "resolved" and G.interval.bounded:
        if not up:
            return "widens"
        return ("narrows (overshoots)" if G.interval.lo > 1 else "narrows (not fully)" if G.interval.hi < 1
                else "narrows (G = 1 not excluded)")
    return "raises" if up else "lowers"


def fallback_why(gap: Gap, G: Judged) -> str:
    """Why a resolved gain is read as raising or lowering b+ape and not as a G: the gap is not resolved at
    its Holm level (NO_RESOLVED_GAP), b+ape is ahead (NO_GAP_AHEAD), or the gap is resolved at its Holm
    level but G's Fieller interval at G's own Holm level is unbounded (G_UNBOUNDED)."""
    if gap.state == "resolved":
        return G_UNBOUNDED if G.interval.unbounded else ""
    return NO_GAP_AHEAD if gap.state == "ahead" else NO_RESOLVED_GAP


def G_exploratory(gap: Gap, G: Interval) -> bool:
    """True for a G shown at 95% where the gap has an interval but is not resolved at its Holm level: it is
    no verdict, only exploratory (EXPLORATORY_G)."""
    return gap.state == "not resolved" and math.isfinite(G.point)


def effect_phrase(effect_word: str, backend: str, why: str = "") -> str:
    """The verdict's phrase for an effect word (its EFFECT_PHRASE entry, with the backend, the seed counts
    and, for raises / lowers, why it is no G claim)."""
    category = next(e for e in EFFECT_ORDER if effect_word.startswith(e))
    phrase = EFFECT_PHRASE[category].format(b=backend, effect=effect_word, why=why.format(b=backend))
    return phrase.replace(" ()", "")


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
        word = effect(gap, G, gain_holm)
        closures[pe] = Closure(G.nominal if with_G else NONE, welch(values, base), same.nominal if same else NONE,
                               refs[pe], G, gain_holm, same, word,
                               fallback_why(gap, G) if word in ("raises", "lowers") else "")
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

