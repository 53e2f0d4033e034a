"""Name -> class registries, so a new attention, encoding, dataset or task is one file.

Every module in `rpevit.attention`, `rpevit.pe` and `rpevit.tasks` is imported by its package
(`load_all`), and registers itself with a decorator. Config validation reads the names from here,
and the sweep's Parquet schema reads each task's declared metrics (`TaskMetrics`). What a registered
layer class takes (`init_parameters`: layer context and options) is read here too, from its
`__init__`, so the config and the analysis learn a variant's options without the model code
(rpevit.models, which imports timm). How the analysis names, groups, orders and colours a backend or
an encoding (`Display`) is declared where it registers, as keyword arguments of `register_attention` /
`register_pe`, and read here (`display`) with no model built. So are a variant's options (`Option`:
name, type, default, allowed values, help), declared beside the class as `options=(...)`: the config
makes each one a TrialConfig field of the variant's section (rpevit.config), so a flag, a sweep key and
a Parquet column, with no central file edited. This module imports nothing of rpevit at its top: it
sits below the config (docs/architecture.md, "Layers").
"""
from __future__ import annotations

import functools
import importlib
import inspect
import keyword
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

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
OPTION_TYPES = (int, float, str)  # an option's type: its field's type hint and its Parquet column's type


@dataclass(frozen=True)
class Option:
    """One option of a backend or an encoding, declared beside its class (`register_pe(..., options=(...))`)
    and passed to its `__init__` under its name: it becomes the TrialConfig field of that name in the
    variant's section ("attention" or "pe"), so a CLI flag, a sweep key and a Parquet column, validated
    like every field (rpevit.config). What it says is what a core field's `_field(...)` says:

    type: int, float or str. default: a value of that type (the `__init__` default should be
    `OPTION.default`; where that is a dataset_default sentinel, the value the default config resolves it
    to, as tests/test_factory.py checks). help: one line for both CLIs. choices (str options) or the bounds ge / gt / le /
    lt (numbers): what is allowed; note: appended to the allowed text; dataset_default: a sentinel
    outside the bounds meaning "the dataset's default". cost_free: a value the computation uses without
    changing its shape or its operations (a scale, an eps), so one bench row measures every value.

    An option several variants take is declared once, as a module constant of its owner's module
    (`ROPE_BASE` in rpevit.pe.rope), and named in each of their `options`; two different declarations of
    one name are refused when the second registers."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    dataset_default: float | None = None
    note: str = ""
    cost_free: bool = False

    def __post_init__(self) -> None:
        def bad(key: str, value: Any, allowed: str) -> ValueError:
            return ValueError(f"option {self.name!r}: {key} = {value!r}; allowed: {allowed}")

        if not (isinstance(self.name, str) and self.name.isidentifier() and self.name == self.name.lower()
                and not keyword.iskeyword(self.name) and not self.name.startswith("_")):
            raise bad("name", self.name, "a lower-case Python identifier not starting with '_'")
        if self.type not in OPTION_TYPES:
            raise bad("type", self.type, "int, float or str")
        if type(self.default) is not self.type:
            raise bad("default", self.default, f"a value of its type, {self.type.__name__}")
        if not (isinstance(self.help, str) and self.help.strip()):
            raise bad("help", self.help, "one line of help text")
        bounds = [key for key in ("ge", "gt", "le", "lt", "dataset_default") if getattr(self, key) is not None]
        if self.type is str and bounds:
            raise bad(bounds[0], getattr(self, bounds[0]), "None for a str option (say what is allowed with choices)")
        if self.choices and (self.type is not str or not isinstance(self.choices, tuple)
                             or not all(isinstance(c, str) for c in self.choices) or self.default not in self.choices):
            raise bad("choices", self.choices, "a tuple of the str values allowed, for a str option, with its default")


def declared_options(cls: type) -> tuple[Option, ...]:
    """The options a registered class declares (its `options=` at registration; () for none)."""
    return vars(cls).get("options", ())


def declared_by(option: str) -> str:
    """'<kind> <name>' of a registered variant declaring an option of that name, '' if none: where to import
    the declaration from, for a refusal's message."""
    owners = [f"{kind} {name!r}" for kind, name, cls in _variants()
              if any(o.name == option for o in declared_options(cls))]
    return owners[0] if owners else ""


def _variants() -> list[tuple[str, str, type]]:
    """(kind, name, class) of every registered backend and encoding."""
    return ([("attention", n, c) for n, c in ATTENTIONS.items()]
            + [("pe", n, c) for n, c in POSITION_ENCODINGS.items()])


_BUILT_OPTIONS: dict[str, Any] = {}  # what TrialConfig was built with (close_options): option names, core fields


def close_options(names: Iterable[str], core: dict[str, str]) -> None:
    """Record that TrialConfig has been built, once per process, with these option fields and the `core`
    fields (name -> section): a variant registered later may name only these options (a new one would be
    no field, so it could never be set)."""
    _BUILT_OPTIONS.update(names=frozenset(names), core=dict(core))


def _core_clash(kind: str, name: str, option: Option, core: dict[str, str]) -> ValueError | None:
    if option.name not in core:
        return None
    return ValueError(f"option {option.name!r} of {kind} {name!r} has the name of the core TrialConfig field "
                      f"{option.name!r} (section {core[option.name]!r}); allowed: another name")


def _check_options(kind: str, name: str, cls: type, options: Any) -> tuple[Option, ...]:
    """The refusals of a variant's declared options, one line each, when it registers."""
    where = f"{kind} {name!r}"
    if not isinstance(options, tuple) or not all(isinstance(o, Option) for o in options):
        raise ValueError(f"{where}: options = {options!r}; allowed: a tuple of rpevit.registry.Option")
    names = [o.name for o in options]
    taken = init_parameters(cls)
    for option in options:
        if names.count(option.name) > 1:
            raise ValueError(f"{where} declares option {option.name!r} twice")
        if option.name in CONTEXT:
            raise ValueError(f"{where}: option {option.name!r} is layer context ({', '.join(CONTEXT)}), passed to "
                             f"every layer; allowed: another name")
        if option.name not in taken:
            raise ValueError(f"{where} declares option {option.name!r}, which {cls.__qualname__}.__init__ does not "
                             f"take; allowed: the keyword names of its __init__ ({', '.join(taken)})")
        for other_kind, other, other_cls in _variants():
            declared = {o.name: o for o in declared_options(other_cls)}.get(option.name)
            if other_cls is not cls and declared is not None and (declared != option or other_kind != kind):
                raise ValueError(f"option {option.name!r} is declared twice, differently: by {other_kind} {other!r} "
                                 f"({declared}) and by {where} ({option}); declare it once, in its owner's module, "
                                 f"and name that one in both")
        clash = _core_clash(kind, name, option, _BUILT_OPTIONS.get("core", {}))
        if clash is not None:
            raise clash
        built = _BUILT_OPTIONS.get("names")
        if built is not None and option.name not in built:
            raise ValueError(f"{where} declares option {option.name!r} after TrialConfig was built without it "
                             f"(once per process, from the variants registered by its first use): import the "
                             f"variant's module before the config is first used")
    return options


def collect_options(core: dict[str, str]) -> list[tuple[str, Option]]:
    """(kind, option) of every registered variant's declared options, each once: the TrialConfig fields
    they become, in a fixed order whatever the import order: attention options, then pe options, each
    kind in the legend order of the first variant declaring the option (Display.order, then name), then
    its place in that variant's `options`. `core`: the core field names -> sections, which an option must
    not reuse (nor two variants declare one name differently: refused at registration, checked again)."""
    chosen: dict[str, tuple[str, Option, str]] = {}
    ranked = sorted(_variants(), key=lambda v: (v[0] != "attention", vars(v[2])["display"].order, v[1]))
    for kind, name, cls in ranked:
        for option in declared_options(cls):
            clash = _core_clash(kind, name, option, core)
            if clash is not None:
                raise clash
            first = chosen.setdefault(option.name, (kind, option, name))
            if first[:2] != (kind, option):
                raise ValueError(f"option {option.name!r} is declared twice, differently: by {first[0]} {first[2]!r} "
                                 f"({first[1]}) and by {kind} {name!r} ({option})")
    return [(kind, option) for kind, option, _ in chosen.values()]


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


def undeclared_arguments(cls: type, core: Iterable[str]) -> list[str]:
    """The keywords `cls(...)` takes that are neither layer context (CONTEXT), nor a core field of its
    config section (`core`: e.g. redraw_interval, which the training loop reads too), nor an option the
    class declares (`declared_options`): what the factory could not pass. Config validation refuses such
    a class at `--dry-run`, and the factory raises on it, from this one rule."""
    known = set(CONTEXT) | set(core) | {option.name for option in declared_options(cls)}
    return [name for name in init_parameters(cls) if name not in known]


def _register(table: dict, kind: str, name: str) -> Callable[[T], T]:
    def add(obj: T) -> T:
        if name in table and table[name] is not obj:
            raise ValueError(f"{kind} {name!r} is registered twice ({table[name]} and {obj})")
        table[name] = obj
        return obj

    return add


def register_attention(name: str, *, options: tuple[Option, ...] = (), label: str = "", colour: str | None = None,
                       family: str = "", groups: tuple[str, ...] = (), order: int = UNORDERED,
                       identity_colour: str | None = None) -> Callable[[T], T]:
    """An attention backend. `options`: the Options its `__init__` takes (config section "attention"),
    recorded on the class as `options`; the other keywords are how the analysis shows it (`Display`),
    recorded as `display`."""
    shown = Display(name, label, colour, family, groups, order, identity_colour)

    def add(cls: T) -> T:
        cls.options = _check_options("attention", name, cls, options)  # type: ignore[attr-defined]
        cls.display = shown  # type: ignore[attr-defined]
        return _register(ATTENTIONS, "attention", name)(cls)

    return add


def register_pe(name: str, *, options: tuple[Option, ...] = (), label: str = "", colour: str | None = None,
                family: str = "", groups: tuple[str, ...] = (), order: int = UNORDERED) -> Callable[[T], T]:
    """A position encoding. `options`: the Options its `__init__` takes (config section "pe"), recorded
    on the class as `options`; the other keywords are how the analysis shows it (`Display`), recorded as
    `display`. Also records the name on the class as `pe_name`, for its error messages."""
    shown = Display(name, label, colour, family, groups, order)

    def add(cls: T) -> T:
        cls.options = _check_options("pe", name, cls, options)  # type: ignore[attr-defined]
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


LAYER_PACKAGES = ("rpevit.attention", "rpevit.pe")  # where the variants whose options are config fields live


def load_layers() -> None:
    """Import every backend and encoding (not the tasks, which use TrialConfig: rpevit.config builds it
    from what these register)."""
    for pkg in LAYER_PACKAGES:
        import_submodules(pkg)


def load_all() -> None:
    for pkg in (*LAYER_PACKAGES, "rpevit.tasks"):
        import_submodules(pkg)
