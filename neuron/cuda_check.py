"""Before `--device cuda` starts: is everything the GPU path needs there? One error that lists
what is missing and how to get it, instead of a traceback from deep inside CuPy or ctypes.

What the GPU path needs at run time, none of it compiled locally (`pip install -e '.[cuda]'`
brings all of it as wheels): CuPy (cupy-cuda13x), an NVIDIA driver that sees a GPU and is new
enough for CUDA 13, NVRTC (CuPy compiles its elementwise and raw kernels at run time: the
nvidia-cuda-nvrtc wheel of cupy's [ctk] extra), and cuDNN 9 (nvidia-cudnn-cu13).
"""
from __future__ import annotations

from .errors import DeviceUnavailableError

INSTALL = "pip install -e '.[cuda]'   (or: pip install 'neuron[cuda]')"


class CudaSetupError(DeviceUnavailableError):
    """Something the GPU path needs is missing; the message says what and how to get it."""


def _check_cupy():
    try:
        import cupy
    except ImportError as e:
        return None, f"CuPy is not installed ({e}); {INSTALL} brings cupy-cuda13x[ctk]"
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


def _check_nvrtc(cupy):
    version = getattr(getattr(cupy.cuda, "nvrtc", None), "getVersion", None)
    if version is None:         # a CuPy without this probe: let CuPy itself report later
        return None
    try:
        version()
    except Exception as e:
        return (f"NVRTC (CUDA's run-time compiler, which CuPy uses for its kernels) cannot be "
                f"loaded: {type(e).__name__}: {e}; {INSTALL} brings it as the "
                "nvidia-cuda-nvrtc wheel (cupy-cuda13x[ctk])")
    return None


def _check_cudnn():
    from .kernels import cudnn
    try:
        cudnn.lib()
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"{first}; {INSTALL} brings nvidia-cudnn-cu13"
    return None


def missing_for_cuda() -> list[str]:
    """What the GPU path lacks on this machine (empty: nothing)."""
    cupy, err = _check_cupy()
    if err:
        return [err]        # nothing else can be checked without CuPy
    problems = [_check_driver(cupy)]
    if problems[0] is None:
        problems.append(_check_nvrtc(cupy))
    problems.append(_check_cudnn())
    return [p for p in problems if p]


def require_cuda() -> None:
    problems = missing_for_cuda()
    if problems:        # one line, as every CLI error (cli_errors.py)
        raise CudaSetupError("device cuda is not usable: " + "; ".join(problems) +
                             "; use device cpu (--device cpu) or auto")
