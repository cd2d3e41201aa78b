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
  over the link). A planned offload (``defer``) keeps the staging block until its release
  step (``release_draining``), as a plain planned offload keeps its whole block, so the
  copy overlaps compute and holds 1/rate of a plain one's bytes; an eviction frees it at
  once and later compute waits for the copy. The staging block comes from free space only.
  An eviction happens when the arena is full, so free space often holds only part of one:
  then it encodes the tensor slice by slice through the largest staging block free space
  holds, each slice after the last one's copy (``Codec.pieces`` puts the bytes where a whole
  encode would), in at most ``MAX_SLICES``. Where that is not enough (or for a planned
  offload, whose copy must overlap compute), the tensor goes to the host uncompressed
  (``pool.uncompressed``, its codec back when it returns or is freed);
- bring-back: copy into a staging block -> decode into the tensor's block. A prefetch
  (``stage_compressed``) brings the compressed bytes only, into a staging block from free
  space (none: not made); the tensor stays on the host, its host buffer kept, until its first
  reader (``decode_staged``) takes its block and decodes into it (the reader's kernel waits
  for the decode, a pass over memory) and the staging block goes. So a prefetched tensor holds
  1/rate of a plain prefetched one's bytes while it waits for its reader, and an eviction
  meanwhile (``drop_staged``) frees the staging block and copies nothing. (Decoding at once
  held the whole block and the staging block until the reader: more than a plain prefetch,
  which at 0.2 of resnet_cifar 20's peak made compressed superneurons move more bytes than
  plain.) A miss takes its block and a staging block, compute waits for the decode and the
  staging block goes at once; with no room for one it decodes on the host and copies the
  whole tensor.

These lifetimes are the same on every device, so the simulated peak is the run's. The event
log gets ("encode" | "decode", tensor id, bytes the codec touches) beside the copy, and the
simulated clock (memory/clock.py) times them on a codec stream.
"""
from __future__ import annotations

import numpy as np

from ..errors import MemoryBudgetError
from ..recording import unrecordable
from .tensors import KIND_INDEX, Kind

_WS = KIND_INDEX[Kind.WORKSPACE]


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


def _claimed(pool, take):
    """``take()`` (an allocation whose first tenant is a copy or a codec kernel, not compute)
    -> (its result, the fences that tenant waits for: the block's last kernel and the copies
    still reading it; None without fences, where the device waits for all compute)."""
    if pool.fences is None:
        return take(), None
    r, (epoch, events) = pool._h.take_as_copy(take)
    ev = pool.fences.compute_event(epoch)
    return r, ([ev] if ev is not None else []) + list(events)


def _fenced(fence) -> dict:
    """encode/decode's ``fence`` argument where there is one (devices without fences wait for
    all compute, and take none)."""
    return {} if fence is None else {"fence": fence}


def _free_after(pool, off, events, staging: bool, t=None) -> None:
    """Free a block that ``events`` (codec kernels, copies) still read: with fences its next
    tenant waits for them; without, compute waits now."""
    events = [e for e in events if e is not None]
    if pool.fences is None:
        for ev in events:
            pool.device.compute_wait(ev)
        if staging:
            pool.free_bytes(off)
        else:
            pool._h.free(off)
        return
    if staging:                     # only codec kernels and copies touched it, no compute
        pool._account(_WS, -pool._h.size_of(off))
        pool._h.free(off, -1, events)
    else:
        pool._h.free(off, pool.fences.tensor_epoch(t.id), events)


#: an eviction whose staging block free space cannot hold encodes in at most this many slices
#: through a smaller one (each slice waits for the last one's copy: more slices, more latency)
MAX_SLICES = 4


def _slice_elements(pool, codec, num: int) -> int:
    """Elements per slice for an eviction through the largest staging block free space holds;
    0 where that takes more than MAX_SLICES slices."""
    c = pool.heap.largest_free // codec.nbytes(codec.unit) * codec.unit
    return c if c and -(-num // c) <= MAX_SLICES else 0


def offload_compressed(pool, t, codec, defer: bool = False, until: int | None = None) -> None:
    """As Pool.offload, storing codec.encode(tensor) on the host."""
    if pool.inflight:
        pool._settle(t)
    if pool.collectives:
        pool._settle_collective(t.id)
    num = int(np.prod(t.shape))
    n = codec.nbytes(num)
    # the staging block from free space only: evicting others to compress this one could
    # cascade. An eviction (compute waits for its copy anyway) may encode slice by slice
    # through a smaller one; where there is none, t goes to the host as it is.
    saved, pool.evict_enabled = pool.evict_enabled, False
    claim = None
    try:
        c, ((st_off, staging), claim) = num, _claimed(pool, lambda: _staging(pool, n, t, None))
    except MemoryBudgetError as e:
        if not e.staging:
            raise
        c = 0 if defer else _slice_elements(pool, codec, num)
        if c:
            (st_off, staging), claim = _claimed(
                pool, lambda: _staging(pool, codec.nbytes(c), t, None))
    finally:
        pool.evict_enabled = saved
    if not c:
        pool.uncompressed[t.id] = pool.codecs.pop(t.id)
        return pool.offload(t, defer, until)
    buf = pool.host_pool.get(n, home=t.id if t.persistent else None)
    reading = pool.host_pool.pending_read(buf)     # a prefetch from buf may still run
    off = pool.offset.pop(t.id)
    dev = pool.device
    encoded = copied = None
    copies = []
    fence = None
    if pool.fences is not None:     # the producer's kernel and the staging block's last users
        fence = pool.fences.tensor_fence(t.id) + claim
        pre = pool.inflight.pop(t.id, None) if pool.inflight else None
        if pre is not None:
            fence.append(pre)
    flat = dev.view(off, t.shape, t.dtype).reshape(-1) if dev.computes else None
    for lo in range(0, num, c):
        hi = min(num, lo + c)
        m = codec.nbytes(hi - lo)
        if dev.computes:
            # a slice waits for the copies of the last one out of the staging block (the
            # copy stream runs them in order: the last one's event covers them)
            encoded = dev.encode(codec, flat[lo:hi], staging[:m], after=copied, **_fenced(fence))
            for a, b, k in [(0, 0, n)] if c == num else codec.pieces(lo, hi, num):
                if pool.async_copies:
                    copied = dev.offload(staging[a:a + k], buf[b:b + k], after=encoded
                                         if reading is None else [encoded, reading])
                    copies.append(copied)
                else:
                    dev.copy_to_host(staging[a:a + k], buf[b:b + k], k)
        if pool.log is not None:
            pool.log.append(("encode", t.id, (hi - lo) * t.dtype.itemsize + m))
            pool.log.append(("offload_async" if defer else "offload", t.id, m))
    if defer:   # t's block is free once encoded; the staging block is kept for the copy
        pool.draining.append((t, st_off, copied, True, until))
    else:                           # later tenants of either block wait for the copies
        _free_after(pool, st_off, copies, True)
    pool._account_tensor(t, -1)
    _free_after(pool, off, [encoded], False, t)
    if pool.fences is not None:
        pool.fences.filled.pop(t.id, None)
        if copied is not None:
            pool.outbound[t.id] = copied    # a copy back from buf waits for it
    del pool.live[t.id]
    pool.lru.pop(t.id, None)
    pool.pinned.discard(t.id)
    pool.host[t.id] = (t, buf)
    pool.offload_bytes += n
    pool.offload_count += 1


def stage_compressed(pool, t, codec) -> bool:
    """A prefetch of a compressed tensor (Pool.prefetch): its compressed bytes into a staging
    block from free space; False where there is no room. The tensor stays on the host, its
    buffer kept, until its first reader decodes it (``decode_staged``): until then the arena
    holds 1/rate of it, and evicting it (``drop_staged``) frees the staging block and copies
    nothing."""
    n = codec.nbytes(int(np.prod(t.shape)))
    if not pool._h.can_alloc(n):
        return False
    _, buf = pool.host[t.id]
    (st_off, staging), fence = _claimed(pool, lambda: _staging(pool, n, t, None))
    copied = None
    dev = pool.device
    if dev.computes:
        if pool.async_copies:       # after the block's last tenant and the copy that filled buf
            if fence is not None:
                out = pool.outbound.pop(t.id, None)
                fence += [out] if out is not None else []
            copied = dev.prefetch(buf[:n], staging, compute_waits=False, after=fence)
        else:
            dev.copy_to_device(buf, staging, n)
    pool.reading.pop(t.id, None)    # an earlier copy from buf: this one is behind it (FIFO)
    pool.staged[t.id] = (st_off, copied)
    pool.lru[t.id] = t              # evictable, as a prefetched tensor is
    pool.prefetch_bytes += n
    pool.prefetch_count += 1
    if pool.log is not None:
        pool.log.append(("prefetch", t.id, n))
    return True


def decode_staged(pool, t, step, codec) -> None:
    """The first reader of a staged tensor: its block, then the decode from the staging block
    (the reader's kernel waits for it), then the staging block goes. Where the block cannot
    be had even by evicting, the staging block goes first and it is an ordinary miss, so this
    never fails where a plain prefetched tensor (its whole block already held) would not."""
    st_off, copied = pool.staged[t.id]
    pool.lru.pop(t.id, None)
    try:
        off, fence = _claimed(pool, lambda: pool._take(t.nbytes or 1, t, step))
    except MemoryBudgetError:
        drop_staged(pool, t)
        return bring_back_compressed(pool, t, step, codec)
    del pool.staged[t.id]
    n = codec.nbytes(int(np.prod(t.shape)))
    _, buf = pool.host.pop(t.id)
    pool.offset[t.id] = off
    pool.live[t.id] = t
    pool.lru[t.id] = t
    pool._account_tensor(t, 1)
    dev = pool.device
    decoded = None
    if dev.computes:
        staging = dev.view(st_off, (n,), np.uint8)
        view = dev.view(off, t.shape, t.dtype)
        if pool.async_copies:
            # after the copy into the staging block and the new block's last users; the
            # reader and the staging block's next tenant wait for it
            decoded = dev.decode(codec, staging, view, after=copied, **_fenced(fence))
            dev.compute_wait(decoded)
            pool.release_host(t, buf, copied)           # reused once its copy is done
        else:
            dev.decode(codec, staging, view)
            pool.release_host(t, buf)
    else:
        pool.release_host(t, buf)
    if pool.fences is not None:
        pool.fences.last_use[t.id] = -1     # the decode, waited for by compute, filled it
        if decoded is not None:
            pool.fences.filled[t.id] = decoded
        _free_after(pool, st_off, [decoded], True)
    else:
        pool.free_bytes(st_off)
    if pool.log is not None:
        pool.log.append(("decode", t.id, t.nbytes + n))


def drop_staged(pool, t) -> None:
    """Evict (or free) a staged tensor: the host still holds its bytes, so only the staging
    block goes, after the copy into it (its next tenant may overwrite it)."""
    st_off, copied = pool.staged.pop(t.id)
    if copied is not None:
        pool.reading[t.id] = copied     # the copy may still read the host buffer
    _free_after(pool, st_off, [copied], True)     # its next tenant waits for the copy
    pool.lru.pop(t.id, None)
    if pool.log is not None:
        pool.log.append(("drop", t.id, 0))


def bring_back_compressed(pool, t, step, codec) -> None:
    """A miss (Pool._bring_back): the tensor's block, the compressed bytes copied into a
    staging block and decoded into it; compute waits for the decode and the staging block goes
    at once. With no room for a staging block: decoded on the host, the whole tensor copied."""
    _, buf = pool.host[t.id]
    n = codec.nbytes(int(np.prod(t.shape)))
    off, fence = _claimed(pool, lambda: pool._take(t.nbytes or 1, t, step))     # the decode's
    del pool.host[t.id]
    pool.reading.pop(t.id, None)        # the copies below are behind it on the copy stream
    pool.offset[t.id] = off
    pool.live[t.id] = t
    pool.lru[t.id] = t
    pool._account_tensor(t, 1)
    try:
        (st_off, staging), copy_fence = _claimed(pool, lambda: _staging(pool, n, t, step))
    except MemoryBudgetError as e:
        if e.staging:                   # a miss must not fail where a plain one would not
            return _decode_on_host(pool, t, off, buf, n, codec)
        raise
    dev = pool.device
    decoded = None
    if dev.computes:
        view = dev.view(off, t.shape, t.dtype)
        if pool.async_copies:
            if copy_fence is not None:  # and after the copy that filled buf
                out = pool.outbound.pop(t.id, None)
                copy_fence += [out] if out is not None else []
            copied = dev.prefetch(buf[:n], staging, compute_waits=False, after=copy_fence)
            decoded = dev.decode(codec, staging, view, after=copied, **_fenced(fence))
            dev.compute_wait(decoded)
            pool.release_host(t, buf, copied)           # reused once its copy is done
        else:
            dev.copy_to_device(buf, staging, n)
            dev.decode(codec, staging, view)
            pool.release_host(t, buf)
    else:
        pool.release_host(t, buf)
    if pool.fences is not None:
        pool.fences.last_use[t.id] = -1
        if decoded is not None:
            pool.fences.filled[t.id] = decoded
    _free_after(pool, st_off, [decoded], True)
    pool.prefetch_bytes += n
    pool.prefetch_count += 1
    if pool.log is not None:
        pool.log.append(("fetch", t.id, n))
        pool.log.append(("decode", t.id, t.nbytes + n))


def _decode_on_host(pool, t, off, buf, n, codec) -> None:
    """A miss with no room for a staging block: decode on the host (NumPy) and copy the whole
    tensor into its block, as an uncompressed bring-back does."""
    dev = pool.device
    pool.outbound.pop(t.id, None)       # waited for below, on the host
    if dev.computes:
        # the copy that filled buf may still be running: its eviction made only compute wait
        # for it, and the host reads buf now (the rare path: a whole-tensor copy follows anyway)
        dev.synchronize()
        unrecordable(dev, f"{t.name} was decoded on the host (no room for a staging block)")
        full = np.empty(t.shape, t.dtype)
        codec.decode(buf[:n], full)
        dev.copy_to_device(full.reshape(-1).view(np.uint8), dev.view(off, t.shape, t.dtype),
                           t.nbytes)
    pool.release_host(t, buf)
    pool.prefetch_bytes += t.nbytes
    pool.prefetch_count += 1
    if pool.log is not None:
        pool.log.append(("fetch", t.id, t.nbytes))


def sent_uncompressed(events, compress) -> int:
    """From a simulation's event log (pool.log): the compressed tensors that went to the host
    as they are (an offload that no encode came just before), for want of staging room."""
    out, last = 0, None
    for ev in events:
        if ev[0] in ("offload", "offload_async") and ev[1] in compress and last != ev[1]:
            out += 1
        last = ev[1] if ev[0] == "encode" else None
    return out
