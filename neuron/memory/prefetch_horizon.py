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

import numbers

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
        self.limit = len(steps) if limit is None else limit
        self.round = round_bytes
        # per step: the bytes it adds at its peak (what it writes, its workspace), the largest
        # single block among them, and the bytes that die after it
        self.adds, self.largest = [], []
        for s in steps:
            blocks = [round_bytes(t.nbytes or 1) for t in s.writes]
            if s.workspace_bytes:
                blocks.append(round_bytes(s.workspace_bytes))
            self.adds.append(sum(blocks))
            self.largest.append(max(blocks, default=0))
        self.frees = [sum(round_bytes(t.nbytes or 1) for t in dead) for dead in frees]
        # the plan's clock: each step's compute seconds, and a copy's seconds by its bytes
        self.copy_s = cost.copy_time if cost is not None else None
        self.step_s = [cost.step_time(s, batch) + cost.step_overhead for s in steps] \
            if cost is not None else None
        # no read takes longer to copy than the largest: past that much compute, stop looking
        self.longest_copy = cost.copy_time(max(
            (t.nbytes for s in steps for t in s.reads), default=0)) if cost is not None else 0

    def issue(self, pool, i: int) -> None:
        """After step ``i``: start the prefetches the horizon allows, in route order."""
        steps, host, heap = self.steps, pool.host, pool._h
        staged = pool.staged
        end = min(len(steps), i + 1 + self.limit)
        reserve = 0         # the most bytes a step between now and the next reader adds
        grown = 0           # what the steps between now and the next reader add net
        block = 0           # the largest single block one of them takes
        step_s, copy_s = self.step_s, self.copy_s
        timed = step_s is not None
        cover = 0.0         # compute seconds of the steps after the next one, up to the reader
        queued = 0.0        # copy seconds of the prefetches this walk started
        for j in range(i + 1, end):
            short = False
            for t in steps[j].reads:
                if t.id not in host or (staged and t.id in staged):
                    continue
                if j > i + 1:
                    if timed:
                        dt = copy_s(t.nbytes)
                        if cover >= queued + dt:
                            return      # not due: issued after the next step it is still
                        queued += dt    # in time (by the plan's clock)
                    if not self._leaves_room(heap, self.round(t.nbytes or 1), reserve, block):
                        return
                elif timed:
                    queued += copy_s(t.nbytes)
                if not pool.prefetch(t):
                    if j > i + 1:
                        return
                    short = True        # the next step's other reads are still tried
            if short:
                return
            add = grown + self.adds[j]
            if add > reserve:
                reserve = add
            if self.largest[j] > block:
                block = self.largest[j]
            grown += self.adds[j] - self.frees[j]
            if reserve >= heap.free_bytes:      # no later read can pass: stop looking
                return
            if timed and j > i + 1:
                cover += step_s[j]
                if cover >= queued + self.longest_copy:
                    return

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
