"""Datasets as whole uint8 tensors on the training device, normalised and augmented there in batches.

Sources, in order: `<data_dir>/<name>.npz` (keys x_train, y_train, x_test, y_test, uint8, the
format of ../shared/data), else a download into data_dir (MNIST through torchvision; CIFAR from the
authors' binary archives, never unpickled: rpevit.cifar_archive), cached as `<name>.npz`.
`digits` (scikit-learn's bundled 8x8 digits) needs no folder and no network. Tiny ViTs are starved
by per-image CPU transforms, hence the on-device path.
"""
from __future__ import annotations

import math
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

import numpy as np
import torch
from torch import Tensor

from rpevit import cifar_archive

ARRAY_CACHE_SIZE = 2  # datasets a process keeps once cache_arrays() was called (sweep workers)
_array_cache: dict[tuple, dict[str, np.ndarray]] | None = None  # None: no caching (the default)
VALIDATION_SEED = 0  # the hold-out is the same for every trial, whatever its seed
FOLDERLESS_DATASETS = ("digits",)  # bundled with scikit-learn: a data folder given for them is a mistake
DIGITS_TEST_FRACTION = 0.2
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")  # the only members of a dataset file that are read
MAX_IMAGES = 1_000_000  # per split of a dataset file (MNIST has 60,000): more is a crafted or wrong file
READ_CHUNK_BYTES = 16 * 2**20


class DataError(RuntimeError):
    """A dataset that cannot be loaded; the message says which file to put where."""


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset's shape and its recipe: what each placeholder field of a config resolves to
    (rpevit.config.RECIPE_FIELDS), so that a trial that leaves a knob alone runs what was chosen for
    its dataset. The recipe's lr, init, grad_clip and redraw_interval are the choices of the dataset's
    own validation split, one for every variant alike (rpevit.analysis.validation_choice; which study
    chose each is named beside DATASET_SPECS, and tests/test_defaults_follow_validation.py fails when
    a published choice and the recipe differ)."""

    name: str
    image_size: int
    channels: int
    num_classes: int
    patch_size: int  # default: 16 tokens for 8x8 and 28x28 images, 64 for 32x32
    augment: str  # the default augmentation: "none", "crop" or "crop_flip"
    crop_padding: int  # zero padding of the random crop
    batch_size: int  # recipe defaults, used when the config leaves them at 0 / -1 / auto
    lr: float
    warmup_epochs: float
    init: str = "trunc_normal"  # initial Linear weights (rpevit.models.vit.ViT)
    grad_clip: float = 1.0  # max global gradient norm (0: off)
    redraw_interval: int = 1  # training steps between random-feature redraws (0: one draw)


DATASET_SPECS = {
    # each dataset's recipe: what a 0 / -1 / auto field resolves to (config.resolve_values).
    # digits (the smoke dataset): lr / init / grad_clip: results/recipe_val_digits (2e-3, torch_default, 1.0; before
    # it timm's init and clipping at lr 1e-3, never chosen on digits); redraw: results/redraw_val_digits (every step
    # until 80%, one choice for every encoding alike: MNIST's value, now chosen on digits' own split)
    "digits": DatasetSpec("digits", 8, 1, 10, 2, "none", 1, 16, 2e-3, 1.0, init="torch_default", grad_clip=1.0,
                          redraw_interval=1),
    # lr / init / grad_clip: results/recipe_val_mnist (4e-3, torch_default, 1.0); redraw: results/redraw_val_mnist
    # (every step, one choice for every encoding alike)
    "mnist": DatasetSpec("mnist", 28, 1, 10, 7, "none", 2, 64, 4e-3, 0.2, init="torch_default", grad_clip=1.0,
                         redraw_interval=1),
    # lr / init / grad_clip: results/recipe_val_cifar10 (1e-3, torch_default, off); redraw:
    # results/redraw_val_cifar10 (every 10 steps, one choice for every encoding alike)
    "cifar10": DatasetSpec("cifar10", 32, 3, 10, 4, "crop_flip", 4, 128, 1e-3, 5.0, init="torch_default",
                           grad_clip=0.0, redraw_interval=10),
    # CIFAR-100 has no validation study of its own: CIFAR-10's choices (the same images and protocol model)
    "cifar100": DatasetSpec("cifar100", 32, 3, 100, 4, "crop_flip", 4, 128, 1e-3, 5.0, init="torch_default",
                            grad_clip=0.0, redraw_interval=10),
}


@dataclass
class Splits:
    """uint8 images (N, C, H, W) and int64 labels, all on one device, plus train-set statistics."""

    spec: DatasetSpec
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    mean: Tensor  # (1, C, 1, 1), pixel scale 0-1
    std: Tensor

    def normalize(self, x: Tensor) -> Tensor:
        """uint8 pixels -> standardised images in the default dtype (float32; float64 inside a
        `dtype: float64` run, where the model is float64 too)."""
        return (x.to(torch.get_default_dtype()) / 255.0 - self.mean) / self.std


def synthetic_splits(dataset: str, n: int, device: torch.device | str, seed: int = 0) -> Splits:
    """n random uint8 images and labels shaped like `dataset`'s, as a training split on the device (no
    file read): for timing and device checks, whose results do not depend on the pixels."""
    spec = DATASET_SPECS[dataset]
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, spec.channels, spec.image_size, spec.image_size), generator=g,
                      dtype=torch.uint8).to(device)
    y = torch.randint(0, spec.num_classes, (n,), generator=g).to(device)
    half = torch.full((1, spec.channels, 1, 1), 0.5, device=device)
    return Splits(spec=spec, x_train=x, y_train=y, x_val=x[:0], y_val=y[:0], x_test=x[:0], y_test=y[:0],
                  mean=half, std=half)


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """--data-dir, else $RPEVIT_DATA, else ./data; always absolute (Ray trials change cwd)."""
    chosen = data_dir or os.environ.get("RPEVIT_DATA") or "data"
    if "\0" in str(chosen):  # no path holds one; pathlib would raise a bare ValueError
        where = "field 'data_dir'" if data_dir else "$RPEVIT_DATA"
        raise DataError(f"{where} has value {str(chosen)!r}, which holds a NUL character; allowed: a folder path "
                        f"without NUL characters")
    return Path(chosen).expanduser().resolve()


def cache_arrays() -> None:
    """Keep the arrays of the last ARRAY_CACHE_SIZE datasets in this process from now on.

    For workers that run trial after trial (the sweep's reused workers): CIFAR-10 takes ~1.6 s to
    read. Cached arrays are read-only and keyed by file, size and mtime; load_splits copies what
    it hands out, so no trial can change what the next one gets.
    """
    global _array_cache
    if _array_cache is None:
        _array_cache = {}


def _cached(key: tuple, load: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if _array_cache is None:
        return load()
    if key not in _array_cache:
        arrays = load()
        for array in arrays.values():
            array.flags.writeable = False
        while len(_array_cache) >= ARRAY_CACHE_SIZE:
            _array_cache.pop(next(iter(_array_cache)))
        _array_cache[key] = arrays
    return dict(_array_cache[key])


def dataset_file(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Where a trial reads dataset `name` (not a folderless one), checked as it will check it before
    reading: the folder is not a file, the .npz is a file (not a folder, a FIFO, a device) where it
    exists, and where it does not, a download is allowed (not RPEVIT_OFFLINE=1). DataError otherwise.
    `sweep.py` calls it for every trial's dataset: a dry run warns of what a trial would refuse, a real local run
    refuses it before Ray starts."""
    folder = resolve_data_dir(data_dir)
    if folder.exists() and not folder.is_dir():
        raise DataError(f"field 'data_dir' has value {str(folder)!r}, which is a file; allowed: a folder "
                        f"holding {name}.npz (or nothing: $RPEVIT_DATA, else ./data)")
    path = folder / f"{name}.npz"
    if path.exists() and not path.is_file():
        raise DataError(f"dataset file {path} is not a file; allowed: an .npz archive with keys "
                        f"x_train, y_train, x_test, y_test")
    if not path.exists() and os.environ.get("RPEVIT_OFFLINE") == "1":
        _download(name, folder, path)  # refuses offline, with the message a trial would give
    return path


def load_arrays(name: str, data_dir: str | os.PathLike | None = None) -> dict[str, np.ndarray]:
    """The four arrays of a dataset, validated against its spec (read-only when cached)."""
    if name not in DATASET_SPECS:
        raise DataError(f"field 'dataset' has value {name!r}; allowed: {', '.join(DATASET_SPECS)}")
    if name in FOLDERLESS_DATASETS:
        if data_dir:  # a folder given for digits is a mistake worth saying, not silently ignoring
            raise DataError(f"field 'data_dir' has value {str(data_dir)!r} but dataset {name!r} is bundled with "
                            f"scikit-learn and reads no data folder; allowed: no data_dir for {name}")
        return _cached((name,), _digits_arrays)
    path = dataset_file(name, data_dir)
    if not path.exists():
        _download(name, path.parent, path)
    stat = path.stat()
    return _cached((name, str(path), stat.st_size, stat.st_mtime_ns), lambda: _read_npz(name, path))


def _read_npz(name: str, path: Path) -> dict[str, np.ndarray]:
    """The four arrays of a dataset file, each checked from its .npy header (dtype, shape, size)
    before a byte of it is decompressed: a crafted archive (a zip bomb, thousands of members, a
    header claiming 10^12 images) is refused with a message, not read into memory."""
    allowed = f"a valid {name}.npz with keys {', '.join(NPZ_KEYS)}"
    if not zipfile.is_zipfile(path):  # else np.load would try (and refuse) to unpickle it
        with open(path, "rb") as handle:
            head = handle.read(16)
        raise DataError(f"dataset file {path} is corrupt or not an .npz archive (an .npz is a zip file; this one "
                        f"starts with {head!r}); allowed: {allowed}")
    spec = DATASET_SPECS[name]
    arrays: dict[str, np.ndarray] = {}
    where = ""
    try:
        with zipfile.ZipFile(path) as archive:
            members = {info.filename: info for info in archive.infolist()}
            for key in NPZ_KEYS:  # only these: other members are never read
                info = members.get(f"{key}.npy")
                if info is None:
                    raise DataError(f"dataset file {path}: key {key!r} is missing; expected keys "
                                    f"{', '.join(NPZ_KEYS)}")
                where = f": key {key!r}"
                with archive.open(info) as member:
                    shape, fortran, dtype = _npy_header(member)
                    _check_header(key, shape, dtype, spec, path)
                    arrays[key] = _read_npy_data(member, info, shape, fortran, dtype, key, path)
    except DataError:
        raise
    except (OSError, ValueError, RuntimeError, NotImplementedError, EOFError, zipfile.BadZipFile,
            zlib.error) as err:  # a torn archive, an encrypted member, a header numpy cannot parse
        what = f"{where} is corrupt" if where else " is corrupt or not an .npz archive"
        raise DataError(f"dataset file {path}{what} ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                        f"allowed: {allowed}") from err
    _check_arrays(arrays, spec, str(path))
    return arrays


def _npy_header(member: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of an .npy stream, read from its header alone."""
    version = np.lib.format.read_magic(member)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)  # 2.0, 3.0: a 4-byte length
    return read_header(member)


def _check_header(key: str, shape: tuple, dtype: np.dtype, spec: "DatasetSpec", path: Path) -> None:
    """An array's declared dtype and shape against the dataset's spec and MAX_IMAGES, before reading it."""
    side = spec.image_size
    want = (side, side) if spec.channels == 1 else (side, side, spec.channels)
    if key.startswith("x_"):
        ok = dtype == np.uint8 and len(shape) == 1 + len(want) and tuple(shape[1:]) == want
        expected = f"uint8 of shape (N, {', '.join(map(str, want))})"
    else:
        ok = dtype.kind in "iu" and len(shape) == 1
        expected = "integer labels of shape (N,)"
    if not ok:
        raise DataError(f"dataset file {path}: key {key!r} has shape {tuple(shape)} and dtype {dtype}; "
                        f"expected {expected}")
    if shape[0] > MAX_IMAGES:
        raise DataError(f"dataset file {path}: key {key!r} declares {shape[0]:,} images (shape {tuple(shape)}); "
                        f"allowed: at most {MAX_IMAGES:,} per split")


def _read_npy_data(member: IO[bytes], info: zipfile.ZipInfo, shape: tuple, fortran: bool, dtype: np.dtype,
                   key: str, path: Path) -> np.ndarray:
    """The data after an .npy header: exactly the bytes its (checked) shape needs, read in chunks
    into the array (no second copy), never more than that from a member that declares less."""
    count = math.prod(shape)
    size = count * dtype.itemsize
    if info.file_size < size:
        raise DataError(f"dataset file {path}: key {key!r} is truncated ({info.file_size:,} bytes for a {size:,}-byte "
                        f"array of shape {tuple(shape)}); allowed: a complete {path.name}")
    array = np.empty(count, dtype=dtype)
    target, filled = memoryview(array.view(np.uint8)), 0
    while filled < size:
        chunk = member.read(min(size - filled, READ_CHUNK_BYTES))
        if not chunk:
            raise DataError(f"dataset file {path}: key {key!r} is truncated ({filled:,} of {size:,} bytes); "
                            f"allowed: a complete {path.name}")
        target[filled:filled + len(chunk)] = chunk
        filled += len(chunk)
    return array.reshape(shape[::-1]).transpose() if fortran else array.reshape(shape)


def _digits_arrays() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype(np.uint8), test_size=DIGITS_TEST_FRACTION,
        random_state=0, stratify=digits.target,
    )
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def _download(name: str, folder: Path, path: Path) -> None:
    expected = (f"put {path.name} (keys x_train, y_train, x_test, y_test; uint8) in {folder}, "
                f"or pass --data-dir / set RPEVIT_DATA to a folder that holds it")
    if os.environ.get("RPEVIT_OFFLINE") == "1":
        raise DataError(f"dataset {name!r}: {path} does not exist and downloads are off "
                        f"(RPEVIT_OFFLINE=1); {expected}")
    cache = folder / "torchvision"
    created = [p for p in (cache, folder, *folder.parents) if not p.exists()]  # what a failure must remove
    before = set(cache.rglob("*")) if cache.is_dir() else set()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        arrays = _cifar_arrays(name, cache) if name in cifar_archive.ARCHIVES else _torchvision_arrays(name, cache)
    except Exception as err:  # any download failure becomes the same actionable message
        _remove_new(cache, before, created)
        raise DataError(f"dataset {name!r}: {path} does not exist and the download failed "
                        f"({type(err).__name__}: {err}); {expected}") from err
    write_arrays(path, arrays)


def _torchvision_arrays(name: str, cache: Path) -> dict[str, np.ndarray]:
    """MNIST through torchvision: it parses the raw IDX files itself (a legacy processed .pt it would load
    with weights_only=True), no pickle."""
    import torchvision.datasets as tvd

    cls = {"mnist": tvd.MNIST}[name]
    arrays = {}
    for split in ("train", "test"):
        ds = cls(str(cache), train=(split == "train"), download=True)
        arrays[f"x_{split}"] = np.asarray(ds.data, dtype=np.uint8)
        arrays[f"y_{split}"] = np.asarray(ds.targets, dtype=np.uint8)
    return arrays


def _cifar_arrays(name: str, cache: Path) -> dict[str, np.ndarray]:
    """CIFAR from the authors' binary archive (rpevit.cifar_archive: records read as bytes, never
    unpickled), downloaded into `cache` by torchvision's downloader, which checks its MD5."""
    from torchvision.datasets.utils import download_url

    spec = cifar_archive.ARCHIVES[name]
    cache.mkdir(parents=True, exist_ok=True)
    download_url(spec.url, str(cache), spec.filename, spec.md5)
    return cifar_archive.read_records(cache / spec.filename, spec)


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """`path` as a compressed .npz, atomically (a temp file beside it, then os.replace: a kill leaves no torn
    dataset that the next run would read as whole) and never through a symbolic link: the temp file is created
    afresh (a stale one, or a link planted under its name, is removed as an entry, never followed) with O_EXCL |
    O_NOFOLLOW, and os.replace swaps a link at `path` itself instead of writing where it points."""
    tmp = path.with_suffix(".tmp.npz")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as handle:
        np.savez_compressed(handle, **arrays)
    os.replace(tmp, path)


def _remove_new(cache: Path, before: set[Path], created: list[Path]) -> None:
    """Undo a failed download: what it added under the torchvision cache (partial files, empty
    folders), then the folders it created (deepest first); nothing that was there before."""
    if cache.is_dir() and not cache.is_symlink():
        for item in sorted(set(cache.rglob("*")) - before, key=lambda p: len(p.parts), reverse=True):
            try:
                item.rmdir() if item.is_dir() and not item.is_symlink() else item.unlink()
            except OSError:
                pass
    for folder in created:  # deepest first: cache, then folder, then its created parents
        try:
            folder.rmdir()  # only if empty
        except OSError:
            pass


def _check_arrays(arrays: dict[str, np.ndarray], spec: DatasetSpec, source: str) -> None:
    side = spec.image_size
    shape = f"(N, {side}, {side})" if spec.channels == 1 else f"(N, {side}, {side}, {spec.channels})"
    for split in ("train", "test"):
        xk, yk = f"x_{split}", f"y_{split}"
        for key in (xk, yk):
            if key not in arrays:
                raise DataError(f"dataset file {source}: key {key!r} is missing; "
                                f"expected keys x_train, y_train, x_test, y_test")
        x, y = arrays[xk], arrays[yk]
        want = (side, side) if spec.channels == 1 else (side, side, spec.channels)
        if x.dtype != np.uint8 or x.shape[1:] != want:
            raise DataError(f"dataset file {source}: key {xk!r} has shape {x.shape} and dtype {x.dtype}; "
                            f"expected uint8 of shape {shape}")
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"dataset file {source}: key {yk!r} has shape {y.shape} and dtype {y.dtype}; "
                            f"expected integer labels of shape ({len(x)},)")
        if len(y) and (y.min() < 0 or y.max() >= spec.num_classes):
            raise DataError(f"dataset file {source}: key {yk!r} holds labels outside 0..{spec.num_classes - 1}")


def load_splits(name: str, *, data_dir: str | None = None, device: torch.device | str = "cpu",
                val_fraction: float = 0.1, train_subset: int = 0) -> Splits:
    """Train / fixed seeded validation hold-out / test, as device tensors."""
    spec = DATASET_SPECS[name]
    arrays = load_arrays(name, data_dir)
    order = np.random.default_rng(VALIDATION_SEED).permutation(len(arrays["x_train"]))
    n_val = validation_size(len(order), val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:]
    _check_not_empty(name, len(order), len(train_idx), n_val, len(arrays["x_test"]), val_fraction)
    check_train_subset(name, len(order), val_fraction, train_subset)
    if train_subset:
        train_idx = train_idx[:train_subset]

    def images(x: np.ndarray) -> Tensor:
        x = np.ascontiguousarray(x)
        t = torch.from_numpy(x if x.flags.writeable else x.copy())  # never a view of a cached array
        t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)  # -> N C H W
        return t.contiguous().to(device)

    def labels(y: np.ndarray) -> Tensor:
        return torch.from_numpy(y.astype(np.int64)).to(device)

    x_train = images(arrays["x_train"][train_idx])
    pixels = x_train.float().div_(255.0)
    mean = pixels.mean(dim=(0, 2, 3), keepdim=True)
    std = pixels.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return Splits(
        spec=spec,
        x_train=x_train, y_train=labels(arrays["y_train"][train_idx]),
        x_val=images(arrays["x_train"][val_idx]), y_val=labels(arrays["y_train"][val_idx]),
        x_test=images(arrays["x_test"]), y_test=labels(arrays["y_test"]),
        mean=mean, std=std,
    )


def validation_size(n_images: int, val_fraction: float) -> int:
    """How many of a dataset's n_images training images the seeded validation hold-out takes."""
    return int(round(val_fraction * n_images))


def check_train_subset(name: str, n_images: int, val_fraction: float, train_subset: int) -> None:
    """A train_subset larger than the training split would train on the whole split while the row records
    train_subset: refused (load_splits, and `sweep.py --dry-run` from the file's header, training_images)."""
    n_val = validation_size(n_images, val_fraction)
    if train_subset > n_images - n_val:
        raise DataError(f"dataset {name!r}: field 'train_subset' has value {train_subset} but the training split "
                        f"holds {n_images - n_val} images ({n_images} training images, val_fraction="
                        f"{val_fraction:g} holds out {n_val}); allowed: 1..{n_images - n_val}, or 0 for all")


def training_images(name: str, data_dir: str | os.PathLike | None = None) -> int | None:
    """How many training images a dataset's file holds, read from x_train's .npy header alone (nothing
    decompressed), or None where the file is not there yet or its header is unreadable (a trial reads and
    refuses it then, with load_arrays' message). For the dry run's train_subset check."""
    if name in FOLDERLESS_DATASETS:
        return len(_cached((name,), _digits_arrays)["x_train"])
    path = dataset_file(name, data_dir)
    try:
        with zipfile.ZipFile(path) as archive, archive.open("x_train.npy") as member:
            shape = _npy_header(member)[0]
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError, EOFError, zipfile.BadZipFile,
            zlib.error):
        return None
    return int(shape[0]) if shape else None


def _check_not_empty(name: str, n_images: int, n_train: int, n_val: int, n_test: int,
                     val_fraction: float) -> None:
    """An empty split would end in a ZeroDivisionError deep in training or FLOP counting."""
    if n_train == 0:
        raise DataError(f"dataset {name!r}: the train split is empty ({n_images} training images, val_fraction="
                        f"{val_fraction:g} holds out {n_val}); allowed: val_fraction < {1 - 0.5 / max(n_images, 1):.6g} "
                        f"and a dataset file with training images")
    if n_val == 0 and val_fraction > 0:
        raise DataError(f"dataset {name!r}: field 'val_fraction' has value {val_fraction:g} but holds out 0 of "
                        f"{n_images} images; allowed: 0 (no validation), or more than {0.5 / n_images:.3g}")
    if n_test == 0:
        raise DataError(f"dataset {name!r}: the test split is empty (x_test holds 0 images); allowed: a dataset "
                        f"file with at least one test image")


def random_crop_flip(x: Tensor, generator: torch.Generator, padding: int = 4, flip: bool = True) -> Tensor:
    """Per-image random crop from a zero-padded copy (and horizontal flip), on x's device, uint8 in/out."""
    b, dev = x.shape[0], x.device
    oy = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=dev)
    ox = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=dev)
    flipped = torch.rand(b, generator=generator, device=dev) < 0.5
    flipped &= flip
    return crop_flip(x, oy, ox, flipped, padding)


def crop_flip(x: Tensor, oy: Tensor, ox: Tensor, flipped: Tensor, padding: int = 4) -> Tensor:
    """Each image of x (b, C, H, W) cropped at offsets (oy, ox) of its zero-padded copy and mirrored where
    `flipped`: random_crop_flip with its draws passed in (compile: graph draws them per epoch)."""
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    dev = x.device
    rows = oy[:, None] + torch.arange(h, device=dev)  # b h
    cols = ox[:, None] + torch.arange(w, device=dev)  # b w
    cols = torch.where(flipped[:, None], cols.flip(-1), cols)
    return padded[
        torch.arange(b, device=dev)[:, None, None, None],
        torch.arange(c, device=dev)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]


def rotate_images(x: Tensor, degrees: Tensor) -> Tensor:
    """Each image of x (N, C, H, W) rotated about its centre by its angle in `degrees` (N,),
    counter-clockwise as displayed (row 0 at the top; 90 degrees is torch.rot90(x, 1, (-2, -1))),
    bilinear, with zero fill where the rotated image leaves the frame. uint8 in, uint8 out (rounded);
    a float x comes back in its own dtype, unrounded.

    Why on the uint8 pixels, before `Splits.normalize`: zero is the black background there (MNIST's
    digits sit on 0), so the corners the rotation uncovers are background; filled after
    normalisation, zero would be the training mean (a grey frame no test image has). The round trip
    through float costs at most half a grey level per pixel and keeps the step's inputs what every
    other path hands it (uint8, normalised inside the forward). affine_grid with
    align_corners=False puts pixel centres at the same places before and after a multiple of 90
    degrees, so those angles reproduce rot90 up to float rounding (tests/test_data.py).
    """
    if x.ndim != 4 or degrees.shape != (x.shape[0],):
        raise ValueError(f"rotate_images wants x (N, C, H, W) and degrees (N,), got {tuple(x.shape)} and "
                         f"{tuple(degrees.shape)}")
    n, _, h, w = x.shape
    dtype = x.dtype if x.is_floating_point() else torch.float32
    theta = torch.deg2rad(degrees.to(device=x.device, dtype=torch.float64))
    cos, sin = torch.cos(theta), torch.sin(theta)
    # output pixel p samples the input at R^-1 p, R the counter-clockwise rotation in (x right, y down)
    # coordinates; h / w and w / h keep it a rotation in pixels on a non-square image
    affine = torch.zeros(n, 2, 3, dtype=torch.float64, device=x.device)
    affine[:, 0, 0], affine[:, 0, 1] = cos, -sin * h / w
    affine[:, 1, 0], affine[:, 1, 1] = sin * w / h, cos
    grid = torch.nn.functional.affine_grid(affine.to(dtype), [n, x.shape[1], h, w], align_corners=False)
    out = torch.nn.functional.grid_sample(x.to(dtype), grid, mode="bilinear", padding_mode="zeros",
                                          align_corners=False)
    if x.is_floating_point():
        return out
    info = torch.iinfo(x.dtype)
    return out.round_().clamp_(info.min, info.max).to(x.dtype)


def random_rotate(x: Tensor, generator: torch.Generator) -> Tensor:
    """`augment: rotate`: each image rotated by its own uniform angle in [0, 360) degrees, drawn from
    `generator` on x's device (the trial's data generator: a run is reproducible, like
    random_crop_flip). Rotation only: no crop, no flip (a flip is not a rotation)."""
    degrees = 360.0 * torch.rand(x.shape[0], generator=generator, device=x.device)
    return rotate_images(x, degrees)


AUGMENTATIONS = ("none", "crop", "crop_flip", "rotate")  # what `augment` resolves to (besides "auto")


def augment_images(x: Tensor, generator: torch.Generator, augment: str, crop_padding: int) -> Tensor:
    """One training batch under the resolved augmentation (AUGMENTATIONS), drawn from `generator`."""
    if augment == "none":
        return x
    if augment == "rotate":
        return random_rotate(x, generator)
    if augment in ("crop", "crop_flip"):
        return random_crop_flip(x, generator, crop_padding, augment == "crop_flip")
    raise ValueError(f"field 'augment' has value {augment!r}; allowed: auto, {', '.join(AUGMENTATIONS)}")


def batch_indices(n: int, batch_size: int, generator: torch.Generator | None = None):
    """Index tensors of consecutive batches; shuffled with `generator` when given."""
    device = generator.device if generator is not None else "cpu"
    order = (torch.randperm(n, generator=generator, device=device) if generator is not None
             else torch.arange(n))
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]
