"""GPU: the fused BatchNorm + ReLU kernels (neuron.kernels.cuda.bnrelu_*) against the unfused
cuDNN pair (cudnnBatchNormalization* + the ReLU activation), and a fused ResNet step against
the CPU. Skipped (conftest.py) where CuPy or a GPU is missing.

The fused kernels sum per-thread strided partials in float and the partials in double; cuDNN
sums in its own order: float32 rounding apart, hence the tolerances."""
from __future__ import annotations

import numpy as np
import pytest
from gpu_steps import assert_cuda_trains_like_cpu, steps_on_cpu_and_cuda

from neuron.kernels import cuda as K

pytestmark = pytest.mark.gpu

F32 = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _case(cp, shape, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    host = dict(x=(rng.standard_normal(shape) * 2 + 0.5).astype(np.float32),
                dy=rng.standard_normal(shape).astype(np.float32),
                gamma=(1 + 0.3 * rng.standard_normal(c)).astype(np.float32),
                beta=(0.2 * rng.standard_normal(c)).astype(np.float32))
    return {k: cp.asarray(v) for k, v in host.items()}


def _stats(cp, c):
    return [cp.zeros(c, cp.float32), cp.ones(c, cp.float32), cp.empty(c, cp.float32),
            cp.empty(c, cp.float32)]


@pytest.mark.parametrize("shape", [(8, 64, 56, 56), (32, 256, 14, 14), (64, 512, 7, 7),
                                   (5, 3, 9, 11), (16, 10)])
def test_fused_kernels_match_the_cudnn_pair(cp, shape):
    a = _case(cp, shape)
    c = shape[1]
    # unfused: cuDNN BatchNorm, then cuDNN ReLU forward and backward, then BN backward
    z, y, dz, dx = (cp.empty_like(a["x"]) for _ in range(4))
    rm, rv, sm, si = _stats(cp, c)
    K.batchnorm_forward_train(a["x"], a["gamma"], a["beta"], z, rm, rv, sm, si, 0.1, 1e-5, True)
    K.relu_forward(z, y)
    K.relu_backward(y, a["dy"], dz)
    dg, db = cp.empty(c, cp.float32), cp.empty(c, cp.float32)
    K.batchnorm_backward(a["x"], dz, a["gamma"], sm, si, dx, dg, db, eps=1e-5)
    # fused
    fy, fdx = cp.empty_like(a["x"]), cp.empty_like(a["x"])
    frm, frv, fsm, fsi = _stats(cp, c)
    K.bnrelu_forward_train(a["x"], a["gamma"], a["beta"], fy, frm, frv, fsm, fsi, 0.1, 1e-5,
                           True)
    fdg, fdb = cp.empty(c, cp.float32), cp.empty(c, cp.float32)
    K.bnrelu_backward(a["x"], a["dy"], a["gamma"], a["beta"], fsm, fsi, fdx, fdg, fdb, 1e-5)
    cp.cuda.Device().synchronize()
    for name, want, got in (("y", y, fy), ("running_mean", rm, frm), ("running_var", rv, frv),
                            ("save_mean", sm, fsm), ("save_invstd", si, fsi), ("dx", dx, fdx),
                            ("dgamma", dg, fdg), ("dbeta", db, fdb)):
        np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(want), err_msg=name, **F32)
    # the mask the fused backward recomputed is the forward's
    mask = cp.empty_like(a["x"])
    K.bnrelu_relu_grad(a["x"], cp.ones_like(a["dy"]), a["gamma"], a["beta"], fsm, fsi, mask)
    assert bool(((mask != 0) == (fy > 0)).all())


def test_fused_resnet_step_matches_the_cpu(cp):
    from neuron.models import build_model
    graph = build_model("resnet_cifar", depth=8)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], 8)

    def seven_pairs(ex):
        assert len(ex.fused) == 7          # 4 BatchNorm+ReLU, 3 Add+ReLU
    assert_cuda_trains_like_cpu(steps_on_cpu_and_cuda(graph, x, y, fuse=True,
                                                      check=seven_pairs))
