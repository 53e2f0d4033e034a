"""Every file the docs and the code's docstrings point a reader to exists, and every test they cite by
name (`test_x.py::test_y`) is defined there: a renamed module or test fails here, not in a reader's hands
(the audit of 2026-11-29 found docs naming `analysis/variants.py` and `tests/test_attention.py`)."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"\b(?:tests|rpevit|analysis|benchmarks|search_spaces|constraints|docs)/[A-Za-z0-9_./-]+"
                  r"\.(?:py|md|yaml|json|sh|txt|toml)\b")
TEST_NAME = re.compile(r"\b(test_[A-Za-z0-9_]+\.py)::([A-Za-z0-9_]+)")
PLACEHOLDERS = {"analysis/x.py", "search_spaces/x.yaml"}  # "python analysis/x.py": any script


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an sdist): the tree as it is
        return sorted(p for pattern in patterns for p in ROOT.glob(pattern))
    return [ROOT / line for line in out.stdout.splitlines()]


def readers_texts() -> dict[str, str]:
    files = tracked("README.md", "docs/*.md", "rpevit/*.py", "rpevit/**/*.py", "analysis/*.py", "benchmarks/*.py",
                    "benchmarks/*.sh", "benchmarks/**/*.py", "sweep.py")
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in files if p.is_file()}


def test_every_file_a_reader_is_pointed_to_exists():
    missing = sorted({f"{name}: {ref}" for name, text in readers_texts().items() for ref in PATH.findall(text)
                      if ref not in PLACEHOLDERS and not (ROOT / ref).exists()
                      and not (ROOT / "docs" / ref).exists()})  # docs/cluster/... from inside docs/
    assert not missing, "references to files that do not exist:\n" + "\n".join(missing)


RESULTS_FILE = re.compile(r"\bresults/[A-Za-z0-9_./-]+\.(?:md|png|json|parquet|csv)\b")
USERS_OWN = ("results/smoke/",)  # README command 1's folder: the user's, never committed


def test_every_results_file_the_published_text_points_to_exists():
    """A publication rehearsal: ANSWERS.md pointed to a published ladder's `budget_ladder.md` before any step
    wrote it. Every results file that the README, the docs and the committed results' Markdown name exists."""
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
             for p in tracked("README.md", "docs/*.md", "results/*.md", "results/**/*.md") if p.is_file()}
    missing = sorted({f"{name}: {ref}" for name, text in texts.items() for ref in RESULTS_FILE.findall(text)
                      if not ref.startswith(USERS_OWN) and not (ROOT / ref).exists()})
    assert not missing, "results files named that do not exist:\n" + "\n".join(missing)


def test_every_test_cited_by_name_is_defined():
    missing = []
    for name, text in readers_texts().items():
        for file, test in set(TEST_NAME.findall(text)):
            path = ROOT / "tests" / file
            if not path.is_file() or not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{test}\b",
                                                   path.read_text(encoding="utf-8"), re.M):
                missing.append(f"{name}: {file}::{test}")
    assert not missing, "tests cited that do not exist:\n" + "\n".join(sorted(missing))
