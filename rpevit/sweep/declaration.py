"""A study's declared comparisons: the questions it exists to answer, fixed before its first trial runs.

A space's `declare:` block names the comparisons (pairs of cells), the metric, the seeds (n fixed in
advance) and the correction families. The driver records the block in `declaration.json` in the sweep
folder when it first sees it, with the time; the analysis (rpevit/analysis/confirmatory.py) reports
exactly those comparisons as confirmatory, over exactly the declared seeds and only from rows that
started after the declaration was recorded; everything else it prints is exploratory. A declaration
that changes once rows exist is refused unless `sweep.py --redeclare` is given, which records the new
one beside the old: rows that started before it are then exploratory for every comparison. This is
what makes seeds added after a look, or a metric picked after the fact, visible by construction.

    declare:
      question: Does the Luo RPE close the softmax / FAVOR+ gap?     # optional, one line
      metric: judged            # judged (draw mean for random-feature rows, else test_acc) | test_acc
                                # | test_acc_draw_mean
      seeds: [0, 1, 2, 3, 4]    # exactly these seeds count; others are exploratory
      alpha: 0.05               # family-wise error rate (Holm within each family)
      families:
        - name: FAVOR+ gap per encoding
          for_each: epochs      # optional: one family per value of this field (a budget ladder's rungs)
          comparisons:          # a - b of the metric, Welch interval; each side a partial config
            - [{attention: softmax, pe: ape}, {attention: favor, pe: ape}]

        - name: does an RPE narrow the FAVOR+ gap (a contrast of gaps)
          for_each: epochs
          metric: judged            # optional: the family's primary metric (default: the one above)
          secondary_metric: test_acc  # optional: judged beside it, its own Holm (test_acc of a random-feature
                                      # model is its training draw's accuracy)
          contrasts:                # (a1 - b1) - (a2 - b2): does the second gap differ from the first?
            - [[{attention: softmax, pe: ape}, {attention: favor, pe: ape}],
               [{attention: softmax, pe: rope}, {attention: favor, pe: rope}]]
        - name: does the gap shrink with budget
          trend: {field: epochs, from: 10, to: 40}   # per seed: (a - b) at 40 minus (a - b) at 10
          comparisons:
            - [{attention: softmax, pe: ape}, {attention: favor, pe: ape}]

Each side must match one cell of the space: trials that differ only in `seed` (and in the `for_each`
or `trend` field, which the family fixes). Checked when the space is loaded, so `--dry-run` refuses a
typo. A family holds one kind of item (comparisons, contrasts, or comparisons with a trend), so Holm's k
counts like with like. A family that uses none of the later keys (contrasts, trend, metric,
secondary_metric) serialises exactly as before they existed: the digest of a declaration recorded then
is unchanged, so its study resumes without --redeclare.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from rpevit.config import ConfigError, field_types

DECLARATION_FILE = "declaration.json"
METRICS = ("judged", "test_acc", "test_acc_draw_mean")
KEYS = ("question", "metric", "seeds", "alpha", "families")
FAMILY_KEYS = ("name", "for_each", "comparisons", "contrasts", "trend", "metric", "secondary_metric")
TREND_KEYS = ("field", "from", "to")
CELL_FIELDS_EXCLUDED = ("seed", "data_dir")  # what may differ inside one cell


class DeclarationError(ConfigError):
    """A `declare:` block that cannot be used, or one that changed after rows were written."""


Side = dict[str, Any]
Pair = tuple[Side, Side]


@dataclass(frozen=True)
class Trend:
    """Across a budget ladder: per seed, (a - b) at `end` minus (a - b) at `start` of `field` (YAML `from`,
    `to`). The rungs of one seed branch from one trunk, so the test is paired by seed."""

    field: str
    start: Any
    end: Any


@dataclass(frozen=True)
class Family:
    """One correction family: its items are pairs a - b (`comparisons`), contrasts of two pairs
    (a1 - b1) - (a2 - b2) (`contrasts`), or pairs judged as a trend across `trend.field`. `metric` (None:
    the declaration's) is the primary one; `secondary_metric`, if any, is judged beside it, with its own
    Holm correction within this family."""

    name: str
    comparisons: tuple[Pair, ...] = ()
    for_each: str | None = None
    contrasts: tuple[tuple[Pair, Pair], ...] = ()
    trend: Trend | None = None
    metric: str | None = None
    secondary_metric: str | None = None

    @property
    def kind(self) -> str:
        """'comparison', 'contrast' or 'trend'."""
        return "contrast" if self.contrasts else "trend" if self.trend is not None else "comparison"

    @property
    def size(self) -> int:
        """k: the number of items Holm corrects over (per for_each level and per metric)."""
        return len(self.contrasts) if self.contrasts else len(self.comparisons)

    def sides(self) -> list[Side]:
        """Every side the family names, in order."""
        pairs = [p for contrast in self.contrasts for p in contrast] if self.contrasts else list(self.comparisons)
        return [side for pair in pairs for side in pair]

    def metrics(self, default: str) -> tuple[str, ...]:
        """(primary,) or (primary, secondary)."""
        primary = self.metric or default
        return (primary, self.secondary_metric) if self.secondary_metric else (primary,)

    def to_dict(self) -> dict[str, Any]:
        """Canonical plain values; the keys added after the first declarations only when used (the digest
        of a declaration recorded before them is unchanged)."""
        out: dict[str, Any] = {"name": self.name, "for_each": self.for_each}
        if self.contrasts:
            out["contrasts"] = [[[dict(a), dict(b)] for a, b in contrast] for contrast in self.contrasts]
        else:
            out["comparisons"] = [[dict(a), dict(b)] for a, b in self.comparisons]
        if self.trend is not None:
            out["trend"] = {"field": self.trend.field, "from": self.trend.start, "to": self.trend.end}
        if self.metric is not None:
            out["metric"] = self.metric
        if self.secondary_metric is not None:
            out["secondary_metric"] = self.secondary_metric
        return out


@dataclass(frozen=True)
class Declaration:
    metric: str
    seeds: tuple[int, ...]
    families: tuple[Family, ...]
    alpha: float = 0.05
    question: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain, canonical values (JSON, hashing)."""
        out = asdict(self)
        out["seeds"] = list(self.seeds)
        out["families"] = [f.to_dict() for f in self.families]
        return out

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Declaration":
        return parse(values, "declaration.json")


def _bad(source: str, where: str, value: Any, allowed: str) -> DeclarationError:
    return DeclarationError(f"{source}: 'declare.{where}' has value {value!r}; allowed: {allowed}")


def _side(value: Any, where: str, source: str) -> dict[str, Any]:
    types = field_types()
    if not isinstance(value, dict) or not value:
        raise _bad(source, where, value, "a mapping of config fields to values, e.g. {attention: favor, pe: ape}")
    for name in value:
        if name not in types or name in CELL_FIELDS_EXCLUDED:
            raise _bad(source, where, value, f"config fields other than {', '.join(CELL_FIELDS_EXCLUDED)} "
                       f"({name!r} is not one)")
    return dict(value)


def parse(value: Any, source: str) -> Declaration:
    """The `declare:` block as a Declaration; one line naming the key, the value and what is allowed."""
    if not isinstance(value, dict):
        raise _bad(source, "", value, f"a mapping with keys {', '.join(KEYS)}")
    for key in value:
        if key not in KEYS:
            raise _bad(source, key, value[key], f"one of the keys {', '.join(KEYS)}")
    metric = value.get("metric")
    if metric not in METRICS:
        raise _bad(source, "metric", metric, ", ".join(METRICS))
    seeds = value.get("seeds")
    if (not isinstance(seeds, list) or len(seeds) < 2 or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise _bad(source, "seeds", seeds, "a list of at least 2 distinct integers >= 0 (the n fixed in advance)")
    alpha = value.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5:
        raise _bad(source, "alpha", alpha, "a number in (0, 0.5)")
    question = value.get("question", "")
    if not isinstance(question, str) or "\n" in question or len(question) > 300:
        raise _bad(source, "question", question, "one line of text (at most 300 characters)")
    families_in = value.get("families")
    if not isinstance(families_in, list) or not families_in:
        raise _bad(source, "families", families_in, "a non-empty list of {name, comparisons[, for_each]}")
    families, names = [], set()
    for i, fam in enumerate(families_in):
        family = _family(fam, f"families[{i}]", source, names)
        if family.secondary_metric == (family.metric or metric):
            raise _bad(source, f"families[{i}].secondary_metric", family.secondary_metric,
                       "a metric other than the family's primary one")
        families.append(family)
    return Declaration(metric, tuple(seeds), tuple(families), float(alpha), question)


def _pair(value: Any, where: str, source: str, fixed_fields: Sequence[str]) -> Pair:
    if not isinstance(value, list) or len(value) != 2:
        raise _bad(source, where, value, "a pair [a, b] of partial configs (a - b)")
    a, b = (_side(p, where, source) for p in value)
    for name in fixed_fields:
        if name in a or name in b:
            raise _bad(source, where, value, f"sides without {name!r}, which the family's for_each or trend fixes")
    return a, b


def _items(fam: dict[str, Any], key: str, where: str, source: str) -> list[Any]:
    items = fam.get(key)
    if not isinstance(items, list) or not items:
        raise _bad(source, f"{where}.{key}", items, "a non-empty list")
    return items


def _trend(value: Any, where: str, source: str, for_each: str | None) -> Trend:
    if not isinstance(value, dict) or set(value) != set(TREND_KEYS):
        raise _bad(source, where, value, "a mapping {field: F, from: A, to: B} (per seed: a - b at B minus at A)")
    field = value["field"]
    if field not in field_types() or field in CELL_FIELDS_EXCLUDED or field == for_each:
        raise _bad(source, f"{where}.field", field, "a config field other than seed, data_dir and the family's "
                   "for_each")
    start, end = value["from"], value["to"]
    if start == end or any(isinstance(v, (dict, list)) or v is None for v in (start, end)):
        raise _bad(source, where, value, "two different values of the field (from, to)")
    return Trend(field, _normal(field, start), _normal(field, end))


def _family(fam: Any, where: str, source: str, names: set[str]) -> Family:
    if (not isinstance(fam, dict) or set(fam) - set(FAMILY_KEYS) or "name" not in fam
            or ("comparisons" in fam) == ("contrasts" in fam)):
        raise _bad(source, where, fam, "a mapping with keys name and either comparisons or contrasts, optionally "
                   "for_each, trend (with comparisons), metric and secondary_metric")
    name = fam["name"]
    if not isinstance(name, str) or not name.strip() or "\n" in name or len(name) > 120 or name in names:
        raise _bad(source, f"{where}.name", name, "a unique one-line name (at most 120 characters)")
    names.add(name)
    for_each = fam.get("for_each")
    if for_each is not None and (for_each not in field_types() or for_each in CELL_FIELDS_EXCLUDED):
        raise _bad(source, f"{where}.for_each", for_each, "a config field other than seed and data_dir")
    metric, secondary = fam.get("metric"), fam.get("secondary_metric")
    for key, value in (("metric", metric), ("secondary_metric", secondary)):
        if value is not None and value not in METRICS:
            raise _bad(source, f"{where}.{key}", value, ", ".join(METRICS))
    trend = None
    if "trend" in fam:
        if "contrasts" in fam:
            raise _bad(source, f"{where}.trend", fam["trend"], "a trend of comparisons (a family with "
                       "comparisons), not of contrasts")
        trend = _trend(fam["trend"], f"{where}.trend", source, for_each)
    fixed_fields = [f for f in (for_each, trend.field if trend else None) if f]
    pairs: list[Pair] = []
    contrasts: list[tuple[Pair, Pair]] = []
    if "comparisons" in fam:
        for j, pair in enumerate(_items(fam, "comparisons", where, source)):
            pairs.append(_pair(pair, f"{where}.comparisons[{j}]", source, fixed_fields))
    else:
        for j, contrast in enumerate(_items(fam, "contrasts", where, source)):
            at = f"{where}.contrasts[{j}]"
            if not isinstance(contrast, list) or len(contrast) != 2:
                raise _bad(source, at, contrast, "[[a1, b1], [a2, b2]]: two pairs, judged as (a1 - b1) - (a2 - b2)")
            first, second = (_pair(p, at, source, fixed_fields) for p in contrast)
            if first == second:
                raise _bad(source, at, contrast, "two different pairs")
            contrasts.append((first, second))
    return Family(name, tuple(pairs), for_each, tuple(contrasts), trend, metric, secondary)


def _matches(trial: dict[str, Any], side: dict[str, Any]) -> bool:
    return all(trial.get(k) == _normal(k, v) for k, v in side.items())


def _normal(name: str, value: Any) -> Any:
    kind = field_types()[name]
    return float(value) if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool) else value


def cell_of(trials: Sequence[dict[str, Any]], side: dict[str, Any], fixed: dict[str, Any]) -> list[int]:
    """Indices of the trials one side selects (with the family's for_each value in `fixed`)."""
    return [i for i, t in enumerate(trials) if _matches(t, {**side, **fixed})]


def family_levels(fam: Family, trials: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The field values a family fixes, one mapping per place its sides are looked up: each for_each value
    (or none), and for a trend both of its ends at each."""
    levels = sorted({t[fam.for_each] for t in trials}, key=repr) if fam.for_each else [None]
    fixed = [{fam.for_each: value} if fam.for_each else {} for value in levels]
    if fam.trend is None:
        return fixed
    return [{**f, fam.trend.field: end} for f in fixed for end in (fam.trend.start, fam.trend.end)]


def check_against_space(decl: Declaration, trials: Sequence[dict[str, Any]], source: str) -> None:
    """Every side selects exactly one cell of the space (trials differing only in seed), holding every
    declared seed; refused otherwise with one line naming the family, the side and what it matched."""
    for fam in decl.families:
        for fixed in family_levels(fam, trials):
            at = " at " + ", ".join(f"{k}={v}" for k, v in fixed.items()) if fixed else ""
            for side in fam.sides():
                _check_side(trials, side, fixed, decl.seeds, f"family {fam.name!r}, side {side}{at}", source)


def _check_side(trials: Sequence[dict[str, Any]], side: Side, fixed: dict[str, Any], seeds: Sequence[int],
                where: str, source: str) -> None:
    found = cell_of(trials, side, fixed)
    if not found:
        raise DeclarationError(f"{source}: declare: {where} matches no trial of the space; allowed: "
                               f"values that occur in the space (check for typos)")
    shapes = {json.dumps({k: v for k, v in trials[i].items() if k not in CELL_FIELDS_EXCLUDED},
                         sort_keys=True, default=str) for i in found}
    if len(shapes) > 1:
        differ = sorted(k for k in trials[found[0]] if k not in CELL_FIELDS_EXCLUDED
                        and len({repr(trials[i].get(k)) for i in found}) > 1)
        raise DeclarationError(f"{source}: declare: {where} matches trials that differ in "
                               f"{', '.join(differ)}; allowed: a side that selects one cell (name "
                               f"those fields too)")
    missing = sorted(set(seeds) - {trials[i]["seed"] for i in found})
    if missing:
        raise DeclarationError(f"{source}: declare: {where} has no trial with seed(s) {missing}; "
                               f"allowed: declared seeds the space runs")


# ---------------------------------------------------------------- the record in the sweep folder
def read_record(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """declaration.json of a sweep folder (None: none). Untrusted: parsed as JSON, its declaration
    re-validated; a damaged file is an error naming it."""
    path = Path(out_dir) / DECLARATION_FILE
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        raise DeclarationError(f"{path} is not a regular file; allowed: the file the driver wrote")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        entries = record["declarations"]
        for entry in entries:
            entry["parsed"] = Declaration.from_dict(entry["declaration"])
            entry["recorded_at"] = float(entry["recorded_at"])
    except (ValueError, KeyError, TypeError) as err:
        raise DeclarationError(f"{path} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                               f"allowed: the file the driver wrote (restore it from git)") from err
    if not entries:
        raise DeclarationError(f"{path} holds no declaration; allowed: the file the driver wrote")
    return record


def record(out_dir: Path, decl: Declaration | None, *, rows_exist: bool, redeclare: bool) -> str | None:
    """Record the space's declaration in the sweep folder before any trial of this run starts. Returns a
    line for the driver to print (None when nothing changed)."""
    if decl is None:
        return None
    path = out_dir / DECLARATION_FILE
    old = read_record(out_dir)
    entry = {"sha256": decl.digest(), "recorded_at": time.time(),
             "recorded_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "declaration": decl.to_dict()}
    if old is not None and old["declarations"][-1]["sha256"] == entry["sha256"]:
        return None
    if old is not None or rows_exist:
        if not redeclare:
            what = "changed" if old is not None else "was added"
            raise DeclarationError(
                f"{out_dir}: the space's declare block {what} after trials of this sweep ran; allowed: the "
                f"declaration recorded before the runs ({DECLARATION_FILE}), or --redeclare to record this one, "
                f"which makes every row that started before it exploratory")
    entries = [] if old is None else [{k: v for k, v in e.items() if k != "parsed"} for e in old["declarations"]]
    entries.append(entry)
    from rpevit.sweep.results import atomic_file  # the one no-follow atomic writer of results files

    with atomic_file(path) as handle:
        handle.write(json.dumps({"declarations": entries}, indent=1).encode("utf-8"))
    return (f"declared comparisons recorded in {path} ({sum(len(f.comparisons) for f in decl.families)} comparison(s) "
            f"in {len(decl.families)} famil{'y' if len(decl.families) == 1 else 'ies'}, metric {decl.metric}, seeds "
            f"{', '.join(map(str, decl.seeds))})" + ("; rows that started before it are exploratory" if old else ""))


__all__ = ["DECLARATION_FILE", "Declaration", "DeclarationError", "Family", "Pair", "Side", "Trend",
           "check_against_space", "family_levels", "parse", "read_record", "record"]
