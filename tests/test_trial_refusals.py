"""rpevit/config.py, rpevit/cli.py, rpevit/data.py, rpevit/sweep/dry_run.py: bad trial input that used to run as
something else (or not at all) while the row recorded what was asked, now refused in one line naming the field, the
value and what is allowed: an MLP ratio below one hidden unit, abbreviated CLI flags, checkpoint flags that did
nothing, a train_subset larger than the training split (caught by the dry run too), a field of another task, and sizes
with no upper bound."""
from __future__ import annotations

import time

import pytest

from rpevit.cli import build_parser
from rpevit.cli import main as cli_main
from rpevit.config import ConfigError, TrialConfig
from rpevit.data import DataError, load_splits

TINY_ARGV = ["--dim", "16", "--depth", "1", "--heads", "2", "--epochs", "1", "--train-subset", "50"]


def refused_in_one_line(capsys, argv: list[str], words: list[str]) -> None:
    t0 = time.time()
    assert cli_main(argv) == 2, argv
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    assert "epoch 1/" not in err and time.time() - t0 < 30, (argv, err)
    for word in words:
        assert word in err, (argv, word, err)


# ---- item 1: int(dim * mlp_ratio) = 0 ran as mlp_ratio 1.0 (timm's Mlp reads hidden width 0 as in_features)
def test_an_mlp_ratio_below_one_hidden_unit_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        TrialConfig.from_dict({"mlp_ratio": 0.0001}, source="test")
    message = str(err.value)
    for word in ("field 'mlp_ratio' has value 0.0001", "dim=64", "1/dim = 0.015625", "allowed"):
        assert word in message, (word, message)
    with pytest.raises(ConfigError, match="'mlp_ratio'"):
        TrialConfig.from_dict({"dim": 16, "heads": 2, "mlp_ratio": 0.06}, source="test")  # int(0.96) = 0


def test_the_smallest_allowed_mlp_ratio_builds_one_hidden_unit() -> None:
    from rpevit.models.factory import build_model

    cfg = TrialConfig.from_dict({"dim": 16, "heads": 2, "depth": 1, "mlp_ratio": 1 / 16})
    model = build_model(cfg, in_chans=1, num_classes=10)
    fc1 = [m for name, m in model.named_modules() if name.endswith("mlp.fc1")]
    assert fc1 and all(m.out_features == 1 for m in fc1)


# ---- item 2: `--epoch 1` was read as `--epochs 1` (argparse's abbreviations)
def test_the_cli_refuses_abbreviated_flags(capsys) -> None:
    for argv in (["--epoch", "1"], ["--train-sub", "10"], ["--checkpoint", "x"]):
        with pytest.raises(SystemExit) as exit_:
            cli_main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "unrecognized arguments" in err and argv[0] in err, err
    args = build_parser().parse_args(["--epochs", "3", "--train-subset", "10"])  # whole names still work
    assert args.epochs == 3 and args.train_subset == 10


# ---- item 3: checkpoint flags that did nothing
def test_extend_epochs_without_a_checkpoint_dir_and_an_empty_checkpoint_dir_are_refused(capsys) -> None:
    refused_in_one_line(capsys, TINY_ARGV + ["--extend-epochs"],
                        ["--extend-epochs", "without --checkpoint-dir", "allowed: only with --checkpoint-dir"])
    refused_in_one_line(capsys, TINY_ARGV + ["--checkpoint-dir="], ["--checkpoint-dir", "''", "allowed: a folder"])
    refused_in_one_line(capsys, TINY_ARGV + ["--checkpoint-dir", "", "--extend-epochs"],
                        ["--checkpoint-dir", "''", "allowed: a folder"])


# ---- item 4: a train_subset above the training split trained on the whole split
def test_a_train_subset_larger_than_the_training_split_is_refused(capsys) -> None:
    refused_in_one_line(capsys, ["--dim", "16", "--depth", "1", "--heads", "2", "--epochs", "1",
                                 "--train-subset", "100000000"],
                        ["field 'train_subset' has value 100000000", "'digits'", "holds 1293 images",
                         "allowed: 1..1293, or 0 for all"])
    with pytest.raises(DataError, match=r"allowed: 1\.\.1293, or 0 for all"):
        load_splits("digits", val_fraction=0.1, train_subset=1294)
    assert len(load_splits("digits", val_fraction=0.1, train_subset=1293).x_train) == 1293  # the whole split
    assert len(load_splits("digits", val_fraction=0.1, train_subset=0).x_train) == 1293  # 0: all


# ---- sizes without an upper bound passed every check (lr has none: a huge lr is a trial that diverges and
# fails in one line, which tests/test_train.py and tests/test_sweep_cli.py rely on)
@pytest.mark.parametrize("changes, words", [
    ({"depth": 1_000_000_000}, ["'depth'", "1000000000", "an integer in 1..1024"]),
    ({"heads": 100_000}, ["'heads'", "100000", "an integer in 1..8192"]),
    ({"num_features": 100_000_000, "attention": "favor"}, ["'num_features'", "100000000", "an integer in 1..65536"]),
    ({"task": "bench", "bench_iters": 1_000_000_000}, ["'bench_iters'", "1000000000", "an integer in 1..100000"]),
    ({"task": "bench", "bench_warmup": 1_000_000_000}, ["'bench_warmup'", "an integer in 0..100000"]),
    ({"task": "kernel_mse", "kmse_draws": 1e12}, ["'kmse_draws'", "1000000000000", "an integer in 1..10000000"]),
    ({"task": "kernel_mse", "kmse_features": 10**9}, ["'kmse_features'", "an integer in 1..65536"]),
    ({"eval_batch_size": 10**9}, ["'eval_batch_size'", "an integer in 1..65536"]),
    ({"eval_draws": 10**9}, ["'eval_draws'", "an integer in 0..1000"]),
    ({"batch_size": 10**9}, ["'batch_size'", "an integer in 1..65536", "or 0 for the dataset's default"]),
    ({"image_size": 10**6, "task": "bench"}, ["'image_size'", "an integer in 1..4096"]),
    ({"pe": "rotinv", "rotinv_mode": "random", "rotinv_draws": 10**9}, ["'rotinv_draws'", "an integer in 1..4096"]),
    ({"pe": "reflection_string", "reflection_count": 10**9}, ["'reflection_count'", "an integer in 1..4096"]),
    ({"mlp_ratio": 1e6}, ["'mlp_ratio'", "1000000.0", "a number in (0, 64]"]),
])
def test_sizes_have_an_upper_bound(changes: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        TrialConfig.from_dict(changes, source="test")
    message = str(err.value)
    assert message.count("\n") == 0 and "has value" in message
    for word in words:
        assert word in message, (word, message)


def test_the_upper_bounds_themselves_are_allowed() -> None:
    TrialConfig.from_dict({"depth": 1024, "eval_batch_size": 65536, "eval_draws": 1000, "batch_size": 65536,
                           "mlp_ratio": 64.0, "attention": "favor", "num_features": 65536})
    TrialConfig.from_dict({"dim": 8192, "heads": 8192})
    TrialConfig.from_dict({"task": "bench", "bench_iters": 100_000, "bench_warmup": 100_000})
    TrialConfig.from_dict({"task": "kernel_mse", "kmse_draws": 10_000_000, "kmse_features": 65536})


def test_the_cli_refuses_an_unbounded_size_before_training(capsys) -> None:
    refused_in_one_line(capsys, ["--task", "bench", "--bench-iters", "1000000000"],
                        ["field 'bench_iters' has value 1000000000; allowed: an integer in 1..100000"])


# ---- a field of another task's section (bench_*, kmse_*) was accepted and changed nothing but the trial's key
# (`--set bench_iters=5` on a train space made every trial a new key, trained again by `--resume`)
@pytest.mark.parametrize("changes, field, default", [
    ({"bench_iters": 5}, "bench_iters", 10),
    ({"kmse_dim": 3}, "kmse_dim", 16),
    ({"task": "kernel_mse", "bench_batch": 4}, "bench_batch", 32),
    ({"task": "bench", "kmse_draws": 10}, "kmse_draws", 2000),
])
def test_a_field_of_another_task_is_refused(changes: dict, field: str, default: int) -> None:
    with pytest.raises(ConfigError) as err:
        TrialConfig.from_dict(changes, source="test")
    message = str(err.value)
    task = changes.get("task", "train")
    owner = "bench" if field.startswith("bench_") else "kernel_mse"
    for word in (f"field {field!r} has value {changes[field]}", f"allowed: its default {default} with task={task!r}",
                 f"only task {owner!r} reads it"):
        assert word in message, (word, message)
    TrialConfig.from_dict({**changes, "task": owner})  # the task that reads it takes it
    TrialConfig.from_dict({"task": task, field: default})  # its default is no change: allowed anywhere


def test_set_a_field_of_another_task_on_a_train_space_is_one_line_from_sweep(capsys) -> None:
    import sweep

    assert sweep.main(["--space", "search_spaces/cifar10_ladder40_cpu.yaml", "--dry-run", "--set",
                       "bench_iters=5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "field 'bench_iters' has value 5; allowed: its default 10 with task='train'" in err, err


def test_the_cli_refuses_a_field_of_another_task(capsys) -> None:
    refused_in_one_line(capsys, TINY_ARGV + ["--bench-iters", "5"],
                        ["field 'bench_iters' has value 5", "task='train'", "only task 'bench' reads it"])


# ---- the dry run did not see a train_subset larger than the training split (each trial failed as it loaded)
def test_the_dry_run_warns_of_a_train_subset_above_the_split_and_a_real_sweep_refuses_it(tmp_path, capsys) -> None:
    import sweep

    space = tmp_path / "space.yaml"
    space.write_text("task: train\nfixed: {dataset: digits, epochs: 1, dim: 16, depth: 1, heads: 2}\n"
                     "grid: {train_subset: [100, 1294]}\n")
    assert sweep.main(["--space", str(space), "--dry-run", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("warning: data: dataset 'digits': field 'train_subset' has value 1294 but the training split holds 1293 "
            "images") in out, out
    assert sweep.main(["--space", str(space), "--results-dir", str(tmp_path), "--no-dashboard"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "allowed: 1..1293, or 0 for all" in err, err
    assert not (tmp_path / "space").exists() or not any((tmp_path / "space").rglob("trials.parquet"))
    space.write_text(space.read_text().replace("1294", "1293"))  # the whole split is allowed: no warning
    assert sweep.main(["--space", str(space), "--dry-run", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "data: digits is bundled" in out and "warning: data:" not in out, out
