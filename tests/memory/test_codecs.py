"""FreeLunch codecs (issue 13): fixed sizes, and every decoded tensor within the codec's
stated bound, on arbitrary float32 data."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from neuron.memory.codecs import BLOCK, Bf16, Bfp8, get_codec

normal = st.floats(min_value=-2.0 ** 100, max_value=2.0 ** 100, allow_nan=False,
                   allow_infinity=False, width=32).filter(lambda v: v == 0 or abs(v) > 1e-30)


def roundtrip(codec, x):
    data = codec.encode(x)
    assert data.dtype == np.uint8 and data.size == codec.nbytes(x.size)
    out = np.empty_like(x)
    codec.decode(data, out)
    return out


@settings(max_examples=30, deadline=None)
@given(arrays(np.float32, st.integers(1, 200), elements=normal))
def test_bf16_within_its_relative_bound(x):
    c = Bf16()
    err = np.abs(roundtrip(c, x).astype(np.float64) - x)
    assert np.all(err <= c.bound(x).astype(np.float64) + 0)


@settings(max_examples=30, deadline=None)
@given(arrays(np.float32, st.integers(1, 200), elements=normal))
def test_bfp8_within_its_block_bound(x):
    c = Bfp8()
    err = np.abs(roundtrip(c, x).astype(np.float64) - x)
    assert np.all(err <= c.bound(x).astype(np.float64))
    blocks = np.pad(np.abs(x.astype(np.float64)), (0, (-x.size) % BLOCK)).reshape(-1, BLOCK)
    stated = np.maximum(blocks.max(axis=1) / 127, 2.0 ** -129)
    assert np.all(c.bound(x).astype(np.float64) <= np.repeat(stated, BLOCK)[:x.size])


def test_rates_and_real_activations():
    x = np.maximum(np.random.default_rng(0).standard_normal((4, 16, 8, 8)), 0).astype(np.float32)
    assert Bf16().nbytes(x.size) * 2 == x.nbytes
    assert Bfp8().nbytes(x.size) == x.size + x.size // BLOCK         # 3.88x
    for c in (Bf16(), Bfp8()):
        y = roundtrip(c, x)
        assert y.shape == x.shape and not np.array_equal(y, x)        # lossy, but close:
        assert np.abs(y - x).max() <= 0.05 * np.abs(x).max()
        assert np.all(y[x == 0] == 0)


def test_unknown_rate_is_an_error():
    assert get_codec(2).name == "bf16" and get_codec("4").name == "bfp8"
    with pytest.raises(ValueError, match="rate 3"):
        get_codec(3)
