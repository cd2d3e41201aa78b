"""The fused Add + ReLU kernels of the GPU module (cuda.add_relu_*, cuda_raw._k_add_relu) on
the CPU: their CUDA source compiled by g++ through the CuPy stand-in (cuda_standins/), checked
bit for bit against numpy_ref's (elementwise: no summation order to differ), and fused
residual networks trained and replayed through them."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.devices import CpuDevice
from neuron.kernels import numpy_ref as ref
from neuron.layers import AddReLU
from neuron.models.resnet import bottleneck

import test_cuda_on_standins as standins
from test_cuda_on_standins import CudaKernelsOnCpu, _same, train
from test_cuda_on_standins import rerun_graphs  # noqa: F401 (a fixture, requested by name)

SHAPE = (3, 4, 5, 6)


def _dev(a):
    from cuda_standins import DevArray
    return np.ascontiguousarray(a).view(DevArray)


def _dev_nhwc(a):
    """A logical NCHW device array stored channels-last (--layout nhwc)."""
    return _dev(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _inputs(n, dtype, seed=0):
    """n arrays whose sums have every sign, zeros of both signs, a NaN and an infinity."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(SHAPE).astype(dtype) for _ in range(n)]
    xs[0].flat[:4] = [np.nan, np.inf, -0.0, 0.0]
    xs[1].flat[:4] = [1.0, -1.0, -0.0, -0.0]
    dy = rng.standard_normal(SHAPE).astype(dtype)
    dy.flat[4:6] = [np.nan, -2.0]
    return xs, dy


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "mixed"])
def test_the_kernels_give_numpy_refs_bits(gpu_kernels, dtype, n, layout):
    cuda = gpu_kernels
    xs, dy = _inputs(n, dtype)
    want_y, want_dy = np.empty(SHAPE, dtype), dy.copy()
    with np.errstate(invalid="ignore"):
        ref.add_relu_forward(xs, want_y)
    ref.add_relu_backward(want_y, want_dy)
    put = {"nchw": [_dev] * (n + 2), "nhwc": [_dev_nhwc] * (n + 2),
           "mixed": [_dev_nhwc, _dev] * n}[layout]     # storage views only when all alike
    d_xs = [put[i](x) for i, x in enumerate(xs)]
    y, d_dy = put[n](np.full(SHAPE, 7, dtype)), put[n + 1](dy)
    with np.errstate(invalid="ignore"):
        cuda.add_relu_forward(d_xs, y)
    cuda.add_relu_backward(y, d_dy)
    assert np.asarray(y).tobytes() == want_y.tobytes()
    assert np.ascontiguousarray(d_dy).tobytes() == want_dy.tobytes()   # in place
    assert np.isnan(want_y.flat[0]) and np.isnan(want_dy.flat[4]) and want_dy.flat[5] == 0


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [2, 3])
def test_the_low_type_kernels_are_add_then_relu_rounded_as_stored(gpu_kernels, low, n):
    """2-byte data (the low type's own kernels, on the bits): what the unfused pair stores,
    the sums rounded as add_forward rounds them (after each add), then the ReLU, and the
    masked gradient (exact in the low type)."""
    import ml_dtypes
    cuda = gpu_kernels
    low = np.dtype(low) if low == "float16" else np.dtype(ml_dtypes.bfloat16)
    xs, dy = _inputs(n, np.float32, seed=5)
    xs = [x.astype(low) for x in xs]
    dy = dy.astype(low)
    z = xs[0].astype(np.float32)
    for x in xs[1:]:                            # float32 arithmetic, rounded where stored
        z = (z + x.astype(np.float32)).astype(low).astype(np.float32)
    want_y = np.maximum(z, 0).astype(low)
    want_dy = ((want_y.astype(np.float32) > 0) * dy.astype(np.float32)).astype(low)
    y, d_dy = _dev(np.zeros(SHAPE, low)), _dev(dy)
    cuda.add_relu_forward([_dev(x) for x in xs], y)
    cuda.add_relu_backward(y, d_dy)
    assert np.asarray(y).dtype == low
    assert np.asarray(y).tobytes() == want_y.tobytes()
    assert np.asarray(d_dy).tobytes() == want_dy.tobytes()


def test_backward_refuses_two_types_naming_them(gpu_kernels):
    with pytest.raises(TypeError, match="add_relu_backward: y is float32 and dy float64"):
        gpu_kernels.add_relu_backward(_dev(np.ones(SHAPE, np.float32)),
                                      _dev(np.ones(SHAPE, np.float64)))


def bottleneck_net():
    """ResNet-50's bottleneck blocks, narrow: identity and strided projection shortcuts."""
    x = nn.Input((3, 16, 16), name="data")
    h = nn.Conv2d(8, 3, padding=1, bias=False, name="conv1")(x)
    h = nn.ReLU(name="relu")(nn.BatchNorm(name="bn1")(h))
    h = bottleneck(h, "layer1.0", 2)
    h = bottleneck(h, "layer2.0", 4, stride=2)
    h = nn.GlobalAvgPool(name="avgpool")(h)
    return nn.Graph(x, nn.Linear(10, name="fc")(h), name="bottleneck_net")


@pytest.fixture
def with_bottleneck(monkeypatch):
    monkeypatch.setitem(standins.GRAPHS, "bottleneck", bottleneck_net)


def _add_relus(ex) -> int:
    return sum(type(l) is AddReLU for l in ex.graph.route)


@pytest.mark.parametrize("graph", ["resnet_cifar8", "bottleneck"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_fused_residual_network_trains_like_the_unfused_one(gpu_kernels, with_bottleneck,
                                                               graph, layout):
    """The GPU module's AddReLU (and BNReLU) kernels against numpy_ref's unfused network."""
    gpu = train(graph, CudaKernelsOnCpu(64 << 20), fuse=True, layout=layout)
    assert _add_relus(gpu[2]) >= 2 and gpu[2].layout == layout
    _same(gpu, train(graph, CpuDevice(64 << 20)))


def test_fused_with_chunks_and_recomputation(gpu_kernels, with_bottleneck):
    for kw in ({"policy": "superneurons"}, {"policy": "superneurons", "chunks": 2}):
        _same(train("bottleneck", CudaKernelsOnCpu(64 << 20), fuse=True, **kw),
              train("bottleneck", CpuDevice(64 << 20), **kw))


@pytest.mark.parametrize("kw", [{}, {"policy": "superneurons", "fraction": 0.5}])
def test_the_fused_residual_network_replays_bit_identically(gpu_kernels, rerun_graphs,
                                                            with_bottleneck, kw):
    """CudaDevice's recorded iteration of the fused bottleneck network (the in-place masks on
    the tape, and inside a captured graph) gives the bits of running every iteration."""
    from test_cuda_on_standins import _arena_for, replays_bit_identically
    _, arena, kw, _ = _arena_for("bottleneck", kw)
    runs = replays_bit_identically("bottleneck", arena, fuse=True, **kw)
    ex = runs["graph"][2]
    assert _add_relus(ex) == 2
    names = {getattr(fn, "__name__", "") for fn, *_ in ex._replay.tape.ops}
    assert {"add_relu_forward", "add_relu_backward"} <= names, names
