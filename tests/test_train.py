"""The train task and the single-trial CLI: determinism, exact resume, divergence, JSON row."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rpevit.cli import main
from rpevit.config import TrialConfig
from rpevit.tasks.train import DivergedError, train_and_evaluate

TIMING_KEYS = {"train_s_per_epoch", "images_per_s", "infer_ms_per_sample", "peak_mem_mb", "git_commit"}


def _metrics(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING_KEYS}


@pytest.mark.slow
def test_same_seed_gives_identical_metrics(tiny) -> None:
    cfg = TrialConfig.from_dict(tiny)
    a, b = train_and_evaluate(cfg, log=None), train_and_evaluate(cfg, log=None)
    assert _metrics(a) == _metrics(b)
    c = train_and_evaluate(cfg.replace(seed=1), log=None)
    assert c["log_likelihood"] != a["log_likelihood"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"augment": "crop_flip", "dropout": 0.1, "drop_path": 0.1}])
def test_resume_from_checkpoint_matches_uninterrupted_run(tiny, tmp_path, extra) -> None:
    cfg = TrialConfig.from_dict({**tiny, **extra, "epochs": 3})
    straight = train_and_evaluate(cfg, log=None)

    class Killed(Exception):
        pass

    def kill_after_first_epoch(row: dict, _ckpt) -> None:
        if row["epoch"] == 1:
            raise Killed

    # stop after the first epoch (its checkpoint is written), as a kill would, then resume from disk
    with pytest.raises(Killed):
        train_and_evaluate(cfg, checkpoint_dir=tmp_path, log=None, on_epoch=kill_after_first_epoch)
    epochs_seen = []
    resumed = train_and_evaluate(cfg, checkpoint_dir=tmp_path, log=None,
                                 on_epoch=lambda row, ckpt: epochs_seen.append(row["epoch"]))
    assert epochs_seen == [2, 3]
    assert _metrics(resumed) == _metrics(straight)


def test_each_epoch_row_says_where_it_ran_and_keeps_it_through_a_resume(tiny, tmp_path) -> None:
    """The summary row of a trial resumed on another machine or commit named only the run that finished it; each
    epoch row now records its device and commit, and the checkpoint's history keeps them, so the epochs a resumed
    run replays into epochs.parquet still say where they ran."""
    import torch

    from rpevit import metrics
    from rpevit.sweep.results import epochs_schema
    from rpevit.sweep.trainable import checkpointed_history

    cfg = TrialConfig.from_dict({**tiny, "epochs": 1})
    rows = []
    train_and_evaluate(cfg, checkpoint_dir=tmp_path, log=None, on_epoch=lambda row, _ckpt: rows.append(row))
    here = (metrics.device_name(torch.device("cpu")), metrics.git_commit())
    assert [(r["device_name"], r["git_commit"]) for r in rows] == [here]
    assert {"device_name", "git_commit"} <= set(epochs_schema("train").names)
    # the history a resume replays is the stored one, with the device and commit it recorded
    history = checkpointed_history(tmp_path, cfg)
    assert [(r["device_name"], r["git_commit"]) for r in history] == [here]


def test_divergence_raises(tiny) -> None:
    cfg = TrialConfig.from_dict({**tiny, "lr": 1e8, "grad_clip": 0.0, "label_smoothing": 0.0,
                                 "warmup_epochs": 0.0, "weight_decay": 0.0})
    with pytest.raises(DivergedError, match="training loss is"):
        train_and_evaluate(cfg, log=None)


@pytest.mark.slow
def test_summary_row_has_every_metric(tiny) -> None:
    row = train_and_evaluate(TrialConfig.from_dict(tiny), log=None)
    for key in ("test_acc", "precision", "recall", "f1", "log_likelihood", "aic", "bic", "params",
                "flops", "train_s_per_epoch", "infer_ms_per_sample", "images_per_s", "peak_mem_mb",
                "device_name", "torch_version", "ray_version", "git_commit"):
        assert key in row, key
    assert row["flops_unsupported"] == ""
    assert row["aic"] == pytest.approx(2 * row["params"] - 2 * row["log_likelihood"])
    assert 0.0 <= row["test_acc"] <= 1.0 and row["flops"] > 0


@pytest.mark.slow
def test_cli_prints_progress_then_one_json_row(capsys) -> None:
    code = main(["--dataset", "digits", "--epochs", "2", "--dim", "16", "--depth", "1",
                 "--heads", "2", "--train-subset", "100", "--pe", "rope"])
    out, err = capsys.readouterr()
    assert code == 0
    assert err.count("epoch ") == 2
    row = json.loads(out.strip().splitlines()[-1])
    assert row["pe"] == "rope" and row["dataset"] == "digits" and row["seed"] == 0
    assert set(row) >= {"test_acc", "precision", "recall", "f1", "log_likelihood", "aic", "bic",
                        "params", "flops", "train_s_per_epoch", "infer_ms_per_sample", "attention"}


def test_cli_bad_input_exits_2_with_the_field(capsys) -> None:
    assert main(["--dataset", "digits", "--pe", "alibi"]) == 2
    assert "'pe'" in capsys.readouterr().err
    assert main(["--dataset", "mnist", "--data-dir", "/nonexistent/rpevit"]) == 2
    assert "/nonexistent/rpevit/mnist.npz" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_task_reports_costs() -> None:
    from rpevit.tasks.bench import time_variant

    cfg = TrialConfig.from_dict({"task": "bench", "dataset": "cifar10", "image_size": 16,
                                 "patch_size": 4, "dim": 16, "depth": 1, "heads": 2,
                                 "bench_batch": 4, "bench_warmup": 1, "bench_iters": 2})
    row = time_variant(cfg, log=None)
    assert row["tokens"] == 16 and row["flops"] > 0 and row["flops_unsupported"] == ""
    assert row["forward_ms"] > 0 and row["train_step_ms"] > 0 and row["infer_ms"] > 0
    assert row["out_of_memory"] is False and row["train_ms_per_image"] == row["train_step_ms"] / 4
    assert row["step_mem_kind"] in ("rss_step_peak", "unavailable") and not row["step_mem_mb"] < 0


@pytest.mark.slow
@pytest.mark.skipif(Path("/proc/sys/vm/overcommit_memory").exists()
                    and Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1",
                    reason="with overcommit always on, an impossible allocation succeeds and the kernel kills later")
def test_bench_records_out_of_memory_as_an_outcome() -> None:
    """favor+luo_rpe on the dense path at N = 262,144 tokens needs N x N matrices of hundreds of GiB: the
    allocation fails at once, and the row says so instead of the trial failing."""
    from rpevit.tasks.bench import combine_repeats, time_variant

    cfg = TrialConfig.from_dict({"task": "bench", "dataset": "cifar10", "image_size": 2048, "patch_size": 4,
                                 "dim": 16, "depth": 1, "heads": 4, "attention": "favor", "pe": "luo_rpe",
                                 "luo_path": "dense", "bench_batch": 1, "bench_warmup": 1, "bench_iters": 1})
    row = time_variant(cfg, log=None)
    assert row["out_of_memory"] is True and row["tokens"] == 262144
    assert math.isnan(row["train_step_ms"]) and row["step_mem_kind"] == "out_of_memory"
    ok = {**row, "out_of_memory": False, "train_step_ms": 5.0}
    assert combine_repeats([ok, row])["out_of_memory"] is True  # out of memory in any run: the variant is
