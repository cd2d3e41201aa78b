"""The CUDA runtime stand-in (``cupy.cuda``): memory, streams and events, and NCCL over MPI."""
from __future__ import annotations

import ctypes
import time
import weakref

import numpy as np

# The CUDA runtime: device memory is host memory at real addresses, so that pointer arithmetic,
# views at offsets and memcpy are the real thing; streams run each operation at once and every
# event is complete. What CUDA would order them by is kept in a log, on request (log_streams).

class CUDARuntimeError(RuntimeError):
    """cupy_backends' CUDARuntimeError: what the runtime refuses, named as CUDA names it."""


class Memory:
    """cupy.cuda.Memory: ``nbytes`` of "device" memory at ``ptr``, aligned as cudaMalloc's is
    (at least 256 bytes: the arena's views, and the workspaces carved from them, are aligned on
    a GPU, so kernels that align a workspace lose no bytes there, nor here)."""
    allocated = weakref.WeakSet()       # the ones that own their bytes (see memory_snapshot)
    ALIGN = 256

    def __init__(self, nbytes, ptr=None, free=None):
        self.size = int(nbytes)
        if ptr is None:
            self._buf = np.zeros(max(self.size, 1) + self.ALIGN, np.uint8)
            base = int(self._buf.__array_interface__["data"][0])
            ptr = base + (-base) % self.ALIGN
            Memory.allocated.add(self)
        self.ptr, self._free = int(ptr), free

    def __del__(self):
        if self._free is not None and self.ptr:
            self._free(self.ptr, 0)


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + int(offset)


def _observed(stream, pos):
    """The host learned that the operation at (stream, pos) and all before it completed: what
    it issues from now on happens after them (logged as ("host", (stream, pos)) in issued)."""
    if _Stream._logging and stream is not None and stream.ops is not None and pos >= 0:
        _Stream.issued.append(("host", (stream, pos)))


class _Event:
    _by_ptr = weakref.WeakValueDictionary()     # eventRecordWithFlags names it by pointer

    def __init__(self, disable_timing=False):
        self.ptr = id(self)
        _Event._by_ptr[self.ptr] = self
        self.timing = not disable_timing
        self.t = None
        self.stream = self.pos = None       # where it was recorded: stream.ops[pos]
        self.synced = False                 # the host waited for it
        self.captured = None                # the _Capture it was last recorded in
        self.clock = {}                     # what its record follows (see _Capture)

    def _host_use(self, what):
        if self.captured is not None:
            raise CUDARuntimeError(f"cudaErrorCapturedEvent: {what}: operation not permitted on "
                                   "an event last recorded in a capturing stream")

    def _stamp(self):
        self.t = time.perf_counter()            # operations ran when issued: now is when
        return self

    def record(self, stream=None):
        (stream or _Cuda.get_current_stream()).record(self)

    @property
    def done(self):                     # every operation ran when issued
        self._host_use("cudaEventQuery")
        _observed(self.stream, self.pos)
        return True

    def synchronize(self):
        self._host_use("cudaEventSynchronize")
        self.synced = True
        _observed(self.stream, self.pos)


class _Capture:
    """One stream capture (cudaStreamBeginCapture on ``origin``) and CUDA's rules for it: a
    capturing stream may wait only for events recorded in the same capture (else
    cudaErrorStreamCaptureIsolation), a stream that waits for one joins the capture, the host
    may not wait for a capturing stream, and every joined stream's last operation must be
    waited for by the origin before the capture ends (else cudaErrorStreamCaptureUnjoined).
    A copy or kernel issued to a stream outside a live capture would run once, at capture time,
    not in the graph: the stand-in refuses it (``strict``), since neuron never means that.

    The join rule is checked with clocks: each stream counts its operations in the capture, an
    event's record carries what its stream had seen (its own count and what it had waited
    for), a wait merges that in."""
    live = []
    strict = True

    def __init__(self, origin):
        self.origin, self.streams, self.open = origin, {origin.ptr: origin}, True

    @classmethod
    def check_issue(cls, stream, what):
        if cls.strict and cls.live and stream.capture is None:
            raise CUDARuntimeError(f"{what} on a stream outside the live capture: it would run "
                                   "now, once, and not be part of the graph")


class _Graph:
    """What end_capture returns: the stand-ins do not keep the captured work (they ran it as it
    was issued); a test that launches graphs wraps CudaDevice.capture (memory_snapshot)."""

    def launch(self, stream=None):
        raise NotImplementedError("a stand-in graph holds no work: wrap CudaDevice.capture")


class _Stream:
    """A stream runs each operation when it is issued. One made after log_streams() also keeps
    what was issued to it, in order, in ``ops``: ("record", event), ("wait", event, the
    (stream, index) of the record it waits for, None if none), (kind, dst, src, nbytes) for a
    memcpyAsync of kind "h2d", "d2h" or "d2d", ("kernel", name, ranges) for launch(name,
    ranges) (the [lo, hi) device address ranges it reads or writes). ``issued`` holds every
    logged operation as (stream, index) in the order the host issued them, across streams,
    and ("host", (stream, index)) where the host learned that operation complete (an event's
    ``done`` or ``synchronize``, a stream's ``synchronize``)."""
    _current = []
    _logging = False
    issued: list = []
    _by_ptr = weakref.WeakValueDictionary()     # memcpyAsync names its stream by pointer

    def __init__(self, null=False, non_blocking=False):
        self.ptr = 0 if null else id(self)
        self.ops = [] if _Stream._logging else None
        self.synced = False                 # the host waited for all that was queued so far
        self.capture = None                 # the _Capture this stream is part of
        self.clock = {}                     # stream ptr -> its operations this one follows
        _Stream._by_ptr[self.ptr] = self

    def _tick(self):
        if self.capture is not None:
            self.clock[self.ptr] = self.clock.get(self.ptr, 0) + 1

    # ---- stream capture (the rules: _Capture) ----------------------------------------------
    def begin_capture(self, mode=None):
        if self.capture is not None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is already capturing")
        self.capture = _Capture(self)
        self.clock = {}
        _Capture.live.append(self.capture)

    def is_capturing(self):
        return self.capture is not None

    def end_capture(self):
        c = self.capture
        if c is None or c.origin is not self:
            raise CUDARuntimeError("cudaErrorIllegalState: not the origin of a capture")
        unjoined = [s for ptr, s in c.streams.items()
                    if s is not self and self.clock.get(ptr, 0) < s.clock.get(ptr, 0)]
        for s in c.streams.values():
            s.capture, s.clock = None, {}
        c.open = False
        _Capture.live.remove(c)
        if unjoined:
            raise CUDARuntimeError(f"cudaErrorStreamCaptureUnjoined: {len(unjoined)} stream(s) "
                                   "forked into the capture were not joined back")
        return _Graph()

    def _log(self, *op):
        if self.ops is not None:
            self.ops.append(op)
            _Stream.issued.append((self, len(self.ops) - 1))

    def record(self, event=None):
        ev = (event or _Event())._stamp()
        ev.stream, ev.pos = self, len(self.ops or ())
        self._tick()
        ev.captured, ev.clock = self.capture, dict(self.clock)
        self._log("record", ev)
        return ev

    def wait_event(self, event):        # CUDA: waits for the event's latest record, now
        c = event.captured
        if c is not None and c.open:
            if self.capture is None:            # a fork: this stream joins the capture
                self.capture, self.clock = c, {}
                c.streams[self.ptr] = self
            elif self.capture is not c:
                raise CUDARuntimeError("cudaErrorStreamCaptureMerge: two captures joined")
            for ptr, n in event.clock.items():
                self.clock[ptr] = max(self.clock.get(ptr, 0), n)
        elif self.capture is not None:
            raise CUDARuntimeError("cudaErrorStreamCaptureIsolation: dependency created on "
                                   "uncaptured work in another stream")
        elif c is not None:
            raise CUDARuntimeError("cudaErrorCapturedEvent: a wait for an event last recorded "
                                   "in a capture that has ended")
        self._log("wait", event, None if event.stream is None else (event.stream, event.pos))

    def synchronize(self):
        if self.capture is not None:
            raise CUDARuntimeError("cudaErrorStreamCaptureUnsupported: the host waited for a "
                                   "capturing stream")
        self.synced = True
        if self.ops:
            _observed(self, len(self.ops) - 1)

    def use(self):
        _Stream._current[:] = [self]

    def __enter__(self):
        _Stream._current.append(self)

    def __exit__(self, *exc):
        _Stream._current.pop()


def log_streams():
    """Streams made from now on (until uninstall()) log the operations issued to them."""
    _Stream._logging = True
    _Stream.issued = []


def launch(name, ranges=(), reads=()):
    """A kernel ``name`` issued now, on the current stream, into its log, writing the device
    address ranges ``ranges`` ([(lo, hi)]; or touching them, when it is not known which) and
    reading ``reads``: returns the operation, (stream, index in its ops)."""
    s = _Cuda.get_current_stream()
    _Capture.check_issue(s, f"kernel {name}")
    s._tick()
    s._log("kernel", name, tuple(ranges), tuple(reads))
    return s, len(s.ops) - 1


def happens_before(a, b) -> bool:
    """Whether the logged operation a = (stream, index) completes before b starts, as CUDA
    orders them: each stream in issue order, plus an edge from an event's record to every
    wait_event on it."""
    seen, todo = set(), [b]
    while todo:
        s, j = todo.pop()
        for i in range(j - 1, -1, -1):
            if (s, i) == a:
                return True
            if (s, i) in seen:
                break
            seen.add((s, i))
            op = s.ops[i]
            if op[0] == "wait" and op[2] is not None:
                todo.append(op[2])
    return False


class _Runtime:
    memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice = 1, 2, 3
    _KINDS = {1: "h2d", 2: "d2h", 3: "d2d"}

    @staticmethod
    def eventRecordWithFlags(event, stream, flags):
        """cudaEventRecordWithFlags: only cudaEventRecordExternal (1), only in a capture (an
        event record node of the graph: the launches record it)."""
        s, ev = _Stream._by_ptr.get(stream), _Event._by_ptr.get(event)
        if flags != 1 or s is None or ev is None or s.capture is None or not s.capture.open:
            raise CUDARuntimeError("cudaErrorInvalidValue: eventRecordWithFlags(external) outside "
                                   "a capture or on an unknown event or stream")
        s.record(ev)

    @staticmethod
    def memcpyAsync(dst, src, n, kind, stream):
        s = _Stream._by_ptr.get(stream)
        if s is not None:
            _Capture.check_issue(s, f"memcpyAsync ({_Runtime._KINDS[kind]})")
            s._tick()
        ctypes.memmove(int(dst), int(src), int(n))
        if s is not None:
            s._log(_Runtime._KINDS[kind], dst, src, n)

    @staticmethod
    def memGetInfo():
        return 8 << 30, 16 << 30

    @staticmethod
    def getDeviceProperties(i):
        return {"name": b"NVIDIA H100 stand-in", "totalGlobalMem": 16 << 30, "major": 9,
                "minor": 0}

    @staticmethod
    def runtimeGetVersion():
        return 13000

    @staticmethod
    def driverGetVersion():
        return 13000


class _Pinned(bytearray):
    """Pinned host memory (alloc_pinned_memory), kept track of for memory_snapshot."""
    allocated = weakref.WeakValueDictionary()     # id -> buffer (a bytearray is unhashable)


def memory_snapshot():
    """Every byte of stand-in device memory (each Memory that owns its bytes: the arena, fixed
    buffers) and of pinned host memory, as a function that writes them all back. A test that
    launches CUDA graphs takes one before a capture, which runs the work as it is issued, and
    restores it after, so the graph's launch starts where the capture started."""
    saved = []
    for m in list(Memory.allocated):
        saved.append((m._buf, m._buf.copy()))
    for p in list(_Pinned.allocated.values()):
        a = np.frombuffer(p, np.uint8)
        saved.append((a, a.copy()))

    def restore():
        for dst, src in saved:
            dst[...] = src
    return restore


class _PythonFunctionAllocator:
    def __init__(self, malloc, free):
        self._malloc, self._free = malloc, free

    def malloc(self, nbytes):
        ptr = self._malloc(int(nbytes), 0)
        return MemoryPointer(Memory(nbytes, ptr, self._free), 0)


class _Cuda:
    Memory, MemoryPointer, Event, Stream = Memory, MemoryPointer, _Event, _Stream
    PythonFunctionAllocator = _PythonFunctionAllocator
    runtime = _Runtime
    device = type("device", (), {"get_cublas_handle": staticmethod(lambda: None)})
    allocator = None

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_elapsed_time(e0, e1):
        if not (e0.timing and e1.timing):
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: elapsed time of an event "
                                   "created with disable_timing")
        e0._host_use("cudaEventElapsedTime")
        e1._host_use("cudaEventElapsedTime")
        return (e1.t - e0.t) * 1e3              # milliseconds, as CUDA's

    @staticmethod
    def Device(i=0):
        return type("Dev", (), {"use": lambda self: None})()

    @staticmethod
    def get_current_stream():
        if not _Stream._current:
            _Stream._current.append(_Stream(null=True))
        return _Stream._current[-1]

    @staticmethod
    def alloc_pinned_memory(nbytes):
        mem = _Pinned(int(nbytes))
        _Pinned.allocated[id(mem)] = mem
        return mem

    @classmethod
    def set_allocator(cls, fn):
        cls.allocator = fn

    @classmethod
    def get_allocator(cls):
        return cls.allocator


class _Nccl:
    """cupy.cuda.nccl for ranks launched by mpirun: every rank's "device" memory is its host
    memory, so an all-reduce is an MPI all-reduce over the bytes at the given addresses."""
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 6, 7, 8, 0
    _DTYPES = {6: np.float16, 7: np.float32, 8: np.float64}
    groups = 0

    @staticmethod
    def get_unique_id():
        return b"stand-in"

    @classmethod
    def groupStart(cls):
        cls.groups += 1

    @staticmethod
    def groupEnd():
        pass

    class NcclCommunicator:
        def __init__(self, world, uid, rank):
            from mpi4py import MPI
            self.mpi = MPI.COMM_WORLD
            assert (self.mpi.Get_size(), self.mpi.Get_rank()) == (world, rank)

        def allReduce(self, send, recv, count, dtype, op, stream):
            from mpi4py import MPI
            assert op == _Nccl.NCCL_SUM and send == recv        # neuron reduces in place
            dt = np.dtype(_Nccl._DTYPES[dtype])
            buf = (ctypes.c_char * (count * dt.itemsize)).from_address(recv)
            self.mpi.Allreduce(MPI.IN_PLACE, np.frombuffer(buf, dt, count), op=MPI.SUM)

        def check_async_error(self):
            pass

        def abort(self):
            pass


_Cuda.nccl = _Nccl
