"""NumPy reference pooling (the CPU device): max, average and global average. Conventions:
numpy_ref.py."""
from __future__ import annotations

import numpy as np

from .numpy_helpers import _offset_slices, _pair

# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------

def pool_out_hw(h, w, kernel, stride, padding, ceil_mode=False):
    """Output size as torch (dilation 1): in ceil mode the last window must
    start inside the input or left padding."""
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)

    def one(n, k, s, p):
        num = n + 2 * p - k
        o = (-(-num // s) if ceil_mode else num // s) + 1
        if ceil_mode and (o - 1) * s >= n + p:
            o -= 1
        return o

    return one(h, kh, sh, ph), one(w, kw, sw, pw)


def _taps(ho, wo, h, w, kernel, stride, padding):
    """(out_h, out_w, in_h, in_w) slices of every kernel tap that reaches the input."""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            sl = _offset_slices(ho, wo, h, w, stride, padding, i, j)
            if sl is not None:
                yield sl


def maxpool_forward(x, y, kernel, stride, padding):
    """Max pooling with implicit -inf padding.  The output size is taken from
    y, so ceil-mode shapes work too."""
    kh, kw = _pair(kernel)
    stride, padding = _pair(stride), _pair(padding)
    h, w = x.shape[2:]
    ho, wo = y.shape[2:]
    y.fill(-np.inf)
    for oh, ow, ih, iw in _taps(ho, wo, h, w, (kh, kw), stride, padding):
        yv = y[:, :, oh, ow]
        np.maximum(yv, x[:, :, ih, iw], out=yv)


def maxpool_backward(x, y, dy, dx, kernel, stride, padding, accumulate=False):
    """Routes each dy to the FIRST maximum of its window in row-major order
    (the element torch's CPU kernel records as index)."""
    kh, kw = _pair(kernel)
    stride, padding = _pair(stride), _pair(padding)
    h, w = x.shape[2:]
    ho, wo = y.shape[2:]
    if not accumulate:
        dx[...] = 0
    taken = np.zeros(y.shape, dtype=bool)     # window already routed
    hit = np.empty(y.shape, dtype=bool)
    # x gathered per tap into a contiguous output-shaped buffer, so that all
    # elementwise work runs on contiguous arrays; taps falling into the
    # padding read NaN, which never equals the maximum.
    xg = np.empty(y.shape, dtype=x.dtype)
    contrib = np.empty(y.shape, dtype=dx.dtype)
    for oh, ow, ih, iw in _taps(ho, wo, h, w, (kh, kw), stride, padding):   # row-major
        if (oh.stop - oh.start, ow.stop - ow.start) != (ho, wo):
            xg.fill(np.nan)
        xg[:, :, oh, ow] = x[:, :, ih, iw]
        np.equal(xg, y, out=hit)
        np.greater(hit, taken, out=hit)   # hit and not yet taken
        taken |= hit
        np.multiply(dy, hit, out=contrib)
        dxv = dx[:, :, ih, iw]
        dxv += contrib[:, :, oh, ow]


def _avgpool_divisor(h, w, ho, wo, kernel, stride, padding, dtype):
    """Window sizes clipped to the padded input (torch, count_include_pad)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    hs = np.arange(ho) * sh - ph
    ws = np.arange(wo) * sw - pw
    ch = np.minimum(hs + kh, h + ph) - hs
    cw = np.minimum(ws + kw, w + pw) - ws
    return np.outer(ch, cw).astype(dtype)


def avgpool_forward(x, y, kernel, stride, padding):
    """Average pooling, count_include_pad=True (torch default)."""
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    h, w = x.shape[2:]
    ho, wo = y.shape[2:]
    y[...] = 0
    for oh, ow, ih, iw in _taps(ho, wo, h, w, kernel, stride, padding):
        y[:, :, oh, ow] += x[:, :, ih, iw]
    y /= _avgpool_divisor(h, w, ho, wo, kernel, stride, padding, y.dtype)


def avgpool_backward(dy, dx, kernel, stride, padding, accumulate=False):
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    h, w = dx.shape[2:]
    ho, wo = dy.shape[2:]
    g = dy / _avgpool_divisor(h, w, ho, wo, kernel, stride, padding, dy.dtype)
    if not accumulate:
        dx[...] = 0
    for oh, ow, ih, iw in _taps(ho, wo, h, w, kernel, stride, padding):
        dx[:, :, ih, iw] += g[:, :, oh, ow]


def global_avgpool_forward(x, y):
    np.mean(x, axis=(2, 3), out=y)


def global_avgpool_backward(dy, dx, accumulate=False):
    h, w = dx.shape[2:]
    g = (dy * (1.0 / (h * w))).astype(dx.dtype, copy=False)[:, :, None, None]
    if accumulate:
        np.add(dx, g, out=dx)
    else:
        np.copyto(dx, g)
