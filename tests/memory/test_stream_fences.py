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


def _run(S, cuda_kw, iters=2):
    """Train resnet_cifar 8 (8x8, batch 4) under 0.5 of its liveness peak on the stand-in
    CudaDevice with every stream logging; each step's kernels are one logged kernel touching
    the blocks of the step's tensors, its workspace and the CuPy temporaries it took; each
    encode or decode is one on the codec stream touching its source and destination."""
    from neuron.devices.cuda import CudaDevice
    from cuda_standins.stream_check import check
    graph, batch, budget = resnet8_budget(0.5, size=8, batch=4)
    S.log_streams()
    dev = CudaDevice(budget, headroom_bytes=0)
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
            ranges = list(temps)
            for t in step.reads + step.writes:
                off = pool.offset[t.storage.id]
                ranges.append((base + off, base + off + pool.heap.round(t.storage.nbytes or 1)))
            if ws is not None:
                ptr = ws.data.ptr
                ranges.append((ptr, ptr + pool.heap.round(ws.nbytes)))
            S.launch(step.name, ranges)
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
