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
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from rpevit.analysis import stats
from rpevit.analysis.common import column, fmt, judged_accuracy, markdown_table, md_text, read_trials
from rpevit.sweep.declaration import DECLARATION_FILE, Declaration, DeclarationError, Family, cell_of, read_record
from rpevit.sweep.results import unix_seconds

METRIC_TEXT = {"judged": "judged accuracy (mean over fresh draws for random-feature models, test_acc otherwise)",
               "test_acc": "test_acc", "test_acc_draw_mean": "test_acc_draw_mean (mean over fresh draws)"}
INCOMPLETE_P = 1.0  # an incomplete comparison still counts in its family's k, as if not rejected (conservative)


@dataclass(frozen=True)
class Outcome:
    """One declared comparison, judged: the cells' values over the declared seeds, the nominal and Holm
    intervals (points: accuracy x 100), and its verdict."""

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

    @property
    def resolved(self) -> bool:
        return self.complete and self.holm.excludes(0.0)

    def verdict(self, n_declared: int) -> str:
        if not self.complete:
            return (f"incomplete: {len(self.values_a)} and {len(self.values_b)} of the {n_declared} declared seeds "
                    f"(no verdict before n is reached)")
        if self.resolved:
            return f"resolved: {self.a} {'higher' if self.holm.point > 0 else 'lower'}"
        return f"not resolved with {stats.seeds_text(self.holm.n)}"


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


def judge_family(rows: pd.DataFrame, values: pd.Series, fam: Family, fixed: dict[str, Any],
                 decl: Declaration) -> list[Outcome]:
    """Every comparison of one family (at one for_each value), Holm over the declared k."""
    records = rows.to_dict("records")
    cells = []
    for a, b in fam.comparisons:
        picked = []
        for side in (a, b):
            idx = cell_of(records, side, fixed)
            per_seed = {int(records[i]["seed"]): float(values.iloc[i]) for i in idx}
            picked.append(tuple(per_seed[s] for s in sorted(per_seed) if math.isfinite(per_seed[s])))
        cells.append((a, b, *picked))
    nominal = [stats.welch(np.array(va) * 100, np.array(vb) * 100) for _, _, va, vb in cells]
    complete = [len(va) == len(vb) == len(decl.seeds) for _, _, va, vb in cells]
    p = [iv.p if ok and math.isfinite(iv.p) else INCOMPLETE_P for iv, ok in zip(nominal, complete)]
    divisors = stats.holm_divisors(p, decl.alpha)
    out = []
    for (a, b, va, vb), iv, ok, m in zip(cells, nominal, complete, divisors):
        holm = stats.welch(np.array(va) * 100, np.array(vb) * 100, 1 - decl.alpha / m) if m else iv
        out.append(Outcome(fam.name, side_label(a), side_label(b), va, vb, iv, holm, len(cells), ok,
                           short_label(a), short_label(b)))
    return out


def judge(results_dir: Path) -> tuple[Declaration, dict[str, Any], list[tuple[str, list[Outcome]]], dict[str, int]]:
    """The declaration in force, its record, the judged families (name with its for_each value) and the
    set-aside counts. Raises DeclarationError where the folder has no declaration."""
    record = read_record(results_dir)
    if record is None:
        raise DeclarationError(f"{results_dir} holds no declaration.json: this study declared no comparisons (its "
                               f"space has no declare: block), so everything about it is exploratory")
    entry = record["declarations"][-1]
    decl: Declaration = entry["parsed"]
    frame = read_trials(results_dir, ["train"]).frame
    redeclared = len(record["declarations"]) > 1
    rows, set_aside = usable_rows(frame, decl, entry["recorded_at"], redeclared) if not frame.empty else (frame, {})
    rows = rows.reset_index(drop=True)
    values = metric_values(rows, decl.metric) if not rows.empty else pd.Series(dtype=float)
    families = []
    for fam in decl.families:
        levels = sorted(set(frame[fam.for_each]), key=lambda v: (isinstance(v, str), v)) \
            if fam.for_each and not frame.empty and fam.for_each in frame.columns else [None]
        for level in levels:
            fixed = {fam.for_each: level} if fam.for_each else {}
            name = md_text(fam.name + (f" ({fam.for_each} = {fmt(level)})" if fam.for_each else ""))
            families.append((name, judge_family(rows, values, fam, fixed, decl)))
    return decl, entry, families, set_aside


def build(results_dir: Path) -> str:
    decl, entry, families, set_aside = judge(results_dir)
    n = len(decl.seeds)
    lines = [f"Declared {entry.get('recorded_at_utc', '')} (declaration.json, sha256 {entry['sha256'][:12]}), before "
             f"the rows used here started."]
    if decl.question:
        lines.append(f"Question: {question_text(decl)}")
    lines += ["", f"- Metric: {METRIC_TEXT[decl.metric]}, in points (accuracy x 100).",
              f"- Seeds: {', '.join(map(str, decl.seeds))} (n = {n} per cell, fixed in advance).",
              f"- Correction: Holm within each family at alpha {fmt(decl.alpha)}; k is the declared family size. "
              f"A comparison is resolved only where its interval at its Holm level excludes 0.",
              "- Rows set aside: " + (", ".join(f"{v} ({k})" for k, v in set_aside.items() if v) or "none") + ".",
              "- Everything else reported about this study is exploratory.", ""]
    for name, outcomes in families:
        lines += [f"### {name}", "", markdown_table(
            ["a", "b", "mean a", "mean b", "a − b, 95%", "a − b at its Holm level", "verdict"],
            [[o.a, o.b, stats.mean_interval(np.array(o.values_a) * 100).text(),
              stats.mean_interval(np.array(o.values_b) * 100).text(), o.nominal.text(),
              o.holm.text() if o.complete else "—", o.verdict(n)] for o in outcomes]), ""]
    return "\n".join(lines)


def exploratory_note(folders: Sequence[Path]) -> str:
    """One Markdown line for a report over these sweep folders: which declared their comparisons before they
    ran (only those comparisons are confirmatory) and that every other verdict is exploratory."""
    declared = sorted(Path(f).name for f in folders if os.path.lexists(Path(f) / DECLARATION_FILE))
    if not declared:
        return ("_Exploratory: no study in this report declared its comparisons before it ran (no folder holds a "
                f"{DECLARATION_FILE}), so every verdict below describes these rows under Holm families chosen after "
                "the data were seen. A study that declares them (a `declare:` block in its space) gets its "
                "confirmatory table from `python analysis/confirmatory.py FOLDER`._")
    return (f"_Declared before their runs: {', '.join(declared)}; only their declared comparisons are confirmatory "
            f"(`confirmatory.md` in each, `python analysis/confirmatory.py FOLDER`). Every verdict below is "
            f"exploratory: it describes these rows under Holm families chosen after the data were seen._")


def main() -> None:
    from rpevit.analysis.common import results_parser, write_study

    parser = results_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    try:
        text = build(args.results_dir)
    except DeclarationError as err:
        raise SystemExit(f"error: {' '.join(str(err).split())}") from err
    write_study(args.results_dir, "confirmatory.md", "Declared comparisons (confirmatory)",
                "declared comparisons", text)


__all__ = ["Outcome", "build", "exploratory_note", "judge", "main"]
