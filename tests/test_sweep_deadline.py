"""`sweep.py --deadline`: only trials predicted to end before it start, nothing is lost, `--resume`
does the rest; the value's forms and refusals; estimates and the slot plan (rpevit/sweep/deadline.py).

Real sweeps are tiny digits trials (seconds each) whose estimates come from fabricated rows or
--deadline-estimate of minutes, so which trials fit is decided by the plan, never by this machine's
speed.
"""
from __future__ import annotations

import datetime as dt
import math
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import ray
import yaml

import sweep
from rpevit import checkpoint
from rpevit.config import ConfigError, TrialConfig
from rpevit.sweep import deadline as dl
from rpevit.sweep.results import TRIALS_FILE, to_table, trials_schema, write_table_atomic
from rpevit.sweep.runner import SweepOptions, execute_sweep
from rpevit.sweep.summary import summarize
from rpevit.sweep.space import expand_space
from tests.test_sweep_reuse import two_cpu_ray  # noqa: F401 - the fixture: a 2-CPU Ray for the test

ROOT = Path(__file__).resolve().parents[1]
TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 200, "epochs": 2,
        "batch_size": 64, "eval_draws": 0}
NOW = dt.datetime(2026, 11, 23, 12, 0).timestamp()  # local noon


# ---- the value ----
@pytest.mark.parametrize("text, minutes", [("90m", 90), ("90", 90), ("1.5h", 90), (" 45 min ", 45), ("0.5", 0.5)])
def test_durations_are_minutes_from_now(text, minutes):
    assert dl.parse_deadline(text, now=NOW).at == NOW + 60 * minutes


def test_wall_clock_times_are_local_unless_they_carry_an_offset():
    local_six = dt.datetime(2026, 11, 23, 18, 0).timestamp()
    assert dl.parse_deadline("18:00", now=NOW).at == local_six  # HH:MM: today, local time
    assert dl.parse_deadline("18:00:30", now=NOW).at == local_six + 30
    assert dl.parse_deadline("2026-11-23T18:00", now=NOW).at == local_six
    assert dl.parse_deadline("2026-11-24 02:00", now=NOW).at == dt.datetime(2026, 11, 24, 2).timestamp()
    utc = dt.datetime(2026, 11, 23, 18, 0, tzinfo=dt.timezone.utc).timestamp()
    assert dl.parse_deadline("2026-11-23T18:00Z", now=NOW).at == utc
    # Python 3.10's fromisoformat refuses a Z (3.11 reads it): the text reaches it as +00:00 on every Python
    assert dl.iso_offset("2026-11-23T18:00Z") == "2026-11-23T18:00+00:00" == dl.iso_offset("2026-11-23T18:00+00:00")
    assert dl.iso_offset("Z") == "Z" and dl.iso_offset("2026-11-23T18:00") == "2026-11-23T18:00"
    assert dl.parse_deadline("2026-11-23T19:00+01:00", now=NOW).at == utc
    assert "2026-11-23 18:00:00" in dl.parse_deadline("18:00", now=NOW).describe(now=NOW)


@pytest.mark.parametrize("text, why", [
    ("0", "not positive"), ("-5", "not positive"), ("0m", "not positive"), ("-1.5h", "not positive"),
    ("11:00", "passed today"), ("2026-11-23T11:59", "has passed"), ("2020-01-01", "has passed"),
    ("garbage", "neither a time nor a duration"), ("nan", "neither"), ("inf", "neither"), ("", "neither"),
    ("25:00", "not a time of day"), ("12:60", "not a time of day"), ("600000m", "more than a year"),
])
def test_bad_values_are_refused_naming_the_flag_the_value_and_what_is_allowed(text, why):
    with pytest.raises(ConfigError) as err:
        dl.parse_deadline(text, now=NOW)
    message = str(err.value)
    assert message.startswith(f"--deadline has value {text!r}") and why in message
    assert "allowed: a future wall-clock time, ISO 8601" in message and "(90m or 90)" in message
    if why == "passed today":
        assert "for tomorrow give the date: 2026-11-24T11:00" in message


def test_the_command_line_refuses_before_ray_starts(tmp_path, capsys):
    space = tmp_path / "s.yaml"
    space.write_text(yaml.safe_dump({"name": "s", "fixed": TINY, "grid": {"pe": ["ape"]}}))
    base = ["--space", str(space), "--results-dir", str(tmp_path / "results")]
    ray.shutdown()
    for flags, expected in [
        (["--deadline", "yesterday"], "error: --deadline has value 'yesterday', which is neither"),
        (["--deadline=-30m"], "error: --deadline has value '-30m', a duration that is not positive"),
        (["--deadline", "2000-01-01T00:00"], "error: --deadline has value '2000-01-01T00:00', which has passed"),
        (["--deadline", "90m", "--deadline-estimate", "0"], "error: --deadline-estimate has value 0.0; allowed"),
        (["--deadline", "90m", "--deadline-estimate", "nan"], "error: --deadline-estimate has value nan; allowed"),
        (["--deadline-estimate", "30"], "no --deadline is given; allowed: only with --deadline"),
    ]:
        assert sweep.main(base + flags) == 2
        assert expected in capsys.readouterr().err
    assert not ray.is_initialized() and not (tmp_path / "results").exists()  # stopped before the lock and Ray
    assert sweep.main(base + ["--deadline", "90m", "--dry-run"]) == 0
    assert "deadline 20" in capsys.readouterr().out


def test_the_resume_flags_repeat_where_and_how_the_sweep_ran():
    """Pasted on a cluster's head, the printed command joins the same cluster with the same resources and retries
    (a dropped --address started a local Ray there instead); a flag left at its default is not repeated."""
    import sweep

    args = sweep.build_parser().parse_args(
        ["--space", "s.yaml", "--set", "lr=0.002", "--only", "pe=rope", "--rungs-first", "--address", "10.0.0.5:6379",
         "--cpus-per-trial", "2", "--gpus-per-trial", "0.25", "--max-concurrent", "8", "--max-failures", "3",
         "--no-reuse", "--no-dashboard", "--deadline", "2h", "--deadline-estimate", "30", "--redeclare"])
    assert sweep.resume_flags(args) == (
        "--set", "lr=0.002", "--only", "pe=rope", "--rungs-first", "--address", "10.0.0.5:6379", "--cpus-per-trial",
        "2", "--gpus-per-trial", "0.25", "--max-concurrent", "8", "--max-failures", "3", "--no-reuse", "--no-dashboard")
    assert sweep.resume_flags(sweep.build_parser().parse_args(["--space", "s.yaml"])) == ()


def test_resume_command_repeats_what_selects_the_trials():
    command = dl.resume_command("spaces/a b.yaml", "x", "out", "/data", ["--set", "lr=0.002", "--only", "pe=rope"],
                                deadline=True)
    assert shlex.split(command) == ["python", "sweep.py", "--space", "spaces/a b.yaml", "--name", "x", "--results-dir",
                                    "out", "--data-dir", "/data", "--set", "lr=0.002", "--only", "pe=rope", "--resume",
                                    "--deadline", dl.NEW_DEADLINE]
    assert "--deadline" not in dl.resume_command("a.yaml", "x", "results", None)


# ---- estimates ----
def row(cfg: dict, seconds: float, *, epochs_done: int | None = None, resumed: int = 0, per_epoch: float = math.nan,
        members: int = 1, key: str = "", start: float = 1.0e9, status: str = "ok") -> dict:
    """A trials.parquet row of `cfg` that took `seconds`."""
    full = TrialConfig.from_dict({**TrialConfig().to_dict(), **cfg}).to_dict()
    return {**full, "trial_key": key or f"k{seconds}-{cfg.get('seed', 0)}-{start}", "status": status,
            "started_at": dt.datetime.fromtimestamp(start, dt.timezone.utc),
            "finished_at": dt.datetime.fromtimestamp(start + seconds, dt.timezone.utc),
            "epochs_done": full["epochs"] if epochs_done is None else epochs_done, "resumed_from_epoch": resumed,
            "train_s_per_epoch": per_epoch, "fused_members": members, "tune_trial_id": f"t{key}{start}"}


def test_a_row_of_as_many_epochs_or_more_is_preferred_to_a_short_row_scaled_up():
    """A budget ladder's 2-epoch cool-down row (6 s: 2 s of epochs, 4 s of start-up and final evaluation) and a
    10-epoch row (14 s: 1 s an epoch, the same 4 s). Scaled up to 10 epochs the short row says 30 s (its fixed
    cost counted five times); the 10-epoch row says 14. For 2 epochs both count, and the slower says 6."""
    cfg = {**TINY, "epochs": 10}
    rows = [row({**cfg, "seed": 1}, 6.0, epochs_done=10, resumed=8, per_epoch=1.0),
            row({**cfg, "seed": 2}, 14.0, per_epoch=1.0)]
    est = dl.Estimator(rows, "train", has_epochs=True)
    assert est.trial(cfg, 10).seconds == pytest.approx(14.0)
    assert est.trial(cfg, 2).seconds == pytest.approx(6.0)
    assert dl.Estimator(rows[:1], "train", has_epochs=True).trial(cfg, 10).seconds == pytest.approx(30.0)  # alone


def test_estimates_prefer_the_same_recipe_then_the_same_model_then_any_row():
    rope = {**TINY, "pe": "rope", "epochs": 4}
    rows = [row({**rope, "seed": 7}, 40.0), row({**rope, "seed": 8}, 60.0),  # same recipe: the slowest counts
            row({**rope, "seed": 1, "lr": 0.01}, 400.0),  # same model, another lr
            row({**TINY, "pe": "ape"}, 4000.0), row({**rope}, 9e9, status="failed")]
    est = dl.Estimator(rows, "train", has_epochs=True)
    assert est.trial({**rope, "seed": 3}, epochs=4) == dl.Estimate(60.0, "same recipe")
    assert est.trial({**rope, "seed": 3}, epochs=8).seconds == 120.0  # twice the epochs: twice the time
    assert est.trial({**rope, "lr": 0.05}, epochs=4) == dl.Estimate(400.0, "same model")
    assert est.trial({**TINY, "pe": "none"}, epochs=2).source == "same task"
    assert dl.Estimator([], "train", has_epochs=True).trial(rope, 4) is None
    assert dl.Estimator([], "train", has_epochs=True, fallback_s=30.0).trial(rope, 4) == dl.Estimate(120.0,
                                                                                                      dl.FALLBACK)


def test_a_resumed_trial_needs_its_remaining_epochs_and_the_rows_fixed_cost_stays_whole():
    rows = [row(TINY, 100.0, epochs_done=10, per_epoch=8.0)]  # 80 s of epochs + 20 s of loading and evaluation
    est = dl.Estimator(rows, "train", has_epochs=True)
    assert est.trial(TINY, epochs=1).seconds == pytest.approx(28.0)  # 20 s + 1 epoch, not 100 / 10
    assert est.trial(TINY, epochs=20).seconds == pytest.approx(200.0)  # proportional is the larger reading
    resumed = [row(TINY, 30.0, epochs_done=10, resumed=7)]  # a row that trained 3 epochs after a resume
    assert dl.Estimator(resumed, "train", has_epochs=True).trial(TINY, epochs=10).seconds == pytest.approx(100.0)


def test_checkpoint_epochs_are_read_safely_and_only_from_the_trials_own_checkpoint(tmp_path):
    cfg = TrialConfig.from_dict({**TINY, "epochs": 5})
    good = tmp_path / "good"
    checkpoint.save(good / checkpoint.CHECKPOINT_NAME,
                    {"model": {}, "optimizer": {}, "scheduler": {}, "rng": {}, "history": [], "epoch": 3,
                     "fingerprint": checkpoint.fingerprint(cfg)})
    assert dl.epochs_done(good, cfg.to_dict()) == 3
    assert dl.epochs_done(good, {**cfg.to_dict(), "seed": 9}) == 0  # another run's checkpoint: plan it whole
    assert dl.epochs_done(tmp_path / "none", cfg.to_dict()) == 0
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / checkpoint.CHECKPOINT_NAME).write_bytes(b"\x80\x04not a checkpoint")
    assert dl.epochs_done(tmp_path / "junk", cfg.to_dict()) == 0


def test_a_fused_group_takes_one_members_time_scaled_to_its_size(tmp_path):
    cfgs = [{**TINY, "seed": s} for s in range(4)]
    est = dl.Estimator([row({**TINY, "seed": 9}, 100.0, members=2)], "train", has_epochs=True)
    group = lambda n: dl.Unit(tuple((f"{i:016x}", cfgs[i]) for i in range(n)), "fused")  # noqa: E731
    assert dl.unit_estimate(group(2), est, tmp_path).seconds == 100.0  # they run together
    assert dl.unit_estimate(group(1), est, tmp_path).seconds == 100.0
    assert dl.unit_estimate(group(4), est, tmp_path).seconds == 200.0  # twice the members of the row's group
    checkpoint.save(tmp_path / f"{0:016x}" / checkpoint.CHECKPOINT_NAME,  # member 0 is 1 epoch in: a sub-group of its own
                    {"model": {}, "optimizer": {}, "scheduler": {}, "rng": {}, "history": [], "epoch": 1,
                     "fingerprint": checkpoint.fingerprint(TrialConfig.from_dict(cfgs[0]))})
    assert dl.unit_estimate(group(2), est, tmp_path).seconds == pytest.approx(150.0)  # 1 epoch, then 2, in turn


def test_the_plan_admits_in_order_what_ends_before_the_deadline_on_its_slots(tmp_path):
    cfgs = [{**TINY, "seed": s, "epochs": e} for s, e in enumerate([2, 2, 20, 2, 2, 2])]
    est = dl.Estimator([row({**TINY, "seed": 99}, 100.0)], "train", has_epochs=True)  # 50 s per epoch
    units = [dl.Unit(((f"{i:016x}", c),)) for i, c in enumerate(cfgs)]
    each = dl.PER_TRIAL_S + 100.0
    deadline = dl.Deadline(NOW + dl.STARTUP_S + 2 * each + 1)
    plan = dl.plan_units(units, est, slots=2, now=NOW, deadline=deadline, checkpoint_root=tmp_path)
    assert plan.admitted == [0, 1, 3, 4] and plan.left == [2, 5]  # the 1000 s trial is left, later short ones fit
    assert plan.finish_at == NOW + dl.STARTUP_S + 2 * each
    one_slot = dl.plan_units(units, est, slots=1, now=NOW, deadline=deadline, checkpoint_root=tmp_path)
    assert one_slot.admitted == [0, 1]
    unknown = dl.plan_units(units, dl.Estimator([], "train", has_epochs=True), slots=2, now=NOW, deadline=deadline,
                            checkpoint_root=tmp_path)
    assert unknown.probe and unknown.admitted == [0] and unknown.left == [1, 2, 3, 4, 5]
    assert "probe" in unknown.estimate_text()
    again = dl.plan_units(units, dl.Estimator([], "train", has_epochs=True), slots=2, now=NOW, deadline=deadline,
                          checkpoint_root=tmp_path, probe=False)
    assert again.admitted == [] and not again.probe


def test_a_fused_summary_counts_each_group_once(tmp_path, capsys):
    space = expand_space({"name": "fz", "fixed": TINY, "grid": {"pe": ["ape", "rope"]}, "seeds": [0, 1, 2],
                          "fuse": "seeds"}, source="fz.yaml")
    rows = [row(cfg, 10.0 if cfg["pe"] == "ape" else 20.0, key=key, members=3, start=1.0e9 + (cfg["pe"] == "rope"))
            for cfg, key in zip(space.trials, space.keys)]
    (tmp_path / "fz").mkdir()
    write_table_atomic(to_table(rows, trials_schema("train")), tmp_path / "fz" / TRIALS_FILE)
    outcome = summarize(tmp_path / "fz", space, wall_s=40.0, slots=1, started_after=1.0e9 - 1)
    out = capsys.readouterr().out
    assert outcome.trial_s == 30.0 and outcome.trials_ran == 2  # 10 s + 20 s, not 3 x (10 + 20)
    assert "sum of in-trial times 30.0 s over 2 fused groups (6 trials; the members of a group share" in out
    assert "5.00 s per fused group outside" in out


# ---- real sweeps ----
@pytest.mark.slow
def test_only_what_fits_starts_in_space_order_and_nothing_started_is_lost(tmp_path, two_cpu_ray, capsys):
    space = expand_space({"name": "dl", "fixed": TINY, "grid": {"pe": ["ape", "rope"]}, "seeds": [0, 1]},
                         source="dl.yaml")
    # measured rows of the same recipes (seed 100: not in this space, set aside, still measurements): ape
    # 100 s, rope 1000 s (the slowest row of a level counts, so the rope trials stay at 1000 s however fast
    # the ape ones turn out)
    (tmp_path / "dl").mkdir()
    old = [row({**TINY, "pe": pe, "seed": 100}, seconds, key=f"{i:016x}")
           for i, (pe, seconds) in enumerate((("ape", 100.0), ("rope", 1000.0)))]
    write_table_atomic(to_table(old, trials_schema("train")), tmp_path / "dl" / TRIALS_FILE)
    each = dl.PER_TRIAL_S + 100.0
    deadline = time.time() + dl.STARTUP_S + 2 * each + 30  # one slot: both ape trials fit, no rope trial does
    opts = SweepOptions(results_dir=tmp_path, dashboard=False, resume=True, max_concurrent=1, deadline=deadline,
                        progress_every_s=1e9)
    outcome = execute_sweep(space, opts)
    out = capsys.readouterr().out
    assert outcome.exit_code == 0, out[-3000:]
    ape = [k for i, k in enumerate(space.keys) if space.trials[i]["pe"] == "ape"]
    trials = pd.read_parquet(tmp_path / "dl" / TRIALS_FILE)
    ran = trials[trials["trial_key"].isin(space.keys)]
    assert list(ran["trial_key"]) == ape and set(ran["status"]) == {"ok"}  # in space order
    epochs = pd.read_parquet(tmp_path / "dl" / "epochs.parquet")
    assert sorted(epochs["trial_key"]) == sorted(ape * 2)  # every epoch of what ran
    for key in set(space.keys) - set(ape):  # never started: no folder, no checkpoint
        assert not (tmp_path / "dl" / "trials" / key).exists()
    assert "deadline plan: starting 2 of 4 Tune trial(s) (2 trial(s))" in out
    assert "ran 2 trial(s), left 2 that would not end before it; estimate: 1 min 40 s per Tune trial" in out
    assert "round 2 (after the last finished): starting 0 of 2 Tune trial(s)" in out  # planned again: still too long
    assert "then 16 min 40 s per Tune trial (from rows of: same recipe 2" in out
    command = next(ln for ln in out.splitlines() if ln.startswith("continue with: ")).removeprefix("continue with: ")
    assert shlex.split(command) == ["python", "sweep.py", "--space", "dl.yaml", "--name", "dl", "--results-dir",
                                    str(tmp_path), "--resume", "--deadline", dl.NEW_DEADLINE]

    # the resume: test_the_command_line_prints_the_resume_command_that_continues_the_sweep


@pytest.mark.slow
def test_the_plan_is_made_again_when_the_trials_started_have_finished(tmp_path, two_cpu_ray, capsys):
    """Issue 39: a 3-minute deadline left minutes unused while trials the first plan left waited. The
    estimates (600 s a trial) are far above what these trials take (seconds): the first plan admits one
    on one slot; once it has finished, the time actually left admits more."""
    space = expand_space({"name": "again", "fixed": TINY, "grid": {"pe": ["ape", "rope"]}}, source="again.yaml")
    (tmp_path / "again").mkdir()
    estimate = 600.0
    old = [row({**TINY, "pe": pe, "seed": 100}, estimate, key=f"{i:016x}") for i, pe in enumerate(("ape", "rope"))]
    write_table_atomic(to_table(old, trials_schema("train")), tmp_path / "again" / TRIALS_FILE)
    # the first plan: one of two (a second needs 5 s more). Round 2 admits another while start-up and the
    # first trial took under STARTUP_S + estimate (11 min): a margin a loaded machine keeps (beside two
    # running studies they took 3 min, past the 160 s that a 100 s estimate allowed). The test never waits
    # for the deadline: it ends when the trials have run.
    deadline = time.time() + dl.STARTUP_S + 2 * (dl.PER_TRIAL_S + estimate) - 5
    outcome = execute_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False, resume=True, max_concurrent=1,
                                                deadline=deadline, progress_every_s=1e9))
    out = capsys.readouterr().out
    assert outcome.exit_code == 0, out[-3000:]
    assert "deadline plan: starting 1 of 2 Tune trial(s)" in out
    assert "deadline plan, round 2 (after the last finished): starting 1 of 1 Tune trial(s)" in out, out[-3000:]
    trials = pd.read_parquet(tmp_path / "again" / TRIALS_FILE)
    ran = trials[trials["trial_key"].isin(space.keys)]
    assert list(ran["trial_key"]) == space.keys and set(ran["status"]) == {"ok"}  # both, in space order


def test_when_nothing_can_fit_ray_is_not_started_and_no_probe_is_claimed(tmp_path, monkeypatch, capsys):
    from rpevit.sweep import session

    monkeypatch.setattr(session, "ray_session", lambda *a, **k: pytest.fail("Ray was started"))
    space = expand_space({"name": "near", "fixed": TINY, "grid": {"pe": ["ape", "rope"]}}, source="near.yaml")
    near = time.time() + dl.STARTUP_S / 2  # nothing known, and not even a probe's start-up fits
    outcome = execute_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False, deadline=near))
    out = capsys.readouterr().out
    assert outcome.exit_code == 0 and "Ray is not started" in out
    assert "starting 0 of 2 Tune trial(s)" in out and "the deadline leaves no time for a probe" in out
    assert "starts alone as a probe" not in out
    assert "ran 0 trial(s), left 2" in out and "continue with: " in out
    (tmp_path / "near" / TRIALS_FILE).parent.mkdir(exist_ok=True)  # known, but longer than the time left
    write_table_atomic(to_table([row({**TINY, "pe": "ape", "seed": 9}, 1000.0, key=f"{7:016x}")],
                                trials_schema("train")), tmp_path / "near" / TRIALS_FILE)
    outcome = execute_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False, resume=True,
                                                deadline=time.time() + 600))
    out = capsys.readouterr().out
    assert outcome.exit_code == 0 and "Ray is not started" in out and "16 min 40 s per Tune trial" in out


def test_absurd_deadlines_and_estimates_are_one_line_and_day_counts_are_bounded(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        for text, why in [("9999-12-31T23:59", "which is more than a year ahead"),
                          ("0001-01-01T00:00", "which has passed \\(more than a year ago\\)"),
                          ("2099-01-01T00:00\\+01:00", "which is more than a year ahead")]:
            with pytest.raises(ConfigError, match=f"^--deadline has value '{text}', {why}; allowed"):
                dl.parse_deadline(text.replace("\\", ""))
    finally:
        monkeypatch.undo()
        time.tzset()
    with pytest.raises(ConfigError, match=r"--deadline-estimate has value 1e\+300; allowed: .* at most 31,622,400"):
        dl.check_estimate(1e300, dl.parse_deadline("90m"))
    assert dl.span(1e300) == dl.span(math.inf) == "more than a year" and dl.span(3 * 86400) == "3 d 00 h"
    with pytest.raises(ConfigError, match="deadline has value 1e\\+300; allowed: a Unix time at most a year ahead"):
        dl.as_deadline(1e300)


@pytest.mark.slow
def test_with_nothing_known_one_trial_probes_and_the_rest_is_planned_from_it(tmp_path, two_cpu_ray, capsys):
    space = expand_space({"name": "probe", "fixed": TINY, "grid": {"pe": ["ape", "rope", "none"]}},
                         source="probe.yaml")
    outcome = execute_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False, deadline="30m",
                                                progress_every_s=1e9))
    out = capsys.readouterr().out
    assert outcome.exit_code == 0, out[-3000:]
    assert "starting 1 of 3 Tune trial(s) (1 trial(s))" in out and "estimate: nothing known yet" in out
    assert "round 2 (after the last finished): starting 2 of 2 Tune trial(s) (2 trial(s))" in out
    assert "from rows of: same task 2" in out
    trials = pd.read_parquet(tmp_path / "probe" / TRIALS_FILE).set_index("trial_key")
    assert set(trials["status"]) == {"ok"} and len(trials) == 3
    probe = trials.loc[space.keys[0]]
    assert (trials.loc[space.keys[1:], "started_at"] > probe["finished_at"]).all()  # it ran alone, first


@pytest.mark.slow
def test_the_command_line_prints_the_resume_command_that_continues_the_sweep(tmp_path):
    space = {"name": "dlcli", "fixed": TINY, "grid": {"pe": ["ape", "rope"], "epochs": [2, 10000]}}
    path = tmp_path / "dlcli.yaml"
    path.write_text(yaml.safe_dump(space))
    results = tmp_path / "out dir"
    # no rows yet: 30 s per epoch from --deadline-estimate; one at a time, the two 2-epoch trials (60 s start-up
    # + 2 x 65 s) fit in 4 min; the 10000-epoch ones do not, also once the first rows say how fast an epoch
    # really is: 5000x a 2-epoch row of over a tenth of a second is twice the ~4 min then left, or more (at
    # 9.5 min a fast machine's 0.1 s row fitted one, which then ran past the test's timeout)
    first = subprocess.run([sys.executable, "sweep.py", "--space", str(path), "--name", "mine", "--results-dir",
                            str(results), "--set", "lr=0.002", "--no-dashboard", "--max-concurrent", "1",
                            "--deadline", "4m", "--deadline-estimate", "30"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    assert "ran 2 trial(s), left 2 that would not end before it" in first.stdout
    assert "from rows of: --deadline-estimate 2" in first.stdout
    line = next(ln for ln in first.stdout.splitlines() if ln.startswith("continue with: "))
    argv = shlex.split(line.removeprefix("continue with: "))
    assert argv == ["python", "sweep.py", "--space", str(path), "--name", "mine", "--results-dir", str(results),
                    "--set", "lr=0.002", "--max-concurrent", "1", "--no-dashboard", "--resume", "--deadline",
                    dl.NEW_DEADLINE]  # how it ran too (sweep.resume_flags), the estimate not: it was for that run
    before = pd.read_parquet(results / "mine" / TRIALS_FILE)
    assert len(before) == 2 and set(before["epochs"]) == {2} and set(before["lr"]) == {0.002}
    # 5 minutes: a 10000-epoch trial is predicted at 5000x a measured 2-epoch row (over a tenth of a second
    # on any machine), so it does not fit, and the command ends without starting Ray
    argv = [sys.executable, *argv[1:-1], "5m"]
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "set aside" not in again.stdout and "2 already done, 2 to run" in again.stdout  # the same trials
    assert "Ray is not started" in again.stdout and "ran 0 trial(s), left 2" in again.stdout
    trials = pd.read_parquet(results / "mine" / TRIALS_FILE)
    assert trials["trial_key"].tolist() == before["trial_key"].tolist()
    assert (trials["started_at"].to_numpy() == before["started_at"].to_numpy()).all()  # what ran was not rerun
    epochs = pd.read_parquet(results / "mine" / "epochs.parquet")
    assert len(epochs) == 2 * 2 and not epochs.duplicated(["trial_key", "epoch"]).any()
