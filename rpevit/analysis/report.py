"""One report.md with every table and figure that applies to RESULTS_DIR.

    python analysis/report.py RESULTS_DIR

Runs the sections of gap_closure.py (draw-aware verdict and tables), string_study.py, efficiency.py,
token_scaling.py, kernel_mse.py
and rotation.py (test-time rotations) whose trials are present (each writes its PNGs into RESULTS_DIR),
includes the rotation-invariant concentration study if analysis/rotinv_concentration.py wrote its
output into RESULTS_DIR or a folder below it, and states where the rows were produced (device,
torch / ray / python versions, git commit, from the rows).
Only rows listed in each folder's space.json are used; the Trials table counts those set aside.
Where RESULTS_DIR holds a STUDIES file, only the folders it lists are read (results/STUDIES: the
published studies), and the report names the folders it left out; a folder whose trials.parquet
cannot be read is skipped with one line (stderr and the Trials table), not the whole report.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from rpevit.analysis import efficiency, gap_closure, kernel_mse, rotation, string_study, token_scaling
from rpevit.analysis.confirmatory import exploratory_note
from rpevit.analysis.common import (SPACE_FILE, cli, code_span, column, current_rows, environment_table, fmt,
                                    markdown_table, md_text, one_read_per_folder, read_epoch_times, read_sweep,
                                    read_text_file, read_trials, space_keys, studies_note, trial_files,
                                    unlisted_folders, write_markdown)
from rpevit.sweep.declaration import DECLARATION_FILE
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import TRIALS_FILE, unix_seconds

ROTINV_FILE = "rotinv_concentration.md"
ROTINV_ALLOWED = "the Markdown file analysis/rotinv_concentration.py wrote (a regular UTF-8 file)"
THREAD_HOURS_NOTE = ("Thread-hours: per Tune trial, last finish − first start times its torch threads, over the "
                     "rows of the current space; a trial resumed after a stop or a budget ladder's pause counts "
                     "from its resume, plus the recorded training seconds (epochs.parquet) of each epoch trained "
                     "before, once however many rungs inherited it; their validation and time lost to a stop are "
                     "not counted.")


def thread_hours(frame: pd.DataFrame, epochs: pd.DataFrame | None = None) -> float:
    """Thread-hours spent inside the rows' trials: per Tune trial (members timed together in one worker share
    one), last finish - first start, times its torch threads, plus earlier_epoch_hours(frame, epochs): a
    resumed trial's span starts at its resume, and without the epochs it trained before, a budget ladder run
    with --rungs-first (its trunks resume after their pause) would count its trunks' second round only. NaN
    where the rows carry no start/finish times."""
    if frame.empty or not {"started_at", "finished_at"} <= set(frame.columns):
        return math.nan
    spans = pd.DataFrame({"start": unix_seconds(frame["started_at"]), "end": unix_seconds(frame["finished_at"]),
                          "threads": _threads(frame)})
    trial = column(frame, "tune_trial_id", "").fillna("").astype(str)
    spans["trial"] = trial.where(trial != "", pd.Series(frame.index.astype(str), index=frame.index))
    per_trial = spans.groupby("trial").agg(start=("start", "min"), end=("end", "max"), threads=("threads", "max"))
    return float(((per_trial["end"] - per_trial["start"]) * per_trial["threads"]).sum() / 3600
                 + earlier_epoch_hours(frame, epochs))


def hours_running(frame: pd.DataFrame) -> float:
    """Wall hours during which at least one of the rows' trials ran: the length of the union of their
    [started_at, finished_at] spans, so the gaps between sessions of a study run over several are not counted
    and two trials side by side count once (thread_hours counts each). NaN where no row carries both times."""
    if frame.empty or not {"started_at", "finished_at"} <= set(frame.columns):
        return math.nan
    spans = pd.DataFrame({"start": unix_seconds(frame["started_at"]),
                          "end": unix_seconds(frame["finished_at"])}).dropna().sort_values("start")
    if spans.empty:
        return math.nan
    total, reach = 0.0, -math.inf
    for start, end in spans.itertuples(index=False):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 3600


def time_span(frame: pd.DataFrame) -> str:
    """'2026-11-22 19:25 → 11-23 10:15' (UTC): the rows' first start and last finish, the year and then the
    month left out where they repeat; '—' where no row carries both times."""
    if frame.empty or not {"started_at", "finished_at"} <= set(frame.columns):
        return "—"
    start, end = unix_seconds(frame["started_at"]).min(), unix_seconds(frame["finished_at"]).max()
    if not (math.isfinite(start) and math.isfinite(end)):
        return "—"
    a, b = (pd.Timestamp(t, unit="s", tz="UTC") for t in (start, end))
    tail = "%H:%M" if a.date() == b.date() else "%m-%d %H:%M" if a.year == b.year else "%Y-%m-%d %H:%M"
    return f"{a:%Y-%m-%d %H:%M} → {b.strftime(tail)}"


def _threads(frame: pd.DataFrame) -> pd.Series:
    return pd.to_numeric(column(frame, "torch_threads", 1), errors="coerce").fillna(1)


def earlier_epoch_hours(frame: pd.DataFrame, epochs: pd.DataFrame | None) -> float:
    """Thread-hours of the epochs the rows' trials trained before their last resume, from their epoch rows'
    training seconds (epoch_s) times the trial's threads. An epoch row after a trial's resumed_from_epoch
    was trained inside its span, so is already counted. One epoch trained once appears under several keys
    (a budget ladder's rungs inherit their trunk's rows up to their branch; members trained together in one
    worker share one epoch_s), so rows are one epoch where (epoch, epoch_s) agree, and such an epoch counts
    only if it lies before the resume of every trial that holds it. 0 without epoch rows or without
    resumed_from_epoch (rows of a version that did not record it)."""
    if (epochs is None or epochs.empty or "resumed_from_epoch" not in frame.columns
            or not {"trial_key", "epoch", "epoch_s"} <= set(epochs.columns) or "trial_key" not in frame.columns):
        return 0.0
    trials = pd.DataFrame({"trial_key": frame["trial_key"].astype(str),
                           "resumed": pd.to_numeric(frame["resumed_from_epoch"], errors="coerce").fillna(0),
                           "threads": _threads(frame)}).groupby("trial_key").max()
    rows = epochs.assign(trial_key=epochs["trial_key"].astype(str),
                         epoch=pd.to_numeric(epochs["epoch"], errors="coerce"),
                         epoch_s=pd.to_numeric(epochs["epoch_s"], errors="coerce")).join(trials, on="trial_key",
                                                                                         how="inner")
    rows = rows.dropna(subset=["epoch", "epoch_s"])
    if rows.empty:
        return 0.0
    rows["inside"] = rows["epoch"] > rows["resumed"]
    once = rows.groupby(["epoch", "epoch_s"]).agg(inside=("inside", "any"), threads=("threads", "max")).reset_index()
    earlier = once[~once["inside"]]
    return float((earlier["epoch_s"] * earlier["threads"]).sum() / 3600)


def status_table(results_dir: Path) -> str:
    """Per sweep folder: tasks, ok / failed rows of the current space, the rows set aside as stale
    (trial_key not in the folder's space.json), so a reader sees what every section left out, the
    thread-hours its trials took and how many were resumed after a stop."""
    rows = []
    for path in trial_files(results_dir):
        frame = read_sweep(path, results_dir)
        if frame is None:  # named on stderr by read_sweep
            rows.append([md_text(path.parent.name), "?", "—", "—", f"skipped: {TRIALS_FILE} cannot be read", "—", "—"])
            continue
        current, stale = current_rows(frame, path.parent)
        counts = current["status"].value_counts()
        tasks = ", ".join(sorted(frame["task"].dropna().astype(str).unique())) if "task" in frame else "?"
        aside = stale if space_keys(path.parent) is not None else f"no {SPACE_FILE}: all kept"
        resumed = int((pd.to_numeric(column(current, "resumed_from_epoch", 0), errors="coerce") > 0).sum())
        rows.append([md_text(path.parent.name), tasks, int(counts.get(OK, 0)), int(counts.get(FAILED, 0)), aside,
                     fmt(thread_hours(current, read_epoch_times(path.parent))), resumed])
    return markdown_table(["folder", "task", OK, FAILED, f"set aside (not in {SPACE_FILE})",
                           "thread-hours in trials", "resumed after a stop"], rows)


def rotinv_section(results_dir: Path) -> str | None:
    """rotinv_concentration.md found under results_dir, headings demoted, image links made relative."""
    found = sorted(results_dir.rglob(ROTINV_FILE))
    if not found:
        return None
    parts = ["## Rotation-invariant RPE: concentration of the random mode", ""]
    for path in found:
        rel = path.parent.relative_to(results_dir)
        text = inert_markdown(read_text_file(path, ROTINV_ALLOWED) or "")
        text = re.sub(r"^(#+) ", r"#\1\1 ", text, flags=re.M).replace("#### ", "### ", 1)
        png = path.with_suffix(".png")
        parts += [f"_from {md_text(rel / ROTINV_FILE)}_", "", text.strip(), ""]
        if png.exists():  # a relative link whatever the folder is called (`javascript:x` is quoted to a path)
            parts += [f"![rotinv concentration]({quote((rel / png.name).as_posix(), safe='/._-')})", ""]
    return "\n".join(parts)


# A bracket, `$`, the `:` of `://` or the `.` of `www.`, and the run of backslashes right before it
_LINK_FORMING = re.compile(r"(\\*)([\[\]$]|:(?=//)|(?<=[wW]{3})\.)")


def inert_markdown(text: str) -> str:
    """A Markdown file found under RESULTS_DIR, included as Markdown (its tables stay tables) but inert:
    `& < >` as entities (no HTML); every `[` and `]` backslash-escaped, so no link, image, reference link, link
    reference definition (`[1]: https://...`) or footnote can form; no autolink (GitHub's extension links a bare
    `https://...`, `www....` or e-mail address): the `:` of `://` and the `.` of `www.` backslash-escaped, and a
    U+2060 WORD JOINER (`&#8288;`) before each `@`, as md_text does; `$` escaped (GitHub's math). A character
    after an odd run of backslashes is escaped already and stays as it is; after an even run (none, or escaped
    backslashes) it gets one more, so a backslash in the file cannot un-escape it. An escaped character renders
    as itself: prose reads the same."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("@", "&#8288;@")
    return _LINK_FORMING.sub(lambda m: m[0] if len(m[1]) % 2 else f"{m[1]}\\{m[2]}", text)


def build_report(results_dir: Path) -> str:
    """report.md's text: each folder's rows read once (one_read_per_folder), every section from them."""
    with one_read_per_folder():
        return _report(results_dir)


def superseding_note(results_dir: Path) -> str:
    """One Markdown line where a declared study (a folder with a declaration.json) sits beside this report
    without being read by it: the studies read here ran settings chosen before the validation studies, some
    of them on test accuracy, and the declared reruns answer the same questions at settings chosen on
    validation ('' where there is none). Names come from the folders, never typed."""
    skipped, _ = unlisted_folders(results_dir)
    declared = [name for name in skipped
                if (results_dir / name / DECLARATION_FILE).is_file() and (results_dir / name / TRIALS_FILE).is_file()]
    if not declared:
        return ""
    names = ", ".join(code_span(name) for name in declared)
    return (f"_The studies read here ran settings chosen before the validation studies existed, some of them (the "
            f"redraw schedule, luo_rpe's luo_scale) on test accuracy: their verdicts are exploratory at those "
            f"settings. The declared studies {names} ask the same questions at settings chosen on each dataset's "
            f"validation split, with their comparisons declared before they ran: their `confirmatory.md` and "
            f"`results/ANSWERS.md` give those answers; this report does not read them._")


def shown_path(path: Path) -> str:
    """A folder as the report names it: relative to the working directory where it lies below it (`results`,
    as the committed report was made from a checkout's root: the same text in every clone), else absolute."""
    path, here = Path(path).absolute(), Path.cwd().absolute()
    return path.relative_to(here).as_posix() if path.is_relative_to(here) else str(path)


def _report(results_dir: Path) -> str:
    sections = [gap_closure.build(results_dir), string_study.build(results_dir), efficiency.build(results_dir),
                token_scaling.build(results_dir), kernel_mse.build(results_dir), rotation.build(results_dir), rotinv_section(results_dir)]
    trials = read_trials(results_dir)
    read_from = studies_note(results_dir)
    head = ["# rpevit results report", "", f"Results: {code_span(shown_path(results_dir))}", "",
            exploratory_note([path.parent for path in trial_files(results_dir)]), "",
            *([superseding_note(results_dir), ""] if superseding_note(results_dir) else []), "## Trials", "",
            status_table(results_dir),
            "", THREAD_HOURS_NOTE, "", *([read_from, ""] if read_from else []),
            "## Environment the successful rows were produced on", "", trials.note(), "",
            environment_table(trials.frame), ""]
    body = [s for s in sections if s]
    if not body:
        body = ["_no section applies: no successful train, bench or kernel_mse trials and no rotinv study_"]
    return "\n".join(head + body)


def main() -> None:
    results_dir = cli(__doc__.splitlines()[0])
    write_markdown(results_dir / "report.md", build_report(results_dir))


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool

    run_tool(main)
