"""The CUDA runtime stand-in (``cupy.cuda``): memory, streams and events, and NCCL over MPI."""
from __future__ import annotations

import ctypes
import time
import weakref

import numpy as np

# The CUDA runtime: device memory is host memory at real addresses, so that pointer arithmetic,
# views at offsets and memcpy are the real thing; streams run each operation at once and every
# event is complete. What CUDA would order them by is kept in a log, on request (log_streams).

class Memory:
    """cupy.cuda.Memory: ``nbytes`` of "device" memory at ``ptr``."""

    def __init__(self, nbytes, ptr=None, free=None):
        self.size = int(nbytes)
        if ptr is None:
            self._buf = np.zeros(max(self.size, 1), np.uint8)
            ptr = int(self._buf.__array_interface__["data"][0])
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
    def __init__(self, disable_timing=False):
        self.t = None
        self.stream = self.pos = None       # where it was recorded: stream.ops[pos]
        self.synced = False                 # the host waited for it

    def _stamp(self):
        self.t = time.perf_counter()            # operations ran when issued: now is when
        return self

    def record(self, stream=None):
        (stream or _Cuda.get_current_stream()).record(self)

    @property
    def done(self):                     # every operation ran when issued
        _observed(self.stream, self.pos)
        return True

    def synchronize(self):
        self.synced = True
        _observed(self.stream, self.pos)


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
        _Stream._by_ptr[self.ptr] = self

    def _log(self, *op):
        if self.ops is not None:
            self.ops.append(op)
            _Stream.issued.append((self, len(self.ops) - 1))

    def record(self, event=None):
        ev = (event or _Event())._stamp()
        ev.stream, ev.pos = self, len(self.ops or ())
        self._log("record", ev)
        return ev

    def wait_event(self, event):        # CUDA: waits for the event's latest record, now
        self._log("wait", event, None if event.stream is None else (event.stream, event.pos))

    def synchronize(self):
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


def launch(name, ranges=()):
    """A kernel ``name`` issued now, on the current stream, into its log, touching the device
    address ranges ``ranges`` ([(lo, hi)], read or written): returns the operation, (stream,
    index in its ops)."""
    s = _Cuda.get_current_stream()
    s._log("kernel", name, tuple(ranges))
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
    def memcpyAsync(dst, src, n, kind, stream):
        ctypes.memmove(int(dst), int(src), int(n))
        s = _Stream._by_ptr.get(stream)
        if s is not None:
            s._log(_Runtime._KINDS[kind], dst, src, n)

    @staticmethod
    def memGetInfo():
        return 8 << 30, 16 << 30

    @staticmethod
    def getDeviceProperties(i):
        return {"name": b"NVIDIA H100 stand-in", "totalGlobalMem": 16 << 30}

    @staticmethod
    def runtimeGetVersion():
        return 13000

    @staticmethod
    def driverGetVersion():
        return 13000


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
        return bytearray(int(nbytes))

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
