"""Training-step time of attention x pe variants relative to a baseline variant, side by side.

    .venv/bin/python benchmarks/variant_step_time.py --attention softmax favor relu \
        --pe ape luo_rpe circulant_string rope rope_mixed --tokens 16 64 --baseline softmax+ape --device cpu
    .venv/bin/python benchmarks/variant_step_time.py --attention softmax \
        --pe rope cayley_string reflection_string sparse_cayley_string --baseline softmax+rope --set string_sparsity=0.1

Generic over registry names: a variant is `attention+pe` (pe may itself be a '+' combination).
Token counts map to the project's datasets: 16 = MNIST 28 px / patch 7, 64 = CIFAR 32 px / patch 4
(other square counts: CIFAR 32 px with patch 32/sqrt(N)). One training step = forward, cross-entropy,
backward, AdamW step on random images. All variants of one token count are timed interleaved,
round by round after a warm-up; the table shows the median ms and the ratio to the baseline.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any, Callable

import torch

from rpevit.config import TrialConfig
from rpevit.data import DATASET_SPECS
from rpevit.models import build_model
from rpevit.sweep.space import parse_overrides
from rpevit.tasks.steppers import make_optimizer


def dataset_for_tokens(tokens: int) -> dict[str, Any]:
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise SystemExit(f"--tokens {tokens}: needs a square patch grid")
    if tokens == 16:
        return {"dataset": "mnist", "patch_size": 7}
    if 32 % side:
        raise SystemExit(f"--tokens {tokens}: CIFAR's 32 px do not split into {side} x {side} patches")
    return {"dataset": "cifar10", "patch_size": 32 // side}


def split_variant(name: str) -> tuple[str, str]:
    attention, sep, pe = name.partition("+")
    if not sep:
        raise SystemExit(f"variant {name!r}: expected attention+pe, e.g. softmax+ape")
    return attention, pe


def training_step(cfg: TrialConfig, batch: int, device: torch.device) -> Callable[[], None]:
    spec = DATASET_SPECS[cfg.dataset]
    model = build_model(cfg, spec.channels, spec.num_classes).to(device).train()
    optimizer = make_optimizer(model, cfg)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(batch, spec.channels, spec.image_size, spec.image_size, generator=g).to(device)
    labels = torch.randint(0, spec.num_classes, (batch,), generator=g).to(device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step


def measure(steps: dict[str, Callable[[], None]], rounds: int, warmup: int, inner: int) -> dict[str, float]:
    for step in steps.values():
        for _ in range(warmup):
            step()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(inner):
                step()
            samples[name].append((time.perf_counter() - start) / inner * 1e3)
    return {name: statistics.median(s) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attention", nargs="+", default=["softmax", "favor", "relu"])
    parser.add_argument("--pe", nargs="+", default=["ape", "luo_rpe", "circulant_string", "rope", "rope_mixed"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--baseline", default="softmax+ape")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--inner", type=int, default=3, help="steps per timed sample")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="TrialConfig overrides for every variant, e.g. dim=64 string_sparsity=0.1")
    args = parser.parse_args()

    overrides = parse_overrides(args.set)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [args.baseline] + [f"{a}+{p}" for a in args.attention for p in args.pe if f"{a}+{p}" != args.baseline]
    device = torch.device(args.device)
    print(f"# torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"median of {args.rounds} rounds x {args.inner} steps, overrides {overrides or 'none'}")
    results: dict[int, dict[str, float]] = {}
    for tokens in args.tokens:
        steps = {}
        for name in names:
            attention, pe = split_variant(name)
            cfg = TrialConfig.from_dict({**dataset_for_tokens(tokens), "attention": attention, "pe": pe,
                                         "device": args.device, **overrides}, source=f"variant {name}")
            steps[name] = training_step(cfg, args.batch, device)
        results[tokens] = measure(steps, args.rounds, args.warmup, args.inner)
    header = " | ".join(f"N={t} ms | N={t} ratio" for t in args.tokens)
    print(f"\n| variant | {header} |\n|---|" + "---|---|" * len(args.tokens))
    for name in names:
        cells = " | ".join(f"{results[t][name]:.2f} | {results[t][name] / results[t][args.baseline]:.2f}"
                           for t in args.tokens)
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
