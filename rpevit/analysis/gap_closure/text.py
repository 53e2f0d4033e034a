"""Gap closure in words and Markdown tables: the verdict per dataset, generated from the numbers of
compute.py, and the accuracy, fidelity and gap tables."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rpevit.analysis.common import VARIANT, column, fmt, markdown_table, with_variant
from rpevit.analysis.gap_closure.compute import (ACCURACY_COLUMNS, DRAW_MEAN, EFFECT_ORDER, EXPLORATORY_G, FIDELITY,
                                                 GAP_OUTCOME, PER_LAYER, SOURCES, TRAIN_DRAW, Assessment, Closure,
                                                 Config, Gap, G_exploratory, effect_phrase, fallback_why, float_list)
from rpevit.analysis.stats import Judged, mean_interval

SOURCE_NOTE = ("Draw mean: mean accuracy over fresh draws (softmax and relu-identity: their exact test_acc); "
               "random-feature backends are judged on it. Training draw: accuracy with the random features the "
               "model finished training with. Gaps and gains in accuracy points; every interval is 95% (t-based: "
               "Welch for differences, Fieller for G) with the seed counts n of its groups (G: b+pe, b+ape, "
               "softmax+ape). The Holm columns judge each comparison at its Holm level within the family of its "
               "configuration and accuracy (k comparisons): an effect is claimed only where that interval "
               "excludes 0.")


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
            "not resolved": f"{gap.text(backend)}: {gap.why.split(':')[0]}, so no G at its Holm level"
                            + (" (the G at 95% in the table and figure is exploratory only)" if any(
                                G_exploratory(gap, c.G) for c in assessment.closures.values()) else ""),
            "one seed": f"{gap.text(backend)}: one seed, no interval"}[gap.state]
    head = (f"Holm over k = {assessment.k}: {head}" if assessment.k else
            f"no comparison has an interval (one seed), so nothing is Holm-corrected: {head}")
    groups: dict[str, list[str]] = {}
    for pe, c in sorted(assessment.closures.items(), key=lambda kv: EFFECT_ORDER.index(
            next(e for e in EFFECT_ORDER if kv[1].effect.startswith(e)))):
        groups.setdefault(effect_phrase(c.effect, backend, c.why), []).append(closure_item(pe, c, gap))
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
def accuracy_intervals(seeds: pd.DataFrame) -> list[tuple[tuple, list]]:
    """Per variant (its VARIANT key less the dataset): the seed count and each accuracy's mean_interval."""
    return [(key[1:], [int(g[TRAIN_DRAW].notna().sum()),
                       *(mean_interval(g[c].to_numpy(float)) for c in ACCURACY_COLUMNS)])
            for key, g in seeds.groupby(list(VARIANT))]


def accuracy_table(seeds: pd.DataFrame) -> str:
    """Per variant: every accuracy, mean [95% t interval] (n seeds), in %."""
    rows = [[*key, n, *(i.text(scale=100, digits=4) for i in intervals)]
            for key, (n, *intervals) in accuracy_intervals(seeds)]
    return markdown_table([*VARIANT[1:], "seeds", *(f"{label} %" for label in ACCURACY_COLUMNS.values())], rows)


def past_range_note(seeds: pd.DataFrame) -> str:
    """One line where an interval of the accuracy table passes what its column can be (0-100%: an accuracy,
    or the standard deviation of accuracies over draws, never below 0). A t interval is symmetric about the
    mean and knows nothing of that range, so seeds far apart (a model that collapses in some seeds) give a
    bound past it. Printed as computed, not cut at the range, which would hide how little the seeds agree;
    this line says so, with the count, so that no reader takes 106% for a measurement."""
    past = [i for _, (_, *intervals) in accuracy_intervals(seeds) for i in intervals
            if i.bounded and (i.hi > 1 or i.lo < 0)]
    if not past:
        return ""
    widest = max(past, key=lambda i: i.hi - i.lo)
    many = len(past) != 1
    return (f"_{len(past)} interval{'s' if many else ''} above pass{'' if many else 'es'} the 0-100% "
            f"{'their columns' if many else 'its column'} can take (an accuracy, or a standard deviation of "
            f"accuracies over draws; the widest: {widest.text(scale=100, digits=4)}): a t interval is symmetric "
            f"about the mean and is printed as computed, not cut at the range, so such a bound says only that the "
            f"seeds disagree widely._")


def per_layer_text(rows: pd.DataFrame) -> str:
    """Per-layer TV of one variant: each seed's rows averaged, then the mean over the n seeds whose rows have
    it, e.g. '0.12, 0.3 (n=2)' (n may be fewer than the variant's seeds); — when no row has it."""
    per_seed = []
    for _, g in rows.groupby("seed", dropna=False):
        arrays = [a for a in map(float_list, g[PER_LAYER]) if a is not None]
        if len({len(a) for a in arrays}) > 1:
            return "layer counts differ"
        if arrays:
            per_seed.append(np.nanmean(np.vstack(arrays), axis=0))
    if not per_seed:
        return "—"
    if len({len(a) for a in per_seed}) > 1:
        return "layer counts differ"
    return ", ".join(fmt(x, 2) for x in np.nanmean(np.vstack(per_seed), axis=0)) + f" (n={len(per_seed)})"


def fidelity_table(frame: pd.DataFrame, seeds: pd.DataFrame) -> str:
    """Per variant: mean TV distance of the attention rows to exact softmax rows (0 = softmax itself)."""
    if not seeds[FIDELITY].notna().any():
        return f"_no {FIDELITY} in these rows (written before attention fidelity was measured)_"
    layers = with_variant(frame).assign(**{PER_LAYER: column(frame, PER_LAYER)}).groupby(list(VARIANT))
    rows = [[*key[1:], int(g[FIDELITY].notna().sum()), mean_interval(g[FIDELITY].to_numpy(float)).text(),
             per_layer_text(layers.get_group(key)) if key in layers.groups else "—"]
            for key, g in seeds.groupby(list(VARIANT))]
    return markdown_table([*VARIANT[1:], "seeds", "TV to softmax [95%] (n)",
                           "TV per layer, mean over the n seeds that have it (n)"], rows)


def G_cell(closure: Closure, gap: Gap) -> str:
    """G [95%] (n), labelled EXPLORATORY_G where the gap is not resolved at its Holm level, or why there is none."""
    if math.isfinite(closure.G.point):
        return f"{closure.G.text()}; {EXPLORATORY_G}" if G_exploratory(gap, closure.G) else closure.G.text()
    if gap.state == "missing" or closure.G_holm is None:
        return "—"
    return f"— ({GAP_OUTCOME[gap.state].format(backend='b')})"


def holm_cell(judged: Judged | None, word: str) -> str:
    return "—" if judged is None else f"{word} (k={judged.k})"


def holm_G_word(closure: Closure, gap: Gap) -> str:
    """The Holm column's word for G: 'narrows it, not fully: G below 1 at its Holm level', 'raises b+ape, G
    unbounded at its Holm level', 'widens it', 'not resolved with 3 seeds; no resolved gap for a G'."""
    phrase = effect_phrase(closure.effect, "b", closure.why)
    if closure.effect.startswith(("narrows", "raises", "lowers")):  # its parenthesis is part of the verdict
        return phrase.replace(" (", ", ", 1).removesuffix(")")
    word = phrase.split(" (")[0]
    if closure.effect.startswith("not resolved") and gap.state != "resolved" and closure.G_holm is not None:
        word += "; " + fallback_why(gap, closure.G_holm).format(b="b")
    return word


def gap_table(assessed: dict[Config, Assessment]) -> str:
    """One row per (configuration, pe) on one accuracy: gap, G, gain, same-encoding gap, Holm verdicts."""
    rows = []
    for config, a in assessed.items():
        for pe, c in a.closures.items():
            same_word = c.same_holm.word("softmax ahead", "b ahead") if c.same_holm else ""
            G_word = holm_G_word(c, a.gap)
            rows.append([*config, pe, a.gap.baseline, a.gap.nominal.text(scale=100), G_cell(c, a.gap),
                         c.gain.text(scale=100), c.same_ref, c.same.text(scale=100),
                         holm_cell(c.G_holm, G_word), holm_cell(c.same_holm, same_word)])
    return markdown_table(["dataset", "backend b", "qk_norm", "redraw", "pe", "baseline",
                           "gap softmax+ape − b+ape [95%] (n)", "G [95%] (n)", "gain b+pe − b+ape [95%] (n)",
                           "same-encoding reference", "same-encoding gap softmax+pe − b+pe [95%] (n)",
                           "Holm: G (gain)", "Holm: same-encoding gap"], rows)




def dataset_section(dataset: str, frame: pd.DataFrame, seeds: pd.DataFrame,
                    assessed: dict[str, dict[Config, Assessment]]) -> list[str]:
    """One dataset's verdict, accuracy table and attention-fidelity table."""
    ds = seeds[seeds["dataset"] == dataset]
    return [verdict(dataset, frame, seeds, assessed),
            f"### {dataset}: accuracy per variant (%), mean [95% t interval] (n seeds)", "",
            accuracy_table(ds), "", *([past_range_note(ds), ""] if past_range_note(ds) else []),
            f"### {dataset}: attention fidelity, mean total-variation distance to exact softmax rows", "",
            fidelity_table(frame[frame["dataset"] == dataset], ds), ""]


def closure_section(assessed: dict[str, dict[Config, Assessment]]) -> list[str]:
    """The gap-closure tables on each accuracy, what they hold, and the figure."""
    parts = ["### Gap closure G = (acc[b+pe] - acc[b+ape]) / (acc[softmax+ape] - acc[b+ape]), "
             "beside the same-encoding gap acc[softmax+pe] - acc[b+pe]", "", SOURCE_NOTE, ""]
    for metric, label in SOURCES.items():
        parts += [f"#### On the {label}", "", gap_table(assessed[metric]), ""]
    return parts + ["![gap closure](gap_closure.png)", ""]
