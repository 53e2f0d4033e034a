"""rpevit/config.py, rpevit/cli.py, rpevit/sweep/space.py: values refused before anything trains, as one-line messages (exit
2) naming the field, the value and what is allowed; huge spaces refused before they are built;
sweep names that are one folder name."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rpevit.cli import main as cli_main
from rpevit.config import ConfigError, TrialConfig, field_types
from rpevit.flops import count_flops
from rpevit.sweep.runner import SweepOptions, run_sweep
from rpevit.sweep import space as space_module
from rpevit.sweep.space import RAY_RESOURCE_GRANULARITY, SpaceError, expand_space
import sweep  # the CLI at the repository root (pytest puts the root on sys.path: pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]

FLOAT_FIELDS = [name for name, hint in field_types().items() if hint is float]


def assert_refused_in_one_line(capsys, cases: list) -> None:
    """Each `sweep.py --space ... --dry-run` of cases exits 2 with one `error:` line holding every word."""
    for argv, words in cases:
        assert sweep.main(["--space", *argv, "--dry-run"]) == 2, argv
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and err.count("\n") == 1 and "trial_key" not in out, (argv, err)
        for word in words:
            assert word in err, (argv, word, err)


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_nan_and_inf_in_any_float_field_are_refused(name: str) -> None:
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ConfigError) as err:
            TrialConfig.from_dict({name: bad}, source="test")
        assert f"field {name!r} has value {bad!r}" in str(err.value) and "finite" in str(err.value)


@pytest.mark.parametrize("changes, words", [
    ({"epochs": 0}, ["'epochs'", "0", "1..10000"]),
    ({"epochs": 10**9}, ["'epochs'", "1000000000", "1..10000"]),
    ({"pe": "ape+"}, ["'pe'", "'ape+'", "joined by '+'"]),
    ({"pe": "+rope"}, ["'pe'", "'+rope'"]),
    ({"pe": "ape+ rope"}, ["'pe'", "'ape+ rope'"]),
    ({"seed": -1}, ["'seed'", "-1", "0..9223372036854775807"]),
    ({"seed": 2**63}, ["'seed'", str(2**63), "0..9223372036854775807"]),
    ({"train_subset": 2**64}, ["'train_subset'", "64-bit"]),
    ({"data_dir": "/some/folder"}, ["'data_dir'", "'/some/folder'", "digits"]),
])
def test_out_of_range_values_are_refused(changes: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        TrialConfig.from_dict(changes, source="test")
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def _fake_mnist(folder: Path, n_test: int = 20) -> Path:
    rng = np.random.default_rng(0)
    np.savez(folder / "mnist.npz", x_train=rng.integers(0, 256, (50, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, 50).astype(np.uint8),
             x_test=np.zeros((n_test, 28, 28), np.uint8), y_test=np.zeros(n_test, np.uint8))
    return folder


def _cli_cases(tmp: Path) -> list[tuple[list[str], list[str]]]:
    a_file = tmp / "a_file"
    a_file.write_text("not a folder")
    text_npz = tmp / "text"
    text_npz.mkdir()
    (text_npz / "mnist.npz").write_text("x_train,y_train\n1,2\n")
    no_test = tmp / "no_test"
    no_test.mkdir()
    _fake_mnist(no_test, n_test=0)
    cases = [
        (["--lr", "nan"], ["'lr'", "nan", "finite"]),
        (["--weight-decay", "inf"], ["'weight_decay'", "inf", "finite"]),
        (["--kmse-angle", "nan"], ["'kmse_angle'", "nan", "finite"]),
        (["--epochs", "0"], ["'epochs'", "0", "1..10000"]),
        (["--pe", "ape+"], ["'pe'", "'ape+'"]),
        (["--seed", str(2**63)], ["'seed'", str(2**63), "0..9223372036854775807"]),
        (["--val-fraction", "0.9999"], ["train split is empty", "val_fraction=0.9999", "allowed"]),
        (["--val-fraction", "0.0001"], ["'val_fraction'", "0.0001", "holds out 0", "allowed"]),
        (["--checkpoint-dir", str(a_file)], ["checkpoint_dir", str(a_file), "is a file", "allowed"]),
        (["--dataset", "mnist", "--data-dir", str(a_file)], ["'data_dir'", str(a_file), "is a file", "allowed"]),
        (["--dataset", "mnist", "--data-dir", str(text_npz)], ["mnist.npz", "not an .npz", "allowed"]),
        (["--dataset", "mnist", "--data-dir", str(no_test)], ["test split is empty", "allowed"]),
        (["--data-dir", str(tmp)], ["'data_dir'", str(tmp), "digits", "allowed"]),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], ["'device'", "'cuda'", "allowed: cpu, auto"]))
    return cases


def test_cli_refuses_bad_values_before_training_in_one_line(tmp_path, capsys) -> None:
    base = ["--dim", "16", "--depth", "1", "--heads", "2", "--epochs", "1", "--train-subset", "50"]
    for argv, words in _cli_cases(tmp_path):
        argv = base + argv
        t0 = time.time()
        assert cli_main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert "epoch 1/" not in err and "pickle" not in err and time.time() - t0 < 30, (argv, err)
        for word in words:
            assert word in err, (argv, word, err)


def test_flops_of_an_empty_batch_is_a_message_not_a_zero_division() -> None:
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="at least one example"):
        count_flops(model, torch.zeros(0, 4))


def write_space(folder: Path, spec: dict, name: str = "space.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(spec))
    return path


TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "epochs": 1}


def test_sweep_dry_run_refuses_what_a_trial_would_refuse(tmp_path, capsys) -> None:
    space = write_space(tmp_path, {"name": "s", "fixed": TINY, "grid": {"pe": ["ape", "rope"]}})
    nan_space = write_space(tmp_path, {"name": "n", "fixed": {**TINY, "lr": float("nan")}}, "nan.yaml")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        ([str(nan_space)], ["'lr'", "nan", "finite"]),  # `lr: .nan` in the YAML passed the dry run before
        ([str(space), "--set", "lr=.nan"], ["'lr'", "nan", "finite"]),
        ([str(space), "--set", "mlp_ratio=.inf"], ["'mlp_ratio'", "inf", "finite"]),
        ([str(space), "--set", "epochs=0"], ["'epochs'", "1..10000"]),
        ([str(space), "--set", "pe=ape+"], ["'pe'", "'ape+'"]),
        ([str(space), "--set", f"seed={2**63}"], ["'seed'", "0..9223372036854775807"]),
        ([str(space), "--set", "lr=[1"], ["--set lr", "'[1'", "not valid YAML", "allowed"]),
        ([str(space), "--set", "lr={a: 1}"], ["--set lr", "allowed: one YAML scalar"]),
        ([str(space), "--data-dir", str(a_file)], ["--data-dir", str(a_file), "is a file"]),
        ([str(space), "--data-dir", str(tmp_path)], ["--data-dir", "no trial reads a data folder"]),
        ([str(space), "--gpus-per-trial", "nan"], ["gpus_per_trial", "nan", "finite"]),
        ([str(space), "--name", ".."], ["--name", "'..'", "allowed"]),
    ]
    if not torch.cuda.is_available():
        cases.append(([str(space), "--set", "device=cuda"], ["'device'", "'cuda'", "allowed: cpu, auto"]))
    assert_refused_in_one_line(capsys, cases)


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "../up", "", "x" * 101])
def test_sweep_names_are_one_safe_folder_name(tmp_path, name: str) -> None:
    with pytest.raises(SpaceError, match="allowed: 1-100 letters"):
        expand_space({"name": name, "fixed": TINY}, source="space.yaml")
    space = expand_space({"name": "fine", "fixed": TINY}, source="space.yaml")
    space.name = name  # as sweep.py --name did before checking
    results = tmp_path / "a" / "results"
    with pytest.raises(SpaceError, match="sweep name"):
        run_sweep(space, SweepOptions(results_dir=results))
    assert not (tmp_path / "a").exists()  # nothing written, least of all next to --results-dir


def test_huge_spaces_are_counted_and_refused_before_expanding(tmp_path, capsys, monkeypatch) -> None:
    """Refused from the count alone: no grid point is built and no trial validated (checked by
    counting, not by timing: tests never time things; benchmarks/sweep_overhead.py measures the runner)."""
    built = {"points": 0, "configs": 0}
    product, from_dict = space_module._product, TrialConfig.from_dict.__func__

    def counted_product(grid):
        built["points"] += 1
        return product(grid)

    def counted_from_dict(cls, values, **kwargs):
        built["configs"] += 1
        return from_dict(cls, values, **kwargs)

    monkeypatch.setattr(space_module, "_product", counted_product)
    monkeypatch.setattr(TrialConfig, "from_dict", classmethod(counted_from_dict))
    ten = list(range(10))
    huge = {"name": "huge", "fixed": TINY, "grid": {"seed": ten, "dim": [16, 32], "num_features": ten,
                                                    "rotinv_draws": [1 + i for i in ten], "kmse_draws": ten,
                                                    "bench_iters": [1 + i for i in ten],
                                                    "reflection_count": [1 + i for i in ten]},
            "seeds": [0, 1, 2, 3, 4]}  # 2 * 10^6 grid points x 5 seeds = 10^7 trials
    with pytest.raises(SpaceError) as err:
        expand_space(huge, source="huge.yaml")
    assert built == {"points": 0, "configs": 0}
    assert "10,000,000 trials" in str(err.value) and "at most 10,000" in str(err.value)
    assert "--max-trials" in str(err.value)

    path = write_space(tmp_path, huge)
    assert sweep.main(["--space", str(path), "--dry-run"]) == 2
    assert "10,000,000 trials" in capsys.readouterr().err and built["points"] == 0
    assert sweep.main(["--space", str(path), "--dry-run", "--max-trials", "0"]) == 2
    assert "--max-trials" in capsys.readouterr().err

    # what is allowed expands, validating each trial once
    big = {"name": "big", "fixed": TINY, "grid": {"num_features": [1 + i for i in range(100)],
                                                  "seed": list(range(100))}}
    space = expand_space(big, source="big.yaml")
    assert len(space.trials) == 10_000 and built["configs"] <= 10_000, built
    assert built["points"] > 0  # the counters see expansion, so their zeros above mean none happened
    with pytest.raises(SpaceError, match="10,000 trials.*at most 9,999"):
        expand_space(big, source="big.yaml", max_trials=9_999)


# ---- issue 31, items 11 and 16: options and values that used to pass, or end in a traceback
def test_sweep_options_that_ray_or_tune_would_misread_are_refused(tmp_path, capsys) -> None:
    space = write_space(tmp_path, {"name": "s", "fixed": {**TINY, "dataset": "mnist"}})
    digits = write_space(tmp_path, {"name": "d", "fixed": TINY}, "digits.yaml")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        ([str(space), "--max-failures", "-1"], ["--max-failures", "-1", "allowed: an integer >= 0"]),
        ([str(space), "--cpus-per-trial", "0.00001"], ["cpus_per_trial", "1e-05", "0.0001", "Ray's resource"]),
        ([str(space), "--gpus-per-trial", "0.00005"], ["gpus_per_trial", "5e-05", "0.0001"]),
        ([str(space), "--results-dir", str(a_file)], ["--results-dir", str(a_file), "is a file", "allowed"]),
        ([str(space), "--results-dir", str(a_file / "sub")], ["--results-dir", "is a file", "allowed"]),
        ([str(space), "--set", 'data_dir="a\\0b"'], ["'data_dir'", "'a\\x00b'", "NUL", "allowed"]),
    ]
    assert_refused_in_one_line(capsys, cases)
    assert not (a_file.is_dir()) and a_file.read_text() == "x"
    for fine in (["--max-failures", "0"], ["--cpus-per-trial", "0.0001"]):
        assert sweep.main(["--space", str(digits), "--dry-run", *fine]) == 0, fine
    capsys.readouterr()
    from ray._private.ray_constants import MIN_RESOURCE_GRANULARITY

    assert RAY_RESOURCE_GRANULARITY == MIN_RESOURCE_GRANULARITY  # the copy the dry run uses (no Ray import)


def test_a_results_dir_that_cannot_hold_the_sweep_is_one_line_not_a_traceback(tmp_path, capsys) -> None:
    """What the dry run checks is also what the run says (the lock makes the folder)."""
    space = write_space(tmp_path, {"name": "s", "fixed": TINY})
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert sweep.main(["--space", str(space), "--results-dir", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file" in err and "Traceback" not in err, err
    from rpevit.sweep.lock import sweep_lock

    with pytest.raises(SpaceError, match="cannot be created.*allowed"):
        with sweep_lock(a_file / "s"):
            pass
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert sweep.main(["--space", str(space), "--results-dir", str(locked), "--dry-run"]) == 2
        assert "not writable" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, limit", [("--dim", "100000000000", "1..8192"),
                                                ("--rotinv-degree", "1000", "0..16"),
                                                ("--bench-batch", "10000000000", "1..65536"),
                                                ("--kmse-dim", "1000000000", "1..4096")])
def test_sizes_that_only_the_allocator_would_refuse_are_bounded_in_the_cli(capsys, flag, value, limit) -> None:
    task = {"--bench-batch": "bench", "--kmse-dim": "kernel_mse"}.get(flag, "train")
    t0 = time.time()
    assert cli_main(["--task", task, flag, value, "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    name = flag[2:].replace("-", "_")
    assert err.count("\n") == 1 and f"field {name!r} has value {value}; allowed: an integer in {limit}" in err, err
    assert time.time() - t0 < 5
    TrialConfig.from_dict({"task": task, name: int(limit.split("..")[1])})  # the bound itself is allowed


# ---- issue 39, items 5, 6 and 9: bounded waits, one line, and a dry run that checks the data file
def test_a_space_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, capsys) -> None:
    import threading

    fifo = tmp_path / "space.yaml"
    os.mkfifo(fifo)  # open() would wait for a writer forever
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(sweep.main(["--space", str(fifo), "--dry-run"])),
                              daemon=True)
    worker.start()
    worker.join(20)
    assert codes == [2], "sweep.py blocked on a FIFO named by --space"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{fifo}: the space file is a named pipe (FIFO); allowed: a YAML space file" in err
    for path, what in ((tmp_path, "a folder"), (Path("/dev/zero"), "a device")):
        assert sweep.main(["--space", str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"the space file is {what}; allowed" in err, err


@pytest.mark.parametrize("value, env", [("bogus", False), ("bogus", True), ("127.0.0.1:99999", False),
                                        ("local", False), ("http://127.0.0.1:8265", True), ("host:", False)])
def test_a_cluster_address_of_no_known_form_is_one_line_before_ray(tmp_path, capsys, monkeypatch, value, env) -> None:
    space = write_space(tmp_path, {"name": "s", "fixed": TINY})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if env:
        monkeypatch.setenv("RAY_ADDRESS", value)
    argv = ["--space", str(space), "--results-dir", str(tmp_path / "r"), *([] if env else ["--address", value])]
    for extra in (["--dry-run"], []):
        assert sweep.main(argv + extra) == 2
        err = capsys.readouterr().err
        where = "$RAY_ADDRESS" if env else "--address"
        assert err.count("\n") == 1 and f"error: {where} has value {value!r}; allowed: auto" in err, err


def test_a_cluster_address_nothing_answers_at_is_refused_at_once(tmp_path) -> None:
    import socket

    from rpevit.sweep import session

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{taken.getsockname()[1]}"  # bound, not listening: refused
        t0 = time.monotonic()
        with pytest.raises(SpaceError, match=f"--address has value '{dead}', but no Ray head answers there "
                                             f"\\(ConnectionRefusedError"):
            session.probe_address(dead)
        assert time.monotonic() - t0 < session.PROBE_TIMEOUT_S
        taken.listen(1)
        session.probe_address(dead)  # something listens: Ray is asked (bounded by JOIN_TIMEOUT_S)
    assert session.check_address("auto") is None and session.check_address("[::1]:6379") == ("::1", 6379)
    assert session.check_address("ray://head.cluster:10001") == ("head.cluster", 10001)


@pytest.mark.slow
def test_a_dead_or_silent_cluster_address_ends_the_sweep_in_one_line_in_bounded_time(tmp_path) -> None:
    import socket
    import subprocess
    import sys

    space = write_space(tmp_path, {"name": "s", "fixed": TINY})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{taken.getsockname()[1]}"
        env = {**os.environ, "RAY_ADDRESS": dead}
        done = subprocess.run([sys.executable, "sweep.py", "--space", str(space), "--results-dir", str(tmp_path / "r")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"error: $RAY_ADDRESS has value '{dead}', but no Ray head answers there" in done.stderr
    # something accepts the connection but never speaks Ray's protocol: Ray would wait for good
    silent = ("import runpy, socket, sys, threading\n"
              "server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen(8)\n"
              "threading.Thread(target=lambda: [server.accept() for _ in iter(int, 1)], daemon=True).start()\n"
              "from rpevit.sweep import session\n"
              "session.JOIN_TIMEOUT_S = 15.0\n"
              "sys.argv = ['sweep.py', *sys.argv[1:], '--address', '127.0.0.1:%d' % server.getsockname()[1]]\n"
              "runpy.run_path('sweep.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", silent, "--space", str(space), "--results-dir", str(tmp_path / "r")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "but no Ray cluster answered there within 15 s" in errors[0], done.stderr[-2000:]


def test_the_dry_run_checks_the_data_file_as_a_trial_will(tmp_path, capsys, monkeypatch) -> None:
    """What a trial would refuse: a warning line in the dry run (its table still shown), one refusal
    line before Ray starts in a real run."""
    monkeypatch.setenv("RPEVIT_OFFLINE", "1")
    space = write_space(tmp_path, {"name": "m", "fixed": {**TINY, "dataset": "mnist"}})
    folder_npz = tmp_path / "as_folder"
    (folder_npz / "mnist.npz").mkdir(parents=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ([str(space), "--data-dir", str(folder_npz)], ["dataset file", "mnist.npz is not a file", "allowed"]),
        ([str(space), "--data-dir", str(empty)], ["mnist.npz does not exist and downloads are off",
                                                  "RPEVIT_OFFLINE=1"]),
    ]
    for argv, needles in cases:
        assert sweep.main(["--space", *argv, "--dry-run"]) == 0
        warnings = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("warning: data: ")]
        assert len(warnings) == 1 and all(n in warnings[0] for n in needles), warnings
        assert "the sweep would stop here" in warnings[0]
    for argv, needles in cases:  # a real run: one line, before Ray starts, nothing written
        results = tmp_path / "results"
        assert sweep.main(["--space", *argv, "--results-dir", str(results)]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and all(n in err for n in needles), err
        assert not results.exists()
    (empty / "mnist.npz").write_bytes(b"")  # there: the dry run passes (the trial reads and checks it)
    assert sweep.main(["--space", str(space), "--data-dir", str(empty), "--dry-run"]) == 0
    assert "warning: data" not in capsys.readouterr().out
    monkeypatch.delenv("RPEVIT_OFFLINE")  # online, a missing file is downloaded by the trial: a warning only
    assert sweep.main(["--space", str(space), "--data-dir", str(tmp_path / "fresh"), "--dry-run"]) == 0
    assert not (tmp_path / "fresh").exists()  # and the dry run downloads nothing


@pytest.mark.slow
def test_an_embedded_ray_that_cannot_start_is_one_line_not_a_traceback(tmp_path) -> None:
    """Issue 59 (adversary, item 7): a Ray start-up failure printed Ray's raw traceback. A real failure here: a
    temp folder whose socket paths exceed the 107 bytes AF_UNIX allows (Ray refuses it at once)."""
    import subprocess
    import sys

    long_tmp = Path("/tmp") / ("r" * 100)  # /tmp/rrr.../rpevit-<uid>/ray/session_.../sockets/plasma_store > 107
    long_tmp.mkdir(exist_ok=True)
    env = {**os.environ, "RAY_TMPDIR": str(long_tmp), "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "sweep.py", "--space", "search_spaces/smoke.yaml", "--results-dir",
                               str(tmp_path), "--no-dashboard"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
    finally:
        import shutil

        shutil.rmtree(long_tmp, ignore_errors=True)
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith("error: the embedded Ray did not start in ")
    assert "AF_UNIX path length" in errors[0] and "RAY_TMPDIR" in errors[0]
