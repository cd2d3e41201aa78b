"""The MILP's model against the runtime it plans for (planners/checkmate.py,
checkmate_stream.py): the bytes of a plan that fits are within the budget in its memory
rows, and its copy stream prices one swap no dearer than the plan's clock does."""
from __future__ import annotations

import pytest

from neuron.executor import Executor
from neuron.memory.costmodel import CostModel
from neuron.memory.planners import PlanContext, get_planner
from neuron.memory.planners.base import RECOMPUTE, SWAP
from neuron.memory.planners.checkmate import Model
from neuron.memory.planners.costs import tensor_costs
from neuron.memory.planners.estimate import needed_workspace
from neuron.memory.planners.rewrite import droppable
from neuron.models import build_model

pytest.importorskip("scipy.optimize", reason="the MILP needs scipy")


def _ctx(depth, fraction, size=32, batch=32):
    g = build_model("resnet_cifar", depth=depth, in_shape=(3, size, size), num_classes=10)
    ex = Executor(g, batch, device="virtual", policy="liveness")
    live = ex.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in ex.persistent)
    return PlanContext(ex, int(resident + fraction * (live - resident)),
                       CostModel.analytic("h100", dtype=ex.dtype))


def _superneurons_in_the_model():
    """Superneurons' plan of resnet_cifar 20 at 0.5x its liveness peak, which fits without
    the tensor cache, and the MILP's model of that graph: (ctx, costs, model, the plan's
    choice by tensor id)."""
    ctx = _ctx(20, 0.5)
    d = get_planner("superneurons").plan(ctx)
    assert ctx.evaluate(d, static=True)["fits"]
    costs = tensor_costs(ctx, droppable(ctx.schedule))
    return ctx, costs, Model(ctx, costs), {c.tensor.id: d.tensors[c.tensor.name] for c in costs}


def test_a_step_that_runs_on_no_workspace_needs_none():
    ctx = _ctx(8, 1.0)
    convs = [s for s in ctx.schedule.steps if s.workspace_bytes and s.layer.workspace_shrinks()]
    assert convs and all(needed_workspace(s) == 0 for s in convs)
    others = [s for s in ctx.schedule.steps if not s.layer.workspace_shrinks()]
    assert all(needed_workspace(s) == s.workspace_bytes for s in others)


def test_the_milp_memory_rows_hold_for_a_plan_that_fits_on_its_own():
    """Superneurons' plan of resnet_cifar 20 at 0.5x its liveness peak runs without the
    tensor cache. Counted with every convolution's preferred workspace, the MILP's memory rows
    put it over the budget at three steps (1.25 MiB at a backward convolution), though the
    executor gives a convolution no workspace when its preferred one does not fit. The rows
    are checked before a recompute chain's early versions and the swapped inputs brought back
    early for a recompute are added back: the bytes the model starts from (the whole model:
    the test below)."""
    ctx, costs, model, choice = _superneurons_in_the_model()
    assert SWAP in choice.values() and RECOMPUTE in choice.values()
    for k in range(model.nsteps):
        need = model.mem[k]
        for i, c in enumerate(costs):
            if choice[c.tensor.id] == RECOMPUTE and c.last_fwd < k < c.first_bwd:
                need -= c.tensor.nbytes - sum(b for b, a, z in model.held[i] if a < k < z)
            if choice[c.tensor.id] == SWAP and model.off_after[i] < k <= c.prefetch_after:
                need -= c.tensor.nbytes
        assert need <= ctx.budget, (k, need - ctx.budget)


def test_a_plan_that_recomputes_from_swapped_inputs_and_fits_is_feasible_in_the_model():
    """Superneurons' plan of resnet_cifar 20 at 0.5x its liveness peak fits without the
    tensor cache and recomputes tensors from swapped inputs (their prefetch serves the
    recompute, so the input is back early). With its choices fixed, the whole program, early
    versions and early returns included, is feasible at the budget: the model admits the
    runtime's plan (it forbade recompute-from-swap, r_i + s_u <= 1, until this case was
    modelled). Its objective is the choices' costs plus the early returns' added waits."""
    ctx, costs, model, choice = _superneurons_in_the_model()
    n = model.n
    fixed = {}
    for i, c in enumerate(costs):
        fixed[i] = float(choice[c.tensor.id] == RECOMPUTE)
        fixed[n + i] = float(choice[c.tensor.id] == SWAP)
    both = [(u, i, added) for u, i, p, added in model.back_early if fixed[i] and fixed[n + u]]
    assert len(both) >= 2 and all(added >= 0 for *_, added in both)
    x, attempt = model.solve(ctx.budget, False, 20.0, fixed)
    assert x is not None, attempt
    want = sum(model.c_obj[col] for col, v in fixed.items() if v) + sum(a for *_, a in both)
    assert attempt["objective_s"] == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert attempt["back_early_columns"] > 0


def test_the_copy_stream_prices_one_swap_no_dearer_than_the_clock():
    """Alone, each swap's waits in the flow model are at most copy_walk's (the stream is
    modelled preemptive, so optimistic), and equal where its copies do not meet."""
    ctx = _ctx(8, 0.5)
    costs = tensor_costs(ctx, droppable(ctx.schedule))
    model = Model(ctx, costs, stream=True)
    n, equal = model.n, 0
    for i, c in enumerate(costs[:12]):
        fixed = {j: 0.0 for j in range(2 * n)}
        fixed[n + i] = 1.0
        x, attempt = model.solve(float("inf"), False, 20.0, fixed)
        assert x is not None, attempt
        waits = attempt["objective_s"] - 1e-3 * c.swap_s
        assert waits <= c.exposed_s + 1e-9, (i, waits, c.exposed_s)
        equal += abs(waits - c.exposed_s) < 1e-9
    assert equal >= 6


def test_the_polished_milp_plan_is_never_slower_than_the_milp_plan():
    """``checkmate:polish=1``: the MILP's plan refined on the simulator's clock (polish.py),
    the best known reference; where the model's optimum is not the simulator's it is
    faster, and it never is slower."""
    ctx = _ctx(8, 0.3, size=16, batch=8)
    plain = ctx.evaluate(get_planner("checkmate").plan(ctx))["time_s"]
    p = get_planner("checkmate:polish=1")
    assert p.name == "checkmate+polish"
    d = p.plan(ctx)
    log = d.info["polish"]
    assert log["milp_time_s"] == plain
    assert ctx.evaluate(d)["time_s"] == min(plain, log["time_s"]) <= plain
    with pytest.raises(ValueError, match="polish must be 0 or 1"):
        get_planner("checkmate:polish=2")


def test_the_solver_output_is_held_and_shown_only_when_the_solve_raises(capfd):
    import os
    from neuron.memory.planners.checkmate import solver_output_held
    with solver_output_held():
        os.write(1, b"solver chatter\n")
        os.write(2, b"more chatter\n")
    out, err = capfd.readouterr()
    assert "chatter" not in out + err
    with pytest.raises(RuntimeError, match="solve failed"):
        with solver_output_held():
            os.write(2, b"why it failed\n")
            raise RuntimeError("solve failed")
    out, err = capfd.readouterr()
    assert "why it failed" in err
    os.write(1, b"after\n")                 # the descriptors are back
    assert capfd.readouterr().out == "after\n"
