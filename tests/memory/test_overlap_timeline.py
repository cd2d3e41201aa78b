"""Overlap measured from event timestamps (memory/overlap.py): the arithmetic on hand-made
intervals, and the timeline CudaDevice and the pool fill, on the CUDA stand-ins with a fake
clock."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from neuron.memory.overlap import overlap_stats

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/planners")
from planner_training import resnet8_budget  # noqa: E402


def test_concurrent_and_exposed_copy_time_from_intervals():
    s = overlap_stats([(0, 10), (12, 20)], [("d2h", 5, 15, 100), ("h2d", 18, 25, 50),
                                            ("h2d", 19, 21, 8)])
    assert s["compute_ms"] == 18 and s["d2h_ms"] == 10 and s["h2d_ms"] == 7
    assert s["d2h_bytes"] == 100 and s["h2d_bytes"] == 58
    assert s["copy_ms"] == 17                       # (5, 15) and (18, 25)
    assert s["concurrent_ms"] == 5 + 3 + 2          # (5,10) (12,15) (18,20)
    assert s["exposed_copy_ms"] == 7 and s["hidden_fraction"] == pytest.approx(10 / 17)
    assert s["span_ms"] == 25
    assert overlap_stats([(0, 1)], [])["hidden_fraction"] is None


def test_a_timeline_of_a_planned_run_on_the_stand_ins(gpu_kernels, cuda_standins, monkeypatch):
    """Each iteration: its copies by direction with the bytes the pool moved, each step's
    kernels, and consistent sums; only the last ``keep`` iterations are kept."""
    from cuda_standins import runtime
    from neuron.devices.cuda import CudaDevice
    from neuron.executor import Executor
    from neuron.memory.traffic import TrafficCheck
    clock = iter(range(10 ** 9))
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: next(clock) * 1e-3)   # 1 ms/tick
    graph, batch, budget = resnet8_budget(0.6, size=8, batch=4)
    dev = CudaDevice(budget, headroom_bytes=0)
    try:
        ex = Executor(graph, batch, device=dev, seed=1, budget=budget, planner="capuchin",
                      replay="off")     # the timeline times eager iterations (executor.py)
        timeline = ex.pool.overlap
        assert timeline is not None and dev.timeline is timeline
        timeline.keep = 2
        check = TrafficCheck(ex)
        step = check.wrap(ex.train_step)
        rng = np.random.default_rng(0)
        for _ in range(3):
            step(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32),
                 rng.integers(0, 10, batch))
        rep = timeline.report()
    finally:
        dev.close()
    assert len(rep["iterations"]) == 2
    moved = check.report()["ran"]
    for it in rep["iterations"]:
        assert it["h2d_bytes"] == moved["prefetch_bytes"] > 0
        assert it["d2h_bytes"] >= moved["offload_bytes"] > 0
        assert it["compute_ms"] > 0 and it["d2h_ms"] > 0 and it["h2d_ms"] > 0
        assert 0 <= it["concurrent_ms"] <= min(it["copy_ms"], it["compute_ms"])
        assert it["exposed_copy_ms"] == pytest.approx(it["copy_ms"] - it["concurrent_ms"])
    assert rep["median"]["h2d_bytes"] == moved["prefetch_bytes"]


sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/kernels")
from test_cuda_on_standins import rerun_graphs  # noqa: E402, F401 (a fixture, requested by name)


@pytest.mark.parametrize("mode", ["tape", "graph"])
def test_replayed_iterations_are_timed_too(gpu_kernels, cuda_standins, rerun_graphs,
                                           monkeypatch, mode):
    """With NEURON_OVERLAP=1 a replaying executor keeps its timeline: a copy's completion
    event (which fences hold and later copies wait for) stays the untimed ring event and its
    interval gets timing events of its own, so the records repeat and the tape is trusted
    (the fourth step replays; with a fresh timed completion event it never is); a graph
    records the timing events as event record nodes (external records in the capture), so
    each launch is timed. The replays give eager's bits, and every measured execution is a
    replayed one with the bytes the eager iterations move."""
    from cuda_standins import runtime
    from neuron.devices.cuda import CudaDevice
    from neuron.executor import Executor
    clock = iter(range(10 ** 9))
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: next(clock) * 1e-3)   # 1 ms/tick
    monkeypatch.setenv("NEURON_OVERLAP", "1")
    external = []
    real = runtime._Runtime.eventRecordWithFlags
    monkeypatch.setattr(runtime._Runtime, "eventRecordWithFlags", staticmethod(
        lambda *a: (external.append(a), real(*a))))
    from neuron.memory.overlap import Timeline
    starts = []                         # when each measured execution's first step began
    read = Timeline.sample

    def sample(self, wait=False):
        done = read(self, wait)
        if done:
            starts.append(self._last[0][0][0].t)
        return done
    monkeypatch.setattr(Timeline, "sample", sample)
    graph, batch, budget = resnet8_budget(0.6, size=8, batch=4)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32),
             rng.integers(0, 10, batch)) for _ in range(7)]
    runs = {}
    for replay in ("off", mode):
        dev = CudaDevice(budget, headroom_bytes=0)
        try:
            ex = Executor(graph, batch, device=dev, seed=1, budget=budget, planner="capuchin",
                          replay=replay)
            timeline = ex.pool.overlap
            assert timeline is not None
            timeline.keep = 3
            losses = []
            for i, (x, y) in enumerate(data):
                if i == 4:                  # steps 5-7 replay: measure only those
                    assert ex.replay["ran"] == replay, ex.replay
                    timeline.clear()
                if i == 5:
                    ring = dev._copy_events[(dev.compute_stream.ptr, "timed")][0]
                    size = len(ring)
                losses.append(ex.train_step(x, y))
            assert len(ring) == size        # replays reuse the timing events, none created
            rep = timeline.report()
            runs[replay] = (losses, ex.state_dict(), ex.replay, rep)
        finally:
            dev.close()
    losses, state, info, rep = runs[mode]
    assert info["ran"] == mode and info["eager_because"] is None, info
    assert info["replayed_iterations"] == 4, info
    assert losses == runs["off"][0]
    assert all(state[k].tobytes() == runs["off"][1][k].tobytes() for k in state)
    assert len(rep["iterations"]) == 3
    assert (len(external) > 0) == (mode == "graph")
    assert starts[-3] < starts[-2] < starts[-1]     # each one timed by its own execution
    per_iter = runs["off"][3]["iterations"][-1]
    for it in rep["iterations"]:
        assert it["h2d_bytes"] == per_iter["h2d_bytes"] > 0
        assert it["d2h_bytes"] == per_iter["d2h_bytes"] > 0
        assert it["compute_ms"] > 0 and it["h2d_ms"] > 0 and it["d2h_ms"] > 0
        assert 0 <= it["concurrent_ms"] <= min(it["copy_ms"], it["compute_ms"])
