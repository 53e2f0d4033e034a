"""CIFAR-10 carried to a GPU lease in parts (benchmarks/lease/cifar_pack.py; issue 60, item 4).

The device tool sends 64 MiB a call, the working tree included; cifar10.npz is 169.6 MB. A lease that finds a
part missing, damaged or from another prepare must say so in one line before it spends its time, and the
file it rebuilds must be the one prepared, byte for byte. These tests run the real split, move and rebuild
on a small fake npz (the size limits scaled down so that it needs three parts), and the call plan on the
real sizes.
"""
from __future__ import annotations

import math

import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "lease"))
import cifar_pack  # noqa: E402
import timeline  # noqa: E402

KIB = 1024
SMALL = {"x_train": ((60, 32, 32, 3), "uint8"), "y_train": ((60,), "uint8"),
         "x_test": ((20, 32, 32, 3), "uint8"), "y_test": ((20,), "uint8")}


def fake_arrays() -> dict[str, np.ndarray]:
    """Images with photo-like structure (smooth gradients plus noise): what the delta filters are for."""
    rng = np.random.default_rng(0)

    def images(n: int) -> np.ndarray:
        ramp = np.add.outer(np.arange(32), np.arange(32))[None, :, :, None] * rng.integers(1, 4, (n, 1, 1, 3))
        return ((ramp + rng.integers(0, 40, (n, 32, 32, 3))) % 256).astype(np.uint8)

    return {"x_train": images(60), "y_train": rng.integers(0, 10, 60, dtype=np.uint8),
            "x_test": images(20), "y_test": rng.integers(0, 10, 20, dtype=np.uint8)}


@pytest.fixture
def small_limits(monkeypatch):
    """A call carries 150 KiB here (the tree counted as 20 KiB): the ~140 KiB of xz needs three parts."""
    monkeypatch.setattr(cifar_pack, "ARRAYS", SMALL)
    monkeypatch.setattr(cifar_pack, "FILTERS", cifar_pack.FILTERS[:2] + [{"id": lzma.FILTER_LZMA2, "preset": 1}])
    monkeypatch.setattr(cifar_pack, "CARRY_LIMIT", 150 * KIB)
    monkeypatch.setattr(cifar_pack, "TREE_HEADROOM", 4 * KIB)
    monkeypatch.setattr(cifar_pack, "MARGIN", 1 * KIB)
    monkeypatch.setattr(cifar_pack, "MIN_FIRST_PART", 4 * KIB)
    monkeypatch.setattr(cifar_pack, "tree_bytes", lambda root=None: 20 * KIB)


@pytest.fixture
def prepared(tmp_path, small_limits):
    """A prepared pack (three parts) of a fake cifar10.npz, a fake .lease of 60 KiB, and the source arrays."""
    data, lease = tmp_path / "shared", tmp_path / ".lease"
    data.mkdir()
    lease.mkdir()
    (lease / "site.tar.xz").write_bytes(b"w" * 60 * KIB)
    arrays = fake_arrays()
    np.savez_compressed(data / "cifar10.npz", **arrays)
    manifest = cifar_pack.prepare(data, tmp_path / ".lease_cifar", lease, root=tmp_path)
    return tmp_path, manifest, arrays


def carry(tmp_path: Path, *numbers: int) -> Path:
    """One call's checkout: the pack folder holding only the given parts (what the device tool copies)."""
    pack = tmp_path / "checkout" / ".lease_cifar"
    shutil.rmtree(pack, ignore_errors=True)
    pack.mkdir(parents=True)
    for n in numbers:
        shutil.copytree(tmp_path / ".lease_cifar" / f"part{n}", pack / f"part{n}")
    return pack


def test_the_parts_fit_their_calls_and_rebuild_the_prepared_file(prepared):
    tmp_path, manifest, arrays = prepared
    parts = manifest["parts"]
    assert [p["call"] for p in parts] == [1, 2, 3]  # part 1 beside .lease, then one part a call
    room = cifar_pack.CARRY_LIMIT - 20 * KIB - cifar_pack.TREE_HEADROOM - cifar_pack.MARGIN
    assert parts[0]["bytes"] == room - 60 * KIB and all(p["bytes"] <= room for p in parts[1:])
    assert manifest["xz"]["of_rebuilt"] < 0.9  # the delta filters shrink photo-like bytes
    machine = tmp_path / "lease"
    first = cifar_pack.receive(carry(tmp_path, 1), machine)
    assert first.line(Path(".lease_cifar")).endswith("1 of 3 parts in (1); missing: 2, 3 (carry .lease_cifar/part2, "
                                                     ".lease_cifar/part3)")
    assert not (tmp_path / "checkout" / ".lease_cifar" / "part1").exists()  # moved out of the checkout
    third = cifar_pack.receive(carry(tmp_path, 3), machine)  # out of order: still one line of what is missing
    assert "2 of 3 parts in (1, 3); missing: 2 " in third.line(Path(".lease_cifar")) and third.rebuilt is None
    done = cifar_pack.receive(carry(tmp_path, 2), machine)
    assert done.rebuilt == machine / "data" / "cifar10.npz" and "none missing" in done.line(Path(".lease_cifar"))
    assert hashlib.sha256(done.rebuilt.read_bytes()).hexdigest() == manifest["rebuilt"]["sha256"]
    with np.load(done.rebuilt) as back:
        assert all(np.array_equal(back[name], array) for name, array in arrays.items())
    again = cifar_pack.receive(carry(tmp_path), machine)  # a later call carrying nothing: nothing rebuilt again
    assert again.rebuilt == done.rebuilt and again.missing == []


def test_a_missing_part_is_one_line_and_the_rung_does_not_start(prepared, capsys):
    tmp_path, _, _ = prepared
    machine = tmp_path / "lease"
    pack = carry(tmp_path, 1, 3)
    assert cifar_pack.main(["receive", "--pack", str(pack), "--into", str(machine), "--require-complete"]) == 4
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and out.endswith("2 of 3 parts in (1, 3); missing: 2 (carry .lease_cifar/part2)")
    assert not (machine / "data" / "cifar10.npz").exists()


def test_a_damaged_part_is_one_line_naming_it_and_is_not_taken(prepared, capsys):
    tmp_path, manifest, _ = prepared
    pack = carry(tmp_path, 1)
    damaged = pack / "part1" / manifest["parts"][0]["file"]
    body = bytearray(damaged.read_bytes())
    body[100] ^= 0xFF
    damaged.write_bytes(bytes(body))
    assert cifar_pack.main(["receive", "--pack", str(pack), "--into", str(tmp_path / "lease")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cifar10.npz.xz.1" in err and "damaged on the way" in err
    assert damaged.exists() and not (tmp_path / "lease" / "cifar_pack" / damaged.name).exists()


def test_a_part_of_another_prepare_is_refused_in_one_line(prepared, capsys):
    tmp_path, manifest, _ = prepared
    machine = tmp_path / "lease"
    cifar_pack.receive(carry(tmp_path, 1), machine)
    pack = carry(tmp_path, 2)
    other = dict(manifest, prepared_at_utc="2026-01-01T00:00:00Z")
    (pack / "part2" / cifar_pack.MANIFEST).write_text(json.dumps(other))
    assert cifar_pack.main(["receive", "--pack", str(pack), "--into", str(machine)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "this machine holds parts of pack" in err and "one prepare" in err


def test_a_rebuilt_file_whose_digest_differs_is_refused_and_not_left_behind(prepared, capsys):
    tmp_path, manifest, _ = prepared
    forged = dict(manifest, rebuilt=dict(manifest["rebuilt"], sha256="0" * 64))
    pack = carry(tmp_path, 1, 2, 3)
    for n in (1, 2, 3):
        (pack / f"part{n}" / cifar_pack.MANIFEST).write_text(json.dumps(forged))
    machine = tmp_path / "lease"
    assert cifar_pack.main(["receive", "--pack", str(pack), "--into", str(machine), "--require-complete"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the rebuilt cifar10.npz" in err and "0000000000000000..." in err
    assert not list((machine / "data").iterdir())  # neither cifar10.npz nor its temporary file


def test_bad_input_to_prepare_is_one_line(tmp_path, small_limits, capsys):
    (tmp_path / ".lease").mkdir()
    assert cifar_pack.main(["prepare", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"),
                            "--lease", str(tmp_path / ".lease")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cifar10.npz is not a file" in err
    (tmp_path / "d").mkdir()
    np.savez(tmp_path / "d" / "cifar10.npz", x_train=np.zeros((3, 32, 32), np.uint8))
    assert cifar_pack.main(["prepare", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
                            "--lease", str(tmp_path / ".lease")]) == 2
    assert "arrays ['x_train']; allowed: exactly" in capsys.readouterr().err


# ---------------------------------------------------------------- the call plan at the real sizes
# Measured here on 2026-11-28 (gpu_lease.sh prepare, then prepare-cifar on /work/shared/data): .lease (site.tar.xz,
# mnist.npz, SHA256SUMS, WHEELS) and the xz of the stored cifar10.npz: 114,888,444 bytes, 0.623 of its 184,381,002.
LEASE_BYTES = 46_463_496
XZ_BYTES = 115_000_000  # the measured size rounded up (the plan must hold for a little more)
SOURCE_BYTES = 169_596_192


def real_manifest(tree: int) -> dict:
    room = cifar_pack.CARRY_LIMIT - tree - cifar_pack.TREE_HEADROOM - cifar_pack.MARGIN
    sizes = cifar_pack.part_sizes(XZ_BYTES, room - LEASE_BYTES, room)
    beside_lease = room - LEASE_BYTES >= cifar_pack.MIN_FIRST_PART
    parts = [{"number": i, "folder": f"part{i}", "file": f"cifar10.npz.xz.{i}", "bytes": b, "sha256": "0" * 64,
              "call": i if beside_lease else i + 1} for i, b in enumerate(sizes, 1)]
    return {"format": 1, "dataset": "cifar10", "parts": parts, "prepared_at_utc": "2026-11-28T00:00:00Z",
            "source": {"bytes": SOURCE_BYTES}, "rebuilt": {"bytes": 184_381_002, "sha256": "0" * 64},
            "xz": {"bytes": XZ_BYTES, "of_rebuilt": XZ_BYTES / 184_381_002, "of_source": XZ_BYTES / SOURCE_BYTES,
                   "filters": cifar_pack.FILTERS_TEXT}}


def test_every_call_of_the_real_pack_sends_less_than_64_mib_and_the_rung_gets_its_sweep():
    """With the working tree as git holds it now (plus the headroom prepare keeps), CIFAR-10 travels in as few
    calls as the room each leaves allows (three while the tree was under ~7.6 MiB, four once the results grew
    past it: a receive call is short, so the rung keeps its sweep), each under the device tool's 64 MiB with
    .lease in the first; the last call's sweep gets the 430 s that search_spaces/cifar10_rungs_gpu.yaml's header
    sizes its rungs for (LEASE_BUDGET_S=810)."""
    tree = cifar_pack.tree_bytes()
    assert 0 < tree < 16 * cifar_pack.MIB
    manifest = real_manifest(tree)
    calls, sweep_s = cifar_pack.planned_calls(manifest, LEASE_BYTES, 810)
    room = cifar_pack.CARRY_LIMIT - tree - cifar_pack.TREE_HEADROOM - cifar_pack.MARGIN
    beside_lease = room - LEASE_BYTES if room - LEASE_BYTES >= cifar_pack.MIN_FIRST_PART else 0
    fewest = (1 if beside_lease else 0) + math.ceil((XZ_BYTES - beside_lease) / room)
    assert [c.carry for c in calls] == [(".lease", ".lease_cifar/part1"),
                                       *((f".lease_cifar/part{i}",) for i in range(2, fewest + 1))]
    for call in calls:
        assert tree + cifar_pack.TREE_HEADROOM + call.carried_bytes <= cifar_pack.CARRY_LIMIT - cifar_pack.MARGIN
    assert calls[-1].command.endswith("gpu_lease.sh rung EPOCHS") and calls[0].command.endswith("gpu_lease.sh receive")
    assert all(c.end - c.start <= timeline.CALL_END_S for c in calls)
    assert all(b.start - a.end == timeline.GAP_S for a, b in zip(calls, calls[1:]))
    assert sweep_s == 430
    text, fits = cifar_pack.render_plan(manifest, calls, sweep_s, tree, 810)
    assert fits and "sweep.py --deadline 430 s" in text and 'carry=[".lease", ".lease_cifar/part1"]' in text
    _, fits_grown = cifar_pack.render_plan(manifest, calls, sweep_s, tree + 8 * cifar_pack.MIB, 810)
    assert not fits_grown  # a tree grown past the headroom: the plan says OVER THE LIMIT (and cifar-plan exits 2)


def test_part_sizes_fill_the_first_call_then_split_evenly(monkeypatch):
    monkeypatch.setattr(cifar_pack, "MIN_FIRST_PART", 10)
    assert cifar_pack.part_sizes(100, 30, 40) == [30, 35, 35]
    assert cifar_pack.part_sizes(100, 5, 40) == [34, 33, 33]  # no room beside .lease: call 1 carries it alone
    assert cifar_pack.part_sizes(20, 30, 40) == [20]
    with pytest.raises(cifar_pack.PackError, match="room -5 bytes a call"):
        cifar_pack.part_sizes(100, 0, -5)


# ---------------------------------------------------------------- gpu_lease.sh's rung lease commands
def lease_sh(tmp_path: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess

    env = {**os.environ, "LEASE_DIR": str(tmp_path / "machine"), "OUT": str(tmp_path / "out"),
           "LEASE_CIFAR_PACK": str(tmp_path / "checkout" / ".lease_cifar"), "LEASE_PYTHON": sys.executable,
           "LEASE_BUDGET_S": "810"}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("args, named", [(["rung", "three"], "EPOCHS has value 'three'"),
                                         (["rung", "3", "--set", "epochs=4"], "argument '--set' 'epochs=4' is not allowed"),
                                         (["rung", "3", "--only"], "argument '--only' is not allowed")])
def test_rung_arguments_other_than_a_budget_and_only_pairs_are_refused_in_one_line(tmp_path, args, named):
    done = lease_sh(tmp_path, *args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and named in done.stderr, done.stderr


def test_a_rung_call_without_every_part_starts_nothing_and_says_which_are_missing(prepared):
    """The rung call of a lease whose second call never came: its receive line names the missing part, then
    one error line; no plan, no sweep."""
    tmp_path, _, _ = prepared
    machine = tmp_path / "machine"
    cifar_pack.receive(carry(tmp_path, 1), machine)
    carry(tmp_path, 3)
    done = lease_sh(tmp_path, "rung", "3")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "2 of 3 parts in (1, 3); missing: 2 (carry .lease_cifar/part2)" in done.stdout
    assert done.stderr.count("\n") == 1 and "cifar10.npz is not rebuilt on this machine" in done.stderr
    assert not (machine / "plan.txt").exists() and not (machine / "sweep.log").exists()


# ---------------------------------------------------------------- names read from a manifest (untrusted)
PAYLOAD = b"the rebuilt file\n"


def one_part_pack(tmp_path: Path, rebuilt_file: str = "cifar10.npz", folder: str = "part1",
                  extra_parts: tuple[dict, ...] = ()) -> Path:
    """A pack of one real part (its xz, size and digest right) whose manifest names `rebuilt_file`, `folder`."""
    xz = lzma.compress(PAYLOAD, format=lzma.FORMAT_XZ)
    pack = tmp_path / "checkout" / ".lease_cifar"
    (pack / "part1").mkdir(parents=True)
    (pack / "part1" / "p.xz").write_bytes(xz)
    parts = [{"number": 1, "folder": folder, "file": "p.xz", "bytes": len(xz),
              "sha256": hashlib.sha256(xz).hexdigest(), "call": 1}, *extra_parts]
    manifest = {"format": 1, "dataset": "cifar10", "parts": parts,
                "rebuilt": {"file": rebuilt_file, "bytes": len(PAYLOAD), "sha256": hashlib.sha256(PAYLOAD).hexdigest()}}
    (pack / "part1" / cifar_pack.MANIFEST).write_text(json.dumps(manifest))
    return pack


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_a_rebuilt_file_name_that_leaves_the_data_folder_is_refused_and_nothing_is_overwritten(tmp_path, capsys, where):
    """rebuilt.file is a path under LEASE_DIR/data: '/home/u/.bashrc' or '../../x' would overwrite any file."""
    victim = tmp_path / "victim.txt"
    victim.write_text("original\n")
    name = str(victim) if where == "absolute" else "../../victim.txt"
    pack = one_part_pack(tmp_path, rebuilt_file=name)
    assert cifar_pack.main(["receive", "--pack", str(pack), "--into", str(tmp_path / "a" / "lease")]) == 1
    err = capsys.readouterr().err.strip()
    assert victim.read_text() == "original\n"
    assert err.count("\n") == 0 and f"rebuilt.file has value {name!r}; allowed: " in err, err


@pytest.mark.parametrize("field, value", [("folder", "part2\n2\tx\ttouch PWNED; #"), ("folder", "a\tb"),
                                          ("file", "a/b"), ("file", ".hidden"), ("folder", "..")])
def test_a_part_name_with_a_tab_newline_or_slash_is_refused_where_the_manifest_is_read(tmp_path, field, value):
    """Part names become paths and the tab-separated `plan --calls` lines rehearse_rung.sh runs with bash -c:
    a tab or newline in a folder would forge a call's command."""
    evil = {"number": 2, "folder": "part2", "file": "b", "bytes": 1, "sha256": "0" * 64, "call": 2, field: value}
    pack = one_part_pack(tmp_path, extra_parts=(evil,))
    with pytest.raises(cifar_pack.PackError) as refused:
        cifar_pack.read_manifest(pack / "part1" / cifar_pack.MANIFEST)
    message = str(refused.value)
    assert "\n" not in message and f"parts[1].{field} has value {value!r}; allowed: " in message


def test_plan_calls_never_prints_a_forged_call(tmp_path, capsys):
    """`plan --calls` with a folder holding a newline and tabs: one error line, no line for bash -c to run."""
    evil = {"number": 2, "folder": "part2\n2\tx\ttouch PWNED; #", "file": "b", "bytes": 1, "sha256": "0" * 64,
            "call": 2}
    pack = one_part_pack(tmp_path, extra_parts=(evil,))
    (tmp_path / ".lease").mkdir()
    assert cifar_pack.main(["plan", "--pack", str(pack), "--lease", str(tmp_path / ".lease"), "--budget", "810",
                            "--calls"]) == 2
    out, err = capsys.readouterr()
    assert "PWNED" not in out and err.count("\n") == 1 and "parts[1].folder has value" in err, (out, err)
    manifest = json.loads((pack / "part1" / cifar_pack.MANIFEST).read_text())
    with pytest.raises(cifar_pack.PackError, match=r"parts\[1\]\.folder has value"):
        cifar_pack.planned_calls(manifest, 0, 810)  # checked again where the carry list is built


@pytest.mark.parametrize("planted", ["cifar10.npz", ".cifar10.npz.rebuilding", ".cifar10.npz.sha256"])
def test_the_rebuild_never_writes_through_a_link(tmp_path, capsys, planted):
    """A link at the rebuilt file, its temporary file or its digest marker: the file it points at is unchanged
    (a link at the target or marker is refused in one line; one at the temporary name is removed, not followed)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("original\n")
    data = tmp_path / "lease" / "data"
    data.mkdir(parents=True)
    (data / planted).symlink_to(victim)
    pack = one_part_pack(tmp_path)
    code = cifar_pack.main(["receive", "--pack", str(pack), "--into", str(tmp_path / "lease")])
    err = capsys.readouterr().err.strip()
    assert victim.read_text() == "original\n"
    if planted == ".cifar10.npz.rebuilding":
        assert code == 0 and (data / "cifar10.npz").read_bytes() == PAYLOAD and not (data / planted).is_symlink()
    else:
        assert code == 1 and err.count("\n") == 0 and "is a symbolic link" in err and planted in err, err


def test_rungs_says_plan_py_could_not_run_instead_of_calling_every_rung_too_long(tmp_path):
    """The lease review: `cifar-plan` under an interpreter without rpevit's environment (the default python3 here
    has no torch) printed 'does NOT fit one call, even as halves' for every rung: plan.py's crash read as its
    answer. Now one line says plan.py could not run, and with which interpreter."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch' (stand-in)\")\n")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lease" / "cifar_pack.py"), "rungs", "--space",
                           str(ROOT / "search_spaces" / "cifar10_rungs_gpu.yaml"), "--deadline-s", "430",
                           "--throughput", str(ROOT / "results" / "gpu_h100" / "lease_2026-11-26" / "throughput_packed.json")],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "does NOT fit" not in done.stdout, done.stdout + done.stderr
    assert done.stderr.strip().startswith("error: benchmarks/lease/plan.py could not run under ")
    assert "No module named 'torch' (stand-in)" in done.stderr and "LEASE_PYTHON=" in done.stderr
