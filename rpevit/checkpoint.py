"""Trial checkpoints: loaded without running code, and only into the run that wrote them.

Why this module exists:

- A checkpoint is a file someone may hand you (or plant in `results/<sweep>/trials/<key>/`).
  `torch.load(weights_only=False)` unpickles arbitrary objects, i.e. runs arbitrary code, so every
  checkpoint is loaded with `weights_only=True`: tensors, dicts, lists, tuples, numbers, strings.
  The train task stores only such values (RNG states are tensors, the history is a list of dicts
  of numbers); anything else is refused with a CheckpointError before it can run.
- A checkpoint continues *one* run. Resuming it under another seed, model size or learning rate
  would silently produce a row whose config does not describe what was trained, so each
  checkpoint stores a fingerprint (the config fields that define the run) and a resume under a
  different config is refused with the differing fields named. `epochs` is special: fewer epochs
  than were already trained is always refused; more is allowed only when asked for explicitly
  (`extend_epochs=True`, `python -m rpevit.cli ... --extend-epochs`), since the cosine schedule
  of the longer run differs from the one the first epochs were trained under. Two things outside the
  config fields are part of the run too and are checked beside it: the device kind its random
  streams live on (`check_device`) and whether `compile: graph` drew them (`random_stream`).
- One process at a time runs in a checkpoint folder (`claimed`): a budget ladder's trunk writes
  its rungs' checkpoints into their folders, and a rung that starts while its trunk writes there
  would read a half-made state or remove the trunk's temp file mid-write.
- A checkpoint is durable: fsynced before its rename and its folder after (rpevit.durable), so a
  node that crashes or loses power never comes back with a torn `checkpoint.pt` and nothing older.
"""
from __future__ import annotations

import fcntl
import os
import pickle
import pickletools
import re
import socket
import time
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

import torch

from rpevit.config import ConfigError, TrialConfig, recorded_values, resolve_values
from rpevit.durable import flock_refused, fsync_fd, held_elsewhere

CHECKPOINT_NAME = "checkpoint.pt"
FINGERPRINT_VERSION = 1
# Fields that say where / how fast a run executes, or only how it is evaluated after training,
# not what it trains: a resume may change them.
RUNTIME_FIELDS = frozenset({"data_dir", "device", "eval_batch_size", "eval_draws", "eval_rotations", "compile"})
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "rng", "history", "epoch")
CLAIM_NAME = ".trial.lock"  # the flock of the process running in a checkpoint folder (claimed)
CLAIM_WAIT_S = 120.0  # how long a run waits for its folder: a trunk holds a rung's folder for one write


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used by this run; the message names the file and the reason."""


def run_fields() -> list[str]:
    """The TrialConfig fields that define a run (every field but RUNTIME_FIELDS and `epochs`).

    Derived from the dataclass, so a new field is part of the fingerprint without anyone
    remembering to add it (a field that is only runtime must be added to RUNTIME_FIELDS).
    """
    return [f.name for f in fields(TrialConfig) if f.name not in RUNTIME_FIELDS and f.name != "epochs"]


def random_stream(cfg: TrialConfig) -> str:
    """How a run draws its randomness: `compile: graph` draws a whole epoch's at once on the device
    (rpevit.tasks.whole_step), every other mode step by step, so the two are different runs of one
    seed although `compile` is otherwise a runtime field (on, off and graph compute the same step)."""
    return "per-epoch" if cfg.compile == "graph" else "per-step"


def fingerprint(cfg: TrialConfig) -> dict[str, Any]:
    """What a checkpoint stores to recognise its run: plain values only (weights_only-loadable)."""
    return {"version": FINGERPRINT_VERSION, "epochs": cfg.epochs, "random_stream": random_stream(cfg),
            "fields": {name: getattr(cfg, name) for name in run_fields()}}


def prepare_dir(checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """The checkpoint file path, with its folder created and writable now, not after an epoch.

    Without this, a `--checkpoint-dir` that is a file fails only at the first save, after an
    epoch of training has been spent and is then lost.
    """
    if checkpoint_dir is None or str(checkpoint_dir) == "":
        return None
    folder = Path(checkpoint_dir).expanduser()
    allowed = "a folder (created if missing) that this user can write"
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"checkpoint_dir has value {str(folder)!r}, which is a file; allowed: {allowed}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(f"checkpoint_dir has value {str(folder)!r}, which cannot be created "
                              f"({err.strerror or err}); allowed: {allowed}") from err
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CheckpointError(f"checkpoint_dir has value {str(folder)!r}, which is not writable; allowed: {allowed}")
    if folder.is_symlink():  # after mkdir: a link planted before it, or that mkdir(exist_ok) accepted
        raise CheckpointError(f"checkpoint_dir has value {str(folder)!r}, which is a symbolic link (to "
                              f"{os.readlink(folder)!r}); allowed: a real folder (rpevit never writes through a "
                              f"link: a link planted at a trial's folder would have checkpoints written where it "
                              f"points; on the command line, name the folder it points at)")
    path = folder / CHECKPOINT_NAME
    if path.is_symlink():  # a planted link would be read as this run's checkpoint
        raise CheckpointError(f"checkpoint {path} is a symbolic link (to {os.readlink(path)!r}); allowed: a checkpoint "
                              f"file or nothing at that path: remove the link")
    if path.exists() and not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a file; allowed: a checkpoint file or nothing at that path")
    remove_stale_temp(path)
    return path


def temp_path(path: Path) -> Path:
    """Where save() writes before its atomic rename: `checkpoint.tmp` beside `checkpoint.pt`."""
    return path.with_suffix(".tmp")


def remove_stale_temp(path: Path) -> None:
    """A kill during save() leaves its temp file behind: remove it (or a link planted under its
    name) when a run opens its checkpoint folder, before any save of this run."""
    tmp = temp_path(path)
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink(missing_ok=True)


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's contents, unpickled with weights_only=True (never runs code from the file)."""
    path = Path(path)
    if _plain_pickle(path):  # a pickle.dump, never torch.save's format: refused without unpickling it
        raise _refused(path, _pickle_with_globals(path), "a plain pickle, not torch's file format")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = _DISALLOWED_GLOBAL.search(str(err)) is not None  # torch named a global it would not import
        reason = _unpickling_reason(str(err))
        raise _refused(path, reason if refused else _pickle_with_globals(path), reason) from err
    except Exception as err:  # noqa: BLE001 - torch.load raises anything on a torn or foreign file
        reason = " ".join(str(err).split())[:300]
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint ({type(err).__name__}: {reason}); "
                              f"allowed: a checkpoint written by rpevit; delete the file to start afresh") from err
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        have = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {path} is not an rpevit train checkpoint (it holds {have}); "
                              f"allowed: a dict with keys {', '.join(REQUIRED_KEYS)}")
    return state


def _refused(path: Path, imports: str | None, why_corrupt: str) -> CheckpointError:
    """The refusal of a file torch's weights-only loader does not take: one that would import or call
    something (`imports`, what it names) could run code; anything else is corrupt or foreign."""
    if imports is None:  # random bytes, a torn or foreign file: nothing that could run
        return CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint (not a valid torch file: "
                               f"{why_corrupt}); allowed: a checkpoint written by rpevit; delete the file to start "
                               f"afresh")
    return CheckpointError(
        f"checkpoint {path} holds objects other than tensors and plain values ({imports}) and was not "
        f"loaded: unpickling it could run code from the file; allowed: a checkpoint written by rpevit "
        f"(tensors, numbers, strings, lists, dicts); delete the file to start the run afresh")


def _plain_pickle(path: Path) -> bool:
    """The file starts like a pickle of protocol 3 or later: what pickle.dump writes, never torch.save
    (a zip archive; its legacy format opens with protocol 2). torch.load would unpickle it with a
    protocol warning only to refuse it."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(2)
    except OSError:
        return False  # torch.load reports it
    return len(head) == 2 and head[0] == 0x80 and head[1] > 2


_DISALLOWED_GLOBAL = re.compile(r"unsupported GLOBAL|Unsupported global", re.I)  # torch's weights_only refusal
_PICKLE_GLOBAL_OPS = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"}
_PICKLE_SCAN_BYTES = 64 * 2**20


def _pickle_with_globals(path: Path) -> str | None:
    """What a file torch refused imports or calls, if it is a real pickle (a plain `pickle.dump` of
    objects), e.g. 'GLOBAL posix.system'; None for random bytes. Its opcodes are listed, never run."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_PICKLE_SCAN_BYTES)
    except OSError:
        return None
    if not (len(data) > 2 and data[0] == 0x80 and 2 <= data[1] <= pickle.HIGHEST_PROTOCOL):  # PROTO n
        return None
    strings: list[str] = []
    found = None
    try:
        for op, arg, _ in pickletools.genops(data):  # stops at STOP; raises on what no pickle holds
            if isinstance(arg, str):
                strings = [*strings[-1:], arg]
            if found is None and op.name in _PICKLE_GLOBAL_OPS:
                found = (f"GLOBAL {'.'.join(strings)}" if op.name == "STACK_GLOBAL" and len(strings) == 2
                         else f"{op.name} {arg}" if arg is not None else op.name)
    except Exception:  # noqa: BLE001 - not a whole pickle (random bytes, a torn file): nothing could run
        return None
    return found


def _unpickling_reason(text: str) -> str:
    """The part of torch's weights_only refusal that says what was refused (not its advice to
    retry with weights_only=False)."""
    for pattern in (r"unsupported GLOBAL \S+", r"Unsupported global: [^\n]+", r"WeightsUnpickler error:\s*([^\n]+)"):
        found = re.search(pattern, text)
        if found:
            return (found.group(1) if found.lastindex else found.group(0)).strip()
    return " ".join(text.split())[:120]


def stored_fingerprint(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """The fingerprint of a checkpoint; older checkpoints carry only their full `config`."""
    if isinstance(state.get("fingerprint"), dict):
        return state["fingerprint"]
    config = state.get("config")
    if isinstance(config, dict) and "epochs" in config:
        return {"version": 0, "epochs": config["epochs"],
                "fields": {k: v for k, v in config.items() if k not in RUNTIME_FIELDS and k != "epochs"}}
    raise CheckpointError(f"checkpoint {path} records no config fingerprint, so it cannot be matched to this "
                          f"run; allowed: a checkpoint written by rpevit; delete it to start afresh")


def check_matches(state: dict[str, Any], cfg: TrialConfig, path: Path, *, extend_epochs: bool = False) -> None:
    """Refuse to continue a checkpoint under a config that does not describe the run it holds.

    Fields added to TrialConfig after the checkpoint was written are compared with what the older code
    effectively ran (rpevit.config.recorded_values: a field's first default); both sides resolved
    (rpevit.config.resolve_values),
    so a checkpoint written under `batch_size: 0` continues under the recipe's value it ran with.
    """
    stored = stored_fingerprint(state, path)
    theirs = resolve_values(recorded_values(stored.get("fields", {})))  # placeholders compare as the values they ran with
    ours = resolve_values(cfg.to_dict())
    differ = []
    for name in run_fields():
        then, now = theirs[name], ours[name]
        if then != now:
            differ.append(f"field {name!r} has value {now!r} here but {then!r} in the checkpoint")
    stream = stored.get("random_stream")  # absent from checkpoints written before it was recorded
    if stream is not None and stream != random_stream(cfg):
        differ.append(f"field 'compile' has value {cfg.compile!r} here, which draws its randomness "
                      f"{random_stream(cfg)}, but the checkpoint's run drew it {stream} (compile "
                      f"{'graph' if stream == 'per-epoch' else 'on or off'})")
    if differ:
        raise CheckpointError(f"checkpoint {path} belongs to another run: {'; '.join(differ)}; allowed: the "
                              f"checkpoint's values, or another checkpoint_dir (delete the checkpoint to start afresh)")
    done, planned = int(state["epoch"]), int(stored["epochs"])
    if cfg.epochs < done:
        raise CheckpointError(f"checkpoint {path} has {done} epochs done but field 'epochs' has value {cfg.epochs}; "
                              f"allowed: epochs = {planned} (the checkpoint's run), or more than {done} with "
                              f"--extend-epochs")
    if cfg.epochs != planned and not (extend_epochs and cfg.epochs > planned):
        raise CheckpointError(f"checkpoint {path} is of a {planned}-epoch run but field 'epochs' has value "
                              f"{cfg.epochs}; allowed: epochs = {planned}, or more with --extend-epochs "
                              f"(continues under the longer run's lr schedule)")


def written_on(state: dict[str, Any]) -> str:
    """The device kind a checkpoint's random streams live on: a run on a GPU stores its CUDA generator
    (`rng['cuda']`, rpevit.tasks.generators.MemberRandom.state), a run on the CPU never does."""
    return "cuda" if isinstance(state.get("rng"), dict) and "cuda" in state["rng"] else "cpu"


def check_device(state: dict[str, Any], device_type: str, path: Path) -> None:
    """Refuse to continue on a CPU a checkpoint written on a GPU, or the other way round, before any work.

    A run's data order and augmentation come from a generator on its device; a CUDA generator's state
    (a seed and an offset) and a CPU one's (a Mersenne Twister) cannot stand for one another, so the
    run cannot go on as the same random stream (and `amp: auto` would change its precision too).
    Without this the trial failed after loading, in torch's words, on every retry."""
    written = written_on(state)
    if written != device_type:
        raise CheckpointError(f"checkpoint {path} was written on a {written} device, and this run is on {device_type}; "
                              f"allowed: continue it on a {written} device (field 'device' {written!r}, or 'auto' where "
                              f"one is), or delete the checkpoint to start the run afresh on this one: its data order "
                              f"and augmentation come from a generator on the device it trained on, which a "
                              f"{device_type} generator cannot continue")


@contextmanager
def claimed(folder: str | os.PathLike, *, wait_s: float | None = None) -> Iterator[None]:
    """This process's exclusive use of a checkpoint folder while the block runs, or CheckpointError naming
    the holder once `wait_s` (default CLAIM_WAIT_S) has passed.

    Why: a budget ladder's trunk writes a rung's checkpoint into the rung's folder (budget_ladder.
    write_branches) while the rung's own trial may be starting there: the rung could read no history and
    then load the branch (its first epochs never re-reported), or remove the trunk's temp file mid-write
    (the trunk failed) or rename a half-written one. A trial holds its folder for its whole run
    (rpevit.sweep.trainable, rpevit.cli); the trunk takes a rung's folder for one write, without waiting,
    and leaves a rung that is running to run on its own. An flock on `<folder>/.trial.lock`: the kernel
    drops it when the holder exits or is killed, so it is never stale (a second open of the file, even in
    the same process, is a second holder). Never through a link: the folder is opened with O_NOFOLLOW."""
    folder, wait_s = Path(folder), CLAIM_WAIT_S if wait_s is None else wait_s
    allowed = "a folder (created if missing) that this user can write"
    if folder.exists() and not folder.is_dir() and not folder.is_symlink():
        raise CheckpointError(f"checkpoint_dir has value {str(folder)!r}, which is a file; allowed: {allowed}")
    if not folder.is_symlink():  # a link (dangling or not) is refused by _open_folder, naming it
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CheckpointError(f"checkpoint_dir has value {str(folder)!r}, which cannot be created "
                                  f"({err.strerror or err}); allowed: {allowed}") from err
    try:
        folder_fd = _open_folder(folder)  # a link: CheckpointError naming it
    except OSError as err:
        raise CheckpointError(f"checkpoint_dir has value {str(folder)!r}, which cannot be opened "
                              f"({err.strerror or err}); allowed: {allowed}") from err
    try:
        fd = os.open(CLAIM_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder_fd)
    except OSError as err:
        raise CheckpointError(f"checkpoint folder {folder}: {CLAIM_NAME} cannot be opened ({err.strerror or err}); "
                              f"allowed: a regular file this user can write, or nothing there") from err
    finally:
        os.close(folder_fd)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if not held_elsewhere(err):  # the file system refused the lock: nobody to wait for
                    raise CheckpointError(flock_refused(folder / CLAIM_NAME, err)) from err
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                    raise CheckpointError(
                        f"checkpoint folder {folder} is in use by {holder} (waited {wait_s:g} s); allowed: one run "
                        f"at a time in a checkpoint folder: wait for it to end, or stop it") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the flock


def _open_folder(folder: Path) -> int:
    """A descriptor of `folder`, refused (CheckpointError) where `folder` itself is a symbolic link."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if folder.is_symlink():
            raise CheckpointError(f"checkpoint folder {folder} is a symbolic link (to {os.readlink(folder)!r}); "
                                  f"allowed: a real folder (rpevit never writes through a link): remove the link") from err
        raise


def open_for_resume(checkpoint_dir: str | os.PathLike | None, cfg: TrialConfig, *,
                    extend_epochs: bool = False) -> tuple[Path | None, dict[str, Any] | None]:
    """(checkpoint path or None, its checked state or None if there is none yet). Call before any work."""
    path = prepare_dir(checkpoint_dir)
    if path is None or not path.exists():
        return path, None
    state = load(path)
    check_matches(state, cfg, path, extend_epochs=extend_epochs)
    return path, state


def save(path: Path, payload: dict[str, Any]) -> None:
    """Atomic: a kill during the write leaves the previous checkpoint intact. Never through a symbolic
    link, at the file or at its folder: the folder is opened once with O_NOFOLLOW (a linked folder is
    refused, CheckpointError) and every step after that works relative to it (the temp file created
    afresh with O_EXCL | O_NOFOLLOW, os.replace, which swaps a link at `path` itself), so a link swapped
    in between prepare_dir's check and this write changes nothing. Durable: the data fsynced before the
    rename, the folder after it. Links above the folder are the
    user's (the roots a user names are resolved where they are read: rpevit.cli)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder_fd = _open_folder(path.parent)
    try:
        tmp = temp_path(path).name
        try:
            os.unlink(tmp, dir_fd=folder_fd)  # the entry itself, never what a link there points at
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=folder_fd)
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())  # durable before the rename (rpevit.durable)
        os.replace(tmp, path.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        fsync_fd(folder_fd)
    finally:
        os.close(folder_fd)
