"""Decisions from a per-tensor choice: the one builder the choosing planners share (Capuchin,
HOME, DQN, the MILP and superneurons' recompute by cost)."""
from __future__ import annotations

from .base import KEEP, PLANNED, RECOMPUTE, SWAP, Decisions
from .rewrite import recompute_rewrite
from .swap import release_points, swap_schedule

#: the per-tensor codes of a choice, in the order HOME's vectors and polish's moves use
CODES = (KEEP, SWAP, RECOMPUTE)


def build(ctx, cands, choice: dict) -> Decisions:
    """Decisions from a per-tensor choice (tensor id -> SWAP | RECOMPUTE; absent: KEEP): the
    recompute rewrite, then each swap offloaded during forward and prefetched by time."""
    drop = {tid for tid, c in choice.items() if c == RECOMPUTE}
    steps, report = recompute_rewrite(ctx.schedule, drop) if drop else (
        list(ctx.schedule.steps), None)
    swap = [t for t in cands if choice.get(t.id) == SWAP]
    offload_after, prefetch_after = swap_schedule(steps, swap, ctx)
    return Decisions(steps, policy=PLANNED, offload_after=offload_after,
                     prefetch_after=prefetch_after, recompute_report=report,
                     release_after=release_points(steps, offload_after, prefetch_after, ctx),
                     tensors={t.name: choice.get(t.id, KEEP) for t in cands})


def choice_of(d: Decisions, cands) -> dict:
    """The per-tensor choice (tensor id -> KEEP | SWAP | RECOMPUTE) a plan made."""
    return {t.id: d.tensors.get(t.name, KEEP) for t in cands}
