"""Evictions on the plan's schedule: the LRU cache's copies to the host started early enough to
run under compute.

An LRU eviction (memory/pool.py ``_evict_one``) happens when an allocation finds no room, so its
copy to the host would start just when the step that needs the room wants to run. But every
planned iteration is the same program, so one iteration's evictions say the next one's. An
:class:`EvictionRecorder` notes, over one iteration, each eviction: the tensor, the step it
happened in and the last step before it that used (or brought back) the tensor. Its
:class:`EvictionSchedule` then issues, from the next iteration on, each such tensor's copy to the
host right after that last use (``Pool.precopy``), on the copy stream with the block's fences.

The eviction itself does not move: the tensor stays resident and in the LRU, and the cache
evicts it at the same allocation as before, only without a copy to make (its host copy is
done or under way; its block's next tenant waits for that copy). So the pool's decisions, its
layout, its moves and its results are those of the on-demand run by construction; only when
the copies start changes. A tensor used again before its eviction (an iteration that differs
from the recorded one) drops its early copy and is evicted on demand, as is one whose copy could
not start (no host room, not resident): each counted in ``Pool.ahead_fallbacks``.
"""
from __future__ import annotations


class EvictionSchedule:
    """The early copies of a recorded iteration: ``issue[i]``, the tensors whose copy to the
    host starts after step i (in eviction order), for the steps, frees and arena they were
    recorded with."""

    def __init__(self, steps, frees, arena: int, evictions: list, window: int | None = None):
        self.steps, self.frees, self.arena = steps, frees, arena
        self.evictions = evictions          # (tensor, step evicted in, last step before)
        self.issue: dict[int, list] = {}
        for t, at, last in evictions:
            if last is None or last >= at:      # nothing to run under: evicted on demand
                continue
            after = last if window is None else max(last, at - 1 - window)
            self.issue.setdefault(after, []).append(t)

    @property
    def early(self) -> int:
        """How many of the recorded evictions have an early copy."""
        return sum(len(v) for v in self.issue.values())

    def fits(self, steps, frees, arena: int) -> bool:
        return steps is self.steps and frees is self.frees and arena == self.arena

    def after_step(self, pool, i: int) -> None:
        """Step i's kernels are queued: start the copies due after it."""
        for t in self.issue.get(i, ()):
            if not pool.precopy(t):
                pool.ahead_fallbacks += 1

    def arrived(self, tid: int) -> None:
        pass

    def evicted(self, t) -> None:
        pass


class EvictionRecorder:
    """Notes one iteration's LRU evictions and each evicted tensor's last use before them."""

    def __init__(self, steps):
        self.steps = steps
        self.step = 0                       # the step being run
        self.last: dict[int, int] = {}      # tensor id -> last step that used or brought it
        self.evictions: list = []

    def after_step(self, pool, i: int) -> None:
        last = self.last
        for tid in self.steps[i].ids:
            last[tid] = i
        self.step = i + 1

    def arrived(self, tid: int) -> None:
        """A prefetch brought tensor ``tid`` back after the running step."""
        self.last[tid] = self.step

    def evicted(self, t) -> None:
        self.evictions.append((t, self.step, self.last.get(t.id)))

    def schedule(self, frees, arena: int, window: int | None = None) -> EvictionSchedule:
        return EvictionSchedule(self.steps, frees, arena, self.evictions, window)
