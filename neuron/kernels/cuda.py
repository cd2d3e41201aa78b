"""GPU kernels: the numpy_ref signatures on CuPy arrays (views into the CUDA arena).

Every function here has exactly the name, arguments and semantics of its twin in
:mod:`neuron.kernels.numpy_ref` (read that module's docstring for the conventions: outputs are
caller-provided views and are overwritten, ``None`` outputs are skipped, PyTorch semantics).

Where cuDNN has the operation it does the work, through :mod:`neuron.kernels.cudnn`:
convolution (forward, backward data/filter/bias), batch normalization, max/average pooling,
ReLU/sigmoid/tanh forward, ReLU backward, cross-channel LRN and the softmax of the loss.
CuPy does the rest with fused elementwise kernels (dropout, leaky ReLU, the SGD step, the
cross-entropy reduction) and cuBLAS (linear layers, via ``cupy.matmul``). A few cuDNN calls are
replaced by CuPy kernels on purpose, each for a reason given at the spot: sigmoid/tanh backward
(the layers keep only the output, cuDNN's backward wants the input too), average-pool backward
(same), LRN with an even window (cuDNN centres the window differently from torch) and pooling
with ceil-mode output shapes (cuDNN computes floor-mode shapes only).

Convolution algorithms are chosen per call under the bytes of the workspace the executor handed
in (:mod:`neuron.kernels.conv_algos`): every algorithm is timed once per layer geometry with
FindEx under the largest workspace that could be free, then each call takes the fastest whose
workspace fits; every choice is appended to :data:`conv_algo_trace` for the memory trace.
``deterministic = True`` restricts the choice to deterministic algorithms picked by cuDNN's
(reproducible) heuristic ranking under the planned workspace, so runs and policies produce the
same bits.

Importing this module needs neither CuPy nor cuDNN (the pure helpers are unit-tested on the CPU);
the first kernel call loads both.
"""
from __future__ import annotations

import functools

import numpy as np

from . import cudnn as dnn
from . import numpy_ref
from .numpy_ref import _pair, conv2d_out_hw, pool_out_hw  # noqa: F401 (mirrors numpy_ref)

__all__ = list(numpy_ref.__all__) + [
    "choose_conv_algo", "pick_algo", "workspace_bucket", "conv_algo_trace",
    "clear_conv_algo_cache", "dropout_mask_reference", "ConvAlgoError",
]

# ------------------------------------------------------------------------------------------
# switches
# ------------------------------------------------------------------------------------------

#: only deterministic cuDNN algorithms, chosen by heuristic rank instead of by a (noisy) timing,
#: plus deterministic max-pool backward: bit-identical results from run to run
deterministic = False
#: let float32 convolutions use TF32 tensor cores (torch.backends.cudnn.allow_tf32). Off by
#: default so float32 results stay within float32 rounding of the NumPy reference; cuBLAS in
#: CuPy follows the CUPY_TF32 environment variable instead.
allow_tf32 = False
#: "find": measure with cudnnFind*AlgorithmEx (once per layer geometry and bucket);
#: "heuristic": cuDNN's ranking without running anything
conv_algo_search = "find"
#: label stamped on conv_algo_trace records (the executor may set the current layer/step name)
trace_label = None

_cupy = None


def _cp():
    global _cupy
    if _cupy is None:
        import cupy
        _cupy = cupy
    return _cupy


def _h():
    return dnn.get_handle()


def _ptr(a) -> int:
    return 0 if a is None else a.data.ptr


def _td(a):
    return dnn.tensor_descriptor(a.shape, a.dtype, a.strides)


def _contig(a):
    if not a.flags.c_contiguous:
        raise ValueError(f"expected a C-contiguous array, got shape {a.shape} strides {a.strides}")
    return a


# ------------------------------------------------------------------------------------------
# convolution algorithm choice: neuron.kernels.conv_algos (FindEx once per geometry, then the
# fastest that fits the free bytes of the moment); re-exported here, its public home
# ------------------------------------------------------------------------------------------

from .conv_algos import (  # noqa: E402,F401
    ConvAlgoError, ConvAlgoRecord, ConvChoice, align_region, aligned_workspace,
    choose_conv_algo, clear_conv_algo_cache, conv2d_workspace_request, conv_algo_trace,
    conv_geometry_key, pick_algo, workspace_bucket)
from .conv_algos import choose as _choose  # noqa: E402
from .conv_algos import key_text as _key_text  # noqa: E402,F401
from .conv_algos import math_type as _math_type  # noqa: E402,F401
from .conv_algos import record as _record  # noqa: E402


# ------------------------------------------------------------------------------------------
# convolution
# ------------------------------------------------------------------------------------------

def conv2d_workspace_bytes(x_shape, w_shape, stride, padding, dilation, groups, itemsize):
    """Same number as the NumPy reference (the im2col buffer): it is what the planner budgets on
    every device, so virtual, CPU and GPU plans agree byte for byte. On the GPU it is a ceiling,
    not a need: the algorithm is chosen to fit whatever part of it is handed in."""
    return numpy_ref.conv2d_workspace_bytes(x_shape, w_shape, stride, padding, dilation, groups,
                                            itemsize)


def _conv_setup(x, w, stride, padding, dilation, groups):
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    _contig(w)
    wd = dnn.filter_descriptor(w.shape, w.dtype)
    cd = dnn.convolution_descriptor(padding, stride, dilation, groups, x.dtype)
    return stride, padding, dilation, wd, cd


def conv2d_forward(x, w, b, y, stride, padding, dilation, groups, workspace):
    stride, padding, dilation, wd, cd = _conv_setup(x, w, stride, padding, dilation, groups)
    xd, yd = _td(x), _td(y)
    ws_ptr, ws_bytes = aligned_workspace(workspace)
    key = conv_geometry_key("fwd", x.shape, w.shape, stride, padding, dilation, groups, x.dtype)
    choice = _choose("fwd", key, xd, wd, cd, yd, ws_bytes, (_ptr(x), _ptr(w), _ptr(y)),
                     (ws_ptr, ws_bytes))
    _record("fwd", key, choice, ws_bytes)
    cd.set_math_type(choice.math_type)
    h = _h()
    dnn.convolution_forward(h, xd, _ptr(x), wd, _ptr(w), cd, choice.algo, ws_ptr, ws_bytes, yd,
                            _ptr(y))
    if b is not None:
        dnn.add_tensor(h, dnn.bias_descriptor(w.shape[0], b.dtype), _ptr(_contig(b)), yd, _ptr(y),
                       1.0, 1.0)


def conv2d_backward(x, w, dy, dx, dw, db, stride, padding, dilation, groups, workspace):
    stride, padding, dilation, wd, cd = _conv_setup(x, w, stride, padding, dilation, groups)
    dyd = _td(dy)
    h = _h()
    ws_ptr, ws_bytes = aligned_workspace(workspace)
    if db is not None:
        dnn.convolution_backward_bias(h, dyd, _ptr(dy), dnn.bias_descriptor(db.shape[0], db.dtype),
                                      _ptr(_contig(db)))
    if dw is not None:
        _contig(dw)
        xd = _td(x)
        key = conv_geometry_key("bwd_filter", x.shape, w.shape, stride, padding, dilation,
                                groups, x.dtype)
        choice = _choose("bwd_filter", key, xd, wd, cd, dyd, ws_bytes,
                         (_ptr(x), _ptr(dw), _ptr(dy)), (ws_ptr, ws_bytes))
        _record("bwd_filter", key, choice, ws_bytes)
        cd.set_math_type(choice.math_type)
        dnn.convolution_backward_filter(h, xd, _ptr(x), dyd, _ptr(dy), cd, choice.algo, ws_ptr,
                                        ws_bytes, wd, _ptr(dw))
    if dx is not None:
        dxd = _td(dx)
        key = conv_geometry_key("bwd_data", x.shape, w.shape, stride, padding, dilation,
                                groups, x.dtype)
        choice = _choose("bwd_data", key, dxd, wd, cd, dyd, ws_bytes,
                         (_ptr(dx), _ptr(w), _ptr(dy)), (ws_ptr, ws_bytes))
        _record("bwd_data", key, choice, ws_bytes)
        cd.set_math_type(choice.math_type)
        dnn.convolution_backward_data(h, wd, _ptr(w), dyd, _ptr(dy), cd, choice.algo, ws_ptr,
                                      ws_bytes, dxd, _ptr(dx))


# ------------------------------------------------------------------------------------------
# batch normalization (cuDNN SPATIAL; a 2-D (N, C) input is described as (N, C, 1, 1))
# ------------------------------------------------------------------------------------------

def bn_param_dtype(dtype):
    """The dtype of cuDNN's bnScaleBiasMeanVarDesc for data of ``dtype``: float for half (and
    bfloat16) data, the data's own type otherwise (cuDNN's documented rule)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _bn_params(x, **arrays):
    """Check that BN's per-channel arrays have cuDNN's parameter dtype; returns it."""
    want = bn_param_dtype(x.dtype)
    c = x.shape[1]
    for name, a in arrays.items():
        if a is None:
            continue
        if np.dtype(a.dtype) != want or a.size != c:
            raise ValueError(f"batchnorm on {np.dtype(x.dtype).name} input of shape "
                             f"{tuple(x.shape)}: {name} must be {want.name} with {c} elements "
                             f"(cuDNN's scale/bias/statistics descriptor), got "
                             f"{np.dtype(a.dtype).name} of shape {tuple(a.shape)}")
    return want


def _param_or(a, channels, dtype, value):
    if a is not None:
        return _contig(a)
    return _cp().full((channels,), value, dtype=dtype)


def batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var,
                            save_mean, save_invstd, momentum, eps, update_running):
    cp = _cp()
    c = x.shape[1]
    pdt = _bn_params(x, weight=gamma, bias=beta, running_mean=running_mean,
                     running_var=running_var, save_mean=save_mean, save_invstd=save_invstd)
    bn = dnn.bias_descriptor(c, pdt)
    scale = _param_or(gamma, c, pdt, 1.0)
    bias = _param_or(beta, c, pdt, 0.0)
    rm = rv = None
    if update_running and (running_mean is not None or running_var is not None):
        # cuDNN updates both or neither: a missing one gets a throwaway buffer
        rm = running_mean if running_mean is not None else cp.zeros((c,), pdt)
        rv = running_var if running_var is not None else cp.ones((c,), pdt)
    sm, si = save_mean, save_invstd
    if (sm is None) != (si is None):        # likewise for the saved statistics
        sm = sm if sm is not None else cp.empty((c,), pdt)
        si = si if si is not None else cp.empty((c,), pdt)
    # ``factor`` multiplies the new batch statistic: torch's momentum. NULL running pointers
    # (a recompute) leave the running statistics untouched.
    dnn.batchnorm_forward_training(_h(), _td(x), _ptr(x), _td(y), _ptr(y), bn, _ptr(scale),
                                   _ptr(bias), float(momentum), _ptr(rm), _ptr(rv), float(eps),
                                   _ptr(sm), _ptr(si))


def batchnorm_forward_infer(x, gamma, beta, y, running_mean, running_var, eps):
    c = x.shape[1]
    pdt = _bn_params(x, weight=gamma, bias=beta, running_mean=running_mean,
                     running_var=running_var)
    scale = _param_or(gamma, c, pdt, 1.0)
    bias = _param_or(beta, c, pdt, 0.0)
    dnn.batchnorm_forward_inference(_h(), _td(x), _ptr(x), _td(y), _ptr(y),
                                    dnn.bias_descriptor(c, pdt), _ptr(scale), _ptr(bias),
                                    _ptr(_contig(running_mean)), _ptr(_contig(running_var)),
                                    float(eps))


def batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, eps=1e-5):
    cp = _cp()
    c = x.shape[1]
    pdt = _bn_params(x, weight=gamma, save_mean=save_mean, save_invstd=save_invstd,
                     dweight=dgamma, dbias=dbeta)
    scale = _param_or(gamma, c, pdt, 1.0)
    # cuDNN always writes all three gradients: absent ones go to throwaway buffers
    dx_ = dx if dx is not None else cp.empty_like(x)
    dg = dgamma if dgamma is not None else cp.empty((c,), pdt)
    dbt = dbeta if dbeta is not None else cp.empty((c,), pdt)
    # cuDNN wants the epsilon the forward used (Inception-v4: 1e-3), also with saved statistics
    have_saved = save_mean is not None and save_invstd is not None
    dnn.batchnorm_backward(_h(), _td(x), _ptr(x), _td(dy), _ptr(dy), _td(dx_), _ptr(dx_),
                           dnn.bias_descriptor(c, pdt), _ptr(scale), _ptr(_contig(dg)),
                           _ptr(_contig(dbt)), float(eps),
                           _ptr(save_mean) if have_saved else 0,
                           _ptr(save_invstd) if have_saved else 0)


# ------------------------------------------------------------------------------------------
# activations (backward reads the OUTPUT only, as in numpy_ref)
# ------------------------------------------------------------------------------------------

def _act_forward(mode, x, y):
    dnn.activation_forward(_h(), dnn.activation_descriptor(mode), _td(x), _ptr(x), _td(y), _ptr(y))


def relu_forward(x, y):
    _act_forward(dnn.CUDNN_ACTIVATION_RELU, x, y)


def relu_backward(y, dy, dx):
    # cuDNN's ReLU backward tests x > 0; y > 0 is the same predicate, so y stands in for the
    # input the layer did not keep
    yd = _td(y)
    dnn.activation_backward(_h(), dnn.activation_descriptor(dnn.CUDNN_ACTIVATION_RELU), yd,
                            _ptr(y), _td(dy), _ptr(dy), yd, _ptr(y), _td(dx), _ptr(dx))


def sigmoid_forward(x, y):
    _act_forward(dnn.CUDNN_ACTIVATION_SIGMOID, x, y)


def tanh_forward(x, y):
    _act_forward(dnn.CUDNN_ACTIVATION_TANH, x, y)


@functools.cache
def _k_sigmoid_bwd():
    return _cp().ElementwiseKernel("T y, T dy", "T dx", "dx = dy * ((T(1) - y) * y)",
                                   "neuron_sigmoid_bwd")


@functools.cache
def _k_tanh_bwd():
    return _cp().ElementwiseKernel("T y, T dy", "T dx", "dx = dy * (T(1) - y * y)",
                                   "neuron_tanh_bwd", options=("--fmad=false",))


def sigmoid_backward(y, dy, dx):
    # CuPy, not cuDNN: cuDNN's activation backward takes x as well, which the layer dropped
    _k_sigmoid_bwd()(y, dy, dx)


def tanh_backward(y, dy, dx):
    _k_tanh_bwd()(y, dy, dx)


@functools.cache
def _k_leaky():
    cp = _cp()
    fwd = cp.ElementwiseKernel("T x, T slope", "T y", "y = x > T(0) ? x : x * slope",
                               "neuron_leaky_relu_fwd")
    bwd = cp.ElementwiseKernel("T y, T dy, T slope", "T dx", "dx = y > T(0) ? dy : dy * slope",
                               "neuron_leaky_relu_bwd")
    return fwd, bwd


def leaky_relu_forward(x, y, slope):
    _k_leaky()[0](x, y.dtype.type(slope), y)


def leaky_relu_backward(y, dy, dx, slope):
    _k_leaky()[1](y, dy, dx.dtype.type(slope), dx)


# ------------------------------------------------------------------------------------------
# pooling
# ------------------------------------------------------------------------------------------

def _floor_shape(x, y, kernel, stride, padding) -> bool:
    """Whether y has cuDNN's (floor-mode) output shape for this window."""
    return tuple(y.shape[2:]) == pool_out_hw(x.shape[2], x.shape[3], kernel, stride, padding)


def _pool_desc(mode, kernel, stride, padding):
    return dnn.pooling_descriptor(mode, kernel, padding, stride, dnn.CUDNN_PROPAGATE_NAN)


def _max_mode():
    return dnn.CUDNN_POOLING_MAX_DETERMINISTIC if deterministic else dnn.CUDNN_POOLING_MAX


_POOL_PREAMBLE = r"""
__device__ inline long long nr_lo(long long a, long long s) {  // ceil(a / s) for any sign
    return a >= 0 ? (a + s - 1) / s : -((-a) / s);
}
__device__ inline long long nr_hi(long long a, long long s) {  // floor(a / s) for any sign
    return a >= 0 ? a / s : -((-a + s - 1) / s);
}
__device__ inline long long lmin(long long a, long long b) { return a < b ? a : b; }
__device__ inline long long lmax(long long a, long long b) { return a > b ? a : b; }
"""


@functools.cache
def _k_pool():
    """Pooling on C-contiguous NCHW arrays for the shapes cuDNN cannot do (ceil mode) and for
    average-pool backward. Backward kernels gather (one thread per input element, no atomics),
    so they are deterministic."""
    cp = _cp()
    geo = "int32 H, int32 W, int32 Ho, int32 Wo, int32 kh, int32 kw, int32 sh, int32 sw, " \
          "int32 ph, int32 pw"
    maxf = cp.ElementwiseKernel(
        "raw T x, T neg_inf, " + geo, "T y", r"""
        long long wo = i % Wo, t = i / Wo, ho = t % Ho, nc = t / Ho;
        const long long base = nc * H * W;
        T m = neg_inf;
        for (int a = 0; a < kh; ++a) {
            long long ih = ho * sh - ph + a;
            if (ih < 0 || ih >= H) continue;
            for (int b = 0; b < kw; ++b) {
                long long iw = wo * sw - pw + b;
                if (iw < 0 || iw >= W) continue;
                T v = x[base + ih * W + iw];
                m = (v > m || isnan(v)) ? v : m;     // NaN sticks, like np.maximum
            }
        }
        y = m;""", "neuron_maxpool_fwd")
    maxb = cp.ElementwiseKernel(
        "raw T x, raw T y, raw T dy, " + geo, "T dx", r"""
        long long iw = i % W, t = i / W, ih = t % H, nc = t / H;
        const long long xb = nc * H * W, yb = nc * Ho * Wo;
        const T xv = x[i];
        T acc = 0;
        long long ho0 = lmax(nr_lo(ih + ph - kh + 1, sh), 0LL), ho1 = lmin(nr_hi(ih + ph, sh), (long long)Ho - 1);
        long long wo0 = lmax(nr_lo(iw + pw - kw + 1, sw), 0LL), wo1 = lmin(nr_hi(iw + pw, sw), (long long)Wo - 1);
        for (long long ho = ho0; ho <= ho1; ++ho) {
            for (long long wo = wo0; wo <= wo1; ++wo) {
                const T m = y[yb + ho * Wo + wo];
                if (!(xv == m)) continue;
                // the gradient goes to the FIRST maximum of the window in row-major order
                bool first = true;
                for (int a = 0; a < kh && first; ++a) {
                    long long jh = ho * sh - ph + a;
                    if (jh < 0 || jh >= H) continue;
                    for (int b = 0; b < kw; ++b) {
                        long long jw = wo * sw - pw + b;
                        if (jw < 0 || jw >= W) continue;
                        if (jh == ih && jw == iw) { a = kh; break; }
                        if (x[xb + jh * W + jw] == m) { first = false; break; }
                    }
                }
                if (first) acc += dy[yb + ho * Wo + wo];
            }
        }
        dx = acc;""", "neuron_maxpool_bwd", preamble=_POOL_PREAMBLE)
    avgf = cp.ElementwiseKernel(
        "raw T x, " + geo, "T y", r"""
        long long wo = i % Wo, t = i / Wo, ho = t % Ho, nc = t / Ho;
        const long long base = nc * H * W;
        T s = 0;
        for (int a = 0; a < kh; ++a) {
            long long ih = ho * sh - ph + a;
            if (ih < 0 || ih >= H) continue;
            for (int b = 0; b < kw; ++b) {
                long long iw = wo * sw - pw + b;
                if (iw < 0 || iw >= W) continue;
                s += x[base + ih * W + iw];
            }
        }
        // torch's count_include_pad divisor: the window clipped to the padded input
        long long hs = ho * sh - ph, ws = wo * sw - pw;
        long long ch = lmin(hs + kh, (long long)H + ph) - hs, cw = lmin(ws + kw, (long long)W + pw) - ws;
        y = s / T(ch * cw);""", "neuron_avgpool_fwd", preamble=_POOL_PREAMBLE)
    avgb = cp.ElementwiseKernel(
        "raw T dy, " + geo, "T dx", r"""
        long long iw = i % W, t = i / W, ih = t % H, nc = t / H;
        const long long yb = nc * Ho * Wo;
        T acc = 0;
        long long ho0 = lmax(nr_lo(ih + ph - kh + 1, sh), 0LL), ho1 = lmin(nr_hi(ih + ph, sh), (long long)Ho - 1);
        long long wo0 = lmax(nr_lo(iw + pw - kw + 1, sw), 0LL), wo1 = lmin(nr_hi(iw + pw, sw), (long long)Wo - 1);
        for (long long ho = ho0; ho <= ho1; ++ho) {
            long long hs = ho * sh - ph, ch = lmin(hs + kh, (long long)H + ph) - hs;
            for (long long wo = wo0; wo <= wo1; ++wo) {
                long long ws = wo * sw - pw, cw = lmin(ws + kw, (long long)W + pw) - ws;
                acc += dy[yb + ho * Wo + wo] / T(ch * cw);
            }
        }
        dx = acc;""", "neuron_avgpool_bwd", preamble=_POOL_PREAMBLE)
    return maxf, maxb, avgf, avgb


def _geo(x_hw, y_hw, kernel, stride, padding):
    return (np.int32(x_hw[0]), np.int32(x_hw[1]), np.int32(y_hw[0]), np.int32(y_hw[1]),
            *(np.int32(v) for v in (*kernel, *stride, *padding)))


def _ccontig(a):
    return _cp().ascontiguousarray(a)


def _run_into(out, fn):
    """Run ``fn(dst)`` into ``out``, through a contiguous temporary when out is a strided view
    (the raw-indexing kernels assume C order)."""
    if out.flags.c_contiguous:
        fn(out)
    else:
        tmp = _cp().empty(out.shape, out.dtype)
        fn(tmp)
        out[...] = tmp


def maxpool_forward(x, y, kernel, stride, padding):
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    if _floor_shape(x, y, kernel, stride, padding):
        dnn.pooling_forward(_h(), _pool_desc(_max_mode(), kernel, stride, padding), _td(x),
                            _ptr(x), _td(y), _ptr(y))
        return
    g = _geo(x.shape[2:], y.shape[2:], kernel, stride, padding)
    xc = _ccontig(x)
    _run_into(y, lambda out: _k_pool()[0](xc, x.dtype.type(-np.inf), *g, out))


def maxpool_backward(x, y, dy, dx, kernel, stride, padding):
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    if _floor_shape(x, y, kernel, stride, padding):
        dnn.pooling_backward(_h(), _pool_desc(_max_mode(), kernel, stride, padding), _td(y),
                             _ptr(y), _td(dy), _ptr(dy), _td(x), _ptr(x), _td(dx), _ptr(dx))
        return
    g = _geo(x.shape[2:], y.shape[2:], kernel, stride, padding)
    xc, yc, dyc = _ccontig(x), _ccontig(y), _ccontig(dy)
    _run_into(dx, lambda out: _k_pool()[1](xc, yc, dyc, *g, out))


def avgpool_forward(x, y, kernel, stride, padding):
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    if _floor_shape(x, y, kernel, stride, padding):
        # floor mode: every window lies inside the padded input, so cuDNN's fixed kh*kw divisor
        # is torch's count_include_pad divisor
        dnn.pooling_forward(_h(), _pool_desc(dnn.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                             kernel, stride, padding),
                            _td(x), _ptr(x), _td(y), _ptr(y))
        return
    g = _geo(x.shape[2:], y.shape[2:], kernel, stride, padding)
    xc = _ccontig(x)
    _run_into(y, lambda out: _k_pool()[2](xc, *g, out))


def avgpool_backward(dy, dx, kernel, stride, padding):
    # CuPy, not cuDNN: cudnnPoolingBackward takes x and y, which AvgPool2d does not keep
    kernel, stride, padding = _pair(kernel), _pair(stride), _pair(padding)
    g = _geo(dx.shape[2:], dy.shape[2:], kernel, stride, padding)
    dyc = _ccontig(dy)
    _run_into(dx, lambda out: _k_pool()[3](dyc, *g, out))


def global_avgpool_forward(x, y):
    _cp().mean(x, axis=(2, 3), out=y)


def global_avgpool_backward(dy, dx):
    h, w = dx.shape[2:]
    _cp().multiply(dy[:, :, None, None], dx.dtype.type(1.0 / (h * w)), out=dx)


# ------------------------------------------------------------------------------------------
# linear (cuBLAS through cupy.matmul)
# ------------------------------------------------------------------------------------------

def _matmul(a, b, out):
    _cp().matmul(a, b, out=out)


def linear_forward(x, w, b, y):
    _matmul(x, w.T, y)
    if b is not None:
        _cp().add(y, b, out=y)


def linear_backward(x, w, dy, dx, dw, db):
    if dx is not None:
        _matmul(dy, w, dx)
    if dw is not None:
        _matmul(dy.T, x, dw)
    if db is not None:
        _cp().sum(dy, axis=0, out=db)


# ------------------------------------------------------------------------------------------
# dropout: a counter-based hash, so the mask depends only on (seed, element index)
# ------------------------------------------------------------------------------------------

from .dropout_mask import _seed_key, dropout_mask_reference  # noqa: E402,F401


@functools.cache
def _k_dropout():
    cp = _cp()
    mask = cp.ElementwiseKernel("uint64 key, float32 keep", "uint8 m", r"""
        unsigned long long z = key + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z = z ^ (z >> 31);
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        m = u < keep ? 1 : 0;""", "neuron_dropout_mask")
    apply = cp.ElementwiseKernel("T x, uint8 m, T scale", "T y", "y = (x * T(m)) * scale",
                                 "neuron_dropout_apply", options=("--fmad=false",))
    return mask, apply


def dropout_forward(x, y, mask, p, seed):
    if p >= 1.0:
        mask.fill(0)
    elif p <= 0.0:
        mask.fill(1)
    else:
        _k_dropout()[0](np.uint64(_seed_key(seed)), np.float32(1.0 - p), mask)
    dropout_apply(x, y, mask, p)


def dropout_apply(x, y, mask, p):
    if p >= 1.0:
        y.fill(0)
        return
    scale = 1.0 / (1.0 - p) if p > 0.0 else 1.0
    _k_dropout()[1](x, mask, y.dtype.type(scale), y)


def dropout_backward(dy, mask, dx, p):
    dropout_apply(dy, dx, mask, p)


# ------------------------------------------------------------------------------------------
# LRN (torch.nn.LocalResponseNorm)
# ------------------------------------------------------------------------------------------

def _lrn_cudnn_ok(size, alpha, beta, k) -> bool:
    # cuDNN's window for an even size looks one channel further ahead than torch's; its
    # descriptor also bounds n, k and beta. Outside that, the CuPy kernels below.
    return (size % 2 == 1 and dnn.CUDNN_LRN_MIN_N <= size <= dnn.CUDNN_LRN_MAX_N
            and k >= dnn.CUDNN_LRN_MIN_K and beta >= dnn.CUDNN_LRN_MIN_BETA)


_LRN_PREAMBLE = r"""
template <typename T>
__device__ T lrn_scale(const T* x, long long base, long long HW, int C, int c, int lo, int hi,
                       T a_over_n, T k) {
    T s = 0;
    for (int cc = c - lo; cc <= c + hi; ++cc) {
        if (cc < 0 || cc >= C) continue;
        T v = x[base + (long long)cc * HW];
        s += v * v;
    }
    return s * a_over_n + k;
}
"""


@functools.cache
def _k_lrn():
    cp = _cp()
    args = "int32 C, int64 HW, int32 lo, int32 hi, T a_over_n, T k, T beta"
    fwd = cp.ElementwiseKernel("raw T x, " + args, "T y", r"""
        long long hw = i % HW, t = i / HW; int c = t % C; long long n = t / C;
        long long base = n * C * HW + hw;
        T scale = lrn_scale(&x[0], base, HW, C, c, lo, hi, a_over_n, k);
        y = x[i] * pow(scale, -beta);""", "neuron_lrn_fwd", preamble=_LRN_PREAMBLE,
        options=("--fmad=false",))
    bwd = cp.ElementwiseKernel("raw T x, raw T y, raw T dy, " + args + ", T coef", "T dx", r"""
        long long hw = i % HW, t = i / HW; int c = t % C; long long n = t / C;
        long long base = n * C * HW + hw;
        // channels whose window contains c: c - hi .. c + lo
        T acc = 0;
        for (int cc = c - hi; cc <= c + lo; ++cc) {
            if (cc < 0 || cc >= C) continue;
            long long j = base + (long long)cc * HW;
            T sc = lrn_scale(&x[0], base, HW, C, cc, lo, hi, a_over_n, k);
            acc += dy[j] * y[j] / sc;
        }
        T scale = lrn_scale(&x[0], base, HW, C, c, lo, hi, a_over_n, k);
        dx = dy[i] * pow(scale, -beta) + acc * x[i] * coef;""", "neuron_lrn_bwd",
        preamble=_LRN_PREAMBLE, options=("--fmad=false",))
    return fwd, bwd


def _lrn_args(x, size, alpha, beta, k):
    t = x.dtype.type
    c = x.shape[1]
    hw = int(np.prod(x.shape[2:], dtype=np.int64))
    # torch's window of channel c: c - size//2 .. c + (size-1)//2
    return (np.int32(c), np.int64(hw), np.int32(size // 2), np.int32((size - 1) // 2),
            t(alpha / size), t(k), t(beta))


def lrn_forward(x, y, size, alpha, beta, k):
    if _lrn_cudnn_ok(size, alpha, beta, k):
        # cuDNN divides alpha by n itself, like torch
        dnn.lrn_forward(_h(), dnn.lrn_descriptor(size, alpha, beta, k), _td(x), _ptr(x), _td(y),
                        _ptr(y))
        return
    xc = _ccontig(x)
    args = _lrn_args(x, size, alpha, beta, k)
    _run_into(y, lambda out: _k_lrn()[0](xc, *args, out))


def lrn_backward(x, y, dy, dx, size, alpha, beta, k):
    if _lrn_cudnn_ok(size, alpha, beta, k):
        dnn.lrn_backward(_h(), dnn.lrn_descriptor(size, alpha, beta, k), _td(y), _ptr(y),
                         _td(dy), _ptr(dy), _td(x), _ptr(x), _td(dx), _ptr(dx))
        return
    xc, yc, dyc = _ccontig(x), _ccontig(y), _ccontig(dy)
    args = _lrn_args(x, size, alpha, beta, k)
    coef = x.dtype.type(-2.0 * alpha * beta / size)
    _run_into(dx, lambda out: _k_lrn()[1](xc, yc, dyc, *args, coef, out))


# ------------------------------------------------------------------------------------------
# structural
# ------------------------------------------------------------------------------------------

def add_forward(xs, y):
    cp = _cp()
    if len(xs) == 1:
        cp.copyto(y, xs[0])
        return
    cp.add(xs[0], xs[1], out=y)
    for a in xs[2:]:
        cp.add(y, a, out=y)


# slice assignment is the same on CuPy arrays: one definition serves both devices
concat_forward = numpy_ref.concat_forward


def concat_backward(dy, dxs, widths=None):
    cp = _cp()
    widths = numpy_ref.concat_widths(dy, dxs, widths)
    if widths is None:
        return
    o = 0
    for d, c in zip(dxs, widths):
        if d is not None:
            cp.copyto(d, dy[:, o:o + c])
        o += c
    assert o == dy.shape[1]


# ------------------------------------------------------------------------------------------
# loss: cuDNN softmax for the probabilities, a float64 log-sum-exp per row for the loss
# ------------------------------------------------------------------------------------------

@functools.cache
def _k_xent():
    cp = _cp()
    # one thread per sample; the log-sum-exp straight from the logits (not log of the
    # probabilities, which underflow) in double, as numpy_ref does
    rows = cp.ElementwiseKernel("raw T logits, raw int64 labels, int64 K", "float64 loss", r"""
        const long long base = i * K;
        double m = (double)logits[base];
        for (long long j = 1; j < K; ++j) m = fmax(m, (double)logits[base + j]);
        double s = 0.0;
        for (long long j = 0; j < K; ++j) s += exp((double)logits[base + j] - m);
        loss = log(s) + m - (double)logits[base + labels[i]];""", "neuron_xent_rows")
    grad = cp.ElementwiseKernel("T p, raw int64 labels, int64 K, T inv_n", "T d", r"""
        const long long row = i / K, col = i % K;
        d = (col == labels[row] ? p - T(1) : p) * inv_n;""", "neuron_xent_grad",
        options=("--fmad=false",))
    return rows, grad


def softmax_xent_forward(logits, labels, probs):
    cp = _cp()
    n, k = logits.shape
    dnn.softmax_forward(_h(), _td(logits), _ptr(logits), _td(probs), _ptr(probs),
                        dnn.CUDNN_SOFTMAX_ACCURATE, dnn.CUDNN_SOFTMAX_MODE_INSTANCE)
    rows = cp.empty((n,), np.float64)
    _k_xent()[0](_ccontig(logits), _ccontig(labels).astype(np.int64, copy=False), np.int64(k),
                 rows)
    return float(rows.mean())       # the one device->host sync of an iteration


def softmax_xent_backward(probs, labels, dlogits):
    n, k = probs.shape
    _k_xent()[1](probs, _ccontig(labels).astype(np.int64, copy=False), np.int64(k),
                 dlogits.dtype.type(1.0 / n), dlogits)


# ------------------------------------------------------------------------------------------
# optimizer: the whole torch.optim.SGD step in one kernel
# ------------------------------------------------------------------------------------------

_FMA_PREAMBLE = r"""
__device__ inline float fused(float a, float b, float c) { return fmaf(a, b, c); }
__device__ inline double fused(double a, double b, double c) { return fma(a, b, c); }
"""


@functools.cache
def _k_sgd():
    cp = _cp()
    # --fmad=false keeps velocity*momentum + d as two roundings (torch: buf.mul_(m).add_(d));
    # the explicit fused() calls are the fused multiply-adds of torch's add(alpha=...).
    opts = ("--fmad=false",)
    with_v = cp.ElementwiseKernel(
        "T g, T wd, T mom, T neg_lr, int32 first, int32 nesterov", "T p, T v", r"""
        T d = (wd != T(0)) ? fused(wd, p, g) : g;
        T vv;
        if (first) { vv = d; } else { vv = v * mom; vv = vv + d; }
        v = vv;
        d = nesterov ? fused(mom, vv, d) : vv;
        p = fused(neg_lr, d, p);""", "neuron_sgd_momentum", preamble=_FMA_PREAMBLE,
        options=opts)
    plain = cp.ElementwiseKernel("T g, T wd, T neg_lr", "T p", r"""
        T d = (wd != T(0)) ? fused(wd, p, g) : g;
        p = fused(neg_lr, d, p);""", "neuron_sgd", preamble=_FMA_PREAMBLE, options=opts)
    return with_v, plain


def sgd_update(param, grad, velocity, lr, momentum, weight_decay, nesterov, first_step=False):
    t = param.dtype.type
    if momentum != 0:
        if velocity is None:
            raise ValueError("sgd_update: momentum != 0 needs a velocity buffer")
        _k_sgd()[0](grad, t(weight_decay), t(momentum), t(-lr), np.int32(bool(first_step)),
                    np.int32(bool(nesterov)), param, velocity)
    else:
        _k_sgd()[1](grad, t(weight_decay), t(-lr), param)


# ------------------------------------------------------------------------------------------
# memory primitives
# ------------------------------------------------------------------------------------------

def fill(a, value):
    a.fill(value)


def copy(dst, src):
    """dst <- src; ``src`` may be a CuPy array or host data (NumPy, lists): the data layer feeds
    host batches through here."""
    cp = _cp()
    if isinstance(src, cp.ndarray):
        cp.copyto(dst, src)
        return
    src = np.asarray(src)
    if src.dtype != dst.dtype:
        src = src.astype(dst.dtype)
    if dst.flags.c_contiguous and src.shape == dst.shape:
        # through a pinned staging buffer, asynchronously on the compute stream; src may die
        # as soon as this returns (it was copied into the staging buffer)
        input_stager().stage(src, dst.data.ptr)
    else:
        cp.copyto(dst, cp.asarray(src))


_stager = None


def input_stager():
    """The process's PinnedStager over CuPy (pinned buffers, the current stream)."""
    global _stager
    if _stager is None:
        cp = _cp()
        from ..cuda_device import pinned_empty
        from .input_staging import PinnedStager

        def memcpy_async(dst, src, n):
            cp.cuda.runtime.memcpyAsync(dst, src, n, cp.cuda.runtime.memcpyHostToDevice,
                                        cp.cuda.get_current_stream().ptr)

        def record():
            return cp.cuda.get_current_stream().record(cp.cuda.Event(disable_timing=True))

        _stager = PinnedStager(pinned_empty, memcpy_async, record)
    return _stager


def add_inplace(dst, src):
    _cp().add(dst, src, out=dst)
