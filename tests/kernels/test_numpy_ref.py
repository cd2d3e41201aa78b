"""Tests for the NumPy reference kernels (neuron/kernels/numpy_ref.py).

* Finite-difference gradient checks in float64 (central differences, loss =
  random projection of the output, relative error < 1e-6) for every kernel
  with a backward.
* Comparisons with torch.nn.functional (float64) where torch is importable.
* SGD vs torch.optim.SGD in float32: required BIT-IDENTICAL (0 ulp).
"""

import numpy as np
import pytest

from neuron.kernels import numpy_ref as K

F64 = np.float64
H_FD = 1e-6
TOL = 1e-6


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def rng(seed=0):
    return np.random.default_rng(seed)


def garbage(shape, dtype=F64):
    """Outputs start as NaN: backward kernels must overwrite, not accumulate."""
    return np.full(shape, np.nan, dtype=dtype)


def numgrad(loss, a, h=H_FD):
    """Central-difference gradient of the scalar loss() w.r.t. array a
    (perturbed in place)."""
    assert a.flags.c_contiguous
    flat = a.reshape(-1)
    g = np.empty(a.size, dtype=F64)
    for i in range(a.size):
        old = flat[i]
        flat[i] = old + h
        fp = loss()
        flat[i] = old - h
        fm = loss()
        flat[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g.reshape(a.shape)


def relerr(num, ana):
    num = np.asarray(num, dtype=F64)
    ana = np.asarray(ana, dtype=F64)
    den = np.linalg.norm(num) + np.linalg.norm(ana)
    return np.linalg.norm(num - ana) / max(den, 1e-300)


def assert_grad(num, ana, tol=TOL):
    assert np.all(np.isfinite(ana))
    err = relerr(num, ana)
    assert err < tol, f"relative error {err:.3e}"


def proj_loss(fwd, out_shape, seed=123):
    """Returns (loss(), R) with loss = sum(R * fwd-output)."""
    r = rng(seed).standard_normal(out_shape)
    y = np.empty(out_shape)

    def loss():
        fwd(y)
        return float(np.sum(r * y))

    return loss, r


def distinct(shape, seed=0, spacing=0.01):
    """Random values pairwise at least `spacing` apart (no max-pool ties)."""
    n = int(np.prod(shape))
    v = rng(seed).permutation(n).astype(F64) * spacing - n * spacing / 2
    return v.reshape(shape)


def away_from_zero(shape, seed=0, margin=1e-2):
    x = rng(seed).standard_normal(shape)
    x[np.abs(x) < margin] += 3 * margin
    return x


def torch_or_skip():
    return pytest.importorskip("torch")


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------

# (N, C, H, W, K, kh, kw, stride, padding, dilation, groups, bias)
CONV_CASES = [
    (2, 3, 6, 5, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, True),
    (2, 4, 7, 7, 4, 3, 3, (2, 2), (1, 1), (1, 1), 1, False),
    (1, 4, 9, 8, 6, 3, 2, (2, 1), (2, 0), (2, 3), 2, True),
    (2, 4, 6, 7, 4, 3, 3, (1, 2), (1, 2), (1, 1), 4, False),   # depthwise
    (2, 6, 5, 5, 3, 1, 1, (2, 2), (0, 0), (1, 1), 3, True),    # grouped 1x1 s2
    (1, 2, 5, 6, 3, 2, 3, (1, 1), (0, 1), (1, 1), 1, True),    # even/rect kernel
    (1, 2, 4, 4, 2, 3, 3, (3, 3), (3, 3), (2, 2), 1, True),    # taps entirely in padding
]


def _conv_setup(case, dtype=F64, seed=0):
    n, c, h, w, k, kh, kw, s, p, d, g, bias = case
    r = rng(seed)
    x = r.standard_normal((n, c, h, w)).astype(dtype)
    wt = r.standard_normal((k, c // g, kh, kw)).astype(dtype)
    b = r.standard_normal(k).astype(dtype) if bias else None
    ho, wo = K.conv2d_out_hw(h, w, kh, kw, s, p, d)
    ws = np.empty(K.conv2d_workspace_bytes(x.shape, wt.shape, s, p, d, g,
                                           np.dtype(dtype).itemsize), np.uint8)
    return x, wt, b, (n, k, ho, wo), ws


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_gradcheck(case):
    _, _, _, _, _, _, _, s, p, d, g, bias = case
    x, w, b, yshape, ws = _conv_setup(case)
    loss, r = proj_loss(lambda y: K.conv2d_forward(x, w, b, y, s, p, d, g, ws), yshape)
    dx, dw = garbage(x.shape), garbage(w.shape)
    db = garbage(b.shape) if bias else None
    K.conv2d_backward(x, w, r, dx, dw, db, s, p, d, g, ws)
    assert_grad(numgrad(loss, x), dx)
    assert_grad(numgrad(loss, w), dw)
    if bias:
        assert_grad(numgrad(loss, b), db)


def test_conv_backward_partial_outputs():
    case = CONV_CASES[2]
    _, _, _, _, _, _, _, s, p, d, g, _ = case
    x, w, b, yshape, ws = _conv_setup(case)
    dy = rng(5).standard_normal(yshape)
    full = [np.empty(x.shape), np.empty(w.shape), np.empty(b.shape)]
    K.conv2d_backward(x, w, dy, *full, s, p, d, g, ws)
    for keep in range(3):
        outs = [None, None, None]
        outs[keep] = garbage(full[keep].shape)
        K.conv2d_backward(x, w, dy, *outs, s, p, d, g, ws)
        np.testing.assert_allclose(outs[keep], full[keep], rtol=1e-12, atol=1e-12)
    K.conv2d_backward(x, w, dy, None, None, None, s, p, d, g, ws)   # no-op


def test_conv_out_hw_and_workspace():
    assert K.conv2d_out_hw(32, 32, 3, 3, (1, 1), (1, 1), (1, 1)) == (32, 32)
    assert K.conv2d_out_hw(32, 31, 3, 3, (2, 2), (1, 1), (1, 1)) == (16, 16)
    assert K.conv2d_out_hw(9, 8, 3, 2, (2, 1), (2, 0), (2, 3)) == (5, 5)
    nb = K.conv2d_workspace_bytes((2, 4, 9, 8), (6, 2, 3, 2), (2, 1), (2, 0), (2, 3), 2, 4)
    assert nb >= 4 * 3 * 2 * 2 * 5 * 5 * 4


def test_conv_workspace_misaligned_and_too_small():
    case = CONV_CASES[0]
    _, _, _, _, _, _, _, s, p, d, g, _ = case
    for dtype in (np.float32, F64):
        x, w, b, yshape, ws = _conv_setup(case, dtype)
        y_ref = np.empty(yshape, dtype)
        K.conv2d_forward(x, w, b, y_ref, s, p, d, g, ws)
        big = np.empty(ws.nbytes + 16, np.uint8)
        for off in (1, 3, 8):
            y = np.empty(yshape, dtype)
            K.conv2d_forward(x, w, b, y, s, p, d, g, big[off:off + ws.nbytes])
            np.testing.assert_array_equal(y, y_ref)
        with pytest.raises(ValueError):
            K.conv2d_forward(x, w, b, np.empty(yshape, dtype), s, p, d, g, ws[:ws.nbytes // 2])


def test_conv_noncontiguous_outputs():
    case = CONV_CASES[2]
    _, _, _, _, _, _, _, s, p, d, g, _ = case
    x, w, b, yshape, ws = _conv_setup(case)
    y = np.empty(yshape)
    K.conv2d_forward(x, w, b, y, s, p, d, g, ws)
    ybig = np.zeros(yshape[:3] + (yshape[3] * 2,))
    K.conv2d_forward(x, w, b, ybig[..., ::2], s, p, d, g, ws)
    np.testing.assert_allclose(ybig[..., ::2], y, rtol=1e-13, atol=1e-13)
    assert np.all(ybig[..., 1::2] == 0)
    dy = rng(1).standard_normal(yshape)
    dx, dw, db = np.empty(x.shape), np.empty(w.shape), np.empty(b.shape)
    K.conv2d_backward(x, w, dy, dx, dw, db, s, p, d, g, ws)
    dwT = np.empty(w.shape[::-1]).T                      # F-ordered dW
    dxT = np.empty(x.shape[::-1]).T
    K.conv2d_backward(x, w, dy, dxT, dwT, None, s, p, d, g, ws)
    np.testing.assert_allclose(dwT, dw, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dxT, dx, rtol=1e-13, atol=1e-13)


def test_conv_float32_matches_float64():
    case = CONV_CASES[0]
    _, _, _, _, _, _, _, s, p, d, g, _ = case
    x, w, b, yshape, ws = _conv_setup(case, F64)
    x32, w32, b32, _, ws32 = _conv_setup(case, np.float32)
    y, y32 = np.empty(yshape), np.empty(yshape, np.float32)
    K.conv2d_forward(x, w, b, y, s, p, d, g, ws)
    K.conv2d_forward(x32, w32, b32, y32, s, p, d, g, ws32)
    np.testing.assert_allclose(y32, y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_vs_torch(case):
    torch = torch_or_skip()
    import torch.nn.functional as tf
    _, _, _, _, _, _, _, s, p, d, g, bias = case
    x, w, b, yshape, ws = _conv_setup(case)
    y = np.empty(yshape)
    K.conv2d_forward(x, w, b, y, s, p, d, g, ws)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True) if bias else None
    yt = tf.conv2d(xt, wt, bt, s, p, d, g)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    dy = rng(7).standard_normal(yshape)
    yt.backward(torch.tensor(dy))
    dx, dw = np.empty(x.shape), np.empty(w.shape)
    db = np.empty(b.shape) if bias else None
    K.conv2d_backward(x, w, dy, dx, dw, db, s, p, d, g, ws)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dw, wt.grad.numpy(), rtol=1e-10, atol=1e-12)
    if bias:
        np.testing.assert_allclose(db, bt.grad.numpy(), rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------
# batch norm
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 4, 3, 5), (7, 5)])
def test_batchnorm_gradcheck(shape):
    r = rng(1)
    c = shape[1]
    x = r.standard_normal(shape) * 2 + 0.5
    gamma = r.standard_normal(c)
    beta = r.standard_normal(c)
    rm, rv = r.standard_normal(c), r.random(c) + 0.5
    rm0, rv0 = rm.copy(), rv.copy()
    sm, si = np.empty(c), np.empty(c)

    def fwd(y):
        K.batchnorm_forward_train(x, gamma, beta, y, rm, rv, sm, si, 0.1, 1e-5, False)

    loss, dy = proj_loss(fwd, shape)
    loss()
    np.testing.assert_array_equal(rm, rm0)          # update_running=False
    np.testing.assert_array_equal(rv, rv0)
    dx, dg, db = garbage(shape), garbage(c), garbage(c)
    K.batchnorm_backward(x, dy, gamma, sm, si, dx, dg, db)
    assert_grad(numgrad(loss, x), dx)
    assert_grad(numgrad(loss, gamma), dg)
    assert_grad(numgrad(loss, beta), db)
    # dx only
    dx2 = garbage(shape)
    K.batchnorm_backward(x, dy, gamma, sm, si, dx2, None, None)
    np.testing.assert_allclose(dx2, dx, rtol=1e-12, atol=1e-12)
    # in place (dx aliases dy)
    dyi = dy.copy()
    K.batchnorm_backward(x, dyi, gamma, sm, si, dyi, None, None)
    np.testing.assert_allclose(dyi, dx, rtol=1e-12, atol=1e-12)
    # params only
    dg2, db2 = garbage(c), garbage(c)
    K.batchnorm_backward(x, dy, gamma, sm, si, None, dg2, db2)
    np.testing.assert_allclose(dg2, dg, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db2, db, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 4, 3, 5), (7, 5)])
def test_batchnorm_vs_torch(shape):
    torch = torch_or_skip()
    import torch.nn.functional as tf
    r = rng(2)
    c = shape[1]
    x = r.standard_normal(shape) * 3 + 1
    gamma, beta = r.standard_normal(c), r.standard_normal(c)
    rm, rv = r.standard_normal(c), r.random(c) + 0.5
    rmt, rvt = torch.tensor(rm), torch.tensor(rv)
    xt = torch.tensor(x, requires_grad=True)
    gt = torch.tensor(gamma, requires_grad=True)
    bt = torch.tensor(beta, requires_grad=True)
    y = np.empty(shape)
    sm, si = np.empty(c), np.empty(c)
    dy = r.standard_normal(shape)
    for _ in range(2):                      # running stats over 2 steps
        K.batchnorm_forward_train(x, gamma, beta, y, rm, rv, sm, si, 0.1, 1e-5, True)
        yt = tf.batch_norm(xt, rmt, rvt, gt, bt, training=True, momentum=0.1, eps=1e-5)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rm, rmt.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rv, rvt.numpy(), rtol=1e-12, atol=1e-12)
    axes = (0, 2, 3) if len(shape) == 4 else (0,)
    np.testing.assert_allclose(sm, x.mean(axis=axes), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(si, 1 / np.sqrt(x.var(axis=axes) + 1e-5), rtol=1e-12)
    yt.backward(torch.tensor(dy))
    dx, dg, db = np.empty(shape), np.empty(c), np.empty(c)
    K.batchnorm_backward(x, dy, gamma, sm, si, dx, dg, db)
    # the last torch forward's graph saw the same batch statistics
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dg, gt.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(db, bt.grad.numpy(), rtol=1e-9, atol=1e-11)
    # inference with the running statistics
    yi = np.empty(shape)
    K.batchnorm_forward_infer(x, gamma, beta, yi, rm, rv, 1e-5)
    yit = tf.batch_norm(torch.tensor(x), rmt, rvt, torch.tensor(gamma), torch.tensor(beta),
                        training=False, eps=1e-5)
    np.testing.assert_allclose(yi, yit.numpy(), rtol=1e-10, atol=1e-12)


def test_batchnorm_float32_runs():
    r = rng(3)
    x = r.standard_normal((4, 3, 5, 5)).astype(np.float32)
    g, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    sm, si = np.empty(3, np.float32), np.empty(3, np.float32)
    y = np.empty_like(x)
    K.batchnorm_forward_train(x, g, b, y, rm, rv, sm, si, 0.1, 1e-5, True)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(axis=(0, 2, 3)), 1, atol=1e-3)
    np.testing.assert_allclose(rm, 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------

ACTS = {
    "relu": (lambda x, y: K.relu_forward(x, y), lambda y, dy, dx: K.relu_backward(y, dy, dx)),
    "leaky": (lambda x, y: K.leaky_relu_forward(x, y, 0.1),
              lambda y, dy, dx: K.leaky_relu_backward(y, dy, dx, 0.1)),
    "sigmoid": (K.sigmoid_forward, K.sigmoid_backward),
    "tanh": (K.tanh_forward, K.tanh_backward),
}


@pytest.mark.parametrize("name", sorted(ACTS))
def test_activation_gradcheck(name):
    fwd, bwd = ACTS[name]
    x = away_from_zero((2, 3, 4, 5), seed=4)
    loss, dy = proj_loss(lambda y: fwd(x, y), x.shape)
    y = np.empty(x.shape)
    fwd(x, y)
    dx = garbage(x.shape)
    bwd(y, dy, dx)
    assert_grad(numgrad(loss, x), dx)


@pytest.mark.parametrize("name", sorted(ACTS))
def test_activation_inplace_and_vs_torch(name):
    fwd, bwd = ACTS[name]
    x = rng(5).standard_normal((3, 4, 5)) * 4
    y = np.empty_like(x)
    fwd(x, y)
    xi = x.copy()
    fwd(xi, xi)                                   # in place
    np.testing.assert_array_equal(xi, y)
    dy = rng(6).standard_normal(x.shape)
    dx = np.empty_like(x)
    bwd(y, dy, dx)
    dyi = dy.copy()
    bwd(y, dyi, dyi)                              # in place
    np.testing.assert_array_equal(dyi, dx)
    torch = torch_or_skip()
    import torch.nn.functional as tf
    fn = {"relu": tf.relu, "leaky": lambda t: tf.leaky_relu(t, 0.1),
          "sigmoid": torch.sigmoid, "tanh": torch.tanh}[name]
    xt = torch.tensor(x, requires_grad=True)
    yt = fn(xt)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-13, atol=1e-15)


def test_sigmoid_extreme_inputs():
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], np.float32)
    y = np.empty_like(x)
    K.sigmoid_forward(x, y)
    assert np.all(np.isfinite(y))
    assert y[0] == 0 and y[-1] == 1 and y[2] == 0.5


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


# --------------------------------------------------------------------------
# linear
# --------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(bias):
    r = rng(14)
    x, w = r.standard_normal((4, 5)), r.standard_normal((3, 5))
    b = r.standard_normal(3) if bias else None
    loss, dy = proj_loss(lambda y: K.linear_forward(x, w, b, y), (4, 3))
    dx, dw = garbage(x.shape), garbage(w.shape)
    db = garbage(3) if bias else None
    K.linear_backward(x, w, dy, dx, dw, db)
    assert_grad(numgrad(loss, x), dx)
    assert_grad(numgrad(loss, w), dw)
    if bias:
        assert_grad(numgrad(loss, b), db)
    dw2 = garbage(w.shape)
    K.linear_backward(x, w, dy, None, dw2, None)
    np.testing.assert_array_equal(dw2, dw)


def test_linear_vs_torch():
    torch = torch_or_skip()
    import torch.nn.functional as tf
    r = rng(15)
    x, w, b = r.standard_normal((6, 7)), r.standard_normal((4, 7)), r.standard_normal(4)
    y = np.empty((6, 4))
    K.linear_forward(x, w, b, y)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    yt = tf.linear(xt, wt, bt)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    dy = r.standard_normal((6, 4))
    yt.backward(torch.tensor(dy))
    dx, dw, db = np.empty(x.shape), np.empty(w.shape), np.empty(4)
    K.linear_backward(x, w, dy, dx, dw, db)
    for a, t in ((dx, xt), (dw, wt), (db, bt)):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-12, atol=1e-13)


# --------------------------------------------------------------------------
# dropout
# --------------------------------------------------------------------------

def test_dropout_gradcheck():
    x = rng(16).standard_normal((3, 4, 2, 2))
    mask = np.empty(x.shape, np.uint8)
    y = np.empty(x.shape)
    K.dropout_forward(x, y, mask, 0.3, seed=5)
    loss, dy = proj_loss(lambda yy: K.dropout_apply(x, yy, mask, 0.3), x.shape)
    dx = garbage(x.shape)
    K.dropout_backward(dy, mask, dx, 0.3)
    assert_grad(numgrad(loss, x), dx)


def test_dropout_determinism_and_p():
    x = rng(17).standard_normal((8, 16, 10, 10)).astype(np.float32)
    m1, m2, m3 = (np.empty(x.shape, np.uint8) for _ in range(3))
    y1, y2, y3 = (np.empty_like(x) for _ in range(3))
    K.dropout_forward(x, y1, m1, 0.25, seed=42)
    K.dropout_forward(x, y2, m2, 0.25, seed=42)
    K.dropout_forward(x, y3, m3, 0.25, seed=43)
    np.testing.assert_array_equal(m1, m2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(m1, m3)
    assert set(np.unique(m1)) <= {0, 1}
    assert abs(m1.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y1, x * m1 / np.float32(0.75), rtol=1e-6)
    # apply reproduces the forward exactly (recomputation)
    y4 = np.empty_like(x)
    K.dropout_apply(x, y4, m1, 0.25)
    np.testing.assert_array_equal(y4, y1)
    # keep fraction follows p
    for p in (0.1, 0.5, 0.9):
        K.dropout_forward(x, y3, m3, p, seed=1)
        assert abs(m3.mean() - (1 - p)) < 0.01
    # larger p drops a superset with the same seed (same uniforms)
    K.dropout_forward(x, y2, m2, 0.5, seed=42)
    assert np.all(m2 <= m1)
    # edge cases
    K.dropout_forward(x, y3, m3, 0.0, seed=1)
    np.testing.assert_array_equal(y3, x)
    assert np.all(m3 == 1)
    K.dropout_forward(x, y3, m3, 1.0, seed=1)
    assert np.all(y3 == 0) and np.all(m3 == 0)
    dx = np.empty_like(x)
    K.dropout_backward(x, m3, dx, 1.0)
    assert np.all(dx == 0)


# --------------------------------------------------------------------------
# LRN
# --------------------------------------------------------------------------

LRN_CASES = [(3, 1e-2, 0.75, 2.0), (4, 0.5, 0.75, 1.0), (5, 1e-1, 0.6, 1.5), (2, 2.0, 1.3, 0.7),
             (9, 0.3, 0.75, 1.0)]                      # size > C


@pytest.mark.parametrize("size,alpha,beta,k", LRN_CASES)
def test_lrn_gradcheck(size, alpha, beta, k):
    x = rng(18).standard_normal((2, 6, 3, 2))
    loss, dy = proj_loss(lambda y: K.lrn_forward(x, y, size, alpha, beta, k), x.shape)
    y = np.empty(x.shape)
    K.lrn_forward(x, y, size, alpha, beta, k)
    dx = garbage(x.shape)
    K.lrn_backward(x, y, dy, dx, size, alpha, beta, k)
    assert_grad(numgrad(loss, x), dx)


@pytest.mark.parametrize("size,alpha,beta,k", LRN_CASES)
def test_lrn_vs_torch(size, alpha, beta, k):
    torch = torch_or_skip()
    import torch.nn.functional as tf
    x = rng(19).standard_normal((2, 7, 4, 3)) * 2
    y = np.empty(x.shape)
    K.lrn_forward(x, y, size, alpha, beta, k)
    xt = torch.tensor(x, requires_grad=True)
    yt = tf.local_response_norm(xt, size, alpha, beta, k)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    dy = rng(20).standard_normal(x.shape)
    yt.backward(torch.tensor(dy))
    dx = np.empty(x.shape)
    K.lrn_backward(x, y, dy, dx, size, alpha, beta, k)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------
# add / concat
# --------------------------------------------------------------------------

def test_add_forward():
    r = rng(21)
    xs = [r.standard_normal((2, 3, 4)) for _ in range(3)]
    y = np.empty((2, 3, 4))
    K.add_forward(xs, y)
    np.testing.assert_allclose(y, xs[0] + xs[1] + xs[2], rtol=1e-15)
    K.add_forward(xs[:1], y)
    np.testing.assert_array_equal(y, xs[0])
    a = xs[0].copy()
    K.add_forward([a, xs[1]], a)                     # in place into first input
    np.testing.assert_array_equal(a, xs[0] + xs[1])


def test_concat_gradcheck():
    r = rng(22)
    xs = [r.standard_normal((2, c, 3, 2)) for c in (2, 3, 1)]
    ysh = (2, 6, 3, 2)
    loss, dy = proj_loss(lambda y: K.concat_forward(xs, y), ysh)
    y = np.empty(ysh)
    K.concat_forward(xs, y)
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=1))
    dxs = [garbage(a.shape) for a in xs]
    K.concat_backward(dy, dxs)
    for a, d in zip(xs, dxs):
        assert_grad(numgrad(loss, a), d)
    # None entries: width of one missing entry is inferred, several need widths
    d0, d2 = garbage(xs[0].shape), garbage(xs[2].shape)
    K.concat_backward(dy, [d0, None, d2])
    np.testing.assert_array_equal(d0, dxs[0])
    np.testing.assert_array_equal(d2, dxs[2])
    d2 = garbage(xs[2].shape)
    K.concat_backward(dy, [None, None, d2], widths=[2, 3, 1])
    np.testing.assert_array_equal(d2, dxs[2])
    with pytest.raises(ValueError):
        K.concat_backward(dy, [None, None, d2])


# --------------------------------------------------------------------------
# softmax cross entropy
# --------------------------------------------------------------------------

def test_softmax_xent_gradcheck():
    r = rng(23)
    logits = r.standard_normal((5, 7)) * 3
    labels = r.integers(0, 7, 5).astype(np.int64)
    probs = np.empty_like(logits)
    loss = lambda: K.softmax_xent_forward(logits, labels, probs)   # noqa: E731
    loss()
    dl = garbage(logits.shape)
    K.softmax_xent_backward(probs, labels, dl)
    assert_grad(numgrad(loss, logits), dl)


def test_softmax_xent_vs_torch_and_stability():
    r = rng(24)
    logits = r.standard_normal((6, 10)) * 5
    labels = r.integers(0, 10, 6).astype(np.int64)
    probs = np.empty_like(logits)
    loss = K.softmax_xent_forward(logits, labels, probs)
    assert isinstance(loss, float)
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-14)
    # stable for huge logits (float32)
    big = (logits * 1000).astype(np.float32)
    pb = np.empty_like(big)
    lb = K.softmax_xent_forward(big, labels, pb)
    assert np.isfinite(lb) and np.all(np.isfinite(pb))
    torch = torch_or_skip()
    import torch.nn.functional as tf
    lt = torch.tensor(logits, requires_grad=True)
    ref = tf.cross_entropy(lt, torch.tensor(labels))
    assert abs(loss - ref.item()) < 1e-12
    ref.backward()
    dl = np.empty_like(logits)
    K.softmax_xent_backward(probs, labels, dl)
    np.testing.assert_allclose(dl, lt.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(probs, tf.softmax(torch.tensor(logits), 1).numpy(), rtol=1e-13)
    lbt = tf.cross_entropy(torch.tensor(big), torch.tensor(labels)).item()
    assert abs(lb - lbt) <= 1e-5 * max(1.0, abs(lbt))


# --------------------------------------------------------------------------
# SGD
# --------------------------------------------------------------------------

SGD_CASES = [
    # lr, momentum, weight_decay, nesterov
    (0.1, 0.0, 0.0, False),
    (0.1, 0.0, 5e-4, False),
    (0.05, 0.9, 0.0, False),
    (0.1, 0.9, 5e-4, False),
    (0.1, 0.9, 1e-4, True),
    (0.3, 0.5, 0.0, True),
]


def _sgd_reference(p, grads, lr, mom, wd, nest):
    """Straightforward float64 transcription of torch.optim.SGD."""
    p = p.astype(F64)
    buf = None
    for g in grads:
        d = g + wd * p
        if mom:
            buf = d.copy() if buf is None else mom * buf + d
            d = d + mom * buf if nest else buf
        p = p - lr * d
    return p


@pytest.mark.parametrize("lr,mom,wd,nest", SGD_CASES)
def test_sgd_matches_formula(lr, mom, wd, nest):
    r = rng(25)
    p0 = r.standard_normal(50)
    grads = [r.standard_normal(50) for _ in range(3)]
    p = p0.copy()
    v = np.zeros_like(p) if mom else None
    for g in grads:
        g_copy = g.copy()
        K.sgd_update(p, g, v, lr, mom, wd, nest)
        np.testing.assert_array_equal(g, g_copy)          # grad untouched
    np.testing.assert_allclose(p, _sgd_reference(p0, grads, lr, mom, wd, nest), rtol=1e-13)
    # first_step=True with a dirty buffer == zero-initialized buffer
    if mom:
        p2 = p0.copy()
        v2 = np.full_like(p0, 123.0)
        for i, g in enumerate(grads):
            K.sgd_update(p2, g, v2, lr, mom, wd, nest, first_step=(i == 0))
        np.testing.assert_array_equal(p2, p)
        np.testing.assert_array_equal(v2, v)


@pytest.mark.parametrize("lr,mom,wd,nest", SGD_CASES)
def test_sgd_vs_torch_bit_identical_float32(lr, mom, wd, nest):
    """float32, 3 steps, zero-initialized velocity: BIT-IDENTICAL (0 ulp) to
    torch.optim.SGD on AVX2/AVX512 CPUs, including non-vector-multiple
    tails (<= 1 ulp accepted on other torch CPU capabilities)."""
    torch = torch_or_skip()
    r = rng(26)
    shapes = [(37, 29), (16, 3, 3, 3), (7,), (1000,)]
    params = [r.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[(r.standard_normal(s) * 0.1).astype(np.float32) for s in shapes] for _ in range(3)]
    # torch's CPU add(alpha=...) is a fused multiply-add on its AVX2/AVX512
    # paths, which sgd_update reproduces exactly; a build without FMA
    # vector kernels rounds twice and may differ by 1 ulp.
    cap = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    max_ulp = 0 if cap in ("AVX2", "AVX512") else 1
    tparams = [torch.nn.Parameter(torch.tensor(p.copy())) for p in params]
    opt = torch.optim.SGD(tparams, lr=lr, momentum=mom, weight_decay=wd, nesterov=nest)
    vel = [np.zeros_like(p) if mom else None for p in params]
    for step in range(3):
        for tp, g in zip(tparams, grads[step]):
            tp.grad = torch.tensor(g)
        opt.step()
        for p, v, g in zip(params, vel, grads[step]):
            K.sgd_update(p, g, v, lr, mom, wd, nest)
        for p, tp in zip(params, tparams):
            _assert_same_f32(p, tp.detach().numpy(), max_ulp)
        if mom:
            for v, tp in zip(vel, tparams):
                _assert_same_f32(v, opt.state[tp]["momentum_buffer"].numpy(), max_ulp)


def _assert_same_f32(a, b, max_ulp):
    if max_ulp == 0:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_array_max_ulp(a, b, maxulp=max_ulp)


# --------------------------------------------------------------------------
# memory primitives
# --------------------------------------------------------------------------

def test_fill_copy_add_inplace():
    a = np.empty((3, 4), np.float32)
    K.fill(a, 2.5)
    assert np.all(a == 2.5)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    K.copy(a, b)
    np.testing.assert_array_equal(a, b)
    K.add_inplace(a, b)
    np.testing.assert_array_equal(a, 2 * b)
    K.copy(a[:, ::2], b[:, 1::2])                       # strided views
    np.testing.assert_array_equal(a[:, ::2], b[:, 1::2])
