"""A convolution step's workspace leaves its algorithm the bytes it was chosen for, on the GPU
code path run on the CPU stand-ins with a stand-in cuDNN whose algorithms need workspace as the
H200's do.

What failed on the H200 (2026-11-27, tests/gpu/test_cuda_mixed.py and test_cuda_layout.py,
deterministic kernels at bf16/fp16): the executor asked for the deterministic backward-filter
algorithm's workspace, the mixed-precision backward carved the low-type weight-gradient
buffer from the front of it (kernels/low_grad_buffers.py), and no deterministic algorithm fit
what was left ("no deterministic cuDNN algorithm fits a workspace of 4128 bytes", ALGO_1 needing
8224). The stand-in's only deterministic backward-filter algorithm needs workspace and its
zero-workspace one is not deterministic (ALGO_0, as in cuDNN), so the step fails unless the
request holds both the buffers and the algorithm's bytes."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.executor import Executor
from neuron.kernels import cudnn, numpy_ref
from neuron.models import build_model

ARENA = 64 << 20
BATCH = 4


def _ceiling(xd, wd, cd):
    return numpy_ref.conv2d_workspace_bytes(xd.shape, wd.shape, cd.stride, cd.padding,
                                            cd.dilation, cd.groups, np.dtype(xd.dtype).itemsize)


@pytest.fixture
def hungry_cudnn(cuda_standins, monkeypatch):
    """cuDNN's backward-filter heuristics as the H200 listed them for bf16: ALGO_1
    (deterministic) needing workspace (``over`` bytes past the planned im2col ceiling: 32 on
    the H200 for a strided 1x1; a negative ``over`` is below it), ALGO_0 (none, not
    deterministic). Each backward-filter call asserts that it got its algorithm's bytes."""
    from neuron.kernels import cuda as K
    dnn = K.dnn
    needs = {}
    state = {"over": 32, "calls": 0}

    def get_algorithms(h, kind, xd, wd, cd, yd):
        if kind != "bwd_filter":
            return dnn._perf(-1.0)
        need = max(0, _ceiling(xd, wd, cd) + state["over"])
        needs[(tuple(xd.shape), tuple(wd.shape))] = need
        return [cudnn.AlgoPerf(1, cudnn.CUDNN_STATUS_SUCCESS, -1.0, need,
                               cudnn.CUDNN_DETERMINISTIC, cudnn.CUDNN_TENSOR_OP_MATH),
                cudnn.AlgoPerf(0, cudnn.CUDNN_STATUS_SUCCESS, -1.0, 0,
                               cudnn.CUDNN_NON_DETERMINISTIC, cudnn.CUDNN_TENSOR_OP_MATH)]

    real = type(dnn).convolution_backward_filter

    def backward_filter(self, h, xd, x, dyd, dy, cd, algo, ws, ws_bytes, wd, dw, **kw):
        if algo == 1:
            need = needs[(tuple(xd.shape), tuple(wd.shape))]
            assert ws_bytes >= need, f"ALGO_1 needs {need} bytes, was handed {ws_bytes}"
            state["calls"] += 1
        return real(self, h, xd, x, dyd, dy, cd, algo, ws, ws_bytes, wd, dw, **kw)
    monkeypatch.setattr(dnn, "get_algorithms", get_algorithms)
    monkeypatch.setattr(type(dnn), "convolution_backward_filter", backward_filter)
    monkeypatch.setattr(K, "deterministic", True)
    K.clear_conv_algo_cache()
    yield state
    K.clear_conv_algo_cache()


def _step(precision, layout="nchw", model="resnet_cifar", depth=8):
    from neuron.devices.cuda import CudaDevice
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    dev = CudaDevice(ARENA, headroom_bytes=0)
    try:
        ex = Executor(build_model(model, depth=depth, in_shape=(3, 16, 16)), BATCH, device=dev,
                      seed=1, precision=precision, layout=layout, replay="off",
                      optimizer=nn.SGD(lr=0.05, momentum=0.9))
        return ex.train_step(x, y)
    finally:
        dev.close()


@pytest.mark.parametrize("over", [32, -64], ids=["past_the_ceiling", "under_it"])
@pytest.mark.parametrize("precision,layout,model,depth", [
    ("bf16", "nchw", "resnet_cifar", 8), ("fp16", "nchw", "resnet_cifar", 8),
    ("bf16", "nhwc", "densenet_cifar", 10)])
def test_a_deterministic_mixed_backward_gets_its_algorithms_workspace(
        gpu_kernels, hungry_cudnn, precision, layout, model, depth, over):
    pytest.importorskip("ml_dtypes")
    hungry_cudnn["over"] = over
    assert np.isfinite(_step(precision, layout, model, depth))
    assert hungry_cudnn["calls"] > 0        # the deterministic algorithm ran, every time fed


def test_the_request_holds_the_gradient_buffers_and_the_algorithm(gpu_kernels, hungry_cudnn):
    """The H200's geometry: x[8, 32, 8, 8], w[64, 32, 1, 1], stride 2 at bf16. The stand-in's
    ALGO_1 needs the ceiling + 32 bytes; the weight-gradient buffer is 64*32*2 = 4096 bytes
    (a bias's 64*2 rounds up to 256); the request is their sum whatever is free, the plan's
    backward workspace the ceiling and the buffer."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from neuron.kernels import cuda as K
    bf16 = np.dtype(ml_dtypes.bfloat16)
    args = ((8, 32, 8, 8), (64, 32, 1, 1), 2, 0, 1, 1, bf16)
    ceiling = numpy_ref.conv2d_workspace_bytes(*args[:6], 2)
    for free in (0, 4128, 1 << 20):
        assert K.conv2d_workspace_request("B", *args, free) == ceiling + 32 + 4096
        assert K.conv2d_workspace_request("B", *args, free, bias=True) == \
            ceiling + 32 + 4096 + 256
        assert K.conv2d_workspace_request("F", *args, free) == 0     # the stand-in's forward
    # float32 features: no buffers (the gradients are the masters')
    ceiling32 = numpy_ref.conv2d_workspace_bytes(*args[:6], 4)
    assert K.conv2d_workspace_request("B", *args[:6], np.float32, 0) == ceiling32 + 32
    conv = nn.Conv2d(64, 1, stride=2, bias=False)
    conv(nn.Input((32, 8, 8)))
    assert conv.workspace_bytes("B", 8, 2) == ceiling + 4096
    assert conv.workspace_bytes("F", 8, 2) == ceiling
    assert conv.workspace_bytes("B", 8, 4) == ceiling32
