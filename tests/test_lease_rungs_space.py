"""search_spaces/cifar10_rungs_gpu.yaml, the declared CIFAR-10 rung study of the GPU leases (issue 60, item 4).

It claims all12.yaml's CIFAR-10 model and recipe, seeds no committed study used, a declaration with the right
families, and a first rung that benchmarks/lease/plan.py fits in one call; each claim is checked here against
the files it names, so the header cannot drift from what the lease runs.
"""
from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from rpevit.sweep.space import load_space

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "search_spaces" / "cifar10_rungs_gpu.yaml"
SEEDS = (10, 11, 12)
CELLS = {(a, pe) for a in ("softmax", "favor") for pe in ("ape", "luo_rpe", "rope", "circulant_string")}


@pytest.fixture(scope="module")
def space():
    return load_space(str(SPACE), {})


def test_every_trial_is_an_all12_cifar10_cell_but_for_its_budget_and_seed(space):
    all12 = load_space(str(ROOT / "search_spaces" / "all12.yaml"), {}, only={"dataset": "cifar10"})
    reference = {(t["attention"], t["pe"]): t for t in all12.trials if t["seed"] == 0}
    assert {(t["attention"], t["pe"]) for t in space.trials} == CELLS
    for trial in space.trials:
        other = reference[(trial["attention"], trial["pe"])]
        differ = {k for k in set(trial) | set(other) if trial.get(k) != other.get(k)}
        assert differ == {"epochs", "seed"}, (trial["attention"], trial["pe"], differ)
    assert {t["compile"] for t in space.trials} == {"on"} and {t["amp"] for t in space.trials} == {"auto"}  # bf16
    assert space.fuse == "seeds" and len(space.groups()) == 8 * 3 and space.branch is None
    assert sorted({t["epochs"] for t in space.trials}) == [3, 6, 10]


def test_the_declaration_has_the_gap_the_contrast_and_the_trend_families(space):
    decl = space.declaration
    assert decl.seeds == SEEDS and decl.metric == "judged" and decl.alpha == 0.05
    kinds = [(f.kind, f.for_each, f.secondary_metric, f.size) for f in decl.families]
    assert kinds == [("comparison", "epochs", "test_acc", 4), ("contrast", "epochs", "test_acc", 3),
                     ("trend", None, "test_acc", 4)]
    gaps, contrasts, trend = decl.families
    assert {(a["attention"], a["pe"], b["attention"], b["pe"]) for a, b in gaps.comparisons} == \
        {("softmax", pe, "favor", pe) for pe in ("ape", "luo_rpe", "rope", "circulant_string")}
    assert all(first == ({"attention": "softmax", "pe": "ape"}, {"attention": "favor", "pe": "ape"})
               for first, _ in contrasts.contrasts)  # gap(ape) - gap(rpe)
    assert {second[0]["pe"] for _, second in contrasts.contrasts} == {"luo_rpe", "rope", "circulant_string"}
    assert (trend.trend.field, trend.trend.start, trend.trend.end) == ("epochs", 3, 10)  # first to last rung
    assert trend.comparisons == gaps.comparisons


def test_the_declaration_is_recorded_before_a_trial_and_read_back_unchanged(space, tmp_path):
    from rpevit.sweep import declaration

    line = declaration.record(tmp_path, space.declaration, rows_exist=False, redeclare=False)
    assert "11 item(s) in 3 families, metric judged, seeds 10, 11, 12" in line
    (entry,) = declaration.read_record(tmp_path)["declarations"]
    assert entry["sha256"] == space.declaration.digest() and entry["parsed"] == space.declaration
    assert declaration.record(tmp_path, space.declaration, rows_exist=True, redeclare=False) is None  # a later lease


def test_its_seeds_are_used_by_no_committed_study_and_no_other_space():
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "results"], capture_output=True, text=True,
                             check=True).stdout.split()
    files = [ROOT / p for p in tracked if p.endswith("trials.parquet")]
    assert files, "no committed trials.parquet found"
    for path in files:
        seeds = set(pq.read_table(path, columns=["seed"]).column("seed").to_pylist())
        assert not seeds & set(SEEDS), f"{path} holds seed(s) {sorted(seeds & set(SEEDS))}"
    for other in sorted((ROOT / "search_spaces").glob("*.yaml")):
        if other == SPACE:
            continue
        spec = yaml.safe_load(other.read_text()) or {}
        used = set(spec.get("seeds") or []) | set((spec.get("declare") or {}).get("seeds") or [])
        assert not used & set(SEEDS), f"{other.name} runs seed(s) {sorted(used & set(SEEDS))}"


def header_plan_lines() -> list[tuple[str, str]]:
    """The header's quoted plan.py runs: (the --throughput file, the `lease plan:` line quoted for it)."""
    text = SPACE.read_text()
    lines = [l[2:].strip() for l in text.splitlines() if l.startswith("#")]
    quoted = [l for l in lines if l.startswith("lease plan:")]
    files = re.findall(r"--throughput (results/\S+\.json)", text)
    return list(zip(files, quoted))


def test_the_header_s_rung_figures_are_what_plan_py_prints():
    """The header quotes plan.py's line for rung 3 at the rung call's 430 s (cifar_pack.planned_calls, tested in
    tests/test_lease_cifar_pack.py), for both committed rates: the quoted figure is plan.py's, not typed."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "lease"))
    try:
        import plan
    finally:
        sys.path.pop(0)
    pairs = header_plan_lines()
    assert [f for f, _ in pairs] == ["results/gpu_h100/lease_2026-11-26/throughput_packed.json",
                                     "results/gpu_h100/lease_2026-11-27/throughput.json"]
    for throughput, quoted in pairs:
        argv = ["plan.py", "--space", "search_spaces/cifar10_rungs_gpu.yaml", "--exact", "--deadline-s", "430",
                "--throughput", throughput, "--only", "epochs=3"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", argv)
            mp.chdir(ROOT)
            assert plan.main() == 0
        printed = out.getvalue().splitlines()
        assert printed[0] == quoted and printed[0].startswith("lease plan: 8 of 8 fused group(s) of 3 fit")
