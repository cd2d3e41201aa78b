"""GPU: the fused Add + ReLU kernels (neuron.kernels.cuda.add_relu_*) against the unfused pair
as neuron runs it (CuPy's add, then cuDNN's ReLU forward and backward), a fused residual step
against the CPU, and the fused network replayed as a CUDA graph with eager execution's bits.
Skipped (conftest.py) where CuPy or a GPU is missing.

The kernels are elementwise (no summation order to differ), so forward agrees with the pair to
the bit; backward agrees in value (cuDNN's ReLU backward writes +0 where the mask multiplies a
negative gradient into -0, which compares equal)."""
from __future__ import annotations

import numpy as np
import pytest
from gpu_steps import assert_cuda_trains_like_cpu, steps_on_cpu_and_cuda

from neuron.kernels import cuda as K

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _low(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _put(cp, a, nhwc):
    """A device copy of host array a (N, C, H, W), stored channels-last when ``nhwc``; a
    2-byte one made as the device makes its views (cupy.ndarray of the dtype), filled with its
    bits."""
    host = np.ascontiguousarray(a.transpose(0, 2, 3, 1) if nhwc else a)
    d = cp.ndarray(host.shape, a.dtype)
    if a.dtype.itemsize == 2:
        d.view(np.uint16)[...] = cp.asarray(host.view(np.uint16))
    else:
        d[...] = cp.asarray(host)
    return d.transpose(0, 3, 1, 2) if nhwc else d


def _host(cp, a, dtype):
    """Host copy of device array a in logical (N, C, H, W) order (through its bits if 2-byte)."""
    return np.ascontiguousarray(cp.asnumpy(cp.ascontiguousarray(
        a.view(np.uint16) if dtype.itemsize == 2 else a))).view(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("shape", [(8, 64, 56, 56), (5, 3, 9, 11)])
def test_fused_kernels_match_the_unfused_pair(cp, dtype, n, nhwc, shape):
    dt = _low(dtype)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape).astype(np.float32).astype(dt) for _ in range(n)]
    dy_h = rng.standard_normal(shape).astype(np.float32).astype(dt)
    d_xs = [_put(cp, x, nhwc) for x in xs]
    # unfused: add_forward, cuDNN ReLU forward, cuDNN ReLU backward
    z, y, dz = (_put(cp, np.zeros(shape, dt), nhwc) for _ in range(3))
    K.add_forward(d_xs, z)
    K.relu_forward(z, y)
    K.relu_backward(y, _put(cp, dy_h, nhwc), dz)
    # fused: forward, then the mask in place over dy
    fy, fdy = _put(cp, np.zeros(shape, dt), nhwc), _put(cp, dy_h, nhwc)
    K.add_relu_forward(d_xs, fy)
    K.add_relu_backward(fy, fdy)
    cp.cuda.Device().synchronize()
    y_h, fy_h = _host(cp, y, dt), _host(cp, fy, dt)
    assert fy_h.tobytes() == y_h.tobytes()
    np.testing.assert_array_equal(_host(cp, fdy, dt).astype(np.float64),
                                  _host(cp, dz, dt).astype(np.float64))
    assert 0.3 < (fy_h.astype(np.float32) > 0).mean() < 0.9


def _residual(name):
    from neuron.models import build_model
    from neuron.models.resnet import bottleneck

    import neuron as nn
    if name == "resnet_cifar8":
        return build_model("resnet_cifar", depth=8)
    x = nn.Input((3, 32, 32), name="data")
    h = nn.Conv2d(16, 3, padding=1, bias=False, name="conv1")(x)
    h = nn.ReLU(name="relu")(nn.BatchNorm(name="bn1")(h))
    h = bottleneck(h, "layer1.0", 4)
    h = bottleneck(h, "layer2.0", 8, stride=2)
    h = nn.GlobalAvgPool(name="avgpool")(h)
    return nn.Graph(x, nn.Linear(10, name="fc")(h), name="bottleneck_net")


@pytest.mark.parametrize("name", ["resnet_cifar8", "bottleneck"])
def test_fused_residual_step_matches_the_cpu(cp, name):
    from neuron.layers import AddReLU
    graph = _residual(name)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], 8)

    def fused(ex):
        if ex.fuse:
            assert sum(type(l) is AddReLU for l in ex.graph.route) >= 2
    assert_cuda_trains_like_cpu(steps_on_cpu_and_cuda(
        graph, x, y, cpu_kw={"fuse": False}, cuda_kw={"fuse": True}, check=fused))


@pytest.mark.usefixtures("deterministic_kernels")
def test_the_fused_network_replays_as_a_cuda_graph_with_eager_bits(cp):
    import neuron as nn
    from neuron.executor import Executor
    runs = {}
    for mode in ("off", "graph"):
        rng = np.random.default_rng(0)
        ex = Executor(_residual("bottleneck"), 8, device="cuda", seed=1, replay=mode,
                      fuse=True, optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
        losses = [ex.train_step(rng.standard_normal((8, 3, 32, 32)).astype(np.float32),
                                rng.integers(0, 10, 8)) for _ in range(5)]
        runs[mode] = (losses, ex.state_dict(), dict(ex.replay))
        ex.device.close()
    (l_off, s_off, _), (l_g, s_g, r) = runs["off"], runs["graph"]
    assert l_g == l_off
    assert all(s_off[k].tobytes() == s_g[k].tobytes() for k in s_off)
    assert r["ran"] == "graph" and r["replayed_iterations"] >= 2, r
