"""rpevit/analysis/progress.py: a running declared study's rows so far (results/in_progress/<study>/PROGRESS.md),
counted from the Parquet as the verdicts will use them, so RESUME.md no longer types them by hand."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from rpevit.analysis import answers, answers_sources, progress
from rpevit.analysis.generated import stale
from rpevit.sweep import declaration
from rpevit.sweep.declaration import DeclarationError, parse
from tests.analysis_rows import config_row, ladder_epoch_rows, write_sweep

PAIRS = [[{"attention": "softmax", "pe": pe}, {"attention": "favor", "pe": pe}] for pe in ("ape", "rope")]
DECLARE = {"metric": "judged", "seeds": [5, 6, 7], "families": [
    {"name": "gap", "for_each": "epochs", "comparisons": PAIRS},
    {"name": "trend", "comparisons": PAIRS, "trend": {"field": "epochs", "from": 10, "to": 40}}]}


def row(attention: str, pe: str, epochs: int, seed: int, started_at: float) -> dict:
    return {**config_row(dataset="digits", attention=attention, pe=pe, epochs=epochs, seed=seed),
            "test_acc": 0.5, "test_acc_draw_mean": 0.5, "started_at": started_at, "finished_at": started_at + 60}


def running_study(results: Path, rows: list[dict], failed: tuple = ()) -> Path:
    folder = results / answers_sources.IN_PROGRESS / "ladder"
    folder.mkdir(parents=True)
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "ladder", rows, failed=failed)
    return folder


def test_each_declared_cell_and_rung_lists_the_declared_seeds_the_verdicts_will_use(tmp_path):
    after = time.time() + 10
    rows = [row("softmax", "ape", e, s, after) for e in (10, 20) for s in (5, 6, 7)]
    rows += [row("favor", "ape", 10, 5, after), row("favor", "ape", 10, 7, after)]
    rows += [row("softmax", "rope", 10, 9, after)]  # a seed outside the declared ones: not counted
    rows += [row("softmax", "rope", 20, 6, after - 3600)]  # started before the declaration: not counted
    folder = running_study(tmp_path / "results", rows,
                           failed=[(config_row(dataset="digits", attention="favor", pe="rope", epochs=10, seed=5), "NaN")])
    p = progress.progress(folder)
    assert (p.ok, p.failed, p.rung_field, p.rungs, p.seeds) == (10, 1, "epochs", (10, 20, 40), (5, 6, 7))
    assert [progress.confirmatory.short_label(side) for side, _ in p.cells] == [
        "softmax+ape", "favor+ape", "softmax+rope", "favor+rope"]
    per_cell = {progress.confirmatory.short_label(side): per_rung for side, per_rung in p.cells}
    assert per_cell["softmax+ape"] == {10: (5, 6, 7), 20: (5, 6, 7), 40: ()}
    assert per_cell["favor+ape"] == {10: (5, 7), 20: (), 40: ()}
    assert per_cell["softmax+rope"] == {10: (), 20: (), 40: ()}
    assert p.complete_cells == 2
    assert p.set_aside == {"a seed outside the declared ones": 1,
                           "started before the declaration was recorded (or no start time)": 1}
    text = progress.progress_text(p, "ladder")
    assert "10 ok and 1 failed row(s)" in text and "2 of 12 cell x rung entries hold every declared seed" in text
    assert "| softmax+ape | 5–7 (3 of 3) | 5–7 (3 of 3) | — |" in text
    assert "| favor+ape | 5, 7 (2 of 3) | — | — |" in text
    assert "1 a seed outside the declared ones" in text


@pytest.mark.parametrize("have, text", [((), "—"), ((5,), "5 (1 of 5)"), ((5, 6), "5, 6 (2 of 5)"),
                                        ((5, 6, 7), "5–7 (3 of 5)"), ((5, 7, 8), "5, 7, 8 (3 of 5)")])
def test_seed_lists(have, text):
    assert progress.seed_list_text(have, (5, 6, 7, 8, 9)) == text


def test_answers_writes_progress_beside_a_running_study_and_check_names_it_when_rows_move_on(tmp_path):
    """PROGRESS.md is one of the generated files (answers.expected_texts takes progress_files): a snapshot that
    adds rows without regenerating it is stale."""
    results = tmp_path / "results"
    after = time.time() + 10
    folder = running_study(results, [row("softmax", "ape", 10, s, after) for s in (5, 6)])
    expected = answers.progress_files(results)
    assert list(expected) == [folder / progress.PROGRESS_FILE]
    text = expected[folder / progress.PROGRESS_FILE]
    assert "| cell | epochs = 10 | epochs = 40 |" in text and "| softmax+ape | 5, 6 (2 of 3) | — |" in text and text.startswith("<!-- GENERATED")
    (line,) = answers.running_lines(results)
    assert "Rows so far: 2 ok, 0 of 8 cell x rung entries complete (`in_progress/ladder/PROGRESS.md`)." in line
    for path, body in expected.items():
        path.write_text(body, encoding="utf-8")
    assert stale(answers.progress_files(results), tmp_path) == []
    write_sweep(folder, "ladder", [row("softmax", "ape", 10, s, after) for s in (5, 6, 7)])  # the next snapshot
    (message,) = stale(answers.progress_files(results), tmp_path)
    assert "PROGRESS.md" in message and "5–7 (3 of 3)" in message


def test_a_folder_without_a_declaration_is_refused_in_one_line(tmp_path):
    folder = write_sweep(tmp_path / "s", "s", [row("softmax", "ape", 10, 5, time.time())])
    with pytest.raises(DeclarationError, match="holds no declaration.json"):
        progress.progress(folder)


def test_a_ladder_says_whether_each_seeds_rungs_are_one_run_up_to_their_cool_down(tmp_path):
    """The declared trend pairs a seed's rungs; a trunk trained again after its checkpoint was lost must still
    agree with the rungs it once branched. PROGRESS.md says so from the epoch rows, and names a pair that does not."""
    after = time.time() + 10
    rows = [{**row(a, "ape", e, s, after), "lr_schedule": "wsd", "cooldown_fraction": 0.2}
            for a in ("softmax", "favor") for e in (10, 20, 40) for s in (5, 6)]
    retrained = next(i for i, r in enumerate(rows) if (r["attention"], r["epochs"], r["seed"]) == ("favor", 40, 6))
    curves = [ladder_epoch_rows(r, {12: 1e-6} if i == retrained else None) for i, r in enumerate(rows)]
    folder = tmp_path / "results" / answers_sources.IN_PROGRESS / "ladder"
    folder.mkdir(parents=True)
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "ladder", rows, epochs=curves)
    p = progress.progress(folder)
    assert (p.shared.pairs, p.shared.epochs) == (12, 4 * (8 + 8 + 16))  # 2 attentions x 2 seeds x 3 pairs
    assert p.shared.differing == ("favor+ape seed 6: 20 vs 40 epochs (epochs 1-16, largest |difference| 1e-06)",)
    text = progress.progress_text(p, "ladder")
    assert "1 pair(s) differ (largest |difference| 1e-06; largest first): favor+ape seed 6: 20 vs 40 epochs" in text
    assert "Every one differs only by float rounding" in text and "weaker" not in text
    # epoch 12 is after the 10-epoch rung's cool-down start (8): its pair with the trunk is not touched
    assert "10 vs 40" not in text


def test_a_study_judged_at_one_budget_has_no_rung_check(tmp_path):
    one = {**DECLARE, "families": [{"name": "gap", "comparisons": PAIRS}]}
    folder = tmp_path / "results" / answers_sources.IN_PROGRESS / "one"
    folder.mkdir(parents=True)
    declaration.record(folder, parse(one, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "one", [row("softmax", "ape", 10, 5, time.time() + 10)])
    p = progress.progress(folder)
    assert p.rung_field is None and p.shared is None
    assert "one run up to their cool-down" not in progress.progress_text(p, "one")
