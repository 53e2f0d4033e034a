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
  (the file changed since the rows ran: a resume from it would set rows aside, not continue them).

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
    why_not: str = ""  # where there are no commands: why (inert Markdown)

    def commands(self) -> list[str]:
        """The shell lines, from the clone's root: the working folder, the pinned worktree, the sweep."""
        if self.why_not:
            return []
        study, tree = f"{STUDIES}/{self.name}", f"../wt-{self.name}"
        flags = " --rungs-first" if self.rungs_first else ""
        return [f"[ -e {study} ] || {{ mkdir -p {STUDIES} && cp -r results/{self.folder} {study}; }}",
                f"[ -e {tree} ] || git worktree add --detach {tree} {self.commit}",
                f"cd {tree} && git checkout -q --detach {self.commit}",
                "python3 -m venv .venv && . .venv/bin/activate && pip install -e . -c constraints/tested.txt",
                f"python sweep.py --space {self.source} --results-dir {STUDIES} --resume{flags}"]

    def publish_commands(self) -> list[str]:
        """Back in the clone (its own environment), at each stop: the rows so far into results/, judged."""
        return [f"python -m rpevit.sweep.snapshot {STUDIES}/{self.name} results/{self.folder}",
                f"python analysis/confirmatory.py results/{self.folder}", "python analysis/answers.py results"]


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
        rungs_first = branches_its_rungs(results_dir.parent, source, folder)
    except ConfigError as err:
        return replace(known, why_not=confirmatory.md_text(str(err)))
    return replace(known, name=name, source=source, commit=commit, rungs_first=rungs_first)


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


def latest_commit(folder: Path) -> str:
    """The git_commit of the ok row of the current space that finished last; ConfigError where it names no
    commit (a tree with edits, `+dirty`, or no git checkout): no checkout reproduces that code."""
    frame = read_sweep(folder / TRIALS_FILE, folder)
    rows = current_rows(frame, folder)[0] if frame is not None else pd.DataFrame()
    rows = rows[column(rows, "status", "").astype(str) == OK] if not rows.empty else rows
    if rows.empty:
        raise ConfigError(f"{folder / TRIALS_FILE} holds no ok row of the current space; allowed: a study with "
                          f"rows to continue")
    latest = rows.loc[unix_seconds(column(rows, "finished_at")).fillna(float("-inf")).idxmax()]
    commit = str(latest.get("git_commit", ""))
    if not COMMIT.fullmatch(commit):
        raise ConfigError(f"its latest row (seed {latest.get('seed')}, finished {latest.get('finished_at')}) has "
                          f"field 'git_commit' value {commit[:60]!r}; allowed: the 40 hex digits of a commit (a tree "
                          f"with edits, '+dirty', or no checkout: no commit reproduces its code)")
    return commit


def branches_its_rungs(root: Path, source: str, folder: Path) -> bool:
    """Whether the space file at `source` in this checkout branches its rungs (`branch: epochs`); ConfigError
    where it is missing, does not load, or no longer lists exactly the trials of the folder's space.json."""
    path = root / source
    if not path.is_file() or path.is_symlink():
        raise ConfigError(f"its space file {source!r} is not a regular file in this checkout; allowed: the space "
                          f"file its space.json names, as committed")
    space = load_space(path)  # SpaceError (a ConfigError) names what is wrong
    listed = space_keys(folder)
    if listed is not None and set(space.current_keys) != set(listed):
        raise ConfigError(f"its space file {source!r} lists {len(space.current_keys)} trials, not the "
                          f"{len(listed)} of its space.json; allowed: the space file its rows ran from")
    return space.branch is not None


def continuation_text(c: Continuation) -> str:
    """results/README.md: one paragraph saying what is incomplete, then the commands as a code block."""
    planned = f" of the {c.planned} trials its space.json lists" if c.planned is not None else ""
    head = (f"Published before every declared item was complete: {code_span(c.folder)}, {c.incomplete} of its "
            f"{c.items} judged items without a verdict yet ({c.entries[0]} of {c.entries[1]} cell x rung entries "
            f"hold every declared seed; {c.ok} ok rows{planned}).")
    if c.why_not:
        return f"{head} No command continues it from here: {c.why_not}."
    where = (f"at the commit its latest row ran at ({c.commit[:7]}), from {code_span(c.source)}"
             + (", shorter rungs first (`--rungs-first`)" if c.rungs_first else ""))
    return "\n".join([f"{head} Its rows continue {where}; from the root of a clone of this repository (add "
                      f"`--data-dir FOLDER` for a data folder other than `$RPEVIT_DATA` or `./data`):", "",
                      *(f"    {line}" for line in c.commands()), "",
                      "then at each stop, back in the clone with its own environment, its rows so far into "
                      f"{code_span('results/' + c.folder)} and judged:", "",
                      *(f"    {line}" for line in c.publish_commands())])


__all__ = ["Continuation", "branches_its_rungs", "check_folder", "continuation", "continuation_text", "latest_commit",
           "space_name_and_source"]
