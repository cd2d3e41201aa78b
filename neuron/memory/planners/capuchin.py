"""Capuchin (Peng et al. 2020)-style planning from measured costs.

Per tensor that backward reads: the seconds a swap costs (what compute waits for of its copy
out, its block held until the clock says the copy is done, and of its copy back, hidden in the
free time before its first backward use or exposed: swap.copy_walk) against the seconds its
recompute costs (the producer's forward and the transient tensors on its way, rewrite.chains);
the cheaper wins. Tensors are taken cheapest per byte freed first; how many, simulation decides
(``search``): a grid of counts from none to all, refined around the fastest, each simulated
with the tensor cache behind it (Capuchin's passive mode), the fastest that fits kept. Swaps are
offloaded during forward and prefetched by time (swap.py); without a budget nothing moves.

Swaps share one copy stream, so the choice is searched three ways and the fastest kept: priced
alone; ``queued`` (each swap by the wait it adds behind the cheaper ones: costs.py); ``busy``
(each copy hiding under one step only). Under compression the choice is made from compressed
and from full-size swap costs. Where no count fits, the tensor cache alone is tried in two
orders (``fallback``); if neither fits, the fastest plan returns with ``info["none_fit"]``.
Measured effects: docs/planners.md and bench/results/planners.md.
"""
from __future__ import annotations

import dataclasses

from .base import PLANNED, Decisions, Planner
from .choice import build
from .costs import queued, rank, tensor_costs
from .rewrite import droppable


class Capuchin(Planner):
    name = "capuchin"
    description = "swap what hides under compute, recompute what is cheaper than its exposed copy"

    def plan(self, ctx) -> Decisions:
        cands = droppable(ctx.schedule)
        if ctx.budget is None:
            return build(ctx, cands, {})
        peak = ctx.simulate(build(ctx, cands, {}), None)["peak_bytes"]
        target = max(0, peak - ctx.budget)
        best, tried, seen = (None, float("inf")), [], []
        for compressed, label in ctx.copy_pricings():
            alone = tensor_costs(ctx, cands, compressed)
            for costs, how in ((alone, "alone"), (queued(ctx, alone), "queued"),
                               (tensor_costs(ctx, cands, compressed, busy=True), "busy")):
                choice_of, order = rank(costs)
                ranked = [(c.tensor.id, choice_of[c.tensor.id]) for c in order]
                if ranked in seen:      # the same choices in the same order: the same search
                    continue
                seen.append(ranked)
                best = search(ctx, cands, choice_of, order, target, best, tried,
                              how if label is None else f"{label}, {how}")
        if best[1] == float("inf"):
            best = fallback(ctx, cands, best, tried)
        best[0].info["search"] = tried
        return best[0]


#: the pool's order as the superneurons policy runs it: evict first, compact only when nothing
#: is left to evict (PLANNED compacts first)
EVICT_FIRST = dataclasses.replace(PLANNED, name="planned-evict-first", compact_first=False)


def fallback(ctx, cands, best, tried):
    """No count fit (the planned moves can fragment a tight arena: a planned offload holds its
    block until the next step has run): nothing planned, the tensor cache alone, as the
    superneurons policy runs, in the pool's compaction-first order and in the policy's own;
    the fastest that fits, else ``best`` with ``info["none_fit"]``."""
    for policy in (PLANNED, EVICT_FIRST):
        d = dataclasses.replace(build(ctx, cands, {}), policy=policy)
        r = ctx.evaluate(d)
        tried.append({"tensors": 0, "policy": policy.name, "fits": r["fits"],
                      "time_s": r["time_s"]})
        if r["time_s"] < best[1]:
            best = d, r["time_s"]
            ctx.pin(d)
    if best[1] == float("inf"):
        best[0].info["none_fit"] = True
    return best


#: the count search's grid over [0, all candidates], refined around its best by halving steps
GRID = 12
#: effort bound: no further count is simulated once the search has simulated this many steps
#: (the first count always is; ResNet-50's iteration is ~550 steps, a 10^4-layer ResNet's
#: ~83,000, where the search keeps to its first count or two, as before)
MAX_SIM_STEPS = 150_000


def search(ctx, cands, choice_of, order, target, best, tried, label):
    """The count search: the first k tensors of ``order`` for k on a grid over [0, n] and
    refined around the fastest, beginning with the fewest covering the ``target`` bytes;
    each simulated with the cache behind it unless the planned moves alone fit, no count
    above the fewest that fit alone. Simulation decides: fewer moves with the cache for the
    rest can beat more (ResNet-50 in 490 MiB: 32 recomputes against the 73 covering the
    excess, 124 ms against 151). Returns the fastest of these and ``best`` (decisions,
    seconds); ``tried`` gets a log entry per count."""
    n, sizes = len(order), [c.tensor.nbytes for c in order]
    k0, acc = 0, 0
    while k0 < n and acc < target:
        acc += sizes[k0]
        k0 += 1
    times, fit_alone, spent = {}, [n], ctx.simulated_steps

    def probe(k):
        nonlocal best
        if k in times or not 0 <= k <= fit_alone[0] or \
                (times and ctx.simulated_steps - spent > MAX_SIM_STEPS):
            return
        d = build(ctx, cands, {c.tensor.id: choice_of[c.tensor.id] for c in order[:k]})
        alone = ctx.evaluate(d, static=True)
        r = alone if alone["fits"] else ctx.evaluate(d)
        if alone["fits"]:
            fit_alone[0] = min(fit_alone[0], k)
        times[k] = r["time_s"]
        tried.append({"tensors": k, "fits_planned": alone["fits"],
                      "fits": r["fits"], "time_s": r["time_s"]})
        if label:
            tried[-1]["costs"] = label
        # a plan that does not fit has time inf: it is kept only while nothing fits
        if r["time_s"] < best[1] or best[0] is None:
            best = d, r["time_s"]
            ctx.pin(d)

    probe(k0)
    for i in range(GRID + 1):
        probe(round(n * i / GRID))
    step = -(-n // GRID)
    while step > 1:
        step //= 2
        k = min(times, key=lambda k: (times[k], k))
        probe(k - step)
        probe(k + step)
    return best
