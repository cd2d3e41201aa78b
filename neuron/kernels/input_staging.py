"""Host batches to the GPU through pinned memory, asynchronously.

A pageable NumPy array cannot be copied to the device asynchronously: the driver first copies it
into its own pinned bounce buffer while the host waits. neuron copies the batch into a pinned
staging buffer of its own (a host memcpy) and queues ``cudaMemcpyAsync`` from there on the
current (compute) stream, so the kernels that read the batch are ordered after it while the host
goes on. A staging buffer is reused only after the event of its previous copy completed (the
wait is normally already over: that copy belonged to an earlier iteration).

Pure bookkeeping over three callables, so it is tested on the CPU with fakes: ``alloc(nbytes)``
-> 1-D uint8 host array (pinned on the GPU), ``memcpy_async(dst_ptr, src_ptr, nbytes)`` and
``record()`` -> an event with ``synchronize()``.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np


def _size_class(nbytes: int) -> int:
    """Powers of two from 4 KiB: a batch and its labels each keep one buffer."""
    return max(4096, 1 << max(0, int(nbytes) - 1).bit_length())


class PinnedStager:
    def __init__(self, alloc, memcpy_async, record, max_buffers: int = 8):
        self._alloc, self._memcpy, self._record = alloc, memcpy_async, record
        self.max_buffers = int(max_buffers)
        self._bufs: OrderedDict[int, list] = OrderedDict()    # class -> [buffer, event]
        self.staged_bytes = 0
        self.allocations = 0

    def _buffer(self, nbytes: int):
        cls = _size_class(nbytes)
        slot = self._bufs.get(cls)
        if slot is None:
            if len(self._bufs) >= self.max_buffers:            # least recently used goes
                _, (_, ev) = self._bufs.popitem(last=False)
                if ev is not None:
                    ev.synchronize()
            slot = self._bufs[cls] = [self._alloc(cls), None]
            self.allocations += 1
        else:
            self._bufs.move_to_end(cls)
        if slot[1] is not None:
            slot[1].synchronize()           # its previous copy may still be reading it
        return slot

    def stage(self, src: np.ndarray, dst_ptr: int) -> None:
        """Copy ``src`` (any host array, already of the destination's dtype and size) to the
        device address ``dst_ptr``; returns once the copy is queued."""
        src = np.ascontiguousarray(src)
        n = src.nbytes
        if n == 0:
            return
        slot = self._buffer(n)
        buf = slot[0]
        buf[:n] = src.reshape(-1).view(np.uint8)
        self._memcpy(int(dst_ptr), int(buf.__array_interface__["data"][0]), n)
        slot[1] = self._record()
        self.staged_bytes += n
