"""What a user sees at the end of a sweep ranks random-feature models by their accuracy over fresh
draws (what the defaults train with: tests/test_defaults_follow_validation.py)."""
from __future__ import annotations

import math
from pathlib import Path

from rpevit.sweep.tune_run import Progress
from rpevit.sweep.summary import judged_value
from rpevit.sweep.space import load_space


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


# ---- issue 43, items 2 and 3: the closing table answers, and the next step is printed
SPACE_YAML = """name: ranked
task: train
fixed: {dataset: digits, epochs: 1}
grid:
  attention: [softmax, favor, relu]
  pe: [ape]
seeds: [0, 1, 2]
"""


def write_rows(out_dir: Path, space, rows: dict[int, dict], failed: dict[int, str] = {}) -> None:
    """Summary rows of the space's trials (by index) and failures, through the driver's real writer."""
    from types import SimpleNamespace

    import torch

    from rpevit import metrics
    from rpevit.sweep.protocol import SUMMARY, Report
    from rpevit.sweep.writer import ParquetResults

    env = metrics.environment(torch.device("cpu"))
    configs = {space.keys[i]: space.trials[i] for i in [*rows, *failed]}
    writer = ParquetResults(out_dir, space.name, configs, {k: i for i, k in enumerate(space.keys)})
    for i, values in rows.items():
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                               Report(SUMMARY, space.keys[i], {**space.trials[i], **env, **values}).to_tune())
    for i, error in failed.items():
        writer.record_failure(space.keys[i], error, error, f"f{i}", 1)
    writer.on_experiment_end([])


def test_the_closing_table_ranks_variants_by_judged_accuracy_over_seeds(tmp_path, capsys, monkeypatch):
    """One row per variant, best first by the judged accuracy (favor: its draw mean, not its training draw),
    mean [95% t interval] (n) over its ok seeds from rpevit.analysis.stats, the training draw beside the
    draw mean of random-feature variants, failed and not-run seeds counted; then what to run next."""
    from rpevit.analysis.stats import mean_interval
    from rpevit.sweep.summary import compute_summary, print_summary

    path = tmp_path / "ranked.yaml"
    path.write_text(SPACE_YAML)
    space = load_space(path)
    index = {(t["attention"], t["seed"]): i for i, t in enumerate(space.trials)}
    softmax, favor_draw, favor_mean, relu = [0.90, 0.92, 0.91], [0.70, 0.71, 0.72], [0.34, 0.35], [0.95, 0.97]
    rows = {index["softmax", s]: {"test_acc": a, "test_acc_draw_mean": math.nan} for s, a in enumerate(softmax)}
    rows |= {index["favor", s]: {"test_acc": favor_draw[s], "test_acc_draw_mean": m} for s, m in enumerate(favor_mean)}
    rows |= {index["relu", s]: {"test_acc": a, "test_acc_draw_mean": 0.5} for s, a in enumerate(relu)}
    out = tmp_path / "results" / "ranked"
    (out / "tensorboard").mkdir(parents=True)
    write_rows(out, space, rows, failed={index["favor", 2]: "ValueError: boom"})  # relu seed 2: not run
    monkeypatch.chdir(tmp_path)
    summary = compute_summary(out, space, wall_s=0.0)
    assert [r.label for r in summary.table] == ["attention=softmax", "attention=relu", "attention=favor"]
    softmax_row, relu_row, favor_row = summary.table
    assert softmax_row.judged == mean_interval(softmax) and softmax_row.training_draw is None
    assert relu_row.judged == mean_interval([0.5, 0.5]) and relu_row.training_draw == mean_interval(relu)
    assert favor_row.judged == mean_interval(favor_mean) and favor_row.training_draw == mean_interval(favor_draw[:2])
    assert (favor_row.ok, favor_row.failed, favor_row.not_run) == (2, 1, 0) and relu_row.status == "2 ok, 1 not run"
    print_summary(summary)
    printed = capsys.readouterr().out
    print(printed)
    line = next(l for l in printed.splitlines() if "attention=favor" in l)
    assert mean_interval(favor_mean).text(scale=100, digits=4) in line  # percent, as report.md (issue 59, item 7)
    assert mean_interval(favor_draw[:2]).text(scale=100, digits=4) in line
    assert line.startswith("3 ") and "2 ok, 1 failed" in line
    assert "mean [95% interval] (n seeds)" in printed and "training draw" in printed
    assert "next:\n  tensorboard --logdir results/ranked/tensorboard" in printed
    report = Path(__file__).resolve().parent.parent / "analysis" / "report.py"
    assert f"  python {report} results/ranked\n" in printed and "results/ranked/report.md" in printed


def test_progress_prints_no_repeated_line_when_several_events_come_together(capsys):
    """Issue 43, item 9: trials ending together and the experiment's end printed the same line (one
    timestamp) several times; a heartbeat after every_s still repeats it, to show the sweep is alive."""
    class Trial:
        status = "TERMINATED"
        config = {"trial": {"name": "x", "members": [{"trial_key": "k1", "label": "attention=favor", "cfg": {}}]}}

    progress = Progress(total=1, every_s=1e9)
    progress.on_trial_result(0, [], Trial(), {"kind": "summary", "trial_key": "k1", "row": {}})  # its row: done
    progress.on_trial_complete(0, [Trial()], Trial())
    progress.on_experiment_end([Trial()])
    progress.on_trial_complete(0, [Trial()], Trial())
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "done 1 | failed 0 | of 1" in lines[0]
    progress.every_s = 0.0
    progress.on_step_end(0, [Trial()])
    assert len(capsys.readouterr().out.splitlines()) == 1  # the heartbeat
