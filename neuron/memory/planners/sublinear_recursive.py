"""Recursive sublinear memory (Chen et al. 2016, seed 004, §4.4): O(log n) checkpoints.

The paper's recursion g(n) = k + g(n/(k+1)): store k intermediate results, and treat each of
the k+1 segments as a subroutine whose own forward/backward applies the same scheme. With k=1,
g(n) = log2 n checkpoints at O(n log n) forward compute.

What this planner does (``sublinear-recursive``, option ``k``, default 1):

- *Units*: the route is cut at its split points (``sublinear.split_points`` that backward reads,
  i.e. droppable): unit j runs from after split point s_{j-1} up to and including s_j; the
  last unit is the tail up to the loss. Recomputing a unit needs only its start s_{j-1}
  (plus parameters and saved aux, as every "R" step).
- *Top level* (the ordinary forward): the n units are split into k+1 groups of near-equal
  unit count; the k group boundaries are kept (KEEP); every other droppable tensor is dropped.
- *Nested recompute* (its own rewrite; ``rewrite.recompute_rewrite`` keeps every recomputed
  tensor until backward used it, which is one level only): when a backward step needs a
  dropped tensor of unit i, descend from the top group to the subgroup holding i. At each
  level whose subgroup boundary in front of i is not held, emit "R" steps from the nearest
  held boundary of that group, keeping only that group's k subgroup boundaries (fresh
  versions, which then stay live until backward has passed them, like any checkpoint);
  every other tensor of that pass is a transient version that dies after the next "R" step
  reads it. At a single unit (the leaf) the unit is recomputed from its start and all its
  droppable tensors are kept until its backward steps ran (as in the sqrt planner).
  So a checkpoint that is recomputed is itself the source of the deeper recomputes: the
  nesting is faithful, not a multi-level approximation.

What it does not do: no budget search (k is fixed; the tree is split by unit count, not by
bytes, so a stage with larger feature maps is not given more boundaries); the leaf is one
unit (a ResNet block, a DenseNet dense block + transition), which cannot be split further
since it has no single-tensor cut inside; a layer with several outputs, the data layer and
the loss are never recomputed (their outputs are held, as in ``recompute_rewrite``). No
offload: the pool runs without eviction (PLANNED_NO_EVICT).
"""
from __future__ import annotations

import bisect
import copy

from ..recompute import RecomputeReport, rebind, renumber, rerun_step
from ..schedule import Step
from .base import KEEP, PLANNED_NO_EVICT, RECOMPUTE, Decisions, Planner
from .rewrite import droppable, producers, recomputable
from .sublinear import split_points


def split_groups(a: int, b: int, parts: int) -> list:
    """Units a..b (inclusive) as up to ``parts`` contiguous groups of near-equal count."""
    n = b - a + 1
    parts = min(parts, n)
    out, start = [], a
    for g in range(parts):
        size = n // parts + (1 if g < n % parts else 0)
        out.append((start, start + size - 1))
        start += size
    return out


class SublinearRecursive(Planner):
    name = "sublinear-recursive"
    description = "Chen et al. §4.4: k checkpoints per level, recursively (O(log n) memory)"

    def __init__(self, k: int = 1):
        if int(k) < 1:
            raise ValueError("k must be >= 1")
        self.k = int(k)

    def plan(self, ctx) -> Decisions:
        schedule = ctx.schedule
        cands = droppable(schedule)
        steps, keep, report, info = nested_rewrite(schedule, cands, self.k)
        drop = {t.id for t in cands} - keep
        d = Decisions(steps, policy=PLANNED_NO_EVICT, recompute_report=report,
                      tensors={t.name: RECOMPUTE if t.id in drop else KEEP for t in cands})
        d.info.update(info)
        return d


def nested_rewrite(schedule, cands: list, k: int):
    """The schedule with nested "R" steps -> (steps, kept ids, report, info).

    A chunked schedule (memory/chunking.py) has the same units and tree, per chunk: a kept
    boundary is kept in every chunk, and chunk c is recomputed from chunk c's boundaries."""
    reg, route = schedule.registry, schedule.graph.route
    prod = producers(schedule)
    at = {id(l): i for i, l in enumerate(route)}
    rpos = {tid: at[id(st.layer)] for tid, (st, _) in prod.items()}     # route position
    col = {tid: st.chunk.index if st.chunk else 0 for tid, (st, _) in prod.items()}
    cand_ids = {t.id for t in cands}
    split = split_points(schedule) & cand_ids
    # unit j (1-based) covers route positions (ends[j-1], ends[j]]; unit M is the tail
    bound_pos = sorted({rpos[t] for t in split})
    ends = [-1] + bound_pos + [len(route) - 1]
    n_units = len(ends) - 1
    unit_at = {p: j + 1 for j, p in enumerate(bound_pos)}
    # s_j in chunk c: end tensor of unit j
    bound = {(unit_at[rpos[t.id]], col[t.id]): t for t in cands if t.id in split}

    top = split_groups(1, n_units, k + 1)
    keep = {bound[d, c].id for _, d in top[:-1] for c in range(schedule.chunks)}
    drop = cand_ids - keep
    current: dict[int, object] = {}     # dropped id -> its live recomputed version
    new_steps: list[Step] = []
    counter = [len(reg)]
    extra = [0]
    depth = [0]

    def unit_of(pos: int) -> int:
        return bisect.bisect_left(ends, pos)

    def available(j: int, c: int) -> bool:
        return j == 0 or bound[j, c].id in keep or bound[j, c].id in current

    def pick(a, local: dict):
        """This pass's version, else the live one, else the forward tensor itself."""
        if a.id in local:
            return local[a.id]
        return current.get(a.id, a)

    def run(j0: int, j1: int, store: set) -> None:
        """Re-run units j0..j1 as far as needed to make ``store`` (ids in that range);
        versions of ``store`` go to ``current``, the rest are transient."""
        lo, hi = ends[j0 - 1], ends[j1]
        need, stack = {}, [i for i in store if i not in current]
        while stack:                    # the forward steps these tensors need, in the range
            tid = stack.pop()
            if tid in need:
                continue
            fwd, pos = prod[tid]
            need[tid] = pos
            for a in fwd.ins:
                if a.id in current or a.id not in prod:
                    continue
                if lo < rpos[a.id] <= hi and recomputable(prod[a.id][0].layer):
                    stack.append(a.id)
                else:   # before the range: the unit's start, which must be held
                    assert a.id not in drop or a.id in current, \
                        f"{a.name}: a dropped start with no live version"
        local: dict[int, object] = {}
        for tid in sorted(need, key=need.get):
            fwd = prod[tid][0]
            ins = [pick(a, local) for a in fwd.ins]
            u = fwd.outs[0]
            counter[0] += 1
            v = reg.add(f"{u.name}@n{counter[0]}", u.kind, u.shape, u.dtype)
            new_steps.append(rerun_step(fwd, ins, v))
            local[tid] = v
            extra[0] += 1
            if tid in store:
                current[tid] = v

    def ensure(i: int, c: int) -> None:
        """Make every dropped tensor of unit i (in chunk c) live, recomputing down the tree."""
        a, b, level = 1, n_units, 0
        groups = top
        while a < b:
            g0, g1 = next(g for g in groups if g[0] <= i <= g[1])
            if g0 > a and not available(g0 - 1, c):
                j = max(x for x in range(a - 1, g0 - 1) if available(x, c))
                run(j + 1, g0 - 1, {bound[e, c].id for _, e in groups if j < e <= g0 - 1})
            a, b, level = g0, g1, level + 1
            groups = split_groups(a, b, k + 1)
        depth[0] = max(depth[0], level)
        lo, hi = ends[i - 1], ends[i]
        run(i, i, {t for t in drop if lo < rpos[t] <= hi and col[t] == c})

    for s in schedule.steps:
        s = copy.copy(s)
        if s.phase == "B":
            binding = {}
            for t in [*s.ins, *s.outs]:
                if t is None or t.id not in drop:
                    continue
                if t.id not in current:
                    ensure(unit_of(rpos[t.id]), col[t.id])
                binding[t.id] = current[t.id]
            if binding:
                rebind(s, binding)
        new_steps.append(s)
    renumber(new_steps)
    dropped = [t for t in cands if t.id in drop]
    report = RecomputeReport("recursive", extra[0], len(dropped),
                             sum(t.nbytes for t in dropped), n_units, 0, 0, 0)
    info = {"k": k, "units": n_units, "levels": depth[0], "top_checkpoints": len(keep),
            "extra_forward_steps": extra[0]}
    return new_steps, keep, report, info
