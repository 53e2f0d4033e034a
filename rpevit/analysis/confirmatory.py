"""The confirmatory table of a study: exactly the comparisons it declared before it ran.

    python analysis/confirmatory.py RESULTS_DIR

RESULTS_DIR is one sweep folder whose space had a `declare:` block (rpevit/sweep/declaration.py); the
driver recorded it in declaration.json before the first trial. This module reads that record, not the
space file, and uses only rows that (1) belong to the current space, (2) ran one of the declared seeds,
and (3) started after the declaration in force was recorded. Each declared comparison a - b of the
declared metric gets its Welch interval at 95% and at its Holm level within its family (k = the
declared family size, fixed in advance); it is "resolved" only where that interval excludes 0, and it
gets no verdict at all until both cells hold every declared seed ("incomplete": a comparison read
before its n is reached would be a second look). Every other figure any script prints about the study
is exploratory, and this file says how many rows it set aside and why. Writes confirmatory.md.

A study whose declaration was recorded with `sweep.py --redeclare` (a changed declaration, or a first one
recorded after trials had begun) says so in every text written from it (`redeclared_text`: when, and what
changed: seeds added, alpha, metric, families), and every row it uses started after the declaration in
force; a resumed row is set aside too, since its earlier epochs may predate it. A declaration.json edited
by hand (its sha256 no longer its declaration's digest) is refused in one line (declaration.read_record).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from rpevit.analysis import budget_ladder, seed_pairing, stats
from rpevit.analysis.common import column, fmt, judged_accuracy, markdown_table, md_text, read_trials
from rpevit.sweep.declaration import (AFTER_TRIALS, DECLARATION_FILE, Declaration, DeclarationError, Family, Pair,
                                      Trend, cell_of, read_record, redeclarations, utc_text)
from rpevit.sweep.results import unix_seconds

METRIC_TEXT = {"judged": "judged accuracy (mean over fresh draws for random-feature models, test_acc otherwise)",
               "test_acc": "test_acc (for a random-feature model: its training draw, the draw it holds at the end of "
                           "training; for softmax the judged accuracy itself)",
               "test_acc_draw_mean": "test_acc_draw_mean (mean over fresh draws)"}
METRIC_SHORT = {"judged": "judged accuracy", "test_acc": "training draw (test_acc)",
                "test_acc_draw_mean": "mean over fresh draws"}
PENALTY_SENTENCE = ("For softmax the two metrics are one number; for a random-feature model the judged accuracy "
                    "averages fresh draws while test_acc reads the draw the model was trained on, so the difference "
                    "between the two verdicts is the cost of judging a random-feature model on draws it was not "
                    "frozen to (the fresh-draw penalty), not a difference between the attention mechanisms.")
PENALTY_OF_KIND = {  # what the side-by-side table's last column is, per kind of item
    "comparison": "The last column is, for a softmax − random-feature gap, the random-feature cell's fresh-draw "
                  "penalty.",
    "contrast": "The last column is, for a contrast of two softmax − random-feature gaps, the difference of the two "
                "random-feature cells' fresh-draw penalties (gap 1's minus gap 2's), not one penalty.",
    "trend": "The last column is, for a trend of a softmax − random-feature gap, the change of the random-feature "
             "cell's fresh-draw penalty from the shorter budget to the longer, not one penalty.",
}
INCOMPLETE_P = 1.0  # an incomplete comparison still counts in its family's k, as if not rejected (conservative)
KIND_METHOD = {
    "comparison": "a − b of the metric, Welch's interval, as declared (it treats the two cells as independent "
                  "samples, though both run under the declared seeds: the seed-pairing line below, once an item is "
                  "complete, checks how much the verdicts lean on that)",
    "contrast": "(a1 − b1) − (a2 − b2), the difference of two gaps: a contrast of four cell means taken as independent, as "
                "declared (the seed-pairing line below, once an item is complete, checks that), with the "
                "Welch-Satterthwaite interval (rpevit.analysis.stats.contrast). The gaps are signed: a positive "
                "contrast is a smaller gap 2, which is a narrower one while gap 2 is not negative (each gap is shown "
                "beside it, with its sign)",
    "trend": "per seed, (a − b) at the longer budget minus (a − b) at the shorter; a one-sample t interval over seeds. "
             "Paired by seed because the rungs of one seed share its initialisation and data order (and, in a study "
             "that branches its rungs, `branch: epochs`, its trunk: the shorter run resumes the longer run's "
             "checkpoint at its cool-down start), so they are not independent. The gap at each end is shown with "
             "Welch's interval (as in the comparisons), over the seeds the "
             "change uses. The gap is signed: a falling gap is a shrinking one only while it stays above 0 (the "
             "verdict says where it ends below 0, its second cell ahead)",
}


@dataclass(frozen=True)
class Outcome:
    """One declared item, judged on one metric: its cells' values over the declared seeds (`cells`, per
    seed: seed -> value), the nominal and Holm intervals (points: accuracy x 100), and its verdict. For a
    comparison, a and b are its sides; for a contrast, its two gaps (a = a1 − b1, b = a2 − b2); for a
    trend, its gap at the longer budget (a) and at the shorter (b)."""

    family: str
    a: str
    b: str
    values_a: tuple[float, ...]
    values_b: tuple[float, ...]
    nominal: stats.Interval
    holm: stats.Interval
    k: int
    complete: bool
    a_short: str = ""  # 'softmax+rope': the cell as prose names it (short_label)
    b_short: str = ""
    kind: str = "comparison"
    metric: str = "judged"
    counts: tuple[int, ...] = ()  # seeds found per cell (per seed-with-every-cell for a trend)
    gaps: tuple[stats.Interval, ...] = ()  # a contrast: gap 1 and gap 2; a trend: its gap at the longer and the
    # shorter budget (each Welch, 95%, signed a − b)
    pending: int = 0  # items of its family still incomplete: counted at p = 1, so a "not resolved" may change
    could_resolve: bool = False  # not resolved now, but Holm would resolve it were every incomplete item of its
    # family to come in at p = 0 (its best case: they take the first steps): its "not resolved" reads "for now"
    where: str = ""  # the family's name with its for_each value (and trend), without the metric
    by_seed: tuple[tuple[float, dict[int, float]], ...] = ()  # a comparison or contrast: (coefficient, seed ->
    # value) per cell, for the seed-paired check beside the declared test (seed_pairing)

    @property
    def resolved(self) -> bool:
        return self.complete and self.holm.excludes(0.0)

    @property
    def gaps_text(self) -> str:
        """' (signed: gap 1 1.98, gap 2 0.366 points)', and where a gap is negative, that its second cell is
        ahead there: a positive contrast is a smaller signed gap, which is a narrower one only while gap 2 >= 0."""
        if len(self.gaps) != 2:
            return ""
        g1, g2 = (g.point for g in self.gaps)
        behind = [f"gap {i} < 0: its second cell ahead" for i, g in ((1, g1), (2, g2)) if g < 0]
        return f" (signed: gap 1 {fmt(g1, 3)}, gap 2 {fmt(g2, 3)} points" + "".join(f"; {b}" for b in behind) + ")"

    @property
    def label(self) -> str:
        """The item as prose names it: 'softmax+ape − favor+ape', '(…) − (…)'."""
        if self.kind == "comparison":
            return f"{self.a_short} − {self.b_short}"
        return f"({self.a_short}) − ({self.b_short})"

    @property
    def have(self) -> tuple[int, ...]:
        """Seeds found per cell (a trend: seeds with every rung)."""
        return self.counts or (len(self.values_a), len(self.values_b))

    def counts_text(self, n_declared: int) -> str:
        have = self.have
        if self.kind == "trend":
            return f"{have[0]} of the {n_declared} declared seeds with every rung"
        return f"{' and '.join(map(str, have)) if len(have) < 3 else ', '.join(map(str, have))} of the {n_declared} declared seeds"

    def verdict(self, n_declared: int) -> str:
        if not self.complete:
            return f"incomplete: {self.counts_text(n_declared)} (no verdict before n is reached)"
        if not self.resolved:
            s = "s" if self.pending != 1 else ""
            if not self.pending:
                later = ""
            elif self.could_resolve:  # Holm resolves it in the best case of the incomplete items (judge_family)
                later = f" (for now: {self.pending} item{s} of its family incomplete, counted as not rejected)"
            else:  # not even in that best case: whatever the incomplete items give, it stays
                later = (f" (final whatever the {self.pending} incomplete item{s} of its family "
                         f"give{'' if s else 's'}: Holm would not resolve it even were {'they' if s else 'it'} "
                         f"to take the first steps)")
            return f"not resolved with {stats.seeds_text(self.holm.n)}{later}"
        up = self.holm.point > 0
        if self.pending:  # an incomplete item judged later can only take a Holm step before this one:
            s = "s" if self.pending != 1 else ""  # a lower level for it, never a reversal
            return (f"{self._resolved_text(up)} (for now: its Holm level may fall, its interval narrow, while "
                    f"{self.pending} item{s} of its family {'are' if s else 'is'} incomplete; resolved stays resolved)")
        return self._resolved_text(up)

    def _resolved_text(self, up: bool) -> str:
        if self.kind == "contrast":
            return f"resolved: gap 2 ({self.b}) {'smaller' if up else 'larger'} than gap 1{self.gaps_text}"
        if self.kind == "trend":
            return f"resolved: the gap {'rises' if up else 'falls'} from the shorter budget to the longer{self.ends_text}"
        return f"resolved: {self.a} {'higher' if up else 'lower'}"

    @property
    def ends_text(self) -> str:
        """A trend's ' (signed, in points: 0.366 at the shorter budget, -1.3 at the longer; below 0 at the longer:
        its second cell ahead)': a falling signed gap is a shrinking one only while it stays above 0."""
        if self.kind != "trend" or len(self.gaps) != 2:
            return ""
        longer, shorter = (g.point for g in self.gaps)
        below = [f"below 0 at the {end}: its second cell ahead" for end, g in (("shorter", shorter), ("longer", longer))
                 if g < 0]
        return (f" (signed, in points: {fmt(shorter, 3)} at the shorter budget, {fmt(longer, 3)} at the longer"
                + "".join(f"; {b}" for b in below) + ")")

    @property
    def direction(self) -> str:
        """A resolved item's direction in a few words, for a line that lists items of any kind: 'softmax+ape
        higher', 'gap 2 smaller', 'the gap falls'."""
        up = self.holm.point > 0
        if self.kind == "contrast":
            return f"gap 2 {'smaller' if up else 'larger'}" + ("" if len(self.gaps) != 2 or self.gaps[1].point >= 0
                                                              else ", below 0")
        if self.kind == "trend":
            return f"the gap {'rises' if up else 'falls'}" + ("" if len(self.gaps) != 2 or self.gaps[0].point >= 0
                                                             else ", to below 0")
        return f"{self.a_short or self.a} {'higher' if up else 'lower'}"


def redeclared_text(record: dict[str, Any]) -> str:
    """'' for a study declared once, before its first trial; otherwise one Markdown phrase saying it was
    redeclared, when, and what each redeclaration changed (names from the file made inert): 'redeclared
    with `sweep.py --redeclare`: first declared 2026-11-26T11:11:48Z; 2026-11-27T09:00:00Z: seeds 0, 1, 2 →
    0, 1, 2, 3, 4 (added 3, 4)'."""
    found = redeclarations(record)
    if not found:
        return ""
    first = record["declarations"][0]
    steps = [] if first.get(AFTER_TRIALS) else [f"first declared {utc_text(first['recorded_at'])}"]
    steps += [f"{utc_text(at)}: {', '.join(what)}" for at, what in found]
    return f"redeclared with `sweep.py --redeclare`: {md_text('; '.join(steps))}"


def side_label(side: dict[str, Any]) -> str:
    return md_text(" ".join(f"{k}={v}" for k, v in side.items()))


def question_text(decl: Declaration) -> str:
    """The declared question (read from a file: inert Markdown), or that none was stated."""
    return md_text(decl.question) if decl.question else "no question stated"


def short_label(side: dict[str, Any]) -> str:
    """'softmax+rope' for {attention: softmax, pe: rope}, as the answers name variants; any other field
    follows as k=v ('favor+ape epochs=5')."""
    head = "+".join(str(side[k]) for k in ("attention", "pe") if k in side)
    rest = " ".join(f"{k}={fmt(v)}" for k, v in side.items() if k not in ("attention", "pe"))
    return md_text(" ".join(part for part in (head, rest) if part))


def metric_values(frame: pd.DataFrame, metric: str) -> pd.Series:
    if metric == "judged":
        return judged_accuracy(frame)
    return pd.to_numeric(column(frame, metric), errors="coerce")


def usable_rows(frame: pd.DataFrame, decl: Declaration, recorded_at: float,
                redeclared: bool) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows the confirmatory table may use, and how many were set aside for each reason. A row's
    `started_at` is its last (re)start, so after a --redeclare a resumed row may have run epochs before
    the declaration in force: such rows are set aside too."""
    seed_ok = frame["seed"].isin(decl.seeds)
    started = unix_seconds(column(frame, "started_at"))
    after = started >= recorded_at
    resumed = pd.to_numeric(column(frame, "resumed_from_epoch", 0), errors="coerce").fillna(0) > 0
    unsure = after & resumed if redeclared else pd.Series(False, index=frame.index)
    set_aside = {"a seed outside the declared ones": int((~seed_ok).sum()),
                 "started before the declaration was recorded (or no start time)": int((seed_ok & ~after).sum()),
                 "resumed after a redeclaration (earlier epochs may predate it)": int((seed_ok & unsure).sum())}
    return frame[seed_ok & after & ~unsure], set_aside


def cell_values(records: list[dict], values: pd.Series, side: dict[str, Any], fixed: dict[str, Any]) -> dict[int, float]:
    """seed -> finite metric value of the one cell a side selects (with the family's fixed fields)."""
    out = {int(records[i]["seed"]): float(values.iloc[i]) for i in cell_of(records, side, fixed)}
    return {seed: v for seed, v in sorted(out.items()) if math.isfinite(v)}


Item = tuple[Callable[[float], stats.Interval], bool, dict[str, Any]]  # (interval at a level, complete, labels)


def comparison_item(records: list[dict], values: pd.Series, pair: Pair, fixed: dict[str, Any], n: int) -> Item:
    a, b = (cell_values(records, values, side, fixed) for side in pair)
    va, vb = tuple(a.values()), tuple(b.values())
    return (lambda level: stats.welch(np.array(va) * 100, np.array(vb) * 100, level),
            len(va) == len(vb) == n,
            {"a": side_label(pair[0]), "b": side_label(pair[1]), "a_short": short_label(pair[0]),
             "b_short": short_label(pair[1]), "values_a": va, "values_b": vb, "counts": (len(va), len(vb)),
             "by_seed": ((1.0, a), (-1.0, b))})


def contrast_item(records: list[dict], values: pd.Series, contrast: tuple[Pair, Pair], fixed: dict[str, Any],
                  n: int) -> Item:
    """(a1 − b1) − (a2 − b2) over the distinct cells, a cell named twice entering once with its
    coefficients summed (stats.contrast)."""
    sides = [contrast[0][0], contrast[0][1], contrast[1][0], contrast[1][1]]
    coefficients: dict[str, float] = {}
    by_seed: dict[str, dict[int, float]] = {}
    for side, c in zip(sides, (1.0, -1.0, -1.0, 1.0)):
        key = json.dumps(side, sort_keys=True, default=str)
        coefficients[key] = coefficients.get(key, 0.0) + c
        by_seed[key] = cell_values(records, values, side, fixed)
    groups = {key: tuple(cell.values()) for key, cell in by_seed.items()}
    used = [k for k in groups if coefficients[k] != 0]
    counts = tuple(len(groups[k]) for k in used)
    gap = [tuple(len(cell_values(records, values, s, fixed)) for s in pair) for pair in contrast]
    labels = [" − ".join(short_label(s) for s in pair) for pair in contrast]
    gaps = tuple(stats.welch(*(np.array(list(cell_values(records, values, s, fixed).values())) * 100 for s in pair))
                 for pair in contrast)
    return (lambda level: stats.contrast([np.array(groups[k]) * 100 for k in used], [coefficients[k] for k in used],
                                         level),
            all(c == n for c in counts),
            {"a": md_text(labels[0]), "b": md_text(labels[1]), "a_short": labels[0], "b_short": labels[1],
             "values_a": (), "values_b": (), "counts": tuple(c for pair in gap for c in pair), "gaps": gaps,
             "by_seed": tuple((coefficients[k], by_seed[k]) for k in used)})


def trend_item(records: list[dict], values: pd.Series, pair: Pair, fixed: dict[str, Any], trend: Trend,
               seeds: Sequence[int]) -> Item:
    """Per seed: (a − b) at trend.end minus (a − b) at trend.start; only seeds with all four values."""
    at = {end: [cell_values(records, values, side, {**fixed, trend.field: end}) for side in pair]
          for end in (trend.start, trend.end)}
    both = [s for s in seeds if all(s in cell for cells in at.values() for cell in cells)]
    gap = {end: tuple(at[end][0][s] - at[end][1][s] for s in both) for end in at}
    change = tuple(hi - lo for hi, lo in zip(gap[trend.end], gap[trend.start]))
    welch = tuple(stats.welch(*(np.array([cell[s] for s in both]) * 100 for cell in at[end]))
                  for end in (trend.end, trend.start))  # each end's gap over the same seeds: independent cells
    name = " − ".join(short_label(s) for s in pair)
    return (lambda level: stats.mean_interval(np.array(change) * 100, level),
            len(both) == len(seeds),
            {"a": md_text(f"{name} at {trend.field} = {fmt(trend.end)}"),
             "b": md_text(f"{name} at {trend.field} = {fmt(trend.start)}"),
             "a_short": f"{name} at {md_text(fmt(trend.end))}", "b_short": f"at {md_text(fmt(trend.start))}",
             "values_a": gap[trend.end], "values_b": gap[trend.start], "counts": (len(both),), "gaps": welch})


def judge_family(rows: pd.DataFrame, values: pd.Series, fam: Family, fixed: dict[str, Any],
                 decl: Declaration, metric: str = "") -> list[Outcome]:
    """Every item of one family (at one for_each value) on one metric, Holm over the declared k."""
    records, n = rows.to_dict("records"), len(decl.seeds)
    if fam.kind == "contrast":
        items = [contrast_item(records, values, c, fixed, n) for c in fam.contrasts]
    elif fam.kind == "trend":
        items = [trend_item(records, values, pair, fixed, fam.trend, decl.seeds) for pair in fam.comparisons]
    else:
        items = [comparison_item(records, values, pair, fixed, n) for pair in fam.comparisons]
    nominal = [at(1 - decl.alpha) for at, _, _ in items]
    p = [iv.p if ok and math.isfinite(iv.p) else INCOMPLETE_P for iv, (_, ok, _) in zip(nominal, items)]
    divisors = stats.holm_divisors(p, decl.alpha)
    # the best case for a complete item: every incomplete one comes in at p = 0 and takes a first step
    best = stats.holm([pi if ok else 0.0 for pi, (_, ok, _) in zip(p, items)])
    out = []
    pending = sum(not ok for _, ok, _ in items)
    for (at, ok, labels), iv, m, adjusted in zip(items, nominal, divisors, best):
        holm = at(1 - decl.alpha / m) if m else iv
        out.append(Outcome(fam.name, nominal=iv, holm=holm, k=len(items), complete=ok, kind=fam.kind,
                           metric=metric or decl.metric, pending=pending,
                           could_resolve=ok and pending > 0 and adjusted <= decl.alpha, **labels))
    return out


def levels_of(frame: pd.DataFrame, fam: Family, decl: Declaration) -> list[Any]:
    """The values of a family's for_each: those its rows hold, and every budget a declared trend over the same
    field names, so a rung no row has reached yet is judged "incomplete" rather than left out (a declaration
    lists no levels of its own: a for_each value that neither a row nor a trend names is not known here)."""
    if not fam.for_each:
        return [None]
    named = {v for f in decl.families if f.trend is not None and f.trend.field == fam.for_each
             for v in (f.trend.start, f.trend.end)}
    found = set(frame[fam.for_each]) if not frame.empty and fam.for_each in frame.columns else set()
    return sorted(found | named, key=lambda v: (isinstance(v, str), v)) or [None]


def family_title(fam: Family, level: Any, metric: str, default: str) -> str:
    """'name (epochs = 10)'; with a secondary metric, each judged family also names its metric."""
    parts = [f"{fam.for_each} = {fmt(level)}"] if fam.for_each else []
    if fam.trend is not None:
        parts.append(f"{fam.trend.field} {fmt(fam.trend.start)} → {fmt(fam.trend.end)}")
    if fam.secondary_metric:
        parts.append(METRIC_SHORT[metric] + ("" if metric != (fam.metric or default) else ", primary"))
    return md_text(fam.name + (f" ({'; '.join(parts)})" if parts else ""))


def in_force(results_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A declared study's record (declaration.json, checked) and its last entry, the declaration in force
    (`parsed`, `recorded_at`). DeclarationError where the folder has none."""
    record = read_record(results_dir)
    if record is None:
        raise DeclarationError(f"{results_dir} holds no declaration.json: this study declared no comparisons (its "
                               f"space has no declare: block), so everything about it is exploratory")
    return record, record["declarations"][-1]


def judge(results_dir: Path) -> tuple[Declaration, dict[str, Any], list[tuple[str, list[Outcome]]], dict[str, int]]:
    """The declaration in force, its record, the judged families (name with its for_each value and, for a
    family with a secondary metric, the metric: the primary's then the secondary's at each level) and the
    set-aside counts. Raises DeclarationError where the folder has no declaration."""
    record, entry = in_force(results_dir)
    decl: Declaration = entry["parsed"]
    frame = read_trials(results_dir, ["train"]).frame
    redeclared = bool(redeclarations(record))
    rows, set_aside = usable_rows(frame, decl, entry["recorded_at"], redeclared) if not frame.empty else (frame, {})
    rows = rows.reset_index(drop=True)
    families = []
    for fam in decl.families:
        for level in levels_of(frame, fam, decl):
            fixed = {fam.for_each: level} if fam.for_each else {}
            where = family_title(replace(fam, secondary_metric=None), level, decl.metric, decl.metric)
            for metric in fam.metrics(decl.metric):
                values = metric_values(rows, metric) if not rows.empty else pd.Series(dtype=float)
                families.append((family_title(fam, level, metric, decl.metric),
                                 [replace(o, where=where) for o in judge_family(rows, values, fam, fixed, decl, metric)]))
    return decl, entry, families, set_aside


def side_by_side(primary: list[Outcome], secondary: list[Outcome], n: int) -> str:
    """One family's items on its two metrics in one table: each at its Holm level with its verdict, and the
    difference of the two point estimates (for a softmax − random-feature gap: the fresh-draw penalty)."""
    rows = []
    for p, q in zip(primary, secondary):
        diff = p.holm.point - q.holm.point if p.complete and q.complete else math.nan
        rows.append([p.label, p.holm.text() if p.complete else "—", p.verdict(n),
                     q.holm.text() if q.complete else "—", q.verdict(n), fmt(diff, 3)])
    first, second = (METRIC_SHORT[o[0].metric] if o else "" for o in (primary, secondary))
    return markdown_table(["item", f"{first}: at its Holm level", f"{first}: verdict", f"{second}: at its Holm level",
                           f"{second}: verdict", f"{first} − {second} (points)"], rows)


def outcome_row(o: Outcome, n: int) -> list[str]:
    """A table row: the item, its two parts' means, the estimate at 95% and at its Holm level, the verdict.
    An incomplete item shows no estimate at all: an interval read before its n is reached would be the
    second look the declaration rules out (its seed counts are in its verdict)."""
    if not o.complete:
        return [o.a, o.b, "—", "—", "—", "—", o.verdict(n)]
    if o.kind == "comparison":
        parts = [stats.mean_interval(np.array(o.values_a) * 100).text(),
                 stats.mean_interval(np.array(o.values_b) * 100).text()]
    else:  # a contrast's two gaps, or a trend's gap at each end: signed, each with its own 95% Welch interval
        parts = [g.text() for g in o.gaps] if len(o.gaps) == 2 else ["—", "—"]
    return [o.a, o.b, *parts, o.nominal.text(), o.holm.text(), o.verdict(n)]


HEADERS = {"comparison": ["a", "b", "mean a", "mean b", "a − b, 95%", "a − b at its Holm level", "verdict"],
           "contrast": ["gap 1 (a1 − b1)", "gap 2 (a2 − b2)", "gap 1, 95%", "gap 2, 95%", "gap 1 − gap 2, 95%",
                        "gap 1 − gap 2 at its Holm level", "verdict"],
           "trend": ["gap at the longer budget", "gap at the shorter budget", "gap (longer), 95% Welch",
                     "gap (shorter), 95% Welch",
                     "change per seed, 95%", "change at its Holm level", "verdict"]}


def trend_premise(results_dir: Path, rows: pd.DataFrame) -> str:
    """Whether each seed's rungs are one run up to the shorter one's cool-down, as the trend's pairing by seed
    assumes of a branched study (budget_ladder.shared_epochs over the rows judged here): a trunk trained again
    from epoch 0 on other hardware is compared with the rungs that branched from its first run."""
    return budget_ladder.shared_epochs_text(budget_ladder.shared_epochs(rows, budget_ladder.trial_epoch_curves(
        results_dir)))


def build(results_dir: Path) -> str:
    decl, entry, families, set_aside = judge(results_dir)
    record_, entry_ = in_force(results_dir)
    frame = read_trials(results_dir, ["train"]).frame
    rows = usable_rows(frame, entry_["parsed"], entry_["recorded_at"], bool(redeclarations(record_)))[0] \
        if not frame.empty else frame
    n = len(decl.seeds)
    kinds = list(dict.fromkeys(f.kind for f in decl.families))
    record = read_record(results_dir)
    redeclared = redeclared_text(record)
    since = utc_text(entry["recorded_at"])
    lines = [f"Declared {since} (declaration.json, sha256 {entry['sha256'][:12]}), before the rows used here started."
             if not redeclared else
             f"**Redeclared.** The study was {redeclared}. The declaration in force (declaration.json, sha256 "
             f"{entry['sha256'][:12]}) was recorded {since}; only rows that started after it, and were not resumed "
             f"from an earlier start, are used here, and every earlier row is exploratory."]
    if decl.question:
        lines.append(f"Question: {question_text(decl)}")
    metrics = list(dict.fromkeys(m for f in decl.families for m in f.metrics(decl.metric)))
    lines += ["", f"- Metric: {METRIC_TEXT[decl.metric]}, in points (accuracy x 100)."
              + ("" if len(metrics) == 1 else " Families that declare a secondary metric are judged on it too, "
                 f"beside the primary one, each with its own Holm correction: "
                 f"{'; '.join(METRIC_TEXT[m] for m in metrics if m != decl.metric)}. {PENALTY_SENTENCE}"),
              f"- Seeds: {', '.join(map(str, decl.seeds))} (n = {n} per cell, fixed in advance).",
              *(f"- {kind.capitalize()}: {KIND_METHOD[kind]}." for kind in kinds),
              *([f"- The trend's premise, checked on these rows: {trend_premise(results_dir, rows)}"]
                if "trend" in kinds else []),
              f"- Correction: Holm within each family at alpha {fmt(decl.alpha)}; k is the declared family size. "
              f"An item is resolved only where its interval at its Holm level excludes 0. Items are taken in "
              f"increasing p; the i-th is shown at 1 - alpha/(k - i + 1), and from the first that is not resolved "
              f"on, every item is shown at that step's level (Holm stops there, so each of those intervals "
              f"includes 0). An incomplete item counts in k as not rejected and shows no estimate before its n "
              f"is reached. Each table gives every item's p and its Holm-adjusted p (resolved exactly where that "
              f"is at most alpha). The interval at its Holm level inverts Holm's test at that step: it excludes 0 "
              f"exactly where Holm rejects, but the intervals of one family are not simultaneous confidence "
              f"intervals. Each family is corrected on its own at each value of its `for_each` (each rung) and on "
              f"each metric, as declared: nothing is corrected across rungs, across families or between the two "
              f"metrics, so the chance of some false claim over the whole question is above alpha.",
              *([f"- {pairing}"] if (pairing := seed_pairing.text(families, decl.alpha)) else []),
              "- Rows set aside: " + (", ".join(f"{v} ({k})" for k, v in set_aside.items() if v) or "none") + ".",
              "- Everything else reported about this study is exploratory.", ""]
    for i, (name, outcomes) in enumerate(families):
        kind = outcomes[0].kind if outcomes else "comparison"
        later = families[i + 1][1] if i + 1 < len(families) else []
        if outcomes and later and later[0].where == outcomes[0].where and later[0].metric != outcomes[0].metric:
            lines += [f"### {outcomes[0].where}: both declared metrics side by side", "",
                      side_by_side(outcomes, later, n), "", PENALTY_SENTENCE + " " + PENALTY_OF_KIND[kind], ""]
        headers = [*HEADERS[kind][:-1], "p (two-sided)", "p, Holm-adjusted", HEADERS[kind][-1]]
        rows = [[*row[:-1], *p_texts, row[-1]] for o, p_texts in zip(outcomes, p_values(outcomes))
                for row in [outcome_row(o, n)]]
        lines += [f"### {name}", "", markdown_table(headers, rows), ""]
    return "\n".join(lines)


def p_values(outcomes: Sequence[Outcome]) -> list[tuple[str, str]]:
    """Per item of one family: its two-sided p and its Holm-adjusted p (stats.holm over the family, an incomplete
    item at INCOMPLETE_P as in the judgement), so a reader sees the order Holm took the items in and how far each
    is from alpha (adjusted p <= alpha exactly where the item is resolved); '—' for an incomplete item."""
    raw = [o.nominal.p if o.complete and math.isfinite(o.nominal.p) else INCOMPLETE_P for o in outcomes]
    adjusted = stats.holm(raw)
    return [(f"{p:.3g}", f"{q:.3g}") if o.complete else ("—", "—") for o, p, q in zip(outcomes, raw, adjusted)]


def declared_status(folder: Path) -> str:
    """'declared': declared once, before its first trial; 'redeclared: …' (redeclared_text); 'refused: …'
    where its declaration.json cannot be used (the one-line reason); '' where it holds none."""
    try:
        record = read_record(folder)
    except DeclarationError as err:
        return f"refused: {md_text(' '.join(str(err).split()))}"
    if record is None:
        return ""
    redeclared = redeclared_text(record)
    return redeclared or "declared"


def exploratory_note(folders: Sequence[Path]) -> str:
    """One Markdown line for a report over these sweep folders: which declared their comparisons before they
    ran (only those comparisons are confirmatory), which were redeclared (when and what changed), and that
    every other verdict is exploratory."""
    status = {md_text(Path(f).name): declared_status(Path(f)) for f in folders
              if os.path.lexists(Path(f) / DECLARATION_FILE)}
    declared = sorted(name for name, s in status.items() if s == "declared")
    redeclared = [f"{name} ({s})" for name, s in sorted(status.items()) if s.startswith("redeclared")]
    refused = [f"{name} ({s})" for name, s in sorted(status.items()) if s.startswith("refused")]
    if not status:
        return ("_Exploratory: no study in this report declared its comparisons before it ran (no folder holds a "
                f"{DECLARATION_FILE}), so every verdict below describes these rows under Holm families chosen after "
                "the data were seen. A study that declares them (a `declare:` block in its space) gets its "
                "confirmatory table from `python analysis/confirmatory.py FOLDER`._")
    parts = [f"Declared before their runs: {', '.join(declared)}" if declared else "", "; ".join(redeclared)]
    later = "; a redeclared study's over the rows that started after its last declaration" if redeclared else ""
    head = (f"{'; '.join(p for p in parts if p)}; only their declared comparisons are confirmatory (`confirmatory.md` "
            f"in each, `python analysis/confirmatory.py FOLDER`{later}). " if declared or redeclared else "")
    tail = (f"A declaration.json that cannot be used makes nothing of its study confirmatory: {'; '.join(refused)}. "
            if refused else "")
    return (f"_{head}{tail}Every verdict below is exploratory: it describes these rows under Holm families chosen "
            f"after the data were seen._")


def main() -> None:
    from rpevit.analysis.common import require_folder, results_parser, write_study

    parser = results_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    require_folder(parser, "RESULTS_DIR", args.results_dir, "allowed: a declared study's sweep folder (one holding "
                   "declaration.json)")
    try:
        text = build(args.results_dir)
    except DeclarationError as err:
        raise SystemExit(f"error: {' '.join(str(err).split())}") from err
    write_study(args.results_dir, "confirmatory.md", "Declared comparisons (confirmatory)",
                "declared comparisons", text)


__all__ = ["Outcome", "build", "declared_status", "exploratory_note", "in_force", "judge", "main", "redeclared_text"]
