"""How fast the random mode of `rotinv` concentrates on p(|c_i - c_j|^2), against m draws.

    .venv/bin/python analysis/rotinv_concentration.py OUT_DIR [--draws 1 2 4 ...] [--grid 8]
        [--coefficients 1 1 1] [--repeats 100] [--delta 0.05]

For each m, `repeats` independent sets of m Gaussian draws go through
`random_projection_features` (float64); the deviation from the exact p over all pairs of grid
positions is summarised by its max and RMS. Beside them (docs/string_and_rotinv.md derives both):
- rms_exact: sqrt(mean over pairs of Var X / m), the exact expected RMS (an identity, not a bound);
- hoeffding: a 1 - delta bound on the max deviation (Hoeffding after truncating |w|^2 <= R);
- chebyshev: a 1 - delta bound on the max deviation (Chebyshev + union over offsets).
Writes rotinv_concentration.md (table) and rotinv_concentration.png in OUT_DIR.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from rpevit.analysis.common import output_file, pyplot, write_text_file
from rpevit.attention.base import LowRankModulation
from rpevit.pe.rotation_invariant import centred_coordinates, double_factorial_odd, random_projection_features
from rpevit.sweep.results import named_folder


def distinct_offsets(coords: torch.Tensor) -> torch.Tensor:
    """t = |c_i - c_j|^2 of the distinct nonzero offsets up to sign (X depends on (w^T D)^2 only),
    (2H-1)(2W-1) - 1 halved on an H x W grid. Offsets are compared as integer multiples of the grid
    step, not as floats: coordinates built in float32 (the trial's dtype, `centred_coordinates`) make
    equal offsets differ in their last bits, and comparing those counted 420 offsets on 8 x 8, not 112."""
    diff = (coords[:, None, :] - coords[None, :, :]).reshape(-1, 2).double()
    step = diff.abs()[diff.abs() > 0].min()
    steps = torch.round(diff / step)
    if (diff / step - steps).abs().max() > 1e-3:
        raise ValueError("coordinates are not on a grid: their offsets are not multiples of the smallest one")
    steps = torch.where((steps[:, :1] < 0) | ((steps[:, :1] == 0) & (steps[:, 1:] < 0)), -steps, steps)
    unique = torch.unique(steps, dim=0)
    unique = unique[(unique != 0).any(-1)]
    return ((unique * step) ** 2).sum(-1)


def per_draw_variance(t: torch.Tensor, a: list[float]) -> torch.Tensor:
    """Var X for X = sum_k a_k (t G^2)^k / (2k-1)!!, G ~ N(0, 1): E[G^(2n)] = (2n-1)!!."""
    second = sum(
        a[k] * a[l] * t ** (k + l) * double_factorial_odd(k + l) / (double_factorial_odd(k) * double_factorial_odd(l))
        for k in range(len(a)) for l in range(len(a))
    )
    mean = sum(a[k] * t**k for k in range(len(a)))
    return second - mean**2


def upper_gamma_regularised(order: int, x: float) -> float:
    """Gamma(order + 1, x) / order! = P(Poisson(x) <= order) = e^-x sum_{j <= order} x^j / j!."""
    return math.exp(-x) * sum(x**j / math.factorial(j) for j in range(order + 1))


def hoeffding_bound(t: torch.Tensor, a: list[float], draws: int, delta: float) -> float:
    """max over offsets of eps = beta(R) + (U_R - a_0) sqrt(ln(4D / delta) / (2m)), R = 2 ln(2m / delta)."""
    offsets = t.numel()
    radius = 2 * math.log(2 * draws / delta)  # P(max_s |w_s|^2 > R) <= m e^(-R/2) = delta / 2
    upper = sum(a[k] * (radius * t) ** k / double_factorial_odd(k) for k in range(len(a)))
    bias = sum(a[k] * t**k * upper_gamma_regularised(k, radius / 2) for k in range(len(a)))
    eps = bias + (upper - a[0]) * math.sqrt(math.log(4 * offsets / delta) / (2 * draws))
    return float(eps.max())


def chebyshev_bound(t: torch.Tensor, a: list[float], draws: int, delta: float) -> float:
    """P(max |dev| >= eps) <= sum_offsets Var / (m eps^2) = delta."""
    return float(math.sqrt(per_draw_variance(t, a).sum() / (draws * delta)))


DEFAULT_DRAWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def measure(grid: int, a: list[float], draws: list[int], repeats: int, delta: float,
            seed: int) -> tuple[list[dict], dict]:
    """The table's rows (one per m) and what its header states, from `repeats` seeded draws per m (float64)."""
    coords = centred_coordinates((grid, grid)).double()
    coef = torch.tensor([a], dtype=torch.float64)
    t_pairs = ((coords[:, None, :] - coords[None, :, :]) ** 2).sum(-1)
    exact = sum(a[k] * t_pairs**k for k in range(len(a)))
    t_offsets = distinct_offsets(coords)
    var_pairs = per_draw_variance(t_pairs, a)
    gen = torch.Generator().manual_seed(seed)

    rows = []
    for m in draws:
        maxes, rmses = [], []
        for _ in range(repeats):
            w = torch.randn(1, m, 2, dtype=torch.float64, generator=gen)
            dev = LowRankModulation(*random_projection_features(coords, coef, w)).dense()[0] - exact
            maxes.append(dev.abs().max())
            rmses.append(dev.square().mean().sqrt())
        maxes, rmses = torch.stack(maxes), torch.stack(rmses)
        rows.append({
            "m": m,
            "max_mean": float(maxes.mean()),
            "max_q": float(torch.quantile(maxes, 1 - delta)),
            "rms_mean": float(rmses.square().mean().sqrt()),
            "rms_exact": float((var_pairs.mean() / m).sqrt()),
            "hoeffding": hoeffding_bound(t_offsets, a, m, delta),
            "chebyshev": chebyshev_bound(t_offsets, a, m, delta),
        })
    meta = {"grid": grid, "a": a, "repeats": repeats, "delta": delta, "seed": seed,
            "p_min": float(exact.min()), "p_max": float(exact.max()), "offsets": t_offsets.numel()}
    return rows, meta


def table(rows: list[dict], meta: dict) -> str:
    """rotinv_concentration.md: the header line and one table row per m."""
    q = f"{100 * (1 - meta['delta']):g}%"
    grid, a = meta["grid"], meta["a"]
    lines = [
        "# rotinv random mode: deviation from p against m draws",
        "",
        f"grid {grid}x{grid} (coordinates in [-1/2, 1/2]^2, t = |c_i - c_j|^2 in [0, 2]), "
        f"p(t) = {' + '.join(f'{c:g} t^{k}' for k, c in enumerate(a))}, p in [{meta['p_min']:.3g}, {meta['p_max']:.3g}], "
        f"{meta['repeats']} repeats per m, seed {meta['seed']}, delta = {meta['delta']}, {meta['offsets']} distinct offsets.",
        "",
        f"| m | max dev (mean) | max dev ({q} quantile) | {q} bound: truncated Hoeffding | {q} bound: Chebyshev | "
        f"RMS dev (measured) | RMS dev (exact sqrt(Var/m)) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['m']} | {r['max_mean']:.4g} | {r['max_q']:.4g} | {r['hoeffding']:.4g} | "
                     f"{r['chebyshev']:.4g} | {r['rms_mean']:.4g} | {r['rms_exact']:.4g} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=named_folder)
    parser.add_argument("--draws", type=int, nargs="+", default=list(DEFAULT_DRAWS))
    parser.add_argument("--grid", type=int, default=8, help="side of the square patch grid (8: CIFAR, 4: MNIST)")
    parser.add_argument("--coefficients", type=float, nargs="+", default=[1.0, 1.0, 1.0], help="a_0 .. a_K")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)

    a = args.coefficients
    rows, meta = measure(args.grid, a, args.draws, args.repeats, args.delta, args.seed)
    text = table(rows, meta)
    write_text_file(args.out_dir / "rotinv_concentration.md", text)
    print(text, end="")

    q = f"{100 * (1 - args.delta):g}%"
    plt = pyplot()
    ms = [r["m"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.loglog(ms, [r["max_q"] for r in rows], "o-", label=f"max dev, {q} quantile (measured)")
    ax.loglog(ms, [r["max_mean"] for r in rows], "o--", label="max dev, mean (measured)")
    ax.loglog(ms, [r["hoeffding"] for r in rows], "k-", label=f"{q} bound: truncated Hoeffding")
    ax.loglog(ms, [r["chebyshev"] for r in rows], "k--", label=f"{q} bound: Chebyshev + union")
    ax.loglog(ms, [r["rms_mean"] for r in rows], "s-", label="RMS dev (measured)")
    ax.loglog(ms, [r["rms_exact"] for r in rows], "s:", label="RMS dev, exact sqrt(Var/m)")
    ax.set_xlabel("m (Gaussian draws)")
    ax.set_ylabel("|mean over draws - p(|c_i - c_j|^2)|")
    ax.set_title(f"rotinv random mode, {args.grid}x{args.grid} grid, a = {a}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with output_file(args.out_dir / "rotinv_concentration.png") as handle:  # atomic, never through a link
        fig.savefig(handle, format="png", dpi=120)
    plt.close(fig)
    print(f"wrote {args.out_dir / 'rotinv_concentration.md'} and .png")


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool

    run_tool(main)
