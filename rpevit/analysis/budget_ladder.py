"""A budget ladder's answer: accuracy against training budget per variant, and how stable the ranking of
the variants is from one budget to the next.

    python analysis/budget_ladder.py RESULTS_DIR

Reads the `train` rows of one study whose trials differ in `epochs` (a space with `branch: epochs`,
e.g. search_spaces/cifar10_ladder_cpu.yaml). Every figure carries its budget as "N epochs (M images)":
a ladder's rungs are fixed budgets, none of them "final". Per variant and budget: the judged accuracy
(mean over fresh draws for random-feature models) as mean [95% t interval] (n seeds). Between every two
budgets: Kendall's tau of each seed's own ranking at the two budgets (paired by seed: a seed's rungs share
its trunk), their mean with its t interval (n seeds), and, labelled apart, the tau of the rankings of the
mean accuracies (no interval), and every pair of variants whose means swap order with its difference at
both budgets (Welch 95%: a swap within seed noise is no change of answer); the highest mean at each budget
names the variants it is not resolved from (Welch, Holm over its k - 1 differences to the others: the top is
picked from the data).
Whether that pairing holds is checked from the epoch rows (shared_epochs): a seed's shorter rung and every
longer rung of it record the same epochs before the shorter rung's cool-down where they are one run up to
there (a branched trunk, or a rerun that reproduced it exactly), and any pair that does not is named.
Everything here is exploratory: the
study's declared comparisons are in confirmatory.md (analysis/confirmatory.py). Writes
budget_ladder.md and budget_ladder.png into RESULTS_DIR.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from rpevit.analysis import stats, variants
from rpevit.analysis.common import (column, devices_text, fmt, judged_accuracy, markdown_table, md_text, pyplot,
                                    raw_text, read_epoch_curves, read_trials, save_figure, script_main, trial_files,
                                    with_variant)
from rpevit.config import TrialConfig
from rpevit.sweep.declaration import DECLARATION_FILE
from rpevit.sweep.results import STORED_KEY
from rpevit.tasks.budget_ladder import ladder_branch_epoch

LEVEL = 0.95


def ladder_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Train rows with their variant label, budget (epochs, images) and judged accuracy; empty when the
    rows hold one budget only (not a ladder)."""
    if frame.empty or "epochs" not in frame.columns or frame["epochs"].nunique() < 2:
        return frame.iloc[0:0]
    rows = with_variant(frame)
    rows["variant"] = rows["attention"].astype(str) + "+" + rows["pe"].astype(str)
    rows["acc"] = judged_accuracy(frame).to_numpy() * 100
    rows["images"] = pd.to_numeric(rows["epochs"], errors="coerce") * pd.to_numeric(rows["n_train"], errors="coerce")
    return rows


def per_budget(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, epochs): images seen, mean [t interval] (n) of the judged accuracy, the
    mean's standard error and df (for the tau interval)."""
    out = []
    for (variant, epochs), g in rows.groupby(["variant", "epochs"]):
        acc = stats.finite(g["acc"])
        iv = stats.mean_interval(acc)
        se = float(acc.std(ddof=1) / math.sqrt(len(acc))) if len(acc) > 1 else math.nan
        out.append({"variant": variant, "epochs": int(epochs), "images": float(g["images"].median()),
                    "mean": iv.point, "interval": iv, "se": se, "n": len(acc)})
    return pd.DataFrame(out)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    return float(scipy_stats.kendalltau(a, b).statistic)


@dataclass(frozen=True)
class PairedBlock:
    """The variants and seeds that every per-seed tau between two budgets is taken over: each variant used holds
    each seed used at both budgets (a finite accuracy), so every seed's tau ranks the same variants and their mean
    averages one quantity. Where the cells do not all hold the same seeds (a study still running, or published
    before every cell is complete) a seed ranking 9 variants and one ranking 8 are not replicates of one ranking,
    and two budget pairs over different variant sets are not comparable either: the variants or seeds that break
    the block are left out and named, never averaged over. `left_out`: each variant at both budgets that is not
    used, with the seeds used that it lacks; `seeds_left_out`: each seed some variant used holds at both budgets
    that is not used, with the variants used that lack it."""

    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    left_out: tuple[tuple[str, tuple[int, ...]], ...] = ()
    seeds_left_out: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def notes(self) -> list[str]:
        """['relu+ape left out: seeds 8, 9 missing', 'seed 4 left out: missing for favor+ape']: what was left out
        and why, generated from the rows; [] where nothing was."""
        notes = [f"{variant} left out: {_seeds_text(missing)} missing" for variant, missing in self.left_out]
        return notes + [f"seed {seed} left out: missing for {', '.join(lacking)}"
                        for seed, lacking in self.seeds_left_out]

    def text(self) -> str:
        """'8' where nothing was left out, else '8 (relu+ape left out: seeds 8, 9 missing)': how many variants
        every tau ranks, and which were left out and why."""
        notes = self.notes()
        return f"{len(self.variants)}" + (f" ({'; '.join(notes)})" if notes else "")


def _seeds_text(seeds: tuple[int, ...]) -> str:
    return f"seed{'' if len(seeds) == 1 else 's'} {', '.join(map(str, seeds))}"


def held_seeds(rows: pd.DataFrame, first: int, second: int) -> dict[str, frozenset[int]]:
    """Per variant: the seeds with a finite accuracy at both budgets (a seed's tau can rank the variant)."""
    seed = pd.to_numeric(rows["seed"], errors="coerce")
    held = rows[rows["epochs"].isin([first, second]) & np.isfinite(pd.to_numeric(rows["acc"], errors="coerce"))
                & np.isfinite(seed)]
    out: dict[str, frozenset[int]] = {}
    for variant, g in held.groupby("variant"):
        at = [set(pd.to_numeric(g.loc[g["epochs"] == e, "seed"]).astype(int)) for e in (first, second)]
        out[str(variant)] = frozenset(at[0] & at[1])
    return out


def paired_block(rows: pd.DataFrame, first: int, second: int, minimum: int = 3) -> PairedBlock | None:
    """The PairedBlock of two budgets, or None where no seed holds `minimum` variants at both. Its seeds are
    those that hold every one of its variants at both budgets, and its variants those that hold every one of its
    seeds (the intersection over seeds): of every such block with `minimum` variants or more, the one with the
    most (variant, seed) cells, so no cell is dropped where every cell holds every seed; ties go to more seeds
    (the interval is over seeds), then to the first in name order. The candidates are the intersections of the
    variants' seed sets, enumerated in full (a ladder has some ten variants and seeds)."""
    held = {v: s for v, s in held_seeds(rows, first, second).items() if s}
    candidates: set[frozenset[int]] = set()
    for seeds in held.values():
        candidates |= {seeds} | {seeds & c for c in candidates}
    blocks = []
    for seeds in candidates:
        members = tuple(sorted(v for v, s in held.items() if seeds <= s))
        if seeds and len(members) >= minimum:
            blocks.append((-len(members) * len(seeds), -len(seeds), members, tuple(sorted(seeds))))
    if not blocks:
        return None
    _, _, members, seeds = min(blocks)
    left_out = tuple((v, tuple(sorted(set(seeds) - s))) for v, s in sorted(held.items()) if v not in members)
    extra = sorted(set().union(*(held[v] for v in members)) - set(seeds))
    seeds_left_out = tuple((seed, tuple(v for v in members if seed not in held[v])) for seed in extra)
    return PairedBlock(members, seeds, left_out, seeds_left_out)


def seed_taus(rows: pd.DataFrame, first: int, second: int) -> dict[int, float]:
    """Per seed of the PairedBlock (paired_block): Kendall's tau between the variants' accuracies of THAT seed at
    the two budgets, over the block's variants (3 or more), the same for every seed so that their mean is a mean
    of one quantity. Paired by seed because a seed's rungs are one run: the shorter budgets branch from the
    longest run of the same seed at their cool-down start (rpevit/tasks/budget_ladder.py), so a seed's two
    accuracies are not independent draws, and its own ranking at both budgets is the replicate."""
    block = paired_block(rows, first, second)
    if block is None:
        return {}
    out = {}
    for seed in block.seeds:
        g = rows[(pd.to_numeric(rows["seed"], errors="coerce") == seed) & rows["variant"].isin(block.variants)]
        at = {e: g[g["epochs"] == e].groupby("variant")["acc"].mean() for e in (first, second)}
        out[seed] = kendall_tau(at[first][list(block.variants)].to_numpy(),
                                at[second][list(block.variants)].to_numpy())
    return out


@dataclass(frozen=True)
class LadderTau:
    """How alike the variants' rankings are at two budgets. `per_seed`: the mean of the per-seed taus
    (seed_taus) with its one-sample t interval at LEVEL, clipped to [-1, 1] (the range of a tau), n = the
    seeds; the figure that carries an interval. `of_means`: Kendall's tau between the rankings of the
    variants' mean accuracies, a different quantity (a ranking of means is steadier than any one seed's), shown
    beside it without an interval. `variants`: how many variants both rank: the PairedBlock's (`block`), or,
    where there is none (no rows, or no seed with 3 variants at both budgets), the variants at both budgets."""

    per_seed: stats.Interval
    of_means: float
    variants: int
    block: PairedBlock | None = None
    unclipped: stats.Interval | None = None  # the t interval as computed, where a bound passed [-1, 1]

    def variants_text(self) -> str:
        """The variants column: the count, with the variants or seeds left out and why (PairedBlock.text)."""
        return self.block.text() if self.block is not None else str(self.variants)


def tau_interval(table: pd.DataFrame, first: int, second: int, rows: pd.DataFrame | None = None) -> LadderTau:
    """LadderTau of two budgets: NaN of_means below 3 variants at both, no per-seed figure without `rows`
    (n=0), no interval below 2 per-seed taus. With `rows`, both taus rank the variants of the PairedBlock
    (paired_block), the tau of the means included, so that the two figures set side by side, and every budget
    pair, say which variants they rank. The interval is the t interval of the per-seed taus, not a bootstrap of
    the means: perturbing every mean independently shrinks tau (its draws sat below the point value) and ignores
    that a seed's rungs share a trunk."""
    a = table[table["epochs"] == first].set_index("variant")
    b = table[table["epochs"] == second].set_index("variant")
    common = sorted(set(a.index) & set(b.index))
    block = paired_block(rows, first, second) if rows is not None else None
    if block is not None:
        common = list(block.variants)
    if len(common) < 3:
        return LadderTau(stats.Interval(math.nan, n=(0,)), math.nan, len(common))
    of_means = kendall_tau(a.loc[common, "mean"].to_numpy(), b.loc[common, "mean"].to_numpy())
    per_seed = stats.mean_interval(list(seed_taus(rows, first, second).values()) if rows is not None else [], LEVEL)
    unclipped = None
    if per_seed.bounded and (per_seed.lo < -1.0 or per_seed.hi > 1.0):
        unclipped = per_seed
        per_seed = dataclasses.replace(per_seed, lo=max(-1.0, per_seed.lo), hi=min(1.0, per_seed.hi))
    return LadderTau(per_seed, of_means, len(common), block, unclipped)


def taus(table: pd.DataFrame, rows: pd.DataFrame | None = None) -> list[tuple[int, int, LadderTau]]:
    """(first, second, LadderTau) for every two budgets, shorter first."""
    budgets = sorted(table["epochs"].unique())
    return [(first, second, tau_interval(table, first, second, rows))
            for first, second in itertools.combinations(budgets, 2)]


def per_seed_text(tau: LadderTau) -> str:
    """'0.876 [0.864, 0.888] (n=3 seeds)': the mean of the per-seed taus, its interval and its seeds; where the
    t interval passed tau's range, what it was before the clip ('[0.763, 1] (n=3 seeds; the t interval [0.763,
    1.05] clipped to tau's range)'): every other interval these pages print is as computed, so this one says so."""
    iv = tau.per_seed
    seeds = f"n={iv.n[0]} seed{'' if iv.n[0] == 1 else 's'}"
    if not math.isfinite(iv.point):
        return "no per-seed tau (no seed has 3 variants at both budgets)"
    if not iv.bounded:
        return f"{fmt(iv.point, 3)} (no interval, {seeds})"
    raw = tau.unclipped
    clip = (f"; the t interval [{fmt(raw.lo, 3)}, {fmt(raw.hi, 3)}] clipped to tau's range [-1, 1]"
            if raw is not None else "")
    return f"{fmt(iv.point, 3)} [{fmt(iv.lo, 3)}, {fmt(iv.hi, 3)}] ({seeds}{clip})"


@dataclass(frozen=True)
class Tie:
    """A variant not resolved from the highest mean at its budget: its difference to the top (top minus it,
    points) at 95% (`nominal`) and at its Holm level (`holm`), Holm over the differences of the k - 1 others to
    the top that have an interval."""

    variant: str
    nominal: stats.Interval
    holm: stats.Interval

    def text(self) -> str:
        holm = f", Holm [{fmt(self.holm.lo, 3)}, {fmt(self.holm.hi, 3)}]" if self.holm.bounded else ""
        return f"{self.variant} ({fmt(self.nominal.point, 3)} points behind, {self.nominal.text()}{holm})"


def tied_with_top(rows: pd.DataFrame, group: pd.DataFrame) -> tuple[pd.Series, list[Tie], int]:
    """The variant with the highest mean at one budget, the variants whose difference from it is not resolved,
    and how many differences were judged (those with an interval). The top is picked from the data, so its k - 1
    differences to the others are one Holm family (Welch, each at its Holm level; exploratory), and every
    variant whose Holm interval includes 0, or that has no interval, is listed: 'highest' alone would call a
    tie within seed noise a winner, and a plain 95% interval per difference would ignore that the top was
    chosen as the largest of k means."""
    top = group.loc[group["mean"].idxmax()]
    epochs = int(top["epochs"])
    at = rows[rows["epochs"] == epochs]
    best = stats.finite(at.loc[at["variant"] == top["variant"], "acc"])
    others = {variant: stats.finite(at.loc[at["variant"] == variant, "acc"])
              for variant in sorted(group["variant"]) if variant != top["variant"]}
    judged = stats.judge_family({v: (lambda level, acc=acc: stats.welch(best, acc, level))
                                 for v, acc in others.items()})
    ties = [Tie(v, j.nominal, j.interval) for v, j in judged.items()
            if not (j.interval.bounded and j.interval.excludes(0.0))]
    return top, ties, sum(j.nominal.bounded for j in judged.values())


def ties_text(ties: list[Tie], judged: int) -> str:
    """', not resolved from A (...), B (...) (Holm over its 11 differences to the others)', or that it is
    resolved from each of the others; '' where nothing was judged and nothing is tied."""
    family = f"Holm over its {judged} difference{'' if judged == 1 else 's'} to the others"
    if ties:
        return f", not resolved from {', '.join(t.text() for t in ties)} ({family})"
    return f", resolved from each of the other {judged} ({family})" if judged else ""


@dataclass(frozen=True)
class Swap:
    """Two variants whose order of mean accuracy differs between two budgets: `ahead` has the higher mean at
    the shorter budget, `behind` at the longer; `shorter` and `longer`: ahead - behind (points) at each, Welch
    95% (two cells of independent seeds at one budget). A swap between means a fraction of a point apart is
    seed noise, not a change of answer: the distances say which it is."""

    ahead: str
    behind: str
    shorter: stats.Interval
    longer: stats.Interval

    def text(self) -> str:
        return (f"{self.ahead} over {self.behind} by {self.shorter.text()} points, then {self.longer.text()}")


def swapped_pairs(rows: pd.DataFrame, table: pd.DataFrame, first: int, second: int) -> list[Swap]:
    """Every pair of variants at both budgets whose means are in one order at `first` and the other at
    `second` (a tie at either counts as no swap), the closest at the longer budget first."""
    means = {e: table[table["epochs"] == e].set_index("variant")["mean"] for e in (first, second)}
    common = sorted(set(means[first].index) & set(means[second].index))

    def acc(variant: str, epochs: int) -> np.ndarray:
        return stats.finite(rows.loc[(rows["variant"] == variant) & (rows["epochs"] == epochs), "acc"])

    out = []
    for a, b in itertools.combinations(common, 2):
        d1, d2 = means[first][a] - means[first][b], means[second][a] - means[second][b]
        if d1 * d2 < 0:
            ahead, behind = (a, b) if d1 > 0 else (b, a)
            out.append(Swap(ahead, behind, stats.welch(acc(ahead, first), acc(behind, first)),
                            stats.welch(acc(ahead, second), acc(behind, second))))
    return sorted(out, key=lambda s: abs(s.longer.point))


def swaps_text(swaps: list[Swap], shown: int = 3) -> str:
    """'no pair swaps', or the swapped pairs with their distances at both budgets (the first `shown`, closest
    first, and how many more)."""
    if not swaps:
        return "no pair of variants swaps order"
    more = f"; {len(swaps) - shown} more in budget_ladder.md" if len(swaps) > shown else ""
    return (f"{len(swaps)} pair{'' if len(swaps) == 1 else 's'} swap order (ahead at the shorter budget, "
            f"difference there, then at the longer, Welch 95%): {'; '.join(s.text() for s in swaps[:shown])}{more}")


def variants_text(k: int) -> str:
    return f"{k} variant{'' if k == 1 else 's'}"


def left_out_text(tau: LadderTau) -> str:
    """', relu+ape left out: seeds 8, 9 missing' (the summary's form of PairedBlock.text), '' where none was."""
    return "".join(f", {note}" for note in tau.block.notes()) if tau.block is not None else ""


def summary(results_dir: Path) -> str | None:
    """The ladder in one sentence for the answers (rpevit/analysis/answers.py): between every two budgets the
    mean of the per-seed taus with its interval and n seeds, and beside it, labelled, the tau of the rankings of
    the means; the highest mean at each budget with its n and the variants it is not resolved from (Holm over
    its k - 1 differences to the others); None where the rows hold one budget only. Exploratory, as everything
    in this module."""
    rows = ladder_rows(read_trials(results_dir, ["train"]).frame)
    if rows.empty:
        return None
    table = per_budget(rows)
    between = []
    for first, second, tau in taus(table, rows):
        if not math.isfinite(tau.of_means):
            between.append(f"{first} → {second} epochs not defined ({variants_text(tau.variants)} at both, "
                           f"3 needed)")
            continue
        between.append(f"{first} → {second} epochs {per_seed_text(tau)}, the rankings of the means: tau "
                       f"{fmt(tau.of_means, 3)} ({variants_text(tau.variants)}{left_out_text(tau)}; "
                       f"{swaps_text(swapped_pairs(rows, table, first, second))})")
    best = []
    for epochs, g in table.groupby("epochs"):
        top, ties, judged = tied_with_top(rows, g)
        best.append(f"{budget_label(int(epochs), float(top['images']))}: {top['variant']} "
                    f"{top['interval'].text()} of {variants_text(len(g))}"
                    + ties_text(ties, judged))
    return (f"Kendall's tau between the variants' rankings at two budgets, as the mean of the per-seed taus "
            f"(each seed's own ranking at both, paired by seed) [95% t interval] (n seeds), and beside it the tau "
            f"of the rankings of the variants' mean accuracies: {'; '.join(between)}; the highest mean at each "
            f"fixed budget, %, and the variants it is not resolved from (exploratory: the highest is picked from "
            f"the data, so its differences to the others are judged by Holm over those k - 1 comparisons): "
            f"{'; '.join(best)}")


SHARED_MEASURES = ("train_loss", "val_loss", "val_acc")  # what an epoch row records of the run itself
LISTED_PAIRS = 10  # pairs that differ named in the text; the rest counted
ROUNDING_ONLY = 1e-5  # a pair whose largest |difference| is below this differs only in its losses' 6th digit or
# beyond: every validation accuracy is equal (one image of a 5,000-image split is 2e-4)


@dataclass(frozen=True)
class SharedEpochs:
    """How a seed's rungs agree on the epochs before the shorter rung's cool-down. A pair is a shorter and a
    longer rung of one configuration (every TrialConfig field but `epochs`, the seed included) under the wsd
    schedule, whose learning rate, data order and random-feature draws agree up to the shorter rung's cool-down
    start (rpevit.tasks.budget_ladder.branch_epoch proves it in steps for a branched space). `largest`: the
    largest |difference| of SHARED_MEASURES over every epoch compared (0.0: identical; nan: none compared)."""

    pairs: int  # pairs compared
    epochs: int  # epoch rows compared, over all pairs
    largest: float
    differing: tuple[str, ...]  # one label per pair that differs, the largest difference first
    without_rows: int  # pairs whose shared epochs are not all in the epoch rows (not compared)
    differences: tuple[float, ...] = ()  # each differing pair's largest |difference|, in `differing`'s order

    @property
    def rounding_only(self) -> int:
        """Differing pairs whose every difference is below ROUNDING_ONLY (the last ones of `differing`)."""
        return sum(d < ROUNDING_ONLY for d in self.differences)


def trial_epoch_curves(results_dir: Path) -> pd.DataFrame:
    """The epoch rows (common.EPOCH_CURVE_COLUMNS, with `sweep`) of every sweep folder under results_dir."""
    frames = [f for f in (read_epoch_curves(path.parent) for path in trial_files(Path(results_dir))) if f is not None]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def shared_epochs(rows: pd.DataFrame, curves: pd.DataFrame) -> SharedEpochs:
    """SharedEpochs of the trial rows `rows` (their config columns, sweep and the key each was stored under:
    STORED_KEY where the rows were read through migrate.resolved_frame, else trial_key) from their epoch rows
    `curves` (trial_epoch_curves): every shorter/longer pair of one configuration, compared on the epochs
    before the shorter one's cool-down (ladder_branch_epoch)."""
    wsd = rows[column(rows, "lr_schedule", "").astype(str) == "wsd"] if not rows.empty else rows
    keys = [f.name for f in dataclasses.fields(TrialConfig) if f.name != "epochs" and f.name in wsd.columns]
    if wsd.empty or curves.empty or "epochs" not in wsd.columns:
        return SharedEpochs(0, 0, math.nan, (), 0)
    by_trial = {key: g.drop_duplicates("epoch").set_index("epoch").sort_index()
                for key, g in curves.groupby(["sweep", "trial_key"])}
    pairs = compared = without = 0
    largest = math.nan
    differing: list[tuple[float, str]] = []
    for _, group in wsd.assign(_config=wsd[keys].astype(str).agg("\x1f".join, axis=1)).groupby("_config"):
        group = group.sort_values("epochs")
        for (_, short), (_, long) in itertools.combinations(group.iterrows(), 2):
            if int(short["epochs"]) == int(long["epochs"]):
                continue
            shared = range(1, ladder_branch_epoch({"epochs": short["epochs"],
                                                   "cooldown_fraction": short["cooldown_fraction"]}) + 1)
            # the trial rows' text columns were made inert as read (untrusted_names), the epoch rows' were not:
            # a sweep named `odd[x]` is looked up by its name as read (raw_text), not counted as without rows
            a, b = (by_trial.get((raw_text(r["sweep"]), raw_text(r.get(STORED_KEY, r["trial_key"]))))
                    for r in (short, long))
            if a is None or b is None or not (set(shared) <= set(a.index) and set(shared) <= set(b.index)):
                without += 1
                continue
            diff = max(_measure_difference(a.loc[list(shared), m], b.loc[list(shared), m]) for m in SHARED_MEASURES)
            pairs, compared = pairs + 1, compared + len(shared)
            largest = diff if math.isnan(largest) else max(largest, diff)
            if diff > 0:
                differing.append((diff, f"{short['attention']}+{short['pe']} seed {int(short['seed'])}: "
                                        f"{int(short['epochs'])} vs {int(long['epochs'])} epochs "
                                        f"(epochs 1-{shared[-1]}, largest |difference| {fmt(diff, 3)}"
                                        f"{ran_on(a.loc[list(shared)], b.loc[list(shared)])})"))
    differing.sort(key=lambda d: -d[0])  # stable: pairs of equal difference keep the rows' order
    return SharedEpochs(pairs, compared, largest, tuple(label for _, label in differing), without,
                        tuple(d for d, _ in differing))


def ran_on(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """'; ran on X vs Y' where the epoch rows of both runs record their devices (device_name, train epoch rows
    from 2026-11-30 on) and those differ, else '': whether a pair's difference is other hardware, from the rows."""
    def devices(rows: pd.DataFrame) -> str:
        names = column(rows, "device_name", None).dropna().astype(str)
        return ", ".join(md_text(n) for n in dict.fromkeys(names)) if len(names) == len(rows) else ""

    first, second = devices(a), devices(b)
    return f"; ran on {first} vs {second}" if first and second and first != second else ""


def _measure_difference(a: pd.Series, b: pd.Series) -> float:
    """max |a - b| of one measure over the shared epochs; both missing counts as equal, one missing as inf."""
    a, b = pd.to_numeric(a, errors="coerce").to_numpy(float), pd.to_numeric(b, errors="coerce").to_numpy(float)
    both = np.isnan(a) & np.isnan(b)
    if (np.isnan(a) ^ np.isnan(b)).any():
        return math.inf
    return float(np.max(np.abs(a[~both] - b[~both]), initial=0.0))


def shared_epochs_text(check: SharedEpochs) -> str:
    """One paragraph: whether a seed's rungs are one run up to the shorter rung's cool-down."""
    skipped = (f" {check.without_rows} pair(s) lack some of those epoch rows and are not compared."
               if check.without_rows else "")
    if check.pairs == 0:
        return ("Not checked: no two rungs of one configuration (wsd schedule) with the epoch rows of the epochs "
                "before the shorter one's cool-down." + skipped)
    head = (f"Each shorter rung against every longer rung of its configuration and seed, on the epochs before the "
            f"shorter one's cool-down (train loss, validation loss and accuracy as each epoch recorded them): "
            f"{check.pairs} pair(s), {check.epochs} epoch rows.")
    if not check.differing:
        return (f"{head} Identical in every one: each seed's rungs are one run up to their cool-down, as the "
                f"pairing by seed assumes.{skipped}")
    listed = "; ".join(check.differing[:LISTED_PAIRS])  # names as the rows hold them: inert (untrusted_names)
    more = f"; and {len(check.differing) - LISTED_PAIRS} more" if len(check.differing) > LISTED_PAIRS else ""
    rounding = check.rounding_only
    beyond = len(check.differing) - rounding
    weaker = ("share their seed's initialisation and data order but are not one run up to their cool-down (a run "
              "not reproduced exactly: a trunk trained again, or other hardware), so their pairing by seed is weaker "
              "than the others'")
    floor = (f"only by float rounding (largest |difference| below {fmt(ROUNDING_ONLY)}: every validation accuracy "
             f"equal, the losses within {fmt(ROUNDING_ONLY)})")
    if not rounding:
        tail = f" Those rungs {weaker}."
    elif beyond:
        tail = (f" Of these, {rounding} differ{'s' if rounding == 1 else ''} {floor}, effectively one run; the "
                f"other {beyond} {weaker}.")
    else:
        tail = f" Every one differs {floor}: effectively one run, as the pairing by seed assumes."
    return (f"{head} {len(check.differing)} pair(s) differ (largest |difference| {fmt(check.largest, 3)}; largest "
            f"first): {listed}{more}.{tail}{skipped}")


def budget_label(epochs: int, images: float) -> str:
    return f"{epochs} epochs ({fmt(images / 1e6, 3)}M images)" if math.isfinite(images) else f"{epochs} epochs"


def plot(table: pd.DataFrame, path: Path, device_note: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    styles = {"softmax": "-", "favor": "--", "relu": ":"}
    encodings = sorted({v.split("+", 1)[1] for v in table["variant"]})
    colours = variants.colours(variants.PE, encodings)  # each encoding's colour of every figure
    for variant, g in table.sort_values("images").groupby("variant"):
        attention, pe = variant.split("+", 1)
        lo = [iv.lo for iv in g["interval"]]
        hi = [iv.hi for iv in g["interval"]]
        ax.errorbar(g["images"], g["mean"], yerr=[np.subtract(g["mean"], lo), np.subtract(hi, g["mean"])],
                    ls=styles.get(attention, "-."), color=colours[pe], marker="o", ms=4, capsize=3, label=variant)
    ax.set_xscale("log")
    ax.set_xlabel("training budget: images seen (fixed budget per rung; each rung fully decayed)")
    ax.set_ylabel("judged test accuracy, % (mean, 95% t interval)")
    ax.set_title(f"Accuracy against budget ({device_note})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    return save_figure(fig, path)


def swaps_table(rows: pd.DataFrame, table: pd.DataFrame, budgets: list[int]) -> str:
    """Every swapped pair (swapped_pairs) between every two budgets, or one line saying there is none."""
    out = [[f"{first} → {second} epochs", s.ahead, s.behind, s.shorter.text(), s.longer.text()]
           for first, second in itertools.combinations(budgets, 2) for s in swapped_pairs(rows, table, first, second)]
    if not out:
        return "No pair of variants swaps order between any two budgets."
    return markdown_table(["budgets", "ahead at the shorter", "behind at the shorter", "difference at the shorter",
                           "difference at the longer"], out)


def declared_note(results_dir: Path) -> str:
    """Where this page's declared comparisons are: in `confirmatory.md` where every sweep folder read here holds
    its declaration.json; else which ones declared none (everything about them is exploratory)."""
    folders = [f.parent for f in trial_files(results_dir)]
    undeclared = [md_text(f.name) for f in folders if not os.path.lexists(f / DECLARATION_FILE)]
    if not undeclared:
        return "Exploratory: the declared comparisons of this study are in `confirmatory.md`."
    if len(undeclared) == len(folders):
        who = "this study declared no comparisons" if len(folders) == 1 else "no study read here declared comparisons"
        return f"Exploratory: {who} before it ran (no {DECLARATION_FILE}), so every figure here is exploratory."
    return (f"Exploratory: the declared comparisons are in each declared study's `confirmatory.md`; "
            f"{', '.join(undeclared)} declared none (no {DECLARATION_FILE}).")


def build(results_dir: Path) -> str | None:
    trials = read_trials(results_dir, ["train"])
    rows = ladder_rows(trials.frame)
    if rows.empty:
        return None
    table = per_budget(rows)
    budgets = sorted(table["epochs"].unique())
    images = {e: float(table.loc[table["epochs"] == e, "images"].median()) for e in budgets}
    devices = devices_text(rows)
    plot(table, Path(results_dir) / "budget_ladder.png", devices)
    acc_rows = []
    for variant, g in table.groupby("variant"):
        by = g.set_index("epochs")
        acc_rows.append([variant, *(by.loc[e, "interval"].text() if e in by.index else "—" for e in budgets)])
    acc_rows.sort(key=lambda r: r[0])
    tau_rows = [[f"{first} → {second} epochs",
                 per_seed_text(tau) if math.isfinite(tau.of_means) else "—",
                 ", ".join(f"{seed}: {fmt(t, 3)}" for seed, t in seed_taus(rows, first, second).items()) or "—",
                 fmt(tau.of_means, 3), tau.variants_text()]
                for first, second, tau in taus(table, rows)]
    ns = sorted(set(table["n"]))
    lines = [trials.note(), "",
             declared_note(results_dir) + " Rows: " + devices + ".",
             "", "### Judged test accuracy at each fixed budget, % (mean [95% t interval] (n seeds))", "",
             markdown_table(["variant", *(budget_label(e, images[e]) for e in budgets)], acc_rows), "",
             "### How stable the ranking of the variants is across budgets", "",
             markdown_table(["budgets", "per-seed tau: mean [95% t interval] (n seeds)",
                             "tau of each seed's own ranking", "tau of the rankings of the means (no interval)",
                             "variants"], tau_rows), "",
             f"Tau: 1 = the same order at both budgets, 0 = unrelated, -1 = reversed. The interval is over seeds "
             f"(n = {', '.join(map(str, ns))} per cell): each seed's own ranking at the two budgets, paired because a "
             f"seed's rungs share its initialisation and data order (and, where the study branches its rungs, its "
             f"longest run: the shorter ones resume it at their cool-down start); the mean of those per-seed taus "
             f"with its t interval, clipped to [-1, 1]. A per-seed tau ranks single-seed accuracies, so it is "
             f"noisier than the tau of the rankings of the means beside it, which is another quantity (not the "
             f"point of that interval, and it may lie outside it).", "",
             "### Which variants swap order between budgets", "",
             swaps_table(rows, table, budgets), "",
             "Ordered by their means at each budget; a swap of two means whose differences' intervals include 0 at "
             "both budgets is within seed noise (each difference: Welch 95%, two cells of independent seeds; "
             "exploratory).", "",
             "### Are a seed's rungs one run up to their cool-down?", "",
             shared_epochs_text(shared_epochs(rows, trial_epoch_curves(results_dir))), "",
             "![accuracy against budget](budget_ladder.png)", ""]
    return "\n".join(lines)


def main() -> None:
    script_main(__doc__, build, "budget_ladder.md", "Budget ladder: accuracy against training budget",
                "train trials at two or more budgets (epochs)")


__all__ = ["LadderTau", "PairedBlock", "SharedEpochs", "Swap", "Tie", "build", "held_seeds", "kendall_tau",
           "ladder_rows", "main", "paired_block", "per_budget", "seed_taus", "shared_epochs", "shared_epochs_text",
           "swapped_pairs", "tau_interval", "tied_with_top", "trial_epoch_curves"]
