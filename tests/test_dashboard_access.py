"""Issue 43, items 9 and 10: the dashboard's token is private from the start, its printed path is the one
Ray reads, the printed note says how to get in (paste the token, an SSH tunnel), and trial workers run at
the driver's niceness, not Ray's +15."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rpevit.sweep import session

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_token_env(monkeypatch):
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)


def test_the_token_is_created_private_before_ray_and_never_through_a_link(tmp_path, monkeypatch, no_token_env):
    token = tmp_path / "home" / ".ray" / "auth_token"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert session.token_path() == token
    session.create_private_token()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    text = token.read_text()
    assert len(text) == 64 and int(text, 16) >= 0  # Ray's own format: 32 random bytes in hex
    session.create_private_token()
    assert token.read_text() == text  # an existing token is Ray's to read, not replaced
    elsewhere = tmp_path / "mine" / "token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(elsewhere))
    assert session.token_path() == elsewhere
    victim = tmp_path / "victim"
    elsewhere.parent.mkdir()
    elsewhere.symlink_to(victim)
    session.create_private_token()
    assert not victim.exists()  # not written through the link
    elsewhere.unlink()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x" * 64)
    session.create_private_token()
    assert not elsewhere.exists()  # the token is in the environment: no file
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    session.create_private_token()
    assert not elsewhere.exists()


def test_the_dashboard_note_names_the_token_ray_reads_and_the_tunnel(monkeypatch, tmp_path, no_token_env):
    monkeypatch.setenv("HOME", str(tmp_path))
    note = session.dashboard_note("127.0.0.1:8266")
    assert f"paste the token from {tmp_path}/.ray/auth_token (`ray get-auth-token` prints it)" in note
    assert "ssh -L 8266:127.0.0.1:8266 <this host>, then open http://127.0.0.1:8266" in note
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    assert f"from {tmp_path}/t " in session.dashboard_note("127.0.0.1:8265")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret")
    assert "from $RAY_AUTH_TOKEN when" in session.dashboard_note("127.0.0.1:8265")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert session.dashboard_note("127.0.0.1:8265") == "" and session.dashboard_note(None) == ""


PROBE = """
import contextlib, io, json, os, re, stat, urllib.error, urllib.request
from pathlib import Path
from rpevit.sweep import session
import ray

@ray.remote
def niceness():
    return os.nice(0)

printed = io.StringIO()
with contextlib.ExitStack() as stack:
    with contextlib.redirect_stdout(printed):
        stack.enter_context(session.ray_session(None, dashboard=True, gpus_per_trial=0))
    token = Path(os.environ["HOME"], ".ray", "auth_token")
    url = re.search(r"dashboard: (http://[0-9.:]+)", printed.getvalue()).group(1)  # the port Ray took
    codes = {}
    for name, headers in (("anonymous", {}), ("token", {"Authorization": "Bearer " + token.read_text()})):
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/api/version", headers=headers), timeout=20) as r:
                codes[name] = r.status
        except urllib.error.HTTPError as err:
            codes[name] = err.code
    print(json.dumps({"mode": oct(stat.S_IMODE(token.stat().st_mode)), "driver": os.nice(0),
                      "worker": ray.get(niceness.remote()), **codes}))
"""


@pytest.mark.slow
def test_an_embedded_ray_uses_the_private_token_and_runs_workers_at_the_drivers_niceness(tmp_path):
    """A fresh home: the token rpevit creates (0600) is the one the dashboard accepts (401 without it), and a
    task runs at the driver's niceness (Ray alone would add 15)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    import json

    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert out.returncode == 0 and line, out.stderr[-3000:]
    got = json.loads(line[-1])
    assert got["mode"] == "0o600" and got["token"] == 200 and got["anonymous"] == 401, got
    assert got["worker"] == got["driver"], got
