"""Before `--device cuda` starts: is everything the GPU path needs there? One error that lists
what is missing and how to get it, instead of a traceback from deep inside CuPy or ctypes.

What the GPU path needs at run time, none of it compiled locally (`pip install -e '.[cuda]'`
brings all of it as wheels): CuPy (cupy-cuda13x), an NVIDIA driver that sees a GPU and is new
enough for CUDA 13, NVRTC (CuPy compiles its elementwise and raw kernels at run time: the
nvidia-cuda-nvrtc wheel of cupy's [ctk] extra), and cuDNN 9 (nvidia-cudnn-cu13).
"""
from __future__ import annotations

from ..errors import DeviceUnavailableError

INSTALL = "pip install 'neuron-arena[cuda]' (in a checkout: pip install -e '.[cuda]')"


class CudaSetupError(DeviceUnavailableError):
    """Something the GPU path needs is missing; the message says what and how to get it."""


def _check_cupy():
    try:
        import cupy
    except ImportError as e:
        return None, f"CuPy is not installed ({e}): the cupy-cuda13x[ctk] wheel"
    return cupy, None


def _check_driver(cupy):
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:          # no driver, too old a driver, no device node
        drv = ""
        try:
            v = cupy.cuda.runtime.driverGetVersion()
            drv = f" (driver supports CUDA {v // 1000}.{v % 1000 // 10})" if v else ""
        except Exception:
            pass
        return (f"no usable NVIDIA GPU or driver{drv}: {type(e).__name__}: {e}. The GPU path "
                "needs an NVIDIA driver for CUDA 13 (R580 or newer) and a visible GPU "
                "(nvidia-smi should list it)")
    if n < 1:
        return "the NVIDIA driver sees no GPU (cudaGetDeviceCount() is 0)"
    return None


def _load_libcuda():
    """The driver's own library (what CuPy would load), found without CuPy."""
    import ctypes
    return ctypes.CDLL("libcuda.so.1")


def _check_driver_library():
    """The driver and a GPU, through libcuda itself: named even when CuPy is missing too."""
    import ctypes
    try:
        cuda = _load_libcuda()
    except OSError as e:
        return (f"no NVIDIA driver ({e}): the GPU path needs an NVIDIA driver for CUDA 13 "
                "(R580 or newer) and a visible GPU (nvidia-smi should list it)")
    version, count = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDriverGetVersion(ctypes.byref(version))
    drv = (f" (it supports CUDA {version.value // 1000}.{version.value % 1000 // 10})"
           if version.value else "")
    rc = cuda.cuInit(0)
    if rc != 0:
        return (f"the NVIDIA driver{drv} does not start (cuInit error {rc}); the GPU path needs "
                "a driver for CUDA 13 (R580 or newer) and a visible GPU")
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return "the NVIDIA driver sees no GPU (cuDeviceGetCount() is 0)"
    if version.value and version.value < 13000:
        return (f"the NVIDIA driver{drv} is too old: the GPU path needs one for CUDA 13 (R580 "
                "or newer)")
    return None


def _check_nvrtc(cupy):
    version = getattr(getattr(cupy.cuda, "nvrtc", None), "getVersion", None)
    if version is None:         # a CuPy without this probe: let CuPy itself report later
        return None
    try:
        version()
    except Exception as e:
        return (f"NVRTC (CUDA's run-time compiler, which CuPy uses for its kernels) cannot be "
                f"loaded: {type(e).__name__}: {e}: the nvidia-cuda-nvrtc wheel "
                "(cupy-cuda13x[ctk])")
    return None


def _check_cudnn():
    from ..kernels import cudnn
    try:
        cudnn.lib()
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        first = first.removesuffix("Searched, in order:").rstrip(" .:")
        return f"{first}: the nvidia-cudnn-cu13 wheel"
    return None


def missing_for_cuda() -> list[str]:
    """What the GPU path lacks on this machine (empty: nothing): every missing piece, CuPy's
    absence included, so that one run names all there is to install. Nothing may import CuPy
    before this runs (the CLI calls it first; tests/devices/test_cuda_check.py keeps that so)."""
    cupy, err = _check_cupy()
    if err:                 # the driver and cuDNN are still checked, without CuPy
        problems = [err, _check_driver_library()]
    else:
        problems = [_check_driver(cupy)]
        if problems[0] is None:
            problems.append(_check_nvrtc(cupy))
    problems.append(_check_cudnn())
    return [p for p in problems if p]


def require_cuda() -> None:
    """Raise CudaSetupError, one line naming every missing piece, unless the GPU path can run."""
    problems = missing_for_cuda()
    if problems:        # one line, as every CLI error (cli/errors.py)
        wheels = any("wheel" in p for p in problems)
        raise CudaSetupError("device cuda is not usable: " + "; ".join(problems) + ". " +
                             (f"{INSTALL} brings the wheels, or use" if wheels else "Use") +
                             " --device cpu (or auto)")


#: the compute capability each mixed precision needs on the GPU: cuDNN's half-precision
#: kernels (5.3), bfloat16 arithmetic and tensor cores (Ampere, 8.0)
MIN_CAPABILITY = {"fp16": (5, 3), "bf16": (8, 0)}


def precision_missing(precision: str, capability: tuple[int, int],
                      bf16_arrays: str | None = None) -> str | None:
    """None when a GPU of ``capability`` (major, minor) runs ``precision`` (neuron/precision),
    else what is missing, in one line. ``bf16_arrays``: why CuPy cannot hold bfloat16 arrays
    (None: it can), for bf16."""
    need = MIN_CAPABILITY.get(precision)
    if need is None:
        return None                     # fp32, tf32 (a math mode: plain float32 where absent)
    have = tuple(int(v) for v in capability)
    if have < need:
        return (f"{precision} needs a GPU of compute capability {need[0]}.{need[1]} or newer "
                f"({'Ampere' if precision == 'bf16' else 'half-precision cuDNN'}); this one "
                f"has {have[0]}.{have[1]}: use --precision fp32"
                f"{' or fp16' if precision == 'bf16' and have >= MIN_CAPABILITY['fp16'] else ''}")
    if precision == "bf16" and bf16_arrays is not None:
        return f"bf16 on the GPU needs CuPy arrays of bfloat16: {bf16_arrays}"
    return None


def cupy_bf16_missing(cupy) -> str | None:
    """Why ``cupy`` cannot hold bfloat16 arrays (ml_dtypes' dtype, CuPy 14 or newer), or None."""
    try:
        import ml_dtypes
    except ImportError:
        return "the ml_dtypes package is not installed (pip install ml_dtypes)"
    try:
        cupy.ndarray((0,), ml_dtypes.bfloat16)
    except Exception as e:              # an older CuPy: unsupported dtype
        return (f"CuPy {getattr(cupy, '__version__', '?')} refuses the dtype "
                f"({type(e).__name__}: {e}); CuPy 14 or newer holds it")
    return None
