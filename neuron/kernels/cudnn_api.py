"""cuDNN 9's legacy API through ctypes: constants, struct layouts, prototypes, errors, loading.

The bottom layer of the binding (see neuron.kernels.cudnn for the whole picture): enum values and
struct layouts copied from the cuDNN 9.28 headers (neuron.kernels.cudnn_headers checks them against
the installed headers), one signature string per function, the library search and lazy load,
:func:`call` (every status-returning call goes through it and raises :class:`CudnnError` with
cuDNN's own message), and the dtype helpers. Importing it needs neither CUDA nor cuDNN.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import site
import sys
import sysconfig
import threading
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

# cudnn_graph.h's backend (graph) API: neuron.kernels.cudnn_engines runs convolutions on the
# engines it lists (cudnnBackendDescriptorType_t, cudnnBackendAttributeName_t,
# cudnnBackendAttributeType_t, cudnnBackendHeurMode_t, and the engines' notes)
CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR = 1
CUDNN_BACKEND_ENGINE_DESCRIPTOR = 2
CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3
CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4
CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5
CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10
CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11
CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12
CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15
CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16
CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17
CUDNN_ATTR_CONVOLUTION_COMP_TYPE = 100
CUDNN_ATTR_CONVOLUTION_CONV_MODE = 101
CUDNN_ATTR_CONVOLUTION_DILATIONS = 102
CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES = 103
CUDNN_ATTR_CONVOLUTION_POST_PADDINGS = 104
CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS = 105
CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS = 106
CUDNN_ATTR_ENGINEHEUR_MODE = 200
CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201
CUDNN_ATTR_ENGINEHEUR_RESULTS = 202
CUDNN_ATTR_ENGINECFG_ENGINE = 300
CUDNN_ATTR_EXECUTION_PLAN_HANDLE = 400
CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401
CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA = 701
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W = 703
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X = 704
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y = 705
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W = 709
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX = 710
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY = 711
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X = 716
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY = 717
CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800
CUDNN_ATTR_OPERATIONGRAPH_OPS = 801
CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900
CUDNN_ATTR_TENSOR_DATA_TYPE = 901
CUDNN_ATTR_TENSOR_DIMENSIONS = 902
CUDNN_ATTR_TENSOR_STRIDES = 903
CUDNN_ATTR_TENSOR_UNIQUE_ID = 906
CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000
CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001
CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003
CUDNN_ATTR_ENGINE_GLOBAL_INDEX = 1301
CUDNN_ATTR_ENGINE_NUMERICAL_NOTE = 1303
CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE = 1305
CUDNN_TYPE_HANDLE = 0
CUDNN_TYPE_DATA_TYPE = 1
CUDNN_TYPE_INT64 = 3
CUDNN_TYPE_FLOAT = 4
CUDNN_TYPE_DOUBLE = 5
CUDNN_TYPE_VOID_PTR = 6
CUDNN_TYPE_CONVOLUTION_MODE = 7
CUDNN_TYPE_HEUR_MODE = 8
CUDNN_TYPE_NUMERICAL_NOTE = 11
CUDNN_TYPE_BACKEND_DESCRIPTOR = 15
CUDNN_TYPE_BEHAVIOR_NOTE = 19
CUDNN_HEUR_MODE_INSTANT = 0
CUDNN_HEUR_MODE_B = 1
CUDNN_HEUR_MODE_FALLBACK = 2
CUDNN_HEUR_MODE_A = 3
CUDNN_NUMERICAL_NOTE_TENSOR_CORE = 0
CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS = 1
CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION = 2
CUDNN_NUMERICAL_NOTE_FFT = 3
CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC = 4
CUDNN_NUMERICAL_NOTE_WINOGRAD = 5
CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION = 0

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
# u unsigned, z size_t, l int64_t, d double. check_headers() parses the headers and compares.
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
    # the backend API (cudnn_engines.py)
    "cudnnBackendCreateDescriptor": "ip", "cudnnBackendDestroyDescriptor": "p",
    "cudnnBackendFinalize": "p", "cudnnBackendSetAttribute": "piilp",
    "cudnnBackendGetAttribute": "piilpp", "cudnnBackendExecute": "ppp",
}

_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int, "u": ctypes.c_uint, "z": ctypes.c_size_t,
           "l": ctypes.c_int64, "d": ctypes.c_double}

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
        if np.dtype(dtype).name == "bfloat16":     # ml_dtypes' (an optional package)
            return CUDNN_DATA_BFLOAT16
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
