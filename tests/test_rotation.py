"""The rotation study's analysis (rpevit.analysis.rotation) on constructed rows with known answers.

Rows go through the real Parquet writer, as a sweep writes them. Numbers are chosen so the verdicts
are known by hand: at rotated test images, rotinv (exact) trained upright sits 30 points above every
other encoding (resolved), rotinv (random) within a point (not resolved); under FAVOR+ the judged
accuracy is the draw mean, whose ordering is the opposite of the own-draw one.
"""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rpevit import metrics
from rpevit.analysis import report, rotation
from rpevit.analysis.efficiency import BENCH_TIMING, CONTENDED, ONE_AT_A_TIME
from rpevit.analysis.stats import mean_interval, welch
from rpevit.config import TrialConfig
from rpevit.sweep.protocol import SUMMARY, Report
from rpevit.sweep.writer import ParquetResults
from rpevit.sweep.space import trial_key
from rpevit.tool_exit import exit_code

ENV = metrics.environment(torch.device("cpu"))
ROTATIONS = ("0", "90", "180", "270", "random")
SPREAD = (-0.005, 0.0, 0.005)  # the three seeds around each cell's mean
PES = {"ape": {}, "rope": {}, "cayley_string": {}, "rotinv exact": {"rotinv_mode": "exact"},
       "rotinv random": {"rotinv_mode": "random", "rotinv_draws": 16}}
START = 1.7e9


def write_sweep(out_dir: Path, name: str, rows: list[dict]) -> Path:
    keys = [trial_key(r) for r in rows]
    writer = ParquetResults(out_dir, name, dict(zip(keys, rows)), {k: i for i, k in enumerate(keys)})
    for i, (key, row) in enumerate(zip(keys, rows)):
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"), Report(SUMMARY, key, row).to_tune())
    writer.on_experiment_end([])
    return out_dir


def upright_means(pe: str) -> dict[str, float]:
    """softmax, trained upright: 98% upright for all; rotated: rotinv exact 70%, the others 40-41%."""
    turned = {"rotinv exact": 0.70, "rotinv random": 0.41, "ape": 0.40, "rope": 0.41, "cayley_string": 0.41}[pe]
    return {"0": 0.98, **{r: turned for r in ROTATIONS[1:]}}


def favor_means(pe: str) -> tuple[dict[str, float], dict[str, float]]:
    """favor, trained on rotated images: (draw mean, own draw). On the draw mean rotinv exact is 30 points
    below the others at every rotation; on its own draw it would be 10 points above."""
    mean = 0.50 if pe == "rotinv exact" else 0.80
    own = 0.95 if pe == "rotinv exact" else 0.85
    return dict.fromkeys(ROTATIONS, mean), dict.fromkeys(ROTATIONS, own)


def key_of(rotation: str) -> str:
    return "test_acc_rot_random" if rotation == "random" else f"test_acc_rot{rotation}"


def row(attention: str, pe: str, augment: str, seed: int, own: dict, mean: dict | None, start: float) -> dict:
    cfg = TrialConfig.from_dict({"dataset": "mnist", "attention": attention, "pe": pe.split()[0], **PES[pe],
                                 "augment": augment, "seed": seed, "eval_rotations": "standard",
                                 "redraw_interval": 100 if attention == "favor" else 0, "epochs": 2})
    out = {**cfg.to_dict(), **ENV, "train_s_per_epoch": 10.0 + seed, "n_train": 54000, "hostname": "h",
           "started_at": start, "finished_at": start + 50}
    for r in ROTATIONS:  # rotated test sets see the seeds in another order: drops vary from seed to seed
        d = SPREAD[seed] if r == "0" else SPREAD[(seed + 1) % 3]
        out[key_of(r)] = own[r] + d
        out[f"{key_of(r)}_draw_mean"] = math.nan if mean is None else mean[r] + d
    out["test_acc"] = out["test_acc_rot0"]
    out["test_acc_draw_mean"] = out["test_acc_rot0_draw_mean"]
    return out


def study_rows() -> list[dict]:
    rows, t = [], START
    for pe in PES:
        for seed in range(3):
            rows.append(row("softmax", pe, "none", seed, upright_means(pe), None, t))  # one after the other
            t += 100
    for pe in PES:
        mean, own = favor_means(pe)
        for seed in range(3):
            rows.append(row("favor", pe, "rotate", seed, own, mean, START + 10_000))  # all side by side
    return rows


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("results")
    write_sweep(out / "rotation_mnist_cpu", "rotation_mnist_cpu", study_rows())
    return out


@pytest.fixture(scope="module")
def long(results) -> pd.DataFrame:
    from rpevit.analysis.common import read_trials

    return rotation.long_table(rotation.rotation_rows(read_trials(results, ["train"]).frame))


def test_rotinv_labels_name_the_dense_path_only_where_it_ran():
    frame = pd.DataFrame({"pe": ["rotinv", "rotinv", "rotinv", "ape"], "rotinv_mode": ["exact", "exact", "random", "exact"],
                          "rotinv_draws": [16, 16, 4, 16], "rotinv_path": ["lowrank", "dense", "dense", "lowrank"]})
    assert list(rotation.rotation_pe_labels(frame)) == [
        "rotinv (exact)", "rotinv (exact, dense path)", "rotinv (random, 4 draws, dense path)", "ape"]
    older = frame.drop(columns="rotinv_path")  # rows written before the option: the low-rank path ran
    assert list(rotation.rotation_pe_labels(older))[:2] == ["rotinv (exact)", "rotinv (exact)"]


def test_long_table_has_one_row_per_variant_rotation_and_seed(long):
    assert len(long) == 2 * 5 * 5 * 3  # cells x encodings x rotations x seeds
    assert list(long["rotation"].cat.categories) == list(ROTATIONS)
    assert set(long["pe"]) == {"ape", "rope", "cayley_string", "rotinv (exact)", "rotinv (random, 16 draws)"}
    assert set(long["augment"]) == {"none", "rotate"}
    assert set(long.loc[long["attention"] == "favor", "redraw"]) == {"every 100 until 0.8"}
    exact = long[(long["pe"] == "rotinv (exact)") & (long["attention"] == "softmax") & (long["rotation"] == "random")]
    assert sorted(exact["acc"]) == pytest.approx([0.695, 0.70, 0.705])  # seeds 2, 0, 1


def test_a_random_feature_model_is_judged_on_its_draw_mean(long):
    favor = long[(long["attention"] == "favor") & (long["pe"] == "rotinv (exact)")]
    assert favor["acc"].mean() == pytest.approx(0.50) and favor["acc_own_draw"].mean() == pytest.approx(0.95)


def test_drops_are_per_seed_and_families_are_holm_over_invariant_against_other(long):
    cell = ("mnist", "softmax", "none", "off", "none")
    assert rotation.drops(long, (*cell, "rotinv (exact)")) == pytest.approx([0.275, 0.275, 0.29])  # seeds 0, 1, 2
    by_rotation, on_drop = rotation.families(long, cell)
    assert set(by_rotation) == set(ROTATIONS)
    family = by_rotation["random"]
    assert len(family) == 2 * 3 and all(j.k == 6 for j in family.values())
    exact_ape = family[("rotinv (exact)", "ape")]
    assert exact_ape.resolved and exact_ape.interval.point == pytest.approx(0.30)
    # the nominal interval is Welch's, by hand: equal spreads, so se = sqrt(2 s^2 / 3), df = 4
    a = np.array([0.70, 0.705, 0.695])
    assert exact_ape.nominal.lo == pytest.approx(welch(a, a - 0.30).lo)
    assert exact_ape.interval.level == pytest.approx(1 - 0.05 / 6)
    assert not family[("rotinv (random, 16 draws)", "ape")].resolved  # 1 point, t = 2.4 with 4 df
    assert not any(j.resolved for j in by_rotation["0"].values())  # every encoding 98% upright
    assert on_drop[("rotinv (exact)", "ape")].resolved and on_drop[("rotinv (exact)", "ape")].interval.point < 0
    assert not on_drop[("rotinv (random, 16 draws)", "ape")].resolved  # 1 point less drop: t = 1.4


def test_verdicts_claim_only_what_holm_resolves(results):
    text = rotation.build(results)
    upright = next(line for line in text.splitlines() if line.startswith("**mnist, softmax"))
    assert "trained upright" in upright and "Rotation invariance helps" in upright
    exact_ape = welch([0.695, 0.70, 0.705], [0.395, 0.40, 0.405], level=1 - 0.05 / 6)  # its Holm level: k = 6
    assert (f"rotinv (exact) vs ape at test rotations 90, 180, 270, random (at random: "
            f"{exact_ape.text(scale=100)} points, k=6)") in upright
    assert "rotinv (random, 16 draws) vs" not in upright  # within a point of the others: never claimed
    assert "The other 18 of 30 accuracy comparisons (pair x test rotation) are not resolved with 3 seeds" in upright
    assert "drop under exact quarter turns (upright minus the mean at 90/180/270 degrees; negative: higher when turned) is lower" in upright
    assert "rotinv (random, 16 draws) − ape" not in upright and " is higher (difference of drops" not in upright
    # constructed: upright 98 % for all, at random angles 70 % (rotinv exact) and 40 % (ape): drops 28 and 58 points
    assert "rotinv (exact) − ape: -30" in upright and "(mean drops 28 and 58)" in upright
    assert "costs accuracy" not in upright
    favor = next(line for line in text.splitlines() if line.startswith("**mnist, favor"))
    assert "trained on rotated images" in favor and "It costs accuracy (resolved below)" in favor
    assert "rotinv (exact) vs ape at test rotations 0, 90, 180, 270, random (at random: -30" in favor
    assert "helps" not in favor and "No difference in the drop" in favor
    # the table: mean [95% t] (n) per rotation, then the drop and the cost with its timing
    up, turned = mean_interval([0.975, 0.98, 0.985]), mean_interval([0.70, 0.705, 0.695])
    assert (f"| rotinv (exact) | {up.text(scale=100, digits=4)} | {turned.text(scale=100, digits=4)} |" in text)
    assert "| 11 (one trial at a time) |" in text and "| 11 (contended) |" in text
    assert (results / rotation.CSV_FILE).exists()
    assert len(pd.read_csv(results / rotation.CSV_FILE)) == 150


def test_cost_is_labelled_by_how_it_was_measured(results):
    from rpevit.analysis.common import read_trials

    frame = read_trials(results, ["train"]).frame
    costs = rotation.cost_table(rotation.rotation_rows(frame), frame.iloc[0:0]).set_index(["attention", "pe"])
    assert costs.loc[("softmax", "ape"), "timing"] == ONE_AT_A_TIME
    assert costs.loc[("softmax", "ape"), "train_s_per_epoch"] == pytest.approx(11.0)
    assert costs.loc[("favor", "rope"), "timing"] == CONTENDED
    bench = pd.DataFrame([{**TrialConfig.from_dict({"task": "bench", "dataset": "mnist", "pe": "rope",
                                                    "image_size": 28, "patch_size": 7}).to_dict(),
                           "train_step_ms": 64.0, "bench_batch": 32}])
    with_bench = rotation.cost_table(rotation.rotation_rows(frame), bench).set_index(["attention", "pe"])
    assert with_bench.loc[("softmax", "rope"), "timing"] == BENCH_TIMING
    assert with_bench.loc[("softmax", "rope"), "train_s_per_epoch"] == pytest.approx(2.0 * 54000 / 1e3)
    assert with_bench.loc[("softmax", "ape"), "timing"] == ONE_AT_A_TIME


def test_rows_without_rotations_give_no_section_and_the_report_includes_it(results, tmp_path):
    plain = {**TrialConfig.from_dict({"dataset": "mnist", "epochs": 2}).to_dict(), **ENV, "test_acc": 0.9}
    write_sweep(tmp_path / "plain", "plain", [plain])
    assert rotation.build(tmp_path / "plain") is None
    assert "## Rotations: what a rotation-invariant RPE buys" in report.build_report(results)


def bench_row(attention: str, pe: str, redraw_interval: int, step_ms: float) -> dict:
    cfg = TrialConfig.from_dict({"task": "bench", "dataset": "mnist", "attention": attention, "pe": pe.split()[0],
                                 **PES[pe], "redraw_interval": redraw_interval, "bench_batch": 64})
    return {**cfg.to_dict(), **ENV, "train_step_ms": step_ms}


def test_bench_rows_from_another_folder_replace_contended_times_and_must_match_the_redraw(results, tmp_path):
    """A bench sweep of the same models, alone, in its own folder (--bench): its time is quoted where the
    model and, for a random-feature backend, the redraw interval match; a FAVOR+ bench row timed with
    another redraw schedule does not stand in for the study's."""
    bench = write_sweep(tmp_path / "bench_rotation", "bench_rotation",
                        [bench_row("softmax", "rotinv exact", 0, 128.0), bench_row("favor", "ape", 100, 64.0),
                         bench_row("favor", "rope", 0, 32.0)])
    text = rotation.build(results, [bench])
    table = text.split("### mnist, favor")[1].split("\n\n")[1]
    ape = next(line for line in table.splitlines() if line.startswith("| ape |"))
    rope = next(line for line in table.splitlines() if line.startswith("| rope |"))
    assert ape.endswith(f"| {64.0 / 64 * 54000 / 1e3:g} (bench, alone) |")  # redraw 100 = the study's
    assert rope.endswith("| 11 (contended) |")  # timed with redraw 0: not the study's model cost
    softmax = text.split("### mnist, softmax")[1]
    assert f"| {128.0 / 64 * 54000 / 1e3:g} (bench, alone) |" in softmax
    assert f"Bench rows read from: `{bench.as_posix()}`." in text
    assert rotation.build(results) is not None and "Bench rows read from" not in rotation.build(results)


def test_the_script_takes_bench_folders_and_names_an_empty_one(results, tmp_path, monkeypatch, capsys):
    bench = write_sweep(tmp_path / "bench_rotation", "bench_rotation", [bench_row("favor", "ape", 100, 64.0)])
    monkeypatch.setattr("sys.argv", ["rotation.py", str(results), "--bench", str(bench)])
    rotation.main()
    assert "(bench, alone)" in (results / "rotation.md").read_text()
    monkeypatch.setattr("sys.argv", ["rotation.py", str(results), "--bench", str(tmp_path / "nothing")])
    with pytest.raises(SystemExit) as stopped:
        rotation.main()
    assert f"--bench has value {str(tmp_path / 'nothing')!r}, which does not exist; allowed:" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr("sys.argv", ["rotation.py", str(results), "--bench", str(tmp_path / "empty")])
    with pytest.raises(SystemExit) as stopped:
        rotation.main()
    assert f"--bench {tmp_path / 'empty'} holds no trials.parquet" in capsys.readouterr().err
    # argparse's usage error (parser.error): exit code 2, which run_tool passes on as the process's
    assert stopped.value.code == 2 and exit_code(stopped.value) == 2


def test_other_sections_leave_the_rotation_studys_rows_to_it(results, tmp_path):
    """Rotation-study rows change the training augmentation: the gap-closure and efficiency sections
    set them aside (and say how many), so an MNIST cell of another study is not averaged with them."""
    from rpevit.analysis import efficiency, gap_closure, string_study
    from tests.analysis_rows import config_row

    plain = [{**config_row(attention=a, pe="ape", seed=s, dataset="mnist"), "test_acc": acc + 0.001 * s,
              "train_s_per_epoch": 5.0} for a, acc in (("softmax", 0.98), ("favor", 0.95)) for s in range(3)]
    alone, mixed = tmp_path / "alone", tmp_path / "mixed"
    write_sweep(alone / "converged", "converged", plain)
    write_sweep(mixed / "converged", "converged", plain)
    write_sweep(mixed / "rotation_mnist_cpu", "rotation_mnist_cpu", study_rows())
    note = "_30 rows of the rotation study (test-time rotations) left to its own section: its training augmentation differs_"
    for build in (gap_closure.build, efficiency.build):
        with_rotation, without = build(mixed), build(alone)
        assert note in with_rotation and note not in without
        body = [line for line in with_rotation.splitlines() if not line.startswith("_")]  # the notes differ
        assert body == [line for line in without.splitlines() if not line.startswith("_")]
    assert gap_closure.build(results) is None  # the rotation study alone: nothing for the gap tables
    assert string_study.build(mixed) is None  # its rope / cayley_string rows are not a STRING study
    assert "## Rotations" in report.build_report(mixed)


def test_the_drop_uses_exact_quarter_turns_not_interpolated_angles():
    """Issue 41: a rotation-trained model scores higher on bilinearly resampled images than on the exact
    upright one; the drop must compare exact turns on both sides, so the random angle stays out of it."""
    acc = {"0": 0.90, "90": 0.89, "180": 0.88, "270": 0.87, "random": 0.93}  # higher at random: interpolation
    long = pd.DataFrame([{"dataset": "mnist", "attention": "softmax", "qk_norm": "none", "redraw": "off",
                          "augment": "rotate", "pe": "ape", "rotation": r, "seed": s, "acc": a + 0.01 * s}
                         for r, a in acc.items() for s in range(3)])
    key = ("mnist", "softmax", "none", "off", "rotate", "ape")
    assert rotation.drops(long, key) == pytest.approx([0.02, 0.02, 0.02])  # 0.90 - mean(0.89, 0.88, 0.87)
    assert rotation.drops(long, key, ("random",)) == pytest.approx([-0.03] * 3)  # what the earlier drop measured
    partial_turns = long[long["rotation"] != "270"]
    assert len(rotation.drops(partial_turns, key)) == 0  # a seed without every quarter turn has no drop


def test_each_cells_table_names_the_device_its_times_ran_on(results):
    """The train s / epoch of a cell's table are its train rows' (their device), or a bench row's (the bench
    row's device): the heading names the devices of exactly those rows (efficiency.time_devices)."""
    from rpevit.analysis.common import read_trials
    from rpevit.analysis.efficiency import time_devices

    frame = read_trials(results, ["train"]).frame
    frame["device_name"] = "Train CPU A"
    bench = pd.DataFrame([{**TrialConfig.from_dict({"task": "bench", "dataset": "mnist", "pe": "rope",
                                                    "image_size": 28, "patch_size": 7}).to_dict(),
                           "train_step_ms": 64.0, "bench_batch": 32, "device_name": "Bench GPU B"}])
    costs = rotation.cost_table(rotation.rotation_rows(frame), bench)
    rope = costs[(costs["pe"] == "rope") & (costs["attention"] == "softmax")]
    assert time_devices(rope) == "device: Bench GPU B"
    assert time_devices(costs[costs["pe"] == "ape"]).startswith("device: Train CPU A")
    assert "2 devices: Bench GPU B" in time_devices(costs[costs["attention"] == "softmax"])
    text = rotation.build(results)
    assert text.count("mean [95% t] (n); train s / epoch on device") == len(rotation.cells(rotation.long_table(
        rotation.rotation_rows(frame))))
