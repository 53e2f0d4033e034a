"""rpevit.analysis.continuation: the commands results/README.md gives for a declared study published before every
declared item was complete (issue 58: cifar10_ladder40_cpu's 40-epoch rung), each fact read from the folder and
checked. A tiny declared budget ladder on digits (a real space file, its rows through the real Parquet writer
under the keys the space gives them), published with its 5-epoch rung only; `sweep.py --dry-run` runs the
generated sweep command itself and finds the published rows done."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpevit.analysis import answers_blocks, answers_sources, continuation
from rpevit.sweep import declaration
from rpevit.sweep.plan import write_space_file
from rpevit.sweep.protocol import SUMMARY, Report
from rpevit.sweep.space import load_space
from rpevit.sweep.writer import ParquetResults
from tests.analysis_rows import ENV

REPO = Path(__file__).resolve().parents[1]
SPACE = """\
name: tiny_ladder
task: train
fixed: {dataset: digits, lr_schedule: wsd, redraw_interval: 10, cooldown_fraction: 0.2, warmup_epochs: 0.5}
branch: epochs
grid:
  - attention: [softmax, favor]
    pe: [ape]
    epochs: [10, 5]
seeds: [0, 1, 2]
declare:
  question: does the gap shrink?
  metric: judged
  seeds: [0, 1, 2]
  alpha: 0.05
  families:
    - name: gap
      for_each: epochs
      comparisons:
        - [{attention: softmax, pe: ape}, {attention: favor, pe: ape}]
    - name: trend
      trend: {field: epochs, from: 5, to: 10}
      comparisons:
        - [{attention: softmax, pe: ape}, {attention: favor, pe: ape}]
"""
EARLIER, LATEST = "a" * 40, "b" * 40
# one budget, no branch: not a budget ladder; published with its ape rows only (the rope comparison incomplete)
FLAT = """\
name: tiny_ladder
task: train
fixed: {dataset: digits, lr_schedule: wsd, redraw_interval: 10, cooldown_fraction: 0.2, warmup_epochs: 0.5}
grid:
  - attention: [softmax, favor]
    pe: [ape, rope]
    epochs: [5]
seeds: [0, 1, 2]
declare:
  question: does the gap hold?
  metric: judged
  seeds: [0, 1, 2]
  alpha: 0.05
  families:
    - name: gap
      comparisons:
        - [{attention: softmax, pe: ape}, {attention: favor, pe: ape}]
        - [{attention: softmax, pe: rope}, {attention: favor, pe: rope}]
"""
PYTHON = "python{}.{}".format(*sys.version_info[:2])  # the rows' python_version (ENV): this interpreter's


def published(root: Path, epochs: tuple[int, ...] = (5,), latest_commit: str = LATEST, space_text: str = SPACE,
              python_versions: tuple[str, ...] | None = None) -> Path:
    """root/results/tiny_ladder: declared, space.json, the rows of the given rungs (the last one written
    finished last and ran at `latest_commit`, the others at EARLIER); root/search_spaces/tiny_ladder.yaml.
    `python_versions`: each row's python_version in turn (cycled), else this interpreter's (ENV)."""
    (root / "search_spaces").mkdir(parents=True, exist_ok=True)
    (root / "search_spaces" / "tiny_ladder.yaml").write_text(space_text)
    space = load_space(root / "search_spaces" / "tiny_ladder.yaml")
    space.source = "search_spaces/tiny_ladder.yaml"  # as sweep.py records it, run from the repository root
    folder = root / "results" / space.name
    folder.mkdir(parents=True)
    declaration.record(folder, space.declaration, rows_exist=False, redeclare=False)
    write_space_file(folder, space)
    configs = dict(zip(space.keys, space.trials))
    writer = ParquetResults(folder, space.name, configs, {k: i for i, k in enumerate(configs)})
    chosen = [(k, c) for k, c in configs.items() if c["epochs"] in epochs and c["pe"] == "ape"]
    start = time.time() + 10
    for i, (key, config) in enumerate(chosen):
        acc = (0.9 if config["attention"] == "softmax" else 0.8) + config["seed"] / 1000
        row = {**config, **ENV, "git_commit": latest_commit if i == len(chosen) - 1 else EARLIER,
               "test_acc": acc, "test_acc_draw_mean": acc, "started_at": start + i, "finished_at": start + i + 1}
        if python_versions is not None:
            row["python_version"] = python_versions[i % len(python_versions)]
        writer.on_trial_result(i, [], SimpleNamespace(trial_id=f"t{i}"), Report(SUMMARY, key, row).to_tune())
    writer.on_experiment_end([])
    return folder


def test_a_published_ladder_with_a_rung_left_gets_the_commands_that_continue_it(tmp_path):
    folder = published(tmp_path)
    c = continuation.continuation(folder, tmp_path / "results")
    assert (c.name, c.source, c.commit, c.rungs_first, c.why_not) == ("tiny_ladder", "search_spaces/tiny_ladder.yaml",
                                                                      LATEST, True, "")
    assert (c.incomplete, c.items, c.entries, c.ok, c.planned) == (2, 3, (2, 4), 6, 12)  # the 10-epoch gap, the trend
    assert c.commands() == [
        "[ -e ../studies/tiny_ladder ] || { mkdir -p ../studies && cp -r results/tiny_ladder ../studies/tiny_ladder; }",
        f"[ -e ../wt-tiny_ladder ] || git worktree add --detach ../wt-tiny_ladder {LATEST}",
        f"cd ../wt-tiny_ladder && git checkout -q --detach {LATEST}",
        f"{PYTHON} -m venv .venv && . .venv/bin/activate && pip install -e . -c constraints/tested.txt",
        "python sweep.py --space search_spaces/tiny_ladder.yaml --results-dir ../studies --resume --rungs-first"]
    text = continuation.continuation_text(c)
    assert text.startswith("Published before every declared item was complete: `tiny_ladder`, 2 of its 3 judged "
                           "items without a verdict yet (2 of 4 cell x rung entries hold every declared seed; 6 ok "
                           "rows of the 12 trials its space.json lists).")
    assert f"    git worktree add" not in text and f"\n    [ -e ../wt-tiny_ladder ] || git worktree add" in text
    assert "\n    python -m rpevit.sweep.snapshot ../studies/tiny_ladder results/tiny_ladder\n" in text


def test_the_generated_sweep_command_resumes_the_published_rows(tmp_path):
    """The sweep line run as given (with --dry-run, and sweep.py of this checkout) on a copy of the published
    folder in ../studies: the 6 published trials are done, the 6 of the 10-epoch rung left."""
    root = tmp_path / "clone"
    folder = published(root)
    c = continuation.continuation(folder, root / "results")
    subprocess.run(["bash", "-c", c.commands()[0]], cwd=root, check=True)  # the copy, as the first line makes it
    assert (tmp_path / "studies" / "tiny_ladder" / "trials.parquet").is_file()
    argv = shlex.split(c.commands()[-1])
    assert argv[:2] == ["python", "sweep.py"]
    done = subprocess.run([sys.executable, str(REPO / "sweep.py"), *argv[2:], "--dry-run"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "12 trials in sweep 'tiny_ladder'" in done.stdout
    assert "for 6 of 6 Tune trial(s)" in done.stdout, done.stdout[-1500:]  # the 10-epoch trunks; 6 rows done


def test_a_complete_study_gets_no_commands(tmp_path):
    folder = published(tmp_path, epochs=(5, 10))
    assert continuation.continuation(folder, tmp_path / "results") is None


@pytest.mark.parametrize("field,value,match", [
    ("source", "../outside/tiny_ladder.yaml", "field 'source' has value '../outside/tiny_ladder.yaml'"),
    ("source", "/etc/tiny_ladder.yaml", "field 'source' has value '/etc/tiny_ladder.yaml'"),
    ("source", "search_spaces/x.yaml; rm -rf ~", "field 'source' has value"),
    ("name", "a/b", "field 'name' has value 'a/b'"),
    ("name", "`x` [y](http://e.example)", "field 'name' has value"),
])
def test_a_space_json_field_that_is_not_safe_gives_no_command_and_says_why(tmp_path, field, value, match):
    folder = published(tmp_path)
    space = json.loads((folder / "space.json").read_text())
    (folder / "space.json").write_text(json.dumps({**space, field: value}))
    c = continuation.continuation(folder, tmp_path / "results")
    assert c.commands() == [] and match.replace("'", "") in c.why_not.replace("'", "").replace("\\", "")
    text = continuation.continuation_text(c)
    assert "No command continues it from here:" in text and "\n    " not in text
    assert "[y](" not in text  # inert Markdown


def test_a_latest_row_from_a_tree_with_edits_gives_no_command(tmp_path):
    folder = published(tmp_path, latest_commit=LATEST + "+dirty")
    c = continuation.continuation(folder, tmp_path / "results")
    assert c.commands() == [] and "field 'git_commit' value" in c.why_not and "+dirty" in c.why_not


def test_a_space_file_edited_since_the_rows_gives_no_command(tmp_path):
    folder = published(tmp_path)
    path = tmp_path / "search_spaces" / "tiny_ladder.yaml"
    path.write_text(SPACE.replace("seeds: [0, 1, 2]\ndeclare", "seeds: [0, 1, 2, 3]\ndeclare"))
    c = continuation.continuation(folder, tmp_path / "results")
    assert c.commands() == [] and "lists 16 trials, not the 12 of its space.json" in c.why_not
    path.unlink()
    c = continuation.continuation(folder, tmp_path / "results")
    assert c.commands() == [] and "is not a regular file in this checkout" in c.why_not


def test_results_readme_gives_the_commands_for_a_published_study_and_none_for_a_running_one(tmp_path):
    published(tmp_path)
    block = answers_blocks.declared_studies_block(answers_sources.Sources(tmp_path / "results"))
    assert block.count("Published before every declared item was complete: `tiny_ladder`") == 1
    assert "\n\n    [ -e ../studies/tiny_ladder ]" in block
    (tmp_path / "results" / answers_sources.IN_PROGRESS).mkdir()
    (tmp_path / "results" / "tiny_ladder").rename(tmp_path / "results" / answers_sources.IN_PROGRESS / "tiny_ladder")
    block = answers_blocks.declared_studies_block(answers_sources.Sources(tmp_path / "results"))
    assert "Published before" not in block and "Running, declared before its first trial" in block


def test_a_rung_no_row_has_reached_is_judged_incomplete_not_left_out(tmp_path):
    """A declaration lists no budgets: the levels of a for_each family came from the rows alone, so a study with
    no 10-epoch row yet had no 10-epoch family at all (read as "every item complete"). A declared trend names
    its budgets: those levels are listed, incomplete."""
    from rpevit.analysis import confirmatory
    _, _, families, _ = confirmatory.judge(published(tmp_path))
    assert [(title, [o.complete for o in outcomes]) for title, outcomes in families] == [
        ("gap (epochs = 5)", [True]), ("gap (epochs = 10)", [False]), ("trend (epochs 5 → 10)", [False])]


def test_a_folder_name_the_shell_would_split_gives_no_command(tmp_path):
    folder = published(tmp_path)
    odd = folder.rename(folder.parent / "tiny ladder; x")
    c = continuation.continuation(odd, tmp_path / "results")
    assert c.commands() == [] and "its folder under results/ is" in c.why_not and "tiny ladder; x" in c.why_not


def test_a_budget_ladder_is_judged_at_each_stop_with_its_budget_ladder_md_and_a_single_budget_study_is_not(tmp_path):
    """budget_ladder.md is written by analysis/budget_ladder.py alone and `answers.py --check` does not compare
    it with the rows: a stop that leaves it out leaves it stale without a word. A study at one budget has none."""
    c = continuation.continuation(published(tmp_path / "ladder"), tmp_path / "ladder" / "results")
    assert c.publish_commands() == [
        "python -m rpevit.sweep.snapshot ../studies/tiny_ladder results/tiny_ladder",
        "python analysis/confirmatory.py results/tiny_ladder", "python analysis/budget_ladder.py results/tiny_ladder",
        "python analysis/answers.py results"]
    assert "\n    python analysis/budget_ladder.py results/tiny_ladder\n" in continuation.continuation_text(c)
    flat = continuation.continuation(published(tmp_path / "flat", space_text=FLAT), tmp_path / "flat" / "results")
    assert flat is not None and not flat.why_not and not flat.rungs_first
    assert not any("budget_ladder" in line for line in flat.publish_commands())
    assert "budget_ladder" not in continuation.continuation_text(flat)


@pytest.mark.parametrize("versions,venv,note", [
    (("3.12.4",), "python3.12 -m venv", None),
    (("3.12.4", "3.12.7+"), "python3.12 -m venv", None),  # one major.minor: patch levels may differ
    (("3.11.7", "3.12.4"), "python3 -m venv", "its rows ran on Python 3.11 and 3.12"),
    (("",), "python3 -m venv", "its rows record no Python version"),
    (("3.12.4", "3.12; rm -rf ~"), "python3 -m venv", "3 rows record a python_version that is not a version"),
])
def test_the_venv_is_made_with_the_python_its_rows_ran_on(tmp_path, versions, venv, note):
    """`python3` is whatever the machine has; constraints/tested.txt pins the packages of one Python. The rows
    record theirs (python_version): its major.minor, or python3 and a note where they disagree or hold none."""
    c = continuation.continuation(published(tmp_path, python_versions=versions), tmp_path / "results")
    line = c.commands()[3]
    assert line.startswith(f"{venv} .venv && "), line
    text = continuation.continuation_text(c)
    if note is None:
        assert c.python_note == "" and "record no Python" not in text
    else:
        assert note in c.python_note and note in text and "rm -rf" not in line


def test_the_text_says_a_second_driver_exits_at_once_and_how_to_stop_a_running_one(tmp_path):
    c = continuation.continuation(published(tmp_path), tmp_path / "results")
    text = continuation.continuation_text(c)
    assert ("`sweep.py` locks `../studies/tiny_ladder/.sweep.lock` before it starts anything: a second driver on "
            "the same folder exits at once (code 2, naming the holder), so the sweep line never runs the study "
            "twice; on the machine where it is still running, stop it first with `kill -INT` of its `sweep.py`") in text


@pytest.mark.slow
def test_the_generated_sweep_line_exits_at_once_where_a_driver_holds_the_folder(tmp_path):
    """What the text says, through sweep.py: with the folder's lock held (a running driver), the generated line
    exits 2 naming the holder and trains nothing."""
    from rpevit.sweep.lock import sweep_lock
    root = tmp_path / "clone"
    c = continuation.continuation(published(root), root / "results")
    subprocess.run(["bash", "-c", c.commands()[0]], cwd=root, check=True)
    argv = shlex.split(c.commands()[-1])
    with sweep_lock(tmp_path / "studies" / "tiny_ladder"):
        done = subprocess.run([sys.executable, str(REPO / "sweep.py"), *argv[2:]], cwd=root, capture_output=True,
                              text=True, timeout=300)
    assert done.returncode == 2 and "is in use by another driver (pid " in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "studies" / "tiny_ladder" / "trials").exists()


def test_the_data_folder_is_named_as_the_sweep_line_reads_it_from_the_worktree(tmp_path):
    """The sweep runs after `cd ../wt-<name>`: its `./data` is the worktree's, not the clone's, and a relative
    --data-dir is read from the worktree too."""
    text = continuation.continuation_text(continuation.continuation(published(tmp_path), tmp_path / "results"))
    assert "`./data`" not in text
    assert ("add `--data-dir FOLDER` to the sweep line for a data folder other than `$RPEVIT_DATA` or "
            "`../wt-tiny_ladder/data`: the sweep runs in the worktree, so a relative FOLDER is read from there, e.g. "
            "`../shared/data` for a `shared/` beside the clone") in text
