"""When to offload and when to start a prefetch, by time (shared by the swapping planners).

A swapped tensor is offloaded right after its last forward use (eager, during forward: the
plan, not a shortage, decides). Its arena block is kept until its copy out is done, by the
plan's clock (``release_points``), so compute never waits for it there. Its prefetch starts
after the latest step from which the compute still ahead of its first backward use covers
the copy, so that the copy ends before the step that reads it, however many steps back that
is; vDNN instead starts it a fixed number of steps ahead.

Under compression (planners/compress.py) a prefetch still starts by the full-size copy's time,
though it brings only the compressed bytes: while it waits it holds only its staging block
(1/rate of the tensor), so the lead is cheap, and it leaves the copy stream slack for the
offloads and evictions queued ahead of it, which this rule does not see. Started by the
compressed copy's time, superneurons' plans of ResNet-50 at 0.3x its liveness peak were 2.1%
(rate 2) and 1.3% (rate 4) slower, the same decisions with later prefetches.
"""
from __future__ import annotations

import bisect
import heapq


def uses(steps) -> tuple[dict, dict]:
    """tensor id -> position of its last forward use, and of its first later (R/B) use."""
    last_fwd, first_bwd = {}, {}
    for i, s in enumerate(steps):
        for t in s.reads + s.writes:
            if s.phase == "F":
                last_fwd[t.id] = i
            elif t.id in last_fwd and t.id not in first_bwd:
                first_bwd[t.id] = i
    return last_fwd, first_bwd


def prefetch_step(cum, f: int, j: int, copy_s: float) -> int:
    """The step after which the copy back of a tensor last used in forward at step f and
    next read at step j starts: the latest one whose following steps up to j-1 take at
    least the copy's time (cum: cumulative compute seconds, cum[k] before step k)."""
    p = bisect.bisect_right(cum, cum[j] - copy_s) - 2
    return min(j - 1, max(f + 1, p))


def lead_s(ctx, t) -> float:
    """The copy time a prefetch of ``t`` is started ahead by: the full-size copy's, compressed
    or not (see the module's docstring)."""
    return ctx.cost.copy_time(t.nbytes)


def swap_schedule(steps, tensors, ctx, ahead: int | None = None) -> tuple[dict, dict]:
    """offload_after and prefetch_after for the tensors to swap. ``ahead``: start each
    prefetch that many steps before its use (vDNN) instead of by time."""
    last_fwd, first_bwd = ctx.uses(steps)
    offload_after: dict[int, list] = {}
    prefetch_after: dict[int, list] = {}
    cum = ctx.cum_time(steps) if ahead is None else None    # bisected per tensor
    for t in tensors:
        f, j = last_fwd.get(t.id), first_bwd.get(t.id)
        if f is None or j is None:
            continue
        offload_after.setdefault(f, []).append(t)
        if ahead is not None:
            p = max(f + 1, j - 1 - ahead)
        else:
            p = prefetch_step(cum, f, j, lead_s(ctx, t))
        prefetch_after.setdefault(p, []).append(t)
    for lst in prefetch_after.values():         # earliest use first
        lst.sort(key=lambda t: first_bwd[t.id])
    return offload_after, prefetch_after


def copy_walk(cum, swaps) -> dict:
    """The copy stream as a plan expects it: ``swaps`` lists (tensor id, f, p, j, copy out
    seconds, copy back seconds, codec seconds) per planned swap: offloaded after step f (its
    copy after an encode of codec seconds), prefetched after step p (None: not planned),
    next read at step j. Replayed in the executor's order (after step i: the releases due,
    its offloads, its prefetches; the reads of step i + 1), each copy after the one before
    it and no earlier than its issue on the compute clock ``cum`` (cum[k]: compute seconds
    before step k), which every wait for a copy or a codec pass delays from then on. Returns
    tensor id -> (the step after which its block is released: the first ending after its
    copy out, never past its prefetch step or the step before j; the seconds compute waits
    for its copies, at the release and at j, codec passes not included)."""
    n = len(cum) - 1
    ev = []                     # (position, order, sequence, swap): a heap
    for k, sw in enumerate(swaps):
        ev.append((sw[1], 1, k, sw))
        if sw[2] is not None:
            ev.append((sw[2], 2, k, sw))
        ev.append((sw[3] - 1, 3, k, sw))
    heapq.heapify(ev)
    copy = lag = 0.0            # copy stream free at; compute's delay from waits so far
    done, out = {}, {}
    while ev:
        pos, kind, k, sw = heapq.heappop(ev)
        tid, f, p, j, one, two, codec = sw
        now = cum[min(pos + 1, n)] + lag        # the end of step pos, as delayed
        if kind == 0:           # the release: compute waits for the copy out
            wait = max(0.0, done[tid] - now)
            lag += wait
            out[tid] = (pos, out[tid][1] + wait)
        elif kind == 1:         # the offload, after its encode (compute waits for that)
            lag += codec
            copy = max(copy, now + codec) + one
            done[tid] = copy
            held = bisect.bisect_left(cum, copy - lag) - 1  # the first step ending after it
            held = max(f + 1, min(held, n if p is None else p, j - 1))
            out[tid] = (held, 0.0)
            heapq.heappush(ev, (held, 0, k, sw))
        elif kind == 2:         # the prefetch
            copy = max(copy, now) + two
            done[tid] = copy
        else:                   # step j reads it: waits for its copy back, then a decode
            wait = max(0.0, done[tid] - now) if p is not None else 0.0
            lag += wait + codec
            out[tid] = (out[tid][0], out[tid][1] + wait)
    return out


def release_points(steps, offload_after: dict, prefetch_after: dict, ctx) -> dict:
    """tensor id -> the step after which a planned offload's block is released
    (Decisions.release_after), by ``copy_walk`` of the planned swaps (a prefetch copies only
    what was offloaded; a compressed copy moves its compressed bytes after an encode). Only
    those held past the step after the offload (the executor's default).

    Released after the next step regardless, a copy longer than that step was exposed: on the
    H100's analytic costs about half of ResNet-50's copies out, so swaps rarely paid against
    recomputes. On a device without a copy stream the copy is done when it returns: {}."""
    if not ctx.cost.spec.async_copies or not offload_after:
        return {}
    n = len(steps)
    _, first_bwd = ctx.uses(steps)
    prefetch_at = {t.id: p for p, lst in prefetch_after.items() for t in lst}
    swaps = []
    for f, lst in sorted(offload_after.items()):
        for t in lst:
            one, codec = ctx.copy_cost(t)
            swaps.append((t.id, f, prefetch_at.get(t.id), first_bwd.get(t.id, n), one, one,
                          codec))
    walk = copy_walk(ctx.cum_time(steps), swaps)
    return {tid: walk[tid][0] for tid, f, *_ in swaps if walk[tid][0] > f + 1}
