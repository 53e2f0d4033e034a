"""Provenance (issue 43, item 8): a row's git_commit says '+dirty' whenever the code that ran is not the
commit's (an untracked variant file imported counts), and a user's own sweep folders under results/
stay out of git while the committed studies stay in."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rpevit.metrics import git_state

ROOT = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return tmp_path


def test_an_untracked_file_that_ran_makes_the_commit_dirty(repo: Path):
    sha = git(repo, "rev-parse", "HEAD").strip()
    tracked = repo / "pkg" / "model.py"
    assert git_state(repo, [tracked]) == sha
    variant = repo / "pkg" / "my_attention.py"  # a one-file variant, never added to git
    variant.write_text("y = 2\n")
    assert git_state(repo, [tracked]) == sha  # lying there unused: the code that ran is the commit's
    assert git_state(repo / "pkg", [tracked, variant]) == sha + "+dirty"  # imported: not the commit's code
    (repo / "ignored").mkdir()
    scratch = repo / "ignored" / "notes.py"
    scratch.write_text("")
    assert git_state(repo, [tracked, scratch]) == sha  # ignored files are not the project's code
    variant.unlink()
    tracked.write_text("x = 3\n")
    assert git_state(repo, [tracked]) == sha + "+dirty"
    assert git_state(repo.parent, []) == "unknown"  # not a checkout


def in_checkout() -> bool:
    try:
        return git(ROOT, "rev-parse", "--show-toplevel").strip() == str(ROOT)
    except (OSError, subprocess.CalledProcessError):
        return False


@pytest.mark.skipif(not in_checkout(), reason="needs the git checkout of rpevit (its .gitignore files)")
def test_user_sweep_folders_are_ignored_and_the_committed_studies_are_not():
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    studies = [line.strip() for line in (ROOT / "results" / "STUDIES").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    tracked = {Path(p).parts[1] for p in git(ROOT, "ls-files", "results").splitlines() if len(Path(p).parts) > 2}
    assert studies and set(studies) <= tracked  # every published study is committed
    for folder in sorted(set(studies) | tracked):
        assert not ignored(f"results/{folder}/trials.parquet"), f"results/{folder}: add !/{folder}/ to results/.gitignore"
        assert ignored(f"results/{folder}/trials/k/checkpoint.pt") and ignored(f"results/{folder}/tensorboard/k/x")
    for mine in ("smoke", "mine", "smoke2"):
        assert ignored(f"results/{mine}/trials.parquet") and ignored(f"results/{mine}/space.json"), mine
    assert not ignored("results/report.md") and not ignored("results/gap_closure.png")
