"""accumulate=True on the GPU kernels (cuDNN beta = 1, or a CuPy add) against the NumPy
reference: dx ends as its old contents plus the kernel's gradient."""
from __future__ import annotations

import numpy as np
import pytest
from gpu_steps import assert_cuda_trains_like_cpu, steps_on_cpu_and_cuda

from neuron.kernels import numpy_ref as R

pytestmark = pytest.mark.gpu

F32 = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def K():
    from neuron.kernels import cuda
    return cuda


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _check(cp, shape, run_ref, run_gpu):
    rng = np.random.default_rng(0)
    start = rng.standard_normal(shape).astype(np.float32)
    ref = start.copy()
    run_ref(ref)
    got = cp.asarray(start)
    run_gpu(got)
    np.testing.assert_allclose(cp.asnumpy(got), ref, **F32)


def test_accumulate_matches_reference(K, cp):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    dyc = rng.standard_normal((2, 6, 8, 8)).astype(np.float32)
    y = np.maximum(x, 0)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    mean = x.mean(axis=(0, 2, 3))
    invstd = (1 / np.sqrt(x.var(axis=(0, 2, 3)) + 1e-5)).astype(np.float32)
    gamma = rng.standard_normal(4).astype(np.float32)
    g = cp.asarray
    wsb = R.conv2d_workspace_bytes(x.shape, w.shape, 1, 1, 1, 1, 4)
    ws_np, ws_cp = np.empty(wsb, np.uint8), cp.empty(max(wsb, 64 << 20), cp.uint8)
    _check(cp, x.shape,
           lambda d: R.conv2d_backward(x, w, dyc, d, None, None, 1, 1, 1, 1, ws_np,
                                       accumulate=True),
           lambda d: K.conv2d_backward(g(x), g(w), g(dyc), d, None, None, 1, 1, 1, 1, ws_cp,
                                       accumulate=True))
    _check(cp, x.shape,
           lambda d: R.batchnorm_backward(x, dy, gamma, mean, invstd, d, None, None,
                                          accumulate=True),
           lambda d: K.batchnorm_backward(g(x), g(dy), g(gamma), g(mean.astype(np.float32)),
                                          g(invstd), d, None, None, accumulate=True))
    _check(cp, x.shape, lambda d: R.relu_backward(y, dy, d, accumulate=True),
           lambda d: K.relu_backward(g(y), g(dy), d, accumulate=True))
    _check(cp, x.shape, lambda d: R.sigmoid_backward(y, dy, d, accumulate=True),
           lambda d: K.sigmoid_backward(g(y), g(dy), d, accumulate=True))
    ym = np.empty((2, 4, 4, 4), np.float32)
    R.maxpool_forward(x, ym, 2, 2, 0)
    dym = rng.standard_normal(ym.shape).astype(np.float32)
    _check(cp, x.shape, lambda d: R.maxpool_backward(x, ym, dym, d, 2, 2, 0, accumulate=True),
           lambda d: K.maxpool_backward(g(x), g(ym), g(dym), d, 2, 2, 0, accumulate=True))
    _check(cp, (2, 2, 8, 8),
           lambda d: R.concat_backward(dyc, [None, d, None], widths=[1, 2, 3], accumulate=(1,)),
           lambda d: K.concat_backward(g(dyc), [None, d, None], widths=[1, 2, 3],
                                       accumulate=(1,)))


def test_chunked_training_step_gpu_matches_cpu(cp):
    """Fan-out gradients accumulated in place and every layer in 2 chunks (BN's two passes,
    dW summed over chunks, the whole batch's dropout mask offset per chunk), GPU vs CPU."""
    from neuron.models import build_model
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    assert_cuda_trains_like_cpu(steps_on_cpu_and_cuda(graph, x, y, chunks=2))
