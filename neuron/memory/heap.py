"""Block heap over one preallocated device arena (SuperNeurons §3.2.1).

The heap only manages *offsets* into an arena of ``size`` bytes; it never
touches storage.  The runtime maps offsets onto its one device buffer, and
the planner can use the very same class on a virtual device (say 100 GiB)
to simulate memory use without a GPU.

Requests are rounded up to whole blocks.  Placement is first-fit (the
paper's choice, default) or best-fit; freed blocks are coalesced with their
free neighbours.  Every call is O(log n) in the number of free segments.
The bookkeeping lives in the C++ extension ``neuron.memory._heap``; this
module adds argument normalisation and the :class:`HeapFullError` report.

Example::

    heap = Heap(1 << 30)              # 1 GiB arena, 1 KiB blocks
    a = heap.alloc(3000)              # -> 0, takes 3072 bytes
    b = heap.alloc(100)               # -> 3072
    heap.free(a)
    heap.stats()["largest_free"]
"""

from __future__ import annotations

import operator

from neuron.memory import _heap

__all__ = ["Heap", "HeapFullError"]

# The extension stores sizes and offsets as 64-bit integers; values beyond
# this can never be a valid arena, request that fits, or live offset, and
# are handled here so Python callers get the documented exception instead
# of a pybind11 conversion TypeError.
_I64_MAX = 2**63 - 1

_STRATEGIES = ("first_fit", "best_fit")


class HeapFullError(MemoryError):
    """No free segment can hold the (rounded) request.

    ``free_bytes`` may exceed ``requested`` when the arena is fragmented;
    comparing it with ``largest_free`` tells the two situations apart.
    """

    def __init__(self, requested: int, largest_free: int, free_bytes: int) -> None:
        self.requested = requested
        self.largest_free = largest_free
        self.free_bytes = free_bytes
        super().__init__(
            f"cannot allocate {requested} bytes: largest free segment is "
            f"{largest_free} bytes ({free_bytes} bytes free in total)"
        )

    def __reduce__(self):
        # The default would call __init__ with the message only.
        return (type(self), (self.requested, self.largest_free, self.free_bytes))


def _as_int(name: str, value) -> int:
    # bool is an int subclass, but Heap(True) is certainly a mistake.
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


class Heap:
    """First-fit / best-fit block allocator over an arena of ``size`` bytes.

    ``size`` is rounded down to a multiple of ``block``; ``block`` must be a
    positive multiple of ``alignment``, a power of two >= 256.  Offsets
    returned by :meth:`alloc` double as allocation ids for :meth:`free`.
    """

    __slots__ = ("_impl", "_size", "_block")

    def __init__(
        self,
        size: int,
        block: int = 1024,
        alignment: int = 256,
        strategy: str = "first_fit",
    ) -> None:
        size = _as_int("size", size)
        block = _as_int("block", block)
        alignment = _as_int("alignment", alignment)
        for name, value in (("size", size), ("block", block), ("alignment", alignment)):
            if value > _I64_MAX:
                raise ValueError(f"{name} must be at most {_I64_MAX} bytes, got {value}")
        if not isinstance(strategy, str) or strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be 'first_fit' or 'best_fit', got {strategy!r}")
        self._impl = _heap.Heap(size, block, alignment, strategy)
        # Cached: read on every request.
        self._size = self._impl.size
        self._block = block

    # -- configuration -----------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    @property
    def block(self) -> int:
        return self._block

    @property
    def alignment(self) -> int:
        return self._impl.alignment

    @property
    def strategy(self) -> str:
        return self._impl.strategy

    # -- requests ----------------------------------------------------------

    def round(self, nbytes: int) -> int:
        """Bytes a request of ``nbytes`` (>= 1) would take: whole blocks."""
        nbytes = self._request(nbytes)
        return -(-nbytes // self._block) * self._block

    def alloc(self, nbytes: int) -> int:
        """Offset of a new allocation; :class:`HeapFullError` if none fits.

        A failed request leaves the heap unchanged.
        """
        offset = self.try_alloc(nbytes)
        if offset < 0:
            raise HeapFullError(self.round(nbytes), self.largest_free, self.free_bytes)
        return offset

    def try_alloc(self, nbytes: int) -> int:
        """Like :meth:`alloc` but returns -1 when no segment fits."""
        nbytes = self._request(nbytes)
        if nbytes > self._size:
            return -1
        return self._impl.try_alloc(nbytes)

    def try_alloc_top(self, nbytes: int) -> int:
        """Like :meth:`try_alloc`, but at the top end of the highest-address segment that
        fits (for blocks that wait for a later reader, kept out of first-fit's way)."""
        nbytes = self._request(nbytes)
        if nbytes > self._size:
            return -1
        return self._impl.try_alloc_top(nbytes)

    def can_alloc(self, nbytes: int) -> bool:
        """Whether :meth:`alloc` would succeed right now."""
        nbytes = self._request(nbytes)
        return nbytes <= self._size and self._impl.can_alloc(nbytes)

    def free(self, offset: int) -> None:
        """Release a live allocation; KeyError if ``offset`` is not one."""
        self._impl.free(self._offset(offset))

    def size_of(self, offset: int) -> int:
        """Rounded size of the live allocation at ``offset``."""
        return self._impl.size_of(self._offset(offset))

    def clear(self) -> None:
        """Free every allocation at once; ``high_water`` is kept."""
        self._impl.clear()

    # -- statistics ----------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._impl.used_bytes

    @property
    def free_bytes(self) -> int:
        return self._impl.free_bytes

    @property
    def largest_free(self) -> int:
        return self._impl.largest_free

    @property
    def high_water(self) -> int:
        """Largest ``used_bytes`` since creation or :meth:`reset_high_water`."""
        return self._impl.high_water

    @property
    def num_allocated(self) -> int:
        return self._impl.num_allocated

    @property
    def num_free_segments(self) -> int:
        return self._impl.num_free_segments

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free / free_bytes``; 0.0 when nothing is free."""
        return self._impl.fragmentation

    def reset_high_water(self) -> None:
        """Restart peak tracking from the current ``used_bytes``."""
        self._impl.reset_high_water()

    def allocations(self) -> list[tuple[int, int]]:
        """Live ``(offset, size)`` pairs sorted by offset."""
        return self._impl.allocations()

    def free_segments(self) -> list[tuple[int, int]]:
        """Free ``(offset, size)`` segments sorted by offset (coalesced)."""
        return self._impl.free_segments()

    def stats(self) -> dict:
        """All statistics (plus ``size``) in one dict."""
        impl = self._impl
        return {
            "size": self._size,
            "used_bytes": impl.used_bytes,
            "free_bytes": impl.free_bytes,
            "largest_free": impl.largest_free,
            "high_water": impl.high_water,
            "num_allocated": impl.num_allocated,
            "num_free_segments": impl.num_free_segments,
            "fragmentation": impl.fragmentation,
        }

    def _check_invariants(self) -> None:
        """Full internal consistency check (for tests); RuntimeError if broken."""
        self._impl.check_invariants()

    def __repr__(self) -> str:
        return (
            f"Heap(size={self._size}, block={self._block}, alignment={self.alignment}, "
            f"strategy={self.strategy!r}, used_bytes={self.used_bytes}, "
            f"num_allocated={self.num_allocated})"
        )

    # -- helpers -------------------------------------------------------------

    @staticmethod
    def _request(nbytes) -> int:
        nbytes = _as_int("nbytes", nbytes)
        if nbytes <= 0:
            raise ValueError(f"nbytes must be >= 1, got {nbytes}")
        return nbytes

    @staticmethod
    def _offset(offset) -> int:
        offset = _as_int("offset", offset)
        if not 0 <= offset <= _I64_MAX:
            raise KeyError(
                f"offset {offset} is not a live allocation (double free or never allocated)"
            )
        return offset
