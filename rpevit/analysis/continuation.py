"""How a declared study published before every declared item had its rows is continued: the exact commands,
written from its folder into results/README.md's declared-studies block by `python analysis/answers.py results`.

Why: issue 58 publishes `cifar10_ladder40_cpu` once its 10- and 20-epoch rungs are complete, while its
40-epoch trunks may still be training (days on a 2-core CPU); its 40-epoch rung must then be "resumable with
the exact command in results/README.md". A command typed by hand names a commit and a space file that go
stale at the study's next move; this one is generated from the folder at every `answers.py` run, and
`answers.py --check` fails where the committed README no longer says what the rows say. Each fact in it is
read from the folder and checked, since a file's content is untrusted:

- the sweep's name and space file: space.json's `name` (a name a sweep accepts, rpevit.sweep.space.check_name)
  and `source` (a relative path of a YAML file inside the repository, no `..`);
- the commit: the one the study's latest row ran at (`git_commit`, 40 hex digits). A latest row from a tree
  with edits (`+dirty`) or from outside a git checkout gives no command: no commit reproduces its code;
- `--rungs-first` where the space branches its rungs (`branch: epochs`), read from the space file in this
  checkout, and only where that file still lists exactly the trials of space.json; otherwise no command
  (the file changed since the rows ran: a resume from it would set rows aside, not continue them);
- the Python of the worktree's venv: the major.minor its ok rows record (`python_version`), since
  `constraints/tested.txt` pins the packages of one Python and `python3` is whatever the machine has; `python3`
  with a note where the rows disagree or record none (a value that is not a version is not used: it would be
  a shell word);
- `python analysis/budget_ladder.py` among the commands at each stop for a budget ladder (a train space at two
  or more budgets, `epochs`): budget_ladder.md is written by that script alone, and `answers.py --check` does not
  compare it with the rows, so a stop without it leaves it stale without a word.

The sweep's other flags (`--max-concurrent`, `--no-dashboard`, `--data-dir`) are not given: no file of the
study records the command line it ran with (space.json holds its name, source and keys; the rows their config
and environment), and they change the order, the machine's load and where the data is read, not the trials' keys.

Where the study still runs: `sweep.py` takes an exclusive lock on its folder (rpevit.sweep.lock) before Ray or
anything else starts, and a second driver exits at once with code 2 naming the holder, so the sweep line never
runs the study twice; but the lines before it move `../wt-<name>` to the commit and reinstall its venv, under a
driver running from there, so the text says to stop it first (`kill -INT`: exit 130, rows and checkpoints kept).

The commands keep the sweep's working folder (checkpoints, Ray's and TensorBoard's files) in `../studies/`,
outside the clone, so none of it reaches git, and run the sweep from a worktree pinned at that commit
(`../wt-<name>`, its own venv), as the guide's long-studies section says. A `../studies/<name>` already
there (the machine that ran it) is continued from its checkpoints, never overwritten by the published copy;
on another machine a trunk that had not finished trains again from its first epoch (checkpoints are not in
git), and `budget_ladder.shared_epochs` checks that it reproduces what its rungs branched from.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import pandas as pd

from rpevit.analysis import confirmatory, progress
from rpevit.analysis.common import code_span, column, current_rows, read_sweep, space_file, space_keys
from rpevit.config import ConfigError
from rpevit.sweep.protocol import OK
from rpevit.sweep.results import SPACE_FILE, TRIALS_FILE, unix_seconds
from rpevit.sweep.space import NAME_PATTERN, load_space

STUDIES = "../studies"  # the sweep's working folder, beside the clone: checkpoints never inside a checkout
COMMIT = re.compile(r"[0-9a-f]{40}")
VERSION = re.compile(r"(\d{1,2})\.(\d{1,3})(?:\.\d{1,4})?(?:(?:a|b|rc)\d{1,3})?\+?")  # platform.python_version()
SOURCE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*\.ya?ml")


@dataclass(frozen=True)
class Continuation:
    """A published declared study with declared items still incomplete, and how it continues."""

    folder: str  # its folder under results/ (POSIX)
    incomplete: int  # judged items (a comparison, contrast or trend on one metric at one level) with no verdict
    items: int
    entries: tuple[int, int]  # cell x rung entries holding every declared seed, of all
    ok: int
    planned: int | None  # trials space.json lists
    name: str = ""  # the sweep's name (space.json), "" where there are no commands
    source: str = ""  # its space file, relative to the repository root
    commit: str = ""  # the commit of its latest row
    rungs_first: bool = False
    ladder: bool = False  # a budget ladder: budget_ladder.md is judged again at each stop
    python: str = ""  # major.minor its rows ran on ("3.11"), "" where they disagree or record none
    python_note: str = ""  # where python is "": why (inert Markdown)
    why_not: str = ""  # where there are no commands: why (inert Markdown)

    def commands(self) -> list[str]:
        """The shell lines, from the clone's root: the working folder, the pinned worktree, the sweep."""
        if self.why_not:
            return []
        study, tree = f"{STUDIES}/{self.name}", f"../wt-{self.name}"
        flags = " --rungs-first" if self.rungs_first else ""
        python = f"python{self.python}" if self.python else "python3"
        return [f"[ -e {study} ] || {{ mkdir -p {STUDIES} && cp -r results/{self.folder} {study}; }}",
                f"[ -e {tree} ] || git worktree add --detach {tree} {self.commit}",
                f"cd {tree} && git checkout -q --detach {self.commit}",
                f"{python} -m venv .venv && . .venv/bin/activate && pip install -e . -c constraints/tested.txt",
                f"python sweep.py --space {self.source} --results-dir {STUDIES} --resume{flags}"]

    def publish_commands(self) -> list[str]:
        """Back in the clone (its own environment), at each stop: the rows so far into results/, judged (a
        ladder's budget_ladder.md too: nothing else rewrites it or checks it against the rows)."""
        ladder = [f"python analysis/budget_ladder.py results/{self.folder}"] if self.ladder else []
        return [f"python -m rpevit.sweep.snapshot {STUDIES}/{self.name} results/{self.folder}",
                f"python analysis/confirmatory.py results/{self.folder}", *ladder, "python analysis/answers.py results"]


def continuation(folder: Path, results_dir: Path) -> Continuation | None:
    """How the published declared study in `folder` continues; None where every declared item is complete.
    The repository root is results_dir's parent (the space file's `source` is relative to it)."""
    folder, results_dir = Path(folder), Path(results_dir)
    _, _, families, _ = confirmatory.judge(folder)
    outcomes = [o for _, family in families for o in family]
    incomplete = sum(not o.complete for o in outcomes)
    if not incomplete:
        return None
    so_far = progress.progress(folder)
    known = Continuation(folder.relative_to(results_dir).as_posix(), incomplete, len(outcomes),
                         (so_far.complete_cells, len(so_far.cells) * len(so_far.rungs)), so_far.ok, so_far.planned)
    try:
        check_folder(known.folder)
        name, source = space_name_and_source(folder)
        commit = latest_commit(folder)
        rungs_first, ladder = space_shape(results_dir.parent, source, folder)
    except ConfigError as err:
        return replace(known, why_not=confirmatory.md_text(str(err)))
    python, note = recorded_python(folder)
    return replace(known, name=name, source=source, commit=commit, rungs_first=rungs_first, ladder=ladder,
                   python=python, python_note=confirmatory.md_text(note))


def check_folder(relative: str) -> str:
    """The study's folder under results/, as the commands name it: each part a name a sweep accepts, so the
    shell line and the code block need no quoting (a space, a `;` or a line break would break either)."""
    if not all(NAME_PATTERN.fullmatch(part) for part in relative.split("/")):
        raise ConfigError(f"its folder under results/ is {relative[:120]!r}; allowed: folder names of letters, "
                          f"digits, '_', '.', '-' (as a sweep's name)")
    return relative


def space_name_and_source(folder: Path) -> tuple[str, str]:
    """space.json's `name` and `source`, each checked (module docstring); ConfigError names what is wrong.
    The file itself is read by the analysis's one reader (common.space_file)."""
    path, space = folder / SPACE_FILE, space_file(folder)
    if space is None:
        raise ConfigError(f"{path} is missing; allowed: the {SPACE_FILE} sweep.py writes")
    name, source = space.get("name"), space.get("source")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{path}: field 'name' has value {str(name)[:80]!r}; allowed: a sweep's name (one folder "
                          f"name: letters, digits, '_', '.', '-')")
    if (not isinstance(source, str) or not SOURCE.fullmatch(source)
            or any(part in (".", "..") for part in PurePosixPath(source).parts)):
        raise ConfigError(f"{path}: field 'source' has value {str(source)[:120]!r}; allowed: the space file's "
                          f"path relative to the repository root (e.g. search_spaces/<name>.yaml), no '..'")
    return name, source


def ok_rows(folder: Path) -> pd.DataFrame:
    """The ok rows of the current space (the rows the continuation continues); ConfigError where there is none."""
    frame = read_sweep(folder / TRIALS_FILE, folder)
    rows = current_rows(frame, folder)[0] if frame is not None else pd.DataFrame()
    rows = rows[column(rows, "status", "").astype(str) == OK] if not rows.empty else rows
    if rows.empty:
        raise ConfigError(f"{folder / TRIALS_FILE} holds no ok row of the current space; allowed: a study with "
                          f"rows to continue")
    return rows


def latest_commit(folder: Path) -> str:
    """The git_commit of the ok row of the current space that finished last; ConfigError where it names no
    commit (a tree with edits, `+dirty`, or no git checkout): no checkout reproduces that code."""
    rows = ok_rows(folder)
    latest = rows.loc[unix_seconds(column(rows, "finished_at")).fillna(float("-inf")).idxmax()]
    commit = str(latest.get("git_commit", ""))
    if not COMMIT.fullmatch(commit):
        raise ConfigError(f"its latest row (seed {latest.get('seed')}, finished {latest.get('finished_at')}) has "
                          f"field 'git_commit' value {commit[:60]!r}; allowed: the 40 hex digits of a commit (a tree "
                          f"with edits, '+dirty', or no checkout: no commit reproduces its code)")
    return commit


def recorded_python(folder: Path) -> tuple[str, str]:
    """(major.minor, "") of the Python every ok row of the current space records (`python_version`), so the
    worktree's venv is made with the Python `constraints/tested.txt` was resolved for and the rows ran on; else
    ("", why): the rows disagree, record none, or record a value that is not a version (never put in a command)."""
    values = column(ok_rows(folder), "python_version", "").fillna("").astype(str).str.strip()
    found = [VERSION.fullmatch(v) for v in values if v]
    odd = sum(m is None for m in found)
    versions = sorted({(int(m[1]), int(m[2])) for m in found if m is not None})
    if odd:
        rows = f"{odd} row records" if odd == 1 else f"{odd} rows record"
        return "", f"{rows} a python_version that is not a version; allowed: e.g. 3.11.7"
    if not versions:
        return "", "its rows record no Python version"
    if len(versions) > 1:
        listed = ", ".join(f"{a}.{b}" for a, b in versions[:-1]) + f" and {versions[-1][0]}.{versions[-1][1]}"
        return "", f"its rows ran on Python {listed}"
    return f"{versions[0][0]}.{versions[0][1]}", ""


def branches_its_rungs(root: Path, source: str, folder: Path) -> bool:
    """Whether the space file at `source` in this checkout branches its rungs (`branch: epochs`); ConfigError
    where it is missing, does not load, or no longer lists exactly the trials of the folder's space.json."""
    return space_shape(root, source, folder)[0]


def space_shape(root: Path, source: str, folder: Path) -> tuple[bool, bool]:
    """(branches its rungs, is a budget ladder) of the space file at `source` in this checkout: `branch:
    epochs`; a train space at two or more `epochs` values (what analysis/budget_ladder.py reads as a ladder).
    ConfigError where it is missing, does not load, or no longer lists exactly the trials of space.json."""
    path = root / source
    if not path.is_file() or path.is_symlink():
        raise ConfigError(f"its space file {source!r} is not a regular file in this checkout; allowed: the space "
                          f"file its space.json names, as committed")
    space = load_space(path)  # SpaceError (a ConfigError) names what is wrong
    listed = space_keys(folder)
    if listed is not None and set(space.current_keys) != set(listed):
        raise ConfigError(f"its space file {source!r} lists {len(space.current_keys)} trials, not the "
                          f"{len(listed)} of its space.json; allowed: the space file its rows ran from")
    budgets = {repr(trial.get("epochs")) for trial in space.trials}
    return space.branch is not None, space.task == "train" and len(budgets) > 1


def continuation_text(c: Continuation) -> str:
    """results/README.md: one paragraph saying what is incomplete and where the commands run (the Python, the
    worktree's data folder), the commands as a code block, what the folder's lock does where the study still runs,
    then the commands at each stop."""
    planned = f" of the {c.planned} trials its space.json lists" if c.planned is not None else ""
    head = (f"Published before every declared item was complete: {code_span(c.folder)}, {c.incomplete} of its "
            f"{c.items} judged items without a verdict yet ({c.entries[0]} of {c.entries[1]} cell x rung entries "
            f"hold every declared seed; {c.ok} ok rows{planned}).")
    if c.why_not:
        return f"{head} No command continues it from here: {c.why_not}."
    where = (f"at the commit its latest row ran at ({c.commit[:7]}), from {code_span(c.source)}"
             + (", shorter rungs first (`--rungs-first`)" if c.rungs_first else ""))
    tree, study = f"../wt-{c.name}", f"{STUDIES}/{c.name}"
    python = (f"in Python {c.python}, as its rows ran" if c.python else
              f"with `python3` where the venv is made ({c.python_note}: choose the Python its rows should run on)")
    lock = (f"`sweep.py` locks {code_span(study + '/.sweep.lock')} before it starts anything: a second driver on the "
            f"same folder exits at once (code 2, naming the holder), so the sweep line never runs the study twice; "
            f"on the machine where it is still running, stop it first with `kill -INT` of its `sweep.py` (exit 130, "
            f"its rows and epoch checkpoints kept), since the lines before the sweep move {code_span(tree)} to this "
            f"commit and reinstall its venv.")
    judged = " and judged" + (" (its budget ladder too)" if c.ladder else "")
    return "\n".join([f"{head} Its rows continue {where}; from the root of a clone of this repository, {python} "
                      f"(add `--data-dir FOLDER` to the sweep line for a data folder other than `$RPEVIT_DATA` or "
                      f"{code_span(tree + '/data')}: the sweep runs in the worktree, so a relative FOLDER is read from "
                      f"there, e.g. `../shared/data` for a `shared/` beside the clone):", "",
                      *(f"    {line}" for line in c.commands()), "", lock, "",
                      "Then at each stop, back in the clone with its own environment, its rows so far into "
                      f"{code_span('results/' + c.folder)}{judged}:", "",
                      *(f"    {line}" for line in c.publish_commands())])


__all__ = ["Continuation", "branches_its_rungs", "check_folder", "continuation", "continuation_text", "latest_commit",
           "ok_rows", "recorded_python", "space_name_and_source", "space_shape"]
