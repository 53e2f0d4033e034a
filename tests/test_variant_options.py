"""A variant owns its options (issue 44, item 3): an encoding or a backend declares each option beside its
class (rpevit.registry.Option, `register_pe(..., options=...)`), and the option becomes a TrialConfig
field of its section, so a CLI flag, a Parquet column, a validated value, an argument the factory passes
and, for an encoding, part of the trial key only when the trial uses it, with no central file touched.

TrialConfig is built once per process, on first use, from the variants registered by then
(rpevit.config.trial_config_class); a throwaway variant with a NEW option therefore registers in a fresh
process before anything uses the config (the slow test below). The refusals of bad declarations are
checked in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rpevit import registry
from rpevit.config import core_section_fields, section_fields, trial_config_class
from rpevit.registry import Option

REPO = Path(__file__).resolve().parent.parent

THROWAWAYS = textwrap.dedent('''
    """A throwaway encoding and a throwaway backend, each with an option no other file knows."""
    from torch import Tensor

    from rpevit.attention.softmax import SoftmaxAttention
    from rpevit.pe.base import PositionEncoding
    from rpevit.registry import Option, register_attention, register_pe

    THROWAWAY_GAIN = Option("throwaway_gain", float, 1.5, "scale of the throwaway tokens", gt=0, cost_free=True)
    THROWAWAY_MODE = Option("throwaway_mode", str, "plain", "how the throwaway backend reads q",
                            choices=("plain", "doubled"))


    @register_pe("throwaway_gained", options=(THROWAWAY_GAIN,))
    class Gained(PositionEncoding):
        hook = "token"

        def __init__(self, *, throwaway_gain: float = THROWAWAY_GAIN.default, **context) -> None:
            super().__init__(**context)
            self.gain = throwaway_gain

        def add_to_tokens(self, x: Tensor) -> Tensor:
            return x * self.gain


    @register_attention("throwaway_moded", options=(THROWAWAY_MODE,))
    class Moded(SoftmaxAttention):
        def __init__(self, *, throwaway_mode: str = THROWAWAY_MODE.default, **context) -> None:
            super().__init__(**context)
            self.mode = throwaway_mode
''')

PROBE = textwrap.dedent('''
    import contextlib, dataclasses, importlib.util, io, json, sys

    spec = importlib.util.spec_from_file_location("throwaways", sys.argv[1])
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # registers before the config's first use

    from rpevit.cli import build_parser
    from rpevit.config import ConfigError, TrialConfig, field_help, section_fields, unused_encoding_options
    from rpevit.models import build_model
    from rpevit.sweep.results import trials_schema
    from rpevit.sweep.space import expand_space

    out = {}
    for name in ("throwaway_gain", "throwaway_mode"):
        f = {f.name: f for f in dataclasses.fields(TrialConfig)}[name]
        out[name] = {"type": f.type, "default": f.default, "class_default": getattr(TrialConfig, name),
                     "section": f.metadata["section"], "help": field_help(name),
                     "column": str(trials_schema("train").field(name).type)}
    out["sections"] = {k: list(v) for k, v in section_fields().items() if k in ("attention", "pe")}
    parser = build_parser()
    out["parsed"] = {k: v for k, v in vars(parser.parse_args(["--throwaway-gain", "2.5", "--throwaway-mode",
                                                               "doubled"])).items() if k.startswith("throwaway")}
    with contextlib.redirect_stdout(io.StringIO()) as shown, contextlib.suppress(SystemExit):
        parser.parse_args(["--help"])
    out["help_lines"] = [line.strip() for line in shown.getvalue().splitlines() if "throwaway" in line]
    refusals = []
    for values in ({"pe": "throwaway_gained", "throwaway_gain": -1.0}, {"throwaway_mode": "tripled"}):
        try:
            TrialConfig.from_dict(values, source="probe")
        except ConfigError as error:
            refusals.append(str(error))
    out["refusals"] = refusals
    cfg = TrialConfig.from_dict({"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": 1,
                                 "pe": "ape+throwaway_gained", "throwaway_gain": 2.5,
                                 "attention": "throwaway_moded", "throwaway_mode": "doubled"})
    model = build_model(cfg, 1, 10)
    out["built"] = {"gain": [m.gain for m in model.modules() if hasattr(m, "gain")],
                    "mode": [m.mode for m in model.modules() if hasattr(m, "mode")]}
    out["unused_with_ape"] = "throwaway_gain" in unused_encoding_options("ape")
    out["unused_with_it"] = "throwaway_gain" in unused_encoding_options("ape+throwaway_gained")
    space = expand_space({"name": "opts", "task": "train", "fixed": {"dataset": "digits", "epochs": 1},
                          "grid": [{"pe": ["ape", "throwaway_gained"], "throwaway_gain": [1.5, 2.5],
                                    "attention": ["softmax"]},
                                   {"attention": ["throwaway_moded"], "throwaway_mode": ["plain", "doubled"]}],
                          "seeds": [0]}, source="probe")
    out["trials"] = [(t["pe"], t["attention"], t["throwaway_gain"], t["throwaway_mode"], k)
                     for t, k in zip(space.trials, space.keys)]
    print(json.dumps(out))
''')


@pytest.mark.slow
def test_a_new_option_declared_beside_its_variant_is_a_field_flag_column_rule_argument_and_key(tmp_path):
    """In a fresh process (TrialConfig is built once per process, from what is registered by its first use)."""
    module = tmp_path / "throwaways.py"
    module.write_text(THROWAWAYS)
    probe = subprocess.run([sys.executable, "-c", PROBE, str(module)], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert probe.returncode == 0, probe.stderr[-3000:]
    out = json.loads(probe.stdout.strip().splitlines()[-1])
    gain, mode = out["throwaway_gain"], out["throwaway_mode"]
    # a field of its variant's section, with the declared type, default and help; a typed Parquet column
    assert gain == {"type": "float", "default": 1.5, "class_default": 1.5, "section": "pe", "column": "double",
                    "help": "scale of the throwaway tokens (default: 1.5; allowed: a number > 0)"}
    assert mode == {"type": "str", "default": "plain", "class_default": "plain", "section": "attention",
                    "column": "string", "help": "how the throwaway backend reads q (default: 'plain'; allowed: "
                                                "plain, doubled)"}
    assert out["sections"]["pe"][-1] == "throwaway_gain" and "throwaway_mode" in out["sections"]["attention"]
    # a CLI flag with its help
    assert out["parsed"] == {"throwaway_gain": 2.5, "throwaway_mode": "doubled"}
    assert any(line.startswith("--throwaway-gain FLOAT") for line in out["help_lines"]), out["help_lines"]
    assert any(line.startswith("--throwaway-mode {plain,doubled}") for line in out["help_lines"]), out["help_lines"]
    # a bad value refused in one line naming the field, the value and what is allowed
    assert out["refusals"] == ["probe: field 'throwaway_gain' has value -1.0; allowed: a number > 0",
                               "probe: field 'throwaway_mode' has value 'tripled'; allowed: plain, doubled"]
    # the factory passes the value to every layer that declares it
    assert out["built"] == {"gain": [2.5], "mode": ["doubled"]}
    # hashed into the trial key only where the encoding is used: ape at gain 1.5 and 2.5 is one trial
    assert out["unused_with_ape"] and not out["unused_with_it"]
    trials = out["trials"]
    assert [t[:4] for t in trials] == [["ape", "softmax", 1.5, "plain"], ["throwaway_gained", "softmax", 1.5, "plain"],
                                       ["throwaway_gained", "softmax", 2.5, "plain"],
                                       ["ape", "throwaway_moded", 1.5, "plain"],
                                       ["ape", "throwaway_moded", 1.5, "doubled"]]
    assert len({t[4] for t in trials}) == 5


# ---- refusals of bad declarations, one line each (in this process: TrialConfig is built here already)
@pytest.fixture
def restored_tables():
    """The package's variants registered and TrialConfig built; afterwards the tables as they were."""
    trial_config_class()
    registry.load_all()
    tables = (registry.POSITION_ENCODINGS, registry.ATTENTIONS)
    saved = [dict(t) for t in tables]
    yield
    for table, copy in zip(tables, saved):
        table.clear()
        table.update(copy)


def _encoding(**init_defaults):
    """A throwaway encoding class whose __init__ takes `init_defaults` as keyword options."""
    from rpevit.pe.base import PositionEncoding

    names = ", ".join(f"{name}={value!r}" for name, value in init_defaults.items())
    namespace: dict = {}
    exec(f"def __init__(self, *, {names}, **context):\n    PositionEncoding.__init__(self, **context)",
         {"PositionEncoding": PositionEncoding}, namespace)
    return type("Throwaway", (PositionEncoding,), {"hook": "token", "__init__": namespace["__init__"]})


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "Gain", "type": float, "default": 1.0, "help": "h"}, r"option 'Gain': name = 'Gain'; allowed: a lower"),
    ({"name": "gain", "type": bool, "default": True, "help": "h"}, r"option 'gain': type = <class 'bool'>; allowed: int"),
    ({"name": "gain", "type": float, "default": 1, "help": "h"}, r"option 'gain': default = 1; allowed: a value of "
                                                                 r"its type, float"),
    ({"name": "gain", "type": float, "default": 1.0, "help": " "}, r"option 'gain': help = ' '; allowed: one line"),
    ({"name": "mode", "type": str, "default": "a", "help": "h", "gt": 0}, r"option 'mode': gt = 0; allowed: None"),
    ({"name": "mode", "type": str, "default": "c", "help": "h", "choices": ("a", "b")},
     r"option 'mode': choices = \('a', 'b'\); allowed: a tuple of the str values allowed, for a str option, with its"),
])
def test_a_malformed_option_is_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Option(**kwargs)


def test_two_declarations_of_one_option_name_are_refused_naming_both_variants(restored_tables):
    other = Option("rope_base", float, 50.0, "another base")
    with pytest.raises(ValueError, match=r"^option 'rope_base' is declared twice, differently: by pe '\w+' "
                                         r"\(Option\(name='rope_base'.*\) and by pe 'throwaway_base' \(Option\("
                                         r"name='rope_base', type=<class 'float'>, default=50.0"):
        registry.register_pe("throwaway_base", options=(other,))(_encoding(rope_base=50.0))
    assert "throwaway_base" not in registry.POSITION_ENCODINGS
    from rpevit.pe.rope import ROPE_BASE  # the one declaration, named again: accepted

    registry.register_pe("throwaway_base", options=(ROPE_BASE,))(_encoding(rope_base=100.0))


def test_an_option_named_like_a_core_field_or_layer_context_or_not_taken_is_refused(restored_tables):
    with pytest.raises(ValueError, match=r"^option 'lr' of pe 'throwaway_lr' has the name of the core TrialConfig "
                                         r"field 'lr' \(section 'optim'\); allowed: another name$"):
        registry.register_pe("throwaway_lr", options=(Option("lr", float, 0.1, "h"),))(_encoding(lr=0.1))
    with pytest.raises(ValueError, match=r"^pe 'throwaway_seed': option 'seed' is layer context"):
        registry.register_pe("throwaway_seed", options=(Option("seed", int, 0, "h"),))(_encoding(seed=0))
    with pytest.raises(ValueError, match=r"^pe 'throwaway_unused' declares option 'rope_base', which Throwaway.__init__ "
                                         r"does not take; allowed: the keyword names of its __init__"):
        from rpevit.pe.rope import ROPE_BASE

        registry.register_pe("throwaway_unused", options=(ROPE_BASE,))(_encoding(other=1.0))


def test_the_core_field_clash_is_refused_when_the_config_is_built(restored_tables, monkeypatch):
    """Before the build (a variant registered first): registry.collect_options, which the build calls."""
    monkeypatch.setattr(registry, "_BUILT_OPTIONS", {})
    registry.register_pe("throwaway_lr", options=(Option("lr", float, 0.1, "h"),))(_encoding(lr=0.1))
    with pytest.raises(ValueError, match=r"^option 'lr' of pe 'throwaway_lr' has the name of the core TrialConfig "
                                         r"field 'lr' \(section 'optim'\)"):
        registry.collect_options({"lr": "optim"})


def test_a_new_option_registered_after_the_config_is_built_is_refused(restored_tables):
    with pytest.raises(ValueError, match=r"^pe 'throwaway_late' declares option 'late_gain' after TrialConfig was "
                                         r"built without it .*import the variant's module before the config is "
                                         r"first used$"):
        registry.register_pe("throwaway_late", options=(Option("late_gain", float, 1.0, "h"),))(
            _encoding(late_gain=1.0))


def test_the_package_variants_declare_every_option_field_and_the_core_keeps_the_rest():
    """Each pe / attention field is a core field or one registered variant's declared option, never both."""
    registry.load_all()
    declared = {o.name: kind for kind, o in registry.collect_options({})}
    for section in ("attention", "pe"):
        core = set(core_section_fields()[section])
        options = {name for name, kind in declared.items() if kind == section}
        assert set(section_fields()[section]) == core | options and not core & options
    assert core_section_fields()["attention"] == ("attention", "redraw_interval", "redraw_until", "qk_norm")
    assert core_section_fields()["pe"] == ("pe",)


def test_a_layer_module_using_trial_config_while_it_is_built_gets_one_clear_error(monkeypatch):
    """The build imports the backends and encodings; one that used TrialConfig at its import time would re-enter
    the build: refused with what to do, not a recursion."""
    from rpevit import config

    trial_config_class()
    monkeypatch.delitem(vars(config), "TrialConfig")  # as during the build: not yet bound
    monkeypatch.setattr(config, "_BUILDING", [True])
    with pytest.raises(ImportError, match=r"^rpevit.config.TrialConfig was used while it is built .* must not use "
                                          r"TrialConfig at import time \(import it under `if TYPE_CHECKING:`"):
        from rpevit.config import TrialConfig  # noqa: F401
