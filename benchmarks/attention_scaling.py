"""Attention forward+backward time against token count N: exact softmax vs linear-time backends.

    .venv/bin/python benchmarks/attention_scaling.py                  # the scaling table
    .venv/bin/python benchmarks/attention_scaling.py --luo-crossover  # favor+luo_rpe: fft vs dense path

Batch 1, 4 heads, head dim 32, m = 64 random features, float32. Every variant is timed
interleaved in the same rounds (median over rounds), so the printed ratios are side by side.
performer-pytorch (`pip install performer-pytorch`) is its FastAttention(dim_heads=32, nb_features=64)
on the same q, k, v. Slopes are least-squares fits of log(ms) against log(N).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Callable

import torch

from rpevit.attention.kernelized import FavorAttention, ReluAttention
from rpevit.attention.softmax import SoftmaxAttention
from rpevit.pe.relative_bias import RelativeBias


def timed(fn: Callable[[], None], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner * 1e3


def measure(variants: dict[str, Callable[[], None]], rounds: int, min_ms: float = 30.0) -> dict[str, float]:
    """Median ms per call of every variant, interleaved round by round after a warm-up."""
    inner = {}
    for name, fn in variants.items():
        fn()
        once = timed(fn, 1)
        inner[name] = max(1, math.ceil(min_ms / max(once, 1e-3)))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(timed(fn, inner[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


def fwd_bwd(attend: Callable[..., torch.Tensor], q, k, v, *extra) -> Callable[[], None]:
    def step() -> None:
        for t in (q, k, v, *extra):
            t.grad = None
        attend(q, k, v, *extra).sum().backward()
    return step


def make_variants(n: int, heads: int, head_dim: int, m: int, luo_paths: tuple[str, ...], performer: bool):
    side = math.isqrt(n)
    assert side * side == n, "N must be a square grid"
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=g).requires_grad_() for _ in range(3))
    table = (0.1 * torch.randn(heads, 2 * side - 1, 2 * side - 1, generator=g)).requires_grad_()
    shape = dict(heads=heads, head_dim=head_dim)
    favor, relu = FavorAttention(**shape, num_features=m), ReluAttention(**shape, num_features=m)
    softmax = SoftmaxAttention(**shape)
    variants = {}
    if not luo_paths:
        variants["softmax"] = fwd_bwd(softmax, q, k, v)
        variants["favor"] = fwd_bwd(favor, q, k, v)
        variants["relu"] = fwd_bwd(relu, q, k, v)
        luo_paths = ("fft",)
    for path in luo_paths:
        variants[f"favor+luo({path})"] = fwd_bwd(
            lambda q_, k_, v_, t_, p=path: favor(q_, k_, v_, RelativeBias(t_, (side, side), p)), q, k, v, table)
    if performer:
        from performer_pytorch import FastAttention

        fast = FastAttention(dim_heads=head_dim, nb_features=m)
        variants["performer-pytorch"] = fwd_bwd(fast, q, k, v)
    return variants


def slope(ns: list[int], ms: list[float]) -> float:
    xs, ys = [math.log(n) for n in ns], [math.log(t) for t in ms]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=None,
                        help="square token counts; default 64 256 1024 4096 (16 .. 1024 with --luo-crossover)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    parser.add_argument("--luo-crossover", action="store_true", help="time favor+luo_rpe fft vs dense paths")
    parser.add_argument("--no-performer", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tokens is None:
        args.tokens = [16, 36, 64, 100, 144, 196, 256, 400, 576, 1024] if args.luo_crossover else [64, 256, 1024, 4096]
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1, heads {args.heads}, "
          f"head dim {args.head_dim}, m {args.features}, forward+backward, median of {args.rounds} rounds")
    table: dict[str, list[float]] = {}
    for n in args.tokens:
        paths = ("fft", "dense") if args.luo_crossover else ()
        variants = make_variants(n, args.heads, args.head_dim, args.features, paths,
                                 performer=not (args.no_performer or args.luo_crossover))
        for name, ms in measure(variants, args.rounds).items():
            table.setdefault(name, []).append(ms)
    names = list(table)
    base = names[0]
    print("\n| N | " + " | ".join(f"{n} ms" for n in names) + " | " + " | ".join(f"{n}/{base}" for n in names[1:]) + " |")
    print("|---" * (2 * len(names)) + "|")
    for i, n in enumerate(args.tokens):
        cells = [f"{table[x][i]:.3f}" for x in names] + [f"{table[x][i] / table[base][i]:.2f}" for x in names[1:]]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if "performer-pytorch" in table:
        print("\nperformer-pytorch / favor (how many times faster rpevit's FAVOR+ is): " + ", ".join(
            f"N={n}: {p / f:.2f}x" for n, p, f in zip(args.tokens, table["performer-pytorch"], table["favor"])))
    print("\nlog-log slope in N (all N): " + ", ".join(f"{x}: {slope(args.tokens, table[x]):.2f}" for x in names))
    if len(args.tokens) > 2:
        tail = args.tokens[-3:]
        print("log-log slope in N (last 3 N): " + ", ".join(f"{x}: {slope(tail, table[x][-3:]):.2f}" for x in names))


if __name__ == "__main__":
    main()
