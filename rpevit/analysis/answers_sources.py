"""The committed results the answers read (rpevit.analysis.answers): which study folders are published (what
results/.gitignore re-includes and what results/STUDIES lists; the rule is rpevit.analysis.answers' module
docstring's), which published or running studies declared their comparisons and how (declared once, or
redeclared), and `Sources`, the published studies read and analysed once. `AnswersError` is the one-line refusal
every part of the answers raises where a figure they cite is missing."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis import confirmatory, efficiency, gap_closure, rotation, string_study, token_scaling
from rpevit.analysis.common import TrialRows, column, listed_studies, raw_text, read_trials
from rpevit.analysis.gap_closure import Assessment, Config
from rpevit.sweep.declaration import DECLARATION_FILE
from rpevit.sweep.results import TRIALS_FILE


# What happened to a study after its rows were first read, which its rows cannot show: seeds added after a look.
ADDED_AFTER_A_LOOK = {"mnist_converged_cpu": (3, 4)}

ROTATION_STUDY, ROTATION_BENCH = "rotation_mnist_cpu", "bench_rotation_mnist_cpu"
TOKEN_SCALING = "token_scaling_cpu"
IN_PROGRESS = "in_progress"  # results/in_progress/<study>/: rows of studies still running, not yet published


class AnswersError(ValueError):
    """A figure the answers cite is missing from the committed results (one line naming it)."""


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


# ---------------------------------------------------------------- which folders are published
GITIGNORE = ".gitignore"
REINCLUDED = re.compile(r"!/?(?P<name>[^/*?\[\]!#\\\s]+)/?")  # a `!/<folder>/` line of results/.gitignore


def published_folders(results_dir: Path) -> set[str] | None:
    """The folders directly under results_dir that the generated text may read (rpevit.analysis.answers' module
    docstring): the ones results_dir/.gitignore re-includes (`!/<folder>/`, the committed studies; its `/*/` ignores
    every other) and the ones results_dir/STUDIES lists. None where results_dir holds neither file: every folder is
    read."""
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


# ---------------------------------------------------------------- declared studies
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
