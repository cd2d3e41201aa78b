"""Compressed swaps through staging blocks (memory/compressed_swap.py): a prefetch holds only
the compressed bytes until the first reader, evicting it then copies nothing, and an eviction
with too little free space for a whole staging block encodes slice by slice. On the CPU device
(real bytes), the virtual one (offsets only) and the late-copy model of the GPU's streams."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from neuron.devices import CpuDevice, VirtualDevice
from neuron.memory.codecs import Bf16, Bfp8
from neuron.memory.pool import Pool, Residency
from neuron.memory.tensors import Kind, TensorRegistry
from stream_model import StreamModelDevice

KiB = 1024
DEVICES = {"cpu": CpuDevice, "virtual": VirtualDevice,
           "late": lambda n: StreamModelDevice(n, polls=10 ** 6)}


def setup(kind, blocks, sizes, codec=Bf16()):
    """A pool of ``blocks`` KiB and float32 activations of ``sizes`` KiB, the first compressed
    and holding random values (x)."""
    reg = TensorRegistry()
    ts = [reg.add(f"t{i}", Kind.ACTIVATION, (s * KiB // 4,), np.float32)
          for i, s in enumerate(sizes)]
    p = Pool(DEVICES[kind](blocks * KiB), block=KiB, evict=True)
    p.codecs = {ts[0].id: codec}
    x = np.random.default_rng(0).standard_normal(ts[0].shape).astype(np.float32)
    v = p.alloc(ts[0])
    if v is not None:
        v[...] = x
    return p, ts, x


def check_decoded(p, t, x, codec):
    if p.device.computes:
        got = p.view(t)
        assert np.all(np.abs(got - x) <= codec.bound(x)) and not np.array_equal(got, x)


def all_waited(p):
    """Every copy and codec event was waited for, or still fences a free block (its next
    tenant waits for it)."""
    from stream_model import pending
    return all(ev.waited for ev in getattr(p.device, "events", ()) if id(ev) not in pending(p))


@pytest.mark.parametrize("kind", list(DEVICES))
def test_a_compressed_prefetch_holds_its_compressed_bytes_only_until_its_reader(kind):
    p, (t0,), x = setup(kind, 40, [16])
    p.offload(t0)                                   # 8 KiB on the host
    assert p.used_bytes == 0 and p.offload_bytes == 8 * KiB
    assert p.prefetch(t0) and p.state(t0) is Residency.PREFETCHING
    assert p.used_bytes == 8 * KiB                  # the staging block, not 16 + 8 KiB
    assert p.prefetch(t0) and p.used_bytes == 8 * KiB   # on its way already
    p.lock([t0.id])
    p.ensure_all([t0], SimpleNamespace(name="B9:conv"))     # its reader: decoded now
    assert p.state(t0) is Residency.DEVICE and p.used_bytes == 16 * KiB
    assert p.hits == 1 and p.misses == 0 and not p.staged
    assert p.prefetch_bytes == 8 * KiB and p.high_water == 24 * KiB     # block + staging
    check_decoded(p, t0, x, Bf16())
    p.device.synchronize()
    p._reap()
    assert p.host_pool.in_use_bytes == 0 and all_waited(p)


@pytest.mark.parametrize("kind", list(DEVICES))
def test_evicting_a_staged_tensor_copies_nothing_and_it_comes_back(kind):
    p, (t0, t1, t2), x = setup(kind, 40, [16, 16, 16])
    p.alloc(t1)
    p.offload(t0)
    assert p.prefetch(t0)                           # 8 KiB staged where t0 was
    p.lock([t1.id, t2.id])
    p.alloc(t2)                                     # 16 KiB: only t0's staging can go
    assert p.state(t0) is Residency.HOST and not p.staged
    assert p.offload_bytes == 8 * KiB and p.offload_count == 1      # no second copy out
    assert p.host_pool.in_use_bytes == 8 * KiB      # the host kept its bytes
    p.unlock([t1.id, t2.id])
    p.free(t2)
    p.lock([t0.id])
    p.ensure(t0)                                    # a miss now
    assert p.misses == 1 and p.prefetch_bytes == 16 * KiB
    check_decoded(p, t0, x, Bf16())
    p.free(t0)
    p.free(t1)
    p.device.synchronize()
    p._reap()
    assert p.used_bytes == 0 and p.host_pool.in_use_bytes == 0 and all_waited(p)


@pytest.mark.parametrize("kind", list(DEVICES))
def test_freeing_a_staged_tensor_frees_its_staging_block_and_host_buffer(kind):
    p, (t0,), _ = setup(kind, 40, [16])
    p.offload(t0)
    assert p.prefetch(t0)
    p.free(t0)
    p.device.synchronize()
    p._reap()
    assert p.used_bytes == 0 and not p.staged and not p.host and not p.reading
    assert p.host_pool.in_use_bytes == 0 and all_waited(p)


@pytest.mark.parametrize("codec", [Bf16(), Bfp8()], ids=["bf16", "bfp8"])
@pytest.mark.parametrize("kind", list(DEVICES))
def test_an_eviction_with_room_for_part_of_its_staging_block_encodes_in_slices(kind, codec):
    """t0 (16 KiB) is evicted with 3 KiB free: bf16 needs 8 KiB to stage (3 slices), bfp8
    4.1 KiB (2 slices, each two pieces: exponents and values). The host gets exactly the
    bytes of a whole encode."""
    p, (t0, t1, t2), x = setup(kind, 35, [16, 16, 16], codec)
    p.alloc(t1)
    p.lock([t1.id, t2.id])
    p.alloc(t2)                                     # evicts t0
    n = codec.nbytes(t0.shape[0])
    assert p.state(t0) is Residency.HOST and not p.uncompressed
    assert p.offload_bytes == n and p.host_pool.in_use_bytes == -(-n // 4096) * 4096
    assert p.high_water == 35 * KiB                 # t0, t1 and a 3 KiB staging block
    if p.device.computes:
        p.device.synchronize()                      # the host may read the buffer now
        np.testing.assert_array_equal(p.host[t0.id][1][:n], codec.encode(x))
    p.unlock([t1.id, t2.id])
    p.free(t1)
    p.lock([t0.id])
    p.ensure(t0)
    check_decoded(p, t0, x, codec)
    assert all_waited(p)


def test_an_eviction_with_too_little_room_for_slices_goes_uncompressed():
    p, (t0, t1, t2), x = setup("cpu", 33, [16, 16, 16])     # 1 KiB free: 8 slices of bf16
    p.alloc(t1)
    p.lock([t1.id, t2.id])
    p.alloc(t2)
    assert t0.id in p.uncompressed and p.offload_bytes == 16 * KiB
