"""YAML search space -> the explicit, validated list of trial configs of a sweep.

The driver expands every space itself (grid products, seeded samples, seeds, include/exclude)
and hands Tune that fixed list, so `--dry-run`, validation, the run and `--resume` all see the
same trials in the same order. Each trial is a full TrialConfig dict plus a stable `trial_key`.

Format (every key but `fixed`/`grid` optional):

    name: all12                 # results/<name>/; default: the file's stem
    task: train                 # train | bench | kernel_mse
    fixed: {dataset: digits, epochs: 2}
    grid: {attention: [softmax, favor], pe: [ape, rope]}     # cartesian product, or a LIST of
                                                             # such mappings: union of products
    sample: {lr: {loguniform: [1.0e-4, 1.0e-2]}}             # choice | uniform | loguniform |
    num_samples: 4                                           # randint [lo, hi) ; drawn per grid
    sample_seed: 0                                           # point from this seed
    seeds: [0, 1, 2]            # every trial crossed with these seeds
    exclude: [{attention: favor, pe: rope}]   # drop grid trials matching ALL keys of an entry
    include: [{attention: softmax, pe: ape+rope}]   # extra trials: entry over `fixed`, x seeds
    resources: {cpus_per_trial: 1, gpus_per_trial: 0.25, max_concurrent: 8}
    timing: {repeats: 3, interleave: true, warmup: true}     # timing tasks (bench) only
    fuse: seeds                 # trials differing only in seed train as one fused group (one Tune
                                # trial, stacked parameters: rpevit/tasks/train_group.py)
    branch: epochs              # a budget ladder: trials differing only in epochs (lr_schedule wsd)
                                # share one run up to each cool-down (rpevit/tasks/budget_ladder.py)
    declare: {...}              # the comparisons the study exists to answer, fixed before it runs
                                # (rpevit/sweep/declaration.py; reported by analysis/confirmatory.py)

Timing tasks (registered with `timing=True`: `bench`) never share a node with other trials: the runner reserves
the whole node for each (cpus_per_trial is then the measurement's thread count). `timing:`
asks for repeats (the row holds the median, plus min / max of train_step_ms), interleaved in
rounds over all variants inside one worker (A B C, A B C, ...) so that slow drift of the
machine hits every variant alike, and an untimed warm-up run before a worker's first timed one.

`fuse: seeds` (tasks with a group runner: train) makes one Tune trial of each set of pending
trials that differ only in their seed; every member keeps its own trial_key, rows and checkpoint,
so a fused and an unfused run of a space resume into one another, and seeds added later run as
a group of the new seeds only. `--dry-run` shows the groups.

`branch: epochs` (task train, `lr_schedule: wsd`) makes each set of trials that differ only in `epochs`
a budget ladder: the longest pending one (the trunk) runs first and writes each shorter one's
checkpoint at its cool-down start, from which that trial resumes as from an interrupted run of its
own (rpevit/tasks/budget_ladder.py). Every trial keeps its own key and row; Tune starts each
ladder's trunk before its shorter trials, which follow it (rpevit.sweep.launch_plan). `--dry-run`
shows which trunk each trial branches from.

Precedence: fixed < grid < sample < seeds < `--set` overrides. With `seeds:`, a `seed` in fixed, grid or
sample is refused (the list would overwrite it); `--set task=...` is refused (the task decides which of
timing, fuse and branch a space may hold: change it in the file); a field given twice to `--set` or
`--only` with different values is refused.

The number of trials is computed before anything is expanded and refused above `max_trials`
(DEFAULT_MAX_TRIALS, `sweep.py --max-trials`): a typo'd grid of 10^7 points would otherwise fill
memory before printing a line.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import yaml

from rpevit import registry
from rpevit.config import (FIRST_DEFAULTS, ConfigError, TrialConfig, did_you_mean, load_registry, registered_names,
                           resolve_values, unused_encoding_options)
from rpevit.tasks.budget_ladder import LADDER_FIELDS, check_ladder
from rpevit.tasks.grouping import GROUP_FIELDS, check_group
from rpevit.sweep import yaml_strict
from rpevit.sweep.declaration import Declaration, DeclarationError, check_against_space
from rpevit.sweep.declaration import parse as parse_declaration
from rpevit.sweep.results import KEY_LENGTH

TOP_LEVEL_KEYS = ("name", "description", "task", "fixed", "grid", "sample", "num_samples",
                  "sample_seed", "seeds", "exclude", "include", "resources", "timing", "fuse", "branch",
                  "declare")
FUSE_MODES = ("seeds",)  # `fuse: seeds`: trials that differ only in seed train as one group
BRANCH_MODES = ("epochs",)  # `branch: epochs`: trials that differ only in epochs form a budget ladder
SAMPLERS = ("choice", "uniform", "loguniform", "randint")
KEY_EXCLUDED_FIELDS = ("data_dir",)  # where the data lives does not change what a trial computes
DEFAULT_MAX_TRIALS = 10_000  # a sweep bigger than this is almost surely a typo; --max-trials raises it
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")  # one path component; no '.', '..', '.x'
NAME_ALLOWED = "1-100 letters, digits, '_', '.', '-', not starting with '.' (one folder name)"
RAY_RESOURCE_GRANULARITY = 1e-4  # Ray's MIN_RESOURCE_GRANULARITY (a copy: dry runs do not import Ray)
MAX_SPACE_BYTES = 4 * 2**20  # a space file is a few KB; more is a wrong path (a binary, /dev/zero)


class SpaceError(ConfigError):
    """A search space that cannot run; the message names file, key, value and what is allowed."""


@dataclass
class Resources:
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_concurrent: int = 0  # 0 = as many as the cluster fits

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str) -> "Resources":
        _known_keys(values, "resources", [f.name for f in fields(cls)], source)
        for key, value in values.items():
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or value < 0):
                raise SpaceError(f"{source}: resources.{key} has value {value!r}; allowed: a finite number >= 0")
        if "max_concurrent" in values and not isinstance(values["max_concurrent"], int):
            raise SpaceError(f"{source}: resources.max_concurrent has value {values['max_concurrent']!r}; "
                             f"allowed: an integer >= 0 (0 = as many as fit)")
        res = cls(**{k: type(getattr(cls, k))(v) for k, v in values.items()})
        if res.cpus_per_trial <= 0:
            raise SpaceError(f"{source}: resources.cpus_per_trial has value {res.cpus_per_trial!r}; "
                             f"allowed: a number > 0")
        if res.gpus_per_trial > 1 and not float(res.gpus_per_trial).is_integer():
            raise SpaceError(f"{source}: resources.gpus_per_trial has value {res.gpus_per_trial!r}; "
                             f"allowed: a fraction in [0, 1] or a whole number of GPUs")
        for key in ("cpus_per_trial", "gpus_per_trial"):  # Ray fails on finer shares only after it started
            value = getattr(res, key)
            if 0 < value < RAY_RESOURCE_GRANULARITY:
                raise SpaceError(f"{source}: resources.{key} has value {value!r}; allowed: 0"
                                 f"{' (no GPU)' if key.startswith('gpu') else ''} or at least "
                                 f"{RAY_RESOURCE_GRANULARITY:g} (Ray's resource precision: 1/10,000 of a unit)")
        return res

    def with_overrides(self, cpus_per_trial: float | None, gpus_per_trial: float | None,
                       max_concurrent: int | None, source: str) -> "Resources":
        """These resources with the command line's values where it gave one (None: keep), checked
        as a whole: the one merge of a space's resources and sweep.py's flags."""
        given = {"cpus_per_trial": cpus_per_trial, "gpus_per_trial": gpus_per_trial, "max_concurrent": max_concurrent}
        return Resources.from_dict({**vars(self), **{k: v for k, v in given.items() if v is not None}},
                                   source=f"{source} + command line")


@dataclass(frozen=True)
class Timing:
    """How a timing space measures (`timing:`); see the module docstring."""

    repeats: int = 1  # timed runs per variant; the row holds their median
    interleave: bool = False  # repeats in rounds over all variants, in one worker
    warmup: bool = True  # an untimed run before the first timed run of each worker

    @classmethod
    def from_dict(cls, values: Any, source: str, task: str) -> "Timing":
        values = {} if values is None else values  # `timing:` with nothing under it
        load_registry()
        if isinstance(values, dict) and values and task not in registry.TIMING_TASKS:
            raise SpaceError(f"{source}: 'timing' is given for task {task!r}; allowed: only for timing tasks "
                             f"({', '.join(sorted(registry.TIMING_TASKS))}); remove the key")
        _known_keys(values, "timing", [f.name for f in fields(cls)], source)
        for key, value in values.items():
            if key == "repeats":
                _count(value, "timing.repeats", source)
            elif not isinstance(value, bool):
                raise SpaceError(f"{source}: timing.{key} has value {value!r}; allowed: true or false")
        timing = cls(**values)
        if timing.interleave and timing.repeats < 2:
            raise SpaceError(f"{source}: timing.interleave is true with timing.repeats {timing.repeats}; allowed: "
                             f"repeats >= 2 (one repeat has nothing to interleave), or interleave: false")
        return timing


@dataclass
class Space:
    name: str
    task: str
    source: str
    trials: list[dict[str, Any]]  # full TrialConfig dicts, in run order
    keys: list[str]  # trial_key of each trial
    resources: Resources = field(default_factory=Resources)
    duplicates_dropped: int = 0
    timing: Timing = field(default_factory=Timing)
    whole_keys: list[str] | None = None  # with `--only`: the keys of the whole space, which stay current
    fuse: str | None = None  # `fuse: seeds`, or None
    branch: str | None = None  # `branch: epochs` (budget ladders), or None
    declaration: Declaration | None = None  # `declare:`, checked against the trials
    # trial key -> the key the same trial had before keys hashed the resolved config (where they differ):
    # the runner renames checkpoint folders of sweeps started before (rpevit.sweep.migrate)
    legacy_keys: dict[str, str] = field(default_factory=dict)

    @property
    def current_keys(self) -> list[str]:
        """The keys whose rows count as this space's (space.json): with `--only`, those of the whole
        space, so running one part into a folder never sets the other parts' rows aside."""
        return self.keys if self.whole_keys is None else self.whole_keys

    @property
    def exclusive(self) -> bool:
        """Whether each trial gets a whole node to itself (timing tasks: their rows are times)."""
        load_registry()
        return self.task in registry.TIMING_TASKS

    def varying_fields(self) -> list[str]:
        """Config fields whose value differs between trials: what identifies a trial (cached: the
        runner labels every trial with it)."""
        cached = self.__dict__.get("_varying")
        if cached is not None and cached[0] == id(self.trials) and cached[1] == len(self.trials):
            return cached[2]
        names = [f.name for f in fields(TrialConfig) if f.name not in KEY_EXCLUDED_FIELDS]
        varying = [n for n in names if len({repr(t[n]) for t in self.trials}) > 1]
        self.__dict__["_varying"] = (id(self.trials), len(self.trials), varying)
        return varying

    def label(self, index: int) -> str:
        """The trial's varying fields as `name=value`, without an option of an encoding it does not use
        (softmax+ape is not labelled with the luo_scale default it never reads)."""
        trial = self.trials[index]
        unused = unused_encoding_options(trial.get("pe", TrialConfig.pe))
        return " ".join(f"{n}={trial[n]}" for n in self.varying_fields() if n not in unused) or self.keys[index]

    def groups(self, indices: list[int] | None = None) -> list[list[int]]:
        """The Tune trials of the given trials (default: all), as lists of trial indices in space
        order: with `fuse: seeds`, trials equal in every field but GROUP_FIELDS share one; else one each."""
        indices = list(range(len(self.trials))) if indices is None else indices
        if self.fuse is None:
            return [[i] for i in indices]
        grouped: dict[str, list[int]] = {}
        for i in indices:
            grouped.setdefault(_group_key(self.trials[i]), []).append(i)
        return list(grouped.values())

    def ladders(self, indices: list[int] | None = None) -> list[list[int]]:
        """With `branch: epochs`, the budget ladders among the given trials (default: all): trials equal
        in every field but LADDER_FIELDS, each ladder longest first (the trunk, then its branches)."""
        indices = list(range(len(self.trials))) if indices is None else indices
        grouped: dict[str, list[int]] = {}
        for i in indices:
            grouped.setdefault(_group_key(self.trials[i], LADDER_FIELDS) if self.branch else str(i), []).append(i)
        return [sorted(g, key=lambda i: -self.trials[i]["epochs"]) for g in grouped.values()]

    def table(self) -> str:
        """One row per trial with its differing values (the dry-run view); with `fuse`, the group of each;
        with `branch`, the trial each branches from."""
        extra = "group" if self.fuse else "branches from" if self.branch else None
        columns = ["#", "trial_key", *([extra] if extra else []), *self.varying_fields()]
        group_of = {i: g for g, members in enumerate(self.groups()) for i in members}
        trunk_of = {i: ladder[0] for ladder in self.ladders() for i in ladder[1:]}

        def extra_cell(i: int) -> list[str]:
            if self.fuse:
                return [f"g{group_of[i]} ({len(self.groups()[group_of[i]])})"]
            if self.branch:
                return [f"#{trunk_of[i]}" if i in trunk_of else "(trunk)"]
            return []

        def cell(trial: dict[str, Any], name: str) -> str:  # an option its encoding never reads: '-', not 0.0
            return "-" if name in unused_encoding_options(trial.get("pe", TrialConfig.pe)) else str(trial[name])

        rows = [[str(i), key, *extra_cell(i), *(cell(t, c) for c in columns[3 if extra else 2:])]
                for i, (t, key) in enumerate(zip(self.trials, self.keys))]
        widths = [max(len(c), *(len(r[j]) for r in rows)) for j, c in enumerate(columns)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        return "\n".join([line(columns), *(line(r) for r in rows)])


def trial_key(config: dict[str, Any]) -> str:
    """Stable id of a trial: a hash of its non-default config values (minus the data location).

    Hashing only what differs from the defaults keeps keys (and so `--resume`) stable when new
    fields with defaults are added to TrialConfig. Spaces hash the resolved config
    (rpevit.config.resolve_values): `batch_size: 0` and the recipe's 128 are one trial. The hashed
    text is `json.dumps` of those values with sorted keys, built from `key_fragments`.
    """
    return _hashed([text for _, text in key_fragments(config)])


def key_fragments(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, '"field": <JSON value>') for each value the key hashes, by field name: not the data
    location, not an option of an encoding the trial does not use (its value follows the current
    default, which may have moved since a key was made: luo_scale 10 -> 1000), not a baseline value."""
    unused = unused_encoding_options(config.get("pe", TrialConfig.pe))
    return [(k, f"{json.dumps(k)}: {json.dumps(v)}") for k, v in sorted(config.items())
            if k not in KEY_EXCLUDED_FIELDS and k not in unused and v != KEY_BASELINE.get(k)]


def seeded_keys(config: dict[str, Any], seeds: list[Any]) -> list[str]:
    """[trial_key({**config, "seed": s}) for s in seeds], the other fields encoded once: the keys of one
    configuration's seeds (the analysis recomputes 10^5 keys so, rpevit.sweep.migrate.resolved_frame)."""
    fragments = key_fragments({k: v for k, v in config.items() if k != "seed"})
    before, after = [t for k, t in fragments if k < "seed"], [t for k, t in fragments if k > "seed"]
    baseline, name = KEY_BASELINE.get("seed"), json.dumps("seed")
    return [_hashed(before + after if seed == baseline else [*before, f"{name}: {json.dumps(seed)}", *after])
            for seed in seeds]


def _hashed(fragments: list[str]) -> str:
    return hashlib.sha1(("{" + ", ".join(fragments) + "}").encode()).hexdigest()[:KEY_LENGTH]


def parse_value(text: str) -> Any:
    """A scalar as YAML 1.2 reads it ('3' -> 3, '1e-3' -> 0.001, 'rope' -> 'rope'; rpevit.sweep.yaml_strict)."""
    return yaml_strict.load(text)


def parse_overrides(items: list[str] | None, flag: str = "--set") -> dict[str, Any]:
    """`--set field=value` (or `--only field=value`) pairs -> {field: value}; fields are checked
    with the trial configs."""
    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SpaceError(f"{flag} has value {item!r}; allowed: field=value")
        try:
            parsed = parse_value(value)
        except yaml.YAMLError as err:
            reason = " ".join(str(err).split())[:200]
            raise SpaceError(f"{flag} {name.strip()} has value {value!r}, which is not valid YAML ({reason}); "
                             f"allowed: one YAML scalar, e.g. 3, 1.0e-3, rope") from err
        if parsed is None or isinstance(parsed, (list, dict)):
            raise SpaceError(f"{flag} {name.strip()} has value {value!r} (read as {parsed!r}); allowed: one "
                             f"YAML scalar, e.g. 3, 1.0e-3, rope")
        name = name.strip()
        if name in out and (out[name] != parsed or type(out[name]) is not type(parsed)):  # not: last one wins
            raise SpaceError(f"{flag} {name} is given twice, with values {out[name]!r} and {parsed!r}; allowed: "
                             f"one value per field")
        out[name] = parsed
    return out


def check_name(name: Any, where: str) -> str:
    """A sweep name is one folder name under --results-dir: `..` or `a/b` would write elsewhere."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise SpaceError(f"{where} has value {name!r}; allowed: {NAME_ALLOWED}")
    return name


def count_trials(grids: list[dict[str, list]], num_samples: int, seeds: list[int] | None,
                 include: list[dict[str, Any]]) -> int:
    """How many trials a space expands to before exclude / de-duplication: an upper bound,
    computed from the list lengths without building anything."""
    per_seed = len(seeds) if seeds else 1
    grid_points = sum(math.prod(len(v) for v in grid.values()) for grid in grids)
    extra = sum(1 if (seeds is None or "seed" in entry) else per_seed for entry in include)
    return num_samples * grid_points * per_seed + extra


@contextmanager
def open_regular_file(path: Path, what: str, allowed: str) -> Iterator[BinaryIO]:
    """`path` opened for reading only if it is a regular file: a FIFO would block in open() until a
    writer came, a device (/dev/zero) never ends. Opened without blocking, then checked on the open
    file itself (fstat), so nothing can be swapped in between; SpaceError names what it is instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):
        os.close(fd)
        found = ("a named pipe (FIFO)" if stat.S_ISFIFO(kind) else "a folder" if stat.S_ISDIR(kind) else
                 "a device" if stat.S_ISCHR(kind) or stat.S_ISBLK(kind) else "a socket" if stat.S_ISSOCK(kind) else
                 "not a regular file")
        raise SpaceError(f"{path}: {what} is {found}; allowed: {allowed} (a regular file)")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as handle:
        yield handle


def load_space(path: str | Path, overrides: dict[str, Any] | None = None,
               max_trials: int = DEFAULT_MAX_TRIALS, only: dict[str, Any] | None = None) -> Space:
    """Read, expand and validate a YAML space file."""
    path = Path(path)
    try:
        with open_regular_file(path, "the space file", "a YAML space file") as handle:
            raw = handle.read(MAX_SPACE_BYTES + 1)
        if len(raw) > MAX_SPACE_BYTES:
            raise SpaceError(f"{path}: the space file is larger than {MAX_SPACE_BYTES:,} bytes; allowed: a YAML "
                             f"space of at most {MAX_SPACE_BYTES:,} bytes")
        spec = yaml_strict.load(raw.decode("utf-8"))
    except OSError as err:
        raise SpaceError(f"{path}: cannot read the space file ({err})") from err
    except UnicodeDecodeError as err:
        raise SpaceError(f"{path}: not UTF-8 text (byte {raw[err.start:err.start + 1]!r} at offset {err.start}); "
                         f"allowed: a UTF-8 YAML space file") from err
    except yaml.YAMLError as err:
        raise SpaceError(f"{path}: not valid YAML ({err})") from err
    if isinstance(spec, dict) and "name" in spec and not isinstance(spec["name"], str):
        check_name(spec["name"], f"{path}: 'name'")  # `name:`, `name: 1e3`: not str()'d into 'None', '1000.0'
    return expand_space(spec, source=str(path), default_name=path.stem, overrides=overrides,
                        max_trials=max_trials, only=only)


def expand_space(spec: Any, *, source: str = "space", default_name: str = "sweep",
                 overrides: dict[str, Any] | None = None, max_trials: int = DEFAULT_MAX_TRIALS,
                 only: dict[str, Any] | None = None) -> Space:
    """The explicit trial list of a parsed space (see the module docstring for the format).

    `only` ({field: value}, `sweep.py --only`) keeps the trials whose final config has every one
    of those values, e.g. the CIFAR-10 half of all12.yaml. Their keys are the ones the whole space
    gives them, and `whole_keys` keeps the whole space's, so a part and the whole resume into one
    another. The steps: read the keys (`_read_spec`), refuse a space too big before building it
    (`_check_size`), expand grid x samples x seeds, exclude and include (`_value_sets`), validate,
    resolve and key every trial (`_resolved_trials`), check what the trials must hold together
    (`_check_trials`)."""
    parts = _read_spec(spec, source, default_name)
    overrides = dict(overrides or {})
    _check_fields(overrides, "--set", source)
    if "task" in overrides:  # the task decides which space keys hold (timing, fuse, branch): read with the file
        raise SpaceError(f"{source}: --set task has value {overrides['task']!r}; allowed: change task in the space "
                         f"file, where its task-level keys (timing, fuse, branch) are checked")
    only = dict(only or {})
    _check_fields(only, "--only", source)
    _check_size(parts, max_trials, source)
    _check_no_seed_beside_seeds(parts.fixed, parts.grids, parts.samplers, parts.seeds,
                                isinstance(spec.get("grid"), list), source)
    values = _value_sets(parts, source)
    kept = _resolved_trials(values, parts.fixed, overrides, only, source)
    space = Space(name=parts.name, task=parts.task, source=source, trials=kept.configs, keys=kept.keys,
                  resources=parts.resources, duplicates_dropped=len(values) - len(kept.whole_keys),
                  timing=parts.timing, whole_keys=kept.whole_keys if only else None, fuse=parts.fuse,
                  branch=parts.branch, declaration=parts.declaration, legacy_keys=kept.legacy)
    _check_trials(space, parts.declaration, whole=not only)
    return space


@dataclass
class _SpecParts:
    """A space file's keys, each read and checked (expand_space's first step)."""

    name: str
    task: str
    fixed: dict[str, Any]  # with the task
    grids: list[dict[str, list]]
    samplers: dict[str, tuple[str, list]]
    num_samples: int
    sample_seed: int
    seeds: list[int] | None
    exclude: list[dict[str, Any]]
    include: list[dict[str, Any]]
    resources: Resources
    timing: Timing
    fuse: str | None
    branch: str | None
    declaration: Declaration | None


def _read_spec(spec: Any, source: str, default_name: str) -> _SpecParts:
    """Every top-level key of a parsed space, checked on its own (SpaceError naming the key otherwise)."""
    if not isinstance(spec, dict):
        raise SpaceError(f"{source}: the file holds {type(spec).__name__}; allowed: a mapping with "
                         f"keys {', '.join(TOP_LEVEL_KEYS)}")
    for key in spec:
        if key not in TOP_LEVEL_KEYS:
            raise SpaceError(f"{source}: unknown key {key!r};{did_you_mean(key, TOP_LEVEL_KEYS)} allowed: "
                             f"{', '.join(TOP_LEVEL_KEYS)}")
    name = check_name(str(spec.get("name", default_name)), f"{source}: 'name'")
    fixed = _mapping(spec.get("fixed", {}), "fixed", source)
    task = spec.get("task", fixed.get("task", "train"))
    _check_task(task, "'task'" if "task" in spec else "fixed.task", source)
    if "task" in fixed and fixed["task"] != task:
        _check_task(fixed["task"], "fixed.task", source)
        raise SpaceError(f"{source}: 'task' is {task!r} but fixed.task is {fixed['task']!r}; give it once")
    grids = _grids(spec.get("grid", {}), source)  # each key checked in the order the messages are expected
    samplers = _samplers(spec.get("sample", {}), source)
    num_samples = _count(spec.get("num_samples", 1), "num_samples", source)
    if samplers and "num_samples" not in spec:
        raise SpaceError(f"{source}: 'sample' is given without 'num_samples'; allowed: an integer >= 1")
    sample_seed = _count(spec.get("sample_seed", 0), "sample_seed", source, minimum=0)
    seeds = _seeds(spec.get("seeds"), source)
    exclude = _partials(spec.get("exclude", []), "exclude", source)
    include = _partials(spec.get("include", []), "include", source)
    resources = Resources.from_dict(spec.get("resources", {}), source)
    timing = Timing.from_dict(spec.get("timing", {}), source, task)
    fuse = _fuse(spec.get("fuse"), task, source)
    branch = _branch(spec.get("branch"), task, fuse, source)
    try:
        declaration = parse_declaration(spec["declare"], source) if spec.get("declare") is not None else None
    except DeclarationError as err:
        raise SpaceError(str(err)) from err
    return _SpecParts(name, task, {**fixed, "task": task}, grids, samplers, num_samples, sample_seed, seeds, exclude,
                      include, resources, timing, fuse, branch, declaration)


def _check_task(task: Any, where: str, source: str) -> None:
    """The space's task is one registered task name: checked before it is used (a key of the task tables)."""
    load_registry()
    if not isinstance(task, str) or task not in registry.TASKS:
        raise SpaceError(f"{source}: {where} has value {task!r}; allowed: one task name: {registered_names('task')}")


def _check_no_seed_beside_seeds(fixed: dict[str, Any], grids: list[dict[str, list]],
                                samplers: dict[str, tuple[str, list]], seeds: list[int] | None,
                                grid_list: bool, source: str) -> None:
    """With `seeds:`, every trial's seed is set from that list (after fixed, grid and sample): a `seed`
    in fixed, grid or sample would be overwritten without a word, so it is refused (include entries may
    give one: they are not crossed with the seeds)."""
    if seeds is None:
        return
    givers = [("fixed", fixed), *((f"grid[{j}]" if grid_list else "grid", g) for j, g in enumerate(grids)),
              ("sample", {k: {kind: args} for k, (kind, args) in samplers.items()})]
    for where, values in givers:
        if "seed" in values:
            raise SpaceError(f"{source}: {where}.seed has value {values['seed']!r} beside 'seeds' {seeds}, which "
                             f"sets every trial's seed; allowed: the seeds: list (remove {where}.seed, or put "
                             f"those seeds in seeds:)")


def _check_size(parts: _SpecParts, max_trials: int, source: str) -> None:
    """Refuse a space that expands to more than max_trials trials, counted before anything is built."""
    total = count_trials(parts.grids, parts.num_samples, parts.seeds, parts.include)
    if total > max_trials:
        sizes = " + ".join("x".join(str(len(v)) for v in g.values()) or "1" for g in parts.grids)
        raise SpaceError(f"{source}: the space expands to {total:,} trials (num_samples {parts.num_samples} x grid "
                         f"points {sizes} x {len(parts.seeds) if parts.seeds else 1} seed(s), + "
                         f"{len(parts.include)} include); allowed: at most {max_trials:,} (raise the limit with "
                         f"--max-trials)")


def _value_sets(parts: _SpecParts, source: str) -> list[dict[str, Any]]:
    """The trials' values before validation: per sample, each grid point (fixed < grid < sample < seeds),
    crossed with the seeds; the excluded ones dropped (an entry that matches nothing is refused: a
    typo); then the included ones (over `fixed`, crossed with the seeds unless they give one)."""
    rng = random.Random(parts.sample_seed)
    grid_trials: list[dict[str, Any]] = []
    for _ in range(parts.num_samples):
        for grid in parts.grids:
            for point in _product(grid):
                sampled = {k: _draw(rng, kind, args) for k, (kind, args) in parts.samplers.items()}
                grid_trials.extend(_with_seeds({**parts.fixed, **point, **sampled}, parts.seeds))
    trials = _without_excluded(grid_trials, parts.exclude, source)
    for entry in parts.include:
        trials.extend(_with_seeds({**parts.fixed, **entry}, parts.seeds if "seed" not in entry else None))
    if not trials:
        raise SpaceError(f"{source}: the space expands to no trials; allowed: at least one")
    return trials


@dataclass
class _Resolved:
    """The trials a space keeps, validated and resolved, with their keys (expand_space)."""

    configs: list[dict[str, Any]] = field(default_factory=list)  # resolved TrialConfig dicts, `only` applied
    keys: list[str] = field(default_factory=list)
    whole_keys: list[str] = field(default_factory=list)  # every distinct trial's key, before `only`
    legacy: dict[str, str] = field(default_factory=dict)  # key -> the key of its unresolved config, where they differ


def _resolved_trials(values: list[dict[str, Any]], fixed: dict[str, Any], overrides: dict[str, Any],
                     only: dict[str, Any], source: str) -> _Resolved:
    """Each value set with the --set overrides, validated (TrialConfig), resolved and keyed; duplicates
    (an equal resolved config) dropped; with `only`, the trials holding every one of its values kept."""
    kept, seen = _Resolved(), set()
    occurring: dict[str, set[str]] = {k: set() for k in only}  # for the message if `only` keeps none
    for i, trial in enumerate(values):
        trial = {**trial, **overrides}
        try:
            cfg = TrialConfig.from_dict(trial, source=source)
        except ConfigError:  # again, for the message: naming the trial costs time, so only on error
            cfg = TrialConfig.from_dict(trial, source=f"{source}: trial #{i} {_short(trial, fixed)}")
        requested = cfg.to_dict()
        full = resolve_values(requested)  # what runs: keys and rows hold resolved values, not placeholders
        key = trial_key(full)
        if key in seen:
            continue
        seen.add(key)
        if full != requested:
            kept.legacy[key] = trial_key(requested)
        kept.whole_keys.append(key)
        for k in only:
            occurring[k].add(str(full[k]))
        if any(full[k] != v for k, v in only.items()):
            continue
        kept.configs.append(full)
        kept.keys.append(key)
    if not kept.configs:  # only `only` can empty the list here: the space itself was checked before
        asked = " ".join(f"{k}={v}" for k, v in only.items())
        found = "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in occurring.items())
        raise SpaceError(f"{source}: --only {asked} matches no trial; allowed: values that occur in the space "
                         f"({found})")
    return kept


def _check_trials(space: Space, declaration: Declaration | None, whole: bool) -> None:
    """What the trials must hold together: the declared cells (for the whole space only: with --only
    the space is a part, whose trials need not hold every cell), each fused group, each budget ladder."""
    source, configs = space.source, space.trials
    if declaration is not None and whole:
        try:
            check_against_space(declaration, configs, source)
        except DeclarationError as err:
            raise SpaceError(str(err)) from err
    if space.fuse is not None:
        for members in space.groups():
            try:
                check_group([TrialConfig.from_dict(configs[i], source=source) for i in members])
            except ConfigError as err:
                raise SpaceError(f"{source}: 'fuse' has value {space.fuse!r} but {err}") from err
    if space.branch is not None:
        for ladder in space.ladders():
            try:
                check_ladder([TrialConfig.from_dict(configs[i], source=source) for i in ladder],
                             source=f"{source}: 'branch' has value {space.branch!r} but trial #{ladder[0]}'s ladder")
            except ConfigError as err:
                raise SpaceError(str(err)) from err


# ---- pieces ----
_FIELDS = tuple(f.name for f in fields(TrialConfig))
_DEFAULTS = {f.name: f.default for f in fields(TrialConfig)}
# What trial keys hash against: the defaults, except where a default changed after results were keyed
# (rpevit.config.FIRST_DEFAULTS: redraw_interval, luo_scale, init, grad_clip): a changed default must not
# change the key of a trial already run, so the baseline keeps the value the first keys were made with.
KEY_BASELINE = {**_DEFAULTS, **FIRST_DEFAULTS}


def _check_fields(values: dict[str, Any], where: str, source: str) -> None:
    """A key that is not a config field is refused in one line; a typo close to a field names that field
    first ("did you mean 'epochs'?") and points to the list instead of printing all ~70 fields."""
    for key in values:
        if key not in _FIELDS:
            hint = did_you_mean(key, _FIELDS)
            allowed = (f"a TrialConfig field ({len(_FIELDS)} of them: python sweep.py --fields lists each with its "
                       f"help)" if hint else f"{', '.join(_FIELDS)} (each described by: python sweep.py --fields)")
            raise SpaceError(f"{source}: {where} key {key!r} is not a TrialConfig field;{hint} allowed: {allowed}")


def _known_keys(values: Any, name: str, allowed: list[str], source: str) -> None:
    """`values` (the space's `name:` section) is a mapping whose every key is one of `allowed`."""
    if not isinstance(values, dict):
        raise SpaceError(f"{source}: {name!r} has value {values!r}; allowed: a mapping of {', '.join(allowed)}")
    for key in values:
        if key not in allowed:
            raise SpaceError(f"{source}: unknown key {name}.{key};{did_you_mean(key, allowed)} allowed: "
                             f"{', '.join(allowed)}")


def _mapping(value: Any, where: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpaceError(f"{source}: {where!r} has value {value!r}; allowed: a mapping field -> value")
    _check_fields(value, where, source)
    return dict(value)


def _grids(value: Any, source: str) -> list[dict[str, list]]:
    grids = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        raise SpaceError(f"{source}: 'grid' is an empty list; allowed: a mapping or a non-empty list of mappings")
    out = []
    for j, grid in enumerate(grids):
        where = "grid" if not isinstance(value, list) else f"grid[{j}]"
        grid = _mapping(grid, where, source)
        for key, options in grid.items():
            if not isinstance(options, list):
                raise SpaceError(f"{source}: {where}.{key} has value {options!r}; allowed: a list of values")
            if not options:
                raise SpaceError(f"{source}: {where}.{key} is an empty list; allowed: at least one value")
        out.append(grid)
    return out


def _product(grid: dict[str, list]) -> list[dict[str, Any]]:
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def _samplers(value: Any, source: str) -> dict[str, tuple[str, list]]:
    sample = _mapping(value, "sample", source)
    out = {}
    for key, spec in sample.items():
        allowed = "{choice: [v, ...]} | {uniform: [lo, hi]} | {loguniform: [lo, hi]} | {randint: [lo, hi]}"
        if not (isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in SAMPLERS):
            raise SpaceError(f"{source}: sample.{key} has value {spec!r}; allowed: {allowed}")
        kind, args = next(iter(spec.items()))
        if not isinstance(args, list) or not args:
            raise SpaceError(f"{source}: sample.{key}.{kind} has value {args!r}; allowed: a non-empty list")
        if kind != "choice":
            numeric = all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
            if len(args) != 2 or not numeric or not args[0] < args[1]:
                raise SpaceError(f"{source}: sample.{key}.{kind} has value {args!r}; allowed: [lo, hi] "
                                 f"numbers with lo < hi")
            if kind == "loguniform" and args[0] <= 0:
                raise SpaceError(f"{source}: sample.{key}.loguniform has value {args!r}; allowed: 0 < lo < hi")
            if kind == "randint" and not all(isinstance(a, int) for a in args):
                raise SpaceError(f"{source}: sample.{key}.randint has value {args!r}; allowed: integers lo < hi")
        out[key] = (kind, args)
    return out


def _draw(rng: random.Random, kind: str, args: list) -> Any:
    if kind == "choice":
        return args[rng.randrange(len(args))]
    if kind == "uniform":
        return rng.uniform(args[0], args[1])
    if kind == "loguniform":
        return math.exp(rng.uniform(math.log(args[0]), math.log(args[1])))
    return rng.randrange(args[0], args[1])  # randint: [lo, hi) as in Tune


def _fuse(value: Any, task: str, source: str) -> str | None:
    """`fuse`: absent/null, or one of FUSE_MODES for a task that has a fused-group runner."""
    if value is None:
        return None
    if value not in FUSE_MODES:
        raise SpaceError(f"{source}: 'fuse' has value {value!r}; allowed: {', '.join(FUSE_MODES)} (or leave it out)")
    if task not in registry.GROUP_TASKS:
        raise SpaceError(f"{source}: 'fuse' is given for task {task!r}; allowed: only for tasks with a fused-group "
                         f"runner ({', '.join(sorted(registry.GROUP_TASKS)) or 'none'}); remove the key")
    return value


def _branch(value: Any, task: str, fuse: str | None, source: str) -> str | None:
    """`branch`: absent/null, or one of BRANCH_MODES, for the train task, unfused."""
    if value is None:
        return None
    if value not in BRANCH_MODES:
        raise SpaceError(f"{source}: 'branch' has value {value!r}; allowed: {', '.join(BRANCH_MODES)} (or leave it out)")
    if task != "train":
        raise SpaceError(f"{source}: 'branch' is given for task {task!r}; allowed: only for task train; remove the key")
    if fuse is not None:
        raise SpaceError(f"{source}: 'branch' has value {value!r} beside 'fuse: {fuse}'; allowed: one of the two "
                         f"(fused groups do not write branch checkpoints yet): remove one key")
    return value


def _group_key(trial: dict[str, Any], differing: tuple[str, ...] = GROUP_FIELDS) -> str:
    """What the trials of one group share: every field but `differing` (fused groups: GROUP_FIELDS; budget
    ladders: LADDER_FIELDS) and where the data lives."""
    shared = {k: v for k, v in trial.items() if k not in differing and k not in KEY_EXCLUDED_FIELDS}
    return json.dumps(shared, sort_keys=True)


def _count(value: Any, where: str, source: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpaceError(f"{source}: {where!r} has value {value!r}; allowed: an integer >= {minimum}")
    return value


def _seeds(value: Any, source: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise SpaceError(f"{source}: 'seeds' has value {value!r}; allowed: a non-empty list of integers >= 0")
    for seed in value:
        _count(seed, "seeds", source, minimum=0)
    return value


def _with_seeds(values: dict[str, Any], seeds: list[int] | None) -> list[dict[str, Any]]:
    return [values] if seeds is None else [{**values, "seed": s} for s in seeds]


def _partials(value: Any, where: str, source: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise SpaceError(f"{source}: {where!r} has value {value!r}; allowed: a list of partial configs")
    out = []
    for j, entry in enumerate(value):
        entry = _mapping(entry, f"{where}[{j}]", source)
        if not entry:
            raise SpaceError(f"{source}: {where}[{j}] is empty; allowed: a mapping of at least one field")
        out.append(entry)
    return out


def _matches_full(full: dict[str, Any], partial: dict[str, Any]) -> bool:
    """Whether a trial (`full`: defaults filled in) has every value of the partial config."""
    return all(full[k] == v for k, v in partial.items())


def _without_excluded(trials: list[dict[str, Any]], exclude: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """The trials no `exclude` entry matches (_matches); SpaceError for the first entry that matches no
    trial (a typo). Indexed, not each trial against each entry: the entries are grouped by the fields
    they name, each group a hash table from their values to the entries, and each trial (defaults filled
    in once) is looked up once per group. Matching each pair filled the defaults in per pair: 2,000
    entries made a dry run take 53 s (issue 59, item 7). Hash lookup is `==` (1, 1.0 and True hash alike);
    an entry or trial value that cannot be hashed (a list) is compared pair by pair as before."""
    groups: dict[tuple[str, ...], dict[tuple, list[int]]] = {}
    one_by_one: list[int] = []  # entries holding an unhashable value
    for j, entry in enumerate(exclude):
        names = tuple(sorted(entry))
        values = tuple(entry[n] for n in names)
        try:
            hash(values)
        except TypeError:
            one_by_one.append(j)
            continue
        groups.setdefault(names, {}).setdefault(values, []).append(j)
    matched = [False] * len(exclude)
    kept = []
    for trial in trials:
        full = {**_DEFAULTS, **trial}
        hits: list[int] = []
        for names, table in groups.items():
            values = tuple(full[n] for n in names)
            try:
                hits.extend(table.get(values, ()))
            except TypeError:  # the trial's value cannot be hashed: compared with each entry of the group
                hits.extend(j for found in table.values() for j in found if _matches_full(full, exclude[j]))
        hits.extend(j for j in one_by_one if _matches_full(full, exclude[j]))
        for j in hits:
            matched[j] = True
        if not hits:
            kept.append(trial)
    for j, entry in enumerate(exclude):
        if not matched[j]:
            raise SpaceError(f"{source}: exclude entry {entry} matches no trial; allowed: values "
                             f"that occur in the grid (check for typos)")
    return kept


def _short(values: dict[str, Any], fixed: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in values.items() if fixed.get(k) != v or k == "task") + ")"
