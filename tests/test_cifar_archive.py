"""rpevit/cifar_archive.py: CIFAR from the authors' binary archives, records read as bytes (never unpickled),
checked against the documented layout (https://www.cs.toronto.edu/~kriz/cifar.html, "Binary version")."""
from __future__ import annotations

import io
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rpevit import cifar_archive
from rpevit.cifar_archive import ARCHIVES, ArchiveError, read_records

SMALL = {"cifar10": {"train": 10, "test": 4}, "cifar100": {"train": 6, "test": 3}}  # records per member


def documented_records(images: np.ndarray, labels: list[np.ndarray]) -> bytes:
    """Records as the authors document them, written from (N, 32, 32, 3) images: the label byte(s), then
    1024 red, 1024 green and 1024 blue bytes, each channel row-major."""
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # channel, then row, then column
    return b"".join(bytes(np.concatenate([[lab[i] for lab in labels], planes[i]]).astype(np.uint8))
                    for i in range(len(images)))


def write_archive(path: Path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)


def small_archive(name: str, tmp_path: Path, rng: np.random.Generator):
    """A small archive of `name`'s layout and the arrays it must read back as."""
    spec = ARCHIVES[name]
    spec = replace(spec, counts={s: SMALL[name][s] * len(m) for s, m in spec.members.items()})
    members, expected = {}, {}
    for split, names in spec.members.items():
        xs, ys = [], []
        for member in names:
            n = SMALL[name][split]
            x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
            fine = rng.integers(0, spec.classes, n, dtype=np.uint8)
            coarse = rng.integers(0, 20, n, dtype=np.uint8)
            members[member] = documented_records(x, [coarse, fine] if spec.label_bytes == 2 else [fine])
            xs.append(x)
            ys.append(fine)
        expected[f"x_{split}"], expected[f"y_{split}"] = np.concatenate(xs), np.concatenate(ys)
    path = tmp_path / spec.filename
    write_archive(path, members)
    return path, spec, members, expected


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_records_read_back_as_the_images_and_labels_they_were_written_from(name, tmp_path):
    path, spec, _, expected = small_archive(name, tmp_path, np.random.default_rng(0))
    arrays = read_records(path, spec)
    assert set(arrays) == set(expected)
    for key, value in expected.items():
        assert arrays[key].dtype == np.uint8 and arrays[key].flags.c_contiguous
        np.testing.assert_array_equal(arrays[key], value)
    # byte by byte as documented: after the label byte(s), the first 1024 bytes are the red channel row-major
    # (the first 32 bytes its first row), then green, then blue; torchvision's .data is (N, H, W, C)
    first = members_of(path)[spec.members["train"][0]][:spec.label_bytes + cifar_archive.IMAGE_BYTES]
    image = np.frombuffer(first[spec.label_bytes:], dtype=np.uint8)
    for channel in range(3):
        np.testing.assert_array_equal(arrays["x_train"][0, :, :, channel].ravel(), image[1024 * channel:1024 * (channel + 1)])
    np.testing.assert_array_equal(arrays["x_train"][0, 0, :, 0], image[:32])
    assert arrays["y_train"][0] == first[spec.label_at]


def members_of(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}


def test_the_published_archives_are_named_with_their_published_md5():
    assert ARCHIVES["cifar10"].filename == "cifar-10-binary.tar.gz"
    assert ARCHIVES["cifar10"].md5 == "c32a1d4ab5d03f1284b67883e8d87530"
    assert ARCHIVES["cifar100"].md5 == "03b5dce01913d631647c71ecec9e9cb8"
    assert (ARCHIVES["cifar100"].label_bytes, ARCHIVES["cifar100"].label_at) == (2, 1)  # the fine label


def test_a_wrong_archive_is_refused_naming_the_member(tmp_path):
    path, spec, members, _ = small_archive("cifar10", tmp_path, np.random.default_rng(1))
    first = spec.members["train"][0]

    write_archive(path, {k: v for k, v in members.items() if k != first})
    with pytest.raises(ArchiveError, match="data_batch_1.bin' is missing"):
        read_records(path, spec)

    write_archive(path, {k: v for k, v in members.items() if k != first}, links=(first,))
    with pytest.raises(ArchiveError, match="data_batch_1.bin' is not a regular file"):
        read_records(path, spec)

    write_archive(path, {**members, first: members[first][:-1]})
    with pytest.raises(ArchiveError, match="the train records hold .*allowed: 50 records of 3073 bytes"):
        read_records(path, spec)

    write_archive(path, {**members, first: members[first] * 6})
    with pytest.raises(ArchiveError, match="more than the 50 train records"):
        read_records(path, spec)

    bad = bytearray(members[first])
    bad[0] = 10
    write_archive(path, {**members, first: bytes(bad)})
    with pytest.raises(ArchiveError, match="label is 10; allowed: 0..9"):
        read_records(path, spec)


def test_the_download_reads_the_binary_archive_and_never_unpickles(tmp_path, monkeypatch):
    """data._download for CIFAR: the archive torchvision's downloader fetched (MD5 checked there) is read as
    records; pickle is never called (torchvision's CIFAR10 class unpickled the python archive's batches)."""
    import pickle

    from rpevit import data

    (tmp_path / "src").mkdir()
    path, spec, _, expected = small_archive("cifar10", tmp_path / "src", np.random.default_rng(2))
    monkeypatch.setitem(cifar_archive.ARCHIVES, "cifar10", spec)
    fetched = []

    def download_url(url, root, filename, md5):
        fetched.append((url, filename, md5))
        (Path(root) / filename).write_bytes(path.read_bytes())

    import torchvision.datasets.utils as tv_utils
    monkeypatch.setattr(tv_utils, "download_url", download_url)
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle.load called"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle.loads called"))
    monkeypatch.delenv("RPEVIT_OFFLINE", raising=False)
    folder = tmp_path / "data"
    data._download("cifar10", folder, folder / "cifar10.npz")
    assert fetched == [(spec.url, "cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530")]
    with np.load(folder / "cifar10.npz") as written:
        for key, value in expected.items():
            np.testing.assert_array_equal(written[key], value)
