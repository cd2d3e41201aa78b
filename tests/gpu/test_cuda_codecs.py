"""The FreeLunch codecs on the GPU (issue 13): the fused kernels give the NumPy codecs' bytes
exactly, take no CuPy temporary, run on the device's codec stream, and a compressed plan trains
on the GPU as planned. Skipped without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.devices.cuda import CudaDevice
from neuron.executor import Executor
from neuron.memory.codecs import Bf16, Bfp8
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
