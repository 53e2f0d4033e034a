"""README command 1, then README command 2, in one clone (issue 59): command 1 (`python sweep.py --space
search_spaces/smoke.yaml`) writes results/smoke/, and the tests of command 2 must stay green after it. The
generated text (results/ANSWERS.md, the blocks of README.md, results/README.md and docs/) reads only the
published study folders (rpevit.analysis.answers_sources.published_folders: what results/.gitignore re-includes and
results/STUDIES lists), never a user's own folder, whatever it holds: rows, a declaration.json, `_val_` in
its name.

The folders are made the way command 1 makes them, without running it (the real sweep takes minutes on 2
shared cores): the smoke space's trials, their rows through the sweep's own Parquet writer (trials.parquet,
epochs.parquet), space.json, and each trial's folder and TensorBoard folder."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpevit.analysis import answers, answers_blocks, answers_sources, answers_validation
from rpevit.analysis.generated import stale
from rpevit.sweep import declaration
from rpevit.sweep.declaration import parse
from rpevit.sweep.plan import write_space_file
from rpevit.sweep.protocol import EPOCH, SUMMARY, Report
from rpevit.sweep.space import load_space
from rpevit.sweep.writer import ParquetResults
from tests.analysis_rows import ENV, config_row, write_sweep
from tests.test_declaration import DECLARE, rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def command_one(results: Path) -> Path:
    """results/smoke/ as README command 1 leaves it (made-up accuracies; no trial runs)."""
    space = load_space(ROOT / "search_spaces" / "smoke.yaml")
    folder = results / space.name
    configs = dict(zip(space.keys, space.trials))
    writer = ParquetResults(folder, space.name, configs, {k: i for i, k in enumerate(space.keys)})
    now = time.time()
    for i, (key, cfg) in enumerate(configs.items()):
        trial = SimpleNamespace(trial_id=f"t{i}")
        for epoch in range(cfg["epochs"]):
            writer.on_trial_result(i, [], trial, Report(EPOCH, key, {"epoch": epoch, "train_loss": 1.0 / (epoch + 1),
                                                                      "val_acc": 0.5}).to_tune())
        row = {**cfg, **ENV, "test_acc": 0.6 + 0.05 * i, "test_acc_draw_mean": 0.55 + 0.05 * i, "final_val_acc": 0.6,
               "started_at": now, "finished_at": now + 60, "epochs_done": cfg["epochs"]}
        writer.on_trial_result(i, [], trial, Report(SUMMARY, key, row).to_tune())
        (folder / "trials" / key).mkdir(parents=True)
        (folder / "trials" / key / "log.txt").write_text("epoch 1\n")
        (folder / "tensorboard" / key).mkdir(parents=True)
    writer.on_experiment_end([])
    write_space_file(folder, space)
    return folder


def own_folders(results: Path) -> list[Path]:
    """README command 1's folder, and folders of one's own that look like published kinds: a declared study
    (a declaration.json) and one named like a validation study."""
    smoke = command_one(results)
    declared = results / "mine_declared"
    declared.mkdir()
    declaration.record(declared, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(declared, "mine_declared", rows(time.time() + 10))
    val = write_sweep(results / "mine_val_digits", "mine_val_digits",
                      [config_row(dataset="digits", seed=seed, luo_scale=scale, pe="luo_rpe") | {"test_acc": 0.5,
                                                                                                 "final_val_acc": 0.5}
                       for seed in (0, 1) for scale in (1.0, 10.0)])
    return [smoke, declared, val]


def tracked_folders() -> set[str]:
    """The folders under results/ that git tracks: what a fresh clone holds. This checkout may hold more (CI
    runs README command 1 first, so results/smoke/ is here): the tests read the clone, not the checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "results"], cwd=ROOT, capture_output=True,
                                check=True, timeout=60).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: which folders under results/ are committed is not known here")
    return {Path(p).parts[1] for p in listed.split("\0") if p and len(Path(p).parts) > 2}


def clone(tmp_path: Path) -> Path:
    """What a fresh clone holds that the generated text is read from and written into: results/ (the
    committed studies, their .gitignore and STUDIES; none of this checkout's own folders), README.md,
    docs/ and search_spaces/ (a published study still to finish is continued from its space file:
    rpevit.analysis.continuation)."""
    root = tmp_path / "clone"
    tracked = tracked_folders()

    def not_in_a_clone(folder: str, names: list[str]) -> set[str]:
        here = Path(folder)
        return {n for n in names if n == "__pycache__" or (here == RESULTS and (here / n).is_dir()
                                                           and n not in tracked)}

    shutil.copytree(RESULTS, root / "results", ignore=not_in_a_clone)
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copytree(ROOT / "search_spaces", root / "search_spaces")
    shutil.copy2(ROOT / "README.md", root / "README.md")
    return root


def test_the_published_folders_are_what_gitignore_re_includes_and_studies_lists(tmp_path):
    (tmp_path / ".gitignore").write_text("# comment\n/*/\n!/kept/\n!kept_too/\n!/in_progress/\n/not_me/\n")
    (tmp_path / "STUDIES").write_text("listed\n")
    assert answers_sources.published_folders(tmp_path) == {"kept", "kept_too", "in_progress", "listed"}
    assert answers_sources.is_published(tmp_path, tmp_path / "kept" / "sweep") and not answers_sources.is_published(
        tmp_path, tmp_path / "smoke")
    (tmp_path / ".gitignore").unlink()
    assert answers_sources.published_folders(tmp_path) == {"listed"}
    (tmp_path / "STUDIES").unlink()
    assert answers_sources.published_folders(tmp_path) is None  # a results folder of one's own: every folder is read
    assert answers_sources.is_published(tmp_path, tmp_path / "smoke")


def test_every_committed_study_folder_is_published():
    """Each folder git tracks under results/ (a `!/<folder>/` of results/.gitignore) is read, as before the rule."""
    published = answers_sources.published_folders(RESULTS)
    folders = tracked_folders()  # not every folder here: README command 1's results/smoke/ is no study
    assert folders and folders - published == set(), "add !/<folder>/ to results/.gitignore to publish it"


def test_every_published_folder_has_its_row_in_the_results_readme():
    """A publication rehearsal: nothing asked that a study moved out of results/in_progress/ gets its row in
    results/README.md's table of folders (what ran, from which commits, on which machines, the command that
    reproduces it). in_progress/ is the running studies' folder, named in the declared-studies block."""
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    missing = sorted(folder for folder in answers_sources.published_folders(RESULTS) - {answers_sources.IN_PROGRESS}
                     if f"| `{folder}/" not in text)
    assert not missing, f"no row in results/README.md's table of folders for: {', '.join(missing)}"
    assert f"`{answers_sources.IN_PROGRESS}/" in text


def test_a_users_own_folders_reach_no_folder_list_of_the_generated_text(tmp_path):
    """Before the fix, the study-rows table listed `smoke` (`+| smoke | train | 4 | ...`), the declared sections
    a user's declared study and the validation section a user's `*_val_*` folder."""
    results = clone(tmp_path) / "results"
    before = ([r["folder"] for r in answers_blocks.folder_rows(results)], answers_sources.confirmatory_studies(results),
              answers_validation.validation_folders(results))
    for folder in own_folders(results):
        assert (folder / "trials.parquet").is_file()
    after = ([r["folder"] for r in answers_blocks.folder_rows(results)], answers_sources.confirmatory_studies(results),
             answers_validation.validation_folders(results))
    assert after == before and "smoke" not in after[0] and after[0]
    assert answers_blocks.provenance_mismatches(results) == []


@pytest.mark.slow
def test_readme_command_one_then_command_two_in_one_clone(tmp_path):
    """The equivalent of CI running README command 1, then command 2, in one fresh clone: with results/smoke/
    (and other folders of one's own) present, every generated file and block regenerated from the clone equals
    the committed text (tests/test_answers.py::test_committed_answers_equal_what_the_analysis_code_writes)."""
    root = clone(tmp_path)
    own_folders(root / "results")
    messages = stale(answers.expected_texts(root / "results"), root)
    assert not messages, "\n\n".join(messages)
