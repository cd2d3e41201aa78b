"""Device tables of int64 values (a multi-tensor kernel's pointers and sizes), each uploaded
once per distinct content and kept.

The plan fixes every address, so a layer's tensors sit at the same addresses every iteration:
the table that names them is built and copied to the device the first time and found again
after, and a CUDA graph (devices/cuda_graph.py) that reads it keeps reading the same bytes. So
tables are never freed or rewritten (a captured graph may hold their addresses): they are
packed into slabs of device memory outside the arena, as the step guard's flag is, up to
``limit_bytes``; past it, and while a stream is capturing (a copy there would be a graph node
reading host memory that changes), ``table`` answers None and the caller takes its
per-tensor path.
"""
from __future__ import annotations

import numpy as np

from . import cuda_helpers

#: table start alignment within a slab (bytes)
ALIGN = 16


class PointerTables:
    def __init__(self, slab_bytes: int = 64 << 10, limit_bytes: int = 16 << 20):
        self.slab_bytes, self.limit_bytes = int(slab_bytes), int(limit_bytes)
        self.clear()

    def clear(self) -> None:
        """Forget every table (their device memory goes with them)."""
        self._tables: dict[tuple, object] = {}
        self._slabs: list = []          # (cupy Memory, bytes used)
        self._host: list = []           # the uploaded host copies, alive until their copy ran
        self.uploads = 0                # tables copied to the device
        self.refused = 0                # tables asked for and not made (capture, limit)
        self.reserved_bytes = 0

    def table(self, values: tuple):
        """The device int64 array holding ``values``, uploaded on the current stream the first
        time they are asked for; None where it cannot be made now (module docstring)."""
        found = self._tables.get(values)
        if found is not None:
            return found
        cp = cuda_helpers._cp()
        stream = cp.cuda.get_current_stream()
        nbytes = 8 * len(values)
        if stream.is_capturing() or nbytes > self.slab_bytes:
            self.refused += 1
            return None
        ptr = self._reserve(cp, nbytes)
        if ptr is None:
            self.refused += 1
            return None
        host = np.asarray(values, np.int64)
        cp.cuda.runtime.memcpyAsync(ptr, host.ctypes.data, nbytes,
                                    cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        self._host.append(host)
        mem = self._slabs[-1][0]
        dev = cp.ndarray((len(values),), np.int64, cp.cuda.MemoryPointer(mem, ptr - mem.ptr))
        self._tables[values] = dev
        self.uploads += 1
        return dev

    def _reserve(self, cp, nbytes: int) -> int | None:
        """A device address for ``nbytes`` in the last slab, or in a new one."""
        if self._slabs:
            mem, used = self._slabs[-1]
            if used + nbytes <= self.slab_bytes:
                self._slabs[-1] = (mem, used + -(-nbytes // ALIGN) * ALIGN)
                return mem.ptr + used
        if self.reserved_bytes + self.slab_bytes > self.limit_bytes:
            return None
        mem = cp.cuda.Memory(self.slab_bytes)
        self.reserved_bytes += self.slab_bytes
        self._slabs.append((mem, -(-nbytes // ALIGN) * ALIGN))
        return mem.ptr


#: the GPU kernels' tables (kernels/cuda.py sgd_update_many)
TABLES = PointerTables()
