"""Reused host buffers for offloaded tensors, by size class: the bookkeeping of CudaDevice's
pinned host pool (cuda_device.PinnedHostPool), pure Python so that it is tested without a
GPU."""
from __future__ import annotations


def size_class(nbytes: int, min_bytes: int = 4096) -> int:
    """Host-buffer size class: at least ``min_bytes``, then steps of 1/8 of the power of two
    below, so a reused buffer wastes at most 12.5% while similar tensors share buffers."""
    nbytes = int(nbytes)
    if nbytes <= min_bytes:
        return min_bytes
    step = max(256, 1 << (nbytes.bit_length() - 4))
    return -(-nbytes // step) * step


class HostBufferPool:
    """Reused host buffers for offloaded tensors: the bookkeeping of PinnedHostPool.

    ``allocate(nbytes)`` makes a new uint8 buffer (pinned memory in PinnedHostPool, plain NumPy in
    tests). :meth:`get` returns a uint8 view of exactly the requested bytes, reusing a released
    buffer of the same size class (or one up to twice as big) before allocating; :meth:`release`
    takes the view (any reshape/dtype view of it works: buffers are found by address) and, if
    given an event, keeps the buffer out of reuse until the event reports ``done`` (a copy may
    still be reading or writing it). Pinned memory is slow to allocate and page-locks host RAM,
    so buffers are kept for reuse rather than freed, up to ``capacity`` bytes in total."""

    def __init__(self, allocate, capacity: int | None = None):
        self._allocate = allocate
        self.capacity = capacity
        self._free: dict[int, list] = {}            # size class -> [buffer]
        self._busy: dict[int, tuple] = {}           # address -> (buffer, class)
        self._pending: list[tuple] = []             # (buffer, class, event)
        self.allocated_bytes = 0                    # all buffers we own
        self.allocations = 0                        # calls to allocate()
        self.reuses = 0

    @staticmethod
    def address(a) -> int:
        return int(a.__array_interface__["data"][0])

    @property
    def in_use_bytes(self) -> int:
        return sum(cls for _, cls in self._busy.values())

    @property
    def free_bytes(self) -> int:
        return sum(cls * len(v) for cls, v in self._free.items())

    def _reap(self) -> None:
        still = []
        for buf, cls, ev in self._pending:
            if ev.done:
                self._free.setdefault(cls, []).append(buf)
            else:
                still.append((buf, cls, ev))
        self._pending = still

    def _take_free(self, cls: int):
        bucket = self._free.get(cls)
        if bucket:
            return bucket.pop(), cls
        # the smallest free buffer that is big enough without wasting more than half of it
        fits = [c for c, v in self._free.items() if v and cls < c <= 2 * cls]
        if fits:
            c = min(fits)
            return self._free[c].pop(), c
        return None, 0

    def get(self, nbytes: int):
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self._reap()
        cls = size_class(max(nbytes, 1))
        buf, c = self._take_free(cls)
        if buf is not None:
            self.reuses += 1
        else:
            if self.capacity is not None and self.allocated_bytes + cls > self.capacity:
                self.trim()
                if self.allocated_bytes + cls > self.capacity:
                    raise MemoryError(
                        f"host buffer of {nbytes} bytes exceeds the pinned pool capacity "
                        f"({self.allocated_bytes} of {self.capacity} bytes in use or pending)")
            buf, c = self._allocate(cls), cls
            self.allocated_bytes += cls
            self.allocations += 1
        self._busy[self.address(buf)] = (buf, c)
        return buf[:nbytes]

    def release(self, view, event=None) -> None:
        addr = self.address(view)
        try:
            buf, cls = self._busy.pop(addr)
        except KeyError:
            raise KeyError(f"host buffer at {addr:#x} is not from this pool or was released "
                           "twice") from None
        if event is not None and not event.done:
            self._pending.append((buf, cls, event))
        else:
            self._free.setdefault(cls, []).append(buf)

    def trim(self) -> int:
        """Drop every free buffer (pending and busy ones stay); returns the bytes dropped."""
        self._reap()
        dropped = self.free_bytes
        self._free.clear()
        self.allocated_bytes -= dropped
        return dropped
