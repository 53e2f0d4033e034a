"""The rotation study: what a rotation-invariant RPE buys where rotation matters.

    python analysis/rotation.py RESULTS_DIR [--bench BENCH_DIR ...]

From the current `train` trials that ran the test-time rotations (`eval_rotations: standard`:
search_spaces/rotation_mnist_cpu.yaml), per dataset, attention configuration (backend, qk_norm,
redraw schedule) and training augmentation (`none`: upright; `rotate`: a uniform random angle per
image):

- a long table, one row per (cell, test rotation) with the rotation in {0, 90, 180, 270, random}
  (0/90/180/270 exact, by torch.rot90; random: one fixed angle per test image, the same for every
  trial): the judged accuracy (a random-feature model: its mean over fresh draws,
  `test_acc_rot*_draw_mean`; else its exact accuracy) as mean [95% t interval] (n seeds), written
  to rotation_long.csv beside the Markdown;
- the drop under exact quarter turns, per seed: upright accuracy minus the mean over 90, 180 and 270
  degrees (the same model measured twice, so the difference is taken per seed), mean [95% t interval].
  Exact turns on both sides (torch.rot90, no interpolation): the drop to random angles would compare an
  uninterpolated image with bilinearly resampled ones, and models trained on (bilinear) rotations score
  higher on resampled images, so that drop measures interpolation, not invariance (issue 41);
- the cost: train s/epoch from `bench` rows of the same model where there are any (each alone on its
  node; under RESULTS_DIR or in a --bench folder such as results/bench_rotation_mnist_cpu, whose
  FAVOR+ rows must have the study's redraw interval), else from the train rows, labelled contended
  when trials ran side by side (efficiency.overlapped): such times are not comparable between variants;
- verdicts, Holm-corrected (rpevit.analysis.stats): per (cell, test rotation), the family of every
  rotation-invariant variant (rotinv exact, rotinv random) against every other encoding, Welch
  differences of accuracy; per cell, the same family on the drop. An effect is claimed only where its
  Holm-level interval excludes 0; else "not resolved with n seeds".

Writes rotation.md and rotation_long.csv into RESULTS_DIR.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis.common import (TrialRows, code_span, column, fmt, has_random_features, markdown_table, pe_labels,
                                    ran_test_rotations, read_trials, redraw_labels, require_trials, results_parser,
                                    write_study, write_text_file)
from rpevit.analysis.efficiency import (BENCH_TIMING, CONTENDED, ONE_AT_A_TIME, TIME_DEVICES, UNKNOWN_TIMES,
                                        field_matches, model_fields, overlapped, time_devices, with_resolved_shape)
from rpevit.analysis.stats import Judged, judge_family, mean_interval, seeds_text, welch
from rpevit.data import DATASET_SPECS
from rpevit.evaluation import ROTATIONS

INVARIANT_PE = "rotinv"  # the rotation-invariant RPE (rpevit/pe/rotation_invariant.py)
UPRIGHT, RANDOM = "0", "random"
QUARTER_TURNS = ("90", "180", "270")  # exact rotations (torch.rot90): the drop compares like with like
CELL = ("dataset", "attention", "qk_norm", "redraw", "augment")  # one table; pe varies inside it
KEY = (*CELL, "pe")  # one variant
LONG_COLUMNS = (*KEY, "rotation", "seed", "acc", "acc_own_draw", "train_s_per_epoch")
AUGMENT_WORDS = {"none": "trained upright (augment none)", "rotate": "trained on rotated images (augment rotate)"}
CSV_FILE = "rotation_long.csv"


def metric_names(rotation: str) -> tuple[str, str]:
    """(exact, draw-mean) column names of one test rotation in the train rows."""
    name = "test_acc_rot_random" if rotation == RANDOM else f"test_acc_rot{rotation}"
    return name, f"{name}_draw_mean"


def rotation_pe_labels(frame: pd.DataFrame) -> pd.Series:
    """pe, with the rotinv mode spelled out ('rotinv (exact)', 'rotinv (random, 16 draws)'), its
    kernelized path where it is the dense one ('rotinv (exact, dense path)': the same model, another
    cost) and the other encodings' variant options where they vary (common.pe_labels)."""
    labels = pe_labels(frame)
    paths = column(frame, "rotinv_path", "lowrank").fillna("lowrank").astype(str)
    for i in frame.index[frame["pe"] == INVARIANT_PE]:
        mode = str(column(frame, "rotinv_mode", "exact")[i])
        draws = column(frame, "rotinv_draws")[i]
        path = ", dense path" if paths[i] == "dense" else ""
        labels[i] = (f"{INVARIANT_PE} (random, {fmt(draws)} draws{path})" if mode == "random"
                     else f"{INVARIANT_PE} ({mode}{path})")
    return labels


def resolved_augment(frame: pd.DataFrame) -> pd.Series:
    """`augment` with `auto` replaced by the dataset's default (rpevit.data.DATASET_SPECS)."""
    augment = column(frame, "augment", "auto").fillna("auto").astype(str)
    default = frame["dataset"].map(lambda d: DATASET_SPECS[d].augment if d in DATASET_SPECS else "auto")
    return augment.where(augment != "auto", default)


def rotation_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The train rows that carry test-time rotations (any finite test_acc_rot*), with the CELL / KEY
    columns filled in: pe label, qk_norm, redraw label, resolved augment."""
    if frame.empty:
        return frame
    rows = frame[ran_test_rotations(frame)].copy()
    if rows.empty:
        return rows
    rows["pe"] = rotation_pe_labels(rows)
    rows["qk_norm"] = column(rows, "qk_norm", "none").fillna("none").astype(str)
    random = has_random_features(rows)
    rows["redraw"] = redraw_labels(rows, random)
    rows["augment"] = resolved_augment(rows)
    rows["random_features"] = random
    return rows


def long_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, test rotation, seed): `acc` the judged accuracy (draw mean for a
    random-feature model, NaN if it has none; else exact), `acc_own_draw` the accuracy with the
    model's own weights and draw. A seed present in several rows (two sweeps) counts once, averaged."""
    if rows.empty:
        return pd.DataFrame(columns=list(LONG_COLUMNS))
    parts = []
    for rotation in ROTATIONS:
        exact, draw_mean = metric_names(rotation)
        own = pd.to_numeric(column(rows, exact), errors="coerce")
        mean = pd.to_numeric(column(rows, draw_mean), errors="coerce")
        part = rows[list(KEY)].copy()
        part["rotation"] = rotation
        part["seed"] = rows["seed"]
        part["acc"] = mean.where(rows["random_features"], own)
        part["acc_own_draw"] = own
        part["train_s_per_epoch"] = pd.to_numeric(column(rows, "train_s_per_epoch"), errors="coerce")
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out["rotation"] = pd.Categorical(out["rotation"], categories=list(ROTATIONS), ordered=True)
    grouped = out.groupby([*KEY, "rotation", "seed"], observed=True, dropna=False)
    return grouped[["acc", "acc_own_draw", "train_s_per_epoch"]].mean().reset_index()[list(LONG_COLUMNS)]


def matching(long: pd.DataFrame, key: tuple, names: tuple[str, ...] = KEY) -> np.ndarray:
    """Boolean mask of the rows of `long` whose `names` columns equal `key`."""
    mask = np.ones(len(long), dtype=bool)
    for name, value in zip(names, key):
        mask = mask & np.asarray(long[name] == value, dtype=bool)
    return mask


def values(long: pd.DataFrame, key: tuple, rotation: str) -> np.ndarray:
    """Judged accuracies over seeds of one variant (KEY values) at one test rotation, finite only."""
    mask = matching(long, key) & np.asarray(long["rotation"] == rotation, dtype=bool)
    acc = long.loc[mask, "acc"].to_numpy(float)
    return acc[np.isfinite(acc)]


def drops(long: pd.DataFrame, key: tuple, rotations: Sequence[str] = QUARTER_TURNS) -> np.ndarray:
    """Per seed: accuracy upright minus the mean accuracy over `rotations` (the same model measured
    several times). The default, exact quarter turns, leaves interpolation out of both sides."""
    g = long[matching(long, key)]
    upright = g[g["rotation"] == UPRIGHT].set_index("seed")["acc"]
    turned = g[g["rotation"].isin(list(rotations))].groupby("seed")["acc"].agg(
        lambda a: a.mean() if len(a) == len(rotations) else math.nan)
    d = (upright - turned.reindex(upright.index)).to_numpy(float)
    return d[np.isfinite(d)]


def is_invariant(pe: str) -> bool:
    return pe.split(" (")[0] == INVARIANT_PE


def families(long: pd.DataFrame, cell: tuple) -> tuple[dict[str, dict[tuple[str, str], Judged]],
                                                       dict[tuple[str, str], Judged]]:
    """Holm families of one cell: per test rotation, every (rotation-invariant variant, other encoding)
    Welch difference of accuracy; and the same pairs on the drop under exact quarter turns."""
    pes = sorted(long.loc[matching(long, cell, CELL), "pe"].unique())
    pairs = [(inv, other) for inv in pes if is_invariant(inv) for other in pes if not is_invariant(other)]
    by_rotation = {}
    for rotation in ROTATIONS:
        by_rotation[rotation] = judge_family({
            (inv, other): partial(welch, values(long, (*cell, inv), rotation), values(long, (*cell, other), rotation))
            for inv, other in pairs})
    on_drop = judge_family({(inv, other): partial(welch, drops(long, (*cell, inv)), drops(long, (*cell, other)))
                            for inv, other in pairs})
    return by_rotation, on_drop


# ---------------------------------------------------------------- cost
def timing_labels(rows: pd.DataFrame) -> pd.Series:
    """Per row: how its train_s_per_epoch was measured (efficiency's labels)."""
    side_by_side = overlapped(rows)
    return side_by_side.map(lambda o: UNKNOWN_TIMES if not isinstance(o, (bool, np.bool_)) else
                            CONTENDED if o else ONE_AT_A_TIME)


def bench_seconds(bench: pd.DataFrame, row: pd.Series) -> float:
    """Train s/epoch of the train row's model from bench rows (median training ms per image x its
    images per epoch), matching dataset, attention, pe and the model fields that apply; NaN if none."""
    found = bench_match(bench, row)
    if found.empty:
        return math.nan
    per_image = (found["train_step_ms"] / found["bench_batch"]).median()
    return float(per_image * row["n_train"] / 1e3)


def bench_match(bench: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The bench rows of the train row's model (bench_seconds' times are theirs); none where there are none."""
    if bench.empty or not {"train_step_ms", "bench_batch"} <= set(bench.columns):
        return bench.iloc[:0]
    mask = (bench["dataset"] == row["dataset"]) & (bench["attention"] == row["attention"]) & \
           (bench["pe"] == row["pe_name"])
    for name in model_fields(row["attention"], row["pe_name"]):
        mask &= field_matches(bench, name, row.get(name))
    if "qk_norm" in bench.columns:
        mask &= bench["qk_norm"].fillna("none") == row["qk_norm"]
    if row["draws_features"]:  # a redraw every step costs a feature draw per step: time the schedule that ran
        mask &= pd.to_numeric(column(bench, "redraw_interval"), errors="coerce") == row["redraw_interval"]
    return bench[mask]


def cost_table(rows: pd.DataFrame, bench: pd.DataFrame) -> pd.DataFrame:
    """Per variant (KEY): train s/epoch and how it was measured: bench (alone) where a bench row of
    the same model exists, else the mean of its train rows, labelled contended / one at a time; TIME_DEVICES:
    the device_name of each row the time is of (efficiency.time_devices names them)."""
    if rows.empty:
        return pd.DataFrame(columns=[*KEY, "train_s_per_epoch", "timing", TIME_DEVICES])
    r = with_resolved_shape(rows)
    r["pe_name"] = frame_pe(rows)
    r["timing"] = timing_labels(rows)
    r["n_train"] = pd.to_numeric(column(r, "n_train"), errors="coerce")
    r["draws_features"] = has_random_features(rows)
    r["redraw_interval"] = pd.to_numeric(column(r, "redraw_interval"), errors="coerce")
    b = with_resolved_shape(bench) if not bench.empty else bench
    out = []
    devices = lambda rows: tuple(column(rows, "device_name", None))  # noqa: E731
    for key, g in r.groupby(list(KEY), dropna=False):
        seconds = bench_seconds(b, g.iloc[0])
        if math.isfinite(seconds):
            out.append([*key, seconds, BENCH_TIMING, devices(bench_match(b, g.iloc[0]))])
            continue
        labels = set(g["timing"])
        timing = CONTENDED if CONTENDED in labels else UNKNOWN_TIMES if UNKNOWN_TIMES in labels else ONE_AT_A_TIME
        out.append([*key, float(pd.to_numeric(g["train_s_per_epoch"], errors="coerce").mean()), timing, devices(g)])
    return pd.DataFrame(out, columns=[*KEY, "train_s_per_epoch", "timing", TIME_DEVICES])


def frame_pe(rows: pd.DataFrame) -> pd.Series:
    """The registered encoding name of each row (its `pe` before the variant label)."""
    return rows["pe"].str.split(" (", n=1, regex=False).str[0]


# ---------------------------------------------------------------- words
def pair_text(pair: tuple[str, str], judged: Judged) -> str:
    return f"{pair[0]} − {pair[1]}: {judged.interval.text(scale=100)}"


def resolved_pairs(by_rotation: dict[str, dict[tuple[str, str], Judged]], sign: int) -> list[str]:
    """Per (invariant, other) pair resolved with this sign at some test rotation: 'rotinv (exact) vs ape at
    test rotations 90, random (at random: 30 [28, 32] (n=3,3; 99.2%) points, k=6)': the interval shown is
    the one at the random rotation where that is resolved, else at the last resolved rotation."""
    found: dict[tuple[str, str], list[tuple[str, Judged]]] = {}
    for rotation, family in by_rotation.items():
        for pair, judged in family.items():
            if judged.resolved and sign * judged.interval.point > 0:
                found.setdefault(pair, []).append((rotation, judged))
    out = []
    for (inv, other), hits in found.items():
        rotation, judged = hits[-1]  # ROTATIONS order: random last
        out.append(f"{inv} vs {other} at test rotation{'s' if len(hits) > 1 else ''} "
                   f"{', '.join(r for r, _ in hits)} (at {rotation}: {judged.interval.text(scale=100)} points, "
                   f"k={judged.k})")
    return out


def verdict(cell: tuple, by_rotation: dict[str, dict[tuple[str, str], Judged]],
            on_drop: dict[tuple[str, str], Judged], mean_drops: dict[str, float] | None = None) -> str:
    """Words from the Holm families of one cell: where a rotation-invariant variant is resolved above
    or below another encoding (accuracy, per test rotation), where its drop under exact quarter turns is
    lower or higher, and how many comparisons are not resolved. Nothing else is claimed. The drop is
    signed (upright minus the mean over 90/180/270 degrees); each drop comparison shows both mean drops
    (mean_drops: per pe, accuracy fraction), since a lower drop is nearer invariance only when both are
    at or above 0."""
    dataset, attention, qk_norm, redraw, augment = cell
    config = attention + ("" if qk_norm == "none" else f", qk_norm {qk_norm}") + \
        ("" if redraw == "off" else f", redraw {redraw}")
    head = f"**{dataset}, {config}, {AUGMENT_WORDS.get(augment, f'augment {augment}')}.**"
    if not any(by_rotation.values()):
        return f"{head} No rotation-invariant variant beside another encoding here: nothing to compare."
    judged_all = [j for family in by_rotation.values() for j in family.values()]
    total = len(judged_all)
    unresolved = sum(not j.resolved for j in judged_all)
    ns = sorted({n for j in judged_all for n in j.interval.n})
    seeds = seeds_text(ns) if ns else "0 seeds"
    helps, hurts = resolved_pairs(by_rotation, +1), resolved_pairs(by_rotation, -1)
    lines = [head]
    if helps:
        lines.append("Rotation invariance helps (accuracy resolved above, Holm per test rotation): "
                     + "; ".join(helps) + ".")
    if hurts:
        lines.append("It costs accuracy (resolved below): " + "; ".join(hurts) + ".")
    if not helps and not hurts:
        lines.append(f"No accuracy difference between a rotation-invariant variant and the other encodings is "
                     f"resolved at any test rotation (Holm per rotation; {total} comparisons, {seeds}).")
    elif unresolved:
        lines.append(f"The other {unresolved} of {total} accuracy comparisons (pair x test rotation) are not "
                     f"resolved with {seeds}.")
    def drop_text(pair: tuple[str, str], judged: Judged) -> str:
        if not mean_drops:
            return pair_text(pair, judged)
        return (f"{pair_text(pair, judged)} (mean drops {fmt(100 * mean_drops[pair[0]], 3)} and "
                f"{fmt(100 * mean_drops[pair[1]], 3)})")

    less = [drop_text(p, j) for p, j in on_drop.items() if j.resolved and j.interval.point < 0]
    more = [drop_text(p, j) for p, j in on_drop.items() if j.resolved and j.interval.point > 0]
    for pairs, word in ((less, "lower"), (more, "higher")):
        if pairs:
            lines.append(f"Its drop under exact quarter turns (upright minus the mean at 90/180/270 degrees; "
                         f"negative: higher when turned) is {word} (difference of drops, points): "
                         + "; ".join(pairs) + ".")
    if on_drop and not less and not more:
        lines.append(f"No difference in the drop under exact quarter turns is resolved "
                     f"(k={next(iter(on_drop.values())).k}).")
    elif on_drop and len(less) + len(more) < len(on_drop):
        lines.append(f"The other {len(on_drop) - len(less) - len(more)} differences of drops are not resolved.")
    return " ".join(lines)


SHORT_TIMING = {BENCH_TIMING: "bench, alone", CONTENDED: "contended", ONE_AT_A_TIME: "one trial at a time",
                UNKNOWN_TIMES: "possibly contended"}


def accuracy_cells(long: pd.DataFrame, cell: tuple, costs: pd.DataFrame) -> list[list[str]]:
    """Per encoding of one cell: accuracy at each test rotation and the drop under exact quarter turns, each
    mean [95% t interval] (n) in %, and its train s / epoch with how it was measured (cost_table)."""
    g = long[matching(long, cell, CELL)]
    rows = []
    for pe in sorted(g["pe"].unique(), key=lambda p: (is_invariant(p), p)):
        key = (*cell, pe)
        cost = costs[matching(costs, key)]
        seconds = (f"{fmt(cost['train_s_per_epoch'].iloc[0], 3)} ({SHORT_TIMING.get(cost['timing'].iloc[0])})"
                   if len(cost) else "—")
        rows.append([pe, *(mean_interval(values(long, key, r)).text(scale=100, digits=4) for r in ROTATIONS),
                     mean_interval(drops(long, key)).text(scale=100), seconds])
    return rows


def study(results_dir: Path, bench_dirs: Sequence[Path] = ()) -> tuple[TrialRows, pd.DataFrame, pd.DataFrame] | None:
    """(the rows read, the long table, the cost table) of the rotation rows under results_dir, with bench rows
    from results_dir and each of bench_dirs; None without any rotation rows."""
    trials = read_trials(results_dir, ["train", "bench"])
    frame = trials.frame
    if frame.empty or "task" not in frame.columns:
        return None
    rows = rotation_rows(frame[frame["task"] == "train"])
    if rows.empty:
        return None
    bench = pd.concat([frame[frame["task"] == "bench"], *(read_trials(d, ["bench"]).frame for d in bench_dirs)],
                      ignore_index=True, sort=False)
    return trials, long_table(rows), cost_table(rows, bench)


def cells(long: pd.DataFrame) -> list[tuple]:
    """The CELL values of the long table, sorted: one table and one verdict each."""
    return list(long[list(CELL)].drop_duplicates().sort_values(list(CELL)).itertuples(index=False, name=None))


def mean_drops(long: pd.DataFrame, cell: tuple) -> dict[str, float]:
    """Per encoding of one cell: its mean drop under exact quarter turns (accuracy fraction)."""
    return {pe: float(np.mean(d)) for pe in long.loc[matching(long, cell, CELL), "pe"].unique()
            if len(d := drops(long, (*cell, pe)))}


def build(results_dir: Path, bench_dirs: Sequence[Path] = ()) -> str | None:
    """Markdown section (and rotation_long.csv) for the rotation rows under results_dir; None without any.
    Bench rows come from results_dir and from each of bench_dirs: the study's own trials ran side by
    side, so their times are contended; a bench sweep of the same models, alone, is the cost to quote."""
    found = study(results_dir, bench_dirs)
    if found is None:
        return None
    trials, long, costs = found
    write_text_file(Path(results_dir) / CSV_FILE, long.to_csv(index=False))
    parts = ["## Rotations: what a rotation-invariant RPE buys where rotation matters", "", trials.note(), ""]
    for cell in cells(long):
        by_rotation, on_drop = families(long, cell)
        dataset, attention, qk_norm, redraw, augment = cell
        parts += [verdict(cell, by_rotation, on_drop, mean_drops(long, cell)), "",
                  f"### {dataset}, {attention} (qk_norm {qk_norm}, redraw {redraw}), augment {augment}: "
                  f"accuracy % at each test rotation, mean [95% t] (n); train s / epoch on "
                  f"{time_devices(costs[matching(costs, cell, CELL)])}", "",
                  markdown_table(["pe", *(f"test rot {r}" for r in ROTATIONS), "drop 0 → 90/180/270, points",
                                  "train s / epoch"], accuracy_cells(long, cell, costs)), ""]
    parts += ["Accuracy: the judged accuracy (random-feature backends: mean over fresh draws, as everywhere in these "
              "reports; others: exact). Test rotations 0/90/180/270 are exact (torch.rot90); `random` is one fixed "
              "angle per test image (rpevit.evaluation.ROTATION_EVAL_SEED), bilinear with zero fill. Drop: upright "
              "minus the mean accuracy at 90/180/270 degrees per seed, exact turns on both sides (the drop to random "
              "angles would set an uninterpolated image against resampled ones). Verdicts: Welch differences of the rotation-invariant "
              "variants against every other encoding, Holm within each test rotation (and on the drop); an effect is "
              "claimed only where its Holm-level interval excludes 0. Train s / epoch: from bench trials of the same "
              "model where there are any (bench, alone), else the mean of the train rows; contended times (trials "
              "ran side by side) are not comparable between variants, and \"one trial at a time\" means only that "
              "no other trial of these results overlapped it (other processes on the machine are not recorded)."
              f"{bench_note(bench_dirs)} Long table: `{CSV_FILE}`.", ""]
    return "\n".join(parts)


def bench_note(bench_dirs: Sequence[Path]) -> str:
    if not bench_dirs:
        return ""
    return f" Bench rows read from: {', '.join(code_span(Path(d).as_posix()) for d in bench_dirs)}."


def main() -> None:
    parser = results_parser(__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, action="append", default=[], metavar="DIR",
                        help="a bench sweep folder of the same models, timed alone (repeatable); its times replace "
                             "the study's own, contended ones")
    args = parser.parse_args()
    for name, folder in [("RESULTS_DIR", args.results_dir), *(("--bench", d) for d in args.bench)]:
        require_trials(parser, name, folder)
    write_study(args.results_dir, "rotation.md", "The rotation study", "rotation-study trials",
                build(args.results_dir, args.bench))

if __name__ == "__main__":
    from rpevit.tool_exit import run_tool

    run_tool(main)
