"""The data layer: npz loading and validation, the offline error, on-device augmentation, splits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rpevit.data import DataError, load_arrays, load_splits, random_crop_flip
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
