"""Thin pointer-level wrappers of the cuDNN operations neuron uses: convolution (heuristic and
measured algorithm lists, workspace sizes, forward, backward data/filter/bias), batch
normalization, pooling, activation, softmax and LRN. They take raw device pointers and
descriptors and know nothing about CuPy; neuron.kernels.cuda composes them."""
from __future__ import annotations

import ctypes

from .cudnn_api import (AlgoPerf, BWD_DATA_ALGO_NAMES, BWD_FILTER_ALGO_NAMES, BwdDataAlgoPerf,
    BwdFilterAlgoPerf, CUDNN_BATCHNORM_SPATIAL, CUDNN_LRN_CROSS_CHANNEL_DIM1,
    CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, FWD_ALGO_NAMES, FwdAlgoPerf, call,
    scalar)
from .cudnn_descriptors import Handle, TensorDescriptor, FilterDescriptor, ConvolutionDescriptor  # noqa: F401
# --------------------------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------------------------

_REQUEST = 16       # more than any *_ALGO_COUNT; cuDNN returns at most what exists

_GET_V7 = {"fwd": ("cudnnGetConvolutionForwardAlgorithm_v7", FwdAlgoPerf),
           "bwd_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", BwdDataAlgoPerf),
           "bwd_filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7", BwdFilterAlgoPerf)}
_FIND_EX = {"fwd": ("cudnnFindConvolutionForwardAlgorithmEx", FwdAlgoPerf),
            "bwd_data": ("cudnnFindConvolutionBackwardDataAlgorithmEx", BwdDataAlgoPerf),
            "bwd_filter": ("cudnnFindConvolutionBackwardFilterAlgorithmEx", BwdFilterAlgoPerf)}
ALGO_NAMES = {"fwd": FWD_ALGO_NAMES, "bwd_data": BWD_DATA_ALGO_NAMES,
              "bwd_filter": BWD_FILTER_ALGO_NAMES}


def _conv_operands(kind, x, w, y, conv):
    """Descriptor order of each kind's C prototype: (first, second, conv, third)."""
    if kind == "fwd":
        return x, w, conv, y        # xDesc, wDesc, convDesc, yDesc
    if kind == "bwd_data":
        return w, y, conv, x        # wDesc, dyDesc, convDesc, dxDesc
    if kind == "bwd_filter":
        return x, y, conv, w        # xDesc, dyDesc, convDesc, dwDesc
    raise ValueError(f"unknown convolution kind {kind!r}; expected fwd, bwd_data or bwd_filter")


def get_algorithms(handle: Handle, kind: str, x: TensorDescriptor, w: FilterDescriptor,
                   conv: ConvolutionDescriptor, y: TensorDescriptor) -> list[AlgoPerf]:
    """cudnnGet*Algorithm_v7: cuDNN's heuristic ranking (no execution), workspace per algo.

    ``x``/``y`` describe the input/output of the *forward* convolution for every kind (for
    backward, dy has y's descriptor and dx has x's)."""
    name, struct = _GET_V7[kind]
    perf = (struct * _REQUEST)()
    n = ctypes.c_int()
    a, b, c, d = _conv_operands(kind, x, w, y, conv)
    call(name, handle.ptr, a.ptr, b.ptr, c.ptr, d.ptr, _REQUEST, ctypes.byref(n), perf)
    return [AlgoPerf.from_struct(perf[i]) for i in range(n.value)]


def find_algorithms(handle: Handle, kind: str, x: TensorDescriptor, x_ptr: int,
                    w: FilterDescriptor, w_ptr: int, conv: ConvolutionDescriptor,
                    y: TensorDescriptor, y_ptr: int, ws_ptr: int, ws_bytes: int
                    ) -> list[AlgoPerf]:
    """cudnnFind*AlgorithmEx: runs every algorithm that fits ``ws_bytes`` on the given buffers
    (it WRITES the output operand: y for fwd, dx for bwd_data, dw for bwd_filter) and returns
    them sorted by measured time. Pointers follow the forward naming like get_algorithms:
    for bwd_data pass dx as x_ptr and dy as y_ptr; for bwd_filter dw as w_ptr and dy as y_ptr."""
    name, struct = _FIND_EX[kind]
    perf = (struct * _REQUEST)()
    n = ctypes.c_int()
    vp = ctypes.c_void_p
    if kind == "fwd":
        args = (x.ptr, vp(x_ptr), w.ptr, vp(w_ptr), conv.ptr, y.ptr, vp(y_ptr))
    elif kind == "bwd_data":
        args = (w.ptr, vp(w_ptr), y.ptr, vp(y_ptr), conv.ptr, x.ptr, vp(x_ptr))
    elif kind == "bwd_filter":
        args = (x.ptr, vp(x_ptr), y.ptr, vp(y_ptr), conv.ptr, w.ptr, vp(w_ptr))
    else:
        raise ValueError(f"unknown convolution kind {kind!r}")
    call(name, handle.ptr, *args, _REQUEST, ctypes.byref(n), perf, vp(ws_ptr or None),
         ctypes.c_size_t(ws_bytes))
    return [AlgoPerf.from_struct(perf[i]) for i in range(n.value)]


def workspace_size(handle: Handle, kind: str, x, w, conv, y, algo: int) -> int:
    name = {"fwd": "cudnnGetConvolutionForwardWorkspaceSize",
            "bwd_data": "cudnnGetConvolutionBackwardDataWorkspaceSize",
            "bwd_filter": "cudnnGetConvolutionBackwardFilterWorkspaceSize"}[kind]
    size = ctypes.c_size_t()
    a, b, c, d = _conv_operands(kind, x, w, y, conv)
    call(name, handle.ptr, a.ptr, b.ptr, c.ptr, d.ptr, int(algo), ctypes.byref(size))
    return int(size.value)


def convolution_forward(handle, x, x_ptr, w, w_ptr, conv, algo, ws_ptr, ws_bytes, y, y_ptr,
                        alpha=1.0, beta=0.0):
    vp = ctypes.c_void_p
    call("cudnnConvolutionForward", handle.ptr, ctypes.byref(scalar(alpha, y.dtype)), x.ptr,
         vp(x_ptr), w.ptr, vp(w_ptr), conv.ptr, int(algo), vp(ws_ptr or None),
         ctypes.c_size_t(ws_bytes), ctypes.byref(scalar(beta, y.dtype)), y.ptr, vp(y_ptr))


def convolution_backward_data(handle, w, w_ptr, dy, dy_ptr, conv, algo, ws_ptr, ws_bytes, dx,
                              dx_ptr, alpha=1.0, beta=0.0):
    vp = ctypes.c_void_p
    call("cudnnConvolutionBackwardData", handle.ptr, ctypes.byref(scalar(alpha, dx.dtype)),
         w.ptr, vp(w_ptr), dy.ptr, vp(dy_ptr), conv.ptr, int(algo), vp(ws_ptr or None),
         ctypes.c_size_t(ws_bytes), ctypes.byref(scalar(beta, dx.dtype)), dx.ptr, vp(dx_ptr))


def convolution_backward_filter(handle, x, x_ptr, dy, dy_ptr, conv, algo, ws_ptr, ws_bytes, dw,
                                dw_ptr, alpha=1.0, beta=0.0):
    vp = ctypes.c_void_p
    call("cudnnConvolutionBackwardFilter", handle.ptr, ctypes.byref(scalar(alpha, dw.dtype)),
         x.ptr, vp(x_ptr), dy.ptr, vp(dy_ptr), conv.ptr, int(algo), vp(ws_ptr or None),
         ctypes.c_size_t(ws_bytes), ctypes.byref(scalar(beta, dw.dtype)), dw.ptr, vp(dw_ptr))


def convolution_backward_bias(handle, dy, dy_ptr, db, db_ptr, alpha=1.0, beta=0.0):
    vp = ctypes.c_void_p
    call("cudnnConvolutionBackwardBias", handle.ptr, ctypes.byref(scalar(alpha, dy.dtype)),
         dy.ptr, vp(dy_ptr), ctypes.byref(scalar(beta, dy.dtype)), db.ptr, vp(db_ptr))


def add_tensor(handle, a, a_ptr, c, c_ptr, alpha=1.0, beta=1.0):
    """C = alpha*A + beta*C with A broadcast over C (conv bias: A is (1, K, 1, 1))."""
    vp = ctypes.c_void_p
    call("cudnnAddTensor", handle.ptr, ctypes.byref(scalar(alpha, c.dtype)), a.ptr, vp(a_ptr),
         ctypes.byref(scalar(beta, c.dtype)), c.ptr, vp(c_ptr))


# --------------------------------------------------------------------------------------------
# batch normalization (SPATIAL: statistics per channel over N, H, W; 2-D input goes as N,C,1,1)
# --------------------------------------------------------------------------------------------

def batchnorm_forward_training(handle, x, x_ptr, y, y_ptr, bn, scale_ptr, bias_ptr, factor,
                               running_mean_ptr, running_var_ptr, eps, save_mean_ptr,
                               save_invvar_ptr, mode=CUDNN_BATCHNORM_SPATIAL):
    """running = (1-factor)*running + factor*batch, with the UNBIASED batch variance for
    running_var (cuDNN's documented behaviour, the same as torch). Both running pointers 0 =
    no update (neuron's recompute). save_invvar receives 1/sqrt(biased var + eps)."""
    vp = ctypes.c_void_p
    call("cudnnBatchNormalizationForwardTraining", handle.ptr, int(mode),
         ctypes.byref(scalar(1.0, y.dtype)), ctypes.byref(scalar(0.0, y.dtype)),
         x.ptr, vp(x_ptr), y.ptr, vp(y_ptr), bn.ptr, vp(scale_ptr), vp(bias_ptr),
         ctypes.c_double(factor), vp(running_mean_ptr or None), vp(running_var_ptr or None),
         ctypes.c_double(eps), vp(save_mean_ptr or None), vp(save_invvar_ptr or None))


def batchnorm_forward_inference(handle, x, x_ptr, y, y_ptr, bn, scale_ptr, bias_ptr, mean_ptr,
                                var_ptr, eps, mode=CUDNN_BATCHNORM_SPATIAL):
    vp = ctypes.c_void_p
    call("cudnnBatchNormalizationForwardInference", handle.ptr, int(mode),
         ctypes.byref(scalar(1.0, y.dtype)), ctypes.byref(scalar(0.0, y.dtype)),
         x.ptr, vp(x_ptr), y.ptr, vp(y_ptr), bn.ptr, vp(scale_ptr), vp(bias_ptr),
         vp(mean_ptr), vp(var_ptr), ctypes.c_double(eps))


def batchnorm_backward(handle, x, x_ptr, dy, dy_ptr, dx, dx_ptr, bn, scale_ptr, dscale_ptr,
                       dbias_ptr, eps, save_mean_ptr, save_invvar_ptr,
                       mode=CUDNN_BATCHNORM_SPATIAL, beta_data=0.0):
    """Overwrites dscale, dbias; dx = result + beta_data*dx (1: accumulate into dx)."""
    vp = ctypes.c_void_p
    one, zero = scalar(1.0, dx.dtype), scalar(0.0, dx.dtype)
    bdata = scalar(beta_data, dx.dtype)
    call("cudnnBatchNormalizationBackward", handle.ptr, int(mode), ctypes.byref(one),
         ctypes.byref(bdata), ctypes.byref(one), ctypes.byref(zero), x.ptr, vp(x_ptr), dy.ptr,
         vp(dy_ptr), dx.ptr, vp(dx_ptr), bn.ptr, vp(scale_ptr), vp(dscale_ptr), vp(dbias_ptr),
         ctypes.c_double(eps), vp(save_mean_ptr or None), vp(save_invvar_ptr or None))


# --------------------------------------------------------------------------------------------
# pooling, activation, softmax, LRN
# --------------------------------------------------------------------------------------------

def pooling_forward(handle, pool, x, x_ptr, y, y_ptr):
    vp = ctypes.c_void_p
    call("cudnnPoolingForward", handle.ptr, pool.ptr, ctypes.byref(scalar(1.0, y.dtype)), x.ptr,
         vp(x_ptr), ctypes.byref(scalar(0.0, y.dtype)), y.ptr, vp(y_ptr))


def pooling_backward(handle, pool, y, y_ptr, dy, dy_ptr, x, x_ptr, dx, dx_ptr, beta=0.0):
    vp = ctypes.c_void_p
    call("cudnnPoolingBackward", handle.ptr, pool.ptr, ctypes.byref(scalar(1.0, dx.dtype)),
         y.ptr, vp(y_ptr), dy.ptr, vp(dy_ptr), x.ptr, vp(x_ptr),
         ctypes.byref(scalar(beta, dx.dtype)), dx.ptr, vp(dx_ptr))


def activation_forward(handle, act, x, x_ptr, y, y_ptr):
    vp = ctypes.c_void_p
    call("cudnnActivationForward", handle.ptr, act.ptr, ctypes.byref(scalar(1.0, y.dtype)),
         x.ptr, vp(x_ptr), ctypes.byref(scalar(0.0, y.dtype)), y.ptr, vp(y_ptr))


def activation_backward(handle, act, y, y_ptr, dy, dy_ptr, x, x_ptr, dx, dx_ptr, beta=0.0):
    vp = ctypes.c_void_p
    call("cudnnActivationBackward", handle.ptr, act.ptr, ctypes.byref(scalar(1.0, dx.dtype)),
         y.ptr, vp(y_ptr), dy.ptr, vp(dy_ptr), x.ptr, vp(x_ptr),
         ctypes.byref(scalar(beta, dx.dtype)), dx.ptr, vp(dx_ptr))


def softmax_forward(handle, x, x_ptr, y, y_ptr, algo=CUDNN_SOFTMAX_ACCURATE,
                    mode=CUDNN_SOFTMAX_MODE_INSTANCE):
    """MODE_INSTANCE on (N, K, 1, 1): a softmax over the K classes of each sample."""
    vp = ctypes.c_void_p
    call("cudnnSoftmaxForward", handle.ptr, int(algo), int(mode),
         ctypes.byref(scalar(1.0, y.dtype)), x.ptr, vp(x_ptr),
         ctypes.byref(scalar(0.0, y.dtype)), y.ptr, vp(y_ptr))


def lrn_forward(handle, lrn, x, x_ptr, y, y_ptr):
    vp = ctypes.c_void_p
    call("cudnnLRNCrossChannelForward", handle.ptr, lrn.ptr, CUDNN_LRN_CROSS_CHANNEL_DIM1,
         ctypes.byref(scalar(1.0, y.dtype)), x.ptr, vp(x_ptr),
         ctypes.byref(scalar(0.0, y.dtype)), y.ptr, vp(y_ptr))


def lrn_backward(handle, lrn, y, y_ptr, dy, dy_ptr, x, x_ptr, dx, dx_ptr, beta=0.0):
    vp = ctypes.c_void_p
    call("cudnnLRNCrossChannelBackward", handle.ptr, lrn.ptr, CUDNN_LRN_CROSS_CHANNEL_DIM1,
         ctypes.byref(scalar(1.0, dx.dtype)), y.ptr, vp(y_ptr), dy.ptr, vp(dy_ptr), x.ptr,
         vp(x_ptr), ctypes.byref(scalar(beta, dx.dtype)), dx.ptr, vp(dx_ptr))
