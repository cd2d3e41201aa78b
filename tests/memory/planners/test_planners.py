"""Every planner behind the one interface: its plan runs on the CPU device and trains
bit-identically to liveness; bad names and budgets are clear errors (issue 12)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from neuron.errors import MemoryBudgetError
from neuron.executor import Executor
from neuron.memory.costmodel import CostModel
from neuron.memory.planners import PlanContext, get_planner, planner_names
from neuron.memory.policy import get_policy
from neuron.memory.planners.checkmate import MAX_STEPS
from neuron.memory.planners.sublinear import split_points
from neuron.memory.planners.swap import uses
from neuron.models import build_model
from neuron.models.densenet import densenet

PLANNERS = planner_names()
from planner_training import make, train  # noqa: E402


def resnet20():
    return build_model("resnet_cifar", depth=20, in_shape=(3, 8, 8)), 4


def small_densenet():
    return densenet(block_config=(2, 2), growth_rate=4, num_init_features=8,
                    in_shape=(3, 16, 16), num_classes=10, stem="cifar"), 4


MODELS = {"resnet20": resnet20, "densenet": small_densenet}
_cache: dict = {}


def model(name):
    if name not in _cache:
        _cache[name] = MODELS[name]()
    return _cache[name]




_ref: dict = {}


def reference(name):
    if name not in _ref:
        graph, batch = model(name)
        ex = make(graph, batch, policy="liveness")
        _ref[name] = (train(ex, graph, batch), ex.planned["peak_bytes"])
    return _ref[name]


def budget_for(name, planner):
    """0.8 of the liveness peak where the planner's plan fits it, else no budget."""
    graph, batch = model(name)
    _, peak = reference(name)
    b = int(peak * 0.8)
    v = Executor(graph, batch, device="virtual", planner=planner, budget=b)
    return b if v.simulate(b, trace=False)["fits"] else None


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("planner", PLANNERS)
def test_every_planner_trains_bit_identically_to_liveness(name, planner):
    (ref_losses, ref_state), _ = reference(name)
    graph, batch = model(name)
    budget = budget_for(name, planner)
    ex = make(graph, batch, device="cpu", planner=planner, budget=budget)
    losses, state = train(ex, graph, batch)
    assert losses == ref_losses
    differ = [k for k in ref_state if ref_state[k].tobytes() != state[k].tobytes()]
    assert not differ, f"{planner}: {len(differ)} tensors differ, e.g. {differ[:3]}"
    # the plan did something: it moved or recomputed bytes, as it decided
    counts = ex.decisions.counts()
    # (unless keeping everything fits the budget: workspaces shrink to none where they do
    # not fit, so a budget below the liveness peak may need no move at all)
    keep_all_fits = budget is not None and Executor(
        graph, batch, device="virtual", policy="liveness").simulate(budget)["fits"]
    if (planner not in ("capuchin", "checkmate", "dqn") or budget is not None) \
            and not keep_all_fits:          # these three keep everything without a budget
        assert counts["swap"] + counts["recompute"] > 0, counts
    assert ex.pool.high_water == ex.planned["peak_bytes"]


def test_unknown_planner_lists_the_names():
    graph, batch = model("resnet20")
    with pytest.raises(ValueError, match="choose one of superneurons, sublinear"):
        Executor(graph, batch, device="virtual", planner="nope")


@pytest.mark.parametrize("spec,fragment", [
    ("home:seed=abc", "planner 'home': option seed must be an integer, got 'abc'"),
    ("home:search_seconds=nan", "planner 'home': option search_seconds must be a finite number"),
    ("home:search_seconds=fast", "option search_seconds must be a finite number, got 'fast'"),
    ("superneurons:polish=x", "planner 'superneurons': option polish must be an integer"),
    ("dqn:seed=1.5", "planner 'dqn': option seed must be an integer, got 1.5"),
    ("home:sed=1", "planner 'home': unknown option 'sed'; it takes seed, search_seconds"),
    ("vdnn:k=2", "planner 'vdnn': unknown option 'k'; it takes no options"),
])
def test_a_planner_option_of_the_wrong_type_or_name_is_named(spec, fragment):
    with pytest.raises(ValueError) as e:
        get_planner(spec)
    assert fragment in str(e.value)


def test_a_planner_option_of_the_wrong_type_is_one_cli_line(capsys):
    from neuron.cli.main import main
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--budget", "4MiB", "--no-min-budget",
               "--planner", "home:seed=abc"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == ("neuron plan: error: planner 'home': option seed must be "
                                       "an integer, got 'abc'")


@pytest.mark.parametrize("planner", ["sublinear", "vdnn", "capuchin"])
def test_budget_below_the_planners_minimum_names_step_tensor_and_bytes(planner):
    from neuron.plan import lower_bound
    graph, batch = model("resnet20")
    # the ideal bound: below it nothing fits (neuron's own bound counts workspaces that shrink)
    lb, _ = lower_bound(Executor(graph, batch, device="virtual", policy="liveness"), ideal=True)
    with pytest.raises(MemoryBudgetError, match=r"step [FBR]\d+:.*cannot allocate .* bytes"):
        make(graph, batch, device="cpu", planner=planner, budget=lb - 4096)


@pytest.mark.parametrize("planner", PLANNERS)
def test_parameters_that_cannot_fit_fail_before_the_search(planner, monkeypatch):
    """The setup's error, naming the parameter block, before any planner runs (checkmate spent
    22 s solving ResNet-50's MILP before finding that its parameters alone exceed 100 MiB)."""
    from neuron.memory.planners import base
    graph, batch = model("resnet20")
    resident = sum(b.nbytes for b in
                   Executor(graph, batch, device="virtual", policy="liveness").persistent)
    monkeypatch.setattr(base.PlanContext, "__init__", lambda *a, **k: pytest.fail("searched"))
    with pytest.raises(MemoryBudgetError, match=r"parameters and optimizer state do not fit: "
                       r"setup: cannot allocate params:\S+ \(param"):
        Executor(graph, batch, device="virtual", planner=planner, budget=resident // 2)


def test_vdnn_prefetches_one_layer_ahead_and_time_based_prefetch_looks_further():
    graph, batch = model("resnet20")
    cost = CostModel.analytic("h100")
    ex = Executor(graph, batch, device="virtual", planner="vdnn", cost=cost)
    last_fwd, first_bwd = uses(ex.steps)
    pos = {t.id: p for p, ts in ex.decisions.prefetch_after.items() for t in ts}
    assert pos and all(pos[i] == max(last_fwd[i] + 1, first_bwd[i] - 2) for i in pos)
    # a slow link: the time-based schedule starts copies several steps before their use
    slow = CostModel(cost.spec, dtype=np.float32)
    slow.copy_bandwidth = 1e6
    b = int(reference("resnet20")[1] * 0.8)
    ex = Executor(graph, batch, device="virtual", planner="capuchin", cost=slow, budget=b)
    _, first_bwd = uses(ex.steps)
    ahead = [first_bwd[t.id] - p for p, ts in ex.decisions.prefetch_after.items() for t in ts]
    assert not ahead or max(ahead) > 2


def test_sublinear_sqrt_keeps_about_sqrt_n_checkpoints_and_lowers_the_peak():
    graph = build_model("resnet_cifar", depth=56, in_shape=(3, 8, 8))
    ex = Executor(graph, 4, device="virtual", planner="sublinear-sqrt")
    c = ex.decisions.counts()
    n = c["keep"] + c["recompute"]
    assert 0.5 * n ** 0.5 <= c["keep"] <= 2 * n ** 0.5
    live = Executor(graph, 4, device="virtual", policy="liveness").simulate(None)
    assert ex.simulate(None)["peak_bytes"] < live["peak_bytes"]
    assert split_points(ex.schedule)


def test_checkmate_reports_solver_status_and_gap_and_refuses_large_graphs():
    graph, batch = model("resnet20")
    b = int(reference("resnet20")[1] * 0.9)
    ex = Executor(graph, batch, device="virtual", planner="checkmate", budget=b)
    info = ex.decisions.info
    assert info["attempts"] and "time_limit_s" in info
    assert any(a.get("fits") for a in info["attempts"])
    assert info["gap"] is not None and info["gap"] <= 1e-3
    deep = build_model("resnet_cifar", depth=6 * (MAX_STEPS // 30) + 2, in_shape=(3, 8, 8))
    with pytest.raises(ValueError, match="checkmate: .* steps"):
        Executor(deep, 2, device="virtual", planner="checkmate", budget=1 << 30)


def _small_resnet_ctx(fraction):
    # without gradient aliasing (memory/aliasing.py): with it, the backward's bytes differ and
    # at 0.7 and 0.6 the optimum priced alone queues three swaps back to back on the copy
    # stream, which that pricing leaves out (checkmate.py's docstring), fitting only at x0.8
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 32, 32), num_classes=10)
    ex = Executor(g, 32, device="virtual", policy="liveness", _alias_gradients=False)
    live = ex.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in ex.persistent)
    return PlanContext(ex, int(resident + fraction * (live - resident)),
                       CostModel.analytic("h100", dtype=ex.dtype))


@pytest.mark.parametrize("fraction", [0.9, 0.7, 0.6])
def test_checkmate_memory_model_holds_for_its_plans(fraction):
    """The MILP counts what the rewrite really holds (a chain's early versions, a swap's
    prefetch window, transient tensors re-run), so each of its programs' plans fits on its
    own, without the tensor cache, at the full budget or one tightening (x0.95: the pool's
    fragmentation is outside the model)."""
    ctx = _small_resnet_ctx(fraction)
    d = get_planner("checkmate").plan(ctx)
    programs: dict = {}
    for a in d.info["attempts"]:
        programs.setdefault(a.get("costs"), []).append(a)
    assert set(programs) == {None, "queued", "busy", "stream"}
    for name, attempts in programs.items():
        assert any(a["fits"] and a["margin"] >= 0.95 for a in attempts), (name, attempts)
    if fraction < 0.9:
        assert d.info["attempts"][0]["early_columns"] > 0
    assert ctx.evaluate(d, static=True)["fits"]


def test_checkmate_takes_the_cache_variable_where_no_plan_fits_alone():
    """At 0.3 of the peak even dropping everything leaves a backward step over the budget:
    the strict model is infeasible, so the MILP charges the bytes the cache must evict and
    its plan runs with the cache."""
    ctx = _small_resnet_ctx(0.3)
    d = get_planner("checkmate").plan(ctx)
    attempts = d.info["attempts"]
    assert attempts[0]["objective_s"] is None and attempts[0]["status"] == 2   # infeasible
    cache = [a for a in attempts if a["margin"] == "cache"]
    assert cache and all(a["evicted_mib"] > 0 for a in cache)
    assert all(a["fits_with_cache"] and not a["fits"] for a in cache)
    r = ctx.evaluate(d)                 # the fastest of the programs' plans
    assert r["fits"] and r["time_s"] == min(a["time_s"] for a in attempts if "time_s" in a)
    assert not any(a.get("fits") for a in attempts)     # so it is a cache plan


def test_planner_context_evaluates_time_and_peak():
    graph, batch = model("resnet20")
    ex = Executor(graph, batch, device="virtual", planner="superneurons")
    ctx = PlanContext(ex, None, CostModel.analytic("h200"))
    r = ctx.evaluate(ex.decisions, None)
    assert r["fits"] and r["time_s"] > 0 and r["peak_bytes"] == ex.simulate(None)["peak_bytes"]
    assert get_planner("vdnn-conv").conv_only


def _superneurons_at(fraction):
    graph, batch = model("resnet20")
    _, peak = reference("resnet20")
    ex = Executor(graph, batch, device="virtual", policy="liveness")
    return ex, PlanContext(ex, int(peak * fraction))


def test_superneurons_at_the_liveness_peak_recomputes_nothing_and_takes_liveness_time():
    ex, ctx = _superneurons_at(1.0)
    d = get_planner("superneurons").plan(ctx)
    assert d.info["variant"] == "liveness" and d.counts()["recompute"] == 0
    live = ctx.evaluate(dataclasses.replace(d, policy=get_policy("liveness")))
    assert ctx.evaluate(d)["time_s"] == live["time_s"]
    assert ctx.evaluate(d)["time_s"] < ctx.evaluate(get_planner("superneurons").paper(ctx)[0],
                                                   None)["time_s"]


@pytest.mark.parametrize("fraction", [1.0, 0.7, 0.5, 0.3])
def test_superneurons_variant_is_never_slower_than_the_paper_policy(fraction):
    from neuron.memory.planners.superneurons import plan_evictions
    ex, ctx = _superneurons_at(fraction)
    sn = get_planner("superneurons")
    d = sn.plan(ctx)
    paper, kept = sn.paper(ctx)
    paper_d, paper_s = plan_evictions(ctx, paper, kept)
    mine = ctx.evaluate(d)
    if paper_s < float("inf"):
        assert mine["fits"] and mine["time_s"] <= paper_s
    assert set(d.info["candidates"]) == {"liveness", "cache", "paper", "cost-greedy", "cost",
                                        "cost-swap", "polish"}


def test_superneurons_recompute_by_cost_takes_the_cheapest_per_byte_and_trains_identically():
    """The cost variant recomputes a prefix of the tensors ordered by recompute seconds per
    byte, fits the budget, reports the time the simulator gives, and trains bit-identically."""
    from neuron.memory.planners.costs import tensor_costs
    from neuron.memory.planners.rewrite import droppable
    from neuron.memory.planners.superneurons import SuperNeurons
    graph, batch = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16)), 8
    live = make(graph, batch, device="cpu", policy="liveness")
    ref_losses, ref_state = train(live, graph, batch)
    resident = sum(t.nbytes for t in live.persistent)
    budget = int(resident + 0.5 * (live.planned["peak_bytes"] - resident))
    slow = CostModel.analytic("h100")
    slow.copy_bandwidth = 1e8           # copies dear: the cache alone is not the fastest
    ctx = PlanContext(Executor(graph, batch, device="virtual", policy="liveness"), budget, slow)
    cands = droppable(ctx.schedule)
    d, t, entry = SuperNeurons().recompute_by_cost(ctx, cands)
    assert entry["fits"] and t == ctx.evaluate(d)["time_s"]
    price = {c.tensor.name: c.recompute_s / c.tensor.nbytes for c in tensor_costs(ctx, cands)}
    dropped = [n for n, c in d.tensors.items() if c == "recompute"]
    kept = [n for n, c in d.tensors.items() if c != "recompute" and n in price]
    assert len(dropped) == entry["recomputed"] >= 3 and kept
    assert max(price[n] for n in dropped) <= min(price[n] for n in kept)

    class CostOnly(SuperNeurons):
        def plan(self, ctx):
            return self.recompute_by_cost(ctx, droppable(ctx.schedule))[0]

    run = make(graph, batch, device="cpu", planner=CostOnly(), budget=budget, cost=slow)
    losses, state = train(run, graph, batch)
    assert losses == ref_losses
    assert all(ref_state[k].tobytes() == state[k].tobytes() for k in ref_state)
    assert run.decisions.counts()["recompute"] == len(dropped)
    assert run.pool.high_water <= budget


@pytest.mark.parametrize("fraction", [0.7, 0.5])
def test_superneurons_is_within_10_percent_of_the_milp_optimum_on_a_small_resnet(fraction):
    """Issue 12's target on a graph small enough for a unit test (bench/planners.py has the
    benchmark's graphs): the H100 analytic clock, batch 32 at 32x32."""
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 32, 32), num_classes=10)
    ex = Executor(g, 32, device="virtual", policy="liveness")
    live = ex.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in ex.persistent)
    ctx = PlanContext(ex, int(resident + fraction * (live - resident)),
                      CostModel.analytic("h100", dtype=ex.dtype))
    sn = ctx.evaluate(get_planner("superneurons").plan(ctx))
    opt = ctx.evaluate(get_planner("checkmate").plan(ctx))
    assert sn["fits"] and opt["fits"]
    assert sn["time_s"] <= 1.10 * opt["time_s"]


def test_the_executor_reuses_the_planners_simulation_of_its_answer():
    """A planner has usually simulated the decisions it returns: the executor's simulate()
    gives that result, and it is the one a fresh simulation gives."""
    from neuron.executor import Executor
    from neuron.models import build_model
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    live = Executor(g, 4, device="virtual", policy="liveness")
    peak = live.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in live.persistent)
    b = int(resident + 0.6 * (peak - resident))
    ex = Executor(g, 4, device="virtual", planner="superneurons", budget=b)
    assert ex._planned_sim is not None
    reused = ex.simulate(b, trace=False, events=True)
    fresh = ex._simulate(b, trace=False, events=True)
    assert reused["fits"] and fresh["fits"]
    assert reused["peak_bytes"] == fresh["peak_bytes"]
    assert reused["events"] == fresh["events"]
    # another arena, or a per-step trace, is simulated anew
    assert ex.simulate(b, trace=True)["trace"]


def test_run_bounded_keeps_every_run_of_dropped_tensors_under_the_limit():
    """Cheapest first; a tensor whose drop would join runs (linked by recompute chains) past the
    limit is skipped, and a later one that fits is still taken."""
    from types import SimpleNamespace as NS
    from neuron.memory.planners.superneurons import run_bounded

    def cost(i, nbytes, inputs=()):
        return NS(tensor=NS(id=i, nbytes=nbytes), inputs=tuple(inputs))
    # a chain 1 <- 2 <- 3 <- 4 (each reads the one before), and 5 on its own
    order = [cost(2, 40, [1]), cost(3, 40, [2]), cost(1, 40, [0]), cost(5, 70, [9]),
             cost(4, 10, [3])]
    taken = [c.tensor.id for c in run_bounded(order, 100)]
    # 1 would make the run 2-3 hold 120 bytes: skipped; 4 makes it 90: taken after 5
    assert taken == [2, 3, 5, 4]
    assert [c.tensor.id for c in run_bounded(order, 10 ** 9)] == [2, 3, 1, 5, 4]
    assert [c.tensor.id for c in run_bounded(order, 39)] == [4]
