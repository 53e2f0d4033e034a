"""rpevit/checkpoint.py beyond a kill: a crash or power loss (fsync), two processes in one checkpoint
folder (a budget ladder's trunk writing a rung's branch while the rung's trial starts there), a checkpoint
moved to another device kind, and one resumed under the other random stream of `compile: graph`.

Each test fails against the code before these guards (checked with the test copied onto that commit).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import time
from pathlib import Path

import pytest
import torch

from rpevit import checkpoint, registry
from rpevit.checkpoint import CHECKPOINT_NAME, CheckpointError
from rpevit.cli import main
from rpevit.config import TrialConfig
from rpevit.sweep import trainable
from rpevit.sweep.protocol import EPOCH, Member, TrialSpec
from rpevit.sweep.space import trial_key
from rpevit.tasks.budget_ladder import Branch
from rpevit.tasks.train import train_and_evaluate

TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 100, "epochs": 2, "batch_size": 50,
        "eval_batch_size": 256, "drop_path": 0.0, "eval_draws": 0}
LADDER = {**TINY, "train_subset": 96, "batch_size": 16, "lr_schedule": "wsd", "cooldown_fraction": 0.2,
          "warmup_epochs": 0.5, "epochs": 10}


def test_a_checkpoint_is_fsynced_before_its_rename_and_its_folder_after(tmp_path, monkeypatch) -> None:
    """What a node that crashes or loses power needs (a kill keeps the page cache: only this order shows it)."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "data")
        real_fsync(fd)

    def replace(src, dst, **dir_fds) -> None:
        calls.append("rename")
        real_replace(src, dst, **dir_fds)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    checkpoint.save(tmp_path / CHECKPOINT_NAME, {"epoch": 1})
    assert calls == ["data", "rename", "folder"]
    assert torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True) == {"epoch": 1}


def _hold(folder: str) -> None:  # another process holding a trial's folder until it is killed
    with checkpoint.claimed(folder):
        Path(folder, "held").touch()
        time.sleep(120)


@pytest.mark.slow
def test_one_process_at_a_time_holds_a_checkpoint_folder_and_a_kill_frees_it(tmp_path) -> None:
    holder = multiprocessing.get_context("spawn").Process(target=_hold, args=(str(tmp_path / "trial"),))
    holder.start()
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "trial" / "held").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "trial" / "held").exists(), "the holding process did not start within 60 s"
        started = time.monotonic()
        with pytest.raises(CheckpointError, match=rf"is in use by pid {holder.pid} on .*waited 0.3 s.*one run at a "
                                                  rf"time in a checkpoint folder"):
            with checkpoint.claimed(tmp_path / "trial", wait_s=0.3):
                pytest.fail("claimed a folder another process holds")
        assert time.monotonic() - started >= 0.3
        os.kill(holder.pid, signal.SIGKILL)  # the kernel drops a killed holder's flock: never a stale claim
        holder.join(30)
        with checkpoint.claimed(tmp_path / "trial", wait_s=5):
            assert (tmp_path / "trial" / checkpoint.CLAIM_NAME).read_text() == f"pid {os.getpid()} on {os.uname()[1]}"
    finally:
        if holder.is_alive():
            holder.kill()
        holder.join(30)


def test_a_rung_folder_that_is_a_file_or_a_dangling_link_is_a_branch_not_written(tmp_path) -> None:
    """One line in the trunk's log, and the trunk goes on (an OSError out of the claim failed the trunk)."""
    from rpevit.tasks.budget_ladder import write_branches

    rung = TrialConfig.from_dict({**LADDER, "attention": "softmax", "pe": "ape", "epochs": 5})
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    lines: list[str] = []
    write_branches([Branch(rung, tmp_path / "afile", 4), Branch(rung, tmp_path / "dangling", 4)],
                   lambda _cfg: {"epoch": 4}, lines.append)
    assert len(lines) == 2 and all("no branch for the 5-epoch rung" in line for line in lines), lines
    assert "which is a file" in lines[0] and "is a symbolic link" in lines[1]
    assert not (tmp_path / "nowhere").exists()


def test_a_claim_is_never_taken_through_a_link(tmp_path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "trial").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        with checkpoint.claimed(tmp_path / "trial"):
            pass
    (tmp_path / "real").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "real" / checkpoint.CLAIM_NAME).symlink_to(victim)
    with pytest.raises(CheckpointError, match="cannot be opened"):
        with checkpoint.claimed(tmp_path / "real"):
            pass
    assert victim.read_text() == "keep"


@pytest.mark.slow
def test_a_trunk_never_writes_the_branch_of_a_rung_whose_trial_is_running(tmp_path) -> None:
    """The rung's trial holds its folder (here: this test, through a second open, as flock counts it): the trunk
    leaves it to run on its own, writes nothing there, and its own row is unchanged."""
    trunk = TrialConfig.from_dict({**LADDER, "attention": "softmax", "pe": "ape"})
    rung = trunk.replace(epochs=5)
    lines: list[str] = []
    with checkpoint.claimed(tmp_path / "rung"):
        train_and_evaluate(trunk, log=lines.append, checkpoint_dir=tmp_path / "trunk",
                           branches=[Branch(rung, tmp_path / "rung")])
    assert not (tmp_path / "rung" / CHECKPOINT_NAME).exists()
    assert any("no branch for the 5-epoch rung" in line and "is in use by pid" in line and "it runs on its own" in line
               for line in lines), lines
    free: list[str] = []  # control: the same trunk with the rung's folder free writes the branch
    train_and_evaluate(trunk, log=free.append, branches=[Branch(rung, tmp_path / "rung-free")])
    assert (tmp_path / "rung-free" / CHECKPOINT_NAME).exists()
    assert any("wrote the 5-epoch rung's checkpoint after epoch 4" in line for line in free)


@pytest.mark.slow
def test_the_branch_is_written_before_the_trunks_own_checkpoint(tmp_path, monkeypatch) -> None:
    """A kill between the two then leaves the trunk one epoch back with the branch written (its resume sees it),
    never the trunk past the branch epoch with no branch (the rung then trained from epoch 0)."""
    from rpevit.tasks import train

    trunk = TrialConfig.from_dict({**LADDER, "attention": "softmax", "pe": "ape"})
    rung = trunk.replace(epochs=5)
    real_save = train.save_checkpoint

    class Killed(Exception):
        pass

    def dies_at_the_trunks_epoch_4(path: Path, payload: dict) -> None:
        if payload["epoch"] == 4:
            raise Killed
        real_save(path, payload)

    monkeypatch.setattr(train, "save_checkpoint", dies_at_the_trunks_epoch_4)
    with pytest.raises(Killed):
        train_and_evaluate(trunk, log=None, checkpoint_dir=tmp_path / "trunk", branches=[Branch(rung, tmp_path / "rung")])
    assert checkpoint.load(tmp_path / "rung" / CHECKPOINT_NAME)["epoch"] == 4
    assert checkpoint.load(tmp_path / "trunk" / CHECKPOINT_NAME)["epoch"] == 3


@pytest.mark.slow
def test_a_trial_holds_its_folder_while_it_runs_and_waits_for_a_holder(tmp_path, monkeypatch) -> None:
    """rpevit.sweep.trainable.run_single (Tune's report replaced by a list): the trial's folder is held from
    before it reads its checkpoint to its end, and a folder another process holds fails the trial in one line."""
    registry.load_all()
    cfg = TrialConfig.from_dict({**TINY, "attention": "softmax", "pe": "ape"}).to_dict()
    one = Member(trial_key(cfg), "softmax ape", cfg)
    spec = TrialSpec(one.trial_key, (one,), checkpoint_root=str(tmp_path / "trials"))
    folder = tmp_path / "trials" / one.trial_key
    held_during: list[bool] = []

    def report(result: dict) -> None:
        if result["kind"] != EPOCH:
            return
        try:
            with checkpoint.claimed(folder, wait_s=0):
                held_during.append(False)
        except CheckpointError:
            held_during.append(True)

    monkeypatch.setattr(trainable.tune, "report", report)
    monkeypatch.setattr(trainable, "place_on_devices", lambda cpus, gpus: {
        "node_id": "n0", "hostname": "h", "pid": 1, "ray_gpu_ids": "", "cuda_device": -1, "torch_threads": 1})
    trainable.run_single(spec, one)
    assert held_during == [True, True]  # at each of the two epoch rows
    monkeypatch.setattr(checkpoint, "CLAIM_WAIT_S", 0.2)
    with checkpoint.claimed(folder):
        with pytest.raises(CheckpointError, match="is in use by pid"):
            trainable.run_single(spec, one)


@pytest.mark.slow
def test_the_cli_refuses_a_checkpoint_folder_another_run_holds(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(checkpoint, "CLAIM_WAIT_S", 0.2)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.tmp").write_bytes(b"the holder's save, mid-write")
    with checkpoint.claimed(tmp_path / "run"):
        assert main(["--dataset", "digits", "--dim", "16", "--depth", "1", "--heads", "2", "--train-subset", "100",
                     "--epochs", "1", "--checkpoint-dir", str(tmp_path / "run")]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "is in use by pid" in message
    assert not (tmp_path / "run" / CHECKPOINT_NAME).exists()
    # its first check of the folder (which removes a killed save's temp file) waited for the claim too
    assert (tmp_path / "run" / "checkpoint.tmp").read_bytes() == b"the holder's save, mid-write"


@pytest.mark.slow
def test_a_checkpoint_of_another_device_kind_is_refused_before_any_work(tmp_path) -> None:
    """A run's data order comes from a generator on its device: a CUDA generator's state cannot continue on the
    CPU (torch refused it only after the model and data were loaded, in its own words, on every retry)."""
    cfg = TrialConfig.from_dict({**TINY, "attention": "softmax", "pe": "ape"})
    cfg = cfg.replace(epochs=1)
    train_and_evaluate(cfg, log=None, checkpoint_dir=tmp_path / "run")
    path = tmp_path / "run" / CHECKPOINT_NAME
    state = checkpoint.load(path)
    assert checkpoint.written_on(state) == "cpu"
    checkpoint.check_device(state, "cpu", path)  # the same kind continues
    state["rng"]["cuda"] = torch.zeros(16, dtype=torch.uint8)  # what a GPU run stores
    checkpoint.save(path, state)
    with pytest.raises(CheckpointError, match=r"was written on a cuda device, and this run is on cpu; allowed: "
                                              r"continue it on a cuda device"):
        train_and_evaluate(cfg, log=None, checkpoint_dir=tmp_path / "run")


def test_a_resume_that_switches_to_or_from_compile_graph_is_refused(tmp_path) -> None:
    """`compile: graph` draws a whole epoch's randomness at once: another run of the same seed. on and off
    compute the same step and continue one another."""
    cfg = TrialConfig.from_dict({**TINY, "attention": "softmax", "pe": "ape", "compile": "off"})
    path = tmp_path / CHECKPOINT_NAME
    state = {"epoch": 1, "fingerprint": checkpoint.fingerprint(cfg)}
    checkpoint.check_matches(state, cfg.replace(compile="on"), path)
    with pytest.raises(CheckpointError, match="field 'compile' has value 'graph' here, which draws its randomness "
                                              "per-epoch, but the checkpoint's run drew it per-step"):
        checkpoint.check_matches(state, cfg.replace(compile="graph"), path)
    graph = {"epoch": 1, "fingerprint": checkpoint.fingerprint(cfg.replace(compile="graph"))}
    with pytest.raises(CheckpointError, match="field 'compile' has value 'on'"):
        checkpoint.check_matches(graph, cfg.replace(compile="on"), path)
    older = {"epoch": 1, "fingerprint": {k: v for k, v in checkpoint.fingerprint(cfg).items() if k != "random_stream"}}
    checkpoint.check_matches(older, cfg.replace(compile="graph"), path)  # not recorded then: nothing to compare


@pytest.mark.slow
def test_a_fused_member_whose_checkpoint_is_of_another_device_kind_fails_alone(tmp_path) -> None:
    """As a foreign checkpoint does: the group's other members train and keep their rows."""
    from rpevit.tasks.train_group import train_group

    cfgs = [TrialConfig.from_dict({**TINY, "attention": "softmax", "pe": "ape", "epochs": 1, "seed": s}) for s in (0, 1)]
    train_and_evaluate(cfgs[0], log=None, checkpoint_dir=tmp_path / "m0")
    path = tmp_path / "m0" / CHECKPOINT_NAME
    state = checkpoint.load(path)
    state["rng"]["cuda"] = torch.zeros(16, dtype=torch.uint8)  # what a GPU run stores
    checkpoint.save(path, state)
    outcomes = train_group(cfgs, checkpoint_dirs=[tmp_path / "m0", tmp_path / "m1"], log=None)
    assert isinstance(outcomes[0], CheckpointError) and "written on a cuda device" in str(outcomes[0])
    assert isinstance(outcomes[1], dict) and outcomes[1]["seed"] == 1
