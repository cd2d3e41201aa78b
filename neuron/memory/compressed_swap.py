"""COMPRESS (FreeLunch, seed 002): a feature map kept for backward goes to the host compressed
at a fixed rate and is decompressed into its arena block before its next use.

The pool calls these instead of its plain offload / bring-back for tensors in
``pool.codecs`` (tensor id -> memory.codecs.Codec). The host buffer holds
``codec.nbytes(elements)`` bytes, so host memory and bytes copied shrink by the rate. The
event log gets ("encode" | "decode", tensor id, bytes the codec touches) beside the copy, and
the simulated clock (memory/clock.py) times them on a codec stream.

The copies are synchronous on every device: on the GPU the codec runs in CuPy on a
temporary array outside the arena (GPU-unverified; FreeLunch's in-arena workspace and its own
codec stream are not built).
"""
from __future__ import annotations

import numpy as np


def _to_host(device, encoded, buf) -> None:
    if isinstance(encoded, np.ndarray):
        buf[:encoded.size] = encoded
    else:                               # a CuPy array: the device's codec output
        encoded.get(out=buf[:encoded.size])


def _from_host(view, buf, n):
    if isinstance(view, np.ndarray):
        return buf[:n]
    import cupy
    return cupy.asarray(buf[:n])


def offload_compressed(pool, t, codec) -> None:
    """As Pool.offload, storing codec.encode(tensor) on the host."""
    if pool.inflight:
        pool._settle(t)
    n = codec.nbytes(int(np.prod(t.shape)))
    buf = pool.host_pool.get(n)
    off = pool.offset.pop(t.id)
    if pool.device.computes:
        if pool.async_copies:
            pool.device.synchronize()   # the producer's kernel has finished writing it
        _to_host(pool.device, codec.encode(pool.device.view(off, t.shape, t.dtype)), buf)
    pool._account_tensor(t, -1)
    pool._h.free(off)
    del pool.live[t.id]
    pool.lru.pop(t.id, None)
    pool.pinned.discard(t.id)
    pool.host[t.id] = (t, buf)
    pool.offload_bytes += n
    pool.offload_count += 1
    if pool.log is not None:
        pool.log.append(("encode", t.id, t.nbytes + n))
        pool.log.append(("offload", t.id, n))


def bring_back_compressed(pool, t, step, ahead: bool, codec) -> None:
    """As Pool._bring_back, decoding the host bytes into the tensor's new arena block."""
    _, buf = pool.host[t.id]
    n = codec.nbytes(int(np.prod(t.shape)))
    off = pool._take(t.nbytes or 1, t, step)
    del pool.host[t.id]
    pool.offset[t.id] = off
    pool.live[t.id] = t
    pool.lru[t.id] = t
    pool._account_tensor(t, 1)
    if pool.device.computes:
        view = pool.device.view(off, t.shape, t.dtype)
        codec.decode(_from_host(view, buf, n), view)
    pool.host_pool.put(buf)
    pool.prefetch_bytes += n
    pool.prefetch_count += 1
    if pool.log is not None:
        pool.log.append(("prefetch" if ahead else "fetch", t.id, n))
        pool.log.append(("decode", t.id, t.nbytes + n))
