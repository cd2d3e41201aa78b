"""Matrix products through cuBLAS called directly (ctypes), on a handle of neuron's own.

CuPy refuses every cuBLAS call while a stream is being captured (its setStream raises
NotImplementedError), though cuBLAS itself supports capture; the linear layers' products go
through here so that a CUDA graph (devices/cuda_graph.py) can hold them. The handle has a fixed
workspace outside the arena (at a new stream cuBLAS would take one from its own pool, which a
capture forbids), follows the current stream, and uses TF32 where CuPy would (CUPY_TF32).

``gemm_args`` maps a row-major product onto cuBLAS's column-major one; it is pure, so the
CPU tests check it against NumPy (tests/kernels/test_cublas.py).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import numpy as np

OP_N, OP_T = 0, 1
DEFAULT_MATH, TF32_TENSOR_OP_MATH = 0, 3
WORKSPACE_BYTES = 32 << 20          # NVIDIA's recommendation for Hopper

_GEMM = {np.dtype(np.float32): ("cublasSgemm_v2", ctypes.c_float),
         np.dtype(np.float64): ("cublasDgemm_v2", ctypes.c_double)}

# cudaDataType_t and cublasComputeType_t (library_types.h, cublas_api.h)
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
_LOW_TYPES = {"float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}


def gemm_ex_types(a_dtype, b_dtype, out_dtype):
    """(A, B, C data types, compute type) of cublasGemmEx for mixed precision: 2-byte operands
    of one type (fp16 or bf16), a product in that type or float32, float32 accumulation
    (tensor cores); None for any other combination."""
    a, b, c = (np.dtype(d).name for d in (a_dtype, b_dtype, out_dtype))
    low = _LOW_TYPES.get(a)
    if low is None or b != a or c not in (a, "float32"):
        return None
    ct = low if c == a else CUDA_R_32F
    return low, low, ct, CUBLAS_COMPUTE_32F


class CublasError(RuntimeError):
    pass


def gemm_args(m: int, n: int, k: int, a_order: str, b_order: str):
    """out[m, n] = a[m, k] @ b[k, n] for row-major ``out`` as cuBLAS's column-major
    ``C = op(A) op(B)``: C is ``out`` read column-major (n x m), so C = b^T a^T with A = b and
    B = a. ``a_order``/``b_order``: "C" for a C-contiguous operand (read column-major it is its
    transpose: op N), "F" for an F-contiguous one, a transposed view (op T). Returns
    (transa, transb, M, N, K, lda, ldb, ldc), or None for an empty product."""
    if min(m, n, k) <= 0:
        return None
    transa, lda = (OP_N, n) if b_order == "C" else (OP_T, k)
    transb, ldb = (OP_N, k) if a_order == "C" else (OP_T, m)
    return transa, transb, n, m, k, lda, ldb, n


def _order(x) -> str | None:
    return "C" if x.flags.c_contiguous else "F" if x.flags.f_contiguous else None


def _find_library(cp):
    """libcublas as CuPy loaded it (its path from the process's mappings), else the system's."""
    try:
        import cupy_backends.cuda.libs.cublas  # noqa: F401
    except ImportError:
        return None
    cp.cuda.device.get_cublas_handle()          # CuPy may load the library only now
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith("libcublas.so"):
                    return ctypes.CDLL(path)
    except OSError:
        pass
    found = ctypes.util.find_library("cublas")
    return ctypes.CDLL(found) if found else None


class _Handle:
    def __init__(self, lib, cp):
        self.lib, self.cp = lib, cp
        h = ctypes.c_void_p()
        self._check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        self.ptr = h
        self.workspace = cp.cuda.Memory(WORKSPACE_BYTES)    # outside the arena, like the handle
        self.stream = None
        self.math = None

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"{what} failed with cuBLAS status {status}")

    def bind(self, stream_ptr: int, tf32: bool) -> None:
        if stream_ptr != self.stream:
            self._check(self.lib.cublasSetStream_v2(self.ptr, ctypes.c_void_p(stream_ptr)),
                        "cublasSetStream")
            # setting the stream resets the workspace to cuBLAS's pool: set ours again
            self._check(self.lib.cublasSetWorkspace_v2(
                self.ptr, ctypes.c_void_p(self.workspace.ptr), ctypes.c_size_t(WORKSPACE_BYTES)),
                "cublasSetWorkspace")
            self.stream = stream_ptr
        math = TF32_TENSOR_OP_MATH if tf32 else DEFAULT_MATH
        if math != self.math:
            self._check(self.lib.cublasSetMathMode(self.ptr, ctypes.c_int(math)),
                        "cublasSetMathMode")
            self.math = math


_state: dict = {}       # "lib" -> the CDLL or None; device id -> its _Handle


def handle(cp):
    """This process's handle on the current device (created on first use), or None where
    libcublas cannot be loaded."""
    if "lib" not in _state:
        _state["lib"] = _find_library(cp)
    lib = _state["lib"]
    if lib is None:
        return None
    dev = cp.cuda.Device().id
    h = _state.get(dev)
    if h is None:
        h = _state[dev] = _Handle(lib, cp)
    return h


def gemm(cp, a, b, out) -> bool:
    """out = a @ b (2-D float32/float64 CuPy arrays, ``out`` C-contiguous; or 2-byte operands
    with a 2-byte or float32 ``out``: cublasGemmEx, float32 accumulation) on the current
    stream; False where this does not apply (the caller uses cupy.matmul)."""
    ex = gemm_ex_types(a.dtype, b.dtype, out.dtype)
    fn = _GEMM.get(np.dtype(out.dtype))
    if ex is None and (fn is None or a.dtype != out.dtype or b.dtype != out.dtype):
        return False
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or not out.flags.c_contiguous:
        return False
    (m, k), (k2, n) = a.shape, b.shape
    a_order, b_order = _order(a), _order(b)
    if a_order is None or b_order is None or k2 != k or out.shape != (m, n):
        return False
    args = gemm_args(m, n, k, a_order, b_order)
    if args is None:
        return False
    h = handle(cp)
    if h is None:
        return False
    h.bind(cp.cuda.get_current_stream().ptr, os.environ.get("CUPY_TF32", "0") != "0")
    transa, transb, M, N, K, lda, ldb, ldc = args
    if ex is not None:
        a_type, b_type, c_type, compute = ex
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)     # the compute type's scalars
        status = h.lib.cublasGemmEx(
            h.ptr, ctypes.c_int(transa), ctypes.c_int(transb), ctypes.c_int(M), ctypes.c_int(N),
            ctypes.c_int(K), ctypes.byref(one), ctypes.c_void_p(b.data.ptr), ctypes.c_int(b_type),
            ctypes.c_int(lda), ctypes.c_void_p(a.data.ptr), ctypes.c_int(a_type),
            ctypes.c_int(ldb), ctypes.byref(zero), ctypes.c_void_p(out.data.ptr),
            ctypes.c_int(c_type), ctypes.c_int(ldc), ctypes.c_int(compute),
            ctypes.c_int(CUBLAS_GEMM_DEFAULT))
        h._check(status, "cublasGemmEx")
        return True
    name, scalar = fn
    one, zero = scalar(1.0), scalar(0.0)
    status = getattr(h.lib, name)(
        h.ptr, ctypes.c_int(transa), ctypes.c_int(transb), ctypes.c_int(M), ctypes.c_int(N),
        ctypes.c_int(K), ctypes.byref(one), ctypes.c_void_p(b.data.ptr), ctypes.c_int(lda),
        ctypes.c_void_p(a.data.ptr), ctypes.c_int(ldb), ctypes.byref(zero),
        ctypes.c_void_p(out.data.ptr), ctypes.c_int(ldc))
    h._check(status, name)
    return True
