"""How the answers word a figure (rpevit.analysis.answers): an interval and its Holm level, a verdict, a claim,
a mean accuracy, a setting, the label of an exploratory passage, and the sentences of the gap-closure answers
(results/ANSWERS.md's sections and the GPU block of results/README.md alike)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from rpevit.analysis import gap_closure
from rpevit.analysis.answers_sources import ADDED_AFTER_A_LOOK, AnswersError, Sources, config_name, status_of
from rpevit.analysis.common import code_span, fmt, md_text, read_trials, with_variant
from rpevit.analysis.gap_closure import DRAW_MEAN, TRAIN_DRAW, Assessment, Closure, Config, Gap
from rpevit.analysis.stats import Interval, Judged, mean_interval, seeds_text
from rpevit.sweep.declaration import DECLARATION_FILE


DATASET_NAMES = {"mnist": "MNIST", "cifar10": "CIFAR-10", "digits": "digits"}


# ---------------------------------------------------------------- wording
def bounds(iv: Interval, scale: float = 100.0) -> str:
    """'[0.0115, 0.666]' or 'unbounded' (a Fieller interval whose denominator is not resolved)."""
    if iv.unbounded:
        return "unbounded"
    if not iv.bounded:
        return "no interval"
    return f"[{bound(iv.lo * scale)}, {bound(iv.hi * scale)}]"


def bound(value: float) -> str:
    """3 significant figures, but never rounded onto a round hundred it is not (100.28 is '100.3', not '100',
    which would read as the ceiling of an accuracy rather than an interval that passes it)."""
    text = fmt(value, 3)
    return fmt(value, 4) if abs(value) >= 100 and float(text) != value else text


def at_holm(iv: Interval, k: int, scale: float = 100.0) -> str:
    """'[0.0115, 0.666] at its Holm level (99.2 %, k = 11)'."""
    return f"{bounds(iv, scale)} at its Holm level ({fmt(100 * iv.level, 3)} %, k = {k})"


def verdict_text(judged: Judged) -> str:
    """'excludes 0' where the interval at its Holm level does, else 'not resolved with n seeds'."""
    return "excludes 0" if judged.resolved else f"not resolved with {seeds_text(judged.interval.n)}"


def claim(judged: Judged, scale: float = 100.0, unit: str = "") -> str:
    """A Holm-judged comparison with both intervals and what it shows: '0.339 [0.131, 0.547] (n=5,5);
    [0.0115, 0.666] at its Holm level (99.2 %, k = 11): excludes 0', or '...: not resolved with 5 seeds'."""
    if not math.isfinite(judged.nominal.p):
        return f"{judged.nominal.text(scale)}{unit}: no interval"
    return f"{judged.nominal.text(scale)}{unit}; {at_holm(judged.interval, judged.k, scale)}: {verdict_text(judged)}"


def percent(values: Sequence[float] | np.ndarray) -> str:
    """'98.77 [98.65, 98.89] (n=5)': a mean accuracy in %."""
    return mean_interval(values).text(scale=100, digits=4)


def setting_text(value: object) -> str:
    """A setting as a reader writes it: 54000 whether a row stored it as an int or a float, 0.002, cosine
    (text from a row made inert Markdown: md_text)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return str(int(value)) if float(value).is_integer() else fmt(float(value))
    return md_text(value)
def exploratory(folders: Iterable[str], results_dir: Path) -> str:
    """The label of an exploratory passage: which studies it reads, that none declared its comparisons (or
    that only their declared comparisons, elsewhere, are confirmatory), and what else is known about them.
    `folders`: folder names as they are (a frame's `sweep` value read back with raw_text), each printed as a
    code span."""
    folders = sorted(set(folders))
    declared = [f for f in folders if (results_dir / f / DECLARATION_FILE).exists()]
    undeclared = [f for f in folders if f not in declared]
    redeclared = [f for f in declared if status_of(results_dir / f)]
    parts = []
    if undeclared:
        parts.append(f"{', '.join(code_span(f) for f in undeclared)} declared no comparisons before "
                     f"{'it' if len(undeclared) == 1 else 'they'} ran")
    if declared:
        parts.append(f"the declared comparisons of {', '.join(code_span(f) for f in declared)} are judged in \"Declared "
                     f"comparisons\" on their declared seeds; the figures here, over every row, are not")
    if redeclared:
        parts.append(f"{', '.join(code_span(f) for f in redeclared)} {'was' if len(redeclared) == 1 else 'were'} "
                     f"redeclared (`sweep.py --redeclare`; when and what changed: \"Declared comparisons\")")
    parts += [f"in {code_span(f)}, {note}" for f in folders if (note := study_note(results_dir, f))]
    return f"_Exploratory: {'; '.join(parts)}._"


def study_note(results_dir: Path, sweep: str) -> str | None:
    """What a reader must know of a study that looked at its data before it had all its seeds (ADDED_AFTER_A_LOOK):
    which seeds of how many cells came after the look, counted from its rows; None for any other study."""
    seeds = ADDED_AFTER_A_LOOK.get(sweep)
    if seeds is None:
        return None
    frame = with_variant(read_trials(Path(results_dir) / sweep, ["train"]).frame)
    added = frame[frame["seed"].isin(seeds)] if not frame.empty else frame
    cells = len(added[["attention", "pe", "qk_norm", "redraw"]].drop_duplicates()) if not added.empty else 0
    return (f"seeds {' and '.join(str(s) for s in seeds)} were added to {cells} of its cells after the "
            f"{len(set(frame['seed']) - set(seeds)) if not frame.empty else 0}-seed result had been read (a second "
            f"look, with no sequential correction), and its Holm families (one per configuration and accuracy) were "
            f"defined after the data were seen")


# ---------------------------------------------------------------- sentences of the gap-closure answers
EFFECT_WORDS = {"narrows (overshoots)": "narrows the gap (overshoots: G above 1 at its Holm level)",
                "narrows (G = 1 not excluded)":
                    "narrows the gap (G = 1, full closure, not excluded at its Holm level)",
                "narrows (not fully)": "narrows the gap (not fully: G below 1 at its Holm level)",
                "widens": "widens the gap (G interval at its Holm level below 0)", "raises": "raises {b}+ape",
                "lowers": "lowers {b}+ape"}


def gap_sentence(gap: Gap, backend: str, accuracy: str) -> str:
    """softmax+ape − b+ape on one accuracy, with its Holm verdict and whether G is defined."""
    if gap.judged is None:
        return f"softmax+ape − {backend}+ape on the {accuracy}: not measured ({gap.why})"
    if gap.state == "one seed":
        return f"softmax+ape − {backend}+ape on the {accuracy} is {gap.nominal.text(100)}: one seed, no interval"
    what = {"resolved": "excludes 0, a gap", "ahead": f"excludes 0, {backend}+ape ahead of softmax+ape",
            "not resolved": f"not resolved with {seeds_text(gap.judged.interval.n)}, so G is not defined"}[gap.state]
    return (f"softmax+ape − {backend}+ape on the {accuracy} is {gap.nominal.text(100)}; "
            f"{at_holm(gap.judged.interval, gap.judged.k)}: {what}")


def effect_words(effect: str, backend: str) -> str:
    """What an encoding does to b+ape, in words that claim only what its Holm interval shows."""
    for word, text in EFFECT_WORDS.items():
        if effect == word:
            return text.format(b=backend)
    if effect.startswith("not resolved"):
        return f"its effect on {backend}+ape is {effect}"
    return effect


def G_text(c: Closure, gap: Gap) -> str:
    """'G 1.46 [1.08, 2.55] (n=5,5,5), unbounded at its Holm level', or '' where G is not defined (the gap
    does not exclude 0 at its Holm level)."""
    if gap.state != "resolved" or not math.isfinite(c.G.point) or c.G_holm is None:
        return ""
    return f"G {c.G.text()}, {bounds(c.G_holm.interval, 1.0)} at its Holm level"


def encoding_sentence(pe: str, c: Closure, gap: Gap, backend: str) -> str:
    """One encoding on one accuracy: its effect with the gain (95 % and at its Holm level), G where the gap
    is resolved, and its same-encoding gap."""
    if c.G_holm is None:
        return f"{pe}: not measured"
    parts = [f"{pe}: {effect_words(c.effect, backend)}; gain {c.gain.text(100)}, {at_holm(c.gain_holm, c.G_holm.k)}"]
    if G_text(c, gap):
        parts.append(G_text(c, gap))
    if c.same_holm is not None:
        word = c.same_holm.word(f"softmax+{pe} ahead", f"{backend}+{pe} ahead")
        parts.append(f"same-encoding gap softmax+{pe} − {backend}+{pe} {claim(c.same_holm)}"
                     + (f" ({word})" if c.same_holm.resolved else ""))
    else:
        parts.append(f"no same-encoding gap ({c.same_ref.removeprefix('— ').strip('()')})")
    return "; ".join(parts)


def configuration_lines(sources: Sources, config: Config) -> list[str]:
    """Markdown bullets for one Performer configuration: the draw mean (judged) with every encoding, the
    first look where seeds were added after it, and the training draw's gap and resolved effects."""
    backend = config[1]
    draw, train = sources.assessed[DRAW_MEAN][config], sources.assessed[TRAIN_DRAW][config]
    lines = [f"- **{config_name(config)}** (baseline {draw.gap.baseline})",
             f"  - {gap_sentence(draw.gap, backend, 'draw mean')}."]
    first = sources.first_look[DRAW_MEAN].get(config)
    if first is not None and first.gap.judged is not None and draw.gap.judged is not None \
            and first.gap.judged.nominal.n != draw.gap.judged.nominal.n:
        lines.append(f"  - First look, before seeds were added: {gap_sentence(first.gap, backend, 'draw mean')}.")
    lines += [f"  - {encoding_sentence(pe, c, draw.gap, backend)}." for pe, c in draw.closures.items()]
    shown = [encoding_sentence(pe, c, train.gap, backend) for pe, c in train.closures.items()
             if c.G_holm is not None and c.G_holm.resolved]
    rest = len([c for c in train.closures.values() if c.G_holm is not None]) - len(shown)
    lines.append(f"  - Training draw: {gap_sentence(train.gap, backend, 'training draw')}."
                 + (" " + " ".join(f"{s}." for s in shown) if shown else "")
                 + (f" No other encoding's effect on {backend}+ape excludes 0 there ({rest} not resolved)."
                    if rest and shown else f" No encoding's effect on {backend}+ape excludes 0 there."
                    if rest else "")
                 + same_gaps_text(train, backend))
    return lines


def same_gaps_text(assessed: Assessment, backend: str) -> str:
    """The same-encoding gaps of one accuracy that `configuration_lines` shows no other way (those of encodings
    whose effect is not resolved), each judged in the configuration's Holm family: a resolved one with its
    figures, the rest by name; a reviewer found resolved training-draw gaps left unsaid."""
    unshown = [(pe, c) for pe, c in assessed.closures.items() if c.same_holm is not None
               and not (c.G_holm is not None and c.G_holm.resolved)]
    if not unshown:
        return ""
    resolved = [f"softmax+{pe} − {backend}+{pe} {claim(c.same_holm)} "
                f"({c.same_holm.word(f'softmax+{pe} ahead', f'{backend}+{pe} ahead')})"
                for pe, c in unshown if c.same_holm.resolved]
    rest = [pe for pe, c in unshown if not c.same_holm.resolved]
    parts = resolved + ([f"not resolved: {', '.join(rest)}"] if rest else [])
    return f" Same-encoding gaps there: {'; '.join(parts)}."


def accuracy_of(sources: Sources, dataset: str, attention: str, pe: str) -> np.ndarray:
    """Per-seed judged accuracy (draw mean for random-feature models) of one variant at qk_norm none: softmax
    without redraws, a random-feature backend at the study's redraw schedule (gap_closure.per_seed)."""
    s = sources.seeds
    rows = s[(s["dataset"] == dataset) & (s["attention"] == attention) & (s["pe"] == pe) & (s["qk_norm"] == "none")]
    rows = rows[(rows["redraw"] == "off") if attention == "softmax" else (rows["redraw"] != "off")]
    values = rows[DRAW_MEAN].to_numpy(float)
    values = values[np.isfinite(values)]
    if not len(values):
        raise AnswersError(f"{dataset} {attention}+{pe} (qk_norm none) has no accuracy in the results; allowed: a "
                           f"variant the studies ran")
    return values


def seeds_per_cell(sources: Sources, dataset: str) -> str:
    """'5 seeds in 12 cells, 3 seeds in 40 cells': how many seeds the dataset's cells (variants) hold."""
    s = sources.seeds[sources.seeds["dataset"] == dataset]
    counts = s.dropna(subset=[TRAIN_DRAW]).groupby(list(gap_closure.VARIANT)).size().value_counts().sort_index(
        ascending=False)
    return ", ".join(f"{n} seeds in {cells} cell{'s' if cells != 1 else ''}" for n, cells in counts.items())


def epochs_of(sources: Sources, dataset: str) -> str:
    frame = sources.train.frame
    epochs = sorted(set(pd.to_numeric(frame.loc[frame["dataset"] == dataset, "epochs"], errors="coerce").dropna()
                        .astype(int)))
    return " / ".join(map(str, epochs)) + " epochs"
