"""`python sweep.py` end to end in subprocesses: failures + dashboard, and resume after SIGKILL."""
from __future__ import annotations

import pytest

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from rpevit import registry
from rpevit.config import TrialConfig
from rpevit.sweep.store import read_frame
from tests.process_output import Output

pytestmark = pytest.mark.slow  # Ray and real sweeps: `pytest -m "not slow"` leaves them out

ROOT = Path(__file__).resolve().parents[1]
TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 200, "epochs": 2,
        "batch_size": 64}


def start_sweep(space: dict, tmp_path: Path, *flags: str, env: dict | None = None
                ) -> tuple[subprocess.Popen, Output]:
    """Run sweep.py in its own process group; its output lines are collected by a thread."""
    path = tmp_path / f"{space['name']}.yaml"
    path.write_text(yaml.safe_dump(space))
    proc = subprocess.Popen([sys.executable, "sweep.py", "--space", str(path), "--results-dir",
                             str(tmp_path / "results"), *flags], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    return proc, Output(proc)


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out.update(map(int, kids))
        todo.extend(map(int, kids))
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_failed_trial_is_recorded_the_rest_finish_and_dashboard_answers(tmp_path):
    space = {"name": "fail", "fixed": TINY, "grid": {"attention": ["softmax", "favor"], "pe": ["ape", "rope"]},
             "include": [{"lr": 1.0e6, "grad_clip": 0.0, "warmup_epochs": 0.0}]}  # diverges: NaN loss
    token = secrets.token_hex(32)  # this sweep's own Ray auth token, not the user's
    proc, lines = start_sweep(space, tmp_path, "--dashboard", "--cpus-per-trial", "1",
                              env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    dashboard, anonymous = None, None
    deadline = time.time() + 200
    while proc.poll() is None and time.time() < deadline and dashboard is None:
        url = next((ln.split("dashboard: ")[1].split()[0] for ln in list(lines) if "dashboard: http" in ln), None)
        if url and any("running" in ln for ln in list(lines)):  # the sweep is under way
            try:
                urllib.request.urlopen(url + "/api/version", timeout=10)
            except urllib.error.HTTPError as err:
                anonymous = err.code
            request = urllib.request.Request(url + "/api/version", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                dashboard = (response.status, json.loads(response.read()))
        time.sleep(0.5)
    rc = proc.wait(timeout=max(1, deadline - time.time()))
    out = lines.whole()
    assert dashboard is not None and dashboard[0] == 200, out[-3000:]
    assert "ray_version" in dashboard[1] and anonymous == 401  # it answers, and only with the token
    assert rc == 1, out[-3000:]  # non-zero: one trial failed
    assert "1 failed" in out and "DivergedError" in out

    results = tmp_path / "results" / "fail"
    trials = pd.read_parquet(results / "trials.parquet")
    assert len(trials) == 5 and trials["trial_key"].is_unique
    ok, failed = trials[trials["status"] == "ok"], trials[trials["status"] == "failed"]
    assert len(ok) == 4 and len(failed) == 1
    assert failed["lr"].item() == 1e6 and "DivergedError: training loss is nan" in failed["error"].item()
    assert 'train.py", line' in failed["error_traceback"].item()
    # a divergence replays identically from its checkpoint, so it is not retried (--max-failures 1 is for
    # other errors: a killed worker, a lost node)
    assert failed["attempts"].item() == 1
    assert "not retried" in (results / "trials" / failed["trial_key"].item() / "log.txt").read_text()
    assert ok["test_acc"].between(0, 1).all() and ok["flops"].gt(0).all() and ok["epochs_done"].eq(2).all()
    assert set(ok["data_dir"]) == {""}  # digits reads no data folder (others get absolute paths)
    epochs = pd.read_parquet(results / "epochs.parquet")
    assert len(epochs) == 4 * 2 and not epochs.duplicated(["trial_key", "epoch"]).any()
    assert set(epochs["trial_key"]) == set(ok["trial_key"])

    # --resume reruns nothing here (failed trials need --retry-failed) and still reports the failure
    again, lines = start_sweep(space, tmp_path, "--resume")
    assert again.wait(timeout=120) == 1
    assert "0 to run" in lines.whole()
    assert "--retry-failed --resume" in lines.whole()  # the summary names the command that reruns it
    pd.testing.assert_frame_equal(pd.read_parquet(results / "trials.parquet"), trials)

    # --resume --retry-failed runs the failed trial again on purpose, and only it: it diverges again (the
    # same configuration), its row is its new run's, and the finished rows are kept as they were
    again, lines = start_sweep(space, tmp_path, "--resume", "--retry-failed")
    assert again.wait(timeout=180) == 1, lines.whole()[-3000:]
    assert "1 to run" in lines.whole(), lines.whole()[-3000:]
    retried = pd.read_parquet(results / "trials.parquet")
    assert len(retried) == 5 and retried["trial_key"].is_unique
    pd.testing.assert_frame_equal(retried[retried["status"] == "ok"].reset_index(drop=True),
                                  ok.reset_index(drop=True))
    failed_again = retried[retried["status"] == "failed"]
    assert failed_again["trial_key"].item() == failed["trial_key"].item()
    assert "DivergedError: training loss is nan" in failed_again["error"].item()
    log = (results / "trials" / failed["trial_key"].item() / "log.txt").read_text()
    assert log.count("not retried") == 2, log  # the trial's log is appended to: its first run and this one


def test_a_trial_whose_checkpoint_is_damaged_fails_once_naming_it_and_is_not_retried(tmp_path):
    """A damaged checkpoint.pt (here: not a checkpoint at all) is refused with CheckpointError at every try: Tune's
    retry (--max-failures 1) would only read it again, so the trial fails once, its row naming the file."""
    from rpevit.sweep.space import expand_space

    space = {"name": "damaged", "fixed": TINY, "grid": {"attention": ["softmax"]}}
    key = expand_space(space, source="damaged.yaml").keys[0]
    folder = tmp_path / "results" / "damaged" / "trials" / key
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(b"PK\x03\x04 truncated")  # a zip header and nothing after it
    proc, lines = start_sweep(space, tmp_path, "--no-dashboard", "--resume")
    assert proc.wait(timeout=180) == 1, lines.whole()[-3000:]
    failed = pd.read_parquet(tmp_path / "results" / "damaged" / "trials.parquet")
    assert failed["status"].tolist() == ["failed"] and failed["attempts"].tolist() == [1], failed.T
    assert "CheckpointError" in failed["error"].item() and "checkpoint.pt" in failed["error"].item()
    assert "not retried: a retry reads the same checkpoint" in (folder / "log.txt").read_text()


def test_a_trial_whose_worker_is_killed_is_retried_from_its_checkpoint_and_its_row_counts_the_tries(tmp_path):
    """SIGKILL of the Ray worker running a trial (as an OOM killer or a lost node does): under --max-failures 1 Tune
    retries it, the retry resumes from the checkpoint, and the ok row says it took 2 tries (`attempts`; ok rows had
    none, so a retried trial looked like any other but for resumed_from_epoch)."""
    fixed = {**TINY, "dim": 32, "depth": 2, "heads": 4, "train_subset": 600, "epochs": 12}
    space = {"name": "retried", "fixed": fixed, "grid": {"pe": ["ape"]}, "resources": {"cpus_per_trial": 1}}
    proc, lines = start_sweep(space, tmp_path, "--no-dashboard", "--max-failures", "1")
    folder, killed, deadline = None, None, time.time() + 300
    while killed is None and time.time() < deadline and proc.poll() is None:
        for log in (tmp_path / "results" / "retried" / "trials").glob("*/log.txt"):
            try:
                epoch = torch.load(log.parent / "checkpoint.pt", weights_only=True)["epoch"]
            except Exception:  # noqa: BLE001 - not written yet, or being replaced this instant
                continue
            if 2 <= epoch <= fixed["epochs"] - 4:
                pid = int(re.findall(r"\(node \w+, pid (\d+),", log.read_text())[-1])
                os.kill(pid, signal.SIGKILL)  # the worker process that runs the trial
                folder, killed = log.parent, epoch
                break
        time.sleep(0.05)
    assert killed is not None, lines.whole()[-3000:]
    assert proc.wait(timeout=300) == 0, lines.whole()[-3000:]
    trials = pd.read_parquet(tmp_path / "results" / "retried" / "trials.parquet")
    epochs = pd.read_parquet(tmp_path / "results" / "retried" / "epochs.parquet")
    assert trials["status"].tolist() == ["ok"] and trials["attempts"].tolist() == [2], trials.T
    assert trials["resumed_from_epoch"].item() >= killed, (trials["resumed_from_epoch"].item(), killed)
    assert sorted(epochs["epoch"]) == list(range(1, 13))  # no epoch lost or reported twice by the retry
    assert f"after epoch {trials['resumed_from_epoch'].item()}" in (folder / "log.txt").read_text()


def test_resume_after_sigkill_finishes_without_duplicates_and_matches_an_uninterrupted_run(tmp_path):
    fixed = {**TINY, "dim": 32, "depth": 2, "heads": 4, "train_subset": 600, "epochs": 12}
    space = {"name": "kill", "fixed": fixed, "grid": {"pe": ["ape", "rope", "none"]},
             "resources": {"cpus_per_trial": 1}}
    proc, lines = start_sweep(space, tmp_path, "--no-dashboard")
    results = tmp_path / "results" / "kill"
    ckpts = results / "trials"
    interrupted, family = None, set()
    deadline = time.time() + 300
    while interrupted is None and time.time() < deadline and proc.poll() is None:
        family |= descendants(proc.pid)
        if read_frame(results).empty:  # the kill comes once a trial has its row (in parts/ until the sweep ends)
            time.sleep(0.2)
            continue
        for path in ckpts.glob("*/checkpoint.pt"):
            try:
                epoch = torch.load(path, weights_only=True)["epoch"]
            except Exception:  # noqa: BLE001 - being replaced this instant; look again
                continue
            if 1 <= epoch <= fixed["epochs"] - 3:
                interrupted = (path.parent.name, epoch)
                break
        time.sleep(0.05)
    family |= descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # the driver only, at an arbitrary moment of a trial
    proc.wait()
    assert interrupted is not None, "".join(lines)[-3000:]
    try:
        time.sleep(8)
        workers = [p for p in family if alive(p) and "ImplicitFunc" in Path(f"/proc/{p}/cmdline").read_text()]
        assert not workers, "trial processes outlived the killed driver"
    finally:
        for pid in family:  # Ray's own agents may linger after a SIGKILL; they are ours to end
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    before = read_frame(results)  # the rows the store holds (a sweep's rows stay in parts/ until it ends)
    assert len(before) >= 1 and interrupted[0] not in set(before["trial_key"])

    # the killed driver's lock file is left behind, but its flock died with it: --resume goes ahead
    assert f"pid {proc.pid}" in (results / ".sweep.lock").read_text()
    again, lines = start_sweep(space, tmp_path, "--no-dashboard", "--resume")
    assert again.wait(timeout=300) == 0, "".join(lines)[-3000:]
    trials = pd.read_parquet(results / "trials.parquet")
    epochs = pd.read_parquet(results / "epochs.parquet")
    assert len(trials) == 3 and trials["trial_key"].is_unique and set(trials["status"]) == {"ok"}
    assert len(epochs) == 3 * 12 and not epochs.duplicated(["trial_key", "epoch"]).any()
    done = trials[trials["trial_key"].isin(before["trial_key"])]  # trials finished before the kill were not rerun
    started_before = before.set_index("trial_key").loc[done["trial_key"], "started_at"].to_numpy()
    assert len(done) == len(before) and (done["started_at"].to_numpy() == started_before).all()

    # the interrupted trial ends exactly as an uninterrupted run of the same config (CPU, 1 thread)
    row = trials.set_index("trial_key").loc[interrupted[0]]
    assert row["resumed_from_epoch"] >= interrupted[1]  # continued from its checkpoint, not from scratch
    assert f"after epoch {row['resumed_from_epoch']}" in (ckpts / interrupted[0] / "log.txt").read_text()
    cfg = TrialConfig.from_dict({k: getattr(row[k], "item", lambda: row[k])() for k in TrialConfig().to_dict()})
    registry.load_all()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reference = registry.TASKS["train"](cfg, log=None)
    finally:
        torch.set_num_threads(threads)
    for name in ("test_acc", "log_likelihood", "f1", "final_val_acc"):
        assert np.isclose(row[name], reference[name], rtol=1e-6, atol=1e-9), (name, row[name], reference[name])
    mine = epochs[epochs["trial_key"] == interrupted[0]].sort_values("epoch")
    assert mine["epoch"].tolist() == list(range(1, 13))
