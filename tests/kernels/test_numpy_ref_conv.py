"""numpy_ref convolution: gradient checks, workspace, partial outputs, vs torch."""
import numpy as np
import pytest

from neuron.kernels import numpy_ref as K
from numpy_ref_helpers import F64, assert_grad, garbage, numgrad, proj_loss, rng, torch_or_skip


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
    (2, 4, 6, 5, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, True),    # stride 1: dx by correlation
    (1, 4, 7, 6, 2, 3, 2, (1, 1), (3, 1), (1, 2), 2, False),   # ... grouped, dilated, dy cropped
    (2, 4, 5, 5, 4, 1, 1, (1, 1), (1, 1), (1, 1), 1, False),   # padded 1x1
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


def test_conv_dx_routes_are_both_tested():
    """dx by correlation of dy (stride 1, kernel > 1x1, dy's columns fit the workspace) and by
    scatter-adding column gradients: CONV_CASES covers both."""
    from neuron.kernels.numpy_conv import _dx_by_correlation
    routes = set()
    for n, c, h, w, k, kh, kw, s, p, d, g, _ in CONV_CASES:
        ho, wo = K.conv2d_out_hw(h, w, kh, kw, s, p, d)
        routes.add(_dx_by_correlation(k, c, kh, kw, h, w, ho, wo, s))
    assert routes == {True, False}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_same_bits_every_call_with_or_without_workspace(case):
    """A replayed step must reproduce an eager one exactly, and a policy that gives the
    convolution no workspace must compute what one that does computes."""
    _, _, _, _, _, _, _, s, p, d, g, bias = case
    x, w, b, yshape, ws = _conv_setup(case, np.float32)
    dy = rng(3).standard_normal(yshape).astype(np.float32)
    runs = []
    for workspace in (ws, None, ws):
        y = np.empty(yshape, np.float32)
        dx, dw = garbage(x.shape, np.float32), garbage(w.shape, np.float32)
        db = np.empty(b.shape, np.float32) if bias else None
        K.conv2d_forward(x, w, b, y, s, p, d, g, workspace)
        K.conv2d_backward(x, w, dy, dx, dw, db, s, p, d, g, workspace)
        runs.append([y, dx, dw] + ([db] if bias else []))
    for other in runs[1:]:
        for a, o in zip(runs[0], other):
            np.testing.assert_array_equal(a, o)


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
