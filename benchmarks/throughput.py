"""Training throughput of one device: solo eager, solo compiled, packed processes, fused seed groups
(k members stacked, rpevit/tasks/train_group.py), fused + compiled; utilisation; projected hours.

    .venv/bin/python benchmarks/throughput.py                       # both protocol models, this device
    .venv/bin/python benchmarks/throughput.py --models cpu --fused 3 --steps 5 --json out.json

Every mode runs the real training step of the train task (tasks/train.py's solo_step, or
train_group's StackedStep) on data kept on the device with the recipe's augmentation, drop path
and random-feature redraws, after untimed warm-up steps (compilation happens there), with the
device synchronised around the timed steps. Measured side by side in one run:

- images/s: training images per second over all members (k x batch x steps / seconds);
- utilisation: fvcore forward FLOPs per image x 3 (forward + backward) x images/s, against the
  device's peak (GPU: dense bf16 tensor-core peak; CPU: this run's own float32 matmul rate, printed).
  fvcore counts a multiply-add as one FLOP, as the project does everywhere (rpevit/flops.py);
- ratios to solo eager;
- projected hours of the CIFAR-10 half of all12.yaml (12 variants x 3 seeds x 200 epochs of
  45,000 images) at the best mode's rate, each variant scaled by its committed bench row's step
  time relative to softmax+ape (results/gpu_h100/bench_cifar10_gpu on a GPU, bench_cifar10_cpu on
  the CPU); "packed" runs P solo processes at once (`--packed`), each a separate interpreter.

The protocol models: gpu = all12.yaml's CIFAR-10 model (dim 192, depth 9, 12 heads, patch 4,
batch 128, bf16 on a GPU); cpu = cifar10_cpu.yaml's (dim 64, depth 4, 4 heads, batch 128).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rpevit import registry  # noqa: E402
from rpevit.config import TrialConfig  # noqa: E402
from rpevit.data import DATASET_SPECS, Splits  # noqa: E402
from rpevit.flops import count_flops  # noqa: E402
from rpevit.metrics import device_name, synchronize  # noqa: E402
from rpevit.models import build_model  # noqa: E402
from rpevit.tasks.train import make_optimizer, solo_step, warmup_cosine  # noqa: E402
from rpevit.tasks.train_group import StackedStep, step_inputs  # noqa: E402
from rpevit.training import default_dtype, forward_loss_fn, path_mask_dtype  # noqa: E402

MODELS = {
    "gpu": {"dataset": "cifar10", "patch_size": 4, "dim": 192, "depth": 9, "heads": 12, "mlp_ratio": 2.0,
            "drop_path": 0.1, "batch_size": 128, "num_features": 64, "redraw_interval": 100},
    "cpu": {"dataset": "cifar10", "patch_size": 4, "dim": 64, "depth": 4, "heads": 4, "mlp_ratio": 2.0,
            "drop_path": 0.1, "batch_size": 128, "num_features": 64, "redraw_interval": 100},
}
GPU_BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}  # dense
STUDY_IMAGES = 12 * 3 * 200 * 45_000  # all12.yaml's CIFAR-10 half: variants x seeds x epochs x train images
BENCH_ROWS = {"cuda": ROOT / "results/gpu_h100/bench_cifar10_gpu/trials.parquet",
              "cpu": ROOT / "results/bench_cifar10_cpu/trials.parquet"}
ALL12 = [(a, p) for a in ("softmax", "favor", "relu") for p in ("ape", "luo_rpe", "circulant_string", "rope")]


def synthetic_splits(n: int, device: torch.device, seed: int = 0) -> Splits:
    """CIFAR-shaped uint8 images and labels on the device (throughput does not depend on the pixels)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    mean = torch.full((1, 3, 1, 1), 0.5, device=device)
    return Splits(spec=DATASET_SPECS["cifar10"], x_train=x, y_train=y, x_val=x[:0], y_val=y[:0], x_test=x[:0],
                  y_test=y[:0], mean=mean, std=mean)


def measure(model_cfg: dict, k: int, compile_mode: str, device: torch.device, steps: int, warmup: int,
            attention: str = "softmax", pe: str = "ape") -> dict:
    """Training images/s of k members (k = 1: the solo step; k > 1: the fused stacked step)."""
    cfg = TrialConfig.from_dict({**model_cfg, "attention": attention, "pe": pe, "compile": compile_mode,
                                 "device": device.type})
    batch = cfg.resolved_batch_size
    with default_dtype(cfg):
        data = synthetic_splits(batch * (steps + warmup), device)
        models = [build_model(cfg.replace(seed=s), 3, 10).to(device) for s in range(k)]
        mask_generators = [torch.Generator(device=device).manual_seed(s) for s in range(k)]
        data_generators = [torch.Generator(device=device).manual_seed(s) for s in range(k)]
        schedule = warmup_cosine(10 * (steps + warmup), 1)
        mask_dtype = path_mask_dtype(cfg, device)
        if k == 1:
            model = models[0]
            optimizer = make_optimizer(model, cfg)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
            forward_loss = forward_loss_fn(cfg, device, data.normalize)

            def step(images, labels, masks):
                return solo_step(model, optimizer, scheduler, forward_loss, images[0], labels[0], masks[0],
                                 cfg.grad_clip)
        else:
            stepper = StackedStep(models, cfg, device, data.normalize, schedule)
            step = stepper.step
        for m in models:
            m.train()
        order = torch.arange(len(data.x_train), device=device)

        def run(first: int, count: int) -> None:
            for t in range(first, first + count):
                idx = order[t * batch:(t + 1) * batch]
                images, labels, masks = step_inputs(data, tuple(idx for _ in range(k)), data_generators,
                                                    "crop_flip", models, mask_generators, mask_dtype)
                step(images, labels, masks)

        run(0, warmup)
        synchronize(device)
        t0 = time.perf_counter()
        run(warmup, steps)
        synchronize(device)
        seconds = time.perf_counter() - t0
        flops, _ = count_flops(models[0], data.normalize(data.x_train[:2]))
    return {"members": k, "compile": compile_mode, "images_per_s": k * batch * steps / seconds,
            "step_ms": 1e3 * seconds / steps, "forward_flops_per_image": flops}


def packed(model_key: str, processes: int, device: torch.device, steps: int, warmup: int) -> dict:
    """P solo eager processes at once, each its own interpreter (what `gpus_per_trial: 1/P` runs)."""
    threads = max(1, (os.cpu_count() or 1) // processes) if device.type == "cpu" else 4
    start_at = time.time() + 20.0 + 5.0 * processes  # every child has imported torch by then
    cmd = [sys.executable, __file__, "--worker", model_key, "--device", device.type, "--steps", str(steps),
           "--warmup", str(warmup), "--start-at", str(start_at), "--threads", str(threads)]
    children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    rows = [json.loads(child.communicate()[0].strip().splitlines()[-1]) for child in children]
    return {"members": processes, "compile": "off", "images_per_s": sum(r["images_per_s"] for r in rows),
            "step_ms": max(r["step_ms"] for r in rows), "forward_flops_per_image": rows[0]["forward_flops_per_image"],
            "packed_processes": processes}


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    registry.load_all()
    measure(MODELS[args.worker], 1, "off", device, 1, 1)  # imports, first kernels: before the common start
    time.sleep(max(0.0, args.start_at - time.time()))
    print(json.dumps(measure(MODELS[args.worker], 1, "off", device, args.steps, args.warmup)), flush=True)


def peak_flops(device: torch.device) -> tuple[float, str]:
    """(FLOP/s, what it is): the GPU's dense bf16 peak by name, or this CPU's measured float32 matmul rate."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, tflops in GPU_BF16_PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12, f"{name} dense bf16 peak {tflops:g} TFLOP/s (datasheet)"
        return math.nan, f"{name}: no peak on file"
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t0 = time.perf_counter()
    for _ in range(5):
        a @ b
    rate = 5 * 2048 ** 3 / (time.perf_counter() - t0)  # multiply-adds per second, fvcore's FLOP
    return rate, f"this CPU's float32 2048^3 matmul rate, {rate / 1e9:.1f} GFLOP/s (multiply-add = 1), {torch.get_num_threads()} threads"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpu", "cpu"], choices=sorted(MODELS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fused", nargs="+", type=int, default=[3, 6, 12])
    parser.add_argument("--packed", type=int, default=4, help="solo processes run at once (0: skip)")
    parser.add_argument("--compile", default="on", choices=("on", "cudagraphs"), help="the compiled modes' setting")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--variants", action="store_true",
                        help="also time each of all12's 12 variants solo eager and fused (largest k) + compiled: "
                             "their speed-ups, and the projection from their own rates")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    registry.load_all()
    device = torch.device(args.device)
    peak, peak_text = peak_flops(device)
    print(f"device: {device_name(device)}; torch {torch.__version__}; {torch.get_num_threads()} threads; "
          f"peak: {peak_text}", flush=True)
    results = {"device": device_name(device), "torch": torch.__version__, "python": platform.python_version(),
               "threads": torch.get_num_threads(), "peak_flops": peak, "peak": peak_text, "models": {}}
    biggest = max(args.fused)
    for key in args.models:
        steps, warmup = (args.steps, args.warmup)
        plan = [("solo eager", lambda: measure(MODELS[key], 1, "off", device, steps, warmup)),
                (f"solo compiled ({args.compile})", lambda: measure(MODELS[key], 1, args.compile, device, steps, warmup))]
        if args.packed > 1:
            plan.append((f"{args.packed} packed processes", lambda: packed(key, args.packed, device, steps, warmup)))
        plan += [(f"fused k={k}", lambda k=k: measure(MODELS[key], k, "off", device, steps, warmup)) for k in args.fused]
        plan.append((f"fused k={biggest} + compiled ({args.compile})",
                     lambda: measure(MODELS[key], biggest, args.compile, device, steps, warmup)))
        rows = []
        print(f"\nmodel {key}: {MODELS[key]}", flush=True)
        for name, run in plan:
            try:
                row = {"mode": name, **run()}
            except Exception as err:  # noqa: BLE001 - a mode that fails is reported, the others still run
                row = {"mode": name, "error": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"}
            if "images_per_s" in row:
                row["tflops"] = 3 * row["forward_flops_per_image"] * row["images_per_s"] / 1e12
                row["utilisation"] = 3 * row["forward_flops_per_image"] * row["images_per_s"] / peak
            rows.append(row)
            print(format_row(row, rows[0]), flush=True)
        best = max((r for r in rows if "images_per_s" in r), key=lambda r: r["images_per_s"])
        hours, source = projected_hours(best["images_per_s"], device)
        print(f"projected all12 CIFAR-10 half (12 variants x 3 seeds x 200 epochs) at the best mode "
              f"({best['mode']}, {best['images_per_s']:.0f} images/s): {hours:.2f} h on this device; {source}")
        results["models"][key] = {"config": MODELS[key], "rows": rows, "best": best["mode"],
                                  "projected_all12_cifar10_hours": hours, "projection_source": source}
        if args.variants:
            results["models"][key]["variants"] = time_variants(key, biggest, args.compile, device, steps, warmup)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def time_variants(key: str, k: int, compile_mode: str, device: torch.device, steps: int, warmup: int) -> list[dict]:
    """Each all12 variant solo eager and fused k + compiled, side by side; the projected hours of the
    CIFAR-10 half from these rates (each variant at its own fused rate)."""
    rows, hours = [], 0.0
    print(f"  per variant (solo eager vs fused k={k} + compiled {compile_mode}):", flush=True)
    for attention, pe in ALL12:
        row = {"variant": f"{attention}+{pe}"}
        try:
            solo = measure(MODELS[key], 1, "off", device, steps, warmup, attention, pe)
            fused = measure(MODELS[key], k, compile_mode, device, steps, warmup, attention, pe)
            row.update(solo_images_per_s=solo["images_per_s"], fused_images_per_s=fused["images_per_s"],
                       speedup=fused["images_per_s"] / solo["images_per_s"])
            hours += STUDY_IMAGES / len(ALL12) / fused["images_per_s"] / 3600
            print(f"    {row['variant']:<26} {row['solo_images_per_s']:>9.0f} -> {row['fused_images_per_s']:>9.0f} "
                  f"images/s ({row['speedup']:.2f}x)", flush=True)
        except Exception as err:  # noqa: BLE001 - reported, the other variants still run
            row["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            hours = math.nan
            print(f"    {row['variant']:<26} failed: {row['error']}", flush=True)
        rows.append(row)
    print(f"  projected all12 CIFAR-10 half at each variant's fused rate: {hours:.2f} h on this device", flush=True)
    return rows + [{"projected_all12_cifar10_hours": hours}]


def format_row(row: dict, solo: dict) -> str:
    if "error" in row:
        return f"  {row['mode']:<34} failed: {row['error']}"
    ratio = row["images_per_s"] / solo["images_per_s"] if "images_per_s" in solo else math.nan
    return (f"  {row['mode']:<34} {row['images_per_s']:>10.0f} images/s  {row['step_ms']:>9.1f} ms/step  "
            f"{row['tflops']:>8.3f} TFLOP/s  {100 * row['utilisation']:>6.2f}% of peak  {ratio:>5.2f}x solo eager")


if __name__ == "__main__":
    main()
