"""Shared by the GPU tests that compare a few training steps on CudaDevice with the CPU
reference from the same weights and data (test_cuda_mixed.py, test_cuda_layout.py)."""
from __future__ import annotations

import numpy as np

BATCH = 8


def run_steps(device, precision="fp32", replay="off", steps=1, layout="nchw",
              model="resnet_cifar", depth=8):
    """(losses, state before, state after, executor) of ``steps`` SGD steps on 16x16 images."""
    import neuron as nn
    from neuron.executor import Executor
    from neuron.models import build_model
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32),
             rng.integers(0, 10, BATCH)) for _ in range(steps)]
    ex = Executor(build_model(model, depth=depth, in_shape=(3, 16, 16)), BATCH, device=device,
                  seed=1, precision=precision, replay=replay, layout=layout,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    before = ex.state_dict()
    losses = [ex.train_step(x, y) for x, y in data]
    return losses, before, ex.state_dict(), ex


def worst_update_difference(a, b) -> float:
    """The largest relative norm of a parameter's update difference between two runs (of
    run_steps), against ``b``'s update."""
    worst = 0.0
    for k in b[2]:
        if ":" in k:
            continue
        da = a[2][k].astype(np.float64) - a[1][k]
        db = b[2][k].astype(np.float64) - b[1][k]
        if np.any(db):
            worst = max(worst, float(np.linalg.norm(da - db) / np.linalg.norm(db)))
    return worst
