"""Helpers the CuPy/cuDNN kernel modules share (kernels/cuda.py, cuda_pool.py): CuPy loaded on
first use, the cuDNN handle, pointers and descriptors, and writing into strided or
accumulating outputs through temporaries."""
from __future__ import annotations

from . import cuda_low
from . import cudnn as dnn

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


def _ccontig(a):
    return _cp().ascontiguousarray(a)


def _grad_into(dx, accumulate, fn):
    """Run ``fn(dst)`` writing an input gradient: into dx, or (accumulating, for the CuPy
    kernels that have no beta) into a CuPy temporary that is then added into dx."""
    if not accumulate:
        fn(dx)
        return
    tmp = _cp().empty(dx.shape, dx.dtype)
    fn(tmp)
    if cuda_low.is_low(dx):
        cuda_low.accumulate(dx, tmp)
    else:
        _cp().add(dx, tmp, out=dx)


def _run_into(out, fn):
    """Run ``fn(dst)`` into ``out``, through a contiguous temporary when out is a strided view
    (the raw-indexing kernels assume C order)."""
    if out.flags.c_contiguous:
        fn(out)
    else:
        tmp = _cp().empty(out.shape, out.dtype)
        fn(tmp)
        out[...] = tmp
