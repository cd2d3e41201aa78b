"""The FreeLunch codecs on the GPU (issue 13): the fused kernels give the NumPy codecs' bytes
exactly, take no CuPy temporary, run on the device's codec stream, and a compressed plan trains
on the GPU as planned. Skipped without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.devices.cuda import CudaDevice
from neuron.executor import Executor
from neuron.memory.codecs import BLOCK, Bf16, Bfp8
from neuron.models import build_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.mark.parametrize("codec", [Bf16(), Bfp8()], ids=["bf16", "bfp8"])
@pytest.mark.parametrize("n", [1, 31, 33, 4096, 100_003])
def test_kernels_give_the_numpy_bytes(cp, codec_samples, codec, n):
    x = codec_samples(n)
    want = codec.encode(x)
    got = cp.empty(codec.nbytes(n), np.uint8)
    codec.encode_into(cp.asarray(x), got)
    np.testing.assert_array_equal(cp.asnumpy(got), want)
    out_cpu, out_gpu = np.empty_like(x), cp.empty(n, cp.float32)
    codec.decode(want, out_cpu)
    codec.decode(got, out_gpu)
    np.testing.assert_array_equal(cp.asnumpy(out_gpu), out_cpu)


def test_device_codec_runs_on_its_own_stream_without_temporaries(cp, codec_samples):
    dev = CudaDevice(64 << 20)
    try:
        codec, n = Bfp8(), 1 << 16
        src, staging, out = dev.view(0, (n,), np.float32), \
            dev.view(1 << 20, (codec.nbytes(n),), np.uint8), dev.view(2 << 20, (n,), np.float32)
        src.set(codec_samples(n))           # no device temporary: no pool is attached
        calls = []
        malloc = dev.allocator.malloc
        dev.allocator.malloc = lambda *a: calls.append(a) or malloc(*a)
        try:
            enc = dev.encode(codec, src, staging)
            dec = dev.decode(codec, staging, out, after=enc)
        finally:
            dev.allocator.malloc = malloc
        assert dev.codec_stream.ptr not in (dev.compute_stream.ptr, dev.copy_stream.ptr)
        dec.synchronize()
        assert not calls                        # written straight into the arena blocks
        want = np.empty(n, np.float32)
        codec.decode(codec.encode(codec_samples(n)), want)
        np.testing.assert_array_equal(cp.asnumpy(out), want)
    finally:
        dev.close()


@pytest.mark.parametrize("rate", [2, 4])
def test_compressed_training_on_the_gpu_matches_the_cpu_and_the_plan(cp, rate):
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((4, 3, 16, 16)).astype(np.float32),
             rng.integers(0, 10, 4).astype(np.int64)) for _ in range(2)]
    losses = {}
    for device in ("cpu", "cuda"):
        ex = Executor(g, 4, device=device, planner=f"vdnn:compress={rate}", seed=2,
                      optimizer=nn.SGD(lr=0.01, momentum=0.9))
        try:
            losses[device] = [ex.train_step(x, y) for x, y in data]
            pool = ex.pool
            assert pool.codecs and pool.offload_bytes > 0
            assert not pool.staged and not pool.draining
            # tensors exactly as planned (the GPU's workspaces and CuPy temporaries are its own)
            assert pool.tensor_high_water == ex.planned["tensor_peak_bytes"], device
        finally:
            if hasattr(ex.device, "close"):
                ex.device.close()
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-2)


@pytest.mark.parametrize("codec", [Bf16(), Bfp8()], ids=["bf16", "bfp8"])
def test_sliced_evictions_and_staged_prefetches_on_the_codec_and_copy_streams(cp, codec,
                                                                              codec_samples):
    """memory/compressed_swap.py on the GPU (as tests/memory/test_compressed_swap.py on the
    late-copy model): an eviction with 3 KiB free encodes t0 in slices, the host holding the
    bytes of a whole encode; its prefetch stages the compressed bytes, an eviction drops them,
    and the reader's miss decodes the same values as the CPU codec."""
    from neuron.memory.pool import Pool
    from neuron.memory.tensors import Kind, TensorRegistry
    KiB = 1024
    reg = TensorRegistry()
    t0, t1, t2 = (reg.add(f"t{i}", Kind.ACTIVATION, (4 * KiB,), np.float32) for i in range(3))
    x = codec_samples(4 * KiB)
    want = np.empty_like(x)
    codec.decode(codec.encode(x), want)
    dev = CudaDevice(35 * KiB, scratch_bytes=0)
    try:
        p = Pool(dev, block=KiB, evict=True)
        p.codecs = {t0.id: codec}
        p.alloc(t0).set(x)
        p.alloc(t1)
        p.lock([t1.id, t2.id])
        p.alloc(t2)                                 # t0 out in slices through 3 KiB
        n = codec.nbytes(x.size)
        assert not p.uncompressed and p.offload_bytes == n
        dev.synchronize()
        np.testing.assert_array_equal(p.host[t0.id][1][:n], codec.encode(x))
        p.unlock([t1.id, t2.id])
        p.free(t2)
        assert p.prefetch(t0) and t0.id in p.staged
        p.lock([t1.id])
        p.alloc(t2)                                 # drops t0's staged copy
        assert not p.staged and p.offload_bytes == n
        p.free(t1)
        p.lock([t0.id])
        p.ensure_all([t0])
        np.testing.assert_array_equal(cp.asnumpy(p.view(t0)), want)
    finally:
        dev.close()


SPIN = r"""extern "C" __global__ void neuron_test_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}"""


def test_a_miss_into_a_block_a_compressed_eviction_frees_waits_for_its_encode(cp):
    """FencedHeap.take_as_copy (tests/memory/test_nested_copy_claims.py on the stand-ins'
    stream log), made deterministic on a GPU: the codec stream is held ~0.1 s, so t0's encode
    runs late; a miss of t1 evicts t0 and copies into its block. A copy that does not wait for
    the encode lands first and t0's host bytes are the encoding of t1's values."""
    from neuron.memory.pool import Pool
    from neuron.memory.tensors import Kind, TensorRegistry
    KiB = 1024
    reg = TensorRegistry()
    t0, t1, t2 = (reg.add(f"t{i}", Kind.ACTIVATION, (KiB,), np.float32) for i in range(3))
    codec = Bfp8()
    dev = CudaDevice(10 * KiB, scratch_bytes=0)     # t0, t2 and t0's staging block
    try:
        p = Pool(dev, block=KiB, evict=True)
        p.codecs = {t0.id: codec}
        p.alloc(t1).set(np.ones(KiB, np.float32))
        p.offload(t1)
        p.alloc(t0).set(np.full(KiB, 2, np.float32))
        p.alloc(t2)
        p.lock([t1.id, t2.id])
        with dev.codec_stream:
            cp.RawKernel(SPIN, "neuron_test_spin")((1,), (1,), (np.int64(200_000_000),))
        p.ensure_all([t1])                          # t0 out compressed, t1 into its block
        dev.synchronize()
        n = codec.nbytes(KiB)
        np.testing.assert_array_equal(p.host[t0.id][1][:n],
                                      codec.encode(np.full(KiB, 2, np.float32)))
        np.testing.assert_array_equal(cp.asnumpy(p.view(t1)), 1)
    finally:
        dev.close()


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 4096) * 4096


@pytest.mark.parametrize("n", [(1 << 29) + 45])
def test_bfp8_round_trip_at_resnet50_scale_on_the_codec_stream(cp, n):
    """A feature map past 2^31 bytes (the pressure stage's largest, ResNet-50 batch 284, is 0.9
    GB) with a ragged tail: ReLU-like values (half zeros, whole zero blocks), encoded and
    decoded by CudaDevice on its codec stream between arena views: the NumPy codec's bytes and
    values, all finite. About half a minute of host NumPy (the stage's limit allows for it)."""
    codec = Bfp8()
    m = codec.nbytes(n)
    dev = CudaDevice(2 * _aligned(4 * n) + _aligned(m), scratch_bytes=0)
    try:
        src = dev.view(0, (n,), np.float32)
        staging = dev.view(_aligned(4 * n), (m,), np.uint8)
        out = dev.view(_aligned(4 * n) + _aligned(m), (n,), np.float32)
        rng = np.random.default_rng(0)
        x = np.maximum(rng.standard_normal(n, dtype=np.float32), 0)
        x[: 64 * BLOCK] = 0
        src.set(x)
        dec = dev.decode(codec, staging, out, after=dev.encode(codec, src, staging))
        dec.synchronize()
        enc = codec.encode(x)
        np.testing.assert_array_equal(cp.asnumpy(staging), enc)
        got = cp.asnumpy(out)
        assert np.isfinite(got).all()
        want = np.empty_like(x)
        codec.decode(enc, want)
        np.testing.assert_array_equal(got, want)
    finally:
        dev.close()


def test_superneurons_compressed_under_pressure_trains_finite_like_the_cpu(cp):
    """The failing configuration of the pressure stage (superneurons:compress=4, H200,
    2026-11-27: NaN at iteration 0) at a small scale: resnet_cifar 8 at 0.5 of its liveness
    peak, where the tensor cache evicts compressed tensors in slices and stages them back."""
    import sys
    sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/memory/planners")
    from planner_training import resnet8_budget
    graph, batch, budget = resnet8_budget(0.5, size=8, batch=4)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32),
             rng.integers(0, 10, batch).astype(np.int64)) for _ in range(3)]
    losses = {}
    for device in ("cpu", "cuda"):
        ex = Executor(graph, batch, device=device, budget=budget, seed=1,
                      planner="superneurons:compress=4",
                      optimizer=nn.SGD(lr=0.01, momentum=0.9))
        try:
            losses[device] = [ex.train_step(x, y) for x, y in data]
            assert ex.pool.offload_bytes > 0, device
        finally:
            if hasattr(ex.device, "close"):
                ex.device.close()
    assert np.isfinite(losses["cuda"]).all()
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-2)
