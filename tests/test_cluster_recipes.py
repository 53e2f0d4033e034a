"""The cluster recipes of docs/cluster.md, checked as far as this machine allows (no SLURM, no Kubernetes,
no SSH hosts here; tests/test_sweep_multinode.py runs a real multi-node sweep instead):

- slurm_sweep.sh: bash's syntax check, then run under stand-ins for srun, scontrol, squeue and ray that
  record their arguments; the stand-in `ray symmetric-run` runs the sweep command it is given as a
  `--dry-run`, so sweep.py's own parser and checks read the exact command the job would run, with a
  --deadline inside the job's end;
- rayjob_sweep.yaml: its entrypoint through sweep.py's parser and checks, the sweep's deadline inside
  activeDeadlineSeconds, the cluster deleted after the job, Ray's version the tested one;
- ray_up_cluster.yaml: Ray's own cluster-config JSON schema (shipped with Ray);
- the Dockerfile: the tested Ray version.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "docs" / "cluster"
TESTED_RAY = re.search(r"^ray==(\S+)$", (ROOT / "constraints" / "tested.txt").read_text(), re.M).group(1)


def sweep_args(command: str) -> list[str]:
    """The arguments after `sweep.py` of a shell command line."""
    words = shlex.split(command)
    return words[words.index("sweep.py") + 1:]


def check_with_sweep_parser(args: list[str]) -> "tuple[object, object]":
    """sweep.py's parser and its deadline and space checks on the arguments: (options, the deadline)."""
    sys.path.insert(0, str(ROOT))
    try:
        import sweep
    finally:
        sys.path.remove(str(ROOT))
    from rpevit.sweep.deadline import parse_deadline
    from rpevit.sweep.space import load_space

    options = sweep.build_parser().parse_args(args)
    load_space(ROOT / options.space)
    return options, parse_deadline(options.deadline) if options.deadline else None


def test_the_rayjob_manifest_runs_a_resumable_sweep_inside_its_deadline():
    job = yaml.safe_load((RECIPES / "rayjob_sweep.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    options, deadline = check_with_sweep_parser(sweep_args(spec["entrypoint"].split("&&", 1)[1]))
    assert options.address == "auto" and options.resume and deadline is not None
    assert options.max_failures == 3  # pods can be evicted: docs/cluster.md says why one retry is too few
    assert deadline.at - dt.datetime.now().timestamp() < spec["activeDeadlineSeconds"] - 10 * 60  # margin
    assert spec["shutdownAfterJobFinishes"] is True and spec["rayClusterSpec"]["rayVersion"] == TESTED_RAY
    mounts = [c["volumeMounts"] for group in [spec["rayClusterSpec"]["headGroupSpec"],
                                              *spec["rayClusterSpec"]["workerGroupSpecs"]]
              for c in group["template"]["spec"]["containers"]]
    assert all(any(m["mountPath"] == options.results_dir for m in ms) for ms in mounts)  # one shared results


def test_the_cluster_launcher_config_passes_rays_schema():
    import jsonschema
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((RECIPES / "ray_up_cluster.yaml").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(config)]
    assert not errors
    assert config["provider"]["type"] == "local" and config["file_mounts"]


def test_the_image_is_rays_tested_version():
    assert f"FROM rayproject/ray:{TESTED_RAY}-" in (RECIPES / "Dockerfile").read_text()


def docker_excludes(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule for the patterns used here (no `!`): a pattern is anchored at the context's
    root and matches a path or one of its parent folders, component by component (`*` within a component);
    `**/` matches any number of leading folders."""
    from fnmatch import fnmatchcase

    parts = path.split("/")
    for pattern in patterns:
        assert not pattern.startswith("!"), "re-includes need the full rule"
        tail = pattern.split("/")
        anywhere = tail[0] == "**"
        tail = tail[1:] if anywhere else tail
        starts = range(len(parts)) if anywhere else [0]
        if any(len(parts) - s >= len(tail) and all(fnmatchcase(parts[s + i], t) for i, t in enumerate(tail))
               for s in starts):
            return True
    return False


def test_the_image_build_context_leaves_out_venvs_history_and_results():
    """Issue 59, item 6: without a .dockerignore the context held the .venv (6.4 GB), results/ and .git."""
    root = RECIPES.parents[1]
    patterns = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    needed = ["pyproject.toml", "constraints/tested.txt", "sweep.py", "rpevit/__init__.py", "rpevit/pe/luo_crossover.json",
              "search_spaces/all12.yaml", "analysis/report.py", "docs/cluster/Dockerfile"]
    for path in needed:
        assert (root / path).exists(), path
        assert not docker_excludes(patterns, path), f"{path} is left out of the image"
    for path in (".venv/lib/python3.11/site-packages/torch/__init__.py", ".venv-ci/bin/python", ".git/HEAD",
                 "results/smoke/trials.parquet", ".lease/wheels/x.whl", "rpevit/__pycache__/config.cpython-311.pyc",
                 "rpevit.egg-info/PKG-INFO"):
        assert docker_excludes(patterns, path), f"{path} would be sent to the build"


STAND_INS = {
    # a long node list after the job's two (a reader that stops at the first line makes it die of SIGPIPE)
    "scontrol": 'echo "$@" >> "$LOG/scontrol"; [ "$1 $2" = "show hostnames" ] && printf "gpu07\\ngpu08\\n" '
                '&& seq -f "gpu%06g" 1 200000',
    "squeue": 'echo "$@" >> "$LOG/squeue"; echo "$FAKE_END"',
    "srun": 'printf "%s\\n" "$*" >> "$LOG/srun"; printf "%s %s\\n" "$RAY_AUTH_MODE" "$RAY_AUTH_TOKEN" >> "$LOG/srun_env"; '
            'while [[ "$1" == --* ]]; do shift; done; exec "$@"',
    # Ray's symmetric-run on one node: record, then run the entrypoint (after --) as a dry run
    "ray": 'printf "%s\\n" "$*" >> "$LOG/ray"; while [ "$1" != "--" ]; do shift; done; shift; exec "$@" --dry-run',
}


def stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    """A bin folder of STAND_INS and the folder they log to."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    for name, body in STAND_INS.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir, log


def test_the_slurm_script_refuses_a_gpu_count_it_cannot_read_before_starting_anything(tmp_path):
    bin_dir, log = stand_ins(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log), "FAKE_END": "", "SLURM_JOB_ID": "1",
           "SLURM_JOB_NODELIST": "gpu07", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "4",
           "SLURM_GPUS_ON_NODE": "gpu:a100", "HOME": str(tmp_path / "home")}
    env.pop("SLURM_GPUS_PER_TASK", None)
    env.pop("GPUS", None)
    out = subprocess.run(["bash", str(RECIPES / "slurm_sweep.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and not (log / "srun").exists(), out.stdout + out.stderr
    assert out.stderr.strip() == ("error: GPUs per node has value 'a100' (from GPUS, SLURM_GPUS_PER_TASK or "
                                  "SLURM_GPUS_ON_NODE); allowed: a whole number (GPUS=4 sbatch "
                                  "docs/cluster/slurm_sweep.sh)")


@pytest.mark.slow
@pytest.mark.parametrize("gpu_env, num_gpus", [({"SLURM_GPUS_PER_TASK": "1"}, "1"),  # --gpus-per-task=1
                                               ({"SLURM_GPUS_ON_NODE": "4"}, "4"),  # --gres=gpu:4: no PER_TASK
                                               ({"SLURM_GPUS_PER_TASK": "a100:2"}, "2")])  # a typed request
def test_the_slurm_script_starts_ray_everywhere_and_the_sweep_inside_the_jobs_time(tmp_path, gpu_env, num_gpus):
    script = RECIPES / "slurm_sweep.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    bin_dir, log = stand_ins(tmp_path)
    end = (dt.datetime.now() + dt.timedelta(hours=4)).replace(second=0, microsecond=0)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log),
           "FAKE_END": end.strftime("%Y-%m-%dT%H:%M:%S"), "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "16", **gpu_env,
           "SPACE": "search_spaces/smoke.yaml", "RESULTS": str(tmp_path / "results"), "PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home")}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "GPUS",
                 *{"SLURM_GPUS_PER_TASK", "SLURM_GPUS_ON_NODE"} - set(gpu_env)):
        env.pop(name, None)
    out = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (log / "srun").read_text().split() == ["--nodes=2", "--ntasks=2", "ray", "symmetric-run", "--address",
                                                  "gpu07:6379", "--min-nodes", "2", "--num-cpus=16", f"--num-gpus={num_gpus}",
                                                  "--", sys.executable, "-u", "sweep.py", "--space",
                                                  "search_spaces/smoke.yaml", "--address", "gpu07:6379",
                                                  "--results-dir", str(tmp_path / "results"), "--max-failures", "3",
                                                  "--resume",
                                                  "--deadline", (end - dt.timedelta(minutes=20)).strftime(
                                                      "%Y-%m-%dT%H:%M")]
    assert "4 trials in sweep 'smoke'" in out.stdout  # sweep.py read the command and its space
    # token auth on every node with one token (issue 59): made once where none exists, yours alone, exported to srun
    token = tmp_path / "home" / ".ray" / "auth_token"
    assert re.fullmatch(r"[0-9a-f]{64}", token.read_text()) and stat.S_IMODE(token.stat().st_mode) == 0o600
    assert (log / "srun_env").read_text().split() == ["token", token.read_text()]
    assert "data: read on the cluster's nodes" in out.stdout  # --address: the nodes' data, not this machine's


def test_a_joined_cluster_no_node_of_which_can_hold_a_trial_is_said_at_once(monkeypatch):
    """A SLURM job whose GPUs Ray was not told of: every GPU trial would wait in silence until the job's end. On a
    joined cluster (nodes may still come) that is a one-line warning naming the largest node, not a refusal."""
    from rpevit.sweep import session

    nodes = [{"CPU": 16.0, "memory": 1e11}, {"CPU": 32.0, "GPU": 0.0}]
    monkeypatch.setattr(session, "live_nodes", lambda: nodes)
    waits = session.check_fits(4, 0.25, fixed_cluster=False)
    assert waits is not None and "\n" not in waits and waits.startswith("warning: no node of the cluster can hold")
    assert "gpus_per_trial 0.25" in waits and "2 live node(s), the largest 32 CPUs and 0 GPUs" in waits
    assert session.check_fits(4, 0, fixed_cluster=False) is None  # CPU trials fit there
    nodes.append({"CPU": 8.0, "GPU": 1.0})
    assert session.check_fits(4, 0.25, fixed_cluster=False) is None  # one node that fits is enough
