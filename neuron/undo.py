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
before it (which stalled compute for every layer's bytes).
"""
from __future__ import annotations


class UndoRecord:
    def __init__(self, device, pool, flag=None):
        self.device, self.pool = device, pool
        self.kernels = device.kernels
        self._buffers: dict[int, object] = {}   # block id -> its host buffer (reused)
        self._saved: list = []                  # blocks written this step, in order
        self._saved_ids: set[int] = set()
        self._flag = flag                       # made once by the executor
        self.snapshot_bytes = 0                 # bytes copied to the host this step
        self._early: dict[int, tuple] = {}      # block id -> (its snapshot's event, offset)
        self.tape = None                        # the tape recording this step (neuron/tape.py)

    @property
    def host_bytes(self) -> int:
        """Host memory held for undo copies (each block's buffer, kept across steps)."""
        return sum(b.nbytes for b in self._buffers.values())

    def begin(self, early=()) -> None:
        """A step starts. ``early``: blocks the step will write, whose snapshots may start now
        (a device with per-block fences only: a block freed before its write passes the copy
        on to its next tenant, memory/fences.py)."""
        self._saved.clear()
        self._saved_ids.clear()
        self._early.clear()
        self.snapshot_bytes = 0
        if self._flag is None:
            self._flag = self.kernels.nonfinite_flag_new()
        self.kernels.nonfinite_flag_clear(self._flag)
        fences = getattr(self.pool, "fences", None)
        for block in early if fences is not None else ():
            if self.pool.resident(block):
                ev = self._snapshot(block, fences)
                off = self.pool.offset[block.id]
                fences.reading[off] = ev
                self._early[block.id] = (ev, off)

    def save(self, block) -> None:
        """Copy a resident block's bytes to its host buffer before its first write this step
        (or, snapshotted when the step began, make the write wait for that copy)."""
        early = self._early.pop(block.id, None)
        if early is not None:
            ev, off = early
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
        buf = self._buffers.get(block.id)
        if buf is None:
            buf = self._buffers[block.id] = self.device.host_allocator()(block.nbytes)
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
