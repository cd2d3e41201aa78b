"""CudaDevice: the arena is ONE cudaMalloc; every tensor is a zero-copy CuPy view into it.

Layout of the single allocation (its size is the memory budget, nothing more)::

    base                                   base + arena_bytes     base + budget
    |---------------- pool region ----------------|--- scratch ---|
      managed by the Pool's Heap (offsets)          optional (default 0 bytes): CuPy
                                                    temporaries before a pool attaches

Outside it, only what cannot be avoided: the cuDNN and cuBLAS handles, CUDA contexts and kernel
images, and whatever cuDNN allocates internally. That is why construction measures the free
memory before and after creating the handles and leaves ``headroom_bytes`` unallocated.

Streams. Kernels run on ``compute_stream`` (made CuPy's current stream; the cuDNN handle
follows the current stream). Offloads (device to pinned host) run on ``d2h_stream`` and
prefetches (host to device) on ``h2d_stream``, so the two directions run at once (full duplex)
and both overlap compute; ``codec_stream`` (de)compresses FreeLunch's compressed swaps
(``encode``/``decode``) and ``snapshot_stream`` carries the step guard's copies (undo.py), so
they never queue ahead of a prefetch. Each copy waits for exactly the events it is given
(``after``): the pool passes the fences of the copy's block (memory/fences.py), recorded on
compute with ``record_compute``, so a copy never waits for compute it does not depend on.
Without ``after`` a copy waits for all compute queued so far (the safe default for callers that
know no better). An arena block whose contents are being offloaded may be reused only after
the offload's event: its next tenant waits for it (``compute_wait`` or a copy's ``after``).

CuPy's own temporaries (reduction scratch, ``cupy.asarray`` of host data, ...) are routed into the
arena with ``cupy.cuda.set_allocator``: the Pool attaches its heap (``attach_heap``) when it is
created, so they are served from the same budget as every tensor, and one that cannot fit is a
MemoryBudgetError naming the kernel and layer that asked for it. No byte escapes the budget.

Host buffers for offloaded tensors are the pool's (memory/host.py HostPool), allocated pinned
through :func:`pinned_empty` (kernels/pinned_host.py). The pointer bookkeeping (ArenaLayout,
ArenaAllocator) is pure Python so it is tested on machines without a GPU.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time

import numpy as np

from . import Device
from .capture_scope import CaptureScope, record_external
from ..errors import MemoryBudgetError
from ..kernels.pinned_host import pinned_empty, pinned_host_bytes
from ..memory.host_budget import default_host_cap

MiB = 1 << 20

DEFAULT_HEADROOM = 512 * MiB       # cuDNN/cuBLAS workspaces and engines created after start-up
_VIEW_CACHE = 1 << 15             # cached arena views (see CudaDevice.view)
COPY_EVENTS = 1024                 # completion events per copy stream, reused round-robin
DEFAULT_SCRATCH = 0                # CuPy temporaries come from the pool's heap (inside the budget)
ARENA_ALIGN = 256                  # what the heap hands out; cuDNN and vector loads need it


# ----------------------------------------------------------------------------------------------
# pure bookkeeping (CPU-testable)
# ----------------------------------------------------------------------------------------------

class ArenaLayout:
    """Offsets <-> device pointers for a region [base_ptr, base_ptr + size), with checks.

    Every view the runtime hands to a kernel goes through :meth:`pointer`, so an offset or size
    bug surfaces as a clear error here instead of as a silent overwrite on the device."""

    def __init__(self, base_ptr: int, size: int):
        base_ptr, size = int(base_ptr), int(size)
        if base_ptr < 0 or size < 0:
            raise ValueError(f"bad arena region base={base_ptr:#x} size={size}")
        self.base, self.size = base_ptr, size

    @property
    def end(self) -> int:
        return self.base + self.size

    def pointer(self, offset: int, nbytes: int = 0, align: int = 1) -> int:
        """Device pointer of [offset, offset + nbytes); ValueError if out of bounds or
        misaligned (``align`` is the element size of the view)."""
        offset, nbytes = int(offset), int(nbytes)
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(f"region [{offset}, {offset + nbytes}) is outside the arena of "
                             f"{self.size} bytes")
        ptr = self.base + offset
        if align > 1 and ptr % align:
            raise ValueError(f"offset {offset} (address {ptr:#x}) is not aligned to {align} bytes")
        return ptr

    def offset(self, ptr: int, nbytes: int = 0) -> int:
        """Inverse of :meth:`pointer`."""
        ptr = int(ptr)
        if not self.contains(ptr, nbytes):
            raise ValueError(f"address {ptr:#x} (+{nbytes}) is outside the arena "
                             f"[{self.base:#x}, {self.end:#x})")
        return ptr - self.base

    def contains(self, ptr: int, nbytes: int = 0) -> bool:
        return self.base <= ptr and ptr + nbytes <= self.end

    def split(self, nbytes: int) -> tuple["ArenaLayout", "ArenaLayout"]:
        """The first ``nbytes`` and the rest, as two layouts."""
        nbytes = int(nbytes)
        if not 0 <= nbytes <= self.size:
            raise ValueError(f"cannot split {nbytes} bytes off an arena of {self.size}")
        return ArenaLayout(self.base, nbytes), ArenaLayout(self.base + nbytes, self.size - nbytes)

    def __repr__(self):
        return f"ArenaLayout(base={self.base:#x}, size={self.size})"


class ArenaAllocator:
    """malloc/free callbacks for ``cupy.cuda.PythonFunctionAllocator`` over heaps in the arena.

    Regions are tried in order: the pool's heap once attached (so temporaries count against the
    budget, like every other byte), then the reserved scratch region. A heap is anything with
    ``try_alloc(n) -> offset or -1``, ``free(offset)`` and ``largest_free`` (neuron's Heap)."""

    def __init__(self):
        self._regions: list[tuple[object, ArenaLayout, str]] = []
        self._live: dict[int, tuple[object, int, int]] = {}    # ptr -> (heap, offset, bytes)
        # CuPy frees from __dealloc__, which the garbage collector may run inside our own
        # malloc on the same thread: a re-entrant lock, not a plain one
        self._lock = threading.RLock()
        self.live_bytes = 0
        # a tape (neuron/tape.py) records where each temporary went and its replays put them
        # there again: the heap's bookkeeping is not repeated, so it could not place them
        self._recorded: list | None = None      # (bytes, pointer) in malloc order
        self._script = None                     # the record being replayed
        self._scripted: dict[int, int] = {}     # pointer -> temporaries replayed there, live

    def record(self, script: list | None) -> None:
        """Append every temporary's (bytes, pointer) to ``script`` (None: stop)."""
        self._recorded = script

    def replay(self, script: list | None) -> None:
        """Serve temporaries from ``script``, in order (None: from the heaps again)."""
        self._script = iter(script) if script is not None else None

    def _replayed(self, nbytes: int) -> int:
        want, ptr = next(self._script, (None, 0))
        if want != nbytes:
            from ..recording import TapeDiverged
            raise TapeDiverged(f"a replayed kernel asked for a {nbytes}-byte CuPy temporary "
                               f"where the record took {want}")
        self._scripted[ptr] = self._scripted.get(ptr, 0) + 1
        return ptr

    def add_region(self, heap, layout: ArenaLayout, name: str, first: bool = False) -> None:
        entry = (heap, layout, name)
        with self._lock:
            if first:
                self._regions.insert(0, entry)
            else:
                self._regions.append(entry)

    def remove_region(self, name: str) -> None:
        with self._lock:
            self._regions = [r for r in self._regions if r[2] != name]

    def malloc(self, nbytes: int, device_id: int = 0) -> int:
        nbytes = int(nbytes)
        if nbytes == 0:
            return 0            # CuPy's own convention for empty arrays
        with self._lock:
            if self._script is not None:
                return self._replayed(nbytes)
            for heap, layout, _ in self._regions:
                off = heap.try_alloc(nbytes)
                if off >= 0:
                    ptr = layout.pointer(off, nbytes)
                    self._live[ptr] = (heap, off, nbytes)
                    self.live_bytes += nbytes
                    if self._recorded is not None:
                        self._recorded.append((nbytes, ptr))
                    return ptr
            where = ", ".join(f"{name}: largest free {heap.largest_free}"
                              for heap, _, name in self._regions) or "no region"
        kernel, step = kernel_context()
        raise MemoryBudgetError(
            f"CuPy temporary of {nbytes} bytes for kernel {kernel}"
            f"{f' (step {step})' if step else ''} does not fit in the arena ({where}); "
            "temporaries come out of the memory budget like every tensor",
            step=step, tensor=f"cupy-temporary:{kernel}", requested=nbytes,
            largest_free=max((h.largest_free for h, _, _ in self._regions), default=0))

    def free(self, ptr: int, device_id: int = 0) -> None:
        if ptr == 0:
            return
        with self._lock:
            n = self._scripted.get(ptr)
            if n is not None:           # a replayed temporary: its place is the record's
                if n > 1:
                    self._scripted[ptr] = n - 1
                else:
                    del self._scripted[ptr]
                return
            heap, off, nbytes = self._live.pop(ptr)
            self.live_bytes -= nbytes
            heap.free(off)

    @property
    def live_count(self) -> int:
        return len(self._live)


def kernel_context(frame=None) -> tuple[str, str | None]:
    """(kernel, step) that is running, read off the Python stack: the innermost function of a
    neuron.kernels module and the executor's current step. Only called to explain a failure."""
    f = frame or sys._getframe(1)
    kernel, step = None, None
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if kernel is None and mod.startswith("neuron.kernels."):
            kernel = f"{mod.rsplit('.', 1)[1]}.{f.f_code.co_name}"
        if step is None and mod == "neuron.executor":
            s = f.f_locals.get("step")
            step = getattr(s, "name", None)
        f = f.f_back
    return kernel or "outside neuron's kernels", step


# ----------------------------------------------------------------------------------------------
# the device
# ----------------------------------------------------------------------------------------------

def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise RuntimeError("the cuda device needs CuPy: pip install 'cupy-cuda13x>=14' "
                           "nvidia-cudnn-cu13 (or 'neuron-arena[cuda]')") from e
    return cupy


class CudaDevice(Device):
    name = "cuda"
    # conv steps ask the kernels for the fastest algorithm's workspace under the largest free
    # block at that moment (SuperNeurons §3.5), instead of the plan's fixed im2col ceiling
    dynamic_workspace = True
    # the pool issues prefetches and offloads on the copy stream and keeps their events
    async_copies = True

    def __init__(self, arena_bytes: int, *, device_id: int = 0,
                 headroom_bytes: int | None = None, scratch_bytes: int = DEFAULT_SCRATCH,
                 pinned_capacity: int | None = None, route_cupy_allocations: bool = True):
        super().__init__(arena_bytes)
        cp = _cupy()
        if not cp.cuda.is_available():
            raise RuntimeError("no usable CUDA device (cupy.cuda.is_available() is False)")
        from ..kernels import cudnn
        from ..memory.heap import Heap

        self.device_id = int(device_id)
        self._cp = cp
        cp.cuda.Device(self.device_id).use()
        if headroom_bytes is None:
            headroom_bytes = int(os.environ.get("NEURON_CUDA_HEADROOM", DEFAULT_HEADROOM))
        self.headroom_bytes = int(headroom_bytes)
        self.scratch_bytes = -(-int(scratch_bytes) // ARENA_ALIGN) * ARENA_ALIGN
        # the scratch is carved out of the budget, never added on top of it
        self.budget_bytes = self.arena_bytes
        if self.scratch_bytes >= self.budget_bytes:
            raise ValueError(f"scratch of {self.scratch_bytes} bytes leaves nothing of a "
                             f"{self.budget_bytes} byte budget for the pool")
        self.arena_bytes = self.budget_bytes - self.scratch_bytes
        self.host_cap = int(pinned_capacity) if pinned_capacity else default_host_cap()

        # Whatever CuPy's default pool cached is given back first: it would count as used.
        cp.get_default_memory_pool().free_all_blocks()
        free_before, self.total_bytes = cp.cuda.runtime.memGetInfo()
        self.compute_stream = cp.cuda.Stream(non_blocking=True)
        self.d2h_stream = cp.cuda.Stream(non_blocking=True)       # offloads
        self.h2d_stream = cp.cuda.Stream(non_blocking=True)       # prefetches and misses
        self.codec_stream = cp.cuda.Stream(non_blocking=True)     # FreeLunch (de)compression
        self.snapshot_stream = cp.cuda.Stream(non_blocking=True)  # the step guard's copies
        self._prev_stream = cp.cuda.get_current_stream()
        self.compute_stream.use()
        try:
            self._allocate_arena(cp, cudnn, free_before)
        except BaseException:
            self._prev_stream.use()         # a failed device must not leave its stream current
            raise
        whole = ArenaLayout(self.arena.ptr, self.arena_bytes + self.scratch_bytes)
        self.layout, self.scratch_layout = whole.split(self.arena_bytes)
        self._views: dict = {}
        self._copy_events: dict = {}        # stream pointer -> [its event ring, next index]
        self._ring_stream: dict = {}        # id(ring event) -> its stream
        self._carry_events: dict = {}       # stream pointer -> its carry event (carry_copies)
        self._capture = None                # a CaptureScope while a graph is being captured
        self.wait_seconds = 0.0             # the host's waits for launched graphs, in all

        self.allocator = ArenaAllocator()
        self._scratch_heap = Heap(self.scratch_bytes, block=ARENA_ALIGN) \
            if self.scratch_bytes else None
        if self._scratch_heap is not None:
            self.allocator.add_region(self._scratch_heap, self.scratch_layout, "scratch")
        self._allocator_fn = None
        self._prev_allocator = None
        if route_cupy_allocations:
            self._install_allocator()

    def _allocate_arena(self, cp, cudnn, free_before) -> None:
        # Create the library handles now so their memory is measured, not discovered later.
        self.cudnn_handle = cudnn.get_handle(self.device_id, self.compute_stream.ptr)
        cp.cuda.device.get_cublas_handle()
        from ..kernels import cublas
        cublas.handle(cp)               # neuron's own, for the linear layers (capturable)
        # the step guard's flag: fixed runtime state like the handles, measured with them
        # (inside the arena it was a block the plan does not list: a run sized to its plan was
        # one block short on the H100)
        self._flag_memory = cp.cuda.Memory(ARENA_ALIGN)
        self._step_flag = cp.ndarray((1,), np.bool_, cp.cuda.MemoryPointer(self._flag_memory, 0))
        free_after, _ = cp.cuda.runtime.memGetInfo()
        self.library_bytes = max(0, free_before - free_after)

        need = self.budget_bytes
        available = free_after - self.headroom_bytes
        if need > available:
            raise MemoryBudgetError(
                f"cannot allocate a {need} byte arena ({self.arena_bytes} pool + "
                f"{self.scratch_bytes} scratch) on GPU {self.device_id}: {free_after} bytes free "
                f"after the cuDNN/cuBLAS handles took {self.library_bytes}, minus "
                f"{self.headroom_bytes} headroom leaves {max(0, available)} "
                f"({need - max(0, available)} short)",
                tensor="arena", requested=need, free_bytes=max(0, available),
                budget=self.arena_bytes)
        try:
            self.arena = cp.cuda.Memory(need)           # the one cudaMalloc
        except Exception as e:                          # OutOfMemoryError / CUDARuntimeError
            raise MemoryBudgetError(
                f"cudaMalloc of the {need} byte arena failed on GPU {self.device_id} "
                f"({free_after} bytes were free): {e}", tensor="arena", requested=need,
                free_bytes=free_after, budget=self.arena_bytes) from e

    # ---- allocator routing ------------------------------------------------------------------
    def _install_allocator(self) -> None:
        cp = self._cp
        arena, alloc = self.arena, self.allocator

        def malloc(nbytes, device_id):
            return alloc.malloc(nbytes, device_id)

        def free(ptr, device_id):
            alloc.free(ptr, device_id)

        malloc.arena = arena        # CuPy keeps the functions alive as long as any temporary:
        free.arena = arena          # so they keep the arena alive too
        self._prev_allocator = cp.cuda.get_allocator()
        self._allocator_fn = cp.cuda.PythonFunctionAllocator(malloc, free).malloc
        cp.cuda.set_allocator(self._allocator_fn)

    def attach_heap(self, heap) -> None:
        """Serve CuPy temporaries from the pool's heap (offsets into the pool region), falling
        back to the scratch region. Called by the pool once it owns the arena."""
        self.allocator.remove_region("pool")
        self.allocator.add_region(heap, self.layout, "pool", first=True)

    def detach_heap(self) -> None:
        self.allocator.remove_region("pool")

    @contextlib.contextmanager
    def recording_temporaries(self, script: list):
        """CuPy temporaries taken meanwhile are appended to ``script`` as (bytes, pointer)."""
        self.allocator.record(script)
        try:
            yield
        finally:
            self.allocator.record(None)

    @contextlib.contextmanager
    def replaying_temporaries(self, script: list):
        """CuPy temporaries taken meanwhile go where ``script`` says, in order."""
        self.allocator.replay(script)
        try:
            yield
        finally:
            self.allocator.replay(None)

    # ---- Device interface -------------------------------------------------------------------
    @property
    def kernels(self):
        from ..kernels import cuda
        return cuda

    def view(self, offset: int, shape, dtype):
        # A plan places the same tensors at the same offsets every iteration: the views are
        # cached (building a CuPy array costs more host time than many kernels take to run)
        key = (offset, tuple(shape) if isinstance(shape, list) else shape, dtype)
        v = self._views.get(key)
        if v is not None:
            return v
        cp = self._cp
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        nbytes = math.prod(shape) * dtype.itemsize
        self.layout.pointer(offset, nbytes, align=dtype.itemsize)
        v = cp.ndarray(shape, dtype, memptr=cp.cuda.MemoryPointer(self.arena, int(offset)))
        if len(self._views) >= _VIEW_CACHE:
            self._views.clear()
        self._views[key] = v
        return v

    def channels_last_view(self, offset: int, shape, dtype):
        """The channels-last view of --layout nhwc (Device.channels_last_view), cached as the
        C-ordered views are."""
        key = (offset, tuple(shape), dtype, "nhwc")
        v = self._views.get(key)
        if v is None:
            v = super().channels_last_view(offset, shape, dtype)
            if len(self._views) >= _VIEW_CACHE:
                self._views.clear()
            self._views[key] = v
        return v

    def move(self, src: int, dst: int, nbytes: int) -> None:
        """Arena bytes [src, src+n) -> [dst, dst+n) on the compute stream (compaction). Ranges
        may overlap: with dst < src, chunks no longer than the shift, copied from low to high
        addresses, never overwrite bytes not yet copied."""
        cp = self._cp
        if nbytes <= 0 or src == dst:
            return
        base = self.arena.ptr
        step = abs(src - dst) if abs(src - dst) < nbytes else nbytes
        order = range(0, nbytes, step) if dst < src else \
            reversed(range(0, nbytes, step))
        for o in order:
            n = min(step, nbytes - o)
            cp.cuda.runtime.memcpyAsync(base + dst + o, base + src + o, n,
                                        cp.cuda.runtime.memcpyDeviceToDevice,
                                        self.compute_stream.ptr)

    def to_numpy(self, a) -> np.ndarray:
        if isinstance(a, np.ndarray):
            return np.array(a, copy=True)
        return self._cp.asnumpy(a, stream=self.compute_stream)   # waits for the compute stream

    @property
    def streams(self) -> tuple:
        return (self.compute_stream, self.d2h_stream, self.h2d_stream, self.codec_stream,
                self.snapshot_stream)

    @property
    def copy_stream(self):
        """The offload stream (callers from before the two directions had a stream each)."""
        return self.d2h_stream

    def synchronize(self) -> None:
        for s in self.streams:
            s.synchronize()

    # ---- transfers ------------------------------------------------------------------------
    # The Pool's interface (host_allocator, copy_to_host, copy_to_device) is synchronous: the
    # pool frees an offloaded block and reuses a host buffer right after the call returns, so
    # these wait for their copy. offload()/prefetch() below are the asynchronous forms, for a
    # pool that keeps the returned events and frees/reuses only once is_done(event).
    def host_allocator(self):
        return pinned_empty

    def copy_to_host(self, view, buf, nbytes: int) -> None:
        self.wait(self._d2h(self.d2h_stream, view, buf, int(nbytes)))

    def copy_to_device(self, buf, view, nbytes: int) -> None:
        self.wait(self._h2d(buf, view, int(nbytes), compute_waits=True))

    @staticmethod
    def _host_ptr(host_buf, nbytes: int) -> int:
        if not host_buf.flags.c_contiguous or host_buf.nbytes < nbytes:
            raise ValueError(f"host buffer must be contiguous and hold {nbytes} bytes "
                             f"(got {host_buf.nbytes}, contiguous={host_buf.flags.c_contiguous})")
        return int(host_buf.__array_interface__["data"][0])

    # ---- events ---------------------------------------------------------------------------
    def new_event(self):
        """An event for the pool's fences (reused: recorded again and again)."""
        return self._cp.cuda.Event(disable_timing=True)

    def record_compute(self, event):
        """Record ``event`` on the compute stream now (it completes with the kernels queued so
        far); returns it."""
        return self._record(self.compute_stream, event)

    def _record(self, stream, event=None):
        event = stream.record(event)
        if self._capture is not None:
            self._capture.register(event)
        return event

    def _wait_event(self, stream, event) -> None:
        """``stream`` waits for ``event``; inside a capture, not for one recorded before it
        (complete by then: capture_scope.py)."""
        if self._capture is None or self._capture.waited(stream, event):
            stream.wait_event(event)

    def _enter(self, stream) -> None:
        """``stream`` is about to take work: inside a capture it must have joined it."""
        if self._capture is not None:
            self._capture.join(stream)

    def _waits(self, stream, after) -> None:
        """``stream`` waits for ``after``: None, all compute queued so far; else the event(s)."""
        if after is None:
            self._wait_event(stream, self._record(self.compute_stream))
        elif isinstance(after, (list, tuple)):
            for ev in after:
                self._wait_event(stream, ev)
        else:
            self._wait_event(stream, after)

    def offload(self, src_view, host_buf, after=None):
        """Copy ``src_view`` (contiguous, in the arena) into ``host_buf`` (pinned, e.g. from
        the pool's HostPool) on the offload stream, after ``after`` (an event or a list: the
        last kernel that used the block, an encode on the codec stream; None: all compute
        queued so far). Returns the event that completes with the copy: the arena block may
        be overwritten only after it (its next tenant waits for it)."""
        return self._d2h(self.d2h_stream, src_view, host_buf, src_view.nbytes, after)

    def snapshot(self, src_view, host_buf, after=None):
        """As :meth:`offload`, on the step guard's own stream (undo.py): a snapshot never
        queues ahead of an offload or a prefetch."""
        return self._d2h(self.snapshot_stream, src_view, host_buf, src_view.nbytes, after)

    def _d2h(self, stream, src_view, host_buf, nbytes, after=None):
        cp = self._cp
        if not src_view.flags.c_contiguous or nbytes > src_view.nbytes:
            raise ValueError("offload needs a contiguous device view of at least nbytes")
        dst = self._host_ptr(host_buf, nbytes)
        self._waits(stream, after)
        self._enter(stream)
        timing = self._timing_start(stream)
        cp.cuda.runtime.memcpyAsync(dst, src_view.data.ptr, nbytes,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        done = self._record(stream, self._copy_event(stream))
        self._timing_end(timing, stream, "d2h", nbytes)
        return done

    def prefetch(self, host_buf, dst_view, compute_waits: bool = True, after=None):
        """Copy ``host_buf`` into ``dst_view`` on the prefetch stream; returns its event.

        The copy first waits for ``after`` (the last kernel that used the block, copies still
        reading it, the copy that filled ``host_buf``; None: all compute queued so far). With
        ``compute_waits`` (default) compute waits for the copy before any later kernel; pass
        False and call :meth:`compute_wait` right before the first kernel that reads the tensor
        to let the compute in between overlap the transfer."""
        return self._h2d(host_buf, dst_view, dst_view.nbytes, compute_waits, after)

    def _h2d(self, host_buf, dst_view, nbytes, compute_waits, after=None):
        cp, stream = self._cp, self.h2d_stream
        if not dst_view.flags.c_contiguous or nbytes > dst_view.nbytes:
            raise ValueError("prefetch needs a contiguous device view of at least nbytes")
        src = self._host_ptr(host_buf, nbytes)
        self._waits(stream, after)
        self._enter(stream)
        timing = self._timing_start(stream)
        cp.cuda.runtime.memcpyAsync(dst_view.data.ptr, src, nbytes,
                                    cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        done = self._record(stream, self._copy_event(stream))
        self._timing_end(timing, stream, "h2d", nbytes)
        if compute_waits:
            self._wait_event(self.compute_stream, done)
        return done

    # ---- overlap timing (memory/overlap.py): off unless a timeline is attached --------------
    def timestamp(self, stream=None):
        """A timing event recorded now on ``stream`` (default: compute), from a ring per stream
        that restarts every iteration (no events created per step). Timing never replaces a
        copy's completion event, which fences hold and later copies wait for: that one stays
        the ring's, so a timed iteration records the same program as the next. Inside a
        capture it is recorded as an event record node of the graph (cudaEventRecordExternal):
        a plain record there only orders streams, and the launches would leave it unrecorded."""
        stream = stream or self.compute_stream
        ev = self._ring_event((stream.ptr, "timed"), stream, timing=True)
        if self._capture is None:
            return stream.record(ev)
        self._enter(stream)
        record_external(self._cp, ev, stream)
        return self._capture.register(ev)   # recorded again outside when it ends: queryable

    def elapsed_ms(self, start, end) -> float:
        return float(self._cp.cuda.get_elapsed_time(start, end))

    #: a memory.overlap.Timeline collecting each copy's and each step's CUDA-event interval
    timeline = None

    def _timing_start(self, stream):
        return None if self.timeline is None else self.timestamp(stream)

    def iteration_start(self) -> None:
        """Every iteration takes its copies' events from the start of the rings, so it uses the
        same events as the one before it (what lets a tape stand for the next iteration). A
        reused event completes later than the one it replaces: a waiter waits longer, never
        less."""
        for ring in self._copy_events.values():
            ring[1] = 0

    def _copy_event(self, stream):
        """A copy's completion event: from a ring per stream, reused round-robin (one that is
        recorded again completes later, with a later copy of the same stream: whoever still
        waits for it waits longer, never too little)."""
        return self._ring_event(stream.ptr, stream)

    def _ring_event(self, key, stream, timing=False):
        """The next event of ring ``key`` (restarted by iteration_start). Copy rings hold
        COPY_EVENTS and wrap; timing rings grow to what one iteration takes (an event timed
        twice in an iteration would lose its first interval)."""
        ring = self._copy_events.get(key)
        if ring is None:
            ring = self._copy_events[key] = [[], 0]
        events, i = ring
        if i == len(events) and (timing or len(events) < COPY_EVENTS):
            events.append(self._cp.cuda.Event(disable_timing=not timing))
            self._ring_stream[id(events[-1])] = stream
        ev = events[i]
        ring[1] = i + 1 if timing else (i + 1) % COPY_EVENTS
        return ev

    def copy_stream_of(self, event):
        """The pointer of the copy stream whose event ring ``event`` is from (None: another
        event)."""
        stream = self._ring_stream.get(id(event))
        return None if stream is None else stream.ptr

    def carry_copies(self, streams: tuple) -> dict:
        """One event per copy stream in ``streams`` (pointers), recorded now after all its
        copies so far: what the pool's fences hold across an iteration's end in place of ring
        events (memory/fences.py). The same objects every iteration. Returns pointer -> event."""
        by_ptr = {s.ptr: s for s in self.streams}
        out = {}
        for ptr in streams:
            ev = self._carry_events.get(ptr)
            if ev is None:
                ev = self._carry_events[ptr] = self._cp.cuda.Event(disable_timing=True)
            stream = by_ptr[ptr]
            self._enter(stream)
            out[ptr] = self._record(stream, ev)
        return out

    def _timing_end(self, timing, stream, kind, nbytes) -> None:
        if timing is not None:
            self.timeline.add(kind, timing, self.timestamp(stream), nbytes)

    # ---- the FreeLunch codec on its own stream (memory/compressed_swap.py) ------------------
    def encode(self, codec, src, dst, after=None, fence=None):
        """Encode ``src`` into ``dst`` (the staging block) on the codec stream, after
        ``fence`` (the producer's kernel and the staging block's last users; None: all
        compute queued so far) and ``after`` (the copy out of ``dst`` of the last slice
        encoded into it); returns its event. ``src`` may be reused once it is done, and the
        copy to the host waits for it (``offload(after=)``)."""
        return self._on_codec_stream(codec.encode_into, src, dst, after, fence)

    def decode(self, codec, src, dst, after=None, fence=None):
        """Decode ``src`` (the staging block) into ``dst`` on the codec stream, after
        ``fence`` (``dst``'s previous tenant; None: all compute queued so far) and ``after``
        (the copy that filled ``src``); returns its event, for the reader's kernel to wait
        on."""
        return self._on_codec_stream(codec.decode, src, dst, after, fence)

    def _on_codec_stream(self, fn, src, dst, after, fence=None):
        s = self.codec_stream
        self._waits(s, fence)
        if after is not None:
            self._waits(s, after)
        self._enter(s)
        with s:                         # the codec's kernels launch on the current stream
            fn(src, dst)
        return self._record(s, self._copy_event(s))

    def compute_wait(self, event) -> None:
        """Make later compute work wait for ``event`` (device-side; the host does not block)."""
        self._wait_event(self.compute_stream, event)

    @staticmethod
    def is_done(event) -> bool:
        return bool(event.done)

    # ---- CUDA graphs (neuron/devices/cuda_graph.py) ----------------------------------------------
    graph_replay = True             # the tape can be captured as one CUDA graph
    # the tape as one CUDA graph: eager's bits on the H200 (tests/gpu/test_replay.py,
    # 2026-11-27); where a capture fails, the executor replays the tape and says why
    replay_default = "graph"
    # a guarded step leaves its loss on the device until it ends (layers/loss.py): reading it
    # mid-step would stall the host until forward is done before it issues backward
    loss_on_device = True

    @property
    def cupy(self):
        return self._cp

    def side_streams(self) -> tuple:
        """The streams work is forked to from the compute stream (joined at a capture's end)."""
        return self.streams[1:]

    def capture(self, work):
        """``work()``'s stream operations as a CUDA graph, captured on the compute stream (the
        rules it follows: capture_scope.py). The capture always ends, and its events are valid
        afterwards, so the streams stay usable after a failure."""
        stream = self.compute_stream
        self.synchronize()              # nothing of an earlier iteration still queued
        stream.begin_capture()
        self._capture = scope = CaptureScope(stream)
        failure = None
        try:
            work()
            scope.rejoin()
        except Exception as e:
            failure = e
        finally:
            self._capture = None
        try:
            graph = stream.end_capture()
        except Exception:
            if failure is None:
                raise
        finally:
            scope.release(stream)
        if failure is not None:         # what broke the capture, not what ending it said
            raise failure
        return graph

    def launch(self, graph) -> None:
        """Run a captured graph on the compute stream and wait for it. It starts after all
        work queued on every stream: the capture dropped its waits for events recorded before
        (capture_scope.py)."""
        for side in self.side_streams():
            self.compute_stream.wait_event(side.record())
        graph.launch(stream=self.compute_stream)
        t0 = time.perf_counter()
        self.compute_stream.synchronize()
        self.wait_seconds += time.perf_counter() - t0

    def copy_to_host_captured(self, view, buf, nbytes: int) -> None:
        """copy_to_host inside a graph: later work on every stream waits for the copy."""
        self.order_after(self._d2h(self.d2h_stream, view, buf, int(nbytes)))

    def copy_to_device_captured(self, buf, view, nbytes: int) -> None:
        self.order_after(self._h2d(buf, view, int(nbytes), compute_waits=True))

    def upload(self, dst, src) -> None:
        """``src`` (pinned host memory, contiguous, of ``dst``'s size) into ``dst`` on the
        compute stream, asynchronously: a CUDA graph's input copy."""
        n = int(dst.nbytes)
        self._cp.cuda.runtime.memcpyAsync(dst.data.ptr, self._host_ptr(src, n), n,
                                          self._cp.cuda.runtime.memcpyHostToDevice,
                                          self.compute_stream.ptr)

    def staging_array(self, shape, dtype):
        """A host array the device copies from asynchronously (pinned)."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return pinned_empty(max(n, 1))[:n].view(dtype).reshape(shape)

    def fixed_array(self, shape, dtype):
        """Device memory outside the arena that stays put (a graph's loss rows), like the step
        guard's flag: not the plan's bytes, not the heap's to place."""
        cp = self._cp
        dtype = np.dtype(dtype)
        n = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        mem = cp.cuda.Memory(n)
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))

    def order_after(self, event) -> None:
        """Make later work on every stream wait for ``event``: what a replay does where the
        recorded run found the event done (neuron/tape.py)."""
        for s in self.streams:
            self._wait_event(s, event)

    @staticmethod
    def wait(event) -> None:
        event.synchronize()

    # ---- precision (neuron/precision) ----------------------------------------------------------
    #: mixed precision runs natively: the layers' kernels take the 2-byte feature maps
    #: (kernels/cuda.py, cuda_low.py) instead of the CPU reference's casts around each kernel
    native_mixed = True

    @property
    def compute_capability(self) -> tuple[int, int]:
        props = self._cp.cuda.runtime.getDeviceProperties(self.device_id)
        return int(props["major"]), int(props["minor"])

    def precision_missing(self, precision: str) -> str | None:
        from .cuda_check import cupy_bf16_missing, precision_missing
        return precision_missing(precision, self.compute_capability,
                                 cupy_bf16_missing(self._cp) if precision == "bf16" else None)

    def use_precision(self, precision: str) -> None:
        """tf32: float32 convolutions and matrix products on TF32 tensor cores from now on
        (cuDNN's math type and neuron's cuBLAS handle). Process-wide switches, as PyTorch's
        allow_tf32 are; fp32 leaves them as they are (strict float32 unless set). bf16/fp16:
        nothing to switch (the low types choose tensor-op math themselves)."""
        if precision == "tf32":
            from ..kernels import cuda as K
            K.allow_tf32 = True
            os.environ["CUPY_TF32"] = "1"

    # ---- reporting / teardown ----------------------------------------------------------------
    def memory_info(self) -> dict:
        free, total = self._cp.cuda.runtime.memGetInfo()
        return {"arena_bytes": self.arena_bytes, "scratch_bytes": self.scratch_bytes,
                "budget_bytes": self.budget_bytes, "pinned_cap_bytes": self.host_cap,
                "arena_base": self.layout.base, "library_bytes": self.library_bytes,
                "headroom_bytes": self.headroom_bytes, "device_free_bytes": free,
                "device_total_bytes": total,
                "cupy_temporaries_live_bytes": self.allocator.live_bytes,
                "pinned_host_bytes": pinned_host_bytes()}

    def close(self) -> None:
        """Give CuPy its previous allocator and stream back (if ours are still installed).
        The arena itself is freed once the last view of it is gone."""
        cp = self._cp
        self.synchronize()
        self._views.clear()
        if self._allocator_fn is not None and cp.cuda.get_allocator() is self._allocator_fn:
            cp.cuda.set_allocator(self._prev_allocator)
        self._allocator_fn = None
        if cp.cuda.get_current_stream().ptr == self.compute_stream.ptr:
            self._prev_stream.use()

    def __repr__(self):
        return (f"CudaDevice(gpu={getattr(self, 'device_id', '?')}, "
                f"arena_bytes={self.arena_bytes})")
