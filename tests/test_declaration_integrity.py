"""The adversary's fourth round (issue 59, items 2-4) on declared studies:

2. a declaration recorded after trials began counts as a redeclaration even where no trial row exists yet
   (trials killed with epoch rows and checkpoints): the driver refuses it without --redeclare, and with it
   the rows resumed after it are set aside;
3. a hand-edited declaration.json (its stored sha256 no longer its declaration's digest, a moved time) is
   refused in one line, by the analysis and by --resume;
4. a redeclared study says so, with what changed and when, in every text written from it: confirmatory.md,
   ANSWERS.md's section, the README's block, results/README.md's declared-studies block, the report's note.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpevit.analysis import answers, answers_blocks, answers_sources, answers_wording, confirmatory
from rpevit.checkpoint import CHECKPOINT_NAME
from rpevit.sweep import declaration, session, store
from rpevit.sweep.declaration import DECLARATION_FILE, DeclarationError, parse
from rpevit.sweep.protocol import EPOCH, Report
from rpevit.sweep.runner import SweepOptions, execute_sweep
from rpevit.sweep.space import expand_space, load_space
from rpevit.sweep.writer import ParquetResults
from tests.analysis_rows import write_sweep
from tests.test_declaration import DECLARE, SPACE, rows

ROOT = Path(__file__).resolve().parents[1]


def killed_trials(folder: Path, space, n: int = 2, epochs: int = 3) -> list[str]:
    """What a driver killed mid-run leaves: n trials' epoch rows (flushed parts), their checkpoints, no trial row."""
    configs = dict(zip(space.keys, space.trials))
    writer = ParquetResults(folder, space.name, configs, {k: i for i, k in enumerate(space.keys)})
    keys = list(configs)[:n]
    for i, key in enumerate(keys):
        for epoch in range(epochs):
            writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"),
                                   Report(EPOCH, key, {"epoch": epoch, "train_loss": 1.0}).to_tune())
        (folder / "trials" / key).mkdir(parents=True)
        (folder / "trials" / key / CHECKPOINT_NAME).write_bytes(b"not read here")
    writer.flush()
    return keys


def undeclared_space():
    return expand_space({k: v for k, v in SPACE.items() if k != "declare"}, source="x.yaml")


# ---------------------------------------------------------------- 2. "before" means before any trial began
def test_trials_began_counts_epoch_rows_and_trial_folders_not_only_trial_rows(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "space.json").write_text("{}")
    assert declaration.trials_began(folder) == []
    killed_trials(folder, undeclared_space())
    found = declaration.trials_began(folder)
    assert not any(f.startswith("trial rows") for f in found)  # no trial row was written
    assert found[0].endswith("row part(s) under parts/") and found[1] == "2 trial folder(s) under trials/ (logs, checkpoints)"
    assert set(p.name.split("-")[0] for p in (folder / store.PARTS_DIR).iterdir()) == {"epochs"}
    store.compact(folder)  # the driver compacts what a killed one left before it records the declaration
    assert declaration.trials_began(folder) == ["epoch rows (epochs.parquet)",
                                                "2 trial folder(s) under trials/ (logs, checkpoints)"]
    assert declaration.PARTS_DIR == store.PARTS_DIR
    only_folder = tmp_path / "e"
    (only_folder / "trials" / "k").mkdir(parents=True)  # a trial that started and was killed before its first epoch
    assert declaration.trials_began(only_folder) == ["1 trial folder(s) under trials/ (logs, checkpoints)"]


def test_the_driver_refuses_a_declaration_added_after_trials_were_killed(tmp_path, monkeypatch):
    """The adversary killed trials (epoch rows, checkpoints, no trial row), then added a declare: block: the
    driver recorded it without --redeclare, and 2 rows whose first 3 epochs predated it counted."""
    def no_ray(*_args):
        raise RuntimeError("Ray would start: the declaration was accepted")
    monkeypatch.setattr(session, "import_ray", no_ray)
    monkeypatch.setattr(session, "prefer_loopback", lambda *_args: None)
    space = expand_space(SPACE, source="x.yaml")
    folder = tmp_path / space.name
    killed_trials(folder, undeclared_space())
    with pytest.raises(DeclarationError, match=r"declare block was added after trials of this sweep ran \(found: "
                                               r"epoch rows \(epochs.parquet\); 2 trial folder\(s\).*allowed: .*--redeclare"):
        execute_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False, resume=True))
    assert not (folder / DECLARATION_FILE).exists()
    with pytest.raises(RuntimeError, match="Ray would start"):  # with --redeclare: recorded, marked so
        execute_sweep(space, SweepOptions(results_dir=tmp_path, dashboard=False, resume=True, redeclare=True))
    (entry,) = json.loads((folder / DECLARATION_FILE).read_text())["declarations"]
    assert entry[declaration.AFTER_TRIALS] is True


def test_rows_resumed_after_a_declaration_recorded_once_trials_began_are_set_aside(tmp_path):
    """A first declaration recorded with --redeclare after trials began: a resumed row's started_at is its
    restart, its earlier epochs predate the declaration, so it is not confirmatory (and the text says why)."""
    folder = tmp_path / "d"
    folder.mkdir()
    line = declaration.record(folder, parse(DECLARE, "x"), rows_exist=["epoch rows"], redeclare=True)
    assert "a redeclaration: rows that started before it are exploratory" in line
    resumed = [{**r, "resumed_from_epoch": 3} if r["seed"] == 0 and r["pe"] == "ape" else r
               for r in rows(time.time() + 10)]
    write_sweep(folder, "d", resumed)
    _, _, _, set_aside = confirmatory.judge(folder)
    assert set_aside["resumed after a redeclaration (earlier epochs may predate it)"] == 2
    text = confirmatory.build(folder)
    assert "Rows set aside: none" not in text and "2 (resumed after a redeclaration" in text
    assert text.startswith("**Redeclared.** The study was redeclared with `sweep.py --redeclare`: ")
    assert "declared after trials of the sweep had begun" in text


def test_a_changed_declaration_with_no_trial_yet_says_when_it_was_recorded(tmp_path):
    declaration.record(tmp_path, parse(DECLARE, "x"), rows_exist=[], redeclare=False)
    with pytest.raises(DeclarationError, match=r"changed after it was recorded \(declaration.json, \d{4}-"):
        declaration.record(tmp_path, parse({**DECLARE, "alpha": 0.1}, "x"), rows_exist=[], redeclare=False)


# ---------------------------------------------------------------- 3. a hand-edited declaration.json
def edit(folder: Path, change) -> None:
    path = folder / DECLARATION_FILE
    record = json.loads(path.read_text())
    change(record["declarations"][-1])
    path.write_text(json.dumps(record, indent=1))


def declared_study(folder: Path, declare: dict = DECLARE) -> Path:
    folder.mkdir(parents=True)
    declaration.record(folder, parse(declare, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, folder.name, rows(time.time() + 10))
    return folder


def test_a_raised_alpha_is_refused_by_the_analysis_and_by_resume(tmp_path):
    """alpha raised to 0.45 by hand flipped a verdict to 'resolved', and --resume accepted the file."""
    folder = declared_study(tmp_path / "d")
    edit(folder, lambda e: e["declaration"].update(alpha=0.45))
    for read in (declaration.read_record, confirmatory.judge, confirmatory.build):
        with pytest.raises(DeclarationError, match=r"declaration.json: declarations\[0\].sha256 has value '[0-9a-f]{64}', "
                                                   r"but the declaration it records hashes to '[0-9a-f]{64}': the file "
                                                   r"was edited .*; allowed: the file the driver wrote") as err:
            read(folder)
        assert "\n" not in str(err.value)
    with pytest.raises(DeclarationError, match="sha256 has value"):  # sweep.py --resume with the space unchanged
        declaration.record(folder, parse(DECLARE, "x"), rows_exist=["trial rows"], redeclare=False)
    note = confirmatory.exploratory_note([folder])
    assert "cannot be used makes nothing of its study confirmatory: d (refused: " in note
    assert "Declared before their runs" not in note


def test_the_answers_stop_in_one_line_on_a_hand_edited_declaration(tmp_path):
    folder = declared_study(tmp_path / "results" / "headline")
    edit(folder, lambda e: e["declaration"].update(alpha=0.45))
    with pytest.raises(SystemExit) as err:
        answers.main([str(tmp_path / "results"), "--check"])
    assert str(err.value).startswith("error: ") and "declarations[0].sha256 has value" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(answers_sources.AnswersError, match="sha256 has value"):
        answers_wording.exploratory(["headline"], tmp_path / "results")


@pytest.mark.parametrize("change, match", [
    (lambda e: e.update(recorded_at=e["recorded_at"] - 3600), r"recorded_at_utc has value '.*'; allowed: the time of "
                                                              r"its recorded_at"),
    (lambda e: e.update(recorded_at="soon"), r"recorded_at has value 'soon'; allowed: Unix seconds"),
    (lambda e: e.update(recorded_at_utc="<b>x</b>"), r"recorded_at_utc has value '<b>x</b>'"),
    (lambda e: e.update(after_trials_began="no"), r"after_trials_began has value 'no'; allowed: true or false"),
    (lambda e: e.update(note="mine"), r"declarations\[0\] has keys .*'note'.*; allowed: sha256, recorded_at"),
    (lambda e: e["declaration"]["seeds"].pop(), r"sha256 has value"),
    (lambda e: e["declaration"].update(alpha=0.9), r"declarations\[0\].declaration: 'declare.alpha' has value 0.9"),
])
def test_each_hand_edit_is_refused_in_one_line(tmp_path, change, match):
    folder = declared_study(tmp_path / "d")
    edit(folder, change)
    with pytest.raises(DeclarationError, match=match) as err:
        declaration.read_record(folder)
    assert "\n" not in str(err.value)


def test_the_committed_declarations_verify_and_every_declared_space_round_trips_its_digest():
    """The committed studies (and the ones running from pinned worktrees, whose records the same code wrote)
    must still read and resume: a declaration's digest is unchanged through declaration.json."""
    for study in ("mnist_headline_cpu", "cifar10_ladder_cpu"):
        record = declaration.read_record(ROOT / "results" / study)
        assert record is not None and declaration.redeclarations(record) == []
    spaces = [p for p in sorted((ROOT / "search_spaces").glob("*.yaml")) if "\ndeclare:" in p.read_text()]
    assert len(spaces) >= 3
    for path in spaces:
        decl = load_space(path).declaration
        again = parse(json.loads(json.dumps(decl.to_dict())), "declaration.json")
        assert again == decl and again.digest() == decl.digest(), path.name


# ---------------------------------------------------------------- 4. a redeclaration is shown everywhere
def redeclared_study(folder: Path) -> Path:
    """Declared with seeds 0, 1, then seeds 2 added after a look (--redeclare) with a family added."""
    folder.mkdir(parents=True)
    declaration.record(folder, parse({**DECLARE, "seeds": [0, 1]}, "x"), rows_exist=False, redeclare=False)
    added = {**DECLARE["families"][0], "name": "<b>more</b> [x](http://e.example)"}
    later = {**DECLARE, "families": [*DECLARE["families"], added]}
    declaration.record(folder, parse(later, "x"), rows_exist=["trial rows"], redeclare=True)
    write_sweep(folder, folder.name, rows(time.time() + 10))
    return folder


def test_changes_names_what_a_redeclaration_changed():
    old = parse(DECLARE, "x")
    new = parse({**DECLARE, "seeds": [0, 1, 2, 3], "alpha": 0.1, "metric": "test_acc", "question": "q?",
                 "families": [{**DECLARE["families"][0], "comparisons": DECLARE["families"][0]["comparisons"][:1]},
                              {**DECLARE["families"][0], "name": "other"}]}, "x")
    assert declaration.changes(old, new) == [
        "question changed", "metric judged → test_acc", "seeds 0, 1, 2 → 0, 1, 2, 3 (added 3)", "alpha 0.05 → 0.1",
        "family 'other' added", "family 'gap': its comparisons changed"]
    assert declaration.changes(new, old)[-2:] == ["family 'other' removed", "family 'gap': its comparisons changed"]


def test_a_redeclared_study_says_so_with_what_changed_and_when_in_every_text(tmp_path):
    """Seeds added after a look read as a plain confirmatory study; a study redeclared after finished runs was
    labelled "Declared before their runs"."""
    results = tmp_path / "results"
    folder = redeclared_study(results / "headline")
    record = declaration.read_record(folder)
    first, second = (declaration.utc_text(e["recorded_at"]) for e in record["declarations"])
    change = (f"first declared {first}; {second}: seeds 0, 1 → 0, 1, 2 (added 2), family '&lt;b&gt;more&lt;/b&gt; "
              f"\\[x\\](http\\://e.example)' added, recorded after trials of the sweep had begun")
    said = f"redeclared with `sweep.py --redeclare`: {change}"
    assert confirmatory.redeclared_text(record) == said
    table = confirmatory.build(folder)  # confirmatory.md
    assert table.startswith(f"**Redeclared.** The study was {said}. The declaration in force")
    for detail in (True, False):  # ANSWERS.md's section; the README's block
        text = "\n".join(answers.declared_section(answers_sources.Sources(results), detail=detail))
        assert f"- `headline` (confirmatory over the rows that started after its last declaration; {said}): " in text
    block = answers_blocks.declared_studies_block(answers_sources.Sources(results))  # results/README.md
    assert f"Declared, then redeclared, so confirmatory only over the rows that started after its last declaration " \
           f"(every earlier row is exploratory; its `confirmatory.md` says what changed): `headline` ({said})." in block
    assert "Declared its comparisons before it ran" not in block
    assert "`headline` was redeclared (`sweep.py --redeclare`" in answers_wording.exploratory(["headline"], results)
    note = confirmatory.exploratory_note([folder])  # report.md
    assert f"headline ({said})" in note and "Declared before their runs" not in note
    everything = "\n".join([table, block, note,
                            *answers.declared_section(answers_sources.Sources(results), detail=True)])
    assert "<b>" not in everything and "[x]" not in everything


def test_a_redeclared_study_still_running_says_so(tmp_path):
    results = tmp_path / "results"
    redeclared_study(results / answers_sources.IN_PROGRESS / "ladder")
    (line,) = answers.running_lines(results)
    assert line.startswith("- Running, redeclared with `sweep.py --redeclare`: first declared ")
    assert "seeds 0, 1 → 0, 1, 2 (added 2)" in line
    block = answers_blocks.declared_studies_block(answers_sources.Sources(results))
    assert "Running, redeclared (rows so far, judged once complete and published): `in_progress/ladder` (" in block
    assert "Running, declared before its first trial" not in block
