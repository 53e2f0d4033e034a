"""The Tune function trainable: one trial = one registered task run on its share of the node.

Checkpoints (and a log.txt) live in a directory keyed by the trial's `trial_key` (results/<sweep>/
trials/<key>/), not in Tune's per-run trial folders, so a Tune retry (FailureConfig) and a `--resume`
after the driver was killed both continue from the last epoch of the same trial. The task writes
its checkpoint atomically after every epoch; its history holds every epoch row, which this
trainable re-reports on a resume so the driver's Parquet never misses an epoch (it dedupes).
Checkpoints are read with weights_only=True and only by the config that wrote them
(rpevit.checkpoint), so a planted or foreign checkpoint fails the trial with a message instead of
running code or being continued under another config.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from ray import tune

from rpevit import checkpoint, registry
from rpevit.checkpoint import CHECKPOINT_NAME  # the name every task writes in its checkpoint_dir
from rpevit.config import TrialConfig
from rpevit.sweep.gpus import claim_least_loaded_gpu


def run_trial(config: dict[str, Any]) -> None:
    """Tune entry point. config["t"]: {"cfg": TrialConfig dict, "trial_key", "label",
    "checkpoint_root", "cpus_per_trial", "gpus_per_trial"} (built by the runner)."""
    config = config["t"]
    key = config["trial_key"]
    registry.load_all()
    cfg = TrialConfig.from_dict(config["cfg"], source=f"trial {key}")
    placement = place_on_devices(config["cpus_per_trial"], config["gpus_per_trial"])
    ckpt_dir = Path(config["checkpoint_root"]) / key
    started_at = time.time()

    def report_epoch(row: dict, _checkpoint_dir: Path | None = None) -> None:
        tune.report({"row_kind": "epoch", "trial_key": key, "row": dict(row),
                     "epoch": row["epoch"], "val_acc": row.get("val_acc", float("nan"))})

    history = checkpointed_history(ckpt_dir, cfg)
    for row in history:  # epochs finished before a kill / retry
        report_epoch(row)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    with open(ckpt_dir / "log.txt", "a") as log_file:

        def log(message: str) -> None:
            print(message, flush=True)
            log_file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
            log_file.flush()

        log(f"trial {key} on {placement['hostname']} (node {placement['node_id'][:8]}, "
            f"GPU ids {placement['ray_gpu_ids'] or '-'}, {placement['torch_threads']} threads)")
        summary = registry.TASKS[cfg.task](cfg, checkpoint_dir=ckpt_dir, on_epoch=report_epoch, log=log)
    summary = {**summary, **placement, "trial_key": key, "resumed_from_epoch": len(history),
               "started_at": started_at, "finished_at": time.time()}
    tune.report({"row_kind": "summary", "trial_key": key, "row": summary,
                 "val_acc": summary.get("final_val_acc", float("nan"))})


def checkpointed_history(ckpt_dir: Path, cfg: TrialConfig) -> list[dict]:
    """Epoch rows stored in the trial's last checkpoint (empty for a fresh trial).

    Loaded safely and matched to cfg first: epochs of a foreign checkpoint must not reach the
    sweep's epochs.parquet before the task refuses that checkpoint.
    """
    path = ckpt_dir / CHECKPOINT_NAME
    if not path.exists():
        return []
    state = checkpoint.load(path)
    checkpoint.check_matches(state, cfg, path)
    return [dict(row) for row in state["history"]]


def place_on_devices(cpus: float, gpus: float) -> dict[str, Any]:
    """Threads = the CPU share; a fractional GPU is the least-loaded visible one, capped in memory.

    Returns where the trial ran, recorded in its summary row.
    """
    import ray

    torch.set_num_threads(max(1, int(cpus)))
    ctx = ray.get_runtime_context()
    ray_gpu_ids = [str(i) for i in ctx.get_accelerator_ids().get("GPU", [])]
    cuda_device = -1
    if gpus > 0 and torch.cuda.is_available():
        if gpus < 1:
            # Ray was told not to set CUDA_VISIBLE_DEVICES (runner): every GPU of the node is
            # visible, pick the least loaded and cap this process at its share of the memory.
            cuda_device = claim_least_loaded_gpu(gpus, torch.cuda.device_count())
            torch.cuda.set_device(cuda_device)
            torch.cuda.set_per_process_memory_fraction(gpus, cuda_device)
        else:
            # whole GPUs are exclusive: use exactly the ones Ray assigned
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
            cuda_device = ids.index(ray_gpu_ids[0]) if ray_gpu_ids and ray_gpu_ids[0] in ids else 0
            torch.cuda.set_device(cuda_device)
    return {"node_id": ctx.get_node_id(), "hostname": socket.gethostname(), "pid": os.getpid(),
            "ray_gpu_ids": ",".join(ray_gpu_ids), "cuda_device": cuda_device,
            "torch_threads": torch.get_num_threads()}
