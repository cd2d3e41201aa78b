"""Stand-ins for CuPy and cuDNN, so that the GPU kernel module (neuron/kernels/cuda.py and the
modules it re-exports) runs on the CPU over NumPy arrays.

- CuPy: NumPy, except that ``ElementwiseKernel`` compiles the kernel's very CUDA source with
  g++ (one C++ loop over ``i`` with CuPy's conventions: a ``raw`` parameter is a pointer to the
  whole array, any other one the current element, a const value for an input and a reference
  for an output; T and U are the dtypes the arguments bind), and arrays have ``.get()``.
- the CUDA runtime (``cupy.cuda``): device memory is host memory at real addresses (Memory,
  MemoryPointer, ``cupy.ndarray(memptr=)``, memcpyAsync as memmove, the allocator hook that
  CudaDevice routes into its arena); streams run each operation when it is issued and every
  event is complete, and they can log what they are issued; NCCL all-reduces through MPI.
- cuDNN (the ``dnn`` namespace, i.e. the level of neuron/kernels/cudnn_ops.py): each operation
  does what cuDNN's documentation says, including ``alpha``/``beta`` blending, on the memory at
  the addresses it is given seen through the descriptors given with them. The arithmetic is
  numpy_ref's, so where the wrappers wire things right the GPU module gives numpy_ref's numbers.

What this checks: the wrappers' argument order and geometry, their beta (accumulate) flags,
their temporaries, the raw kernels' source, and the executor's use of the GPU kernel API. What
it cannot: cuDNN's own numerics, the ctypes marshalling (tests/kernels/test_cudnn_binding.py
checks that against the headers) and timing: operations run when issued, so a missing stream
wait changes no number here. Instead, streams made after ``log_streams()`` log what is issued to
them, and ``happens_before`` reads CUDA's ordering off that log: tests/test_cuda_device.py
checks CudaDevice's stream graph on it (tests/memory/stream_model.py models the same rules for
the pool, with copies that complete late).
"""
from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import sys
import time
import weakref

import numpy as np

from neuron.kernels import (conv_algos, cuda, cuda_helpers, cuda_pool, cuda_raw, cudnn,
                            numpy_pool, numpy_ref)

_CTYPES = {"int32": "int", "int64": "long long", "uint64": "unsigned long long",
           "float32": "float", "float64": "double", "uint8": "unsigned char", "bool": "bool"}


def have_compiler() -> bool:
    return shutil.which("g++") is not None


# ---------------------------------------------------------------------------------------------
# CuPy
# ---------------------------------------------------------------------------------------------

class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr


class DevArray(np.ndarray):
    """A NumPy array that answers ``.get()`` and ``.data.ptr`` (its address) as a CuPy array
    does: the GPU module passes such addresses to cuDNN. ``DevArray(shape, dtype,
    memptr=MemoryPointer)`` is cupy.ndarray's constructor: a view of that memory."""

    def __new__(cls, shape, dtype=np.float32, memptr=None):
        dtype = np.dtype(dtype)
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        n = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        buf = (ctypes.c_char * n).from_address(memptr.ptr)
        a = np.ndarray.__new__(cls, shape, dtype, buffer=buf)
        a._mem = memptr.mem             # the memory lives as long as an array over it
        return a

    def get(self, stream=None):
        return np.array(self)

    @property
    def data(self):
        return _Pointer(int(self.__array_interface__["data"][0]))


def _dev(a):
    return a.view(DevArray) if isinstance(a, np.ndarray) and not isinstance(a, DevArray) else a


def _params(spec: str):
    """CuPy's parameter list: [(raw, type, name)]."""
    return [(p[0] == "raw", p[-2], p[-1]) for p in (s.split() for s in spec.split(",")
                                                     if s.strip())]


class ElementwiseKernel:
    build_dir = None            # set by install()

    def __init__(self, in_params, out_params, operation, name, preamble="", options=(), **_):
        self.ins, self.outs = _params(in_params), _params(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble
        self.fmad = "--fmad=false" not in options

    def _source(self, typevars) -> str:
        head = [f"typedef {_CTYPES[np.dtype(dt).name]} {tv};" for tv, dt in typevars.items()]
        decl, per_i = [], []
        for k, (raw, ty, nm) in enumerate(self.ins + self.outs):
            c = ty if ty in typevars else _CTYPES[ty]
            is_in = k < len(self.ins)
            const = "const " if is_in else ""
            if raw:
                decl.append(f"{const}{c}* {nm} = ({const}{c}*)a[{k}];")
            else:
                decl.append(f"{const}{c}* _{nm} = ({const}{c}*)a[{k}];")
                per_i.append(f"const {c} {nm} = _{nm}[i];" if is_in else f"{c}& {nm} = _{nm}[i];")
        return "\n".join([
            "#include <cmath>", "#include <cstdint>", "using namespace std;",
            "#define __device__", *head, self.preamble,
            'extern "C" void run(void** a, long long n) {', *decl,
            "  for (long long i = 0; i < n; ++i) {", *per_i, "{", self.operation, ";}", "  }",
            "}"])

    def _lib(self, typevars):
        src = self._source(typevars)
        tag = hashlib.sha1(src.encode()).hexdigest()[:16]
        so = self.build_dir / f"{self.name}_{tag}.so"
        if not so.exists():
            cpp = self.build_dir / f"{self.name}_{tag}.cpp"
            cpp.write_text(src)
            flags = [] if self.fmad else ["-ffp-contract=off"]
            r = subprocess.run(["g++", "-O1", "-shared", "-fPIC", *flags, "-o", str(so),
                                str(cpp)], capture_output=True, text=True)
            assert r.returncode == 0, f"{self.name} does not compile:\n{r.stderr[-3000:]}"
        lib = ctypes.CDLL(str(so))
        lib.run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_longlong]
        return lib

    def __call__(self, *args):
        params = self.ins + self.outs
        assert len(args) == len(params), f"{self.name}: {len(args)} arguments for {len(params)}"
        typevars = {}
        for (raw, ty, nm), a in zip(params, args):          # arrays bind T and U first
            if ty in ("T", "U") and isinstance(a, np.ndarray):
                assert typevars.setdefault(ty, a.dtype) == a.dtype, \
                    f"{self.name}: {nm} is {a.dtype}, {ty} is {typevars[ty]}"
        for (raw, ty, nm), a in zip(params, args):
            if ty in ("T", "U") and ty not in typevars:
                typevars[ty] = np.asarray(a).dtype
        elementwise = [a for k, ((raw, _, _), a) in enumerate(zip(params, args))
                       if not raw and (k >= len(self.ins) or isinstance(a, np.ndarray))]
        shape = elementwise[-1].shape
        arrays = []
        for k, ((raw, ty, nm), a) in enumerate(zip(params, args)):
            dt = np.dtype(typevars[ty] if ty in typevars else ty)
            if raw or k >= len(self.ins):
                assert isinstance(a, np.ndarray) and a.flags.c_contiguous, \
                    f"{self.name}: {nm} must be a C-contiguous array"
                assert a.dtype == dt, f"{self.name}: {nm} is {a.dtype}, expected {dt}"
                if not raw:
                    assert a.shape == shape, f"{self.name}: {nm} has shape {a.shape}, not {shape}"
                arrays.append(a)
            else:
                if isinstance(a, np.ndarray):
                    assert a.dtype == dt, f"{self.name}: {nm} is {a.dtype}, expected {dt}"
                arrays.append(np.ascontiguousarray(np.broadcast_to(np.asarray(a, dt), shape)))
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        self._lib(typevars).run(ptrs, int(np.prod(shape)))


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


class _Event:
    done = True

    def __init__(self, disable_timing=False):
        self.t = None
        self.stream = self.pos = None       # where it was recorded: stream.ops[pos]
        self.synced = False                 # the host waited for it

    def _stamp(self):
        self.t = time.perf_counter()            # operations ran when issued: now is when
        return self

    def record(self, stream=None):
        (stream or _Cuda.get_current_stream()).record(self)

    def synchronize(self):
        self.synced = True


class _Stream:
    """A stream runs each operation when it is issued. One made after log_streams() also keeps
    what was issued to it, in order, in ``ops``: ("record", event), ("wait", event, the
    (stream, index) of the record it waits for, None if none), (kind, dst, src, nbytes) for a
    memcpyAsync of kind "h2d", "d2h" or "d2d", ("kernel", name) for launch(name)."""
    _current = []
    _logging = False
    _by_ptr = weakref.WeakValueDictionary()     # memcpyAsync names its stream by pointer

    def __init__(self, null=False, non_blocking=False):
        self.ptr = 0 if null else id(self)
        self.ops = [] if _Stream._logging else None
        self.synced = False                 # the host waited for all that was queued so far
        _Stream._by_ptr[self.ptr] = self

    def _log(self, *op):
        if self.ops is not None:
            self.ops.append(op)

    def record(self, event=None):
        ev = (event or _Event())._stamp()
        ev.stream, ev.pos = self, len(self.ops or ())
        self._log("record", ev)
        return ev

    def wait_event(self, event):        # CUDA: waits for the event's latest record, now
        self._log("wait", event, None if event.stream is None else (event.stream, event.pos))

    def synchronize(self):
        self.synced = True

    def use(self):
        _Stream._current[:] = [self]

    def __enter__(self):
        _Stream._current.append(self)

    def __exit__(self, *exc):
        _Stream._current.pop()


def log_streams():
    """Streams made from now on (until uninstall()) log the operations issued to them."""
    _Stream._logging = True


def launch(name):
    """A kernel ``name`` issued now, on the current stream, into its log: returns the
    operation, (stream, index in its ops)."""
    s = _Cuda.get_current_stream()
    s._log("kernel", name)
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


def _device_array(shape, dtype):
    """A new array: from the installed allocator (CudaDevice routes it into its arena), else
    from host memory."""
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if _Cuda.allocator is None:
        return np.empty(shape, dtype).view(DevArray)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return DevArray(shape, dtype, memptr=_Cuda.allocator(n))


class CupyStandIn:
    ElementwiseKernel = ElementwiseKernel
    cuda = _Cuda
    float64 = np.float64

    def __init__(self):
        self.ndarray = DevArray

    def get_default_memory_pool(self):
        return type("Pool", (), {"free_all_blocks": lambda self: None})()

    def asnumpy(self, a, stream=None):
        return np.array(a)

    def empty(self, shape, dtype=np.float32):
        return _device_array(shape, dtype)

    def empty_like(self, a):
        return _device_array(a.shape, a.dtype)

    def zeros(self, shape, dtype=np.float32):
        a = _device_array(shape, dtype)
        a[...] = 0
        return a

    def ones(self, shape, dtype=np.float32):
        a = _device_array(shape, dtype)
        a[...] = 1
        return a

    def full(self, shape, value, dtype=np.float32):
        a = _device_array(shape, dtype)
        a[...] = value
        return a

    def asarray(self, a, dtype=None):
        if isinstance(a, DevArray) and (dtype is None or a.dtype == dtype):
            return a
        src = np.asarray(a, dtype)
        out = _device_array(src.shape, src.dtype)
        out[...] = src
        return out

    def ascontiguousarray(self, a):
        return a if a.flags.c_contiguous else self.asarray(np.ascontiguousarray(a))

    def __getattr__(self, name):
        f = getattr(np, name)
        if not callable(f) or isinstance(f, type):
            return f
        return lambda *a, **k: _dev(f(*a, **k))


# ---------------------------------------------------------------------------------------------
# cuDNN
# ---------------------------------------------------------------------------------------------

class Desc:
    def __init__(self, kind, **kw):
        self.kind = kind
        self.__dict__.update(kw)

    def set_math_type(self, mt):
        self.math_type = mt


def _at(desc, ptr):
    """The array a descriptor describes at a device address (None for a NULL pointer): the
    memory the wrapper pointed at, seen through the descriptor it passed with it."""
    if not ptr:
        return None
    dtype = np.dtype(desc.dtype)
    shape = tuple(desc.shape)
    strides = desc.strides if desc.strides is not None else \
        tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize
              for i in range(len(shape)))
    span = sum((n - 1) * st for n, st in zip(shape, strides)) + dtype.itemsize
    buf = (ctypes.c_char * span).from_address(int(ptr))
    return np.ndarray(shape, dtype, buffer=buf, strides=strides)


def _channels(desc, ptr):
    a = _at(desc, ptr)
    return None if a is None else a.reshape(-1)


def _blend(out, result, alpha=1.0, beta=0.0):
    """cuDNN's out = alpha * result + beta * out (beta 0: out is not read, NaN or not)."""
    r = result if alpha == 1.0 else alpha * result
    if beta == 0.0:
        out[...] = r
    else:
        out[...] = r + (out if beta == 1.0 else beta * out)


class CudnnStandIn:
    """The ``dnn`` namespace the GPU kernels use, over device addresses as cuDNN's is;
    constants from the real binding."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return getattr(cudnn, name)            # constants, ALGO_NAMES, AlgoPerf

    # descriptors and handle ---------------------------------------------------------------
    def get_handle(self, *a):
        return None

    def tensor_descriptor(self, shape, dtype, strides_bytes=None):
        return Desc("tensor", shape=tuple(shape), dtype=np.dtype(dtype),
                    strides=None if strides_bytes is None else tuple(strides_bytes))

    def filter_descriptor(self, shape, dtype):
        return Desc("filter", shape=tuple(shape), dtype=np.dtype(dtype), strides=None)

    def bias_descriptor(self, channels, dtype):
        return Desc("tensor", shape=(1, int(channels), 1, 1), dtype=np.dtype(dtype), strides=None)

    def convolution_descriptor(self, padding, stride, dilation, groups, dtype):
        return Desc("conv", padding=padding, stride=stride, dilation=dilation, groups=groups)

    def pooling_descriptor(self, mode, window, padding, stride, nan=None):
        return Desc("pool", mode=mode, window=window, padding=padding, stride=stride)

    def activation_descriptor(self, mode, nan=None, coef=0.0):
        return Desc("act", mode=mode)

    def lrn_descriptor(self, n, alpha, beta, k):
        return Desc("lrn", n=n, alpha=alpha, beta=beta, k=k)

    # convolution -------------------------------------------------------------------------
    @staticmethod
    def _perf(time):
        return [cudnn.AlgoPerf(0, cudnn.CUDNN_STATUS_SUCCESS, time, 0,
                               cudnn.CUDNN_DETERMINISTIC, cudnn.CUDNN_FMA_MATH)]

    def get_algorithms(self, h, kind, x, w, conv, y):
        return self._perf(-1.0)

    def find_algorithms(self, h, kind, xd, x, wd, w, cd, yd, y, ws, ws_bytes):
        """Like cudnnFind*Ex it runs the algorithms, so it WRITES the output operand (forward
        naming: y for fwd, x = dx for bwd_data, w = dw for bwd_filter): NaN here."""
        d, p = {"fwd": (yd, y), "bwd_data": (xd, x), "bwd_filter": (wd, w)}[kind]
        _at(d, p)[...] = np.nan
        self.calls.append(("find", kind))
        return self._perf(0.01)

    def workspace_size(self, *a):
        return 0

    @staticmethod
    def _conv(c):
        return c.stride, c.padding, c.dilation, c.groups

    @staticmethod
    def _ws(x_shape, w_shape, c, dtype):
        return np.empty(numpy_ref.conv2d_workspace_bytes(x_shape, w_shape, c.stride, c.padding,
                                                         c.dilation, c.groups,
                                                         np.dtype(dtype).itemsize), np.uint8)

    def convolution_forward(self, h, xd, x, wd, w, cd, algo, ws, ws_bytes, yd, y, alpha=1.0,
                            beta=0.0):
        x, w, y = _at(xd, x), _at(wd, w), _at(yd, y)
        r = np.empty(y.shape, y.dtype)
        numpy_ref.conv2d_forward(x, w, None, r, *self._conv(cd),
                                 self._ws(x.shape, w.shape, cd, x.dtype))
        _blend(y, r, alpha, beta)

    def convolution_backward_data(self, h, wd, w, dyd, dy, cd, algo, ws, ws_bytes, dxd, dx,
                                  alpha=1.0, beta=0.0):
        w, dy, dx = _at(wd, w), _at(dyd, dy), _at(dxd, dx)
        r = np.empty(dx.shape, dx.dtype)
        numpy_ref.conv2d_backward(np.zeros_like(r), w, dy, r, None, None, *self._conv(cd),
                                  self._ws(dx.shape, w.shape, cd, dx.dtype))
        _blend(dx, r, alpha, beta)

    def convolution_backward_filter(self, h, xd, x, dyd, dy, cd, algo, ws, ws_bytes, wd, dw,
                                    alpha=1.0, beta=0.0):
        x, dy, dw = _at(xd, x), _at(dyd, dy), _at(wd, dw)
        r = np.empty(dw.shape, dw.dtype)
        numpy_ref.conv2d_backward(x, np.zeros_like(r), dy, None, r, None, *self._conv(cd),
                                  self._ws(x.shape, dw.shape, cd, x.dtype))
        _blend(dw, r, alpha, beta)

    def convolution_backward_bias(self, h, dyd, dy, bd, db, alpha=1.0, beta=0.0):
        dy, db = _at(dyd, dy), _channels(bd, db)
        _blend(db, dy.sum(axis=(0, 2, 3)), alpha, beta)

    def add_tensor(self, h, ad, a, cd, c, alpha=1.0, beta=1.0):
        a, c = _at(ad, a), _at(cd, c)
        _blend(c, np.broadcast_to(a, c.shape) if alpha == 1.0 else alpha * a, 1.0, beta)

    # batch normalization -----------------------------------------------------------------
    def batchnorm_forward_training(self, h, xd, x, yd, y, bd, scale, bias, factor, rm, rv, eps,
                                   sm, si, mode=None):
        rm, rv = _channels(bd, rm), _channels(bd, rv)
        assert (rm is None) == (rv is None), "cuDNN updates both running statistics or neither"
        numpy_ref.batchnorm_forward_train(_at(xd, x), _channels(bd, scale),
                                          _channels(bd, bias), _at(yd, y), rm, rv,
                                          _channels(bd, sm), _channels(bd, si), factor, eps,
                                          rm is not None)

    def batchnorm_forward_inference(self, h, xd, x, yd, y, bd, scale, bias, mean, var, eps,
                                    mode=None):
        numpy_ref.batchnorm_forward_infer(_at(xd, x), _channels(bd, scale), _channels(bd, bias),
                                          _at(yd, y), _channels(bd, mean), _channels(bd, var),
                                          eps)

    def batchnorm_backward(self, h, xd, x, dyd, dy, dxd, dx, bd, scale, dscale, dbias, eps,
                           sm, si, mode=None, beta_data=0.0):
        x, dy, dx = _at(xd, x), _at(dyd, dy), _at(dxd, dx)
        sm, si = _channels(bd, sm), _channels(bd, si)
        if sm is None:              # cuDNN recomputes the statistics from x
            axes = (0, 2, 3) if x.ndim == 4 else (0,)
            sm = x.mean(axis=axes)
            si = 1.0 / np.sqrt(x.var(axis=axes) + eps)
        r = np.empty(dx.shape, dx.dtype)
        numpy_ref.batchnorm_backward(x, dy, _channels(bd, scale), sm, si, r,
                                     _channels(bd, dscale), _channels(bd, dbias), eps)
        _blend(dx, r, 1.0, beta_data)

    # pooling, activations, softmax, LRN --------------------------------------------------
    @staticmethod
    def _pool_floor_shape(pd, xd, yd):      # cuDNN pools to floor-mode shapes only
        want = numpy_pool.pool_out_hw(*xd.shape[2:], pd.window, pd.stride, pd.padding)
        assert tuple(yd.shape[2:]) == want, f"cuDNN pooling: y {yd.shape} is not floor {want}"

    def pooling_forward(self, h, pd, xd, x, yd, y):
        self._pool_floor_shape(pd, xd, yd)
        if pd.mode == cudnn.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING:
            f = numpy_pool.avgpool_forward
        else:
            assert pd.mode in (cudnn.CUDNN_POOLING_MAX, cudnn.CUDNN_POOLING_MAX_DETERMINISTIC)
            f = numpy_pool.maxpool_forward
        f(_at(xd, x), _at(yd, y), pd.window, pd.stride, pd.padding)

    def pooling_backward(self, h, pd, yd, y, dyd, dy, xd, x, dxd, dx, beta=0.0):
        self._pool_floor_shape(pd, xd, yd)
        assert pd.mode in (cudnn.CUDNN_POOLING_MAX, cudnn.CUDNN_POOLING_MAX_DETERMINISTIC)
        numpy_pool.maxpool_backward(_at(xd, x), _at(yd, y), _at(dyd, dy), _at(dxd, dx),
                                    pd.window, pd.stride, pd.padding, accumulate=beta == 1.0)

    def activation_forward(self, h, ad, xd, x, yd, y):
        {cudnn.CUDNN_ACTIVATION_RELU: numpy_ref.relu_forward,
         cudnn.CUDNN_ACTIVATION_SIGMOID: numpy_ref.sigmoid_forward,
         cudnn.CUDNN_ACTIVATION_TANH: numpy_ref.tanh_forward}[ad.mode](_at(xd, x), _at(yd, y))

    def activation_backward(self, h, ad, yd, y, dyd, dy, xd, x, dxd, dx, beta=0.0):
        assert ad.mode == cudnn.CUDNN_ACTIVATION_RELU, "only ReLU's backward is cuDNN's"
        x, dy, dx = _at(xd, x), _at(dyd, dy), _at(dxd, dx)
        _blend(dx, np.where(x > 0, dy, np.zeros((), dy.dtype)), 1.0, beta)  # cuDNN: x > 0

    def softmax_forward(self, h, xd, x, yd, y, algo=None, mode=None):
        x = _at(xd, x)
        numpy_ref.softmax_xent_forward(x, np.zeros(x.shape[0], np.int64), _at(yd, y))

    def lrn_forward(self, h, ld, xd, x, yd, y):
        numpy_ref.lrn_forward(_at(xd, x), _at(yd, y), ld.n, ld.alpha, ld.beta, ld.k)

    def lrn_backward(self, h, ld, yd, y, dyd, dy, xd, x, dxd, dx, beta=0.0):
        numpy_ref.lrn_backward(_at(xd, x), _at(yd, y), _at(dyd, dy), _at(dxd, dx), ld.n,
                               ld.alpha, ld.beta, ld.k, accumulate=beta == 1.0)


# ---------------------------------------------------------------------------------------------

KERNEL_CACHES = [getattr(cuda_raw, n) for n in dir(cuda_raw) if n.startswith("_k_")] + \
    [cuda._k_any_nonfinite]


def install(monkeypatch, build_dir):
    """Point the GPU kernel modules at the stand-ins (undone by monkeypatch). Returns the
    cuDNN stand-in."""
    ElementwiseKernel.build_dir = build_dir
    cp, dnn = CupyStandIn(), CudnnStandIn()
    for mod in (cuda_raw, cuda_helpers, cuda, cuda_pool):
        monkeypatch.setattr(mod, "_cp", lambda: cp)
    for mod in (cuda, cuda_pool, cuda_helpers, conv_algos):
        monkeypatch.setattr(mod, "dnn", dnn)
    monkeypatch.setattr(cudnn, "get_handle", dnn.get_handle)    # CudaDevice asks it directly
    from neuron import cuda_check
    monkeypatch.setattr(cuda_check, "missing_for_cuda", lambda: [])  # driver, NVRTC, cuDNN
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy.cuda", _Cuda)        # from cupy.cuda import nccl
    monkeypatch.setattr(cuda, "_stager", None)      # the input stager over the stand-in's memory
    uninstall()
    return dnn


def uninstall():
    """What was made with the stand-ins (kernels, algorithm choices) must not outlive them."""
    for f in KERNEL_CACHES:
        f.cache_clear()
    conv_algos.clear_conv_algo_cache()
    _Cuda.allocator = None
    _Stream._current.clear()
    _Stream._logging = False
