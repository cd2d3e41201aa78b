"""Sublinear memory (Chen et al. 2016, seed 004): keep checkpoints, recompute the rest.

- ``sublinear-sqrt``: ~sqrt(n) segments of equal length (§4.3): one extra forward.
- ``sublinear``: Algorithm 3 (memory planning with budget B: walk the route adding each
  output's bytes; at a candidate split point past B, keep it and start a new segment), with the
  paper's search over B: B = sqrt(x*y) from a B=0 run, then a 6-point grid on
  [B/sqrt 2, sqrt 2 B]. Candidates are ranked by a linear-sweep estimate of their peak (the
  paper's static-allocation cost) and time; without a budget the smallest peak wins, with one
  the fastest of the (up to three) best-ranked plans that the simulator says fit.

Split points are where one tensor carries everything forward (the open set of the route is
that tensor alone: block outputs of ResNet, transitions of DenseNet, every layer of VGG), so a
segment's recompute never needs more than its checkpoint. The recursive O(log n) variant of
§4.4 is not implemented. No offload: the pool runs without eviction.
"""
from __future__ import annotations

import math

from .base import KEEP, PLANNED_NO_EVICT, RECOMPUTE, Decisions, Planner
from .estimate import liveness_bytes
from .rewrite import droppable, recompute_rewrite


def split_points(schedule) -> set:
    """Ids of activations that are, when made, the only forward tensor still needed later."""
    route = schedule.graph.route
    pos = {id(l): i for i, l in enumerate(route)}
    last_consumer = {}
    for layer in route:
        for t in layer.outputs:
            last_consumer[id(t)] = max((pos[id(c)] for c in t.consumers), default=-1)
    open_, out = {}, set()
    for i, layer in enumerate(route):
        for sym_id in [k for k, end in open_.items() if end <= i]:
            del open_[sym_id]
        for t in layer.outputs:
            if last_consumer[id(t)] > i:
                open_[id(t)] = last_consumer[id(t)]
        if len(open_) == 1 and len(layer.outputs) == 1 and id(layer.outputs[0]) in open_:
            out.add(schedule.act[id(layer.outputs[0])].id)
    return out


def algorithm3(cands: list, split: set, budget: float) -> tuple[set, int, int]:
    """Chen et al.'s Algorithm 3 -> (checkpoint ids, x, y)."""
    temp = x = y = 0
    keep = set()
    for t in cands:
        temp += t.nbytes
        if t.id in split and temp > budget:
            x += t.nbytes
            y = max(y, temp)
            keep.add(t.id)
            temp = 0
    return keep, x, y


class Sublinear(Planner):
    name = "sublinear"
    description = "Chen et al. Algorithm 3 with the search over its budget B"

    def decisions(self, ctx, cands, keep: set) -> Decisions:
        drop = {t.id for t in cands} - keep
        steps, report = recompute_rewrite(ctx.schedule, drop)
        return Decisions(steps, policy=PLANNED_NO_EVICT, recompute_report=report,
                         tensors={t.name: RECOMPUTE if t.id in drop else KEEP for t in cands})

    def plan(self, ctx) -> Decisions:
        cands = droppable(ctx.schedule)
        split = split_points(ctx.schedule)
        _, x, y = algorithm3(cands, split, 0)
        b = math.sqrt(x * y)
        grid = [b] + [b / math.sqrt(2) * 2 ** (k / 5) for k in range(6)]
        ex = ctx._ex
        scored, seen = [], set()
        for g in grid:
            keep = algorithm3(cands, split, g)[0]
            if frozenset(keep) in seen:         # neighbouring B often give the same plan
                continue
            seen.add(frozenset(keep))
            d = self.decisions(ctx, cands, keep)
            # rank by a linear sweep (the paper's static allocation estimate), simulate the
            # best few: ten heap simulations of a 10^4-layer plan would cost tens of seconds
            peak = int(liveness_bytes(d.steps, ex.persistent, lambda s: s.workspace_bytes,
                                      ex.block).max())
            t = sum(ctx.step_time(s) for s in d.steps)
            key = (peak,) if ctx.budget is None else (peak > ctx.budget, t, peak)
            scored.append((key, int(g), len(keep), peak, t, d))
        scored.sort(key=lambda r: r[0])
        best = scored[0][-1]
        if ctx.budget is not None:
            for r in scored[:3]:
                if ctx.simulate(r[-1])["fits"]:
                    best = r[-1]
                    break
        best.info["search"] = [{"B": g, "checkpoints": k, "estimated_peak_bytes": p,
                                "estimated_time_s": t} for _, g, k, p, t, _ in scored]
        return best


class SublinearSqrt(Sublinear):
    name = "sublinear-sqrt"
    description = "checkpoints every ~sqrt(n) layers (one extra forward)"

    def plan(self, ctx) -> Decisions:
        cands = droppable(ctx.schedule)
        split = split_points(ctx.schedule)
        k = max(1, round(math.sqrt(len(cands))))
        keep, since = set(), 0
        for t in cands:
            since += 1
            if since >= k and t.id in split:
                keep.add(t.id)
                since = 0
        return self.decisions(ctx, cands, keep)
