"""Capuchin (Peng et al. 2020)-style planning from measured costs.

Per tensor that backward reads: the seconds a swap costs (compute waits for the copy out,
since the pool reuses the block at once; the copy back hides in the free time between its last
forward use and its first backward use, or is exposed for the rest) against the seconds its
recompute costs (the producer's forward and the transient tensors on its way,
rewrite.chains); the cheaper wins. Tensors are taken cheapest first (the seconds a choice costs
per byte it frees): the number taken grows (x1.5) from the bytes the liveness peak exceeds the
budget by until the planned moves alone fit. Each count is simulated with the tensor cache
behind it (what the planned moves leave over the budget is evicted, as Capuchin's passive
mode does on demand) and the fastest that fits wins. Swaps are offloaded during forward and
prefetched by time (swap.py); without a budget nothing is moved.

Under compression (planners/compress.py) every count is simulated with the compressed copies,
and the choice is made twice, from the compressed swaps' costs (fewer bytes, an encode and a
decode that compute waits for) and from full-size ones, each searched as above, the fastest
kept. The rule prices each tensor alone, not what its choice does to the rest of memory, and
either price can be the better guide: on ResNet-50 and DenseNet-121 the compressed one
swaps more and is faster (up to 16% at the minimum budget, rate 4), while on resnet_cifar 20 at
16x16 and 0.3x its liveness peak, where the codec's fixed cost per pass makes small
compressed swaps dearer than full-size ones, it recomputed 10 more tensors, the cache then
evicted twice as often, and the plan was 48% slower.
"""
from __future__ import annotations

import dataclasses

from .base import PLANNED, RECOMPUTE, SWAP, Decisions, Planner
from .choice import build
from .costs import tensor_costs
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
            choice_of, order = rank(tensor_costs(ctx, cands, compressed))
            ranked = [(c.tensor.id, choice_of[c.tensor.id]) for c in order]
            if ranked in seen:          # the same choices in the same order: the same search
                continue
            seen.append(ranked)
            best = search(ctx, cands, choice_of, order, target, best, tried, label)
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


def rank(costs) -> tuple[dict, list]:
    """Each tensor's cheaper choice (tensor id -> SWAP | RECOMPUTE), and the TensorCosts by the
    seconds that choice costs per byte it frees, cheapest first."""
    choice_of, price = {}, {}
    for c in costs:
        if c.exposed_s <= c.recompute_s:
            choice_of[c.tensor.id], p = SWAP, c.exposed_s
        else:
            choice_of[c.tensor.id], p = RECOMPUTE, c.recompute_s
        price[c.tensor.id] = p / max(c.tensor.nbytes, 1)
    return choice_of, sorted(costs, key=lambda c: (price[c.tensor.id], -c.tensor.nbytes))


def search(ctx, cands, choice_of, order, target, best, tried, label):
    """The count search: the first tensors of ``order`` covering target x 1.5^k bytes, k = 0,
    1, ..., each simulated (with the cache behind it unless the planned moves alone fit),
    until the planned moves alone fit or every tensor is taken. Returns the fastest of these
    and ``best`` (decisions, seconds); ``tried`` gets a log entry per count."""
    taken = 0
    while True:
        chosen, acc = {}, 0
        for c in order:
            if acc >= target * (1.5 ** taken):
                break
            chosen[c.tensor.id] = choice_of[c.tensor.id]
            acc += c.tensor.nbytes
        d = build(ctx, cands, chosen)
        alone = ctx.evaluate(d, static=True)
        r = alone if alone["fits"] else ctx.evaluate(d)
        tried.append({"tensors": len(chosen), "fits_planned": alone["fits"],
                      "fits": r["fits"], "time_s": r["time_s"]})
        if label:
            tried[-1]["costs"] = label
        # a plan that does not fit has time inf: it is kept only while nothing fits
        if r["time_s"] < best[1] or best[0] is None:
            best = d, r["time_s"]
            ctx.pin(d)
        if alone["fits"] or len(chosen) == len(order):
            return best
        taken += 1
