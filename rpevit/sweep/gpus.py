"""Spread fractional-GPU trials over all GPUs of a node, instead of Ray's fill-GPU-0-first.

Ray accounts fractional GPUs per node correctly (never more than the node's total), but it
packs them onto the lowest-numbered GPU: four 0.25-GPU trials on a 4-GPU node all share GPU 0.
The sweep therefore asks Ray not to set CUDA_VISIBLE_DEVICES for its workers (session.NOSET_ENV), and
each fractional trial claims the least-loaded visible GPU itself from a node-local claims file
(locked, and cleaned of dead processes, so a killed trial frees its share). The file lives in this
user's private 0700 temp folder (rpevit.sweep.session.private_temp_dir), never in a shared /tmp where
another user could plant a link; it is written through the no-follow atomic writer and read as
untrusted (a malformed entry is dropped, not trusted).
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from rpevit.sweep.session import private_temp_dir

CLAIMS_NAME = "gpu_claims.json"  # in the user's private temp folder (default_claims_file)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def default_claims_file() -> Path:
    return private_temp_dir().parent / CLAIMS_NAME


def read_claims(claims_file: Path) -> dict[str, list]:
    """{pid: [device, share]} from the claims file; entries that are not of that form are dropped."""
    try:
        raw = json.loads(claims_file.read_text()) if claims_file.is_file() and not claims_file.is_symlink() else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    out = {}
    for pid, claim in raw.items():
        if (isinstance(pid, str) and pid.isdigit() and isinstance(claim, list) and len(claim) == 2
                and isinstance(claim[0], int) and not isinstance(claim[0], bool) and claim[0] >= 0
                and isinstance(claim[1], (int, float)) and not isinstance(claim[1], bool) and 0 <= claim[1] <= 1):
            out[pid] = claim
    return out


def claim_least_loaded_gpu(fraction: float, num_devices: int, *, pid: int | None = None,
                           claims_file: Path | None = None) -> int:
    """Index of the visible GPU with the smallest claimed share; records (pid -> device, share).

    Ties go to the lowest index, so one trial per GPU before any GPU gets a second.
    """
    from rpevit.sweep.results import atomic_file

    if num_devices <= 0:
        raise ValueError(f"num_devices={num_devices}; need at least one GPU to claim")
    pid = os.getpid() if pid is None else pid
    claims_file = default_claims_file() if claims_file is None else claims_file
    claims_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(claims_file.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        claims = {p: c for p, c in read_claims(claims_file).items() if _alive(int(p)) and int(p) != pid}
        load = [0.0] * num_devices
        for device, share in claims.values():
            if device < num_devices:
                load[device] += share
        device = min(range(num_devices), key=lambda i: (load[i], i))
        claims[str(pid)] = [device, fraction]
        with atomic_file(claims_file) as handle:
            handle.write(json.dumps(claims).encode())
    return device
