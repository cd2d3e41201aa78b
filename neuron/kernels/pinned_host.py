"""Page-locked host buffers: only pinned memory lets cudaMemcpyAsync run asynchronously and
overlap compute. Used by the CUDA device's host pool and the input stager (kernels/cuda.py),
and counted, so a report can say how much host memory is locked."""
from __future__ import annotations

import weakref

import numpy as np

_pinned = {"bytes": 0}           # page-locked bytes held by live pinned_empty buffers


def pinned_empty(nbytes: int) -> np.ndarray:
    """A 1-D uint8 NumPy array over page-locked host memory (alive as long as the array)."""
    import cupy
    nbytes = int(nbytes)
    mem = cupy.cuda.alloc_pinned_memory(nbytes)
    a = np.frombuffer(mem, np.uint8, nbytes)        # .base keeps `mem` alive
    _pinned["bytes"] += nbytes
    weakref.finalize(a, _unpin, nbytes)
    return a


def _unpin(nbytes: int) -> None:
    _pinned["bytes"] -= nbytes


def pinned_host_bytes() -> int:
    """Page-locked host bytes this process holds through pinned_empty."""
    return _pinned["bytes"]
