"""The cuDNN stand-in (the ``dnn`` namespace): each operation done with numpy_ref's arithmetic.

Mixed precision: tensors of a 2-byte type (bfloat16, float16) are read as float32, computed in
float32 and rounded once where the result is stored (cuDNN with a float compute type); BatchNorm
takes float32 scale, bias and statistics with them."""
from __future__ import annotations

import ctypes

import numpy as np

from neuron.kernels import cudnn, numpy_pool, numpy_ref
from neuron.kernels.channels_last import channels_last_strides

class Desc:
    def __init__(self, kind, **kw):
        self.kind = kind
        self.__dict__.update(kw)

    def set_math_type(self, mt):
        self.math_type = mt


def _at(desc, ptr):
    """The array a descriptor describes at a device address (None for a NULL pointer): the
    memory the wrapper pointed at, seen through the descriptor it passed with it."""
    if not ptr:
        return None
    dtype = np.dtype(desc.dtype)
    shape = tuple(desc.shape)
    strides = desc.strides if desc.strides is not None else \
        tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize
              for i in range(len(shape)))
    span = sum((n - 1) * st for n, st in zip(shape, strides)) + dtype.itemsize
    buf = (ctypes.c_char * span).from_address(int(ptr))
    return np.ndarray(shape, dtype, buffer=buf, strides=strides)


def _is_low(a) -> bool:
    return a is not None and a.dtype.itemsize == 2 and a.dtype.name in ("bfloat16", "float16")


def _f(a):
    """A low-precision array read as float32 (exact); anything else itself."""
    return a.astype(np.float32) if _is_low(a) else a


def _tmp(a):
    """Where a kernel computes an output ``a``: float32 for a low type (laid out as ``a``, so
    that reductions over it run in ``a``'s memory order), else ``a`` itself."""
    return np.empty_like(a, dtype=np.float32) if _is_low(a) else a


def _store(out, r):
    if r is not out:
        out[...] = r.astype(out.dtype)


def _channels(desc, ptr):
    a = _at(desc, ptr)
    return None if a is None else a.reshape(-1)


def _blend(out, result, alpha=1.0, beta=0.0):
    """cuDNN's out = alpha * result + beta * out (beta 0: out is not read, NaN or not)."""
    r = _f(result)
    r = r if alpha == 1.0 else alpha * r
    if beta == 0.0:
        out[...] = r.astype(out.dtype) if _is_low(out) else r
    else:
        o = _f(out)
        r = r + (o if beta == 1.0 else beta * o)
        out[...] = r.astype(out.dtype) if _is_low(out) else r


class CudnnStandIn:
    """The ``dnn`` namespace the GPU kernels use, over device addresses as cuDNN's is;
    constants from the real binding."""

    def __init__(self):
        self.calls = []
        self.dtypes = []            # (kind, x, w, y dtypes, compute type) of each convolution

    def __getattr__(self, name):
        return getattr(cudnn, name)            # constants, ALGO_NAMES, AlgoPerf

    # descriptors and handle ---------------------------------------------------------------
    def get_handle(self, *a):
        return None

    def tensor_descriptor(self, shape, dtype, strides_bytes=None):
        return Desc("tensor", shape=tuple(shape), dtype=np.dtype(dtype),
                    strides=None if strides_bytes is None else tuple(strides_bytes))

    def filter_descriptor(self, shape, dtype, fmt=cudnn.CUDNN_TENSOR_NCHW):
        """NCHW: a C-ordered (K, C, R, S) filter; NHWC: stored K, R, S, C (--layout nhwc)."""
        assert fmt in (cudnn.CUDNN_TENSOR_NCHW, cudnn.CUDNN_TENSOR_NHWC), f"filter format {fmt}"
        strides = None if fmt == cudnn.CUDNN_TENSOR_NCHW else \
            channels_last_strides(shape, np.dtype(dtype).itemsize)
        return Desc("filter", shape=tuple(shape), dtype=np.dtype(dtype), strides=strides,
                    fmt=fmt)

    def bias_descriptor(self, channels, dtype):
        return Desc("tensor", shape=(1, int(channels), 1, 1), dtype=np.dtype(dtype), strides=None)

    def convolution_descriptor(self, padding, stride, dilation, groups, dtype):
        return Desc("conv", padding=padding, stride=stride, dilation=dilation, groups=groups,
                    dtype=np.dtype(dtype))

    def pooling_descriptor(self, mode, window, padding, stride, nan=None):
        return Desc("pool", mode=mode, window=window, padding=padding, stride=stride)

    def activation_descriptor(self, mode, nan=None, coef=0.0):
        return Desc("act", mode=mode)

    def lrn_descriptor(self, n, alpha, beta, k):
        return Desc("lrn", n=n, alpha=alpha, beta=beta, k=k)

    # convolution -------------------------------------------------------------------------
    @staticmethod
    def _perf(time):
        return [cudnn.AlgoPerf(0, cudnn.CUDNN_STATUS_SUCCESS, time, 0,
                               cudnn.CUDNN_DETERMINISTIC, cudnn.CUDNN_FMA_MATH)]

    def get_algorithms(self, h, kind, x, w, conv, y):
        return self._perf(-1.0)

    def find_algorithms(self, h, kind, xd, x, wd, w, cd, yd, y, ws, ws_bytes):
        """Like cudnnFind*Ex it runs the algorithms, so it WRITES the output operand (forward
        naming: y for fwd, x = dx for bwd_data, w = dw for bwd_filter): NaN here."""
        d, p = {"fwd": (yd, y), "bwd_data": (xd, x), "bwd_filter": (wd, w)}[kind]
        _at(d, p)[...] = np.nan
        self.calls.append(("find", kind))
        return self._perf(0.01)

    def workspace_size(self, *a):
        return 0

    # backend engine plans (cudnn_engines.py) ----------------------------------------------
    #: ms per plan: below find_algorithms' 0.01, so a plan is chosen wherever one may run
    #: (every stand-in test then runs the plan path); a test sets it higher to see the legacy
    #: algorithm win, or sets ``engine_failure`` to see the plans skipped
    engine_time = 0.005
    legacy_time = 0.02
    engine_failure = None

    def conv_engine_plans(self, h, kind, x_shape, w_shape, y_shape, padding, stride, dilation,
                          dtype, *, tf32=False, deterministic=False, limit_bytes, count=6,
                          layout="nchw"):
        self.calls.append(("plans", kind))
        if self.engine_failure is not None:
            raise self.engine_failure
        plan = cudnn.EnginePlan(kind, 0, 0, (), 0, True)
        plan.geometry = (tuple(x_shape), tuple(w_shape), tuple(y_shape), padding, stride,
                         dilation, np.dtype(dtype), layout)
        return [plan], []

    def time_calls(self, calls, runs=3):
        """Runs each call once (like cuDNN's timing, a run writes the output); a plan's time
        is ``engine_time``, a legacy algorithm's ``legacy_time`` (not find_algorithms' 0.01:
        a test sees that FindEx's rows were timed again by this clock)."""
        for run in calls:
            run()
        return [self.engine_time if run.plan is not None else self.legacy_time
                for run in calls]

    def run_conv_plan(self, h, plan, ptrs, ws_ptr):
        """The plan's convolution (beta = 0) on packed operands at ``ptrs`` (x, w, y)."""
        xs, ws_, ys, padding, stride, dilation, dt, layout = plan.geometry
        # the operands as the plan's tensors describe them (packed in its layout)
        xd, wd, yd = (Desc("tensor", shape=s, dtype=dt, strides=tuple(
            st * dt.itemsize for st in cudnn.packed_strides(s, layout))) for s in (xs, ws_, ys))
        cd = Desc("conv", padding=padding, stride=stride, dilation=dilation,
                  groups=xs[1] // ws_[1], dtype=dt)
        self.calls.append(("plan", plan.kind))
        x, w, y = ptrs
        if plan.kind == "fwd":
            self.convolution_forward(h, xd, x, wd, w, cd, None, ws_ptr, 0, yd, y)
        elif plan.kind == "bwd_data":
            self.convolution_backward_data(h, wd, w, yd, y, cd, None, ws_ptr, 0, xd, x)
        else:
            self.convolution_backward_filter(h, xd, x, yd, y, cd, None, ws_ptr, 0, wd, w)

    @staticmethod
    def _conv(c):
        return c.stride, c.padding, c.dilation, c.groups

    @staticmethod
    def _ws(x_shape, w_shape, c, dtype):
        return np.empty(numpy_ref.conv2d_workspace_bytes(x_shape, w_shape, c.stride, c.padding,
                                                         c.dilation, c.groups,
                                                         np.dtype(dtype).itemsize), np.uint8)

    def convolution_forward(self, h, xd, x, wd, w, cd, algo, ws, ws_bytes, yd, y, alpha=1.0,
                            beta=0.0):
        x, w, y = _at(xd, x), _at(wd, w), _at(yd, y)
        self.dtypes.append(("fwd", x.dtype, w.dtype, y.dtype, cd.dtype))
        x, w = _f(x), _f(w)
        r = np.empty(y.shape, x.dtype)
        numpy_ref.conv2d_forward(x, w, None, r, *self._conv(cd),
                                 self._ws(x.shape, w.shape, cd, x.dtype))
        _blend(y, r, alpha, beta)

    def convolution_backward_data(self, h, wd, w, dyd, dy, cd, algo, ws, ws_bytes, dxd, dx,
                                  alpha=1.0, beta=0.0):
        w, dy, dx = _at(wd, w), _at(dyd, dy), _at(dxd, dx)
        w, dy = _f(w), _f(dy)
        r = np.empty(dx.shape, dy.dtype)
        numpy_ref.conv2d_backward(np.zeros_like(r), w, dy, r, None, None, *self._conv(cd),
                                  self._ws(dx.shape, w.shape, cd, dy.dtype))
        _blend(dx, r, alpha, beta)

    def convolution_backward_filter(self, h, xd, x, dyd, dy, cd, algo, ws, ws_bytes, wd, dw,
                                    alpha=1.0, beta=0.0):
        x, dy, dw = _at(xd, x), _at(dyd, dy), _at(wd, dw)
        assert x.dtype == dy.dtype == dw.dtype, \
            f"cuDNN backward filter: x {x.dtype}, dy {dy.dtype}, dw {dw.dtype} must agree"
        x, dy = _f(x), _f(dy)
        r = np.empty(dw.shape, x.dtype)
        numpy_ref.conv2d_backward(x, np.zeros_like(r), dy, None, r, None, *self._conv(cd),
                                  self._ws(x.shape, dw.shape, cd, x.dtype))
        _blend(dw, r, alpha, beta)

    def convolution_backward_bias(self, h, dyd, dy, bd, db, alpha=1.0, beta=0.0):
        dy, db = _at(dyd, dy), _channels(bd, db)
        assert dy.dtype == db.dtype, f"cuDNN backward bias: dy {dy.dtype}, db {db.dtype}"
        _blend(db, _f(dy).sum(axis=(0, 2, 3)), alpha, beta)

    def add_tensor(self, h, ad, a, cd, c, alpha=1.0, beta=1.0):
        a, c = _at(ad, a), _at(cd, c)
        a = _f(a)
        _blend(c, np.broadcast_to(a, c.shape) if alpha == 1.0 else alpha * a, 1.0, beta)

    # batch normalization -----------------------------------------------------------------
    def batchnorm_forward_training(self, h, xd, x, yd, y, bd, scale, bias, factor, rm, rv, eps,
                                   sm, si, mode=None):
        rm, rv = _channels(bd, rm), _channels(bd, rv)
        assert (rm is None) == (rv is None), "cuDNN updates both running statistics or neither"
        y = _at(yd, y)
        self._bn_types(xd, yd, bd)
        r = _tmp(y)
        numpy_ref.batchnorm_forward_train(_f(_at(xd, x)), _channels(bd, scale),
                                          _channels(bd, bias), r, rm, rv,
                                          _channels(bd, sm), _channels(bd, si), factor, eps,
                                          rm is not None)
        _store(y, r)

    def batchnorm_forward_inference(self, h, xd, x, yd, y, bd, scale, bias, mean, var, eps,
                                    mode=None):
        y = _at(yd, y)
        self._bn_types(xd, yd, bd)
        r = _tmp(y)
        numpy_ref.batchnorm_forward_infer(_f(_at(xd, x)), _channels(bd, scale),
                                          _channels(bd, bias), r, _channels(bd, mean),
                                          _channels(bd, var), eps)
        _store(y, r)

    def batchnorm_backward(self, h, xd, x, dyd, dy, dxd, dx, bd, scale, dscale, dbias, eps,
                           sm, si, mode=None, beta_data=0.0):
        self._bn_types(xd, dyd, bd)
        x, dy, dx = _f(_at(xd, x)), _f(_at(dyd, dy)), _at(dxd, dx)
        sm, si = _channels(bd, sm), _channels(bd, si)
        if sm is None:              # cuDNN recomputes the statistics from x
            axes = (0, 2, 3) if x.ndim == 4 else (0,)
            sm = x.mean(axis=axes)
            si = 1.0 / np.sqrt(x.var(axis=axes) + eps)
        r = np.empty_like(dx, dtype=x.dtype)    # dx's layout: its reductions' memory order
        numpy_ref.batchnorm_backward(x, dy, _channels(bd, scale), sm, si, r,
                                     _channels(bd, dscale), _channels(bd, dbias), eps)
        _blend(dx, r, 1.0, beta_data)

    @staticmethod
    def _bn_types(xd, yd, bd):
        """cuDNN's rule: scale, bias and statistics are float for half and bfloat16 data."""
        x, y, p = np.dtype(xd.dtype), np.dtype(yd.dtype), np.dtype(bd.dtype)
        assert x == y, f"cuDNN batchnorm: x {x} and y {y} differ"
        want = np.float64 if x == np.float64 else np.float32
        assert p == want, f"cuDNN batchnorm: {x} data takes {np.dtype(want)} parameters, got {p}"

    # pooling, activations, softmax, LRN --------------------------------------------------
    @staticmethod
    def _pool_floor_shape(pd, xd, yd):      # cuDNN pools to floor-mode shapes only
        want = numpy_pool.pool_out_hw(*xd.shape[2:], pd.window, pd.stride, pd.padding)
        assert tuple(yd.shape[2:]) == want, f"cuDNN pooling: y {yd.shape} is not floor {want}"

    def pooling_forward(self, h, pd, xd, x, yd, y):
        self._pool_floor_shape(pd, xd, yd)
        if pd.mode == cudnn.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING:
            f = numpy_pool.avgpool_forward
        else:
            assert pd.mode in (cudnn.CUDNN_POOLING_MAX, cudnn.CUDNN_POOLING_MAX_DETERMINISTIC)
            f = numpy_pool.maxpool_forward
        y = _at(yd, y)
        r = _tmp(y)
        f(_f(_at(xd, x)), r, pd.window, pd.stride, pd.padding)
        _store(y, r)

    def pooling_backward(self, h, pd, yd, y, dyd, dy, xd, x, dxd, dx, beta=0.0):
        self._pool_floor_shape(pd, xd, yd)
        assert pd.mode in (cudnn.CUDNN_POOLING_MAX, cudnn.CUDNN_POOLING_MAX_DETERMINISTIC)
        dx = _at(dxd, dx)
        r = _f(dx).copy() if _is_low(dx) else dx
        numpy_pool.maxpool_backward(_f(_at(xd, x)), _f(_at(yd, y)), _f(_at(dyd, dy)), r,
                                    pd.window, pd.stride, pd.padding, accumulate=beta == 1.0)
        _store(dx, r)

    def activation_forward(self, h, ad, xd, x, yd, y):
        y = _at(yd, y)
        r = _tmp(y)
        {cudnn.CUDNN_ACTIVATION_RELU: numpy_ref.relu_forward,
         cudnn.CUDNN_ACTIVATION_SIGMOID: numpy_ref.sigmoid_forward,
         cudnn.CUDNN_ACTIVATION_TANH: numpy_ref.tanh_forward}[ad.mode](_f(_at(xd, x)), r)
        _store(y, r)

    def activation_backward(self, h, ad, yd, y, dyd, dy, xd, x, dxd, dx, beta=0.0):
        assert ad.mode == cudnn.CUDNN_ACTIVATION_RELU, "only ReLU's backward is cuDNN's"
        x, dy, dx = _f(_at(xd, x)), _f(_at(dyd, dy)), _at(dxd, dx)
        _blend(dx, np.where(x > 0, dy, np.zeros((), dy.dtype)), 1.0, beta)  # cuDNN: x > 0

    def softmax_forward(self, h, xd, x, yd, y, algo=None, mode=None):
        x = _at(xd, x)
        assert not _is_low(x), "the softmax of the loss runs in float32"
        numpy_ref.softmax_xent_forward(x, np.zeros(x.shape[0], np.int64), _at(yd, y))

    def lrn_forward(self, h, ld, xd, x, yd, y):
        numpy_ref.lrn_forward(_at(xd, x), _at(yd, y), ld.n, ld.alpha, ld.beta, ld.k)

    def lrn_backward(self, h, ld, yd, y, dyd, dy, xd, x, dxd, dx, beta=0.0):
        numpy_ref.lrn_backward(_at(xd, x), _at(yd, y), _at(dyd, dy), _at(dxd, dx), ld.n,
                               ld.alpha, ld.beta, ld.k, accumulate=beta == 1.0)
