"""Every lease's rows of a declared rung study read as ONE study.

    python benchmarks/lease/merge_rungs.py                         # every results/gpu_*/lease_*/cifar10_rungs_gpu
    python benchmarks/lease/merge_rungs.py --name cifar10_rungs_gpu --into results/cifar10_rungs_gpu [FOLDER ...]

Why: a GPU lease runs one rung (or half of one) of search_spaces/cifar10_rungs_gpu.yaml on a fresh machine and
brings its rows back (benchmarks/gpu_lease.sh rung: trials.parquet, epochs.parquet, space.json,
declaration.json), committed under results/gpu_<kind>/lease_<date>/cifar10_rungs_gpu/. The analysis reads one
sweep folder, so this writes the union into results/cifar10_rungs_gpu/, which `python analysis/confirmatory.py`
and `python analysis/budget_ladder.py` then read with every rung. Rungs may come from an H100 or an H200 lease
(a half rung's two attentions even from different devices): every row keeps its device_name, and
merged_from.json says which lease brought which rows on which device.

What the merge keeps, and refuses (one line naming the folder, the value and what is allowed; nothing written):
- the declaration: the first recorded one, i.e. the merged folder's declaration.json where it exists (the
  leases after the first seed it into their sweep folder: gpu_lease.sh), else the lease's whose entry was
  recorded first, copied byte for byte. A lease whose declaration.json holds another declaration (another
  sha256) or a redeclaration is refused: its rows answered another question, or started under another one.
- the space: every lease's space.json lists the whole study's trial keys (sweep.py --only keeps them); one
  that lists other keys ran another space (a --set, an edited YAML) and is refused.
- the rows: each trial key once, rebuilt from the lease folders each time (so merging again changes
  nothing), with the rows already merged kept where no lease folder given holds their key. A key two leases
  both ran keeps the `ok` row before any other, then the one that started first; the other is set aside and
  named (not a silent second look). The same row seen twice (the same start) is one row. A trial's epoch rows
  come from the folder whose trial row is kept (a trial cut before its row was written: the first with rows).
Standard Parquet files of the results store's schema are written atomically (rpevit.sweep.results).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from rpevit.config import ConfigError  # noqa: E402
from rpevit.sweep import store  # noqa: E402
from rpevit.sweep.declaration import (AFTER_TRIALS, DECLARATION_FILE, DeclarationError,  # noqa: E402
                                      read_record)
from rpevit.sweep.protocol import OK  # noqa: E402
from rpevit.sweep.space import SpaceError, check_name  # noqa: E402
from rpevit.sweep.results import (EPOCHS_FILE, SPACE_FILE, TRIALS_FILE, DamagedResults,  # noqa: E402
                                  read_regular_bytes, read_space_file, unix_seconds, write_table_atomic,
                                  write_text_atomic)

NAME = "cifar10_rungs_gpu"
SOURCES_FILE = "merged_from.json"
LIVE_MARKS = ("parts", ".sweep.lock", "trials")  # a sweep's own folder: never merged into
MAX_DECLARATION_BYTES = 2**20  # a declaration.json copied into the merged folder: far above any real one


class MergeError(Exception):
    """A lease folder (or the merged one) that cannot be merged; the message is one line."""


@dataclass
class Source:
    """One folder of rows: a lease's, or the merged folder itself (the rows merged before)."""
    folder: Path
    record: dict[str, Any] | None
    keys: list[str] | None
    trials: pa.Table | None
    epochs: pa.Table | None
    taken: list[int] = field(default_factory=list)  # rows of `trials` kept
    space: dict[str, Any] | None = None  # its space.json as read (and checked) once, written to the merged folder


def read_source(folder: Path, need_declaration: bool = True) -> Source:
    """A folder's declaration record, space keys and rows, each checked as the analysis checks them."""
    if not folder.is_dir():
        raise MergeError(f"{folder}: not a folder; allowed: a lease's folder of rows (trials.parquet, space.json, "
                         f"declaration.json)")
    try:
        record = read_record(folder)
    except DeclarationError as err:
        raise MergeError(str(err)) from None
    if record is None and need_declaration:
        raise MergeError(f"{folder}: no {DECLARATION_FILE}; allowed: a lease folder as gpu_lease.sh rung brings it "
                         f"back (the sweep records the declaration before its first trial)")
    try:  # came back from another machine: a regular file only (no link followed, no FIFO waited on), keys str
        space = read_space_file(folder)
    except ConfigError as err:  # names the file, what is wrong and what is allowed
        raise MergeError(" ".join(str(err).split())) from None
    except OSError as err:  # unreadable (permissions): one line all the same
        raise MergeError(f"{folder / SPACE_FILE}: unreadable ({type(err).__name__}: {err.strerror or err}); allowed: "
                         f"the space.json sweep.py wrote") from None
    keys = None if space is None else space["trial_keys"]
    if keys is None and need_declaration:
        raise MergeError(f"{folder}: no {SPACE_FILE}; allowed: a lease folder as gpu_lease.sh rung brings it back")
    try:
        trials, epochs = store.read_table(folder / TRIALS_FILE), store.read_table(folder / EPOCHS_FILE)
    except DamagedResults as err:
        raise MergeError(str(err)) from None
    return Source(folder, record, keys, trials, epochs, space=space)


def declaration_text(folder: Path) -> str:
    """The declaration.json read_record checked, read again for its byte-for-byte copy: a regular file only."""
    path = folder / DECLARATION_FILE
    try:
        data = read_regular_bytes(path, MAX_DECLARATION_BYTES, "the declaration.json the sweep wrote")
        if data is None:
            raise MergeError(f"{path}: gone while merging; allowed: the declaration.json the sweep wrote")
        return data.decode("utf-8")
    except ConfigError as err:
        raise MergeError(" ".join(str(err).split())) from None
    except (OSError, UnicodeDecodeError) as err:
        raise MergeError(f"{path}: unreadable ({type(err).__name__}); allowed: the declaration.json the sweep "
                         f"wrote") from None


def first_entry(source: Source) -> dict[str, Any]:
    return source.record["declarations"][0]


def reference(merged: Source, leases: list[Source]) -> Source:
    """Whose declaration the study keeps: the merged folder's, else the lease's recorded first."""
    if merged.record is not None:
        return merged
    return min(leases, key=lambda s: (first_entry(s)["recorded_at"], str(s.folder)))


def check_declaration(source: Source, ref: Source) -> None:
    """Every entry of the source's declaration.json is the reference's declaration, none a redeclaration."""
    want = first_entry(ref)["sha256"]
    for i, entry in enumerate(source.record["declarations"]):
        if entry["sha256"] != want:
            raise MergeError(f"{source.folder / DECLARATION_FILE}: declarations[{i}].sha256 is {entry['sha256'][:16]}..., "
                             f"the study's ({ref.folder / DECLARATION_FILE}) is {want[:16]}...: its rows ran under "
                             f"another declaration; allowed: leases of the declaration recorded first (move this "
                             f"folder out of the merge)")
        if entry.get(AFTER_TRIALS):
            raise MergeError(f"{source.folder / DECLARATION_FILE}: declarations[{i}] was recorded after trials began "
                             f"(--redeclare); allowed: a declaration recorded before the lease's first trial")


def check_space(source: Source, ref_keys: list[str], ref_folder: Path) -> None:
    if source.keys is not None and set(source.keys) != set(ref_keys):
        extra = sorted(set(source.keys) - set(ref_keys))
        raise MergeError(f"{source.folder / SPACE_FILE}: {len(source.keys)} trial keys, {len(extra)} of them not the "
                         f"study's ({ref_folder / SPACE_FILE}: {len(ref_keys)}), e.g. {extra[:2]}: rows of another "
                         f"space (a --set, an edited YAML); allowed: leases of one space")


def started(table: pa.Table) -> list[float]:
    import pandas as pd

    if "started_at" not in table.column_names:
        return [float("nan")] * table.num_rows
    return unix_seconds(pd.Series(table.column("started_at").to_pandas())).tolist()


def choose_rows(sources: list[Source]) -> list[str]:
    """Mark in each source the trial rows kept (one per key); return a line per row set aside."""
    seen: dict[str, list[tuple[int, int, bool, float]]] = {}
    for s, source in enumerate(sources):
        if source.trials is None:
            continue
        status = source.trials.column("status").to_pylist()
        for i, (key, at) in enumerate(zip(source.trials.column("trial_key").to_pylist(), started(source.trials))):
            seen.setdefault(key, []).append((s, i, status[i] == OK, at))
    aside = []
    for key, rows in seen.items():
        rows.sort(key=lambda r: (not r[2], r[3] if r[3] == r[3] else float("inf"), r[0]))
        s, i, ok, at = rows[0]
        sources[s].taken.append(i)
        for s2, i2, ok2, at2 in rows[1:]:
            if at2 == at and ok2 == ok:
                continue  # the same row, merged before and brought again
            aside.append(f"trial {key}: the row of {sources[s2].folder} ({'ok' if ok2 else 'not ok'}, started at "
                         f"{at2:.0f}) set aside; kept the row of {sources[s].folder} ({'ok' if ok else 'not ok'}, "
                         f"started at {at:.0f})")
    return aside


def epoch_rows(sources: list[Source]) -> list[pa.Table]:
    """Each trial's epoch rows from the source whose trial row is kept; a key without a trial row anywhere
    from the first source holding epoch rows of it."""
    import pyarrow.compute as pc

    owner: dict[str, int] = {}
    for s, source in enumerate(sources):
        if source.trials is not None:
            keys = source.trials.column("trial_key").to_pylist()
            owner.update({keys[i]: s for i in source.taken})
    for s, source in enumerate(sources):
        if source.epochs is not None:
            for key in source.epochs.column("trial_key").to_pylist():
                owner.setdefault(key, s)
    out = []
    for s, source in enumerate(sources):
        if source.epochs is not None:
            mine = pa.array(sorted(k for k, o in owner.items() if o == s), type=pa.string())
            out.append(source.epochs.filter(pc.is_in(source.epochs.column("trial_key").cast(pa.string()), mine)))
    return [t for t in out if t.num_rows]


def devices(table: pa.Table | None, rows: list[int]) -> list[str]:
    if table is None or "device_name" not in table.column_names or not rows:
        return []
    names = table.column("device_name").to_pylist()
    return sorted({str(names[i]) for i in rows if names[i] is not None})


def default_sources(name: str) -> list[Path]:
    return sorted((ROOT / "results").glob(f"gpu_*/lease_*/{name}"), key=lambda p: (p.parent.name, p.parent.parent.name))


def merge(into: Path, folders: list[Path]) -> dict[str, Any]:
    """Check every folder, choose the rows, write the merged folder; returns what merged_from.json records."""
    if not folders:
        raise MergeError(f"no lease folders to merge; allowed: folders such as results/gpu_h100/lease_<date>/{into.name}")
    for mark in LIVE_MARKS:
        if (into / mark).exists():
            raise MergeError(f"--into {into}: holds {mark} (a running or stopped sweep's own folder); allowed: a folder "
                             f"only this tool writes")
    merged = read_source(into, need_declaration=False) if into.exists() else Source(into, None, None, None, None)
    leases = [read_source(folder.resolve()) for folder in folders if folder.resolve() != into.resolve()]
    ref = reference(merged, leases)
    ref_keys = merged.keys if merged.keys is not None else ref.keys
    for lease in leases:
        check_declaration(lease, ref)
        check_space(lease, ref_keys, ref.folder if merged.keys is None else into)
    sources = [*leases, merged]  # the rows merged before come last: a lease folder's own row wins a tie
    aside = choose_rows(sources)
    trials = [s.trials.take(pa.array(sorted(s.taken), type=pa.int64())) for s in sources if s.trials is not None and s.taken]
    declared = declaration_text(ref.folder) if ref is not merged else None  # read before anything is written
    into.mkdir(parents=True, exist_ok=True)
    epochs = epoch_rows(sources)
    if epochs:
        write_table_atomic(store.union(epochs, EPOCHS_FILE), into / EPOCHS_FILE)
    if trials:
        write_table_atomic(store.union(trials, TRIALS_FILE), into / TRIALS_FILE)
    space = merged.space if merged.keys is not None else ref.space  # as read_source read and checked it
    write_text_atomic(into / SPACE_FILE, json.dumps(space, indent=1))
    if declared is not None:
        write_text_atomic(into / DECLARATION_FILE, declared)
    report = {"declaration_sha256": first_entry(ref)["sha256"], "set_aside": aside, "sources": [
        {"folder": os.path.relpath(s.folder, ROOT), "trial_rows": len(s.taken), "devices": devices(s.trials, s.taken)}
        for s in leases], "kept_from_before": len(merged.taken)}
    write_text_atomic(into / SOURCES_FILE, json.dumps(report, indent=1))
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="lease folders (default: results/gpu_*/lease_*/NAME)")
    parser.add_argument("--name", default=NAME, help="the study (its sweep folder's name)")
    parser.add_argument("--into", type=Path, default=None, help="the merged folder (default results/NAME)")
    args = parser.parse_args(argv)
    try:  # --name becomes results/NAME and a glob: one folder name only (sweep.py's rule), else '../x' leaves results/
        check_name(args.name, "--name")
    except SpaceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    into = args.into or ROOT / "results" / args.name
    folders = args.folders or default_sources(args.name)
    try:
        report = merge(into, folders)
    except MergeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = sum(s["trial_rows"] for s in report["sources"]) + report["kept_from_before"]
    print(f"{into}: {rows} trial row(s) from {len(report['sources'])} lease folder(s) "
          + "; ".join(f"{s['folder']} {s['trial_rows']} ({', '.join(s['devices']) or 'no device named'})"
                      for s in report["sources"])
          + f"; {report['kept_from_before']} kept from the folder's earlier merge; declaration "
            f"{report['declaration_sha256'][:16]}...; {len(report['set_aside'])} row(s) set aside")
    for line in report["set_aside"]:
        print(f"  set aside: {line}")
    return 0


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool  # the teardown can abort (rpevit/tool_exit.py)

    run_tool(lambda: main(sys.argv[1:]))
