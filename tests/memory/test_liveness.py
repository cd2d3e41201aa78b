"""Liveness (memory/liveness.py): every non-persistent tensor is freed exactly once, right after
its last use; kept and persistent tensors never; nothing when free_dead=False; O(N)."""
from __future__ import annotations

import time

import numpy as np
import pytest

import neuron as nn
from neuron.executor import with_loss
from neuron.memory.liveness import frees_for
from neuron.memory.recompute import plan_recompute
from neuron.memory.schedule import build_schedule
from neuron.models import build_model

STATE = ("momentum",)


def _schedule(graph, batch=4):
    return build_schedule(with_loss(graph), batch, np.float32, STATE)


@pytest.fixture(scope="module")
def resnet8():
    return _schedule(build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8)))


def _uses(step):
    """Every tensor a step touches (reads, writes and the optimizer state it updates)."""
    out = list(step.reads) + list(step.writes)
    for _, _, _, states in step.updates:
        out.extend(states)
    return out


def brute_force_last_use(steps):
    """O(N^2) reference: for each tensor, scan every step for the last one that uses it."""
    tensors = {}
    for s in steps:
        for t in _uses(s):
            tensors[t.id] = t
    last = {}
    for tid in tensors:
        idx = [i for i, s in enumerate(steps) if any(u.id == tid for u in _uses(s))]
        last[tid] = max(idx)
    return tensors, last


def _check_against_brute_force(steps, keep=()):
    frees = frees_for(steps, True, keep=keep)
    assert len(frees) == len(steps)
    tensors, last = brute_force_last_use(steps)
    keep_ids = {t.id for t in keep}
    freed_at = {}
    for i, dead in enumerate(frees):
        for t in dead:
            assert t.id not in freed_at, f"{t.name} freed twice (steps {freed_at[t.id]}, {i})"
            freed_at[t.id] = i
    expected = {tid for tid, t in tensors.items() if not t.persistent and tid not in keep_ids}
    assert set(freed_at) == expected
    for tid in expected:
        assert freed_at[tid] == last[tid], (tensors[tid].name, freed_at[tid], last[tid])
        # nothing uses it after it is freed
        assert all(all(u.id != tid for u in _uses(s)) for s in steps[freed_at[tid] + 1:])
    return frees, tensors


def test_frees_match_brute_force_on_resnet_train_schedule(resnet8):
    frees, tensors = _check_against_brute_force(resnet8.steps)
    # the schedule is not trivial: activations, gradients and parameter gradients all die
    kinds = {t.kind.value for dead in frees for t in dead}
    assert {"activation", "gradient", "param_grad", "aux", "data"} <= kinds
    assert sum(len(d) for d in frees) > 50


def test_frees_match_brute_force_on_recompute_schedule():
    """The same contract holds on the rewritten (R-step) schedule of every strategy."""
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    for strategy in ("speed", "memory", "cost"):
        # plan_recompute registers the recomputed versions in the schedule's registry: one
        # fresh schedule per strategy
        steps, report = plan_recompute(_schedule(g), strategy)
        assert any(s.phase == "R" for s in steps)
        _check_against_brute_force(steps)


def test_frees_on_a_densenet_with_concats():
    from neuron.models.densenet import densenet
    g = densenet(block_config=(2, 2), growth_rate=4, num_init_features=8, in_shape=(3, 8, 8),
                 num_classes=10, stem="cifar")
    _check_against_brute_force(_schedule(g, 2).steps)


def test_keep_tensors_are_never_freed(resnet8):
    fwd = resnet8.forward_steps()
    logits = resnet8.act[id(resnet8.graph.layers["fc"].outputs[0])]
    without = [t.id for dead in frees_for(fwd) for t in dead]
    assert logits.id in without                 # without keep= it dies after the loss
    frees, _ = _check_against_brute_force(fwd, keep=[logits])
    assert logits.id not in {t.id for dead in frees for t in dead}
    # keeping several
    keep = [logits, resnet8.act[id(resnet8.graph.inputs[0])]]
    frees = frees_for(fwd, keep=keep)
    freed = {t.id for dead in frees for t in dead}
    assert not freed & {t.id for t in keep}


def test_free_dead_false_frees_nothing(resnet8):
    frees = frees_for(resnet8.steps, free_dead=False)
    assert len(frees) == len(resnet8.steps)
    assert all(d == [] for d in frees)
    assert all(d == [] for d in frees_for(resnet8.steps, False, keep=resnet8.persistent()))


def test_persistent_never_freed(resnet8):
    persistent = {t.id for t in resnet8.persistent()}
    assert persistent                             # weights, BN statistics, momentum
    used = {t.id for s in resnet8.steps for t in _uses(s)}
    assert persistent <= used
    freed = {t.id for dead in frees_for(resnet8.steps) for t in dead}
    assert not freed & persistent


def test_each_step_frees_only_what_it_used(resnet8):
    for s, dead in zip(resnet8.steps, frees_for(resnet8.steps)):
        used = {t.id for t in _uses(s)}
        assert {t.id for t in dead} <= used, s.name


def test_empty_schedule():
    assert frees_for([]) == []
    assert frees_for([], free_dead=False) == []


def test_linear_time_on_a_10000_layer_chain():
    x = nn.Input((4,), name="data")
    h = nn.Linear(4, name="fc0")(x)
    for i in range(10_000):
        h = nn.ReLU(name=f"r{i}")(h)
    g = nn.Graph(x, nn.Linear(3, name="fc1")(h))
    sched = _schedule(g, 2)
    assert len(sched.steps) > 20_000
    t0 = time.process_time()     # this process's CPU time: other jobs on the cores do not count
    frees = frees_for(sched.steps)
    elapsed = time.process_time() - t0
    assert elapsed < 2.0, f"frees_for took {elapsed:.2f}s on {len(sched.steps)} steps"
    # spot-check: each ReLU output dies at its last backward use (ReLU backward reads the output)
    step_of = {}
    for i, dead in enumerate(frees):
        for t in dead:
            assert t.id not in step_of
            step_of[t.id] = i
    r5 = sched.act[id(g.layers["r5"].outputs[0])]
    b_r5 = next(i for i, s in enumerate(sched.steps) if s.phase == "B" and s.layer.name == "r5")
    b_r6 = next(i for i, s in enumerate(sched.steps) if s.phase == "B" and s.layer.name == "r6")
    assert b_r6 < b_r5
    assert step_of[r5.id] == b_r5
