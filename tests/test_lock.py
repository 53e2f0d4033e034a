"""Issue 31, item 9: the sweep lock (rpevit.sweep.lock) never writes through a symbolic link, and
a sweep folder holding links where rpevit writes is refused with one message before anything runs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rpevit.sweep.lock import LOCK_FILE, SweepBusy, sweep_lock
from rpevit.sweep.space import SpaceError


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_a_linked_lock_file_is_refused_and_its_target_untouched(tmp_path, victim) -> None:
    folder = tmp_path / "results" / "s"
    folder.mkdir(parents=True)
    (folder / LOCK_FILE).symlink_to(victim)
    with pytest.raises(SpaceError, match=f"{LOCK_FILE} is a symbolic link.*allowed"):
        with sweep_lock(folder):
            pass
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("link", ["trials.parquet", "ray", "trials", "trials/0123456789abcdef",
                                  "trials/0123456789abcdef/log.txt", "trials/0123456789abcdef/checkpoint.pt"])
def test_links_where_the_sweep_writes_are_refused_naming_them(tmp_path, victim, link: str) -> None:
    folder = tmp_path / "results" / "s"
    (folder / "trials" / "0123456789abcdef").mkdir(parents=True)
    path = folder / link
    if path.is_dir():
        os.rename(path, tmp_path / "moved")
    path.symlink_to(victim if "." in link else tmp_path, target_is_directory="." not in link)
    with pytest.raises(SpaceError) as err:
        with sweep_lock(folder):
            pass
    message = str(err.value)
    assert f"{link} -> " in message and "symbolic links" in message and "allowed: no links" in message, message
    assert victim.read_text() == "precious\n"
    path.unlink()
    with sweep_lock(folder):  # without the link the same folder is fine
        assert (folder / LOCK_FILE).read_text().startswith(f"pid {os.getpid()}")


def test_a_linked_sweep_folder_is_refused(tmp_path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "s").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(SpaceError, match="sweep folder .* is a symbolic link.*allowed"):
        with sweep_lock(tmp_path / "results" / "s"):
            pass
    assert not (tmp_path / "real" / LOCK_FILE).exists()


def test_the_lock_has_one_taker_and_is_released_after_a_refusal(tmp_path, victim) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "epochs.parquet").symlink_to(victim)
    with pytest.raises(SpaceError):
        with sweep_lock(folder):
            pass
    (folder / "epochs.parquet").unlink()
    with sweep_lock(folder):
        with pytest.raises(SweepBusy, match=f"pid {os.getpid()}"):  # one taker, even within one process
            with sweep_lock(folder):
                pass
    with sweep_lock(folder):  # released by the refusal and by the end of the first block
        pass


@pytest.mark.parametrize("code", ["ENOLCK", "EOPNOTSUPP", "ENOSYS"])
def test_a_file_system_without_locks_is_named_as_such_not_as_another_driver(tmp_path, monkeypatch, code) -> None:
    """NFS without its lock service, Lustre without -o flock: the flock fails with ENOLCK / EOPNOTSUPP, not
    EWOULDBLOCK. The sweep lock and a trial's checkpoint claim say the storage cannot lock (one line, the errno,
    what storage works) instead of 'in use by another driver' (nobody to look for) or a traceback."""
    import errno
    import fcntl

    from rpevit.checkpoint import CheckpointError, claimed

    def refuse(fd, operation):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(SpaceError) as err:
        with sweep_lock(tmp_path / "results" / "s"):
            pass
    assert not isinstance(err.value, SweepBusy) and "another" not in str(err.value)
    name = errno.errorcode[getattr(errno, code)]  # EOPNOTSUPP is ENOTSUP on Linux
    assert f"cannot be locked ({name}:" in str(err.value) and "file locks" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match=rf"\.trial\.lock cannot be locked \({name}:.*allowed: a results folder"):
        with claimed(tmp_path / "ckpt", wait_s=5):
            pass


def test_a_lock_held_by_another_open_file_is_still_another_driver(tmp_path) -> None:
    folder = tmp_path / "results" / "s"
    with sweep_lock(folder):
        with pytest.raises(SweepBusy, match="in use by another driver"):
            with sweep_lock(folder):
                pass
