"""SuperNeurons (seed 001) behind the planner interface.

The policy of memory/policy.py ("superneurons": liveness, cost-aware recomputation of cheap
segments, the LRU tensor cache that offloads only when the arena is short, compaction), plus
the prefetch by time of issue 12: every checkpoint that backward reads gets a look-ahead
prefetch point, so if the cache did evict it, its copy starts early enough to end before the
step that reads it (a tensor still resident costs nothing there).
"""
from __future__ import annotations

from ..policy import get_policy
from ..recompute import plan_recompute
from .base import KEEP, RECOMPUTE, Decisions, Planner
from .rewrite import droppable
from .swap import swap_schedule


class SuperNeurons(Planner):
    name = "superneurons"
    description = "liveness + cost-aware recompute + LRU tensor cache + time-based prefetch"
    recompute_strategy = "cost"

    def plan(self, ctx) -> Decisions:
        steps, report = plan_recompute(ctx.schedule, self.recompute_strategy)
        dropped = {t.name.split("@")[0] for s in steps if s.phase == "R" for t in s.outs}
        cands = droppable(ctx.schedule)
        kept = [t for t in cands if t.name not in dropped]
        _, prefetch_after = swap_schedule(steps, kept, ctx)
        return Decisions(steps, policy=get_policy("superneurons"), prefetch_after=prefetch_after,
                         recompute_report=report,
                         tensors={t.name: RECOMPUTE if t.name in dropped else KEEP
                                  for t in cands})
