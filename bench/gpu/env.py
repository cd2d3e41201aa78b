"""Stage `env` of the GPU contact kit: what machine, drivers and libraries this run had.

nvidia-smi, the Python, NumPy, CuPy, cuDNN and PyTorch versions, where libcudnn.so.9 was loaded
from, and ``check_headers()``: every enum, struct layout and prototype neuron hand-copied into its
ctypes binding compared with the installed cuDNN headers. On the GPU its target is met when CuPy
sees a GPU, cuDNN loads and the headers agree (or are missing, which is reported). With
``--device cpu`` it records the same facts and judges nothing (there is no GPU to find).
"""
from __future__ import annotations

import importlib.metadata as md
import platform
import shutil
import subprocess
import sys

from bench.gpu.kit import device_name, stage_parser, write_stage

PACKAGES = ("numpy", "cupy-cuda13x", "nvidia-cudnn-cu13", "torch", "pybind11", "setuptools",
            "pytest", "ml_dtypes")      # ml_dtypes: bfloat16 arrays (--precision bf16)


def _run(cmd) -> str:
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]}: not on PATH"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{cmd[0]} failed: {e}"


def gather(device: str) -> dict:
    info: dict = {"python": sys.version.split()[0], "executable": sys.executable,
                  "platform": platform.platform(), "versions": {}}
    for pkg in PACKAGES:
        try:
            info["versions"][pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info["versions"][pkg] = None
    info["nvidia_smi"] = _run(["nvidia-smi"])[:4000]
    info["nvidia_smi_query"] = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,"
                                     "clocks.sm,clocks.max.sm", "--format=csv"])[:1000]
    from neuron.devices import cuda_available
    info["cuda_available"] = cuda_available()
    try:
        import cupy as cp
        info["cupy"] = cp.__version__
        if info["cuda_available"]:
            info["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
            info["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
            free, total = cp.cuda.runtime.memGetInfo()
            info["gpu_free_bytes"], info["gpu_total_bytes"] = int(free), int(total)
    except Exception as e:              # noqa: BLE001
        info["cupy_error"] = f"{type(e).__name__}: {e}"
    from neuron.kernels import cudnn as dnn
    try:
        info["cudnn_path"] = dnn.library_path()
        info["cudnn_version"] = dnn.version()
    except Exception as e:              # noqa: BLE001
        info["cudnn_error"] = f"{type(e).__name__}: {str(e)[:1000]}"
    try:
        problems = dnn.check_headers()
        info["header_check"] = {"ran": True, "mismatches": problems}
    except Exception as e:              # noqa: BLE001 (no headers / no compiler: reported)
        info["header_check"] = {"ran": False, "why": f"{type(e).__name__}: {str(e)[:500]}"}
    try:
        import torch
        info["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                         "cudnn": torch.backends.cudnn.version(),
                         "cuda_available": torch.cuda.is_available()}
    except Exception as e:              # noqa: BLE001
        info["torch"] = {"error": f"{type(e).__name__}: {e}"}
    from neuron.memory.host_budget import host_memory_bytes
    info["host_memory_bytes"] = host_memory_bytes()
    return info


def main(argv=None) -> int:
    args = stage_parser(__doc__).parse_args(argv)
    info = gather(args.device)
    hc = info["header_check"]
    headers = (f"{len(hc['mismatches'])} header mismatches" if hc["ran"]
               else f"headers not checked ({hc['why'][:80]})")
    if args.device == "cuda":
        ok = bool(info["cuda_available"] and "cudnn_version" in info
                  and (not hc["ran"] or not hc["mismatches"]))
        verdict = (f"{device_name('cuda')}, cuDNN "
                   f"{info.get('cudnn_version', 'missing')}, CuPy {info.get('cupy', 'missing')}, "
                   f"torch {info['torch'].get('version', 'missing')}, {headers}")
    else:
        ok = None           # no GPU to find: nothing to judge
        verdict = (f"cpu: Python {info['python']}, GPU usable: {info['cuda_available']}, "
                   f"cuDNN {'loaded' if 'cudnn_version' in info else 'not found'}, {headers}")
    write_stage(args.out, "env", ran=True, target_met=ok, detail=verdict,
                device=device_name(args.device),
                smoke=args.smoke, env=info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
