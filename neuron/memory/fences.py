"""Fences per arena block, for a device whose copies run on streams of their own (CudaDevice).

A copy must wait for the kernels that touch its block, and a kernel for the copies that touch
its block; nothing else. Waiting for "all compute queued so far" before every copy (the old
rule) serializes copies behind unrelated kernels, and making compute wait for an eviction's copy
at once stalls kernels that never touch the evicted block. So the pool keeps, per block:

- for a tensor on the device: the *epoch* of the last step whose kernels used it (``last_use``);
- for a free range of the arena: the epoch of the last kernel that used it and the events of
  the copies still reading it (an offload's copy out of it, a prefetch that was freed unread).

An epoch is one executor step: ``step_end`` records one event on the compute stream after the
step's kernels, from a ring of ``RING`` events reused round-robin (never one per copy per step).
A copy that needs "the kernels up to epoch e" waits for that event; one that needs the kernels of
the running step (not yet recorded) gets an event recorded now. When a range is taken again
(``claim``), its new tenant inherits the fences: a kernel tenant makes compute wait (on the GPU)
for the copies still reading it; a copy tenant (a prefetch) waits for the last kernel and those
copies on its own stream.

The heap wrapper :class:`FencedHeap` does this at every allocation and free of the pool's heap,
including CuPy's temporaries (CudaDevice.attach_heap), so no path around it can reuse a block
that a copy or a kernel still touches.
"""
from __future__ import annotations

import bisect

#: step events kept; a block whose last kernel is older waits for the oldest one kept (later,
#: so still correct, and long complete in practice)
RING = 256
#: events recorded "now" for the running step, reused round-robin (each is waited for at once)
NOW_RING = 8


class BlockFences:
    def __init__(self, device):
        self.device = device
        self.epoch = 0                          # the step whose kernels are being queued
        self._ring = [device.new_event() for _ in range(RING)]
        self._ring_epoch = [-1] * RING
        self._now = [device.new_event() for _ in range(NOW_RING)]
        self._now_i = 0
        self.step_events = frozenset(id(e) for e in self._ring)    # for stream-log checks
        self.last_use: dict[int, int] = {}      # tensor id -> epoch of its last kernel
        self.filled: dict[int, object] = {}     # tensor id -> event of the copy that filled it
        self._starts: list[int] = []            # free ranges with fences, sorted by start
        self._free: dict[int, list] = {}        # start -> [end, epoch, events]
        self.horizon = -1                       # ranges last used at or before: forgotten
        # arena offset -> event of a copy reading a block whose tensor stays in place (the step
        # guard's snapshot issued at an iteration's start, undo.py): if the block is freed
        # first, its next tenant waits for that copy too (FencedHeap.free)
        self.reading: dict[int, object] = {}

    # ---- compute events ---------------------------------------------------------------------
    def step_end(self, ids) -> None:
        """The step's kernels are queued: record its event; ``ids`` were used by them."""
        e = self.epoch
        lu = self.last_use
        for i in ids:
            lu[i] = e
        slot = e % RING
        self.device.record_compute(self._ring[slot])
        self._ring_epoch[slot] = e
        self.epoch = e + 1
        if self.epoch % RING == 0:
            self._forget(self.epoch - RING)

    def iteration_start(self) -> None:
        """A new iteration starts at ring slot 0 (the epochs in between are skipped), so every
        iteration records the same events at the same steps: what lets a tape (neuron/tape.py)
        recorded from one iteration stand for the next."""
        aligned = -(-self.epoch // RING) * RING
        if aligned != self.epoch:
            self.epoch = aligned
            self._forget(self.epoch - RING)
        self._now_i = 0

    def held_events(self) -> list:
        """The copy events these fences hold (Pool.carry_copies)."""
        return list(self.filled.values()) + list(self.reading.values()) + \
            [ev for _, _, evs in self._free.values() for ev in evs]

    def swap_events(self, swap) -> None:
        """Every held event ``ev`` becomes ``swap(ev)`` (Pool.carry_copies)."""
        self.filled = {t: swap(ev) for t, ev in self.filled.items()}
        self.reading = {o: swap(ev) for o, ev in self.reading.items()}
        for rng in self._free.values():
            if rng[2]:
                rng[2] = tuple(swap(ev) for ev in rng[2])

    def compute_event(self, epoch: int):
        """An event that completes after the kernels of steps up to ``epoch`` (None: none)."""
        if epoch < 0:
            return None
        if epoch >= self.epoch:                 # the running step: record now
            ev = self._now[self._now_i]
            self._now_i = (self._now_i + 1) % NOW_RING
            return self.device.record_compute(ev)
        epoch = max(epoch, self.epoch - RING)
        slot = epoch % RING
        if self._ring_epoch[slot] != epoch:     # skipped at an iteration's start: the next
            epoch = -(-epoch // RING) * RING    # recorded one (later, so still correct)
            slot = epoch % RING
            if epoch >= self.epoch or self._ring_epoch[slot] != epoch:
                return self.compute_event(self.epoch)
        return self._ring[slot]

    def tensor_epoch(self, tid: int) -> int:
        """The epoch of the last kernel that used tensor ``tid`` (the running one if unknown)."""
        return self.last_use.get(tid, self.epoch)

    def tensor_fence(self, tid: int) -> list:
        """The events a copy out of tensor ``tid`` waits for: its last kernel, and the copy
        that filled it if it has not been used since."""
        out = [self.compute_event(self.tensor_epoch(tid))]
        filled = self.filled.get(tid)
        if filled is not None:
            out.append(filled)
        return [e for e in out if e is not None]

    # ---- free ranges ------------------------------------------------------------------------
    def freed(self, start: int, size: int, epoch: int | None = None, events=()) -> None:
        """[start, start+size) is free; its last kernel ran in ``epoch`` (None: the running
        step) and ``events`` are copies that may still touch it."""
        self._starts.insert(bisect.bisect_left(self._starts, start), start)
        self._free[start] = [start + size, self.epoch if epoch is None else epoch, tuple(events)]

    def claim(self, start: int, size: int) -> tuple[int, list]:
        """[start, start+size) has a new tenant: (the epoch of its last kernel, the copies it
        must wait for); the fences of the parts outside it stay with them."""
        end = start + size
        starts, free = self._starts, self._free
        i = bisect.bisect_right(starts, start) - 1
        if i < 0 or free[starts[i]][0] <= start:
            i += 1
        epoch, events = self.horizon, []
        while i < len(starts) and starts[i] < end:
            s = starts[i]
            e, ep, evs = free.pop(s)
            del starts[i]
            if ep > epoch:
                epoch = ep
            events.extend(evs)
            if s < start:                       # the part before stays free, fences and all
                self.freed(s, start - s, ep, evs)
                i += 1
            if e > end:                         # and the part after
                self.freed(end, e - end, ep, evs)
                i += 1
        return epoch, events

    def _forget(self, before: int) -> None:
        """Drop free ranges last used before ``before`` with no copy on them (bounded memory):
        a later claim of one waits for ``horizon``, the newest forgotten epoch."""
        keep = []
        for s in self._starts:
            end, ep, evs = self._free[s]
            if ep < before and not evs:
                del self._free[s]
                self.horizon = max(self.horizon, ep)
            else:
                keep.append(s)
        self._starts = keep


class FencedHeap:
    """The pool's heap with fences: every successful ``try_alloc`` claims the range (a kernel
    tenant makes compute wait for the copies still reading it; a copy tenant, while
    ``copy_tenant`` is set, leaves them in ``claimed`` for its own stream to wait on) and every
    ``free`` records the range's fences. Everything else is the heap's own."""

    def __init__(self, impl, fences: BlockFences):
        self._impl = impl
        self.fences = fences
        self.copy_tenant = False
        self.claimed: tuple[int, list] = (-1, [])

    def __getattr__(self, name):
        return getattr(self._impl, name)

    def try_alloc(self, nbytes: int) -> int:
        return self._claim(self._impl.try_alloc(nbytes))

    def try_alloc_top(self, nbytes: int) -> int:
        return self._claim(self._impl.try_alloc_top(nbytes))

    def _claim(self, off: int) -> int:
        if off >= 0:
            epoch, events = self.fences.claim(off, self._impl.size_of(off))
            if self.copy_tenant:
                self.claimed = (epoch, events)
            else:
                wait = self.fences.device.compute_wait
                for ev in events:
                    wait(ev)
        return off

    def take_as_copy(self, take):
        """``take()``, an allocation whose first tenant is a copy or a codec kernel, not
        compute -> (its result, its claim: the epoch of the block's last kernel and the copies
        still reading it, for that tenant's stream to wait on). Nested calls restore the flag:
        ``take`` may evict a compressed tensor, whose staging block is claimed the same way
        (memory/compressed_swap.py). Clearing it there handed the outer block's claim to
        compute and left the outer copy the inner claim's stale fences, so a copy or a decode
        into a block an encode was still reading raced it (NaN under --compress on the GPU)."""
        saved, self.copy_tenant = self.copy_tenant, True
        try:
            r = take()
        finally:
            self.copy_tenant = saved
        return r, self.claimed

    def free(self, offset: int, epoch: int | None = None, events=()) -> None:
        reading = self.fences.reading.pop(offset, None) if self.fences.reading else None
        if reading is not None:
            events = (*events, reading)
        size = self._impl.size_of(offset)
        self._impl.free(offset)
        self.fences.freed(offset, size, epoch, events)
