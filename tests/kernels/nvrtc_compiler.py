"""NVRTC, CUDA's run-time compiler, driven through ctypes: the compiler CuPy builds every kernel
with, and it needs no GPU or driver. With CuPy's own headers (CArray, CIndexer, CUPY_FOR), the
kernels of neuron's GPU path are compiled here as CuPy would compile them on the GPU machine.

Found without importing CuPy (an import on a machine without a driver is no problem, but the
tests elsewhere take "CuPy importable" to mean "try the GPU"):
- NVRTC: $NEURON_NVRTC, else libnvrtc.so.* from the ``nvidia-cuda-nvrtc`` wheel (nvidia/cu13/lib,
  nvidia/cuda_nvrtc/lib), else the system's;
- CuPy's headers: $NEURON_CUPY_INCLUDE, else the installed cupy package's _core/include.
``unavailable()`` says what is missing and how to get it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os

from cuda_standins.cupy_arrays import CTYPES, params

#: what CuPy puts in front of an ElementwiseKernel's source (cupy/_core/core.pyx's header list)
CUPY_HEADERS = ("cupy/complex.cuh", "cupy/carray.cuh", "cupy/atomics.cuh", "cupy/math_constants.h")
#: the H100/H200's virtual architecture
ARCH = "compute_90"


def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def nvrtc_path() -> str | None:
    if os.environ.get("NEURON_NVRTC"):
        return os.environ["NEURON_NVRTC"]
    nvidia = _package_dir("nvidia")
    if nvidia:
        for pattern in ("cu13/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*",
                        "cu12/lib/libnvrtc.so.*"):
            found = sorted(p for p in glob.glob(os.path.join(nvidia, pattern))
                           if "builtins" not in p and "alt" not in p)
            if found:
                return found[0]
    return ctypes.util.find_library("nvrtc")


def cupy_include() -> str | None:
    if os.environ.get("NEURON_CUPY_INCLUDE"):
        return os.environ["NEURON_CUPY_INCLUDE"]
    cupy = _package_dir("cupy")
    inc = os.path.join(cupy, "_core", "include") if cupy else None
    return inc if inc and os.path.isfile(os.path.join(inc, "cupy", "carray.cuh")) else None


def unavailable() -> str | None:
    """Why NVRTC compilation cannot run here, or None."""
    missing = []
    if nvrtc_path() is None:
        missing.append("NVRTC (pip install nvidia-cuda-nvrtc, or set NEURON_NVRTC)")
    if cupy_include() is None:
        missing.append("CuPy's headers (pip install cupy-cuda13x, or set NEURON_CUPY_INCLUDE "
                       "to a cupy/_core/include folder)")
    return "; ".join(missing) + " not found" if missing else None


class CompileError(Exception):
    pass


class Nvrtc:
    def __init__(self):
        self.lib = ctypes.CDLL(nvrtc_path())
        self.include = cupy_include()
        cccl = os.path.join(self.include, "cupy", "_cccl")
        self.include_opts = [f"-I{self.include}"] + [
            f"-I{os.path.join(cccl, d)}" for d in ("libcudacxx", "thrust", "cub")
            if os.path.isdir(os.path.join(cccl, d))]
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
        self.version = (major.value, minor.value)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"nvrtc {what}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source: str, name: str, options=()) -> None:
        """Compile ``source`` to PTX for ARCH; raises CompileError with NVRTC's log."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(),
                                                f"{name}.cu".encode(), 0, None, None), "create")
        try:
            opts = [f"-arch={ARCH}", *self.include_opts, *options]
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            status = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            if status != 0:
                size = ctypes.c_size_t()
                self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                self.lib.nvrtcGetProgramLog(prog, log)
                raise CompileError(f"{name} does not compile with NVRTC "
                                   f"{self.version[0]}.{self.version[1]}:\n"
                                   f"{log.value.decode(errors='replace')[-4000:]}")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


# ---- CuPy's ElementwiseKernel source, as cupy/_core/_kernel.pyx generates it -----------------

def elementwise_source(in_params: str, out_params: str, operation: str, name: str,
                       typevars: dict, preamble: str = "", loop_prep: str = "",
                       after_loop: str = "", index_32_bits: bool = True) -> str:
    """The CUDA source CuPy generates for an ElementwiseKernel called with C-contiguous arrays
    for every parameter (which it views as 1-D) and the type variables ``typevars``
    ({"T": "float32", ...}): inputs are const, a non-raw array is read through a reference to
    the current element, a raw one is the whole CArray."""
    i32 = int(index_32_bits)
    decls, body = [], []
    ins = params(in_params)
    for k, (raw, ty, nm) in enumerate(ins + params(out_params)):
        const = "const " if k < len(ins) else ""
        c = ty if ty in typevars else CTYPES[ty]
        decls.append(f"{const}CArray<{c}, 1, 1, {i32}> {nm if raw else '_raw_' + nm}")
        if not raw:
            body.append(f"{const}{c} &{nm} = _raw_{nm}[_ind.get()];")
    decls.append(f"CIndexer<1, {i32}> _ind")
    typedefs = "".join(f"typedef {CTYPES[dt]} {tv};\n" for tv, dt in typevars.items())
    return ("".join(f"#include <{h}>\n" for h in CUPY_HEADERS) + typedefs + preamble +
            f'\nextern "C" __global__ void {name}({", ".join(decls)}) {{\n'
            f"  {loop_prep};\n  #pragma unroll 1\n  CUPY_FOR(i, _ind.size()) {{\n"
            f"    _ind.set(i);\n    " + "\n    ".join(body) + f"\n    {operation};\n  }}\n"
            f"  {after_loop};\n}}\n")


class Recorder:
    """Stands in for the ``cupy`` module while the kernel factories run: keeps what each
    ElementwiseKernel and RawModule was made of."""

    def __init__(self):
        self.elementwise, self.modules = [], []

    def ElementwiseKernel(self, in_params, out_params, operation, name="kernel",
                          reduce_dims=True, preamble="", no_return=False, return_tuple=False,
                          loop_prep="", after_loop="", options=()):
        kernel = dict(in_params=in_params, out_params=out_params, operation=operation,
                      name=name, preamble=preamble, loop_prep=loop_prep,
                      after_loop=after_loop, options=tuple(options))
        self.elementwise.append(kernel)
        return kernel

    def RawModule(self, code=None, options=(), name_expressions=None, **_):
        module = dict(code=code, options=tuple(options))
        self.modules.append(module)
        return _RecordedModule(module)


class _RecordedModule:
    def __init__(self, module):
        self.module = module

    def get_function(self, name):
        return (self.module, name)
