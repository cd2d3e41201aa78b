"""Index helpers shared by the NumPy reference kernels (numpy_ref.py, numpy_conv.py,
numpy_pool.py): parameter pairs, the output range a kernel tap reaches, and the input
gradient's target when a kernel accumulates into it."""
from __future__ import annotations

import numpy as np

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def _pair(v):
    if isinstance(v, (tuple, list)):
        assert len(v) == 2
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _valid_range(out_len, in_len, stride, pad, offset):
    """Output indices o in [lo, hi) with 0 <= o*stride - pad + offset < in_len.

    Returns (lo, hi, first input index).  hi <= lo means empty.
    """
    start = offset - pad                      # input index of o == 0
    lo = 0 if start >= 0 else (-start + stride - 1) // stride
    hi = (in_len - 1 - start) // stride + 1 if in_len - 1 - start >= 0 else 0
    hi = min(hi, out_len)
    return lo, hi, lo * stride + start


def _grad_target(dx, accumulate):
    """Where a kernel writes its input gradient: dx itself, or (accumulating) a NumPy
    temporary that _grad_finish adds into dx (the reference's stand-in for beta = 1)."""
    return np.empty_like(dx) if accumulate else dx


def _grad_finish(dx, t, accumulate):
    if accumulate:
        np.add(dx, t, out=dx)


def _in_slice(first, count, stride):
    return slice(first, first + (count - 1) * stride + 1, stride)


def _offset_slices(ho, wo, h, w, stride, padding, ki, kj):
    """(out_h_slice, out_w_slice, in_h_slice, in_w_slice) for the kernel tap
    (ki, kj) (already multiplied by dilation); None if the tap never hits."""
    sh, sw = stride
    ph, pw = padding
    h_lo, h_hi, ih0 = _valid_range(ho, h, sh, ph, ki)
    w_lo, w_hi, iw0 = _valid_range(wo, w, sw, pw, kj)
    if h_hi <= h_lo or w_hi <= w_lo:
        return None
    return (slice(h_lo, h_hi), slice(w_lo, w_hi),
            _in_slice(ih0, h_hi - h_lo, sh), _in_slice(iw0, w_hi - w_lo, sw))
