"""Evictions on the plan's schedule (memory/evict_ahead.py): the LRU cache's copies to the host
start right after each evicted tensor's last use, from the iteration after the one recorded,
and the run is the on-demand run in every other respect: the same evictions, moves (in order,
per iteration), losses and parameters to the bit, on the synchronous CPU device and on a device
whose copies complete late; a tensor used again before its eviction falls back to on demand."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.memory.clock import makespan
from neuron.memory.costmodel import CostModel
from neuron.memory.evict_ahead import EvictionRecorder, EvictionSchedule
from neuron.memory.traffic import TrafficCheck, moves
from stream_model import StreamModelDevice

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/planners")
from planner_training import resnet8_budget  # noqa: E402

RUNS = [{"policy": "superneurons"}, {"policy": "offload"}, {"planner": "superneurons"},
        {"planner": "capuchin"}, {"planner": "vdnn"},
        {"planner": "superneurons", "offload_params": True},
        {"policy": "superneurons", "prefetch_ahead": "auto"},
        {"planner": "vdnn:compress=2"}]


def _name(kw):
    return ",".join(str(v) for v in kw.values())


def _train(kw, ahead, device="cpu", iters=3, fraction=0.5, replay="off"):
    graph, batch, budget = resnet8_budget(fraction, size=8, batch=4)
    dev = (CpuDevice if device == "cpu" else StreamModelDevice)(budget)
    try:
        ex = Executor(graph, batch, device=dev, seed=1, budget=budget, evict_ahead=ahead,
                      replay=replay, **kw)
    except Exception as e:         # a plan that cannot fit this budget fails before any state
        pytest.skip(f"{_name(kw)} does not fit {fraction} of the peak: {e}"[:200])
    check = TrafficCheck(ex)
    rng = np.random.default_rng(0)
    losses, logs = [], []
    for _ in range(iters):
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        check.begin()
        ex.pool.log = log = []
        losses.append(ex.train_step(x, rng.integers(0, 10, batch)))
        logs.append(log)
        check.end()
    return ex, losses, check, logs


@pytest.mark.parametrize("kw", RUNS, ids=_name)
@pytest.mark.parametrize("device", ["cpu", "late"])
def test_early_copies_change_nothing_but_when_copies_start(kw, device):
    on, l_on, c_on, logs_on = _train(kw, True, device)
    off, l_off, c_off, logs_off = _train(kw, False, device)
    assert l_on == l_off
    s_on, s_off = on.state_dict(), off.state_dict()
    assert all(s_on[k].tobytes() == s_off[k].tobytes() for k in s_off)
    assert not c_on.mismatches and not c_off.mismatches, (c_on.mismatches, c_off.mismatches)
    assert [moves(a) for a in logs_on] == [moves(b) for b in logs_off]
    a, b = on.pool.counters(), off.pool.counters()
    for k in ("offload_bytes", "prefetch_bytes", "evictions", "evicted_bytes", "cache_misses",
              "compactions"):
        assert a[k] == b[k], k
    assert on.pool.high_water == off.pool.high_water
    assert b["evictions_ahead"] == 0
    assert a["ahead_fallbacks"] == 0
    if a["evictions"]:      # every eviction that has a step to run under copies ahead
        rec = on._evict_schedule
        early = sum(1 for _, at, last in rec.evictions if last is not None and last < at)
        assert a["evictions_ahead"] == early * len(l_on) > 0
        assert sum(e[0] == "precopy" for log in logs_on for e in log) == a["evictions_ahead"]


def test_the_lru_policy_evicts_nothing_on_demand_from_the_first_iteration():
    """The plan's simulation records the evictions, so the run's first iteration already
    copies every one of them ahead."""
    ex, losses, _, logs = _train({"policy": "superneurons"}, True, iters=1)
    c = ex.pool.counters()
    assert c["evictions"] > 0 and c["evictions_ahead"] == c["evictions"]
    # each copy starts after its tensor's last use, before the step that evicts it
    steps_seen = 0
    started = {}
    for e in logs[0]:
        if e[0] == "step":
            steps_seen = e[1]
        elif e[0] == "precopy":
            started[e[1]] = steps_seen
    for t, at, last in ex._evict_schedule.evictions:
        assert last <= started[t.id] < at


def test_a_tensor_used_before_its_eviction_falls_back_to_on_demand():
    """A schedule that starts a copy before a later use of its tensor (an iteration that
    differs from the recorded one): the copy is dropped at that use and the tensor evicted on
    demand, counted; moves and bits stay those of the on-demand run."""
    ref, l_ref, _, logs_ref = _train({"policy": "superneurons"}, False)
    ex, _, _, _ = _train({"policy": "superneurons"}, True, iters=0)
    rec = ex._evict_schedule
    uses = {t.id: [i for i, s in enumerate(ex.steps) if t.id in s.ids and i <= last]
            for t, _, last in rec.evictions if last is not None}
    t, at, last = next(e for e in rec.evictions if len(uses.get(e[0].id, ())) >= 2)
    first = uses[t.id][0]           # made (or used) here, used again before its eviction
    early = EvictionSchedule(rec.steps, rec.frees, rec.arena, [(t, at, first)])
    assert early.issue == {first: [t]}      # wrong on purpose: a use follows
    ex._evict_schedule = early
    rng = np.random.default_rng(0)
    losses, logs = [], []
    for _ in range(3):
        x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
        ex.pool.log = log = []
        losses.append(ex.train_step(x, rng.integers(0, 10, 4)))
        logs.append(log)
    c = ex.pool.counters()
    assert c["ahead_fallbacks"] >= 3 and c["evictions_ahead"] < c["evictions"]
    assert any(e[0] == "precopy_drop" and e[1] == t.id for e in logs[0])
    assert losses == l_ref
    assert [moves(a) for a in logs] == [moves(b) for b in logs_ref]
    s, s_ref = ex.state_dict(), ref.state_dict()
    assert all(s[k].tobytes() == s_ref[k].tobytes() for k in s_ref)


def test_the_tape_records_the_early_copies_as_a_repeating_program():
    on, l_on, _, _ = _train({"policy": "superneurons"}, True, iters=6, replay="tape")
    off, l_off, _, _ = _train({"policy": "superneurons"}, True, iters=6, replay="off")
    assert l_on == l_off
    r = on.replay
    assert r["eager_because"] is None and r["replayed_iterations"] >= 3, r
    assert on.pool.counters() == off.pool.counters()
    assert on.pool.counters()["evictions_ahead"] == on.pool.counters()["evictions"] > 0


def test_off_under_a_host_budget_and_when_asked():
    graph, batch, budget = resnet8_budget(0.5, size=8, batch=4)
    ex = Executor(graph, batch, device=CpuDevice(budget), budget=budget,
                  policy="superneurons", host_budget=1 << 30)
    assert ex._eviction_hooks(ex.steps, ex.frees) is None
    ex = Executor(graph, batch, device=CpuDevice(budget), budget=budget,
                  policy="superneurons", evict_ahead=False)
    assert ex._eviction_hooks(ex.steps, ex.frees) is None and ex._evict_schedule is None


def test_the_recorder_notes_each_eviction_and_the_last_use_before_it():
    class S:
        def __init__(self, ids):
            self.ids = ids

    class T:
        def __init__(self, i):
            self.id = i
    steps = [S((1, 2)), S((2,)), S((3,)), S((4,))]
    rec = EvictionRecorder(steps)
    a, b, c = T(1), T(2), T(3)
    rec.after_step(None, 0)
    rec.after_step(None, 1)
    rec.evicted(a)                  # in step 2: last used in step 0
    rec.after_step(None, 2)
    rec.arrived(2)                  # brought back after step 3 (a prefetch)
    rec.after_step(None, 3)
    rec.evicted(b)                  # after the last step: used or brought back in 3
    rec.evicted(c)                  # last used in step 2
    s = rec.schedule("frees", 100)
    assert rec.evictions == [(a, 2, 0), (b, 4, 3), (c, 4, 2)]
    assert s.issue == {0: [a], 3: [b], 2: [c]}
    assert EvictionSchedule(steps, "frees", 100, rec.evictions, window=0).issue == \
        {1: [a], 3: [b, c]}
    assert s.fits(steps, "frees", 100) and not s.fits(list(steps), "frees", 100)


def test_the_clock_counts_an_early_copy_under_compute():
    """An eviction whose copy started two steps before: the pipelined clock hides it; the
    same copy at the eviction is exposed. Bytes moved are the same."""
    from neuron.memory.costmodel import DEVICES
    graph, batch, budget = resnet8_budget(0.5, size=8, batch=4)
    ex = Executor(graph, batch, device="virtual", policy="superneurons")
    cost = CostModel(DEVICES["h100"])
    t = next(t for s in ex.steps for t in s.writes)
    n = 64 << 20
    late = [("step", 0, 0), ("step", 1, 0), ("offload", t.id, n), ("step", 2, 0)]
    early = [("step", 0, 0), ("precopy", t.id, n), ("step", 1, 0), ("offload", t.id, n),
             ("step", 2, 0)]
    a, b = makespan(late, ex.steps, batch, cost), makespan(early, ex.steps, batch, cost)
    assert a.bytes_moved == b.bytes_moved == n
    assert b.exposed_copy_s < a.exposed_copy_s


@pytest.mark.parametrize("kw", [{"policy": "superneurons"}, {"planner": "capuchin"}],
                         ids=_name)
def test_an_undone_step_leaves_no_early_copy_behind(kw):
    """A step undone (a non-finite image) after its early copies started: they are dropped
    with the iteration, and the steps after it train as without them."""
    from neuron.errors import DataError
    graph, batch, budget = resnet8_budget(0.5, size=8, batch=4)
    runs = []
    for ahead in (True, False):
        ex = Executor(graph, batch, device=CpuDevice(budget), seed=1, budget=budget,
                      evict_ahead=ahead, **kw)
        rng = np.random.default_rng(0)
        losses = []
        for i in range(4):
            x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
            y = rng.integers(0, 10, batch)
            if i == 1:
                x[0, 0, 0, 0] = np.nan
                with pytest.raises(DataError):
                    ex.train_step(x, y)
                continue
            losses.append(ex.train_step(x, y))
        assert not ex.pool.precopied and ex.pool.counters()["evictions"] > 0
        runs.append((losses, ex.state_dict(), ex.pool.counters()))
    (l_on, s_on, c_on), (l_off, s_off, c_off) = runs
    assert l_on == l_off
    assert all(s_on[k].tobytes() == s_off[k].tobytes() for k in s_off)
    assert c_on["offload_bytes"] == c_off["offload_bytes"]


def test_a_step_interrupted_with_early_copies_in_flight_drops_them():
    """Interrupted mid-backward (early copies started, their evictions not yet come): the
    copies are dropped with the iteration, counted, and training goes on as without them."""
    graph, batch, budget = resnet8_budget(0.5, size=8, batch=4)
    runs, stop = [], None
    for ahead in (True, False):
        ex = Executor(graph, batch, device=CpuDevice(budget), seed=1, budget=budget,
                      evict_ahead=ahead, policy="superneurons")
        if stop is None:                # right before the last recorded eviction
            stop = max(at for _, at, _ in ex._evict_schedule.evictions) - 1
        compute, calls = ex._compute, [0]

        def faulty(step, ctx, ws):
            calls[0] += 1
            if calls[0] == len(ex.steps) + stop:         # the second iteration's step `stop`
                raise KeyboardInterrupt
            return compute(step, ctx, ws)
        ex._compute = faulty
        rng = np.random.default_rng(0)
        losses = []
        for i in range(3):
            x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
            y = rng.integers(0, 10, batch)
            if i == 1:
                with pytest.raises(KeyboardInterrupt):
                    ex.train_step(x, y)
                assert not ex.pool.precopied
                dropped = ex.pool.counters()["ahead_fallbacks"]
                continue
            losses.append(ex.train_step(x, y))
        runs.append((losses, ex.state_dict(), dropped))
    (l_on, s_on, dropped), (l_off, s_off, _) = runs
    assert dropped > 0
    assert l_on == l_off
    assert all(s_on[k].tobytes() == s_off[k].tobytes() for k in s_off)
