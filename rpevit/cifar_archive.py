"""CIFAR-10 / CIFAR-100 from their authors' *binary* archives: fixed-length records, read as bytes.

Why not torchvision's CIFAR10/CIFAR100 classes: they read the *python* archives with `pickle.load`, and a
file read from disk is untrusted here (a swap of a batch file in a shared data folder between
torchvision's MD5 check and its `pickle.load` would run code). The binary archives hold the same images
and labels as plain records (https://www.cs.toronto.edu/~kriz/cifar.html, "Binary version"):

- CIFAR-10 (`cifar-10-binary.tar.gz`): `cifar-10-batches-bin/data_batch_{1..5}.bin` (train, in that
  order) and `test_batch.bin`, each 10,000 records of <1 byte label><3072 bytes image>;
- CIFAR-100 (`cifar-100-binary.tar.gz`): `cifar-100-binary/train.bin` (50,000 records) and `test.bin`
  (10,000), each record <1 byte coarse label><1 byte fine label><3072 bytes image>; the fine label (100
  classes) is the target, as torchvision's CIFAR100 `targets`.

An image is 1024 red, then 1024 green, then 1024 blue bytes, each channel row-major (32 x 32): here
reshaped to (N, 32, 32, 3), the layout torchvision's `.data` has. Only the named members are read, from
the archive as it is (nothing is extracted, so no path in it is ever written), each a regular file of
exactly the expected size.
"""
from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_BYTES = 3 * 32 * 32


@dataclass(frozen=True)
class CifarArchive:
    """One binary archive: where it is published, its MD5 (as the authors list it), its members per split
    and how a record is laid out."""
    url: str
    md5: str
    members: dict[str, tuple[str, ...]]  # split -> member names, concatenated in this order
    counts: dict[str, int]  # split -> records
    label_bytes: int  # bytes before the image
    label_at: int  # which of them is the target
    classes: int

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[1]


ARCHIVES = {
    "cifar10": CifarArchive(
        "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530",
        {"train": tuple(f"cifar-10-batches-bin/data_batch_{i}.bin" for i in range(1, 6)),
         "test": ("cifar-10-batches-bin/test_batch.bin",)},
        {"train": 50_000, "test": 10_000}, label_bytes=1, label_at=0, classes=10),
    "cifar100": CifarArchive(
        "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz", "03b5dce01913d631647c71ecec9e9cb8",
        {"train": ("cifar-100-binary/train.bin",), "test": ("cifar-100-binary/test.bin",)},
        {"train": 50_000, "test": 10_000}, label_bytes=2, label_at=1, classes=100),
}


class ArchiveError(ValueError):
    """An archive that is not the one named: a member missing, not a regular file, of another size, or a
    label out of range. The message names the archive, the member and what was expected."""


def read_records(archive: Path, spec: CifarArchive) -> dict[str, np.ndarray]:
    """x_train, y_train, x_test, y_test (uint8; images (N, 32, 32, 3)) from the binary archive at `archive`."""
    record = spec.label_bytes + IMAGE_BYTES
    arrays: dict[str, np.ndarray] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for split, names in spec.members.items():
            raw, expected = bytearray(), spec.counts[split] * record
            for name in names:
                try:
                    member = tar.getmember(name)
                except KeyError:
                    raise ArchiveError(f"{archive}: member {name!r} is missing; allowed: the authors' "
                                       f"{spec.filename} (MD5 {spec.md5})") from None
                if not member.isreg():
                    raise ArchiveError(f"{archive}: member {name!r} is not a regular file; allowed: the authors' "
                                       f"{spec.filename}")
                if len(raw) + member.size > expected:  # before reading: a crafted size never allocates
                    raise ArchiveError(f"{archive}: member {name!r} holds {member.size:,} bytes, more than the "
                                       f"{spec.counts[split]:,} {split} records of {record} bytes allow")
                handle = tar.extractfile(member)
                if handle is None:
                    raise ArchiveError(f"{archive}: member {name!r} cannot be read")
                raw += handle.read(member.size)
            if len(raw) != expected:
                raise ArchiveError(f"{archive}: the {split} records hold {len(raw):,} bytes; allowed: "
                                   f"{spec.counts[split]:,} records of {record} bytes ({expected:,})")
            records = np.frombuffer(bytes(raw), dtype=np.uint8).reshape(-1, record)
            labels = records[:, spec.label_at].copy()
            if int(labels.max()) >= spec.classes:
                raise ArchiveError(f"{archive}: a {split} label is {int(labels.max())}; allowed: 0..{spec.classes - 1}")
            images = records[:, spec.label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            arrays[f"x_{split}"], arrays[f"y_{split}"] = np.ascontiguousarray(images), labels
    return arrays
