"""The capuchin planner (planners/capuchin.py): it never returns a plan that does not fit where
one that fits exists, and its plans train bit-identically to liveness on the CPU device."""
from __future__ import annotations

import numpy as np

from neuron.executor import Executor
from neuron.memory.costmodel import CostModel, DeviceSpec
from neuron.models import build_model

from planner_training import make, train

#: the CPU device's measured model, fixed (cpu_spec() times a micro-benchmark each process):
#: copies on the compute thread at memory bandwidth, so every swap is cheaper than a recompute
CPU = CostModel(DeviceSpec("cpu", flops=5e9, mem_bandwidth=6e9, copy_bandwidth=6e9,
                           copy_latency=2e-6, launch_latency=20e-6, async_copies=False),
                dtype=np.float32)


def test_capuchin_counts_fit_where_held_blocks_fragmented_the_arena():
    """resnet_cifar 8 at 16x16, batch 4, in its ideal layer bound (844,800 B), with the CPU's
    costs (every count swaps): the planned offloads' held blocks left F3:relu 3 KB short
    (fragmentation) and no count fit. The pool now releases a held block before it evicts or
    fails (its copy is under way), so the counts fit, and the plan trains as liveness does."""
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    budget = 844_800
    ex = Executor(graph, 4, device="virtual", planner="capuchin", cost=CPU, budget=budget)
    info = ex.decisions.info
    assert any(t["fits"] for t in info["search"] if t["tensors"])
    assert ex.simulate(budget, trace=False)["fits"]
    assert "none_fit" not in info
    ref = train(make(graph, 4, policy="liveness"), graph, 4)
    run = make(graph, 4, device="cpu", planner="capuchin", cost=CPU, budget=budget)
    losses, state = train(run, graph, 4)
    assert losses == ref[0]
    assert all(ref[1][k].tobytes() == state[k].tobytes() for k in ref[1])


def test_capuchin_falls_back_to_the_cache_alone_where_no_count_fits(monkeypatch):
    """Where the count search finds nothing that fits, the tensor cache alone is tried and
    kept if it fits (not the fastest count that does not fit)."""
    from neuron.memory.planners import capuchin
    monkeypatch.setattr(capuchin, "search", lambda ctx, cands, *a: a[-3])  # finds nothing
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    budget = 844_800
    ex = Executor(graph, 4, device="virtual", planner="capuchin", cost=CPU, budget=budget)
    info = ex.decisions.info
    assert [t["tensors"] for t in info["search"]] == [0, 0]     # the two cache orders
    assert ex.simulate(budget, trace=False)["fits"]
    assert "none_fit" not in info
    assert not ex.decisions.offload_after


def test_capuchin_says_when_nothing_fits():
    """Below what the cache alone fits, the fastest non-fitting plan comes back, marked."""
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    ex = Executor(graph, 4, device="virtual", planner="capuchin", cost=CPU, budget=700_000)
    assert ex.decisions.info.get("none_fit")
    assert not any(t["fits"] for t in ex.decisions.info["search"])


def test_capuchin_count_search_tries_fewer_moves_than_the_excess():
    """resnet_cifar 8 at 32x32, batch 32, half way between its resident state and its liveness
    peak, H100 analytic clock: taking the tensors that cover the excess and more, capuchin was
    51% slower than the MILP optimum of the time; with fewer recomputes and the cache for the
    rest, 0.98x of it. That MILP did not allow a recompute from a swapped input; the one that
    does finds 0.436 ms, 19% under capuchin's 0.538 (which this rule does not search for). So
    the count search is checked against its own start: under every pricing, the fewest
    tensors covering the excess (the first count it simulates) are at least 25% slower than
    the count it keeps, and the plan returned is the fastest count it simulated."""
    from neuron.memory.planners import PlanContext, get_planner
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 32, 32), num_classes=10)
    ex = Executor(g, 32, device="virtual", policy="liveness")
    live = ex.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in ex.persistent)
    ctx = PlanContext(ex, int(resident + 0.5 * (live - resident)),
                      CostModel.analytic("h100", dtype=ex.dtype))
    d = get_planner("capuchin").plan(ctx)
    cap = ctx.evaluate(d)
    assert cap["fits"]
    tried = d.info["search"]
    assert cap["time_s"] == min(t["time_s"] for t in tried if t["fits"])
    firsts = [t for k, t in enumerate(tried)
              if k == 0 or t.get("costs") != tried[k - 1].get("costs")]
    assert len(firsts) >= 2
    for t in firsts:
        assert t["fits"] and cap["time_s"] <= 0.8 * t["time_s"], (t, cap["time_s"])
