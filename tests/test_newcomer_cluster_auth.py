"""`sweep.py --address HOST:PORT` joins a head that runs with Ray's token auth (issue 59, item 2).

Ray (2.60) turns token auth on for `ray start --head` whenever a token exists on the head
(~/.ray/auth_token, which every local sweep writes), but a driver given an explicit address never
turns it on by itself, so the join used to fail after ~20 s of `InvalidAuthToken` lines with a last
line that hid the cause. rpevit now asks the head first (one read-only gRPC call, before Ray is
imported): where it wants a token and this machine has the right one, the driver joins with it
(RAY_AUTH_MODE=token); where the token is missing or foreign, one line says so.

The fast tests talk to a stand-in head: a gRPC server on 127.0.0.1 that answers the probe's call the
way Ray's GCS does (UNAUTHENTICATED without the right `authorization: Bearer` header). The slow test
starts a real head with `ray start --head` as docs/cluster.md tells a user to (a private HOME holding
the token, a private temp dir and port, loopback addresses), a worker as the docs say, and joins them
with `sweep.py --address`; then a driver with a foreign token gets its one line. Its Ray processes
carry a tag in their environment and exactly those are ended (never `ray stop`).
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml

from rpevit.sweep import session
from rpevit.sweep.space import SpaceError

ROOT = Path(__file__).resolve().parents[1]


class StandInHead:
    """A gRPC server answering Ray's GCS cluster-id call, with token auth when `token` is set."""

    def __init__(self, token: str | None, late_s: float = 0.0, late_calls: int = 0) -> None:
        self.token = token
        self.late_s, self.late_calls = late_s, late_calls  # the first late_calls answers late_s late (loaded cores)
        self.calls: list[str | None] = []
        self.stopped = threading.Event()  # a late answer's wait ends at stop(): no handler thread outlives the test
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def service(self, details):  # grpc.GenericRpcHandler
        if details.method != session.AUTH_PROBE_METHOD:
            return None

        def answer(request: bytes, context) -> bytes:
            sent = dict(context.invocation_metadata()).get("authorization")
            self.calls.append(sent)
            if len(self.calls) <= self.late_calls:
                self.stopped.wait(self.late_s)
            if self.token is not None and sent != f"Bearer {self.token}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing "
                                                               "or incorrect")
            return b"\n\x00"

        return grpc.unary_unary_rpc_method_handler(answer)

    def stop(self) -> None:
        self.stopped.set()
        self.server.stop(None)


@pytest.fixture
def private_env(tmp_path, monkeypatch):
    """A HOME of the test's own, no token or auth mode from the caller, and Ray treated as not yet
    imported (prepare_join sets RAY_AUTH_MODE only before Ray's import; the test run may have imported it)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        # setenv first: monkeypatch restores only what it changed, and delenv of an unset name changes
        # nothing, so the RAY_AUTH_MODE=token that prepare_join sets would outlive the test and turn token
        # auth on for every later Ray started in this process (CI, 2026-11-27: 13 Ray tests red)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    return home


def write_token(home: Path, token: str) -> None:
    (home / ".ray").mkdir(mode=0o700, exist_ok=True)
    (home / ".ray" / "auth_token").write_text(token)


def test_a_token_auth_head_is_joined_with_the_token_of_this_machine(private_env):
    token = secrets.token_hex(32)
    write_token(private_env, token)
    head = StandInHead(token)
    try:
        line = session.prepare_join(head.address)
    finally:
        head.stop()
    assert os.environ["RAY_AUTH_MODE"] == "token"  # what Ray reads when it is imported for the join
    assert "token auth" in line and str(private_env / ".ray" / "auth_token") in line
    assert head.calls == [None, f"Bearer {token}"]  # asked without, then checked that the token opens it


def test_a_head_that_answers_late_is_asked_once_more_before_the_join_is_left_to_ray(private_env, monkeypatch):
    """CI, 2026-12-02, two training trials beside it: the stand-in head's answer came after the probe's 5 s,
    the head read as "unknown" and the join was left to Ray (which fails on a token-auth head).
    The first call that reaches the head is answered 4 s late, past the first deadline (1 s), so only the
    second try can read "unauthenticated" (a probe without it reads "unknown" and sets nothing). Whether
    the first try reached the head at all is the network's timing: on loaded cores (`.ci/run` beside two
    training trials, 2026-12-03) its connection could outlast the deadline, so the head saw 2 calls or 3."""
    monkeypatch.setattr(session, "PROBE_TIMEOUT_S", 1.0)
    token = secrets.token_hex(32)
    write_token(private_env, token)
    head = StandInHead(token, late_s=4.0, late_calls=1)
    try:
        line = session.prepare_join(head.address)
    finally:
        head.stop()
    assert line is not None and os.environ["RAY_AUTH_MODE"] == "token"
    # asked without the token (late, then once more), then the token checked
    assert head.calls[-1] == f"Bearer {token}" and head.calls[:-1] in ([None], [None, None])


def test_a_head_that_never_answers_is_left_to_ray_after_both_tries(private_env, monkeypatch):
    """The head holds each call 60 s (until stop()). Both tries are read from the time taken: each waits
    out its deadline (1 s, then 2 s), so one try alone returns in under 2.5 s and a probe that waited for
    an answer takes 60 s. Not from the calls the head saw: on loaded cores (`.ci/run` beside two training
    trials, 2026-12-03) a connection could outlast a short deadline and the call never reached the head."""
    monkeypatch.setattr(session, "PROBE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(session, "PROBE_RETRY_TIMEOUT_S", 2.0)
    head = StandInHead(secrets.token_hex(32), late_s=60.0, late_calls=99)
    started = time.monotonic()
    try:  # None, not "no token": neither late "unauthenticated" was waited for
        assert session.prepare_join(head.address) is None  # "unknown": Ray's own join decides
        took_s = time.monotonic() - started
    finally:
        head.stop()
    assert 2.5 <= took_s < 30.0, took_s
    assert "RAY_AUTH_MODE" not in os.environ and head.calls in ([], [None], [None, None])


def test_a_token_in_the_environment_is_what_ray_sends_first(private_env, monkeypatch):
    token = secrets.token_hex(32)
    write_token(private_env, "not-this-one")
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    head = StandInHead(token)
    try:
        assert "$RAY_AUTH_TOKEN" in session.prepare_join(head.address)
    finally:
        head.stop()


@pytest.mark.parametrize("case", ["no token", "foreign token", "auth disabled here"])
def test_a_join_that_fails_on_auth_says_so_in_one_line(private_env, monkeypatch, case):
    head = StandInHead(secrets.token_hex(32))
    if case == "foreign token":
        write_token(private_env, secrets.token_hex(32))
    if case == "auth disabled here":
        write_token(private_env, head.token)
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    try:
        with pytest.raises(SpaceError) as err:
            session.prepare_join(head.address)
    finally:
        head.stop()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"--address has value '{head.address}'") and "token auth" in message
    assert "ray get-auth-token" in message  # what to do
    assert {"no token": "has no token", "foreign token": "is not the head's",
            "auth disabled here": "RAY_AUTH_MODE=disabled is set here"}[case] in message
    if case != "auth disabled here":
        assert "RAY_AUTH_MODE" not in os.environ  # nothing changed for a join that is refused


def test_a_head_without_token_auth_is_joined_as_before(private_env):
    write_token(private_env, secrets.token_hex(32))
    head = StandInHead(None)
    try:
        assert session.prepare_join(head.address) is None
    finally:
        head.stop()
    assert "RAY_AUTH_MODE" not in os.environ and head.calls == [None]


def test_auto_ray_client_and_a_local_sweep_are_left_to_ray(private_env):
    for address in (None, "auto", "ray://127.0.0.1:1"):
        assert session.prepare_join(address) is None
    assert "RAY_AUTH_MODE" not in os.environ


# ---- a real head, as docs/cluster.md tells a user to start one ----
TINY_SPACE = {"name": "authjoin", "task": "train",
              "fixed": {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 200, "epochs": 1,
                        "batch_size": 50, "eval_draws": 1, "drop_path": 0.0},
              "grid": {"attention": ["softmax"], "pe": ["ape", "rope"]}, "seeds": [0],
              "resources": {"cpus_per_trial": 1, "gpus_per_trial": 0}}


@pytest.mark.slow
def test_sweep_joins_a_ray_start_head_with_token_auth_as_the_docs_say(tmp_path):
    from tests.test_sweep_multinode import TAG, free_port, kill_node

    ray = str(Path(sys.executable).with_name("ray"))
    home = tmp_path / "home"
    home.mkdir()
    write_token(home, secrets.token_hex(32))  # what every local sweep leaves in ~/.ray/auth_token
    ray_tmp = Path(tempfile.mkdtemp(prefix="rpa-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS",
                 "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):  # a user's shell: none of them set
        env.pop(name, None)
    tags = [f"{ray_tmp.name}-head", f"{ray_tmp.name}-worker"]
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(TINY_SPACE))
    try:
        # docs/cluster.md, "Token auth": the head as `ray start --head --port=6379` starts it (loopback address
        # and a private temp dir here), each worker with RAY_AUTH_MODE=token, the driver with --address alone
        subprocess.run([ray, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.2",
                        "--include-dashboard", "false", "--num-cpus", "1", "--num-gpus", "0", "--temp-dir",
                        str(ray_tmp / "head"), "--disable-usage-stats"],
                       env={**env, TAG: tags[0]}, check=True, capture_output=True, timeout=300)
        subprocess.run([ray, "start", "--address", f"127.0.0.2:{port}", "--node-ip-address", "127.0.0.3",
                        "--num-cpus", "1", "--num-gpus", "0", "--temp-dir", str(ray_tmp / "worker"),
                        "--disable-usage-stats"],
                       env={**env, "RAY_AUTH_MODE": "token", TAG: tags[1]}, check=True, capture_output=True,
                       timeout=300)
        joined = subprocess.run([sys.executable, "sweep.py", "--space", str(space), "--address", f"127.0.0.2:{port}",
                                 "--results-dir", str(tmp_path / "results")], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=600)
        out = joined.stdout + joined.stderr
        assert joined.returncode == 0, out[-3000:]
        assert "runs with token auth: joining with the token in" in out
        assert "2 node(s)" in out and "2 ok, 0 failed, 0 not run" in out
        assert "InvalidAuthToken" not in out

        foreign = tmp_path / "foreign"
        foreign.mkdir()
        write_token(foreign, secrets.token_hex(32))
        started = time.monotonic()
        refused = subprocess.run([sys.executable, "sweep.py", "--space", str(space), "--address",
                                  f"127.0.0.2:{port}", "--results-dir", str(tmp_path / "results2")], cwd=ROOT,
                                 env={**env, "HOME": str(foreign)}, capture_output=True, text=True, timeout=600)
        assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
        errors = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("error: --address has value") and "token auth" in errors[0]
        assert "is not the head's" in errors[0] and "InvalidAuthToken" not in refused.stdout + refused.stderr
        assert time.monotonic() - started < 120  # before Ray is imported: no 20 s of Ray's retries
    finally:
        for tag in tags:
            kill_node(tag)
        shutil.rmtree(ray_tmp, ignore_errors=True)
