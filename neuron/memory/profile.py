"""``neuron profile``: time every step's kernel on a device, once, for the cost model.

The profile is JSON keyed by layer geometry (memory/costmodel.py ``layer_key``), with the
device, its identity, the dtype, the per-step overhead of the executor and the copy bandwidth,
so that the simulated clock can replay any plan of the same network on measured times.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..executor import Executor
from .costmodel import ProfileError, cpu_spec, device_spec, layer_key


#: the stopwatches: wall time, or the process's CPU time, which other users of shared cores do
#: not inflate (equal to wall time for single-threaded kernels on an idle core)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


class _TimedExecutor(Executor):
    """The executor with a stopwatch around each kernel (synchronized on the GPU)."""
    times: list
    clock = staticmethod(time.perf_counter)

    def _compute(self, step, ctx, ws):
        sync, clock = self.device.synchronize, self.clock
        sync()
        t0 = clock()
        super()._compute(step, ctx, ws)
        sync()
        self.times.append((step, clock() - t0))


def measure_iterations(ex: Executor, x, y, repeat: int, clock: str = "wall") -> list[float]:
    """Seconds of ``repeat`` training iterations (after the caller's warm-up)."""
    now = CLOCKS[clock]
    out = []
    for _ in range(repeat):
        ex.device.synchronize()
        t0 = now()
        ex.train_step(x, y)
        ex.device.synchronize()
        out.append(now() - t0)
    return out


#: timing runs train on one random batch over and over: at the default lr (0.1) a ResNet-50
#: diverged by its fourth step on the H100 (the step guard stops a non-finite update); a small
#: lr keeps them finite, and no kernel's time depends on it
TIMING_LR = 1e-4


def timing_optimizer():
    from ..optim import SGD
    return SGD(lr=TIMING_LR)


def random_batch(graph, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], batch)
    return x, y


class Profiler:
    """A liveness executor whose kernels are timed; ``round()`` runs one timed iteration, so
    that a benchmark can interleave it with the runs it checks (same contention for all)."""

    def __init__(self, graph, batch: int, *, device: str = "cpu", dtype=np.float32,
                 clock: str = "wall", model: str | None = None):
        self.kind = "cpu" if device == "cpu" else _gpu_kind()
        self.clock = clock if device == "cpu" else "wall"
        self.graph, self.batch, self.dtype, self.model = graph, batch, np.dtype(dtype), model
        self.ex = _TimedExecutor(graph, batch, device=device, policy="liveness", dtype=dtype,
                                 optimizer=timing_optimizer())
        self.ex.clock = CLOCKS[self.clock]
        self.ex.times = []
        self.x, self.y = random_batch(graph, batch)
        self.ex.train_step(self.x, self.y)              # warm-up
        self.ex.times, self.iters = [], []

    def round(self) -> None:
        self.iters += measure_iterations(self.ex, self.x, self.y, 1, self.clock)

    def result(self) -> dict:
        # the fastest of the rounds per step, and of the iterations: on shared cores, the
        # uncontended times (what the simulator predicts) are the minima
        ex, batch, rounds = self.ex, self.batch, len(self.iters)
        n = len(ex.steps)
        per_step = [min(ex.times[r * n + k][1] for r in range(rounds)) for k in range(n)]
        per_key: dict[str, list[float]] = {}
        for step, dt in zip(ex.steps, per_step):
            per_key.setdefault(layer_key(step.layer, step.phase, batch), []).append(dt)
        entries = {k: statistics.median(v) for k, v in per_key.items()}
        iteration_s = min(self.iters)
        # everything the executor does around the kernels (pool, liveness, Python), per step
        overhead = max(0.0, (iteration_s - sum(per_step)) / n)
        spec = cpu_spec() if self.kind == "cpu" else device_spec(self.kind)
        return {"format": "neuron-profile-1", "device": self.kind, "device_detail": spec.detail,
                "dtype": str(self.dtype), "model": self.model or self.graph.name,
                "batch": batch, "repeat": rounds, "clock": self.clock,
                "measured_iteration_s": iteration_s, "step_overhead_s": overhead,
                "copy_bandwidth": spec.copy_bandwidth, "copy_latency": spec.copy_latency,
                "entries": entries, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def profile_model(graph, batch: int, *, device: str = "cpu", repeat: int = 3,
                  model: str | None = None, dtype=np.float32, clock: str = "wall") -> dict:
    p = Profiler(graph, batch, device=device, dtype=dtype, clock=clock, model=model)
    for _ in range(repeat):
        p.round()
    return p.result()


def _gpu_kind() -> str:
    """The cost-model device of the GPU here (unverified: no GPU in this session)."""
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode().upper()
    for kind in ("H200", "H100"):
        if kind in name:
            return kind.lower()
    raise ProfileError(f"no cost-model entry for GPU {name!r}; known: h100, h200")
