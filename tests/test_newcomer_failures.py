"""What a new user reads when a trial fails, when data is missing, and when they press Ctrl-C (issue 59,
items 3 and 5).

- A failed trial's error is the whole message of the exception that ended it, as one line (it was the
  traceback's last line: for a download error that quotes the server, `); put mnist.npz ...`), and the
  console gets one line per failed try instead of Tune's ~150-line traceback (kept whole in the row).
- A dataset file that is plainly missing stops a local sweep in one line before Ray starts, whether or not
  RPEVIT_OFFLINE says downloads are off: the driver fetches it once itself, or says why it cannot.
- With no trial finished ok, the throughput line says so instead of `nan s per trial`.
- Ctrl-C: the progress line does not count stopped trials as done, the driver says "interrupted", exits
  130 (the convention; 1 is a failed trial's code), and Ray's `Tuner.restore(...)` hint, which contradicts
  rpevit's `continue with: ... --resume` line, is not printed.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rpevit.config import ConfigError
from rpevit.sweep.space import expand_space

ROOT = Path(__file__).resolve().parents[1]

# the end of a real error file: `python sweep.py` with mnist and an empty --data-dir on a machine without network
DOWNLOAD_FAILURE = """Failure # 1 (occurred at 2026-11-27_21-34-36)
ray::ImplicitFunc.train() (pid=32410, ip=127.0.0.1, actor_id=8025d3730a905d8d2d0a528a01000000, repr=run_trial)
  File "/work/main/rpevit/data.py", line 287, in <dictcomp>
    parts = {split: cls(str(cache), train=(split == "train"), download=True)
RuntimeError: Error downloading train-images-idx3-ubyte.gz:
Tried https://ossci-datasets.s3.amazonaws.com/mnist/, got:
<urlopen error [Errno -2] Name or service not known>

The above exception was the direct cause of the following exception:

ray::ImplicitFunc.train() (pid=32410, ip=127.0.0.1, actor_id=8025d3730a905d8d2d0a528a01000000, repr=run_trial)
  File "/work/main/rpevit/data.py", line 291, in _download
    raise DataError(f"dataset {name!r}: {path} does not exist and the download failed "
rpevit.data.DataError: dataset 'mnist': /tmp/x/mnist.npz does not exist and the download failed (RuntimeError: \
Error downloading train-images-idx3-ubyte.gz:
Tried https://ossci-datasets.s3.amazonaws.com/mnist/, got:
<urlopen error [Errno -2] Name or service not known>
Tried http://yann.lecun.com/exdb/mnist/, got:
<urlopen error [Errno -2] Name or service not known>
); put mnist.npz (keys x_train, y_train, x_test, y_test; uint8) in /tmp/x, or pass --data-dir / set RPEVIT_DATA \
to a folder that holds it
"""
WHOLE_ERROR = ("rpevit.data.DataError: dataset 'mnist': /tmp/x/mnist.npz does not exist and the download failed "
               "(RuntimeError: Error downloading train-images-idx3-ubyte.gz: Tried "
               "https://ossci-datasets.s3.amazonaws.com/mnist/, got: <urlopen error [Errno -2] Name or service not "
               "known> Tried http://yann.lecun.com/exdb/mnist/, got: <urlopen error [Errno -2] Name or service not "
               "known> ); put mnist.npz (keys x_train, y_train, x_test, y_test; uint8) in /tmp/x, or pass "
               "--data-dir / set RPEVIT_DATA to a folder that holds it")

SPACE = {"name": "newcomer", "task": "train", "fixed": {"dataset": "digits", "epochs": 1},
         "grid": {"attention": ["softmax", "favor"]}, "seeds": [0]}


def failed_trial(tmp_path: Path, key: str, label: str = "attention=softmax") -> SimpleNamespace:
    error_file = tmp_path / "error.txt"
    error_file.write_text(DOWNLOAD_FAILURE)
    return SimpleNamespace(trial_id="t0", error_file=str(error_file), status="ERROR",
                           config={"trial": {"name": key, "members": [{"trial_key": key, "label": label, "cfg": {}}]}})


def test_a_failed_trials_error_is_its_whole_message_in_one_line(tmp_path):
    from rpevit.sweep.store import read_rows
    from rpevit.sweep.writer import ParquetResults, error_line

    assert error_line(DOWNLOAD_FAILURE) == WHOLE_ERROR
    assert error_line("Traceback ...\n  File x\nValueError: bad") == "ValueError: bad"
    assert error_line("") == "unknown error (no error file)"
    space = expand_space(SPACE, source="space.yaml")
    key = space.keys[0]
    writer = ParquetResults(tmp_path / "out", space.name, {key: space.trials[0]}, {key: 0})
    writer.on_trial_error(0, [], failed_trial(tmp_path, key))
    writer.on_experiment_end([])
    row, = read_rows(tmp_path / "out" / "trials.parquet")
    assert row["status"] == "failed" and row["error"] == WHOLE_ERROR
    assert row["error_traceback"] == DOWNLOAD_FAILURE  # the traceback itself stays whole


def test_the_summary_of_a_sweep_with_a_failed_trial_gives_the_command_that_reruns_it(tmp_path, capsys):
    """A plain --resume counts a failed trial as done ("1 already done, 0 to run"): the summary names the
    --retry-failed command, with the sweep's own folders and trial-selecting flags."""
    from rpevit.sweep.summary import ResumeInfo, compute_summary, print_summary
    from rpevit.sweep.writer import ParquetResults

    space = expand_space(SPACE, source="space.yaml")
    key = space.keys[0]
    writer = ParquetResults(tmp_path / "out" / space.name, space.name, {key: space.trials[0]}, {key: 0})
    writer.on_trial_error(0, [], failed_trial(tmp_path, key))
    writer.on_experiment_end([])
    summary = compute_summary(tmp_path / "out" / space.name, space, wall_s=1.0,
                              resume=ResumeInfo(tmp_path / "out", "DATA", ("--only", "attention=softmax")))
    assert summary.retry_command == (f"python sweep.py --space space.yaml --name newcomer --results-dir {tmp_path / 'out'} "
                                     f"--data-dir DATA --only attention=softmax --retry-failed --resume")
    print_summary(summary)
    err = capsys.readouterr().err
    assert err.rstrip().endswith(summary.retry_command) and "does not run it again" in err


def test_the_summary_of_a_sweep_without_failures_gives_no_retry_command(tmp_path):
    from rpevit.sweep.summary import compute_summary

    space = expand_space(SPACE, source="space.yaml")
    assert compute_summary(tmp_path / "empty", space, wall_s=0.0).retry_command == ""


def test_the_console_gets_one_line_per_failed_try(tmp_path, capsys):
    from rpevit.sweep.tune_run import Progress

    progress = Progress(total=1, every_s=1e9, out_dir=tmp_path / "out")
    trial = failed_trial(tmp_path, "0123456789abcdef")
    progress.on_trial_recover(0, [trial], trial)
    progress.on_trial_error(0, [trial], trial)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trial ")]
    assert len(lines) == 2
    assert lines[0].startswith("trial 0123456789abcdef (attention=softmax) failed; retried from its last checkpoint: "
                               + WHOLE_ERROR)
    assert lines[1].startswith("trial 0123456789abcdef (attention=softmax) failed: " + WHOLE_ERROR)
    assert "error_traceback in" in lines[1] and "log.txt" in lines[1]


def test_tunes_own_trial_tracebacks_are_off_while_it_runs():
    """TUNE_PRINT_ALL_TRIAL_ERRORS=0 (Tune's documented switch) is set around Tuner.fit(); read here from the
    source, since a real failing run takes a minute (the Progress line above stands in for it)."""
    from rpevit.sweep import tune_run

    assert tune_run.TRIAL_ERRORS_ENV == "TUNE_PRINT_ALL_TRIAL_ERRORS"
    source = Path(tune_run.__file__).read_text()
    assert "TRIAL_ERRORS_ENV: \"0\"" in source


def sweep_args(tmp_path: Path, **changes) -> argparse.Namespace:
    import sweep

    return sweep.build_parser().parse_args(["--space", str(tmp_path / "space.yaml"),
                                            "--results-dir", str(tmp_path / "results"),
                                            *[a for k, v in changes.items() for a in (f"--{k}", v)]])


def test_a_missing_dataset_file_is_one_line_before_ray_starts_without_rpevit_offline(tmp_path, monkeypatch):
    """The folder lacks mnist.npz and downloads are not switched off: the driver tries the download once
    itself (here: the machine's network refuses, as offline) and stops in one line naming the file."""
    import sweep
    from rpevit import data

    monkeypatch.delenv("RPEVIT_OFFLINE", raising=False)
    tried = []

    def offline(name, folder, path):
        tried.append(path)
        raise data.DataError(f"dataset {name!r}: {path} does not exist and the download failed (RuntimeError: "
                             f"Error downloading:\nTried https://example.org/, got:\n<urlopen error>\n); put "
                             f"{path.name} in {folder}")

    monkeypatch.setattr(data, "_download", offline)
    space = expand_space({**SPACE, "fixed": {"dataset": "mnist", "epochs": 1}}, source="space.yaml")
    empty = tmp_path / "data"
    empty.mkdir()
    with pytest.raises(ConfigError) as err:
        sweep.check_options(sweep_args(tmp_path, **{"data-dir": str(empty)}), space)
    assert tried == [empty / "mnist.npz"]  # once for the sweep, not once per trial
    message = " ".join(str(err.value).split())
    assert message.startswith(f"--data-dir '{empty}': dataset 'mnist': {empty / 'mnist.npz'} does not exist")
    assert "put mnist.npz in" in message


def test_a_file_that_is_there_is_not_fetched(tmp_path, monkeypatch):
    import sweep
    from rpevit import data
    from rpevit.sweep import dry_run

    monkeypatch.delenv("RPEVIT_OFFLINE", raising=False)
    monkeypatch.setattr(data, "_download", lambda *a: pytest.fail("downloaded a file that is there"))
    monkeypatch.setattr(data, "load_arrays", lambda *a: pytest.fail("read a file that is there"))
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "mnist.npz").write_bytes(b"")
    space = expand_space({**SPACE, "fixed": {"dataset": "mnist", "epochs": 1}}, source="space.yaml")
    dry_run.fetch_missing(space, str(folder))
    sweep.check_options(sweep_args(tmp_path, **{"data-dir": str(folder)}), space)
    assert (folder / "mnist.npz").read_bytes() == b"" and sorted(folder.iterdir()) == [folder / "mnist.npz"]


def test_no_trial_finished_ok_says_so_instead_of_nan(tmp_path):
    from rpevit.sweep.summary import compute_summary
    from tests.test_sweep_summary import write_rows

    space = expand_space(SPACE, source="space.yaml")
    write_rows(tmp_path, space, {}, failed={0: "ValueError: bad", 1: "ValueError: bad"})
    summary = compute_summary(tmp_path, space, wall_s=21.5, slots=1)
    assert "nan" not in summary.throughput
    assert summary.throughput == ("wall time 21.5 s; no trial of this run finished ok, so there is no per-trial "
                                  "overhead figure")


# ---- Ctrl-C (item 5) ----
def test_stopped_trials_are_not_counted_as_done(capsys):
    from rpevit.sweep.tune_run import Progress

    def trial(key: str, status: str) -> SimpleNamespace:
        return SimpleNamespace(trial_id=key, status=status, config={"trial": {"name": key, "members": [
            {"trial_key": key, "label": f"attention={key}", "cfg": {}}]}})

    finished, stopped, running = trial("a", "TERMINATED"), trial("b", "TERMINATED"), trial("c", "RUNNING")
    progress = Progress(total=3, every_s=1e9)
    progress.on_trial_result(0, [], finished, {"kind": "summary", "trial_key": "a", "row": {"test_acc": 0.9}})
    progress.show([finished, stopped, running], force=True)
    line = capsys.readouterr().out
    assert "running 1 | pending 0 | done 1 | failed 0 | stopped 1 | of 3" in line
    assert "best judged test acc 90.00% (attention=a)" in line  # percent, as the summary and report.md


def test_tunes_ctrl_c_lines_are_replaced_by_rpevits(capsys):
    from rpevit.sweep.tune_run import INTERRUPTED_LINE, TUNE_LOGGER, _tune_lines

    log = logging.getLogger(TUNE_LOGGER)
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    log.addHandler(keep)
    try:
        with _tune_lines() as lines:
            log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run. Press CTRL+C to skip.")
            log.error("Trials did not complete: [a, b]")
            log.warning("Experiment has been interrupted, but the most recent state was saved.\nResume experiment "
                        "with: Tuner.restore(path=\"/x\", trainable=...)")
            log.warning("something else")
    finally:
        log.removeHandler(keep)
    assert lines.interrupted and seen == ["something else"]
    assert INTERRUPTED_LINE in capsys.readouterr().out


def test_an_interrupted_run_exits_130_with_the_resume_command(tmp_path, capsys):
    from rpevit.sweep.summary import compute_summary, print_summary
    from tests.test_sweep_summary import write_rows

    space = expand_space(SPACE, source="space.yaml")
    write_rows(tmp_path, space, {0: {"test_acc": 0.9}})
    summary = compute_summary(tmp_path, space, wall_s=5.0, slots=1, interrupted=True)
    assert summary.outcome.exit_code == 130
    print_summary(summary)
    printed = capsys.readouterr().out
    assert "interrupted (Ctrl-C)" in printed and "1 ok, 0 failed, 1 not run" in printed
    assert re.search(r"continue with: .*sweep\.py --space space\.yaml .*--resume", printed)
    assert "judged test acc in %: mean [95% interval] (n seeds)" in printed and "90 (no interval" in printed


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_says_so_and_exits_130(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the driver's whole process group) while trials run."""
    space = {"name": "ctrlc", "task": "train",
             "fixed": {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 400, "epochs": 200,
                       "batch_size": 50, "eval_draws": 1, "drop_path": 0.0},
             "grid": {"attention": ["softmax", "relu"]}, "seeds": [0], "resources": {"cpus_per_trial": 1}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    driver = subprocess.Popen([sys.executable, "sweep.py", "--space", str(tmp_path / "space.yaml"), "--results-dir",
                               str(tmp_path / "results"), "--no-dashboard"], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        logs = tmp_path / "results" / "ctrlc" / "trials"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(p.stat().st_size for p in logs.glob("*/log.txt")):
            time.sleep(1)  # a trial is training
        time.sleep(3)
        os.killpg(driver.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
        out, _ = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 130, out[-3000:]
    assert "interrupted (Ctrl-C)" in out and "Tuner.restore" not in out
    assert re.search(r"continue with: .*--resume", out)
    progress = [line for line in out.splitlines() if re.match(r"\[\d\d:\d\d:\d\d\] running", line)]
    assert "done 0" in progress[-1], progress[-1]  # 200 epochs: no trial finished, none counted as done


def test_a_trials_pickled_error_is_never_unpickled_and_a_fifo_error_file_is_named(tmp_path):
    """Without Tune's text error file the writer read `trial.get_pickled_error()` (cloudpickle.loads of a file
    in the trial's folder: a file is untrusted, never unpickled; this test failed before, the pickle's
    payload ran). Ray writes the text file whenever it writes the pickle, so the text is all there is to read."""
    import pickle

    from rpevit.sweep.writer import error_line, trial_traceback

    ran = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (ran,))

    pickled = tmp_path / "error.pkl"
    pickled.write_bytes(pickle.dumps(Payload()))
    trial = SimpleNamespace(trial_id="t0", error_file=str(tmp_path / "error.txt"),
                            get_pickled_error=lambda: pickle.loads(pickled.read_bytes()))
    assert error_line(trial_traceback(trial)) == "unknown error (no error file)" and not ran.exists()
    os.mkfifo(tmp_path / "error.txt")
    writer = threading.Timer(5.0, lambda: os.close(os.open(tmp_path / "error.txt", os.O_WRONLY | os.O_NONBLOCK)))
    writer.start()  # a reader stuck opening the FIFO is let go after 5 s: the test fails instead of hanging
    started = time.monotonic()
    try:
        assert "it is a named pipe" in trial_traceback(trial) and time.monotonic() - started < 5
    finally:
        writer.cancel()
    assert not ran.exists()
