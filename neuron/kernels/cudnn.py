"""A ctypes binding to cuDNN 9's legacy API (``libcudnn.so.9``), loaded on first use.

Why ctypes: CuPy 14 dropped every cuDNN binding, cudnn-frontend drags in dependencies the project
does not allow, and a compiled extension would need a build per Python version. The legacy API is
deprecated since cuDNN 9.0 but still exported by the 9.x shim, and it is exactly what the memory
runtime needs: per-algorithm workspace bytes and measured times, and an explicit workspace pointer
on every call, so every byte cuDNN touches can come from neuron's own arena
(shared/reference/cuda-stack.md has the evidence).

Layers of this module, bottom up:

* library discovery (:func:`find_library`) and loading (:func:`lib`), lazy: ``import neuron`` and
  this module work on a machine without CUDA or cuDNN;
* enum values and struct layouts copied from the cuDNN 9.28 headers, plus :func:`check_headers`,
  which compiles a probe against the installed headers and compares them with what is here (the
  only way hand-copied constants stay honest);
* descriptor objects with a cache keyed by shape/parameters (creating descriptors costs a few
  ctypes calls; a training step would otherwise rebuild thousands of them);
* thin pointer-level wrappers for the operations neuron uses. They take raw device pointers and
  descriptors and know nothing about CuPy; :mod:`neuron.kernels.cuda` composes them.

Every call goes through :func:`call`, which raises :class:`CudnnError` with the function name and
cuDNN's own message.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

# --------------------------------------------------------------------------------------------
# constants from the cuDNN 9.28 headers (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h).
# check_headers() verifies every name below against the installed headers.
# --------------------------------------------------------------------------------------------

# cudnnStatus_t
CUDNN_STATUS_SUCCESS = 0
CUDNN_STATUS_NOT_INITIALIZED = 1001
CUDNN_STATUS_BAD_PARAM = 2000
CUDNN_STATUS_NOT_SUPPORTED = 3000
# cudnnDataType_t
CUDNN_DATA_FLOAT = 0
CUDNN_DATA_DOUBLE = 1
CUDNN_DATA_HALF = 2
CUDNN_DATA_INT8 = 3
CUDNN_DATA_INT32 = 4
CUDNN_DATA_UINT8 = 6
CUDNN_DATA_BFLOAT16 = 9
CUDNN_DATA_INT64 = 10
# cudnnMathType_t
CUDNN_DEFAULT_MATH = 0
CUDNN_TENSOR_OP_MATH = 1
CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2
CUDNN_FMA_MATH = 3
# cudnnNanPropagation_t
CUDNN_NOT_PROPAGATE_NAN = 0
CUDNN_PROPAGATE_NAN = 1
# cudnnTensorFormat_t
CUDNN_TENSOR_NCHW = 0
CUDNN_TENSOR_NHWC = 1
# cudnnConvolutionMode_t
CUDNN_CONVOLUTION = 0
CUDNN_CROSS_CORRELATION = 1
# cudnnDeterminism_t
CUDNN_NON_DETERMINISTIC = 0
CUDNN_DETERMINISTIC = 1
# cudnnConvolutionFwdAlgo_t
CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0
CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1
CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2
CUDNN_CONVOLUTION_FWD_ALGO_DIRECT = 3
CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4
CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5
CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6
CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7
CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8
# cudnnConvolutionBwdDataAlgo_t
CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0
CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1
CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT = 2
CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING = 3
CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD = 4
CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED = 5
CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6
# cudnnConvolutionBwdFilterAlgo_t
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT = 2
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 = 3
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD = 4
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED = 5
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING = 6
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7
# cudnnBatchNormMode_t
CUDNN_BATCHNORM_PER_ACTIVATION = 0
CUDNN_BATCHNORM_SPATIAL = 1
CUDNN_BATCHNORM_SPATIAL_PERSISTENT = 2
# cudnnPoolingMode_t
CUDNN_POOLING_MAX = 0
CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1
CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2
CUDNN_POOLING_MAX_DETERMINISTIC = 3
# cudnnActivationMode_t
CUDNN_ACTIVATION_SIGMOID = 0
CUDNN_ACTIVATION_RELU = 1
CUDNN_ACTIVATION_TANH = 2
CUDNN_ACTIVATION_CLIPPED_RELU = 3
CUDNN_ACTIVATION_ELU = 4
CUDNN_ACTIVATION_IDENTITY = 5
CUDNN_ACTIVATION_SWISH = 6
# cudnnSoftmaxAlgorithm_t / cudnnSoftmaxMode_t
CUDNN_SOFTMAX_FAST = 0
CUDNN_SOFTMAX_ACCURATE = 1
CUDNN_SOFTMAX_LOG = 2
CUDNN_SOFTMAX_MODE_INSTANCE = 0
CUDNN_SOFTMAX_MODE_CHANNEL = 1
# cudnnLRNMode_t
CUDNN_LRN_CROSS_CHANNEL_DIM1 = 0

#: every enum constant above, by its C name (what check_headers compares)
ENUMS: dict[str, int] = {k: v for k, v in dict(globals()).items()
                         if k.startswith("CUDNN_") and isinstance(v, int)}

# #define'd limits (cudnn_graph.h / cudnn_ops.h)
CUDNN_DIM_MAX = 8
CUDNN_BN_MIN_EPSILON = 0.0
CUDNN_LRN_MIN_N = 1
CUDNN_LRN_MAX_N = 16
CUDNN_LRN_MIN_K = 1e-5
CUDNN_LRN_MIN_BETA = 0.01
MACROS: dict[str, float] = {"CUDNN_DIM_MAX": CUDNN_DIM_MAX,
                            "CUDNN_BN_MIN_EPSILON": CUDNN_BN_MIN_EPSILON,
                            "CUDNN_LRN_MIN_N": CUDNN_LRN_MIN_N, "CUDNN_LRN_MAX_N": CUDNN_LRN_MAX_N,
                            "CUDNN_LRN_MIN_K": CUDNN_LRN_MIN_K,
                            "CUDNN_LRN_MIN_BETA": CUDNN_LRN_MIN_BETA}

_STATUS_NAMES = {0: "CUDNN_STATUS_SUCCESS", 1001: "CUDNN_STATUS_NOT_INITIALIZED",
                 2000: "CUDNN_STATUS_BAD_PARAM", 3000: "CUDNN_STATUS_NOT_SUPPORTED"}

FWD_ALGO_NAMES = {0: "IMPLICIT_GEMM", 1: "IMPLICIT_PRECOMP_GEMM", 2: "GEMM", 3: "DIRECT",
                  4: "FFT", 5: "FFT_TILING", 6: "WINOGRAD", 7: "WINOGRAD_NONFUSED"}
BWD_DATA_ALGO_NAMES = {0: "ALGO_0", 1: "ALGO_1", 2: "FFT", 3: "FFT_TILING", 4: "WINOGRAD",
                       5: "WINOGRAD_NONFUSED"}
BWD_FILTER_ALGO_NAMES = {0: "ALGO_0", 1: "ALGO_1", 2: "FFT", 3: "ALGO_3", 4: "WINOGRAD",
                         5: "WINOGRAD_NONFUSED", 6: "FFT_TILING"}


# --------------------------------------------------------------------------------------------
# structs
# --------------------------------------------------------------------------------------------

class _AlgoPerfStruct(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: identical layouts, 48 bytes.

    Enums are C ints (4 bytes) on every ABI cuDNN supports; ``memory`` is a size_t and so starts
    at 16 after 4 bytes of padding behind ``time``."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


class FwdAlgoPerf(_AlgoPerfStruct):
    pass


class BwdDataAlgoPerf(_AlgoPerfStruct):
    pass


class BwdFilterAlgoPerf(_AlgoPerfStruct):
    pass


#: C struct name -> (ctypes class, sizeof, {field: offsetof}) as documented in cudnn_cnn.h 9.28
STRUCT_LAYOUTS = {
    name: (cls, 48, {"algo": 0, "status": 4, "time": 8, "memory": 16, "determinism": 24,
                     "mathType": 28, "reserved": 32})
    for name, cls in (("cudnnConvolutionFwdAlgoPerf_t", FwdAlgoPerf),
                      ("cudnnConvolutionBwdDataAlgoPerf_t", BwdDataAlgoPerf),
                      ("cudnnConvolutionBwdFilterAlgoPerf_t", BwdFilterAlgoPerf))}


class AlgoPerf(NamedTuple):
    """One row of a Get..._v7 / Find...Ex answer, as plain Python values."""
    algo: int
    status: int
    time: float          # ms; measured by Find...Ex, meaningless (-1) from the heuristics
    memory: int          # workspace bytes
    determinism: int
    math_type: int

    @classmethod
    def from_struct(cls, s) -> "AlgoPerf":
        return cls(int(s.algo), int(s.status), float(s.time), int(s.memory),
                   int(s.determinism), int(s.mathType))


# --------------------------------------------------------------------------------------------
# function signatures. One letter per parameter: p pointer/handle/descriptor, i int or enum,
# u unsigned, z size_t, d double. check_headers() parses the headers and compares.
# --------------------------------------------------------------------------------------------

SIGNATURES: dict[str, str] = {
    "cudnnCreate": "p", "cudnnDestroy": "p", "cudnnSetStream": "pp", "cudnnGetStream": "pp",
    "cudnnCreateTensorDescriptor": "p", "cudnnSetTensorNdDescriptor": "piipp",
    "cudnnDestroyTensorDescriptor": "p",
    "cudnnCreateFilterDescriptor": "p", "cudnnSetFilterNdDescriptor": "piiip",
    "cudnnDestroyFilterDescriptor": "p",
    "cudnnCreateConvolutionDescriptor": "p", "cudnnSetConvolutionNdDescriptor": "pipppii",
    "cudnnSetConvolutionMathType": "pi", "cudnnSetConvolutionGroupCount": "pi",
    "cudnnDestroyConvolutionDescriptor": "p",
    "cudnnGetConvolutionNdForwardOutputDim": "pppip",
    "cudnnGetConvolutionForwardAlgorithm_v7": "pppppipp",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": "pppppipp",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": "pppppipp",
    "cudnnFindConvolutionForwardAlgorithmEx": "ppppppppipppz",
    "cudnnFindConvolutionBackwardDataAlgorithmEx": "ppppppppipppz",
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": "ppppppppipppz",
    "cudnnGetConvolutionForwardWorkspaceSize": "pppppip",
    "cudnnGetConvolutionBackwardDataWorkspaceSize": "pppppip",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": "pppppip",
    "cudnnConvolutionForward": "pppppppipzppp",
    "cudnnConvolutionBackwardData": "pppppppipzppp",
    "cudnnConvolutionBackwardFilter": "pppppppipzppp",
    "cudnnConvolutionBackwardBias": "ppppppp",
    "cudnnAddTensor": "ppppppp",
    "cudnnDeriveBNTensorDescriptor": "ppi",
    "cudnnBatchNormalizationForwardTraining": "pi" + "p" * 9 + "dppdpp",
    "cudnnBatchNormalizationForwardInference": "pi" + "p" * 11 + "d",
    "cudnnBatchNormalizationBackward": "pi" + "p" * 14 + "dpp",
    "cudnnCreatePoolingDescriptor": "p", "cudnnSetPooling2dDescriptor": "p" + "i" * 8,
    "cudnnDestroyPoolingDescriptor": "p",
    "cudnnPoolingForward": "p" * 8, "cudnnPoolingBackward": "p" * 12,
    "cudnnCreateActivationDescriptor": "p", "cudnnSetActivationDescriptor": "piid",
    "cudnnDestroyActivationDescriptor": "p",
    "cudnnActivationForward": "p" * 8, "cudnnActivationBackward": "p" * 12,
    "cudnnSoftmaxForward": "pii" + "p" * 6, "cudnnSoftmaxBackward": "pii" + "p" * 8,
    "cudnnCreateLRNDescriptor": "p", "cudnnSetLRNDescriptor": "puddd",
    "cudnnDestroyLRNDescriptor": "p",
    "cudnnLRNCrossChannelForward": "ppi" + "p" * 6, "cudnnLRNCrossChannelBackward": "ppi" + "p" * 10,
}

_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int, "u": ctypes.c_uint, "z": ctypes.c_size_t,
           "d": ctypes.c_double}

# Functions whose return value is not a cudnnStatus_t.
_OTHER_RESTYPES = {"cudnnGetVersion": (ctypes.c_size_t, []),
                   "cudnnGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
                   "cudnnGetLastErrorString": (None, [ctypes.c_char_p, ctypes.c_size_t])}


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------

class CudnnError(RuntimeError):
    """A cuDNN call returned a status other than CUDNN_STATUS_SUCCESS."""

    def __init__(self, status: int, function: str, message: str | None = None,
                 detail: str = ""):
        self.status = int(status)
        self.function = function
        self.message = message or _STATUS_NAMES.get(self.status, "unknown cuDNN status")
        self.detail = detail
        text = f"{function} failed: {self.message} (status {self.status})"
        if detail:
            text += f": {detail}"
        super().__init__(text)


class CudnnNotFoundError(ImportError):
    """libcudnn.so.9 could not be found or loaded; the message lists every place searched."""

    def __init__(self, searched: list[tuple[str, str]]):
        self.searched = searched
        lines = [f"  - {where}: {why}" for where, why in searched]
        super().__init__("cuDNN 9 (libcudnn.so.9) not found. Searched, in order:\n"
                         + "\n".join(lines)
                         + "\nInstall it with `pip install nvidia-cudnn-cu13` or point "
                           "CUDNN_PATH at a cuDNN 9 installation (a directory or the .so).")


# --------------------------------------------------------------------------------------------
# library discovery and loading
# --------------------------------------------------------------------------------------------

SONAME = "libcudnn.so.9"


def site_dirs() -> list[str]:
    """Every directory a pip wheel may have been installed into, without duplicates."""
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:          # some virtualenv flavours lack it
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    for key in ("purelib", "platlib"):
        try:
            dirs.append(sysconfig.get_path(key))
        except KeyError:
            pass
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    out = []
    for d in dirs:
        if d and d not in out:
            out.append(d)
    return out


def _pathfinder_load():
    from cuda import pathfinder          # arrives with cupy-cuda13x 14.x
    return pathfinder.load_nvidia_dynamic_lib("cudnn").abs_path


def candidate_paths(env=None, sites=None) -> list[tuple[str, str]]:
    """(how, path) pairs to try after cuda.pathfinder, in order: the nvidia-cudnn-cu13 wheel in
    every site directory, $CUDNN_PATH (a file, or a directory with the .so in it, lib/ or
    lib64/), then the system loader."""
    env = os.environ if env is None else env
    sites = site_dirs() if sites is None else sites
    out = []
    for d in sites:
        out.append(("nvidia-cudnn wheel", os.path.join(d, "nvidia", "cudnn", "lib", SONAME)))
    root = env.get("CUDNN_PATH")
    if root:
        if os.path.isdir(root):
            for sub in ("", "lib", "lib64"):
                out.append(("CUDNN_PATH", os.path.join(root, sub, SONAME)))
        else:
            out.append(("CUDNN_PATH", root))
    found = ctypes.util.find_library("cudnn")
    if found:
        out.append(("system (ctypes.util.find_library)", found))
    out.append(("system loader", SONAME))
    return out


def find_library(env=None, sites=None, loader=None, pathfinder=_pathfinder_load):
    """Load cuDNN from the first place that works; returns (CDLL, path).

    ``loader`` (default ctypes.CDLL) and ``pathfinder`` are parameters so the search order can be
    tested without cuDNN. Raises CudnnNotFoundError listing every place tried and why it failed.
    """
    loader = loader or ctypes.CDLL
    searched = []
    if pathfinder is not None:
        try:
            path = pathfinder()
            return loader(path), path
        except Exception as e:          # not installed, or its cuBLAS dependency is missing
            searched.append(("cuda.pathfinder.load_nvidia_dynamic_lib('cudnn')",
                             f"{type(e).__name__}: {e}".strip()))
    for how, path in candidate_paths(env, sites):
        is_name = os.sep not in path
        if not is_name and not os.path.exists(path):
            searched.append((f"{how} {path}", "no such file"))
            continue
        try:
            return loader(path), path
        except OSError as e:
            searched.append((f"{how} {path}", f"failed to load: {e}"))
    raise CudnnNotFoundError(searched)


_lib = None
_lib_path = None
_lib_lock = threading.Lock()
_funcs: dict[str, object] = {}


def _declare(cdll) -> None:
    for name, sig in SIGNATURES.items():
        f = getattr(cdll, name)
        f.restype = ctypes.c_int
        f.argtypes = [_CTYPES[c] for c in sig]
        _funcs[name] = f
    for name, (res, args) in _OTHER_RESTYPES.items():
        f = getattr(cdll, name)
        f.restype, f.argtypes = res, args
        _funcs[name] = f


def lib():
    """The loaded library (found and declared on first use)."""
    global _lib, _lib_path
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                cdll, path = find_library()
                _declare(cdll)
                _lib_path, _lib = path, cdll
    return _lib


def library_path() -> str:
    lib()
    return _lib_path


def available() -> bool:
    try:
        lib()
        return True
    except Exception:
        return False


def version() -> int:
    """cudnnGetVersion(), e.g. 92800 for 9.28.0."""
    lib()
    return int(_funcs["cudnnGetVersion"]())


def error_string(status: int) -> str:
    lib()
    s = _funcs["cudnnGetErrorString"](int(status))
    return s.decode() if s else f"status {status}"


def _last_error() -> str:
    buf = ctypes.create_string_buffer(1024)
    try:
        _funcs["cudnnGetLastErrorString"](buf, ctypes.sizeof(buf))
    except Exception:
        return ""
    return buf.value.decode(errors="replace").strip()


def call(name: str, *args) -> None:
    """Call a status-returning cuDNN function; CudnnError on failure."""
    if _lib is None:
        lib()
    status = _funcs[name](*args)
    if status != CUDNN_STATUS_SUCCESS:
        raise CudnnError(status, name, error_string(status), _last_error())


# --------------------------------------------------------------------------------------------
# dtype helpers
# --------------------------------------------------------------------------------------------

_DTYPES = {np.dtype(np.float32): CUDNN_DATA_FLOAT, np.dtype(np.float64): CUDNN_DATA_DOUBLE,
           np.dtype(np.float16): CUDNN_DATA_HALF, np.dtype(np.int8): CUDNN_DATA_INT8,
           np.dtype(np.int32): CUDNN_DATA_INT32, np.dtype(np.uint8): CUDNN_DATA_UINT8,
           np.dtype(np.int64): CUDNN_DATA_INT64}


def data_type(dtype) -> int:
    try:
        return _DTYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"cuDNN has no data type for {np.dtype(dtype)}") from None


def compute_type(dtype) -> int:
    """Accumulation type: double for double tensors, float for everything narrower."""
    return CUDNN_DATA_DOUBLE if np.dtype(dtype) == np.float64 else CUDNN_DATA_FLOAT


def scalar(value: float, dtype):
    """alpha/beta are host scalars of the compute type: double for double data, else float."""
    return (ctypes.c_double if np.dtype(dtype) == np.float64 else ctypes.c_float)(value)


def as_4d(shape, strides_bytes, itemsize) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(dims, element strides) padded to 4-D with trailing 1s: cuDNN's legacy ops want 4-D
    tensors, so (N, C) becomes (N, C, 1, 1). Strides of size-1 dims are made consistent with
    a packed layout because some cuDNN checks compare them even though they are never used."""
    shape = tuple(int(s) for s in shape)
    if strides_bytes is None:
        strides = []
        acc = 1
        for s in reversed(shape):
            strides.insert(0, acc)
            acc *= max(s, 1)
    else:
        strides = []
        for s in strides_bytes:
            if s % itemsize:
                raise ValueError(f"stride {s} is not a multiple of the item size {itemsize}")
            strides.append(s // itemsize)
    if not 1 <= len(shape) <= 4:
        raise ValueError(f"cuDNN legacy ops take 1-D to 4-D tensors, got shape {shape}")
    dims = list(shape) + [1] * (4 - len(shape))
    strides = list(strides) + [1] * (4 - len(strides))
    for i in range(3, -1, -1):
        if dims[i] == 1:
            strides[i] = strides[i + 1] * dims[i + 1] if i < 3 else 1
    return tuple(dims), tuple(strides)


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
        ptr = getattr(self, "ptr", None)
        if ptr is not None and ptr.value and _lib is not None:
            try:
                _funcs[self._destroy](ptr)
            except Exception:       # interpreter shutdown: nothing sensible left to do
                pass
            self.ptr = None


class TensorDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, dims, strides, dtype):
        super().__init__()
        self.dims, self.strides, self.dtype = tuple(dims), tuple(strides), np.dtype(dtype)
        call("cudnnSetTensorNdDescriptor", self.ptr, data_type(dtype), len(dims), _ints(dims),
             _ints(strides))


class FilterDescriptor(_Descriptor):
    _create, _destroy = "cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor"

    def __init__(self, shape, dtype):
        super().__init__()
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        call("cudnnSetFilterNdDescriptor", self.ptr, data_type(dtype), CUDNN_TENSOR_NCHW,
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


def tensor_descriptor(shape, dtype, strides_bytes=None) -> TensorDescriptor:
    """A 4-D tensor descriptor for an array of this shape/strides (bytes, as numpy/cupy give)."""
    key = tensor_key(shape, strides_bytes, dtype)
    return _cache.get(key, lambda: TensorDescriptor(key[1], key[2], dtype))


def tensor_descriptor_for(a) -> TensorDescriptor:
    """Descriptor of any array with .shape/.strides/.dtype (cupy or numpy)."""
    return tensor_descriptor(a.shape, a.dtype, a.strides)


def bias_descriptor(channels, dtype) -> TensorDescriptor:
    """(1, C, 1, 1): per-channel tensors (conv bias, BN scale/bias/statistics)."""
    return tensor_descriptor((1, int(channels), 1, 1), dtype)


def filter_key(shape, dtype):
    return ("filter", tuple(int(s) for s in shape), np.dtype(dtype).str)


def filter_descriptor(shape, dtype) -> FilterDescriptor:
    return _cache.get(filter_key(shape, dtype), lambda: FilterDescriptor(shape, dtype))


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
                       mode=CUDNN_BATCHNORM_SPATIAL):
    """Overwrites dx, dscale, dbias (alpha 1, beta 0 for both data and parameter gradients)."""
    vp = ctypes.c_void_p
    one, zero = scalar(1.0, dx.dtype), scalar(0.0, dx.dtype)
    call("cudnnBatchNormalizationBackward", handle.ptr, int(mode), ctypes.byref(one),
         ctypes.byref(zero), ctypes.byref(one), ctypes.byref(zero), x.ptr, vp(x_ptr), dy.ptr,
         vp(dy_ptr), dx.ptr, vp(dx_ptr), bn.ptr, vp(scale_ptr), vp(dscale_ptr), vp(dbias_ptr),
         ctypes.c_double(eps), vp(save_mean_ptr or None), vp(save_invvar_ptr or None))


# --------------------------------------------------------------------------------------------
# pooling, activation, softmax, LRN
# --------------------------------------------------------------------------------------------

def pooling_forward(handle, pool, x, x_ptr, y, y_ptr):
    vp = ctypes.c_void_p
    call("cudnnPoolingForward", handle.ptr, pool.ptr, ctypes.byref(scalar(1.0, y.dtype)), x.ptr,
         vp(x_ptr), ctypes.byref(scalar(0.0, y.dtype)), y.ptr, vp(y_ptr))


def pooling_backward(handle, pool, y, y_ptr, dy, dy_ptr, x, x_ptr, dx, dx_ptr):
    vp = ctypes.c_void_p
    call("cudnnPoolingBackward", handle.ptr, pool.ptr, ctypes.byref(scalar(1.0, dx.dtype)),
         y.ptr, vp(y_ptr), dy.ptr, vp(dy_ptr), x.ptr, vp(x_ptr),
         ctypes.byref(scalar(0.0, dx.dtype)), dx.ptr, vp(dx_ptr))


def activation_forward(handle, act, x, x_ptr, y, y_ptr):
    vp = ctypes.c_void_p
    call("cudnnActivationForward", handle.ptr, act.ptr, ctypes.byref(scalar(1.0, y.dtype)),
         x.ptr, vp(x_ptr), ctypes.byref(scalar(0.0, y.dtype)), y.ptr, vp(y_ptr))


def activation_backward(handle, act, y, y_ptr, dy, dy_ptr, x, x_ptr, dx, dx_ptr):
    vp = ctypes.c_void_p
    call("cudnnActivationBackward", handle.ptr, act.ptr, ctypes.byref(scalar(1.0, dx.dtype)),
         y.ptr, vp(y_ptr), dy.ptr, vp(dy_ptr), x.ptr, vp(x_ptr),
         ctypes.byref(scalar(0.0, dx.dtype)), dx.ptr, vp(dx_ptr))


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


def lrn_backward(handle, lrn, y, y_ptr, dy, dy_ptr, x, x_ptr, dx, dx_ptr):
    vp = ctypes.c_void_p
    call("cudnnLRNCrossChannelBackward", handle.ptr, lrn.ptr, CUDNN_LRN_CROSS_CHANNEL_DIM1,
         ctypes.byref(scalar(1.0, dx.dtype)), y.ptr, vp(y_ptr), dy.ptr, vp(dy_ptr), x.ptr,
         vp(x_ptr), ctypes.byref(scalar(0.0, dx.dtype)), dx.ptr, vp(dx_ptr))


# --------------------------------------------------------------------------------------------
# checking the hand-copied constants against the installed headers
# --------------------------------------------------------------------------------------------

_STUB_CUDA_HEADERS = {
    # cudnn_graph.h only needs these three names from the CUDA toolkit; none of them affects a
    # layout or value checked here, so stubs let the check run with just the cuDNN wheel.
    "cuda_runtime_api.h": "typedef struct CUstream_st *cudaStream_t;\n"
                          "typedef struct CUgraph_st *cudaGraph_t;\n",
    "library_types.h": "typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, "
                       "PATCH_LEVEL } libraryPropertyType;\n",
}


def find_include_dir(env=None, sites=None) -> str | None:
    """Directory holding cudnn.h: cuda.pathfinder, the wheel, $CUDNN_PATH, /usr/include."""
    env = os.environ if env is None else env
    try:
        from cuda import pathfinder
        d = pathfinder.find_nvidia_header_directory("cudnn")
        if d and os.path.exists(os.path.join(d, "cudnn.h")):
            return d
    except Exception:
        pass
    cands = [os.path.join(d, "nvidia", "cudnn", "include") for d in
             (site_dirs() if sites is None else sites)]
    if env.get("CUDNN_PATH"):
        cands.append(os.path.join(env["CUDNN_PATH"], "include"))
    cands += ["/usr/include", "/usr/local/cuda/include"]
    for d in cands:
        if os.path.exists(os.path.join(d, "cudnn_graph.h")):
            return d
    return None


def _cuda_include_dirs(env=None, sites=None) -> list[str]:
    env = os.environ if env is None else env
    cands = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if env.get(var):
            cands.append(os.path.join(env[var], "include"))
    cands.append("/usr/local/cuda/include")
    for d in (site_dirs() if sites is None else sites):
        cands += glob.glob(os.path.join(d, "nvidia", "cu1*", "include"))
        cands.append(os.path.join(d, "nvidia", "cuda_runtime", "include"))
    return [d for d in cands if os.path.exists(os.path.join(d, "cuda_runtime_api.h"))]


def probe_source() -> str:
    """C source printing, one per line, `name value` for every enum, macro and struct
    size/offset this module hard-codes."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "cudnn_graph.h"',
             '#include "cudnn_ops.h"', '#include "cudnn_cnn.h"', "int main(void) {"]
    for name in ENUMS:
        lines.append(f'  printf("{name} %d\\n", (int){name});')
    for name in MACROS:
        lines.append(f'  printf("{name} %.17g\\n", (double)({name}));')
    for cname, (_, _, fields) in STRUCT_LAYOUTS.items():
        lines.append(f'  printf("sizeof({cname}) %d\\n", (int)sizeof({cname}));')
        for f in fields:
            lines.append(f'  printf("offsetof({cname},{f}) %d\\n", (int)offsetof({cname}, {f}));')
    lines.append('  printf("sizeof(enum) %d\\n", (int)sizeof(cudnnDataType_t));')
    lines.append("  return 0;\n}")
    return "\n".join(lines) + "\n"


def expected_probe_values() -> dict[str, float]:
    """What probe_source() must print if this module is right."""
    exp: dict[str, float] = dict(ENUMS)
    exp.update(MACROS)
    for cname, (cls, size, fields) in STRUCT_LAYOUTS.items():
        exp[f"sizeof({cname})"] = size
        for f, off in fields.items():
            exp[f"offsetof({cname},{f})"] = off
    exp["sizeof(enum)"] = ctypes.sizeof(ctypes.c_int)
    return exp


_PARAM_RE = re.compile(r"\b(cudnn\w+)\s*\(([^;{]*?)\)\s*;", re.S)
_POINTER_TYPES = re.compile(r"(\*|\[\s*\]|cudnnHandle_t|Descriptor_t|cudaStream_t)")


def _param_code(param: str) -> str:
    p = re.sub(r"/\*.*?\*/", " ", param).strip()
    if _POINTER_TYPES.search(p):
        return "p"
    words = p.replace("const", " ").split()
    base = words[0] if words else ""
    if base == "double":
        return "d"
    if base == "size_t":
        return "z"
    if base == "unsigned":
        return "u"
    return "i"          # int and every enum typedef


def parse_prototypes(header_text: str) -> dict[str, str]:
    """name -> signature code (see SIGNATURES) for every cudnn* prototype in the text."""
    text = re.sub(r"//[^\n]*", " ", header_text)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = {}
    for m in _PARAM_RE.finditer(text):
        name, params = m.group(1), m.group(2).strip()
        if params in ("", "void"):
            out[name] = ""
        else:
            out[name] = "".join(_param_code(p) for p in params.split(","))
    return out


def check_headers(include_dir: str | None = None, cc: str | None = None) -> list[str]:
    """Compile a probe against the installed cuDNN headers and compare every hard-coded enum,
    macro, struct size/offset and function signature of this module with them.

    Returns a list of mismatches (empty = all agree). Raises FileNotFoundError when the headers
    or a C compiler are missing, RuntimeError when the probe does not compile."""
    include_dir = include_dir or find_include_dir()
    if include_dir is None:
        raise FileNotFoundError("cuDNN headers (cudnn_graph.h) not found")
    cc = cc or shutil.which("gcc") or shutil.which("cc") or shutil.which("g++")
    if cc is None:
        raise FileNotFoundError("no C compiler (gcc/cc/g++) on PATH")
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        inc = ["-I", include_dir]
        cuda_dirs = _cuda_include_dirs()
        if cuda_dirs:
            inc += ["-I", cuda_dirs[0]]
        else:
            for name, text in _STUB_CUDA_HEADERS.items():
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)
            inc += ["-I", tmp]
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(probe_source())
        lang = ["-x", "c"] if os.path.basename(cc).startswith(("g++", "c++", "clang++")) else []
        r = subprocess.run([cc, *lang, src, *inc, "-o", exe], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"probe did not compile with {cc}:\n{r.stderr[-4000:]}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        key, _, val = line.rpartition(" ")
        got[key] = float(val)
    for key, want in expected_probe_values().items():
        if key not in got:
            problems.append(f"{key}: not printed by the probe")
        elif got[key] != want:
            problems.append(f"{key}: header says {got[key]:g}, neuron has {want:g}")
    text = ""
    for h in ("cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h"):
        with open(os.path.join(include_dir, h)) as f:
            text += f.read()
    protos = parse_prototypes(text)
    for name, sig in SIGNATURES.items():
        if name not in protos:
            problems.append(f"{name}: no prototype in the headers")
        elif protos[name] != sig:
            problems.append(f"{name}: header signature {protos[name]!r}, neuron declares {sig!r}")
    return problems
