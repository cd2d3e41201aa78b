"""Devices: where the arena lives and which kernels run on it.

- CpuDevice: the arena is one NumPy byte buffer; tensors are views at offsets; NumPy kernels.
- VirtualDevice: offsets only, no storage, no kernels; the planner and simulator run the same
  executor code on it, so planned and measured peaks agree by construction.
- CudaDevice (neuron.devices.cuda) has the same interface on the GPU. It is found through the
  device registry (``make_device``/``register_device``), imported only when asked for.
"""
from __future__ import annotations

import contextlib

import numpy as np


class Device:
    name = "device"
    computes = True             # False: skip kernels (planning)

    def __init__(self, arena_bytes: int):
        if arena_bytes <= 0:
            raise ValueError(f"arena size must be positive, got {arena_bytes} bytes")
        self.arena_bytes = int(arena_bytes)

    @property
    def kernels(self):
        raise NotImplementedError

    def view(self, offset: int, shape, dtype):
        raise NotImplementedError

    def channels_last_view(self, offset: int, shape, dtype):
        """The (N, C, H, W) view of a tensor stored N, H, W, C at ``offset`` (--layout nhwc,
        memory/layout.py): the storage's C-ordered view, transposed (no copy)."""
        n, c, h, w = shape
        v = self.view(offset, (n, h, w, c), dtype)
        return None if v is None else v.transpose(0, 3, 1, 2)

    def to_numpy(self, a) -> np.ndarray:
        return np.array(a, copy=True)

    def synchronize(self) -> None:
        pass

    def precision_missing(self, precision: str) -> str | None:
        """None when this device runs ``precision`` (neuron/precision), else what it lacks. Here:
        float32 only (a device's kernels take its master dtype; mixed precision needs its
        kernels to read and write 2-byte types)."""
        if precision == "fp32":
            return None
        return (f"{type(self).__name__}'s kernels compute in float32 only (no {precision} "
                "path: its convolution, matrix and elementwise kernels would need the 2-byte "
                "type); use --precision fp32")

    def step_flag(self):
        """The one-element flag the step guard folds finiteness into (undo.py): the device's
        own fixed state, outside the arena, so that the plan's bytes are the arena's bytes."""
        flag = getattr(self, "_step_flag", None)
        if flag is None:
            flag = self._step_flag = self.kernels.nonfinite_flag_new()
        return flag

    # host side of offload/prefetch; CpuDevice copies synchronously, CudaDevice on its copy stream
    def host_allocator(self):
        return lambda n: np.empty(n, dtype=np.uint8)

    def copy_to_host(self, view, buf, nbytes: int) -> None:
        buf[:nbytes] = view.reshape(-1).view(np.uint8)

    def copy_to_device(self, buf, view, nbytes: int) -> None:
        view.reshape(-1).view(np.uint8)[...] = buf[:nbytes]

    def move(self, src: int, dst: int, nbytes: int) -> None:
        """Arena bytes [src, src+n) to [dst, dst+n); the ranges may overlap (compaction)."""
        raise NotImplementedError

    def staging_array(self, shape, dtype):
        """A host array the device copies the batch from (pinned where that matters)."""
        return np.empty(shape, dtype)

    def order_after(self, event) -> None:
        """Later work waits for ``event`` (copies here are synchronous: already so)."""

    # a tape (neuron/tape.py) fixes where a kernel's temporaries go, on devices that put them in
    # the arena (CudaDevice); NumPy's temporaries are host memory: nothing to fix
    def recording_temporaries(self, script: list):
        return contextlib.nullcontext()

    def replaying_temporaries(self, script: list):
        return contextlib.nullcontext()

    # the FreeLunch codec (memory/compressed_swap.py): here at once, on the compute thread;
    # CudaDevice runs it on a codec stream of its own and returns the event that ends it
    def encode(self, codec, src, dst, after=None):
        codec.encode_into(src, dst)

    def decode(self, codec, src, dst, after=None):
        codec.decode(src, dst)


class CpuDevice(Device):
    name = "cpu"

    def __init__(self, arena_bytes: int):
        super().__init__(arena_bytes)
        # np.empty of a large size maps pages lazily: the budget is a ceiling, not a commitment
        self.buffer = np.empty(self.arena_bytes, dtype=np.uint8)

    @property
    def kernels(self):
        # imported on first use, then kept: an import statement costs ~3 us, a step asks ~1,500 times
        k = CpuDevice._numpy_ref
        if k is None:
            from ..kernels import numpy_ref as k
            CpuDevice._numpy_ref = k
        return k

    _numpy_ref = None

    def precision_missing(self, precision):
        if precision == "tf32":
            return ("TF32 is a GPU tensor-core math mode; the CPU has no TF32 arithmetic "
                    "(fp32 stores the same bytes and computes exactly; bf16 and fp16 run here)")
        if precision == "bf16":
            try:
                import ml_dtypes  # noqa: F401
            except ImportError:
                return "bf16 on the CPU needs the ml_dtypes package: pip install ml_dtypes"
        return None

    def view(self, offset: int, shape, dtype):
        # one ndarray constructor (~1 us) instead of slice, view and reshape (~4 us, with
        # np.prod ~9 us); a step builds ~1,000 views
        return np.ndarray(shape, dtype, buffer=self.buffer, offset=offset)

    def move(self, src: int, dst: int, nbytes: int) -> None:
        # NumPy detects the overlap and copies through a temporary
        self.buffer[dst:dst + nbytes] = self.buffer[src:src + nbytes]


class VirtualDevice(Device):
    name = "virtual"
    computes = False

    @property
    def kernels(self):
        return None

    def view(self, offset, shape, dtype):
        return None

    def precision_missing(self, precision):
        return None             # planning: every precision's bytes

    def host_allocator(self):
        return _VirtualBuffer

    def copy_to_host(self, view, buf, nbytes):
        pass

    def copy_to_device(self, buf, view, nbytes):
        pass

    def move(self, src, dst, nbytes):
        pass


class _VirtualBuffer:
    """A host buffer that only has a size (planning)."""
    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


#: device kind -> class, or "module:Class" imported on first use (GPU code stays unimported on
#: machines without a GPU, and this module never imports the devices built on top of it)
_REGISTRY: dict[str, object] = {"cpu": CpuDevice, "virtual": VirtualDevice,
                                "cuda": "neuron.devices.cuda:CudaDevice"}


def register_device(kind: str, factory) -> None:
    """Make ``make_device(kind, ...)`` build ``factory`` (a Device class or "module:Class")."""
    if kind == "auto":
        raise ValueError("'auto' is reserved: it picks cuda or cpu")
    _REGISTRY[kind] = factory


def device_kinds() -> list[str]:
    return [*_REGISTRY, "auto"]


def _resolve(kind: str):
    factory = _REGISTRY[kind]
    if isinstance(factory, str):
        import importlib
        module, _, name = factory.partition(":")
        factory = _REGISTRY[kind] = getattr(importlib.import_module(module), name)
    return factory


def make_device(kind: str, arena_bytes: int) -> Device:
    """A registered device (cpu, cuda, virtual, ...) or ``auto`` (cuda when a GPU is usable,
    else cpu)."""
    if kind == "auto":
        kind = "cuda" if cuda_available() else "cpu"
    if kind not in _REGISTRY:
        raise ValueError(f"unknown device {kind!r}; expected one of {', '.join(device_kinds())}")
    factory = _REGISTRY.get(kind)
    if kind == "cuda" and (factory == "neuron.devices.cuda:CudaDevice" or
                           getattr(factory, "__module__", "") == "neuron.devices.cuda"):
        from .cuda_check import require_cuda
        require_cuda()      # CuPy, driver, NVRTC, cuDNN: one line naming each that is missing
    return _resolve(kind)(arena_bytes)


def cuda_available() -> bool:
    return cuda_unavailable_reason() is None


def cuda_unavailable_reason() -> str | None:
    """None when a GPU is usable, else why not (no cupy, no driver, no device)."""
    try:
        import cupy
    except Exception as e:      # not installed, or a broken install
        return f"CuPy is not importable ({type(e).__name__}: {e}; pip install 'neuron-arena[cuda]')"
    try:
        if not cupy.cuda.is_available():
            return "no GPU or CUDA driver found"
    except Exception as e:
        return f"no usable GPU ({type(e).__name__}: {e})"
    return None
