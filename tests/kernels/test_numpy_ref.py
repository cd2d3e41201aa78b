"""Tests for the NumPy reference kernels (neuron/kernels/numpy_ref.py).

* Finite-difference gradient checks in float64 (central differences, loss =
  random projection of the output, relative error < 1e-6) for every kernel
  with a backward.
* Comparisons with torch.nn.functional (float64) where torch is importable.
* SGD vs torch.optim.SGD in float32: required BIT-IDENTICAL (0 ulp).

Convolution, batch norm and LRN, pooling and SGD have their own files:
test_numpy_ref_conv.py, test_numpy_ref_norm.py, test_numpy_ref_pool.py, test_numpy_ref_sgd.py.
"""
import numpy as np
import pytest

from neuron.kernels import numpy_ref as K
from numpy_ref_helpers import (assert_grad, away_from_zero, garbage, numgrad, proj_loss, rng,
                               torch_or_skip)


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
