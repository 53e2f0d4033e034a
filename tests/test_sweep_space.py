"""Search-space expansion and validation (no Ray): counts, sampling, keys, error messages, CLI dry-run."""
from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rpevit.config import ConfigError, TrialConfig, field_help, section_fields
from rpevit.sweep.gpus import claim_least_loaded_gpu
from rpevit.sweep.results import LinkRefused
from rpevit.sweep.space import SpaceError, load_space, parse_overrides, trial_key
import sweep  # the CLI at the repository root (pytest puts the root on sys.path: pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_grid_times_seeds(tmp_path):
    space = load_space(write(tmp_path, """
fixed: {dataset: digits, dim: 16, depth: 1}
grid: {attention: [softmax, favor], pe: [ape, rope]}
seeds: [0, 1, 2]
"""))
    assert len(space.trials) == 12 and len(set(space.keys)) == 12
    combos = {(t["attention"], t["pe"], t["seed"]) for t in space.trials}
    assert combos == {(a, p, s) for a in ("softmax", "favor") for p in ("ape", "rope") for s in (0, 1, 2)}
    assert all(t["dim"] == 16 and t["depth"] == 1 for t in space.trials)
    assert space.name == "space" and space.varying_fields() == ["attention", "pe", "seed"]


def test_list_of_grids_is_a_union_and_duplicates_are_dropped(tmp_path):
    space = load_space(write(tmp_path, """
fixed: {dataset: digits, dim: 16}
grid:
  - {pe: [ape, rope], depth: [1]}
  - {attention: [softmax, favor], pe: [rope], depth: [1]}
  - {dataset: [mnist], patch_size: [4], depth: [2]}
"""))
    got = [(t["dataset"], t["attention"], t["pe"], t["depth"]) for t in space.trials]
    assert got == [("digits", "softmax", "ape", 1), ("digits", "softmax", "rope", 1),
                   ("digits", "favor", "rope", 1), ("mnist", "softmax", "ape", 2)]
    assert space.duplicates_dropped == 1  # (softmax, rope) is in the first two grids


def test_include_and_exclude(tmp_path):
    space = load_space(write(tmp_path, """
fixed: {dataset: digits, dim: 16}
grid: {attention: [softmax, favor], pe: [ape, rope]}
seeds: [0, 1]
exclude: [{attention: favor, pe: rope}]
include:
  - {attention: softmax, pe: ape+rope}
  - {attention: favor, pe: none, seed: 7}
"""))
    combos = sorted((t["attention"], t["pe"], t["seed"]) for t in space.trials)
    expected = [(a, p, s) for a in ("softmax", "favor") for p in ("ape", "rope") for s in (0, 1)
                if (a, p) != ("favor", "rope")] + [("softmax", "ape+rope", 0), ("softmax", "ape+rope", 1),
                                                   ("favor", "none", 7)]
    assert combos == sorted(expected)


def test_samples_are_seeded_in_range_and_shared_by_seeds(tmp_path):
    text = """
fixed: {dataset: digits, dim: 16}
grid: {pe: [ape, rope]}
sample:
  lr: {loguniform: [1.0e-4, 1.0e-2]}
  weight_decay: {uniform: [0, 0.1]}
  depth: {randint: [1, 4]}
  attention: {choice: [softmax, favor]}
num_samples: 5
seeds: [0, 1]
"""
    space = load_space(write(tmp_path, text))
    assert len(space.trials) == 2 * 5 * 2
    for t in space.trials:
        assert 1e-4 <= t["lr"] <= 1e-2 and 0 <= t["weight_decay"] <= 0.1
        assert t["depth"] in (1, 2, 3) and t["attention"] in ("softmax", "favor")
    pairs = list(zip(space.trials[::2], space.trials[1::2]))  # seeds are innermost
    assert all(a["lr"] == b["lr"] and (a["seed"], b["seed"]) == (0, 1) for a, b in pairs)
    assert len({t["lr"] for t in space.trials}) == 10  # one draw per (sample, grid point)
    again = load_space(write(tmp_path, text))
    assert again.keys == space.keys  # deterministic: dry-run, run and resume agree
    other = load_space(write(tmp_path, text + "sample_seed: 1\n"))
    assert {t["lr"] for t in other.trials}.isdisjoint({t["lr"] for t in space.trials})
    logs = sorted(math.log10(t["lr"]) for t in space.trials[::2])
    assert logs[-1] - logs[0] > 0.5  # spread over decades, not stuck at one value


def test_trial_key_stability():
    base = TrialConfig(dataset="digits", dim=16).to_dict()
    assert trial_key(base) == trial_key({**base, "data_dir": "/elsewhere"})  # data location is not identity
    assert trial_key(base) != trial_key({**base, "lr": 2e-3})
    assert trial_key(base) != trial_key({**base, "seed": 1})
    # explicit defaults and omitted defaults are the same trial; so are ints given for floats
    assert trial_key(TrialConfig(weight_decay=0.05).to_dict()) == trial_key(TrialConfig().to_dict())
    assert trial_key(TrialConfig.from_dict({"mlp_ratio": 2}).to_dict()) == trial_key(TrialConfig().to_dict())


def test_yaml_scientific_notation_and_overrides(tmp_path):
    space = load_space(write(tmp_path, "fixed: {dataset: digits, lr: 1e-3, epochs: 3}\n"),
                       overrides=parse_overrides(["epochs=1", "pe=rope", "lr=5e-4"]))
    assert space.trials[0]["lr"] == 5e-4 and space.trials[0]["epochs"] == 1 and space.trials[0]["pe"] == "rope"
    assert load_space(write(tmp_path, "fixed: {lr: 1e-3}\n")).trials[0]["lr"] == 1e-3


BAD_SPACES = [(case["space"], case["says"]) for case in yaml.safe_load((ROOT / "tests" / "bad_spaces.yaml").read_text())]


@pytest.mark.parametrize("text,needles", BAD_SPACES)
def test_validation_errors_name_file_key_value_and_allowed(tmp_path, text, needles):
    path = write(tmp_path, text, "bad.yaml")
    with pytest.raises(ConfigError) as info:
        load_space(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_unknown_set_field_and_bad_set_syntax(tmp_path):
    path = write(tmp_path, "fixed: {dataset: digits}\n")
    with pytest.raises(SpaceError, match="--set key 'lrr' is not a TrialConfig field"):
        load_space(path, overrides=parse_overrides(["lrr=1"]))
    with pytest.raises(SpaceError, match="field=value"):
        parse_overrides(["lr"])


def test_only_keeps_the_matching_part_of_a_space_under_the_whole_spaces_keys(tmp_path):
    path = write(tmp_path, """
grid:
  - {dataset: [digits], dim: [16], attention: [softmax, favor]}
  - {dataset: [mnist], dim: [32], attention: [softmax, favor]}
seeds: [0, 1]
""")
    whole = load_space(path)
    part = load_space(path, only=parse_overrides(["dataset=mnist", "attention=favor"], flag="--only"))
    assert [(t["dataset"], t["attention"]) for t in part.trials] == [("mnist", "favor")] * 2
    assert {t["seed"] for t in part.trials} == {0, 1} and part.duplicates_dropped == 0
    assert set(part.keys) < set(whole.keys)  # a part resumes into the whole sweep and back
    assert part.current_keys == whole.keys == whole.current_keys and whole.whole_keys is None
    assert load_space(path, only={"dim": 16.0}).keys == load_space(path, only={"dataset": "digits"}).keys
    with pytest.raises(SpaceError, match=r"--only dataset=cifar10 matches no trial; .*dataset: digits, mnist"):
        load_space(path, only={"dataset": "cifar10"})
    with pytest.raises(SpaceError, match="--only key 'datset' is not a TrialConfig field"):
        load_space(path, only={"datset": "mnist"})
    with pytest.raises(SpaceError, match="--only has value 'dataset'; allowed: field=value"):
        parse_overrides(["dataset"], flag="--only")


def test_only_on_the_command_line_runs_one_half_of_all12(tmp_path, capsys):
    (tmp_path / "cifar10.npz").write_bytes(b"")  # the dry run checks that the file a trial reads is there
    assert sweep.main(["--space", str(ROOT / "search_spaces" / "all12.yaml"), "--only", "dataset=cifar10",
                       "--set", "epochs=2", "--set", "warmup_epochs=0.2", "--data-dir", str(tmp_path),
                       "--dry-run"]) == 0
    assert "36 trials in sweep 'all12'" in capsys.readouterr().out
    assert sweep.main(["--space", str(ROOT / "search_spaces" / "all12.yaml"), "--only", "pe=alibi",
                       "--dry-run"]) == 2
    assert "--only pe=alibi matches no trial" in capsys.readouterr().err


def test_fields_lists_every_config_field_with_its_help(capsys):
    assert sweep.main(["--fields"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for section, names in section_fields().items():
        assert f"{section}:" in lines
        for name in names:
            assert any(line.split()[:1] == [name] and field_help(name) in line for line in lines), name


@pytest.mark.parametrize("name,count", [("smoke", 4), ("all12", 72), ("rope_cifar100", 24), ("mnist_converged_cpu", 153),
                                        ("string_mnist_cpu", 30), ("cifar10_cpu", 90)])
def test_shipped_spaces_expand(name, count):
    space = load_space(ROOT / "search_spaces" / f"{name}.yaml")
    assert len(space.trials) == count and space.name == name


def test_timing_spaces_are_exclusive_and_read_their_timing(tmp_path):
    bench = load_space(write(tmp_path, "task: bench\ntiming: {repeats: 3, interleave: true}\n"))
    assert bench.exclusive and (bench.timing.repeats, bench.timing.interleave, bench.timing.warmup) == (3, True, True)
    train = load_space(write(tmp_path, "fixed: {dataset: digits}\n", "train.yaml"))
    assert not train.exclusive and train.timing.repeats == 1


def test_all12_gives_each_dataset_its_recipe():
    space = load_space(ROOT / "search_spaces" / "all12.yaml")
    cifar = [t for t in space.trials if t["dataset"] == "cifar10"]
    mnist = [t for t in space.trials if t["dataset"] == "mnist"]
    assert len(cifar) == len(mnist) == 36
    assert {(t["dim"], t["depth"], t["heads"], t["epochs"]) for t in cifar} == {(192, 9, 12, 200)}
    assert {(t["attention"], t["pe"]) for t in mnist} == {
        (a, p) for a in ("softmax", "favor", "relu") for p in ("ape", "luo_rpe", "circulant_string", "rope")}


def test_cli_dry_run_prints_table_and_count(tmp_path, capsys):
    path = write(tmp_path, "fixed: {dataset: digits}\ngrid: {pe: [ape, rope]}\nseeds: [0, 1]\n")
    assert sweep.main(["--space", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 trials in sweep 'space'" in out
    lines = [ln.split() for ln in out.splitlines() if ln[:1].isdigit() and "trials in sweep" not in ln]
    assert [(c[2], c[3]) for c in lines] == [("ape", "0"), ("ape", "1"), ("rope", "0"), ("rope", "1")]
    assert sweep.main(["--space", str(write(tmp_path, "grid: {pe: [x]}\n", "bad.yaml")), "--dry-run"]) == 2
    assert "field 'pe' has value 'x'" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_dry_run_does_not_import_ray(tmp_path):
    path = write(tmp_path, "fixed: {dataset: digits}\n")
    code = ("import sys, sweep; rc = sweep.main(['--space', %r, '--dry-run']); "
            "assert 'ray' not in sys.modules, 'dry-run imported ray'; sys.exit(rc)" % str(path))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_gpu_claims_spread_before_sharing_and_forget_dead_processes(tmp_path):
    claims = tmp_path / "claims.json"
    # two live processes of this test's own, not os.getppid(): a pytest started under nohup or as a container's
    # first process has parent pid 1, the pid the claims below use (a run so started failed here)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert 1 not in (os.getpid(), alive.pid)
        got = [claim_least_loaded_gpu(0.25, 2, pid=p, claims_file=claims) for p in (os.getpid(), alive.pid)]
        assert got == [0, 1]  # one trial per GPU before any GPU takes a second
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        assert claim_least_loaded_gpu(0.5, 2, pid=dead.pid, claims_file=claims) == 0  # tie -> lowest index
        # had the dead process's 0.5 on GPU 0 been kept, GPU 1 would be the least loaded
        assert claim_least_loaded_gpu(0.25, 2, pid=1, claims_file=claims) == 0
        assert str(dead.pid) not in yaml.safe_load(claims.read_text())
        assert claim_least_loaded_gpu(0.25, 2, pid=1, claims_file=claims) == 0  # re-claim replaces, not adds
        assert yaml.safe_load(claims.read_text())["1"] == [0, 0.25]
    finally:
        alive.kill()
        alive.wait()


def test_gpu_claims_live_in_the_private_folder_and_never_follow_links(tmp_path, monkeypatch):
    """Issue 39 follow-up: the claims file was in the shared /tmp, written through write_text and its lock
    opened with open(..., 'w'): a link planted there by another user would have been written through."""
    from rpevit.sweep import gpus

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert gpus.default_claims_file() == tmp_path / f"rpevit-{os.getuid()}" / gpus.CLAIMS_NAME
    victim = tmp_path / "victim"
    victim.write_text("keep")
    claims = tmp_path / "claims.json"
    claims.symlink_to(victim)
    with pytest.raises(LinkRefused, match=f"{claims} is a symbolic link"):  # atomic_file's refusal
        claim_least_loaded_gpu(0.25, 2, pid=os.getpid(), claims_file=claims)
    claims.unlink()
    claims.with_suffix(".lock").unlink()  # the first call made the lock file
    claims.with_suffix(".lock").symlink_to(victim)
    with pytest.raises(OSError) as refused:  # os.open with O_NOFOLLOW on a link: ELOOP
        claim_least_loaded_gpu(0.25, 2, pid=os.getpid(), claims_file=claims)
    assert refused.value.errno == errno.ELOOP, refused.value
    assert victim.read_text() == "keep"
    claims.with_suffix(".lock").unlink()
    claims.write_text('{"12": "bogus", "x": [0, 0.5], "1": [0, 0.25]}')  # malformed entries are dropped
    assert gpus.read_claims(claims) == {"1": [0, 0.25]}


def test_a_trial_label_leaves_out_the_options_of_encodings_it_does_not_use():
    """mnist_headline_cpu fixes luo_scale 3; a cell without luo_rpe resolves it to the default it never reads,
    so the field varies across trials, but only the luo_rpe cells are labelled with it."""
    space = load_space(Path(__file__).resolve().parent.parent / "search_spaces" / "mnist_headline_cpu.yaml")
    assert "luo_scale" in space.varying_fields()
    labels = {(t["attention"], t["pe"]): space.label(i) for i, t in enumerate(space.trials)}
    assert "luo_scale" not in labels[("softmax", "ape")] and "pe=ape" in labels[("softmax", "ape")]
    assert "luo_scale=3.0" in labels[("favor", "luo_rpe")]


@pytest.mark.parametrize("content", [b"\x00\xffnot json", b"[1, 2, 3]", b'{"12": "gpu0", "x": [0, 0.5], "7": [true, 2]}',
                                     b'{"1": [0, 0.9]'])
def test_a_malformed_gpu_claims_file_is_read_as_no_claims_and_rewritten(tmp_path, content):
    """Issue 59 (adversary, item 7): a claims file of garbage, another shape or bad entries is untrusted input:
    its claims are dropped and the file is rewritten whole, never a failed trial."""
    claims = tmp_path / "claims.json"
    claims.write_bytes(content)
    assert claim_least_loaded_gpu(0.25, 2, pid=os.getpid(), claims_file=claims) == 0
    assert yaml.safe_load(claims.read_text()) == {str(os.getpid()): [0, 0.25]}


def test_a_gpu_claims_path_that_is_not_a_file_is_refused_in_one_line(tmp_path):
    claims = tmp_path / "claims.json"
    claims.mkdir()
    with pytest.raises(RuntimeError, match=r"is not a regular file; allowed: a regular file or nothing there") as err:
        claim_least_loaded_gpu(0.25, 2, pid=os.getpid(), claims_file=claims)
    assert "\n" not in str(err.value)
