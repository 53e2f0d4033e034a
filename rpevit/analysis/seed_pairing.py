"""An exploratory check beside a declared study's Welch tests: the same differences, paired by seed.

The declared comparisons and contrasts treat their cells as independent samples (Welch's interval; for a
contrast of gaps, Welch-Satterthwaite over four cell means), as the declarations say. But every cell of a
declared study runs under the same declared seeds, and a seed fixes a run's data order and augmentation (and
whatever of its initialisation two models draw alike), so two cells' values at one seed may be correlated. Where
they are, Welch's interval is wider than the paired one (a positive correlation) or narrower (a negative one): an
independent review found a softmax cell and its FAVOR+ cell strongly negatively correlated over the seeds of
cifar10_ladder40_cpu, where Welch's interval is the narrower.

`paired` redoes each complete comparison and contrast of a family as a one-sample t interval over seeds of the
per-seed combination (sum of coefficient x value over its cells), Holm within the same family over the same
declared k (an incomplete item at p = 1, as the declared test counts it), and `text` says in one generated line
which verdicts would differ. The declared test stays the answer; this says how much it leans on independence.
A trend is paired by seed already (its declared test), so it is not redone.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rpevit.analysis import stats

PAIRABLE = ("comparison", "contrast")


@dataclass(frozen=True)
class Paired:
    """One declared item, its declared (Welch) interval at its Holm level and verdict, and the same difference
    paired by seed: the per-seed combination's mean with its one-sample t interval at the paired family's Holm
    level (points)."""

    label: str
    family: str
    declared: stats.Interval
    declared_resolved: bool
    paired: stats.Interval
    paired_resolved: bool

    @property
    def differs(self) -> bool:
        return self.declared_resolved != self.paired_resolved


def per_seed(cells: Sequence[tuple[float, Mapping[int, float]]]) -> np.ndarray:
    """sum over cells of coefficient x value at each seed every cell holds (seeds in increasing order)."""
    seeds = sorted(set.intersection(*(set(values) for _, values in cells))) if cells else []
    return np.array([sum(c * values[s] for c, values in cells) for s in seeds], dtype=float)


def paired(outcomes: Sequence, alpha: float) -> list[Paired]:
    """The complete comparisons and contrasts of one judged family (confirmatory.Outcome, with `by_seed`), each
    also paired by seed with Holm over the family's declared k; [] for a family of another kind."""
    if not outcomes or outcomes[0].kind not in PAIRABLE:
        return []
    nominal = [stats.mean_interval(per_seed(o.by_seed) * 100, 1 - alpha) if o.complete else None for o in outcomes]
    p = [iv.p if iv is not None and math.isfinite(iv.p) else 1.0 for iv in nominal]
    out = []
    for o, iv, m in zip(outcomes, nominal, stats.holm_divisors(p, alpha)):
        if iv is None:
            continue
        at = stats.mean_interval(per_seed(o.by_seed) * 100, 1 - alpha / m) if m else iv
        out.append(Paired(o.label, o.where or o.family, o.holm, o.resolved, at, at.excludes(0.0)))
    return out


def text(families: Sequence[tuple[str, Sequence]], alpha: float) -> str:
    """One Markdown sentence over every judged family (confirmatory.judge's list of (title, outcomes)): how many
    complete comparisons and contrasts the paired test judges alike, and each one it judges otherwise with both
    intervals. '' where no family has a complete comparison or contrast."""
    found = [(title, p) for title, outcomes in families for p in paired(outcomes, alpha)]
    if not found:
        return ""
    narrower = sum(p.paired.hi - p.paired.lo < p.declared.hi - p.declared.lo for _, p in found
                   if p.paired.bounded and p.declared.bounded)
    differ = [(title, p) for title, p in found if p.differs]
    head = (f"Seed pairing (exploratory, not the declared test): every cell runs under the same declared seeds (a "
            f"seed fixes a run's data order and augmentation), so two cells' values at one seed may be correlated, "
            f"which Welch's interval ignores. Redone as a one-sample t interval over seeds of each seed's "
            f"difference (for a contrast, each seed's (a1 − b1) − (a2 − b2)), Holm within the same families: of "
            f"{len(found)} complete comparison(s) and contrast(s), the paired interval at its Holm level is narrower "
            f"than the declared one for {narrower}, and the verdict ")
    if not differ:
        return head + "is the same for every one."
    listed = "; ".join(f"{p.label} ({title}): declared {p.declared.text()} "
                       f"{'resolved' if p.declared_resolved else 'not resolved'}, paired {p.paired.text()} "
                       f"{'resolved' if p.paired_resolved else 'not resolved'}" for title, p in differ)
    return head + f"differs for {len(differ)}: {listed}. The declared verdict is the study's answer."


__all__ = ["PAIRABLE", "Paired", "paired", "per_seed", "text"]
