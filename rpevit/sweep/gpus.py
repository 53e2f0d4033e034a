"""A trial's place on its node (`place_on_devices`: torch threads = its CPU share, its GPU), and
fractional-GPU trials spread over all GPUs of a node, instead of Ray's fill-GPU-0-first.

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
import socket
from pathlib import Path
from typing import Any

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
    if os.path.lexists(claims_file) and not claims_file.is_symlink() and not claims_file.is_file():
        # a folder or FIFO there once failed the trial with a traceback from deep in the writer (issue 59)
        raise RuntimeError(f"GPU claims file {claims_file} is not a regular file; allowed: a regular file or nothing "
                           f"there (remove it: it only records which GPU each running trial took)")
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


_claimed: dict[str, int | None] = {"gpu": None}  # the GPU this worker process claimed first


def place_on_devices(cpus: float, gpus: float) -> dict[str, Any]:
    """Threads = the CPU share; a fractional GPU is the least-loaded visible one, capped in memory.

    A reused worker keeps the GPU it claimed first (its CUDA context lives there). Returns where
    the trial ran, recorded in its summary row. Called in the trial's worker (rpevit.sweep.trainable).
    """
    import ray
    import torch

    torch.set_num_threads(max(1, int(cpus)))
    ctx = ray.get_runtime_context()
    ray_gpu_ids = [str(i) for i in ctx.get_accelerator_ids().get("GPU", [])]
    cuda_device = -1
    if gpus > 0 and torch.cuda.is_available():
        if gpus < 1:
            # Ray was told not to set CUDA_VISIBLE_DEVICES (runner): every GPU of the node is
            # visible, pick the least loaded and cap this process at its share of the memory.
            if _claimed["gpu"] is None:
                _claimed["gpu"] = claim_least_loaded_gpu(gpus, torch.cuda.device_count())
            cuda_device = _claimed["gpu"]
            torch.cuda.set_device(cuda_device)
            torch.cuda.set_per_process_memory_fraction(gpus, cuda_device)
        else:
            # whole GPUs are exclusive: use exactly the ones Ray assigned
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
            cuda_device = ids.index(ray_gpu_ids[0]) if ray_gpu_ids and ray_gpu_ids[0] in ids else 0
            torch.cuda.set_device(cuda_device)
            if torch.cuda.is_initialized():
                torch.cuda.set_per_process_memory_fraction(1.0, cuda_device)
    return {"node_id": ctx.get_node_id(), "hostname": socket.gethostname(), "pid": os.getpid(),
            "ray_gpu_ids": ",".join(ray_gpu_ids), "cuda_device": cuda_device,
            "torch_threads": torch.get_num_threads()}
