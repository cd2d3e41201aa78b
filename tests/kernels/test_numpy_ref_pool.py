"""numpy_ref max, average and global pooling: gradient checks, shapes, vs torch."""
import numpy as np
import pytest

from neuron.kernels import numpy_ref as K
from numpy_ref_helpers import (F64, assert_grad, distinct, garbage, numgrad, proj_loss, rng,
                               torch_or_skip)


# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------

# (shape, kernel, stride, padding, ceil_mode)
POOL_CASES = [
    ((2, 3, 7, 9), (3, 3), (2, 2), (1, 1), False),
    ((1, 2, 8, 7), (2, 2), (2, 2), (0, 0), False),
    ((2, 2, 7, 6), (2, 3), (2, 1), (1, 1), False),
    ((1, 2, 9, 7), (3, 2), (2, 2), (1, 0), True),
    ((1, 3, 5, 5), (3, 3), (1, 1), (1, 1), False),
    ((1, 1, 6, 6), (3, 3), (3, 2), (0, 1), True),
]


def _pool_out(case):
    shape, k, s, p, ceil = case
    return shape[:2] + K.pool_out_hw(shape[2], shape[3], k, s, p, ceil)


@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool_gradcheck(case):
    shape, k, s, p, _ = case
    x = distinct(shape, seed=7)
    yshape = _pool_out(case)
    loss, dy = proj_loss(lambda y: K.maxpool_forward(x, y, k, s, p), yshape)
    y = np.empty(yshape)
    K.maxpool_forward(x, y, k, s, p)
    dx = garbage(shape)
    K.maxpool_backward(x, y, dy, dx, k, s, p)
    assert_grad(numgrad(loss, x), dx)


@pytest.mark.parametrize("case", POOL_CASES)
def test_avgpool_gradcheck(case):
    shape, k, s, p, _ = case
    x = rng(8).standard_normal(shape)
    yshape = _pool_out(case)
    loss, dy = proj_loss(lambda y: K.avgpool_forward(x, y, k, s, p), yshape)
    dx = garbage(shape)
    K.avgpool_backward(dy, dx, k, s, p)
    assert_grad(numgrad(loss, x), dx)


def test_global_avgpool_gradcheck():
    x = rng(9).standard_normal((2, 3, 5, 4))
    loss, dy = proj_loss(lambda y: K.global_avgpool_forward(x, y), (2, 3))
    dx = garbage(x.shape)
    K.global_avgpool_backward(dy, dx)
    assert_grad(numgrad(loss, x), dx)
    y = np.empty((2, 3))
    K.global_avgpool_forward(x, y)
    np.testing.assert_allclose(y, x.mean(axis=(2, 3)), rtol=1e-14)


def test_pool_out_hw():
    assert K.pool_out_hw(32, 32, (3, 3), (2, 2), (1, 1)) == (16, 16)
    assert K.pool_out_hw(7, 9, 3, 2, 1) == (4, 5)
    assert K.pool_out_hw(9, 7, (3, 2), (2, 2), (1, 0), ceil_mode=True) == (5, 4)
    assert K.pool_out_hw(6, 6, 3, (3, 2), (0, 1), ceil_mode=True) == (2, 4)
    # ceil mode: a last window starting in the right padding is dropped
    assert K.pool_out_hw(5, 5, 2, 2, 1, ceil_mode=True) == (3, 3)


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("ties", [False, True])
def test_maxpool_vs_torch(case, ties):
    torch = torch_or_skip()
    import torch.nn.functional as tf
    shape, k, s, p, ceil = case
    r = rng(10)
    x = r.integers(0, 3, shape).astype(F64) if ties else r.standard_normal(shape)
    if ties:
        x[0, 0] = 1.0                                  # a whole plane of ties
    yshape = _pool_out(case)
    y = np.empty(yshape)
    K.maxpool_forward(x, y, k, s, p)
    xt = torch.tensor(x, requires_grad=True)
    yt = tf.max_pool2d(xt, k, s, p, ceil_mode=ceil)
    assert tuple(yt.shape) == yshape
    np.testing.assert_array_equal(y, yt.detach().numpy())
    dy = r.standard_normal(yshape)
    yt.backward(torch.tensor(dy))
    dx = garbage(shape)
    K.maxpool_backward(x, y, dy, dx, k, s, p)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("case", POOL_CASES)
def test_avgpool_vs_torch(case):
    torch = torch_or_skip()
    import torch.nn.functional as tf
    shape, k, s, p, ceil = case
    x = rng(11).standard_normal(shape)
    yshape = _pool_out(case)
    y = np.empty(yshape)
    K.avgpool_forward(x, y, k, s, p)
    xt = torch.tensor(x, requires_grad=True)
    yt = tf.avg_pool2d(xt, k, s, p, ceil_mode=ceil, count_include_pad=True)
    assert tuple(yt.shape) == yshape
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-13, atol=1e-14)
    dy = rng(12).standard_normal(yshape)
    yt.backward(torch.tensor(dy))
    dx = garbage(shape)
    K.avgpool_backward(dy, dx, k, s, p)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-13, atol=1e-14)


def test_global_avgpool_vs_torch():
    torch = torch_or_skip()
    import torch.nn.functional as tf
    x = rng(13).standard_normal((2, 3, 5, 4))
    y = np.empty((2, 3))
    K.global_avgpool_forward(x, y)
    np.testing.assert_allclose(y, tf.adaptive_avg_pool2d(torch.tensor(x), 1).numpy()[:, :, 0, 0],
                               rtol=1e-14)
