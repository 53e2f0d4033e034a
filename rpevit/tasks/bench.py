"""The `bench` task: cost of one variant at a given token count N (image_size / patch_size) and batch.

Medians after warm-up, synchronised on GPU, on random images (no data is loaded): forward,
forward+backward (backward = the difference), a full training step, inference in eval mode,
peak memory, FLOPs and parameters. Token-scaling and per-variant cost studies are sweeps of it.

In a sweep a bench trial has the node to itself, and a space's `timing:` can ask for repeated
runs (interleaved across variants); `combine_repeats` turns the runs of one variant into its row
(rpevit/sweep/space.py, rpevit/sweep/trainable.py).
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from rpevit import metrics
from rpevit.config import TrialConfig
from rpevit.data import DATASET_SPECS
from rpevit.flops import count_flops
from rpevit.models import build_model
from rpevit.registry import TaskMetrics, register_task
from rpevit.tasks.steppers import make_optimizer
from rpevit.tasks.train import resolve_device
from rpevit.training import autocast_context


METRICS = TaskMetrics(
    headline={"tokens": int, "train_step_ms": float},
    other={"forward_ms": float, "backward_ms": float, "forward_backward_ms": float, "infer_ms": float,
           "infer_ms_per_sample": float, "images_per_s": float, "flops": int, "flops_unsupported": str,
           "params": int, "peak_mem_mb": float, "peak_mem_kind": str, "step_mem_mb": float, "step_mem_kind": str,
           "train_ms_per_image": float, "out_of_memory": bool, "train_step_ms_min": float,
           "train_step_ms_max": float, "timing_repeats": int, "timing_interleaved": bool, "process_warm": bool},
)


@register_task("bench", METRICS, timing=True)
def time_variant(cfg: TrialConfig, *, checkpoint_dir: str | Path | None = None,
                 on_epoch: Callable | None = None, log: Callable[[str], None] | None = print) -> dict:
    """Time one variant; `checkpoint_dir`/`on_epoch` are accepted for the common task signature."""
    cfg = cfg.resolved()  # what runs: the recipe's values where the config leaves them to it
    device = resolve_device(cfg.device)
    spec = DATASET_SPECS[cfg.dataset]
    model = build_model(cfg, spec.channels, spec.num_classes).to(device)
    optimizer = make_optimizer(model, cfg)
    g = torch.Generator().manual_seed(cfg.seed)
    side = cfg.resolved_image_size
    images = torch.randn(cfg.bench_batch, spec.channels, side, side, generator=g).to(device)
    labels = torch.randint(0, spec.num_classes, (cfg.bench_batch,), generator=g).to(device)

    def loss() -> torch.Tensor:
        with autocast_context(cfg, device):
            return F.cross_entropy(model(images).float(), labels)

    def forward() -> None:
        loss()

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        loss().backward()

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()

    def infer() -> None:
        with torch.no_grad(), autocast_context(cfg, device):
            model(images)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timing = {"warmup": cfg.bench_warmup, "iters": cfg.bench_iters}
    tokens = cfg.grid[0] * cfg.grid[1]
    try:
        model.train()
        fwd = metrics.median_time(forward, device, **timing)
        fwd_bwd = metrics.median_time(forward_backward, device, **timing)
        step_mem, step_mem_kind = metrics.step_peak_memory_mb(train_step, device)  # also a warm-up step
        step = metrics.median_time(train_step, device, warmup=max(0, cfg.bench_warmup - 1), iters=cfg.bench_iters)
        model.eval()
        inf = metrics.median_time(infer, device, **timing)
    except Exception as err:  # noqa: BLE001 - only out-of-memory is an outcome; the rest re-raise
        if not is_out_of_memory(err):
            raise
        del model, optimizer, images, labels
        metrics.release_cached_memory(device)
        if log:
            log(f"bench {cfg.attention}+{cfg.pe} N={tokens} batch={cfg.bench_batch}: out of memory "
                f"({str(err).splitlines()[0][:200]})")
        return {**cfg.resolved().to_dict(), "tokens": tokens, "out_of_memory": True, **timing_columns(*[math.nan] * 4,
                cfg.bench_batch), "step_mem_mb": math.nan, "step_mem_kind": "out_of_memory",
                "peak_mem_mb": math.nan, "peak_mem_kind": "out_of_memory", "flops": -1,
                "flops_unsupported": "", "params": -1, **metrics.environment(device)}
    peak_mb, peak_kind = metrics.peak_memory_mb(device)
    flops, unsupported = count_flops(model, images[:2])
    if log:
        log(f"bench {cfg.attention}+{cfg.pe} N={tokens} batch={cfg.bench_batch}: fwd {1e3 * fwd:.2f} ms, "
            f"fwd+bwd {1e3 * fwd_bwd:.2f} ms, step {1e3 * step:.2f} ms, infer {1e3 * inf:.2f} ms, "
            f"step memory {step_mem:.1f} MiB")
    return {
        **cfg.resolved().to_dict(),
        "tokens": tokens,
        "out_of_memory": False,
        **timing_columns(1e3 * fwd, 1e3 * fwd_bwd, 1e3 * step, 1e3 * inf, cfg.bench_batch),
        "step_mem_mb": step_mem,
        "step_mem_kind": step_mem_kind,
        "flops": flops,
        "flops_unsupported": ",".join(sorted(unsupported)),
        "params": metrics.count_parameters(model),
        "peak_mem_mb": peak_mb,
        "peak_mem_kind": peak_kind,
        **metrics.environment(device),
    }


OUT_OF_MEMORY_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether err is an allocation failure (CUDA's OutOfMemoryError, the CPU allocator's RuntimeError
    or Python's MemoryError): a recorded outcome of a size, not a defect of the variant."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in OUT_OF_MEMORY_MESSAGES)


MEASURED = ("forward_ms", "forward_backward_ms", "train_step_ms", "infer_ms")  # the rest derive from these


def timing_columns(forward_ms: float, forward_backward_ms: float, train_step_ms: float, infer_ms: float,
                   batch: int) -> dict[str, float]:
    """The time columns of a row from the four measured medians (backward = the difference; per-image
    figures divide by the batch, which a token-scaling study shrinks as N grows)."""
    return {
        "forward_ms": forward_ms,
        "backward_ms": max(forward_backward_ms - forward_ms, 0.0),
        "forward_backward_ms": forward_backward_ms,
        "train_step_ms": train_step_ms,
        "infer_ms": infer_ms,
        "infer_ms_per_sample": infer_ms / batch,
        "train_ms_per_image": train_step_ms / batch,
        "images_per_s": 1e3 * batch / train_step_ms,
    }


def combine_repeats(rows: list[dict]) -> dict:
    """One row from repeated runs of one variant: the median of each measured time (derived columns
    recomputed from the medians, so images_per_s = batch / train_step time still holds), the peak
    memory of the worst run, the spread of train_step_ms, and the number of runs. A variant out of
    memory in any run is out of memory (that run's row, with the number of runs)."""
    if not rows:
        raise ValueError("combine_repeats needs at least one run")
    failed = [r for r in rows if r.get("out_of_memory")]
    if failed:
        return {**failed[-1], "timing_repeats": len(rows)}
    medians = [statistics.median(r[name] for r in rows) for name in MEASURED]
    steps = [r["train_step_ms"] for r in rows]
    worst = {name: max(r[name] for r in rows) for name in ("peak_mem_mb", "step_mem_mb") if name in rows[-1]}
    return {**rows[-1], **timing_columns(*medians, rows[-1]["bench_batch"]), **worst,
            "train_step_ms_min": min(steps), "train_step_ms_max": max(steps), "timing_repeats": len(rows)}
