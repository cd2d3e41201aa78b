"""Host buffers for offloaded tensors, drawn from one reused pool.

Not a host shadow of every tensor (the original SuperNeurons code pinned a full-size host copy of
everything): a buffer exists only while a tensor is off the device, and released buffers are
kept by size class for reuse, so pinned memory (on the GPU device) is allocated rarely.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..errors import MemoryBudgetError


class HostPool:
    """``limit``: host bytes offloaded tensors may occupy at once (the plan's host budget).
    ``cap``: bytes this pool may hold allocated in all, cached free buffers included (the
    device's pinned-memory cap, see neuron.memory.host_budget). Buffers are allocated lazily,
    on first need; when a new one would pass the cap, the cached free buffers are given back
    first, and only if that is not enough is it an error naming the cap.

    A persistent tensor (a parameter block under --offload-params) has a home: the buffer it
    left is kept for it, out of the free lists, and it gets that buffer back at its next
    offload. Between iterations every persistent tensor is then in the buffer it started in,
    which a recorded iteration needs to repeat (neuron/tape.py); from any free buffer they
    rotated among themselves. Homes count as reserved, not in use, like cached buffers."""

    def __init__(self, allocate=None, granularity: int = 4096, limit: int | None = None,
                 cap: int | None = None):
        # allocate(nbytes) -> 1-D uint8 array; CudaDevice passes a pinned allocator
        self._allocate = allocate or (lambda n: np.empty(n, dtype=np.uint8))
        self.granularity = granularity
        self.limit = limit              # host bytes that offloaded tensors may occupy
        self.cap = cap                  # host bytes this pool may hold allocated (pinned)
        self._free: dict[int, list] = defaultdict(list)
        self._pending: dict[int, object] = {}   # buffer address -> event of a copy reading it
        self._homes: dict[int, object] = {}     # persistent tensor id -> the buffer kept for it
        self.in_use_bytes = 0
        self.peak_bytes = 0
        self.reserved_bytes = 0         # everything allocated and not given back (in use + cached)
        self.trimmed_bytes = 0          # cached buffers given back to respect the cap
        # reclaim(nbytes): called before the limit error, to return buffers that the plan has
        # already released but an asynchronous copy still reads (MemoryPool sets it)
        self.reclaim = None

    def size_class(self, nbytes: int) -> int:
        g = self.granularity
        return max(g, (nbytes + g - 1) // g * g)

    def can_get(self, nbytes: int) -> bool:
        """Whether a buffer of nbytes more stays under the limit, and a new one under the
        cap (an early copy of an eviction, memory/evict_ahead.py, takes one only then)."""
        c = self.size_class(nbytes)
        if self.limit is not None and self.in_use_bytes + c > self.limit:
            return False
        return self.cap is None or self.reserved_bytes + c <= self.cap

    def get(self, nbytes: int, home: int | None = None):
        """A buffer of at least nbytes (uint8); reuse a released one of the same class
        (``home``: the tensor's own, if it has one)."""
        g = self.granularity
        c = -(-nbytes // g) * g or g
        if self.limit is not None and self.in_use_bytes + c > self.limit \
                and self.reclaim is not None:
            self.reclaim(self.in_use_bytes + c - self.limit)
        if self.limit is not None and self.in_use_bytes + c > self.limit:
            raise MemoryBudgetError(
                f"host memory budget of {self.limit} bytes exceeded: {self.in_use_bytes} in use, "
                f"{c} more requested for an offloaded tensor", requested=c,
                free_bytes=self.limit - self.in_use_bytes, budget=self.limit)
        mine = self._homes.pop(home, None) if home is not None else None
        if mine is not None and mine.nbytes != c:
            self._free[mine.nbytes].append(mine)
            mine = None
        lst = self._free.get(c)
        buf = mine if mine is not None else lst.pop() if lst else None
        if buf is None:
            if self.cap is not None and self.reserved_bytes + c > self.cap:
                self.trim()
                if self.reserved_bytes + c > self.cap:
                    self.trim(homes=True)
                if self.reserved_bytes + c > self.cap:
                    from .host_budget import describe_cap
                    raise MemoryBudgetError(
                        f"pinned host memory cap of {describe_cap(self.cap)} reached: "
                        f"{self.in_use_bytes} bytes hold offloaded tensors, {c} more requested",
                        requested=c, free_bytes=self.cap - self.reserved_bytes,
                        budget=self.cap)
            buf = self._allocate(c)
            self.reserved_bytes += c
        self.in_use_bytes += c
        if self.in_use_bytes > self.peak_bytes:
            self.peak_bytes = self.in_use_bytes
        return buf

    def put(self, buf, pending=None, home: int | None = None) -> None:
        """``buf`` is free again; ``pending``: the event of a copy still reading it, which the
        next copy into it must wait for (pending_read); ``home``: the persistent tensor it is
        kept for."""
        c = buf.nbytes
        self.in_use_bytes -= c
        if home is not None:
            old = self._homes.pop(home, None)
            if old is not None:
                self._free[old.nbytes].append(old)
            self._homes[home] = buf
        else:
            self._free[c].append(buf)
        if pending is not None:
            self._pending[_address(buf)] = pending

    def home_of(self, tid: int):
        """The buffer kept for persistent tensor ``tid`` (None: none, or given back)."""
        return self._homes.get(tid)

    def pending_read(self, buf):
        """The event of a copy that may still read ``buf`` (just taken from get()), or None."""
        return self._pending.pop(_address(buf), None) if self._pending else None

    def held_events(self) -> list:
        """The events of copies that may still read cached buffers (Pool.carry_copies)."""
        return list(self._pending.values())

    def swap_events(self, swap) -> None:
        """Every held event ``ev`` becomes ``swap(ev)`` (Pool.carry_copies)."""
        self._pending = {a: swap(ev) for a, ev in self._pending.items()}

    def settle(self) -> None:
        """Order the cached buffers by address: an iteration then draws the same buffers as the
        one before it, whatever order they came back in (what makes a recorded iteration a fixed
        program, neuron/tape.py)."""
        for lst in self._free.values():
            if len(lst) > 1 and hasattr(lst[0], "__array_interface__"):
                lst.sort(key=lambda b: -b.__array_interface__["data"][0])

    def trim(self, homes: bool = False) -> int:
        """Give every cached free buffer back (pinned pages return to the OS when the last
        reference goes), with ``homes`` the persistent tensors' too; returns the bytes given
        back. A buffer that a copy may still read is kept."""
        pending = self._pending
        if homes:
            for tid, buf in list(self._homes.items()):
                if _address(buf) not in pending:
                    del self._homes[tid]
                    self.reserved_bytes -= buf.nbytes
                    self.trimmed_bytes += buf.nbytes
        kept = {c: [b for b in v if _address(b) in pending] for c, v in self._free.items()}
        dropped = sum(c * (len(v) - len(kept[c])) for c, v in self._free.items())
        self._free.clear()
        self._free.update({c: v for c, v in kept.items() if v})   # a copy still reads these
        self.reserved_bytes -= dropped
        self.trimmed_bytes += dropped
        return dropped


def _address(buf) -> int:
    return int(buf.__array_interface__["data"][0])
