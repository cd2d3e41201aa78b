"""A training step as a transaction: the undo record of the state one step changes.

Updates are applied per layer during backward (what lets depth exceed the card), so when a step
fails half-way some layers are updated and others are not. Before a step first writes a layer's
persistent block (BN running statistics in forward, parameters and optimizer state in backward),
the block's bytes are copied to a host buffer; a failed step (any exception, KeyboardInterrupt
included, or a non-finite value) writes those bytes back. The copies live in host memory, never
in the arena, so the arena budget does not grow; each block's host buffer is allocated once and
reused every step.

Finiteness is accumulated into one device-side flag (a kernel per written tensor, no host sync)
and read once, at the end of the step. On a CUDA device the snapshot copy runs on a stream of
its own (never ahead of the pool's copies), after the block's last kernel only, and the update
kernel waits for it on the GPU, so the host never blocks per layer. Where the executor knows
the blocks stay in place (``begin(early=...)``), their snapshots are issued when the step starts
and run under forward, so an update waits for a copy long done instead of one issued right
before it (which stalled compute for every layer's bytes); blocks adjacent in the arena are
copied as one range into one host buffer, and their finiteness checks are deferred to one
launch (``check_later``): a step's guard is a handful of operations, not four per layer.
Elsewhere (blocks on the host between uses) ``save_ahead`` starts a block's copy before the
kernel issued ahead of its write, so that kernel runs under the copy.
"""
from __future__ import annotations

import numpy as np


#: the first piece of an early snapshot range (undo.py's ``_pieces``): a forward's first
#: BatchNorm waits about this many bytes' copy (18 us at 55 GB/s) when a step starts
FIRST_PIECE = 1 << 20


class UndoRecord:
    def __init__(self, device, pool, flag=None):
        self.device, self.pool = device, pool
        self.kernels = device.kernels
        self._buffers: dict[int, object] = {}   # block id -> its host buffer (reused)
        self._own: dict[int, object] = {}       # block id -> a buffer of its own
        self._ranges: dict[tuple, object] = {}  # (start, end, block ids) -> a range's buffer
        self._saved: list = []                  # blocks written this step, in order
        self._saved_ids: set[int] = set()
        self._flag = flag                       # made once by the executor
        self.snapshot_bytes = 0                 # bytes copied to the host this step
        self._early: dict[int, tuple] = {}      # block id -> (its snapshot's event, offset)
        self._in_place: set[int] = set()        # early blocks: they stay put all step
        self._waited: set[int] = set()          # id of each snapshot event compute waited for
        self._later: list = []                  # arrays whose check waits for check_deferred
        self.tape = None                        # the tape recording this step (neuron/tape.py)

    @property
    def host_bytes(self) -> int:
        """Host memory held for undo copies (each block's buffer, kept across steps)."""
        return sum(b.nbytes for b in self._own.values()) + \
            sum(b.nbytes for b in self._ranges.values())

    def begin(self, early=()) -> None:
        """A step starts. ``early``: blocks the step will write, whose snapshots may start now
        (a device with per-block fences only: a block freed before its write passes the copy
        on to its next tenant, memory/fences.py)."""
        self._saved.clear()
        self._saved_ids.clear()
        self._early.clear()
        self._in_place.clear()
        self._waited.clear()
        self._later.clear()
        self.snapshot_bytes = 0
        if self._flag is None:
            self._flag = self.kernels.nonfinite_flag_new()
        self.kernels.nonfinite_flag_clear(self._flag)
        fences = getattr(self.pool, "fences", None)
        if fences is None:
            return
        resident = [b for b in early if self.pool.resident(b)]
        ranged = hasattr(self.device, "snapshot")     # a copy of its own stream, after fences
        pieces = [p for run in self._adjacent_runs(resident) for p in self._pieces(run)] \
            if ranged else [[b] for b in resident]
        for piece in pieces:
            ev = self._snapshot(piece[0], fences) if len(piece) == 1 else \
                self._snapshot_range(piece, fences)
            for block in piece:
                self._started(block, ev, fences)
                self._in_place.add(block.id)

    def _adjacent_runs(self, blocks) -> list[list]:
        """``blocks`` in arena order, grouped where each starts where the one before ends (its
        rounded extent): each group is one contiguous range of the arena."""
        pool = self.pool
        runs: list[list] = []
        end = None
        for b in sorted(blocks, key=lambda b: pool.offset[b.id]):
            off = pool.offset[b.id]
            if runs and off == end:
                runs[-1].append(b)
            else:
                runs.append([b])
            end = off + pool.heap.round(b.nbytes)
        return runs

    def save_ahead(self, block) -> None:
        """Start the snapshot of a resident block that this step writes after the kernels
        issued in between (a backward step's own kernel, before its update): they overlap the
        copy, and ``save`` makes the write wait for it. Where snapshots are synchronous, or
        the block was snapshotted already, nothing."""
        fences = getattr(self.pool, "fences", None)
        if fences is None or not hasattr(self.device, "snapshot") or \
                block.id in self._saved_ids or not self.pool.resident(block):
            return
        self._started(block, self._snapshot(block, fences), fences)

    def _started(self, block, ev, fences) -> None:
        """``block``'s snapshot ``ev`` is under way before its write: a later tenant of its
        place waits for the copy, and ``save`` makes the write wait for it."""
        off = self.pool.offset[block.id]
        fences.reading[off] = ev
        self._early[block.id] = (ev, off)

    def _pieces(self, run) -> list[list]:
        """``run`` cut at block boundaries into pieces that double in size from FIRST_PIECE:
        forward writes the first blocks (BatchNorm statistics) soon after the step starts and
        waits only for the small first piece, while the copy runs far ahead of it after."""
        pieces, size, limit = [[]], 0, FIRST_PIECE
        for b in run:
            if pieces[-1] and size + b.nbytes > limit:
                pieces.append([])
                size, limit = 0, 2 * limit
            pieces[-1].append(b)
            size += self.pool.heap.round(b.nbytes)
        return pieces

    def save(self, block) -> None:
        """Copy a resident block's bytes to its host buffer before its first write this step
        (or, snapshotted when the step began, make the write wait for that copy)."""
        early = self._early.pop(block.id, None)
        if early is not None:
            ev, off = early
            if ev is not None and id(ev) not in self._waited:    # once per range's copy
                self._waited.add(id(ev))
                self.device.compute_wait(ev)
            reading = self.pool.fences.reading
            if reading.get(off) is ev:      # still in place: the write orders later tenants
                del reading[off]
            return
        if block.id in self._saved_ids:
            return
        self._snapshot(block, getattr(self.pool, "fences", None), wait=True)

    def _snapshot(self, block, fences, wait: bool = False):
        """Start the copy of ``block`` to its host buffer; ``wait``: later compute (the write)
        waits for it. Returns the copy's event (None where the copy is synchronous)."""
        buf = self._own.get(block.id)
        if buf is None:
            buf = self._own[block.id] = self.device.host_allocator()(block.nbytes)
        self._buffers[block.id] = buf
        view = self.pool.view(block)
        dev = self.device
        ev = None
        if fences is not None and hasattr(dev, "snapshot"):
            # the guard's own stream, after the last kernel that used the block (and the copy
            # that filled it): never ahead of a prefetch; the update waits for it on the GPU
            ev = dev.snapshot(view, buf, after=fences.tensor_fence(block.id))
        elif getattr(dev, "async_copies", False):
            # copy stream; later compute (the update) waits for the copy on the GPU
            ev = dev.offload(view, buf)
        else:
            dev.copy_to_host(view, buf, block.nbytes)
        if wait and ev is not None:
            dev.compute_wait(ev)
        self._saved.append(block)
        self._saved_ids.add(block.id)
        self.snapshot_bytes += block.nbytes
        if self.tape is not None:
            self.tape.mark_saved(block)
        return ev

    def _snapshot_range(self, run, fences):
        """One copy of the arena range ``run`` (adjacent blocks) covers, into one host buffer,
        after every kernel that last used any of them; each block's bytes are its slice."""
        pool, dev = self.pool, self.device
        lo = pool.offset[run[0].id]
        hi = pool.offset[run[-1].id] + run[-1].nbytes
        key = (lo, hi, tuple(b.id for b in run))
        buf = self._ranges.get(key)
        if buf is None:
            buf = self._ranges[key] = dev.host_allocator()(hi - lo)
        after, seen = [], set()
        for b in run:
            for e in fences.tensor_fence(b.id):
                if id(e) not in seen:
                    seen.add(id(e))
                    after.append(e)
        ev = dev.snapshot(dev.view(lo, (hi - lo,), np.uint8), buf, after=after)
        for b in run:
            start = pool.offset[b.id] - lo
            self._buffers[b.id] = buf[start:start + b.nbytes]
            self._saved.append(b)
            self._saved_ids.add(b.id)
            if self.tape is not None:
                self.tape.mark_saved(b)
        self.snapshot_bytes += hi - lo
        return ev

    def stays(self, block) -> bool:
        """Whether ``block`` stays at its place in the arena all step (snapshotted early)."""
        return block.id in self._in_place

    def check_later(self, arrays) -> None:
        """As check_finite, folded into one launch at check_deferred: for arrays of blocks that
        stay in place (``stays``) and are not written again this step."""
        self._later.extend(arrays)

    def check_deferred(self) -> None:
        """The deferred finiteness checks, in one launch (per dtype)."""
        if self._later:
            self.kernels.nonfinite_flag_update_many(self._flag, self._later)
            self._later.clear()

    @property
    def flag(self):
        """The step's device-side flag (for kernels that check their own results)."""
        return self._flag

    def check_finite(self, arrays) -> None:
        """Fold 'any of these is NaN or infinite' into the step's flag (no host sync)."""
        k, flag = self.kernels, self._flag
        for a in arrays:
            k.nonfinite_flag_update(flag, a)

    def nonfinite(self) -> bool:
        """Read the flag: once per step (a read, never on a tape: device.kernels, not the
        recording kernels)."""
        return bool(self.device.kernels.nonfinite_flag_read(self._flag))

    def written(self) -> list[str]:
        return [b.name for b in self._saved]

    def restore(self, blocks=None) -> None:
        """Write every saved block back, wherever the pool now keeps it (arena or host).
        ``blocks``: those a replayed step snapshotted (neuron/tape.py), instead of this step's."""
        if blocks is not None:
            self._saved = list(blocks)
        pool, dev = self.pool, self.device
        pool.written(self._saved)       # their host copies, if any, are not these bytes
        dev.synchronize()               # snapshot copies done, nothing still writing a block
        for block in reversed(self._saved):
            buf = self._buffers[block.id]
            if pool.resident(block):
                dev.copy_to_device(buf, pool.view(block), block.nbytes)
            else:
                pool.host[block.id][1][:block.nbytes] = buf[:block.nbytes]
        dev.synchronize()
        self._saved.clear()
        self._saved_ids.clear()
