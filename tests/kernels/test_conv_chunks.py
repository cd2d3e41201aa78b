"""The CPU convolution works in fixed chunks of samples (bounded workspace, results independent
of the memory budget). Chunked and single-chunk results agree, and the chunk is a function of
the layer's shape only."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.kernels import numpy_conv
from neuron.kernels import numpy_ref as k


def conv_all(x, w, b, dy, stride=(1, 1), padding=(1, 1)):
    n, c, h, wd = x.shape
    ho, wo = k.conv2d_out_hw(h, wd, w.shape[2], w.shape[3], stride, padding, (1, 1))
    ws = np.empty(k.conv2d_workspace_bytes(x.shape, w.shape, stride, padding, (1, 1), 1,
                                           x.dtype.itemsize), np.uint8)
    y = np.empty((n, w.shape[0], ho, wo), x.dtype)
    k.conv2d_forward(x, w, b, y, stride, padding, (1, 1), 1, ws)
    dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(b)
    k.conv2d_backward(x, w, dy, dx, dw, db, stride, padding, (1, 1), 1, ws)
    return y, dx, dw, db, ws.nbytes


def test_chunked_equals_whole_batch(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3, 6, 6))
    w = rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    dy = rng.standard_normal((7, 4, 6, 6))
    whole = conv_all(x, w, b, dy)
    per_sample = 3 * 9 * 36 * 8
    monkeypatch.setattr(numpy_conv, "CONV_CHUNK_BYTES", 2 * per_sample)     # chunks of 2 samples
    chunked = conv_all(x, w, b, dy)
    assert chunked[4] < whole[4]                    # a smaller workspace...
    for a, c in zip(whole[:4], chunked[:4]):        # ...the same results
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 5, 64])
def test_chunk_depends_on_shape_only(n):
    m = k.conv2d_chunk(n, 64, 3, 3, 56, 56, 4)
    assert 1 <= m <= n
    assert m == k.conv2d_chunk(n, 64, 3, 3, 56, 56, 4)
    per_sample = 64 * 9 * 56 * 56 * 4
    assert m * per_sample <= max(k.CONV_CHUNK_BYTES, per_sample)
