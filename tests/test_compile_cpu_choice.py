"""The CPU ladder's compile setting follows the measured runs (results/compile_cpu_1thread/), and the table
in that folder's README is the one benchmarks/throughput.py --table generates from its files."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "results" / "compile_cpu_1thread"
LADDER = ROOT / "search_spaces" / "cifar10_ladder_cpu.yaml"


def throughput_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return throughput


def run_files() -> list[Path]:
    """The folder's `throughput.py --variants` files (relu_forms.json is benchmarks/relu_forms.py's)."""
    return sorted(p for p in RUNS.glob("*.json") if "models" in json.loads(p.read_text()))


def test_the_readme_table_is_generated_from_the_files():
    table = throughput_module().variants_table([str(p) for p in run_files()])
    assert table in (RUNS / "README.md").read_text(), "regenerate: python benchmarks/throughput.py --table " + " ".join(
        str(p.relative_to(ROOT)) for p in run_files())


def test_the_ladder_compiles_the_attentions_that_ran_faster_compiled():
    """Per attention, the median compiled/eager ratio over every variant and run of the files measured at the
    current code (the `after` runs when there are any): compiled where it is above 1, eager where below."""
    files = [p for p in run_files() if p.stem.startswith("after")] or run_files()
    ratios: dict[str, list[float]] = {}
    for path in files:
        run = json.loads(path.read_text())
        assert run["threads"] == 1, path  # a 1-cpu trial's setting
        for row in run["models"]["cpu"]["variants"]:
            if "speedup" in row:
                assert row["members"] == 1 and not row["compile_fallback"], (path, row["variant"])
                ratios.setdefault(row["variant"].split("+")[0], []).append(row["speedup"])
    space = yaml.safe_load(LADDER.read_text())
    compiled = {attention for entry in space["grid"] if entry.get("compile") == ["on"]
                for attention in entry["attention"]}
    assert set(ratios) == {attention for entry in space["grid"] for attention in entry["attention"]}
    assert compiled == {attention for attention, r in ratios.items() if statistics.median(r) > 1}, ratios
