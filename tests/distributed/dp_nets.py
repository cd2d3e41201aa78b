"""Small networks and a fixed stream of global batches shared by the data-parallel tests and
their MPI worker (so both sides train exactly the same thing)."""
import numpy as np

import neuron as nn
from neuron.executor import Executor
from neuron.optim import SGD

STEPS = 3


def net(bn: bool) -> nn.Graph:
    x = nn.Input((2, 6, 6), name="data")
    h = nn.Conv2d(4, 3, padding=1, name="c1")(x)
    if bn:
        h = nn.BatchNorm(name="bn1")(h)
    h = nn.Tanh(name="t1")(h)
    h = nn.Conv2d(4, 3, padding=1, name="c2")(h)
    if bn:
        h = nn.BatchNorm(name="bn2")(h)
    h = nn.ReLU(name="r2")(h)
    h = nn.Linear(6, name="fc1")(h)
    if bn:
        h = nn.BatchNorm(name="bn3")(h)
    y = nn.Linear(3, name="fc2")(nn.Sigmoid(name="s")(h))
    return nn.Graph(x, y, name="dp_net_bn" if bn else "dp_net")


def make_executor(batch: int, bn: bool, device="cpu", **kw) -> Executor:
    return Executor(net(bn), batch, device=device, seed=3,
                    optimizer=SGD(lr=0.2, momentum=0.9, weight_decay=1e-3), **kw)


def global_batches(global_batch: int, steps: int = STEPS):
    rng = np.random.default_rng(11)
    for _ in range(steps):
        yield (rng.standard_normal((global_batch, 2, 6, 6)).astype(np.float32),
               rng.integers(0, 3, global_batch))
