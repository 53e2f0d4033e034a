"""rpevit/checkpoint.py: checkpoints never run code, and only continue the run that wrote them."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from rpevit import checkpoint
from rpevit.checkpoint import CHECKPOINT_NAME, CheckpointError
from rpevit.cli import main
from rpevit.config import ConfigError, TrialConfig
from rpevit.sweep.trainable import checkpointed_history
from rpevit.tasks.budget_ladder import Branch, write_branches
from rpevit.tasks.train import train_and_evaluate

TINY = {"dim": 16, "depth": 1, "heads": 2, "train_subset": 100, "epochs": 2, "batch_size": 50,
        "eval_batch_size": 256, "drop_path": 0.0, "eval_draws": 0}


class Payload:
    """Unpickling this runs `touch <marker>`: what a planted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(folder: Path, marker: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CHECKPOINT_NAME
    torch.save({"model": Payload(marker), "optimizer": {}, "scheduler": {}, "rng": {}, "history": [],
                "epoch": 1}, path)
    return path


def test_planted_pickle_is_refused_and_its_payload_never_runs(tmp_path, capsys) -> None:
    marker, ckpt_dir = tmp_path / "payload_ran", tmp_path / "trials" / "0123456789abcdef"
    path = plant(ckpt_dir, marker)
    cfg = TrialConfig.from_dict(TINY)
    with pytest.raises(CheckpointError, match="was not loaded: unpickling it could run code") as err:
        train_and_evaluate(cfg, checkpoint_dir=ckpt_dir, log=None)  # the train task (CLI and Ray trials)
    assert str(path) in str(err.value) and "posix.system" in str(err.value)
    with pytest.raises(CheckpointError, match="was not loaded"):
        checkpointed_history(ckpt_dir, cfg)  # what the Ray trainable reads first on --resume
    assert main(["--dim", "16", "--depth", "1", "--heads", "2", "--train-subset", "100", "--epochs", "1",
                 "--checkpoint-dir", str(ckpt_dir)]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "was not loaded" in message
    assert not marker.exists(), "the checkpoint's payload ran"
    # control: the planted file is a real exploit that today's weights_only=False load would run
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_another_config_naming_the_fields(tmp_path, capsys) -> None:
    cfg = TrialConfig.from_dict(TINY)
    done = train_and_evaluate(cfg, checkpoint_dir=tmp_path, log=None)  # a finished 2-epoch checkpoint, seed 0
    assert torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)["fingerprint"]["fields"]["seed"] == 0

    with pytest.raises(CheckpointError) as err:  # another seed: refused, not silently continued
        train_and_evaluate(cfg.replace(seed=5), checkpoint_dir=tmp_path, log=None)
    assert "field 'seed' has value 5 here but 0 in the checkpoint" in str(err.value)
    with pytest.raises(CheckpointError) as err:  # another model size: a message, not load_state_dict's
        train_and_evaluate(cfg.replace(dim=32, lr=4e-3), checkpoint_dir=tmp_path, log=None)
    assert "'dim' has value 32 here but 16" in str(err.value) and "'lr' has value 0.004 here but 0.002" in str(err.value)
    with pytest.raises(CheckpointError, match="has 2 epochs done but field 'epochs' has value 1"):
        train_and_evaluate(cfg.replace(epochs=1), checkpoint_dir=tmp_path, log=None)
    with pytest.raises(CheckpointError, match="2-epoch run but field 'epochs' has value 3.*--extend-epochs"):
        train_and_evaluate(cfg.replace(epochs=3), checkpoint_dir=tmp_path, log=None)
    with pytest.raises(CheckpointError, match="'seed' has value 5"):  # the sweep's trainable checks too
        checkpointed_history(tmp_path, cfg.replace(seed=5))
    assert main(["--dim", "16", "--depth", "1", "--heads", "2", "--train-subset", "100", "--epochs", "2",
                 "--batch-size", "50", "--eval-batch-size", "256", "--drop-path", "0", "--eval-draws", "0",
                 "--seed", "5", "--checkpoint-dir", str(tmp_path)]) == 2
    assert "'seed' has value 5" in capsys.readouterr().err

    # the same config resumes (nothing left to train); extending is allowed when asked for
    again = train_and_evaluate(cfg, checkpoint_dir=tmp_path, log=None)
    assert again["epochs_done"] == 2 and again["test_acc"] == done["test_acc"]
    seen: list[int] = []
    longer = train_and_evaluate(cfg.replace(epochs=3), checkpoint_dir=tmp_path, log=None, extend_epochs=True,
                                on_epoch=lambda row, _c: seen.append(row["epoch"]))
    assert seen == [3] and longer["epochs"] == 3 and longer["epochs_done"] == 3


def test_older_checkpoints_match_by_their_stored_config(tmp_path) -> None:
    """Checkpoints written before fingerprints existed carry `config`: they still resume."""
    cfg = TrialConfig.from_dict(TINY)
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "rng": {}, "history": [], "epoch": 1,
             "config": cfg.to_dict()}
    path = tmp_path / CHECKPOINT_NAME
    torch.save(state, path)
    loaded = checkpoint.load(path)
    checkpoint.check_matches(loaded, cfg, path)  # no error
    with pytest.raises(CheckpointError, match="'heads' has value 4"):
        checkpoint.check_matches(loaded, cfg.replace(heads=4), path)
    torch.save({"model": {}}, path)
    with pytest.raises(CheckpointError, match="not an rpevit train checkpoint"):
        checkpoint.load(path)
    path.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match=f"checkpoint {path}"):
        checkpoint.load(path)


# ---- issue 31, items 9 and 18: links are never written through; stale temps; honest messages
def test_random_bytes_are_corrupt_not_code_but_a_real_pickle_still_is(tmp_path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    random_bytes = np.random.default_rng(0).bytes(4096)
    path.write_bytes(random_bytes)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(path)
    assert "is corrupt or not a checkpoint" in str(err.value) and "run code" not in str(err.value)
    assert "allowed" in str(err.value)
    path.write_bytes(b"\x80\x04" + random_bytes)  # starts like a pickle, is not one
    with pytest.raises(CheckpointError, match="corrupt or not a checkpoint"):
        checkpoint.load(path)
    with open(path, "wb") as handle:  # a plain pickle.dump (not torch's format) that would call os.system
        __import__("pickle").dump({"model": Payload(tmp_path / "ran")}, handle)
    with pytest.raises(CheckpointError, match="could run code") as err:
        checkpoint.load(path)
    assert "system" in str(err.value) and not (tmp_path / "ran").exists()


def test_a_plain_pickle_is_refused_without_torch_unpickling_it(tmp_path) -> None:
    """Issue 43, item 9: torch.load unpickled a pickle.dump file (protocol 4) only to refuse it, warning
    'Detected pickle protocol 4' each time; such a file is refused before torch.load, with no warning."""
    path = tmp_path / CHECKPOINT_NAME
    for data in (b"\x80\x04" + np.random.default_rng(0).bytes(64), __import__("pickle").dumps({"model": 1})):
        path.write_bytes(data)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the test
            with pytest.raises(CheckpointError, match="corrupt or not a checkpoint .*a plain pickle"):
                checkpoint.load(path)


def test_save_never_writes_through_a_planted_temp_link_and_stale_temps_go(tmp_path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "trials" / "k"
    folder.mkdir(parents=True)
    (folder / "checkpoint.tmp").symlink_to(victim)
    path = folder / CHECKPOINT_NAME
    checkpoint.save(path, {"epoch": 1})
    assert victim.read_text() == "precious" and torch.load(path, weights_only=True) == {"epoch": 1}
    assert not (folder / "checkpoint.tmp").exists()
    # a kill during save() leaves checkpoint.tmp: the next run's prepare_dir removes it, and only it
    (folder / "checkpoint.tmp").write_bytes(b"torn")
    (folder / "notes.tmp").write_text("not ours")
    assert checkpoint.prepare_dir(folder) == path
    assert not (folder / "checkpoint.tmp").exists() and (folder / "notes.tmp").exists() and path.exists()


def test_a_linked_checkpoint_or_trial_log_is_refused(tmp_path) -> None:
    from rpevit.sweep.trainable import trial_log

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "trials" / "k"
    folder.mkdir(parents=True)
    (folder / CHECKPOINT_NAME).symlink_to(victim)
    with pytest.raises(CheckpointError, match="is a symbolic link.*allowed"):
        checkpoint.prepare_dir(folder)
    (folder / "log.txt").symlink_to(victim)
    with pytest.raises(ConfigError, match="log.txt is a symbolic link.*allowed"):
        with trial_log(folder):
            pass
    linked = tmp_path / "trials" / "linked"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(ConfigError, match="trial folder .*linked is a symbolic link.*allowed"):
        with trial_log(linked):
            pass
    assert victim.read_text() == "precious" and not (tmp_path / "elsewhere").exists()
    with trial_log(tmp_path / "trials" / "fine") as log:  # a real folder still logs
        log("hello")
    assert (tmp_path / "trials" / "fine" / "log.txt").read_text().endswith("hello\n")


def test_no_checkpoint_is_written_through_a_linked_folder(tmp_path) -> None:
    """A link planted at a trial's folder (a ladder rung's `trials/<key>`, made only when its trunk reaches the
    branch epoch, long after the sweep's start-up check), or swapped in after prepare_dir checked it: no
    checkpoint lands where it points. The branch is skipped (the rung runs on its own) with the reason logged."""
    victim = tmp_path / "victim"
    victim.mkdir()
    linked = tmp_path / "trials" / "rung"
    linked.parent.mkdir()
    linked.symlink_to(victim, target_is_directory=True)
    with pytest.raises(CheckpointError, match="checkpoint_dir has value .*rung'.* is a symbolic link.*allowed: a real"):
        checkpoint.prepare_dir(linked)
    with pytest.raises(CheckpointError, match="checkpoint folder .*rung is a symbolic link.*allowed: a real folder"):
        checkpoint.save(linked / CHECKPOINT_NAME, {"epoch": 1})  # swapped in after a check: refused at the write
    logged: list[str] = []
    cfg = TrialConfig.from_dict(TINY)
    write_branches([Branch(cfg, linked, 1)], lambda c: {"epoch": 1}, logged.append)
    assert list(victim.iterdir()) == [], "a checkpoint was written through the link"
    assert len(logged) == 1 and "no branch for the 2-epoch rung" in logged[0] and "symbolic link" in logged[0]
    real = tmp_path / "trials" / "real"  # control: a real folder gets its branch
    write_branches([Branch(cfg, real, 1)], lambda c: {"epoch": 1}, logged.append)
    assert torch.load(real / CHECKPOINT_NAME, weights_only=True) == {"epoch": 1}


@pytest.mark.slow
def test_a_checkpoint_dir_the_user_names_may_be_a_link_of_theirs(tmp_path, capsys) -> None:
    """`python -m rpevit.cli --checkpoint-dir LINK` (a scratch disk linked into a home folder): the folder the user
    names is resolved where it is read, so the run checkpoints into the link's target instead of being refused."""
    target = tmp_path / "scratch"
    target.mkdir()
    (tmp_path / "ckpt").symlink_to(target, target_is_directory=True)
    assert main(["--dim", "16", "--depth", "1", "--heads", "2", "--train-subset", "100", "--epochs", "1",
                 "--batch-size", "50", "--eval-draws", "0", "--quiet", "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    assert torch.load(target / CHECKPOINT_NAME, weights_only=True)["epoch"] == 1
