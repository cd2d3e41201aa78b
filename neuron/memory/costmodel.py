"""How long a step, a copy and a compaction take: the simulator's cost model.

Two sources, and every report says which was used:
- ``analytic``: FLOPs and bytes of each step against a device's peaks (a roofline: the slower
  of arithmetic and memory traffic, plus a launch latency). GPUs from their stated peaks; the
  CPU from a micro-benchmark run once per process (NumPy matmul rate, memcpy bandwidth).
- ``profile``: each step's kernel timed on the device (``neuron profile``, memory/profile.py),
  looked up by layer geometry. A profile from another device, dtype or geometry is refused.

Copies: bandwidth + latency per transfer. ``async_copies`` says whether the device has a copy
stream beside compute (the GPU) or copies on the compute thread (the CPU device).

A GPU profile also holds, per geometry, the kernel's own time from CUDA events
(``gpu_entries``) and the host's time to issue it (``host_entries``, with the executor's host
work between steps as ``host_overhead_s``). The model is then ``pipelined``: the clock runs the
host as a third timeline that issues each step, and a kernel starts when the host has issued it
and the GPU is free (memory/clock.py). Timing each step between two synchronizations (the
``entries``) charges host and GPU time one after the other, which a pipelined iteration does
not pay: on the H100 that put the simulated ResNet-50/DenseNet-121 iterations 11-23% off.
"""
from __future__ import annotations

import functools
import json
import platform
import time
from dataclasses import dataclass

import numpy as np

from ..errors import NeuronError


class ProfileError(NeuronError, ValueError):
    """A profile that does not describe this device, dtype or network."""


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    flops: float                # fp32 FLOP/s (non-tensor-core for GPUs: the kernels are fp32)
    mem_bandwidth: float        # device memory, bytes/s
    copy_bandwidth: float       # host <-> device, pinned, bytes/s per direction
    copy_latency: float         # seconds per transfer
    launch_latency: float       # seconds per step (kernel launch; the CPU: Python overhead)
    async_copies: bool          # a copy stream beside compute
    detail: str = ""            # what identifies the physical device (profiles must match it)


#: stated peaks (vendor data sheets, SXM parts); host link PCIe Gen5 x16 at ~55 GB/s achieved
DEVICES = {
    "h100": DeviceSpec("h100", flops=67e12, mem_bandwidth=3.35e12, copy_bandwidth=55e9,
                       copy_latency=10e-6, launch_latency=5e-6, async_copies=True,
                       detail="NVIDIA H100 80GB HBM3 (stated peaks)"),
    "h200": DeviceSpec("h200", flops=67e12, mem_bandwidth=4.8e12, copy_bandwidth=55e9,
                       copy_latency=10e-6, launch_latency=5e-6, async_copies=True,
                       detail="NVIDIA H200 141GB HBM3e (stated peaks)"),
}


def cpu_detail() -> str:
    """The CPU model string: a CPU profile is only valid on the same processor."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def cpu_spec() -> DeviceSpec:
    """The CPU device measured by a micro-benchmark (under a second, once per process).

    Timed in the process's CPU seconds, best of several rounds: on cores shared with other
    jobs, wall time measures the other jobs (it gave 1 GB/s for a 7 GB/s memcpy here)."""
    clock = time.process_time
    a = np.ones((384, 384), np.float32)
    a @ a
    best = float("inf")
    for _ in range(3):
        t0 = clock()
        for _ in range(4):
            a @ a
        best = min(best, (clock() - t0) / 4)
    flops = 2 * 384 ** 3 / max(best, 1e-9)
    src = np.ones(32 << 20, np.uint8)
    dst = np.empty_like(src)
    dst[...] = src                      # first touch of the destination pages
    best = float("inf")
    for _ in range(5):
        t0 = clock()
        dst[...] = src
        best = min(best, clock() - t0)
    bw = src.nbytes / max(best, 1e-9)
    # the arena's compaction moves overlapping ranges through a temporary: two copies
    return DeviceSpec("cpu", flops=flops, mem_bandwidth=bw, copy_bandwidth=bw,
                      copy_latency=2e-6, launch_latency=20e-6, async_copies=False,
                      detail=cpu_detail())


def device_spec(name: str) -> DeviceSpec:
    if name == "cpu":
        return cpu_spec()
    try:
        return DEVICES[name]
    except KeyError:
        raise ValueError(f"unknown cost-model device {name!r}; choose one of cpu, "
                         f"{', '.join(DEVICES)}") from None


def gpu_kind() -> str:
    """The cost-model device of the GPU here (by its name)."""
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode().upper()
    for kind in ("H200", "H100"):
        if kind in name:
            return kind.lower()
    raise ProfileError(f"no cost-model entry for GPU {name!r}; known: h100, h200")


def planning_cost(device, dtype=np.float32) -> "CostModel":
    """The cost model a planner uses, when given none, for a run on ``device`` (a kind or a
    Device): a known GPU's stated peaks, else the H100's. Not the CPU's measured ones, though
    the CPU device runs there: a plan decides which tensors a lossy codec compresses
    (``--compress``), so it must not vary with a micro-benchmark's timing from run to run."""
    kind = getattr(device, "name", device)
    if kind == "auto":
        from ..devices import cuda_available
        kind = "cuda" if cuda_available() else "cpu"
    if kind == "cuda":
        try:
            return CostModel.analytic(gpu_kind(), dtype=dtype)
        except ProfileError:
            pass
    return CostModel.analytic("h100", dtype=dtype)


#: the profile's JSON format. 2: the keys carry every layer's whole geometry (padding,
#: dilation, groups, the LRN window); format 1's keys omitted them, so two layers with the
#: same shapes but different padding shared one entry
PROFILE_FORMAT = "neuron-profile-2"


def layer_key(layer, phase: str, batch: int) -> str:
    """A step's geometry: what its kernel's time depends on (recompute = forward)."""
    ins = [list(s) for s in layer.in_shapes(batch)]
    outs = [list(s) for s in layer.out_shapes(batch)]
    return f"{'B' if phase == 'B' else 'F'}|{layer.describe()}|{ins}->{outs}"


class CostModel:
    """Seconds per step, per copy and per compaction on one device."""

    def __init__(self, spec: DeviceSpec, profile: dict | None = None, dtype=np.float32,
                 source: str | None = None):
        self.spec = spec
        self.dtype = np.dtype(dtype)
        self.profile = profile
        self.source = source or ("profile" if profile else "analytic")
        self._cache: dict[tuple, tuple] = {}   # -> (layer, seconds)
        self._macs: dict[tuple, tuple] = {}    # -> (layer, count): forward and backward share it
        self._host: dict[tuple, tuple] = {}    # -> (layer, seconds)
        # pipelined: host issue times and event-timed kernels (a GPU profile has both)
        self.pipelined = bool(profile and profile.get("gpu_entries")
                              and profile.get("host_entries"))
        self.host_overhead = float(profile.get("host_overhead_s", 0.0)) if self.pipelined \
            else 0.0
        if profile is not None:
            # pipelined: the executor's own time is host time (host_overhead), not GPU time
            self.step_overhead = 0.0 if self.pipelined else \
                float(profile.get("step_overhead_s", spec.launch_latency))
            self.copy_bandwidth = float(profile.get("copy_bandwidth", spec.copy_bandwidth))
            self.copy_latency = float(profile.get("copy_latency", spec.copy_latency))
        else:
            self.step_overhead = spec.launch_latency
            self.copy_bandwidth, self.copy_latency = spec.copy_bandwidth, spec.copy_latency

    @classmethod
    def analytic(cls, device: str = "h100", dtype=np.float32) -> "CostModel":
        return cls(device_spec(device), dtype=dtype)

    @classmethod
    def from_profile(cls, path: str, dtype=np.float32) -> "CostModel":
        try:
            with open(path, encoding="utf-8") as f:
                prof = json.load(f)
        except UnicodeDecodeError:      # a binary file (an image, an .npz, ...)
            raise ProfileError(f"cannot read profile {path}: not a text file (a profile is the "
                               "JSON that `neuron profile -o FILE.json` writes)") from None
        except (OSError, json.JSONDecodeError) as e:
            raise ProfileError(f"cannot read profile {path}: {e}") from None
        if not isinstance(prof, dict):
            raise ProfileError(f"{path} is not a neuron profile (JSON {type(prof).__name__}, "
                               "not an object)")
        fmt = prof.get("format")
        if fmt == "neuron-profile-1":
            raise ProfileError(f"{path} is an old profile (neuron-profile-1) whose keys omit "
                               "padding and dilation, so layers that differ only there share "
                               "a time: re-run `neuron profile` to measure it again")
        if fmt != PROFILE_FORMAT:
            raise ProfileError(f"{path} is not a neuron profile (format {fmt!r})")
        dev = prof.get("device")
        if dev not in ("cpu", *DEVICES):
            raise ProfileError(f"{path}: measured on unknown device {dev!r}")
        spec = device_spec(dev)
        # a CPU profile holds only on the same processor (GPU profiles name the GPU kind)
        if dev == "cpu" and prof.get("device_detail") != spec.detail:
            raise ProfileError(f"{path} was measured on {prof.get('device_detail')!r}; this "
                               f"machine is {spec.detail!r}: re-run `neuron profile` here")
        if np.dtype(prof.get("dtype", "float32")) != np.dtype(dtype):
            raise ProfileError(f"{path} was measured in {prof.get('dtype')}, the plan uses "
                               f"{np.dtype(dtype)}")
        m = cls(spec, profile=prof, dtype=dtype, source=f"profile:{path}")
        m.path = path
        return m

    # ---- per step -----------------------------------------------------------------------
    def step_time(self, step, batch: int) -> float:
        """Seconds of one step's kernel (not counting the per-step overhead)."""
        # the analytic estimate counts the bytes a step reads and writes: a backward step that
        # also runs deferred updates (distributed/overlap.py) reads more than its layer's own
        # a chunk step (memory/chunking.py) runs on its part of the batch
        chunk = getattr(step, "chunk", None)
        n = batch if chunk is None else chunk.size
        key = id(step.layer), step.phase == "B", n, len(step.reads), len(step.writes)
        hit = self._cache.get(key)
        # the entry holds its layer: a layer's id is reused once it is freed, and a cost model
        # outlives graphs (the planners bench plans model after model with one)
        if hit is not None and hit[0] is step.layer:
            return hit[1]
        if self.profile is None:
            t = self._analytic(step, n)
        elif n == batch:
            t = self._profiled(step, batch)
        else:
            try:
                t = self._profiled(step, n)
            except ProfileError:        # not profiled at the chunk's size: linear in it
                t = self._profiled(step, batch) * n / batch
        self._cache[key] = (step.layer, t)
        return t

    def host_time(self, step, batch: int) -> float:
        """Seconds the host takes to issue one step (pipelined models only), with the
        executor's own work between steps."""
        key = id(step.layer), step.phase == "B", batch
        hit = self._host.get(key)
        if hit is not None and hit[0] is step.layer:    # as step_time's cache
            return hit[1]
        t = self._profiled(step, batch, "host_entries") + self.host_overhead
        self._host[key] = (step.layer, t)
        return t

    def serial(self) -> "CostModel":
        """The same profile charged step by step (each kernel timed between two
        synchronizations, host and GPU time one after the other): the model before
        ``pipelined``, kept to compare against."""
        prof = {k: v for k, v in self.profile.items() if k not in ("gpu_entries",
                                                                 "host_entries")}
        m = CostModel(self.spec, profile=prof, dtype=self.dtype, source=self.source + ":serial")
        m.path = getattr(self, "path", "")
        return m

    def _profiled(self, step, batch, table: str | None = None) -> float:
        key = layer_key(step.layer, step.phase, batch)
        table = table or ("gpu_entries" if self.pipelined else "entries")
        try:
            return self.profile[table][key]
        except KeyError:
            raise ProfileError(
                f"profile {getattr(self, 'path', '')} has no entry for step {step.name} "
                f"(geometry {key}); it was measured for {self.profile.get('model')} batch "
                f"{self.profile.get('batch')}: profile this network and batch") from None

    def _analytic(self, step, batch) -> float:
        layer = step.layer
        if step.phase == "B" and step.aliased and not (step.grad_targets or step.updates
                                                       or step.due
                                                       or layer.rewrites_gradient):
            return 0.0      # every input gradient is its output gradient: no kernel runs
        key = id(layer), batch
        hit = self._macs.get(key)
        if hit is not None and hit[0] is layer:
            macs = hit[1]
        else:
            macs = layer.flops(batch)
            self._macs[key] = (layer, macs)
        # backward computes data and weight gradients: about twice the forward arithmetic
        flops = 2.0 * macs * (2.0 if step.phase == "B" else 1.0)
        moved = 0
        for t in step.reads:
            moved += t.nbytes
        for t in step.writes:
            moved += t.nbytes
        s = self.spec
        return max(flops / s.flops, moved / s.mem_bandwidth)

    def copy_time(self, nbytes: int) -> float:
        return self.copy_latency + nbytes / self.copy_bandwidth

    def codec_time(self, nbytes: int) -> float:
        """A FreeLunch encode or decode (memory/compressed_swap.py) touching ``nbytes`` (the
        tensor and its compressed bytes): one pass over device memory on the codec stream."""
        return nbytes / self.spec.mem_bandwidth + self.spec.launch_latency

    def move_time(self, nbytes: int) -> float:
        """Compaction: device-to-device, read and write."""
        return 2.0 * nbytes / self.spec.mem_bandwidth

    def describe(self) -> dict:
        return {"source": self.source, "device": self.spec.name, "detail": self.spec.detail,
                "async_copies": self.spec.async_copies, "pipelined": self.pipelined}
