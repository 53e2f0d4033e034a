"""What a new user meets in a dry run and in small details (issue 59, items 4 and 7).

- The dry run says what the run would refuse (a trial asking for more CPUs than the machine has, which the
  run refused only after Ray had started), and its advice for a GPU space on a CPU includes --cpus-per-trial:
  following the advice gives a run that starts. A real run refuses the CPUs before Ray starts.
- With no rows of its own the dry run gives an order of magnitude from the committed bench studies of this
  device class, labelled as such (it said "none available").
- A typo in a key names the field it is close to ("did you mean 'epochs'?") instead of only listing all ~70.
- The dry-run table shows '-' for an encoding option a trial does not use (luo_scale 0.0 for ape rows).
- TensorBoard runs are named by variant and key, not by key alone; an older key-named folder is renamed.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import yaml

from rpevit.config import ConfigError, TrialConfig
from rpevit.sweep import dry_run
from rpevit.sweep.space import Resources, SpaceError, expand_space

ROOT = Path(__file__).resolve().parents[1]
GPU_SPACE = {"name": "gpuish", "task": "train", "fixed": {"dataset": "digits", "epochs": 2, "compile": "on"},
             "grid": {"attention": ["softmax", "favor"], "pe": ["ape", "luo_rpe"]}, "seeds": [0],
             "resources": {"cpus_per_trial": 4, "gpus_per_trial": 0.25}}


@pytest.fixture
def two_cpu_machine(monkeypatch):
    """This machine as the issue's: 2 CPUs, no GPU, whatever runs the test."""
    import torch

    monkeypatch.setattr(dry_run, "local_cpus", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def dry_run_lines(tmp_path: Path, capsys, *flags: str) -> list[str]:
    import sweep

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(GPU_SPACE))
    assert sweep.main(["--space", str(space), "--results-dir", str(tmp_path / "results"), "--dry-run", *flags]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_dry_run_says_what_the_run_would_refuse_and_the_advice_is_whole(tmp_path, capsys, two_cpu_machine):
    lines = dry_run_lines(tmp_path, capsys)
    refusal = [line for line in lines if "the run would refuse" in line]
    assert refusal == ["warning: the run would refuse this before any trial starts: cpus_per_trial has value 4 but "
                       "this machine has 2; allowed: <= 2 (--cpus-per-trial 2, or join a bigger cluster with "
                       "--address)"]
    advice = next(line for line in lines if "made for GPUs" in line).split("On the CPU: ")[1]
    assert advice == "--gpus-per-trial 0 --set compile=off --cpus-per-trial 2"
    followed = dry_run_lines(tmp_path, capsys, *advice.split())  # the advice, as given
    assert not [line for line in followed if "would refuse" in line or "made for GPUs" in line]


def test_a_real_run_refuses_the_cpus_before_ray_starts(tmp_path, two_cpu_machine):
    import sweep

    (tmp_path / "space.yaml").write_text(yaml.safe_dump(GPU_SPACE))
    args = sweep.build_parser().parse_args(["--space", str(tmp_path / "space.yaml"), "--gpus-per-trial", "0",
                                            "--results-dir", str(tmp_path / "results")])
    space = expand_space(GPU_SPACE, source="space.yaml")
    with pytest.raises(ConfigError, match=r"^cpus_per_trial has value 4 but this machine has 2; allowed: <= 2 "):
        sweep.check_options(args, space)
    args.cpus_per_trial = 2
    sweep.check_options(args, space)


def test_without_rows_the_estimate_is_an_order_of_magnitude_from_the_committed_bench_studies(tmp_path, capsys,
                                                                                               two_cpu_machine):
    lines = dry_run_lines(tmp_path, capsys, "--gpus-per-trial", "0", "--cpus-per-trial", "1")
    estimate = next(line for line in lines if line.startswith("estimate"))
    assert "none available" not in estimate
    assert estimate.startswith("estimate: none measured (no finished trial of task 'train' in")
    assert "order of magnitude only, from the committed bench rows of results/bench_" in estimate
    assert "results/bench_mnist_cpu" in estimate  # digits runs the MNIST model's variants: their rows
    assert "cpu:x86_64" in estimate and "for 4 of 4 trial(s), 2 at a time on this machine" in estimate


def test_the_bench_estimate_is_within_a_few_times_of_what_committed_studies_measured():
    """bench_seconds against the measured train_s_per_epoch of committed CPU train studies (a sample of
    each): an order of magnitude, as the line says."""
    from rpevit.sweep.store import read_rows

    bench = dry_run.committed_bench_rows("cpu")
    names = {f.name for f in __import__("dataclasses").fields(TrialConfig)}
    ratios = []
    for study in ("mnist_converged_cpu", "cifar10_cpu", "string_mnist_cpu", "luo_scale_val_digits"):
        for row in read_rows(ROOT / "results" / study / "trials.parquet")[::15]:
            if row.get("status") != "ok" or not row.get("train_s_per_epoch"):
                continue
            trial = {**{n: row[n] for n in names if row.get(n) is not None}, "epochs": 1}
            found = dry_run.bench_seconds(trial, bench)
            if found is not None:
                ratios.append(row["train_s_per_epoch"] / found[0])
    assert len(ratios) >= 20
    assert all(1 / 3 < r < 3.5 for r in ratios), sorted(ratios)
    assert 0.7 < sorted(ratios)[len(ratios) // 2] < 1.5


def test_a_typo_in_a_key_names_the_field_it_is_close_to(tmp_path, capsys):
    import sweep

    with pytest.raises(SpaceError) as err:
        expand_space({"name": "x", "fixed": {"dataset": "digits", "epoch": 2}}, source="space.yaml")
    message = str(err.value)
    assert "fixed key 'epoch' is not a TrialConfig field; did you mean 'epochs'? allowed: a TrialConfig field" in message
    assert "python sweep.py --fields" in message and "kmse_draws" not in message  # not the ~70 names
    with pytest.raises(SpaceError, match="key 'zzzz' is not a TrialConfig field; allowed: task, dataset"):
        expand_space({"name": "x", "fixed": {"zzzz": 2}}, source="space.yaml")  # nothing close: the list
    with pytest.raises(SpaceError, match="unknown key 'gird'; did you mean 'grid'?"):
        expand_space({"name": "x", "gird": {"attention": ["softmax"]}}, source="space.yaml")
    with pytest.raises(SpaceError, match="unknown key resources.cpu_per_trial; did you mean 'cpus_per_trial'?"):
        Resources.from_dict({"cpu_per_trial": 1}, "space.yaml")
    with pytest.raises(ConfigError, match="unknown field\\(s\\) \\['lr_shedule'\\]; did you mean 'lr_schedule'?"):
        TrialConfig.from_dict({"lr_shedule": "wsd"})
    assert sweep.main(["--space", str(ROOT / "search_spaces" / "smoke.yaml"), "--dry-run", "--set", "epoch=2"]) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "--set key 'epoch' is not a TrialConfig field; did you mean 'epochs'?" in line


def test_the_dry_run_table_shows_no_value_for_an_option_a_trial_does_not_use():
    space = expand_space({"name": "x", "fixed": {"dataset": "digits", "epochs": 1},
                          "grid": {"pe": ["ape", "luo_rpe"]}}, source="space.yaml")
    header, ape, luo = (line.split() for line in space.table().splitlines())
    column = header.index("luo_scale")
    assert ape[column] == "-" and math.isfinite(float(luo[column]))  # luo_rpe's own scale; ape never reads one


def test_tensorboard_runs_are_named_by_variant_and_key(tmp_path):
    from rpevit.sweep.results import TENSORBOARD_DIR
    from rpevit.sweep.tensorboard_events import EVENTS_PREFIX, EpochBoard, run_name, tensorboard_dir

    key = "0123456789abcdef"
    cfg = {"dataset": "mnist", "attention": "favor", "pe": "ape+rope", "seed": 2}
    assert run_name(key, cfg) == f"mnist-favor-ape+rope-seed2-{key}"
    assert run_name(key, {**cfg, "pe": "../x y"}) == f"mnist-favor-x_y-seed2-{key}"  # one folder name, always
    root = tmp_path / "sweep" / "trials"
    folder = tensorboard_dir(root, key, cfg)
    assert folder == tmp_path / "sweep" / TENSORBOARD_DIR / f"mnist-favor-ape+rope-seed2-{key}"
    with pytest.raises(ConfigError):
        tensorboard_dir(root, "../x", cfg)  # the key is still checked before it names a folder
    older = tmp_path / "sweep" / TENSORBOARD_DIR / key  # a run named by its key alone, before
    older.mkdir(parents=True)
    (older / f"{EVENTS_PREFIX}1.old").write_bytes(b"stale")
    board = EpochBoard(folder, key, "attention=favor")
    board.add({"epoch": 1, "val_acc": 0.5})
    board.close()
    assert not older.exists() and folder.is_dir()  # renamed: the run appears once, under its new name
    assert [p.name for p in folder.iterdir() if p.name.endswith(".old")] == []  # its stale events replaced
