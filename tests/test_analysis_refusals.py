"""What the analysis scripts say about a RESULTS_DIR they cannot read answers from: one line naming the value and
what is allowed, never a traceback and never a sentence about the wrong thing (a missing path 'holds no
declaration.json'; an empty folder ended answers.py in KeyError 'pe', a sweep folder in IndexError)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rpevit.analysis import answers, budget_ladder

ROOT = Path(__file__).resolve().parents[1]


def test_answers_refuses_an_empty_folder_and_a_sweep_folder_in_one_line(tmp_path):
    empty = tmp_path / "results"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a sweep")
    with pytest.raises(SystemExit) as err:
        answers.main([str(empty)])
    assert str(err.value).startswith(f"error: RESULTS_DIR has value {str(empty)!r}, which holds no sweep folder")
    assert "allowed: the folder of sweep folders" in str(err.value)
    sweep = empty / "mine"
    sweep.mkdir()
    (sweep / "trials.parquet").write_bytes(b"")
    with pytest.raises(SystemExit) as err:
        answers.main([str(sweep)])
    assert "which is a sweep folder itself (it holds trials.parquet)" in str(err.value) and "its parent" in str(err.value)


def test_budget_ladder_says_when_a_study_declared_nothing(tmp_path):
    """budget_ladder.md said 'the declared comparisons of this study are in confirmatory.md' of every study,
    declared or not."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trials.parquet").write_bytes(b"")
    assert budget_ladder.declared_note(tmp_path / "a") == ("Exploratory: this study declared no comparisons before it "
                                                           "ran (no declaration.json), so every figure here is "
                                                           "exploratory.")
    assert budget_ladder.declared_note(tmp_path).startswith("Exploratory: no study read here declared comparisons")
    (tmp_path / "a" / "declaration.json").write_text("{}")
    assert budget_ladder.declared_note(tmp_path / "a") == ("Exploratory: the declared comparisons of this study are in "
                                                           "`confirmatory.md`.")
    assert budget_ladder.declared_note(tmp_path).endswith("b declared none (no declaration.json).")


@pytest.mark.slow
@pytest.mark.parametrize("script", ["confirmatory", "budget_ladder", "report"])
def test_a_missing_path_or_a_file_is_named_as_such(tmp_path, script):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    for path, what in ((tmp_path / "nope", "which does not exist"), (a_file, "which is not a folder")):
        done = subprocess.run([sys.executable, f"analysis/{script}.py", str(path)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and f"RESULTS_DIR has value {str(path)!r}, {what}; allowed:" in lines[-1], done.stderr
        assert "holds no" not in done.stderr and "Traceback" not in done.stderr
