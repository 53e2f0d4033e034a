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

Each side must match one cell of the space: trials that differ only in `seed` (and in the `for_each`
field, which the family fixes). Checked when the space is loaded, so `--dry-run` refuses a typo.
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
FAMILY_KEYS = ("name", "for_each", "comparisons")
CELL_FIELDS_EXCLUDED = ("seed", "data_dir")  # what may differ inside one cell


class DeclarationError(ConfigError):
    """A `declare:` block that cannot be used, or one that changed after rows were written."""


@dataclass(frozen=True)
class Family:
    name: str
    comparisons: tuple[tuple[dict[str, Any], dict[str, Any]], ...]
    for_each: str | None = None


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
        out["families"] = [{"name": f.name, "for_each": f.for_each,
                            "comparisons": [[dict(a), dict(b)] for a, b in f.comparisons]} for f in self.families]
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
        where = f"families[{i}]"
        if not isinstance(fam, dict) or set(fam) - set(FAMILY_KEYS) or "name" not in fam or "comparisons" not in fam:
            raise _bad(source, where, fam, f"a mapping with keys name, comparisons and optionally for_each")
        name = fam["name"]
        if not isinstance(name, str) or not name.strip() or "\n" in name or len(name) > 120 or name in names:
            raise _bad(source, f"{where}.name", name, "a unique one-line name (at most 120 characters)")
        names.add(name)
        for_each = fam.get("for_each")
        if for_each is not None and (for_each not in field_types() or for_each in CELL_FIELDS_EXCLUDED):
            raise _bad(source, f"{where}.for_each", for_each, "a config field other than seed and data_dir")
        pairs_in = fam["comparisons"]
        if not isinstance(pairs_in, list) or not pairs_in:
            raise _bad(source, f"{where}.comparisons", pairs_in, "a non-empty list of [a, b] pairs")
        pairs = []
        for j, pair in enumerate(pairs_in):
            if not isinstance(pair, list) or len(pair) != 2:
                raise _bad(source, f"{where}.comparisons[{j}]", pair, "a pair [a, b] of partial configs (a - b)")
            a, b = (_side(p, f"{where}.comparisons[{j}]", source) for p in pair)
            if for_each is not None and (for_each in a or for_each in b):
                raise _bad(source, f"{where}.comparisons[{j}]", pair, f"sides without {for_each!r}, which the "
                           f"family's for_each fixes")
            pairs.append((a, b))
        families.append(Family(name, tuple(pairs), for_each))
    return Declaration(metric, tuple(seeds), tuple(families), float(alpha), question)


def _matches(trial: dict[str, Any], side: dict[str, Any]) -> bool:
    return all(trial.get(k) == _normal(k, v) for k, v in side.items())


def _normal(name: str, value: Any) -> Any:
    kind = field_types()[name]
    return float(value) if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool) else value


def cell_of(trials: Sequence[dict[str, Any]], side: dict[str, Any], fixed: dict[str, Any]) -> list[int]:
    """Indices of the trials one side selects (with the family's for_each value in `fixed`)."""
    return [i for i, t in enumerate(trials) if _matches(t, {**side, **fixed})]


def check_against_space(decl: Declaration, trials: Sequence[dict[str, Any]], source: str) -> None:
    """Every side selects exactly one cell of the space (trials differing only in seed), holding every
    declared seed; refused otherwise with one line naming the family, the side and what it matched."""
    for fam in decl.families:
        values = sorted({t[fam.for_each] for t in trials}, key=repr) if fam.for_each else [None]
        for value in values:
            fixed = {fam.for_each: value} if fam.for_each else {}
            for j, pair in enumerate(fam.comparisons):
                for side in pair:
                    found = cell_of(trials, side, fixed)
                    where = f"family {fam.name!r}, comparison {j}, side {side}" + (f" at {fam.for_each}={value}"
                                                                                   if fixed else "")
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
                    missing = sorted(set(decl.seeds) - {trials[i]["seed"] for i in found})
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
    tmp = out_dir / f".{DECLARATION_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"declarations": entries}, handle, indent=1)
    os.replace(tmp, path)
    return (f"declared comparisons recorded in {path} ({sum(len(f.comparisons) for f in decl.families)} comparison(s) "
            f"in {len(decl.families)} famil{'y' if len(decl.families) == 1 else 'ies'}, metric {decl.metric}, seeds "
            f"{', '.join(map(str, decl.seeds))})" + ("; rows that started before it are exploratory" if old else ""))


__all__ = ["DECLARATION_FILE", "Declaration", "DeclarationError", "Family", "check_against_space", "parse",
           "read_record", "record"]
