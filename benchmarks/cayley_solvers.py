"""Sparse CG vs dense LU for the Cayley map P = (I - S)(I + S)^-1, forward + backward.

    .venv/bin/python benchmarks/cayley_solvers.py [--heads 4] [--dims 16 32 ...] [--fractions ...]

S has a fraction f of its above-diagonal entries (random pattern per head), values N(0, 1/(4 f d))
so that |S|_2 is about 1 at every (d, f): CG's step count depends on |S|, printed beside the
times. Both paths are timed side by side in one run (median of repeats); the winner decides what
`cayley_solver: auto` takes (the dense LU: results/cayley_solvers_cpu/cayley_solvers.md stores one run).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import datetime, timezone

import torch

from rpevit.metrics import device_name, git_commit
from rpevit.pe.cayley_string import cayley_orthogonal
from rpevit.pe.sparse_solve import cayley_solve_sparse, skew_from_entries


def random_pattern(heads: int, dim: int, fraction: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = torch.triu_indices(dim, dim, offset=1)
    count = max(1, round(fraction * rows.numel()))
    picks = torch.stack([torch.randperm(rows.numel(), generator=gen)[:count] for _ in range(heads)])
    return rows[picks], cols[picks]


def time_ms(fn, min_repeats: int = 3, min_seconds: float = 0.3) -> float:
    fn()  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < min_repeats or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 50:
            break
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 by default: on a shared 2-core box, 2 threads stall in OpenMP barriers")
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2, 0.5, 1.0])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_commit()}, {device_name(torch.device('cpu'))}, "
          f"load average at start {load} ({os.cpu_count()} CPUs: above about 0 the run shared the machine)")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, heads {args.heads}, float32, fwd+bwd of P")
    print("| d | f | nnz/head | dense ms | sparse ms | CG steps | sparse/dense | winner |")
    print("|---|---|---|---|---|---|---|---|")
    for dim in args.dims:
        eye = torch.eye(dim)
        for fraction in args.fractions:
            rows, cols = random_pattern(args.heads, dim, fraction, gen)
            std = 0.5 / (fraction * dim) ** 0.5
            values = (std * torch.randn(rows.shape, generator=gen)).requires_grad_()
            weight = torch.randn(args.heads, dim, dim, generator=gen)
            info: list = []

            def dense() -> None:
                p = cayley_orthogonal(skew_from_entries(values, rows, cols, dim))
                (p * weight).sum().backward()

            def sparse() -> None:
                info.clear()
                p = 2 * cayley_solve_sparse(values, rows, cols, eye.expand(args.heads, -1, -1), info) - eye
                (p * weight).sum().backward()

            t_dense, t_sparse = time_ms(dense), time_ms(sparse)
            winner = "sparse" if t_sparse < t_dense else "dense"
            print(f"| {dim} | {fraction} | {rows.shape[1]} | {t_dense:.3f} | {t_sparse:.3f} | "
                  f"{info[0].iterations} | {t_sparse / t_dense:.2f} | {winner} |", flush=True)
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
