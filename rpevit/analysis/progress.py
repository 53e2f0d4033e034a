"""How far a declared study still running has got: results/in_progress/<study>/PROGRESS.md, written by
`python analysis/answers.py results` from the rows committed at a stop.

Why: a study that runs for days is committed in pieces (rpevit.sweep.snapshot), and its RESUME.md used to
say by hand which cells and seeds had rows at each stop: a typed figure that went stale at the next
snapshot. This writes the same facts from the Parquet, and `answers.py --check` fails where the committed
file no longer agrees with the rows beside it.

What it counts is what the verdicts will use: the rows of the current space (space.json) that the
declaration in force admits (its seeds, started after it was recorded: confirmatory.usable_rows), so a
cell shown complete here is one confirmatory.md judges. The cells are the ones the declared families name,
in the order they first name them; the rungs are the values of the field the families are judged per
(`for_each`, or a trend's field) found in the rows or named by a trend. For a ladder, one more line says
whether each seed's rungs are one run up to their cool-down (budget_ladder.shared_epochs), as the declared
trend's pairing by seed assumes: a trunk trained again (its checkpoint lost with a machine) is checked
against the rungs it once branched.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from rpevit.analysis import budget_ladder, confirmatory
from rpevit.analysis.common import column, current_rows, markdown_table, read_sweep, space_keys
from rpevit.sweep.declaration import Declaration, redeclarations
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import TRIALS_FILE, unix_seconds

PROGRESS_FILE = "PROGRESS.md"


@dataclass(frozen=True)
class Progress:
    """A running declared study's rows so far. `cells`: per declared cell (its side dict), per rung value
    (None where the families are judged at one budget), the declared seeds with a usable ok row."""

    planned: int | None  # trials space.json lists (None: no space.json)
    ok: int
    failed: int
    set_aside: dict[str, int]
    rung_field: str | None
    rungs: tuple[Any, ...]
    cells: tuple[tuple[dict[str, Any], dict[Any, tuple[int, ...]]], ...]
    seeds: tuple[int, ...]
    last_finished: str  # UTC, minutes; "" without rows
    shared: budget_ladder.SharedEpochs | None = None  # a ladder's (rung_field "epochs"): its rungs' shared epochs

    @property
    def complete_cells(self) -> int:
        """Cell x rung entries that hold every declared seed."""
        return sum(len(have) == len(self.seeds) for _, per_rung in self.cells for have in per_rung.values())


def rung_field(decl: Declaration) -> str | None:
    """The field the families are judged per: the first for_each, else a trend's field (None: one budget)."""
    for fam in decl.families:
        if fam.for_each:
            return fam.for_each
    return next((fam.trend.field for fam in decl.families if fam.trend is not None), None)


def declared_cells(decl: Declaration) -> list[dict[str, Any]]:
    """Every cell the families name, once, in the order first named."""
    cells: list[dict[str, Any]] = []
    for fam in decl.families:
        for side in fam.sides():
            if dict(side) not in cells:
                cells.append(dict(side))
    return cells


def progress(folder: Path) -> Progress:
    """The rows so far of the declared study in `folder` (module docstring). DeclarationError where it
    declared nothing."""
    folder = Path(folder)
    record, entry = confirmatory.in_force(folder)
    decl: Declaration = entry["parsed"]
    keys = space_keys(folder)
    frame = read_sweep(folder / TRIALS_FILE, folder)
    frame = pd.DataFrame() if frame is None else current_rows(frame, folder)[0]
    status = column(frame, "status", "").astype(str) if not frame.empty else pd.Series(dtype=str)
    ok_rows = frame[status == OK] if not frame.empty else frame
    usable, set_aside = (confirmatory.usable_rows(ok_rows, decl, entry["recorded_at"],
                                                  bool(redeclarations(record)))
                         if not ok_rows.empty else (ok_rows, {}))
    field = rung_field(decl)
    found = set(pd.to_numeric(usable[field], errors="coerce").dropna().tolist()) if field and not usable.empty else set()
    named = {v for fam in decl.families if fam.trend is not None for v in (fam.trend.start, fam.trend.end)}
    rungs = tuple(sorted(found | named)) if field else (None,)
    cells = []
    for side in declared_cells(decl):
        per_rung = {}
        for rung in rungs:
            match = pd.Series(True, index=usable.index)
            for key, value in {**side, **({field: rung} if field else {})}.items():
                match &= column(usable, key).astype(str) == str(value)
            seeds = pd.to_numeric(usable.loc[match, "seed"], errors="coerce").dropna().astype(int)
            per_rung[rung] = tuple(sorted(set(seeds) & set(decl.seeds)))
        cells.append((side, per_rung))
    finished = unix_seconds(column(frame, "finished_at")).dropna() if not frame.empty else pd.Series(dtype=float)
    last = pd.Timestamp(finished.max(), unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M UTC") if len(finished) else ""
    shared = (budget_ladder.shared_epochs(usable, budget_ladder.trial_epoch_curves(folder))
              if field == "epochs" and not usable.empty else None)
    return Progress(len(keys) if keys is not None else None, len(ok_rows), int((status == FAILED).sum()),
                    {k: v for k, v in set_aside.items() if v}, field, rungs, tuple(cells), tuple(decl.seeds), last,
                    shared)


def seed_list_text(have: Sequence[int], declared: Sequence[int]) -> str:
    """'5–9 (5 of 5)', '5, 6, 7 (3 of 5)', '—' for none."""
    if not have:
        return "—"
    run = list(have) == list(range(have[0], have[-1] + 1)) and len(have) > 2
    listed = f"{have[0]}–{have[-1]}" if run else ", ".join(map(str, have))
    return f"{listed} ({len(have)} of {len(declared)})"


def progress_text(p: Progress, name: str) -> str:
    """PROGRESS.md's body (generated.whole_file adds the line saying how it is written)."""
    rung_name = lambda r: "rows" if r is None else confirmatory.md_text(f"{p.rung_field} = {confirmatory.fmt(r)}")  # noqa: E731
    planned = f" of the {p.planned} trials its space.json lists" if p.planned is not None else ""
    aside = "; ".join(f"{n} {why}" for why, n in p.set_aside.items())
    lines = [f"# {confirmatory.md_text(name)}: rows so far (a declared study still running)", "",
             f"{p.ok} ok and {p.failed} failed row(s){planned}"
             + (f", the last finished {p.last_finished}" if p.last_finished else "") + ". "
             f"{p.complete_cells} of {len(p.cells) * len(p.rungs)} cell x rung entries hold every declared seed "
             f"({', '.join(map(str, p.seeds))}); an item is judged once every cell it uses does (a gap: its two "
             f"cells; a contrast of gaps: its four; a trend: its two cells at both ends), until then `confirmatory.md` "
             f"reads it \"incomplete\"."
             + (f" Rows not counted (confirmatory.usable_rows): {aside}." if aside else ""), "",
             "Each entry: the declared seeds with a row the verdicts will use.", "",
             markdown_table(["cell", *map(rung_name, p.rungs)],
                            [[confirmatory.short_label(side), *(seed_list_text(per_rung[r], p.seeds) for r in p.rungs)]
                             for side, per_rung in p.cells])]
    if p.shared is not None:
        lines += ["", "Are a seed's rungs one run up to their cool-down (the declared trend pairs them by seed)? "
                  + budget_ladder.shared_epochs_text(p.shared)]
    return "\n".join(lines)


__all__ = ["PROGRESS_FILE", "Progress", "declared_cells", "progress", "progress_text", "rung_field", "seed_list_text"]
