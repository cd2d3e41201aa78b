"""Sublinear memory (Chen et al. 2016, seed 004): keep checkpoints, recompute the rest.

- ``sublinear-sqrt``: ~sqrt(n) segments of equal length (§4.3): one extra forward.
- ``sublinear``: Algorithm 3 (memory planning with budget B: walk the route adding each
  output's bytes; at a candidate split point past B, keep it and start a new segment), with the
  paper's search over B: B = sqrt(x*y) from a B=0 run, then a 6-point grid on
  [B/sqrt 2, sqrt 2 B]. Candidates are ranked by Algorithm 3's own estimate x + y (bytes of
  the kept checkpoints + the largest segment); the best is built and simulated (the same
  executor) and kept if it fits the budget, else the second is too and the one that fits (or
  has the smaller peak) wins. Every plan costs
  about one extra forward, so the search is over memory, as in the paper.

Split points are where one tensor carries everything forward (the open set of the route is
that tensor alone: block outputs of ResNet, transitions of DenseNet, every layer of VGG), so a
segment's recompute never needs more than its checkpoint. The recursive O(log n) variant of
§4.4 is ``sublinear-recursive`` (sublinear_recursive.py). No offload: the pool runs without eviction.
On a chunked schedule (memory/chunking.py) a layer output's chunks are one unit (``units``),
checkpointed or dropped together; the chunks of a recomputed segment are then all held until
their backward steps ran, as the whole tensors were, so chunking does not lower this peak.
"""
from __future__ import annotations

import math

from .base import KEEP, PLANNED_NO_EVICT, RECOMPUTE, Decisions, Planner
from .rewrite import droppable, producers, recompute_rewrite


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
            out.update(t.id for t in schedule.values(layer.outputs[0]))    # every chunk
    return out


def units(schedule, cands: list) -> list[list]:
    """The candidates by layer output, in route order: the chunks of one output (a chunked
    schedule, memory/chunking.py) are checkpointed or dropped together, as the whole tensor
    is without chunks (a recompute of chunk c then starts from chunk c of the checkpoint)."""
    prod = producers(schedule)
    out: dict[int, list] = {}
    for t in cands:
        out.setdefault(id(prod[t.id][0].layer), []).append(t)
    return list(out.values())


def algorithm3(units: list, split: set, budget: float) -> tuple[set, int, int]:
    """Chen et al.'s Algorithm 3 over ``units`` (see units()) -> (checkpoint ids, x, y)."""
    temp = x = y = 0
    keep = set()
    for u in units:
        n = sum(t.nbytes for t in u)
        temp += n
        if u[0].id in split and temp > budget:
            x += n
            y = max(y, temp)
            keep.update(t.id for t in u)
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
        split, groups = split_points(ctx.schedule), units(ctx.schedule, cands)
        _, x, y = algorithm3(groups, split, 0)
        b = math.sqrt(x * y)
        grid = [b] + [b / math.sqrt(2) * 2 ** (k / 5) for k in range(6)]
        # rank the grid by Algorithm 3's own estimate, x + y (stored checkpoints + the
        # largest segment), and build and simulate only the best two: each rewrite and heap
        # simulation of a 10^4-layer plan costs seconds
        ranked, seen = [], set()
        for g in grid:
            keep, gx, gy = algorithm3(groups, split, g)
            if frozenset(keep) not in seen:     # neighbouring B often give the same plan
                seen.add(frozenset(keep))
                ranked.append((gx + gy, int(g), keep))
        ranked.sort(key=lambda r: r[0])
        tried, best, best_key = [], None, None
        for est, g, keep in ranked[:2]:
            if best_key is not None and not best_key[0]:
                break                           # the best estimate fits: the paper's pick
            d = self.decisions(ctx, cands, keep)
            r = ctx.simulate(d)
            key = (not r["fits"], r.get("peak_bytes") or 0)
            tried.append({"B": g, "checkpoints": len(keep), "estimate_bytes": est,
                          "fits": r["fits"], "peak_bytes": r.get("peak_bytes")})
            if best_key is None or key < best_key:
                best, best_key = d, key
        best.info["search"] = tried + [{"B": g, "checkpoints": len(k), "estimate_bytes": e}
                                       for e, g, k in ranked[len(tried):]]
        return best


class SublinearSqrt(Sublinear):
    name = "sublinear-sqrt"
    description = "checkpoints every ~sqrt(n) layers (one extra forward)"

    def plan(self, ctx) -> Decisions:
        cands = droppable(ctx.schedule)
        split, groups = split_points(ctx.schedule), units(ctx.schedule, cands)
        k = max(1, round(math.sqrt(len(groups))))
        keep, since = set(), 0
        for u in groups:
            since += 1
            if since >= k and u[0].id in split:
                keep.update(t.id for t in u)
                since = 0
        return self.decisions(ctx, cands, keep)
