"""Host buffers for offloaded tensors, drawn from one reused pool.

Not a host shadow of every tensor (the original SuperNeurons code pinned a full-size host copy of
everything): a buffer exists only while a tensor is off the device, and released buffers are
kept by size class for reuse, so pinned memory (on the GPU device) is allocated rarely.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np


class HostPool:
    def __init__(self, allocate=None, granularity: int = 4096, limit: int | None = None):
        # allocate(nbytes) -> 1-D uint8 array; CudaDevice passes a pinned allocator
        self._allocate = allocate or (lambda n: np.empty(n, dtype=np.uint8))
        self.granularity = granularity
        self.limit = limit              # host bytes that offloaded tensors may occupy
        self._free: dict[int, list] = defaultdict(list)
        self.in_use_bytes = 0
        self.peak_bytes = 0
        self.reserved_bytes = 0         # everything ever allocated (in use + cached)

    def size_class(self, nbytes: int) -> int:
        g = self.granularity
        return max(g, (nbytes + g - 1) // g * g)

    def get(self, nbytes: int):
        """A buffer of at least nbytes (uint8); reuse a released one of the same class."""
        g = self.granularity
        c = -(-nbytes // g) * g or g
        if self.limit is not None and self.in_use_bytes + c > self.limit:
            from ..errors import MemoryBudgetError
            raise MemoryBudgetError(
                f"host memory budget of {self.limit} bytes exceeded: {self.in_use_bytes} in use, "
                f"{c} more requested for an offloaded tensor", requested=c,
                free_bytes=self.limit - self.in_use_bytes, budget=self.limit)
        lst = self._free.get(c)
        buf = lst.pop() if lst else None
        if buf is None:
            buf = self._allocate(c)
            self.reserved_bytes += c
        self.in_use_bytes += c
        if self.in_use_bytes > self.peak_bytes:
            self.peak_bytes = self.in_use_bytes
        return buf

    def put(self, buf) -> None:
        c = buf.nbytes
        self.in_use_bytes -= c
        self._free[c].append(buf)
