"""``neuron profile``: time every step's kernel on a device, once, for the cost model.

The profile is JSON keyed by layer geometry (memory/costmodel.py ``layer_key``), with the
device, its identity, the dtype, the per-step overhead of the executor and the copy bandwidth,
so that the simulated clock can replay any plan of the same network on measured times.

On a GPU each round also runs one iteration the way training runs it, without synchronizing:
each step's kernels between two CUDA events on the compute stream (``gpu_entries``) and the
host's time to issue them (``host_entries``; ``host_overhead_s`` is the executor's own host
work per step). The clock then pipelines host and GPU (costmodel ``pipelined``).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..executor import Executor
from .costmodel import PROFILE_FORMAT, cpu_spec, device_spec, gpu_kind, layer_key


#: the stopwatches: wall time, or the process's CPU time, which other users of shared cores do
#: not inflate (equal to wall time for single-threaded kernels on an idle core)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


class _TimedExecutor(Executor):
    """The executor with a stopwatch around each kernel (synchronized on the GPU)."""
    times: list
    clock = staticmethod(time.perf_counter)

    events = None       # a list: time with CUDA events, unsynchronized (pipelined round)

    def _compute(self, step, ctx, ws):
        if self.events is not None:
            return self._compute_events(step, ctx, ws)
        sync, clock = self.device.synchronize, self.clock
        sync()
        t0 = clock()
        super()._compute(step, ctx, ws)
        sync()
        self.times.append((step, clock() - t0))

    def _compute_events(self, step, ctx, ws):
        import cupy as cp
        stream = self.device.compute_stream
        t0 = time.perf_counter()
        e0 = stream.record(cp.cuda.Event())
        super()._compute(step, ctx, ws)
        e1 = stream.record(cp.cuda.Event())
        t1 = time.perf_counter()
        self.events.append((step, t1 - t0, e0, e1, t1))


def pipelined_iteration(ex: "_TimedExecutor", x, y) -> dict:
    """One iteration as training runs it (no synchronization between steps): per step the
    host's issue time and the kernels' event time; the host's time from the start to the last
    step issued; the iteration's wall time."""
    import cupy as cp
    ex.device.synchronize()
    ex.events = []
    t0 = time.perf_counter()
    try:
        ex.train_step(x, y)
        ex.device.synchronize()
        wall = time.perf_counter() - t0
    finally:
        rows, ex.events = ex.events, None
    return {"host": [h for _, h, _, _, _ in rows],
            "gpu": [cp.cuda.get_elapsed_time(e0, e1) / 1e3 for _, _, e0, e1, _ in rows],
            "issued_s": rows[-1][4] - t0 if rows else 0.0, "wall_s": wall}


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
                 clock: str = "wall", model: str | None = None, precision=None,
                 layout=None):
        self.kind = "cpu" if device == "cpu" else gpu_kind()
        self.clock = clock if device == "cpu" else "wall"
        self.graph, self.batch, self.dtype, self.model = graph, batch, np.dtype(dtype), model
        self.ex = _TimedExecutor(graph, batch, device=device, policy="liveness", dtype=dtype,
                                 optimizer=timing_optimizer(), precision=precision,
                                 layout=layout)
        self.ex.clock = CLOCKS[self.clock]
        self.ex.times = []
        self.x, self.y = random_batch(graph, batch)
        self.ex.train_step(self.x, self.y)              # warm-up
        self.ex.times, self.iters, self.pipes = [], [], []

    def round(self) -> None:
        self.iters += measure_iterations(self.ex, self.x, self.y, 1, self.clock)
        if self.kind != "cpu":
            self.pipes.append(pipelined_iteration(self.ex, self.x, self.y))

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
        out = {"format": PROFILE_FORMAT, "device": self.kind, "device_detail": spec.detail,
               "dtype": str(self.dtype), "precision": ex.precision.name,
               "layout": ex.layout,
               "model": self.model or self.graph.name,
               "batch": batch, "repeat": rounds, "clock": self.clock,
               "measured_iteration_s": iteration_s, "step_overhead_s": overhead,
               "copy_bandwidth": spec.copy_bandwidth, "copy_latency": spec.copy_latency,
               "entries": entries, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if self.pipes:
            out.update(pipelined_entries(ex.steps, batch, self.pipes, per_step))
        return out


def pipelined_entries(steps, batch: int, pipes: list[dict], synced: list[float]) -> dict:
    """Per geometry the fastest round's host and kernel times (medians over the steps of the
    same geometry, as ``entries``), and the executor's host work per step. A step that reads a
    result back (``syncs_host``, the loss) waits there for all the GPU work queued before it:
    its host time is taken from its own synchronized timing (``synced``) less its kernels',
    and the clock adds the wait."""
    n = len(steps)
    raw = [min(p["host"][k] for p in pipes) for k in range(n)]
    gpu = [min(p["gpu"][k] for p in pipes) for k in range(n)]
    host = list(raw)
    for k, s in enumerate(steps):
        if s.phase != "B" and s.layer.syncs_host:
            host[k] = max(0.0, synced[k] - gpu[k])
    tables: dict[str, dict[str, list[float]]] = {"host_entries": {}, "gpu_entries": {}}
    for step, h, g in zip(steps, host, gpu):
        key = layer_key(step.layer, step.phase, batch)
        tables["host_entries"].setdefault(key, []).append(h)
        tables["gpu_entries"].setdefault(key, []).append(g)
    issued = min(p["issued_s"] for p in pipes)
    return {**{t: {k: statistics.median(v) for k, v in rows.items()}
               for t, rows in tables.items()},
            # what the host did besides the steps (its wait at a read-back is in ``raw``)
            "host_overhead_s": max(0.0, (issued - sum(raw)) / n),
            "pipelined_iteration_s": min(p["wall_s"] for p in pipes)}


def profile_model(graph, batch: int, *, device: str = "cpu", repeat: int = 3,
                  model: str | None = None, dtype=np.float32, clock: str = "wall",
                  precision=None, layout=None) -> dict:
    """``layout``: nchw or nhwc storage of 4-d maps and conv weights (memory/layout.py)."""
    p = Profiler(graph, batch, device=device, dtype=dtype, clock=clock, model=model,
                 precision=precision, layout=layout)
    for _ in range(repeat):
        p.round()
    return p.result()
