"""A planner under FreeLunch compression (planners/compress.py) plans with the compressed
copies: the plan context carries the codec, every candidate is simulated with the compression
its decisions will have, and the per-tensor swap costs count compressed bytes and codec passes
(PlanContext.copy_cost)."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.executor import Executor
from neuron.memory.codecs import get_codec
from neuron.memory.compressed_swap import sent_uncompressed
from neuron.memory.costmodel import CostModel
from neuron.memory.planners import PlanContext, get_planner
from neuron.memory.planners.compress import Compressed
from neuron.memory.planners.costs import tensor_costs
from neuron.memory.planners.rewrite import droppable
from neuron.memory.planners.superneurons import time_bound
from neuron.memory.tensors import Kind
from neuron.models import build_model

COST = CostModel.analytic("h100")
_graphs: dict = {}


def setup(size: int, fraction: float):
    """resnet_cifar 20 at size x size, batch 32: a liveness executor and a fraction of its
    liveness peak."""
    if size not in _graphs:
        g = build_model("resnet_cifar", depth=20, in_shape=(3, size, size))
        ex = Executor(g, 32, device="virtual", policy="liveness")
        _graphs[size] = g, ex, ex.simulate(None, trace=False)["peak_bytes"]
    g, ex, peak = _graphs[size]
    return g, ex, int(peak * fraction)


def test_copy_cost_counts_the_compressed_bytes_and_the_codec_passes():
    _, ex, budget = setup(8, 0.3)
    ctx = PlanContext(ex, budget, COST)
    fmap = max((t for t in droppable(ex.schedule) if t.kind == Kind.ACTIVATION),
               key=lambda t: t.nbytes)
    grad = next(t for s in ex.schedule.steps for t in s.writes if t.kind == Kind.GRADIENT)
    full = {t.id: ctx.copy_cost(t) for t in (fmap, grad)}
    assert full[fmap.id] == (COST.copy_time(fmap.nbytes), 0.0)
    plain = {c.tensor.id: c for c in tensor_costs(ctx, droppable(ex.schedule))}
    bound = time_bound(ctx, ex.schedule.steps)[0]
    ctx.codec = codec = get_codec(4)
    m = codec.nbytes(fmap.nbytes // 4)
    assert ctx.copy_cost(fmap) == (COST.copy_time(m), COST.codec_time(fmap.nbytes + m))
    assert ctx.copy_cost(fmap, compressed=False) == full[fmap.id]
    assert ctx.copy_cost(grad) == full[grad.id]             # a gradient goes as it is
    squeezed = {c.tensor.id: c for c in tensor_costs(ctx, droppable(ex.schedule))}
    c0, c1 = plain[fmap.id], squeezed[fmap.id]
    assert c1.swap_s == 2 * COST.copy_time(m) < c0.swap_s
    # compute waits for the encode and the decode whatever the copies hide
    assert c1.exposed_s >= 2 * COST.codec_time(fmap.nbytes + m)
    assert c1.recompute_s == c0.recompute_s
    assert ctx.copy_fraction == 33 / 128
    assert time_bound(ctx, ex.schedule.steps)[0] <= bound     # fewer bytes to copy: sound


def test_the_tensor_caches_evictions_are_priced_as_compressed_copies():
    """The MILP's evicted-bytes variable and the DQN's features price an eviction as the
    compressed run makes it (memory/compressed_swap.py: the cache's evictions go through the
    codec): fewer bytes copied plus the codec's passes; full size under full-size pricing."""
    from neuron.memory.planners.checkmate import MiB, Model
    from neuron.memory.planners.dqn_features import TraceGraph
    _, ex, budget = setup(8, 0.3)
    ctx = PlanContext(ex, budget, COST)
    plain = ctx.evict_s_per_byte()
    assert plain == 2 * COST.copy_time(1 << 30) / (1 << 30)
    cands = droppable(ex.schedule)
    full_model = Model(ctx, tensor_costs(ctx, cands))
    full_evict = TraceGraph(ctx).evict_per_byte
    ctx.codec = codec = get_codec(4)
    m = codec.nbytes(1 << 28)
    assert ctx.evict_s_per_byte() == \
        2 * (COST.copy_time(m) + COST.codec_time((1 << 30) + m)) / (1 << 30) < plain
    assert ctx.evict_s_per_byte(compressed=False) == plain
    assert Model(ctx, tensor_costs(ctx, cands, False), False).evict_s_per_mib == \
        full_model.evict_s_per_mib == 2 * COST.copy_time(MiB)
    assert Model(ctx, tensor_costs(ctx, cands), True).evict_s_per_mib < \
        full_model.evict_s_per_mib
    assert TraceGraph(ctx).evict_per_byte < full_evict


def test_the_executor_reuses_the_planners_compressed_simulation():
    """Every candidate was simulated with the compression its decisions have, so the
    executor takes the planner's simulation of its answer, and it is a fresh one's."""
    g, _, budget = setup(16, 0.3)
    for spec in ("superneurons:compress=2", "capuchin:compress=4"):
        ex = Executor(g, 32, device="virtual", planner=spec, budget=budget, cost=COST)
        assert ex._planned_sim is not None, spec
        reused = ex.simulate(budget, trace=False, events=True)
        fresh = ex._simulate(budget, trace=False, events=True)
        assert reused["fits"] and reused["events"] == fresh["events"], spec
        assert any(e[0] == "encode" for e in fresh["events"]), spec


def full_size_plan(ex, budget, planner, rate):
    """What the wrapper did before: the inner planner's plan with full-size copies, then
    every feature map compressed."""
    ctx = PlanContext(ex, budget, COST)
    d = get_planner(planner).plan(ctx)
    d.compress = {t.id: rate for s in d.steps for t in s.reads + s.writes
                  if t.kind == Kind.ACTIVATION and t.dtype == np.float32}
    return d, ctx.evaluate(d)


# (planner, liveness peak fraction, rate, input size, whether compressed planning is faster)
CASES = [("superneurons", 0.25, 4, 32, True), ("superneurons", 0.15, 2, 32, False),
         ("capuchin", 0.15, 4, 32, True), ("capuchin", 0.2, 4, 32, False),
         ("capuchin", 0.3, 2, 16, False), ("superneurons", 0.3, 2, 32, False)]


@pytest.mark.parametrize("planner,fraction,rate,size,faster", CASES)
def test_planning_with_compressed_copies_is_no_slower_and_swaps_where_they_pay(
        planner, fraction, rate, size, faster):
    """Where compressed copies make swapping pay, the plan differs from the full-size one
    (more swaps) and is faster in the simulator; it is never slower (by more than 0.1%:
    superneurons at 0.15 and rate 2 plans 3.8002 ms against the full-size plan's 3.7994, once
    a planned offload's block is held until its copy is done by the clock, which made the
    full-size plan's swaps hide; before, 3% faster was asserted there).
    (resnet_cifar 20 32x32 at 0.25 and rate 4: superneurons 2.11 -> 1.74 ms; capuchin at 0.2
    and rate 4 was 1.8% slower, and at 16x16 and 0.3 48% slower, with the compressed costs
    alone, before it searched the full-size choice too. Since capuchin's count search tries
    fewer recomputes than the excess, its compressed plan at 0.15 and rate 4 recomputes fewer
    tensors and leaves more to the cache's compressed copies instead of swapping more: 4.51
    ms against the full-size choice's 4.73, where before the search they were 5.13 and 5.57.)"""
    _, ex, budget = setup(size, fraction)
    old, r_old = full_size_plan(ex, budget, planner, rate)
    ctx = PlanContext(ex, budget, COST)
    new = Compressed(get_planner(planner), rate).plan(ctx)
    r_new = ctx.evaluate(new)
    assert r_old["fits"] and r_new["fits"]
    assert r_new["time_s"] <= r_old["time_s"] * 1.001
    if faster:
        assert r_new["time_s"] < 0.97 * r_old["time_s"]
        if planner == "capuchin":                   # a different choice (see above)
            assert new.tensors != old.tensors
        else:
            assert new.counts()["compress"] > old.counts()["swap"]   # swapped more


@pytest.mark.parametrize("spec,fraction,size", [("superneurons:compress=4", 0.25, 16),
                                                ("capuchin:compress=4", 0.15, 32)])
def test_a_compressed_plan_runs_for_real_as_simulated(spec, fraction, size):
    """On the CPU device the run's pool counters and peak are the plan's."""
    g, _, budget = setup(size, fraction)
    ex = Executor(g, 32, device="cpu", planner=spec, budget=budget, cost=COST, seed=1,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9))
    # compressed copies (capuchin's: its cache's evictions, none planned since its count search)
    sim = ex.simulate(budget, trace=False, events=True)
    offloads = sum(e[0].startswith("offload") and e[1] in ex.decisions.compress
                   for e in sim["events"])
    assert sent_uncompressed(sim["events"], ex.decisions.compress) < offloads   # some encoded
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 3, size, size)).astype(np.float32)
    loss = ex.train_step(x, rng.integers(0, 10, 32))
    assert np.isfinite(loss)
    got = ex.pool.counters()
    assert got == {k: ex.planned[k] for k in got}
    assert got["offloads"] > 0 and ex.pool.high_water == ex.planned["peak_bytes"]
