"""Where the efficient variants pay: time and memory against the token count N, the fitted exponent
over each variant's top decade of N, and the N at which each linear-attention variant overtakes its
softmax counterpart; and the measured dense/FFT crossover of luo_rpe that `luo_path: auto` follows.

    python analysis/token_scaling.py RESULTS_DIR [--write-crossover]

Reads the bench rows of sweeps that vary N (token_scaling*.yaml), per device. Per image: a study
shrinks the batch as N grows so that every step carries about as many tokens, so times and step
memory are divided by the batch (`train_ms_per_image`, `infer_ms_per_sample`, step memory per
image). The exponent is the least-squares slope of log cost on log N over N >= N_max / 10 (the
top decade; small N is dominated by fixed per-call overheads). The crossover: the N from which the
linear variant's training step per image stays below its counterpart's at every larger measured N,
interpolated log-log between the two bracketing sizes; where it never does, the ratio at the
largest N and, when the exponents allow, the N their fitted lines would cross (extrapolated, and
said so). Counterparts: softmax+ape for the ape rows, softmax+luo_rpe for every Luo row, softmax+
rope for rope and the STRINGs (the encodings that declare the group "string" where they register:
rpevit.analysis.variants), softmax+rotinv in the same mode for rotinv.

`--write-crossover` writes the luo_rpe dense/FFT table of these rows into rpevit/pe/luo_crossover.json
(one entry per device kind), the table `luo_path: auto` reads (rpevit/pe/relative_bias.py).
Writes token_scaling.md and token_scaling.png into RESULTS_DIR.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit import config, registry
from rpevit.analysis import variants
from rpevit.analysis.common import (column, fmt, markdown_table, per_distinct, pyplot, read_trials, require_trials,
                                    results_parser, save_figure, write_study, write_text_file)

TOP_DECADE = 10.0  # the exponent is fitted over N >= N_max / TOP_DECADE
# Fitted exponents closer than this are the same scaling: a decade of timings fixes a slope to a few
# hundredths at best, and two lines that are parallel by construction come out of the fit ~1e-15 apart
# (which BLAS ran decides the sign), so a crossing is extrapolated only beyond this gap.
EXPONENT_TOLERANCE = 0.05
EXTRAPOLATION_REACH = 1000.0  # an extrapolated crossing is shown only up to this multiple of the largest N
TIME = "train_ms_per_image"
INFER = "infer_ms_per_sample"
MEMORY = "step_mem_mb_per_image"
COSTS = ((TIME, "train step ms / image"), (INFER, "inference ms / image"), (MEMORY, "step memory MiB / image"))
LINE_STYLES = ("-", "--", ":", "-.")  # by an encoding's place in its family's panel, then by its option
CROSSOVER_FILE = Path(__file__).resolve().parents[1] / "pe" / "luo_crossover.json"


def scaling_rows(bench: pd.DataFrame) -> pd.DataFrame:
    """The bench rows of sweeps that vary the token count N (token_scaling*.yaml): a cost bench at
    one model size (bench_mnist_cpu.yaml, ...) has no exponent to fit."""
    if bench.empty or "tokens" not in bench.columns:
        return bench.iloc[0:0]
    varies = bench.groupby("sweep")["tokens"].transform("nunique") > 1
    return bench[varies]


def device_kind(device_name: str) -> str:
    """'cpu' for rows measured on a CPU (device_name 'cpu:...'), else 'cuda' (a GPU's name)."""
    return "cpu" if str(device_name).startswith("cpu") else "cuda"


def variant_name(attention: str, pe: str, luo_path: str, rotinv_mode: str) -> str:
    """attention+pe, with the path of a kernelized luo_rpe and the mode of rotinv: the options that make
    different algorithms of one encoding."""
    if pe == "luo_rpe" and attention != "softmax":
        return f"{attention}+luo_rpe ({luo_path})"
    if pe == "rotinv":
        return f"{attention}+rotinv ({rotinv_mode})"
    return f"{attention}+{pe}"


def counterpart(attention: str, pe: str, rotinv_mode: str) -> str | None:
    """The softmax variant a linear one is compared with (None for softmax rows)."""
    if attention == "softmax":
        return None
    if pe == "luo_rpe":
        return "softmax+luo_rpe"
    if pe == "rotinv":
        return f"softmax+rotinv ({rotinv_mode})"
    if pe in variants.in_group(variants.STRING):
        return f"softmax+{variants.STRING_REFERENCE}"
    return f"softmax+{pe}"


def linear_in_tokens(attention: str, pe: str, values: dict) -> bool:
    """Whether a variant is O(N) in the tokens by construction: its backend says so (`linear_time`) and no
    encoding of its `pe` (each part of a combination) makes it quadratic with these config values
    (`PositionEncoding.quadratic_on_kernelized`: luo_rpe's dense path, rotinv's dense path, any score hook
    whose class does not say otherwise). A name not registered here is not counted as O(N)."""
    config.load_registry()
    backend = registry.ATTENTIONS.get(attention)
    parts = [registry.POSITION_ENCODINGS.get(p) for p in str(pe).split("+")]
    if backend is None or not getattr(backend, "linear_time", False) or None in parts:
        return False
    return not any(cls.quadratic_on_kernelized(values) for cls in parts)


def per_image(bench: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, variant, N): medians of the per-image costs, with the variant's names."""
    b = bench.copy()
    batch = pd.to_numeric(b["bench_batch"], errors="coerce")
    b[TIME] = pd.to_numeric(b["train_step_ms"], errors="coerce") / batch
    b[INFER] = pd.to_numeric(b["infer_ms"], errors="coerce") / batch
    b[MEMORY] = pd.to_numeric(column(b, "step_mem_mb"), errors="coerce") / batch
    b["device"] = b["device_name"].astype(str)
    b["out_of_memory"] = column(b, "out_of_memory", False).fillna(False).astype(bool)
    luo_path, mode = column(b, "luo_path", "auto").astype(str), column(b, "rotinv_mode", "exact").astype(str)
    b["variant"] = [variant_name(*v) for v in zip(b["attention"], b["pe"], luo_path, mode)]
    b["counterpart"] = [counterpart(*v) for v in zip(b["attention"], b["pe"], mode)]
    rotinv_path = column(b, "rotinv_path", "lowrank").astype(str)
    b["linear_in_tokens"] = per_distinct(
        [b["attention"].astype(str), b["pe"].astype(str), luo_path, rotinv_path],
        lambda a, pe, lp, rp: linear_in_tokens(a, pe, {"luo_path": lp, "rotinv_path": rp}))
    keys = ["device", "variant", "tokens"]
    table = b.groupby(keys).agg(attention=("attention", "first"), pe=("pe", "first"), counterpart=("counterpart", "first"),
                                linear_in_tokens=("linear_in_tokens", "all"),
                                batch=("bench_batch", "first"), out_of_memory=("out_of_memory", "any"),
                                **{c: (c, "median") for c, _ in COSTS}).reset_index()
    return table.sort_values(keys).reset_index(drop=True)


def top_decade_exponent(n: np.ndarray, cost: np.ndarray) -> float:
    """Least-squares slope of log cost on log n over n >= max(n) / TOP_DECADE (NaN with < 2 points)."""
    ok = np.isfinite(cost) & (cost > 0)
    n, cost = n[ok], cost[ok]
    if len(n) == 0:
        return math.nan
    top = n >= n.max() / TOP_DECADE
    if len(np.unique(n[top])) < 2:
        return math.nan
    return float(np.polyfit(np.log(n[top]), np.log(cost[top]), 1)[0])


def exponents(table: pd.DataFrame) -> pd.DataFrame:
    """Per device and variant: the N range, its top decade, and each cost's fitted exponent there."""
    rows = []
    for (device, variant), g in table.groupby(["device", "variant"]):
        n = g["tokens"].to_numpy(float)
        ran = g[~g["out_of_memory"]]
        top = n[n >= n.max() / TOP_DECADE] if len(n) else n
        fitted = np.unique(ran["tokens"].to_numpy(float))
        fitted = fitted[fitted >= n.max() / TOP_DECADE] if len(n) else fitted
        row = {"device": device, "variant": variant, "N": f"{int(n.min())}..{int(n.max())}",
               "top decade": f"{int(top.min())}..{int(top.max())}" if len(top) else "—",
               "sizes in the fit": len(fitted),
               "out of memory at N": ", ".join(str(int(t)) for t in g.loc[g["out_of_memory"], "tokens"]) or "—"}
        for cost, label in COSTS:
            row[f"{label} exponent"] = top_decade_exponent(ran["tokens"].to_numpy(float), ran[cost].to_numpy(float))
        rows.append(row)
    return pd.DataFrame(rows)


def crossing(n: np.ndarray, ratio: np.ndarray) -> tuple[float, str]:
    """(N, how) from which ratio (linear / softmax, per image) stays < 1 at every larger measured N.

    how: 'measured' (interpolated log-log between the bracketing sizes), 'below the smallest N'
    (faster everywhere measured), or 'not reached' (N NaN)."""
    ok = np.isfinite(ratio)
    n, ratio = n[ok], ratio[ok]
    if len(n) == 0 or ratio[-1] >= 1:
        return math.nan, "not reached"
    above = np.nonzero(ratio >= 1)[0]
    if len(above) == 0:
        return float(n[0]), "below the smallest N"
    i = above[-1]  # the last size where softmax was at least as fast; it is faster from n[i + 1] on
    x0, x1, y0, y1 = np.log(n[i]), np.log(n[i + 1]), np.log(ratio[i]), np.log(ratio[i + 1])
    return float(np.exp(x0 + (x1 - x0) * y0 / (y0 - y1))), "measured"


def extrapolated_crossing(largest_n: float, ratio: float, gap: float) -> float:
    """The N where two fitted power laws would cross beyond the largest measured N: the linear variant
    is `ratio` (>= 1) times slower there and its exponent `gap` lower than its counterpart's, so the
    ratio falls as (N / largest_n)^-gap. NaN where there is no crossing to project: the exponents differ
    by less than EXPONENT_TOLERANCE (equal within the fit's precision), the linear one grows at least as
    fast, or the crossing lies beyond EXTRAPOLATION_REACH times the largest N (computed in logs, so a
    near-zero gap can never overflow to inf)."""
    if not (math.isfinite(ratio) and ratio >= 1 and math.isfinite(gap) and gap >= EXPONENT_TOLERANCE):
        return math.nan
    log_reach = math.log(ratio) / gap
    if log_reach > math.log(EXTRAPOLATION_REACH):
        return math.nan
    return float(largest_n * math.exp(log_reach))


def crossovers(table: pd.DataFrame, exps: pd.DataFrame) -> pd.DataFrame:
    """Per device and linear variant: where its training step per image overtakes its counterpart's."""
    rows = []
    slope = exps.set_index(["device", "variant"])[f"{COSTS[0][1]} exponent"]
    for (device, variant), g in table[table["counterpart"].notna()].groupby(["device", "variant"]):
        ref_name = g["counterpart"].iloc[0]
        ref_rows = table[(table["device"] == device) & (table["variant"] == ref_name)].set_index("tokens")
        ref = ref_rows[TIME]
        g = g.set_index("tokens")
        # where the linear variant ran and its counterpart did not fit in memory: no ratio, but the answer
        # to "where does it pay" there is that only the linear one runs
        ran = g.index[np.isfinite(g[TIME].to_numpy(float)) & ~g["out_of_memory"].to_numpy(bool)]
        counterpart_oom = sorted(int(n) for n in ref_rows.index[ref_rows["out_of_memory"].to_numpy(bool)] if n in ran)
        common_n = np.array(sorted(set(g.index) & set(ref.index)), dtype=float)
        if len(common_n) == 0:
            continue
        ratio = g.loc[common_n, TIME].to_numpy(float) / ref.loc[common_n].to_numpy(float)
        at, how = crossing(common_n, ratio)
        # the largest N where both ran (an out-of-memory row has no time): the last ratio is labelled, and
        # extrapolated from, the N it was measured at, not a larger one where either could not run
        finite = np.nonzero(np.isfinite(ratio))[0]
        last_at = float(common_n[finite[-1]]) if len(finite) else math.nan
        last = float(ratio[finite[-1]]) if len(finite) else math.nan
        gap = slope.get((device, ref_name), math.nan) - slope.get((device, variant), math.nan)
        extrapolated = extrapolated_crossing(last_at, last, gap) if how == "not reached" else math.nan
        rows.append({"device": device, "variant": variant, "against": ref_name,
                     "smallest N": int(common_n[0]), "ratio at smallest N": ratio[0], "ratio at largest N": last,
                     "largest N": int(last_at) if len(finite) else math.nan,
                     "overtakes from N": at, "how": how, "extrapolated N": extrapolated,
                     "counterpart out of memory at N": ", ".join(map(str, counterpart_oom)) or "—"})
    return pd.DataFrame(rows)


def luo_path_table(table: pd.DataFrame) -> dict[str, dict]:
    """Per device kind, from the kernelized luo_rpe rows measured on both paths: the training step per
    image of each path at each N, and `fft_from_tokens`, the smallest measured N from which the FFT
    path is faster at every larger measured N (None where dense was faster at the largest N)."""
    out: dict[str, dict] = {}
    luo = table[(table["pe"] == "luo_rpe") & (table["attention"] != "softmax")].copy()
    luo["path"] = luo["variant"].str.extract(r"\((dense|fft)\)")[0]
    for device, g in luo.groupby("device"):
        per_n = g.pivot_table(index="tokens", columns="path", values=TIME, aggfunc="median")
        if not {"dense", "fft"} <= set(per_n.columns):
            continue
        per_n = per_n.dropna()
        n = per_n.index.to_numpy(float)
        faster = (per_n["fft"] < per_n["dense"]).to_numpy()
        slower = np.nonzero(~faster)[0]
        start = None if len(slower) and slower[-1] == len(n) - 1 else int(n[slower[-1] + 1] if len(slower) else n[0])
        out[device_kind(device)] = {
            "fft_from_tokens": start, "measured_tokens": [int(t) for t in n],
            "dense_ms_per_image": [round(float(t), 3) for t in per_n["dense"]],
            "fft_ms_per_image": [round(float(t), 3) for t in per_n["fft"]], "device_name": device}
    return out


def luo_path_backends(table: pd.DataFrame, device: str) -> str:
    """Which kernelized backends each luo_rpe path's figure is the median over, at which N: 'dense: favor,
    relu; fft: favor at N = 256, 1024, favor, relu at N = 2304, 4096' (the table pools them)."""
    luo = table[(table["pe"] == "luo_rpe") & (table["attention"] != "softmax") & (table["device"] == device)]
    parts = []
    for path in ("dense", "fft"):
        rows = luo[luo["variant"].str.contains(rf"\({path}\)")]
        # the rows' names are inert already (untrusted_names): md_text again would print its escapes
        by_n = rows.groupby("tokens")["attention"].agg(lambda a: ", ".join(sorted(set(map(str, a)))))
        groups: dict[str, list[int]] = {}
        for n, names in by_n.items():
            groups.setdefault(names, []).append(int(n))
        text = (next(iter(groups)) if len(groups) == 1 else
                "; ".join(f"{names} at N = {', '.join(map(str, ns))}" for names, ns in groups.items()))
        parts.append(f"{path}: {text}")
    return "; ".join(parts)


def timing_text(frame: pd.DataFrame) -> str:
    """'Medians of 3 interleaved timed runs': the repeats and interleaving the rows record."""
    repeats = sorted({int(v) for v in pd.to_numeric(column(frame, "timing_repeats"), errors="coerce").dropna()})
    interleaved = bool(column(frame, "timing_interleaved", False).fillna(False).astype(bool).all())
    return (f"Medians of {'/'.join(map(str, repeats)) or '?'} {'interleaved ' if interleaved else ''}timed runs")


def plot(table: pd.DataFrame, path: Path) -> Path:
    """Training step and step memory per image against N, log-log, one column per encoding family present
    (each encoding's declared family: rpevit.analysis.variants), colour by attention (the one colour map),
    line style by the encoding's place in its family and the variant's option (dense / fft, exact / random)."""
    plt = pyplot()
    devices = sorted(table["device"].unique())
    panels = variants.families(table["pe"])
    colours = variants.colours(variants.ATTENTION, table["attention"])
    fig, axes = plt.subplots(2 * len(devices), len(panels), figsize=(3.3 * len(panels), 6.2 * len(devices)),
                             squeeze=False)
    for d, device in enumerate(devices):
        rows = table[table["device"] == device]
        for f, (family, pes) in enumerate(panels):
            for r, (cost, label) in enumerate((COSTS[0], COSTS[2])):
                ax = axes[2 * d + r, f]
                for variant, g in rows[rows["pe"].isin(pes)].groupby("variant"):
                    attention, pe = str(g["attention"].iloc[0]), str(g["pe"].iloc[0])
                    g = g[~g["out_of_memory"]].sort_values("tokens")
                    ax.loglog(g["tokens"], g[cost], ls=line_style(variant, pes.index(pe)), marker="o", ms=3.5,
                              color=colours[attention], label=variant)
                ax.set_title(f"{family}" + (f"\n{device}" if f == 0 and r == 0 else ""), fontsize=10)
                ax.set_xlabel("tokens N", fontsize=9)
                if f == 0:
                    ax.set_ylabel(label, fontsize=9)
                ax.tick_params(labelsize=8)
                ax.grid(True, which="major", alpha=0.3)
                if r == 0 and ax.get_lines():
                    ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, path)


def line_style(variant: str, place: int) -> str:
    """LINE_STYLES by the encoding's place in its family's panel (0: the first), one step further for the
    second algorithm of an encoding (luo_rpe's fft path, rotinv's random mode)."""
    return LINE_STYLES[(place + ("(fft)" in variant or "(random)" in variant)) % len(LINE_STYLES)]


def describe_crossovers(cross: pd.DataFrame) -> list[str]:
    """The crossover table as Markdown."""
    tokens = lambda v: f"{v:.0f}" if math.isfinite(v) else "—"  # noqa: E731 - a token count, never 1.04e+03
    shown = cross.assign(**{"overtakes from N": [tokens(v) if h != "not reached" else "not within the measured N"
                                                 for v, h in zip(cross["overtakes from N"], cross["how"])],
                            "extrapolated N": [tokens(v) for v in cross["extrapolated N"]]})
    cols = ["device", "variant", "against", "smallest N", "ratio at smallest N", "ratio at largest N", "largest N",
            "overtakes from N", "how", "extrapolated N", "counterpart out of memory at N"]
    return [markdown_table(cols, shown[cols].itertuples(index=False))]


def build(results_dir: Path) -> str | None:
    """Markdown section (and token_scaling.png) for the token-scaling bench rows under results_dir."""
    trials = read_trials(results_dir, ["bench"])
    rows = scaling_rows(trials.frame)
    if rows.empty:
        return None
    table = per_image(rows)
    exps = exponents(table)
    cross = crossovers(table, exps)
    plot(table, results_dir / "token_scaling.png")
    parts = ["## Token scaling: where the efficient variants pay", "", trials.note(), "",
             f"{timing_text(rows)} per variant and N, each bench trial alone on the machine; per "
             "image (the batch shrinks as N grows). Step memory: one training step's peak above what the process "
             "held when it started (`step_mem_kind`).", "",
             f"### Fitted exponents over each variant's top decade (N >= N_max / {fmt(TOP_DECADE)})", "",
             "`sizes in the fit`: the measured N in that decade; a fit through 2 sizes is a line through two "
             "points, no more (a variant measured only at large N, as the FFT path).", "",
             markdown_table(list(exps.columns), exps.itertuples(index=False)), "",
             "### Where each linear variant overtakes its softmax counterpart (training step per image)", "",
             *describe_crossovers(cross), "",
             "`ratio`: the linear variant's training step per image over its counterpart's; `largest N`: the "
             "largest N where both ran; `counterpart out of memory at N`: sizes where the linear variant ran and "
             "its counterpart did not fit in memory (no ratio there: only the linear one runs). `overtakes from N`: "
             "interpolated log-log between the last size where softmax was as fast and the next; `extrapolated N`: "
             "where the fitted top-decade lines would cross, beyond the measurements (a projection, not a "
             f"measurement), given only where the exponents differ by at least {fmt(EXPONENT_TOLERANCE)} (closer "
             f"ones are equal within the fit's precision) and within {fmt(EXTRAPOLATION_REACH)} x the largest N.", ""]
    paths = luo_path_table(table)
    if paths:
        lines = []
        for kind, entry in paths.items():
            n = entry["measured_tokens"]
            lines += [f"- {kind} ({entry['device_name']}): FFT path faster from N = {entry['fft_from_tokens']}"
                      if entry["fft_from_tokens"] is not None else
                      f"- {kind} ({entry['device_name']}): dense path faster up to the largest N measured ({n[-1]})",
                      f"  Each figure: the median over the kernelized backends measured at that N "
                      f"({luo_path_backends(table, entry['device_name'])}).", "",
                      "  " + markdown_table(["N", "dense ms/image", "fft ms/image"],
                                            zip(n, entry["dense_ms_per_image"], entry["fft_ms_per_image"]))
                      .replace("\n", "\n  ")]
        parts += ["### luo_rpe on kernelized backends: the dense / FFT crossover (`luo_path: auto`)", "", *lines, ""]
    parts += ["![token scaling](token_scaling.png)", ""]
    return "\n".join(parts)


def read_crossover(path: Path) -> dict:
    """The crossover table now in `path`, or one line and exit where it is not a JSON object."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        table = err
    if not isinstance(table, dict):
        raise SystemExit(f"error: {path} is not a crossover table ({' '.join(str(table).split())[:200]}); allowed: "
                         f"the JSON object --write-crossover writes (restore it from git, or delete it)")
    return table


def write_crossover(results_dir: Path, path: Path = CROSSOVER_FILE) -> dict:
    """Merge this study's dense/FFT table into the committed crossover file (other device kinds kept)."""
    rows = scaling_rows(read_trials(results_dir, ["bench"]).frame)
    measured = luo_path_table(per_image(rows)) if not rows.empty else {}
    if not measured:
        raise SystemExit(f"no luo_rpe rows on both paths (luo_path dense and fft) under {results_dir}")
    table = read_crossover(path) if path.is_file() and not path.is_symlink() else {}  # a link: refused below
    for kind, entry in measured.items():
        table[kind] = {**entry, "source": str(results_dir)}
    write_text_file(path, json.dumps(table, indent=1) + "\n")
    print(f"wrote {path}: " + ", ".join(f"{k} fft from {v['fft_from_tokens']}" for k, v in measured.items()))
    return table


def main() -> None:
    parser = results_parser(__doc__.splitlines()[0])
    parser.add_argument("--write-crossover", action="store_true",
                        help=f"write the measured luo_rpe dense/FFT crossover into {CROSSOVER_FILE.name}")
    args = parser.parse_args()
    require_trials(parser, "RESULTS_DIR", args.results_dir)
    write_study(args.results_dir, "token_scaling.md", "Token scaling", "token-scaling bench trials",
                build(args.results_dir))
    rows = scaling_rows(read_trials(args.results_dir, ["bench"]).frame)
    for kind, entry in luo_path_table(per_image(rows)).items():
        found = entry["fft_from_tokens"]
        print(f"luo_rpe dense/FFT crossover measured on {kind} ({entry['device_name']}): "
              + (f"FFT faster from N = {found}" if found is not None else
                 f"dense faster at every N measured (up to {entry['measured_tokens'][-1]})"))
    if args.write_crossover:
        write_crossover(args.results_dir)
