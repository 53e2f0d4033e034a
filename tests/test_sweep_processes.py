"""rpevit/sweep/runner.py, lock.py, reaper.py with real processes and a real Ray: one driver per
sweep, loopback-only embedded Ray, Ray ends with a SIGKILLed driver and `--resume` of a fresh sweep
says so.

One sweep driver A runs a single ~10 s trial; while it runs, its processes' sockets are checked
and a second driver B is started on the same sweep; then A is SIGKILLed and every process it
started (gcs_server, raylet, agents, workers) must be gone within seconds.
"""
from __future__ import annotations

import pytest

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import ray  # noqa: F401  (puts Ray's bundled psutil on the path)
import psutil  # noqa: E402
import yaml

from tests.process_output import Output

pytestmark = pytest.mark.slow  # Ray and real sweeps: `pytest -m "not slow"` leaves them out

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
SPACE = {"name": "locked", "fixed": {"dataset": "digits", "dim": 32, "depth": 2, "heads": 4, "epochs": 80,
                                     "batch_size": 64, "eval_draws": 0},
         "grid": {"pe": ["rope"]}, "resources": {"cpus_per_trial": 1}}


def start(space_file: Path, results: Path, *flags: str) -> tuple[subprocess.Popen, Output]:
    proc = subprocess.Popen([sys.executable, "sweep.py", "--space", str(space_file), "--results-dir", str(results),
                             *flags], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, Output(proc)


def wait_catching(proc: subprocess.Popen, signum: int, timeout: float = 30) -> None:
    """Until the process catches `signum` (its bit in /proc's SigCgt: sweep.py's first statement installs
    rpevit.sigterm's handler). A fixed 0.3 s wait could send SIGTERM before that on a stalled machine: -15
    and no line, not the 143 the test is about (exec to install() took up to 162 ms here, loaded)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        caught = next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                      if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) >> (signum - 1) & 1:
            return
        time.sleep(0.005)
    pytest.fail(f"pid {proc.pid} did not install a handler of signal {signum} within {timeout} s "
                f"(exit code {proc.poll()})")


def family(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening(procs: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """(process name, ip, port) of every listening TCP socket and bound UDP socket of procs."""
    out = []
    for proc in procs:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN or (conn.type == 2 and conn.laddr):  # 2: SOCK_DGRAM
                    out.append((proc.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    return out


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_one_driver_per_sweep_loopback_ray_and_ray_dies_with_a_killed_driver(tmp_path):
    space_file, results = tmp_path / "locked.yaml", tmp_path / "results"
    space_file.write_text(yaml.safe_dump(SPACE))
    ckpt = results / "locked" / "trials"
    a, a_lines = start(space_file, results, "--resume")  # --resume of a sweep that never ran
    seen: list[psutil.Process] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and a.poll() is None and not list(ckpt.glob("*/checkpoint.pt")):
            time.sleep(0.2)
        assert a.poll() is None and list(ckpt.glob("*/checkpoint.pt")), "".join(a_lines)[-3000:]
        assert any("nothing to resume, starting" in ln for ln in a_lines), "".join(a_lines)[-3000:]

        # 6: every socket of the driver and of the Ray it started is on loopback
        seen = family(a.pid)
        names = {p.name() for p in alive(seen)}
        assert {"gcs_server", "raylet"} <= names, names
        sockets = listening(seen)
        assert len(sockets) >= 5, sockets
        exposed = [s for s in sockets if s[1] not in LOOPBACK]
        assert not exposed, f"Ray listens beyond loopback: {exposed}"

        # 4: a second driver on the same sweep stops at once, naming the holder
        b, b_lines = start(space_file, results, "--resume")
        assert b.wait(timeout=60) == 2
        out_b = b_lines.whole()
        assert "in use by another driver" in out_b and f"pid {a.pid}" in out_b, out_b[-2000:]
        # no Ray of its own; not timed: under contention its imports alone took 24 s (the wait's 60 s is the
        # hang guard)
        assert "ray started" in "".join(a_lines) and "ray started" not in out_b, out_b[-2000:]
        assert a.poll() is None  # A was not disturbed

        # 10: SIGKILL the driver alone; everything it started ends within seconds
        seen = list({p.pid: p for p in [*seen, *family(a.pid)]}.values())
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        deadline = time.time() + 10
        while alive(seen) and time.time() < deadline:
            time.sleep(0.2)
        left = [(p.pid, p.name()) for p in alive(seen)]
        assert not left, f"still running {time.time() - deadline + 10:.1f} s after the driver's SIGKILL: {left}"
    finally:
        for proc in alive(seen):  # whatever a failed assertion left behind is ours to end
            proc.kill()

    # 4: the killed driver's lock file is still there (naming it) but the lock is gone with it; that
    # --resume then goes through it and finishes is tested with a real SIGKILL in test_sweep_cli.py
    assert f"pid {a.pid}" in (results / "locked" / ".sweep.lock").read_text()
    from rpevit.sweep.lock import sweep_lock

    with sweep_lock(results / "locked"):
        pass


# ---- issue 39, item 4: SIGTERM at any moment ends the driver with 143 and one line, Ray shut down
TERM_DURING_INIT = """
import os, runpy, signal, sys, threading
from rpevit.sweep import session  # no Ray import yet: sweep.py's own order of imports is kept

name, delay = sys.argv[1], float(sys.argv[2])  # session._init_ray (Ray starts) or session.import_ray
real = getattr(session, name)
def signalled(*args, **kwargs):  # SIGTERM while Ray is imported or starts
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM)).start()
    return real(*args, **kwargs)
setattr(session, name, signalled)
sys.argv = ["sweep.py", *sys.argv[3:]]
runpy.run_path("sweep.py", run_name="__main__")
"""


def stopped(proc: subprocess.Popen, lines: Output, seen: list[psutil.Process], results: Path) -> None:
    """The driver ended on SIGTERM as it should: 143, one line saying so, no traceback or abort dump,
    every process it started gone, the sweep lock free."""
    try:
        assert proc.wait(timeout=120) == 143, "".join(lines)[-3000:]
        out = lines.whole()
        assert out.count("SIGTERM received, stopping") == 1, out[-3000:]
        for noise in ("Traceback", "*** SIGTERM", "SIGABRT", "Exception ignored"):
            assert noise not in out, out[-3000:]
        deadline = time.time() + 15
        while alive(seen) and time.time() < deadline:
            time.sleep(0.2)
        assert not alive(seen), [(p.pid, p.name()) for p in alive(seen)]
    finally:
        for p in alive(seen):
            p.kill()
    from rpevit.sweep.lock import sweep_lock

    with sweep_lock(results / "locked"):
        pass


SWALLOWED_DURING_IMPORTS = """
import os, signal, sys
from rpevit import sigterm
sigterm.install()  # as sweep.py does before its imports
if sys.argv[1] == "work":
    sigterm.imports_done()
try:  # what torch's C extension does with its optional numpy import: any error raised is cleared
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(100000))  # the handler runs between bytecodes, in here
    finally:
        print("unwound", flush=True)
except BaseException:
    pass
print("went on after SIGTERM", flush=True)
"""


def test_sigterm_while_importing_exits_even_where_an_import_swallows_the_exit():
    """CI saw a SIGTERM land in torch's import of numpy: the SystemExit was cleared there, numpy was left
    half imported and the driver died of a RecursionError in scipy's import, status 1. Until the driver's
    imports are done, nothing needs unwinding and the handler exits 143 at once; after, it raises, so that
    every `finally` runs."""
    for phase, out_expected in (("imports", ""), ("work", "unwound\nwent on after SIGTERM\n")):
        run = subprocess.run([sys.executable, "-c", SWALLOWED_DURING_IMPORTS, phase], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        from rpevit.sigterm import EXIT_CODE, LINE

        assert run.stderr == LINE, (phase, run.stderr)
        assert run.stdout == out_expected, (phase, run.stdout)
        assert run.returncode == (EXIT_CODE if phase == "imports" else 0), (phase, run.returncode)


@pytest.mark.parametrize("moment", ["imports", "ray.import", "ray.init", "ray.init+1s", "tune"])
def test_sigterm_at_any_moment_exits_143_in_one_line(tmp_path, moment):
    space_file, results = tmp_path / "locked.yaml", tmp_path / "results"
    space_file.write_text(yaml.safe_dump(SPACE))
    argv = ["--space", str(space_file), "--results-dir", str(results), "--no-dashboard"]
    if moment.startswith("ray."):
        delay = "1.0" if moment.endswith("+1s") else "0.0"
        name = "import_ray" if moment == "ray.import" else "_init_ray"
        proc = subprocess.Popen([sys.executable, "-c", TERM_DURING_INIT, name, delay, *argv], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines = Output(proc)
    else:
        proc, lines = start(space_file, results, "--no-dashboard")
    seen: list[psutil.Process] = []
    if moment == "imports":  # python is importing torch, pandas, rpevit (~2.5 s of CPU) once its handler is in
        wait_catching(proc, signal.SIGTERM)
    elif moment == "tune":
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not list(results.glob("locked/trials/*/checkpoint.pt")):
            seen = list({p.pid: p for p in [*seen, *family(proc.pid)]}.values())
            time.sleep(0.2)
        assert proc.poll() is None, "".join(lines)[-3000:]
    if moment.startswith("ray."):  # the driver signals itself; what it starts meanwhile is watched
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            seen = list({p.pid: p for p in [*seen, *family(proc.pid)]}.values())
            time.sleep(0.1)
    else:
        seen = list({p.pid: p for p in [*seen, *family(proc.pid)]}.values())
        proc.send_signal(signal.SIGTERM)
    stopped(proc, lines, seen, results)


# ---- issue 39, item 11: the embedded Ray's sessions (trial logs among them) are this user's alone
PRIVATE_SESSION = """
import os, stat, sys
from rpevit.sweep import session
import ray
with session.ray_session(None, True, 0.0):
    folder = ray._private.worker._global_node.get_session_dir_path()  # where this Ray keeps logs, sockets
    logs = os.path.join(folder, "logs")
    print(folder, oct(stat.S_IMODE(os.stat(os.path.dirname(os.path.dirname(folder))).st_mode)),
          len(os.listdir(logs)) > 0, flush=True)
"""


def test_the_embedded_rays_session_folder_is_behind_a_folder_only_this_user_enters(tmp_path):
    from rpevit.sweep import session

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "TMPDIR", "RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-c", PRIVATE_SESSION], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    folder, mode, has_logs = done.stdout.split()[-3:]
    private = Path("/tmp") / f"rpevit-{os.getuid()}"
    assert Path(folder).parent == private / "ray" and mode == "0o700" and has_logs == "True", done.stdout
    assert private.stat().st_uid == os.getuid()
    assert session.private_temp_dir() == private / "ray"


def test_a_private_temp_folder_that_is_a_link_or_open_is_refused_or_closed(tmp_path, monkeypatch):
    from rpevit.sweep import session

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    folder = tmp_path / f"rpevit-{os.getuid()}"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    assert session.private_temp_dir() == folder / "ray" and stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder.symlink_to(elsewhere)
    with pytest.raises(session.SpaceError, match="is a symbolic link; allowed: a folder of this user's, mode 0700"):
        session.private_temp_dir()
