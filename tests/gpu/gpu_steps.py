"""Shared by the GPU tests that compare a few training steps on CudaDevice with the CPU
reference from the same weights and data (test_cuda_mixed.py, test_cuda_layout.py,
test_cuda_accumulate.py, test_fused_bn_relu.py, test_fused_add_relu.py; lrn_net also
tests/kernels/test_cuda_layout_on_standins.py)."""
from __future__ import annotations

import numpy as np

BATCH = 8


def run_steps(device, precision="fp32", replay="off", steps=1, layout="nchw",
              model="resnet_cifar", depth=8):
    """(losses, state before, state after, executor) of ``steps`` SGD steps on 16x16 images."""
    from neuron.models import build_model

    import neuron as nn
    from neuron.executor import Executor
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32),
             rng.integers(0, 10, BATCH)) for _ in range(steps)]
    ex = Executor(build_model(model, depth=depth, in_shape=(3, 16, 16)), BATCH, device=device,
                  seed=1, precision=precision, replay=replay, layout=layout,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    before = ex.state_dict()
    losses = [ex.train_step(x, y) for x, y in data]
    return losses, before, ex.state_dict(), ex


def update_differences(a, b) -> dict:
    """Per parameter, the relative norm of its update difference between two runs (of
    run_steps), against ``b``'s update; largest first."""
    out = {}
    for k in b[2]:
        if ":" in k:
            continue
        da = a[2][k].astype(np.float64) - a[1][k]
        db = b[2][k].astype(np.float64) - b[1][k]
        if np.any(db):
            out[k] = float(np.linalg.norm(da - db) / np.linalg.norm(db))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def worst_update_difference(a, b) -> float:
    """The largest of :func:`update_differences`."""
    return max(update_differences(a, b).values(), default=0.0)


def worst_updates_text(a, b, n: int = 4) -> str:
    """The ``n`` largest update differences with their parameters' names: which layer a
    failing tolerance is about (the H200's first mixed run printed only the number)."""
    return ", ".join(f"{k} {v:.3g}" for k, v in list(update_differences(a, b).items())[:n])


def steps_on_cpu_and_cuda(graph, x, y, steps=2, cpu_kw=None, cuda_kw=None, check=None, **kw):
    """{"cpu": (losses, state), "cuda": (losses, state)}: ``steps`` SGD steps (lr 0.1, momentum
    0.9, seed 0) of ``graph`` on each device from the same weights and batch; ``kw`` to both
    executors, ``cpu_kw``/``cuda_kw`` to one; ``check(executor)`` before its steps."""
    import neuron as nn
    from neuron.executor import Executor
    results = {}
    for kind, own in (("cpu", cpu_kw), ("cuda", cuda_kw)):
        ex = Executor(graph, len(x), device=kind, optimizer=nn.SGD(lr=0.1, momentum=0.9),
                      seed=0, **kw, **(own or {}))
        if check is not None:
            check(ex)
        results[kind] = ([ex.train_step(x, y) for _ in range(steps)], ex.state_dict())
        if kind == "cuda":
            ex.device.close()
    return results


def assert_cuda_trains_like_cpu(results) -> None:
    """The losses within 1e-4 and every state array within float32 rounding of the CPU's."""
    import pytest
    (l_cpu, s_cpu), (l_gpu, s_gpu) = results["cpu"], results["cuda"]
    assert l_gpu == pytest.approx(l_cpu, rel=1e-4)
    for k in s_cpu:
        np.testing.assert_allclose(s_gpu[k], s_cpu[k], rtol=2e-3, atol=2e-4, err_msg=k)


def lrn_net():
    """What resnet and densenet lack: cuDNN's LRN (odd window) and the raw one (even), a
    ceil-mode max pool (raw kernels), an average pool (raw backward) and a sigmoid, on
    channels-last maps at --layout nhwc."""
    import neuron as nn
    x = nn.Input((3, 16, 16), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(16, 3, padding=1, name="c1")(x))
    h = nn.LRN(5, name="lrn_odd")(h)
    h = nn.MaxPool2d(3, 2, ceil_mode=True, name="p1")(h)
    h = nn.ReLU(name="r2")(nn.Conv2d(16, 3, padding=1, bias=False, name="c2")(h))
    h = nn.LRN(4, name="lrn_even")(h)
    h = nn.AvgPool2d(2, 2, name="p2")(h)
    h = nn.Sigmoid(name="s")(nn.Linear(16, name="fc1")(h))
    return nn.Graph(x, nn.Linear(10, name="fc2")(h))
