"""Overlap measured, not derived: how long each copy and each step's kernels ran, from CUDA-event
timestamps, and how much of the copy time ran while compute was busy.

A :class:`Timeline` attached to a device (CudaDevice.timeline) is given, per iteration, one
interval per copy (a timed event recorded on the copy's stream after its waits, and its
completion event) and one per step (an event recorded on compute once the step's waits were
issued, and one after its kernels). A stream reaches an event only when the work before it,
waits included, is done, so a step's interval is its kernels' time and a copy's its transfer's.
Per iteration (:func:`overlap_stats`): the time of each direction's copies, compute time, the
time copies ran concurrently with compute, and the exposed copy time (copies running while
compute was idle: what the copies cost the iteration at most).

Timestamps are read once an execution's events are complete, never waiting for them inside an
iteration, for the last ``keep`` executions (Timeline).
"""
from __future__ import annotations


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def _length(u) -> float:
    return sum(b - a for a, b in u)


def _intersection(u, v) -> float:
    """Length of the intersection of two unions of disjoint sorted intervals."""
    i = j = 0
    total = 0.0
    while i < len(u) and j < len(v):
        lo, hi = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        if hi > lo:
            total += hi - lo
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_stats(compute, copies) -> dict:
    """``compute``: [(start, end)] of the steps; ``copies``: [(kind, start, end, bytes)], times
    in milliseconds. -> per-direction copy time and bytes, compute time, concurrent and exposed
    copy time, the hidden fraction (concurrent / copy time, None with no copies) and the span."""
    cu = _union(compute)
    out = {"compute_ms": _length(cu)}
    for kind in ("d2h", "h2d"):
        own = [(a, b) for k, a, b, _ in copies if k == kind]
        out[f"{kind}_ms"] = _length(_union(own))
        out[f"{kind}_bytes"] = sum(n for k, _, _, n in copies if k == kind)
    cp = _union([(a, b) for _, a, b, _ in copies])
    busy = _length(cp)
    concurrent = _intersection(cp, cu)
    out.update(copy_ms=busy, concurrent_ms=concurrent, exposed_copy_ms=busy - concurrent,
               hidden_fraction=concurrent / busy if busy > 0 else None)
    ends = [t for iv in compute for t in iv] + [t for _, a, b, _ in copies for t in (a, b)]
    out["span_ms"] = (max(ends) - min(ends)) if ends else 0.0
    return out


class Timeline:
    """The timed events of the last iteration issued, and the overlap of the last ``keep``
    executions read from them (see the module docstring).

    The events come from rings that restart every iteration (CudaDevice.timestamp), so that a
    timed iteration can be recorded and replayed: each execution (eager, a tape's replay, a
    graph's launch) records the same events again. An execution is therefore read
    (``sample``) before the next one records over it: at the next step's start, if its events
    are complete by then (never waiting for them), right after a graph's launch, and by
    ``report``."""

    def __init__(self, device, keep: int = 5):
        self.device = device
        self.keep = int(keep)
        self._measured: list[dict] = []     # overlap_stats of executions read, oldest first
        self._last: tuple[list, list] | None = None     # the last iteration's events
        self._unread = False                # an execution of _last not yet read
        self._steps: list = []          # [(start event, end event)] this iteration
        self._copies: list = []         # [(kind, start event, end event, bytes)]
        self._open = None

    def clear(self) -> None:
        """Forget the executions measured so far, and the one in flight (e.g. the warm-up)."""
        self._measured.clear()
        self._unread = False

    def add(self, kind: str, start, end, nbytes: int) -> None:
        self._copies.append((kind, start, end, int(nbytes)))

    def step_start(self) -> None:
        self._open = self.device.timestamp()

    def step_end(self) -> None:
        if self._open is not None:
            self._steps.append((self._open, self.device.timestamp()))
            self._open = None

    def iteration_end(self) -> None:
        if self._steps or self._copies:
            self._last, self._unread = (self._steps, self._copies), True
        self._steps, self._copies, self._open = [], [], None

    def launched(self) -> None:
        """A graph captured from the last iteration ran again (its events with it), and the
        device waited for it: read it."""
        self._unread = self._last is not None
        self.sample()

    def sample(self, wait: bool = False) -> bool:
        """Read the last execution's intervals if it has not been read and its events are
        complete (``wait``: after synchronizing). Returns whether it was read."""
        if not self._unread:
            return False
        steps, copies = self._last
        if wait:
            self.device.synchronize()
        else:
            # a stream completes in order: the last step's end and each copy's end suffice
            done = self.device.is_done
            if (steps and not done(steps[-1][1])) or not all(done(b) for _, _, b, _ in copies):
                return False
        self._unread = False
        if not steps:
            return False
        ms = self.device.elapsed_ms
        t0 = steps[0][0]
        self._measured.append(overlap_stats(
            [(ms(t0, a), ms(t0, b)) for a, b in steps],
            [(k, ms(t0, a), ms(t0, b), n) for k, a, b, n in copies]))
        del self._measured[:-self.keep]
        return True

    def report(self) -> dict:
        """Per measured execution (oldest first) its overlap_stats, and their medians."""
        self.sample(wait=True)
        per = list(self._measured)
        out = {"iterations": per}
        if per:
            def median(key):
                vals = sorted(p[key] for p in per if p[key] is not None)
                return vals[len(vals) // 2] if vals else None
            out["median"] = {k: median(k) for k in per[0]}
        return out
