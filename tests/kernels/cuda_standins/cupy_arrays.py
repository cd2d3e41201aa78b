"""The CuPy stand-in: arrays that answer ``.get()``, and ElementwiseKernel built with g++."""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from typing import ClassVar

import numpy as np

from .runtime import _Cuda

#: NumPy dtype name -> the C type CuPy names it by (cupy/_core/_scalar.pyx); the NVRTC check
#: (tests/kernels/nvrtc_compiler.py) generates CuPy's source with the same names
CTYPES = {"bool": "bool", "int8": "signed char", "uint8": "unsigned char", "int16": "short",
          "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int",
          "int64": "long long", "uint64": "unsigned long long", "float32": "float",
          "float64": "double"}


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
        if memptr is None:              # cupy.ndarray(shape, dtype): fresh memory
            return np.empty(shape, dtype).view(cls)
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


def params(spec: str):
    """CuPy's parameter list: [(raw, type, name)]."""
    return [(p[0] == "raw", p[-2], p[-1]) for p in (s.split() for s in spec.split(",")
                                                     if s.strip())]


#: CuPy's CArray indexing of a non-contiguous array (cupy/carray.cuh, operator[](ptrdiff_t)):
#: the logical C-order index through the strides; ``&x[0]`` is the first element's address
_STRIDED_RAW = """
template <typename T> struct neuron_strided {
    T* p; const long long* m;                       // m: ndim, shape..., strides (bytes)...
    neuron_strided(T* p_, const long long* m_) : p(p_), m(m_) {}
    T& operator[](long long i) const {
        long long nd = m[0], diff = 0;
        for (long long d = nd - 1; d > 0; --d) { diff += m[1 + nd + d] * (i % m[1 + d]); i /= m[1 + d]; }
        diff += m[1 + nd] * i;
        return *(T*)((char*)p + diff);
    }
};
"""


class ElementwiseKernel:
    build_dir = None            # set by install()

    def __init__(self, in_params, out_params, operation, name, preamble="", options=(), **_):
        self.ins, self.outs = params(in_params), params(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble
        self.fmad = "--fmad=false" not in options

    def _source(self, typevars, strided=()) -> str:
        """``strided``: the raw parameters given a non-C-contiguous array, read as CuPy's CArray
        reads one (carray.cuh: ``x[i]`` is the element of logical C-order index i, through the
        array's strides), their shape and strides in the entry after the parameters'."""
        head = [f"typedef {CTYPES[np.dtype(dt).name]} {tv};" for tv, dt in typevars.items()]
        decl, per_i = [], []
        n = len(self.ins + self.outs)
        for k, (raw, ty, nm) in enumerate(self.ins + self.outs):
            c = ty if ty in typevars else CTYPES[ty]
            is_in = k < len(self.ins)
            const = "const " if is_in else ""
            if raw and k in strided:
                meta = n + list(strided).index(k)
                decl.append(f"neuron_strided<{const}{c}> {nm}(({const}{c}*)a[{k}], "
                            f"(const long long*)a[{meta}]);")
            elif raw:
                decl.append(f"{const}{c}* {nm} = ({const}{c}*)a[{k}];")
            else:
                decl.append(f"{const}{c}* _{nm} = ({const}{c}*)a[{k}];")
                per_i.append(f"const {c} {nm} = _{nm}[i];" if is_in else f"{c}& {nm} = _{nm}[i];")
        return "\n".join([
            "#include <cmath>", "#include <cstdint>", "using namespace std;",
            "#define __device__", _STRIDED_RAW, *head, self.preamble,
            'extern "C" void run(void** a, long long n) {', *decl,
            "  for (long long i = 0; i < n; ++i) {", *per_i, "{", self.operation, ";}", "  }",
            "}"])

    def _lib(self, typevars, strided=()):
        src = self._source(typevars, strided)
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
        arrays, strided_outs, strided, metas = [], [], [], []
        for k, ((raw, ty, nm), a) in enumerate(zip(params, args)):
            dt = np.dtype(typevars[ty] if ty in typevars else ty)
            if raw or k >= len(self.ins):
                assert isinstance(a, np.ndarray), f"{self.name}: {nm} must be an array"
                assert a.dtype == dt, f"{self.name}: {nm} is {a.dtype}, expected {dt}"
                if raw and not a.flags.c_contiguous:
                    # CuPy hands the kernel the array itself (a CArray with its strides)
                    strided.append(k)
                    metas.append(np.array([a.ndim, *a.shape, *a.strides], np.int64))
                    arrays.append(a)
                    continue
                if not raw:
                    assert a.shape == shape, f"{self.name}: {nm} has shape {a.shape}, not {shape}"
                if not a.flags.c_contiguous:
                    # CuPy indexes a strided output by its logical (C-order) index i: the
                    # kernel runs on a C-ordered copy (it may read the output) written back
                    strided_outs.append((a, np.ascontiguousarray(a)))
                    a = strided_outs[-1][1]
                arrays.append(a)
            else:
                if isinstance(a, np.ndarray):
                    assert a.dtype == dt, f"{self.name}: {nm} is {a.dtype}, expected {dt}"
                arrays.append(np.ascontiguousarray(np.broadcast_to(np.asarray(a, dt), shape)))
        arrays += metas
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.__array_interface__["data"][0]
                                                for a in arrays])
        self._lib(typevars, tuple(strided)).run(ptrs, int(np.prod(shape)))
        for a, c in strided_outs:
            a[...] = c



#: a raw kernel's scalar parameter type -> the NumPy scalar type CuPy must be given for it
_SCALARS = {"float": np.float32, "double": np.float64, "int": np.int32, "long long": np.int64,
            "unsigned int": np.uint32, "unsigned long long": np.uint64, "bool": np.bool_}
_CTYPES_OF = {np.float32: ctypes.c_float, np.float64: ctypes.c_double, np.int32: ctypes.c_int32,
              np.int64: ctypes.c_int64, np.uint32: ctypes.c_uint32, np.uint64: ctypes.c_uint64,
              np.bool_: ctypes.c_bool}

#: what g++ needs around a CUDA source: CUDA's qualifiers and the thread coordinates
_RAW_HARNESS = """#include <cmath>
#include <cstdint>
using namespace std;
#define __global__
#define __device__
#define __forceinline__ inline
struct neuron_dim3 { unsigned x, y, z; };
static neuron_dim3 threadIdx, blockIdx, blockDim, gridDim;
"""


class RawModule:
    """cupy.RawModule: ``get_function(name)`` is the kernel, called as CuPy calls it,
    ``kernel(grid, block, args)``. The very source is compiled by g++ with one loop over the
    blocks and threads (sequentially: for kernels without shared memory or barriers); each
    argument must be what the kernel's parameter takes (an array for a pointer, the NumPy
    scalar of its C type otherwise): CuPy passes a scalar's bytes as they are, so a wrong type
    is no error on a GPU, only wrong numbers."""

    def __init__(self, code=None, options=(), name_expressions=None, **_):
        self.code, self.fmad = code, "--fmad=false" not in options

    def get_function(self, name):
        return _RawFunction(self, name)


class _RawFunction:
    launches: ClassVar[dict] = {}           # kernel name -> launches, across the session

    def __init__(self, module, name):
        self.module, self.name = module, name
        typedefs = {alias: ty.strip() for ty, alias in
                    re.findall(r"typedef\s+([\w ]+?)\s+(\w+)\s*;", module.code)}
        m = re.search(r'extern "C" __global__ void ' + name + r"\s*\(([^)]*)\)", module.code)
        assert m, f"{name}: no such kernel in the module's source"
        self.params = []            # (C type, name); a pointer's type ends with *
        for decl in m.group(1).split(","):
            decl = " ".join(decl.split())
            star = decl.rfind("*")
            if star >= 0:
                self.params.append((decl[: star + 1], decl[star + 1:].strip()))
            else:
                ty, nm = decl.rsplit(" ", 1)
                ty = ty.replace("const ", "").strip()
                self.params.append((typedefs.get(ty, ty), nm))
        self._lib = None

    def _build(self):
        src = _RAW_HARNESS + self.module.code + (
            f'\nextern "C" void neuron_run_{self.name}(unsigned gx, unsigned bx, void** a) {{\n'
            "  gridDim.x = gx; blockDim.x = bx; gridDim.y = gridDim.z = blockDim.y = "
            "blockDim.z = 1;\n  for (unsigned b = 0; b < gx; ++b) for (unsigned t = 0; t < bx; "
            "++t) {\n    blockIdx.x = b; threadIdx.x = t;\n    " + self._call() + "\n  }\n}\n")
        tag = hashlib.sha1(src.encode()).hexdigest()[:16]
        so = ElementwiseKernel.build_dir / f"{self.name}_{tag}.so"
        if not so.exists():
            cpp = ElementwiseKernel.build_dir / f"{self.name}_{tag}.cpp"
            cpp.write_text(src)
            flags = [] if self.module.fmad else ["-ffp-contract=off"]
            r = subprocess.run(["g++", "-O1", "-shared", "-fPIC", *flags, "-o", str(so),
                                str(cpp)], capture_output=True, text=True, check=False)
            assert r.returncode == 0, f"{self.name} does not compile:\n{r.stderr[-3000:]}"
        lib = ctypes.CDLL(str(so))
        fn = getattr(lib, f"neuron_run_{self.name}")
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        return fn

    def _call(self):
        """The kernel called with each parameter read from the argument array ``a``: a
        pointer is the entry itself, a scalar is where the entry points."""
        args = [f"({ty})a[{k}]" if ty.endswith("*") else f"*({ty}*)a[{k}]"
                for k, (ty, _) in enumerate(self.params)]
        return f"{self.name}(" + ", ".join(args) + ");"

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        assert len(args) == len(self.params), \
            f"{self.name}: {len(args)} arguments for {len(self.params)} parameters"
        keep, ptrs = [], []
        for (ty, nm), a in zip(self.params, args):
            if ty.endswith("*"):
                assert isinstance(a, np.ndarray), f"{self.name}: {nm} must be an array, got {a!r}"
                ptrs.append(int(a.__array_interface__["data"][0]))
                continue
            want = _SCALARS[ty]
            assert type(a) is want, \
                f"{self.name}: {nm} is a {ty}, given {type(a).__name__} (needs numpy.{want.__name__})"
            c = _CTYPES_OF[want](a.item())
            keep.append(c)
            ptrs.append(ctypes.addressof(c))
        if self._lib is None:
            self._lib = self._build()
        grid = grid if isinstance(grid, tuple) else (grid,)
        block = block if isinstance(block, tuple) else (block,)
        assert all(d == 1 for d in grid[1:] + block[1:]), f"{self.name}: 1-D launches only"
        _RawFunction.launches[self.name] = _RawFunction.launches.get(self.name, 0) + 1
        self._lib(int(grid[0]), int(block[0]), (ctypes.c_void_p * len(ptrs))(*ptrs))


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
    RawModule = RawModule
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

    def full(self, shape, value, dtype=np.float32):
        a = _device_array(shape, dtype)
        a[...] = value
        return a

    def zeros(self, shape, dtype=np.float32):
        return self.full(shape, 0, dtype)

    def ones(self, shape, dtype=np.float32):
        return self.full(shape, 1, dtype)

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
