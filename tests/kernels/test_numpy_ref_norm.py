"""numpy_ref batch normalization and LRN: gradient checks and vs torch."""
import numpy as np
import pytest

from neuron.kernels import numpy_ref as K
from numpy_ref_helpers import assert_grad, garbage, numgrad, proj_loss, rng, torch_or_skip


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


# ---- BatchNorm + ReLU fused (layers/norm.py BNReLU): the unfused pair's bits ----------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 5)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_bnrelu_kernels_are_the_unfused_pair_bit_for_bit(dtype, shape, accumulate):
    gen = np.random.default_rng(5)
    c = shape[1]
    x = (gen.standard_normal(shape) + 0.3).astype(dtype)
    dy = gen.standard_normal(shape).astype(dtype)
    gamma, beta = (1 + 0.5 * gen.standard_normal(c)).astype(dtype), \
        (0.3 * gen.standard_normal(c)).astype(dtype)
    start = gen.standard_normal(shape).astype(dtype)

    def stats():
        return [np.zeros(c, dtype), np.ones(c, dtype), np.empty(c, dtype), np.empty(c, dtype)]
    z, y, dz = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    rm, rv, sm, si = stats()
    K.batchnorm_forward_train(x, gamma, beta, z, rm, rv, sm, si, 0.1, 1e-5, True)
    K.relu_forward(z, y)
    K.relu_backward(y, dy, dz)
    dx, dg, db = start.copy(), np.empty(c, dtype), np.empty(c, dtype)
    K.batchnorm_backward(x, dz, gamma, sm, si, dx, dg, db, 1e-5, accumulate=accumulate)

    fy = np.empty_like(x)
    frm, frv, fsm, fsi = stats()
    K.bnrelu_forward_train(x, gamma, beta, fy, frm, frv, fsm, fsi, 0.1, 1e-5, True)
    fdx, fdg, fdb = start.copy(), np.empty(c, dtype), np.empty(c, dtype)
    K.bnrelu_backward(x, dy, gamma, beta, fsm, fsi, fdx, fdg, fdb, 1e-5, accumulate=accumulate)
    for a, b in ((y, fy), (rm, frm), (rv, frv), (sm, fsm), (si, fsi), (dx, fdx), (dg, fdg),
                 (db, fdb)):
        assert a.tobytes() == b.tobytes()
    assert 0 < (y > 0).mean() < 1               # both sides of the ReLU are exercised
    zi, yi = np.empty_like(x), np.empty_like(x)
    K.batchnorm_forward_infer(x, gamma, beta, zi, rm, rv, 1e-5)
    K.bnrelu_forward_infer(x, gamma, beta, yi, rm, rv, 1e-5)
    assert np.maximum(zi, 0).tobytes() == yi.tobytes()


def test_bnrelu_backward_into_its_own_dy_and_at_the_relu_edge():
    """dx may be dy's memory (in-place backward); values whose BN output is exactly 0 (x at
    the mean, beta 0) are masked as the unfused ReLU masks them."""
    gen = np.random.default_rng(8)
    x = gen.standard_normal((3, 2, 4, 4)).astype(np.float32)
    x[:, :, 0, 0] = x.mean(axis=(0, 2, 3))[None, :]         # near the mean: z near 0
    gamma, beta = np.array([1.5, -0.7], np.float32), np.array([0.0, 0.1], np.float32)
    dy = gen.standard_normal(x.shape).astype(np.float32)
    z, y, dz, want = (np.empty_like(x) for _ in range(4))
    sm, si = np.empty(2, np.float32), np.empty(2, np.float32)
    K.batchnorm_forward_train(x, gamma, beta, z, None, None, sm, si, 0.1, 1e-5, False)
    K.relu_forward(z, y)
    K.relu_backward(y, dy, dz)
    K.batchnorm_backward(x, dz, gamma, sm, si, want, None, None, 1e-5)
    shared = dy.copy()
    K.bnrelu_backward(x, shared, gamma, beta, sm, si, shared, None, None, 1e-5)
    assert shared.tobytes() == want.tobytes()
