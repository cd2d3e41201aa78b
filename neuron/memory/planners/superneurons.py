"""SuperNeurons (seed 001) behind the planner interface.

The policy of memory/policy.py ("superneurons": liveness, cost-aware recomputation of cheap
segments, the LRU tensor cache that offloads only when the arena is short, compaction), plus
the prefetch by time of issue 12: every checkpoint that backward reads gets a look-ahead
prefetch point, so if the cache did evict it, its copy starts early enough to end before the
step that reads it (a tensor still resident costs nothing there).

Under a budget, the tensors the cache would evict are known before the run: the plan is
simulated once, and each activation the LRU evicted becomes a planned offload right after its
last forward use, whose copy overlaps the next step (an eviction on demand stalls compute until
its copy is out: on the H100, ResNet-50 at twice PyTorch's batch in 12 GiB hid none of its
copies). The planned variant is kept only where the simulated clock finds it faster.
"""
from __future__ import annotations

import dataclasses

from ..clock import makespan
from ..policy import get_policy
from ..recompute import plan_recompute
from .base import KEEP, RECOMPUTE, SWAP, Decisions, Planner
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
        d = Decisions(steps, policy=get_policy("superneurons"), prefetch_after=prefetch_after,
                      recompute_report=report,
                      tensors={t.name: RECOMPUTE if t.name in dropped else KEEP for t in cands})
        return d if ctx.budget is None else plan_evictions(ctx, d, kept)


def plan_evictions(ctx, d: Decisions, kept) -> Decisions:
    """``d`` with the LRU cache's evictions (found by simulating it) offloaded by plan, if the
    simulated clock finds that faster."""
    r = ctx.simulate(d, events=True)
    if not r["fits"]:
        return d
    by_id = {t.id: t for t in kept}
    evicted = list({e[1]: by_id[e[1]] for e in r["events"]
                    if e[0] == "offload" and e[1] in by_id}.values())
    if not evicted:
        return d
    offload_after, _ = swap_schedule(d.steps, evicted, ctx)
    planned = dataclasses.replace(
        d, offload_after=offload_after,
        tensors={**d.tensors, **{t.name: SWAP for t in evicted}})
    # the LRU plan's time from the simulation already run (one simulation fewer: planning a
    # 10^4-layer ResNet is held to 10 s)
    before = makespan(r["events"], d.steps, ctx.batch, ctx.cost).makespan_s
    after = ctx.evaluate(planned)
    choice = planned if after["fits"] and after["time_s"] < before else d
    choice.info["evictions"] = {"tensors": len(evicted), "lru_time_s": before,
                                "planned_time_s": after["time_s"],
                                "planned": choice is planned}
    return choice
