"""TrialConfig: the flat, typed record of every knob of one trial, validated before anything trains.

One record drives every task (`train`, `bench`, `kernel_mse`), the single-trial CLI and the
sweep runner: flat, because flags, sweep keys, trial keys and Parquet columns are its field names.
Each field's metadata groups it into a section (`SECTIONS`: model, attention, pe, optim, ...;
`TrialConfig.section(name)`), gives its one-line help (`field_help`, shown by both CLIs) and its
allowed values (choices or bounds), which validate() checks field by field; the rules relating
several fields stay explicit in validate(). Layers never see this record: `rpevit.models.factory`
hands each one the arguments its `__init__` declares (`layer_arguments`, here, so that validation
builds a backend by the same rule to see that it holds no learned parameters). Validation errors
name the field, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import threading
import typing
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from rpevit import registry

if TYPE_CHECKING:
    from rpevit.data import DatasetSpec

DATASETS = ("digits", "mnist", "cifar10", "cifar100")
MAX_EPOCHS = 10_000  # more is a typo (a month per epoch-second); it would also overflow schedules
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # integer fields are int64 columns in the results


class ConfigError(ValueError):
    """A trial config that cannot run; the message names field, value and allowed values."""


def did_you_mean(name: Any, candidates: "typing.Iterable[str]") -> str:
    """' did you mean 'epochs'?' for a key close to one of the candidates (difflib's ratio >= 0.6; the
    closest, and any others as close as it within 0.1, at most 3), else '': a typo of one field is
    answered with the field, not only with a list of every field there is (issue 59, item 7)."""
    import difflib

    ratio = lambda c: difflib.SequenceMatcher(None, str(name), c).ratio()  # noqa: E731
    close = [(ratio(c), c) for c in difflib.get_close_matches(str(name), list(candidates), n=3, cutoff=0.6)]
    close = [c for r, c in close if r >= close[0][0] - 0.1] if close else []
    return f" did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def field_error(source: str, name: str, value: Any, allowed: str) -> ConfigError:
    """The one-line refusal of a field's value: where, the field, the value, what is allowed."""
    return ConfigError(f"{source}: field {name!r} has value {value!r}; allowed: {allowed}")


SECTIONS = ("task", "data", "model", "attention", "pe", "optim", "runtime", "bench", "kernel_mse")
TASK_SECTIONS = ("bench", "kernel_mse")  # sections named after the one task that reads their fields
DATASET_DEFAULT = "the dataset's default"  # what a field's `dataset_default` sentinel means


def _field(default: Any, section: str, help: str, *, choices: tuple[str, ...] = (), ge: float | None = None,
           gt: float | None = None, le: float | None = None, lt: float | None = None,
           dataset_default: float | None = None, note: str = "", cost_free: bool = False) -> Any:
    """A TrialConfig field whose metadata says what validate() and both CLIs need to know.

    `section` groups it (SECTIONS), `help` is its one-line help text, `choices` or the bounds
    `ge` / `gt` / `le` / `lt` say what is allowed, `dataset_default` is a sentinel outside those
    bounds meaning DATASET_DEFAULT, and `note` is appended to the allowed text. Keeping the rule
    beside the field means a new field is checked and documented without editing validate().
    `cost_free`: a value the computation uses without changing its shape or its operations (a scale,
    an eps, a schedule), so one bench row measures the cost of every value (rpevit.analysis.efficiency).
    """
    metadata: dict[str, Any] = {"section": section, "help": help, "cost_free": cost_free}
    if choices:
        metadata["choices"] = choices
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt, "dataset_default": dataset_default}
    metadata.update({key: value for key, value in bounds.items() if value is not None})
    if note:
        metadata["note"] = note
    return field(default=default, metadata=metadata)


V = TypeVar("V", int, float)


class RecipeDefault(Generic[V]):
    """`cfg.resolved_<field>`: the config field's value, or the dataset recipe's (DatasetSpec) where
    the field holds its "use the recipe" value (0 unless `recipe_when` says otherwise). Read-only,
    and not a dataclass field (no annotation), so it is neither a flag nor a Parquet column."""

    def __init__(self, recipe_when: Callable[[V], bool] = lambda value: value == 0) -> None:
        self.recipe_when = recipe_when
        self.field = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = name.removeprefix("resolved_")

    def __get__(self, cfg: "TrialConfig | None", owner: type | None = None) -> V:
        if cfg is None:
            return self  # type: ignore[return-value]  (the descriptor itself, on the class)
        value = getattr(cfg, self.field)
        return getattr(cfg.spec, self.field) if self.recipe_when(value) else value


class _CoreFields:
    """The fields of TrialConfig that are no variant's option: what the tasks, the training loop, the
    model wrapper and the data read. Not a dataclass: `_build_trial_config` reads these annotations and
    `_field`s in order and inserts the registered backends' and encodings' options after OPTIONS_AFTER."""

    # what to run
    task: str = _field("train", "task", "what to run: train a model, benchmark it, or measure kernel estimator MSE")
    dataset: str = _field("digits", "data", "dataset; its recipe sets image size, patch size, batch size, lr and "
                          "warm-up (rpevit.data.DATASET_SPECS)", choices=DATASETS)
    attention: str = _field("softmax", "attention", "attention backend (registered name)")
    pe: str = _field("ape", "pe", "position encoding(s): one registered name, or several joined by '+' "
                     "(e.g. ape+rope)")

    # model (0 means: the dataset's default)
    image_size: int = _field(0, "model", "input image side in pixels (train: the dataset's native size)",
                             ge=1, le=4096, dataset_default=0)  # bench: 2048 is 262,144 tokens at patch 4
    patch_size: int = _field(0, "model", "patch side in pixels; tokens = (image_size / patch_size)^2",
                             gt=0, dataset_default=0)
    dim: int = _field(64, "model", "embedding width (heads x head dim)", ge=1, le=8192)  # ViT-22B: 6144
    depth: int = _field(4, "model", "number of transformer blocks", ge=1, le=1024)  # ViT-22B: 48
    heads: int = _field(4, "model", "attention heads per block", ge=1, le=8192)  # a divisor of dim
    mlp_ratio: float = _field(2.0, "model", "MLP hidden width / dim (the width is int(dim * mlp_ratio), at least 1)",
                              gt=0, le=64)
    drop_path: float = _field(0.1, "model", "stochastic-depth rate of the last block (linear from 0)", ge=0, lt=1)
    dropout: float = _field(0.0, "model", "dropout after the attention and MLP projections", ge=0, lt=1)
    init: str = _field("auto", "model", "initial Linear weights: trunc_normal (timm's ViT: std 0.02, zero "
                       "biases) or torch_default (nn.Linear's own: uniform, scaled by 1/sqrt(fan_in)); auto: the "
                       "dataset's recipe, chosen on its validation split (rpevit.data.DATASET_SPECS)",
                       choices=("auto", "trunc_normal", "torch_default"))

    # attention: what the training loop and the model wrapper read too (redraw_* also reach the kernelized
    # backends' __init__, as core fields of their section); each backend's own options follow here
    # (OPTIONS_AFTER), declared beside it (registry.Option)
    # -1: the dataset's recipe, what its validation split chose for every encoding alike (rpevit.data:
    # MNIST every step, results/redraw_val_mnist; CIFAR-10 every 10 steps, results/redraw_val_cifar10);
    # with one draw (0) a model learns its own kernel and collapses on fresh draws (MNIST favor+ape:
    # 98.7 % on its draw, 29 % over fresh ones)
    redraw_interval: int = _field(-1, "attention", "training steps between random-feature redraws",
                                  ge=0, dataset_default=-1, note="0 = never: one draw for the whole run, which the "
                                  "model can fit; see docs/random_features.md", cost_free=True)
    # the draw is frozen for the last stretch so the final weights are adapted to the draw they
    # are evaluated with (docs/random_features.md)
    redraw_until: float = _field(0.8, "attention", "fraction of training steps after which the draw is frozen",
                                 ge=0, le=1, cost_free=True)
    qk_norm: str = _field("none", "attention", "l2: unit q and k with a learned per-head temperature "
                          "(Luo et al. 2021, section 3.3)", choices=("none", "l2"))

    # optimisation
    epochs: int = _field(10, "optim", "training epochs", ge=1, le=MAX_EPOCHS)
    batch_size: int = _field(0, "optim", "training batch size", ge=1, le=65536, dataset_default=0)
    lr: float = _field(0.0, "optim", "peak AdamW learning rate", gt=0, dataset_default=0.0)
    weight_decay: float = _field(0.05, "optim", "AdamW weight decay (not on ViT.no_weight_decay())", ge=0)
    warmup_epochs: float = _field(-1.0, "optim", "linear warm-up length in epochs (at most 10% of the run)",
                                  ge=0, dataset_default=-1.0)
    label_smoothing: float = _field(0.1, "optim", "label smoothing of the cross-entropy", ge=0, lt=1)
    grad_clip: float = _field(-1.0, "optim", "max global gradient norm", ge=0, dataset_default=-1.0, note="0 = off")
    lr_schedule: str = _field("cosine", "optim", "after the warm-up: cosine to 0 over the run, or wsd (warm-up, "
                              "stable at the peak, then a 1-sqrt cool-down to 0 over the last cooldown_fraction; "
                              "the budget ladder's schedule: shorter budgets branch off one run, docs/budget_ladder.md)",
                              choices=("cosine", "wsd"), cost_free=True)
    cooldown_fraction: float = _field(0.2, "optim", "wsd: fraction of the training steps the cool-down takes",
                                      gt=0, le=1, cost_free=True)

    # data
    data_dir: str = _field("", "data", "folder with <dataset>.npz ('': $RPEVIT_DATA, else ./data)")
    train_subset: int = _field(0, "data", "use only this many training images", ge=0, note="0 = all")
    val_fraction: float = _field(0.1, "data", "seeded hold-out of the training set for validation", ge=0, lt=1)
    augment: str = _field("auto", "data", "training augmentation (auto: the dataset's default; rotate: a uniform "
                          "random angle per image, rotation only, rpevit.data.random_rotate)",
                          choices=("auto", "none", "crop", "crop_flip", "rotate"))

    # runtime
    seed: int = _field(0, "runtime", "seeds weights, data order, augmentation and random features",
                       ge=0, le=INT64_MAX, note="2^63 - 1")
    device: str = _field("auto", "runtime", "where to run (auto: cuda if available)", choices=("auto", "cpu", "cuda"))
    amp: str = _field("auto", "runtime", "autocast precision (auto: bf16 on GPU, none on CPU)",
                      choices=("auto", "bf16", "none"))
    eval_batch_size: int = _field(1024, "runtime", "batch size of evaluation passes (the final evaluation: "
                                  "(image, variant) pairs, each batch's images read by every draw together)", ge=1,
                                  le=65536)
    eval_draws: int = _field(8, "runtime", "fresh random-feature draws of the draw-aware test evaluation",
                             ge=0, le=1000, note="0 = no draw-aware evaluation")
    eval_rotations: str = _field("none", "runtime", "test-time rotations of the summary row (standard: the test set "
                                 "rotated by 0, 90, 180, 270 degrees and by a fixed random angle per image; "
                                 "rpevit.evaluation.rotation_metrics)", choices=("none", "standard"))
    dtype: str = _field("float32", "runtime", "dtype of parameters and activations (float64: the exactness "
                            "checks of fused and compiled steps; amp autocasts on top)", choices=("float32", "float64"))
    compile: str = _field("off", "runtime", "torch.compile the training step's forward + loss (fullgraph): on = "
                          "inductor, cudagraphs = inductor with CUDA graphs; on the CPU it pays for some variants and "
                          "slows others (results/compile_cpu_1thread/); graph = the whole step (inputs, forward, "
                          "backward, clipping, AdamW) in one compiled function, one CUDA graph (an epoch's short last "
                          "batch padded to the batch size), its randomness drawn per epoch (rpevit/tasks/whole_step.py)",
                          choices=("off", "on", "cudagraphs", "graph"))

    # bench task
    bench_batch: int = _field(32, "bench", "batch size of the timed passes", ge=1, le=65536)
    bench_warmup: int = _field(3, "bench", "untimed warm-up iterations", ge=0, le=100_000)
    bench_iters: int = _field(10, "bench", "timed iterations (medians are reported)", ge=1, le=100_000)

    # kernel_mse task
    kmse_dim: int = _field(16, "kernel_mse", "dimension of x and y", ge=1, le=4096)  # a d x d QR per point
    kmse_features: int = _field(16, "kernel_mse", "random features m of the estimator", ge=1, le=65536)
    kmse_estimator: str = _field("positive", "kernel_mse", "positive (FAVOR+) or trigonometric random features",
                                 choices=("positive", "trig"))
    kmse_projection: str = _field("gaussian", "kernel_mse", "distribution of the projection rows",
                                  choices=("gaussian", "orthogonal", "rademacher", "orthogonal_rademacher"))
    kmse_norm: float = _field(1.0, "kernel_mse", "|x| = |y|", gt=0)
    kmse_angle: float = _field(0.5, "kernel_mse", "angle between x and y in radians", ge=0)
    kmse_draws: int = _field(2000, "kernel_mse", "Monte Carlo repetitions", ge=1, le=10_000_000)



OPTIONS_AFTER = "qk_norm"  # the options of the attention layers, then of the pe layers, follow this core field


class _TrialConfigMethods:
    """Every knob of one trial, flat (one CLI flag, sweep key and Parquet column per field).

    Each field's metadata names its section (`section()` returns one as a dict), its help text
    and its allowed values; validate() checks those generically and the cross-field rules
    explicitly. The fields are the core ones (`_CoreFields`) and the options the registered backends
    and encodings declare (registry.Option): TrialConfig is built from both on first use
    (`trial_config_class`), a dataclass with these methods.
    """

    # ---- construction and validation ----
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> "TrialConfig":
        """Build and validate; unknown keys and wrong types are errors, not silently dropped. The one
        constructor from values (CLI, spaces, stored rows): field types resolved once per process, fast
        enough to expand and validate a sweep of 10^5 trials in seconds."""
        types = field_types()
        unknown = sorted(set(values) - set(types))
        if unknown:
            hint = did_you_mean(unknown[0], types) if len(unknown) == 1 else ""
            raise ConfigError(f"{source}: unknown field(s) {unknown};{hint} allowed fields: "
                              f"{', '.join(sorted(types))}")
        cfg = cls(**{k: _coerce(k, v, types[k], source) for k, v in values.items()})
        cfg.validate(source=source)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "TrialConfig":
        return type(self).from_dict({**self.to_dict(), **changes})

    def resolved(self) -> "TrialConfig":
        """This config with every "use the recipe" placeholder replaced by what runs (resolve_values):
        what results store and trial keys hash, so two spellings of one computation are one trial."""
        return dataclasses.replace(self, **resolve_values(self.to_dict()))

    @property
    def pe_names(self) -> list[str]:
        return [p.strip() for p in self.pe.split("+") if p.strip()]

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def section(self, name: str) -> dict[str, Any]:
        """The fields of one section (SECTIONS) and their values: the typed group a layer or task reads."""
        return {field_name: getattr(self, field_name) for field_name in section_fields()[name]}

    def validate(self, *, source: str = "config") -> None:
        """Per-field rules from the field metadata, then the rules that relate several fields."""
        load_registry()
        bad = lambda name, value, allowed: field_error(source, name, value, allowed)  # noqa: E731
        _check_values(self, bad)
        for name, table in _REGISTRY_FIELDS:
            names = self.pe_names if name == "pe" else [getattr(self, name)]
            for value in names:
                if value not in getattr(registry, table):
                    raise bad(name, value, registered_names(name))
        self._check_layer_arguments(bad)
        hooks = [registry.POSITION_ENCODINGS[n].hook for n in self.pe_names]
        if hooks.count("score") > 1:
            raise bad("pe", self.pe, "at most one score-hook encoding in a combination")
        if len(set(self.pe_names)) != len(self.pe_names):
            raise bad("pe", self.pe, "each encoding at most once in a combination")
        if self.dim % self.heads:
            raise bad("dim", self.dim, f"a multiple of heads={self.heads}")
        if int(self.dim * self.mlp_ratio) < 1:  # the MLP's hidden width as rpevit.models.vit.Block computes it:
            # 0 would not fail but run as mlp_ratio 1.0 (timm's Mlp reads a hidden width of 0 as "in_features")
            raise bad("mlp_ratio", self.mlp_ratio, f"a number >= 1/dim = {1 / self.dim!r} with dim={self.dim} "
                      f"(the MLP's hidden width int(dim * mlp_ratio) must be at least 1)")
        task_check = registry.TASK_CHECKS.get(self.task)  # the task's own rules, beside the task
        if task_check is not None:
            task_check(self, source)
        self._check_other_tasks_fields(bad)
        image, patch = self.resolved_image_size, self.resolved_patch_size
        if patch <= 0 or image % patch:
            raise bad("patch_size", self.patch_size, f"a divisor of image_size={image}")
        for name in self.pe_names:
            registry.POSITION_ENCODINGS[name].check_config(self, source)
        registry.ATTENTIONS[self.attention].check_config(self, source)
        self._check_backend_parameters(bad)

    def _check_other_tasks_fields(self, bad: Callable[[str, Any, str], "ConfigError"]) -> None:
        """A field of a task's own section (TASK_SECTIONS: `bench_*`, `kmse_*`) keeps its default in a trial of
        another task: no other task reads it, so a value there would change nothing but the trial's key (`--set
        bench_iters=5` on a train space made 180 new keys that `--resume` would train again as new trials)."""
        defaults = _default_values()
        for section in TASK_SECTIONS:
            if section == self.task:
                continue
            for name in section_fields()[section]:
                value = getattr(self, name)
                if value != defaults[name]:
                    raise bad(name, value, f"its default {defaults[name]!r} with task={self.task!r} (only task "
                              f"{section!r} reads it: another value would change nothing but the trial's key)")

    def _check_backend_parameters(self, bad: Callable[[str, Any, str], "ConfigError"]) -> None:
        """A backend holds no learned parameters: the final evaluation of a trained model also runs its weights with
        exact softmax attention in the backend's place (the softmax swap, `test_acc_softmax_swap`:
        rpevit.evaluation.with_softmax_attention), which would drop them, so such a backend used to train every
        epoch and then fail there. Refused here, at `--dry-run`; each backend and its option values are built
        once per process (learned_parameters), not once per trial."""
        try:
            learned = learned_parameters(self)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - a backend that cannot be built with this config fails every trial
            raise bad("attention", self.attention, f"a backend that can be built with this config: building one layer "
                      f"raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        if learned:
            cls = registry.ATTENTIONS[self.attention]
            raise bad("attention", self.attention, f"a backend without learned parameters: {cls.__qualname__} has "
                      f"{', '.join(map(repr, learned))}. The final evaluation of a trained model also runs its "
                      f"weights with exact softmax attention in the backend's place (the softmax swap, "
                      f"test_acc_softmax_swap: rpevit.evaluation.with_softmax_attention), which would drop them; "
                      f"a fixed tensor can be a buffer (register_buffer), and what is learned belongs to the model "
                      f"around the backend (a position encoding, the q/k/v projections)")

    def _check_layer_arguments(self, bad: Callable[[str, Any, str], "ConfigError"]) -> None:
        """Every keyword a chosen layer's `__init__` takes is layer context, a core field of its config section
        or an option the variant declares (registry.undeclared_arguments), so a variant with an undeclared
        option fails here (at `--dry-run`), not in every trial."""
        chosen = [("attention", self.attention, registry.ATTENTIONS[self.attention])]
        chosen += [("pe", name, registry.POSITION_ENCODINGS[name]) for name in self.pe_names]
        for section, name, cls in chosen:
            undeclared = registry.undeclared_arguments(cls, core_section_fields()[section])
            if undeclared:
                owners = [f"{option!r}: the Option of {registry.declared_by(option)}" for option in undeclared
                          if registry.declared_by(option)]
                raise bad(section, name, f"a registered {section} whose __init__ takes only layer context "
                          f"({', '.join(registry.CONTEXT)}), core fields of the config section {section!r} and the "
                          f"options it declares: {cls.__qualname__}.__init__ also takes "
                          f"{', '.join(map(repr, undeclared))}; declare {'it' if len(undeclared) == 1 else 'them'} "
                          f"as an Option of the variant (register_{section}(..., options=(Option(...), ...)), "
                          f"rpevit.registry.Option)" + (f", naming the one declaration where another variant "
                                                        f"has it ({'; '.join(owners)})" if owners else ""))

    @property
    def spec(self) -> "DatasetSpec":
        from rpevit.data import DATASET_SPECS

        return DATASET_SPECS[self.dataset]

    resolved_image_size = RecipeDefault[int]()
    resolved_patch_size = RecipeDefault[int]()
    resolved_batch_size = RecipeDefault[int]()
    resolved_lr = RecipeDefault[float]()
    resolved_warmup_epochs = RecipeDefault[float](recipe_when=lambda value: value < 0)  # 0 = no warm-up

    @property
    def grid(self) -> tuple[int, int]:
        side = self.resolved_image_size // self.resolved_patch_size
        return side, side


def _coerce(name: str, value: Any, hint: Any, source: str) -> Any:
    """Accept any integer for int and any real for float (YAML, numpy); anything else names the field."""
    if hint is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint is str and isinstance(value, str):
        return value
    raise ConfigError(
        f"{source}: field {name!r} has value {value!r} of type {type(value).__name__}; "
        f"allowed: a value of type {hint.__name__}"
    )


# Fields whose placeholder resolves from the dataset's recipe (DatasetSpec): the field's dataset_default
# (0, or -1 where 0 is a setting: no warm-up, no clipping, never redraw) or "auto" means "the recipe's
# value". Placeholders that choose where or how a computation runs, not what it computes, stay as
# requested: device and amp (the row's device_name says what ran), luo_path, cayley_solver and
# rotinv_path (algorithms of one result, proven equal in the tests).
RECIPE_FIELDS = ("image_size", "patch_size", "batch_size", "lr", "warmup_epochs", "augment", "init", "grad_clip",
                 "redraw_interval")

# What a field held before its default moved to "the dataset's recipe" or to another value: the value a
# stored row or checkpoint that lacks the field ran with (the code then had only that behaviour), and
# the baseline trial keys hash against (rpevit.sweep.space.KEY_BASELINE), so that a moved default
# changes no key of a trial already run. redraw_interval 0 -> 100 -> 1 -> the recipe's; luo_scale
# 10 -> 1000 -> the dataset's (rpevit.pe.relative_bias); init and grad_clip: the recipe's since
# issue 41 (item 2).
FIRST_DEFAULTS: dict[str, Any] = {"redraw_interval": 0, "luo_scale": 10.0, "init": "trunc_normal", "grad_clip": 1.0}


def recorded_values(values: dict[str, Any]) -> dict[str, Any]:
    """A stored config (a row's or a checkpoint's columns) with each field it lacks at FIRST_DEFAULTS:
    written before the field existed, it ran what the field's first default does, not today's default."""
    return {**{k: v for k, v in FIRST_DEFAULTS.items() if k not in values}, **values}


def is_placeholder(name: str, value: Any) -> bool:
    """Whether a RECIPE_FIELDS value means "the dataset's recipe": "auto" for a str field, the field's
    dataset_default sentinel (any negative value where the sentinel is negative) for a number."""
    if isinstance(value, str):
        return value == "auto"
    sentinel = _sentinels()[name]
    return value < 0 if sentinel < 0 else value == sentinel


@functools.lru_cache(maxsize=1)
def _sentinels() -> dict[str, float]:
    return {f.name: f.metadata["dataset_default"] for f in fields(trial_config_class())
            if "dataset_default" in f.metadata}


def resolve_values(values: dict[str, Any]) -> dict[str, Any]:
    """Every field of a config dict (defaults where absent) with its placeholders resolved: the
    RECIPE_FIELDS from the dataset's recipe, and each encoding's own (PositionEncoding.resolve_options,
    e.g. rotinv_basis auto -> bernstein or monomial); the options of encodings the trial does not use
    at their defaults (they change nothing, so they must not tell two trials apart). Idempotent; a dict, so rows of old results
    (which stored the placeholders) resolve with it too, without constructing a TrialConfig."""
    from rpevit.data import DATASET_SPECS

    load_registry()
    defaults = _default_values()
    out = {**defaults, **{k: v for k, v in values.items() if k in defaults}}
    spec = DATASET_SPECS.get(out["dataset"])
    if spec is not None:
        for name in RECIPE_FIELDS:
            if is_placeholder(name, out[name]):
                out[name] = getattr(spec, name)
    out.update({option: defaults[option] for option in unused_encoding_options(out["pe"])})
    for name in (part.strip() for part in str(out["pe"]).split("+")):
        encoding = registry.POSITION_ENCODINGS.get(name)
        if encoding is not None:
            out.update(encoding.resolve_options(out))
    return out


def unused_encoding_options(pe: str) -> set[str]:
    """The option fields of registered encodings that `pe` (names joined by '+') does not use: they do
    not apply to the trial, so they must not tell two trials apart (resolve_values, trial keys)."""
    used = [name.strip() for name in str(pe).split("+")]
    options = encoding_options()
    in_use = {option for name in used for option in options.get(name, ())}
    return {option for name, names in options.items() if name not in used for option in names
            if option not in in_use}


_ENCODING_OPTIONS: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}


def encoding_options() -> dict[str, tuple[str, ...]]:
    """pe name -> the config fields its class takes (registry.init_parameters) that are fields (its
    declared options, once validated), cached per set of registered encodings (a throwaway one
    registered later gets its own entry)."""
    load_registry()
    key = tuple(registry.POSITION_ENCODINGS)
    if key not in _ENCODING_OPTIONS:
        defaults = _default_values()
        _ENCODING_OPTIONS[key] = {
            name: tuple(p for p in registry.init_parameters(cls) if p in defaults and p not in registry.CONTEXT)
            for name, cls in registry.POSITION_ENCODINGS.items()}
    return _ENCODING_OPTIONS[key]


@functools.lru_cache(maxsize=1)
def field_types() -> dict[str, Any]:
    """Field name -> type (int, float, str) of TrialConfig, resolved once (sweeps validate 10^4+ trials)."""
    return typing.get_type_hints(trial_config_class())


@functools.lru_cache(maxsize=1)
def _default_values() -> dict[str, Any]:
    return {f.name: f.default for f in fields(trial_config_class())}


_REGISTRY_LOADED: list[bool] = []


def load_registry() -> None:
    """registry.load_all() once per process: it rescans the packages on every call."""
    if not _REGISTRY_LOADED:
        registry.load_all()
        _REGISTRY_LOADED.append(True)


_REGISTRY_FIELDS = (("task", "TASKS"), ("attention", "ATTENTIONS"), ("pe", "POSITION_ENCODINGS"))


def registered_names(name: str) -> str:
    """The registered names a registry-backed field (task, attention, pe) accepts, sorted."""
    table = dict(_REGISTRY_FIELDS)[name]
    return ", ".join(sorted(getattr(registry, table)))


@functools.lru_cache(maxsize=1)
def section_fields() -> dict[str, tuple[str, ...]]:
    """Section -> the names of its fields, in declaration order (every section of SECTIONS present)."""
    grouped: dict[str, list[str]] = {name: [] for name in SECTIONS}
    for f in fields(trial_config_class()):
        grouped[f.metadata["section"]].append(f.name)
    return {name: tuple(names) for name, names in grouped.items()}


@functools.lru_cache(maxsize=1)
def core_section_fields() -> dict[str, tuple[str, ...]]:
    """Section -> the names of its core fields (`_CoreFields`: not a variant's option), in order."""
    grouped: dict[str, list[str]] = {name: [] for name in SECTIONS}
    for name in _CoreFields.__annotations__:
        grouped[getattr(_CoreFields, name).metadata["section"]].append(name)
    return {name: tuple(names) for name, names in grouped.items()}


def layer_context(cfg: "TrialConfig", layer: int) -> dict[str, Any]:
    """The shape and identity of one layer: where the dataset, image and patch size end, for layers."""
    return {"dim": cfg.dim, "heads": cfg.heads, "head_dim": cfg.head_dim, "grid": cfg.grid,
            "layer": layer, "seed": cfg.seed}


def layer_arguments(cls: type, cfg: "TrialConfig", section: str, layer: int) -> dict[str, Any]:
    """The keyword arguments for `cls`: the context it declares, and its options from cfg's `section` (what
    rpevit.models.factory builds every layer with, and learned_parameters its one backend)."""
    context, options = layer_context(cfg, layer), cfg.section(section)
    undeclared = registry.undeclared_arguments(cls, core_section_fields()[section])
    if undeclared:
        raise TypeError(
            f"{cls.__qualname__}.__init__ takes {undeclared[0]!r}, which is neither layer context "
            f"({', '.join(registry.CONTEXT)}), nor a core field of the config section {section!r}, nor an option it "
            f"declares: declare it as an Option of the variant (rpevit.registry.Option)"
        )
    return {name: context[name] if name in context else options[name] for name in registry.init_parameters(cls)}


_LEARNED: dict[tuple, tuple[str, ...]] = {}  # (backend class, its option values) -> its parameters' names


@functools.cache
def _option_names(cls: type) -> tuple[str, ...]:
    return tuple(name for name in registry.init_parameters(cls) if name not in registry.CONTEXT)


def learned_parameters(cfg: "TrialConfig") -> tuple[str, ...]:
    """The names of the learned parameters (nn.Parameter) of cfg's backend, which validation refuses (backends
    hold none: TrialConfig._check_backend_parameters). Found by building one layer of it on the CPU with
    cfg's resolved values, once per backend class and values of the options it takes (a sweep of 10^4 trials
    builds a few), with the global RNG state restored afterwards, so validating changes no later random draw."""
    import torch  # the registered backends are torch modules; the config itself needs torch only here

    cls = registry.ATTENTIONS[cfg.attention]
    key = (cls, *(getattr(cfg, name) for name in _option_names(cls)))
    if key not in _LEARNED:
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            backend = cls(**layer_arguments(cls, cfg.resolved(), "attention", 0))
        _LEARNED[key] = tuple(name for name, _ in backend.named_parameters())
    return _LEARNED[key]


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def allowed_values(metadata: Any, hint: Any) -> str | None:
    """What a field's metadata allows, in words ('an integer > 0', 'a fraction in [0, 1)', ...); None: any."""
    if "choices" in metadata:
        return ", ".join(metadata["choices"])
    low, high = metadata.get("ge", metadata.get("gt")), metadata.get("le", metadata.get("lt"))
    if low is None and high is None:
        return None
    kind = "an integer" if hint is int else "a number"
    if low is not None and high is not None:
        if hint is int and "ge" in metadata and "le" in metadata:
            text = f"{kind} in {low}..{high}"
        else:
            kind = "a fraction" if 0 <= low and high <= 1 else kind
            text = (f"{kind} in {'[' if 'ge' in metadata else '('}{_number(low)}, "
                    f"{_number(high)}{']' if 'le' in metadata else ')'}")
    elif low is not None:
        text = f"{kind} {'>=' if 'ge' in metadata else '>'} {_number(low)}"
    else:
        text = f"{kind} {'<=' if 'le' in metadata else '<'} {_number(high)}"
    if "note" in metadata:
        text += f" ({metadata['note']})"
    if "dataset_default" in metadata:
        text += f", or {_number(metadata['dataset_default'])} for {DATASET_DEFAULT}"
    return text


class _Rule(typing.NamedTuple):
    """A field's metadata checks, resolved once: bounds as numbers (+-inf where none) for speed."""

    name: str
    hint: Any
    metadata: Any
    low: float
    low_open: bool  # gt rather than ge
    high: float
    high_open: bool  # lt rather than le
    sentinel: Any  # dataset_default, or None


def _in_range(value: float, rule: _Rule) -> bool:
    if value == rule.sentinel:
        return True
    if value < rule.low or value > rule.high:
        return False
    return not ((rule.low_open and value == rule.low) or (rule.high_open and value == rule.high))


@functools.lru_cache(maxsize=1)
def _field_rules() -> tuple[_Rule, ...]:
    """Every field's rule, resolved once: validate() runs for each of 10^5 sweep trials."""
    types, rules = field_types(), []
    for f in fields(trial_config_class()):
        m = f.metadata
        rules.append(_Rule(f.name, types[f.name], m, m.get("ge", m.get("gt", -math.inf)), "gt" in m,
                           m.get("le", m.get("lt", math.inf)), "lt" in m, m.get("dataset_default")))
    return tuple(rules)


def field_help(name: str) -> str:
    """One line for a CLI: the field's help text, default and allowed values (from its metadata)."""
    f = {f.name: f for f in fields(trial_config_class())}[name]
    if name in dict(_REGISTRY_FIELDS):
        load_registry()
        allowed = registered_names(name) + (" (joined by '+')" if name == "pe" else "")
    else:
        allowed = allowed_values(f.metadata, field_types()[name])
    return f"{f.metadata['help']} (default: {f.default!r}" + (f"; allowed: {allowed})" if allowed else ")")


def _check_values(cfg: "TrialConfig", bad: Any) -> None:
    """Checks of one field at a time, from its type and metadata; they run before every cross-field rule.

    NaN compares False with everything, so `lr < 0`-style checks let it through (and a sweep's
    dry run with it); inf passes `> 0`. Every float field, including ones added later, must be
    finite, then within its metadata's choices or bounds, and every int field must fit the int64
    columns of the results.
    """
    for rule in _field_rules():
        name, hint, metadata, value = rule.name, rule.hint, rule.metadata, getattr(cfg, rule.name)
        if hint is float and isinstance(value, float) and not math.isfinite(value):  # (not numbers.Real: slow)
            raise bad(name, value, "a finite number (not nan or inf)")
        if "choices" in metadata:
            if value not in metadata["choices"]:
                raise bad(name, value, ", ".join(metadata["choices"]))
        elif hint is not str and not _in_range(value, rule):
            raise bad(name, value, allowed_values(metadata, hint))
        if hint is int and isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            raise bad(name, value, f"a 64-bit integer in {INT64_MIN}..{INT64_MAX}")
    if any(not part or part != part.strip() for part in cfg.pe.split("+")):
        raise bad("pe", cfg.pe, "registered names joined by '+' with no empty or padded part, e.g. 'ape+rope'")
    if cfg.dataset == "digits" and cfg.data_dir:
        raise bad("data_dir", cfg.data_dir, "'' for dataset 'digits' (bundled with scikit-learn, it reads no "
                  "data folder: leave data_dir / --data-dir out)")


# ---- TrialConfig: the core fields and the registered variants' options, built once on first use ----
_BUILDING: list[bool] = []
_BUILD_LOCK = threading.RLock()  # one build per process even if two threads first use TrialConfig together


def trial_config_class() -> type:
    """TrialConfig, built on first use (PEP 562: `from rpevit.config import TrialConfig` calls this) from
    the core fields and the options the registered backends and encodings declare, then cached as the
    module's `TrialConfig` for the rest of the process. Building imports the backends and encodings
    (registry.load_layers: torch, not timm), which is why `import rpevit.config` alone imports neither; they
    must not use TrialConfig at their import time (type hints under TYPE_CHECKING). A variant registered
    after the build may declare no new option (registry.close_options)."""
    built = globals().get("TrialConfig")
    if built is not None:
        return built
    with _BUILD_LOCK:  # re-entrant: the building thread gets back in (and is refused below), another waits
        built = globals().get("TrialConfig")
        if built is not None:
            return built
        if _BUILDING:
            raise ImportError("rpevit.config.TrialConfig was used while it is built from the registered backends "
                              "and encodings: a module of rpevit.attention or rpevit.pe must not use TrialConfig at "
                              "import time (import it under `if TYPE_CHECKING:` for type hints)")
        _BUILDING.append(True)
        try:
            cls = _build_trial_config()
        finally:
            _BUILDING.clear()
        globals()["TrialConfig"] = cls
        return cls


_HINTS = {"int": int, "float": float, "str": str}


def _build_trial_config() -> type:
    """The dataclass TrialConfig: `_CoreFields` in order, with every declared Option (registry.collect_options,
    a fixed order) as a field of its variant's section inserted after OPTIONS_AFTER; the methods of
    `_TrialConfigMethods`. Type hints stay the names 'int', 'float', 'str', as the core's are."""
    core = [(name, hint, getattr(_CoreFields, name)) for name, hint in _CoreFields.__annotations__.items()]
    assert all(hint in _HINTS for _, hint, _ in core), core
    registry.load_layers()
    sections = {name: f.metadata["section"] for name, _, f in core}
    options = registry.collect_options(sections)
    declared = [(option.name, option.type.__name__,
                 _field(option.default, kind, option.help, choices=option.choices, ge=option.ge, gt=option.gt,
                        le=option.le, lt=option.lt, dataset_default=option.dataset_default, note=option.note,
                        cost_free=option.cost_free))
                for kind, option in options]
    at = [name for name, _, _ in core].index(OPTIONS_AFTER) + 1
    specs = [(name, hint, field(default=f.default, metadata=f.metadata))
             for name, hint, f in core[:at] + declared + core[at:]]
    cls = dataclasses.make_dataclass("TrialConfig", specs, bases=(_TrialConfigMethods,),
                                     namespace={"__module__": __name__, "__doc__": _TrialConfigMethods.__doc__})
    registry.close_options((option.name for _, option in options), sections)
    return cls


def __getattr__(name: str) -> Any:
    if name == "TrialConfig":
        return trial_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
