"""The data layer: npz loading and validation, the offline error, on-device augmentation, splits."""
from __future__ import annotations

import io
import sys
import tracemalloc
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from rpevit.data import MAX_IMAGES, DataError, load_arrays, load_splits, random_crop_flip, write_arrays
from tests.conftest import DATA_DIR


def _write_fake_mnist(folder, n_train=50, n_test=20, **overrides):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, n_train).astype(np.uint8),
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, n_test).astype(np.uint8),
    }
    arrays.update(overrides)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez_compressed(folder / "mnist.npz", **arrays)
    return arrays


def test_npz_loads_into_device_tensors(tmp_path) -> None:
    arrays = _write_fake_mnist(tmp_path)
    splits = load_splits("mnist", data_dir=str(tmp_path), val_fraction=0.2)
    assert splits.x_train.shape == (40, 1, 28, 28) and splits.x_train.dtype == torch.uint8
    assert splits.x_val.shape == (10, 1, 28, 28)
    assert torch.equal(splits.x_test[:, 0], torch.from_numpy(arrays["x_test"]))
    assert splits.y_test.dtype == torch.int64
    # the hold-out is fixed: the same images whatever the trial
    again = load_splits("mnist", data_dir=str(tmp_path), val_fraction=0.2)
    assert torch.equal(again.x_val, splits.x_val)
    # train and validation are disjoint and together the training set
    both = torch.cat([splits.x_train, splits.x_val]).flatten(1)
    assert torch.equal(both.sort(0).values, torch.from_numpy(arrays["x_train"]).flatten(1).sort(0).values)


def test_env_var_names_the_folder(tmp_path, monkeypatch) -> None:
    _write_fake_mnist(tmp_path)
    monkeypatch.setenv("RPEVIT_DATA", str(tmp_path))
    assert load_arrays("mnist")["x_train"].shape == (50, 28, 28)


def test_missing_dataset_offline_says_which_file_where(tmp_path) -> None:
    with pytest.raises(DataError) as err:
        load_arrays("cifar10", tmp_path)
    message = str(err.value)
    assert str(tmp_path / "cifar10.npz") in message and "RPEVIT_DATA" in message
    assert "x_train, y_train, x_test, y_test" in message


@pytest.mark.parametrize("overrides, words", [
    ({"x_train": np.zeros((50, 32, 32), np.uint8)}, ["'x_train'", "(50, 32, 32)", "(N, 28, 28)"]),
    ({"x_test": np.zeros((20, 28, 28), np.float32)}, ["'x_test'", "float32", "uint8"]),
    ({"y_test": None}, ["'y_test'", "missing"]),
    ({"y_train": np.full(50, 12, np.uint8)}, ["'y_train'", "0..9"]),
    ({"y_train": np.zeros(49, np.uint8)}, ["'y_train'", "(49,)"]),
])
def test_wrong_shaped_npz_is_named(tmp_path, overrides, words) -> None:
    _write_fake_mnist(tmp_path, **overrides)
    with pytest.raises(DataError) as err:
        load_arrays("mnist", tmp_path)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_corrupt_npz_is_named(tmp_path) -> None:
    (tmp_path / "mnist.npz").write_bytes(b"this is not a zip archive")
    with pytest.raises(DataError, match="corrupt"):
        load_arrays("mnist", tmp_path)


@pytest.mark.slow
def test_digits_needs_no_folder() -> None:
    splits = load_splits("digits", val_fraction=0.1)
    assert splits.x_train.shape[1:] == (1, 8, 8)
    assert len(splits.x_train) + len(splits.x_val) + len(splits.x_test) == 1797
    assert splits.x_train.max() == 255


def test_augmentation_keeps_shape_dtype_and_is_seeded() -> None:
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = [random_crop_flip(x, torch.Generator().manual_seed(s)) for s in (0, 0, 1)]
    assert out[0].shape == x.shape and out[0].dtype == torch.uint8
    assert torch.equal(out[0], out[1]) and not torch.equal(out[0], out[2])
    assert not torch.equal(out[0], x)


def test_crop_is_a_shift_and_flip_a_mirror() -> None:
    x = torch.randint(1, 256, (200, 1, 6, 6), dtype=torch.uint8)
    out = random_crop_flip(x, torch.Generator().manual_seed(0), padding=2)
    for img, src in zip(out[:, 0], x[:, 0]):
        # every crop equals the source, maybe mirrored, shifted by at most 2 with zero fill
        found = False
        for candidate in (src, src.flip(-1)):
            padded = torch.nn.functional.pad(candidate, (2, 2, 2, 2))
            for dy in range(5):
                for dx in range(5):
                    found |= torch.equal(padded[dy:dy + 6, dx:dx + 6], img)
        assert found
    no_flip = random_crop_flip(x, torch.Generator().manual_seed(0), padding=0, flip=False)
    assert torch.equal(no_flip, x)


@pytest.mark.skipif(not (DATA_DIR / "mnist.npz").exists(), reason="needs the offline MNIST copy")
def test_real_mnist_from_the_shared_folder() -> None:
    arrays = load_arrays("mnist", DATA_DIR)
    assert arrays["x_train"].shape == (60000, 28, 28) and arrays["x_test"].shape == (10000, 28, 28)
    assert np.bincount(arrays["y_test"]).tolist()[:3] == [980, 1135, 1032]


# ---- issue 31, items 7, 10 and 16: crafted dataset files, a NUL in data_dir, failed downloads
def _npy_header(shape: tuple, descr: str = "|u1") -> bytes:
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()  # magic, version and header


def _write_members(path, members: dict[str, bytes | np.ndarray], zeros: dict[str, int] | None = None) -> None:
    """An .npz built by hand: arrays, raw .npy bytes, and members followed by `zeros[name]` zero
    bytes streamed through deflate (a zip bomb in miniature: megabytes that compress to kilobytes)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, value in members.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                if isinstance(value, np.ndarray):
                    np.lib.format.write_array(member, value, allow_pickle=False)
                else:
                    member.write(value)
                block = bytes(2**20)
                for _ in range((zeros or {}).get(name, 0)):
                    member.write(block)


def _good_members(n_train: int = 50, n_test: int = 20) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
            "y_train": rng.integers(0, 10, n_train).astype(np.uint8),
            "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
            "y_test": rng.integers(0, 10, n_test).astype(np.uint8)}


def _peak_mb(load) -> tuple[object, float]:
    tracemalloc.start()
    try:
        try:
            result = load()
        except DataError as err:
            result = err
        return result, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_a_header_claiming_too_many_images_is_refused_before_allocating(tmp_path) -> None:
    members = _good_members()
    members["x_train"] = _npy_header((10**12, 28, 28))  # the probe's file: a numpy traceback before
    _write_members(tmp_path / "mnist.npz", members, zeros={"x_train": 8})  # and 8 MB of zeros after it
    err, peak = _peak_mb(lambda: load_arrays("mnist", tmp_path))
    assert isinstance(err, DataError) and peak < 4, (err, peak)
    assert "'x_train' declares 1,000,000,000,000 images" in str(err) and f"at most {MAX_IMAGES:,}" in str(err)
    assert "mnist.npz" in str(err)


def test_zip_bomb_members_are_read_only_as_far_as_a_checked_shape_needs(tmp_path) -> None:
    """A miniature of the probe's 7.7 MB file holding 7.8 GB of zeros: 64 MB of zeros in ~64 KB,
    once in an extra member, once behind the 50 images x_train declares."""
    members = _good_members()
    members["x_train"] = _npy_header((50, 28, 28)) + members["x_train"].tobytes()
    members["bomb"] = _npy_header((32 * 2**20,))
    _write_members(tmp_path / "mnist.npz", members, zeros={"x_train": 32, "bomb": 32})
    assert (tmp_path / "mnist.npz").stat().st_size < 2**20
    arrays, peak = _peak_mb(lambda: load_arrays("mnist", tmp_path))
    assert not isinstance(arrays, DataError), arrays
    assert arrays["x_train"].shape == (50, 28, 28) and peak < 8, peak
    assert np.array_equal(arrays["x_train"], _good_members()["x_train"])


def test_unused_members_are_never_read(tmp_path) -> None:
    members = {**_good_members(), **{f"junk{i}": _npy_header((2**20,)) for i in range(40)}}
    members["pickled"] = _npy_header((3,), descr="|O")  # would need allow_pickle: never looked at
    _write_members(tmp_path / "mnist.npz", members, zeros={f"junk{i}": 1 for i in range(40)})  # 40 MB unused
    arrays, peak = _peak_mb(lambda: load_arrays("mnist", tmp_path))
    assert not isinstance(arrays, DataError), arrays
    assert sorted(arrays) == ["x_test", "x_train", "y_test", "y_train"] and peak < 8, peak


@pytest.mark.parametrize("key, header, words", [
    ("y_train", _npy_header((50,), descr="|O"), ["'y_train'", "object", "integer labels"]),
    ("x_test", _npy_header((20, 28, 28), descr="<f8"), ["'x_test'", "float64", "uint8"]),
    ("x_train", _npy_header((50, 28, 28)) + bytes(100), ["'x_train'", "truncated", "allowed"]),
    ("x_train", b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 20, ["'x_train'", "corrupt", "allowed"]),
])
def test_bad_headers_are_named(tmp_path, key: str, header: bytes, words: list[str]) -> None:
    _write_members(tmp_path / "mnist.npz", {**_good_members(), key: header})
    with pytest.raises(DataError) as err:
        load_arrays("mnist", tmp_path)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_a_nul_in_data_dir_is_named(tmp_path) -> None:
    with pytest.raises(DataError, match="field 'data_dir' has value 'a\\\\x00b', which holds a NUL.*allowed"):
        load_arrays("mnist", "a\0b")


def test_a_failed_download_removes_what_it_created(tmp_path, monkeypatch) -> None:
    """Without the file and without a network, nothing is left behind: not the data folder, not
    an empty data/torchvision/MNIST/raw, not a partial archive; what was there stays."""
    class FailingMNIST:
        def __init__(self, root: str, train: bool, download: bool) -> None:
            raw = Path(root) / "MNIST" / "raw"
            raw.mkdir(parents=True, exist_ok=True)
            (raw / "train-images-idx3-ubyte.gz.part").write_bytes(b"partial")
            raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    datasets = types.ModuleType("torchvision.datasets")
    datasets.MNIST = datasets.CIFAR10 = datasets.CIFAR100 = FailingMNIST
    torchvision = types.ModuleType("torchvision")
    torchvision.datasets = datasets
    monkeypatch.setitem(sys.modules, "torchvision", torchvision)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets)
    monkeypatch.delenv("RPEVIT_OFFLINE", raising=False)

    folder = tmp_path / "new" / "data"
    with pytest.raises(DataError, match="download failed.*RuntimeError"):
        load_arrays("mnist", folder)
    assert not (tmp_path / "new").exists()

    kept = tmp_path / "old" / "torchvision" / "MNIST" / "raw" / "earlier.gz"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"from before")
    with pytest.raises(DataError, match="download failed"):
        load_arrays("cifar10", tmp_path / "old")
    assert kept.exists() and sorted(p.name for p in (tmp_path / "old").rglob("*")) == [
        "MNIST", "earlier.gz", "raw", "torchvision"]


# ---- issue 28, item 5: `augment: rotate` (rpevit.data.rotate_images / random_rotate)
def _bilinear_rotation_by_hand(img: torch.Tensor, degrees: float) -> torch.Tensor:
    """The definition, one output pixel at a time: the pixel centre (x right, y down, about the image
    centre) is sent back by the inverse of the counter-clockwise rotation and the source is read
    bilinearly, neighbours outside the image counting as 0."""
    h, w = img.shape
    a = np.deg2rad(degrees)
    c, s = np.cos(a), np.sin(a)
    out = torch.zeros(h, w, dtype=torch.float64)
    for i in range(h):
        for j in range(w):
            xo, yo = j - (w - 1) / 2, i - (h - 1) / 2
            xs, ys = c * xo - s * yo + (w - 1) / 2, s * xo + c * yo + (h - 1) / 2
            x0, y0 = int(np.floor(xs)), int(np.floor(ys))
            total = 0.0
            for yy, wy in ((y0, 1 - (ys - y0)), (y0 + 1, ys - y0)):
                for xx, wx in ((x0, 1 - (xs - x0)), (x0 + 1, xs - x0)):
                    if 0 <= yy < h and 0 <= xx < w:
                        total += wy * wx * float(img[yy, xx])
            out[i, j] = total
    return out


def test_rotation_at_quarter_turns_is_rot90_exactly() -> None:
    from rpevit.data import rotate_images

    x = torch.randint(0, 256, (6, 3, 9, 9), dtype=torch.uint8)
    for k in range(4):
        out = rotate_images(x, torch.full((6,), 90.0 * k))
        assert out.dtype == torch.uint8 and torch.equal(out, torch.rot90(x, k, dims=(-2, -1))), k
    wide = torch.randint(0, 256, (2, 1, 4, 6), dtype=torch.uint8)
    assert torch.equal(rotate_images(wide, torch.full((2,), 180.0)), torch.rot90(wide, 2, dims=(-2, -1)))


def test_rotation_at_any_angle_is_bilinear_with_zero_fill_by_hand() -> None:
    from rpevit.data import rotate_images

    g = torch.Generator().manual_seed(3)
    x = torch.rand(3, 1, 7, 7, generator=g, dtype=torch.float64) * 255
    angles = torch.tensor([30.0, 137.5, 301.0])
    out = rotate_images(x, angles)
    assert out.dtype == torch.float64
    for n in range(3):
        torch.testing.assert_close(out[n, 0], _bilinear_rotation_by_hand(x[n, 0], float(angles[n])))
    as_uint8 = rotate_images(x.round().to(torch.uint8), angles)  # uint8: the same, rounded
    expected = torch.stack([_bilinear_rotation_by_hand(x.round()[n, 0], float(angles[n])) for n in range(3)])
    assert (as_uint8[:, 0].double() - expected).abs().max() <= 0.5 + 1e-6


def test_random_rotation_is_seeded_uniform_and_dispatched_by_augment() -> None:
    from rpevit.data import augment_images, random_crop_flip, random_rotate, rotate_images

    x = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
    out = [random_rotate(x, torch.Generator().manual_seed(s)) for s in (0, 0, 1)]
    assert out[0].shape == x.shape and out[0].dtype == torch.uint8
    assert torch.equal(out[0], out[1]) and not torch.equal(out[0], out[2])
    # the angles are 360 x the generator's next uniform draws: the same images come out
    angles = 360.0 * torch.rand(64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out[0], rotate_images(x, angles)) and 0 <= angles.min() and angles.max() < 360
    assert torch.equal(augment_images(x, torch.Generator().manual_seed(0), "rotate", 2), out[0])
    assert torch.equal(augment_images(x, torch.Generator().manual_seed(0), "crop", 2),
                       random_crop_flip(x, torch.Generator().manual_seed(0), 2, False))
    assert augment_images(x, torch.Generator(), "none", 2) is x
    with pytest.raises(ValueError, match="augment"):
        augment_images(x, torch.Generator(), "auto", 2)


@pytest.mark.slow
def test_a_rotate_run_is_reproducible_and_differs_from_upright(tiny) -> None:
    from rpevit.config import TrialConfig
    from rpevit.tasks.train import train_and_evaluate

    def run(augment: str) -> dict:
        cfg = TrialConfig.from_dict({**tiny, "dataset": "digits", "epochs": 1, "augment": augment, "eval_draws": 0})
        return train_and_evaluate(cfg, log=None)

    first, second, upright = run("rotate"), run("rotate"), run("none")
    assert first["final_val_acc"] == second["final_val_acc"] and first["test_acc"] == second["test_acc"]
    assert first["log_likelihood"] != upright["log_likelihood"]


def test_a_downloaded_dataset_is_written_atomically_and_never_through_a_link(tmp_path):
    """The download's .npz was written with np.savez_compressed(path.with_suffix('.tmp.npz')), which follows a
    link planted at `mnist.tmp.npz` and overwrites what it points at (failed before). Now the temp file is created
    afresh beside the dataset and renamed over it; a link at the dataset's own name is replaced, not written through."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "mnist.tmp.npz").symlink_to(victim)
    (tmp_path / "cifar10.npz").symlink_to(victim)
    arrays = {"x_train": np.zeros((2, 28, 28), np.uint8), "y_train": np.array([1, 2], np.uint8)}
    for name in ("mnist", "cifar10"):
        write_arrays(tmp_path / f"{name}.npz", arrays)
        with np.load(tmp_path / f"{name}.npz") as back:
            assert back["y_train"].tolist() == [1, 2] and back["x_train"].shape == (2, 28, 28)
        assert not (tmp_path / f"{name}.npz").is_symlink() and not (tmp_path / f"{name}.tmp.npz").exists()
    assert victim.read_text() == "precious"
