"""The layering of rpevit's imports (docs/architecture.md, "Layers"): a leaf config, no import cycle, and
reading a space or results without the model's dependencies (timm, and torchvision with it) (issue 44)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import import_graph
from tests.analysis_rows import train_rows, write_sweep

REPO = Path(__file__).resolve().parent.parent
MODEL_ONLY = ("timm", "torchvision")  # what only building a model needs (rpevit.models.vit)
READERS = ("rpevit.config", "rpevit.sweep.space", "rpevit.analysis.report")  # a space, results, the analysis
# docs/architecture.md, "Layers", from the bottom: a module imports only from its own layer and those before it
LAYERS = (("rpevit.data", "rpevit.cifar_archive", "rpevit.metrics", "rpevit.flops", "rpevit.sigterm", "rpevit.tool_exit", "rpevit.registry",
           "rpevit.durable"),
          ("rpevit.config",),
          ("rpevit.attention", "rpevit.pe", "rpevit.checkpoint", "rpevit.training"),
          ("rpevit.models",),
          ("rpevit.evaluation", "rpevit.tasks"),
          ("rpevit.sweep", "rpevit.analysis", "rpevit.cli"))


def layer(module: str) -> int:
    """The index in LAYERS of a module's layer (-1: the package `rpevit` itself); every module has one."""
    found = [i for i, names in enumerate(LAYERS) for name in names if module == name or module.startswith(name + ".")]
    assert module == "rpevit" or found, f"{module} is in no layer of LAYERS: add it there and to the docs"
    return found[0] if found else -1


def test_config_imports_nothing_above_it():
    """Not even inside a function: the config is validated by everything, so it sits below the model."""
    imported = {target for target in import_graph.edges()["rpevit.config"] if target.startswith("rpevit")}
    assert imported <= {"rpevit.registry", "rpevit.data"}, imported  # data: the recipes
    # data imports only its CIFAR archive reader, which imports no rpevit
    assert {t for t in import_graph.edges()["rpevit.data"] if t.startswith("rpevit")} <= {"rpevit.cifar_archive"}
    assert not any(target.startswith("rpevit") for target in import_graph.edges()["rpevit.cifar_archive"])
    registry = import_graph.edges()["rpevit.registry"]
    kinds = {how for target, how in registry.items() if target.startswith("rpevit")}
    assert kinds == {frozenset({import_graph.PLUGIN})}  # only registering by import (load_all)


def test_each_layer_imports_only_the_layers_below_it():
    """Module-level, deferred and type-only imports alike; registering by import (registry.load_all) aside."""
    upward = [(name, target) for name, out in import_graph.edges().items() for target, how in out.items()
              if target in import_graph.modules() and how != {import_graph.PLUGIN} and layer(target) > layer(name)]
    assert upward == []


def test_no_import_cycle():
    """Module-level, deferred and type-only imports alike (registering by import aside: registry.load_all)."""
    assert import_graph.cycles() == []


def test_reading_a_space_or_results_imports_no_model_code():
    """What importing the config, the space and the analysis runs: not the ViT, not timm."""
    loaded = import_graph.closure(READERS)
    assert "rpevit.models.vit" not in loaded
    assert {name.split(".")[0] for name in loaded} & set(MODEL_ONLY) == set()
    assert not any(name.startswith(("rpevit.tasks.train", "rpevit.sweep.runner", "rpevit.sweep.tune_run"))
                   for name in loaded), sorted(loaded)


PROBE = """
import json, runpy, sys
import rpevit.tool_exit
MODEL_ONLY = {model_only!r}
loaded = {{}}
rpevit.tool_exit.exit_now = sys.exit  # a script's run_tool ends in SystemExit here, so this probe goes on

def run(script, *args):
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        assert not stop.code, (script, stop.code)

import rpevit.config, rpevit.sweep.space, rpevit.analysis.report
loaded["import"] = [m for m in MODEL_ONLY if m in sys.modules]
run("sweep.py", "--space", "search_spaces/smoke.yaml", "--dry-run", "--results-dir", {results!r})
loaded["dry run"] = [m for m in MODEL_ONLY if m in sys.modules]
run("analysis/report.py", {results!r})
loaded["report"] = [m for m in MODEL_ONLY if m in sys.modules]
print(json.dumps(loaded))
"""


@pytest.mark.slow
def test_dry_run_and_report_load_no_model_dependencies(tmp_path):
    """The commands themselves, in a fresh process: the imports, `sweep.py --dry-run` (which validates
    every trial through the registry) and analysis/report.py on a results folder load neither timm nor
    torchvision."""
    results = tmp_path / "results"
    write_sweep(results / "main", "main", train_rows())
    probe = PROBE.format(model_only=MODEL_ONLY, results=str(results))
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "MPLBACKEND": "Agg"})
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {"import": [], "dry run": [], "report": []}
    assert (results / "report.md").is_file()
