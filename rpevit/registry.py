"""Name -> class registries, so a new attention, encoding, dataset or task is one file.

Every module in `rpevit.attention`, `rpevit.pe` and `rpevit.tasks` is imported by its package
(`load_all`), and registers itself with a decorator. Config validation reads the names from here,
and the sweep's Parquet schema reads each task's declared metrics (`TaskMetrics`). What a registered
layer class takes (`init_parameters`: layer context and options) is read here too, from its
`__init__`, so the config and the analysis learn a variant's options without the model code
(rpevit.models, which imports timm). How the analysis names, groups, orders and colours a backend or
an encoding (`Display`) is declared where it registers, as keyword arguments of `register_attention` /
`register_pe`, and read here (`display`) with no model built. This module imports nothing of rpevit at
its top: it sits below the config (docs/architecture.md, "Layers").
"""
from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")

ATTENTIONS: dict[str, type] = {}
POSITION_ENCODINGS: dict[str, type] = {}
TASKS: dict[str, Callable] = {}
METRICS: dict[str, "TaskMetrics"] = {}
GROUP_TASKS: dict[str, Callable] = {}  # task -> its fused-group runner (`fuse: seeds` spaces)
TIMING_TASKS: set[str] = set()  # tasks whose rows are timings (register_task(..., timing=True))
TASK_CHECKS: dict[str, Callable] = {}  # task -> its config rules (register_task(..., check=fn))


@dataclass(frozen=True)
class TaskMetrics:
    """The columns a task adds to the sweep's Parquet files, name -> Python type (int, float, str,
    bool or list[float]), declared beside the task so a new metric is one edit in one file.

    `headline` columns follow the headline config in trials.parquet, `other` follow the rest of the
    config, `epoch` columns follow the fixed epoch columns of epochs.parquet (rpevit.sweep.results).
    """

    headline: dict[str, type] = field(default_factory=dict)
    other: dict[str, type] = field(default_factory=dict)
    epoch: dict[str, type] = field(default_factory=dict)


UNORDERED = 1000  # Display.order of a variant that declares none: after those that do


@dataclass(frozen=True)
class Display:
    """How the analysis shows a registered backend or encoding, declared beside its class
    (`@register_pe("rope", colour="C2", family="rope and circulant", groups=("string",), order=3)`) so
    that every figure and table picks up a new variant with no analysis file touched
    (rpevit.analysis.variants reads it; docs/analysis.md, "Names, groups and colours").

    label: its name in legends (the registered name when not given). colour: a matplotlib colour, the
    same in every figure; None: the analysis's fallback, a fixed colour chosen from a hash of the name
    (stable when other variants are added, but two undeclared names may share one). family: the panel
    it is drawn in beside its relatives (the token-scaling plot); its label when not given. groups:
    tags that studies select by ("string": an encoding RoPE(r) P of the STRING family, in the STRING
    study and timed against softmax+rope; "string_study": compared in the STRING study without being a
    STRING). order: its place in legends and panel rows, smaller first, ties by name. identity_colour
    (backends only): the colour of "<name>-identity", a random-feature backend configured to draw no
    features (rpevit.analysis.common.with_variant)."""

    name: str
    label: str
    colour: str | None = None
    family: str = ""
    groups: tuple[str, ...] = ()
    order: int = UNORDERED
    identity_colour: str | None = None

    def __post_init__(self) -> None:
        for key, kind in (("label", str), ("family", str), ("order", int)):
            value = getattr(self, key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"variant {self.name!r}: {key} = {value!r}; allowed: a {kind.__name__}")
        for key in ("colour", "identity_colour"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"variant {self.name!r}: {key} = {value!r}; allowed: a matplotlib colour name "
                                 f"('C3', 'tab:red', '#1f77b4') or None")
        if not isinstance(self.groups, tuple) or not all(isinstance(g, str) and g for g in self.groups):
            raise ValueError(f"variant {self.name!r}: groups = {self.groups!r}; allowed: a tuple of tag names")
        if not self.label:
            object.__setattr__(self, "label", self.name)
        if not self.family:
            object.__setattr__(self, "family", self.label)


def display(kind: str, name: str) -> Display | None:
    """The Display of a registered backend (kind "attention") or encoding ("pe"); None for a name not
    registered (a composite 'ape+rope', a label with options, a name no longer registered). The
    tables must be loaded (load_all) for the package's own names."""
    table = {"attention": ATTENTIONS, "pe": POSITION_ENCODINGS}[kind]
    cls = table.get(name)
    return None if cls is None else vars(cls).get("display")


CONTEXT = ("dim", "heads", "head_dim", "grid", "layer", "seed")  # what a layer may take besides its options


@functools.lru_cache(maxsize=None)
def init_parameters(cls: type) -> tuple[str, ...]:
    """Keyword names `cls(...)` accepts: its `__init__`'s, and its bases' while each passes `**context` on.

    nn.Module's and object's `__init__` take only `*args` / `**kwargs`, so they add no name."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names += [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return tuple(dict.fromkeys(names))


def undeclared_arguments(cls: type, options: Iterable[str]) -> list[str]:
    """The keywords `cls(...)` takes that are neither layer context (CONTEXT) nor one of `options` (the
    fields of its config section): what the factory could not pass. Config validation refuses such a
    class at `--dry-run`, and the factory raises on it, from this one rule."""
    known = set(CONTEXT) | set(options)
    return [name for name in init_parameters(cls) if name not in known]


def _register(table: dict, kind: str, name: str) -> Callable[[T], T]:
    def add(obj: T) -> T:
        if name in table and table[name] is not obj:
            raise ValueError(f"{kind} {name!r} is registered twice ({table[name]} and {obj})")
        table[name] = obj
        return obj

    return add


def register_attention(name: str, *, label: str = "", colour: str | None = None, family: str = "",
                       groups: tuple[str, ...] = (), order: int = UNORDERED,
                       identity_colour: str | None = None) -> Callable[[T], T]:
    """An attention backend; the keywords are how the analysis shows it (`Display`), recorded on the
    class as `display`."""
    shown = Display(name, label, colour, family, groups, order, identity_colour)

    def add(cls: T) -> T:
        cls.display = shown  # type: ignore[attr-defined]
        return _register(ATTENTIONS, "attention", name)(cls)

    return add


def register_pe(name: str, *, label: str = "", colour: str | None = None, family: str = "",
                groups: tuple[str, ...] = (), order: int = UNORDERED) -> Callable[[T], T]:
    """A position encoding; the keywords are how the analysis shows it (`Display`), recorded on the
    class as `display`. Also records the name on the class as `pe_name`, for its error messages."""
    shown = Display(name, label, colour, family, groups, order)

    def add(cls: T) -> T:
        cls.pe_name = name  # type: ignore[attr-defined]
        cls.display = shown  # type: ignore[attr-defined]
        return _register(POSITION_ENCODINGS, "pe", name)(cls)

    return add


def register_task(name: str, metrics: TaskMetrics | None = None, *, timing: bool = False,
                  check: Callable | None = None) -> Callable[[T], T]:
    """A task: `fn(cfg, *, checkpoint_dir=None, on_epoch=None, log=print) -> summary row`, with the
    metrics its rows carry (besides the config, environment and placement columns). `timing`: its rows
    are times, so each trial gets a whole node and a space may ask for repeats (rpevit.sweep.space).
    `check(cfg, source)`: the task's own config rules, raising ConfigError (TrialConfig.validate calls
    it, as it calls each encoding's and backend's check_config)."""

    def add(fn: T) -> T:
        METRICS[name] = metrics or TaskMetrics()
        if timing:
            TIMING_TASKS.add(name)
        if check is not None:
            TASK_CHECKS[name] = check
        return _register(TASKS, "task", name)(fn)

    return add


def register_group_task(task: str) -> Callable[[T], T]:
    """The fused-group runner of a registered task: `fn(cfgs, *, checkpoint_dirs=None, on_epoch=None,
    log=print) -> [summary row or exception per member]`, where on_epoch(member, row, folder). A space
    with `fuse: seeds` may group only tasks that have one."""
    return _register(GROUP_TASKS, "group task", task)


def import_submodules(package_name: str) -> None:
    """Import every module of a package so that its registrations run."""
    package = importlib.import_module(package_name)
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package_name}.{info.name}")


def load_all() -> None:
    for pkg in ("rpevit.attention", "rpevit.pe", "rpevit.tasks"):
        import_submodules(pkg)
