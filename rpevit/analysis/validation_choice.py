"""Choices made on the validation split (issue 28): which candidate of a knob wins on validation,
and what its test accuracy is, beside the value the project chose before (on test).

    python analysis/validation_choice.py results/luo_scale_val_digits     # luo_scale
    python analysis/validation_choice.py results/redraw_val_mnist         # the redraw schedule

The knob is whatever varies across the rows besides the cell (attention, pe) and the seed: luo_scale,
or (redraw_interval, redraw_until). Per cell and candidate, the validation accuracy a row is judged
by is `val_acc_draw_mean` (the mean over fresh draws) for random-feature backends and
`final_val_acc` otherwise; the chosen candidate is the one with the highest mean over seeds. Its
test accuracy (judged_accuracy: draw mean for random features) is then read once. Whether the
chosen candidate beats the earlier choice on validation is judged per cell, Holm-corrected over the
cells: claimed only when the corrected interval excludes 0, else "not resolved with n seeds". Every
candidate of a cell ran the same seeds, so the margin is paired by seed (seed_margin: a one-sample t
interval of the per-seed differences over the seeds where both have a value, n = those pairs; a seed
where either failed is left out), Welch, with the reason, only where they share fewer than 2 such
seeds or the rows carry no seed; each cell's line says which.
For a knob taken once for every cell (JOINT), the joint choice's margin over the earlier choice is
paired by seed the same way (per seed, the mean over cells of the chosen minus the earlier candidate);
it is exploratory, as the chosen candidate is the best of those tried (a selection), so it says whether
its 95% interval excludes 0 and makes no claim.
A choice at an end of the values tried is flagged: the grid does not bracket it. Trials that failed
(e.g. training diverged) are listed with their error, per candidate, and count as tried.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis import stats
from rpevit.analysis.common import (column, current_rows, has_random_features, judged_accuracy, load_trials,
                                    markdown_table, read_sweep, script_main, trial_files)
from rpevit.sweep.protocol import FAILED

CELL = ("dataset", "attention", "pe")
RECIPE = ("lr", "init", "grad_clip")  # the CPU protocol's recipe: one choice for every variant alike
REDRAW = ("redraw_interval", "redraw_until")
KNOBS = (("luo_scale",), REDRAW, RECIPE)
EARLIER = {("luo_scale",): (10.0,),  # chosen on test before; digits' schedule was MNIST's validation choice, borrowed
           REDRAW: {"mnist": (100, 0.8), "cifar10": (100, 0.8), "digits": (1, 0.8)},
           RECIPE: {"mnist": (2e-3, "trunc_normal", 1.0), "cifar10": (1e-3, "trunc_normal", 1.0),
                    "digits": (1e-3, "trunc_normal", 1.0)}}
# where an earlier choice came from, when not from test results (the default: "made on test")
EARLIER_HOW = {("digits", REDRAW): "MNIST's validation choice, borrowed: never chosen on digits",
               ("digits", RECIPE): "timm's init and clipping, lr 1e-3: never chosen on digits"}
# Knobs a study takes once for all its cells (the candidate with the highest mean over the cells), beside the
# per-cell choice: the recipe, the redraw schedule, which a study's encodings share so that comparing two
# encodings under FAVOR+ does not also compare two schedules (like with like), and luo_scale, which a
# study's backends share so that the softmax / Performer gap under luo_rpe does not also compare two scales.
# The joint choice is the dataset's default (rpevit.data.DATASET_SPECS, rpevit.pe.relative_bias).
JOINT = (RECIPE, REDRAW, ("luo_scale",))
# A knob chosen again on a dataset after the settings its first study ran at moved (the recipe: luo_scale's bias
# moves with Adam's lr, so the two are not independent). The later study's earlier choice is the first study's, not
# the value made on test; once the later study is published, the dataset's default follows it and the first study
# stays published, read as superseded (rpevit.analysis.answers_validation.current_validation_folders).
RECHOSEN = {"luo_scale_val_digits_recipe": {
    "supersedes": "luo_scale_val_digits", "earlier": (1000.0,),
    "how": "luo_scale_val_digits' choice, made at digits' recipe before recipe_val_digits chose it"}}
SUPERSEDED = {spec["supersedes"]: study for study, spec in RECHOSEN.items()}
NOT_ON_THE_SCALE = {"redraw_interval": {0}}  # 0 = never redraw: another setting, not the end of the interval scale
SCALE_ENDS = {"redraw_interval": 1}  # a redraw every step: nothing lies beyond it


def edge_of_grid(knob: tuple[str, ...], chosen: tuple, candidates: list[tuple]) -> str | None:
    """"largest" or "smallest" when `chosen`'s first component is an end of the values tried (among the
    candidates that share its other components, at least two): the best may lie beyond the grid, so
    the choice is not bracketed. None when it is interior, at the end of the scale itself (SCALE_ENDS),
    or there is no scale to be at the end of."""
    excluded = NOT_ON_THE_SCALE.get(knob[0], set())
    values = sorted({c[0] for c in candidates if c[1:] == chosen[1:] and c[0] not in excluded})
    if len(values) < 2 or chosen[0] in excluded or chosen[0] == SCALE_ENDS.get(knob[0]):
        return None
    return "largest" if chosen[0] == values[-1] else "smallest" if chosen[0] == values[0] else None


def validation_accuracy(frame: pd.DataFrame) -> pd.Series:
    """What a row is chosen on: the validation draw mean for random-feature rows, final_val_acc otherwise."""
    draw_mean = pd.to_numeric(column(frame, "val_acc_draw_mean"), errors="coerce")
    return draw_mean.where(has_random_features(frame), pd.to_numeric(frame["final_val_acc"], errors="coerce"))


def knob_of(frame: pd.DataFrame) -> tuple[str, ...]:
    """The knob the rows vary (KNOBS), found from the data: the first whose columns take several values."""
    for knob in KNOBS:  # a knob varies within a cell (across cells, e.g. softmax rows, it may differ for nothing)
        if all(k in frame for k in knob) and any(len(rows[list(knob)].drop_duplicates()) > 1
                                                 for _, rows in frame.groupby(list(CELL))):
            return knob
    raise ValueError(f"the rows vary none of {', '.join('/'.join(k) for k in KNOBS)}; allowed: a sweep of one of them")


def failed_trials(results_dir: Path) -> pd.DataFrame:
    """The current train rows that failed (a candidate whose training diverged is a result: shown, never
    dropped in silence); empty if none."""
    frames = []
    for path in trial_files(results_dir):
        frame = read_sweep(path, results_dir)
        if frame is None or "status" not in frame:
            continue
        failed = frame[(frame["status"] == FAILED) & (column(frame, "task", "train") == "train")]
        frames.append(current_rows(failed, path.parent)[0])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def choices(frame: pd.DataFrame, failed: pd.DataFrame | None = None,
            study: str | None = None) -> tuple[tuple[str, ...], list[dict]]:
    """(knob, one record per cell: its candidates' validation and test figures and failed seeds, the
    chosen one). A candidate whose every seed failed is listed (and counts as tried) but cannot be chosen.
    `study`: the folder's name, for a knob chosen again (RECHOSEN: its earlier choice is the first study's)."""
    frame = frame.assign(val=validation_accuracy(frame), test=judged_accuracy(frame), failed=False, error="")
    if failed is not None and not failed.empty:
        frame = pd.concat([frame, failed.assign(val=math.nan, test=math.nan, failed=True,
                                                error=column(failed, "error", "").fillna("").astype(str))],
                          ignore_index=True)
    knob = knob_of(frame)
    records = []
    for cell, rows in frame.groupby(list(CELL)):
        earlier = earlier_choice(knob, cell[0], study)
        candidates = {}
        for value, group in rows.groupby(list(knob)):
            value = value if isinstance(value, tuple) else (value,)
            ok = group[~group["failed"].astype(bool)]
            errors = group.loc[group["failed"].astype(bool), "error"]
            candidates[value] = {"val": stats.mean_interval(ok["val"]), "test": stats.mean_interval(ok["test"]),
                                 "val_seeds": ok["val"].to_numpy(), "test_seeds": ok["test"].to_numpy(),
                                 "val_by_seed": by_seed(ok),
                                 "failed": len(errors), "seeds": len(group),
                                 "error": errors.iloc[0].split(": ", 1)[-1] if len(errors) else ""}
        measured = {v: c for v, c in candidates.items() if math.isfinite(c["val"].point)}
        chosen = max(measured, key=lambda v: measured[v]["val"].point) if measured else None
        records.append({"cell": cell, "candidates": candidates, "chosen": chosen,
                        "earlier": earlier if earlier in candidates else None,
                        "edge": edge_of_grid(knob, chosen, list(candidates)) if chosen is not None else None})
    return knob, records


def by_seed(rows: pd.DataFrame) -> dict | None:
    """seed -> validation accuracy of a candidate's rows in one cell (the mean where a seed has two rows;
    finite ones only), what a paired comparison pairs on; None where the rows carry no seed."""
    if "seed" not in rows or rows["seed"].isna().any():
        return None
    found = rows[np.isfinite(rows["val"].to_numpy(float))]
    return {seed: float(v) for seed, v in found.groupby("seed")["val"].mean().items()}


def earlier_choice(knob: tuple[str, ...], dataset: str, study: str | None = None) -> tuple | None:
    """The value the project used before this choice was made on validation (for one dataset; for a study
    that chose the knob again, RECHOSEN, the first study's choice)."""
    if study in RECHOSEN:
        return RECHOSEN[study]["earlier"]
    earlier = EARLIER[knob]
    return earlier.get(dataset) if isinstance(earlier, dict) else earlier


def joint_choice(knob: tuple[str, ...], records: list[dict]) -> dict | None:
    """One candidate for every cell alike (JOINT knobs): per candidate tried in every cell, the mean over
    cells (each weighted alike) of the cell's mean validation accuracy, and per seed the mean over cells
    (`val_by_seed`: seed -> that mean, over the seeds every cell ran, for the comparison with the earlier
    choice paired by seed; None where the rows carry no seed). None when no candidate
    was measured in every cell. A candidate tried in every cell but failed on every seed of one cannot
    be chosen for every variant; it still counts as tried (`unusable`, and in the bracketing), as a
    failed candidate does for one cell."""
    if not records:
        return None
    common = set.intersection(*(set(v for v, c in r["candidates"].items() if math.isfinite(c["val"].point))
                                for r in records))
    tried = set.intersection(*(set(r["candidates"]) for r in records))
    if not common:
        return None
    # candidates some cell has not tried (a grid still running, or extended in one cell only): left out of
    # the joint choice, and said so, so a partial grid never narrows the choice silently
    untried = {value: [cell_name(r) for r in records if value not in r["candidates"]]
               for value in sorted(set().union(*(set(r["candidates"]) for r in records)) - tried)}
    unusable = {value: [(cell_name(r), r["candidates"][value]["failed"], r["candidates"][value]["seeds"])
                        for r in records if not math.isfinite(r["candidates"][value]["val"].point)]
                for value in sorted(tried - common)}
    scores = {}
    for value in common:
        per_cell = [r["candidates"][value] for r in records]
        n = min(len(c["val_seeds"]) for c in per_cell)
        seeds = np.mean([np.asarray(c["val_seeds"], float)[:n] for c in per_cell], axis=0)
        tests = np.mean([np.asarray(c["test_seeds"], float)[:n] for c in per_cell], axis=0)
        scores[value] = {"val": stats.mean_interval(seeds), "val_seeds": seeds, "test": stats.mean_interval(tests),
                         "val_by_seed": cell_mean_by_seed(per_cell)}
    chosen = max(scores, key=lambda v: scores[v]["val"].point)
    earlier = records[0]["earlier"]
    return {"scores": scores, "chosen": chosen, "earlier": earlier if earlier in scores else None,
            "edge": edge_of_grid(knob, chosen, sorted(tried)), "unusable": unusable, "untried": untried}


def cell_mean_by_seed(per_cell: list[dict]) -> dict | None:
    """seed -> the mean over cells of a candidate's validation accuracy, for the seeds every cell ran (the
    cells weighted alike, as in the joint choice); None where some cell's rows carry no seed."""
    found = [c.get("val_by_seed") for c in per_cell]
    if any(f is None for f in found):
        return None
    shared = set.intersection(*(set(f) for f in found))
    return {seed: float(np.mean([f[seed] for f in found])) for seed in sorted(shared)}


MIN_PAIRS = 2  # a paired interval needs two per-seed differences: one carries no spread


def seed_margin(chosen: dict, earlier: dict, level: float = stats.LEVEL) -> tuple[stats.Interval, str]:
    """`chosen` minus `earlier` on validation, and how it was computed. The two ran the same seeds (every
    candidate tried runs every seed of the grid), so a seed's two values are one paired observation and the
    seed's own effect cancels: where both have a value in at least MIN_PAIRS seeds, the one-sample t interval
    of the per-seed differences over those seeds (n = pairs; a seed where either has no value, e.g. it failed,
    is left out and named); else Welch, with the reason. `chosen`, `earlier`: a candidate's figures,
    `val_by_seed` (seed -> value; None where the rows carry no seed) and `val_seeds` (its values by row)."""
    a, b = chosen.get("val_by_seed"), earlier.get("val_by_seed")
    if a is None or b is None:  # no seed ids: the values by row, unpaired
        return (stats.welch(chosen["val_seeds"], earlier["val_seeds"], level),
                "Welch, unpaired: the rows carry no seed")
    shared = sorted(set(a) & set(b))
    if len(shared) >= MIN_PAIRS:
        return stats.mean_interval([a[seed] - b[seed] for seed in shared], level), paired_text(set(a) ^ set(b))
    seeds = " and ".join(", ".join(map(str, sorted(s))) or "none" for s in (a, b))
    why = f"the two share only seed {shared[0]}" if shared else "the two ran different seeds"
    return stats.welch(list(a.values()), list(b.values()), level), f"Welch, unpaired: {why}: {seeds}"


def paired_text(alone: set) -> str:
    """'paired by seed', naming the seeds left out as only one of the two has a value there."""
    if not alone:
        return "paired by seed"
    left = ", ".join(map(str, sorted(alone)))
    return (f"paired by seed over the seeds both have: seed{'s' if len(alone) > 1 else ''} {left} left out, "
            f"where one of the two has no value")


def joint_margin(joint: dict) -> tuple[stats.Interval, str]:
    """The joint choice minus the earlier one on validation (mean over cells) and how it was computed
    (seed_margin over the seeds' cell means, each seed's mean over the cells that all ran it): paired by seed,
    Welch with the reason where the two share fewer than 2 seeds."""
    return seed_margin(*(joint["scores"][v] for v in (joint["chosen"], joint["earlier"])))


def joint_lines(knob: tuple[str, ...], records: list[dict], label) -> list[str]:
    """The joint choice as Markdown: every candidate's mean over the cells, the chosen one, and its margin
    over the earlier choice on validation (joint_sentence)."""
    joint = joint_choice(knob, records)
    if joint is None:
        return ["No candidate was measured in every cell: no joint choice."]
    rows = [[label(v) + (" **chosen on validation**" if v == joint["chosen"] else "")
             + (" (earlier choice)" if v == joint["earlier"] else ""), c["val"].text(100, 4), c["test"].text(100, 4)]
            for v, c in sorted(joint["scores"].items(), key=lambda item: -item[1]["val"].point)]
    cells = ", ".join(" / ".join(str(x) for x in r["cell"][1:]) for r in records)
    out = [f"### One choice for every variant alike (mean over the cells {cells}, each weighted alike)", "",
           markdown_table([" / ".join(knob), "validation accuracy % (mean over cells)", "test accuracy %"], rows), ""]
    out.append(joint_sentence(knob, joint, label))
    return out


def joint_sentence(knob: tuple[str, ...], joint: dict, label) -> str:
    """What validation chooses for every variant alike, its margin over the earlier choice (joint_margin: paired
    by seed where they share 2 seeds; exploratory, as the chosen one is the best of the K candidates, so no claim:
    whether its 95% interval excludes 0), whether the grid brackets it and what cannot be used."""
    chosen, earlier = joint["chosen"], joint["earlier"]
    edge = (f" It is the {joint['edge']} {knob[0]} tried with its other settings: the best may lie beyond the grid "
            f"(not bracketed)." if joint["edge"] else "")
    edge += "".join(f" {label(value)} was tried in every cell and cannot be chosen for every variant: it failed in "
                    + "; ".join(f"{cell} ({failed} of {seeds} seeds)" for cell, failed, seeds in cells) + "."
                    for value, cells in joint["unusable"].items())
    if joint["untried"]:
        edge += (f" Not among the candidates, as some cell has not tried them: "
                 + "; ".join(f"{label(value)} ({', '.join(cells)} lacks it)" for value, cells in joint["untried"].items())
                 + ".")
    if earlier is None or chosen == earlier:
        return f"Validation chooses {label(chosen)}" + (", the earlier choice." if chosen == earlier else ".") + edge
    margin, how = joint_margin(joint)
    word = "its 95% interval excludes 0" if margin.excludes(0.0) else "its 95% interval does not exclude 0"
    return (f"Validation chooses {label(chosen)} for every variant, not the earlier {label(earlier)}; its margin "
            f"on validation (mean over cells) is {margin.text(100, 3)} points ({how}; exploratory: "
            f"{label(chosen)} was picked as the best of {len(joint['scores'])} candidates): {word}.{edge}")


def cell_name(record: dict) -> str:
    """'mnist / favor / rope': a record's cell as the tables and verdicts name it."""
    return " / ".join(str(c) for c in record["cell"])


def cell_margin(record: dict, level: float = stats.LEVEL) -> tuple[stats.Interval, str]:
    """A cell's chosen candidate minus its earlier one on validation, and how it was computed (seed_margin: the
    candidates of a cell share seeds, so paired by seed where they share 2 with a value, else Welch)."""
    return seed_margin(*(record["candidates"][v] for v in (record["chosen"], record["earlier"])), level)


def margins(records: list[dict]) -> dict[str, stats.Judged]:
    """Per cell (cell_name) whose validation choice differs from the earlier one: the chosen candidate minus
    the earlier one on validation (cell_margin: paired by seed, else Welch), judged by Holm over those cells."""
    family = {}
    for record in records:
        chosen, earlier = record["chosen"], record["earlier"]
        if chosen is not None and earlier is not None and chosen != earlier:
            family[cell_name(record)] = lambda level, record=record: cell_margin(record, level)[0]
    return stats.judge_family(family) if family else {}


def chosen_for_every_variant(results_dir: Path) -> tuple[str, tuple[str, ...], tuple] | None:
    """(dataset, knob, the joint choice) of a validation study's rows, for a JOINT knob; None when it
    has no train rows or no candidate was measured in every cell. What the dataset's defaults follow
    (tests/test_defaults_follow_validation.py)."""
    frame = load_trials(results_dir, task="train")
    if frame.empty:
        return None
    knob, records = choices(frame[frame["status"] == "ok"] if "status" in frame else frame, failed_trials(results_dir),
                            Path(results_dir).name)
    joint = joint_choice(knob, records) if knob in JOINT else None
    datasets = {record["cell"][0] for record in records}
    if joint is None or len(datasets) != 1:
        return None
    return datasets.pop(), knob, joint["chosen"]


def earlier_text(knob: tuple[str, ...], datasets: list[str], label, study: str | None = None) -> str:
    """"the earlier choice (made on test): 100, 0.8" for the datasets of the rows (each named when several),
    with where it came from (EARLIER_HOW, RECHOSEN) when that was not test results."""
    if study in RECHOSEN:
        return f"the earlier choice ({RECHOSEN[study]['how']}): {label(RECHOSEN[study]['earlier'])}"
    found = [(d, earlier_choice(knob, d)) for d in datasets]
    found = [(d, v) for d, v in found if v is not None]
    if not found:
        return "no earlier choice"
    how = {EARLIER_HOW.get((d, knob), "made on test") for d, _ in found}
    if len(found) == 1 or (len({v for _, v in found}) == 1 and len(how) == 1):
        return f"the earlier choice ({how.pop()}): {label(found[0][1])}"
    return "the earlier choices: " + "; ".join(f"{d}: {label(v)} ({EARLIER_HOW.get((d, knob), 'made on test')})"
                                               for d, v in found)


def build(results_dir: Path) -> str | None:
    frame = load_trials(results_dir, task="train")
    if frame.empty:
        return None
    study = Path(results_dir).name
    knob, records = choices(frame[frame["status"] == "ok"] if "status" in frame else frame, failed_trials(results_dir),
                            study)
    name = " / ".join(knob)
    label = lambda value: ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)  # noqa: E731
    lines = [f"Knob: **{name}**; {earlier_text(knob, sorted(set(frame['dataset'])), label, study)}. Validation accuracy is "
             "the draw mean over fresh draws for random-feature backends (val_acc_draw_mean), final_val_acc "
             "otherwise; test accuracy is read once per trial and judged the same way. Intervals: 95% t (n).", ""]
    table = []
    for record in records:
        cell = cell_name(record)
        for value, c in sorted(record["candidates"].items()):
            mark = (" **chosen on validation**" if value == record["chosen"] else "") + \
                   (" (earlier choice)" if value == record["earlier"] else "")
            failures = f"{c['failed']} of {c['seeds']} seeds failed: {c['error']}" if c["failed"] else ""
            table.append([cell, label(value) + mark, c["val"].text(100, 4), c["test"].text(100, 4), failures])
    lines.append(markdown_table(["cell", name, "validation accuracy %", "test accuracy %", "failed"], table))
    lines.append("")
    judged = margins(records)
    for record in records:
        cell = cell_name(record)
        chosen, earlier = record["chosen"], record["earlier"]
        edge = (f" It is the {record['edge']} {knob[0]} tried: the best may lie beyond the grid (not bracketed)."
                if record["edge"] else "")
        edge += "".join(f" {label(value)} failed in {c['failed']} of {c['seeds']} seeds ({c['error']})."
                        for value, c in sorted(record["candidates"].items()) if c["failed"])
        if chosen is None:
            lines.append(f"- {cell}: no candidate has a validation accuracy.")
        elif earlier is None or chosen == earlier:
            lines.append(f"- {cell}: validation chooses {label(chosen)}"
                         + (", the earlier choice: it does not change." if chosen == earlier else ".") + edge)
        else:
            verdict = judged[cell]
            word = verdict.word("better on validation than the earlier choice", "worse")
            how = f" ({cell_margin(record)[1]})" if math.isfinite(verdict.nominal.point) else ""
            lines.append(f"- {cell}: validation chooses {label(chosen)}, not the earlier {label(earlier)}; its margin on "
                         f"validation is {verdict.nominal.text(100, 3)} points{how}, Holm over {verdict.k} cell(s): "
                         f"{word}. "
                         f"Test accuracy: {record['candidates'][chosen]['test'].text(100, 4)} against "
                         f"{record['candidates'][earlier]['test'].text(100, 4)}.{edge}")
    if knob in JOINT:
        lines += ["", *joint_lines(knob, records, label)]
    return "\n".join(lines)


def main() -> None:
    script_main(__doc__, build, "validation_choice.md", "A choice made on validation", "trials")


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool

    run_tool(main)
