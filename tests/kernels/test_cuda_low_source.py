"""The low-precision kernels (neuron/kernels/cuda_low.py) compiled with g++ on the stand-ins:
their bf16/fp16 conversions are bit-exact against ml_dtypes' and NumPy's (round to nearest
even, NaN, overflow, fp16 subnormals), and each operation rounds once where it stores."""
from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

LOWS = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16)}


@pytest.fixture
def low(gpu_kernels):
    from neuron.kernels import cuda_low
    return cuda_low


def _float_samples():
    """float32 values with the hard cases: ties in both low types, subnormals of fp16, the
    overflow edges of fp16 (65504, 65520), NaN, infinities, signed zeros."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000)).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, -65520.0,
                      2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14,
                      2.0 ** -14 * (1 - 2.0 ** -11), 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
                      1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 3.4e38], np.float32)
    return np.concatenate([x, bits.view(np.float32), edges])


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("name", list(LOWS))
def test_float32_to_low_rounds_as_numpy(low, name):
    x = _float_samples()
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(LOWS[name])
    got = np.empty(x.shape, LOWS[name])
    low.cast(got, x)
    _same_bits(got, want)


@pytest.mark.parametrize("name", list(LOWS))
def test_every_low_value_reads_back_exactly(low, name):
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(LOWS[name])
    got = np.empty(h.shape, np.float32)
    low.cast(got, h)
    want = h.astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("name", list(LOWS))
def test_operations_round_once(low, name):
    dt = LOWS[name]
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 5)).astype(dt)
    b = rng.standard_normal((6, 5)).astype(dt)
    f = lambda v: v.astype(np.float32)          # noqa: E731
    y = np.empty_like(a)
    low.add(a, b, y)
    _same_bits(y, (f(a) + f(b)).astype(dt))
    acc = a.copy()
    low.accumulate(acc, b)
    _same_bits(acc, (f(a) + f(b)).astype(dt))
    low.scale(a, 0.3, y)
    _same_bits(y, (f(a) * np.float32(0.3)).astype(dt))
    mask = (rng.random((6, 5)) < 0.5).astype(np.uint8)
    low.dropout_apply(a, mask, 2.0, y)
    _same_bits(y, (f(a) * mask * np.float32(2.0)).astype(dt))
    x4 = rng.standard_normal((2, 3, 4, 5)).astype(dt)
    m = np.empty((2, 3), dt)
    low.mean_hw(x4, m)
    np.testing.assert_allclose(f(m), f(x4).mean(axis=(2, 3)), rtol=1e-2, atol=1e-3)
    d4 = np.empty_like(x4)
    low.spread_hw(m, d4)
    _same_bits(d4, np.broadcast_to((f(m) * np.float32(1 / 20))[:, :, None, None],
                                   x4.shape).astype(dt))
    t = rng.standard_normal((6, 5)).astype(np.float32)
    bias = rng.standard_normal(5).astype(dt)
    low.bias_rows(t, bias, y)
    _same_bits(y, (t + f(bias)).astype(dt))
    g = t.copy()
    low.round_into(g, t * 3, dt)
    np.testing.assert_array_equal(g, f((t * 3).astype(dt)))
    low.round_into(g, t, dt, accumulate=True)
    np.testing.assert_array_equal(g, f((f((t * 3).astype(dt)) + t).astype(dt)))
    db = np.full(5, 7.0, np.float32)
    low.col_sums(a, db)
    np.testing.assert_allclose(db, f(f(a).sum(axis=0).astype(dt)), rtol=1e-6)
    first = db.copy()
    low.col_sums(a, db, accumulate=True)
    np.testing.assert_allclose(db, f((first + f(a).sum(axis=0)).astype(dt)), rtol=1e-6)


@pytest.mark.parametrize("name", list(LOWS))
def test_fill_and_nonfinite_flag(low, name):
    dt = LOWS[name]
    a = np.zeros(7, dt)
    low.fill(a, 0.1)
    _same_bits(a, np.full(7, 0.1, np.float32).astype(dt))
    flag = np.zeros(1, np.bool_)
    low.nonfinite(flag, a)
    assert not flag[0]
    a[3] = np.inf
    low.nonfinite(flag, a)
    assert flag[0]
    flag[0] = False
    a[3] = np.nan
    low.nonfinite(flag, a)
    assert flag[0]


def test_unscale_sets_both_flags_only_on_overflow(low):
    g = np.array([2.0, -4.0, 8.0], np.float32)
    flag, over = np.zeros(1, np.bool_), np.zeros(1, np.bool_)
    low.unscale(g, 0.5, flag, over)
    np.testing.assert_array_equal(g, [1.0, -2.0, 4.0])
    assert not flag[0] and not over[0]
    g[1] = np.inf
    low.unscale(g, 0.5, flag, over)
    assert flag[0] and over[0]
