"""The fused BatchNorm + ReLU kernels of the GPU module (cuda.bnrelu_*, cuda_raw._k_bnrelu) on
the CPU: their CUDA source compiled by g++ through the CuPy stand-in (cuda_standins/), checked
against the unfused NumPy pair, and a fused network trained through them like numpy_ref.

The GPU kernels sum in another order than NumPy (per-thread strided partial sums, then the
partials in double), so they agree to float32 rounding, not to the bit."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.devices import CpuDevice
from neuron.kernels import numpy_ref as ref

from test_cuda_on_standins import CudaKernelsOnCpu, _same, train
from test_cuda_on_standins import rerun_graphs  # noqa: F401 (a fixture, requested by name)


def _dev(a):
    from cuda_standins import DevArray
    return np.ascontiguousarray(a).view(DevArray)


def _case(shape, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    gamma = (1 + 0.3 * rng.standard_normal(c)).astype(dtype)
    beta = (0.2 * rng.standard_normal(c)).astype(dtype)
    return x, dy, gamma, beta


def _unfused(x, dy, gamma, beta, momentum=0.1, eps=1e-5):
    c = x.shape[1]
    z, y, dz, dx = (np.empty_like(x) for _ in range(4))
    rm, rv, sm, si = np.zeros(c, x.dtype), np.ones(c, x.dtype), np.empty(c, x.dtype), \
        np.empty(c, x.dtype)
    ref.batchnorm_forward_train(x, gamma, beta, z, rm, rv, sm, si, momentum, eps, True)
    ref.relu_forward(z, y)
    ref.relu_backward(y, dy, dz)
    dg, db = np.empty(c, x.dtype), np.empty(c, x.dtype)
    ref.batchnorm_backward(x, dz, gamma, sm, si, dx, dg, db, eps)
    return dict(y=y, rm=rm, rv=rv, sm=sm, si=si, dx=dx, dg=dg, db=db)


@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (2, 5, 1, 1), (6, 4), (3, 2, 33, 17)])
def test_fused_kernels_match_the_unfused_pair(gpu_kernels, shape):
    cuda = gpu_kernels
    x, dy, gamma, beta = _case(shape)
    want = _unfused(x, dy, gamma, beta)
    c = shape[1]
    y, dx = _dev(np.full(shape, np.nan, np.float32)), _dev(np.full(shape, np.nan, np.float32))
    rm, rv = _dev(np.zeros(c, np.float32)), _dev(np.ones(c, np.float32))
    sm, si = _dev(np.empty(c, np.float32)), _dev(np.empty(c, np.float32))
    dg, db = _dev(np.empty(c, np.float32)), _dev(np.empty(c, np.float32))
    cuda.bnrelu_forward_train(_dev(x), _dev(gamma), _dev(beta), y, rm, rv, sm, si, 0.1, 1e-5,
                              True)
    cuda.bnrelu_backward(_dev(x), _dev(dy), _dev(gamma), _dev(beta), sm, si, dx, dg, db, 1e-5)
    for name, got in dict(y=y, rm=rm, rv=rv, sm=sm, si=si, dx=dx, dg=dg, db=db).items():
        np.testing.assert_allclose(got, want[name], rtol=2e-5, atol=2e-5, err_msg=name)
    # accumulate adds; no running update leaves the running statistics alone
    before = np.array(dx)
    cuda.bnrelu_backward(_dev(x), _dev(dy), _dev(gamma), _dev(beta), sm, si, dx, dg, db, 1e-5,
                         accumulate=True)
    np.testing.assert_allclose(dx, 2 * before, rtol=1e-6, atol=1e-7)
    rm0 = np.array(rm)
    cuda.bnrelu_forward_train(_dev(x), _dev(gamma), _dev(beta), y, rm, rv, sm, si, 0.1, 1e-5,
                              False)
    assert np.array_equal(rm, rm0)


def test_the_mask_is_recomputed_from_x_exactly(gpu_kernels):
    """Backward's dz (the mask kernel) is zero exactly where the forward's y is zero."""
    cuda = gpu_kernels
    x, dy, gamma, beta = _case((4, 3, 6, 6), seed=2)
    c = 3
    y = _dev(np.empty_like(x))
    sm, si = _dev(np.empty(c, np.float32)), _dev(np.empty(c, np.float32))
    cuda.bnrelu_forward_train(_dev(x), _dev(gamma), _dev(beta), y, None, None, sm, si, 0.1,
                              1e-5, False)
    dz = _dev(np.empty_like(x))
    cuda.bnrelu_relu_grad(_dev(x), _dev(np.ones_like(dy)), _dev(gamma), _dev(beta), sm, si, dz)
    assert np.array_equal(np.asarray(dz) != 0, np.asarray(y) > 0)
    assert 0 < (np.asarray(y) > 0).mean() < 1


def test_partials_are_bounded():
    from neuron.kernels.cuda import bnrelu_partials
    from neuron.kernels.cuda_raw import BNRELU_MAX_PARTIALS, bnrelu_workspace_bytes
    assert bnrelu_partials(10, 4) == 32                     # the least: one warp per channel
    assert bnrelu_partials(64 * 112 * 112, 64) == 4096      # ResNet-50's stem at batch 64
    assert bnrelu_partials(64 * 49, 2048) == 128            # 24 values per thread
    for m, c in ((1 << 30, 4096), (1 << 20, 64), (100, 3)):
        p = bnrelu_partials(m, c)
        assert p % 32 == 0 and c * p <= max(BNRELU_MAX_PARTIALS, 32 * c)
        assert bnrelu_workspace_bytes(m, c, 2) < 10 << 20


@pytest.mark.parametrize("graph", ["resnet_cifar8", "densenet_cifar10"])
def test_a_fused_network_trains_on_the_gpu_module_like_numpy_ref(gpu_kernels, graph):
    arena = 64 << 20
    gpu = train(graph, CudaKernelsOnCpu(arena), fuse=True)
    assert gpu[2].fused
    _same(gpu, train(graph, CpuDevice(arena), fuse=True))
    _same(gpu, train(graph, CpuDevice(arena)))          # and like the unfused network


@pytest.mark.parametrize("graph", ["resnet_cifar8", "densenet_cifar10"])
def test_a_fused_network_at_nhwc_trains_like_the_unfused_one(gpu_kernels, graph):
    """--fuse with --layout nhwc: the kernels read channels-last maps as rows of channels."""
    gpu = train(graph, CudaKernelsOnCpu(64 << 20), fuse=True, layout="nhwc")
    assert gpu[2].fused and gpu[2].layout == "nhwc"
    _same(gpu, train(graph, CpuDevice(64 << 20)))


def test_fused_with_chunks_and_recomputation_on_the_gpu_module(gpu_kernels):
    for kw in ({"policy": "superneurons"}, {"policy": "superneurons", "chunks": 2}):
        _same(train("resnet_cifar8", CudaKernelsOnCpu(64 << 20), fuse=True, **kw),
              train("resnet_cifar8", CpuDevice(64 << 20), **kw))


#: the fused GPU statistics are summed in another order than NumPy's, so z differs from the
#: CPU's by float32 ulps, and where that straddles a rounding boundary of the 2-byte type the
#: stored value differs by one of its ulps (bf16 2^-8, fp16 2^-11 relative). Measured on
#: resnet_cifar8, one step: worst update error 2.2e-3 (bf16), 1.3e-3 (fp16), loss 2.5e-8 and
#: 3.8e-5 relative. The exact check of the low-type path is the next test.
MIXED_LOSS_RTOL = {"bf16": 1e-4, "fp16": 1e-4}
MIXED_TOL = {"bf16": 1e-2, "fp16": 2e-3}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_fused_mixed_step_on_the_cuda_path_matches_the_cpu_reference(gpu_kernels, precision):
    """2-byte feature maps: the low type's fused kernels (its bits read and written, float32
    arithmetic); the step agrees with the CPU reference (fused) to a few ulps of that type."""
    from test_cuda_mixed_on_standins import _data, _on_cuda, _run, worst_update_error
    data = _data()
    gpu = _on_cuda(precision, data, fuse=True)
    assert gpu[3].fused
    cpu = _run(CpuDevice(64 << 20), precision, data, fuse=True)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=MIXED_LOSS_RTOL[precision])
    worst, name = worst_update_error(gpu, cpu)
    assert worst < MIXED_TOL[precision], (worst, name)


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_the_low_type_path_is_the_float32_kernels_rounded_once(gpu_kernels, low):
    """bnrelu_* on 2-byte x, dy, y, dx (the low type's own kernels, on the bits): exactly the
    float32 kernels on the float32 values of the inputs, each output rounded once."""
    import ml_dtypes  # noqa: F401 (numpy's bfloat16)
    cuda = gpu_kernels
    low = np.dtype(low) if low == "float16" else np.dtype(ml_dtypes.bfloat16)
    x, dy, gamma, beta = _case((4, 3, 5, 6), seed=4)
    xl, dyl = x.astype(low), dy.astype(low)
    x32, dy32 = xl.astype(np.float32), dyl.astype(np.float32)
    c = 3
    outs = {}
    for name, (xa, dya, dt) in {"low": (xl, dyl, low), "f32": (x32, dy32, np.float32)}.items():
        y, dx = _dev(np.zeros(x.shape, dt)), _dev(np.zeros(x.shape, dt))
        sm, si = _dev(np.empty(c, np.float32)), _dev(np.empty(c, np.float32))
        dg, db = _dev(np.empty(c, np.float32)), _dev(np.empty(c, np.float32))
        cuda.bnrelu_forward_train(_dev(xa), _dev(gamma), _dev(beta), y, None, None, sm, si,
                                  0.1, 1e-5, False)
        cuda.bnrelu_backward(_dev(xa), _dev(dya), _dev(gamma), _dev(beta), sm, si, dx, dg, db)
        outs[name] = (np.asarray(y), np.asarray(dx), np.asarray(dg), np.asarray(db))
    (y, dx, dg, db), (y32, dx32, dg32, db32) = outs["low"], outs["f32"]
    assert y.dtype == low and dx.dtype == low
    assert y.tobytes() == y32.astype(low).tobytes()
    assert dx.tobytes() == dx32.astype(low).tobytes()
    assert dg.tobytes() == dg32.tobytes() and db.tobytes() == db32.tobytes()


@pytest.mark.parametrize("kw", [{}, {"policy": "superneurons", "fraction": 0.5}])
def test_the_fused_network_replays_on_cuda_device_bit_identically(gpu_kernels, rerun_graphs, kw):
    """CudaDevice's recorded iteration of a fused network (the fused kernels and their partial
    sums on the tape, and inside a captured graph) gives the bits of running every iteration."""
    from test_cuda_on_standins import _arena_for, replays_bit_identically
    _, arena, kw, _ = _arena_for("resnet_cifar8", kw)
    replays_bit_identically("resnet_cifar8", arena, fuse=True, **kw)


def test_the_partial_sums_live_in_the_planned_workspace(gpu_kernels, monkeypatch):
    """Given the workspace the layer plans (cuda_raw.bnrelu_workspace_bytes), the kernels put
    their partial sums there (no allocation) and compute the same bits as without it."""
    from neuron.kernels import cuda_raw
    cuda = gpu_kernels
    shape = (4, 3, 5, 7)
    x, dy, gamma, beta = _case(shape, seed=6)
    ws_bytes = cuda_raw.bnrelu_workspace_bytes(4 * 35, 3, 4)
    results = []
    for ws in (None, _dev(np.zeros(ws_bytes, np.uint8))):
        y, dx = _dev(np.empty(shape, np.float32)), _dev(np.empty(shape, np.float32))
        sm, si, dg, db = (_dev(np.empty(3, np.float32)) for _ in range(4))
        cuda.bnrelu_forward_train(_dev(x), _dev(gamma), _dev(beta), y, None, None, sm, si, 0.1,
                                  1e-5, False, workspace=ws)
        cuda.bnrelu_backward(_dev(x), _dev(dy), _dev(gamma), _dev(beta), sm, si, dx, dg, db,
                             workspace=ws)
        results.append([np.asarray(a).tobytes() for a in (y, dx, dg, db)])
        if ws is not None:
            assert np.any(np.asarray(ws) != 0)          # the sums were written there
    assert results[0] == results[1]
    p = cuda_raw.bnrelu_partials(140, 3)
    assert ws_bytes == 2 * 3 * p * 4 + 2 * 3 * (p // 32) * 8


def test_inference_uses_the_running_statistics(gpu_kernels):
    cuda = gpu_kernels
    x, _, gamma, beta = _case((3, 4, 5, 5), seed=7)
    rm = np.array([0.1, -0.2, 0.3, 0.0], np.float32)
    rv = np.array([1.5, 0.5, 2.0, 1.0], np.float32)
    want = np.empty_like(x)
    ref.bnrelu_forward_infer(x, gamma, beta, want, rm, rv, 1e-5)
    got = _dev(np.empty_like(x))
    cuda.bnrelu_forward_infer(_dev(x), _dev(gamma), _dev(beta), got, _dev(rm), _dev(rv), 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(np.asarray(got) > 0, want > 0)
