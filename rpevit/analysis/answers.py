"""The project's answers, written from the committed Parquet by the analysis code: results/ANSWERS.md and
the generated blocks of README.md, results/README.md and docs/*.md.

    python analysis/answers.py results            # rewrite them
    python analysis/answers.py results --check    # exit 1, naming each file whose text is stale

Every figure in those passages is computed here through the analysis functions the report uses
(gap_closure, string_study, rotation, validation_choice, efficiency, token_scaling, stats); no statistic is
computed anew. Every claim is labelled:

- **confirmatory**: a comparison a study declared before its first trial ran (its `declare:` block,
  recorded in `<sweep folder>/declaration.json`), judged by rpevit.analysis.confirmatory over exactly the
  declared seeds; every study folder under RESULTS_DIR that holds a declaration gets a section, found
  afresh at each run;
- **exploratory**: everything else, labelled so. Such a figure describes the rows; where its interval at its
  Holm level excludes 0 the text says "excludes 0" (the STRING and rotation verdicts reused from their
  modules say "resolved"), within families chosen after the data were seen: not a confirmed answer.
  Otherwise it says "not resolved with n seeds". G is given only where the gap it divides by excludes 0 at
  its Holm level.

The wording rule is the README's: every interval carries its n; an effect is claimed only where its
interval at its Holm level excludes 0.

Only published study folders are read (`published_folders`): the folders results/.gitignore re-includes
(`!/<folder>/`: what git tracks under results/, so what a fresh clone holds) and those results/STUDIES lists.
Within them: the report's studies (STUDIES), the validation studies (`*_val_*`), the declared ones (a
`declaration.json`), the running declared ones (`in_progress/<study>/`, one line each, no verdict, and its
`PROGRESS.md`: which declared cells hold which seeds, rpevit.analysis.progress) and the
sweeps one level below a published folder (`gpu_h100/<sweep>/`, `pilots/<sweep>/`). Any other folder under
results/ is a user's own (README command 1 writes `results/smoke/`; a sweep of one's own `results/<name>/`):
it is never read into generated text, whatever it holds (rows, a declaration.json, a `_val_` in its name), so
running command 1 before the tests (command 2) leaves every generated text as committed. A results folder that
holds neither file (one's own results folder, a test's) is read whole.

A declared study that was redeclared (`sweep.py --redeclare`) says so, with when and what changed, wherever it
appears: its section and table here, the README's block, results/README.md's declared-studies block
(rpevit.analysis.confirmatory.redeclared_text).

This module writes results/ANSWERS.md (its sections on the declared comparisons, the gap closure, STRING,
rotation and the budget ladders, and its summary), the README's "answers" block, and runs the command. Its
parts: rpevit.analysis.answers_sources (which folders are published, the declared studies among them, `Sources`),
answers_wording (intervals, verdicts, the exploratory label, the gap-closure sentences), answers_validation (the
settings chosen on validation), answers_cost (token scaling and cost ratios) and answers_blocks (the other
generated blocks of results/README.md and docs/).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import pandas as pd

from rpevit.analysis import budget_ladder, confirmatory, efficiency, rotation, string_study
from rpevit.analysis import headline, progress
from rpevit.analysis.answers_blocks import (declared_studies_block, gpu_answers_block, gpu_bench_block,
                                            gpu_packing_block, gpu_sweep_block, gpu_times_block, mnist_redraw_table,
                                            pilots_block, provenance_mismatches, recipe_table, rows_block,
                                            step_times_block)
from rpevit.analysis.answers_cost import cost_section, scaling_summary
from rpevit.analysis.answers_sources import (ROTATION_BENCH, ROTATION_STUDY, TOKEN_SCALING, AnswersError, Sources,
                                             confirmatory_studies, configurations, find_config, is_published,
                                             published_folders, status_of)
from rpevit.analysis.answers_validation import (folder_dataset, knob_of, ran_with, superseded_by, validation_folders,
                                                validation_lines, validation_section, with_defaults_for_unrecorded)
from rpevit.analysis.answers_wording import (DATASET_NAMES, EFFECT_WORDS, G_text, accuracy_of, bounds,
                                             configuration_lines, effect_words, epochs_of, exploratory, percent,
                                             seeds_per_cell, setting_text, study_note, verdict_text)
from rpevit.analysis.common import (code_span, fmt, has_random_features, markdown_table, one_read_per_folder, raw_text,
                                    read_trials, redraw_labels)
from rpevit.analysis.gap_closure import DRAW_MEAN, Assessment, Config, Gap
from rpevit.analysis.generated import GeneratedTextError, block_names, fill, stale, whole_file, write_atomic
from rpevit.analysis.stats import seeds_text
from rpevit.config import TrialConfig
from rpevit.sweep.declaration import Declaration, DeclarationError
from rpevit.sweep.results import TRIALS_FILE


COMMAND = "python analysis/answers.py results"
ANSWERS_FILE = "ANSWERS.md"


# ---------------------------------------------------------------- sections
def running_lines(results_dir: Path) -> list[str]:
    """One line per declared study still running: what it declared, how many of its items are judged so far (an
    item is judged once every cell it uses is complete: its `confirmatory.md` in results/in_progress/, which a
    review found readers were not pointed to), and its rows so far."""
    lines = []
    published = {f.relative_to(results_dir).as_posix() for f in confirmatory_studies(results_dir)}
    for folder in confirmatory_studies(results_dir, running=True):
        if folder.name in published:  # a study is running or published, never both: which rows would be its own?
            raise AnswersError(f"{folder} and {Path(results_dir) / folder.name} both hold the declared study "
                               f"{folder.name!r}; allowed: one of them. A published study is continued into its "
                               f"published folder (results/README.md's declared-studies block); remove {folder} "
                               f"(git rm -r) once its rows are there")
        decl, _, families, _ = confirmatory.judge(folder)
        items = sum(len(outcomes) for _, outcomes in families)
        complete = sum(o.complete for _, outcomes in families for o in outcomes)
        status = status_of(folder) or "declared before its first trial"
        name = folder.relative_to(results_dir).as_posix()
        so_far = progress.progress(folder)
        planned = f" of {so_far.planned} trials" if so_far.planned is not None else ""
        lines.append(f"- Running, {status}: {code_span(name)} "
                     f"({confirmatory.question_text(decl)}; {items} judged items in {len(families)} families, "
                     f"n = {len(decl.seeds)} declared seeds): an item is judged once every cell it uses holds "
                     f"every declared seed; {complete} of the {items} are judged so far, in "
                     f"{code_span(f'{name}/confirmatory.md')} (a verdict beside an incomplete item of its family says "
                     f"how it may still change). "
                     f"Rows so far: {so_far.ok} ok{planned}, {so_far.complete_cells} of "
                     f"{len(so_far.cells) * len(so_far.rungs)} cell x rung entries complete "
                     f"({code_span(f'{name}/{progress.PROGRESS_FILE}')}).")
    return lines


def family_line(name: str, outcomes: Sequence[confirmatory.Outcome], n: int) -> str:
    """One declared family in one line, its items grouped by verdict: the resolved ones with their interval at
    its Holm level, a contrast or a trend with its direction in words (a family may resolve one item each way: a
    contrast that widens the gap beside one that narrows it), the others by name (confirmatory.md has every
    figure)."""
    def counts(o: confirmatory.Outcome) -> str:
        if o.kind == "trend":
            return f"{o.have[0]} of {n} seeds with every rung"
        return f"{(' and ' if len(o.have) == 2 else ', ').join(map(str, o.have))} of {n} seeds"
    resolved = [f"{o.label} {o.holm.text()}" + (f" ({o.direction})" if o.kind != "comparison" else "")
                for o in outcomes if o.resolved]  # a − b's sign says which side is higher; a contrast's does not
    unresolved = [o.label for o in outcomes if o.complete and not o.resolved]
    incomplete = [f"{o.label} ({counts(o)})" for o in outcomes if not o.complete]
    groups = [f"resolved: {', '.join(resolved)}" if resolved else "",
              f"not resolved with {n} seeds: {', '.join(unresolved)}" if unresolved else "",
              f"incomplete, no verdict before the declared n: {', '.join(incomplete)}" if incomplete else ""]
    return f"  - {name}, k = {outcomes[0].k if outcomes else 0}: {'; '.join(g for g in groups if g)}."


def declared_section(sources: Sources, detail: bool) -> list[str]:
    """The confirmatory answers: per declared study, each declared comparison with its verdict
    (confirmatory.judge); detail adds the study's whole confirmatory table (confirmatory.build). A declared
    study still running (results/in_progress/) gets one line (running_lines), no verdicts."""
    folders = confirmatory_studies(sources.results_dir)
    running = running_lines(sources.results_dir)
    if not folders:
        return ["No published study declared its comparisons before it ran (no `declaration.json` in any published "
                "study folder), so there is no confirmatory answer yet: every figure that follows is exploratory.",
                *([""] + running if running else [])]
    lines = [*running]
    for folder in folders:
        rel = folder.relative_to(sources.results_dir).as_posix()
        decl, _, families, _ = confirmatory.judge(folder)
        n = len(decl.seeds)
        status = status_of(folder)
        label = "confirmatory" if not status else \
            f"confirmatory over the rows that started after its last declaration; {status}"
        lines.append(f"- {code_span(rel)} ({label}): {confirmatory.question_text(decl)} Metric: "
                     f"{confirmatory.METRIC_TEXT[decl.metric]}, in points; n = {n} declared seeds per cell; Holm "
                     f"within each declared family of k items; each item (a − b, a difference of two gaps, or a gap's change "
                     f"per seed) at its Holm level:")
        lines += [family_line(name, outcomes, n) for name, outcomes in families]
        if detail:
            text = confirmatory.build(folder).replace("\n### ", "\n#### ")
            lines += ["", f"### {code_span(rel)}: its confirmatory table "
                          f"({code_span(f'python analysis/confirmatory.py results/{rel}')})", "", text, ""]
    return lines


def ladder_lines(sources: Sources) -> list[str]:
    """Per published declared study whose rows form a budget ladder: its ranking stability and best means
    (budget_ladder.summary), exploratory beside the study's declared comparisons."""
    lines = []
    for folder in confirmatory_studies(sources.results_dir):
        text = budget_ladder.summary(folder)
        if text:
            rel = folder.relative_to(sources.results_dir).as_posix()
            lines.append(f"- Budget ladder ({code_span(rel)}; exploratory, beside its declared comparisons): {text}. "
                         f"The table and plot: {code_span(f'results/{rel}/budget_ladder.md')} "
                         f"({code_span(f'python analysis/budget_ladder.py results/{rel}')}).")
    return lines


def ladder_section(sources: Sources) -> list[str]:
    lines = ladder_lines(sources)
    return ["## Budget ladders (exploratory)", "", *lines, ""] if lines else []


def gap_section(sources: Sources, dataset: str, title: str) -> list[str]:
    """One dataset's softmax-vs-Performer answers: every Performer configuration, exploratory."""
    soft = accuracy_of(sources, dataset, "softmax", "ape")
    head = [f"## {title} (exploratory)", "", exploratory(sources.sweeps(dataset), sources.results_dir), "",
            f"{DATASET_NAMES.get(dataset, dataset)}, {epochs_of(sources, dataset)}; "
            f"{seeds_per_cell(sources, dataset)}. softmax+ape reaches {percent(soft)} %. Random-feature backends are "
            "judged on the mean over fresh draws (draw mean); gains, gaps and G are in points of accuracy (G: a "
            "ratio). Each configuration is one Holm family per accuracy: the gap, and per encoding G (tested as "
            "G = 0, i.e. the gain) and the same-encoding gap; k is given with each interval. Source: "
            "`results/report.md`, \"Accuracy and gap closure\".", ""]
    lines = []
    for config in configurations(sources.assessed[DRAW_MEAN], dataset):
        lines += configuration_lines(sources, config)
    return head + lines + [""]


def string_section(sources: Sources, dataset: str) -> list[str]:
    """The STRING variants against RoPE under softmax, with bench costs (string_study's tables and verdict)."""
    table, fs = sources.strings[dataset]
    rows = [[r["variant"], r["acc_text"], r["diff"].text(scale=100),
             string_study.holm_word(r["holm"]) + (f" (k = {r['holm'].k})" if r["holm"] is not None else "")
             + string_study.twin_text(r),
             fmt(r["train x rope"], 3)] for _, r in table.iterrows()]
    sweeps = sorted(set(sources.train.frame.loc[(sources.train.frame["dataset"] == dataset) &
                                                (sources.train.frame["attention"] == "softmax"), "sweep"].astype(str)
                        .map(raw_text)))  # folder names, as exploratory takes them
    return [f"## {DATASET_NAMES.get(dataset, dataset)}: the STRING variants against RoPE, softmax attention "
            "(exploratory)", "", exploratory(sweeps, sources.results_dir), "",
            string_study.verdict(DATASET_NAMES.get(dataset, dataset), table, fs), "",
            f"Cost: bench trials each alone, {string_study.bench_devices(sources.both.frame, dataset)}.", "",
            markdown_table(["variant", "test acc % [95%] (n)", "vs rope, points [95%] (n)", "Holm vs rope",
                            "train step x rope (bench, alone)"], rows), "",
            "Source: `results/report.md`, \"The STRING study\"; a seed trained in two sweeps counts once.", ""]


def rotation_section(sources: Sources) -> list[str]:
    """The rotation study: each cell's verdict (rotation.verdict) and the cost of each model, timed alone."""
    long, costs = sources.rotation
    lines = ["## MNIST: what a rotation-invariant RPE buys where rotation matters (exploratory)", "",
             exploratory([ROTATION_STUDY], sources.results_dir), "",
             "Each paragraph is one cell (backend x training augmentation); Holm within each test rotation over the "
             "rotinv-vs-other pairs, and on the drop under exact quarter turns. Source: "
             f"`results/{ROTATION_STUDY}/rotation.md` (`python analysis/rotation.py results/{ROTATION_STUDY} --bench "
             f"results/{ROTATION_BENCH}`).", ""]
    upright = long[(long["augment"] == "none")]
    where = {rotation.UPRIGHT: "upright", "90": "at 90 degrees", rotation.RANDOM: "at random angles"}
    spans = {r: upright[upright["rotation"] == r].groupby(list(rotation.KEY), observed=True)["acc"].mean()
             for r in where}
    lines += ["Trained upright, every encoding's mean accuracy under both backends lies in "
              + ", ".join(f"{fmt(100 * s.min(), 3)}–{fmt(100 * s.max(), 3)} % {where[r]}" for r, s in spans.items())
              + " (descriptive: means over seeds).", ""]
    for cell in rotation.cells(long):
        by_rotation, on_drop = rotation.families(long, cell)
        lines += [rotation.verdict(cell, by_rotation, on_drop, rotation.mean_drops(long, cell)), ""]
    shown = costs.assign(cost=[f"{fmt(s, 3)} ({rotation.SHORT_TIMING.get(t, t)})"
                               for s, t in zip(costs["train_s_per_epoch"], costs["timing"])])
    shown = shown.drop_duplicates(["attention", "pe"])
    table = shown.pivot(index="pe", columns="attention", values="cost").fillna("—")
    lines += [f"Cost, training s per epoch of the study's images (how each was measured in brackets; "
              f"{efficiency.time_devices(shown)}):", "",
              markdown_table(["pe", *table.columns], [[pe, *row] for pe, row in zip(table.index, table.to_numpy())]),
              ""]
    return lines


# ---------------------------------------------------------------- the README's short answers
def short_gap(gap: Gap, backend: str) -> str:
    if gap.judged is None:
        return f"softmax+ape − {backend}+ape: not measured"
    what = {"resolved": "excludes 0, a gap", "ahead": f"excludes 0, {backend}+ape ahead",
            "one seed": "one seed"}.get(gap.state, f"not resolved with {seeds_text(gap.judged.interval.n)}, so no G")
    return (f"softmax+ape − {backend}+ape {gap.nominal.text(100)}, Holm {bounds(gap.judged.interval)} "
            f"(k = {gap.judged.k}): {what}")


def grouped_effects(a: Assessment, backend: str) -> str:
    """Each encoding's effect on b+ape, grouped by what its Holm interval shows: 'raises favor+ape: luo_rpe
    0.494 [...] (n=5,5), Holm [...]; ...; not resolved: ape+rope (n=3,5)'."""
    groups: dict[str, list[str]] = {}
    for pe, c in a.closures.items():
        if c.G_holm is None:
            continue
        if c.effect.startswith("not resolved") or c.effect not in EFFECT_WORDS:
            groups.setdefault("not resolved", []).append(f"{pe} ({c.gain.n_text()})")
            continue
        G = G_text(c, a.gap)
        groups.setdefault(effect_words(c.effect, backend).split(" (")[0], []).append(
            f"{pe} {c.gain.text(100)}, Holm {bounds(c.gain_holm)}" + (f", {G}" if G else ""))
    return "; ".join(f"{word}: {', '.join(items)}" for word, items in groups.items())


def grouped_same(a: Assessment, backend: str) -> str:
    """The same-encoding gaps, grouped: where softmax with the same encoding is ahead, and the rest."""
    groups: dict[str, list[str]] = {}
    for pe, c in a.closures.items():
        if c.same_holm is None:
            groups.setdefault("not measured", []).append(pe)
        elif c.same_holm.resolved:
            word = "softmax ahead" if c.same.point > 0 else f"{backend} ahead"
            groups.setdefault(word, []).append(f"{pe} {c.same.text(100)}, Holm {bounds(c.same_holm.interval)}")
        else:
            groups.setdefault("not resolved", []).append(f"{pe} ({c.same.n_text()})")
    return "; ".join(f"{word}: {', '.join(items)}" for word, items in groups.items())


# What a training run's outcome depends on, beside the cells' own attention and encoding: the fields an
# exploratory and a declared answer to one comparison are set side by side on (redraw: random-feature rows only).
PROTOCOL_FIELDS = ("epochs", "n_train", "lr_schedule", "lr", "warmup_epochs", "init", "grad_clip", "redraw_interval",
                   "redraw_until", "torch_version")
REDRAW_FIELDS = ("redraw_interval", "redraw_until")


def cell_rows(frame: pd.DataFrame, variants: Iterable[str], qk_norm: str = "none") -> pd.DataFrame:
    """The rows of `frame` whose attention+pe is one of `variants` ("softmax+ape"), at `qk_norm`."""
    if frame.empty:
        return frame
    names = frame["attention"].astype(str) + "+" + frame["pe"].astype(str)
    keep = names.isin(list(variants))
    if "qk_norm" in frame.columns:
        keep &= frame["qk_norm"].astype(str).eq(qk_norm) | frame["qk_norm"].isna()
    return frame[keep]


def protocol_differences(before: pd.DataFrame, after: pd.DataFrame, redraw: str | None = None) -> str:
    """The PROTOCOL_FIELDS whose values differ between two sets of rows, each as 'lr 0.002 → 0.004' (several
    values joined by '/'), or "" where none does. A field older rows lack is read at what their code ran
    (`with_defaults_for_unrecorded`); `redraw` (a redraw_label, "every 100 until 0.8") keeps only the
    random-feature `before` rows of that one schedule (an exploratory study that also ran others reports each
    configuration apart)."""
    def values(rows: pd.DataFrame, name: str) -> str:
        if name in REDRAW_FIELDS:
            rows = rows[has_random_features(rows)]
        if name not in rows.columns and name not in {f.name for f in fields(TrialConfig)}:
            return "—"  # an environment column no row recorded
        if name in {f.name for f in fields(TrialConfig)}:
            rows, _ = with_defaults_for_unrecorded(rows, (name,))
        shown = sorted({setting_text(v) for v in rows[name].dropna()}, key=lambda t: (len(t), t))
        return "/".join(shown) or "—"

    if redraw is not None and not before.empty:
        random = has_random_features(before)
        before = before[~random | (pd.Series(redraw_labels(before, random), index=before.index) == redraw)]
    out = []
    for name in PROTOCOL_FIELDS:
        old, new = values(before, name), values(after, name)
        if old != new:
            out.append(f"{name} {old} → {new}")
    return ", ".join(out)


def declared_on(sources: Sources, dataset: str) -> Iterator[tuple[Path, pd.DataFrame, Declaration, list]]:
    """(folder, its train rows, declaration, judged families) of each declared study whose rows are all on
    `dataset`: the studies an exploratory line on that dataset is set beside."""
    for folder in confirmatory_studies(sources.results_dir):
        frame = read_trials(folder, ["train"]).frame
        if frame.empty or set(frame["dataset"].astype(str)) != {dataset}:
            continue
        decl, _, families, _ = confirmatory.judge(folder)
        yield folder, frame, decl, families


def declared_study_label(folder: Path, frame: pd.DataFrame, before: pd.DataFrame | None,
                         variants: Iterable[str], config: Config | None) -> str:
    """"`study`, redeclared (settings that differ from these rows: ...)": the study's name, whether it was
    redeclared, and (with the exploratory rows `before` of `config`) the settings its rows of `variants` ran
    that differ from them (protocol_differences): the same question, not the same runs."""
    differs = ""
    if before is not None and config is not None:
        changed = protocol_differences(before, cell_rows(frame, variants), config[3])
        differs = f" (settings that differ from these rows: {changed})" if changed else " (the same settings)"
    return f"{code_span(folder.name)}{', redeclared' if status_of(folder) else ''}{differs}"


def exploratory_rows(sources: Sources, dataset: str, variants: Iterable[str],
                     config: Config | None) -> pd.DataFrame | None:
    """The exploratory train rows of `variants` on `dataset` a declared study's settings are compared with
    (None without a `config` to compare)."""
    train = sources.train.frame
    if config is None or train.empty:
        return None
    return cell_rows(train[train["dataset"].astype(str) == dataset], variants)


def declared_verdicts(sources: Sources, dataset: str, a: str, b: str, config: Config | None = None) -> str:
    """The verdicts the declared studies on `dataset` gave a − b (variants as prose names them), per family
    that declared it on its primary metric: "`mnist_headline_cpu` (the same-encoding gap): not resolved with
    5 seeds". With `config` (the exploratory configuration the line supersedes), each study also names the
    settings its rows of a and b ran that differ from the exploratory rows' (`protocol_differences`): the
    same question, not the same runs. Empty where none declared it."""
    found = []
    before = exploratory_rows(sources, dataset, (a, b), config)
    for folder, frame, decl, families in declared_on(sources, dataset):
        verdicts = []
        for name, outcomes in families:
            for o in outcomes:
                if o.kind == "comparison" and (o.a_short, o.b_short) == (a, b) and o.metric == decl.metric:
                    verdict = (f"resolved, {o.holm.text()}" if o.resolved else
                               o.verdict(len(decl.seeds)).split(" (no verdict")[0])
                    verdicts.append(f"{name}: {verdict}")
        if verdicts:
            found.append(f"{declared_study_label(folder, frame, before, (a, b), config)}: {'; '.join(verdicts)}")
    return "; ".join(found)


def declared_brief(sources: Sources, dataset: str, pairs: Sequence[tuple[str, str]],
                   config: Config | None = None) -> str:
    """How the declared studies on `dataset` judged each a − b of `pairs` (variants as prose names them), on
    their primary metric, counted over the families that declared it (one per rung in a ladder): "`cifar10_ladder_cpu`:
    favor+luo_rpe − favor+ape: favor+luo_rpe ahead in 3 of 3 declared families; favor+rope − favor+ape: favor+ape
    ahead in 3 of 3". Empty where none declared any of them. An exploratory line that a declared study also
    answers ends with this, so a reader sees where the two disagree (a review found them contradicting with no
    note: only the FAVOR+ APE gap was looked up). With `config`, each study names the settings its rows of these
    variants ran that differ from the exploratory rows' (protocol_differences), as declared_verdicts does."""
    variants = sorted({v for pair in pairs for v in pair})
    before = exploratory_rows(sources, dataset, variants, config)
    found = []
    for folder, frame, decl, families in declared_on(sources, dataset):
        parts = []
        for a, b in pairs:
            judged = [o for _, outcomes in families for o in outcomes if o.kind == "comparison"
                      and {(o.a_short, o.b_short), (o.b_short, o.a_short)} & {(a, b)} and o.metric == decl.metric]
            if not judged:
                continue
            words: dict[str, int] = {}
            for o in judged:  # declared either way round: the word names the variant ahead
                word = ("incomplete" if not o.complete else "not resolved" if not o.resolved
                        else f"{o.a_short if o.holm.point > 0 else o.b_short} ahead")
                words[word] = words.get(word, 0) + 1
            counts = ", ".join(f"{w} in {n}" for w, n in words.items())
            parts.append(f"{a} − {b}: {counts} of {len(judged)} declared famil{'y' if len(judged) == 1 else 'ies'}")
        if parts:
            found.append(f"{declared_study_label(folder, frame, before, variants, config)}: {'; '.join(parts)}")
    return "; ".join(found)


SUPERSEDED = ("superseded by the declared studies that ask the same questions at the settings chosen on validation "
              "(not a rerun of these trials; each a − b at its Holm level per declared family): ")


HOW_TO_READ = ("How to read: mean or difference [95% interval] (n seeds of each group), t-based (Welch, "
               "Welch-Satterthwaite for a contrast; `rpevit/analysis/stats.py`); \"at its Holm level\" is the same "
               "interval corrected by Holm within its family. An effect is claimed only where that interval excludes 0; "
               "otherwise it is \"not resolved with n seeds\". A comparison a study declared before it ran is "
               "confirmatory; everything else is exploratory and labelled so.")


def readme_block(sources: Sources) -> str:
    """The README's "Answers so far" (issue 58, item 8): the headline figure and table (rpevit.analysis.headline),
    the line of each declared study still running (running_lines: a review found the README silent about the
    declared study of its own question), how to read them, and the link to results/ANSWERS.md, which keeps every
    line of the summary."""
    found = headline.headline(sources.results_dir, lambda f: is_published(sources.results_dir, f))
    running = running_lines(sources.results_dir)  # a declared study of the question still running: where it stands
    lines = [*headline.readme_lines(found, f"results/{headline.FIGURE}"), *([""] + running if running else []),
             "", HOW_TO_READ + " Every other answer "
             f"(MNIST, STRING, rotation, validation choices, cost), each declared comparison and every configuration: "
             f"[results/{ANSWERS_FILE}](results/{ANSWERS_FILE}); the tables: [results/report.md](results/report.md)."]
    return "\n".join(lines)


def summary_lines(sources: Sources) -> list[str]:
    """results/ANSWERS.md's summary: the declared comparisons, then a few headline figures of each study, each
    labelled (the README's block until issue 58 moved the README to one figure and one table)."""
    lines = ["**Declared before the runs (confirmatory).**", "", *declared_section(sources, False)]
    lines += ["", "**Exploratory** (comparisons no study declared before it ran; intervals at 95 %, then at their "
                  "Holm level; points of accuracy, draw mean for random-feature models):"]
    for dataset, title in (("mnist", "MNIST"), ("cifar10", "CIFAR-10")):
        assessed = sources.assessed[DRAW_MEAN]
        config = find_config(assessed, dataset, "favor")
        a = assessed[config]
        notes = [f"in {code_span(s)}, {note}" for s in sources.sweeps(dataset)
                 if (note := study_note(sources.results_dir, s))]
        lines.append(f"- **{title}** ({', '.join(map(code_span, sources.sweeps(dataset)))}; {epochs_of(sources, dataset)}; "
                     f"FAVOR+ redrawn {config[3]}" + "".join(f"; {n}" for n in notes) + "):")
        gap = f"  - FAVOR+: {short_gap(a.gap, 'favor')}"
        first = sources.first_look[DRAW_MEAN].get(config)
        if first is not None and first.gap.judged is not None and first.gap.judged.nominal.n != a.gap.judged.nominal.n:
            gap += f" (first look, {first.gap.nominal.n_text()}: Holm {bounds(first.gap.judged.interval)}, " \
                   f"{verdict_text(first.gap.judged)})"
        if declared := declared_verdicts(sources, dataset, "softmax+ape", "favor+ape", config):
            gap += (f"; superseded by the declared studies that ask the same question (softmax+ape − favor+ape) at "
                    f"the settings chosen on validation, not a rerun of these trials: {declared}")
        pes = list(a.closures)
        later = lambda pairs, c=config: (f"; {SUPERSEDED}{d}"  # noqa: E731
                                         if (d := declared_brief(sources, dataset, pairs, c)) else "")
        lines += [gap + ".", f"  - On favor+ape (gain): {grouped_effects(a, 'favor')}"
                  + later([(f"favor+{pe}", "favor+ape") for pe in pes]) + ".",
                  f"  - Same encoding, softmax+pe − favor+pe: {grouped_same(a, 'favor')}"
                  + later([(f"softmax+{pe}", f"favor+{pe}") for pe in pes]) + "."]
        relu_config = find_config(assessed, dataset, "relu")
        relu = assessed[relu_config]
        relu_pes = list(relu.closures)
        lines.append(f"  - ReLU: {short_gap(relu.gap, 'relu')}; on relu+ape: {grouped_effects(relu, 'relu')}"
                     + later([("softmax+ape", "relu+ape"), *((f"relu+{pe}", "relu+ape") for pe in relu_pes)],
                             relu_config) + ".")
    for dataset in sorted(sources.strings, key=lambda d: (d != "mnist", d)):
        table, _ = sources.strings[dataset]
        judged = [r["holm"] for r in string_study.distinct(table)]
        best = table.iloc[0]
        resolved = sum(j.resolved for j in judged)
        lines.append(f"- STRING on {DATASET_NAMES.get(dataset, dataset)} (softmax): {resolved} of {len(judged)} "
                     f"differences to rope exclude 0 at their Holm level (k = {len(judged)}); the highest mean is "
                     f"{best['variant']}, {best['acc_text']} %.")
    long, _ = sources.rotation
    hits = []
    for cell in rotation.cells(long):
        by_rotation, on_drop = rotation.families(long, cell)
        below = sum(j.resolved and j.interval.point < 0 for f in by_rotation.values() for j in f.values())
        above = sum(j.resolved and j.interval.point > 0 for f in by_rotation.values() for j in f.values())
        total = sum(len(f) for f in by_rotation.values())
        drop = sum(j.resolved for j in on_drop.values())
        hits.append(f"{cell[1]}, {rotation.AUGMENT_WORDS.get(cell[4], cell[4]).split(' (')[0]}: {above} above and "
                    f"{below} below of {total}, {drop} of {len(on_drop)} drops")
    lines.append("- Rotation (`rotation_mnist_cpu`): rotinv against the other encodings, comparisons whose Holm "
                 "interval excludes 0 — " + "; ".join(hits) + ".")
    lines += ladder_lines(sources)
    for folder in validation_folders(sources.results_dir):
        knob = knob_of(folder)
        lines.append(f"- Chosen on validation ({code_span(folder.name)}; {' / '.join(knob)}: the chosen value over the earlier "
                     f"one, margin in validation points): " + "; ".join(validation_lines(folder, short=True))
                     + f". {' / '.join(knob)} on {folder_dataset(folder)}: {ran_with(sources, knob, folder_dataset(folder))}."
                     + (f" Superseded by {code_span(later)}." if (later := superseded_by(sources.results_dir, folder))
                        else ""))
    lines.append(f"- Cost (measurements, `{TOKEN_SCALING}`): {scaling_summary(sources)}")
    return lines


def answers_file(sources: Sources) -> str:
    """results/ANSWERS.md."""
    lines = ["# Answers so far", "",
             "How to read the figures: mean or difference [95 % interval] (n seeds of each group). Intervals are "
             "t-based (Welch for differences, Fieller for the gap closure G; `rpevit/analysis/stats.py`). A t or "
             "Welch interval is symmetric about its estimate and is not cut at the range an accuracy (0-100) or a "
             "difference of two (±100) can take: where seeds disagree widely a bound passes it, printed as computed (a "
             "Kendall's tau interval, clipped to tau's range [-1, 1], says where it was). "
             "A verdict "
             "family is corrected by Holm; each comparison is also shown at its Holm level (with k, the family's "
             "size), and an effect is claimed only where that interval excludes 0; otherwise the text says \"not "
             "resolved with n seeds\". G = (b+pe − b+ape) / (softmax+ape − b+ape) is given only where that gap "
             "excludes 0 at its Holm level.", "",
             "Confirmatory or exploratory: a comparison a study declared before its first trial ran (its "
             "`declaration.json`) is confirmatory and judged over exactly its declared seeds (\"Declared "
             "comparisons\"). Everything else is exploratory and labelled so: its \"excludes 0\" (or, in the "
             "sentences the STRING and rotation reports write, \"resolved\") describes these rows under Holm "
             "families chosen after the data were seen, not a confirmed answer.", "",
             "## In short", "", *summary_lines(sources), "",
             "## Declared comparisons (confirmatory)", "", *declared_section(sources, True), "",
             *gap_section(sources, "mnist", "MNIST: softmax vs Performer attention, and what each encoding does"),
             *string_section(sources, "mnist"), *rotation_section(sources),
             *gap_section(sources, "cifar10", "CIFAR-10: softmax vs Performer attention, and what each encoding does"),
             *string_section(sources, "cifar10"), *ladder_section(sources), *validation_section(sources),
             *cost_section(sources)]
    return "\n".join(lines)


# ---------------------------------------------------------------- files
BLOCKS: dict[str, Callable[[Sources], str]] = {
    "dataset-recipes": recipe_table,
    "answers": readme_block,
    "study-rows": rows_block,
    "declared-studies": declared_studies_block,
    "cifar10-pilots": pilots_block,
    "cifar10-step-times": step_times_block,
    "gpu-sweep": gpu_sweep_block,
    "gpu-times": gpu_times_block,
    "gpu-answers": gpu_answers_block,
    "gpu-bench": gpu_bench_block,
    "gpu-packing": gpu_packing_block,
    "mnist-redraw-table": mnist_redraw_table,
}


def targets(results_dir: Path) -> list[Path]:
    """The hand-written files that may hold generated blocks: the README, results/README.md, docs/*.md."""
    root = Path(results_dir).resolve().parent
    return [p for p in [root / "README.md", Path(results_dir) / "README.md", *sorted((root / "docs").glob("*.md"))]
            if p.exists()]


def progress_files(results_dir: Path) -> dict[Path, str]:
    """in_progress/<study>/PROGRESS.md of each running declared study: its rows so far, per declared cell and
    rung (rpevit.analysis.progress), so no stop types them by hand."""
    return {folder / progress.PROGRESS_FILE: whole_file(progress.progress_text(progress.progress(folder), folder.name),
                                                        COMMAND)
            for folder in confirmatory_studies(results_dir, running=True)}


def expected_texts(results_dir: Path) -> dict[Path, str]:
    """Every generated file and every file holding generated blocks, as the analysis code writes them."""
    sources = Sources(Path(results_dir))
    cache: dict[str, str] = {}

    def generator(name: str) -> Callable[[], str]:
        return lambda: cache.setdefault(name, BLOCKS[name](sources))

    out = {Path(results_dir) / ANSWERS_FILE: whole_file(answers_file(sources), COMMAND)}
    out.update(progress_files(Path(results_dir)))
    placed: set[str] = set()
    for path in targets(results_dir):
        text = path.read_text(encoding="utf-8")
        names = block_names(text)
        if names:
            placed.update(names)
            out[path] = fill(text, {name: generator(name) for name in BLOCKS}, COMMAND, str(path))
    unused = sorted(set(BLOCKS) - placed)
    if unused:
        raise GeneratedTextError(f"generated block(s) {', '.join(unused)} appear in no file of "
                                 f"{', '.join(str(p) for p in targets(results_dir))}; allowed: every block placed once")
    return out


def check_results_folder(results_dir: Path) -> None:
    """SystemExit in one line where RESULTS_DIR cannot be the folder of studies the answers come from: a sweep
    folder itself (its trials.parquet at the top: the studies are the folders below RESULTS_DIR), or a folder
    with no sweep folder below it (an empty one: the answers' tables would have no rows to come from)."""
    allowed = "allowed: the folder of sweep folders the answers come from (the repository's `results`)"
    if (results_dir / TRIALS_FILE).exists():
        raise SystemExit(f"error: RESULTS_DIR has value {str(results_dir)!r}, which is a sweep folder itself (it holds "
                         f"{TRIALS_FILE}); {allowed}, e.g. its parent")
    if not any(p.is_file() for p in results_dir.rglob(TRIALS_FILE)):
        raise SystemExit(f"error: RESULTS_DIR has value {str(results_dir)!r}, which holds no sweep folder (no "
                         f"{TRIALS_FILE} below it); {allowed}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, help="the committed results folder (results)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale file")
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        parser.error(f"RESULTS_DIR {args.results_dir} is not a folder")
    check_results_folder(args.results_dir)
    try:
        with one_read_per_folder():  # each folder's rows read once for every block
            expected = expected_texts(args.results_dir)
    except (AnswersError, GeneratedTextError, DeclarationError) as err:
        raise SystemExit(f"error: {' '.join(str(err).split())}") from None
    root = args.results_dir.resolve().parent
    if args.check:
        messages = stale(expected, root) + provenance_mismatches(args.results_dir)
        figure = args.results_dir / headline.FIGURE
        if headline.headline(args.results_dir, lambda f: is_published(args.results_dir, f)) is not None and not figure.is_file():
            messages.append(f"{figure} is missing: the README shows it")
        if messages:
            print("\n\n".join(messages) + f"\n\nRegenerate with: {COMMAND}", file=sys.stderr)
            raise SystemExit(1)
        print(f"{len(expected)} files agree with the analysis code")
        return
    for path, text in expected.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            write_atomic(path, text)
            print(f"wrote {os.path.relpath(path)}")
    found = headline.headline(args.results_dir, lambda f: is_published(args.results_dir, f))
    if found is not None:  # the README's figure, drawn from the same rows as its table
        headline.figure(found, args.results_dir / headline.FIGURE)  # save_figure says where


__all__ = ["BLOCKS", "COMMAND", "AnswersError", "Sources", "answers_file", "confirmatory_studies", "declared_section",
           "expected_texts", "is_published", "main", "progress_files", "provenance_mismatches", "published_folders", "readme_block"]
