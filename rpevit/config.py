"""TrialConfig: the flat, typed record of every knob of one trial, validated before anything trains.

One record drives every task (`train`, `bench`, `kernel_mse`), the single-trial CLI and the
sweep runner. Validation errors name the field, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import typing
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rpevit import registry

if TYPE_CHECKING:
    from rpevit.data import DatasetSpec

DATASETS = ("digits", "mnist", "cifar10", "cifar100")
MAX_EPOCHS = 10_000  # more is a typo (a month per epoch-second); it would also overflow schedules
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # integer fields are int64 columns in the results


class ConfigError(ValueError):
    """A trial config that cannot run; the message names field, value and allowed values."""


def _choices(*values: str) -> dict[str, Any]:
    return {"metadata": {"choices": values}}


@dataclass
class TrialConfig:
    # what to run
    task: str = "train"
    dataset: str = "digits"
    attention: str = "softmax"
    pe: str = "ape"  # one registered name, or several joined by '+' (e.g. "ape+rope")

    # model (0 means: the dataset's default)
    image_size: int = 0
    patch_size: int = 0
    dim: int = 64
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 2.0
    drop_path: float = 0.1
    dropout: float = 0.0

    # attention options
    num_features: int = 64  # m, random features of FAVOR+ / ReLU
    redraw_interval: int = 0  # training steps between FAVOR+ feature redraws; 0 = never
    # fraction of training steps after which the draw is frozen: no redraw in the last stretch,
    # so the final weights are adapted to the draw they are evaluated with (docs/random_features.md)
    redraw_until: float = 0.8
    # L2-normalised q and k with a learned per-head temperature (Luo et al. 2021, section 3.3)
    qk_norm: str = field(default="none", **_choices("none", "l2"))
    feature_type: str = field(default="orthogonal", **_choices("orthogonal", "iid"))
    relu_projection: str = field(default="random", **_choices("random", "identity"))
    kernel_eps: float = 1e-3

    # position encoding options
    rope_base: float = 100.0
    luo_path: str = field(default="auto", **_choices("auto", "fft", "dense"))
    luo_scale: float = 10.0  # the Luo bias table is luo_scale * a raw parameter (rpevit/pe/relative_bias.py)
    string_sparsity: float = 0.1  # f, fraction of learned above-diagonal entries of S
    cayley_solver: str = field(default="auto", **_choices("auto", "dense", "sparse"))
    reflection_block: int = 0  # coordinates per Householder block; 0 = the whole head
    reflection_count: int = 2  # reflections per block
    rotinv_mode: str = field(default="exact", **_choices("exact", "random"))
    rotinv_degree: int = 2  # degree of p in |c_i - c_j|^2
    # auto: bernstein in exact mode, monomial in random mode (rpevit/pe/rotation_invariant.py)
    rotinv_basis: str = field(default="auto", **_choices("auto", "monomial", "bernstein"))
    rotinv_draws: int = 16  # Gaussian projections of the random mode

    # optimisation
    epochs: int = 10
    # 0 (batch, lr) / -1 (warm-up) = the dataset's recipe default (rpevit.data.DATASET_SPECS)
    batch_size: int = 0
    lr: float = 0.0
    weight_decay: float = 0.05
    warmup_epochs: float = -1.0
    label_smoothing: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 = off

    # data
    data_dir: str = ""  # '' -> $RPEVIT_DATA, else ./data
    train_subset: int = 0  # 0 = all training images
    val_fraction: float = 0.1
    augment: str = field(default="auto", **_choices("auto", "none", "crop", "crop_flip"))

    # runtime
    seed: int = 0
    device: str = field(default="auto", **_choices("auto", "cpu", "cuda"))
    amp: str = field(default="auto", **_choices("auto", "bf16", "none"))
    eval_batch_size: int = 1024
    # fresh random-feature draws of the draw-aware test evaluation (random-feature backends); 0 = off
    eval_draws: int = 8

    # bench task
    bench_batch: int = 32
    bench_warmup: int = 3
    bench_iters: int = 10

    # kernel_mse task
    kmse_dim: int = 16
    kmse_features: int = 16
    kmse_estimator: str = field(default="positive", **_choices("positive", "trig"))
    kmse_projection: str = field(
        default="gaussian", **_choices("gaussian", "orthogonal", "rademacher", "orthogonal_rademacher")
    )
    kmse_norm: float = 1.0  # |x| = |y|
    kmse_angle: float = 0.5  # angle between x and y, radians
    kmse_draws: int = 2000  # Monte Carlo repetitions

    # ---- construction and validation ----
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> "TrialConfig":
        """Build and validate; unknown keys and wrong types are errors, not silently dropped."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                f"{source}: unknown field(s) {unknown}; allowed fields: {', '.join(sorted(known))}"
            )
        hints = typing.get_type_hints(cls)
        coerced = {k: _coerce(k, v, hints[k], source) for k, v in values.items()}
        cfg = cls(**coerced)
        cfg.validate(source=source)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "TrialConfig":
        return TrialConfig.from_dict({**self.to_dict(), **changes})

    @property
    def pe_names(self) -> list[str]:
        return [p.strip() for p in self.pe.split("+") if p.strip()]

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def validate(self, *, source: str = "config") -> None:
        _load_registry()
        bad = lambda name, value, allowed: ConfigError(  # noqa: E731
            f"{source}: field {name!r} has value {value!r}; allowed: {allowed}"
        )
        _check_values(self, bad)
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise bad(f.name, getattr(self, f.name), ", ".join(choices))
        if self.task not in registry.TASKS:
            raise bad("task", self.task, ", ".join(sorted(registry.TASKS)))
        if self.dataset not in DATASETS:
            raise bad("dataset", self.dataset, ", ".join(DATASETS))
        if self.attention not in registry.ATTENTIONS:
            raise bad("attention", self.attention, ", ".join(sorted(registry.ATTENTIONS)))
        if not self.pe_names:
            raise bad("pe", self.pe, ", ".join(sorted(registry.POSITION_ENCODINGS)))
        for name in self.pe_names:
            if name not in registry.POSITION_ENCODINGS:
                raise bad("pe", name, ", ".join(sorted(registry.POSITION_ENCODINGS)))
        hooks = [registry.POSITION_ENCODINGS[n].hook for n in self.pe_names]
        if hooks.count("score") > 1:
            raise bad("pe", self.pe, "at most one score-hook encoding in a combination")
        if len(set(self.pe_names)) != len(self.pe_names):
            raise bad("pe", self.pe, "each encoding at most once in a combination")
        positive = ("dim", "depth", "heads", "eval_batch_size", "num_features",
                    "bench_batch", "bench_iters", "kmse_dim", "kmse_features", "kmse_draws",
                    "rotinv_draws", "reflection_count")
        for name in positive:
            if getattr(self, name) <= 0:
                raise bad(name, getattr(self, name), "an integer > 0")
        for name in ("epochs", "batch_size", "image_size", "patch_size", "train_subset", "redraw_interval",
                     "reflection_block", "bench_warmup", "seed", "rotinv_degree"):
            if getattr(self, name) < 0:
                raise bad(name, getattr(self, name), "an integer >= 0")
        if self.dim % self.heads:
            raise bad("dim", self.dim, f"a multiple of heads={self.heads}")
        if not 0.0 <= self.redraw_until <= 1.0:
            raise bad("redraw_until", self.redraw_until, "a fraction of training steps in [0, 1]")
        if self.eval_draws < 0:
            raise bad("eval_draws", self.eval_draws, "an integer >= 0 (0 = no draw-aware evaluation)")
        if not 0.0 < self.string_sparsity <= 1.0:
            raise bad("string_sparsity", self.string_sparsity, "a fraction in (0, 1]")
        if not 0.0 <= self.val_fraction < 1.0:
            raise bad("val_fraction", self.val_fraction, "a fraction in [0, 1)")
        if self.lr < 0:
            raise bad("lr", self.lr, "a number > 0, or 0 for the dataset's default")
        if self.warmup_epochs < 0 and self.warmup_epochs != -1:
            raise bad("warmup_epochs", self.warmup_epochs, "a number >= 0, or -1 for the dataset's default")
        for name in ("mlp_ratio", "rope_base", "kernel_eps", "kmse_norm", "luo_scale"):
            if getattr(self, name) <= 0:
                raise bad(name, getattr(self, name), "a number > 0")
        for name in ("weight_decay", "label_smoothing", "grad_clip",
                     "drop_path", "dropout", "kmse_angle"):
            if getattr(self, name) < 0:
                raise bad(name, getattr(self, name), "a number >= 0")
        if self.task == "kernel_mse" and self.kmse_dim < 2:
            raise bad("kmse_dim", self.kmse_dim, "an integer >= 2 (x and y span a plane)")
        if self.task == "kernel_mse" and self.kmse_angle > 3.141592653589794:
            raise bad("kmse_angle", self.kmse_angle, "radians in [0, pi]")
        if self.label_smoothing >= 1 or self.drop_path >= 1 or self.dropout >= 1:
            raise bad("label_smoothing/drop_path/dropout", None, "values in [0, 1)")
        if self.task == "train":
            spec = self.spec
            image = self.image_size or spec.image_size
            if image != spec.image_size:
                raise bad("image_size", self.image_size,
                          f"0 or {spec.image_size} for dataset {self.dataset!r} (train uses native size)")
        image, patch = self.resolved_image_size, self.resolved_patch_size
        if patch <= 0 or image % patch:
            raise bad("patch_size", self.patch_size, f"a divisor of image_size={image}")
        for name in self.pe_names:
            registry.POSITION_ENCODINGS[name].check_config(self, source)
        registry.ATTENTIONS[self.attention].check_config(self, source)

    @property
    def spec(self) -> "DatasetSpec":
        from rpevit.data import DATASET_SPECS

        return DATASET_SPECS[self.dataset]

    @property
    def resolved_image_size(self) -> int:
        return self.image_size or self.spec.image_size

    @property
    def resolved_patch_size(self) -> int:
        return self.patch_size or self.spec.patch_size

    @property
    def resolved_batch_size(self) -> int:
        return self.batch_size or self.spec.batch_size

    @property
    def resolved_lr(self) -> float:
        return self.lr or self.spec.lr

    @property
    def resolved_warmup_epochs(self) -> float:
        return self.spec.warmup_epochs if self.warmup_epochs < 0 else self.warmup_epochs

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


@functools.lru_cache(maxsize=1)
def field_types() -> dict[str, Any]:
    """Field name -> type (int, float, str) of TrialConfig, resolved once (sweeps validate 10^4+ trials)."""
    return typing.get_type_hints(TrialConfig)


def build_config(values: dict[str, Any], *, source: str = "config") -> "TrialConfig":
    """TrialConfig.from_dict with the field types resolved once: the same checks and messages,
    fast enough to expand and validate a sweep of 10^5 trials in seconds."""
    types = field_types()
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {unknown}; allowed fields: {', '.join(sorted(types))}")
    cfg = TrialConfig(**{k: _coerce(k, v, types[k], source) for k, v in values.items()})
    cfg.validate(source=source)
    return cfg


_REGISTRY_LOADED: list[bool] = []


def _load_registry() -> None:
    """registry.load_all() once per process: it rescans the packages on every call."""
    if not _REGISTRY_LOADED:
        registry.load_all()
        _REGISTRY_LOADED.append(True)


def _check_values(cfg: "TrialConfig", bad: Any) -> None:
    """Checks that must run before every comparison in validate(), generic over the field types.

    NaN compares False with everything, so `lr < 0`-style checks let it through (and a sweep's
    dry run with it); inf passes `> 0`. Every float field, including ones added later, must be
    finite, and every int field must fit the int64 columns of the results.
    """
    if not 0 <= cfg.seed <= INT64_MAX:
        raise bad("seed", cfg.seed, f"an integer in 0..{INT64_MAX} (2^63 - 1)")
    if not 1 <= cfg.epochs <= MAX_EPOCHS:
        raise bad("epochs", cfg.epochs, f"an integer in 1..{MAX_EPOCHS}")
    for name, hint in field_types().items():
        value = getattr(cfg, name)
        if hint is float and isinstance(value, float) and not math.isfinite(value):  # (not numbers.Real: slow)
            raise bad(name, value, "a finite number (not nan or inf)")
        if hint is int and isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            raise bad(name, value, f"a 64-bit integer in {INT64_MIN}..{INT64_MAX}")
    if any(not part or part != part.strip() for part in cfg.pe.split("+")):
        raise bad("pe", cfg.pe, "registered names joined by '+' with no empty or padded part, e.g. 'ape+rope'")
    if cfg.dataset == "digits" and cfg.data_dir:
        raise bad("data_dir", cfg.data_dir, "'' for dataset 'digits' (bundled with scikit-learn, it reads no "
                  "data folder: leave data_dir / --data-dir out)")
