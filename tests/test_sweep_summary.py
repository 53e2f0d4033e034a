"""What a user sees at the end of a sweep ranks random-feature models by their accuracy over fresh
draws, and the defaults train them as the studies do (redraws every 100 steps until 80%)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from rpevit.config import TrialConfig
from rpevit.sweep.tune_run import Progress
from rpevit.sweep.summary import judged_value
from rpevit.sweep.space import load_space

ROOT = Path(__file__).resolve().parent.parent


def test_random_feature_rows_are_judged_on_the_draw_mean():
    favor = {"test_acc": 0.925, "test_acc_draw_mean": 0.231}
    softmax = {"test_acc": 0.858, "test_acc_draw_mean": math.nan}
    assert judged_value(favor, "test_acc") == 0.231
    assert judged_value(softmax, "test_acc") == 0.858
    assert judged_value({"final_val_acc": 0.5}, "final_val_acc") == 0.5


def test_progress_best_is_the_judged_accuracy_of_finished_trials():
    class Trial:
        config = {"trial": {"name": "x", "members": [{"trial_key": "k1", "label": "attention=favor", "cfg": {}}]}}

    progress = Progress(total=2, every_s=1e9)
    progress.on_trial_result(0, [], Trial(), {"kind": "epoch", "trial_key": "k1", "row": {}, "val_acc": 0.99})
    assert progress.best[1] == ""  # one-draw epoch accuracies do not rank
    progress.on_trial_result(0, [], Trial(), {"kind": "summary", "trial_key": "k1", "label": "attention=favor",
                                              "row": {"test_acc": 0.925, "test_acc_draw_mean": 0.231}})
    assert progress.best == (0.231, "attention=favor")


def test_the_default_redraws_as_the_studies_do_and_old_keys_stay():
    """The defaults follow validation (redraw every step until 80%, luo_scale 1000: issue 41); the committed
    studies' trial keys did not change."""
    cfg = TrialConfig()
    assert (cfg.redraw_interval, cfg.redraw_until, cfg.luo_scale) == (1, 0.8, 1000.0)
    for study in ("string_mnist_cpu", "mnist_converged_cpu", "kernel_mse", "token_scaling_cpu", "bench_mnist_cpu",
                  "cifar10_cpu", "bench_cifar10_cpu", "luo_scale_val_digits", "redraw_val_mnist", "rotation_mnist_cpu",
                  "bench_rotation_mnist_cpu"):
        committed = json.loads((ROOT / "results" / study / "space.json").read_text())["trial_keys"]
        assert set(committed) <= set(load_space(ROOT / "search_spaces" / f"{study}.yaml").keys), study


def test_the_ray_token_is_made_private(tmp_path):
    import os
    import stat

    from rpevit.sweep.session import private_token_file

    token = tmp_path / "auth_token"
    token.write_text("secret")
    token.chmod(0o644)
    assert private_token_file(token) == token
    assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
    assert private_token_file(tmp_path / "missing") == tmp_path / "missing"  # nothing there: nothing done
