"""Where a training step's time goes, from torch.profiler, in a few numbers that come back from a lease.

Used by benchmarks/throughput.py (`--profile-steps N`): after a mode's timed samples, N more steps of
the same, already compiled, step run under the profiler. Why: the first GPU run (NVIDIA H200,
results/gpu_h200/lease_2026-11-26) measured a compiled solo step far below issue 40's goal at a
fraction of a percent of the peak, which means the GPU waits on something (launches from Python, host
syncs, eager work around the compiled region); a timing alone cannot say which, a trace can, and a
trace is too large to bring back. So this keeps per step:

- wall ms (the device synchronised around the block; the profiler's own overhead is in it) and, on a
  GPU, the device's busy ms (the sum of the device-side events' time: kernels, copies, sets) and busy
  fraction = busy / wall: near 1, the step is GPU-bound; far below 1, the host is the limit. Only
  device-side events are summed: a CPU event's self device time is the time of the device work it
  launched, which the device-side events hold already (summing every event but the launch calls, as
  the two leases of 2026-11-26 did, counted such work twice and read over 100% of wall);
- kernel launches (cudaLaunchKernel and its variants; cudaGraphLaunch counts one graph) and host
  syncs (cuda*Synchronize, blocking cudaMemcpy; the one closing the block counts 1/N) per step;
- aten ops per step (nested calls included): on a CPU, where there are no launches, the same measure
  of eager work;
- the CPU time per step of the named regions: `step_inputs` (data, augmentation, masks), `train_step`
  (the step), the optimizer, and the compiled region's forward and backward;
- the top ops by self CPU time and by self device time.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")
# Disjoint regions, each by its events' names: the benchmark's own labels, torch.optim's, and the
# compiled autograd function's forward and backward (exact names: "CompiledFunction" is a prefix of
# "CompiledFunctionBackward", and "Torch-Compiled Region" wraps the former, so neither is matched).
REGIONS: dict[str, Callable[[str], bool]] = {
    "step_inputs": lambda key: key == "step_inputs",
    "train_step": lambda key: key == "train_step",
    "optimizer": lambda key: key.startswith(("Optimizer.step#", "Optimizer.zero_grad#")),
    "compiled forward": lambda key: key == "CompiledFunction",
    "compiled backward": lambda key: key == "CompiledFunctionBackward",
}
TOP = 10


def device_busy_us(table) -> float:
    """The device's busy time in a key_averages table: the self time of its device-side events only."""
    return sum(_device_us(e) for e in table if getattr(e, "device_type", None) == DeviceType.CUDA)


def _device_us(event) -> float:
    """Self time on the accelerator of a key_averages entry (device_* in torch >= 2.4, cuda_* before)."""
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)) or 0.0)


def profile_steps(run: Callable[[int, int], None], first: int, count: int, device: torch.device,
                  synchronize: Callable[[torch.device], None]) -> dict:
    """Profile run(first, count) (count steps) and reduce it to per-step figures (see the module)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        run(first, count)
        synchronize(device)
        wall_ms = 1e3 * (time.perf_counter() - t0) / count
    table = prof.key_averages()
    per_step = lambda x: x / count  # noqa: E731

    def matching(chosen: Callable[[str], bool]) -> list:
        return [e for e in table if chosen(e.key)]

    busy_ms = per_step(device_busy_us(table) / 1e3) if device.type == "cuda" else None
    regions = {name: round(per_step(sum(e.cpu_time_total for e in matching(chosen)) / 1e3), 3)
               for name, chosen in REGIONS.items() if matching(chosen)}
    top_cpu = sorted(table, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP]
    result = {
        "steps": count, "wall_ms_per_step": round(wall_ms, 3),
        "launches_per_step": per_step(sum(e.count for e in table if e.key in LAUNCHES)),
        "syncs_per_step": per_step(sum(e.count for e in table if e.key in SYNCS)),
        "aten_ops_per_step": per_step(sum(e.count for e in table if e.key.startswith("aten::"))),
        "region_cpu_ms_per_step": regions,
        "top_self_cpu": [{"op": e.key[:80], "calls_per_step": per_step(e.count),
                          "ms_per_step": round(per_step(e.self_cpu_time_total) / 1e3, 3)} for e in top_cpu],
    }
    if busy_ms is not None:
        top_device = sorted((e for e in table if _device_us(e) > 0), key=_device_us, reverse=True)[:TOP]
        result.update(device_busy_ms_per_step=round(busy_ms, 3), device_busy_fraction=round(busy_ms / wall_ms, 4),
                      device_busy_from="device-side events",
                      top_self_device=[{"op": e.key[:80], "calls_per_step": per_step(e.count),
                                        "ms_per_step": round(per_step(_device_us(e)) / 1e3, 3)} for e in top_device])
    return result


def format_profile(p: dict) -> str:
    """Two lines: the step's totals, then where the CPU time goes."""
    busy = (f", device busy {p['device_busy_ms_per_step']:.2f} ms ({100 * p['device_busy_fraction']:.0f}% of wall)"
            if "device_busy_ms_per_step" in p else "")
    regions = ", ".join(f"{k} {v:.2f}" for k, v in p["region_cpu_ms_per_step"].items())
    top = ", ".join(f"{t['op']} {t['ms_per_step']:.2f}" for t in p["top_self_cpu"][:4])
    return (f"    profile ({p['steps']} steps): {p['wall_ms_per_step']:.2f} ms/step under the profiler{busy}; "
            f"{p['launches_per_step']:.0f} launches, {p['syncs_per_step']:.0f} syncs, "
            f"{p['aten_ops_per_step']:.0f} aten ops per step\n"
            f"    CPU ms/step by region: {regions or '-'}; top self CPU: {top}")
