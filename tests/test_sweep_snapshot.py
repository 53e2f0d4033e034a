"""rpevit/sweep/snapshot.py: a sweep's rows so far, copied whole while its driver writes. The copy holds
what the store's reader reads (compacted file and live parts, deduplicated), reads as a compacted folder
of its own, never holds a trial row without all its epoch rows even while a real writer (the driver's
ParquetResults, flushing, merging and compacting) runs beside it; refusals leave nothing written."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rpevit.sweep import snapshot as snapshot_cli
from rpevit.sweep import store
from rpevit.sweep.declaration import DECLARATION_FILE
from rpevit.sweep.results import EPOCHS_FILE, SPACE_FILE, TRIALS_FILE
from tests.test_results_store import append, brute, flushes, seen
from tests.test_results_store_sigkill import Lives, check_union, life


def sweep_folder(folder: Path, compact_after: int = 4) -> list[dict]:
    """A folder as a running driver leaves it: a compacted file of the first flushes, live parts of the
    rest (merged at fan-in 2), space.json and declaration.json beside them."""
    batches, log = flushes(), store.PartLog(folder)
    for i, batch in enumerate(batches, 1):
        append(log, batch)
        if i == compact_after:
            store.compact(folder)
            log = store.PartLog(folder)
    (folder / SPACE_FILE).write_text('{"name": "s", "trials": {}}')
    (folder / DECLARATION_FILE).write_text('{"question": "q?"}')
    return batches


def test_the_copy_holds_every_row_the_reader_sees_and_reads_as_a_compacted_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(store, "MERGE_FANIN", 2)
    source, dest = tmp_path / "sweep", tmp_path / "copy" / "sweep"
    source.mkdir()
    batches = sweep_folder(source)
    assert store.listed_parts(source, TRIALS_FILE) and (source / TRIALS_FILE).exists()  # both kinds of file
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}

    assert snapshot_cli.main([str(source), str(dest)]) == 0
    trials = brute(batches, TRIALS_FILE)
    ok = sum(status == "ok" for _, status, _ in trials)
    assert capsys.readouterr().out == (f"{source} -> {dest}: {len(trials)} trial row(s) ({ok} ok, {len(trials) - ok} "
                                       f"not ok), {len(brute(batches, EPOCHS_FILE))} epoch row(s), space.json, "
                                       f"declaration.json\n")
    for kind in store.KINDS:  # in the reader's order (compaction sorts the rows it holds)
        assert seen(dest, kind) == seen(source, kind) and sorted(seen(dest, kind)) == sorted(brute(batches, kind))
    assert sorted(p.name for p in dest.iterdir()) == sorted([TRIALS_FILE, EPOCHS_FILE, SPACE_FILE, DECLARATION_FILE])
    for name in (SPACE_FILE, DECLARATION_FILE):
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before  # the sweep is only read

    assert snapshot_cli.main([str(source), str(dest)]) == 0  # again, over its own copy: the same rows
    for kind in store.KINDS:
        assert seen(dest, kind) == seen(source, kind)


def begun_through(copy: Path, lives: Lives, writer: threading.Thread, timeout_s: float = 30.0) -> int:
    """`lives.begun` once the writer thread has parsed the `begin` line of every trial the copy holds rows of.

    A life says `begin n` before it writes trial n's rows, but the writer thread parses that line when it
    next reads the pipe, which can be after the copy took the rows: read at once, `lives.begun` lagged the
    copy and a row of trial 45 read as "never written" with begun 44 (seen once in 60 runs on 2 busy cores).
    Waiting for the line keeps the check as strict as it was: a row of a trial no life began still fails it."""
    keys = [key for kind in store.KINDS if (table := store.read_table(copy / kind)) is not None
            for key in table.column("trial_key").to_pylist()]
    highest = max((int(key, 16) for key in keys), default=0)
    deadline = time.monotonic() + timeout_s
    while lives.begun < highest and writer.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return lives.begun


@pytest.mark.slow
def test_copies_taken_while_a_real_writer_runs_hold_no_trial_row_without_its_epochs(tmp_path):
    """The driver's writer (tests/store_sigkill_writer.py, one life that is not killed before its work is
    done) writes 60 trials, merging parts and compacting every 5; meanwhile copies are taken back to back.
    Each copy holds every trial acknowledged before it began, each row once, and a trial row only with all
    its epoch rows (check_union, the checks the SIGKILL test makes of the store itself)."""
    folder = tmp_path / "sweep"
    folder.mkdir()
    lives = Lives(tmp_path / "writer.log")
    try:
        writer = threading.Thread(target=lives.run, args=(life(folder, "writer", trials=60, compact_every=5),))
        writer.start()
        copies = 0
        while writer.is_alive():
            acked = set(lives.acked)
            if not acked:
                continue
            dest = tmp_path / f"copy{copies}"
            snapshot_cli.snapshot(folder, dest)
            check_union(dest, acked, begun_through(dest, lives, writer))
            copies += 1
        writer.join()
    finally:
        lives.close()
    assert copies >= 5, copies  # the copies were taken while the writer ran, not after
    final = tmp_path / "final"
    snapshot_cli.snapshot(folder, final)
    check_union(final, set(range(1, 61)), 60)


def test_refusals_name_the_folder_and_write_nothing(tmp_path, capsys):
    source = tmp_path / "sweep"
    source.mkdir()
    sweep_folder(source)
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / store.PARTS_DIR).mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    cases = [([empty, tmp_path / "d1"], "holds no trials.parquet or epochs.parquet"),
             ([source, source], "is the sweep folder itself"),
             ([source, other], f"holds {store.PARTS_DIR}/, so it is a sweep's own folder"),
             ([source, a_file], "exists and is not a folder"),
             ([source, link], "is a symbolic link")]
    for argv, words in cases:
        assert snapshot_cli.main([str(a) for a in argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, (argv, err)
    assert not (tmp_path / "d1").exists() and not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in other.iterdir()) == [store.PARTS_DIR] and a_file.read_text() == "x"

    planted = tmp_path / "secret"
    planted.write_text("not the sweep's")
    (source / SPACE_FILE).unlink()
    os.symlink(planted, source / SPACE_FILE)  # a link inside the sweep folder: refused as a driver refuses it
    dest = tmp_path / "d2"
    assert snapshot_cli.main([str(source), str(dest)]) == 2
    err = capsys.readouterr().err
    assert "holds symbolic links (space.json ->" in err and err.count("\n") == 1, err
    assert not dest.exists()

    (source / SPACE_FILE).unlink()
    (source / SPACE_FILE).write_text("{}")
    dest.mkdir()
    os.symlink(planted, dest / TRIALS_FILE)  # a link where the copy writes: never written through
    assert snapshot_cli.main([str(source), str(dest)]) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and err.count("\n") == 1, err
    assert planted.read_text() == "not the sweep's"


RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
STUDY = next((folder for folder in (RESULTS_DIR / "cifar10_ladder40_cpu",  # published, else still running
                                    RESULTS_DIR / "in_progress" / "cifar10_ladder40_cpu")
              if (folder / TRIALS_FILE).is_file()), RESULTS_DIR / "cifar10_ladder40_cpu")


@pytest.mark.skipif(not (STUDY / TRIALS_FILE).is_file(), reason="the study's rows are not committed")
def test_the_committed_rows_of_the_running_study_resume_on_a_fresh_machine(tmp_path):
    """What RESUME.md (once published: results/README.md's continuation block) tells a fresh machine to do: copy
    the committed folder's four files into an empty results folder and `--resume`. Every committed row is a trial
    of the space as it stands (none set aside), the trials with a row are done (never trained again) and the rest
    pending, exactly."""
    import shutil

    from rpevit.sweep.plan import plan_sweep
    from rpevit.sweep.space import load_space

    fresh = tmp_path / "studies" / STUDY.name
    fresh.mkdir(parents=True)
    for name in (TRIALS_FILE, EPOCHS_FILE, SPACE_FILE, DECLARATION_FILE):
        shutil.copy2(STUDY / name, fresh / name)
    space = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / f"{STUDY.name}.yaml")
    plan = plan_sweep(space, fresh, resume=True, retry_failed=False, data_dir=str(tmp_path / "data"),
                      resources=space.resources)
    rows = store.read_table(fresh / TRIALS_FILE).to_pandas()
    done = set(rows.loc[rows["status"] == "ok", "trial_key"])
    assert done <= set(space.current_keys)  # no committed row is set aside as stale
    assert [space.keys[i] for i in plan.pending] == [k for k in space.keys if k not in done]
    assert len(plan.pending) == len(space.keys) - len(done)  # 0 once the last trial has its row
