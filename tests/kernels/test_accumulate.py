"""accumulate=True adds a backward kernel's input gradient into dx (cuDNN's beta = 1): the
result is the old contents plus what the kernel writes without it, and nothing else changes."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.kernels import numpy_ref as K

rng = np.random.default_rng(3)
X = rng.standard_normal((3, 4, 6, 6))
W = rng.standard_normal((5, 4, 3, 3))


def _ws():
    return np.empty(K.conv2d_workspace_bytes(X.shape, W.shape, 1, 1, 1, 1, 8), np.uint8)


def _cases():
    y_relu = np.maximum(X, 0)
    dy = rng.standard_normal(X.shape)
    mean = X.mean(axis=(0, 2, 3))
    invstd = 1 / np.sqrt(X.var(axis=(0, 2, 3)) + 1e-5)
    gamma = rng.standard_normal(4)
    ymax = np.empty((3, 4, 3, 3))
    K.maxpool_forward(X, ymax, 2, 2, 0)
    dyp = rng.standard_normal(ymax.shape)
    ylrn = np.empty_like(X)
    K.lrn_forward(X, ylrn, 5, 1e-4, 0.75, 1.0)
    mask = (rng.random(X.shape) < 0.5).astype(np.float64)
    dyc = rng.standard_normal((3, 5, 6, 6))
    x2, w2, dy2 = rng.standard_normal((3, 7)), rng.standard_normal((2, 7)), rng.standard_normal((3, 2))
    probs = rng.random((3, 6))
    labels = np.array([0, 5, 2])
    return {
        "conv": (X.shape, lambda dx, a: K.conv2d_backward(X, W, dyc, dx, None, None, 1, 1, 1, 1,
                                                          _ws(), accumulate=a)),
        "bn": (X.shape, lambda dx, a: K.batchnorm_backward(X, dy, gamma, mean, invstd, dx, None,
                                                           None, accumulate=a)),
        "relu": (X.shape, lambda dx, a: K.relu_backward(y_relu, dy, dx, accumulate=a)),
        "leaky": (X.shape, lambda dx, a: K.leaky_relu_backward(y_relu, dy, dx, 0.1, accumulate=a)),
        "sigmoid": (X.shape, lambda dx, a: K.sigmoid_backward(y_relu, dy, dx, accumulate=a)),
        "tanh": (X.shape, lambda dx, a: K.tanh_backward(y_relu, dy, dx, accumulate=a)),
        "maxpool": (X.shape, lambda dx, a: K.maxpool_backward(X, ymax, dyp, dx, 2, 2, 0,
                                                              accumulate=a)),
        "avgpool": (X.shape, lambda dx, a: K.avgpool_backward(dyp, dx, 2, 2, 0, accumulate=a)),
        "gap": (X.shape, lambda dx, a: K.global_avgpool_backward(dy[:, :, 0, 0], dx,
                                                                 accumulate=a)),
        "lrn": (X.shape, lambda dx, a: K.lrn_backward(X, ylrn, dy, dx, 5, 1e-4, 0.75, 1.0,
                                                      accumulate=a)),
        "dropout": (X.shape, lambda dx, a: K.dropout_backward(dy, mask, dx, 0.5, accumulate=a)),
        "linear": (x2.shape, lambda dx, a: K.linear_backward(x2, w2, dy2, dx, None, None,
                                                             accumulate=a)),
        "xent": (probs.shape, lambda dx, a: K.softmax_xent_backward(probs, labels, dx,
                                                                    accumulate=a)),
        "concat": ((3, 2, 6, 6), lambda dx, a: K.concat_backward(
            dyc, [None, dx, None], widths=[1, 2, 2], accumulate=(1,) if a else ())),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_accumulate_adds_into_dx(name):
    shape, run = _cases()[name]
    alone = np.full(shape, np.nan)
    run(alone, False)
    assert np.all(np.isfinite(alone))           # overwrote every element
    start = rng.standard_normal(shape)
    acc = start.copy()
    run(acc, True)
    np.testing.assert_allclose(acc, start + alone, rtol=1e-12, atol=1e-12)
    assert not np.array_equal(acc, alone)
