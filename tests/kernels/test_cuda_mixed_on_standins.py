"""bf16 and fp16 mixed precision on the GPU code path (CudaDevice, neuron/kernels/cuda.py and
cuda_low.py, cuBLAS/cuDNN wrappers) run on the CPU stand-ins, against the CPU reference
(neuron/precision/mixed_cpu.py) from the same weights and data.

The two paths round at the same places (each feature map, weight copy and weight gradient once,
to the low type; the loss in float32). On the stand-ins the arithmetic under the roundings is
numpy_ref's on both sides, so the updates agree to float32 summation order (exactly, for
resnet_cifar's bias-free convolutions, when this was written); on a GPU the order differs and
flips a low-type rounding here and there (tests/gpu/test_cuda_mixed.py has its own tolerance).
TOL, on the relative norm of each parameter's update, is what a wrong cast must exceed: the
negative checks run the reference with one convolution reading its float32 master weights (no
low copy: it computes as float32 would; 0.25 (bf16) and 0.14 (fp16) when this was written) and
with the weight gradients left unrounded (1.8e-3 and 2.1e-4), and both must fail it."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.models import build_model

pytest.importorskip("ml_dtypes")

#: the largest relative difference (norm of the update difference / norm of the update) of any
#: parameter after one step, and of the loss
TOL = {"bf16": 5e-4, "fp16": 5e-5}
LOSS_RTOL = {"bf16": 1e-6, "fp16": 1e-6}
BATCH = 4
ARENA = 64 << 20


def resnet():
    return build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))


def densenet():
    """Concatenation (sliced bits, low-type sums) and average pooling (the raw backward kernel
    through float32)."""
    return build_model("densenet_cifar", depth=10, in_shape=(3, 16, 16))


def _data(steps=1, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32),
             rng.integers(0, 10, BATCH)) for _ in range(steps)]


def _run(device, precision, data, replay="off", graph=resnet, **kw):
    ex = Executor(graph(), BATCH, device=device, seed=1, precision=precision, replay=replay,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), **kw)
    before = ex.state_dict()
    losses = [ex.train_step(x, y) for x, y in data]
    return losses, before, ex.state_dict(), ex


def _cuda_device():
    from neuron.devices.cuda import CudaDevice
    return CudaDevice(ARENA, headroom_bytes=0)


def _on_cuda(precision, data, **kw):
    dev = _cuda_device()
    try:
        return _run(dev, precision, data, **kw)
    finally:
        dev.close()


def worst_update_error(a, b) -> tuple[float, str]:
    """The largest ||update_a - update_b|| / ||update_b|| over the parameters (the float32
    masters' change in the steps run), and which."""
    (_, before_a, after_a, _), (_, before_b, after_b, _) = a, b
    worst, name = 0.0, ""
    for k in after_b:
        if k.startswith(("momentum", "velocity")) or ":" in k:
            continue
        da = after_a[k].astype(np.float64) - before_a[k]
        db = after_b[k].astype(np.float64) - before_b[k]
        if not np.any(db):
            continue
        err = float(np.linalg.norm(da - db) / np.linalg.norm(db))
        if err > worst:
            worst, name = err, k
    return worst, name


def pointwise_and_lrn():
    """What resnet and densenet do not have: LRN with an even window (a raw kernel) and an odd
    one (cuDNN), sigmoid, tanh and leaky ReLU (raw backward kernels), ceil-mode pools (raw
    kernels): each through float32 for the 2-byte types."""
    x = nn.Input((3, 16, 16), name="data")
    h = nn.LeakyReLU(0.1, name="r1")(nn.Conv2d(8, 3, padding=1, name="conv1")(x))
    h = nn.LRN(4, name="lrn_even")(h)
    h = nn.MaxPool2d(3, 2, ceil_mode=True, name="p1")(h)
    h = nn.Tanh(name="t")(nn.Conv2d(8, 3, padding=1, bias=False, name="c2")(h))
    h = nn.LRN(5, name="lrn_odd")(h)
    h = nn.AvgPool2d(3, 2, 1, ceil_mode=True, name="p2")(h)
    h = nn.Sigmoid(name="s")(nn.Linear(16, name="fc1")(h))
    return nn.Graph(x, nn.Linear(10, name="fc2")(h))


@pytest.mark.parametrize("graph", [resnet, densenet, pointwise_and_lrn],
                         ids=["resnet_cifar8", "densenet_cifar10", "pointwise_and_lrn"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_step_on_the_cuda_path_matches_the_cpu_reference(gpu_kernels, precision, graph):
    data = _data()
    gpu = _on_cuda(precision, data, graph=graph)
    cpu = _run(CpuDevice(ARENA), precision, data, graph=graph)
    for a, b in zip(gpu[1], cpu[1]):
        assert gpu[1].keys() == cpu[1].keys()
        np.testing.assert_array_equal(gpu[1][a], cpu[1][b])       # the same initial weights
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=LOSS_RTOL[precision])
    worst, name = worst_update_error(gpu, cpu)
    assert worst < TOL[precision], (worst, name)
    # the state the optimizer sees is float32: masters, momentum, BN statistics
    assert all(v.dtype == np.float32 for v in gpu[2].values() if v.ndim), \
        {k: v.dtype for k, v in gpu[2].items()}


def test_the_convolutions_run_in_the_low_type_with_float_compute(gpu_kernels, cuda_standins):
    """Every convolution cuDNN is given reads and writes the low type (x, w, y), with a float
    compute type on its descriptor (cudnn_api.compute_type)."""
    import neuron.kernels.cuda as K
    from neuron.kernels import cudnn_api
    seen = []
    real = K.dnn.convolution_forward

    def spy(h, xd, x, wd, w, cd, *a, **kw):
        seen.append((np.dtype(xd.dtype).name, np.dtype(wd.dtype).name))
        return real(h, xd, x, wd, w, cd, *a, **kw)
    K.dnn.convolution_forward = spy
    try:
        _on_cuda("bf16", _data())
    finally:
        del K.dnn.convolution_forward
    assert seen and set(seen) == {("bfloat16", "bfloat16")}, set(seen)
    import ml_dtypes
    assert cudnn_api.data_type(ml_dtypes.bfloat16) == cudnn_api.CUDNN_DATA_BFLOAT16
    assert cudnn_api.compute_type(ml_dtypes.bfloat16) == cudnn_api.CUDNN_DATA_FLOAT


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_layer_in_the_wrong_type_fails_the_tolerance(gpu_kernels, precision, monkeypatch):
    """The reference with one convolution reading its float32 master weights (no low-type
    copy: that layer computes as float32 would), then with the cast layers' weight gradients
    left unrounded, both differ from the CUDA path by more than TOL."""
    from neuron.precision import mixed_cpu
    from neuron.precision import Precision
    data = _data()
    gpu = _on_cuda(precision, data)
    real = Precision.casts_params
    monkeypatch.setattr(Precision, "casts_params",
                        lambda self, layer: real(self, layer) and layer.name != "conv1")
    one_layer_fp32 = _run(CpuDevice(ARENA), precision, data)
    monkeypatch.setattr(Precision, "casts_params", real)
    assert worst_update_error(gpu, one_layer_fp32)[0] > TOL[precision]
    real_backward = mixed_cpu.backward
    monkeypatch.setattr(mixed_cpu, "backward", lambda *a, **kw: real_backward(
        *a[:11], None, *a[12:], **kw))          # low=None: the gradients are not rounded
    unrounded = _run(CpuDevice(ARENA), precision, data)
    assert worst_update_error(gpu, unrounded)[0] > TOL[precision]


def test_fp16_overflow_skips_the_step_on_the_device(gpu_kernels):
    """fp16's loss scaling on the device: a scale that overflows the gradients skips the step
    (the masters unchanged, the scale halved), read from the flag once at the step's end."""
    data = _data(steps=1)
    dev = _cuda_device()
    try:
        ex = Executor(resnet(), BATCH, device=dev, seed=1, precision="fp16",
                      optimizer=nn.SGD(lr=0.05, momentum=0.9))
        ex.loss_scaler.scale = 2.0 ** 40            # every gradient overflows in fp16
        before = ex.state_dict()
        ex.train_step(*data[0])
        after = ex.state_dict()
        params = [k for k in before if ":" not in k]
        assert all(before[k].tobytes() == after[k].tobytes() for k in params)
        assert ex.loss_scaler.scale == 2.0 ** 39 and ex.loss_scaler.skipped == 1
        ex.loss_scaler.scale = 1024.0
        ex.train_step(*data[0])
        assert ex.loss_scaler.skipped == 1 and ex.loss_scaler.good_steps == 1
        moved = ex.state_dict()
        assert any(moved[k].tobytes() != after[k].tobytes() for k in params)
    finally:
        dev.close()


def test_precision_missing_names_the_capability(gpu_kernels, monkeypatch):
    from neuron.devices.cuda_check import precision_missing
    assert precision_missing("bf16", (9, 0)) is None
    assert precision_missing("fp16", (7, 0)) is None
    msg = precision_missing("bf16", (7, 5))
    assert "compute capability 8.0" in msg and "7.5" in msg and "fp16" in msg
    assert "5.3" in precision_missing("fp16", (5, 0))
    assert "ml_dtypes" in precision_missing("bf16", (9, 0), "the ml_dtypes package is not "
                                            "installed")
    dev = _cuda_device()
    try:
        assert dev.compute_capability == (9, 0)
        assert dev.precision_missing("bf16") is None
        with monkeypatch.context() as m:
            m.setattr(dev._cp.cuda.runtime, "getDeviceProperties",
                      lambda i: {"major": 7, "minor": 0})
            with pytest.raises(ValueError, match="bf16 on device cuda: bf16 needs a GPU of "
                                                 "compute capability 8.0"):
                Executor(resnet(), BATCH, device=dev, precision="bf16")
    finally:
        dev.close()


from test_cuda_on_standins import rerun_graphs  # noqa: E402,F401 (the fixture)


def test_a_bf16_step_replays_as_tape_and_graph_with_eager_bits(gpu_kernels, rerun_graphs):
    """A bf16 iteration (weight casts, low-type kernels and temporaries, the float32 loss)
    recorded once and replayed as a tape and as a graph under CUDA's capture rules gives the
    bits of the eager run; the batch is staged in bf16 (the graph copies bytes, casts none)."""
    data = _data(steps=5, seed=3)
    runs = {mode: _on_cuda("bf16", data, replay=mode) for mode in ("off", "tape", "graph")}
    losses, _, state, _ = runs["off"]
    for mode in ("tape", "graph"):
        l_m, _, s_m, ex = runs[mode]
        assert l_m == losses, mode
        assert all(state[k].tobytes() == s_m[k].tobytes() for k in state), mode
        r = ex.replay
        assert r["ran"] == mode and r["replayed_iterations"] >= 2 and \
            r["eager_because"] is None, r
        assert ex.batch_buffers()["data"].dtype.name == "bfloat16"


def test_a_bf16_graph_reads_its_staging_filled_in_place_with_no_cast(gpu_kernels, rerun_graphs,
                                                                    monkeypatch):
    """The bf16 staging filled in place and passed back (as the throughput bench and a loader
    do) is taken as it is, no float32 round trip on the host, and gives the bits of feeding
    the float32 batch (the H200, 2026-11-27: a bf16 staging passed back was refused)."""
    import neuron.executor as E
    data = _data(steps=6, seed=5)
    *_, fed = _on_cuda("bf16", data, replay="graph")
    ex = Executor(resnet(), BATCH, device=_cuda_device(), seed=1, precision="bf16",
                  replay="graph", optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    ex.train_step(*data[0])
    xb, yb = list(ex.batch_buffers().values())[:2]
    taken = []
    real = E.feed
    monkeypatch.setattr(E, "feed", lambda *a, **k: (lambda out: (
        taken.append(out[ex.train_graph.inputs[0].producer.name] is xb), out)[1])(
        real(*a, **k)))
    for x, y in data[1:]:
        xb[...], yb[...] = x, y
        ex.train_step(xb, yb)
    assert ex.replay["replayed_iterations"] >= 2 and taken and all(taken), taken
    a, b = fed.state_dict(), ex.state_dict()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_an_fp16_step_replays_with_eager_bits_and_skips_overflows_as_eager_does(
        gpu_kernels, rerun_graphs, monkeypatch):
    """fp16 recorded and replayed as a tape and as a graph: the loss scale is read when each
    replay runs (a graph is captured again when it changes). From a scale that overflows at
    first (those records, which hold their own undo, are not trusted), then again in the middle
    of the run (forced, replayed), the replays skip, undo and shrink exactly as the eager run
    does: the same losses, scales and bits."""
    data = _data(steps=12, seed=5)
    runs = {}
    for mode in ("off", "tape", "graph"):
        dev = _cuda_device()
        try:
            ex = Executor(resnet(), BATCH, device=dev, seed=1, precision="fp16", replay=mode,
                          optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
            ex.loss_scaler.scale = 2.0 ** 19           # the first two steps overflow in fp16
            losses, scales = [], []
            for i, (x, y) in enumerate(data):
                if i == 8:
                    ex.loss_scaler.scale = 2.0 ** 40   # and these, replayed
                losses.append(ex.train_step(x, y))
                scales.append(ex.loss_scaler.scale)
            runs[mode] = (losses, scales, ex.loss_scaler.skipped, ex.state_dict(), ex.replay)
        finally:
            dev.close()
    losses, scales, skipped, state, _ = runs["off"]
    assert scales[:2] == [2.0 ** 18, 2.0 ** 17] and scales[8] == 2.0 ** 39 and skipped >= 3
    for mode in ("tape", "graph"):
        l_m, s_m, k_m, st_m, r = runs[mode]
        assert (l_m, s_m, k_m) == (losses, scales, skipped), mode
        assert all(state[k].tobytes() == st_m[k].tobytes() for k in state), mode
        assert r["ran"] == mode and r["replayed_iterations"] >= 6 and \
            r["eager_because"] is None, r


def test_a_cudnn_that_refuses_bf16_batchnorm_runs_it_in_float32(gpu_kernels, monkeypatch):
    """Where a cuDNN build refuses BatchNorm, an activation or pooling on a 2-byte type, that
    operation runs in float32 through temporaries from then on (said once): the same values,
    since cuDNN computes in float either way, so the step still matches the CPU reference."""
    import cuda_standins
    import neuron.kernels.cuda as K
    from neuron.kernels.cudnn_api import CudnnError
    for name in ("batchnorm_forward_training", "batchnorm_backward", "activation_forward",
                 "pooling_forward"):
        real = getattr(cuda_standins.CudnnStandIn, name)

        def refusing(self, h, *a, _real=real, _name=name, **kw):
            x_desc = next(d for d in a if getattr(d, "kind", None) == "tensor")
            if np.dtype(x_desc.dtype).itemsize == 2:
                raise CudnnError(3000, f"cudnn-{_name}")
            return _real(self, h, *a, **kw)
        monkeypatch.setattr(cuda_standins.CudnnStandIn, name, refusing)
    data = _data()
    K.low_refused.clear()
    try:
        with pytest.warns(RuntimeWarning, match="runs in float32"):
            gpu = _on_cuda("bf16", data)
        assert set(K.low_refused) == {"batchnorm", "activation"}
        assert worst_update_error(gpu, _run(CpuDevice(ARENA), "bf16", data))[0] < TOL["bf16"]
        with pytest.warns(RuntimeWarning, match="refused pooling"):
            gpu = _on_cuda("bf16", data, graph=densenet)    # its average pooling too
        assert "pooling" in K.low_refused
        cpu = _run(CpuDevice(ARENA), "bf16", data, graph=densenet)
        assert worst_update_error(gpu, cpu)[0] < TOL["bf16"]
    finally:
        K.low_refused.clear()


def test_fp16_overflow_without_the_step_guard_raises(gpu_kernels):
    """Executor.transactional = False: no undo record, so an overflow is not skipped but named
    (as the CPU path raises mid-step), never applied silently."""
    from neuron.precision.loss_scale import GradientOverflow
    dev = _cuda_device()
    try:
        ex = Executor(resnet(), BATCH, device=dev, seed=1, precision="fp16",
                      optimizer=nn.SGD(lr=0.05))
        ex.transactional = False
        ex.train_step(*_data()[0])                  # a good step first
        ex.loss_scaler.scale = 2.0 ** 40
        with pytest.raises(GradientOverflow, match="not transactional"):
            ex.train_step(*_data()[0])
    finally:
        dev.close()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_float32_batch_is_rounded_on_the_device_piece_by_piece(gpu_kernels, cuda_standins,
                                                                 monkeypatch, precision):
    """The data layer's copy of a host float32 batch into a low-precision tensor: staged as
    float32 and rounded by the cast kernel, in pieces of CAST_CHUNK elements; the bits of the
    host's rounding (ml_dtypes / NumPy)."""
    import neuron.kernels.cuda as K
    from neuron.precision import get_precision
    low = get_precision(precision).low()
    monkeypatch.setattr(K, "CAST_CHUNK", 1000)
    x = np.random.default_rng(2).standard_normal((4, 3, 16, 16)).astype(np.float32) * 300
    dst = cuda_standins.CupyStandIn().empty(x.shape, low)
    staged = K.input_stager().staged_bytes
    K.copy(dst, x)
    assert K.input_stager().staged_bytes - staged == x.nbytes      # float32 went across
    np.testing.assert_array_equal(np.asarray(dst).view(np.uint16),
                                  x.astype(low).view(np.uint16))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_chunked_mixed_step_matches_the_cpu_reference(gpu_kernels, precision):
    """The batch in two chunks: weight and bias gradients summed over the chunks into the
    float32 masters, each partial sum rounded through the low type as the reference rounds
    it (cuDNN hands the GPU path each chunk's gradient already rounded, so the two paths may
    differ by a rounding of the second chunk's share, within TOL)."""
    data = _data()
    kw = {"policy": "superneurons", "chunks": 2}
    gpu = _on_cuda(precision, data, **kw)
    cpu = _run(CpuDevice(ARENA), precision, data, **kw)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=LOSS_RTOL[precision])
    worst, name = worst_update_error(gpu, cpu)
    assert worst < TOL[precision], (worst, name)


def _classifier():
    x = nn.Input((3, 16, 16), name="data")
    h = nn.ReLU(name="r")(nn.Linear(256, name="fc1")(x))
    return nn.Graph(x, nn.Linear(10, name="fc2")(h), name="classifier")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_linear_weight_gradient_takes_no_weight_sized_temporary(gpu_kernels, monkeypatch,
                                                                  precision):
    """The float32 product of a low-type linear layer's weight gradient goes straight into its
    float32 master gradient and is rounded there (cuBLAS writes its output in place): the
    largest CuPy temporary of a step is far below the weight's float32 bytes, which the plan
    does not hold (VGG16's first classifier layer: 411 MB), and the update is the reference's."""
    from cuda_standins import cublas_gemm
    from neuron.kernels import cublas
    monkeypatch.setattr(cublas, "gemm", cublas_gemm)    # cublasGemmEx's one rounding
    data = _data()
    dev = _cuda_device()
    temps = []
    malloc = dev.allocator.malloc
    dev.allocator.malloc = lambda n, device_id=0: temps.append(int(n)) or malloc(n, device_id)
    try:
        losses, before, after, _ = _run(dev, precision, data, graph=_classifier)
    finally:
        dev.close()
    weight = 256 * 3 * 16 * 16 * 4
    assert temps and max(temps) < weight // 8, max(temps)
    cpu = _run(CpuDevice(ARENA), precision, data, graph=_classifier)
    worst, name = worst_update_error((losses, before, after, None), cpu)
    assert worst < TOL[precision], (worst, name)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_an_average_pool_backward_in_the_low_type_takes_no_temporary(gpu_kernels, precision):
    """DenseNet's transitions: the raw average-pool backward reads and writes the low type
    (summing in float), where it took float32 copies of dy and dx outside the plan (4.9 GB for
    DenseNet-121's first transition at the bf16 widest batch); the step is still the CPU
    reference's."""
    from neuron.devices.cuda import kernel_context
    data = _data()
    dev = _cuda_device()
    temps = []
    malloc = dev.allocator.malloc
    dev.allocator.malloc = lambda n, device_id=0: temps.append(kernel_context()[0]) or \
        malloc(n, device_id)
    try:
        run = _run(dev, precision, data, graph=densenet)
    finally:
        dev.close()
    assert not [k for k in temps if "pool" in k], temps
    worst, name = worst_update_error(run, _run(CpuDevice(ARENA), precision, data, graph=densenet))
    assert worst < TOL[precision], (worst, name)
