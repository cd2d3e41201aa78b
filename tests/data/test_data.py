import gzip
import struct

import numpy as np
import pytest

from neuron.data import (
    DataFormatError,
    Dataset,
    Split,
    batches,
    iterate,
    load_dataset,
    write_cifar10_bin,
    write_mnist_idx,
)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _rand_cifar(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    return x, y


def _rand_mnist(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    return x, y


def _expected_norm(train_u8, other_u8):
    """Reference: scale to [0,1], per-channel standardize with train stats (float64)."""
    tr = train_u8.astype(np.float64) / 255.0
    mean = tr.mean(axis=(0, 2, 3), keepdims=True)
    std = tr.std(axis=(0, 2, 3), keepdims=True)
    return (other_u8.astype(np.float64) / 255.0 - mean) / std


def _mnist_idx_bytes(magic, dims, payload):
    return struct.pack(">i" + "I" * len(dims), magic, *dims) + bytes(payload)


# --------------------------------------------------------------------------
# spec parsing
# --------------------------------------------------------------------------
def test_unknown_spec_lists_accepted_forms():
    with pytest.raises(ValueError) as ei:
        load_dataset("imagenet")
    msg = str(ei.value)
    for form in ("synthetic", "digits", "cifar10:DIR", "mnist:DIR"):
        assert form in msg
    with pytest.raises(ValueError, match="cifar10:DIR"):
        load_dataset("svhn:/tmp")
    with pytest.raises(ValueError, match="directory"):
        load_dataset("cifar10:")
    with pytest.raises(ValueError, match="directory"):
        load_dataset("mnist")


def test_missing_dir_names_path(tmp_path):
    missing = tmp_path / "nope"
    for spec in (f"cifar10:{missing}", f"mnist:{missing}"):
        with pytest.raises(FileNotFoundError) as ei:
            load_dataset(spec)
        assert str(missing) in str(ei.value)


# --------------------------------------------------------------------------
# synthetic
# --------------------------------------------------------------------------
def test_synthetic_shapes_and_reproducible():
    a = load_dataset("synthetic", sample_shape=(2, 5, 7), num_classes=4, synthetic_size=33, seed=3)
    b = load_dataset("synthetic", sample_shape=(2, 5, 7), num_classes=4, synthetic_size=33, seed=3)
    c = load_dataset("synthetic", sample_shape=(2, 5, 7), num_classes=4, synthetic_size=33, seed=4)
    assert isinstance(a, Split) and a.test is None
    ds = a.train
    assert ds.x.shape == (33, 2, 5, 7) and ds.x.dtype == np.float32
    assert ds.y.shape == (33,) and ds.y.dtype == np.int64
    assert ds.sample_shape == (2, 5, 7) and ds.num_classes == 4 and len(ds) == 33
    assert ds.y.min() >= 0 and ds.y.max() < 4
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.train.y, b.train.y)
    assert not np.array_equal(a.train.x, c.train.x)


def test_synthetic_defaults():
    s = load_dataset("synthetic")
    assert s.train.x.shape == (1024, 3, 32, 32)
    assert s.train.num_classes == 10


# --------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------
def test_digits_split_and_normalization():
    s = load_dataset("digits")
    assert s.train.x.shape == (1437, 1, 8, 8) and s.test.x.shape == (360, 1, 8, 8)
    assert s.train.x.dtype == np.float32 and s.train.y.dtype == np.int64
    assert s.train.num_classes == 10 and s.test.num_classes == 10
    assert s.train.sample_shape == (1, 8, 8)
    # standardized with train statistics
    assert abs(float(s.train.x.mean())) < 1e-5
    assert abs(float(s.train.x.std()) - 1.0) < 1e-5
    # stratified: every class in the test split, roughly proportional
    counts = np.bincount(s.test.y, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38
    # the two splits partition the 1797 samples.  Normalization is one affine map
    # with positive scale and the raw pixels span 0..16, so min/max rescaling
    # recovers the raw integer pixels exactly.
    from sklearn.datasets import load_digits

    d = load_digits()
    both = np.concatenate([s.train.x, s.test.x]).reshape(1797, 64).astype(np.float64)
    lo, hi = both.min(), both.max()
    rescaled = np.round((both - lo) / (hi - lo) * 16).astype(np.int64)
    got = sorted(r.tobytes() + bytes([int(c)]) for r, c in zip(rescaled, np.concatenate([s.train.y, s.test.y])))
    want = sorted(r.astype(np.int64).tobytes() + bytes([int(c)]) for r, c in zip(d.data, d.target))
    assert got == want


def test_digits_deterministic_and_seeded():
    a = load_dataset("digits", seed=0)
    b = load_dataset("digits", seed=0)
    c = load_dataset("digits", seed=1)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.test.y, b.test.y)
    assert len(c.train) == 1437 and len(c.test) == 360
    assert not np.array_equal(a.test.x, c.test.x)


# --------------------------------------------------------------------------
# CIFAR-10
# --------------------------------------------------------------------------
def test_cifar10_roundtrip_with_writer(tmp_path):
    x1, y1 = _rand_cifar(7, 1)
    x2, y2 = _rand_cifar(5, 2)
    xt, yt = _rand_cifar(4, 3)
    write_cifar10_bin(tmp_path / "data_batch_1.bin", x1, y1)
    write_cifar10_bin(tmp_path / "data_batch_3.bin", x2, y2)  # gaps allowed
    write_cifar10_bin(tmp_path / "test_batch.bin", xt, yt)
    s = load_dataset(f"cifar10:{tmp_path}")
    xtr = np.concatenate([x1, x2])
    assert s.train.x.shape == (12, 3, 32, 32) and s.train.x.dtype == np.float32
    assert s.test.x.shape == (4, 3, 32, 32)
    np.testing.assert_array_equal(s.train.y, np.concatenate([y1, y2]))
    np.testing.assert_array_equal(s.test.y, yt)
    assert s.train.y.dtype == np.int64
    np.testing.assert_allclose(s.train.x, _expected_norm(xtr, xtr), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.test.x, _expected_norm(xtr, xt), rtol=1e-5, atol=1e-5)
    # per-channel zero mean / unit std on train
    np.testing.assert_allclose(s.train.x.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(s.train.x.std(axis=(0, 2, 3)), 1, atol=1e-5)
    assert s.train.name == "cifar10" and s.train.num_classes == 10


def test_cifar10_handcrafted_bytes_layout(tmp_path):
    # record = label byte, then 1024 R, 1024 G, 1024 B bytes (row-major 32x32)
    recs = bytearray()
    for label, (r, g, b) in ((3, (10, 20, 30)), (9, (40, 50, 60))):
        recs.append(label)
        recs += bytes([r]) * 1024 + bytes([g]) * 1023 + bytes([255]) + bytes([b]) * 1024
    (tmp_path / "data_batch_1.bin").write_bytes(bytes(recs))
    s = load_dataset(f"cifar10:{tmp_path}")
    assert s.test is None  # no test_batch.bin
    np.testing.assert_array_equal(s.train.y, [3, 9])
    raw = np.zeros((2, 3, 32, 32), np.uint8)
    raw[0, 0], raw[0, 1], raw[0, 2] = 10, 20, 30
    raw[1, 0], raw[1, 1], raw[1, 2] = 40, 50, 60
    raw[:, 1, 31, 31] = 255
    np.testing.assert_allclose(s.train.x, _expected_norm(raw, raw), rtol=1e-5, atol=1e-5)
    # the odd pixel is the largest value of channel 1 in both images
    assert s.train.x[0, 1].argmax() == 32 * 32 - 1


def test_cifar10_subfolder(tmp_path):
    sub = tmp_path / "cifar-10-batches-bin"
    x, y = _rand_cifar(3, 5)
    write_cifar10_bin(sub / "data_batch_2.bin", x, y)
    write_cifar10_bin(sub / "test_batch.bin", x, y)
    s = load_dataset(f"cifar10:{tmp_path}")
    np.testing.assert_array_equal(s.train.y, y)
    assert len(s.test) == 3


def test_cifar10_no_train_batch(tmp_path):
    x, y = _rand_cifar(2, 0)
    write_cifar10_bin(tmp_path / "test_batch.bin", x, y)
    with pytest.raises(FileNotFoundError) as ei:
        load_dataset(f"cifar10:{tmp_path}")
    assert str(tmp_path) in str(ei.value) and "data_batch_1.bin" in str(ei.value)


def test_cifar10_truncated(tmp_path):
    x, y = _rand_cifar(10, 0)
    p = write_cifar10_bin(tmp_path / "data_batch_1.bin", x, y)
    p.write_bytes(p.read_bytes()[:-42])
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"cifar10:{tmp_path}")
    msg = str(ei.value)
    assert str(p) in msg and "30688" in msg and "3073" in msg
    assert isinstance(ei.value, ValueError)


def test_cifar10_empty_file(tmp_path):
    p = tmp_path / "data_batch_1.bin"
    p.write_bytes(b"")
    with pytest.raises(DataFormatError, match="0 bytes"):
        load_dataset(f"cifar10:{tmp_path}")


def test_cifar10_bad_label(tmp_path):
    x, y = _rand_cifar(4, 0)
    write_cifar10_bin(tmp_path / "data_batch_1.bin", x, y)
    p = tmp_path / "test_batch.bin"
    blob = bytearray(write_cifar10_bin(p, x, y).read_bytes())
    blob[2 * 3073] = 12  # label of record 2
    p.write_bytes(bytes(blob))
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"cifar10:{tmp_path}")
    msg = str(ei.value)
    assert str(p) in msg and "record 2" in msg and "12" in msg


def test_cifar_writer_validates(tmp_path):
    with pytest.raises(ValueError):
        write_cifar10_bin(tmp_path / "a.bin", np.zeros((2, 3, 32, 31), np.uint8), [0, 1])
    with pytest.raises(ValueError):
        write_cifar10_bin(tmp_path / "a.bin", np.zeros((2, 3, 32, 32), np.uint8), [0, 10])


# --------------------------------------------------------------------------
# MNIST
# --------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
def test_mnist_roundtrip_with_writer(tmp_path, gz):
    xtr, ytr = _rand_mnist(9, 1)
    xte, yte = _rand_mnist(4, 2)
    write_mnist_idx(tmp_path, "train", xtr, ytr, gz=gz)
    write_mnist_idx(tmp_path, "t10k", xte, yte, gz=gz)
    if gz:
        assert (tmp_path / "train-images-idx3-ubyte.gz").is_file()
    s = load_dataset(f"mnist:{tmp_path}")
    assert s.train.x.shape == (9, 1, 28, 28) and s.test.x.shape == (4, 1, 28, 28)
    assert s.train.x.dtype == np.float32 and s.train.y.dtype == np.int64
    np.testing.assert_array_equal(s.train.y, ytr)
    np.testing.assert_array_equal(s.test.y, yte)
    tr4, te4 = xtr[:, None], xte[:, None]
    np.testing.assert_allclose(s.train.x, _expected_norm(tr4, tr4), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.test.x, _expected_norm(tr4, te4), rtol=1e-5, atol=1e-5)
    assert s.train.sample_shape == (1, 28, 28) and s.train.name == "mnist"


def test_mnist_handcrafted_bytes(tmp_path):
    img = np.zeros((2, 28, 28), np.uint8)
    img[0, 0, 1] = 200  # row 0, col 1 -> byte offset 1 of image 0
    img[1, 27, 0] = 100  # row 27, col 0 -> byte offset 27*28 of image 1
    (tmp_path / "train-images-idx3-ubyte").write_bytes(
        bytes.fromhex("00000803") + bytes.fromhex("00000002") + bytes.fromhex("0000001c") * 2
        + img.tobytes())
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(bytes.fromhex("00000801 00000002 07 02"))
    s = load_dataset(f"mnist:{tmp_path}")
    assert s.test is None
    np.testing.assert_array_equal(s.train.y, [7, 2])
    x = s.train.x
    assert x[0, 0, 0, 1] == x.max() and x[1, 0, 27, 0] > x[1, 0, 0, 0]
    np.testing.assert_allclose(x, _expected_norm(img[:, None], img[:, None]), rtol=1e-5, atol=1e-5)


def _write_good_mnist(d, n=3):
    x, y = _rand_mnist(n, 0)
    return write_mnist_idx(d, "train", x, y)


def test_mnist_missing_file(tmp_path):
    ip, lp = _write_good_mnist(tmp_path)
    lp.unlink()
    with pytest.raises(FileNotFoundError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    assert str(lp) in str(ei.value)
    # only one half of the test pair present -> error too
    _write_good_mnist(tmp_path)
    x, y = _rand_mnist(2, 1)
    _, tl = write_mnist_idx(tmp_path, "t10k", x, y)
    tl.unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_dataset(f"mnist:{tmp_path}")


def test_mnist_wrong_magic(tmp_path):
    ip, lp = _write_good_mnist(tmp_path)
    blob = bytearray(ip.read_bytes())
    blob[3] = 0x01  # 2049 instead of 2051 (labels magic on an images file)
    ip.write_bytes(bytes(blob))
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    msg = str(ei.value)
    assert str(ip) in msg and "2049" in msg and "2051" in msg


def test_mnist_wrong_label_magic(tmp_path):
    ip, lp = _write_good_mnist(tmp_path)
    lp.write_bytes(_mnist_idx_bytes(2051, (3,), [1, 2, 3]))
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    assert str(lp) in str(ei.value) and "2049" in str(ei.value)


def test_mnist_wrong_dims(tmp_path):
    x = np.zeros((2, 32, 32), np.uint8)
    ip, lp = write_mnist_idx(tmp_path, "train", x, [1, 2])
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    assert str(ip) in str(ei.value) and "28x28" in str(ei.value) and "32x32" in str(ei.value)


def test_mnist_truncated_and_trailing(tmp_path):
    ip, lp = _write_good_mnist(tmp_path, n=3)
    good = ip.read_bytes()
    ip.write_bytes(good[:-1])
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    assert str(ip) in str(ei.value) and str(16 + 3 * 784) in str(ei.value)
    ip.write_bytes(good + b"\0")
    with pytest.raises(DataFormatError, match="expected 2368"):
        load_dataset(f"mnist:{tmp_path}")
    ip.write_bytes(good[:10])  # shorter than the header
    with pytest.raises(DataFormatError, match="header"):
        load_dataset(f"mnist:{tmp_path}")


def test_mnist_truncated_gz(tmp_path):
    x, y = _rand_mnist(3, 0)
    ip, lp = write_mnist_idx(tmp_path, "train", x, y, gz=True)
    ip.write_bytes(ip.read_bytes()[:-20])
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    assert str(ip) in str(ei.value)


def test_mnist_bad_label_and_count_mismatch(tmp_path):
    ip, lp = _write_good_mnist(tmp_path, n=3)
    lp.write_bytes(_mnist_idx_bytes(2049, (3,), [1, 10, 2]))
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    assert str(lp) in str(ei.value) and "10" in str(ei.value)
    lp.write_bytes(_mnist_idx_bytes(2049, (2,), [1, 2]))
    with pytest.raises(DataFormatError) as ei:
        load_dataset(f"mnist:{tmp_path}")
    assert "3 images" in str(ei.value) and "2 labels" in str(ei.value)


def test_mnist_gz_preferred_name_fallback(tmp_path):
    # mixed: images gz, labels plain
    x, y = _rand_mnist(2, 0)
    write_mnist_idx(tmp_path, "train", x, y, gz=True)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_mnist_idx_bytes(2049, (2,), y.astype(np.uint8)))
    s = load_dataset(f"mnist:{tmp_path}")
    np.testing.assert_array_equal(s.train.y, y)
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz") as f:
        assert f.read(4) == bytes.fromhex("00000803")


# --------------------------------------------------------------------------
# Dataset validation
# --------------------------------------------------------------------------
def test_dataset_validation():
    x = np.zeros((3, 1, 2, 2), np.float64)
    ds = Dataset("t", x, np.array([0, 1, 2], np.int32), 3)
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64 and ds.x.flags.c_contiguous
    with pytest.raises(DataFormatError, match=r"\[0, 3\)"):
        Dataset("t", x, np.array([0, 1, 3]), 3)
    with pytest.raises(DataFormatError):
        Dataset("t", x, np.array([-1, 1, 2]), 3)
    with pytest.raises(DataFormatError):
        Dataset("t", x, np.array([0, 1]), 3)
    with pytest.raises(DataFormatError):
        Dataset("t", x[0], np.array([0]), 3)


# --------------------------------------------------------------------------
# batching
# --------------------------------------------------------------------------
def _toy(n=23):
    x = np.arange(n * 2 * 3 * 3, dtype=np.float32).reshape(n, 2, 3, 3)
    y = np.arange(n, dtype=np.int64) % 5
    return Dataset("toy", x, y, 5)


def _ids(xb):
    return (xb[:, 0, 0, 0] / 18).astype(np.int64)


def test_batches_no_shuffle_order_and_dtypes():
    ds = _toy(23)
    out = list(batches(ds, 5, shuffle=False, seed=0))
    assert len(out) == 4
    for k, (xb, yb) in enumerate(out):
        assert xb.shape == (5, 2, 3, 3) and xb.dtype == np.float32 and xb.flags.c_contiguous
        assert yb.shape == (5,) and yb.dtype == np.int64 and yb.flags.c_contiguous
        np.testing.assert_array_equal(_ids(xb), np.arange(5 * k, 5 * k + 5))
        np.testing.assert_array_equal(yb, ds.y[5 * k:5 * k + 5])
    # keep last
    out = list(batches(ds, 5, shuffle=False, seed=0, drop_last=False))
    assert [len(b[1]) for b in out] == [5, 5, 5, 5, 3]
    # batches are copies: mutating them leaves the dataset alone
    out[0][0][...] = -1
    assert ds.x.min() >= 0


def test_batches_shuffle_determinism_and_coverage():
    ds = _toy(23)
    a = list(batches(ds, 4, shuffle=True, seed=7, epoch=2, drop_last=False))
    b = list(batches(ds, 4, shuffle=True, seed=7, epoch=2, drop_last=False))
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    ids = np.concatenate([_ids(x) for x, _ in a])
    np.testing.assert_array_equal(np.sort(ids), np.arange(23))  # each sample exactly once
    assert not np.array_equal(ids, np.arange(23))
    # x and y stay paired
    for xb, yb in a:
        np.testing.assert_array_equal(yb, _ids(xb) % 5)
    # different epoch / seed -> different order
    ids_e3 = np.concatenate([_ids(x) for x, _ in batches(ds, 4, shuffle=True, seed=7, epoch=3, drop_last=False)])
    ids_s8 = np.concatenate([_ids(x) for x, _ in batches(ds, 4, shuffle=True, seed=8, epoch=2, drop_last=False)])
    assert not np.array_equal(ids, ids_e3) and not np.array_equal(ids, ids_s8)
    # drop_last: 5 full batches of distinct samples
    dl = list(batches(ds, 4, shuffle=True, seed=7, epoch=2))
    assert len(dl) == 5
    ids_dl = np.concatenate([_ids(x) for x, _ in dl])
    assert len(set(ids_dl.tolist())) == 20


def test_batch_too_large():
    ds = _toy(10)
    with pytest.raises(ValueError) as ei:
        list(batches(ds, 11, shuffle=True, seed=0))
    assert "11" in str(ei.value) and "10" in str(ei.value)
    with pytest.raises(ValueError) as ei:
        iterate(ds, 11, seed=0)
    assert "11" in str(ei.value) and "10" in str(ei.value)
    # without drop_last the whole dataset is one batch
    out = list(batches(ds, 11, shuffle=False, seed=0, drop_last=False))
    assert len(out) == 1 and len(out[0][1]) == 10
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError):
            batches(ds, bad, shuffle=False, seed=0)


def test_iterate_matches_batches_per_epoch():
    ds = _toy(23)
    it = iterate(ds, 5, seed=3)
    stream = [next(it) for _ in range(4 * 3)]  # 4 steps/epoch, 3 epochs
    for e in range(3):
        ref = list(batches(ds, 5, shuffle=True, seed=3, epoch=e))
        for k in range(4):
            np.testing.assert_array_equal(stream[4 * e + k][0], ref[k][0])
            np.testing.assert_array_equal(stream[4 * e + k][1], ref[k][1])


def test_iterate_gathers_into_given_buffers_or_leaves_them():
    """into: each batch gathered into the buffers (the same arrays yielded back, the same
    values); buffers of another shape or type are not used."""
    ds = _toy(23)
    xb, yb = np.empty((5, *ds.x.shape[1:]), ds.x.dtype), np.empty(5, ds.y.dtype)
    given = iterate(ds, 5, seed=3, into=lambda: (xb, yb))
    for ref in [next(iterate(ds, 5, seed=3, start_step=k)) for k in range(6)]:
        x, y = next(given)
        assert x is xb and y is yb
        np.testing.assert_array_equal(x, ref[0])
        np.testing.assert_array_equal(y, ref[1])
    wrong = np.empty((5, *ds.x.shape[1:]), np.float16)
    x, _ = next(iterate(ds, 5, seed=3, into=lambda: (wrong, yb)))
    assert x is not wrong and x.dtype == ds.x.dtype
    x, _ = next(iterate(ds, 5, seed=3, into=lambda: None))
    assert x is not xb


@pytest.mark.parametrize("k", [0, 1, 3, 4, 5, 11, 17])
def test_iterate_resumable(k):
    ds = _toy(23)
    full = iterate(ds, 5, seed=11)
    ref = [next(full) for _ in range(k + 9)]
    resumed = iterate(ds, 5, seed=11, start_step=k)
    for j in range(9):
        x, y = next(resumed)
        np.testing.assert_array_equal(x, ref[k + j][0])
        np.testing.assert_array_equal(y, ref[k + j][1])


def test_iterate_exact_multiple_and_seed_dependence():
    ds = _toy(20)
    a = iterate(ds, 5, seed=1)
    first = [_ids(next(a)[0]) for _ in range(8)]
    np.testing.assert_array_equal(np.sort(np.concatenate(first[:4])), np.arange(20))
    np.testing.assert_array_equal(np.sort(np.concatenate(first[4:])), np.arange(20))
    b = iterate(ds, 5, seed=2)
    assert not np.array_equal(np.concatenate(first[:4]), np.concatenate([_ids(next(b)[0]) for _ in range(4)]))


@pytest.mark.parametrize("dtype", [np.complex64, np.int64, np.uint8, object])
def test_dataset_refuses_images_that_are_not_real_floats(dtype):
    from neuron.data import DataFormatError, Dataset
    x = np.zeros((2, 1, 2, 2)).astype(dtype)
    with pytest.raises(DataFormatError, match=f"found dtype {np.dtype(dtype)}"):
        Dataset("probe", x, np.array([0, 1]), 2)
