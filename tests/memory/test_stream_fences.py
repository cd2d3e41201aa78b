"""Fences per block, proven on the stream log of CudaDevice over the CUDA stand-ins: for a planned
ResNet under memory pressure, every copy and kernel that touch the same bytes are ordered, no
copy waits for compute it does not depend on, and no compute waits for a copy it does not read
or whose block it does not reuse (cuda_standins/stream_check.py). Widening a fence back to "all
compute queued so far" is caught."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from neuron.executor import Executor
from neuron.memory import fences as fences_mod

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/planners")
from planner_training import resnet8_budget  # noqa: E402


def _run(S, cuda_kw, iters=2, fraction=0.5):
    """Train resnet_cifar 8 (8x8, batch 4) under ``fraction`` of its liveness peak (None: no
    budget) on the stand-in CudaDevice with every stream logging; each step's kernels are one
    logged kernel touching the blocks of the step's tensors, its workspace and the CuPy
    temporaries it took; each encode or decode is one on the codec stream touching its source
    and destination."""
    from neuron.devices.cuda import CudaDevice
    from cuda_standins.stream_check import check
    graph, batch, budget = resnet8_budget(fraction or 1.0, size=8, batch=4)
    if fraction is None:
        budget = None
    S.log_streams()
    dev = CudaDevice(budget or 64 << 20, headroom_bytes=0)
    try:
        ex = Executor(graph, batch, device=dev, seed=1, budget=budget, **cuda_kw)
        pool, base = ex.pool, dev.arena.ptr
        temps = []
        malloc = dev.allocator.malloc

        def traced(n, device_id=0):
            ptr = malloc(n, device_id)
            temps.append((ptr, ptr + pool.heap.round(n)))
            return ptr
        dev.allocator.malloc = traced
        compute = ex._compute

        def logged(step, ctx, ws):
            temps.clear()
            compute(step, ctx, ws)
            ranges, reads = list(temps), []
            written = {t.id for t in step.writes} | _written_in_place(ex, step)

            def span(t):
                off = pool.offset[t.storage.id]
                return base + off, base + off + pool.heap.round(t.storage.nbytes or 1)
            for t in step.reads + step.writes:
                (ranges if t.id in written else reads).append(span(t))
            if ws is not None:
                ptr = ws.data.ptr
                ranges.append((ptr, ptr + pool.heap.round(ws.nbytes)))
            S.launch(step.name, ranges, reads)
        ex._compute = logged
        on_codec = dev._on_codec_stream

        def codec_logged(fn, src, dst, after, fence=None):
            def run(a, b):                  # on the codec stream: a kernel over both
                fn(a, b)
                S.launch("codec", [(v.data.ptr, v.data.ptr + v.nbytes) for v in (a, b)])
            return on_codec(run, src, dst, after, fence)
        dev._on_codec_stream = codec_logged
        rng = np.random.default_rng(0)
        for _ in range(iters):
            x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
            ex.train_step(x, rng.integers(0, 10, batch))
        from cuda_standins.runtime import _Stream
        return check(_Stream.issued, dev.compute_stream, pool.fences.step_events), ex
    finally:
        dev.close()


def _written_in_place(ex, step) -> set:
    """Ids of what a step reads and also writes in place: gradients it adds into, parameters
    and optimizer state it updates, BN running statistics in forward (schedule.bind counts
    them as reads: they must be resident)."""
    from neuron.distributed.overlap import due_updates
    ids = set()
    if step.phase == "F":
        ids |= {t.storage.id for t in step.params.values()
                if t.name not in ex.schedule.param_grads}
    elif step.phase == "B":
        ids |= {g.id for _, g, _ in step.grad_targets}
        applies = step.chunk is None or step.chunk.applies_update   # else it sums gradients
        for _, p, g, states in due_updates(step):
            ids.add(g.id)
            if applies:
                ids |= {p.storage.id, *(s.storage.id for s in states)}
    return ids


RUNS = [{"policy": "superneurons"}, {"planner": "vdnn"}, {"planner": "capuchin"},
        {"planner": "superneurons", "offload_params": True}, {"planner": "vdnn:compress=2"},
        {"planner": "superneurons:compress=4", "offload_params": True}]


@pytest.mark.parametrize("kw", RUNS, ids=lambda kw: ",".join(f"{v}" for v in kw.values()))
def test_copies_and_kernels_wait_for_what_they_touch_and_nothing_else(gpu_kernels, cuda_standins, kw):
    rep, ex = _run(cuda_standins, kw)
    c = ex.pool.counters()
    assert c["offloads"] > 0 and c["prefetches"] > 0        # the pressure moves tensors
    assert rep.copies >= c["offloads"] + c["prefetches"] and rep.kernels >= len(ex.steps)
    assert rep.waits_for_copies > 0
    assert not rep.races, rep.races[:3]
    assert not rep.copy_waits, rep.copy_waits[:3]
    assert not rep.compute_waits, rep.compute_waits[:3]


def test_a_fence_widened_to_the_whole_queue_is_caught(gpu_kernels, cuda_standins, monkeypatch):
    """The old rule, every copy after all compute queued so far: still safe, not tight."""
    monkeypatch.setattr(fences_mod.BlockFences, "compute_event",
                        lambda self, epoch: self.device.record_compute(self.device.new_event()))
    rep, _ = _run(cuda_standins, {"policy": "superneurons"})
    assert not rep.races
    assert rep.copy_waits


def test_compute_that_waits_for_a_copy_at_once_is_caught(gpu_kernels, cuda_standins, monkeypatch):
    """The old eviction and prefetch rule, compute waits for each copy as it is issued: the
    kernels in between wait for a copy they do not touch."""
    from neuron.devices.cuda import CudaDevice
    offload, prefetch = CudaDevice.offload, CudaDevice.prefetch

    def eager_offload(self, *a, **k):
        ev = offload(self, *a, **k)
        self.compute_wait(ev)
        return ev

    def eager_prefetch(self, buf, view, compute_waits=True, after=None):
        return prefetch(self, buf, view, True, after)
    monkeypatch.setattr(CudaDevice, "offload", eager_offload)
    monkeypatch.setattr(CudaDevice, "prefetch", eager_prefetch)
    rep, _ = _run(cuda_standins, {"planner": "vdnn"})      # prefetches steps ahead
    assert not rep.races
    assert rep.compute_waits


def test_a_missing_fence_is_a_race(gpu_kernels, cuda_standins, monkeypatch):
    """And the checker's other side: a prefetch that does not wait for the block's last
    kernel races it."""
    monkeypatch.setattr(fences_mod.BlockFences, "compute_event", lambda self, epoch: None)
    rep, _ = _run(cuda_standins, {"policy": "superneurons"})
    assert rep.races


def _snapshots_and_kernels(ex):
    """(issue positions of the step guard's copies, of the compute stream's kernels) in the
    last iteration of a _run (each iteration logs one kernel per step)."""
    from cuda_standins.runtime import _Stream
    dev = ex.device
    snaps, kernels = [], []
    for pos, (stream, i) in enumerate(_Stream.issued):
        if stream == "host":                # what the host saw complete
            continue
        op = stream.ops[i]
        if stream is dev.snapshot_stream and op[0] == "d2h":
            snaps.append(pos)
        elif stream is dev.compute_stream and op[0] == "kernel":
            kernels.append(pos)
    n = len(ex.steps)
    last_start, prev_end = kernels[-n], kernels[-n - 1]
    return [p for p in snaps if p > prev_end], last_start


@pytest.mark.parametrize("kw", [{}, {"chunks": 2, "policy": "recompute"}],
                         ids=["liveness", "chunks,recompute"])
def test_guard_snapshots_start_with_the_step_and_run_under_forward(gpu_kernels, cuda_standins,
                                                                    monkeypatch, kw):
    """Where no tensor moves to the host, every block the step writes is snapshotted before
    its first kernel, and each write waits for a copy issued long before (not one issued right
    before it, which stalled compute for every layer's bytes); the ordering stays exact and the
    bits are those of snapshotting right before each write."""
    rep, ex = _run(cuda_standins, kw, fraction=None)
    assert not rep.races, rep.races[:3]
    snaps, first_kernel = _snapshots_and_kernels(ex)
    assert snaps and all(p < first_kernel for p in snaps), (snaps[-3:], first_kernel)
    early = ex.state_dict()
    monkeypatch.setattr(Executor, "_snapshots_at_start", lambda self: [])
    rep, ex = _run(cuda_standins, kw, fraction=None)
    assert not rep.races
    snaps, first_kernel = _snapshots_and_kernels(ex)
    assert any(p > first_kernel for p in snaps)      # the old order: the control
    late = ex.state_dict()
    assert all(early[k].tobytes() == late[k].tobytes() for k in early)


def _evictions_on_the_log(monkeypatch):
    """Note each LRU eviction as it happens: (the stream log's length when it starts and when
    it is done, the evicted block's device range); a list filled while a _run trains."""
    from neuron.memory.pool import Pool
    from cuda_standins.runtime import _Stream
    seen, evicting = [], []
    evict_one, offload = Pool._evict_one, Pool.offload

    def traced_evict_one(self):
        evicting.append(True)
        try:
            return evict_one(self)
        finally:
            evicting.pop()

    def traced_offload(self, t, *a, **k):
        if not evicting or self.fences is None:     # (the plan's virtual device)
            return offload(self, t, *a, **k)
        lo, pos = self.device.arena.ptr + self.offset[t.id], len(_Stream.issued)
        offload(self, t, *a, **k)
        seen.append((pos, len(_Stream.issued), lo, lo + t.nbytes))
    monkeypatch.setattr(Pool, "_evict_one", traced_evict_one)
    monkeypatch.setattr(Pool, "offload", traced_offload)
    return seen


def _kernels_between_copy_and_eviction(ex, seen) -> list:
    """For each eviction noted: the compute kernels issued after its copy to the host (the
    last copy out of the block issued by the eviction's end) and before the eviction."""
    from cuda_standins.runtime import _Stream
    dev = ex.device
    issued = _Stream.issued
    out = []
    for pos, end, lo, hi in seen:
        copy = next((k for k in range(end - 1, -1, -1)
                     if issued[k][0] is dev.d2h_stream
                     and issued[k][0].ops[issued[k][1]][:1] == ("d2h",)
                     and issued[k][0].ops[issued[k][1]][2] == lo
                     and issued[k][0].ops[issued[k][1]][3] >= hi - lo), None)
        assert copy is not None, (lo, hi)
        out.append(sum(1 for s, i in issued[copy:pos]
                       if s is dev.compute_stream and s.ops[i][0] == "kernel"))
    return out


def test_evictions_copy_under_the_compute_before_them(gpu_kernels, cuda_standins, monkeypatch):
    """The LRU policy's evictions on the schedule of the iteration before (memory/
    evict_ahead.py): each eviction's copy to the host is issued at least one compute step
    before the allocation that takes its block, so it runs under that compute; the stream log
    stays race-free and tight, and the run moves and computes what it did on demand."""
    seen = _evictions_on_the_log(monkeypatch)
    rep, ex = _run(cuda_standins, {"policy": "superneurons"}, iters=3)
    c = ex.pool.counters()
    assert c["evictions"] > 0 and seen and len(seen) == c["evictions"]
    assert c["evictions_ahead"] == c["evictions"] and c["ahead_fallbacks"] == 0
    assert not rep.races, rep.races[:3]
    assert not rep.copy_waits, rep.copy_waits[:3]
    assert not rep.compute_waits, rep.compute_waits[:3]
    under = _kernels_between_copy_and_eviction(ex, seen)
    assert min(under) >= 1, sorted(under)[:5]
    state = ex.state_dict()
    seen.clear()
    _, on_demand = _run(cuda_standins, {"policy": "superneurons", "evict_ahead": False},
                        iters=3)
    assert on_demand.pool.counters()["evictions"] == c["evictions"]
    assert on_demand.pool.counters()["offload_bytes"] == c["offload_bytes"]
    other = on_demand.state_dict()
    assert all(state[k].tobytes() == other[k].tobytes() for k in state)


def test_an_eviction_on_demand_is_caught(gpu_kernels, cuda_standins, monkeypatch):
    """The probe: evictions reverted to on demand (no copy starts ahead) copy at the
    allocation that needs the block, with no compute to run under."""
    from neuron.memory.pool import Pool
    seen = _evictions_on_the_log(monkeypatch)
    monkeypatch.setattr(Pool, "precopy", lambda self, t: False)
    _, ex = _run(cuda_standins, {"policy": "superneurons"}, iters=3)
    assert ex.pool.counters()["evictions_ahead"] == 0
    assert seen and max(_kernels_between_copy_and_eviction(ex, seen)) == 0
