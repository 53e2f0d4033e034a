"""`sweep.py --dry-run` shows what will run (issue 43, item 4): the values every trial runs with after
--set, the data each dataset reads, a GPU space on a machine without one, and an estimate from measured
rows (labelled), or that there is none."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from rpevit.sweep import dry_run
from rpevit.sweep.space import load_space
from tests.test_sweep_summary import write_rows

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "search_spaces" / "smoke.yaml"


def run_dry(capsys, *args: str) -> tuple[int, str, str]:
    import sys

    sys.path.insert(0, str(ROOT))
    try:
        import sweep
    finally:
        sys.path.remove(str(ROOT))
    code = sweep.main(["--dry-run", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_dry_run_shows_the_effective_values_and_that_no_estimate_exists_yet(tmp_path, capsys):
    code, out, _ = run_dry(capsys, "--space", str(SMOKE), "--set", "epochs=3", "--results-dir", str(tmp_path))
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("every trial: "))
    assert "epochs=3 (--set)" in line and "dataset=digits" in line and "dim=32" in line
    assert "attention=" not in line and "lr=0.003" in line  # varying fields are the table's; values as they run
    assert "data: digits is bundled with scikit-learn (no data folder)" in out
    assert "resources: 1 CPU + 0 GPU per trial" in out
    # none measured: an order of magnitude from the committed bench studies instead (issue 59, item 4)
    assert f"estimate: none measured (no finished trial of task 'train' in {tmp_path / 'smoke'}" in out


def test_the_data_each_dataset_reads_is_checked(tmp_path, capsys, monkeypatch):
    space = tmp_path / "m.yaml"
    space.write_text("name: m\ntask: train\nfixed: {dataset: mnist, epochs: 1}\ngrid: {attention: [softmax]}\n")
    empty = tmp_path / "nowhere"
    monkeypatch.delenv("RPEVIT_OFFLINE")
    code, out, _ = run_dry(capsys, "--space", str(space), "--data-dir", str(empty), "--results-dir", str(tmp_path))
    assert code == 0 and f"warning: data: {empty.resolve()}/mnist.npz is missing (the folder" in out
    monkeypatch.setenv("RPEVIT_OFFLINE", "1")  # offline, the sweep could never have it: a real run refuses
    code, out, _ = run_dry(capsys, "--space", str(space), "--data-dir", str(empty), "--results-dir", str(tmp_path))
    assert code == 0 and "RPEVIT_OFFLINE=1" in out and "the sweep would stop here" in out
    import sys

    sys.path.insert(0, str(ROOT))
    import sweep

    sys.path.remove(str(ROOT))
    assert sweep.main(["--space", str(space), "--data-dir", str(empty), "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()  # one line, before Ray or anything else started
    assert err.count("\n") == 0 and f"--data-dir {str(empty)!r}" in err and "RPEVIT_OFFLINE=1" in err
    assert not (tmp_path / "m").exists()
    folder = tmp_path / "data"
    folder.mkdir()
    np.savez(folder / "mnist.npz", x=np.zeros(1))
    code, out, _ = run_dry(capsys, "--space", str(space), "--data-dir", str(folder), "--results-dir", str(tmp_path))
    assert code == 0 and f"data: {folder.resolve()}/mnist.npz found" in out


def test_a_gpu_space_on_a_cpu_machine_is_warned_with_the_flags_for_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dry_run, "local_cpus", lambda: 4)  # CPUs for its trials (2 CPUs: test_newcomer_small_things)
    space = load_space(ROOT / "search_spaces" / "all12.yaml")
    warning = dry_run.gpu_warning(space, space.resources, local=True)
    assert "gpus_per_trial 0.25" in warning and "compile on" in warning
    assert warning.endswith("On the CPU: --gpus-per-trial 0 --set compile=off")
    assert dry_run.gpu_warning(space, space.resources, local=False) is None  # a cluster's GPUs are not ours to see
    assert dry_run.gpu_warning(load_space(SMOKE), load_space(SMOKE).resources, local=True) is None


def test_compile_on_alone_is_no_gpu_request(monkeypatch, tmp_path):
    """A CPU space that compiles some variants (compile pays on the CPU for softmax and FAVOR+) is not warned;
    CUDA graphs are a GPU request."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "cpu_compiled.yaml"
    path.write_text("name: cpu_compiled\ntask: train\nfixed: {dataset: digits, epochs: 1}\n"
                    "grid:\n  - {attention: [softmax, favor], compile: ['on']}\n  - {attention: [relu]}\n")
    space = load_space(path)
    assert {t["compile"] for t in space.trials} == {"on", "off"}
    assert dry_run.gpu_warning(space, space.resources, local=True) is None
    path.write_text(path.read_text().replace("compile: ['on']", "compile: [cudagraphs]"))
    space = load_space(path)
    warning = dry_run.gpu_warning(space, space.resources, local=True)
    assert "compile cudagraphs" in warning and warning.endswith("On the CPU: --set compile=off")


def test_the_estimate_comes_from_measured_rows_and_says_so(tmp_path):
    space = load_space(SMOKE)
    out = tmp_path / "smoke"
    now = time.time()
    measured = {"epochs_done": 20, "train_s_per_epoch": 1.0, "started_at": now - 100.0, "finished_at": now - 40.0,
                "test_acc": 0.8}
    write_rows(out, space, {0: measured})
    line = dry_run.estimate_line(space, space.resources, str(tmp_path), None, resume=True, local=True)
    assert line.startswith(f"estimate (from measured rows of {out / 'trials.parquet'}): about ")
    # the row: 60 s for 20 epochs; the 3 trials left, 2 at a time after 60 s of start-up, 5 s before each
    assert "about 3 min 10 s for 3 of 3 Tune trial(s), 2 at a time on this machine" in line, line
    assert "1 min 00 s per Tune trial (from rows of: same task 3" in line, line  # other encodings: same task
    assert dry_run.estimate_line(space, space.resources, str(tmp_path), None, resume=False, local=True).startswith(
        f"warning: {out} already holds results")
    (out / "trials.parquet").write_bytes(b"not parquet")  # a damaged file: said, never moved by a dry run
    line = dry_run.estimate_line(space, space.resources, str(tmp_path), None, resume=True, local=True)
    assert line.startswith("estimate: none (") and (out / "trials.parquet").read_bytes() == b"not parquet"


def test_a_data_free_space_reads_no_dataset_file(tmp_path, capsys, monkeypatch):
    """A bench space (random images of the dataset's shape) with no cifar10.npz anywhere: the dry run says no
    data is read, and a real run neither refuses nor downloads (it once tried to, offline, on a GPU lease)."""
    space = tmp_path / "b.yaml"
    space.write_text("name: b\ntask: bench\nfixed: {dataset: cifar10, dim: 16, depth: 1, heads: 2}\n"
                     "grid: {attention: [softmax]}\nresources: {cpus_per_trial: 1, gpus_per_trial: 0}\n")
    empty = tmp_path / "nowhere"
    monkeypatch.setenv("RPEVIT_OFFLINE", "1")
    code, out, _ = run_dry(capsys, "--space", str(space), "--data-dir", str(empty), "--results-dir", str(tmp_path))
    assert code == 0 and "data: none read by task bench" in out and "cifar10.npz" not in out
    loaded = load_space(space)
    dry_run.check_data(loaded, str(empty))  # nothing to refuse
    dry_run.fetch_missing(loaded, str(empty), say=lambda *a, **k: pytest.fail(f"would fetch: {a}"))
