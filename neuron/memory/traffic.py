"""The run moves what the plan moves: a run's copies between arena and host, per iteration, set
against the plan's (the same iteration simulated on the VirtualDevice by the same executor).

A move is ``(op, tensor id, bytes)`` in the order the pool made it, op one of "offload" (planned,
its block freed at once), "offload_async" (planned, its block kept until the plan's release
step), "prefetch" (ahead of use) and "fetch" (a miss). Equal lists mean equal bytes in the same
order; where they differ, :func:`first_difference` says where.
"""
from __future__ import annotations

MOVES = frozenset(("offload", "offload_async", "prefetch", "fetch"))


def moves(log) -> list[tuple]:
    """The moves of a pool event log (Pool.log), in order."""
    return [e for e in log if e[0] in MOVES]


def summary(mv) -> dict:
    """Bytes and counts of a list of moves, by direction."""
    out = {"offload_bytes": 0, "prefetch_bytes": 0, "offloads": 0, "prefetches": 0}
    for op, _, n in mv:
        if op.startswith("offload"):
            out["offload_bytes"] += n
            out["offloads"] += 1
        else:
            out["prefetch_bytes"] += n
            out["prefetches"] += 1
    return out


def first_difference(planned, ran) -> dict | None:
    """None where equal; else the index and the two moves there (None past an end)."""
    for i in range(max(len(planned), len(ran))):
        a = planned[i] if i < len(planned) else None
        b = ran[i] if i < len(ran) else None
        if a != b:
            return {"index": i, "planned": a, "ran": b}
    return None


class TrafficCheck:
    """Per-iteration check of an executor's moves against its plan's.

    ``begin()`` before a training step starts the pool's event log, ``end()`` after it compares
    that iteration's moves with the planned ones (simulated once, on the pool's arena size)
    and keeps ``last`` (the run's moves), ``planned`` and ``mismatches`` (iterations that
    differed, with the first difference)."""

    def __init__(self, executor):
        self.executor = executor
        sim = executor.simulate(executor.pool.heap.size, trace=True, events=True)
        if not sim["fits"]:
            raise sim["error"]
        self.planned = moves(sim["events"])
        self.last: list = []
        self.iterations = 0
        self.mismatches: list = []

    def begin(self) -> None:
        self.executor.pool.log = []

    def end(self) -> bool:
        pool = self.executor.pool
        self.last = moves(pool.log or ())
        pool.log = None
        diff = first_difference(self.planned, self.last)
        if diff is not None:
            self.mismatches.append({"iteration": self.iterations, **diff})
        self.iterations += 1
        return diff is None

    def wrap(self, step_fn):
        """``step_fn`` (a training step) with the check around it."""
        def step(*a, **k):
            self.begin()
            out = step_fn(*a, **k)
            self.end()
            return out
        return step

    def report(self) -> dict:
        return {"planned": summary(self.planned), "ran": summary(self.last),
                "iterations_checked": self.iterations, "mismatches": len(self.mismatches),
                "first_mismatch": self.mismatches[0] if self.mismatches else None}
