"""Capuchin (Peng et al. 2020)-style planning from measured costs.

Per tensor that backward reads: the seconds a swap costs (what compute waits for of its copy
out, whose block is held until the copy is done by the clock, but not past the prefetch, and of
its copy back, which hides in the free time before its first backward use or is exposed for the
rest: swap.copy_walk) against the seconds its recompute costs (the producer's forward and the
transient tensors on its way, rewrite.chains); the cheaper wins. Tensors are taken cheapest
first (the seconds a choice costs per byte it frees). How many: simulation decides
(``search``), from the fewest covering the bytes the liveness peak exceeds the budget by, over
a grid of counts from none to all, refined around the fastest, never above the fewest whose
planned moves alone fit. Each count is simulated with the tensor cache behind it (what the
planned moves leave over the budget is evicted, as Capuchin's passive mode does on demand) and
the fastest that fits wins. Swaps are offloaded during forward and prefetched by time
(swap.py); without a budget nothing is moved.

The count used to start at the excess and only grow (x1.5), and taking more than the excess
is often slower than taking fewer and leaving the rest to the cache: recomputed tensors are
held from their recompute to their backward use, so long runs of them refill the arena. With
the grid (H100 analytic clock, batch 32): ResNet-50 in 490 MiB 150.9 -> 118.4 ms (+701% ->
+528% over unlimited memory; superneurons +560%), DenseNet-121 in 356 MiB 161.6 -> 117.8 ms
(+703% -> +485%; superneurons +520%), vgg16 in 2342 MiB 76.0 -> 65.6 ms; resnet_cifar 20 at
32x32 against the MILP optimum at f = 0.7, 0.5, 0.3 of the budget range: +0.0, +0.2, +73.9%
-> -1.2, -1.8, +7.8%. At 1.0x, 0.5x and 0.3x of ResNet-50's and DenseNet-121's liveness peaks
the times were unchanged (ResNet-50 at 0.3x, 838 MiB: 45.2 ms, +140%, where superneurons
takes +52% and the MILP +36%: this rule does not see which tensors are live at the peak, nor
that a run of recomputes refills it). Planning takes up to 1.2 s (DenseNet-121 in 356 MiB).

Where no count fits (the planned moves' held blocks fragmented an arena the cache alone fit,
resnet_cifar 8 at 16x16, batch 4, with the CPU device's costs, in 844,800 B, 3 KB short at
F3:relu, until the pool released held blocks before evicting), the tensor cache alone is
tried, in the pool's compaction-first order and the policy's evict-first one (``fallback``);
only if neither fits does the fastest non-fitting plan come back, with ``info["none_fit"]``.

Swaps on one copy stream: priced alone, as if the stream were idle, swaps that hide under
compute look cheap, while all of them and the cache's evictions share the stream. So the
choice is searched three ways and the fastest kept: priced alone; ``queued`` (costs.py: each
swap by the wait it adds behind the cheaper ones booked before it); and ``busy`` (each copy
hides under one step only, the stream taken as full of evictions, as at the minimum budgets).
When a planned offload's block was released after the next step whatever its copy, only 2-10
swaps were ever cheaper than their recompute and a queue changed no choice; with the block
held by the clock (H100 analytic, batch 32, before -> now): ResNet-50 at 0.5x 21.40 -> 20.80
ms, at 0.3x 45.2 -> 36.3 ms (+140% -> +93%), DenseNet-121 at 0.3x +35.1% -> +20.7%; at the
minimum budgets the busy pricing keeps the plans it made before (ResNet-50 +527%,
DenseNet-121 +481%; priced alone or queued, +611% and +523%); planning about 1.5-2x longer.

Under compression (planners/compress.py) every count is simulated with the compressed copies,
and the choice is made twice, from the compressed swaps' costs (fewer bytes, an encode and a
decode that compute waits for) and from full-size ones, each searched as above, the fastest
kept. The rule prices each tensor alone, not what its choice does to the rest of memory, and
either price can be the better guide. (Before the grid, the compressed one swapped more on
ResNet-50 and DenseNet-121 and was faster, up to 16% at the minimum budget, rate 4, while on
resnet_cifar 20 at 16x16 and 0.3x its liveness peak it recomputed 10 more tensors and was
48% slower. With the grid the compressed plans recompute fewer and leave compressed copies to
the cache: resnet_cifar 20 at 32x32, 0.15x, rate 4, 5.13 -> 4.51 ms; ResNet-50 at 0.3x, rate
4: 33.8 ms, unchanged.)
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
