"""Spread fractional-GPU trials over all GPUs of a node, instead of Ray's fill-GPU-0-first.

Ray accounts fractional GPUs per node correctly (never more than the node's total), but it
packs them onto the lowest-numbered GPU: four 0.25-GPU trials on a 4-GPU node all share GPU 0.
The sweep therefore asks Ray not to set CUDA_VISIBLE_DEVICES for its workers, and each
fractional trial claims the least-loaded visible GPU itself from a node-local claims file
(locked, and cleaned of dead processes, so a killed trial frees its share).
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path

CLAIMS_FILE = Path(tempfile.gettempdir()) / "rpevit_gpu_claims.json"
NOSET_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # Ray's switch, read by its workers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_least_loaded_gpu(fraction: float, num_devices: int, *, pid: int | None = None,
                           claims_file: Path = CLAIMS_FILE) -> int:
    """Index of the visible GPU with the smallest claimed share; records (pid -> device, share).

    Ties go to the lowest index, so one trial per GPU before any GPU gets a second.
    """
    if num_devices <= 0:
        raise ValueError(f"num_devices={num_devices}; need at least one GPU to claim")
    pid = os.getpid() if pid is None else pid
    claims_file.parent.mkdir(parents=True, exist_ok=True)
    with open(claims_file.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        claims = json.loads(claims_file.read_text()) if claims_file.exists() else {}
        claims = {p: c for p, c in claims.items() if _alive(int(p)) and int(p) != pid}
        load = [0.0] * num_devices
        for device, share in claims.values():
            if device < num_devices:
                load[device] += share
        device = min(range(num_devices), key=lambda i: (load[i], i))
        claims[str(pid)] = [device, fraction]
        tmp = claims_file.with_suffix(f".{pid}.tmp")
        tmp.write_text(json.dumps(claims))
        os.replace(tmp, claims_file)
    return device
