"""When planned copies happen (planners/swap.py): the copy stream as a plan expects it
(``copy_walk``), and the release of a planned offload's block once its copy is done by the
clock (``release_points``), which the simulated clock then confirms."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from neuron.executor import Executor
from neuron.memory.clock import makespan
from neuron.memory.costmodel import CostModel, DeviceSpec
from neuron.memory.planners import PlanContext
from neuron.memory.planners.choice import build
from neuron.memory.planners.costs import tensor_costs
from neuron.memory.planners.rewrite import droppable
from neuron.memory.planners.swap import copy_walk, release_points
from neuron.models import build_model

H100 = CostModel.analytic("h100")


def test_copy_walk_queues_copies_in_issue_order():
    cum = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]       # eight steps of 1 s
    # a: out after step 0 (1 s -> 2.5 s), back after step 5; b: out after step 0 too, queued
    # behind a (2.5 -> 4.0 s), back after step 6
    walk = copy_walk(cum, [("a", 0, 5, 7, 1.5, 0.5, 0.0), ("b", 0, 6, 8, 1.5, 1.5, 0.0)])
    assert walk["a"] == (2, 0.0)        # released after step 2 (ends at 3.0 >= 2.5)
    # after step 3 (ends at 4.0 >= 4.0); a's copy back 6.0 -> 6.5, before step 7 (7.0); b's
    # 7.0 -> 8.5: 0.5 s past the start of step 8, which reads it
    assert walk["b"] == (3, 0.5)
    # read at step 7 instead: compute waits 1.5 s there (7.0 -> 8.5)
    walk = copy_walk(cum, [("a", 0, 5, 7, 1.5, 0.5, 0.0), ("b", 0, 6, 7, 1.5, 1.5, 0.0)])
    assert walk["b"] == (3, pytest.approx(1.5))


def test_copy_walk_delays_compute_by_each_wait():
    """A wait at one copy delays every later step: a copy back that would have been late
    by the first wait's length is then on time."""
    cum = [float(k) for k in range(12)]
    # a: out 1 -> 4 s, released after step 1 (its prefetch): waits 2 s (compute now 2 s late)
    # b: out after step 2 at 5 s (3 + 2) -> 6, back after step 7 at 10 -> 11, read at step 9:
    # 9 + 2 = 11 s, no wait
    walk = copy_walk(cum, [("a", 0, 1, 4, 3.0, 0.5, 0.0), ("b", 2, 7, 9, 1.0, 1.0, 0.0)])
    assert walk["a"] == (1, 2.0)
    assert walk["b"][1] == 0.0


def test_copy_walk_never_holds_a_block_past_its_prefetch():
    cum = [float(k) for k in range(9)]
    held, wait = copy_walk(cum, [("a", 0, 2, 5, 4.0, 1.0, 0.0)])["a"]
    assert held == 2                    # its copy (1 -> 5 s) outlasts step 2: released there
    # 2 s at the release (3 -> 5 s); its copy back 5 -> 6 s, before step 5 (now at 7 s)
    assert wait == 2.0


def small():
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 32, 32), num_classes=10)
    ex = Executor(g, 32, device="virtual", policy="liveness")
    return ex


def test_a_device_without_a_copy_stream_releases_after_the_next_step():
    ex = small()
    cpu = CostModel(DeviceSpec("cpu", flops=5e9, mem_bandwidth=6e9, copy_bandwidth=6e9,
                               copy_latency=2e-6, launch_latency=20e-6, async_copies=False),
                    dtype=np.float32)
    ctx = PlanContext(ex, None, cpu)
    cands = droppable(ex.schedule)
    d = build(ctx, cands, {t.id: "swap" for t in cands})
    assert d.offload_after and d.release_after == {}


def test_one_swap_waits_as_the_clock_simulates_it_and_holding_hides_its_copy():
    """Each swap alone: the seconds copy_walk says compute waits for equal the clock's exposed
    copy time of the plan that swaps it, and releasing its block after the next step instead
    (as the executor did before) waits at least as long."""
    ex = small()
    ctx = PlanContext(ex, None, H100)
    costs = tensor_costs(ctx, droppable(ex.schedule))
    held_longer = 0
    for c in costs[::3]:
        d = build(ctx, [c.tensor], {c.tensor.id: "swap"})
        r = ctx.simulate(d, None, events=True)
        rep = makespan(r["events"], d.steps, ctx.batch, H100)
        assert rep.exposed_copy_s == pytest.approx(c.exposed_s, abs=1e-12)
        assert d.release_after.get(c.tensor.id, c.last_fwd + 1) == c.held_after
        if c.held_after > c.last_fwd + 1:
            held_longer += 1
            before = dataclasses.replace(d, release_after={})
            r0 = ctx.simulate(before, None, events=True)
            rep0 = makespan(r0["events"], d.steps, ctx.batch, H100)
            assert rep0.exposed_copy_s > rep.exposed_copy_s
    assert held_longer > 0


def test_release_points_queue_every_planned_swap():
    ex = small()
    ctx = PlanContext(ex, None, H100)
    cands = droppable(ex.schedule)
    d = build(ctx, cands, {t.id: "swap" for t in cands})
    alone = {c.tensor.id: c.held_after for c in tensor_costs(ctx, cands)}
    prefetch_at = {t.id: p for p, ts in d.prefetch_after.items() for t in ts}
    offload_at = {t.id: f for f, ts in d.offload_after.items() for t in ts}
    assert d.release_after == release_points(d.steps, d.offload_after, d.prefetch_after, ctx)
    for tid, k in d.release_after.items():
        assert offload_at[tid] + 1 < k <= prefetch_at[tid]
        assert k >= alone[tid]          # queued behind the others: never released earlier
    assert any(k > alone[tid] for tid, k in d.release_after.items())
