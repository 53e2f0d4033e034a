"""Layers take explicit arguments, filled by one factory; config rules and help live in field metadata.

Registry-wide, so a variant added later is covered: every backend and encoding declares only
layer context and options of its own config section, with the config's defaults; the factory
builds the same layer as an explicit call; every field has a section, a help line shown by the
CLI, and its range checked from metadata with the usual message.
"""
from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import pytest
import torch

from rpevit import registry
from rpevit.attention.kernelized import FavorAttention
from rpevit.cli import build_parser
from rpevit.config import SECTIONS, ConfigError, TrialConfig, allowed_values, field_help, field_types, section_fields
from rpevit.models.factory import build_attention, build_encodings, layer_arguments
from rpevit.pe.base import PositionEncoding
from rpevit.pe.cayley_string import SparseCayleyString
from rpevit.pe.rope import MixedRoPE
from rpevit.registry import CONTEXT, init_parameters

registry.load_all()
LAYERS = [("attention", name, cls) for name, cls in sorted(registry.ATTENTIONS.items())] + [
    ("pe", name, cls) for name, cls in sorted(registry.POSITION_ENCODINGS.items())]


DEFAULTS = {f.name: f.default for f in fields(TrialConfig)}


def config_defaults(section: str, name: str) -> dict[str, object]:
    """The config default of each field, what a layer built outside a config should run; where that default
    is the dataset's (redraw_interval, luo_scale: a dataset_default sentinel), what the default config
    (digits) resolves it to with this layer chosen. A layer's own `auto` (rotinv_basis) stays `auto`."""
    resolved = TrialConfig(**{section: name}).resolved().to_dict()
    sentinel = {f.name for f in fields(TrialConfig) if "dataset_default" in f.metadata}
    return {k: resolved[k] if k in sentinel else v for k, v in DEFAULTS.items()}


def declared_defaults(cls: type) -> dict[str, object]:
    """Parameter name -> default over the `**context` chain of __init__s (as init_parameters walks it)."""
    defaults: dict[str, object] = {}
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass is not torch.nn.Module:
            for p in inspect.signature(vars(klass)["__init__"]).parameters.values():
                if p.default is not p.empty:
                    defaults.setdefault(p.name, p.default)
    return defaults


@pytest.mark.parametrize("section,name,cls", LAYERS, ids=[f"{s}:{n}" for s, n, _ in LAYERS])
def test_layers_declare_context_and_own_options_with_the_config_defaults(section, name, cls):
    params = init_parameters(cls)
    assert "cfg" not in params
    options = set(section_fields()[section])
    assert set(params) <= set(CONTEXT) | options, (name, params)
    resolved = config_defaults(section, name)
    for param, default in declared_defaults(cls).items():
        if param in options:
            assert default == resolved[param], f"{cls.__name__}({param}={default!r}) but the default config " \
                                               f"resolves it to {resolved[param]!r}"


def test_factory_refuses_an_option_that_is_not_a_field_of_the_section():
    class Odd(PositionEncoding):
        def __init__(self, *, rope_frequency: float = 1.0, **context) -> None:
            super().__init__(**context)

    with pytest.raises(TypeError, match="'rope_frequency'.*section 'pe'"):
        layer_arguments(Odd, TrialConfig.from_dict({}), "pe", 0)


def test_factory_builds_what_an_explicit_call_builds():
    cfg = TrialConfig.from_dict({"attention": "favor", "pe": "rope_mixed", "dim": 32, "heads": 2, "seed": 7,
                                 "num_features": 24, "feature_type": "iid", "rope_base": 50.0,
                                 "rope_mixed_base": 20.0})
    favor = FavorAttention(heads=2, head_dim=16, layer=2, seed=7, num_features=24, feature_type="iid")
    assert torch.equal(build_attention(cfg, 2).projection, favor.projection)
    mixed = MixedRoPE(grid=cfg.grid, heads=2, head_dim=16, layer=2, seed=7, rope_mixed_base=20.0)
    (built,) = build_encodings(cfg, ("qk",), 2)
    assert torch.equal(built.frequencies, mixed.frequencies)
    sparse_cfg = cfg.replace(pe="sparse_cayley_string", string_sparsity=0.3)
    (sparse,) = build_encodings(sparse_cfg, ("qk",), 1)
    explicit = SparseCayleyString(grid=cfg.grid, heads=2, head_dim=16, layer=1, seed=7, string_sparsity=0.3,
                                  rope_base=50.0)
    assert torch.equal(sparse.rows, explicit.rows) and torch.equal(sparse.cols, explicit.cols)
    assert type(build_attention(cfg, 0, name="softmax")).__name__ == "SoftmaxAttention"


def test_every_field_has_a_section_and_one_help_line():
    grouped = [name for names in section_fields().values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in fields(TrialConfig))  # each field in exactly one section
    cfg = TrialConfig.from_dict({})
    for section in SECTIONS:
        assert cfg.section(section) == {n: getattr(cfg, n) for n in section_fields()[section]}
    for f in fields(TrialConfig):
        assert f.metadata["section"] in SECTIONS and f.metadata["help"], f.name
        line = field_help(f.name)
        assert "\n" not in line and f"default: {f.default!r}" in line, line


def test_cli_help_lists_every_field_by_section_with_help_default_and_range():
    text = " ".join(build_parser().format_help().split())
    for section in SECTIONS:
        assert f"{section} options:" in text
    for f in fields(TrialConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in text and " ".join(field_help(f.name).split()) in text, f.name
    assert "an integer in 1..10000" in text and "a fraction in (0, 1]" in text


def outside(metadata: dict, hint: type) -> list:
    """Values just outside a field's bounds (never its dataset-default sentinel)."""
    step = 1 if hint is int else 0.5
    values = []
    if "ge" in metadata:
        values.append(metadata["ge"] - step)
    if "gt" in metadata:
        values.append(metadata["gt"])
    if "le" in metadata:
        values.append(metadata["le"] + step)
    if "lt" in metadata:
        values.append(metadata["lt"])
    return [hint(v if v != metadata.get("dataset_default") else v - step) for v in values]


BOUNDED = [(f.name, value) for f in fields(TrialConfig) if field_types()[f.name] is not str
           for value in outside(f.metadata, field_types()[f.name])]


@pytest.mark.parametrize("name,value", BOUNDED)
def test_bounds_come_from_field_metadata(name, value):
    metadata = {f.name: f.metadata for f in fields(TrialConfig)}[name]
    with pytest.raises(ConfigError) as err:
        TrialConfig.from_dict({name: value}, source="test")
    allowed = allowed_values(metadata, field_types()[name])
    assert str(err.value) == f"test: field {name!r} has value {value!r}; allowed: {allowed}"


def test_every_number_field_is_bounded_and_sentinels_mean_the_dataset_default():
    numbers = [f.name for f in fields(TrialConfig) if field_types()[f.name] is not str]
    assert {name for name, _ in BOUNDED} == set(numbers)
    assert all(f.default is not MISSING for f in fields(TrialConfig))
    cfg = TrialConfig.from_dict({"lr": 0, "warmup_epochs": -1, "batch_size": 0})
    assert cfg.resolved_lr == cfg.spec.lr and cfg.resolved_batch_size == cfg.spec.batch_size
