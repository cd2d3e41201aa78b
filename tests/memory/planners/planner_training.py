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
