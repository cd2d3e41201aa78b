"""Two training steps of an executor, the way every planner test compares a plan with liveness."""
from __future__ import annotations

import numpy as np

import neuron as nn
from neuron.executor import Executor

STEPS = 2


def make(graph, batch, **kw):
    return Executor(graph, batch, optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
                    seed=3, **kw)


def train(ex, graph, batch):
    losses = []
    for i in range(STEPS):
        rng = np.random.default_rng(1000 + i)
        x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
        losses.append(ex.train_step(x, rng.integers(0, graph.outputs[0].shape[0], batch)))
    return losses, ex.state_dict()


def resnet8_budget(fraction: float, size: int = 16, batch: int = 8):
    """resnet_cifar 8 at size x size (16: small enough to train on the CPU), and a budget of
    the resident state plus ``fraction`` of the rest of its liveness peak. -> (graph, batch,
    budget)."""
    from neuron.models import build_model
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, size, size))
    live = Executor(graph, batch, device="virtual", policy="liveness")
    peak = live.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in live.persistent)
    return graph, batch, int(resident + fraction * (peak - resident))


def assert_trains_like_liveness(run, graph, batch, budget):
    """``run`` (an executor with a plan) trains bit-identically to liveness within its
    budget."""
    ref_losses, ref_state = train(make(graph, batch, device="cpu", policy="liveness"), graph,
                                  batch)
    losses, state = train(run, graph, batch)
    assert losses == ref_losses
    differ = [k for k in ref_state if ref_state[k].tobytes() != state[k].tobytes()]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}"
    assert run.pool.high_water <= budget
