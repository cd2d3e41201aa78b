"""A miss whose block, or whose staging block, is made by evicting a compressed tensor: the copy
into it waits for that tensor's encode, which still reads the block (on the stream log of
CudaDevice over the CUDA stand-ins, cuda_standins/stream_check.py).

The eviction claims its own staging block as a copy tenant inside the miss's allocation
(FencedHeap.take_as_copy, nested). It used to clear the flag on the way out, so the miss's
block was claimed for compute and its copy waited for the stale claim of the inner staging
block: on the GPU the copy could land before the encode read the block, and the encode then
compressed someone else's bytes (compressed bytes read as float32: inf and NaN in backward,
superneurons:compress=4 on ResNet-50, H200, 2026-11-27). The stand-ins run every operation
when it is issued, so only the ordering shows it."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.memory.codecs import Bfp8
from neuron.memory.tensors import Kind, TensorRegistry

KiB = 1024


def _log_codec(dev, S):
    """Each encode or decode is logged as one kernel on the codec stream over both arrays."""
    on_codec = dev._on_codec_stream

    def logged(fn, src, dst, after, fence=None):
        def run(a, b):
            fn(a, b)
            S.launch("codec", [(v.data.ptr, v.data.ptr + v.nbytes) for v in (a, b)])
        return on_codec(run, src, dst, after, fence)
    dev._on_codec_stream = logged


@pytest.mark.parametrize("miss", ["plain", "compressed"])
def test_a_copy_into_a_block_a_compressed_eviction_frees_waits_for_its_encode(
        gpu_kernels, cuda_standins, miss):
    """t0 (compressed) is the only tensor the miss of t1 can evict. Plain: t1's block is t0's.
    Compressed (t1 twice t0's size): t1's block fits in free space, its staging block does not,
    and comes from t0's."""
    from cuda_standins.runtime import _Stream
    from cuda_standins.stream_check import check
    from neuron.devices.cuda import CudaDevice
    from neuron.memory.pool import Pool
    S = cuda_standins
    S.log_streams()
    reg = TensorRegistry()
    t1_elems = KiB if miss == "plain" else 2 * KiB
    t0 = reg.add("t0", Kind.ACTIVATION, (KiB,), np.float32)
    t1 = reg.add("t1", Kind.ACTIVATION, (t1_elems,), np.float32)
    t2 = reg.add("t2", Kind.ACTIVATION, (KiB,), np.float32)
    codec = Bfp8()
    staging0 = -(-codec.nbytes(KiB) // KiB) * KiB
    # t0, t2, then free space for t0's staging block and (compressed) t1's block
    arena = t0.nbytes + t2.nbytes + staging0 + (t1.nbytes if miss == "compressed" else 0)
    dev = CudaDevice(arena, scratch_bytes=0, headroom_bytes=0)
    try:
        _log_codec(dev, S)
        p = Pool(dev, block=KiB, evict=True)
        p.codecs = {t0.id: codec} | ({t1.id: codec} if miss == "compressed" else {})
        p.alloc(t1)[...] = 1
        p.offload(t1)
        p.alloc(t0)[...] = 2
        p.alloc(t2)
        p.lock([t1.id, t2.id])
        p.ensure_all([t1])
        assert t0.id in p.host and t1.id in p.live and not p.uncompressed
        rep = check(_Stream.issued, dev.compute_stream, p.fences.step_events)
        assert rep.copies >= 3
        assert not rep.races, [(a[0].ops[a[1]][:2], b[0].ops[b[1]][0]) for a, b in rep.races]
        dev.synchronize()
        np.testing.assert_array_equal(np.asarray(p.view(t1)), 1)
    finally:
        dev.close()
