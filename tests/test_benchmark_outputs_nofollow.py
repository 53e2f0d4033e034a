"""What the benchmarks write never goes through a symbolic link, and what they are told is checked first.

A link planted at an output path (a figure, a JSON of figures, a child's log) would have the benchmark
overwrite whatever it points at: each output goes through rpevit's no-follow atomic writer (or O_NOFOLLOW),
and a link there stops the run with one line naming the path while its target stays as it was. A
--baseline-rev starting with '-' would be an option of `git archive` (--output=/path writes anywhere).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pyarrow as pa
import pytest

ROOT = Path(__file__).resolve().parent.parent


def load(relative: str) -> ModuleType:
    """A benchmark script as a module (its own folder on sys.path, as when it runs)."""
    path = ROOT / relative
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass in it looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A victim file and a link to it at the output path a benchmark is given."""
    victim = tmp_path / "victim.txt"
    victim.write_text("original\n")
    out = tmp_path / "out"
    out.mkdir()
    return victim, out


def test_curves_png_is_never_written_through_a_link(planted, monkeypatch, capsys):
    victim, out = planted
    link = out / "curves.png"
    link.symlink_to(victim)
    curves = load("benchmarks/lease/curves.py")
    trials = pa.Table.from_pandas(pd.DataFrame({"trial_key": ["a", "b"], "attention": ["softmax", "favor"],
                                                "pe": ["ape", "ape"], "seed": [0, 0], "device_name": ["cpu", "cpu"]}))
    epochs = pa.Table.from_pandas(pd.DataFrame({"trial_key": ["a", "a", "b", "b"], "epoch": [1, 2, 1, 2],
                                                "val_acc": [0.1, 0.2, 0.1, 0.3], "train_loss": [2.0, 1.5, 2.1, 1.4]}))
    monkeypatch.setattr(curves, "read_results_table", lambda path: epochs if path.name == "epochs.parquet" else trials)
    with pytest.raises(SystemExit) as stopped:
        curves.main(str(out), str(link), "cpu")
    assert victim.read_text() == "original\n" and link.is_symlink()
    message = str(stopped.value)
    assert "\n" not in message and str(link) in message and "symbolic link" in message, message
    plain = out / "plain.png"  # and without a link the figure is written as before
    assert curves.main(str(out), str(plain), "cpu") == 0 and plain.read_bytes()[:4] == b"\x89PNG"


def test_throughput_json_is_never_written_through_a_link(planted):
    victim, out = planted
    link = out / "throughput.json"
    link.symlink_to(victim)
    throughput = load("benchmarks/throughput.py")
    with pytest.raises(SystemExit) as stopped:
        throughput.write_json(str(link), {"device": "cpu"})
    assert victim.read_text() == "original\n" and link.is_symlink()
    assert "\n" not in str(stopped.value) and str(link) in str(stopped.value) and "symbolic link" in str(stopped.value)


def test_gpu_packing_logs_and_json_are_never_written_through_a_link(planted):
    victim, out = planted
    gpu_packing = load("benchmarks/gpu_packing.py")
    for name, write in [("pack1_seed0.log", lambda p: gpu_packing.open_log(p)),
                        ("packing.json", lambda p: gpu_packing.write_out(p, {"pack": 2}))]:
        link = out / name
        link.symlink_to(victim)
        with pytest.raises(SystemExit) as stopped:
            write(link)
        assert victim.read_text() == "original\n" and link.is_symlink()
        assert "\n" not in str(stopped.value) and str(link) in str(stopped.value) and "symbolic link" in str(stopped.value)


@pytest.mark.parametrize("rev", ["--output=OUT", "-o", ""])
def test_a_baseline_rev_that_git_would_read_as_an_option_is_refused_in_one_line(tmp_path, rev):
    target = tmp_path / "archive.tar"
    rev = rev.replace("OUT", str(target))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "results_scale.py"), "--epoch-rows", "1000",
                           f"--baseline-rev={rev}"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert not target.exists()
    assert done.returncode != 0 and done.stderr.strip().count("\n") == 0, done.stderr
    assert f"--baseline-rev has value {rev!r}; allowed: " in done.stderr, done.stderr
