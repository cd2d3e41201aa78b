"""A CPU device with CudaDevice's asynchronous interface and CUDA's ordering rules, strict enough
that a missing wait shows up as wrong numbers on a machine without a GPU.

What CudaDevice promises the pool, and what this model makes observable:
- copies (``offload``/``prefetch``) run on a copy stream and the codec (``encode``/``decode``)
  on a codec stream, each FIFO, with ``after=`` as a cross-stream dependency;
- ``compute_wait(ev)`` orders later *kernels* after ``ev``; it does not block the host. Only
  ``wait(ev)``, ``is_done(ev)`` returning True, ``synchronize()`` (or the same for a later
  event of that stream) tell the host that a copy is complete.

The model: kernels run at once on the host, so arena-side results are computed at the call (a
kernel that raced a copy is caught by ``waited``: every event must have been waited for by
compute or the host). Host-side results are late. A copy to the host fills its buffer with
``POISON`` as soon as it could start (at the call, or once the copies before it on its stream
and those it waits for are complete) and lands the real bytes only when the host learns that it
is complete; a host read before then (a decode on the host, a checkpoint) sees poison and the
numbers change.
A copy from the host reads its buffer at the call and checks, when it completes, that the host
did not write the buffer in between (a buffer handed back for reuse too early).
"""
from __future__ import annotations

import numpy as np

from neuron.devices import CpuDevice

POISON = 0xFF               # as float32 (and bf16) bytes: NaN


def _span(a) -> tuple[int, int]:
    addr = int(a.__array_interface__["data"][0])
    return addr, addr + a.nbytes


class Event:
    def __init__(self, stream: str, polls: int, deps=(), on_complete=None, on_start=None):
        self.stream, self.polls, self.deps = stream, polls, tuple(deps)
        self.on_complete, self.on_start = on_complete, on_start
        self.waited = False         # compute or the host waited for it
        self.complete = False       # the host knows it is done
        self.host_target = None     # a copy to the host: (buffer view, the bytes it will hold)


class ComputeMark:
    """An event recorded on compute (``record_compute``): kernels run at once here, so it is
    complete when recorded."""
    waited = complete = True


def _copy_deps(after) -> list:
    """The model's copy events among ``after`` (None, one event or a list), marked waited."""
    evs = [] if after is None else list(after) if isinstance(after, (list, tuple)) else [after]
    out = [e for e in evs if isinstance(e, Event)]
    for e in out:
        e.waited = True
    return out


class StreamModelDevice(CpuDevice):
    """``polls``: how many ``is_done`` calls report an event as still running (10**6: done only
    when waited for)."""
    async_copies = True

    def __init__(self, arena_bytes: int, polls: int = 2):
        super().__init__(arena_bytes)
        self.polls = polls
        self.events: list[Event] = []
        self._queues: dict[str, list[Event]] = {"copy": [], "codec": []}

    # ---- streams ---------------------------------------------------------------------------
    def _op(self, stream, deps=(), on_complete=None, on_start=None) -> Event:
        ev = Event(stream, self.polls, [d for d in deps if d is not None], on_complete,
                   on_start)
        self.events.append(ev)
        self._queues[stream].append(ev)
        self._start_ready()
        return ev

    def _start_ready(self) -> None:
        """Each stream's first op whose dependencies are complete may be running now."""
        for queue in self._queues.values():
            e = queue[0] if queue else None
            if e is not None and e.on_start is not None and all(d.complete for d in e.deps):
                start, e.on_start = e.on_start, None
                start()

    def _complete(self, ev: Event) -> None:
        queue = self._queues[ev.stream]
        while not ev.complete:              # FIFO: the earlier ops of its stream first
            e = queue[0]
            for d in e.deps:
                self._complete(d)
            queue.pop(0)
            if e.on_start is not None:
                start, e.on_start = e.on_start, None
                start()
            e.complete = True
            if e.on_complete is not None:
                e.on_complete()
            self._start_ready()

    # ---- copies ----------------------------------------------------------------------------
    def new_event(self):
        return ComputeMark()

    def record_compute(self, ev):
        return ev

    def offload(self, view, buf, after=None):
        return self._d2h(view, buf, view.nbytes, after)

    snapshot = offload

    def _d2h(self, view, buf, nbytes, after=None):
        deps = _copy_deps(after)            # e.g. the encode, a prefetch into the block
        data = view.reshape(-1).view(np.uint8)[:nbytes].copy()     # read after the producer
        target = buf[:nbytes]

        def start():
            target[...] = POISON            # what a host read sees before the copy completes

        def land():
            target[...] = data
        ev = self._op("copy", deps, land, start)
        ev.host_target = (target, data)
        return ev

    def prefetch(self, buf, view, compute_waits=True, after=None):
        ev = self._h2d(buf, view, view.nbytes, after)
        if compute_waits:
            ev.waited = True
        return ev

    def _h2d(self, buf, view, nbytes, after=None):
        deps = _copy_deps(after)
        src = buf[:nbytes].copy()
        lo, hi = _span(buf[:nbytes])
        for e in self._queues["copy"]:      # earlier copies to this buffer come first (FIFO)
            if e.host_target is not None:
                target, data = e.host_target
                a, b = _span(target)
                if a < hi and lo < b:
                    s, t = max(a, lo), min(b, hi)
                    src[s - lo:t - lo] = data[s - a:t - a]
        view.reshape(-1).view(np.uint8)[:nbytes] = src
        read = buf[:nbytes]

        def check():
            if not np.array_equal(read, src):
                raise AssertionError("a host buffer was written while a copy from it was still "
                                     "running (reused before its event completed)")
        return self._op("copy", deps, check)

    def copy_to_host(self, view, buf, nbytes):
        self.wait(self._d2h(view, buf, int(nbytes)))

    def copy_to_device(self, buf, view, nbytes):
        self.wait(self._h2d(buf, view, int(nbytes)))

    # ---- the codec stream ------------------------------------------------------------------
    def encode(self, codec, src, dst, after=None, fence=None):
        deps = _copy_deps(after) + _copy_deps(fence)    # a copy out of dst, its last users
        codec.encode_into(src, dst)
        return self._op("codec", deps)

    def decode(self, codec, src, dst, after=None, fence=None):
        deps = _copy_deps(after) + _copy_deps(fence)    # the copy that fills src, ...
        codec.decode(src, dst)
        return self._op("codec", deps)

    # ---- waiting ---------------------------------------------------------------------------
    def compute_wait(self, ev):
        ev.waited = True                    # later kernels wait; the host does not

    def is_done(self, ev):
        if not ev.complete:
            ev.polls -= 1
            if ev.polls >= 0:
                return False
            self._complete(ev)
        return True

    def wait(self, ev):
        ev.waited = True
        self._complete(ev)

    def synchronize(self):
        for q in self._queues.values():
            if q:
                self._complete(q[-1])


def pending(pool) -> set:
    """Ids of the copies and codec work no one waited for yet that are still fenced: the next
    tenant of a free block waits for what reads it, a copy back from the host for the copy
    that sent the tensor there."""
    out = {id(e) for e in pool.outbound.values()}
    if pool.fences is not None:
        out.update(id(e) for _, _, evs in pool.fences._free.values() for e in evs)
    return out
