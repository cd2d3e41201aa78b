"""Datasets and deterministic batching for neuron.

Loading
-------
``load_dataset(spec)`` accepts:

* ``"synthetic"``      random normal images + random labels (no test split)
* ``"digits"``         scikit-learn's 8x8 digits, shape (1, 8, 8), 1437/360 split
* ``"cifar10:DIR"``    CIFAR-10 *binary* version (``data_batch_{1..5}.bin``,
                       ``test_batch.bin``), shape (3, 32, 32)
* ``"mnist:DIR"``      MNIST IDX files (optionally ``.gz``), shape (1, 28, 28)
* ``"folder:DIR"``     an ImageFolder layout (one subfolder per class, JPEG/PNG),
                       decoded lazily by background threads (image_folder.py)

Every real dataset is scaled to [0, 1] and then standardized per channel with
the mean/std of the *training* split (the same statistics are applied to the
test split).  ``x`` is float32 (N, C, H, W), ``y`` is int64 (N,).

Batching
--------
``batches`` walks one epoch; its permutation is a pure function of
``(seed, epoch)``.  ``iterate`` is an infinite stream over epochs whose step
``k`` is a pure function of ``(seed, k)``, so a run can resume at any step.
"""
from __future__ import annotations

import gzip
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .batch_order import epoch_batches, epoch_permutation
from ..errors import NeuronError
from .image_folder import load_image_folder

__all__ = [
    "DataFormatError",
    "Dataset",
    "Split",
    "load_dataset",
    "batches",
    "iterate",
    "write_cifar10_bin",
    "write_mnist_idx",
    "ACCEPTED_SPECS",
]

ACCEPTED_SPECS = ("synthetic", "digits", "cifar10:DIR", "mnist:DIR", "folder:DIR")


class DataFormatError(NeuronError, ValueError):
    """A data file exists but its contents are not what the format requires."""


# --------------------------------------------------------------------------
# containers
# --------------------------------------------------------------------------
@dataclass
class Dataset:
    name: str
    x: np.ndarray  # (N, C, H, W) float32, normalized
    y: np.ndarray  # (N,) int64
    num_classes: int
    origin: str = ""  # what was read, e.g. "10000 images from data_batch_1.bin"

    def __post_init__(self) -> None:
        x = np.asarray(self.x)
        y = np.asarray(self.y)
        if x.dtype.kind != "f":
            # complex parts would be dropped; integer pixels are not normalized; objects fail late
            raise DataFormatError(
                f"{self.name}: images must be normalized real floating point, found dtype "
                f"{x.dtype} (scale and standardize pixels first, as load_dataset does)")
        if x.ndim != 4:
            raise DataFormatError(
                f"{self.name}: x must have shape (N, C, H, W), found shape {x.shape}")
        if y.ndim != 1:
            raise DataFormatError(
                f"{self.name}: y must have shape (N,), found shape {y.shape}")
        if x.shape[0] != y.shape[0]:
            raise DataFormatError(
                f"{self.name}: x has {x.shape[0]} samples but y has {y.shape[0]} labels")
        if not np.issubdtype(y.dtype, np.integer):
            raise DataFormatError(
                f"{self.name}: labels must be integers, found dtype {y.dtype}")
        if int(self.num_classes) < 1:
            raise ValueError(f"{self.name}: num_classes must be >= 1, got {self.num_classes}")
        self.num_classes = int(self.num_classes)
        if y.size:
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi >= self.num_classes:
                raise DataFormatError(
                    f"{self.name}: labels must lie in [0, {self.num_classes}), "
                    f"found range [{lo}, {hi}]")
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self.y = np.ascontiguousarray(y, dtype=np.int64)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.x.shape[1:])  # type: ignore[return-value]

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass
class Split:
    train: Dataset
    test: Dataset | None


# --------------------------------------------------------------------------
# normalization
# --------------------------------------------------------------------------
def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean/std (float64) of (N, C, H, W) data, memory-frugal."""
    c = x.shape[1]
    mean = np.empty(c, np.float64)
    std = np.empty(c, np.float64)
    for ch in range(c):
        plane = x[:, ch]
        if x.dtype == np.uint8:
            # exact statistics from a 256-bin histogram; no float copy of the data
            counts = np.bincount(plane.ravel(), minlength=256).astype(np.float64)
            vals = np.arange(256, dtype=np.float64)
            n = counts.sum()
            m = (counts * vals).sum() / n
            var = (counts * (vals - m) ** 2).sum() / n
        else:
            p = plane.astype(np.float64)
            m = p.mean()
            var = p.var()
        mean[ch] = m
        std[ch] = np.sqrt(var)
    std[std < 1e-12] = 1.0  # constant channel: only center it
    return mean, std


def _apply_norm(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, np.float32)
    for ch in range(x.shape[1]):
        np.subtract(x[:, ch], mean[ch], out=out[:, ch], dtype=np.float32)
        out[:, ch] *= np.float32(1.0 / std[ch])
    return out


def _standardize(train_raw: np.ndarray, test_raw: np.ndarray | None):
    """Standardize with train statistics. Scale invariance means that the
    result equals standardizing ``raw / 255`` (or ``raw / 16``)."""
    mean, std = _channel_stats(train_raw)
    tr = _apply_norm(train_raw, mean, std)
    te = None if test_raw is None else _apply_norm(test_raw, mean, std)
    return tr, te


# --------------------------------------------------------------------------
# synthetic / digits
# --------------------------------------------------------------------------
def _load_synthetic(sample_shape, num_classes, size, seed) -> Split:
    shape = tuple(int(d) for d in sample_shape)
    if len(shape) != 3 or any(d < 1 for d in shape):
        raise ValueError(f"synthetic: sample_shape must be 3 positive ints (C, H, W), got {sample_shape!r}")
    if int(num_classes) < 1:
        raise ValueError(f"synthetic: num_classes must be >= 1, got {num_classes}")
    if int(size) < 1:
        raise ValueError(f"synthetic: synthetic_size must be >= 1, got {size}")
    rng = np.random.default_rng(np.random.SeedSequence([_check_seed(seed), 0x5F17]))
    x = rng.standard_normal((int(size),) + shape, dtype=np.float32)
    y = rng.integers(0, int(num_classes), size=int(size), dtype=np.int64)
    return Split(Dataset("synthetic", x, y, int(num_classes)), None)


DIGITS_TEST_SIZE = 360


def _stratified_split(y: np.ndarray, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split (pure numpy, independent of sklearn's
    version).  Each class gives round(n_test * share) samples to test; the
    rounding remainder is settled by largest fractional part (ties -> lower
    class id)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD161]))
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * n_test / len(y)
    take = np.floor(exact).astype(np.int64)
    short = n_test - int(take.sum())
    order = np.lexsort((classes, -(exact - take)))  # largest fraction first
    take[order[:short]] += 1
    test_idx = []
    for cls, k in zip(classes, take):
        idx = np.flatnonzero(y == cls)
        test_idx.append(rng.permutation(idx)[:k])
    test = np.sort(np.concatenate(test_idx))
    mask = np.ones(len(y), bool)
    mask[test] = False
    train = np.flatnonzero(mask)
    # shuffle so that neither split is ordered by source position
    return rng.permutation(train), rng.permutation(test)


def _load_digits(seed) -> Split:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - environment dependent
        raise ImportError("digits: the 'digits' dataset needs scikit-learn (pip install scikit-learn)") from e
    d = load_digits()
    x = (np.asarray(d.data, np.float64) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(d.target, np.int64)
    tr, te = _stratified_split(y, DIGITS_TEST_SIZE, _check_seed(seed))
    xtr, xte = _standardize(x[tr], x[te])
    return Split(Dataset("digits", xtr, y[tr], 10), Dataset("digits", xte, y[te], 10))


# --------------------------------------------------------------------------
# CIFAR-10 (binary version)
# --------------------------------------------------------------------------
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch.bin"


def _read_cifar_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    n_bytes = raw.size
    if n_bytes == 0 or n_bytes % CIFAR_RECORD:
        raise DataFormatError(
            f"cifar10: {path} has {n_bytes} bytes, expected a non-zero multiple of "
            f"{CIFAR_RECORD} (1 label byte + 3072 pixel bytes)")
    rec = raw.reshape(-1, CIFAR_RECORD)
    y = rec[:, 0].astype(np.int64)
    bad = np.flatnonzero(y > 9)
    if bad.size:
        i = int(bad[0])
        raise DataFormatError(
            f"cifar10: {path} record {i} has label byte {int(y[i])}, expected 0..9 "
            f"({bad.size} bad record(s); is this the binary version of CIFAR-10?)")
    x = rec[:, 1:].reshape(-1, 3, 32, 32)
    return x, y


def _load_cifar10(root: Path) -> Split:
    if not root.is_dir():
        raise FileNotFoundError(f"cifar10: directory not found: {root}")
    base = root
    if not any((root / f).is_file() for f in CIFAR_TRAIN_FILES) and (root / "cifar-10-batches-bin").is_dir():
        base = root / "cifar-10-batches-bin"
    train_files = [base / f for f in CIFAR_TRAIN_FILES if (base / f).is_file()]
    if not train_files:
        raise FileNotFoundError(
            f"cifar10: no training batch found in {base} (looked for "
            f"{', '.join(CIFAR_TRAIN_FILES)}; also tried the cifar-10-batches-bin/ subfolder)")
    parts = [_read_cifar_file(p) for p in train_files]
    xtr = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    ytr = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    test_path = base / CIFAR_TEST_FILE
    if test_path.is_file():
        xte, yte = _read_cifar_file(test_path)
    else:
        xte = yte = None
    ntr, nte = _standardize(xtr, xte)
    missing = [f for f in CIFAR_TRAIN_FILES if not (base / f).is_file()]
    origin = (f"{len(ytr)} training images from {', '.join(p.name for p in train_files)} in "
              f"{base}" + (f" ({', '.join(missing)} not found)" if missing else ""))
    train = Dataset("cifar10", ntr, ytr, 10, origin)
    test = None if xte is None else Dataset("cifar10", nte, yte, 10,
                                            f"{len(yte)} test images from {CIFAR_TEST_FILE}")
    return Split(train, test)


def write_cifar10_bin(path, x_uint8, y) -> Path:
    """Write records in the CIFAR-10 binary format: per sample 1 label byte
    followed by 3072 CHW pixel bytes.  Returns the path written."""
    path = Path(path)
    x = np.asarray(x_uint8)
    y = np.asarray(y)
    if x.ndim != 4 or x.shape[1:] != (3, 32, 32):
        raise ValueError(f"write_cifar10_bin: x must have shape (N, 3, 32, 32), got {x.shape}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"write_cifar10_bin: y must have shape ({x.shape[0]},), got {y.shape}")
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.integer) or (x.size and (x.min() < 0 or x.max() > 255)):
            raise ValueError(f"write_cifar10_bin: x must be uint8 (or integers in 0..255), got {x.dtype}")
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() > 9):
        raise ValueError("write_cifar10_bin: labels must be integers in 0..9")
    rec = np.empty((x.shape[0], CIFAR_RECORD), np.uint8)
    rec[:, 0] = y
    rec[:, 1:] = x.reshape(x.shape[0], -1)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec.tofile(path)
    return path


# --------------------------------------------------------------------------
# MNIST (IDX)
# --------------------------------------------------------------------------
MNIST_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dims
MNIST_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dim


def _find_maybe_gz(base: Path, name: str) -> Path | None:
    for cand in (base / name, base / (name + ".gz")):
        if cand.is_file():
            return cand
    return None


def _read_bytes(path: Path) -> bytes:
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as f:
                return f.read()
        except (OSError, EOFError) as e:  # BadGzipFile is an OSError
            raise DataFormatError(f"mnist: {path} is not a valid gzip file ({e})") from e
    return path.read_bytes()


def _read_idx(path: Path, magic: int, ndim: int) -> tuple[np.ndarray, tuple[int, ...]]:
    data = _read_bytes(path)
    header = 4 + 4 * ndim
    if len(data) < 4:
        raise DataFormatError(f"mnist: {path} has {len(data)} bytes, too short for an IDX header")
    (found,) = struct.unpack(">i", data[:4])
    if found != magic:
        raise DataFormatError(
            f"mnist: {path} has magic number {found}, expected {magic} "
            f"({'images, idx3' if magic == MNIST_IMAGES_MAGIC else 'labels, idx1'})")
    if len(data) < header:
        raise DataFormatError(
            f"mnist: {path} has {len(data)} bytes, too short for its {header}-byte IDX header")
    dims = struct.unpack(">" + "I" * ndim, data[4:header])
    expected = header + math.prod(dims)      # Python ints: a corrupt header cannot overflow
    if len(data) != expected:
        raise DataFormatError(
            f"mnist: {path} has {len(data)} bytes, expected {expected} "
            f"({header}-byte header + {' x '.join(map(str, dims))} bytes)")
    arr = np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)
    return arr, dims


def _read_mnist_pair(base: Path, prefix: str, required: bool):
    img_name = f"{prefix}-images-idx3-ubyte"
    lbl_name = f"{prefix}-labels-idx1-ubyte"
    img_path = _find_maybe_gz(base, img_name)
    lbl_path = _find_maybe_gz(base, lbl_name)
    if img_path is None and lbl_path is None and not required:
        return None
    if img_path is None:
        raise FileNotFoundError(f"mnist: file not found: {base / img_name} (or {img_name}.gz)")
    if lbl_path is None:
        raise FileNotFoundError(f"mnist: file not found: {base / lbl_name} (or {lbl_name}.gz)")
    x, dims = _read_idx(img_path, MNIST_IMAGES_MAGIC, 3)
    if dims[1:] != (28, 28):
        raise DataFormatError(
            f"mnist: {img_path} has images of {dims[1]}x{dims[2]}, expected 28x28")
    y, _ = _read_idx(lbl_path, MNIST_LABELS_MAGIC, 1)
    if y.shape[0] != x.shape[0]:
        raise DataFormatError(
            f"mnist: {img_path} has {x.shape[0]} images but {lbl_path} has {y.shape[0]} labels")
    if x.shape[0] == 0:
        raise DataFormatError(f"mnist: {img_path} contains no images")
    bad = np.flatnonzero(y > 9)
    if bad.size:
        i = int(bad[0])
        raise DataFormatError(
            f"mnist: {lbl_path} label {i} is {int(y[i])}, expected 0..9 ({bad.size} bad label(s))")
    return x.reshape(-1, 1, 28, 28), y.astype(np.int64)


def _load_mnist(root: Path) -> Split:
    if not root.is_dir():
        raise FileNotFoundError(f"mnist: directory not found: {root}")
    xtr, ytr = _read_mnist_pair(root, "train", required=True)
    test = _read_mnist_pair(root, "t10k", required=False)
    xte, yte = (None, None) if test is None else test
    ntr, nte = _standardize(xtr, xte)
    return Split(Dataset("mnist", ntr, ytr, 10, f"{len(ytr)} training images from {root}"),
                 None if xte is None else Dataset("mnist", nte, yte, 10,
                                                  f"{len(yte)} test images from {root}"))


def write_mnist_idx(dir, prefix, images_uint8, labels, gz: bool = False) -> tuple[Path, Path]:
    """Write ``{prefix}-images-idx3-ubyte`` and ``{prefix}-labels-idx1-ubyte``
    (``.gz`` appended when ``gz``) into ``dir``; prefix is usually "train" or
    "t10k".  Returns (images_path, labels_path)."""
    d = Path(dir)
    x = np.asarray(images_uint8)
    y = np.asarray(labels)
    if x.ndim != 3:
        raise ValueError(f"write_mnist_idx: images must have shape (N, H, W), got {x.shape}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"write_mnist_idx: labels must have shape ({x.shape[0]},), got {y.shape}")
    for name, a in (("images", x), ("labels", y)):
        if a.dtype != np.uint8 and (not np.issubdtype(a.dtype, np.integer)
                                     or (a.size and (a.min() < 0 or a.max() > 255))):
            raise ValueError(f"write_mnist_idx: {name} must be uint8 (or integers in 0..255)")
    x = x.astype(np.uint8)
    y = y.astype(np.uint8)
    img = struct.pack(">iIII", MNIST_IMAGES_MAGIC, *x.shape) + x.tobytes()
    lbl = struct.pack(">iI", MNIST_LABELS_MAGIC, y.shape[0]) + y.tobytes()
    d.mkdir(parents=True, exist_ok=True)
    sfx = ".gz" if gz else ""
    ip = d / f"{prefix}-images-idx3-ubyte{sfx}"
    lp = d / f"{prefix}-labels-idx1-ubyte{sfx}"
    for p, blob in ((ip, img), (lp, lbl)):
        if gz:
            with gzip.open(p, "wb") as f:
                f.write(blob)
        else:
            p.write_bytes(blob)
    return ip, lp


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------
def load_dataset(spec: str, *, sample_shape=(3, 32, 32), num_classes: int = 10,
                 synthetic_size: int = 1024, seed: int = 0, loader_workers: int | None = None,
                 on_corrupt: str = "skip") -> Split:
    """Load a dataset by spec (see module docstring).

    ``num_classes`` and ``synthetic_size`` only apply to "synthetic";
    ``sample_shape`` to "synthetic" and "folder" (the size images are cropped to), as do
    ``loader_workers`` and ``on_corrupt`` ("skip" or "refuse" unreadable images); ``seed`` drives the synthetic data and the digits split.
    The test split of cifar10/mnist is optional on disk: when its files are
    absent ``Split.test`` is None.
    """
    if not isinstance(spec, str):
        raise ValueError(f"dataset spec must be a string, one of {', '.join(ACCEPTED_SPECS)}; got {spec!r}")
    s = spec.strip()
    kind, sep, arg = s.partition(":")
    kind = kind.lower()
    accepted = ("unknown dataset spec {!r}; accepted forms: "
                "'synthetic', 'digits', 'cifar10:DIR', 'mnist:DIR', 'folder:DIR'")
    if not sep:
        if kind == "synthetic":
            return _load_synthetic(sample_shape, num_classes, synthetic_size, seed)
        if kind == "digits":
            return _load_digits(seed)
        if kind in ("cifar10", "mnist", "folder"):
            raise ValueError(f"dataset spec {spec!r} needs a directory: '{kind}:DIR'")
        raise ValueError(accepted.format(spec))
    if kind not in ("cifar10", "mnist", "folder"):
        raise ValueError(accepted.format(spec))
    if not arg.strip():
        raise ValueError(f"dataset spec {spec!r} needs a directory: '{kind}:DIR'")
    root = Path(os.path.expanduser(arg.strip()))
    if kind == "folder":
        return Split(*load_image_folder(root, sample_shape, workers=loader_workers,
                                        on_corrupt=on_corrupt))
    return _load_cifar10(root) if kind == "cifar10" else _load_mnist(root)


# --------------------------------------------------------------------------
# batching
# --------------------------------------------------------------------------
def _check_seed(seed) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return int(seed)


def _check_batch(ds: Dataset, batch, drop_last: bool) -> int:
    if isinstance(batch, (bool, np.bool_)) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch size must be a positive int, got {batch!r}")
    n = len(ds)
    if drop_last and batch > n:
        raise ValueError(
            f"batch size {int(batch)} is larger than dataset '{ds.name}' with {n} samples")
    return int(batch)


def batches(ds: Dataset, batch: int, *, shuffle: bool, seed: int, epoch: int = 0,
            drop_last: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of (x, y) batches.  With ``shuffle`` the order is a pure
    function of (seed, epoch).  Yields fresh C-contiguous float32 x and int64 y.

    ``batch > len(ds)`` raises ValueError when ``drop_last`` (no batch would be
    produced); with ``drop_last=False`` the whole dataset is one batch.
    """
    b = _check_batch(ds, batch, drop_last)
    seed = _check_seed(seed)
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
    n = len(ds)
    order = epoch_permutation(n, seed, int(epoch)) if shuffle else None
    stop = (n // b) * b if drop_last else n

    def gen():
        for i in range(0, stop, b):
            if order is None:
                xb, yb = ds.x[i:i + b].copy(), ds.y[i:i + b].copy()
            else:
                idx = order[i:i + b]
                xb, yb = ds.x[idx], ds.y[idx]
            yield xb, yb

    return gen()


def steps_per_epoch(ds: Dataset, batch: int) -> int:
    """Number of steps in one epoch of ``iterate`` (always drops the last partial batch)."""
    return len(ds) // _check_batch(ds, batch, True)


def iterate(ds: Dataset, batch: int, *, seed: int, start_step: int = 0, into=None
            ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Infinite shuffled stream over epochs (partial batches dropped).

    Step k uses epoch ``k // steps_per_epoch`` with the same permutation as
    ``batches(ds, batch, shuffle=True, seed=seed, epoch=e)``, so step k is a
    pure function of (seed, k) and ``iterate(..., start_step=k)`` equals the
    tail of ``iterate(..., start_step=0)`` from step k.

    ``into``: called before each batch, returns (images, labels) buffers to gather the batch
    into (Executor.batch_buffers: the staging a replayed step reads, so the batch is not
    copied again) or None; buffers of another shape or type are left alone.
    """
    b = _check_batch(ds, batch, True)
    seed = _check_seed(seed)
    if hasattr(ds, "stream"):       # decoded lazily by background workers (image_folder.py)
        return ds.stream(b, seed, int(start_step))
    if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)) or start_step < 0:
        raise ValueError(f"start_step must be a non-negative int, got {start_step!r}")
    def gen():
        for order, i in epoch_batches(len(ds), b, seed, start_step):
            idx = order[i:i + b]
            bufs = into() if into is not None else None
            if bufs is not None and all(buf.shape == (b, *a.shape[1:]) and buf.dtype == a.dtype
                                        for buf, a in zip(bufs, (ds.x, ds.y))):
                yield np.take(ds.x, idx, axis=0, out=bufs[0]), \
                    np.take(ds.y, idx, axis=0, out=bufs[1])
            else:
                yield ds.x[idx], ds.y[idx]

    return gen()
