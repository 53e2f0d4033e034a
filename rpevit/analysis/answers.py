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
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from rpevit.analysis import budget_ladder, confirmatory, efficiency, gap_closure, rotation, string_study, token_scaling
from rpevit.analysis import continuation, headline, progress, validation_choice
from rpevit.analysis.common import (TrialRows, code_span, column, current_rows, fmt, has_random_features, listed_studies,
                                    markdown_table, one_read_per_folder, read_epoch_times, read_sweep, read_trials,
                                    md_text, raw_text, read_text_file, redraw_labels, space_keys, with_variant, devices_text, VARIANT)
from rpevit.analysis.gap_closure import DRAW_MEAN, TRAIN_DRAW, Assessment, Closure, Config, Gap
from rpevit.analysis.generated import GeneratedTextError, block_names, fill, stale, whole_file, write_atomic
from rpevit.analysis.report import hours_running, thread_hours, time_span
from rpevit.analysis.stats import Interval, Judged, mean_interval, seeds_text
from rpevit.config import FIRST_DEFAULTS, ConfigError, TrialConfig, recorded_values
from rpevit.sweep.declaration import DECLARATION_FILE, Declaration, DeclarationError
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import TRIALS_FILE, unix_seconds
from rpevit.sweep.space import load_space

COMMAND = "python analysis/answers.py results"
ANSWERS_FILE = "ANSWERS.md"
# What happened to a study after its rows were first read, which its rows cannot show: seeds added after a look.
ADDED_AFTER_A_LOOK = {"mnist_converged_cpu": (3, 4)}

ROTATION_STUDY, ROTATION_BENCH = "rotation_mnist_cpu", "bench_rotation_mnist_cpu"
TOKEN_SCALING = "token_scaling_cpu"
GPU_FOLDER, GPU_SWEEP, GPU_BENCH, GPU_PACKING = "gpu_h100", "all12_cifar10_gpu_4ep", "bench_cifar10_gpu", "packing"
PILOTS = "pilots"
PILOT_ALLOWED = "the JSON summary row the CLI prints (python -m rpevit.cli), a regular file"
PACKING_ALLOWED = "the JSON benchmarks/gpu_packing.py writes, a regular file"
DATASET_NAMES = {"mnist": "MNIST", "cifar10": "CIFAR-10", "digits": "digits"}


class AnswersError(ValueError):
    """A figure the answers cite is missing from the committed results (one line naming it)."""


# ---------------------------------------------------------------- wording
def bounds(iv: Interval, scale: float = 100.0) -> str:
    """'[0.0115, 0.666]' or 'unbounded' (a Fieller interval whose denominator is not resolved)."""
    if iv.unbounded:
        return "unbounded"
    if not iv.bounded:
        return "no interval"
    return f"[{bound(iv.lo * scale)}, {bound(iv.hi * scale)}]"


def bound(value: float) -> str:
    """3 significant figures, but never rounded onto a round hundred it is not (100.28 is '100.3', not '100',
    which would read as the ceiling of an accuracy rather than an interval that passes it)."""
    text = fmt(value, 3)
    return fmt(value, 4) if abs(value) >= 100 and float(text) != value else text


def at_holm(iv: Interval, k: int, scale: float = 100.0) -> str:
    """'[0.0115, 0.666] at its Holm level (99.2 %, k = 11)'."""
    return f"{bounds(iv, scale)} at its Holm level ({fmt(100 * iv.level, 3)} %, k = {k})"


def verdict_text(judged: Judged) -> str:
    """'excludes 0' where the interval at its Holm level does, else 'not resolved with n seeds'."""
    return "excludes 0" if judged.resolved else f"not resolved with {seeds_text(judged.interval.n)}"


def claim(judged: Judged, scale: float = 100.0, unit: str = "") -> str:
    """A Holm-judged comparison with both intervals and what it shows: '0.339 [0.131, 0.547] (n=5,5);
    [0.0115, 0.666] at its Holm level (99.2 %, k = 11): excludes 0', or '...: not resolved with 5 seeds'."""
    if not math.isfinite(judged.nominal.p):
        return f"{judged.nominal.text(scale)}{unit}: no interval"
    return f"{judged.nominal.text(scale)}{unit}; {at_holm(judged.interval, judged.k, scale)}: {verdict_text(judged)}"


def percent(values: Sequence[float] | np.ndarray) -> str:
    """'98.77 [98.65, 98.89] (n=5)': a mean accuracy in %."""
    return mean_interval(values).text(scale=100, digits=4)


def exploratory(folders: Iterable[str], results_dir: Path) -> str:
    """The label of an exploratory passage: which studies it reads, that none declared its comparisons (or
    that only their declared comparisons, elsewhere, are confirmatory), and what else is known about them.
    `folders`: folder names as they are (a frame's `sweep` value read back with raw_text), each printed as a
    code span."""
    folders = sorted(set(folders))
    declared = [f for f in folders if (results_dir / f / DECLARATION_FILE).exists()]
    undeclared = [f for f in folders if f not in declared]
    redeclared = [f for f in declared if status_of(results_dir / f)]
    parts = []
    if undeclared:
        parts.append(f"{', '.join(code_span(f) for f in undeclared)} declared no comparisons before "
                     f"{'it' if len(undeclared) == 1 else 'they'} ran")
    if declared:
        parts.append(f"the declared comparisons of {', '.join(code_span(f) for f in declared)} are judged in \"Declared "
                     f"comparisons\" on their declared seeds; the figures here, over every row, are not")
    if redeclared:
        parts.append(f"{', '.join(code_span(f) for f in redeclared)} {'was' if len(redeclared) == 1 else 'were'} "
                     f"redeclared (`sweep.py --redeclare`; when and what changed: \"Declared comparisons\")")
    parts += [f"in {code_span(f)}, {note}" for f in folders if (note := study_note(results_dir, f))]
    return f"_Exploratory: {'; '.join(parts)}._"


def study_note(results_dir: Path, sweep: str) -> str | None:
    """What a reader must know of a study that looked at its data before it had all its seeds (ADDED_AFTER_A_LOOK):
    which seeds of how many cells came after the look, counted from its rows; None for any other study."""
    seeds = ADDED_AFTER_A_LOOK.get(sweep)
    if seeds is None:
        return None
    frame = with_variant(read_trials(Path(results_dir) / sweep, ["train"]).frame)
    added = frame[frame["seed"].isin(seeds)] if not frame.empty else frame
    cells = len(added[["attention", "pe", "qk_norm", "redraw"]].drop_duplicates()) if not added.empty else 0
    return (f"seeds {' and '.join(str(s) for s in seeds)} were added to {cells} of its cells after the "
            f"{len(set(frame['seed']) - set(seeds)) if not frame.empty else 0}-seed result had been read (a second "
            f"look, with no sequential correction), and its Holm families (one per configuration and accuracy) were "
            f"defined after the data were seen")


# ---------------------------------------------------------------- the studies, read once
@dataclass
class Sources:
    """The committed results under results_dir, read and analysed once (each property on first use)."""

    results_dir: Path

    def folder(self, *names: str) -> Path:
        """A folder of the committed results the answers cite; one line naming it where it is missing."""
        path = self.results_dir.joinpath(*names)
        if not path.is_dir():
            raise AnswersError(f"{path} is missing; allowed: the committed results folder the answers cite")
        return path

    @cached_property
    def train(self) -> TrialRows:
        """The published studies' train rows (results/STUDIES), less the rotation study's: report.md's rows."""
        return read_trials(self.results_dir, ["train"]).without_rotation_study()

    @cached_property
    def assessed(self) -> dict[str, dict[Config, Assessment]]:
        return gap_closure.assess(self.seeds)

    @cached_property
    def seeds(self) -> pd.DataFrame:
        return gap_closure.per_seed(self.train.frame)

    @cached_property
    def first_look(self) -> dict[str, dict[Config, Assessment]]:
        """The same assessment without the seeds added after a look (ADDED_AFTER_A_LOOK): what was read first."""
        frame = self.train.frame
        added = np.zeros(len(frame), dtype=bool)
        for sweep, seeds in ADDED_AFTER_A_LOOK.items():
            added |= (column(frame, "sweep", "") == sweep).to_numpy() & frame["seed"].isin(seeds).to_numpy()
        return gap_closure.assess(gap_closure.per_seed(frame[~added].reset_index(drop=True)))

    @cached_property
    def both(self) -> TrialRows:
        return read_trials(self.results_dir, ["train", "bench"]).without_rotation_study()

    @cached_property
    def strings(self) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
        return string_study.study_tables(self.both.frame)

    @cached_property
    def bench_costs(self) -> pd.DataFrame:
        frame = self.both.frame
        return efficiency.bench_cost_table(frame[frame["task"] == "bench"])

    @cached_property
    def rotation(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        found = rotation.study(self.folder(ROTATION_STUDY), [self.folder(ROTATION_BENCH)])
        if found is None:
            raise AnswersError(f"{self.folder(ROTATION_STUDY)} holds no rotation rows; allowed: the rotation study")
        return found[1], found[2]

    @cached_property
    def scaling(self) -> pd.DataFrame:
        return token_scaling.per_image(token_scaling.scaling_rows(read_trials(self.folder(TOKEN_SCALING),
                                                                              ["bench"]).frame))

    def sweeps(self, dataset: str) -> list[str]:
        """The studies of the rows on `dataset`: their `sweep` values read back (raw_text), as folder names for
        paths and code spans, where md_text's escapes would be printed as they are."""
        frame = self.train.frame
        return sorted(set(frame.loc[frame["dataset"] == dataset, "sweep"].astype(str).map(raw_text)))


def find_config(assessed: dict[Config, Assessment], dataset: str, backend: str, qk_norm: str = "none",
                redrawn: bool = True) -> Config:
    """The one Performer configuration of these rows with this backend and qk_norm that redraws (or not)."""
    found = [c for c in assessed if c[:3] == (dataset, backend, qk_norm) and (c[3] != "off") == redrawn]
    if len(found) != 1:
        raise AnswersError(f"{dataset}, {backend}, qk_norm {qk_norm}, {'redrawn' if redrawn else 'redraw off'}: "
                           f"{len(found)} configurations in the results; allowed: exactly one")
    return found[0]


def configurations(assessed: dict[Config, Assessment], dataset: str) -> list[Config]:
    """A dataset's Performer configurations: qk_norm none first, redrawn before not, favor before relu."""
    return sorted((c for c in assessed if c[0] == dataset), key=lambda c: (c[2] != "none", c[3] == "off", c[1]))


def config_name(config: Config) -> str:
    _, backend, qk_norm, redraw = config
    return f"{backend}, qk_norm {qk_norm}, redraw {redraw}"


# ---------------------------------------------------------------- sentences of the gap-closure answers
EFFECT_WORDS = {"narrows (overshoots)": "narrows the gap (overshoots: G above 1 at its Holm level)",
                "narrows (G = 1 not excluded)":
                    "narrows the gap (G = 1, full closure, not excluded at its Holm level)",
                "narrows (not fully)": "narrows the gap (not fully: G below 1 at its Holm level)",
                "widens": "widens the gap (G interval at its Holm level below 0)", "raises": "raises {b}+ape",
                "lowers": "lowers {b}+ape"}


def gap_sentence(gap: Gap, backend: str, accuracy: str) -> str:
    """softmax+ape − b+ape on one accuracy, with its Holm verdict and whether G is defined."""
    if gap.judged is None:
        return f"softmax+ape − {backend}+ape on the {accuracy}: not measured ({gap.why})"
    if gap.state == "one seed":
        return f"softmax+ape − {backend}+ape on the {accuracy} is {gap.nominal.text(100)}: one seed, no interval"
    what = {"resolved": "excludes 0, a gap", "ahead": f"excludes 0, {backend}+ape ahead of softmax+ape",
            "not resolved": f"not resolved with {seeds_text(gap.judged.interval.n)}, so G is not defined"}[gap.state]
    return (f"softmax+ape − {backend}+ape on the {accuracy} is {gap.nominal.text(100)}; "
            f"{at_holm(gap.judged.interval, gap.judged.k)}: {what}")


def effect_words(effect: str, backend: str) -> str:
    """What an encoding does to b+ape, in words that claim only what its Holm interval shows."""
    for word, text in EFFECT_WORDS.items():
        if effect == word:
            return text.format(b=backend)
    if effect.startswith("not resolved"):
        return f"its effect on {backend}+ape is {effect}"
    return effect


def G_text(c: Closure, gap: Gap) -> str:
    """'G 1.46 [1.08, 2.55] (n=5,5,5), unbounded at its Holm level', or '' where G is not defined (the gap
    does not exclude 0 at its Holm level)."""
    if gap.state != "resolved" or not math.isfinite(c.G.point) or c.G_holm is None:
        return ""
    return f"G {c.G.text()}, {bounds(c.G_holm.interval, 1.0)} at its Holm level"


def encoding_sentence(pe: str, c: Closure, gap: Gap, backend: str) -> str:
    """One encoding on one accuracy: its effect with the gain (95 % and at its Holm level), G where the gap
    is resolved, and its same-encoding gap."""
    if c.G_holm is None:
        return f"{pe}: not measured"
    parts = [f"{pe}: {effect_words(c.effect, backend)}; gain {c.gain.text(100)}, {at_holm(c.gain_holm, c.G_holm.k)}"]
    if G_text(c, gap):
        parts.append(G_text(c, gap))
    if c.same_holm is not None:
        word = c.same_holm.word(f"softmax+{pe} ahead", f"{backend}+{pe} ahead")
        parts.append(f"same-encoding gap softmax+{pe} − {backend}+{pe} {claim(c.same_holm)}"
                     + (f" ({word})" if c.same_holm.resolved else ""))
    else:
        parts.append(f"no same-encoding gap ({c.same_ref.removeprefix('— ').strip('()')})")
    return "; ".join(parts)


def configuration_lines(sources: Sources, config: Config) -> list[str]:
    """Markdown bullets for one Performer configuration: the draw mean (judged) with every encoding, the
    first look where seeds were added after it, and the training draw's gap and resolved effects."""
    backend = config[1]
    draw, train = sources.assessed[DRAW_MEAN][config], sources.assessed[TRAIN_DRAW][config]
    lines = [f"- **{config_name(config)}** (baseline {draw.gap.baseline})",
             f"  - {gap_sentence(draw.gap, backend, 'draw mean')}."]
    first = sources.first_look[DRAW_MEAN].get(config)
    if first is not None and first.gap.judged is not None and draw.gap.judged is not None \
            and first.gap.judged.nominal.n != draw.gap.judged.nominal.n:
        lines.append(f"  - First look, before seeds were added: {gap_sentence(first.gap, backend, 'draw mean')}.")
    lines += [f"  - {encoding_sentence(pe, c, draw.gap, backend)}." for pe, c in draw.closures.items()]
    shown = [encoding_sentence(pe, c, train.gap, backend) for pe, c in train.closures.items()
             if c.G_holm is not None and c.G_holm.resolved]
    rest = len([c for c in train.closures.values() if c.G_holm is not None]) - len(shown)
    lines.append(f"  - Training draw: {gap_sentence(train.gap, backend, 'training draw')}."
                 + (" " + " ".join(f"{s}." for s in shown) if shown else "")
                 + (f" No other encoding's effect on {backend}+ape excludes 0 there ({rest} not resolved)."
                    if rest and shown else f" No encoding's effect on {backend}+ape excludes 0 there."
                    if rest else "")
                 + same_gaps_text(train, backend))
    return lines


def same_gaps_text(assessed: Assessment, backend: str) -> str:
    """The same-encoding gaps of one accuracy that `configuration_lines` shows no other way (those of encodings
    whose effect is not resolved), each judged in the configuration's Holm family: a resolved one with its
    figures, the rest by name; a reviewer found resolved training-draw gaps left unsaid."""
    unshown = [(pe, c) for pe, c in assessed.closures.items() if c.same_holm is not None
               and not (c.G_holm is not None and c.G_holm.resolved)]
    if not unshown:
        return ""
    resolved = [f"softmax+{pe} − {backend}+{pe} {claim(c.same_holm)} "
                f"({c.same_holm.word(f'softmax+{pe} ahead', f'{backend}+{pe} ahead')})"
                for pe, c in unshown if c.same_holm.resolved]
    rest = [pe for pe, c in unshown if not c.same_holm.resolved]
    parts = resolved + ([f"not resolved: {', '.join(rest)}"] if rest else [])
    return f" Same-encoding gaps there: {'; '.join(parts)}."


def accuracy_of(sources: Sources, dataset: str, attention: str, pe: str) -> np.ndarray:
    """Per-seed judged accuracy (draw mean for random-feature models) of one variant at qk_norm none: softmax
    without redraws, a random-feature backend at the study's redraw schedule (gap_closure.per_seed)."""
    s = sources.seeds
    rows = s[(s["dataset"] == dataset) & (s["attention"] == attention) & (s["pe"] == pe) & (s["qk_norm"] == "none")]
    rows = rows[(rows["redraw"] == "off") if attention == "softmax" else (rows["redraw"] != "off")]
    values = rows[DRAW_MEAN].to_numpy(float)
    values = values[np.isfinite(values)]
    if not len(values):
        raise AnswersError(f"{dataset} {attention}+{pe} (qk_norm none) has no accuracy in the results; allowed: a "
                           f"variant the studies ran")
    return values


def seeds_per_cell(sources: Sources, dataset: str) -> str:
    """'5 seeds in 12 cells, 3 seeds in 40 cells': how many seeds the dataset's cells (variants) hold."""
    s = sources.seeds[sources.seeds["dataset"] == dataset]
    counts = s.dropna(subset=[TRAIN_DRAW]).groupby(list(gap_closure.VARIANT)).size().value_counts().sort_index(
        ascending=False)
    return ", ".join(f"{n} seeds in {cells} cell{'s' if cells != 1 else ''}" for n, cells in counts.items())


def epochs_of(sources: Sources, dataset: str) -> str:
    frame = sources.train.frame
    epochs = sorted(set(pd.to_numeric(frame.loc[frame["dataset"] == dataset, "epochs"], errors="coerce").dropna()
                        .astype(int)))
    return " / ".join(map(str, epochs)) + " epochs"


# ---------------------------------------------------------------- which folders are published
GITIGNORE = ".gitignore"
REINCLUDED = re.compile(r"!/?(?P<name>[^/*?\[\]!#\\\s]+)/?")  # a `!/<folder>/` line of results/.gitignore


def published_folders(results_dir: Path) -> set[str] | None:
    """The folders directly under results_dir that the generated text may read (module docstring): the ones
    results_dir/.gitignore re-includes (`!/<folder>/`, the committed studies; its `/*/` ignores every other)
    and the ones results_dir/STUDIES lists. None where results_dir holds neither file: every folder is read."""
    results_dir = Path(results_dir)
    listed = listed_studies(results_dir)
    path = results_dir / GITIGNORE
    if not os.path.lexists(path):
        return None if listed is None else set(listed)
    if path.is_symlink() or not path.is_file():
        raise AnswersError(f"{path} is not a regular file; allowed: the committed results/.gitignore")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as err:
        raise AnswersError(f"{path} cannot be read ({' '.join(str(err).split())[:200]}); allowed: the committed "
                           f"results/.gitignore") from err
    found = {m["name"] for m in (REINCLUDED.fullmatch(line.strip()) for line in lines) if m}
    return found | set(listed or ())


def is_published(results_dir: Path, folder: Path) -> bool:
    """Whether a sweep folder under results_dir (any depth) lies in a published folder (published_folders)."""
    allowed = published_folders(results_dir)
    return allowed is None or Path(folder).relative_to(results_dir).parts[0] in allowed


# ---------------------------------------------------------------- sections
def confirmatory_studies(results_dir: Path, *, running: bool = False) -> list[Path]:
    """Every published sweep folder under results_dir (any depth) whose study declared its comparisons: the
    ones published as results, or with `running` those still running (results/in_progress/, rows so far, not
    results yet). A folder of one's own with a declaration.json is not read (published_folders)."""
    found = sorted(p.parent for p in Path(results_dir).rglob(DECLARATION_FILE)
                   if p.is_file() and not p.is_symlink() and (p.parent / TRIALS_FILE).exists())
    return [f for f in found if (f.relative_to(results_dir).parts[0] == IN_PROGRESS) == running
            and is_published(results_dir, f)]


def status_of(folder: Path) -> str:
    """'' for a study declared once before its first trial; else how it was redeclared, when and what
    changed (confirmatory.redeclared_text, inert Markdown)."""
    status = confirmatory.declared_status(folder)
    if status.startswith("refused: "):  # a hand-edited declaration.json: one line, not a table
        raise AnswersError(status.removeprefix("refused: "))
    return "" if status == "declared" else status


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


def validation_folders(results_dir: Path) -> list[Path]:
    """The published validation studies (a knob chosen on the validation split): folders named *_val_*."""
    return sorted(p.parent for p in Path(results_dir).glob(f"*_val_*/{TRIALS_FILE}")
                  if is_published(results_dir, p.parent))


def possessive(name: str) -> str:
    """"digits'", "mnist's": a dataset's name as owner."""
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def superseded_by(results_dir: Path, folder: Path) -> str | None:
    """The published study that chose `folder`'s knob again on its dataset (validation_choice.RECHOSEN), if any."""
    later = validation_choice.SUPERSEDED.get(folder.name)
    return later if later and is_published(results_dir, Path(results_dir) / later) else None


def current_validation_folders(results_dir: Path) -> list[Path]:
    """The validation studies whose choice is their dataset's default: the published ones not superseded."""
    return [f for f in validation_folders(results_dir) if superseded_by(results_dir, f) is None]


def validation_lines(folder: Path, short: bool = False) -> list[str]:
    """Per cell of a validation study: what validation chooses, and its margin over the earlier choice
    (paired by seed, Welch only where the two share no seeds; Holm over the cells:
    validation_choice.margins); `short`, the README's compact form."""
    frame = read_trials(folder, ["train"]).frame
    knob, records = validation_choice.choices(frame, validation_choice.failed_trials(folder), folder.name)
    judged = validation_choice.margins(records)
    label = lambda value: ", ".join(fmt(v) for v in value)  # noqa: E731
    lines = []
    for record in records:
        cell, chosen, earlier = validation_choice.cell_name(record), record["chosen"], record["earlier"]
        if chosen is None:
            lines.append(f"{cell}: no candidate has a validation accuracy")
            continue
        text = f"{cell}: {label(chosen)}" if short else \
            f"{cell}: validation chooses {' / '.join(knob)} = {label(chosen)}"
        lost = record["candidates"].get(earlier, {}) if earlier is not None else {}
        if earlier is not None and chosen != earlier and lost.get("failed") == lost.get("seeds"):
            text += (f" over {'' if short else 'the earlier '}{label(earlier)}, which failed in {lost['failed']} of "
                     f"{lost['seeds']} seeds: no margin")
        elif earlier is not None and chosen != earlier:
            j = judged[cell]
            text += (f" over {label(earlier)}, {j.nominal.text(100)}, Holm {bounds(j.interval)}: {verdict_text(j)}"
                     if short else f" over the earlier {label(earlier)} by {claim(j, unit=' validation points')}")
        elif chosen == earlier:
            text += ", the earlier choice"
        if record["edge"]:
            text += f"; the {record['edge']} value tried, so not bracketed"
        said = earlier if chosen != earlier and lost and lost.get("failed") == lost.get("seeds") else None
        failed = [f"{label(v)} failed in {c['failed']} of {c['seeds']} seeds" for v, c in
                  sorted(record["candidates"].items()) if c["failed"] and v != said]
        if failed and not short:
            text += f" ({'; '.join(failed)})"
        lines.append(text)
    joint = validation_choice.joint_choice(knob, records) if knob in validation_choice.JOINT else None
    if joint is not None:  # one setting for every variant alike: the dataset's default unless superseded
        # "the setting used" only where a published study (exploratory or declared; no validation study) ran it
        results_dir, datasets = folder.parent, {str(r["cell"][0]) for r in records}

        def same(v, c) -> bool:  # a knob value as stored against the chosen one (numbers: to rounding)
            try:
                return math.isclose(float(v), float(c))
            except (TypeError, ValueError):
                return str(v) == str(c)

        ran = any(all(same(v, c) for v, c in zip(value, joint["chosen"]))
                  for rows in published_knob_rows(results_dir, knob, datasets).values()
                  for value in with_defaults_for_unrecorded(rows, knob)[0][list(knob)].drop_duplicates()
                  .itertuples(index=False, name=None))
        later = superseded_by(results_dir, folder)
        dataset = possessive("/".join(sorted(datasets)))
        used = ("the setting used" if ran and not later else "a setting published studies ran, since superseded"
                if ran else f"{dataset} default, which no published study has run" if not later
                else "superseded before any published study ran it")
        lines.append(f"every variant alike ({used}): "
                     + validation_choice.joint_sentence(knob, joint, label).removeprefix("Validation chooses ").rstrip("."))
    return lines


def folder_dataset(folder: Path) -> str:
    """The dataset a validation study chose its knob on (its rows hold one)."""
    datasets = sorted(read_trials(folder, ["train"]).frame["dataset"].astype(str).unique())
    return datasets[0] if len(datasets) == 1 else "/".join(datasets)


def knob_of(folder: Path) -> tuple[str, ...]:
    return validation_choice.knob_of(read_trials(folder, ["train"]).frame)


def ran_with(sources: Sources, knob: tuple[str, ...], dataset: str) -> str:
    """Which value of a knob the published studies' rows on `dataset` ran with, the exploratory studies
    (results/STUDIES) and the declared ones apart, since the declared ones ran the validated settings:
    'the exploratory studies (`cifar10_cpu`) ran luo_scale 10; the declared studies (`cifar10_ladder_cpu`) 100'.
    Only among the rows the knob applies to (luo_scale: luo_rpe rows; the redraw schedule: rows that draw
    random features)."""
    parts = []
    for kind, rows in published_knob_rows(sources.results_dir, knob, {dataset}, sources.train.frame).items():
        studies = ", ".join(code_span(name) for name in sorted(set(rows["sweep"].astype(str).map(raw_text)))) \
            if "sweep" in rows.columns else ""
        parts.append(f"the {kind} studies{f' ({studies})' if studies else ''} ran {values_text(rows, knob)}")
    return "; ".join(parts) if parts else f"no published study ran {dataset} with it"


def published_knob_rows(results_dir: Path, knob: tuple[str, ...], datasets: Collection[str],
                        exploratory: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The published studies' rows on `datasets` that `knob` applies to (knob_rows), by kind, each kind only
    where it has such rows: "exploratory" (results/STUDIES less the rotation study: Sources.train, passed as
    `exploratory` when already read) and "declared" (confirmatory_studies), apart since the declared ones ran
    the validated settings. No validation study's own rows: they are the candidates, not a setting a study ran.
    The one reader of what published studies ran with a knob: ran_with says it, validation_lines checks "the
    setting used" against it, so the two cannot disagree."""
    if exploratory is None:
        exploratory = read_trials(results_dir, ["train"]).without_rotation_study().frame
    declared = confirmatory_studies(results_dir)
    skip = {p.parent.name for p in Path(results_dir).glob(f"*_val_*/{TRIALS_FILE}")}  # published or not
    found = {}
    for kind, frame in (("exploratory", exploratory),
                        ("declared", pd.concat([read_trials(f, ["train"]).frame for f in declared], ignore_index=True)
                         if declared else pd.DataFrame())):
        if frame.empty or "dataset" not in frame.columns:
            continue
        rows = knob_rows(frame[frame["dataset"].astype(str).isin(set(datasets))
                               & ~column(frame, "sweep", "").astype(str).map(raw_text).isin(skip)], knob)
        if not rows.empty:
            found[kind] = rows
    return found


def knob_rows(frame: pd.DataFrame, knob: tuple[str, ...]) -> pd.DataFrame:
    if knob == ("luo_scale",):
        return frame[frame["pe"].astype(str).str.contains("luo_rpe")]
    if knob == ("redraw_interval", "redraw_until"):
        rows = frame[has_random_features(frame)]
        return rows[pd.to_numeric(rows["redraw_interval"], errors="coerce") > 0]
    return frame


def values_text(rows: pd.DataFrame, knob: tuple[str, ...]) -> str:
    """'0.001, trunc_normal, 1 and 0.002, trunc_normal, 1', with a note on fields older rows did not record."""
    rows, unrecorded = with_defaults_for_unrecorded(rows, knob)
    values = rows[list(knob)].drop_duplicates().itertuples(index=False, name=None)
    text = " and ".join(", ".join(fmt(v) for v in value) for value in sorted(values, key=repr)) or "—"
    if unrecorded:
        first = recorded_values({})
        text += (f" ({', '.join(unrecorded)}: not recorded by rows written before the field existed; the code then "
                 f"had only what " + ", ".join(f"{name} {first[name]}" if name in first else f"{name}'s default"
                                               for name in unrecorded) + " does)")
    return text


def with_defaults_for_unrecorded(rows: pd.DataFrame, knob: tuple[str, ...]) -> tuple[pd.DataFrame, list[str]]:
    """Rows with each knob field they lack (a config field added after they were written: their code had
    only the behaviour the field's first default keeps, rpevit.config.recorded_values) filled with that
    value, and the names so filled."""
    defaults = recorded_values({f.name: f.default for f in fields(TrialConfig) if f.name not in FIRST_DEFAULTS})
    unrecorded = [name for name in knob if name not in rows.columns or rows[name].isna().any()]
    if not unrecorded:
        return rows, []
    rows = rows.copy()
    for name in unrecorded:
        rows[name] = rows[name].fillna(defaults[name]) if name in rows.columns else defaults[name]
    return rows, unrecorded


def validation_section(sources: Sources) -> list[str]:
    lines = ["## Settings chosen on validation (exploratory)", "",
             exploratory([f.name for f in validation_folders(sources.results_dir)], sources.results_dir), "",
             "The studies above ran settings chosen earlier on test. Each knob below was then chosen on the "
             "validation split (the draw mean for random-feature models); the chosen candidate is the one with the "
             "highest mean, and its margin over the earlier choice is judged by Holm over the cells. A study whose "
             "choice differs from the setting it ran answers at a setting validation does not choose.", ""]
    for folder in validation_folders(sources.results_dir):
        lines += [f"{code_span(folder.name)} ({code_span(f'results/{folder.name}/validation_choice.md')}):", ""]
        lines += [f"- {line}." for line in validation_lines(folder)]
        later = superseded_by(sources.results_dir, folder)
        if later:
            lines.append(f"- Superseded as {possessive(folder_dataset(folder))} choice by {code_span(later)}, which chose "
                         f"{' / '.join(knob_of(folder))} again at the settings it now runs with.")
        lines.append("")
    return lines


def scaling_facts(sources: Sources) -> dict[str, object]:
    """The token-scaling figures the answers quote: exponent ranges, crossovers, luo_rpe's two paths."""
    table = sources.scaling
    exps = token_scaling.exponents(table)
    time_exp, mem_exp = (f"{label} exponent" for label in (token_scaling.COSTS[0][1], token_scaling.COSTS[2][1]))
    thin = exps["sizes in the fit"] < MIN_FIT_SIZES  # a top-decade fit on 2 sizes: a slope, left out of spans
    softmax = exps["variant"].str.startswith("softmax")
    # O(N) by construction (token_scaling.linear_in_tokens: the backend's linear_time, no quadratic path such as
    # luo_rpe's dense one, which is quoted apart), not by a name
    linear_names = set(table.loc[table["linear_in_tokens"], "variant"]) if "linear_in_tokens" in table else set()
    is_linear = exps["variant"].isin(linear_names)
    in_spans = softmax | is_linear
    linear, soft = exps[is_linear & ~thin], exps[softmax & ~thin]

    def span(frame: pd.DataFrame, name: str) -> str:
        if frame.empty:
            return f"(none fitted on {MIN_FIT_SIZES} or more sizes)"
        return f"{fmt(frame[name].min(), 3)}–{fmt(frame[name].max(), 3)}"

    left_out = [f"{v} ({int(n)} sizes, {top}: {fmt(e, 3)})" for v, n, top, e in
                exps.loc[in_spans & thin, ["variant", "sizes in the fit", "top decade", time_exp]]
                .itertuples(index=False)]
    return {"linear time": span(linear, time_exp), "linear memory": span(linear, mem_exp),
            "softmax time": span(soft, time_exp), "softmax memory": span(soft, mem_exp),
            "thin fits": left_out,
            "crossovers": token_scaling.crossovers(table, exps), "paths": token_scaling.luo_path_table(table)}


MIN_FIT_SIZES = 3  # an exponent quoted in a span is fitted on at least this many sizes of its top decade


def thin_fits_text(facts: dict[str, object]) -> str:
    """' (left out: fitted on fewer than 3 sizes, relu+luo_rpe (fft) (2 sizes, 2304..4096: 0.924))' or ''."""
    thin = facts["thin fits"]
    return (f" (left out, fitted on fewer than {MIN_FIT_SIZES} sizes of their top decade: {', '.join(thin)})"
            if thin else "")


def not_overtaking_text(cross: pd.DataFrame) -> str:
    """'slower than softmax+luo_rpe at every measured N (favor+luo_rpe (dense) 1.4, ... times its step at
    N = 4,096)' (the linear variants that stay slower than their softmax
    counterpart at every measured N, per counterpart), or ''."""
    slower = cross[cross["how"] == "not reached"]
    if slower.empty:
        return ""
    groups = []
    for (against, largest), g in slower.groupby(["against", "largest N"]):
        items = ", ".join(f"{v} {fmt(r, 3)}" for v, r in zip(g["variant"], g["ratio at largest N"]))
        oom = sorted({n for cell in column(g, "counterpart out of memory at N", "—") if cell != "—"
                      for n in str(cell).split(", ")}, key=int)
        beyond = f"; {against} did not fit in memory at N = {', '.join(oom)}" if oom else ""
        groups.append(f"still slower than {against} at the largest N where both ran ({items} times its step at "
                      f"N = {int(largest):,}{beyond})")
    return "; ".join(groups)


def luo_path_text(kind: str, entry: dict) -> str:
    n, dense, fft = entry["measured_tokens"], entry["dense_ms_per_image"], entry["fft_ms_per_image"]
    where = (f"the FFT path is faster from N = {entry['fft_from_tokens']}" if entry["fft_from_tokens"] is not None
             else f"the dense path is faster at every measured N (N = {n[-1]}: {fmt(dense[-1] / 1e3, 3)} s against "
                  f"{fmt(fft[-1] / 1e3, 3)} s per image)")
    return f"luo_rpe on a kernelized backend ({kind}): {where}"


def scaling_summary(sources: Sources) -> str:
    """The README's one-line form of the token-scaling answer."""
    facts = scaling_facts(sources)
    cross = facts["crossovers"]
    measured = cross[cross["how"] == "measured"]
    return (f"over the top decade of N the O(N) variants' training step grows as N^{facts['linear time']}, softmax's "
            f"as N^{facts['softmax time']}{thin_fits_text(facts)}; the linear variants overtake softmax from "
            f"N = {measured['overtakes from N'].min():,.0f}–{measured['overtakes from N'].max():,.0f} tokens"
            + (f", except these, {slower}" if (slower := not_overtaking_text(cross)) else "") + "; "
            + "; ".join(luo_path_text(k, e) for k, e in facts["paths"].items()) + ".")


def bench_protocol(folder: Path) -> str:
    """How a bench study timed, from its rows: 'the machine its rows name (cpu:x86_64 x2 threads; 2 torch
    threads), medians of 3 interleaved repeats'."""
    frame = read_trials(folder, ["bench"]).frame

    def one(name: str) -> str:
        values = sorted({setting_text(v) for v in frame[name].dropna()}) if name in frame else []
        return "/".join(values) or "?"

    interleaved = "interleaved " if "timing_interleaved" in frame and frame["timing_interleaved"].all() else ""
    return (f"the machine its rows name ({one('device_name')}; {one('torch_threads')} torch threads), medians of "
            f"{one('timing_repeats')} {interleaved}repeats")


def timing_text(frame: pd.DataFrame) -> str:
    """Whether the rows' trials overlapped one another (efficiency.overlapped, from their start/end times and
    hosts), in efficiency's words: CONTENDED, ONE_AT_A_TIME or UNKNOWN_TIMES where a row lacks the times."""
    overlapped = efficiency.overlapped(frame)
    if frame.empty or overlapped.isna().any():
        return efficiency.UNKNOWN_TIMES
    return efficiency.CONTENDED if overlapped.astype(bool).any() else efficiency.ONE_AT_A_TIME


def cost_section(sources: Sources) -> list[str]:
    """Where the efficient variants pay: token scaling (exponents, crossovers, luo_rpe's two paths) and each
    study's cost ratios, timed alone."""
    facts = scaling_facts(sources)
    lines = ["## Cost: where the efficient variants pay (measurements)", "",
             f"From `results/{TOKEN_SCALING}/` (bench trials each alone on {bench_protocol(sources.results_dir / TOKEN_SCALING)}, "
             f"per image; `results/{TOKEN_SCALING}/token_scaling.md` has every table). Measurements, not "
             "comparisons: nothing here is tested.", "",
             f"- Over each variant's top decade of N, the O(N) variants' training-step exponents span "
             f"{facts['linear time']} and their step-memory exponents {facts['linear memory']}; softmax's "
             f"training-step exponents span {facts['softmax time']} and its step-memory exponents "
             f"{facts['softmax memory']}{thin_fits_text(facts)}."]
    cross = facts["crossovers"]
    for against, g in cross[cross["how"] == "measured"].groupby("against"):
        lines.append(f"- Against {against}, the linear variants overtake from N = "
                     + ", ".join(f"{n:,.0f} ({v})" for v, n in zip(g["variant"], g["overtakes from N"])) + ".")
    if slower := not_overtaking_text(cross):
        lines.append(f"- Not overtaking within the measured N: {slower}.")
    lines += [f"- {luo_path_text(k, e)}; `luo_path: auto` reads this (`rpevit/pe/luo_crossover.json`)."
              for k, e in facts["paths"].items()]
    lines.append("")
    costs = sources.bench_costs
    for (sweep, dataset), g in costs.groupby(["sweep", "dataset"]):
        g = g[(g["qk_norm"] == "none")]
        soft_ape = g[(g["attention"] == "softmax") & (g["pe"] == "ape")]
        g = g[g["pe"].isin(("ape", "luo_rpe", "rope", "circulant_string"))
              & g["attention"].isin(("softmax", "favor", "relu"))]
        rows = [[f"{a}+{p}", redraw, fmt(r, 3)] for a, p, redraw, r in
                zip(g["attention"], g["pe"], g["redraw"], g["train x softmax+ape"])]
        if len(soft_ape) == 1 and rows:
            lines += [f"Training step relative to softmax+ape at the {DATASET_NAMES.get(dataset, dataset)} study's "
                      f"model ({code_span(f'results/{raw_text(sweep)}/')}, each bench trial alone, N = "
                      f"{fmt(soft_ape['N'].iloc[0])} tokens, "
                      f"batch {fmt(soft_ape['batch'].iloc[0])}; {efficiency.time_devices(g)}):", "",
                      markdown_table(["variant", "redraw", "train step x softmax+ape"], rows), ""]
    if any(line.startswith("Training step relative to softmax+ape") for line in lines):
        lines += [REDRAW_NOT_TIMED, ""]
    return lines


# A bench trial (rpevit/tasks/bench.py) times forward and backward steps and never redraws (redraws are the training
# loop's, rpevit/tasks/train.py): a review read the tables' redraw column as a measured cost.
REDRAW_NOT_TIMED = ("`redraw`: the schedule the variant trains with, not a timed cost: a bench trial "
                    "(`rpevit/tasks/bench.py`) times its steps without advancing the redraw schedule (the training "
                    "loop's `advance_random_features` draws new features), so a redraw's cost (a new feature matrix "
                    "per layer every `redraw_interval` steps) is in none of these ratios, and rows that differ only "
                    "in `redraw` ran the same computation.")


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


def setting_text(value: object) -> str:
    """A setting as a reader writes it: 54000 whether a row stored it as an int or a float, 0.002, cosine
    (text from a row made inert Markdown: md_text)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return str(int(value)) if float(value).is_integer() else fmt(float(value))
    return md_text(value)


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


# ---------------------------------------------------------------- provenance and tables for results/README.md
IN_PROGRESS = "in_progress"  # results/in_progress/<study>/: rows of studies still running, not yet published


def folder_rows(results_dir: Path) -> list[dict]:
    """Per published sweep folder under results_dir (and one level below): its current rows' ok / failed counts,
    rows set aside, seeds, thread-hours in the trials and the commits the rows record. Studies still running
    (results/in_progress/) are left out: their rows change at every stop and are not published; so is every
    folder of one's own (published_folders: results/smoke/ of README command 1)."""
    out = []
    for path in sorted(results_dir.glob(f"*/{TRIALS_FILE}")) + sorted(results_dir.glob(f"*/*/{TRIALS_FILE}")):
        if path.relative_to(results_dir).parts[0] == IN_PROGRESS or not is_published(results_dir, path.parent):
            continue
        frame = read_sweep(path, path.parent)
        if frame is None or frame.empty:
            continue
        current, aside = current_rows(frame, path.parent)
        counts = current["status"].value_counts()
        out.append({"folder": path.parent.relative_to(results_dir).as_posix(),
                    "tasks": ", ".join(sorted(current["task"].dropna().astype(str).unique())),
                    OK: int(counts.get(OK, 0)), FAILED: int(counts.get(FAILED, 0)), "aside": aside,
                    "seeds": sorted(set(pd.to_numeric(current["seed"], errors="coerce").dropna().astype(int))),
                    "thread_hours": thread_hours(current, read_epoch_times(path.parent)),
                    "span": time_span(current), "running_hours": hours_running(current),
                    "resumed": int((pd.to_numeric(column(current, "resumed_from_epoch", 0), errors="coerce")
                                    > 0).sum()),
                    "commits": column(current, "git_commit", "").fillna("").astype(str).str[:7].value_counts()})
    return out


def declared_studies_block(sources: Sources) -> str:
    """results/README.md: which studies declared their comparisons before they ran (confirmatory) and
    which did not (exploratory), from the declaration.json files, so the sentence cannot go stale."""
    def names(folders: list[Path]) -> str:
        return ", ".join(code_span(f.relative_to(sources.results_dir).as_posix()) for f in folders)

    def redeclared(folders: list[Path]) -> str:
        return "; ".join(f"{names([f])} ({status_of(f)})" for f in folders)
    published = confirmatory_studies(sources.results_dir)
    running = confirmatory_studies(sources.results_dir, running=True)
    once = [f for f in published if not status_of(f)]
    again = [f for f in published if status_of(f)]
    text = ("Declared its comparisons before it ran, so confirmatory over exactly those (its `confirmatory.md`, "
            f"written by `python analysis/confirmatory.py results/<folder>`): {names(once)}." if once else "")
    if again:
        text += (f"{' ' if text else ''}Declared, then redeclared, so confirmatory only over the rows that started after "
                 f"its last declaration (every earlier row is exploratory; its `confirmatory.md` says what changed): "
                 f"{redeclared(again)}.")
    text += (" Every other study here declared none (`rpevit/sweep/declaration.py`), so every claim from it is "
             "exploratory." if published else "None of the studies here declared its comparisons before it ran "
             "(`rpevit/sweep/declaration.py`), so every claim from them is exploratory.")
    if running:
        first = [f for f in running if not status_of(f)]
        later = [f for f in running if status_of(f)]
        if first:
            text += (f" Running, declared before its first trial (rows so far, judged once complete and published): "
                     f"{names(first)}.")
        if later:
            text += f" Running, redeclared (rows so far, judged once complete and published): {redeclared(later)}."
    unfinished = [c for c in (continuation.continuation(f, sources.results_dir) for f in published) if c is not None]
    return "\n\n".join([text, *map(continuation.continuation_text, unfinished)])


def rows_block(sources: Sources) -> str:
    """results/README.md: the rows of every study folder, as the Parquet records them (folder_rows)."""
    seeds = lambda s: f"{s[0]}–{s[-1]}" if len(s) > 1 else str(s[0]) if s else "—"  # noqa: E731
    table = [[code_span(r["folder"]), r["tasks"], r[OK], r[FAILED], r["aside"], seeds(r["seeds"]),
              r["span"], fmt(r["running_hours"], 3), fmt(r["thread_hours"], 3), r["resumed"],
              ", ".join(f"{c or '—'} ({n})" for c, n in r["commits"].items())]
             for r in folder_rows(sources.results_dir)]
    return markdown_table(["folder", "task", OK, FAILED, "set aside (not in space.json)", "seeds",
                           "first start → last finish (UTC)", "hours with a trial running", "thread-hours in trials",
                           "resumed after a stop", "commit (rows)"], table)


PROVENANCE_ROW = re.compile(r"^\| `(?P<folder>[^`|]+?)/?` \|(?P<rest>.*)$", re.M)
COUNT = re.compile(r"\b(\d[\d,]*) (ok|failed)\b")


def provenance_mismatches(results_dir: Path) -> list[str]:
    """Every "N ok" / "N failed" in the provenance table of results/README.md (a row per folder) that is not the
    count of that folder, or of one sweep folder under it, in the Parquet: typed counts checked, not trusted."""
    path = Path(results_dir) / "README.md"
    rows = folder_rows(Path(results_dir))
    messages = []
    for match in PROVENANCE_ROW.finditer(path.read_text(encoding="utf-8")):
        folder = match["folder"].rstrip("/")
        found = [r for r in rows if r["folder"] == folder or r["folder"].startswith(folder + "/")]
        for number, word in COUNT.findall(match["rest"]):
            allowed = sorted({r[OK if word == "ok" else FAILED] for r in found})
            if int(number.replace(",", "")) not in allowed:
                messages.append(f"{path}: the row of `{folder}/` says '{number} {word}', but its Parquet holds "
                                f"{' or '.join(map(str, allowed)) or 'no rows'} {word}; allowed: the counts in the "
                                f"generated 'study-rows' table")
    return messages


def pilots_block(sources: Sources) -> str:
    """The CIFAR-10 CPU-protocol pilots: one summary row (the CLI's JSON) per run, the one-seed gap they show,
    and the stopped 10-epoch start's rows."""
    runs = {}
    for path in sorted(sources.folder(PILOTS).glob("cifar10_cpu_*ep_seed0_*.json")):
        row = json.loads(read_text_file(path, PILOT_ALLOWED) or "null")
        if not isinstance(row, dict) or not isinstance(row.get("epochs"), int):
            raise AnswersError(f"{path} is not a summary row with an integer 'epochs'; allowed: the JSON the CLI "
                               f"prints")
        runs[(row["epochs"], md_text(f"{row.get('attention')}+{row.get('pe')}"))] = row  # read from a file

    def value(row: dict, name: str, scale: float = 100.0) -> float:
        x = row.get(name)
        return scale * x if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan

    rows = [[epochs, variant, fmt(value(r, "train_s_per_epoch", 1.0), 3), fmt(value(r, "test_acc")),
             f"{fmt(value(r, 'test_acc_draw_mean'))} [{fmt(value(r, 'test_acc_draw_min'))}]",
             fmt(value(r, "test_acc_draw_ensemble")), fmt(value(r, "test_acc_softmax_swap")),
             fmt(value(r, "attn_tv_to_softmax", 1.0), 3)]
            for (epochs, variant), r in sorted(runs.items(), key=lambda kv: (-kv[0][0], kv[0][1] != "softmax+ape"))]
    gaps = []
    for epochs in sorted({e for e, _ in runs}, reverse=True):
        soft, favor = runs.get((epochs, "softmax+ape")), runs.get((epochs, "favor+ape"))
        if soft and favor:
            gaps.append(f"{fmt(value(soft, 'test_acc') - value(favor, 'test_acc'), 3)} points on the training draw "
                        f"and {fmt(value(soft, 'test_acc') - value(favor, 'test_acc_draw_mean'), 3)} on the draw mean "
                        f"at {epochs} epochs")
    start = read_trials(sources.folder(PILOTS, "cifar10_cpu_10ep_start"), ["train"]).frame
    ordered = start.sort_values(["pe", "seed"])[["attention", "pe", "seed", "test_acc"]]
    started = "; ".join(f"{a}+{p} seed {s}: {fmt(100 * acc)}" for a, p, s, acc in ordered.itertuples(index=False))
    recorded = pd.DataFrame(list(runs.values()))
    names = pd.DataFrame({"device_name": [md_text(r["device_name"]) for r in runs.values()  # read from a file
                                          if isinstance(r.get("device_name"), str)]})
    timing = timing_text(recorded)
    lead = (f"Rows: {devices_text(names)}; times: " + ("possibly contended: the summary rows record no start/end "
            "times (the text above says which pilot shared the cores)." if timing == efficiency.UNKNOWN_TIMES
            else f"{timing}."))
    return "\n".join([lead, "", markdown_table(["epochs", "variant", "train s/epoch", "test acc % (training draw)",
                                      "draw mean % over fresh draws [min]", "draw ensemble %", "softmax swap %",
                                      "attention TV to softmax"], rows), "",
                      f"_Exploratory, one seed, no interval:_ softmax+ape − favor+ape is {'; '.join(gaps)}. The "
                      f"stopped 10-epoch start (`pilots/cifar10_cpu_10ep_start/`, not part of any result), test acc %: "
                      f"{started}."])


def step_times_block(sources: Sources) -> str:
    """The CIFAR-10 CPU protocol's training step per variant family, from its bench sweep (each trial alone):
    what the protocol's epoch count was planned from."""
    costs = sources.bench_costs
    g = costs[costs["sweep"] == "bench_cifar10_cpu"]
    if g.empty:
        raise AnswersError("results/bench_cifar10_cpu has no bench rows; allowed: the committed bench sweep")
    ms = lambda rows: (f"{fmt(rows['train_step_ms'].min(), 3)}" if len(rows) == 1 else  # noqa: E731
                       f"{fmt(rows['train_step_ms'].min(), 3)}–{fmt(rows['train_step_ms'].max(), 3)}")
    parts = [f"{ms(g[(g['attention'] == 'softmax') & (g['pe'] == 'ape') & (g['qk_norm'] == 'none')])} ms for "
             "softmax+ape",
             *(f"{ms(g[g['attention'] == a])} ms for {a}" for a in ("favor", "relu")),
             f"{ms(g[(g['attention'] == 'softmax') & (g['pe'] == 'rotinv')])} ms for softmax+rotinv"]
    return (f"The bench rows of its variants (`bench_cifar10_cpu/`, each alone; "
            f"{efficiency.time_devices(g)}) put a training step at "
            f"{', '.join(parts)}.")


def gpu_times_block(sources: Sources) -> str:
    """The packed 4-epoch GPU sweep: mean train s/epoch and images/s per variant (contended by design)."""
    frame = read_trials(sources.folder(GPU_FOLDER, GPU_SWEEP), ["train"]).frame
    frame = with_variant(frame)
    cells = frame.groupby(["attention", "pe"])[["train_s_per_epoch", "images_per_s"]].mean()
    pes = [p for p in ("ape", "luo_rpe", "circulant_string", "rope") if p in set(frame["pe"])]
    rows = [[attention, *(f"{fmt(cells.loc[(attention, pe), 'train_s_per_epoch'], 3)} s, "
                          f"{cells.loc[(attention, pe), 'images_per_s']:,.0f}/s" if (attention, pe) in cells.index
                          else "—" for pe in pes)] for attention in ("softmax", "favor", "relu")]
    lead = f"Rows: {devices_text(frame)}; times: {timing_text(frame)}."
    return "\n".join([lead, "", markdown_table(["attention", *pes], rows)])


def most_at_once(start: np.ndarray, end: np.ndarray) -> int:
    """The largest number of intervals [start, end) that hold one instant: at some interval's start, the
    intervals begun by then less those ended by then (efficiency.overlaps counts, per interval, every interval
    it meets at any time, which over-counts trials that ran one after another beside a long one)."""
    if len(start) == 0:
        return 0
    begun = np.searchsorted(np.sort(start), start, side="right")
    ended = np.searchsorted(np.sort(end), start, side="right")
    return int((begun - ended).max())


def sweep_run_text(folder: Path) -> str:
    """How a train sweep ran, from its rows alone: its ok rows against the trials its space.json lists, how many
    ran at once at most (their start and finish times), the training images (n_train x epochs_done per row)
    from the first start to the last finish and that rate, evaluation and start-up between trials included, its
    epochs and warm-up, and the model's parameter count. The figures the GPU sweep's paragraph quotes."""
    frame = read_trials(folder, ["train"]).frame
    listed = space_keys(folder)
    start = unix_seconds(frame["started_at"]).to_numpy()
    end = unix_seconds(frame["finished_at"]).to_numpy()
    wall = float(end.max() - start.min())
    images = float((frame["n_train"].astype(float) * frame["epochs_done"].astype(float)).sum())
    resumed = int((pd.to_numeric(column(frame, "resumed_from_epoch", 0), errors="coerce").fillna(0) > 0).sum())
    params = sorted(float(p) for p in frame["params"].unique())
    params_text = (f"{params[0] / 1e6:.2f} M" if params[0] == params[-1] else
                   f"{params[0] / 1e6:.2f}–{params[-1] / 1e6:.2f} M")
    warmup = sorted({float(w) for w in frame["warmup_epochs"]})
    epochs = sorted({int(e) for e in frame["epochs"]})
    warmup_text = "/".join(f"{fmt(w)} epoch ({fmt(100 * w / epochs[-1], 2)} %)" for w in warmup) if len(epochs) == 1 \
        else "/".join(fmt(w) for w in warmup) + " epoch"
    listed_text = f"of the {len(listed)} trials its space.json lists" if listed is not None else "(no space.json)"
    return (f"{len(frame)} ok rows {listed_text}, at most {most_at_once(start, end)} running at "
            f"once (their start and finish times), {resumed} resumed from a checkpoint. From the first trial's start "
            f"to the last one's finish, {images / 1e6:.3g} M training images (training-set size x epochs, summed over "
            f"the rows) went through in {wall:.0f} s: **{images / wall:,.0f} training images/s** for the whole sweep, "
            f"evaluation and the gaps between trials included. {'/'.join(map(str, epochs))} epochs, warm-up "
            f"{warmup_text}; {params_text} parameters; {devices_text(frame)}.")


def gpu_sweep_block(sources: Sources) -> str:
    """The packed 4-epoch GPU sweep as it ran (sweep_run_text of its rows)."""
    return sweep_run_text(sources.folder(GPU_FOLDER, GPU_SWEEP))


def epochs_of_space(folder: Path, root: Path) -> str:
    """'4 of the space's 200 epochs': the epochs a sweep's rows ran against those its space file (space.json's
    `source`, checked by continuation.space_name_and_source, read from the repository `root`) gives the trials of
    the rows' datasets; the rows' epochs alone where the space file is not there."""
    frame = read_trials(folder, ["train"]).frame
    ran = "/".join(str(e) for e in sorted({int(e) for e in frame["epochs"]}))
    try:
        _, source = continuation.space_name_and_source(folder)
        datasets = sorted(set(frame["dataset"].astype(str)))
        space = load_space(root / source, only={"dataset": datasets[0]} if len(datasets) == 1 else None)
    except (ConfigError, OSError) as err:
        return f"{ran} epochs (the space's own budget unknown: {md_text(' '.join(str(err).split())[:120])})"
    planned = "/".join(str(e) for e in sorted({int(t["epochs"]) for t in space.trials}))
    return f"{ran} of the space's {planned} epochs"


def gpu_answers_block(sources: Sources) -> str:
    """The short GPU rows' gap answers (exploratory; a few of the recipe's epochs: not an answer)."""
    gpu = Sources(sources.results_dir / GPU_FOLDER)
    budget = epochs_of_space(gpu.results_dir / GPU_SWEEP, sources.results_dir.resolve().parent)
    lines = [exploratory([GPU_SWEEP], gpu.results_dir) + f" _{budget}: early-training figures, not an answer._", "",
             f"softmax+ape scores {percent(accuracy_of(gpu, 'cifar10', 'softmax', 'ape'))} %."]
    for config in configurations(gpu.assessed[DRAW_MEAN], "cifar10"):
        lines += configuration_lines(gpu, config)
    return "\n".join(lines)


def gpu_bench_block(sources: Sources) -> str:
    """Each CIFAR-10 GPU-protocol variant alone on the H100: median training step (with the min and max of its
    repeats), ratios to softmax+ape and rope, inference, memory and FLOPs (efficiency.bench_cost_table)."""
    bench = read_trials(sources.folder(GPU_FOLDER, GPU_BENCH), ["bench"]).frame
    table = efficiency.bench_cost_table(bench)
    spread = with_variant(efficiency.cost_bench_rows(bench)).groupby(list(gap_closure.VARIANT)).agg(
        lo=("train_step_ms_min", "min"), hi=("train_step_ms_max", "max"))
    rows = [[f"{r['attention']}+{r['pe']}",
             f"{fmt(r['train_step_ms'], 3)} ({fmt(spread.loc[key, 'lo'], 3)}–{fmt(spread.loc[key, 'hi'], 3)})",
             fmt(r["train x softmax+ape"], 3), fmt(r["train x rope"], 3), fmt(r["infer_ms_per_sample"], 2),
             fmt(r["peak_mem_mb"], 4), fmt(r["flops"], 3)]
            for _, r in table.iterrows() for key in [tuple(r[c] for c in gap_closure.VARIANT)]]
    ratio = (spread["hi"] / spread["lo"]).sort_values()
    widest = ratio.index[-1]
    lead = (f"Each bench trial alone; {efficiency.time_devices(table)}. A variant's repeats span (max / min) "
            f"{fmt(ratio.iloc[0], 3)} to {fmt(ratio.iloc[-1], 3)} ({widest[VARIANT.index('attention')]}+{widest[VARIANT.index('pe')]}), median "
            f"{fmt(float(ratio.median()), 3)}: a ratio between two variants within that is not told apart.")
    return lead + "\n\n" + markdown_table(["variant", "train step ms, median (min–max of the repeats)",
                                          "x softmax+ape", "x rope",
                           "inference ms/image", "peak MiB", "multiply-adds/image (fvcore, forward)"], rows)


def gpu_packing_block(sources: Sources) -> str:
    """4-per-GPU against 1-per-GPU (benchmarks/gpu_packing.py JSON files)."""
    rows, devices = [], set()
    for path in sorted(sources.folder(GPU_FOLDER, GPU_PACKING).glob("*.json")):
        run = json.loads(read_text_file(path, PACKING_ALLOWED) or "null")
        devices.add(md_text(run.get("device")) if isinstance(run, dict) else "none")  # read from a file
        try:
            single, packed = run["single"], run["packed"]
            rows.append([md_text(path.stem), ", ".join(fmt(float(s), 4) for s in single["train_s_per_epoch"]),
                         f"{single['train_images_per_s']:,.0f}", fmt(float(max(single["peak_mem_mb"])), 4),
                         ", ".join(fmt(float(s), 4) for s in packed["train_s_per_epoch"]),
                         f"{packed['train_images_per_s']:,.0f}", fmt(float(run["ratio_train_phase"]), 3),
                         fmt(float(run["ratio_end_to_end"]), 3)])
        except (KeyError, TypeError, ValueError) as err:
            raise AnswersError(f"{path} is not a benchmarks/gpu_packing.py result ({type(err).__name__}: {err}); "
                               f"allowed: the JSON it writes") from err
    lead = (f"Device as these files record it: {', '.join(sorted(devices)) or 'none'} (the GPU model is not "
            "recorded in them); 1-per-GPU: one trial on the GPU, 4-per-GPU: four at once (contended by design); what "
            "else ran on the machine is not recorded in them.")
    return lead + "\n\n" + markdown_table(["run", "1-per-GPU s/epoch", "1-per-GPU images/s", "peak MiB",
                           "4-per-GPU s/epoch, each trial", "4-per-GPU aggregate images/s", "ratio, train phase",
                           "ratio, end to end"], rows)


def mnist_redraw_table(sources: Sources) -> str:
    """docs/random_features.md: per random-feature variant of the converged MNIST study (qk_norm none), its
    training-draw and draw-mean accuracy, softmax swap and attention TV, redraw off against redrawn."""
    s = sources.seeds
    rows = []
    for (attention, pe, redraw), g in s[(s["dataset"] == "mnist") & s["attention"].isin(["favor", "relu"])
                                        & (s["qk_norm"] == "none")
                                        & s["pe"].isin(["ape", "luo_rpe", "rope", "circulant_string"])].groupby(
            ["attention", "pe", "redraw"]):
        rows.append([f"{attention}+{pe}", redraw, percent(g[TRAIN_DRAW]), percent(g[DRAW_MEAN]),
                     percent(g["test_acc_softmax_swap"]), mean_interval(g[gap_closure.FIDELITY]).text(digits=3)])
    rows.sort(key=lambda r: (r[1] != "off", r[0]))
    return markdown_table(["variant", "redraw", "training draw %", "draw mean %", "softmax swap %",
                           "TV to softmax"], rows)


def recipe_table(sources: Sources) -> str:
    """docs/usage.md: each dataset's recipe, what a config that leaves a field alone runs (rpevit.data,
    rpevit.pe.relative_bias), and per knob chosen on validation the published study that chose it."""
    from rpevit.data import DATASET_SPECS

    chosen_by = {}
    for folder in current_validation_folders(sources.results_dir):
        found = validation_choice.chosen_for_every_variant(folder)
        if found is not None:
            chosen_by[found[:2]] = folder.name
    rows = []
    for name, spec in DATASET_SPECS.items():
        cfg = TrialConfig.from_dict({"dataset": name, "pe": "luo_rpe"}).resolved()
        studies = [chosen_by.get((name, knob)) for knob in validation_choice.JOINT]
        rows.append([name, f"{spec.image_size} / {cfg.resolved_patch_size} ({cfg.grid[0] * cfg.grid[1]})",
                     str(cfg.batch_size), fmt(cfg.lr), fmt(cfg.warmup_epochs), cfg.init, fmt(cfg.grad_clip),
                     f"every {cfg.redraw_interval} until {fmt(cfg.redraw_until)}", fmt(cfg.luo_scale),
                     ", ".join(code_span(s) for s in studies if s) or "none"] +
                    [", ".join("/".join(knob) for knob, s in zip(validation_choice.JOINT, studies) if not s) or "—"])
    return markdown_table(["dataset", "image / patch (tokens)", "batch", "lr", "warm-up epochs", "init", "grad_clip",
                           "redraw", "luo_scale", "chosen on validation by", "not chosen on this dataset's validation"],
                          rows)


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
