"""How far ahead the pool prefetches: the prefetch horizon.

After each step the executor brings back, ahead of use, tensors on the host that upcoming steps
read. With a horizon of 1 (the SuperNeurons runtime's rule) that is the next step's reads, each
one that fits in a free hole without evicting. A longer horizon walks the steps after it in
route order, and their reads in each step's order, and prefetches each read on the host while

- it fits in a free hole now, evicting nothing (Pool.prefetch), and
- the arena's free bytes left after it still cover what every step before its reader will
  add at its peak (the blocks it writes and its workspace, net of what the steps before it
  free), so no step between now and the reader has to evict for it: a prefetch never pushes
  out a tensor needed before the prefetched one.

The walk stops at the first read that fails either test, so a later tensor never takes room an
earlier one needs ("auto": no other limit; N: at most N steps ahead). What it projects is
static per plan (bytes written, workspaces and frees per step) and what it checks is the pool's
state, so the same plan and the same pool state issue the same copies in the same order every
iteration (a recorded iteration repeats: neuron/tape.py), and a simulation on the
VirtualDevice issues exactly the run's (the run moves what the plan moves, memory/traffic.py).
The projection ignores bytes that planned offloads will release, so it errs towards fewer
prefetches, never towards an eviction it did not foresee (fragmentation aside: a free byte
count is not one hole).
"""
from __future__ import annotations

import bisect
import numbers

import numpy as np

AUTO = "auto"


def prefetch_ahead_arg(value, owner: str = "Executor") -> int | None:
    """``prefetch_ahead`` checked: an integer >= 1 (steps), or "auto" (as far as the arena
    allows), which is returned as None. TypeError/ValueError naming ``owner``'s option."""
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return None
        try:
            value = int(value.strip())
        except ValueError:
            raise ValueError(f"{owner}: prefetch_ahead must be a number of steps >= 1 or "
                             f"'auto', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: prefetch_ahead must be a number of steps >= 1 or 'auto', "
                        f"got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{owner}: prefetch_ahead must be a number of steps >= 1 or 'auto', "
                         f"got {value}")
    return int(value)


class PrefetchHorizon:
    """The horizon walk for one list of steps and its frees (``limit``: steps ahead at most;
    ``round_bytes``: the heap's block rounding; ``cost``: with "auto", the plan's cost model,
    whose clock says when a prefetch is due; ``batch``: what its step times are for)."""

    def __init__(self, steps, frees, round_bytes, limit: int | None, cost=None, batch=None):
        self.steps = steps
        n = len(steps)
        self.limit = n if limit is None else limit
        self.round = round_bytes
        self.read_ids = [frozenset(t.id for t in s.reads) for s in steps]
        self.reads_at: dict[int, list] = {}     # tensor id -> the steps that read it, in order
        for k, ids in enumerate(self.read_ids):
            for tid in ids:
                self.reads_at.setdefault(tid, []).append(k)
        # per step: the bytes it adds at its peak (what it writes, its workspace), the largest
        # single block among them, and the bytes that die after it
        adds, largest = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for k, s in enumerate(steps):
            blocks = [round_bytes(t.nbytes or 1) for t in s.writes]
            if s.workspace_bytes:
                blocks.append(round_bytes(s.workspace_bytes))
            adds[k] = sum(blocks)
            largest[k] = max(blocks, default=0)
        gone = np.array([sum(round_bytes(t.nbytes or 1) for t in dead) for dead in frees],
                        np.int64).reshape(-1)
        # grown[k]: what steps 0..k-1 add net; what step k has in use at its peak, from there
        self.grown = np.concatenate([[0], np.cumsum(adds - gone)]).tolist()
        self._peak = _RangeMax(np.asarray(self.grown[:-1], np.int64) + adds)
        self._block = _RangeMax(largest)
        # the plan's clock: compute seconds before each step, and a copy's seconds by bytes
        self.copy_s = cost.copy_time if cost is not None else None
        self.clock = None if cost is None else np.concatenate([[0.0], np.cumsum(
            [cost.step_time(s, batch) + cost.step_overhead for s in steps])]).tolist()
        # no read takes longer to copy than the largest: past that much compute, stop looking
        self.longest_copy = cost.copy_time(max(
            (t.nbytes for s in steps for t in s.reads), default=0)) if cost is not None else 0

    def issue(self, pool, i: int) -> None:
        """After step ``i``: start the prefetches the horizon allows, in route order."""
        steps, host, heap = self.steps, pool.host, pool._h
        staged = pool.staged
        n = len(steps)
        clock, copy_s = self.clock, self.copy_s
        keys = host.keys()
        queued = 0.0        # copy seconds of the prefetches this walk started
        after = clock[i + 2] if clock is not None and i + 2 <= n else 0.0

        def stop() -> int:
            """Past the last step worth looking at: the limit, or (by the clock) the first
            step whose compute since the next one covers the queue and the longest copy."""
            last = min(n, i + 1 + self.limit)
            if clock is None:
                return last
            return min(last, max(i + 2, bisect.bisect_left(
                clock, after + queued + self.longest_copy)))
        end = stop()
        for j in self._readers(keys, i, min(n, i + 1 + self.limit)):
            if j >= end:
                return
            first = j == i + 1
            if not first:
                reserve = max(0, self._peak.max(i + 1, j) - self.grown[i + 1])
                block = self._block.max(i + 1, j)
                if reserve >= heap.free_bytes:
                    return                  # no read from here on can pass
            short = False
            for t in steps[j].reads:
                if t.id not in host or (staged and t.id in staged):
                    continue
                if not first:
                    if clock is not None:
                        dt = copy_s(t.nbytes)
                        if clock[j] - after >= queued + dt:
                            return      # not due: issued after the next step it is still
                        queued += dt    # in time (by the plan's clock)
                        end = stop()
                    if not self._leaves_room(heap, self.round(t.nbytes or 1), reserve, block):
                        return
                elif clock is not None:
                    queued += copy_s(t.nbytes)
                if not pool.prefetch(t):
                    if not first:
                        return
                    short = True        # the next step's other reads are still tried
            if short:
                return
            if first and queued:
                end = stop()

    def _readers(self, keys, i: int, last: int):
        """The steps i+1 .. last-1 that read a tensor in ``keys`` (on the host), in order: from
        the tensors' own reads where the host holds few, else by looking at each step."""
        if len(keys) <= 64:
            reads_at, found = self.reads_at, set()
            for tid in keys:
                at = reads_at.get(tid)
                if at:
                    k = bisect.bisect_right(at, i)
                    if k < len(at) and at[k] < last:
                        found.add(at[k])
            yield from sorted(found)
            return
        read_ids = self.read_ids
        for j in range(i + 1, last):
            if not keys.isdisjoint(read_ids[j]):
                yield j

    @staticmethod
    def _leaves_room(heap, need: int, reserve: int, block: int) -> bool:
        """Whether a block of ``need`` bytes taken now leaves ``reserve`` free bytes and, after
        it lands in the hole the heap would give it, a hole of ``block`` bytes."""
        if heap.free_bytes - need < reserve:
            return False
        holes = sorted(size for _, size in heap.free_segments())
        if not holes or holes[-1] < need:
            return False
        # whichever hole it lands in, the largest left is at least this
        left = holes[-1] - need
        return max(left, holes[-2] if len(holes) > 1 else 0) >= block


class _RangeMax:
    """max(values[a:b]) in O(1) (a sparse table; 0 for an empty range)."""

    def __init__(self, values):
        levels = [np.asarray(values, np.int64)]
        w = 1
        while 2 * w <= len(values):
            prev = levels[-1]
            levels.append(np.maximum(prev[:-w], prev[w:]))
            w *= 2
        self.levels = [lv.tolist() for lv in levels]

    def max(self, a: int, b: int) -> int:
        if b <= a:
            return 0
        k = (b - a).bit_length() - 1
        lv = self.levels[k]
        return max(lv[a], lv[b - (1 << k)])
