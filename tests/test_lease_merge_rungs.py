"""Every lease's rows of the declared rung study read as one study (benchmarks/lease/merge_rungs.py; issue 60,
item 4).

One GPU lease runs one rung (or half of one) of search_spaces/cifar10_rungs_gpu.yaml; the confirmatory table and
the budget ladder read one folder. Built here from rows written by the real Parquet writer, with the real
space's trial keys and declaration: two leases (rungs 3 and 10, on an H100 and an H200) merge into a folder both
analyses read with every rung; a trial run twice keeps one row (the ok one, else the first) and names the other;
a lease under another declaration or of another space is refused in one line and nothing is written.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpevit.analysis import confirmatory
from rpevit.analysis.budget_ladder import ladder_rows, per_budget
from rpevit.analysis.common import read_trials
from rpevit.sweep import declaration
from rpevit.sweep.plan import write_space_file
from rpevit.sweep.protocol import EPOCH, SUMMARY, Report
from rpevit.sweep.space import load_space
from rpevit.sweep.store import read_frame
from rpevit.sweep.writer import ParquetResults
from tests.analysis_rows import config_row

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "lease"))
import merge_rungs  # noqa: E402

NAME = "cifar10_rungs_gpu"
SPACE_FILE = str(ROOT / "search_spaces" / "cifar10_rungs_gpu.yaml")
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
GAP = {"ape": 0.06, "luo_rpe": 0.01, "rope": 0.05, "circulant_string": 0.04}  # softmax - favor at 3 epochs, judged


@pytest.fixture(scope="module")
def space():
    return load_space(SPACE_FILE, {})


def accuracy(trial: dict) -> tuple[float, float]:
    """(test_acc, judged draw mean): softmax 0.55 + 0.02 per epoch + 0.01 per seed; favor the encoding's gap
    below, half of it at 10 epochs; favor's training draw 0.01 above its fresh draws."""
    softmax = 0.55 + 0.02 * trial["epochs"] + 0.01 * (trial["seed"] - 10)
    if trial["attention"] == "softmax":
        return softmax, softmax
    judged = softmax - GAP[trial["pe"]] / (1 + (trial["epochs"] == 10)) - 0.002 * (trial["seed"] - 10)
    return judged + 0.01, judged


def lease(tmp_path: Path, name: str, space, device: str, epochs: int, attention: str | None = None,
          seed_from: Path | None = None, failed: tuple = (), started: float | None = None,
          decl=None, space_json=None) -> Path:
    """A lease's folder as gpu_lease.sh rung brings it back: declaration.json (recorded now, or seeded from
    `seed_from`), space.json (the whole space's keys, as sweep.py --only writes them), and the rows of the rung's
    trials (`attention`: a half rung) with an epoch row each; `failed`: (attention, pe, seed) whose trial failed."""
    folder = tmp_path / name / NAME
    folder.mkdir(parents=True)
    if seed_from is not None:
        shutil.copy(seed_from / "declaration.json", folder / "declaration.json")
    else:
        declaration.record(folder, decl or space.declaration, rows_exist=False, redeclare=False)
    only = {"epochs": epochs, **({"attention": attention} if attention else {})}
    part = load_space(SPACE_FILE, {}, only=only)
    write_space_file(folder, space_json or part)
    at = started or time.time() + 10
    configs, good, bad = {}, [], []
    for key, trial in zip(part.keys, part.trials):
        test_acc, judged = accuracy(trial)
        configs[key] = {**config_row(**trial), "test_acc": test_acc, "test_acc_draw_mean": judged if trial["attention"]
                        == "favor" else None, "started_at": at, "finished_at": at + 60, "device_name": device,
                        "n_train": 45_000}
        (bad if (trial["attention"], trial["pe"], trial["seed"]) in failed else good).append(key)
    writer = ParquetResults(folder, NAME, configs, {k: i for i, k in enumerate(configs)})
    for i, key in enumerate(good):
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               Report(EPOCH, key, {"epoch": 1, "train_loss": 1.0, "val_acc": 0.5}).to_tune())
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"), Report(SUMMARY, key, configs[key]).to_tune())
    for i, key in enumerate(bad):
        writer.record_failure(key, "RuntimeError: cut", "RuntimeError: cut", f"f{i}", 1)
    writer.on_experiment_end([])
    return folder


def test_two_leases_read_as_one_study_by_both_analyses(tmp_path, space):
    first = lease(tmp_path / "gpu_h100", "lease_2026-12-01", space, H100, 3)
    second = lease(tmp_path / "gpu_h200", "lease_2026-12-02", space, H200, 10, seed_from=first)
    into = tmp_path / "merged" / NAME
    assert merge_rungs.main([str(first), str(second), "--into", str(into)]) == 0
    assert (into / "declaration.json").read_bytes() == (first / "declaration.json").read_bytes()
    trials = read_frame(into)
    assert len(trials) == 48 and trials["trial_key"].is_unique
    assert set(json.loads((into / "space.json").read_text())["trial_keys"]) == set(space.keys)
    assert sorted(set(zip(trials["epochs"], trials["device_name"]))) == [(3, H100), (10, H200)]
    assert len(read_frame(into, "epochs.parquet")) == 48
    report = json.loads((into / merge_rungs.SOURCES_FILE).read_text())
    assert [s["devices"] for s in report["sources"]] == [[H100], [H200]] and report["set_aside"] == []

    _, _, families, _ = confirmatory.judge(into)
    titles = [name for name, _ in families]
    assert any("epochs = 3" in t for t in titles) and any("epochs = 10" in t for t in titles)
    outcomes = {name: items for name, items in families}
    for name, items in outcomes.items():
        assert all(o.complete for o in items), name  # every rung of every declared family has its 3 seeds
    trend = next(items for name, items in outcomes.items() if name.startswith("does the softmax / FAVOR+ gap change")
                 and "judged" in name)
    ape = trend[0]  # gap(ape) 6 points at 3 epochs, 3 at 10 (plus 0.2 a seed): per seed -3
    assert ape.kind == "trend" and ape.nominal.point == pytest.approx(-3.0)
    ladder = per_budget(ladder_rows(read_trials(into, ["train"]).frame))
    assert sorted(set(ladder["epochs"])) == [3, 10] and set(ladder["n"]) == {3}

    assert merge_rungs.main([str(first), str(second), "--into", str(into)]) == 0  # again: the same rows
    assert len(read_frame(into)) == 48 and json.loads((into / merge_rungs.SOURCES_FILE).read_text())["set_aside"] == []


def test_a_trial_run_by_two_leases_keeps_one_row_and_names_the_other(tmp_path, space, capsys):
    """Lease A's rung 3 with softmax+rope seed 10 failed; lease B ran the softmax half of rung 3 again later:
    the failed key takes B's ok row, every other softmax key keeps A's (the first), and B's are named."""
    a = lease(tmp_path / "gpu_h100", "lease_2026-12-01", space, H100, 3, failed={("softmax", "rope", 10)})
    b = lease(tmp_path / "gpu_h200", "lease_2026-12-03", space, H200, 3, attention="softmax", seed_from=a,
              started=time.time() + 3600)
    into = tmp_path / "merged" / NAME
    assert merge_rungs.main([str(a), str(b), "--into", str(into)]) == 0
    trials = read_frame(into)
    assert len(trials) == 24 and trials["trial_key"].is_unique and set(trials["status"]) == {"ok"}
    rope10 = trials[(trials["pe"] == "rope") & (trials["attention"] == "softmax") & (trials["seed"] == 10)]
    assert list(rope10["device_name"]) == [H200]
    assert (trials[trials["attention"] == "softmax"]["device_name"] == H100).sum() == 11
    out = capsys.readouterr().out
    assert out.count("  set aside: ") == 12  # B's 11 repeats and A's failed row
    assert f"the row of {a} (not ok" in out


def test_a_lease_under_another_declaration_is_refused_and_nothing_written(tmp_path, space, capsys):
    a = lease(tmp_path / "gpu_h100", "lease_2026-12-01", space, H100, 3)
    into = tmp_path / "merged" / NAME
    assert merge_rungs.main([str(a), "--into", str(into)]) == 0
    before = {p.name: p.read_bytes() for p in into.iterdir()}
    other = declaration.parse({**space.declaration.to_dict(), "alpha": 0.1}, "x")
    foreign = lease(tmp_path / "gpu_h200", "lease_2026-12-04", space, H200, 10, decl=other)
    assert merge_rungs.main([str(a), str(foreign), "--into", str(into)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "declarations[0].sha256" in err and "another declaration" in err
    assert {p.name: p.read_bytes() for p in into.iterdir()} == before


def test_a_lease_of_another_space_is_refused_in_one_line(tmp_path, space, capsys):
    a = lease(tmp_path / "gpu_h100", "lease_2026-12-01", space, H100, 3)
    changed = load_space(SPACE_FILE, {"eval_draws": 4}, only={"epochs": 10})  # a --set: other trial keys
    b = lease(tmp_path / "gpu_h200", "lease_2026-12-02", space, H200, 10, seed_from=a, space_json=changed)
    assert merge_rungs.main([str(a), str(b), "--into", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "rows of another space" in err and not (tmp_path / "m").exists()


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", ""])
def test_a_name_that_is_not_one_folder_name_is_refused_in_one_line(tmp_path, capsys, name):
    """--name becomes results/NAME (the merged folder) and a glob: '../../x' would write outside results/."""
    assert merge_rungs.main(["--name", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--name has value {name!r}; allowed: " in err, err
    assert not (ROOT / "results" / name / "merged_from.json").exists()
