"""The answers' text on the settings chosen on validation (rpevit.analysis.answers): the published validation
studies (`*_val_*`) and which of them a later study superseded, each cell's choice and its margin
(rpevit.analysis.validation_choice), and which value of a knob the published studies ran with."""
from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Collection

import pandas as pd

from rpevit.analysis import validation_choice
from rpevit.analysis.answers_sources import Sources, confirmatory_studies, is_published
from rpevit.analysis.answers_wording import bounds, claim, exploratory, verdict_text
from rpevit.analysis.common import code_span, column, fmt, has_random_features, raw_text, read_trials
from rpevit.config import FIRST_DEFAULTS, TrialConfig, recorded_values
from rpevit.sweep.results import TRIALS_FILE


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
