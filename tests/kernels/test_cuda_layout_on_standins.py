"""--layout nhwc on the GPU code path (CudaDevice, neuron/kernels/cuda.py, the cuDNN wrappers)
run on the CPU stand-ins: channels-last views reach every wrapper, the stand-in cuDNN reads them
through the descriptors it is given (tensor strides, the NHWC filter format), and training
matches the CPU reference at nchw.

Tolerances: the stand-ins compute with numpy_ref's arithmetic, so the two layouts differ only in
the summation order of reductions over strided arrays (BN statistics, bias gradients, pooling
gradients); losses agree to 2e-5 and parameters to 2e-4 relative (test_cuda_on_standins.py's
check), which a wrong descriptor (an NCHW filter read as NHWC) exceeds in the first digit."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import neuron as nn
from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.kernels.channels_last import channels_last_strides

from test_cuda_on_standins import GRAPHS, _same, rerun_graphs, train  # noqa: F401 (fixture)

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/gpu")
from gpu_steps import lrn_net  # noqa: E402 (tests/gpu/test_cuda_layout.py's network)

ARENA = 64 << 20


def _cuda_device():
    from neuron.devices.cuda import CudaDevice
    return CudaDevice(ARENA, headroom_bytes=0)


def _on_cuda(graph, **kw):
    dev = _cuda_device()
    try:
        return train(graph, dev, **kw)
    finally:
        dev.close()


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_nhwc_on_the_cuda_path_trains_like_nchw_on_the_cpu(gpu_kernels, graph):
    _same(_on_cuda(graph, layout="nhwc", replay="off"), train(graph, CpuDevice(ARENA)))


def test_the_cuda_path_gets_channels_last_views_and_nhwc_filters(gpu_kernels, monkeypatch):
    import cuda_standins
    seen = []
    real = cuda_standins.CudnnStandIn.convolution_forward

    def spy(self, h, xd, x, wd, w, cd, *a, **k):
        seen.append((xd.strides, wd.fmt))
        return real(self, h, xd, x, wd, w, cd, *a, **k)
    monkeypatch.setattr(cuda_standins.CudnnStandIn, "convolution_forward", spy)
    asked = []
    request = gpu_kernels.conv2d_workspace_request
    monkeypatch.setattr(gpu_kernels, "conv2d_workspace_request",
                        lambda *a, **k: asked.append(k.get("layout")) or request(*a, **k))
    gpu_kernels.conv_algo_trace.clear()
    dev = _cuda_device()
    try:
        _, _, ex = train("resnet_cifar8", dev, steps=1, layout="nhwc", replay="off")
        views = [ex.pool.view(t) for t in ex.state_tensors if len(t.shape) == 4]
        assert views and all(v.strides == channels_last_strides(v.shape, 4) for v in views)
    finally:
        dev.close()
    assert seen and all(fmt == gpu_kernels.dnn.CUDNN_TENSOR_NHWC for _, fmt in seen)
    # every convolution input is channels-last: the channel stride is one element
    assert all(strides[1] == 4 for strides, _ in seen), seen
    # the algorithms are chosen, and the workspace asked for, among nhwc's
    trace = gpu_kernels.conv_algo_trace
    assert trace and all(r.key.endswith(" nhwc") for r in trace), trace[:3]
    if getattr(dev, "dynamic_workspace", False):
        assert asked and set(asked) == {"nhwc"}


def test_a_filter_read_in_the_wrong_format_is_caught(gpu_kernels, monkeypatch):
    """The check can fail: KRSC weights described as NCHW filters train differently."""
    import cuda_standins
    real = cuda_standins.CudnnStandIn.filter_descriptor
    monkeypatch.setattr(cuda_standins.CudnnStandIn, "filter_descriptor",
                        lambda self, shape, dtype, fmt=0: real(self, shape, dtype))
    with pytest.raises(AssertionError):
        _same(_on_cuda("resnet_cifar8", layout="nhwc", replay="off"),
              train("resnet_cifar8", CpuDevice(ARENA)))


def test_a_replayed_nhwc_iteration_gives_the_eager_bits(gpu_kernels):
    """The tape (the graph: the test after next; its capture on a GPU: tests/gpu)."""
    eager = _on_cuda("densenet_cifar10", layout="nhwc", replay="off", steps=4)
    replayed = _on_cuda("densenet_cifar10", layout="nhwc", replay="tape", steps=4)
    assert replayed[2].replay["replayed_iterations"] >= 1
    assert eager[0] == replayed[0]
    for k in eager[1]:
        np.testing.assert_array_equal(eager[1][k], replayed[1][k], err_msg=k)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_graph_of_an_nhwc_step_gives_the_eager_bits(gpu_kernels, rerun_graphs, precision):
    """tests/gpu/test_cuda_layout.py's graph test under the stand-in's capture rules, in an
    arena of the plan's size. A graph copies the batch as bytes from the staging buffer, which
    holds it in (N, C, H, W) order: into a channels-last data tensor those bytes landed
    transposed (the replayed iterations' losses differed from the third digit, fp32 too). The
    staging now holds the batch in the data tensor's storage order, an (N, C, H, W) view of
    (N, H, W, C) bytes, so the graph copies bytes and the host transposes nothing per launch."""
    if precision != "fp32":
        pytest.importorskip("ml_dtypes")
    from neuron.models import build_model
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((8, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, 8))
            for _ in range(4)]
    runs = {}
    for replay in ("off", "graph"):
        ex = Executor(build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16)), 8,
                      device="cuda", seed=1, precision=precision, layout="nhwc", replay=replay,
                      optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
        runs[replay] = ([ex.train_step(x, y) for x, y in data], ex.state_dict(), ex)
        ex.device.close()
    r = runs["graph"][2].replay
    assert r["ran"] == "graph" and r["replayed_iterations"] >= 1 and r["eager_because"] is None, r
    from neuron.kernels.channels_last import is_channels_last
    ex = runs["graph"][2]
    assert is_channels_last(ex.batch_buffers()["data"])
    assert ex._replay.graph._reordered == []        # no host pass over the batch per launch
    assert runs["graph"][0] == runs["off"][0]
    for k in runs["off"][1]:
        np.testing.assert_array_equal(runs["graph"][1][k], runs["off"][1][k], err_msg=k)


@pytest.mark.parametrize("graph", ["resnet", "densenet", "pointwise_and_lrn"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_step_at_nhwc_on_the_cuda_path_matches_the_cpu_reference(gpu_kernels, precision,
                                                                          graph):
    """The low-precision weight copies and the float32 masters' gradients (buffers carved in
    the weight's own layout) at nhwc, against the CPU reference at nhwc (the same summation
    orders on both sides, so test_cuda_mixed_on_standins.py's tolerance holds; against nchw,
    BN's reductions in another order flip low-type roundings: about 2e-3 at bf16)."""
    pytest.importorskip("ml_dtypes")
    import test_cuda_mixed_on_standins as mixed
    net = getattr(mixed, graph)
    data = mixed._data()
    dev = _cuda_device()
    try:
        gpu = mixed._run(dev, precision, data, graph=net, layout="nhwc")
    finally:
        dev.close()
    cpu = mixed._run(CpuDevice(ARENA), precision, data, graph=net, layout="nhwc")
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=mixed.LOSS_RTOL[precision])
    worst, name = mixed.worst_update_error(gpu, cpu)
    assert worst < mixed.TOL[precision], (worst, name)


def test_nhwc_under_memory_pressure_with_recomputation_and_chunks(gpu_kernels):
    """Offloaded parameters and activations brought back as raw bytes, recomputed BN, the
    chunked BN kernels (kernels/bn_chunks.py) and gradients accumulated over chunks, all on
    channels-last views."""
    from neuron.plan import plan
    g = GRAPHS["resnet_cifar8"]()
    budget = int(plan(g, 4, policy="liveness", search_min=False)["peak_bytes"] * 0.5)
    for kw in ({"planner": "superneurons", "offload_params": True, "budget": budget},
               {"policy": "superneurons", "chunks": 2}):
        arena = budget if "budget" in kw else ARENA
        from neuron.devices.cuda import CudaDevice
        dev = CudaDevice(arena, headroom_bytes=0)
        try:
            nhwc = train("resnet_cifar8", dev, layout="nhwc", replay="off", **kw)
        finally:
            dev.close()
        _same(nhwc, train("resnet_cifar8", CpuDevice(arena), **kw))


def test_the_raw_pool_and_lrn_kernels_take_channels_last_maps_in_place(gpu_kernels, monkeypatch):
    """What failed on the H200 (2026-11-27): at nhwc the raw kernels (ceil-mode max pool, average
    pool backward, the even-window LRN) ran on C-ordered copies of their channels-last inputs
    and wrote through a C-ordered temporary, CuPy temporaries the plan does not hold ("CuPy
    temporary of 131072 bytes for kernel cuda_helpers._run_into (step B22:p1) does not fit").
    They index logically now (CuPy's CArray follows strides; so does the stand-in's): in an
    arena of the plan's size (device="cuda", as the GPU test runs) the step runs, no kernel of
    those layers takes a temporary, and the result is the CPU's at nchw."""
    from neuron.devices import cuda as cuda_dev
    taken = []
    real = cuda_dev.ArenaAllocator.malloc

    def malloc(self, nbytes, device_id=0):
        taken.append((nbytes, *cuda_dev.kernel_context()))
        return real(self, nbytes, device_id)
    monkeypatch.setattr(cuda_dev.ArenaAllocator, "malloc", malloc)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    runs = {}
    for device, layout in (("cuda", "nhwc"), ("cpu", "nchw")):
        ex = Executor(lrn_net(), 8, device=device, seed=1, layout=layout, replay="off",
                      optimizer=nn.SGD(lr=0.05, momentum=0.9))
        before = ex.state_dict()
        runs[device] = ([ex.train_step(x, y)], ex.state_dict(), before)
        if device == "cuda":
            assert ex.device.arena_bytes == ex.planned["arena_bytes"]
            ex.device.close()
    raw_layers = ("p1", "p2", "lrn_even")
    assert not [t for t in taken if t[2] and t[2].split(":")[-1] in raw_layers], taken
    np.testing.assert_allclose(runs["cuda"][0], runs["cpu"][0], rtol=1e-5)
    for k in runs["cpu"][1]:
        np.testing.assert_allclose(runs["cuda"][1][k], runs["cpu"][1][k], rtol=2e-4, atol=2e-6,
                                   err_msg=k)
