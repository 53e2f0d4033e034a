"""CIFAR-10 carried to a GPU lease in parts: packed here, received and rebuilt on the lent machine.

    python benchmarks/lease/cifar_pack.py prepare DATA_DIR [--out .lease_cifar] [--lease .lease]
    python benchmarks/lease/cifar_pack.py receive --into LEASE_DIR [--pack .lease_cifar] [--require-complete]
    python benchmarks/lease/cifar_pack.py plan [--pack .lease_cifar] [--lease .lease] [--budget 810]

Why: the device tool sends at most 64 MiB a call (the working tree, tracked and untracked-not-ignored files,
plus the git-ignored paths a call names in `carry`), and cifar10.npz is 169.6 MB (its arrays already deflated
by np.savez_compressed, so it does not shrink as it is). So `prepare` writes the same four arrays as a
stored npz (184.3 MB; checked equal to the source's), compresses that with xz through two delta filters
(distance 3: the pixel to the left, same channel; distance 96: the pixel above; together the "gradient"
predictor x - left - up + up-left, which photos leave small), and cuts the xz stream into parts, each in its
own folder (.lease_cifar/partN/, with a copy of MANIFEST.json) that one call can carry: part 1 beside .lease
(the wheels), the rest alone. The lent machine's image has Python 3.12 with lzma (no zstd), so the stream
is one it can read with the standard library alone.

`receive` runs at the start of each call that carries a part: it checks the part against the manifest
(size and SHA-256), moves it out of the checkout into LEASE_DIR/cifar_pack/ (the next call's checkout
need not hold it, and /tmp survives while the machine stays warm), and once every part is there rebuilds
LEASE_DIR/data/cifar10.npz and checks its SHA-256 against the manifest. It says in one line how many parts
are in and which are missing; a part of another prepare, a damaged part, or a rebuilt file whose digest
differs is one line naming it, and exit 1. Standard library only (it runs under the image's Python before
anything is unpacked).

`plan` prints the rung lease's calls: each call's carry list and the bytes it sends (the working tree as
it is now, measured with git, plus what it carries; refused over 64 MiB), its command and its times from
t0, and the seconds the rung's sweep gets at the plan's caps (what benchmarks/lease/plan.py is asked with).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timeline  # noqa: E402 (the lease's time constants: one source for every plan)

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
CARRY_LIMIT = 64 * MIB  # the device tool: the working tree plus the carried paths of one call
TREE_HEADROOM = 4 * MIB  # room kept for the working tree to grow between prepare and the lease
MARGIN = 1 * MIB  # below the limit in every call (folder entries, rounding)
MIN_FIRST_PART = 1 * MIB  # a smaller room beside .lease carries no part: call 1 then carries .lease alone
CHUNK = 16 * MIB
MANIFEST = "MANIFEST.json"
FORMAT = 1
DATASET = "cifar10"
ARRAYS = {"x_train": ((50_000, 32, 32, 3), "uint8"), "y_train": ((50_000,), "uint8"),
          "x_test": ((10_000, 32, 32, 3), "uint8"), "y_test": ((10_000,), "uint8")}
FILTERS = [{"id": lzma.FILTER_DELTA, "dist": 3}, {"id": lzma.FILTER_DELTA, "dist": 96},
           {"id": lzma.FILTER_LZMA2, "preset": 9}]
FILTERS_TEXT = "xz: delta dist 3 (left pixel), delta dist 96 (pixel above), lzma2 preset 9"
STATE = "cifar_pack"  # LEASE_DIR/cifar_pack/: the manifest and the parts received so far

# the rung lease's times (seconds; the other constants are timeline.py's)
RECEIVE_S = 15  # a carried part checked (SHA-256 of <= 64 MiB) and moved out of the checkout
REBUILD_S = 40  # the parts joined, xz-decoded into the 184 MB npz and its SHA-256 checked (~10 s on the image)


class PackError(Exception):
    """Bad input or a bad part: the message is one line naming the field or file, the value and what is allowed."""


# A name read from a manifest becomes a path (LEASE_DIR/data/<rebuilt.file>, cifar_pack/<part file>) and a
# field of the tab-separated `plan --calls` lines rehearse_rung.sh runs: so one plain file name, nothing else
# ('/' or '..' would write elsewhere; a tab or newline would forge a call). The pattern is
# rpevit.sweep.space.NAME_PATTERN's, copied: receive runs under the image's Python before rpevit can import.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
NAME_ALLOWED = "1-100 letters, digits, '_', '.', '-', not starting with '.' (one file or folder name)"


def check_name(value: Any, field: str, where: Path | str) -> str:
    """`value` (the manifest's `field`) when it is one plain name; else PackError naming field, value, allowed."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise PackError(f"{where}: {field} has value {value!r}; allowed: {NAME_ALLOWED}")
    return value


def refuse_link(path: Path, field: str) -> None:
    """A path receive writes is never a symbolic link: writing through it would change what it points at."""
    if path.is_symlink():
        raise PackError(f"{field}: {path} is a symbolic link (to {os.readlink(path)!r}); allowed: a regular file or "
                        f"nothing there: receive never writes through a link; remove it")


def write_nofollow(path: Path, text: str) -> None:
    """`text` into `path` atomically and never through a link: a temporary file created with O_EXCL (which
    never follows a link) beside it, then os.replace (which replaces a link there, never its target). Standard
    library only, so not rpevit.sweep.results.atomic_file: receive runs before rpevit can import."""
    refuse_link(path, "a file receive writes")
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.unlink(missing_ok=True)  # a leftover or a planted link: the entry itself goes, never what it points at
    try:
        with open(temp, "x") as handle:
            handle.write(text)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


# ---------------------------------------------------------------- small pieces
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def manifest_id(manifest: dict[str, Any]) -> str:
    """A pack's identity: the digest of its manifest's canonical JSON (12 hex digits are shown)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def mib(n: int | float) -> str:
    return f"{n / MIB:.1f} MiB"


def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (a file: its size; absent: 0)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def tree_bytes(root: Path = ROOT) -> int:
    """What every call sends besides its carry list: the files git tracks and the untracked ones it does not
    ignore (as the device tool counts them), and shared/ where the checkout has one."""
    try:
        command = ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        listed = subprocess.run(command, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise PackError(f"the working tree's size: git ls-files failed in {root} ({err}); allowed: a git checkout")
    total = 0
    for name in {n for n in listed.split(b"\0") if n}:
        path = root / os.fsdecode(name)
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    shared = root / "shared"
    if shared.is_dir() and not shared.is_symlink():
        total += folder_bytes(shared)  # travels even where git ignores it (counted twice at worst: pessimistic)
    return total


def part_sizes(total: int, first_room: int, room: int) -> list[int]:
    """Byte sizes of the parts: the first fills the room beside .lease in call 1 (none when that room is under
    MIN_FIRST_PART: then part 1 is the first of the equal ones), the rest split evenly into as few parts of
    at most `room` as hold them."""
    if total <= 0 or room <= 0:
        raise PackError(f"part sizes: total {total} bytes, room {room} bytes a call; allowed: both above 0 (a "
                        f"working tree under {mib(CARRY_LIMIT - TREE_HEADROOM - MARGIN)})")
    first = min(total, first_room) if first_room >= MIN_FIRST_PART else 0
    rest = total - first
    count = math.ceil(rest / room)
    sizes = [first] if first else []
    if count:
        base, extra = divmod(rest, count)
        sizes += [base + (i < extra) for i in range(count)]
    return sizes


# ---------------------------------------------------------------- prepare
def load_arrays(source: Path) -> dict[str, Any]:
    """The four arrays of a cifar10.npz, checked (names, shapes, dtypes) against what rpevit.data reads."""
    import numpy as np  # here only: receive and plan run without numpy

    if not source.is_file():
        raise PackError(f"DATA_DIR: {source} is not a file; allowed: a folder holding cifar10.npz (the shared data)")
    with np.load(source) as data:
        if sorted(data.files) != sorted(ARRAYS):
            raise PackError(f"{source}: arrays {sorted(data.files)}; allowed: exactly {sorted(ARRAYS)}")
        arrays = {name: data[name] for name in ARRAYS}
    for name, (shape, dtype) in ARRAYS.items():
        if arrays[name].shape != shape or str(arrays[name].dtype) != dtype:
            raise PackError(f"{source}: {name} has shape {arrays[name].shape} and dtype {arrays[name].dtype}; "
                            f"allowed: shape {shape}, dtype {dtype}")
    return arrays


def write_stored_npz(arrays: dict[str, Any], path: Path) -> None:
    """The arrays as a stored (not deflated) npz, checked equal on reading back: the file the lease rebuilds."""
    import numpy as np

    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    with np.load(path) as back:
        for name, array in arrays.items():
            if not np.array_equal(back[name], array):
                raise PackError(f"{path}: {name} read back differs from the source's; allowed: an exact copy")


def compress(source: Path, target: Path) -> None:
    with open(source, "rb") as src, lzma.open(target, "wb", format=lzma.FORMAT_XZ, filters=FILTERS) as dst:
        while block := src.read(CHUNK):
            dst.write(block)


def decompressed_sha256(parts: Iterable[Path], out: Path | None = None) -> tuple[str, int]:
    """SHA-256 and size of the xz stream the parts hold, joined in order; written to `out` when given.
    An undecodable stream is a PackError naming it."""
    digest, size = hashlib.sha256(), 0
    decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    sink = open(out, "xb") if out is not None else None  # O_EXCL: never through a link planted at `out`
    try:
        for part in parts:
            with open(part, "rb") as handle:
                while block := handle.read(CHUNK):
                    data = decoder.decompress(block)
                    digest.update(data)
                    size += len(data)
                    if sink:
                        sink.write(data)
        if not decoder.eof:
            raise PackError("the joined parts end before their xz stream does; allowed: every part of one prepare")
    except lzma.LZMAError as err:
        raise PackError(f"the joined parts are not one xz stream ({err}); allowed: the parts as prepared") from err
    finally:
        if sink:
            sink.close()
    return digest.hexdigest(), size


def prepare(data_dir: Path, out: Path, lease: Path, root: Path = ROOT) -> dict[str, Any]:
    """Write `out` (.lease_cifar/): the parts of the xz of the stored npz and their manifest. Returns the manifest."""
    source = data_dir / f"{DATASET}.npz"
    if not lease.is_dir():
        raise PackError(f"--lease: {lease} is not a folder; allowed: .lease built first (gpu_lease.sh prepare "
                        f"DATA_DIR): part 1 is sized to travel beside it")
    started = time.time()
    stage = out.parent / f"{out.name}.tmp"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        stored, packed = stage / f"{DATASET}.npz", stage / f"{DATASET}.npz.xz"
        write_stored_npz(load_arrays(source), stored)
        rebuilt = {"file": f"{DATASET}.npz", "bytes": stored.stat().st_size, "sha256": sha256_file(stored),
                   "how": f"np.savez (stored, not deflated) of the source's arrays {', '.join(ARRAYS)}, read back "
                          f"equal to them when prepared"}
        compress(stored, packed)
        if decompressed_sha256([packed]) != (rebuilt["sha256"], rebuilt["bytes"]):
            raise PackError(f"{packed}: decodes to other bytes than {stored}; allowed: a lossless round trip")
        stored.unlink()
        tree = tree_bytes(root)
        lease_bytes = folder_bytes(lease)
        room = CARRY_LIMIT - tree - TREE_HEADROOM - MARGIN
        sizes = part_sizes(packed.stat().st_size, room - lease_bytes, room)
        parts = split(packed, sizes, stage, first_with_lease=room - lease_bytes >= MIN_FIRST_PART)
        packed.unlink()
        manifest = {
            "format": FORMAT, "dataset": DATASET,
            "source": {"file": source.name, "bytes": source.stat().st_size, "sha256": sha256_file(source)},
            "rebuilt": rebuilt,
            "xz": {"bytes": sum(sizes), "filters": FILTERS_TEXT,
                   "of_rebuilt": round(sum(sizes) / rebuilt["bytes"], 4),
                   "of_source": round(sum(sizes) / source.stat().st_size, 4)},
            "parts": parts,
            "sizes_at_prepare": {"carry_limit": CARRY_LIMIT, "tree": tree, "tree_headroom": TREE_HEADROOM,
                                 "margin": MARGIN, "lease": lease_bytes},
            "prepared_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "prepare_s": round(time.time() - started, 1),
        }
        for part in parts:
            (stage / part["folder"] / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return manifest


def split(packed: Path, sizes: list[int], stage: Path, first_with_lease: bool) -> list[dict[str, Any]]:
    """Cut `packed` into stage/partN/cifar10.npz.xz.N of `sizes`; the records the manifest lists."""
    parts = []
    with open(packed, "rb") as src:
        for number, size in enumerate(sizes, 1):
            folder = stage / f"part{number}"
            folder.mkdir()
            target = folder / f"{DATASET}.npz.xz.{number}"
            with open(target, "wb") as dst:
                left = size
                while left:
                    block = src.read(min(CHUNK, left))
                    dst.write(block)
                    left -= len(block)
            parts.append({"number": number, "folder": folder.name, "file": target.name, "bytes": size,
                          "sha256": sha256_file(target), "call": number if first_with_lease else number + 1})
    return parts


# ---------------------------------------------------------------- receive (on the lent machine)
def read_manifest(path: Path) -> dict[str, Any]:
    """A MANIFEST.json, checked for the keys receive uses; one line naming the file otherwise."""
    try:
        manifest = json.loads(path.read_text())
        parts = manifest["parts"]
        assert manifest["format"] == FORMAT and manifest["dataset"] == DATASET and parts
        assert [p["number"] for p in parts] == list(range(1, len(parts) + 1))
        for p in parts:
            assert isinstance(p["bytes"], int) and len(p["sha256"]) == 64 and "file" in p and "folder" in p
        assert len(manifest["rebuilt"]["sha256"]) == 64 and isinstance(manifest["rebuilt"]["bytes"], int)
        assert "file" in manifest["rebuilt"]
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as err:
        raise PackError(f"{path}: not a manifest this script wrote ({type(err).__name__}); allowed: the "
                        f"{MANIFEST} `gpu_lease.sh prepare-cifar` wrote beside each part") from None
    check_names(manifest, path)
    return manifest


def check_names(manifest: dict[str, Any], where: Path | str) -> None:
    """Every name of `manifest` that becomes a path or a carry entry (rebuilt.file, each part's file and
    folder) is one plain name (check_name); the first that is not is one line naming it."""
    check_name(manifest["rebuilt"]["file"], "rebuilt.file", where)
    for i, p in enumerate(manifest["parts"]):
        check_name(p["file"], f"parts[{i}].file", where)
        check_name(p["folder"], f"parts[{i}].folder", where)


@dataclass
class Received:
    """Where a lent machine stands: the pack's manifest, the parts in, and whether cifar10.npz is rebuilt."""
    manifest: dict[str, Any]
    have: list[int]
    rebuilt: Path | None

    @property
    def missing(self) -> list[int]:
        return [p["number"] for p in self.manifest["parts"] if p["number"] not in self.have]

    def line(self, pack: Path) -> str:
        parts, short = self.manifest["parts"], manifest_id(self.manifest)[:12]
        text = (f"cifar10 pack {short}: {len(self.have)} of {len(parts)} parts in "
                f"({', '.join(map(str, self.have)) or 'none'})")
        if self.missing:
            carry = ", ".join(f"{pack.name}/{parts[n - 1]['folder']}" for n in self.missing)
            return f"{text}; missing: {', '.join(map(str, self.missing))} (carry {carry})"
        return f"{text}; none missing; {self.rebuilt} rebuilt, sha256 {self.manifest['rebuilt']['sha256'][:16]}... ok"


def check_part(folder: Path, record: dict[str, Any]) -> Path:
    """The part file of `folder`, its size and SHA-256 those of the manifest's record; else one line."""
    path = folder / record["file"]
    if not path.is_file():
        raise PackError(f"{folder}: {record['file']} is missing; allowed: the folder as prepared (carry it again)")
    size, digest = path.stat().st_size, sha256_file(path)
    if (size, digest) != (record["bytes"], record["sha256"]):
        raise PackError(f"{path}: {size} bytes, sha256 {digest[:16]}...; the manifest's: {record['bytes']} bytes, "
                        f"sha256 {record['sha256'][:16]}...: damaged on the way; allowed: the part as prepared "
                        f"(carry it again)")
    return path


def held_manifest(state: Path) -> dict[str, Any] | None:
    path = state / MANIFEST
    return read_manifest(path) if path.exists() else None


def take_part(folder: Path, state: Path) -> int:
    """Check the part in `folder` against its manifest and the pack the machine holds, move it into `state`,
    and remove the emptied folder from the checkout. Returns its number."""
    manifest = read_manifest(folder / MANIFEST)
    held = held_manifest(state)
    if held is not None and manifest_id(held) != manifest_id(manifest):
        raise PackError(f"{folder}: part of pack {manifest_id(manifest)[:12]} (prepared "
                        f"{manifest.get('prepared_at_utc')}); "
                        f"this machine holds parts of pack {manifest_id(held)[:12]} (prepared "
                        f"{held.get('prepared_at_utc')}); allowed: the parts of one prepare (gpu_lease.sh cifar-plan)")
    record = next((p for p in manifest["parts"] if p["folder"] == folder.name), None)
    if record is None:
        raise PackError(f"{folder}: the manifest lists no part in a folder named {folder.name!r}; allowed: "
                        f"{', '.join(p['folder'] for p in manifest['parts'])}")
    path = check_part(folder, record)
    state.mkdir(parents=True, exist_ok=True)
    if held is None:
        write_nofollow(state / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    refuse_link(state / record["file"], f"parts[{record['number'] - 1}].file")
    shutil.move(str(path), str(state / record["file"]))
    shutil.rmtree(folder)
    return record["number"]


def parts_in(state: Path, manifest: dict[str, Any]) -> list[int]:
    """The parts already moved in (checked when they arrived; their sizes checked again here)."""
    return [p["number"] for p in manifest["parts"]
            if (state / p["file"]).is_file() and (state / p["file"]).stat().st_size == p["bytes"]]


def rebuild(state: Path, manifest: dict[str, Any], data: Path) -> Path:
    """Join the parts, decode them into data/cifar10.npz and check its SHA-256 (else one line, no file).
    The name is checked again here (whoever calls this, no manifest name leaves `data`), and nothing is
    written through a link: one at the target is refused, the temporary file is created with O_EXCL."""
    check_names(manifest, "the manifest")
    target = data / manifest["rebuilt"]["file"]
    temp = data / f".{target.name}.rebuilding"
    data.mkdir(parents=True, exist_ok=True)
    refuse_link(target, "rebuilt.file")
    refuse_link(data / f".{target.name}.sha256", "rebuilt.file's digest marker")
    temp.unlink(missing_ok=True)  # a leftover or a planted link: the entry goes, never what a link points at
    try:
        digest, size = decompressed_sha256([state / p["file"] for p in manifest["parts"]], temp)
        want = manifest["rebuilt"]
        if (digest, size) != (want["sha256"], want["bytes"]):
            raise PackError(f"the rebuilt {target.name}: {size} bytes, sha256 {digest[:16]}...; the manifest's: "
                            f"{want['bytes']} bytes, sha256 {want['sha256'][:16]}...; allowed: the file as prepared "
                            f"(carry the parts again)")
        os.replace(temp, target)  # replaces the entry at target (a link swapped in since: the link, not its target)
        write_nofollow(data / f".{target.name}.sha256", digest + "\n")
    finally:
        temp.unlink(missing_ok=True)
    return target


def rebuilt_already(data: Path, manifest: dict[str, Any]) -> Path | None:
    """data/cifar10.npz when this call or an earlier one rebuilt it from this pack (its marker holds the digest)."""
    target, marker = data / manifest["rebuilt"]["file"], data / f".{manifest['rebuilt']['file']}.sha256"
    if target.is_file() and marker.is_file() and marker.read_text().strip() == manifest["rebuilt"]["sha256"] \
            and target.stat().st_size == manifest["rebuilt"]["bytes"]:
        return target
    return None


def receive(pack: Path, into: Path) -> Received | None:
    """Every part folder this call carried (pack/part*), taken in; cifar10.npz rebuilt once all are in.
    None when neither this call nor an earlier one brought any part."""
    state, data = into / STATE, into / "data"
    for folder in sorted(pack.glob("part*")) if pack.is_dir() else []:
        if folder.is_dir():
            take_part(folder, state)
    manifest = held_manifest(state)
    if manifest is None:
        return None
    have = parts_in(state, manifest)
    got = Received(manifest, have, rebuilt_already(data, manifest))
    if not got.missing and got.rebuilt is None:
        got.rebuilt = rebuild(state, manifest, data)
    return got


# ---------------------------------------------------------------- the call plan (here, before the lease)
@dataclass(frozen=True)
class PlannedCall:
    number: int
    carry: tuple[str, ...]
    carried_bytes: int
    command: str
    start: int
    end: int
    what: str


def planned_calls(manifest: dict[str, Any], lease_bytes: int, budget: int, pack_name: str = ".lease_cifar",
                  lease_name: str = ".lease", rung: str = "EPOCHS") -> tuple[list[PlannedCall], int]:
    """The rung lease, call by call, from t0 (the first call's start), and the seconds its sweep gets
    (sweep.py's --deadline at the plan's caps: what plan.py is asked with)."""
    parts = manifest["parts"]
    for i, p in enumerate(parts):  # a folder is printed into a carry list: no tab or newline gets there
        check_name(p["folder"], f"parts[{i}].folder", "the manifest")
    calls_n = max(p["call"] for p in parts)
    export = f"export LEASE_BUDGET_S={budget}; "
    calls, start = [], 0
    for number in range(1, calls_n + 1):
        mine = [p for p in parts if p["call"] == number]
        carry = ([lease_name] if number == 1 else []) + [f"{pack_name}/{p['folder']}" for p in mine]
        carried = (lease_bytes if number == 1 else 0) + sum(p["bytes"] for p in mine)
        last = number == calls_n
        if last:
            end = min(start + timeline.CALL_END_S, budget - timeline.RETURN_S)
            what = ("receive, rebuild cifar10.npz, .lease unpacked if this machine has not, plan.py --exact, "
                    "sweep.py --only epochs=N --deadline, collect")
            command = f"{export}bash benchmarks/gpu_lease.sh rung {rung}"
        else:
            end = start + RECEIVE_S + (timeline.UNPACK_S if number == 1 else 0)
            what = "receive" + (": the part moved in, .lease checked and unpacked, image.txt" if number == 1 else "")
            command = f"{export}bash benchmarks/gpu_lease.sh receive"
        calls.append(PlannedCall(number, tuple(carry), carried, command, start, end, what))
        start = end + timeline.GAP_S
    last = calls[-1]
    sweep_start = last.start + RECEIVE_S + REBUILD_S + timeline.PLAN_S
    sweep_s = (last.end - timeline.COLLECT_S) - sweep_start - timeline.GRACE_S
    return calls, sweep_s


def call_line(call: PlannedCall) -> str:
    """One `plan --calls` line: NUMBER, the carry list (commas), the command, tab-separated. rehearse_rung.sh
    splits it on tabs and runs the command: a tab, newline or comma inside a field (a --pack or --lease name)
    would forge another field or call, so it is refused in one line."""
    for field, value in [*((f"call {call.number} carry entry", c) for c in call.carry),
                         (f"call {call.number} command", call.command)]:
        if re.search(r"[\t\n\r]", value) or (field.endswith("entry") and "," in value):
            raise PackError(f"{field} has value {value!r}; allowed: no tab, newline (nor, in a carry entry, comma)")
    return f"{call.number}\t{','.join(call.carry)}\t{call.command}"


def render_plan(manifest: dict[str, Any], calls: list[PlannedCall], sweep_s: int, tree: int, budget: int) -> tuple[str, bool]:
    """The call plan as `gpu_lease.sh cifar-plan` prints it, and whether every call fits the 64 MiB."""
    xz, src = manifest["xz"], manifest["source"]
    lines = [f"cifar10 pack {manifest_id(manifest)[:12]} (prepared {manifest['prepared_at_utc']}): {len(manifest['parts'])} "
             f"part(s), {xz['bytes']:,} bytes of xz ({xz['of_rebuilt']:.3f} of the {manifest['rebuilt']['bytes']:,}-byte "
             f"stored npz it rebuilds, {xz['of_source']:.3f} of the source's {src['bytes']:,} bytes; {xz['filters']})",
             f"every call sends the working tree too: {tree:,} bytes now ({mib(tree)}: tracked and untracked-not-ignored "
             f"files); the limit is {mib(CARRY_LIMIT)} a call",
             f"the rung lease of LEASE_BUDGET_S={budget} s from t0 (the first call's start); each call with timeout_s 600, "
             f"the next within {timeline.GAP_S} s of the last (the machine waits only 30 s):"]
    fits = True
    for call in calls:
        total = tree + call.carried_bytes
        over = total > CARRY_LIMIT - MARGIN
        fits &= not over
        lines.append(f"call {call.number}: carry={json.dumps(list(call.carry))}: {total:,} bytes sent ({mib(total)}"
                     f"{', OVER THE LIMIT' if over else ''}); t0+{call.start} -> t0+{call.end} s   {call.command}")
        lines.append(f"  {call.what}")
    lines.append(f"the rung's sweep: sweep.py --deadline {sweep_s} s at these caps (receive {RECEIVE_S} s, rebuild "
                 f"{REBUILD_S} s, plan {timeline.PLAN_S} s, collect {timeline.COLLECT_S} s, stop signal "
                 f"{timeline.GRACE_S} s before); plan.py --exact --deadline-s {sweep_s} decides which rung fits")
    last = calls[-1].end
    lines.append(f"back: t0+{last} -> t0+{last + timeline.RETURN_S}; {budget - last - timeline.RETURN_S} s of the "
                 f"budget unused")
    return "\n".join(lines), fits


def pack_manifest(pack: Path) -> dict[str, Any]:
    """The manifest of the pack here (any part folder's copy: they are equal)."""
    copies = sorted(pack.glob(f"part*/{MANIFEST}")) if pack.is_dir() else []
    if not copies:
        raise PackError(f"--pack: {pack} holds no part folder with a {MANIFEST}; allowed: the folder "
                        f"`gpu_lease.sh prepare-cifar DATA_DIR` writes")
    manifests = [read_manifest(c) for c in copies]
    if len({manifest_id(m) for m in manifests}) > 1:
        raise PackError(f"--pack: {pack} holds parts of several prepares; allowed: one (prepare-cifar again)")
    return manifests[0]


# ---------------------------------------------------------------- which rung fits (here, with plan.py)
def space_values(space: Path, field: str) -> list[Any]:
    """The values a space's grid gives `field` (sorted), read from its YAML (a single grid or a list of grids)."""
    import yaml  # here only: the lent machine runs receive without it

    spec = yaml.safe_load(space.read_text())
    grids = spec["grid"] if isinstance(spec.get("grid"), list) else [spec.get("grid") or {}]
    values = {v for grid in grids for v in grid.get(field, [])}
    if not values:
        raise PackError(f"--space: {space} has no grid values of {field!r}; allowed: a space whose grid lists them")
    return sorted(values)


def ask_plan(space: Path, deadline_s: int, throughput: str, only: list[str]) -> tuple[bool, str]:
    """plan.py --exact on `space` with `only`: whether every group fits, and its plan line (or its error)."""
    command = [sys.executable, str(ROOT / "benchmarks" / "lease" / "plan.py"), "--space", str(space), "--exact",
               "--deadline-s", str(deadline_s), "--throughput", throughput]
    for pair in only:
        command += ["--only", pair]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = (done.stdout + done.stderr).splitlines()
    if done.returncode not in (0, 2):  # 2: its answer, "does not fit"; anything else: plan.py itself failed
        raise PackError(f"benchmarks/lease/plan.py could not run under {sys.executable} (exit {done.returncode}: "
                        f"{lines[-1] if lines else 'no output'}); allowed: rpevit's environment, e.g. "
                        f"LEASE_PYTHON=.venv/bin/python bash benchmarks/gpu_lease.sh cifar-plan")
    plan = next((line for line in lines if line.startswith("lease plan:")), "")
    error = next((line for line in lines if line.startswith("error:")), "")
    return done.returncode == 0, plan if done.returncode == 0 else (error or plan or " ".join(lines[-2:]))


def rung_fits(space: Path, deadline_s: int, throughputs: list[str]) -> list[str]:
    """Per rung and measured rate: whole in the rung call, as halves (one attention a lease), or not at all."""
    lines = []
    for epochs in space_values(space, "epochs"):
        for throughput in throughputs:
            whole, text = ask_plan(space, deadline_s, throughput, [f"epochs={epochs}"])
            if whole:
                lines.append(f"rung {epochs}: whole, in one call ({throughput}): {text}")
                continue
            halves = [ask_plan(space, deadline_s, throughput, [f"epochs={epochs}", f"attention={a}"])
                      for a in space_values(space, "attention")]
            how = ("as halves, one lease each (rung {0} --only attention=...)".format(epochs)
                   if all(ok for ok, _ in halves) else "does NOT fit one call, even as halves")
            lines.append(f"rung {epochs}: {how} ({throughput}): {halves[0][1]}")
    return lines


# ---------------------------------------------------------------- the command line
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the parts and their manifest")
    p.add_argument("data_dir", type=Path)
    p.add_argument("--out", type=Path, default=ROOT / ".lease_cifar")
    p.add_argument("--lease", type=Path, default=ROOT / ".lease")
    r = sub.add_parser("receive", help="take in the parts this call carried; rebuild once all are in")
    r.add_argument("--pack", type=Path, default=ROOT / ".lease_cifar")
    r.add_argument("--into", type=Path, required=True)
    r.add_argument("--require-complete", action="store_true", help="exit 4 unless cifar10.npz is rebuilt")
    q = sub.add_parser("plan", help="the rung lease's calls: carry lists, bytes, times")
    q.add_argument("--pack", type=Path, default=ROOT / ".lease_cifar")
    q.add_argument("--lease", type=Path, default=ROOT / ".lease")
    q.add_argument("--budget", default=os.environ.get("LEASE_BUDGET_S", "810"))
    q.add_argument("--sweep-seconds", action="store_true", help="print the rung sweep's seconds alone")
    q.add_argument("--calls", action="store_true", help="one line a call: NUMBER, its carry list (commas), its command")
    f = sub.add_parser("rungs", help="per rung of the space: does plan.py fit it in the rung call")
    f.add_argument("--space", type=Path, default=ROOT / "search_spaces" / "cifar10_rungs_gpu.yaml")
    f.add_argument("--deadline-s", type=int, required=True, help="the rung sweep's seconds (plan --sweep-seconds)")
    f.add_argument("--throughput", nargs="+", required=True, help="benchmarks/throughput.py JSON(s) with a measured rate")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            manifest = prepare(args.data_dir, args.out, args.lease)
            xz = manifest["xz"]
            print(f"{args.out}: {len(manifest['parts'])} part(s), {xz['bytes']:,} bytes ({xz['of_rebuilt']:.3f} of the "
                  f"stored npz, {xz['of_source']:.3f} of the source) in {manifest['prepare_s']:.0f} s: "
                  + ", ".join(f"{p['folder']} {p['bytes']:,} (call {p['call']})" for p in manifest["parts"]))
            return 0
        if args.command == "receive":
            got = receive(args.pack, args.into)
            if got is None:
                print(f"cifar10 pack: no part carried and none on this machine (carry {args.pack.name}/part1 ...)")
                return 4 if args.require_complete else 0
            print(got.line(args.pack))
            return 4 if args.require_complete and got.rebuilt is None else 0
        if args.command == "rungs":
            print(f"which rung of {args.space.name} fits the rung call's sweep of {args.deadline_s} s "
                  f"(benchmarks/lease/plan.py --exact --deadline-s {args.deadline_s} --only epochs=N [--only attention=A]):")
            print("\n".join(rung_fits(args.space, args.deadline_s, args.throughput)))
            return 0
        budget = timeline.parse_budget(str(args.budget))
        manifest = pack_manifest(args.pack)
        if not args.lease.is_dir():
            raise PackError(f"--lease: {args.lease} is not a folder; allowed: .lease (gpu_lease.sh prepare DATA_DIR)")
        calls, sweep_s = planned_calls(manifest, folder_bytes(args.lease), budget, args.pack.name, args.lease.name)
        if args.sweep_seconds:
            print(sweep_s)
            return 0
        if args.calls:  # what benchmarks/lease/rehearse_rung.sh replays, call by call
            print("\n".join(call_line(c) for c in calls))
            return 0
        text, fits = render_plan(manifest, calls, sweep_s, tree_bytes(), budget)
        print(text)
        if not fits:
            print(f"error: a call would send more than {mib(CARRY_LIMIT - MARGIN)}; allowed: a smaller working tree "
                  f"(commit or ignore less) or prepare-cifar again (it sizes the parts to the tree as it is)",
                  file=sys.stderr)
            return 2
        return 0
    except (PackError, timeline.BudgetError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1 if args.command == "receive" else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
