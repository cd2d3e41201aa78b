"""The shared recompute rewrite: a recompute re-runs the transient tensors on its way (those no
backward step reads) instead of holding their forward copies, and costs price that chain."""
from __future__ import annotations

import numpy as np

import neuron as nn
from neuron.executor import Executor
from neuron.memory.planners import PlanContext
from neuron.memory.planners.base import PLANNED, Decisions, Planner
from neuron.memory.planners.costs import tensor_costs
from neuron.memory.planners.rewrite import (backward_read, chains, droppable,
                                            recompute_rewrite, transient)
from neuron.models import build_model


def _setup():
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    ex = Executor(graph, 4, device="virtual", policy="liveness")
    return graph, ex


def _relu_after_bn(schedule):
    """A ReLU output whose producer reads a BN output: the case the rewrite must chain."""
    act = schedule.act
    for layer in schedule.graph.route:
        if layer.kind == "act" and layer.inputs[0].producer.kind == "bn":
            return act[id(layer.outputs[0])], act[id(layer.inputs[0])], layer.inputs[0].producer
    raise AssertionError("no BN -> ReLU pair in the model")


def test_transient_tensors_are_the_recomputable_ones_backward_never_reads():
    _, ex = _setup()
    s = ex.schedule
    trans, read = transient(s), backward_read(s)
    assert trans and not trans & read
    assert not trans & {t.id for t in droppable(s)}
    relu_out, bn_out, _ = _relu_after_bn(s)
    assert bn_out.id in trans and relu_out.id in read


def test_dropping_a_relu_output_recomputes_its_bn_instead_of_holding_it():
    _, ex = _setup()
    s = ex.schedule
    relu_out, bn_out, bn = _relu_after_bn(s)
    steps, report = recompute_rewrite(s, {relu_out.id})
    # the forward BN output is read in forward only: nothing keeps it for the recompute
    readers = [st for st in steps if bn_out.id in {t.id for t in st.reads}]
    assert readers and all(st.phase == "F" for st in readers)
    # the chain re-runs BN from the conv output, then the ReLU from that fresh version
    r_steps = [st for st in steps if st.phase == "R"]
    assert [st.layer for st in r_steps] == [bn, relu_out_layer(s, relu_out)]
    assert r_steps[1].ins[0] is r_steps[0].outs[0]
    assert report.extra_forward_steps == 2
    # and the chain's layers and the held tensor it starts from, as costs see them
    reruns, frontier = chains(s, [relu_out])[relu_out.id]
    assert [st.layer for st in reruns] == [bn, relu_out_layer(s, relu_out)]
    assert all(st.phase == "F" for st in reruns)
    assert frontier == (s.act[id(bn.inputs[0])].id,)


def relu_out_layer(schedule, t):
    return next(l for l in schedule.graph.route if schedule.act[id(l.outputs[0])] is t)


def test_recompute_seconds_price_the_whole_chain():
    _, ex = _setup()
    ctx = PlanContext(ex, None)
    relu_out, _, bn = _relu_after_bn(ctx.schedule)
    fwd = {s.layer: ctx.step_time(s) for s in ctx.schedule.steps if s.phase == "F"}
    cost = next(c for c in tensor_costs(ctx, droppable(ctx.schedule)) if c.tensor is relu_out)
    relu = relu_out_layer(ctx.schedule, relu_out)
    assert cost.recompute_s == fwd[bn] + fwd[relu] > fwd[relu]
    assert cost.inputs == (ctx.schedule.act[id(bn.inputs[0])].id,)


def test_dropping_every_relu_output_lowers_the_peak_and_trains_identically():
    graph, ex = _setup()
    s = ex.schedule
    relus = {s.act[id(l.outputs[0])].id for l in s.graph.route if l.kind == "act"}
    peak = ex.simulate(None, trace=False)["peak_bytes"]

    class Relus(Planner):
        name = "relus"

        def plan(self, ctx):
            steps, report = recompute_rewrite(ctx.schedule, relus)
            return Decisions(steps, policy=PLANNED, recompute_report=report)

    planned = Executor(graph, 4, device="virtual", planner=Relus())
    assert planned.simulate(None, trace=False)["peak_bytes"] < peak
    states = []
    for kw in ({"policy": "liveness"}, {"planner": Relus()}):
        run = Executor(graph, 4, optimizer=nn.SGD(lr=0.05, momentum=0.9), seed=3, **kw)
        for i in range(2):
            rng = np.random.default_rng(10 + i)
            run.train_step(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                           rng.integers(0, 10, 4))
        states.append(run.state_dict())
    for k, v in states[0].items():
        np.testing.assert_array_equal(v, states[1][k], err_msg=k)
