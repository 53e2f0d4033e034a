"""A study's declared comparisons: the questions it exists to answer, fixed before its first trial runs.

A space's `declare:` block names the comparisons (pairs of cells), the metric, the seeds (n fixed in
advance) and the correction families. The driver records the block in `declaration.json` in the sweep
folder when it first sees it, with the time; the analysis (rpevit/analysis/confirmatory.py) reports
exactly those comparisons as confirmatory, over exactly the declared seeds and only from rows that
started after the declaration was recorded; everything else it prints is exploratory. A declaration
that changes once rows exist is refused unless `sweep.py --redeclare` is given, which records the new
one beside the old: rows that started before it are then exploratory for every comparison. This is
what makes seeds added after a look, or a metric picked after the fact, visible by construction.

"Once rows exist" means once any trial of the sweep began (`trials_began`): a trial row, an epoch row, or a
trial folder (`trials/<key>/`: its log and checkpoints), so trials killed before the block was added (epoch
rows and checkpoints, no trial row yet) make it a redeclaration too. A declaration recorded with
`--redeclare` (a change, or a first one after trials began; `after_trials_began` in its entry) is a
redeclaration: the analysis says so, with what changed and when (`redeclarations`), in every text it writes.

declaration.json is checked whenever it is read (`read_record`): each entry's sha256 must be the digest of
the declaration it records and its recorded_at_utc the time of its recorded_at, so a hand edit (a raised
alpha, a dropped seed, a moved time) is refused in one line, not judged. Edit the space's `declare:` block and
run with `--redeclare` instead: that change is recorded, and shown.

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

import calendar
import hashlib
import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from rpevit.config import ConfigError, did_you_mean, field_types

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
    if _normal_side(a) == _normal_side(b):
        raise _bad(source, where, value, "two different sides (a cell compared with itself is 0 by construction)")
    return a, b


def _normal_side(side: Side) -> dict[str, Any]:
    """A side with its values as the trials hold them ({lr: 1} and {lr: 1.0} are one cell)."""
    return {k: _normal(k, v) for k, v in side.items()}


def _normal_pair(pair: Pair) -> tuple[dict[str, Any], dict[str, Any]]:
    return _normal_side(pair[0]), _normal_side(pair[1])


def _repeat_of(item: Any, earlier: list[Any], key: str, where: str, j: int, source: str, value: Any) -> None:
    """Refuse an item equal to an earlier one of its family (either way round): each is one more test in
    Holm's k, so a repeat would make every other item of the family harder to pass."""
    for i, other in enumerate(earlier):
        if item in other:
            raise _bad(source, f"{where}.{key}[{j}]", value, f"an item not already in the family (it repeats "
                       f"declare.{where}.{key}[{i}]; a repeat adds one to Holm's k)")


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
    for key in ("from", "to"):
        _trend_end(field, value[key], f"{where}.{key}", source)
    return Trend(field, _normal(field, start), _normal(field, end))


TREND_TEXT_VALUE = re.compile(r"[A-Za-z0-9_.+-]{1,100}")  # a config value as spaces write it: favor, ape+rope


def _trend_end(field: str, value: Any, where: str, source: str) -> None:
    """Refuse an end of a trend that is not a value of its field's type: it names the rungs in every generated
    table and sentence, so a string where epochs are numbers (HTML, a newline) would otherwise reach them."""
    kind = field_types()[field]
    if kind is str:
        ok, allowed = isinstance(value, str) and TREND_TEXT_VALUE.fullmatch(value), \
            "a value of the text field: letters, digits and _ . + - (at most 100)"
    elif kind is int:
        ok, allowed = isinstance(value, int) and not isinstance(value, bool), "an integer (the field is an int)"
    else:
        ok, allowed = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                       "a finite number (the field is a float)")
    if not ok:
        raise _bad(source, where, value, allowed)


def _family(fam: Any, where: str, source: str, names: set[str]) -> Family:
    if isinstance(fam, dict):
        for key in fam:
            if key not in FAMILY_KEYS:
                raise DeclarationError(f"{source}: unknown key declare.{where}.{key};"
                                       f"{did_you_mean(key, FAMILY_KEYS)} allowed: {', '.join(FAMILY_KEYS)}")
    if (not isinstance(fam, dict) or "name" not in fam
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
    seen: list[list[Any]] = []  # each earlier item, normalised, in both orders
    if "comparisons" in fam:
        for j, pair in enumerate(_items(fam, "comparisons", where, source)):
            pairs.append(_pair(pair, f"{where}.comparisons[{j}]", source, fixed_fields))
            a, b = _normal_pair(pairs[-1])
            _repeat_of((a, b), seen, "comparisons", where, j, source, pair)
            seen.append([(a, b), (b, a)])
    else:
        for j, contrast in enumerate(_items(fam, "contrasts", where, source)):
            at = f"{where}.contrasts[{j}]"
            if not isinstance(contrast, list) or len(contrast) != 2:
                raise _bad(source, at, contrast, "[[a1, b1], [a2, b2]]: two pairs, judged as (a1 - b1) - (a2 - b2)")
            first, second = (_pair(p, at, source, fixed_fields) for p in contrast)
            if first == second:
                raise _bad(source, at, contrast, "two different pairs")
            contrasts.append((first, second))
            (a1, b1), (a2, b2) = _normal_pair(first), _normal_pair(second)
            _repeat_of(((a1, b1), (a2, b2)), seen, "contrasts", where, j, source, contrast)
            seen.append([((a1, b1), (a2, b2)), ((b1, a1), (b2, a2)), ((a2, b2), (a1, b1)), ((b2, a2), (b1, a1))])
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
UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
UTC_SLACK_S = 2.0  # records before this check took recorded_at_utc from a second clock read, just after recorded_at
ENTRY_KEYS = ("sha256", "recorded_at", "recorded_at_utc", "declaration", "after_trials_began")
PARTS_DIR = "parts"  # rpevit.sweep.store.PARTS_DIR (not imported: store imports space, through protocol, and space imports this module)
TRIAL_FOLDERS = "trials"  # <sweep>/trials/<trial_key>/: a trial's log.txt and checkpoints
AFTER_TRIALS = "after_trials_began"  # in an entry recorded (with --redeclare) once trials of the sweep had begun


def utc_text(seconds: float) -> str:
    """'2026-11-26T11:11:48Z'."""
    return time.strftime(UTC_FORMAT, time.gmtime(seconds))


def trials_began(out_dir: str | os.PathLike) -> list[str]:
    """What in a sweep folder shows that trials of it began (empty: none did): trial rows (trials.parquet),
    epoch rows (epochs.parquet: a trial killed before its row was written leaves them), rows in parts/ (the
    store's flushes, before compaction), and trial folders under trials/ (each trial's log.txt and
    checkpoints, made as it starts). The driver records a declaration without --redeclare only where this is
    empty."""
    from rpevit.sweep.results import EPOCHS_FILE, TRIALS_FILE

    out_dir = Path(out_dir)
    found = [f"{what} ({name})" for name, what in ((TRIALS_FILE, "trial rows"), (EPOCHS_FILE, "epoch rows"))
             if os.path.lexists(out_dir / name)]
    for folder, what in ((PARTS_DIR, "row part(s) under parts/"), (TRIAL_FOLDERS, "trial folder(s) under trials/ "
                                                                                 "(logs, checkpoints)")):
        try:
            with os.scandir(out_dir / folder) as entries:
                count = sum(1 for _ in entries)
        except (FileNotFoundError, NotADirectoryError):
            count = 0
        if count:
            found.append(f"{count} {what}")
    return found


def _entry(value: Any, i: int, path: Path, previous_at: float) -> dict[str, Any]:
    """One entry of declaration.json, checked: its declaration re-validated, its sha256 that declaration's
    digest, its times consistent and in order. One line naming the field, the value and what is allowed."""
    where = f"{path}: declarations[{i}]"
    restore = ("allowed: the file the driver wrote (restore it from git; to change a declaration, edit the space's "
               "declare: block and run sweep.py --redeclare, which records the change and shows it)")
    required = {"sha256", "recorded_at", "declaration"}
    if not isinstance(value, dict) or set(value) - set(ENTRY_KEYS) or not required <= set(value):
        shown = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise DeclarationError(f"{where} has keys {shown!r}; allowed: sha256, recorded_at, declaration, optionally "
                               f"recorded_at_utc and {AFTER_TRIALS} (the entry the driver wrote)")
    entry = dict(value)
    entry["parsed"] = parse(entry["declaration"], f"{where}.declaration")
    digest = entry["parsed"].digest()
    if entry["sha256"] != digest:
        raise DeclarationError(f"{where}.sha256 has value {str(entry['sha256'])[:80]!r}, but the declaration it records "
                               f"hashes to {digest!r}: the file was edited after the driver wrote it; {restore}")
    at = entry["recorded_at"]
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at <= 0 or at < previous_at:
        raise DeclarationError(f"{where}.recorded_at has value {at!r}; allowed: Unix seconds, not before the entry "
                               f"above it; {restore}")
    entry["recorded_at"] = float(at)
    utc = entry.get("recorded_at_utc")
    if utc is not None:
        try:
            stamp = calendar.timegm(time.strptime(utc, UTC_FORMAT)) if isinstance(utc, str) else math.nan
        except ValueError:
            stamp = math.nan
        if not abs(stamp - at) <= UTC_SLACK_S:
            raise DeclarationError(f"{where}.recorded_at_utc has value {str(utc)[:40]!r}; allowed: the time of its "
                                   f"recorded_at, {utc_text(at)!r}; {restore}")
    if not isinstance(entry.get(AFTER_TRIALS, False), bool):
        raise DeclarationError(f"{where}.{AFTER_TRIALS} has value {entry[AFTER_TRIALS]!r}; allowed: true or false")
    return entry


MAX_RECORD_BYTES = 16 * 2**20  # declaration.json: a few kB per declaration; more is not a file the driver wrote


def read_record(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """declaration.json of a sweep folder (None: none). Untrusted: parsed as JSON, and each entry checked
    (`_entry`: its declaration re-validated, its stored sha256 that declaration's digest, its times
    consistent), so a hand-edited file is an error naming the field, not a declaration."""
    from rpevit.sweep.results import read_regular_bytes  # results reads this module's file name: import here

    path = Path(out_dir) / DECLARATION_FILE
    if not os.path.lexists(path):
        return None
    try:  # opened once, without following a link, never waiting on a FIFO (no check-then-read window)
        data = read_regular_bytes(path, MAX_RECORD_BYTES, "the file the driver wrote")
    except ConfigError as err:
        raise DeclarationError(str(err)) from None
    if data is None:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
    except (OSError, ValueError) as err:
        raise DeclarationError(f"{path} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                               f"allowed: the file the driver wrote (restore it from git)") from err
    if not isinstance(record, dict) or set(record) != {"declarations"} or not isinstance(record["declarations"], list):
        shown = str(sorted(record) if isinstance(record, dict) else record)[:80]
        raise DeclarationError(f"{path} holds {type(record).__name__} {shown}; allowed: the file the driver wrote, "
                               f"{{\"declarations\": [...]}} (restore it from git)")
    entries, previous_at = [], 0.0
    for i, value in enumerate(record["declarations"]):
        entries.append(_entry(value, i, path, previous_at))
        previous_at = entries[-1]["recorded_at"]
    if not entries:
        raise DeclarationError(f"{path} holds no declaration; allowed: the file the driver wrote")
    return {"declarations": entries}


def changes(old: Declaration, new: Declaration) -> list[str]:
    """What a redeclaration changed, one plain phrase each (names come from a file: escape them before Markdown):
    'seeds 0, 1, 2 → 0, 1, 2, 3, 4 (added 3, 4)', 'alpha 0.05 → 0.1', "family 'gap': its comparisons changed"."""
    out = []
    if old.question != new.question:
        out.append("question changed")
    if old.metric != new.metric:
        out.append(f"metric {old.metric} → {new.metric}")
    if old.seeds != new.seeds:
        added = [s for s in new.seeds if s not in old.seeds]
        removed = [s for s in old.seeds if s not in new.seeds]
        moved = "; ".join(part for part in (f"added {_ints(added)}" if added else "",
                                            f"removed {_ints(removed)}" if removed else "") if part)
        out.append(f"seeds {_ints(old.seeds)} → {_ints(new.seeds)}" + (f" ({moved})" if moved else " (reordered)"))
    if old.alpha != new.alpha:
        out.append(f"alpha {old.alpha:g} → {new.alpha:g}")
    before = {f.name: f.to_dict() for f in old.families}
    after = {f.name: f.to_dict() for f in new.families}
    out += [f"family {name!r} added" for name in after if name not in before]
    out += [f"family {name!r} removed" for name in before if name not in after]
    for name in (n for n in after if n in before and after[n] != before[n]):
        keys = [k for k in dict.fromkeys([*before[name], *after[name]]) if before[name].get(k) != after[name].get(k)]
        out.append(f"family {name!r}: its {', '.join(keys)} changed")
    if not out and [f.name for f in old.families] != [f.name for f in new.families]:
        out.append("families reordered")
    return out or ["the declaration changed"]


def _ints(values: Sequence[int]) -> str:
    return ", ".join(map(str, values))


def redeclarations(record: dict[str, Any]) -> list[tuple[float, list[str]]]:
    """Each time a declaration was recorded with --redeclare, and what it changed (plain phrases, as
    `changes`): an entry after the first, or a first one recorded once trials of the sweep had begun. Empty
    for a study declared once before its first trial."""
    out = []
    entries = record["declarations"]
    for i, entry in enumerate(entries):
        what = changes(entries[i - 1]["parsed"], entry["parsed"]) if i else []
        if entry.get(AFTER_TRIALS):
            what.append("declared after trials of the sweep had begun" if i == 0 else
                        "recorded after trials of the sweep had begun")
        if what:
            out.append((entry["recorded_at"], what))
    return out


def record(out_dir: Path, decl: Declaration | None, *, rows_exist: bool | Sequence[str], redeclare: bool) -> str | None:
    """Record the space's declaration in the sweep folder before any trial of this run starts. `rows_exist`:
    whether trials of the sweep began (truthy), as `trials_began` finds them (a list of what it found, named
    in the refusal). Returns a line for the driver to print (None when nothing changed)."""
    if decl is None:
        return None
    path = out_dir / DECLARATION_FILE
    old = read_record(out_dir)
    now = time.time()
    entry = {"sha256": decl.digest(), "recorded_at": now, "recorded_at_utc": utc_text(now),
             "declaration": decl.to_dict()}
    if old is not None and old["declarations"][-1]["sha256"] == entry["sha256"]:
        return None
    found = f" (found: {'; '.join(rows_exist)})" if rows_exist and not isinstance(rows_exist, bool) else ""
    if old is not None or rows_exist:
        if not redeclare:
            what = (f"changed after trials of this sweep ran{found}" if old is not None and rows_exist else
                    f"changed after it was recorded ({DECLARATION_FILE}, "
                    f"{utc_text(old['declarations'][-1]['recorded_at'])})" if old is not None else
                    f"was added after trials of this sweep ran{found}")
            raise DeclarationError(
                f"{out_dir}: the space's declare block {what}; allowed: the declaration recorded before the runs "
                f"({DECLARATION_FILE}), or --redeclare to record this one, which makes every row that started before "
                f"it exploratory and is shown, with what changed and when, wherever the study is reported")
    if rows_exist:
        entry[AFTER_TRIALS] = True
    entries = [] if old is None else [{k: v for k, v in e.items() if k != "parsed"} for e in old["declarations"]]
    entries.append(entry)
    from rpevit.sweep.results import atomic_file  # the one no-follow atomic writer of results files

    with atomic_file(path) as handle:
        handle.write(json.dumps({"declarations": entries}, indent=1).encode("utf-8"))
    items = sum(f.size for f in decl.families)
    return (f"declared comparisons recorded in {path} ({items} item(s) in {len(decl.families)} "
            f"famil{'y' if len(decl.families) == 1 else 'ies'}, metric {decl.metric}, seeds "
            f"{', '.join(map(str, decl.seeds))})"
            + ("; a redeclaration: rows that started before it are exploratory" if old or rows_exist else ""))


__all__ = ["AFTER_TRIALS", "DECLARATION_FILE", "Declaration", "DeclarationError", "Family", "Pair", "Side", "Trend",
           "changes", "check_against_space", "family_levels", "parse", "read_record", "record", "redeclarations",
           "trials_began", "utc_text"]
