"""The unified tensor pool (SuperNeurons §3.3): every tensor's bytes come from the device arena
through the heap, and a tensor may also live on the host.

Residency per tensor: on device, on host (offloaded), or absent (not yet made, or freed; a
recompute writes a fresh version). The LRU tensor cache of Algorithm 2: a step *locks* the
tensors it uses; when an allocation cannot be met, unlocked tensors are offloaded to host in
least-recently-used order until it can (only if the policy allows eviction). Prefetch brings a
host tensor back ahead of its use when that fits without evicting anything (how far ahead: the
executor's horizon, memory/prefetch_horizon.py; with it on, such a block lands at the top of
the arena and, until read, is evicted last).

The executor only speaks to this interface, so a policy changes what the pool does, never the
executor's plumbing. On the CPU copies are synchronous. On the GPU they run on a stream per
direction, ordered per block (memory/fences.py): a copy waits for the kernels that touch its
block, a kernel for the copies that touch its block, and a miss waits on the GPU, never on the
host. The decisions (what moves, when, where) are the same on every device, so a run moves what
its plan moves (memory/traffic.py checks it per iteration). An eviction the iteration before
recorded has its copy started right after the tensor's last use (``precopy``,
memory/evict_ahead.py), so that it runs under compute; the eviction itself stays where it was.
"""
from __future__ import annotations

import enum
import os
from collections import OrderedDict

import numpy as np

from ..errors import MemoryBudgetError
from .fences import BlockFences, FencedHeap
from .heap import Heap
from .host import HostPool
from .tensors import KIND_INDEX, Kind, TensorInfo
from .layout import TO_LOGICAL, storage_order, storage_shape

_WS = KIND_INDEX[Kind.WORKSPACE]


class Residency(enum.Enum):
    """Where a tensor is. A recomputed tensor's forward copy is ABSENT after its last forward
    use; its recomputed version is a tensor of its own."""
    ABSENT = "absent"                   # not made yet, freed, or dropped for recompute
    DEVICE = "device"
    PREFETCHING = "prefetching"         # in the arena, its copy from the host still in flight;
                                        # or its compressed bytes staged for the first reader
    HOST = "host"                       # offloaded (its copy to the host may be in flight)


class Pool:
    def __init__(self, device, block: int = 1024, strategy: str = "first_fit",
                 evict: bool = False, host_budget: int | None = None, compact: bool = False):
        self.device = device
        self.heap = Heap(device.arena_bytes, block=block, strategy=strategy)
        self._h = self.heap._impl               # unchecked calls on the hot path
        self._block = self.heap.block
        self.evict_enabled = evict
        # prefetches ahead of use land at the top of the arena (the executor's prefetch
        # horizon, memory/prefetch_horizon.py), out of the way of first-fit's allocations
        self.prefetch_top = False
        # with it, the tensors prefetched and not yet read: evicted only when nothing else
        # can be (they are needed sooner than what the cache kept since forward)
        self.unread: set[int] = set()
        # compaction: when the free bytes suffice but no single hole does, slide every tensor
        # down (first-fit refills from the bottom) so the free space becomes one block
        self.compact_enabled = compact
        # a planner's fallback eviction is for a real shortage, not for scattered free bytes
        self.compact_first = False
        self.compactions = self.moved_bytes = 0
        self.offset: dict[int, int] = {}        # on device: tensor id -> arena offset
        self.live: dict[int, TensorInfo] = {}   # on device
        self.host: dict[int, tuple] = {}        # on host: tensor id -> (tensor, buffer)
        self.lru: OrderedDict[int, TensorInfo] = OrderedDict()  # device tensors, oldest first
        self.locked: set[int] = set()
        self.pinned: set[int] = set()           # never evicted (parameters unless offloaded)
        # limit: what the plan may offload; cap: what the device may pin (CudaDevice.host_cap)
        self.host_pool = HostPool(device.host_allocator(), limit=host_budget,
                                  cap=getattr(device, "host_cap", None))
        self.held: list[int] = []               # raw regions kept to the iteration's end
        self.max_extent = 0                     # highest byte ever handed out
        self.by_kind = [0] * len(Kind)          # bytes on device by kind index, now
        self._peak_kinds = list(self.by_kind)
        self.by_dtype: dict[str, int] = {}      # tensor bytes on device by dtype name, now
        self._peak_dtypes: dict[str, int] = {}
        self._peak_used = 0
        self.tensor_high_water = 0      # the high-water mark of everything but workspaces
        self.step_peak = 0              # the most in use since the executor last reset it
        self.offload_bytes = self.prefetch_bytes = 0
        self.offload_count = self.prefetch_count = 0
        # persistent blocks (parameters under --offload-params) whose arena bytes equal their
        # home host buffer's (brought back from it, written by no kernel since): tensor id ->
        # that buffer. Evicting one copies nothing (its home still holds its bytes); written
        # blocks leave it (``written``): a layer's forward reads its weights, its update writes
        # them, so the weights go out once per iteration, not after each use
        self.clean: dict[int, object] = {}
        self.clean_drops = self.clean_bytes = 0
        # of those offloads, the ones made to find room (LRU eviction), not planned
        self.evictions = self.evicted_bytes = 0
        self.hits = self.misses = 0
        # asynchronous copies (CudaDevice: copy stream + events); the CPU copies synchronously
        self.async_copies = getattr(device, "async_copies", False)
        self.inflight: dict[int, object] = {}   # tensor id -> event of its prefetch
        # (event of a copy reading it, host buffer, its tensor's id if it is the buffer's home)
        self.deferred: list = []
        # tensors an in-flight collective reads and writes (distributed/overlap.py): tensor
        # id -> a call that waits for it (None in the plan, where nothing is in flight)
        self.collectives: dict[int, object] = {}
        self.host_pool.reclaim = self._reclaim_host
        # fences per block (memory/fences.py) where copies run on streams of their own: a copy
        # waits for the kernels that touch its block, a kernel for the copies that touch its
        # block, nothing else
        self.fences = None
        if self.async_copies and hasattr(device, "record_compute"):
            self.fences = BlockFences(device)
            self._h = FencedHeap(self._h, self.fences)
        # tensors on the host whose copy out of the arena may be in flight: id -> its event
        # (a copy back waits for it: the copy streams of the two directions are not ordered)
        self.outbound: dict[int, object] = {}
        # CUDA-event times of copies and steps (memory/overlap.py), where the device keeps them
        self.overlap = None
        if self.fences is not None and hasattr(device, "timeline") and \
                os.environ.get("NEURON_OVERLAP", "1") != "0":
            from .overlap import Timeline
            self.overlap = device.timeline = Timeline(device)
        attach = getattr(device, "attach_heap", None)
        if attach is not None:  # CuPy temporaries come out of the same budget (CudaDevice)
            attach(self._h if self.fences is not None else self.heap)
        # planned offloads whose arena block is kept until their copy is done (by the plan's
        # clock: Decisions.release_after), so that the copy overlaps compute instead of
        # stalling it: (tensor, offset, event, whether the block is a compressed offload's
        # staging block rather than the tensor's own, the step after which it is released)
        self.draining: list = []
        # the simulated clock's input (memory/clock.py): copies and compactions as they happen
        self.log: list | None = None
        # COMPRESS (memory/compressed_swap.py): tensor id -> codec, for what goes to the host
        self.codecs: dict = {}
        # prefetched compressed tensors, still on the host: tensor id -> (offset of the
        # staging block that holds the compressed bytes until the first reader decodes them,
        # the event of the copy into it)
        self.staged: dict[int, tuple] = {}
        # host buffers of tensors on the host that a copy may still read (a staged tensor
        # evicted before its copy was known done): tensor id -> that copy's event
        self.reading: dict[int, object] = {}
        # compressed ones offloaded as they are, for want of room for the staging block:
        # tensor id -> its codec, back in ``codecs`` once it leaves the host
        self.uncompressed: dict = {}
        # evictions on the plan's schedule (memory/evict_ahead.py): the running iteration's
        # recorder or schedule (None: neither), and the tensors whose copy to the host started
        # ahead of their eviction while they stay resident: id -> (host buffer, its event)
        self.ahead = None
        self.precopied: dict[int, tuple] = {}
        self.evictions_ahead = self.ahead_fallbacks = 0

    # ---- allocation -------------------------------------------------------------------
    def _take(self, nbytes: int, what, step, top: bool = False) -> int:
        """An arena offset for nbytes: evicting LRU unlocked tensors if allowed (until the free
        bytes suffice), compacting if allowed (when they suffice but are scattered); ``top``:
        at the top of the highest hole that fits (heap.try_alloc_top)."""
        h = self._h
        off = h.try_alloc_top(nbytes) if top else h.try_alloc(nbytes)
        if off < 0:
            off = self._make_room(nbytes)
            if off < 0:
                raise self.budget_error(what, step, nbytes)
        b = self._block
        end = off - (-nbytes // b) * b
        if end > self.max_extent:
            self.max_extent = end
        return off

    def _make_room(self, nbytes: int) -> int:
        """Evict LRU unlocked tensors until a hole fits (the paper's cache); when nothing is
        left to evict and the free bytes suffice but are scattered, compact. Compaction is the
        last resort: it walks every resident tensor."""
        h = self._h
        off = -1
        # a block kept for its offload's copy goes first: releasing it waits for a copy
        # already under way, where evicting a tensor would start another (not for what
        # may not evict: a prefetch or a staging block waits for the release instead)
        while off < 0 and self.evict_enabled and self.draining:
            self._release(self.draining.pop(0))
            off = h.try_alloc(nbytes)
        if off < 0 and self.compact_first and self.compact_enabled and \
                h.free_bytes >= -(-nbytes // self._block) * self._block:
            self.compact()
            off = h.try_alloc(nbytes)
        while off < 0 and self.evict_enabled:
            if self.unread and self._unread_left_only(nbytes):
                # what is left to evict was prefetched for a step soon: where the free
                # bytes suffice, gather them rather than send it back to the host
                self.unread.clear()
                self.compact()
            elif not self._evict_one():
                break
            off = h.try_alloc(nbytes)
        if off < 0 and self.compact_enabled and \
                h.free_bytes >= -(-nbytes // self._block) * self._block:
            self.compact()
            off = h.try_alloc(nbytes)
        return off

    def compact(self) -> None:
        """Slide every arena tensor to the lowest hole that takes it, in address order.

        Legal between kernels: the executor makes a step's views only after all of the step's
        allocations, so nothing holds an address across a move. First-fit puts each tensor at
        or below where it was, so the sweep leaves the free space in one block at the top
        (raw regions such as a baseline's held workspaces stay where they are)."""
        h, dev = self._h, self.device
        self.compactions += 1
        if self.fences is not None:     # copies still reading blocks that stay put (the step
            for ev in {id(e): e for e in self.fences.reading.values()}.values():
                dev.compute_wait(ev)    # guard's snapshots): a move may write where they read
        copy_tenant = getattr(h, "copy_tenant", False)
        if copy_tenant:
            h.copy_tenant = False           # the moves are compute's: kernels wait on claims
        for tid, off in sorted(self.offset.items(), key=lambda kv: kv[1]):
            t = self.live[tid]
            h.free(off)
            new = h.try_alloc(t.nbytes or 1)
            if new != off:
                if self.inflight:
                    self._settle(t)
                if self.precopied and tid in self.precopied:
                    ev = self.precopied[tid][1]
                    if ev is not None:      # the move may overwrite what its copy reads
                        dev.compute_wait(ev)
                if self.collectives:
                    self._settle_collective(tid)
                dev.move(off, new, t.nbytes)
                self.offset[tid] = new
                self.moved_bytes += t.nbytes
                if self.fences is not None:     # the move used it in the running step
                    self.fences.last_use[tid] = self.fences.epoch
                if self.log is not None:
                    self.log.append(("compact", tid, t.nbytes))
        if copy_tenant:
            h.copy_tenant = True

    def _rounded(self, nbytes: int) -> int:
        b = self._block
        return -(-nbytes // b) * b

    def _account(self, kind_index: int, nbytes: int) -> None:
        bk = self.by_kind
        bk[kind_index] += nbytes
        if nbytes > 0:
            u = self._h.used_bytes
            if u > self.step_peak:
                self.step_peak = u
            if u >= self._peak_used:        # a new high-water mark: remember its make-up
                self._peak_used = u
                self._peak_kinds = list(bk)
                self._peak_dtypes = dict(self.by_dtype)
            if kind_index != _WS and u - bk[_WS] > self.tensor_high_water:
                self.tensor_high_water = u - bk[_WS]

    def _account_tensor(self, t: TensorInfo, sign: int) -> None:
        b = self._block
        n = -(-(t.nbytes or 1) // b) * b
        bd = self.by_dtype
        if t.dtype_parts:               # a block: its members' types, the rounding the first's
            slack = n - t.nbytes
            for name, pb in t.dtype_parts:
                bd[name] = bd.get(name, 0) + sign * (pb + slack)
                slack = 0
        else:
            bd[t.dtype_name] = bd.get(t.dtype_name, 0) + sign * n
        if t.parts:                     # a parameter block: split by its members' kinds
            bk = self.by_kind
            for k, pb in t.parts:
                bk[k] += sign * pb
                n -= pb
        self._account(t.kind_index, sign * n)

    @property
    def by_kind_at_peak(self) -> dict:
        return {k: self._peak_kinds[i] for k, i in KIND_INDEX.items()}

    @property
    def by_dtype_at_peak(self) -> dict:
        """Tensor bytes by dtype name at the high-water mark (workspaces: by_kind_at_peak)."""
        return {n: b for n, b in self._peak_dtypes.items() if b}

    def alloc(self, t: TensorInfo, step=None, pin: bool = False):
        """Place t in the arena; a pinned tensor is never evicted (nor kept in the LRU)."""
        if t.id in self.offset or t.id in self.host:
            raise RuntimeError(f"{t.name} allocated twice")
        n = t.nbytes or 1
        off = self._take(n, t, step)
        self.offset[t.id] = off
        self.live[t.id] = t
        if pin:
            self.pinned.add(t.id)
        else:
            self.lru[t.id] = t
        self._account_tensor(t, 1)
        if self.fences is not None:     # written, if at all, by the running step's kernels
            self.fences.last_use[t.id] = self.fences.epoch
        return self.device.view(off, t.shape, t.dtype)

    def budget_error(self, t, step=None, nbytes: int | None = None):
        h = self.heap
        need = h.round(max(nbytes if nbytes is not None else t.nbytes, 1))
        where = f"step {step.name}" if step is not None else "setup"
        if isinstance(t, TensorInfo):
            name = t.name
        else:       # a workspace: named only when it fails (names cost time on the hot path)
            name = t or f"workspace:{getattr(step, 'name', '?')}"
        kind = f"{t.kind.value}, shape {t.shape}" if isinstance(t, TensorInfo) else "workspace"
        return MemoryBudgetError(
            f"{where}: cannot allocate {name} ({kind}) of {need} bytes in an arena of {h.size} "
            f"bytes: largest free block {h.largest_free}, free {h.free_bytes} "
            f"({need - h.largest_free} bytes short)",
            step=getattr(step, "name", None), tensor=name, requested=need,
            largest_free=h.largest_free, free_bytes=h.free_bytes, budget=h.size)

    def free(self, t: TensorInfo) -> None:
        """Drop a tensor wherever it is."""
        if self.inflight and self.fences is None:
            self._settle(t)
        if t.id in self.collectives:
            self._settle_collective(t.id)
            self.unpin_collective([t])
        if t.id in self.offset:
            off = self.offset.pop(t.id)
            if self.precopied and t.id in self.precopied:
                self._drop_precopy(t, off)
            self._account_tensor(t, -1)
            if self.fences is not None:
                self._fenced_free(t, off)
            else:
                self._h.free(off)
            del self.live[t.id]
            self.lru.pop(t.id, None)
        elif t.id in self.host:
            if self.staged and t.id in self.staged:
                from .compressed_swap import drop_staged
                drop_staged(self, t)
            buf = self.host.pop(t.id)[1]
            self.outbound.pop(t.id, None)   # a later copy into buf follows it on its stream
            self.release_host(t, buf, self.reading.pop(t.id, None) if self.reading else None)
            if self.uncompressed and t.id in self.uncompressed:
                self.codecs[t.id] = self.uncompressed.pop(t.id)
        self.locked.discard(t.id)

    def alloc_bytes(self, nbytes: int, what: str | None = None, step=None) -> int:
        """A raw region (a workspace); returns its offset."""
        off = self._take(nbytes, what, step)
        self._account(_WS, self._rounded(nbytes))
        return off

    def free_bytes(self, offset: int) -> None:
        self._account(_WS, -self._h.size_of(offset))
        self._h.free(offset)

    def hold_bytes(self, offset: int) -> None:
        """Keep a raw region until release_held (the baseline policy frees nothing early)."""
        self.held.append(offset)

    def release_held(self) -> None:
        """At the end of an iteration: the held raw regions go (and every block counts as
        written: an iteration starts with no clean block, whatever wrote them in between)."""
        self.unread.clear()
        self.clean.clear()
        for off in self.held:
            self.free_bytes(off)
        self.held.clear()
        if self.overlap is not None:
            self.overlap.iteration_end()
        if self.fences is not None:
            self.fences.iteration_start()
            start = getattr(self.device, "iteration_start", None)
            if start is not None:
                start()

    def carry_copies(self) -> None:
        """At an iteration's very end: the copy events still held (fences, host buffers being
        read) come from the device's per-stream rings, whose slots depend on how many copies
        the iteration issued; the first iteration (algorithm search, first placements) issues
        other copies than the next, so its successor would wait on other events than the
        third, and a tape (neuron/tape.py) be trusted an iteration later. Each becomes its
        stream's carry event, recorded now after all of that stream's copies: the same object
        every iteration, completing later than the one it replaces (a waiter waits longer,
        never less)."""
        stream_of = getattr(self.device, "copy_stream_of", None)
        if self.fences is None or stream_of is None:
            return
        holders = (self.fences, self.host_pool)
        held = [ev for h in holders for ev in h.held_events() if ev is not None]
        streams = sorted({p for p in map(stream_of, held) if p is not None})
        if not streams:
            return
        carried = self.device.carry_copies(tuple(streams))

        def swap(ev):
            return carried.get(stream_of(ev), ev)
        for h in holders:
            h.swap_events(swap)

    # ---- residency --------------------------------------------------------------------
    def view(self, t: TensorInfo):
        """The array kernels read and write for t: its logical shape, with channels-last
        strides where the layout stores it so (memory/layout.py). Byte copies take the raw
        ``device.view`` instead."""
        off = self.offset[t.parent.id] + t.byte_offset if t.parent is not None else \
            self.offset[t.id]
        if t.channels_last:
            return self.device.channels_last_view(off, t.shape, t.dtype)
        return self.device.view(off, t.shape, t.dtype)

    def state(self, t: TensorInfo) -> Residency:
        tid = t.storage.id
        if tid in self.offset:
            return Residency.PREFETCHING if tid in self.inflight else Residency.DEVICE
        if tid in self.host:
            return Residency.PREFETCHING if tid in self.staged else Residency.HOST
        return Residency.ABSENT

    def resident(self, t: TensorInfo) -> bool:
        return t.storage.id in self.offset

    def lock(self, ids) -> None:
        if self.precopied:              # used again before its eviction: its early copy goes
            for i in ids:
                if i in self.precopied:
                    self._drop_precopy(self.live[i])
        self.locked.update(ids)

    def unlock(self, ids) -> None:
        """The step that used ``ids`` has queued its kernels."""
        if self.fences is not None:
            if self.overlap is not None:
                self.overlap.step_end()
            f = self.fences
            f.step_end(ids)
            if f.filled:            # compute waited for these copies in this step
                for i in ids:
                    f.filled.pop(i, None)
        self.locked.difference_update(ids)
        lru = self.lru
        for i in ids:
            if i in lru:
                lru.move_to_end(i)              # most recently used

    def ensure_all(self, tensors, step=None) -> None:
        offset, inflight = self.offset, self.inflight
        if self.unread:
            self.unread.difference_update(t.id for t in tensors)
        for t in tensors:
            if t.id in offset:
                self.hits += 1
                if inflight and t.id in inflight:   # prefetched: the kernel waits on the GPU
                    self.device.compute_wait(inflight.pop(t.id))
            else:
                self.ensure(t, step)
        if self.deferred:
            self._reap()

    def _reap(self) -> None:
        """Host buffers released while a copy still reads them go back to the host pool, each
        with that copy's event: the next copy into one waits for it on the device (offload).
        The same buffers come back at the same steps every iteration, whatever the copies'
        timing: what lets a recorded iteration repeat (neuron/tape.py; asking is_done here
        made the 4,292-deep ResNet's records differ on the H200)."""
        for ev, buf, home in self.deferred:
            self.host_pool.put(buf, pending=ev, home=home)
        self.deferred = []

    def release_host(self, t: TensorInfo, buf, reading=None) -> None:
        """``t`` left its host buffer ``buf`` (kept as its home if ``t`` is persistent:
        memory/host.py); ``reading``: the event of a copy still reading it."""
        home = t.id if t.persistent else None
        if reading is None:
            self.host_pool.put(buf, home=home)
        else:
            self.deferred.append((reading, buf, home))

    def _reclaim_host(self, nbytes: int) -> None:
        """The plan releases a prefetched tensor's host buffer at the prefetch; its copy may
        still be reading it. Before that counts as over the host budget, every such buffer
        goes back now (_reap: the next copy into one waits for that copy on the device; the
        host never blocks), so the plan's host budget holds."""
        self._reap()

    def _fenced_free(self, t: TensorInfo, off: int) -> None:
        """Free t's block with its fences: its last kernel (the running step's if the step
        uses it) and a prefetch into it that no kernel waited for."""
        f = self.fences
        ev = self.inflight.pop(t.id, None) if self.inflight else None
        f.filled.pop(t.id, None)
        epoch = f.epoch if t.id in self.locked else f.tensor_epoch(t.id)
        self._h.free(off, epoch, () if ev is None else (ev,))

    def _settle(self, t: TensorInfo) -> None:
        """Before a prefetched block is freed or moved: order compute after its copy."""
        ev = self.inflight.pop(t.id, None)
        if ev is not None:
            self.device.compute_wait(ev)

    def pin_collective(self, tensors, wait=None) -> None:
        """A collective (a gradient bucket's all-reduce) works on these tensors in place until
        it completes: like pinned parameters they leave the LRU (never evicted); ``wait``
        (a call, in a real run) is made before one is moved, offloaded or freed, as an
        in-flight prefetch is settled first."""
        for t in tensors:
            self.lru.pop(t.id, None)
            self.pinned.add(t.id)
            self.collectives[t.id] = wait

    def unpin_collective(self, tensors) -> None:
        for t in tensors:
            if t.id in self.collectives:
                del self.collectives[t.id]
                self.pinned.discard(t.id)
                if t.id in self.offset:
                    self.lru[t.id] = t

    def _settle_collective(self, tid: int) -> None:
        wait = self.collectives.get(tid)
        if wait is not None:
            wait()

    def alloc_all(self, tensors, step=None) -> None:
        """Place a step's outputs (no views: the step makes its own after all of them). A
        pool that hooks ``alloc`` (the recorder, the malloc baseline) keeps going through it;
        this one takes the arena's fast path, as a simulation places millions of tensors."""
        if type(self).alloc is not Pool.alloc:
            for t in tensors:
                self.alloc(t, step)
            if self.overlap is not None:
                self.overlap.step_start()
            return
        offset, host, live, lru, h = self.offset, self.host, self.live, self.lru, self._h
        b = self._block
        for t in tensors:
            tid = t.id
            if tid in offset or tid in host:
                raise RuntimeError(f"{t.name} allocated twice")
            n = t.nbytes or 1
            off = h.try_alloc(n)
            if off < 0:
                off = self._take(n, t, step)
            else:
                end = off - (-n // b) * b
                if end > self.max_extent:
                    self.max_extent = end
            offset[tid] = off
            live[tid] = t
            lru[tid] = t
            self._account_tensor(t, 1)
        if self.overlap is not None:    # the step's waits are issued: its kernels come next
            self.overlap.step_start()

    def free_all(self, tensors) -> None:
        offset, h, live, lru = self.offset, self._h, self.live, self.lru
        fenced = self.fences is not None
        for t in tensors:
            if self.inflight and not fenced:
                self._settle(t)
            if t.id in self.collectives:
                self._settle_collective(t.id)
                self.unpin_collective([t])
            off = offset.pop(t.id, None)
            if off is None:                 # on the host, or a block: the general path
                self.free(t)
                continue
            if self.precopied and t.id in self.precopied:
                self._drop_precopy(t, off)
            self._account_tensor(t, -1)
            if fenced:
                self._fenced_free(t, off)
            else:
                h.free(off)
            del live[t.id]
            lru.pop(t.id, None)
            self.locked.discard(t.id)

    def ensure(self, t: TensorInfo, step=None):
        """Make t resident for a step (a cache hit, or a miss that copies it back now)."""
        if t.id in self.offset:
            self.hits += 1
            return
        if t.id not in self.host:
            raise RuntimeError(f"step {getattr(step, 'name', '?')}: {t.name} is needed but was "
                               "never produced or already freed (a schedule bug)")
        if self.staged and t.id in self.staged:     # prefetched compressed: decoded now
            self.hits += 1
        else:
            self.misses += 1
        self._bring_back(t, step)

    def _bring_back(self, t: TensorInfo, step, ahead: bool = False) -> None:
        plain = t.id in self.uncompressed           # on the host as it is
        if t.id in self.codecs and not plain:       # a miss or a staged one's first reader
            from .compressed_swap import bring_back_compressed, decode_staged
            if t.id in self.staged:
                return decode_staged(self, t, step, self.codecs[t.id])
            return bring_back_compressed(self, t, step, self.codecs[t.id])
        _, buf = self.host[t.id]
        n = t.nbytes or 1
        fences = self.fences
        top = ahead and self.prefetch_top
        if top:
            self.unread.add(t.id)
        claim = None
        if fences is not None:      # the copy, not compute, is the block's first tenant
            off, claim = self._h.take_as_copy(lambda: self._take(n, t, step, top))
        else:
            off = self._take(n, t, step, top)
        del self.host[t.id]
        self.offset[t.id] = off
        self.live[t.id] = t
        self.lru[t.id] = t
        self._account_tensor(t, 1)
        view = self.device.view(off, t.shape, t.dtype)
        if fences is not None:
            # after the block's last kernel and the copies still reading it, and after the
            # copy that filled buf; a prefetch: the consumer's kernel waits on the event
            # (ensure_all); a miss: compute waits on the GPU at once, the host never does
            epoch, after = claim
            fence = fences.compute_event(epoch)
            after = ([fence] if fence is not None else []) + list(after)
            out = self.outbound.pop(t.id, None)
            if out is not None:
                after.append(out)
            ev = self.device.prefetch(buf[:t.nbytes], view, compute_waits=not ahead,
                                      after=after)
            if ahead:
                self.inflight[t.id] = ev
            fences.filled[t.id] = ev
            fences.last_use[t.id] = -1
            self.release_host(t, buf, ev)
        elif ahead and self.async_copies:
            # a prefetch: the copy stream works while compute runs the current step; the
            # consumer's kernel waits on the event (ensure_all), the buffer is reused once done
            ev = self.device.prefetch(buf[:t.nbytes], view, compute_waits=False)
            self.inflight[t.id] = ev
            self.release_host(t, buf, ev)
        else:
            self.device.copy_to_device(buf, view, t.nbytes)
            self.release_host(t, buf)
        self.prefetch_bytes += t.nbytes
        self.prefetch_count += 1
        if self.log is not None:
            self.log.append(("prefetch" if ahead else "fetch", t.id, t.nbytes))
        if plain:
            self.codecs[t.id] = self.uncompressed.pop(t.id)
        elif t.persistent:              # its arena bytes are its home buffer's (clean)
            self.clean[t.id] = buf
        if ahead and self.ahead is not None:
            self.ahead.arrived(t.id)

    def prefetch(self, t: TensorInfo) -> bool:
        """Bring t back ahead of use if that needs no eviction (a compressed one: its
        compressed bytes only, decoded at its first reader, memory/compressed_swap.py)."""
        if t.id not in self.host:
            return False
        if self.staged and t.id in self.staged:
            return True                 # on its way already
        if t.id in self.codecs:
            from .compressed_swap import stage_compressed
            return stage_compressed(self, t, self.codecs[t.id])
        if not self._h.can_alloc(t.nbytes or 1):
            return False
        saved, self.evict_enabled = self.evict_enabled, False
        try:
            self._bring_back(t, None, ahead=True)
        finally:
            self.evict_enabled = saved
        return True

    def offload(self, t: TensorInfo, defer: bool = False, until: int | None = None) -> None:
        """Move a device tensor to a host buffer and free its arena block (``defer``: keep
        the block until ``release_draining`` reaches step ``until``, so the copy can overlap
        the kernels up to it)."""
        if t.id in self.codecs:         # through a staging block, on the codec stream
            from .compressed_swap import offload_compressed
            return offload_compressed(self, t, self.codecs[t.id], defer, until)
        home = self.clean.pop(t.id, None) if self.clean else None
        if home is not None and not defer and self._still_home(t, home):
            return self._drop_clean(t, home)
        fences = self.fences
        if self.inflight and fences is None:
            self._settle(t)
        if self.collectives:
            self._settle_collective(t.id)
        # its copy started ahead (precopy: the tensor is unchanged since), or one now
        early = self.precopied.pop(t.id, None) if self.precopied else None
        if early is None:
            buf = self.host_pool.get(t.nbytes, home=t.id if t.persistent else None)
            ev = None
        else:
            buf, ev = early
        off = self.offset.pop(t.id)
        view = self.device.view(off, t.shape, t.dtype)
        epoch = -1
        if fences is not None:
            # after the last kernel that used t (and the copy that filled it, if none did);
            # nothing else. The block's next tenant waits for this copy (claim), not compute
            # now: an eviction stalls no kernel that does not touch the block
            pre = self.inflight.pop(t.id, None) if self.inflight else None
            if early is None:
                ev = self._copy_out(t, view, buf, pre)
            epoch = fences.epoch if t.id in self.locked else fences.tensor_epoch(t.id)
            fences.filled.pop(t.id, None)
            self.outbound[t.id] = ev
        elif early is not None:
            if ev is not None and not defer:    # as below: later kernels may overwrite it
                self.device.compute_wait(ev)
        else:
            # copy stream, after the producer; unless deferred, compute waits for the copy on
            # the GPU before any later kernel (which may overwrite the block), so the host
            # never blocks and the block can be reused at once (the CPU copies now: no event)
            ev = self._copy_out(t, view, buf)
            if ev is not None and not defer:
                self.device.compute_wait(ev)
        if defer:
            self.draining.append((t, off, ev, False, until))
        else:
            self._account_tensor(t, -1)
            if fences is not None:
                self._h.free(off, epoch, (ev,))
            else:
                self._h.free(off)
        del self.live[t.id]
        self.lru.pop(t.id, None)
        self.pinned.discard(t.id)
        self.host[t.id] = (t, buf)
        self.offload_bytes += t.nbytes
        self.offload_count += 1
        if self.log is not None:
            self.log.append(("offload_async" if defer else "offload", t.id, t.nbytes))

    def _still_home(self, t: TensorInfo, home) -> bool:
        """Whether ``home``, the buffer clean ``t`` came back from, still holds its bytes for
        it (the host pool may have given homes back under its pinned-memory cap)."""
        if self.deferred:               # its release may wait for its copy's event: settle
            self._reap()                # it now, as the plan (no events) already has
        return self.host_pool.home_of(t.id) is home and \
            not (self.precopied and t.id in self.precopied)

    def _drop_clean(self, t: TensorInfo, home) -> None:
        """Evict clean ``t`` without a copy: its home buffer holds its bytes (``clean``)."""
        buf = self.host_pool.get(t.nbytes, home=t.id)   # the home, in use again
        off = self.offset.pop(t.id)
        self._account_tensor(t, -1)
        if self.fences is not None:     # its last kernel; a prefetch no kernel waited for
            self.outbound.pop(t.id, None)
            self._fenced_free(t, off)
        else:
            if self.inflight:
                self._settle(t)
            self._h.free(off)
        del self.live[t.id]
        self.lru.pop(t.id, None)
        self.pinned.discard(t.id)
        self.host[t.id] = (t, buf)
        self.clean_drops += 1
        self.clean_bytes += t.nbytes
        if self.log is not None:
            self.log.append(("offload_clean", t.id, 0))

    def written(self, blocks) -> None:
        """A step's kernels wrote these persistent blocks: their home buffers are stale."""
        clean = self.clean
        for b in blocks:
            clean.pop(b.id, None)

    def release_draining(self, step: int | None = None) -> None:
        """Free the blocks of deferred offloads due by ``step`` (None: all of them); later
        kernels wait for their copies."""
        keep = []
        for entry in self.draining:
            if step is not None and entry[4] is not None and entry[4] > step:
                keep.append(entry)
            else:
                self._release(entry)
        self.draining = keep

    def _release(self, entry) -> None:
        t, off, ev, staging, _ = entry
        if self.fences is not None:     # its next tenant waits for the copy (claim)
            evs = () if ev is None else (ev,)
            if staging:                 # a compressed offload's (memory/compressed_swap.py):
                self._account(_WS, -self._h.size_of(off))    # no kernel of compute used it
                self._h.free(off, -1, evs)
            else:
                self._account_tensor(t, -1)
                self._h.free(off, self.fences.tensor_epoch(t.id), evs)
        else:
            if ev is not None:
                self.device.compute_wait(ev)
            if staging:
                self.free_bytes(off)
            else:
                self._account_tensor(t, -1)
                self._h.free(off)
        if self.log is not None:
            self.log.append(("drain", t.id, 0))

    def place_on_host(self, t: TensorInfo, value=None) -> None:
        """Create t directly on the host (parameters under --offload-params)."""
        buf = self.host_pool.get(t.nbytes, home=t.id if t.persistent else None)
        reading = self.host_pool.pending_read(buf)
        if reading is not None:             # the host writes it: the copy must be done
            self.device.wait(reading)
        if value is not None and self.device.computes:
            buf[:t.nbytes] = storage_order(value, t).reshape(-1).view(np.uint8)
        self.host[t.id] = (t, buf)

    def host_view(self, t: TensorInfo) -> np.ndarray:
        """A member's or tensor's bytes while it is on the host (CPU arrays)."""
        _, buf = self.host[t.storage.id]
        raw = buf[t.byte_offset:t.byte_offset + t.nbytes].view(t.dtype)
        if t.channels_last:         # stored N, H, W, C (memory/layout.py)
            return raw.reshape(storage_shape(t.shape)).transpose(TO_LOGICAL)
        return raw.reshape(t.shape)

    def _unread_left_only(self, nbytes: int) -> bool:
        """Whether compaction would make room for ``nbytes`` and the only tensors left to
        evict are prefetched ones not yet read."""
        if not self.compact_enabled or self._h.free_bytes < self._rounded(nbytes):
            return False
        skip = self.locked | self.unread
        return all(tid in skip for tid in self.lru)

    def _evict_one(self) -> bool:
        locked = self.locked
        if self.unread:     # a prefetched tensor not yet read goes last
            skip = locked | self.unread
            tid = next((tid for tid in self.lru if tid not in skip), None)
            if tid is None:
                self.unread.clear()
            else:
                locked = skip
        for tid, t in self.lru.items():     # oldest first; pinned tensors are never in it
            if tid not in locked:
                if self.staged and tid in self.staged:     # its bytes are on the host still
                    from .compressed_swap import drop_staged
                    drop_staged(self, t)
                else:
                    self.evictions += 1
                    self.evicted_bytes += t.nbytes
                    if self.precopied and tid in self.precopied:
                        self.evictions_ahead += 1
                    elif self.ahead is not None and tid not in self.codecs:
                        self.ahead.evicted(t)
                    self.offload(t)
                return True
        return False

    # ---- early copies of evictions (memory/evict_ahead.py) ------------------------------
    def precopy(self, t: TensorInfo) -> bool:
        """Start copying resident tensor ``t`` to a host buffer ahead of its eviction, leaving
        it resident and in the LRU (False: it cannot start: not an evictable resident tensor,
        compressed, or no host room). The eviction then frees its block without a copy."""
        tid = t.id
        if tid not in self.lru or tid in self.locked or tid in self.precopied or \
                tid in self.codecs or tid in self.collectives or \
                (self.staged and tid in self.staged):
            return False
        hp = self.host_pool
        if not hp.can_get(t.nbytes):
            return False
        buf = hp.get(t.nbytes, home=tid if t.persistent else None)
        view = self.device.view(self.offset[tid], t.shape, t.dtype)
        # after the last kernel that used it (and its prefetch, which stays in flight)
        pre = self.inflight.get(tid) if self.inflight else None
        self.precopied[tid] = (buf, self._copy_out(t, view, buf, pre))
        if self.log is not None:
            self.log.append(("precopy", tid, t.nbytes))
        return True

    def _copy_out(self, t: TensorInfo, view, buf, pre=None):
        """Issue the copy of resident ``t`` (its block seen as ``view``) into host buffer
        ``buf``: with fences, after the last kernel that used t (``pre``: and the copy that
        filled it) and after buf's last prefetch, which may still read it; on a device with
        a copy stream, after buf's reader; else now, on the host. Its event (None: done)."""
        if self.fences is not None:
            after = self.fences.tensor_fence(t.id)
            if pre is not None:
                after.append(pre)
            reading = self.host_pool.pending_read(buf)
            if reading is not None:
                after.append(reading)
            return self.device.offload(view, buf[:t.nbytes], after=after)
        if self.async_copies:
            reading = self.host_pool.pending_read(buf)
            if reading is not None:
                self.device.wait(reading)
            return self.device.offload(view, buf[:t.nbytes])
        self.device.copy_to_host(view, buf, t.nbytes)
        return None

    def drop_precopies(self) -> None:
        """The iteration ends: early copies whose eviction did not come are dropped (a
        persistent tensor's block may be written before the next one: undo, updates)."""
        for tid in list(self.precopied):
            self._drop_precopy(self.live[tid])

    def _drop_precopy(self, t: TensorInfo, off: int | None = None) -> None:
        """``t`` is used again or freed before its eviction: its early copy is dropped (its
        buffer back once the copy is done; what writes the block waits for the copy: the
        block's next tenant where ``off`` is being freed, else the next kernel)."""
        buf, ev = self.precopied.pop(t.id)
        self.ahead_fallbacks += 1
        self.release_host(t, buf, ev)
        if ev is not None:
            reading = self.fences.reading if self.fences is not None else None
            if off is not None and reading is not None and off not in reading:
                reading[off] = ev
            else:
                self.device.compute_wait(ev)
        if self.log is not None:
            self.log.append(("precopy_drop", t.id, 0))

    # ---- statistics -------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._h.used_bytes

    @property
    def high_water(self) -> int:
        return self._h.high_water

    def counters(self) -> dict:
        return {"offload_bytes": self.offload_bytes, "prefetch_bytes": self.prefetch_bytes,
                "offloads": self.offload_count, "prefetches": self.prefetch_count,
                "evictions": self.evictions, "evicted_bytes": self.evicted_bytes,
                "evictions_ahead": self.evictions_ahead, "ahead_fallbacks": self.ahead_fallbacks,
                "clean_evictions": self.clean_drops, "clean_evicted_bytes": self.clean_bytes,
                "cache_hits": self.hits, "cache_misses": self.misses,
                "compactions": self.compactions, "compacted_bytes": self.moved_bytes,
                "host_peak_bytes": self.host_pool.peak_bytes}
