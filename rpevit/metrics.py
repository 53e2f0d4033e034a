"""Metrics of one trial: classification quality, information criteria, cost, and where it ran.

Every number in a summary row comes from here, so the formulas are tested once (against
scikit-learn and hand computations in tests/test_metrics.py).
"""
from __future__ import annotations

import functools
import math
import platform
import resource
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import Tensor, nn


def confusion_matrix(y_true: Tensor, y_pred: Tensor, num_classes: int) -> Tensor:
    """(C, C) counts; rows true class, columns predicted class."""
    idx = y_true.long() * num_classes + y_pred.long()
    return torch.bincount(idx, minlength=num_classes**2).reshape(num_classes, num_classes)


def classification_metrics(logits: Tensor, y_true: Tensor) -> dict[str, float]:
    """Top-1 accuracy, macro precision/recall/F1 (sklearn's zero_division=0), log-likelihood.

    The log-likelihood is sum_i log p(y_i | x_i) under the model's softmax, in nats.
    """
    num_classes = logits.shape[-1]
    logits = logits.double()
    y_pred = logits.argmax(dim=-1)
    cm = confusion_matrix(y_true, y_pred, num_classes).double()
    tp = cm.diag()
    predicted, actual = cm.sum(dim=0), cm.sum(dim=1)
    precision = torch.where(predicted > 0, tp / predicted.clamp_min(1), torch.zeros_like(tp))
    recall = torch.where(actual > 0, tp / actual.clamp_min(1), torch.zeros_like(tp))
    denom = precision + recall
    f1 = torch.where(denom > 0, 2 * precision * recall / denom.clamp_min(1e-300), torch.zeros_like(tp))
    # sklearn's macro average runs over the labels present in y_true or y_pred
    present = (predicted + actual) > 0
    log_probs = torch.log_softmax(logits, dim=-1)
    return {
        "test_acc": (y_pred == y_true).double().mean().item(),
        "precision": precision[present].mean().item(),
        "recall": recall[present].mean().item(),
        "f1": f1[present].mean().item(),
        "log_likelihood": log_probs.gather(1, y_true.long()[:, None]).sum().item(),
    }


def information_criteria(log_likelihood: float, params: int, n: int) -> dict[str, float]:
    """AIC = 2k - 2 LL and BIC = k ln n - 2 LL, with k trainable parameters and n test samples."""
    return {"aic": 2 * params - 2 * log_likelihood, "bic": params * math.log(n) - 2 * log_likelihood}


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], device: torch.device, *, warmup: int, iters: int) -> float:
    """Median wall seconds of fn() after warm-up, synchronised on GPU before and after each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(peak MiB, what it measures): CUDA allocator peak on GPU, else the process's max RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_max_rss"


def step_peak_memory_mb(fn: Callable[[], object], device: torch.device) -> tuple[float, str]:
    """(MiB, what it measures): the peak memory of one fn() call above the memory held when it starts,
    i.e. its working set (activations, gradients, temporaries), without the process's baseline.

    CUDA: the allocator's peak above `memory_allocated()` at the start. CPU on Linux: the process's
    resident-set high-water mark, reset through /proc/self/clear_refs after freed memory is handed
    back (`malloc_trim`), minus the resident set at the start. Elsewhere: NaN, kind "unavailable".
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20, "cuda_step_peak_allocated"
    status = Path("/proc/self/status")
    try:
        _trim_heap()
        before = _status_kib(status, "VmRSS")
    except (OSError, ValueError):
        before = None
    if before is None or not reset_resident_peak():
        fn()
        return math.nan, "unavailable"
    fn()
    return max(0.0, (_status_kib(status, "VmHWM") - before) / 1024), "rss_step_peak"


def reset_resident_peak() -> bool:
    """Reset the process's resident-set high-water mark (VmHWM) to its current size through
    /proc/self/clear_refs (Linux >= 4.0); False where that is not possible (the peak then stays the
    process's lifetime peak)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _status_kib(status: Path, field: str) -> float:
    """A memory field of /proc/<pid>/status in KiB (ValueError when absent)."""
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    raise ValueError(f"{status} has no {field} line")


def _trim_heap() -> None:
    """Collect cycles and hand glibc's freed heap back to the OS, so the resident set measures live memory."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the resident set may then include freed heap
        pass


def release_cached_memory(device: torch.device) -> None:
    """After an out-of-memory: collect the dropped tensors and hand the allocator's cache back."""
    import gc
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_name(device: torch.device) -> str:
    """What ran the trial, for every row and figure: a GPU's name, or for a CPU its architecture, model,
    the widest vector unit torch dispatches to and the threads, e.g. 'cpu:x86_64 AMD EPYC 9B45 (AVX2)
    x1 threads'. The model and the vector unit say which machine timed a row (an AVX-512 Xeon and an
    AVX2-only Zen 5 take different times per epoch), which 'cpu:x86_64' alone did not."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    arch = platform.processor() or platform.machine()
    model = cpu_model(Path("/proc/cpuinfo"))
    capability = torch.backends.cpu.get_cpu_capability()
    return " ".join(part for part in (f"cpu:{arch}", model, f"({capability})" if capability else "",
                                      f"x{torch.get_num_threads()} threads") if part)


def cpu_model(cpuinfo: Path) -> str:
    """The CPU's model name from a Linux cpuinfo file ('model name' of its first processor, whitespace
    collapsed), '' where there is none (another OS, or an architecture whose cpuinfo names no model):
    platform.processor() on Linux is only the architecture."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return ""


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the rpevit checkout, with '+dirty' when the code that ran is not that commit's:
    uncommitted changes to tracked files, or an untracked file this process imported (a one-file
    variant dropped into rpevit/attention/, a module of one's own beside sweep.py)."""
    root = Path(__file__).resolve().parent.parent
    loaded = [Path(f) for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)]
    return git_state(root, loaded)


def git_state(root: Path, loaded: Iterable[Path]) -> str:
    """'<sha>', '<sha>+dirty' (see git_commit) or 'unknown' (not a git checkout, or no git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              check=True).stdout

    try:
        sha = git("rev-parse", "HEAD").strip()
        changed = git("status", "--porcelain", "--untracked-files=no").strip()
        top = Path(git("rev-parse", "--show-toplevel").strip())
        untracked = {(top / name).resolve() for name in git("ls-files", "--others", "--exclude-standard", "--full-name",
                                                             "-z", ":/").split("\0") if name}
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    used = untracked & {p.resolve() for p in loaded}
    return sha + ("+dirty" if changed or used else "")


def environment(device: torch.device) -> dict[str, str]:
    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        "ray_version": version("ray"),
        "rpevit_version": version("rpevit"),
        "git_commit": git_commit(),
        "python_version": platform.python_version(),
    }
