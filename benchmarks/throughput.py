"""Training throughput of one device, measured as a user runs it: solo eager, solo compiled, fused seed
groups compiled (k members stacked, rpevit/tasks/train_group.py), and packed processes of compiled fused
groups (what `python sweep.py --space search_spaces/all12.yaml` runs: 4 groups per GPU); utilisation.

    python benchmarks/throughput.py --models gpu                    # the lease's run (benchmarks/gpu_lease.sh)
    python benchmarks/throughput.py --models tiny --fused 3 --packed 2 --steps 2 --json out.json  # a CPU check
    python benchmarks/throughput.py --models gpu --fused 5 --packed 0 --profile-steps 5   # where the time goes
    python benchmarks/throughput.py --models gpu --fused 5 --compile cudagraphs --modes fused packed mps eager \
        --profile-steps 5 --profile-modes fused      # the short lease's: its question first (gpu_lease.sh bench)

Every mode runs the real training step of the train task (tasks/train.py's solo_step, or train_group's
StackedStep) on synthetic data kept on the device, with the recipe's augmentation, drop path and
random-feature redraws, after untimed warm-up steps (compilation happens there), the device synchronised
around each timed sample. Each mode is `--samples` samples (>= 3) of `--steps` steps; its figure is the
median sample, and the spread (min-max) is printed beside it. Side by side in one run:

- images/s: training images per second over all members (k x batch x steps / seconds) and processes;
- FLOPs as the peak counts them: fvcore counts a multiply-add as ONE FLOP (rpevit/flops.py), a
  datasheet's peak counts it as TWO, so a training image costs 2 x 3 x fvcore's forward count
  (forward + backward = 3 forwards); utilisation = that x images/s / peak (GPU: the dense bf16
  tensor-core peak by name; CPU: this run's own float32 matmul rate, 2 FLOPs per multiply-add too);
- ratios to the run's first mode with a rate (solo eager unless --modes puts another first); a compiled
  mode whose compilation failed and fell back to eager says so (`compile_fallback`) and is not a
  compiled figure;
- projected hours of the CIFAR-10 half of all12.yaml (12 variants x 3 seeds x 200 epochs of 45,000
  images) at the packed rate, each variant scaled by its committed bench row's step time relative to
  softmax+ape (results/gpu_h100/bench_cifar10_gpu on a GPU, bench_cifar10_cpu on the CPU).

The models: gpu = all12.yaml's CIFAR-10 model (dim 192, depth 9, 12 heads, patch 4, batch 128, bf16 on a
GPU); cpu = cifar10_cpu.yaml's (dim 64, depth 4, 4 heads); tiny = a CPU check of this script (dim 32,
depth 2, batch 16).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch.profiler import record_function

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rpevit import registry  # noqa: E402
from rpevit.analysis.common import md_text, read_text_file, write_text_file  # noqa: E402
from rpevit.config import TrialConfig  # noqa: E402
from rpevit.data import synthetic_splits  # noqa: E402
from rpevit.flops import count_flops  # noqa: E402
from rpevit.metrics import device_name, synchronize  # noqa: E402
from rpevit.models import build_model  # noqa: E402
from rpevit.tasks.schedule import warmup_cosine  # noqa: E402
from rpevit.tasks.steppers import make_optimizer, solo_step  # noqa: E402
from rpevit.tasks.steppers import StackedStep  # noqa: E402
from rpevit.tasks.train import step_inputs  # noqa: E402
from rpevit import training  # noqa: E402
from rpevit.training import default_dtype, forward_loss_fn, path_mask_dtype  # noqa: E402
from step_profile import format_profile, profile_steps  # noqa: E402

MODELS = {
    "gpu": {"dataset": "cifar10", "patch_size": 4, "dim": 192, "depth": 9, "heads": 12, "mlp_ratio": 2.0,
            "drop_path": 0.1, "batch_size": 128, "num_features": 64, "redraw_interval": 100},
    "cpu": {"dataset": "cifar10", "patch_size": 4, "dim": 64, "depth": 4, "heads": 4, "mlp_ratio": 2.0,
            "drop_path": 0.1, "batch_size": 128, "num_features": 64, "redraw_interval": 100},
    "tiny": {"dataset": "cifar10", "patch_size": 4, "dim": 32, "depth": 2, "heads": 2, "mlp_ratio": 2.0,
             "drop_path": 0.1, "batch_size": 16, "num_features": 16, "redraw_interval": 100},
}
FLOPS_PER_MULTIPLY_ADD = 2  # a datasheet peak counts a multiply-add as 2 FLOPs; fvcore counts it as 1
# dense bf16 tensor-core peaks (datasheets), the most specific name first: a PCIe or NVL H100 is not the SXM part
# (a substring match gave "NVIDIA H100 PCIe" the SXM 989), and "A10" must not match an A100 or an A10G
GPU_BF16_PEAK_TFLOPS = ((r"H100 PCIe", 756.0), (r"H100 NVL", 835.0), (r"H200 NVL", 835.0), (r"GH200", 989.0),
                        (r"H100", 989.0), (r"H200", 989.0), (r"A100", 312.0), (r"L40S", 362.0), (r"A10", 125.0))


def gpu_peak_tflops(name: str) -> tuple[float, str] | None:
    """(dense bf16 TFLOP/s, the model it was matched as) of a GPU by its name, None where none is on file."""
    for model, tflops in GPU_BF16_PEAK_TFLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", name):
            return tflops, model
    return None
STUDY_IMAGES = 12 * 3 * 200 * 45_000  # all12.yaml's CIFAR-10 half: variants x seeds x epochs x train images
BENCH_ROWS = {"cuda": ROOT / "results/gpu_h100/bench_cifar10_gpu/trials.parquet",
              "cpu": ROOT / "results/bench_cifar10_cpu/trials.parquet"}
ALL12 = [(a, p) for a in ("softmax", "favor", "relu") for p in ("ape", "luo_rpe", "circulant_string", "rope")]


def measure(model_cfg: dict, k: int, compile_mode: str, device: torch.device, steps: int, warmup: int,
            samples: int = 3, attention: str = "softmax", pe: str = "ape", barrier: tuple[str, int] | None = None,
            profile: int = 0) -> dict:
    """Training images/s of k members (k = 1: the solo step; k > 1: the fused stacked step): `samples`
    timed samples of `steps` steps after `warmup` steps; the median sample's rate (and all of them).
    `barrier` (folder, n): after the warm-up, wait until n processes have warmed up (packed processes
    time together, each after its own compilation). `profile` > 0: that many more steps, untimed,
    under torch.profiler (benchmarks/step_profile.py), returned as "profile"."""
    cfg = TrialConfig.from_dict({**model_cfg, "attention": attention, "pe": pe, "compile": compile_mode,
                                 "device": device.type}).resolved()  # grad_clip below: the recipe's value
    batch = cfg.resolved_batch_size
    with default_dtype(cfg):
        data = synthetic_splits(cfg.dataset, batch * (warmup + samples * steps + profile), device)
        models = [build_model(cfg.replace(seed=s), cfg.spec.channels, cfg.spec.num_classes).to(device)
                  for s in range(k)]
        mask_generators = [torch.Generator(device=device).manual_seed(s) for s in range(k)]
        data_generators = [torch.Generator(device=device).manual_seed(s) for s in range(k)]
        schedule = warmup_cosine(10 * (warmup + samples * steps), 1)
        mask_dtype = path_mask_dtype(cfg, device)
        if compile_mode == "graph":  # the whole step in one graph (rpevit/tasks/whole_step.py), any k
            return measure_whole(cfg, models, data, schedule, device, steps, warmup, samples, barrier, profile)
        if k == 1:
            model = models[0]
            optimizer = make_optimizer(model, cfg)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
            guard = forward_loss_fn(cfg, device, data.normalize)

            def step(images, labels, masks):
                return solo_step(model, optimizer, scheduler, guard, images[0], labels[0], masks[0], cfg.grad_clip)
        else:
            stepper = StackedStep(models, cfg, device, data.normalize, schedule)
            guard, step = stepper.forward_loss, stepper.step
        for m in models:
            m.train()
        order = torch.arange(len(data.x_train), device=device)

        def run(first: int, count: int) -> None:
            for t in range(first, first + count):
                idx = order[t * batch:(t + 1) * batch]
                with record_function("step_inputs"):
                    images, labels, masks = step_inputs(data, tuple(idx for _ in range(k)), data_generators,
                                                        "crop_flip", models, mask_generators, mask_dtype)
                with record_function("train_step"):
                    step(images, labels, masks)

        t0 = time.perf_counter()
        run(0, warmup)
        synchronize(device)
        warmup_s = time.perf_counter() - t0  # compilation happens here: what a short run pays once
        together = wait_for_others(*barrier) if barrier else True
        rates = []
        for sample in range(samples):
            t0 = time.perf_counter()
            run(warmup + sample * steps, steps)
            synchronize(device)
            rates.append(k * batch * steps / (time.perf_counter() - t0))
        profiled = profile_steps(run, warmup + samples * steps, profile, device, synchronize) if profile else None
        flops, _ = count_flops(models[0], data.normalize(data.x_train[:2]))
    median = sorted(rates)[len(rates) // 2]
    row = {"members": k, "compile": compile_mode, "images_per_s": median, "images_per_s_samples": rates,
           "step_ms": 1e3 * k * batch / median, "warmup_s": warmup_s, "forward_flops_per_image_fvcore": flops,
           "compile_fallback": guard.fallback, "timed_together": together}
    return {**row, "profile": profiled} if profiled else row


def measure_whole(cfg: TrialConfig, models: list, data, schedule, device: torch.device, steps: int, warmup: int,
                  samples: int, barrier: tuple[str, int] | None, profile: int) -> dict:
    """measure() for `compile: graph`: the train task's WholeStep on the same synthetic data, its epoch
    tables drawn once (every timed step is a full batch of them), each step what run_epoch does per step:
    the host redraw schedule, the replay, LambdaLR's step. Timed as measure() times the other modes."""
    from rpevit.tasks.generators import member_random
    from rpevit.tasks.whole_step import WholeStep, advance_redraws, draw_epoch

    k, batch = len(models), cfg.resolved_batch_size
    stepper = WholeStep(models, cfg, device, data.normalize, schedule)
    total = warmup + samples * steps + profile
    stepper.prepare(data, 10 * total)
    stepper.train()
    s = stepper.state
    draws = draw_epoch([member_random(seed, device, alone=False) for seed in range(k)], len(data.x_train),
                       "crop_flip", data.spec.crop_padding, stepper.keeps, stepper.mask_dtype, device)
    s["order"].copy_(draws.order), s["masks"].copy_(draws.masks)
    for name, table in draws.augment.items():
        s[f"aug_{name}"].copy_(table)

    def run(first: int, count: int) -> None:
        for _ in range(count):
            with record_function("step_inputs"):
                for model in models:
                    advance_redraws(model)
            with record_function("train_step"):
                stepper.graph.step(lambda fn: fn(s))
                stepper.scheduler_step()

    t0 = time.perf_counter()
    run(0, warmup)
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    together = wait_for_others(*barrier) if barrier else True
    rates = []
    for _ in range(samples):
        t0 = time.perf_counter()
        run(0, steps)
        synchronize(device)
        rates.append(k * batch * steps / (time.perf_counter() - t0))
    profiled = profile_steps(run, 0, profile, device, synchronize) if profile else None
    flops, _ = count_flops(models[0], data.normalize(data.x_train[:2]))
    from torch._dynamo.utils import counters

    median = sorted(rates)[len(rates) // 2]
    row = {"members": k, "compile": "graph", "images_per_s": median, "images_per_s_samples": rates,
           "step_ms": 1e3 * k * batch / median, "warmup_s": warmup_s, "forward_flops_per_image_fvcore": flops,
           "compile_fallback": stepper.graph.fallback, "timed_together": together,
           "cudagraph_skips": int(sum(counters["inductor"].get(key, 0) for key in counters["inductor"]
                                      if "cudagraph_skip" in key))}
    return {**row, "profile": profiled} if profiled else row


BARRIER_ABORT = "abort"  # written into the barrier folder by the parent when a packed process has failed


def wait_for_others(folder: str, count: int, timeout_s: float = 600.0) -> bool:
    """Mark this process warm in `folder`, then wait until `count` processes are: True if they all were; False
    at the timeout, or at once when the parent wrote BARRIER_ABORT (a sibling failed: it will never be warm, and
    waiting for it would spend the rest of a lease's benchmark)."""
    Path(folder, str(os.getpid())).touch()
    deadline = time.time() + timeout_s
    while len([p for p in Path(folder).iterdir() if p.name != BARRIER_ABORT]) < count:
        if time.time() > deadline or Path(folder, BARRIER_ABORT).exists():
            return False
        time.sleep(0.2)
    return True


def run_packed_children(cmd: list[str], processes: int, env: dict[str, str], barrier: str) -> tuple[list, list]:
    """`processes` copies of `cmd`, their stdout collected; the moment one exits with an error, BARRIER_ABORT
    tells the others to stop waiting for it. Returns (children, their stdout lines)."""
    children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) for _ in range(processes)]
    outputs: list[list[str]] = [[] for _ in children]

    def read(i: int) -> None:
        outputs[i] = children[i].communicate()[0].strip().splitlines()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(processes)]
    for reader in readers:
        reader.start()
    while any(reader.is_alive() for reader in readers):
        if any(child.poll() not in (None, 0) for child in children):
            Path(barrier, BARRIER_ABORT).touch()
        time.sleep(0.2)
    return children, outputs


@contextmanager
def mps_daemon() -> Iterator[dict[str, str]]:
    """NVIDIA's Multi-Process Service for the packed processes, in a private pipe folder; yields the
    environment its clients need. Without it, processes on one GPU share it by time-slicing: kernels of
    two processes never run side by side (the H100 and H200 leases: four packed processes add little
    over one). Raises, with the reason, where the machine has no MPS or it does not start."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise RuntimeError("nvidia-cuda-mps-control is not on this machine's PATH: no MPS here")
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{folder}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{folder}/log"}
        for sub in ("pipe", "log"):
            Path(folder, sub).mkdir()
        subprocess.run([control, "-d"], env=env, check=True, timeout=30)
        try:
            yield env
        finally:
            subprocess.run([control], input="quit\n", text=True, env=env, timeout=30, check=False)


def packed(model_key: str, processes: int, k: int, compile_mode: str, device: torch.device, steps: int,
           warmup: int, samples: int, env: dict[str, str] | None = None) -> dict:
    """P processes at once, each its own interpreter running a fused group of k (compiled): what all12.yaml
    runs on one GPU (`gpus_per_trial: 0.25`, `fuse: seeds`). Every process compiles and warms up first,
    then all time their samples together; the rate is the sum of the processes' medians. `env`: the
    processes' environment (mps_daemon's, to run them under MPS)."""
    threads = max(1, (os.cpu_count() or 1) // processes) if device.type == "cpu" else 4
    with tempfile.TemporaryDirectory() as barrier:
        cmd = [sys.executable, __file__, "--worker", model_key, "--device", device.type, "--steps", str(steps),
               "--warmup", str(warmup), "--samples", str(samples), "--barrier", barrier, "--threads", str(threads),
               "--fused", str(k), "--compile", compile_mode, "--packed", str(processes),
               "--backend", training.COMPILE_BACKEND]
        children, outputs = run_packed_children(cmd, processes, env, barrier)
        failed = [i for i, (child, out) in enumerate(zip(children, outputs)) if child.returncode or not out]
        if failed:
            raise RuntimeError(f"packed process(es) {failed} of {processes} failed (exit "
                               f"{[children[i].returncode for i in failed]}); their stderr is above")
        rows = [json.loads(out[-1]) for out in outputs]
    return {"members": k * processes, "compile": compile_mode, "packed_processes": processes,
            "images_per_s": sum(r["images_per_s"] for r in rows),
            "images_per_s_samples": [sum(x) for x in zip(*(r["images_per_s_samples"] for r in rows))],
            "step_ms": max(r["step_ms"] for r in rows),
            "forward_flops_per_image_fvcore": rows[0]["forward_flops_per_image_fvcore"],
            "compile_fallback": "; ".join(sorted({r["compile_fallback"] for r in rows if r["compile_fallback"]})),
            "timed_together": all(r["timed_together"] for r in rows)}


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    registry.load_all()
    row = measure(MODELS[args.worker], args.fused[0], args.compile, torch.device(args.device), args.steps,
                  args.warmup, args.samples, barrier=(args.barrier, args.packed))
    print(json.dumps(row), flush=True)


def peak_flops(device: torch.device) -> tuple[float, str]:
    """(FLOP/s as a datasheet counts them, what it is): the GPU's dense bf16 peak by name, or this CPU's
    measured float32 matmul rate (2 FLOPs per multiply-add)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found = gpu_peak_tflops(name)
        if found is not None:
            tflops, model = found
            return tflops * 1e12, f"{name} dense bf16 peak {tflops:g} TFLOP/s ({model} datasheet)"
        return math.nan, f"{name}: no peak on file"
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t0 = time.perf_counter()
    for _ in range(5):
        a @ b
    rate = FLOPS_PER_MULTIPLY_ADD * 5 * 2048 ** 3 / (time.perf_counter() - t0)
    return rate, (f"this CPU's float32 2048^3 matmul rate, {rate / 1e9:.1f} GFLOP/s (a multiply-add = 2 FLOPs), "
                  f"{torch.get_num_threads()} threads")


def projected_hours(rate_softmax_ape: float, device: torch.device) -> tuple[float, str]:
    """Hours for all12's CIFAR-10 half at this softmax+ape rate, each variant scaled by its committed
    bench row's train step time relative to softmax+ape on this kind of device."""
    path = BENCH_ROWS["cuda" if device.type == "cuda" else "cpu"]
    try:
        import pandas as pd

        rows = pd.read_parquet(path)
        rows = rows[(rows["status"] == "ok") & (rows["qk_norm"] == "none") if "qk_norm" in rows else rows["status"] == "ok"]
        step = {(r.attention, r.pe): r.train_step_ms for r in rows.itertuples()
                if r.pe != "sparse_cayley_string"}
        ratios = [step[v] / step[("softmax", "ape")] for v in ALL12]
        source = f"variant ratios from {path.relative_to(ROOT)} (mean {sum(ratios) / len(ratios):.2f}x softmax+ape)"
    except (OSError, KeyError, ImportError, ValueError) as err:
        ratios, source = [1.0] * len(ALL12), f"no bench rows ({type(err).__name__}): every variant at softmax+ape's rate"
    images_per_variant = STUDY_IMAGES / len(ALL12)
    return sum(images_per_variant * r for r in ratios) / rate_softmax_ape / 3600, source


MODE_KINDS = ("eager", "compiled", "fused", "whole", "packed", "mps")  # --modes: each kind of mode, in run order
DEFAULT_MODES = ("eager", "compiled", "fused", "packed")  # and "mps" after "packed" with --mps


def plan_modes(key: str, args: argparse.Namespace, device: torch.device) -> list[tuple[str, object]]:
    """(name, thunk) of every mode, in the order of args.modes (kinds of MODE_KINDS): a run cut short keeps
    the modes that came first, so the short lease puts first the ones its question needs. Only the kinds in
    args.profile_modes are profiled (a profile costs the steps it profiles and its tracing)."""
    model, steps, warmup, samples, mode = MODELS[key], args.steps, args.warmup, args.samples, args.compile

    def prof(kind: str) -> int:
        return args.profile_steps if kind in args.profile_modes else 0

    k = min(args.fused)
    by_kind = {
        "eager": [("solo eager", lambda: measure(model, 1, "off", device, steps, warmup, samples,
                                                 profile=prof("eager")))],
        "compiled": [(f"solo compiled ({mode})", lambda: measure(model, 1, mode, device, steps, warmup, samples,
                                                                 profile=prof("compiled")))],
        "fused": [(f"fused k={f} + compiled ({mode})", lambda f=f: measure(model, f, mode, device, steps, warmup,
                                                                           samples, profile=prof("fused")))
                  for f in args.fused if f > 1],
        "whole": [(f"fused k={f} + whole step in one graph (graph)", lambda f=f: measure(
            model, f, "graph", device, steps, warmup, samples, profile=prof("whole"))) for f in args.fused],
        "packed": [(f"{args.packed} packed processes, fused k={k} + compiled",
                    lambda: packed(key, args.packed, k, mode, device, steps, warmup, samples))] if args.packed > 1 else [],
        "mps": [(f"{args.packed} packed processes under MPS, fused k={k} + compiled", lambda: packed_mps(
            key, args.packed, k, mode, device, steps, warmup, samples))] if args.packed > 1 else [],
    }
    return [entry for kind in args.modes for entry in by_kind[kind]]


def mode_order(modes: list[str] | None, mps: bool) -> list[str]:
    """--modes as given (each kind once), else the default order, with "mps" after "packed" under --mps."""
    if modes:
        return list(dict.fromkeys(modes))
    return [*DEFAULT_MODES, "mps"] if mps else list(DEFAULT_MODES)


def packed_mps(model_key: str, processes: int, k: int, compile_mode: str, device: torch.device, steps: int,
               warmup: int, samples: int) -> dict:
    """The packed mode again with the processes under MPS (mps_daemon), timed right after it without."""
    with mps_daemon() as env:
        return {**packed(model_key, processes, k, compile_mode, device, steps, warmup, samples, env=env), "mps": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpu"], choices=sorted(MODELS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fused", nargs="+", type=int, default=[3, 5],
                        help="fused group sizes k (compiled); 1 alone: no fused mode, and --variants times each "
                             "variant solo compiled")
    parser.add_argument("--packed", type=int, default=4, help="processes of compiled fused groups at once (0: skip)")
    parser.add_argument("--compile", default="on", choices=("on", "cudagraphs"), help="the compiled modes' setting")
    parser.add_argument("--mps", action="store_true",
                        help="also time the packed processes under NVIDIA MPS (a CUDA device; after the plain packed mode)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed sample")
    parser.add_argument("--samples", type=int, default=3, help="timed samples per mode (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", action="store_true",
                        help="also time each of all12's 12 variants solo eager and fused (largest k) + compiled")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile's backend (aot_eager: a quick CPU check of this script, not a timing)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after each in-process mode's samples, profile this many more steps (where the time goes)")
    parser.add_argument("--modes", nargs="+", default=None, choices=MODE_KINDS,
                        help="which kinds of mode run, in this order (default: eager compiled fused packed, and mps "
                             "with --mps); the JSON is written after each, so a run cut short keeps the first ones")
    parser.add_argument("--profile-modes", nargs="+", default=["eager", "compiled", "fused", "whole"],
                        choices=("eager", "compiled", "fused", "whole"),
                        help="with --profile-steps: the in-process kinds that are profiled (default: all of them)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--table", nargs="+", default=None, metavar="JSON",
                        help="print the per-variant rows of these --variants files as one Markdown table, and stop")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads of this process (0: torch's default); a CPU sweep trial runs with "
                             "cpus_per_trial threads, so --threads 1 times what a 1-cpu trial runs")
    args = parser.parse_args()
    if min(args.fused) < 1:
        parser.error(f"--fused has value {min(args.fused)}; allowed: group sizes of 1 or more")
    if args.samples < 3 and not args.worker:
        parser.error(f"--samples has value {args.samples}; allowed: 3 or more (a median of fewer is no median)")
    args.modes = mode_order(args.modes, args.mps)
    if "mps" in args.modes and (args.device != "cuda" or args.packed < 2):
        parser.error(f"--mps (or --modes mps) with --device {args.device} and --packed {args.packed}; allowed: "
                     f"--device cuda and --packed 2 or more (MPS shares one CUDA device between processes)")
    if args.table:
        print(variants_table(args.table))
        return
    training.COMPILE_BACKEND = args.backend
    if args.worker:
        worker(args)
        return
    registry.load_all()
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    peak, peak_text = peak_flops(device)
    print(f"device: {device_name(device)}; torch {torch.__version__}; {torch.get_num_threads()} threads; "
          f"peak: {peak_text}; {args.samples} samples of {args.steps} steps per mode (median; min-max)", flush=True)
    results = {"device": device_name(device), "torch": torch.__version__, "python": platform.python_version(),
               "compile_backend": args.backend,
               "threads": torch.get_num_threads(), "peak_flops": peak, "peak": peak_text,
               "flops_per_multiply_add": FLOPS_PER_MULTIPLY_ADD, "models": {},
               "conditions": {"start": run_conditions(device)}}
    for key in args.models:
        rows = []
        print(f"\nmodel {key}: {MODELS[key]}", flush=True)
        for name, run in plan_modes(key, args, device):
            try:
                row = {"mode": name, **run()}
            except Exception as err:  # noqa: BLE001 - a mode that fails is reported, the others still run
                row = {"mode": name, "error": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"}
            if "images_per_s" in row:
                row["flops_per_image"] = FLOPS_PER_MULTIPLY_ADD * 3 * row["forward_flops_per_image_fvcore"]
                row["tflops"] = row["flops_per_image"] * row["images_per_s"] / 1e12
                row["utilisation"] = row["flops_per_image"] * row["images_per_s"] / peak
            rows.append(row)
            print(format_row(row, next(r for r in rows if "images_per_s" in r or r is row)), flush=True)
            if row.get("profile"):
                print(format_profile(row["profile"]), flush=True)
            results["models"][key] = {"config": MODELS[key], "rows": rows}
            write_json(args.json, results)  # after every mode: a run cut short keeps what it measured
        timed = [r for r in rows if "images_per_s" in r]
        best = max(timed, key=lambda r: r["images_per_s"]) if timed else None
        entry = {"config": MODELS[key], "rows": rows}
        if best is not None:
            hours, source = projected_hours(best["images_per_s"], device)
            print(f"projected all12 CIFAR-10 half (12 variants x 3 seeds x 200 epochs) at the best mode "
                  f"({best['mode']}, {best['images_per_s']:.0f} images/s): {hours:.2f} h on this device; {source}")
            entry.update(best=best["mode"], projected_all12_cifar10_hours=hours, projection_source=source)
        results["models"][key] = entry
        if args.variants:
            entry["variants"] = time_variants(key, max(args.fused), args.compile, device, args.steps, args.warmup,
                                              args.samples)
    results["conditions"]["end"] = run_conditions(device)
    write_json(args.json, results)


def run_conditions(device: torch.device) -> dict:
    """What else ran beside the benchmark, recorded at its start and end, so a table can say alone or contended
    from the file instead of by hand: the 1-minute load average against the CPUs it has, and on a GPU the
    compute processes of other PIDs (nvidia-smi; None where it cannot say)."""
    out = {"load_avg_1min": os.getloadavg()[0], "cpus": os.cpu_count(), "other_gpu_processes": None}
    if device.type == "cuda" and shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20, check=True).stdout.split()
            out["other_gpu_processes"] = sum(pid.isdigit() and int(pid) != os.getpid() for pid in listed)
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (gpu_lease.sh's cap on the benchmark) unwinds like an exception: the MPS daemon a mode
    started is told to quit (mps_daemon's finally), where the default action would leave it running
    beside the next call's processes. What was measured is already in the JSON (written after each mode)."""
    raise SystemExit(128 + signum)


def write_json(path: str | None, results: dict) -> None:
    """The results as JSON at `path` (--json), through write_text_file: atomic (a kill between modes leaves the
    last whole file) and never through a link (one there stops with one line; what it points at is untouched)."""
    if path:
        write_text_file(Path(path), json.dumps(results, indent=1))


def time_variants(key: str, k: int, compile_mode: str, device: torch.device, steps: int, warmup: int,
                  samples: int) -> list[dict]:
    """Each all12 variant solo eager and fused k + compiled (k = 1: solo compiled), side by side, with each
    one's warm-up time (compilation: what a short run, such as a ladder's cool-down branch, pays once); the
    projected hours of the CIFAR-10 half from these rates (each variant at its own compiled rate)."""
    rows, hours = [], 0.0
    compiled_name = f"solo compiled {compile_mode}" if k == 1 else f"fused k={k} + compiled {compile_mode}"
    print(f"  per variant (solo eager vs {compiled_name}; warm-up seconds in brackets):", flush=True)
    for attention, pe in ALL12:
        row = {"variant": f"{attention}+{pe}"}
        try:
            solo = measure(MODELS[key], 1, "off", device, steps, warmup, samples, attention, pe)
            fused = measure(MODELS[key], k, compile_mode, device, steps, warmup, samples, attention, pe)
            row.update(solo_images_per_s=solo["images_per_s"], fused_images_per_s=fused["images_per_s"],
                       members=k, speedup=fused["images_per_s"] / solo["images_per_s"],
                       solo_warmup_s=solo["warmup_s"], fused_warmup_s=fused["warmup_s"],
                       compile_fallback=fused["compile_fallback"])
            hours += STUDY_IMAGES / len(ALL12) / fused["images_per_s"] / 3600
            fell_back = f"  COMPILE FELL BACK TO EAGER: {row['compile_fallback']}" if row["compile_fallback"] else ""
            print(f"    {row['variant']:<26} {row['solo_images_per_s']:>9.0f} [{row['solo_warmup_s']:.0f} s] -> "
                  f"{row['fused_images_per_s']:>9.0f} [{row['fused_warmup_s']:.0f} s] images/s "
                  f"({row['speedup']:.2f}x){fell_back}", flush=True)
        except Exception as err:  # noqa: BLE001 - reported, the other variants still run
            row["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            hours = math.nan
            print(f"    {row['variant']:<26} failed: {row['error']}", flush=True)
        rows.append(row)
    print(f"  projected all12 CIFAR-10 half at each variant's compiled rate: {hours:.2f} h on this device", flush=True)
    return rows + [{"projected_all12_cifar10_hours": hours}]


TABLE_ALLOWED = "the JSON file `throughput.py --variants --json` writes"
RATE_FIELDS = ("solo_images_per_s", "fused_images_per_s", "speedup")


def _cell(value: object) -> str:
    """Text read from a file (or a file's name) as one inert Markdown table cell: md_text, and `|` escaped."""
    return md_text(value).replace("|", "\\|")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def variant_rows(path: str, model: str) -> list[dict]:
    """The `--variants` rows of one `--json` file, read as untrusted (read_text_file: a regular file only, no
    link followed, no FIFO waited on, bounded); SystemExit naming the file, the field, its value and what is
    allowed where the file is not what this script writes: `members` a whole number of 1 or more, the rates
    numbers. A value shown in the message is repr'd and cut short, never printed raw."""
    text = read_text_file(Path(path), TABLE_ALLOWED)
    if text is None:
        raise SystemExit(f"error: {path}: no such file; allowed: {TABLE_ALLOWED}")
    try:
        run = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise SystemExit(f"error: {path} is not JSON ({' '.join(str(err).split())[:200]}); allowed: "
                         f"{TABLE_ALLOWED}") from None
    rows = run
    for key in ("models", model, "variants"):
        rows = rows.get(key) if isinstance(rows, dict) else None
    if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
        raise SystemExit(f"error: {path}: field 'models.{model}.variants' has value {repr(rows)[:80]}; allowed: a "
                         f"list of the per-variant rows of {TABLE_ALLOWED}")
    for i, row in enumerate(rows):
        members = row.get("members", 1)
        if not (isinstance(members, int) and not isinstance(members, bool) and members >= 1):
            raise SystemExit(f"error: {path}: field 'models.{model}.variants[{i}].members' has value "
                             f"{repr(members)[:80]}; allowed: a whole number of 1 or more (the fused group size k)")
        for field in RATE_FIELDS if "speedup" in row else ():
            if not _is_number(row.get(field)):
                raise SystemExit(f"error: {path}: field 'models.{model}.variants[{i}].{field}' has value "
                                 f"{repr(row.get(field))[:80]}; allowed: a number (images/s, or their ratio)")
    return rows


def variants_table(paths: list[str], model: str = "cpu") -> str:
    """Markdown: per all12 variant, each file's solo eager and compiled images/s and their ratio (the
    files of results/compile_cpu_1thread/README.md), so that no figure of it is typed by hand. The files are
    untrusted (variant_rows checks them); every text from them, and each file's name, is escaped."""
    runs = [(_cell(Path(path).stem), variant_rows(path, model)) for path in paths]
    head = ["variant"]
    for name, rows in runs:
        k = next((r["members"] for r in rows if "members" in r), 0)  # an int >= 1 (variant_rows)
        compiled = "solo compiled" if k == 1 else f"fused k={k} + compiled"
        head += [f"{name}: eager img/s", f"{name}: {compiled} img/s", f"{name}: ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for attention, pe in ALL12:
        cells = [f"{attention}+{pe}"]
        for _, rows in runs:
            row = next((r for r in rows if r.get("variant") == cells[0]), {})
            if "speedup" in row:
                cells += [f"{row['solo_images_per_s']:.0f}", f"{row['fused_images_per_s']:.0f}", f"{row['speedup']:.2f}x"]
            else:
                cells += ["-", "-", _cell(row.get("error", "not run"))]  # from a file: escaped
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_row(row: dict, base: dict) -> str:
    """One mode's line; its ratio is to `base`, the run's first mode with a rate (named: the short lease's
    first mode is a fused group, not solo eager)."""
    if "error" in row:
        return f"  {row['mode']:<42} failed: {row['error']}"
    ratio = row["images_per_s"] / base["images_per_s"] if "images_per_s" in base else math.nan
    spread = f"({min(row['images_per_s_samples']):.0f}-{max(row['images_per_s_samples']):.0f})"
    fallback = f"  COMPILE FELL BACK TO EAGER: {row['compile_fallback']}" if row.get("compile_fallback") else ""
    return (f"  {row['mode']:<42} {row['images_per_s']:>10.0f} images/s {spread:>17}  {row['step_ms']:>8.1f} ms/step  "
            f"{row['tflops']:>8.3f} TFLOP/s  {100 * row['utilisation']:>6.2f}% of peak  {ratio:>5.2f}x {base['mode']}"
            f"{fallback}")


if __name__ == "__main__":
    main()
