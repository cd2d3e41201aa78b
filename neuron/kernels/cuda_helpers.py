"""Helpers the CuPy/cuDNN kernel modules share (kernels/cuda.py, cuda_pool.py): CuPy loaded on
first use, the cuDNN handle, pointers and descriptors, and writing into strided or
accumulating outputs through temporaries."""
from __future__ import annotations

import warnings

import numpy as np

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


# ---- mixed precision where a cuDNN build refuses a 2-byte type: the float32 round trip ----

#: the cuDNN operations that refused a 2-byte type on this GPU (they run in float32 from then
#: on, through temporaries: the same values, since cuDNN computes in float either way)
low_refused: dict[str, str] = {}


def _low_guarded(op: str, native, via_f32):
    """``native()``; if cuDNN refuses the low type there (a BAD_PARAM or NOT_SUPPORTED
    status), ``via_f32()`` now and for every later call of ``op`` (said once, as a warning)."""
    if op in low_refused:
        return via_f32()
    try:
        return native()
    except dnn.CudnnError as e:
        if e.status // 1000 not in (2, 3):
            raise
        low_refused[op] = str(e)
        warnings.warn(f"cuDNN refused {op} on a 2-byte type ({e}); it runs in float32 through "
                      "temporaries from now on", RuntimeWarning, stacklevel=3)
        return via_f32()


def _via_f32(fn, ins, outs, accumulate=False):
    """``fn(*ins, *outs)`` on float32 copies of the low-precision ones, each output rounded
    back once (``accumulate``: the outputs' current values are read too)."""
    f_ins = [cuda_low.to_f32(_ccontig(a)) if cuda_low.is_low(a) else a for a in ins]
    f_outs = [None if o is None else
              (cuda_low.to_f32(o) if accumulate else _cp().empty(o.shape, np.float32))
              if cuda_low.is_low(o) else o for o in outs]
    fn(*f_ins, *f_outs)
    for o, f in zip(outs, f_outs):
        if o is not None and f is not o:
            cuda_low.cast(o, f)
