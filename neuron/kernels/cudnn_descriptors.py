"""cuDNN descriptors (tensor, filter, convolution, pooling, activation, LRN) with a cache keyed by
shape and parameters, and the per-(device, thread) handles. Creating a descriptor costs a few
ctypes calls; a training step would otherwise rebuild thousands of them."""
from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

import numpy as np

from .cudnn_api import (CUDNN_CROSS_CORRELATION, CUDNN_PROPAGATE_NAN, CUDNN_TENSOR_NCHW, as_4d,
    call, compute_type, data_type)
from . import cudnn_api as _api
# --------------------------------------------------------------------------------------------
# descriptors
# --------------------------------------------------------------------------------------------

def _ints(seq):
    return (ctypes.c_int * len(seq))(*[int(v) for v in seq])


class _Descriptor:
    """Owns one cuDNN descriptor; destroyed with the object."""
    _create = _destroy = ""

    def __init__(self):
        self.ptr = ctypes.c_void_p()
        call(self._create, ctypes.byref(self.ptr))

    @property
    def value(self) -> int:
        return self.ptr.value

    def __del__(self):
        # at interpreter shutdown the module globals (_api included) may already be None:
        # nothing sensible is left to do then
        try:
            ptr = getattr(self, "ptr", None)
            if ptr is not None and ptr.value and _api._lib is not None:
                _api._funcs[self._destroy](ptr)
            self.ptr = None
        except Exception:           # noqa: BLE001
            pass


class TensorDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, dims, strides, dtype):
        super().__init__()
        self.dims, self.strides, self.dtype = tuple(dims), tuple(strides), np.dtype(dtype)
        call("cudnnSetTensorNdDescriptor", self.ptr, data_type(dtype), len(dims), _ints(dims),
             _ints(strides))


class FilterDescriptor(_Descriptor):
    """A filter of logical shape (K, C, R, S), stored K, C, R, S (``fmt`` CUDNN_TENSOR_NCHW) or
    K, R, S, C (CUDNN_TENSOR_NHWC: the weights of --layout nhwc, memory/layout.py)."""
    _create, _destroy = "cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor"

    def __init__(self, shape, dtype, fmt=CUDNN_TENSOR_NCHW):
        super().__init__()
        self.shape, self.dtype, self.fmt = tuple(shape), np.dtype(dtype), int(fmt)
        call("cudnnSetFilterNdDescriptor", self.ptr, data_type(dtype), self.fmt,
             len(shape), _ints(shape))


class ConvolutionDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor"

    def __init__(self, padding, stride, dilation, groups, dtype):
        super().__init__()
        call("cudnnSetConvolutionNdDescriptor", self.ptr, len(padding), _ints(padding),
             _ints(stride), _ints(dilation), CUDNN_CROSS_CORRELATION, compute_type(dtype))
        if groups != 1:
            call("cudnnSetConvolutionGroupCount", self.ptr, int(groups))
        self.math_type = None

    def set_math_type(self, math_type: int) -> None:
        # the chosen algorithm's math type must be set before running it (CuPy 13 did the same)
        if math_type != self.math_type:
            call("cudnnSetConvolutionMathType", self.ptr, int(math_type))
            self.math_type = math_type


class PoolingDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor"

    def __init__(self, mode, window, padding, stride, nan=CUDNN_PROPAGATE_NAN):
        super().__init__()
        call("cudnnSetPooling2dDescriptor", self.ptr, int(mode), int(nan), int(window[0]),
             int(window[1]), int(padding[0]), int(padding[1]), int(stride[0]), int(stride[1]))


class ActivationDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateActivationDescriptor", "cudnnDestroyActivationDescriptor"

    def __init__(self, mode, nan=CUDNN_PROPAGATE_NAN, coef=0.0):
        super().__init__()
        call("cudnnSetActivationDescriptor", self.ptr, int(mode), int(nan), float(coef))


class LRNDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor"

    def __init__(self, n, alpha, beta, k):
        super().__init__()
        call("cudnnSetLRNDescriptor", self.ptr, int(n), float(alpha), float(beta), float(k))


class DescriptorCache:
    """LRU map from a hashable key to a descriptor built on a miss.

    Keys are plain tuples (kind, shape, strides, dtype, parameters), so two layers of the same
    geometry share descriptors and a training step builds none after the first iteration."""

    def __init__(self, capacity: int = 4096):
        self.capacity = int(capacity)
        self._items: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key, build):
        try:
            d = self._items[key]
            self._items.move_to_end(key)
            self.hits += 1
            return d
        except KeyError:
            pass
        self.misses += 1
        d = build()
        self._items[key] = d
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return d

    def __len__(self):
        return len(self._items)

    def __contains__(self, key):
        return key in self._items

    def clear(self):
        self._items.clear()


_cache = DescriptorCache()


def tensor_key(shape, strides_bytes, dtype):
    dtype = np.dtype(dtype)
    dims, strides = as_4d(shape, strides_bytes, dtype.itemsize)
    return ("tensor", dims, strides, dtype.str)


_by_layout: dict = {}       # (shape, strides, dtype) as the caller has them -> descriptor


def tensor_descriptor(shape, dtype, strides_bytes=None) -> TensorDescriptor:
    """A 4-D tensor descriptor for an array of this shape/strides (bytes, as numpy/cupy give)."""
    raw = (shape, strides_bytes, dtype)
    try:
        return _by_layout[raw]      # the per-call path: no 4-D normalization, no LRU update
    except (KeyError, TypeError):   # TypeError: an unhashable shape (a list)
        pass
    key = tensor_key(shape, strides_bytes, dtype)
    d = _cache.get(key, lambda: TensorDescriptor(key[1], key[2], dtype))
    if isinstance(shape, tuple) and (strides_bytes is None or isinstance(strides_bytes, tuple)):
        if len(_by_layout) >= _cache.capacity:
            _by_layout.clear()
        _by_layout[raw] = d
    return d


def tensor_descriptor_for(a) -> TensorDescriptor:
    """Descriptor of any array with .shape/.strides/.dtype (cupy or numpy)."""
    return tensor_descriptor(a.shape, a.dtype, a.strides)


def bias_descriptor(channels, dtype) -> TensorDescriptor:
    """(1, C, 1, 1): per-channel tensors (conv bias, BN scale/bias/statistics)."""
    return tensor_descriptor((1, int(channels), 1, 1), dtype)


def filter_key(shape, dtype, fmt=CUDNN_TENSOR_NCHW):
    key = ("filter", tuple(int(s) for s in shape), np.dtype(dtype).str)
    return key if fmt == CUDNN_TENSOR_NCHW else key + (int(fmt),)


def filter_descriptor(shape, dtype, fmt=CUDNN_TENSOR_NCHW) -> FilterDescriptor:
    """``fmt``: CUDNN_TENSOR_NCHW (weights stored K, C, R, S) or CUDNN_TENSOR_NHWC (K, R, S,
    C); the shape is the logical (K, C, R, S) in both."""
    return _cache.get(filter_key(shape, dtype, fmt), lambda: FilterDescriptor(shape, dtype, fmt))


def _tuple2(v) -> tuple[int, int]:
    """An int or a pair -> a pair of ints (the layers' convention)."""
    if isinstance(v, (tuple, list)):
        return tuple(int(a) for a in v)
    return int(v), int(v)


def conv_key(padding, stride, dilation, groups, dtype):
    return ("conv", _tuple2(padding), _tuple2(stride), _tuple2(dilation), int(groups),
            np.dtype(dtype).str)


def convolution_descriptor(padding, stride, dilation, groups, dtype) -> ConvolutionDescriptor:
    key = conv_key(padding, stride, dilation, groups, dtype)
    return _cache.get(key, lambda: ConvolutionDescriptor(*key[1:4], groups, dtype))


def pooling_key(mode, window, padding, stride, nan=CUDNN_PROPAGATE_NAN):
    return ("pool", int(mode), _tuple2(window), _tuple2(padding), _tuple2(stride), int(nan))


def pooling_descriptor(mode, window, padding, stride, nan=CUDNN_PROPAGATE_NAN):
    key = pooling_key(mode, window, padding, stride, nan)
    return _cache.get(key, lambda: PoolingDescriptor(mode, key[2], key[3], key[4], nan))


def activation_key(mode, nan=CUDNN_PROPAGATE_NAN, coef=0.0):
    return ("act", int(mode), int(nan), float(coef))


def activation_descriptor(mode, nan=CUDNN_PROPAGATE_NAN, coef=0.0):
    return _cache.get(activation_key(mode, nan, coef),
                      lambda: ActivationDescriptor(mode, nan, coef))


def lrn_key(n, alpha, beta, k):
    return ("lrn", int(n), float(alpha), float(beta), float(k))


def lrn_descriptor(n, alpha, beta, k):
    return _cache.get(lrn_key(n, alpha, beta, k), lambda: LRNDescriptor(n, alpha, beta, k))


def descriptor_cache() -> DescriptorCache:
    return _cache


def conv_output_dims(conv: ConvolutionDescriptor, x: TensorDescriptor,
                     w: FilterDescriptor) -> tuple[int, ...]:
    out = (ctypes.c_int * 4)()
    call("cudnnGetConvolutionNdForwardOutputDim", conv.ptr, x.ptr, w.ptr, 4, out)
    return tuple(out)


# --------------------------------------------------------------------------------------------
# handles: one per (device, thread), bound to whatever CuPy stream is current
# --------------------------------------------------------------------------------------------

class Handle:
    """A cudnnHandle_t. cuDNN handles are not thread-safe, so keep one per thread."""

    def __init__(self, stream_ptr: int = 0):
        self.ptr = ctypes.c_void_p()
        call("cudnnCreate", ctypes.byref(self.ptr))
        self.stream_ptr = None
        self.set_stream(stream_ptr)

    def set_stream(self, stream_ptr: int) -> None:
        if stream_ptr != self.stream_ptr:
            call("cudnnSetStream", self.ptr, ctypes.c_void_p(stream_ptr or None))
            self.stream_ptr = stream_ptr

    def destroy(self) -> None:
        if self.ptr is not None and self.ptr.value:
            call("cudnnDestroy", self.ptr)
            self.ptr = None


_handles = threading.local()


def get_handle(device_id: int | None = None, stream_ptr: int | None = None) -> Handle:
    """The calling thread's handle for ``device_id`` (default: CuPy's current device), bound to
    ``stream_ptr`` (default: CuPy's current stream). Rebinding costs one call, only on change."""
    import cupy
    if device_id is None:
        device_id = cupy.cuda.runtime.getDevice()
    if stream_ptr is None:
        stream_ptr = cupy.cuda.get_current_stream().ptr
    table = getattr(_handles, "table", None)
    if table is None:
        table = _handles.table = {}
    h = table.get(device_id)
    if h is None:
        with cupy.cuda.Device(device_id):
            h = table[device_id] = Handle(stream_ptr)
    else:
        h.set_stream(stream_ptr)
    return h
