"""Every memory event of one planned iteration, for `neuron memory`, `--plot` and `--html`.

A RecordingPool is the unified tensor pool plus a log: each allocation, free, offload,
prefetch, compaction move and workspace, with the step it happened in and the arena offset.
It runs inside the executor's own simulation (Executor.pool_class), so what it records is
exactly what `neuron plan` computed, not a re-derivation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..executor import Executor
from .pool import Pool

# event operations
ALLOC, FREE, OFFLOAD, FETCH, PREFETCH, MOVE, WS_ALLOC, WS_FREE = (
    "alloc", "free", "offload", "fetch", "prefetch", "move", "ws_alloc", "ws_free")
#: operations that put bytes in the arena / take them out
ARRIVE, LEAVE = {ALLOC, FETCH, PREFETCH, WS_ALLOC}, {FREE, OFFLOAD, WS_FREE}


@dataclass
class Event:
    step: int               # position in the iteration (-1: before the first step)
    op: str
    name: str
    kind: str
    offset: int
    nbytes: int             # arena bytes (rounded to the heap's block)
    old_offset: int = -1    # for MOVE


@dataclass
class StepSample:
    """The arena at the end of one step."""
    step: int
    layer: str
    phase: str              # F, R (recompute) or B
    used_bytes: int
    free_bytes: int
    largest_free: int


@dataclass
class Recording:
    arena_bytes: int
    events: list[Event] = field(default_factory=list)
    steps: list[StepSample] = field(default_factory=list)
    peak_bytes: int = 0
    peak_event: int = -1    # index of the event that reached the high-water mark
    compactions: list[int] = field(default_factory=list)    # the step of each compaction

    def resident_at(self, event_index: int) -> dict[tuple, Event]:
        """What was in the arena right after event ``event_index``: key -> arriving event."""
        live: dict[tuple, Event] = {}
        for e in self.events[:event_index + 1]:
            key = (e.name, e.kind) if e.op not in (WS_ALLOC, WS_FREE) else ("ws", e.offset)
            if e.op in ARRIVE:
                live[key] = e
            elif e.op in LEAVE:
                live.pop(key, None)
            elif e.op == MOVE and key in live:
                old = live[key]
                live[key] = Event(old.step, old.op, old.name, old.kind, e.offset, old.nbytes)
        return live

    def intervals(self) -> list[tuple]:
        """Every stay of a tensor in the arena: (name, kind, offset, nbytes, first step, last
        step). A compaction move ends one stay and starts another at the new address."""
        open_: dict[tuple, tuple] = {}
        out = []
        last = self.steps[-1].step if self.steps else 0
        for e in self.events:
            key = (e.name, e.kind) if e.op not in (WS_ALLOC, WS_FREE) else ("ws", e.offset)
            start = max(e.step, 0)
            if e.op in ARRIVE:
                open_[key] = (e.name, e.kind, e.offset, e.nbytes, start)
            elif key in open_ and (e.op in LEAVE or e.op == MOVE):
                n, k, off, nb, s0 = open_.pop(key)
                out.append((n, k, off, nb, s0, start))
                if e.op == MOVE:
                    open_[key] = (n, k, e.offset, nb, start)
        out += [(n, k, off, nb, s0, last) for n, k, off, nb, s0 in open_.values()]
        return out


class RecordingPool(Pool):
    """The pool, logging what it does. Only the bookkeeping is added; every decision is the
    parent's."""

    def __init__(self, device, **kw):
        super().__init__(device, **kw)
        self.rec = Recording(arena_bytes=device.arena_bytes)
        self._step = -1

    def _log(self, op, name, kind, offset, nbytes, old=-1):
        rec = self.rec
        rec.events.append(Event(self._step, op, name, kind, offset, nbytes, old))
        if op in ARRIVE and self._h.used_bytes > rec.peak_bytes:
            rec.peak_bytes, rec.peak_event = self._h.used_bytes, len(rec.events) - 1

    def _log_tensor(self, op, t, offset):
        self._log(op, t.name, t.kind.value, offset, self._rounded(t.nbytes or 1))

    # a step begins with making its reads resident, and ends with unlocking its tensors
    def ensure_all(self, tensors, step=None):
        if step is not None:
            self._step = len(self.rec.steps)
            self._current = step
        super().ensure_all(tensors, step)

    def unlock(self, ids):
        super().unlock(ids)
        step = getattr(self, "_current", None)
        if step is not None:
            h = self._h
            self.rec.steps.append(StepSample(self._step, step.layer.name, step.phase,
                                             h.used_bytes, h.free_bytes, h.largest_free))
            self._current = None

    def alloc(self, t, step=None, pin=False):
        view = super().alloc(t, step, pin)
        self._log_tensor(ALLOC, t, self.offset[t.id])
        return view

    def free(self, t):
        off = self.offset.get(t.id)
        super().free(t)
        if off is not None:
            self._log_tensor(FREE, t, off)

    def free_all(self, tensors):
        for t in tensors:           # the parent's fast path does not go through free()
            self.free(t)

    def offload(self, t, defer=False, until=None):
        off, clean = self.offset[t.id], self.clean_drops
        super().offload(t, defer, until)
        # a clean block leaves without a copy (its host buffer holds its bytes): a free here
        self._log_tensor(FREE if self.clean_drops > clean else OFFLOAD, t, off)

    def _bring_back(self, t, step, ahead=False):
        super()._bring_back(t, step, ahead)
        self._log_tensor(PREFETCH if ahead else FETCH, t, self.offset[t.id])

    def compact(self):
        before = dict(self.offset)
        super().compact()
        self.rec.compactions.append(self._step)
        for tid, new in self.offset.items():
            if before.get(tid, new) != new:
                t = self.live[tid]
                self._log(MOVE, t.name, t.kind.value, new, self._rounded(t.nbytes or 1),
                          before[tid])

    def alloc_bytes(self, nbytes, what=None, step=None):
        off = super().alloc_bytes(nbytes, what, step)
        name = f"workspace:{step.name}" if step is not None else (what or "workspace")
        self._log(WS_ALLOC, name, "workspace", off, self._rounded(nbytes))
        return off

    def free_bytes(self, offset):
        n = self._h.size_of(offset)
        super().free_bytes(offset)
        self._log(WS_FREE, "workspace", "workspace", offset, n)


class RecordingExecutor(Executor):
    """An executor whose runs (and simulations) go through a RecordingPool."""
    pool_class = RecordingPool

    @classmethod
    def sharing_plan_of(cls, ex: Executor) -> "RecordingExecutor":
        """A recording executor over ``ex``'s own plan (its steps, decisions and state, not a
        new plan): what it records is the iteration ``ex`` simulates."""
        v = cls.__new__(cls)
        v.__dict__.update(ex.__dict__)
        return v


def record_plan(ex: Executor, arena: int | None) -> tuple[Recording | None, dict]:
    """Replay the plan of the virtual executor ``ex`` in ``arena`` bytes (None: unbounded)
    and log every event. Returns the recording (None when it does not fit) and the
    simulation's result (fits, error, counters): the same as ``ex.simulate(arena)``."""
    run = RecordingExecutor.sharing_plan_of(ex).simulate(arena, trace=True)
    return (run["executor"].pool.rec if run["fits"] else None), run


def record_iteration(graph, batch: int, budget: int | None = None, **kw) -> tuple[Recording, dict]:
    """Plan one iteration under ``budget`` (None: an unbounded arena) and log every event;
    a ``planner`` plans for ``budget``, as neuron.plan does. Returns the recording (None when
    it does not fit) and the simulation's result (fits, error, counters)."""
    ex = Executor(graph, batch, device="virtual",
                  budget=budget if kw.get("planner") else None, **kw)
    return record_plan(ex, budget)


def per_step(rec: Recording) -> dict[str, list]:
    """Per step: the most bytes in use at any moment of it (the peak can be mid-step), bytes
    offloaded and brought back, and whether it compacted."""
    n = len(rec.steps)
    high = [0] * n
    out_b, in_b, compact = [0] * n, [0] * n, [0] * n
    used = 0
    for e in rec.events:
        if e.op in ARRIVE:
            used += e.nbytes
        elif e.op in LEAVE:
            used -= e.nbytes
        s = e.step
        if 0 <= s < n:
            high[s] = max(high[s], used)
            if e.op == OFFLOAD:
                out_b[s] += e.nbytes
            elif e.op in (FETCH, PREFETCH):
                in_b[s] += e.nbytes
    for s in rec.compactions:
        if 0 <= s < n:
            compact[s] += 1
    return {"high": high, "offload": out_b, "fetch": in_b, "compactions": compact}
