"""COMPRESS (FreeLunch, seed 002): a feature map kept for backward goes to the host compressed
at a fixed rate and is decompressed into its arena block before its next use.

The pool calls these instead of its plain offload / bring-back for tensors in
``pool.codecs`` (tensor id -> memory.codecs.Codec). The host buffer holds
``codec.nbytes(elements)`` bytes, so host memory and bytes copied shrink by the rate.

The compressed bytes pass through a staging block in the arena, a raw region of
``codec.nbytes`` bytes: the codec writes into it and the copy reads from it (or the other way
round), so the codec takes no memory outside the budget and the plan counts it. On the GPU the
codec runs on its own stream (CudaDevice.encode/decode), ordered with events:

- offload: encode after the producer -> copy to the host after the encode. The tensor's
  block is free at once (later compute waits for the encode, a pass over memory, not a copy
  over the link). A planned offload (``defer``) keeps the staging block until the next step
  has run (``release_draining``), as a plain planned offload keeps its whole block, so the
  copy overlaps that step and holds 1/rate of a plain one's bytes; an eviction frees it at
  once and later compute waits for the copy. The staging block comes from free space only;
  where there is none, the tensor goes to the host uncompressed (``pool.uncompressed``, its
  codec back when it returns or is freed);
- bring-back: copy into the staging block -> decode into the tensor's block. A prefetch keeps
  the staging block until the tensor's first reader (its kernel waits for the decode); a miss
  frees it at once and compute waits for the decode. A prefetch with no room for the staging
  block is not made; a miss with none decodes on the host and copies the whole tensor.

These lifetimes are the same on every device, so the simulated peak is the run's. The event
log gets ("encode" | "decode", tensor id, bytes the codec touches) beside the copy, and the
simulated clock (memory/clock.py) times them on a codec stream.
"""
from __future__ import annotations

import numpy as np

from ..errors import MemoryBudgetError


def _staging(pool, n: int, t, step) -> tuple[int, object]:
    what = f"{t.name}:compressed"
    try:
        off = pool.alloc_bytes(n, what, step)
    except MemoryBudgetError as e:
        # marked, so that an offload or a prefetch that needed it can do without (errors of
        # anything else pass through)
        e.staging = e.tensor == what
        raise
    view = pool.device.view(off, (n,), np.uint8) if pool.device.computes else None
    return off, view


def offload_compressed(pool, t, codec, defer: bool = False) -> None:
    """As Pool.offload, storing codec.encode(tensor) on the host."""
    if pool.inflight or pool.staged:
        pool._settle(t)
    if pool.collectives:
        pool._settle_collective(t.id)
    n = codec.nbytes(int(np.prod(t.shape)))
    # the staging block from free space only: evicting others to compress this one could
    # cascade. Where there is none, t goes to the host as it is (bring-back knows).
    saved, pool.evict_enabled = pool.evict_enabled, False
    try:
        st_off, staging = _staging(pool, n, t, None)
    except MemoryBudgetError as e:
        if not e.staging:
            raise
        pool.uncompressed[t.id] = pool.codecs.pop(t.id)
        return pool.offload(t, defer)
    finally:
        pool.evict_enabled = saved
    buf = pool.host_pool.get(n)
    off = pool.offset.pop(t.id)
    dev = pool.device
    encoded = copied = None
    if dev.computes:
        encoded = dev.encode(codec, dev.view(off, t.shape, t.dtype), staging)
        if pool.async_copies:
            copied = dev.offload(staging, buf[:n], after=encoded)
        else:
            dev.copy_to_host(staging, buf, n)
    if defer:   # t's block is free once encoded; the staging block is kept for the copy
        if encoded is not None:
            dev.compute_wait(encoded)
        pool.draining.append((t, st_off, copied, True))
    else:
        if copied is not None:          # later kernels may overwrite either block
            dev.compute_wait(copied)
        pool.free_bytes(st_off)
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
        pool.log.append(("offload_async" if defer else "offload", t.id, n))


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
    try:
        st_off, staging = _staging(pool, n, t, step)
    except MemoryBudgetError as e:
        if not ahead and e.staging:     # a miss must not fail where a plain one would not
            return _decode_on_host(pool, t, off, buf, n, codec)
        pool.free(t)                    # a prefetch: as it was, and the caller gives up
        pool.host[t.id] = (t, buf)
        raise
    dev = pool.device
    if dev.computes:
        view = dev.view(off, t.shape, t.dtype)
        if pool.async_copies:
            copied = dev.prefetch(buf[:n], staging, compute_waits=False)
            decoded = dev.decode(codec, staging, view, after=copied)
            pool.deferred.append((copied, buf))         # reused once its copy is done
            if ahead:                                   # the reader's kernel waits
                pool.inflight[t.id] = decoded
            else:
                dev.compute_wait(decoded)
        else:
            dev.copy_to_device(buf, staging, n)
            dev.decode(codec, staging, view)
            pool.host_pool.put(buf)
    else:
        pool.host_pool.put(buf)
    if ahead:                           # kept until the tensor's first reader
        pool.staged[t.id] = st_off
    else:
        pool.free_bytes(st_off)
    pool.prefetch_bytes += n
    pool.prefetch_count += 1
    if pool.log is not None:
        pool.log.append(("prefetch" if ahead else "fetch", t.id, n))
        pool.log.append(("decode", t.id, t.nbytes + n))


def _decode_on_host(pool, t, off, buf, n, codec) -> None:
    """A miss with no room for a staging block: decode on the host (NumPy) and copy the whole
    tensor into its block, as an uncompressed bring-back does."""
    dev = pool.device
    if dev.computes:
        # the copy that filled buf may still be running: its eviction made only compute wait
        # for it, and the host reads buf now (the rare path: a whole-tensor copy follows anyway)
        dev.synchronize()
        full = np.empty(t.shape, t.dtype)
        codec.decode(buf[:n], full)
        dev.copy_to_device(full.reshape(-1).view(np.uint8), dev.view(off, t.shape, t.dtype),
                           t.nbytes)
    pool.host_pool.put(buf)
    pool.prefetch_bytes += t.nbytes
    pool.prefetch_count += 1
    if pool.log is not None:
        pool.log.append(("fetch", t.id, t.nbytes))
