"""Stand-ins for CuPy and cuDNN, so that the GPU kernel module (neuron/kernels/cuda.py and the
modules it re-exports) runs on the CPU over NumPy arrays.

- CuPy: NumPy, except that ``ElementwiseKernel`` compiles the kernel's very CUDA source with
  g++ (one C++ loop over ``i`` with CuPy's conventions: a ``raw`` parameter is a pointer to the
  whole array, any other one the current element, a const value for an input and a reference
  for an output; T and U are the dtypes the arguments bind), ``RawModule`` too (a loop over
  blocks and threads), and arrays have ``.get()``.
- the CUDA runtime (``cupy.cuda``): device memory is host memory at real addresses (Memory,
  MemoryPointer, ``cupy.ndarray(memptr=)``, memcpyAsync as memmove, the allocator hook that
  CudaDevice routes into its arena); streams run each operation when it is issued and every
  event is complete, and they can log what they are issued; NCCL all-reduces through MPI.
- cuDNN (the ``dnn`` namespace, i.e. the level of neuron/kernels/cudnn_ops.py): each operation
  does what cuDNN's documentation says, including ``alpha``/``beta`` blending, on the memory at
  the addresses it is given seen through the descriptors given with them. The arithmetic is
  numpy_ref's, so where the wrappers wire things right the GPU module gives numpy_ref's numbers.

What this checks: the wrappers' argument order and geometry, their beta (accumulate) flags,
their temporaries, the raw kernels' source, and the executor's use of the GPU kernel API. What
it cannot: cuDNN's own numerics, the ctypes marshalling (tests/kernels/test_cudnn_binding.py
checks that against the headers) and timing: operations run when issued, so a missing stream
wait changes no number here. Instead, streams made after ``log_streams()`` log what is issued to
them, and ``happens_before`` reads CUDA's ordering off that log: tests/devices/test_cuda_device.py
checks CudaDevice's stream graph on it (tests/memory/stream_model.py models the same rules for
the pool, with copies that complete late).

The stand-ins live in cupy_arrays.py (CuPy), runtime.py (the CUDA runtime and NCCL) and
cudnn_ops.py (cuDNN); this module installs them.
"""
from __future__ import annotations

import sys

import numpy as np

from neuron.devices import CpuDevice
from neuron.kernels import (conv_algos, cuda, cuda_helpers, cuda_low, cuda_pool, cuda_raw, cudnn,
                            pointer_tables)

from .cudnn_ops import CudnnStandIn, Desc
from .cupy_arrays import CupyStandIn, DevArray, ElementwiseKernel, have_compiler
from .runtime import (CUDARuntimeError, Memory, MemoryPointer, _Capture, _Cuda, _Stream,
                      happens_before, launch, log_streams, memory_snapshot)

__all__ = ["CUDARuntimeError", "CudaKernelsOnCpu", "CudnnStandIn", "CupyStandIn", "Desc",
           "cublas_gemm",
           "DevArray",
           "ElementwiseKernel", "KERNEL_CACHES", "Memory", "MemoryPointer", "happens_before",
           "have_compiler", "install", "launch", "log_streams", "memory_snapshot", "uninstall"]

KERNEL_CACHES = [getattr(cuda_raw, n) for n in dir(cuda_raw) if n.startswith("_k_")] + \
    [cuda._k_any_nonfinite, *cuda_low.KERNEL_CACHES]


class CudaKernelsOnCpu(CpuDevice):
    """The CPU arena with the GPU kernel module (on the stand-ins, once installed)."""
    name = "cuda-standin"

    @property
    def kernels(self):
        return cuda

    def view(self, offset, shape, dtype):
        return super().view(offset, shape, dtype).view(DevArray)


def install(monkeypatch, build_dir):
    """Point the GPU kernel modules at the stand-ins (undone by monkeypatch). Returns the
    cuDNN stand-in."""
    ElementwiseKernel.build_dir = build_dir
    cp, dnn = CupyStandIn(), CudnnStandIn()
    for mod in (cuda_raw, cuda_helpers, cuda, cuda_pool, cuda_low):
        monkeypatch.setattr(mod, "_cp", lambda: cp)
    for mod in (cuda, cuda_pool, cuda_helpers, conv_algos):
        monkeypatch.setattr(mod, "dnn", dnn)
    monkeypatch.setattr(cudnn, "get_handle", dnn.get_handle)    # CudaDevice asks it directly
    from neuron.devices import cuda_check
    monkeypatch.setattr(cuda_check, "missing_for_cuda", lambda: [])  # driver, NVRTC, cuDNN
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy.cuda", _Cuda)        # from cupy.cuda import nccl
    monkeypatch.setattr(cuda, "_stager", None)      # the input stager over the stand-in's memory
    uninstall()
    return dnn


def cublas_gemm(cp, a, b, out) -> bool:
    """A stand-in for neuron.kernels.cublas.gemm (not installed by ``install``: the stand-ins'
    tests run _matmul_low's float32-copy fallback unless they set it): the product in float32
    (float64 for float64), written once into ``out`` in its own type, as cublasSgemm, Dgemm and
    GemmEx write it on a GPU."""
    wide = np.float64 if out.dtype == np.float64 else np.float32
    out[...] = (np.asarray(a, wide) @ np.asarray(b, wide)).astype(out.dtype)
    return True


def uninstall():
    """What was made with the stand-ins (kernels, algorithm choices) must not outlive them."""
    for f in KERNEL_CACHES:
        f.cache_clear()
    pointer_tables.TABLES.clear()      # device tables in the stand-in's memory
    conv_algos.clear_conv_algo_cache()
    _Cuda.allocator = None
    _Stream._current.clear()
    _Capture.live.clear()
    _Stream._logging = False
    _Stream.issued = []
