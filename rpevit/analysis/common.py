"""Shared helpers of the analysis scripts: load sweep results, Markdown, figures (intervals: stats.py).

RESULTS_DIR is either one sweep folder (holding trials.parquet) or a parent folder holding several
`<name>/trials.parquet`; every script accepts both and writes its Markdown and PNGs into RESULTS_DIR.
Only the rows whose trial_key the space.json beside each trials.parquet lists are used (rows of
trials dropped from an edited space stay in the Parquet file); every script says how many it set aside.

A parent may hold a `STUDIES` file: one sweep folder name per line (`#` comments). Then only the
folders it lists are read, and every script names the folders it did not read: `results/STUDIES`
lists the published studies, so a user's own sweep there (`python sweep.py --space
search_spaces/smoke.yaml` writes `results/smoke/`) never enters the committed report. Without a
STUDIES file every folder is read. A trials.parquet that cannot be read stops a script given that
one sweep folder with one line naming it and what to do; under a parent, its folder is skipped with
that line (on stderr, and in the Markdown) and the rest is reported.

Everything read from a file is untrusted. Text values of the rows (names: pe, attention, dataset,
environment, ...) are bounded to LABEL_LIMIT characters and made inert for Markdown as they are
read (`untrusted_names`, `md_text`), so no table cell, heading, prose line or figure label can carry
HTML, a link (bare URLs and e-mail addresses included), emphasis or a line break in, nor a megabyte label into
matplotlib; folder names are passed through `md_text` (or `code_span`) where they reach the Markdown. A value of
such a column that goes into a code span or a path is read back first (`raw_text`): inside a code span no
escape is undone. Every file a script writes (Markdown,
PNG, CSV, JSON) goes through `output_file`: atomic, never through a symbolic link (refused in one line).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import sys
import textwrap
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from rpevit import config, registry
from rpevit.attention.base import RandomFeatureBackend
from rpevit.sweep.protocol import OK
from rpevit.sweep import migrate, results, store
from rpevit.sweep.results import (SPACE_FILE, STR, TRIALS_FILE, DamagedResults, LinkRefused, atomic_file,
                                  named_folder, trials_schema)


ENVIRONMENT_COLUMNS = tuple(name for name, _ in results.ENVIRONMENT_COLUMNS)  # where a row was produced
STUDIES_FILE = "STUDIES"  # in a parent RESULTS_DIR: the sweep folders to read, one per line
MAX_TEXT_BYTES = 2**20  # a STUDIES list or a generated Markdown file read back: far above any real one
VARIANT = ("dataset", "attention", "pe", "qk_norm", "redraw")  # what one row of a per-variant table is


def cost_options() -> tuple[str, ...]:
    """The config fields that change what one image costs besides the shape: every option a registered
    backend or encoding takes (rpevit.registry.init_parameters), less those its field marks
    `cost_free` (a scale, an eps, a redraw schedule): a new option is matched between bench and train
    rows with no edit here."""
    from rpevit.config import TrialConfig, field_types

    config.load_registry()
    free = {f.name for f in dataclasses.fields(TrialConfig) if f.metadata.get("cost_free")}
    names = set(field_types()) - set(registry.CONTEXT) - free
    classes = [*registry.ATTENTIONS.values(), *registry.POSITION_ENCODINGS.values()]
    return tuple(dict.fromkeys(p for cls in classes for p in registry.init_parameters(cls) if p in names))


def attention_class(name: Any) -> type | None:
    """The registered backend class of an `attention` value (None for a name no longer registered)."""
    config.load_registry()  # once per process (the registry's modules are imported once)
    return registry.ATTENTIONS.get(str(name))


ROTATION_METRIC_PREFIX = "test_acc_rot"  # test_acc_rot0 ... test_acc_rot_random and their draw statistics


LABEL_LIMIT = 200  # characters of a name read from a file that reach a table or a figure (a 1 MB `pe` would not plot)
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")  # line breaks and terminal escapes: one space
# What md_text changes besides control characters, each for GitHub's renderer (cmark-gfm: its core inline parser
# and its autolink and strikethrough extensions):
_MARKUP = "|".join([
    r"[\\`\[\]*~&<>@$]",  # escape, code span, link/image, emphasis, strikethrough, entity/HTML, email, math
    r"(?<![A-Za-z0-9_])_+|_+(?![A-Za-z0-9_])",  # a run of `_` with a side not an ASCII letter or digit
    r":(?=//)",  # the `:` of a scheme autolink (http://, https://, ftp://)
    r"(?<=[wW]{3})\.",  # the `.` of a www autolink (www.example.com)
])
_MARKUP_RE = re.compile(_MARKUP)
_UNSAFE = re.compile(rf"{_MARKUP}|[\x00-\x1f\x7f\u0085\u2028\u2029]")  # md_text(text) != text iff it matches
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": "&#8288;@"}  # U+2060 WORD JOINER before an `@`
_INERT = re.compile(r"\\(.)|&(amp|lt|gt);|&#8288;(?=@)", re.DOTALL)  # what md_text writes, read back (raw_text)
_RAW = {"amp": "&", "lt": "<", "gt": ">"}


def short(text: str, limit: int = LABEL_LIMIT) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def md_text(value: Any) -> str:
    """A value read from a file, as inert Markdown text, checked against GitHub's renderer (cmark-gfm, its
    autolink and strikethrough extensions; tests/test_markdown_inert.py renders it where cmarkgfm is installed):

    - line breaks and control characters become a space (a newline would end a table row);
    - `\\ ` [ ] * ~` are backslash-escaped: no escape of what follows, code span, link, image, emphasis or
      strikethrough can open;
    - a run of `_` is backslash-escaped unless an ASCII letter or digit stands on both its sides: such an
      intraword run is both left- and right-flanking and not next to punctuation, so by GFM's rules it can
      neither open nor close emphasis (`luo_rpe`, `cifar10_ladder40_cpu` print as they are), while one at
      either end of the value, or beside a space or punctuation, could pair with generated text;
    - `& < >` become entities (no HTML);
    - `$` is backslash-escaped: GitHub renders `$...$` and `$$...$$` as math (outside cmark-gfm, after it), and an
      escaped `\\$` is documented there as a dollar sign, never a delimiter;
    - no autolink forms: the `:` of `://` and the `.` of `www.` are backslash-escaped (the autolink extension
      matches them in the source, where `\\:` and `\\.` no longer read `://` and `www.`), and each `@` gets
      a U+2060 WORD JOINER before it, as the entity `&#8288;` (the extension finds e-mail addresses in the
      parsed text, with adjacent text joined, where a backslash escape is gone; after the joiner an `@` has no
      local part, and the text still reads the same).

    Text without any of these is unchanged (md_text(text) == text exactly when _UNSAFE finds nothing), so
    ordinary names print as before; `|` is escaped by markdown_table, where it would split a cell. raw_text reads
    the value back, for a code span, where no escape is undone."""
    text = str(value)
    if not _UNSAFE.search(text):
        return text
    return _MARKUP_RE.sub(_inert, _CONTROL.sub(" ", text))


def _inert(found: re.Match) -> str:
    text = found[0]
    return _ENTITIES.get(text) or "".join(f"\\{c}" for c in text)


def raw_text(value: Any) -> str:
    """md_text's inverse: the value md_text made inert, as it was read (its control characters stay spaces and
    a value `short` cut stays cut). For a code span (code_span) or a path, where an escape is not undone:
    `code_span(md_text(name))` would print `name\\[x\\]`; `code_span(raw_text(md_text(name)))` prints
    `name[x]`. The text columns of frames read here hold md_text's output (untrusted_names)."""
    return _INERT.sub(lambda m: m[1] if m[1] is not None else _RAW.get(m[2], ""), str(value))


def code_span(value: Any) -> str:
    """A value read from a file (a path) as a Markdown code span: fenced by one backtick more than its
    longest run of them, line breaks as spaces; inside a code span nothing is markup or HTML."""
    text = _CONTROL.sub(" ", str(value))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


@functools.cache
def _text_columns() -> frozenset[str]:
    """The columns every registered task's trials.parquet declares as text (names, versions, errors)."""
    config.load_registry()
    return frozenset(f.name for task in registry.TASKS for f in trials_schema(task) if f.type == STR)


def untrusted_names(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with every declared text column's values bounded (short) and made inert (md_text):
    what reaches the Markdown, the figures and the CSVs from these rows is then safe, wherever a
    study module prints it. For a code span or a path, raw_text reads a value back."""
    def clean(value: Any) -> Any:
        if not isinstance(value, str) or (len(value) <= LABEL_LIMIT and not _UNSAFE.search(value)):
            return value
        return md_text(short(value))

    out = frame
    for name in _text_columns().intersection(frame.columns):  # each distinct value looked at once
        if not any(clean(value) is not value for value in pd.unique(frame[name])):
            continue
        cleaned = frame[name].map(clean)
        if not cleaned.equals(frame[name]):
            out = out.copy() if out is frame else out
            out[name] = cleaned
    return out


def trial_files(results_dir: Path) -> list[Path]:
    """trials.parquet of one sweep folder, or of every sweep folder directly under a parent (only
    those its STUDIES file lists, where it has one). A folder of a running sweep may hold its rows in
    parts only (rpevit.sweep.store): its trials.parquet path is listed all the same (read_sweep reads
    the union)."""
    results_dir = Path(results_dir)
    if store.holds_rows(results_dir):
        return [results_dir / TRIALS_FILE]
    found = sweep_folders(results_dir)
    listed = listed_studies(results_dir)
    return found if listed is None else [p for p in found if p.parent.name in listed]


def sweep_folders(results_dir: Path) -> list[Path]:
    """`<folder>/trials.parquet` of each folder directly under results_dir that holds trial rows (the
    file, or parts of a running sweep), sorted."""
    folders = {p.parent for p in Path(results_dir).glob(f"*/{TRIALS_FILE}")}
    folders |= {p.parent.parent for p in Path(results_dir).glob(f"*/{store.PARTS_DIR}/trials-*.parquet")}
    return sorted(folder / TRIALS_FILE for folder in folders if store.holds_rows(folder))


def read_text_file(path: Path, allowed: str) -> str | None:
    """The text of a file under a results folder (None: nothing there), read as untrusted: a regular file only
    (a FIFO of that name would block the script forever), at most MAX_TEXT_BYTES, UTF-8; otherwise SystemExit,
    one line naming the file, what is wrong and `allowed`."""
    try:
        data = results.read_regular_bytes(path, MAX_TEXT_BYTES, allowed)
        return None if data is None else data.decode("utf-8")
    except config.ConfigError as err:  # names the file, what it is and what is allowed
        raise SystemExit(f"error: {' '.join(str(err).split())}") from None
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise SystemExit(f"error: {path} cannot be read ({' '.join(str(err).split())[:200]}); allowed: "
                         f"{allowed}") from None


def listed_studies(results_dir: Path) -> list[str] | None:
    """The folder names results_dir/STUDIES lists (None: no such file). A line that is not one plain
    folder name stops the script with one line naming the file, the line and what is allowed."""
    path = Path(results_dir) / STUDIES_FILE
    text = read_text_file(path, "a text file with one sweep folder name per line, or no file (then every folder "
                                "is read)")
    if text is None:
        return None
    lines = text.splitlines()
    names = []
    for number, line in enumerate(lines, 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if name in (".", "..") or name.startswith(".") or any(c in name for c in "/\\\0") or " " in name:
            raise SystemExit(f"error: {path}, line {number}, has value {name!r}; allowed: one sweep folder name per "
                             f"line (a folder directly under {Path(results_dir)}), '#' comments, blank lines")
        names.append(name)
    return names


def unlisted_folders(results_dir: Path) -> tuple[list[str], list[str]]:
    """(folders under a parent holding a trials.parquet that its STUDIES file does not list, folders it
    lists that hold none); both empty without a STUDIES file."""
    results_dir = Path(results_dir)
    listed = listed_studies(results_dir)
    if listed is None or store.holds_rows(results_dir):
        return [], []
    present = {p.parent.name for p in sweep_folders(results_dir)}
    return sorted(present - set(listed)), [name for name in listed if name not in present]


def studies_note(results_dir: Path) -> str:
    """One Markdown line on the folders a STUDIES file left out ('' when it left none out)."""
    skipped, missing = unlisted_folders(results_dir)
    parts = []
    if skipped:
        parts.append(f"not read: {', '.join(map(md_text, skipped))} (not listed in {STUDIES_FILE}, which names the "
                     f"studies this report is made of)")
    if missing:
        parts.append(f"listed in {STUDIES_FILE} but holding no {TRIALS_FILE}: {', '.join(map(md_text, missing))}")
    return "; ".join(f"_{p}_" for p in parts)


_WARNED: set[Path] = set()  # damaged files already named on stderr by this process


def damaged_text(err: DamagedResults) -> str:
    """What a reader does about a trials.parquet the analysis cannot read."""
    return (f"{err}: its folder is skipped. To rebuild it, run that sweep again with --resume (the driver sets "
            f"the file aside as {err.path.name}.damaged-<time> and reruns the trials it held from their "
            f"checkpoints), or restore the file from git or a backup")


_READS: dict[tuple[str, Path], Any] | None = None  # what one_read_per_folder has read


@contextmanager
def one_read_per_folder() -> Iterator[None]:
    """Inside, each sweep folder's rows (read_sweep) and space.json (space_keys) are read, resolved and
    checked once, however many sections ask for them (report.py runs eight; answers.py more): one
    report, one read per folder, and every section sees the same rows even while a sweep writes them."""
    global _READS
    outer = _READS
    _READS = {} if outer is None else outer
    try:
        yield
    finally:
        _READS = outer


def _once(what: str, path: Path, read: Callable[[Path], Any]) -> Any:
    """read(path), kept for the rest of the one_read_per_folder around this call (if any)."""
    if _READS is None:
        return read(path)
    if (what, Path(path)) not in _READS:
        _READS[(what, Path(path))] = read(path)
    return _READS[(what, Path(path))]


def read_sweep(path: Path, results_dir: Path) -> pd.DataFrame | None:
    """One sweep folder's trial rows as a frame: its trials.parquet and the parts a running sweep has
    written since (rpevit.sweep.store.read_table, every row once), configs resolved (rpevit.sweep.
    migrate.resolved_frame), names made inert (untrusted_names). A damaged file: SystemExit (one line)
    when its folder is the one asked for; under a parent None, after one line on stderr (once per file)."""
    found = _once("rows", path, _read_rows)
    if isinstance(found, DamagedResults):
        err = found
        if path.parent == Path(results_dir):
            raise SystemExit(f"error: {err}; allowed: the file sweep.py writes. Run that sweep again with --resume "
                             f"(it sets the file aside as {err.path.name}.damaged-<time> and reruns the trials it "
                             f"held from their checkpoints), or restore the file from git or a backup") from None
        if err.path not in _WARNED:
            _WARNED.add(err.path)
            print(f"warning: {damaged_text(err)}", file=sys.stderr, flush=True)
        return None
    return found.copy(deep=False)  # copy-on-write: a section's edits never reach another's rows


EPOCH_TIME_COLUMNS = ["trial_key", "epoch", "epoch_s"]


def read_epoch_times(folder: Path) -> pd.DataFrame | None:
    """A sweep folder's epoch rows, only the columns that time them (trial_key, epoch, epoch_s), every row once
    (store.read_table: the file and a running sweep's parts); None where there is none or it cannot be read (named
    on stderr once), so a cost figure that needs it says it did without rather than failing the report."""
    return _epoch_rows(folder, "epoch times", EPOCH_TIME_COLUMNS)


# device_name: where each epoch ran (train epoch rows from 2026-11-30 on; absent in older files, which read without it)
EPOCH_CURVE_COLUMNS = ["sweep", "trial_key", "epoch", "train_loss", "val_loss", "val_acc", "device_name"]


def read_epoch_curves(folder: Path) -> pd.DataFrame | None:
    """A sweep folder's epoch rows with what each epoch measured (EPOCH_CURVE_COLUMNS: losses and validation
    accuracy), every row once; None where there is none or it cannot be read (named on stderr once), as
    read_epoch_times."""
    return _epoch_rows(folder, "epoch curves", EPOCH_CURVE_COLUMNS)


def _epoch_rows(folder: Path, what: str, columns: list[str]) -> pd.DataFrame | None:
    """The columns of a folder's epoch rows, read once per one_read_per_folder; None where there are none or
    the file is damaged (named on stderr once per file)."""
    found = _once(what, Path(folder) / results.EPOCHS_FILE, lambda path: _read_epoch_columns(path, columns))
    if isinstance(found, DamagedResults):
        if found.path not in _WARNED:
            _WARNED.add(found.path)
            print(f"warning: {damaged_text(found)}", file=sys.stderr, flush=True)
        return None
    return found


def _read_epoch_columns(path: Path, columns: list[str]) -> pd.DataFrame | DamagedResults | None:
    try:
        table = store.read_table(path, columns=columns)
        return None if table is None else results.frame_of(table, path)  # stored names: no file's metadata renames
    except DamagedResults as err:
        return err


def _read_rows(path: Path) -> pd.DataFrame | DamagedResults:
    try:
        table = store.read_table(path)
        frame = results.frame_of(table, path) if table is not None else None  # stored names, as check_schema saw
    except DamagedResults as err:
        return err
    return untrusted_names(migrate.resolved_frame(frame)) if frame is not None else pd.DataFrame()


def space_keys(folder: Path) -> set[str] | None:
    """trial_keys of the space.json the sweep runner wrote into folder; None when there is none.
    A space.json that is not what the runner writes stops the script with one line (SystemExit)."""
    space = space_file(folder)
    return set(space["trial_keys"]) if space is not None else None


def space_file(folder: Path) -> dict[str, Any] | None:
    """The folder's space.json as the runner wrote it (results.read_space_file: the one reader, a FIFO never
    opened), read once per one_read_per_folder; None without one; SystemExit (one line) for one that is not
    what the runner writes."""
    found = _once("space", Path(folder) / SPACE_FILE, _parse_space_file)
    if isinstance(found, SystemExit):
        raise found
    return found


def _parse_space_file(path: Path) -> dict[str, Any] | None | SystemExit:
    try:
        return results.read_space_file(path.parent)
    except ValueError as err:  # ConfigError: names the file, what is wrong and what is allowed
        return SystemExit(f"error: {' '.join(str(err).split())} (rerun the sweep with --resume to rewrite it, or "
                          f"delete the file to keep every row of that folder)")


def current_rows(frame: pd.DataFrame, folder: Path) -> tuple[pd.DataFrame, int]:
    """Rows whose trial_key the folder's space.json lists, and how many were set aside. A space
    that was edited after a sweep ran leaves rows of trials it no longer contains in trials.parquet;
    mixing them in would average configurations the space no longer describes. (A space.json that is
    not the runner's stops the script with one line.)"""
    space = space_file(folder)
    if space is None:
        return results.rows_of_space(frame, None, None)
    scheme = space.get("key_scheme")
    return results.rows_of_space(frame, space["trial_keys"], scheme if isinstance(scheme, str) else None)


@dataclass
class TrialRows:
    """Successful current rows, with what was left out, so each script can say so in its Markdown."""

    frame: pd.DataFrame
    set_aside: int = 0  # rows of the selected tasks whose trial_key is not in their space.json
    without_space: tuple[str, ...] = ()  # folders holding no space.json: all their rows kept
    with_space: int = 0  # folders whose rows were filtered by their space.json
    damaged: tuple[str, ...] = ()  # folders skipped: their trials.parquet cannot be read
    studies: str = ""  # studies_note: folders a STUDIES file left out
    rotation_study: int = 0  # train rows set aside by without_rotation_study

    def without_rotation_study(self) -> "TrialRows":
        """These rows less the train rows that ran test-time rotations (ran_test_rotations): they belong
        to the rotation study (analysis/rotation.py), whose arms change the training augmentation, so
        averaging them into another study's cell of the same dataset would mix two protocols."""
        rotated = ran_test_rotations(self.frame) & (column(self.frame, "task", "train") == "train")
        kept = self.frame[~rotated].reset_index(drop=True)
        return dataclasses.replace(self, frame=kept, rotation_study=self.rotation_study + int(rotated.sum()))

    def note(self) -> str:
        """One Markdown line on which rows were used: set-aside count, unfiltered, skipped and unread folders."""
        s = "" if self.set_aside == 1 else "s"
        parts = [f"_{self.set_aside} row{s} set aside: not in the current {SPACE_FILE}_"] if self.with_space else []
        if self.rotation_study:
            s = "" if self.rotation_study == 1 else "s"
            parts.append(f"_{self.rotation_study} row{s} of the rotation study (test-time rotations) left to its own "
                         "section: its training augmentation differs_")
        if self.without_space:
            parts.append(f"_no {SPACE_FILE} in {', '.join(map(md_text, self.without_space))}: all rows there kept_")
        if self.damaged:
            parts.append(f"_skipped, {TRIALS_FILE} cannot be read: {', '.join(map(md_text, self.damaged))} (see the "
                         f"warning on stderr)_")
        if self.studies:
            parts.append(self.studies)
        return "; ".join(parts)


def _select(frame: pd.DataFrame, tasks: Sequence[str] | None) -> pd.DataFrame:
    frame = frame[frame["status"] == OK]
    if tasks is not None:
        frame = frame[frame["task"].isin(tasks)] if "task" in frame.columns else frame.iloc[0:0]
    return frame


def read_trials(results_dir: Path, tasks: Sequence[str] | None = None) -> TrialRows:
    """Successful rows of the given tasks (all if None) of every sweep found, keeping only the
    rows their folder's space.json lists (every row where a folder has no space.json)."""
    results_dir = Path(results_dir)
    frames, set_aside, without, damaged = [], 0, [], []
    for path in trial_files(results_dir):
        frame = read_sweep(path, results_dir)
        if frame is None:
            damaged.append(path.parent.name)
            continue
        selected = _select(frame, tasks)
        if space_keys(path.parent) is None:
            without.append(path.parent.name if path.parent != results_dir else ".")
            kept, dropped = selected, 0
        else:
            kept, dropped = current_rows(selected, path.parent)
        frames.append(kept)
        set_aside += dropped
    frame = pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()
    return TrialRows(frame.reset_index(drop=True), set_aside, tuple(without), len(frames) - len(without),
                     tuple(damaged), studies_note(results_dir))


def ran_test_rotations(frame: pd.DataFrame) -> pd.Series:
    """Per row: whether it carries any finite test-time-rotation accuracy (test_acc_rot*: a trial with
    eval_rotations set, rpevit.evaluation)."""
    names = [c for c in frame.columns if str(c).startswith(ROTATION_METRIC_PREFIX)]
    if not names:
        return pd.Series(False, index=frame.index)
    values = frame[names].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    return pd.Series(np.isfinite(values).any(axis=1), index=frame.index)


def load_trials(results_dir: Path, task: str | None = None) -> pd.DataFrame:
    """Successful current rows (see read_trials), optionally of one task; empty if none."""
    return read_trials(results_dir, None if task is None else [task]).frame


def column(frame: pd.DataFrame, name: str, default: Any = math.nan) -> pd.Series:
    """frame[name], or default on every row: results written before a column existed lack it."""
    if name in frame.columns:
        return frame[name]
    return pd.Series([default] * len(frame), index=frame.index, dtype=object if isinstance(default, str) else float)


def has_random_features(frame: pd.DataFrame) -> pd.Series:
    """Rows whose attention draws random features, as its backend class declares for the row's config
    (AttentionBackend.draws_random_features: FAVOR+; Performer-ReLU with a random projection; any
    RandomFeatureBackend registered later). Asked once per attention and distinct values of that
    backend's own options (backend_options), not per row."""
    draws = pd.Series(False, index=frame.index, dtype=bool)
    if frame.empty or "attention" not in frame.columns:
        return draws
    for name, rows in frame.groupby("attention", dropna=False, sort=False).indices.items():
        cls = attention_class(frame["attention"].iloc[rows[0]])
        if cls is None:
            continue
        options = [o for o in backend_options(cls) if o in frame.columns]
        same = frame.iloc[rows].groupby(options, dropna=False, sort=False).ngroup().to_numpy() if options else \
            np.zeros(len(rows), dtype=np.int64)
        firsts = pd.Series(np.arange(len(rows))).groupby(same).first().to_numpy()
        firsts = frame.iloc[rows[firsts]][options].to_dict("records") if options else [{}] * len(firsts)
        decided = np.array([bool(cls.draws_random_features(BackendOptions(values, cls))) for values in firsts],
                           dtype=bool)
        draws.iloc[rows] = decided[same]
    return draws


def backend_options(cls: type) -> tuple[str, ...]:
    """The config fields a backend class takes as its options (its `__init__` keywords, less the layer
    context): all its draws_random_features may read of a row."""
    fields = config.field_types()
    return tuple(p for p in registry.init_parameters(cls) if p in fields and p not in registry.CONTEXT)


class BackendOptions(Mapping):
    """The values of a backend's options in one row, for its draws_random_features. A field that is not
    one of its options raises (the analysis decides per distinct value of the options alone, so a
    backend reading another field would be decided wrongly): declare it as an `__init__` option."""

    def __init__(self, values: dict[str, Any], cls: type) -> None:
        self.values, self.cls = values, cls

    def __getitem__(self, key: str) -> Any:
        if key in self.values:
            return self.values[key]
        if key in backend_options(self.cls):
            raise KeyError(key)  # an option the rows lack (older results): absent, as in the row
        raise TypeError(f"{self.cls.__qualname__}.draws_random_features reads {key!r}, which is not one of its "
                        f"options ({', '.join(backend_options(self.cls)) or 'none'}); allowed: its own options "
                        f"(take it in __init__)")

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


_CPU_WITHOUT_MODEL = re.compile(r"cpu:\S+ x\d+ threads?")  # rpevit.metrics.device_name before 2026-11-29


def device_label(name: str) -> str:
    """A row's device_name as a caption names it: a CPU recorded before its model was (rpevit.metrics.device_name
    from 2026-11-29 on names the model and vector unit) says so, since such rows of one study may come from
    different machines: 'cpu:x86_64 x1 threads (CPU model not recorded)'."""
    return f"{name} (CPU model not recorded)" if _CPU_WITHOUT_MODEL.fullmatch(str(name)) else str(name)


def devices_text(frame: pd.DataFrame) -> str:
    """The devices a frame's rows ran on, as a caption says it: 'device: cpu:x86_64 x1 threads', or, where rows ran
    on more than one, '2 devices: A (40 rows); B (52 rows)' (a study resumed on another machine: ', '-joined
    names read as one device with a comma in its name)."""
    if "device_name" not in frame or frame.empty:
        return "device unknown"
    counts = frame["device_name"].astype(str).map(device_label).value_counts()
    if len(counts) == 1:
        return f"device: {counts.index[0]}"
    return f"{len(counts)} devices: " + "; ".join(f"{name} ({n} rows)" for name, n in sorted(counts.items()))


def judged_accuracy(frame: pd.DataFrame) -> pd.Series:
    """The accuracy a row is judged by: its mean over fresh draws where the attention draws random
    features (one draw is a lottery: docs/random_features.md), its exact test_acc otherwise. A
    random-feature row without a draw mean stays NaN rather than falling back to its one draw."""
    draw_mean = pd.to_numeric(column(frame, "test_acc_draw_mean"), errors="coerce")
    return draw_mean.where(has_random_features(frame), pd.to_numeric(frame["test_acc"], errors="coerce"))


def redraw_label(random_features: bool, interval: float, until: float) -> str:
    """'off' (no redraws, or nothing to redraw), else 'every N' and ' until F' when the row says F."""
    if not random_features or not (isinstance(interval, (int, float, np.number)) and interval > 0):
        return "off"
    label = f"every {int(interval)}"
    return f"{label} until {until:g}" if until is not None and math.isfinite(until) else label


def pe_labels(frame: pd.DataFrame) -> pd.Series:
    """`pe`, with the options of that encoding (rpevit.config.encoding_options: its class's `__init__`; of
    each of its encodings for a combination such as ape+luo_rpe) that take more than one value among its rows
    of the frame: 'sparse_cayley_string (string_sparsity=0.05, cayley_solver=auto)', so that the f sweep
    and the solver row are separate variants, not averaged together."""
    labels = frame["pe"].astype(str).copy()
    by_name = config.encoding_options()
    for pe in labels.unique():  # a combination (ape+luo_rpe) takes the options of each of its encodings
        options = tuple(dict.fromkeys(o for part in pe.split("+") for o in by_name.get(part, ())))
        rows = labels.eq(pe) & frame["pe"].notna()
        varying = [o for o in options if o in frame.columns and frame.loc[rows, o].nunique(dropna=False) > 1]
        if rows.any() and varying:
            labels[rows] = per_distinct([frame.loc[rows, o] for o in varying], lambda *values, pe=pe, varying=varying:
                                        f"{pe} ({', '.join(f'{o}={fmt(v)}' for o, v in zip(varying, values))})")
    return labels


def per_distinct(columns: Sequence[pd.Series], fn: Callable[..., Any]) -> list[Any]:
    """[fn(*values) for values in zip(*columns)], with fn called once per distinct tuple of values (a
    label of 10^5 rows costs what the labels of their few distinct configurations cost). Values are
    distinct by value and, in object columns, by type (None and NaN apart, as fn may tell them apart)."""
    if not columns or len(columns[0]) == 0:
        return []
    keys = {}
    for i, values in enumerate(columns):
        values = pd.Series(values).reset_index(drop=True)
        keys[f"v{i}"] = values
        if values.dtype == object:
            keys[f"t{i}"] = values.map(type)
    codes = pd.DataFrame(keys).groupby(list(keys), dropna=False, sort=False).ngroup().to_numpy()
    _, firsts = np.unique(codes, return_index=True)  # the first row of each distinct tuple, by its number
    firsts_values = [pd.Series(values).iloc[firsts].tolist() for values in columns]
    results = [fn(*values) for values in zip(*firsts_values)]
    return [results[code] for code in codes]


def redraw_labels(frame: pd.DataFrame, random: pd.Series) -> list[str]:
    """redraw_label of each row (its random-features flag, redraw_interval and redraw_until)."""
    interval = pd.to_numeric(column(frame, "redraw_interval", 0), errors="coerce")
    until = pd.to_numeric(column(frame, "redraw_until"), errors="coerce")
    return per_distinct([random, interval, until], redraw_label)


def with_variant(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy with the VARIANT columns filled in: pe with its variant-defining options (pe_labels),
    qk_norm ('none' when absent), redraw (a label), and relu without random features named
    'relu-identity' (it is a different, deterministic backend)."""
    out = frame.copy()
    out["pe"] = pe_labels(out)
    random = has_random_features(out)
    out["qk_norm"] = column(out, "qk_norm", "none").fillna("none").astype(str)
    out["redraw"] = redraw_labels(out, random)
    kinds = {name: isinstance(attention_class(name), type) and issubclass(attention_class(name), RandomFeatureBackend)
             for name in pd.unique(out["attention"])}  # per distinct name
    drawing_kind = out["attention"].map(lambda name: kinds.get(name, False))  # NaN: no backend
    identity = drawing_kind.astype(bool) & ~random  # a random-feature backend configured not to draw
    out["attention"] = out["attention"].where(~identity, out["attention"].astype(str) + "-identity")
    return out


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers to `digits` significant figures; NaN as an em dash."""
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return "—"
        return f"{value:.{digits}g}"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A pipe table; '|' inside cells (norms like |x|) is escaped so it cannot split a column."""
    cell = lambda c: fmt(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display on the machines that run this)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def wrap_titles(fig) -> bool:
    """Break the figure's title and each axes' title into lines no wider than the figure. Why: bbox "tight"
    widens the saved image to a title's full length, so a long one (a study resumed on four machines names
    four devices) shrank the panels to a strip in the middle of an image 2,700 pixels wide. True where a title
    changed (its layout is then made again)."""
    changed = False
    width_pt = fig.get_figwidth() * 72.0
    texts = [getattr(fig, "_suptitle", None)] + [ax.title for ax in fig.get_axes()]
    for text in texts:
        if text is None or not text.get_text():
            continue
        per_line = max(20, int(width_pt / (0.55 * text.get_fontsize())))  # a character: about 0.55 em wide
        lines = [textwrap.fill(line, per_line, break_on_hyphens=False) for line in text.get_text().split("\n")]
        if "\n".join(lines) != text.get_text():
            text.set_text("\n".join(lines))
            changed = True
    return changed


def save_figure(fig, path: Path) -> Path:
    """Saved with everything drawn in it, legends placed outside the axes included (bbox "tight"):
    tight_layout cannot make room for a long outside legend, and warns so; the crop does it. A figure
    made with a layout engine of its own (`layout="constrained"`) keeps it. Written through
    output_file (atomic, never through a link)."""
    path = Path(path)
    try:
        from matplotlib.layout_engine import PlaceHolderLayoutEngine

        wrapped = wrap_titles(fig)
        engine = fig.get_layout_engine()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
            # a one-off tight_layout of the caller leaves a placeholder engine: made again for wrapped titles
            if engine is None or (wrapped and isinstance(engine, PlaceHolderLayoutEngine)):
                fig.tight_layout()
        with output_file(path) as handle:
            fig.savefig(handle, format=path.suffix.lstrip(".") or "png", dpi=110, bbox_inches="tight")
    finally:
        pyplot().close(fig)
    print(f"wrote {path}")  # every figure is named where it lands, as write_markdown names the text
    return path


def environment_table(frame: pd.DataFrame) -> str:
    """Where the rows were produced: each distinct (device, torch, ray, commit, python) with its row count."""
    cols = [c for c in ENVIRONMENT_COLUMNS if c in frame.columns]
    if frame.empty or not cols:
        return "_no environment columns in the results_"
    groups = frame.groupby(cols, dropna=False).size().reset_index(name="rows")
    if "sweep" in frame.columns:
        sweeps = frame.groupby(cols, dropna=False)["sweep"].agg(lambda s: ", ".join(sorted(set(map(str, s)))))
        groups["sweeps"] = sweeps.values
    return markdown_table(list(groups.columns), groups.itertuples(index=False))


def results_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the RESULTS_DIR argument every script takes; a script adds its own options to it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("results_dir", type=named_folder, help="a sweep folder, or a parent of several")
    return parser


def require_folder(parser: argparse.ArgumentParser, name: str, folder: Path,
                   allowed: str = "allowed: a sweep folder, or a parent of several") -> None:
    """Stop with one usage line where `folder` (the argument `name`) does not exist or is not a folder: what
    that line says, not that a missing path 'holds no' rows or declaration."""
    if not folder.exists():
        parser.error(f"{name} has value {str(folder)!r}, which does not exist; {allowed}")
    if not folder.is_dir():
        parser.error(f"{name} has value {str(folder)!r}, which is not a folder; {allowed}")


def require_trials(parser: argparse.ArgumentParser, name: str, folder: Path) -> None:
    """Stop with one usage line where `folder` (the argument `name`) is no folder or holds no sweep."""
    require_folder(parser, name, folder)
    if not trial_files(folder):
        parser.error(f"{name} {folder} holds no {TRIALS_FILE} (nor */{TRIALS_FILE})")


def cli(description: str) -> Path:
    """The RESULTS_DIR argument every script takes, checked."""
    parser = results_parser(description)
    results_dir = parser.parse_args().results_dir
    require_trials(parser, "RESULTS_DIR", results_dir)
    return results_dir


@contextmanager
def output_file(path: Path) -> Iterator[BinaryIO]:
    """What an analysis script writes (Markdown, PNG, CSV, JSON), through rpevit.sweep.results.atomic_file:
    atomic, never through a symbolic link. A link there, or a folder that cannot take the file, stops
    the script with one line naming the path (nothing is written through the link)."""
    try:
        with atomic_file(path) as handle:
            yield handle
    except LinkRefused as err:
        raise SystemExit(f"error: {err}") from None
    except OSError as err:
        raise SystemExit(f"error: cannot write {path} ({err.strerror or err}); allowed: a folder this user can "
                         f"write") from None


def write_text_file(path: Path, text: str) -> Path:
    """`text` into `path` through output_file."""
    with output_file(Path(path)) as handle:
        handle.write(text.encode("utf-8"))
    return Path(path)


def write_markdown(path: Path, text: str) -> Path:
    write_text_file(path, text.rstrip() + "\n")
    print(f"wrote {path}")
    return path


def script_main(doc: str, build: Callable[[Path], "str | None"], out_name: str, title: str, what: str) -> None:
    """The body of every analysis script: RESULTS_DIR -> build(...) -> <RESULTS_DIR>/<out_name>."""
    results_dir = cli(doc.splitlines()[0])
    write_study(results_dir, out_name, title, what, build(results_dir))


def write_study(results_dir: Path, out_name: str, title: str, what: str, text: str | None) -> Path:
    """<results_dir>/<out_name> with the study's title; one line and exit where build found no rows."""
    if text is None:
        raise SystemExit(f"no successful {what} under {results_dir}")
    return write_markdown(results_dir / out_name, f"# {title}\n\n" + text)
