"""GPU pooling and LRN kernels (numpy_pool's twins, re-exported by kernels/cuda.py, which is
the device's kernel namespace): cuDNN where it computes what torch does, CuPy raw kernels for
ceil-mode shapes, average-pool backward and LRN with an even window."""
from __future__ import annotations

import numpy as np

from . import cuda_switches
from . import cudnn as dnn
from . import cuda_low
from .cuda_helpers import (_ccontig, _cp, _grad_into, _h, _low_guarded, _ptr, _run_into, _td,
                           _via_f32)
from .cuda_raw import _k_avgpool_bwd_low, _k_lrn, _k_pool
from .numpy_ref import _pair, pool_out_hw


def _floor_shape(x, y, kernel, stride, padding) -> bool:
    """Whether y has cuDNN's (floor-mode) output shape for this window."""
    return tuple(y.shape[2:]) == pool_out_hw(x.shape[2], x.shape[3], kernel, stride, padding)


def _pool_desc(mode, kernel, stride, padding):
    return dnn.pooling_descriptor(mode, kernel, padding, stride, dnn.CUDNN_PROPAGATE_NAN)


def _max_mode():
    return dnn.CUDNN_POOLING_MAX_DETERMINISTIC if cuda_switches.deterministic \
        else dnn.CUDNN_POOLING_MAX


def _geo(x_hw, y_hw, kernel, stride, padding):
    return (np.int32(x_hw[0]), np.int32(x_hw[1]), np.int32(y_hw[0]), np.int32(y_hw[1]),
            *(np.int32(v) for v in (*kernel, *stride, *padding)))


def _cudnn_pool_forward(mode, x, y, kernel, stride, padding):
    def run(x_, y_):
        dnn.pooling_forward(_h(), _pool_desc(mode, kernel, stride, padding), _td(x_), _ptr(x_),
                            _td(y_), _ptr(y_))
    if cuda_low.is_low(y):
        _low_guarded("pooling", lambda: run(x, y), lambda: _via_f32(run, [x], [y]))
    else:
        run(x, y)


def maxpool_forward(x, y, kernel, stride, padding):
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    if _floor_shape(x, y, kernel, stride, padding):
        _cudnn_pool_forward(_max_mode(), x, y, kernel, stride, padding)
        return
    g = _geo(x.shape[2:], y.shape[2:], kernel, stride, padding)
    xc = _f32_in(x)
    _into(y, lambda out: _k_pool()[0](xc, xc.dtype.type(-np.inf), *g, out))


def maxpool_backward(x, y, dy, dx, kernel, stride, padding, accumulate=False):
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    if _floor_shape(x, y, kernel, stride, padding):
        def run(x_, y_, dy_, dx_):
            dnn.pooling_backward(_h(), _pool_desc(_max_mode(), kernel, stride, padding),
                                 _td(y_), _ptr(y_), _td(dy_), _ptr(dy_), _td(x_), _ptr(x_),
                                 _td(dx_), _ptr(dx_), beta=1.0 if accumulate else 0.0)
        if cuda_low.is_low(dx):
            _low_guarded("pooling", lambda: run(x, y, dy, dx),
                         lambda: _via_f32(run, [x, y, dy], [dx], accumulate))
        else:
            run(x, y, dy, dx)
        return
    g = _geo(x.shape[2:], y.shape[2:], kernel, stride, padding)
    xc, yc, dyc = _f32_in(x), _f32_in(y), _f32_in(dy)
    _grad_into(dx, accumulate,
               lambda d: _into(d, lambda out: _k_pool()[1](xc, yc, dyc, *g, out)))


def avgpool_forward(x, y, kernel, stride, padding):
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    if _floor_shape(x, y, kernel, stride, padding):
        # floor mode: every window lies inside the padded input, so cuDNN's fixed kh*kw divisor
        # is torch's count_include_pad divisor
        _cudnn_pool_forward(dnn.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, x, y, kernel,
                            stride, padding)
        return
    g = _geo(x.shape[2:], y.shape[2:], kernel, stride, padding)
    xc = _f32_in(x)
    _into(y, lambda out: _k_pool()[2](xc, *g, out))


def avgpool_backward(dy, dx, kernel, stride, padding, accumulate=False):
    # CuPy, not cuDNN: cudnnPoolingBackward takes x and y, which AvgPool2d does not keep
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    g = _geo(dx.shape[2:], dy.shape[2:], kernel, stride, padding)
    if cuda_low.is_low(dx) and dy.dtype == dx.dtype:    # in the low type: no float32 copies
        k = _k_avgpool_bwd_low(cuda_low.low_name(dx.dtype))
        _grad_into(dx, accumulate, lambda d: k(cuda_low.bits(dy), *g, cuda_low.bits(d)))
        return
    dyc = _f32_in(dy)
    _grad_into(dx, accumulate, lambda d: _into(d, lambda out: _k_pool()[3](dyc, *g, out)))


def _f32_in(a):
    """A raw kernel's input as it is (the kernels index it logically through its strides: a
    channels-last map needs no copy); a low-precision one as a float32 temporary (the raw
    pooling kernels compute in their input's type: mixed precision computes in float32)."""
    return cuda_low.to_f32(a) if cuda_low.is_low(a) else a


def _into(out, fn):
    """``fn(dst)`` into ``out``: through a float32 temporary rounded once into a low-precision
    ``out``, else into ``out`` itself, strided or not (the raw kernels write their output by
    its logical index: no temporary the plan does not hold)."""
    if cuda_low.is_low(out):
        t = _cp().empty(out.shape, np.float32)
        fn(t)
        cuda_low.cast(out, t)
    else:
        fn(out)


def global_avgpool_forward(x, y):
    if cuda_low.is_low(y):
        cuda_low.mean_hw(_ccontig(x), y)
        return
    _cp().mean(x, axis=(2, 3), out=y)


def global_avgpool_backward(dy, dx, accumulate=False):
    h, w = dx.shape[2:]
    if cuda_low.is_low(dx):
        _grad_into(dx, accumulate, lambda out: _run_into(
            out, lambda o: cuda_low.spread_hw(_ccontig(dy), o)))
        return
    _grad_into(dx, accumulate, lambda out: _cp().multiply(
        dy[:, :, None, None], dx.dtype.type(1.0 / (h * w)), out=out))


def _lrn_cudnn_ok(size, alpha, beta, k) -> bool:
    # cuDNN's window for an even size looks one channel further ahead than torch's; its
    # descriptor also bounds n, k and beta. Outside that, the CuPy kernels below.
    return (size % 2 == 1 and dnn.CUDNN_LRN_MIN_N <= size <= dnn.CUDNN_LRN_MAX_N
            and k >= dnn.CUDNN_LRN_MIN_K and beta >= dnn.CUDNN_LRN_MIN_BETA)


def _lrn_args(x, size, alpha, beta, k):
    t = x.dtype.type
    c = x.shape[1]
    hw = int(np.prod(x.shape[2:], dtype=np.int64))
    # torch's window of channel c: c - size//2 .. c + (size-1)//2
    return (np.int32(c), np.int64(hw), np.int32(size // 2), np.int32((size - 1) // 2),
            t(alpha / size), t(k), t(beta))


def lrn_forward(x, y, size, alpha, beta, k):
    if cuda_low.is_low(y):          # mixed precision: LRN in float32, rounded once
        return _via_f32(lambda x_, y_: lrn_forward(x_, y_, size, alpha, beta, k), [x], [y])
    if _lrn_cudnn_ok(size, alpha, beta, k):
        # cuDNN divides alpha by n itself, like torch
        dnn.lrn_forward(_h(), dnn.lrn_descriptor(size, alpha, beta, k), _td(x), _ptr(x), _td(y),
                        _ptr(y))
        return
    args = _lrn_args(x, size, alpha, beta, k)
    _k_lrn()[0](x, *args, y)        # logical indexing: strided x and y in place


def lrn_backward(x, y, dy, dx, size, alpha, beta, k, accumulate=False):
    if cuda_low.is_low(dx):
        return _via_f32(lambda x_, y_, dy_, dx_: lrn_backward(
            x_, y_, dy_, dx_, size, alpha, beta, k, accumulate), [x, y, dy], [dx], accumulate)
    if _lrn_cudnn_ok(size, alpha, beta, k):
        dnn.lrn_backward(_h(), dnn.lrn_descriptor(size, alpha, beta, k), _td(y), _ptr(y),
                         _td(dy), _ptr(dy), _td(x), _ptr(x), _td(dx), _ptr(dx),
                         beta=1.0 if accumulate else 0.0)
        return
    args = _lrn_args(x, size, alpha, beta, k)
    coef = x.dtype.type(-2.0 * alpha * beta / size)
    _grad_into(dx, accumulate, lambda d: _k_lrn()[1](x, y, dy, *args, coef, d))
