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
"""
from __future__ import annotations

from .base import RECOMPUTE, SWAP, Decisions, Planner
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
        costs = tensor_costs(ctx, cands)
        choice_of, price = {}, {}
        for c in costs:
            if c.exposed_s <= c.recompute_s:
                choice_of[c.tensor.id], p = SWAP, c.exposed_s
            else:
                choice_of[c.tensor.id], p = RECOMPUTE, c.recompute_s
            price[c.tensor.id] = p / max(c.tensor.nbytes, 1)
        order = sorted(costs, key=lambda c: (price[c.tensor.id], -c.tensor.nbytes))
        peak = ctx.simulate(build(ctx, cands, {}), None)["peak_bytes"]
        target = max(0, peak - ctx.budget)
        best, best_t, taken, tried = None, float("inf"), 0.0, []
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
            if r["time_s"] < best_t or best is None:
                best, best_t = d, r["time_s"]
                ctx.pin(d)
            if alone["fits"] or len(chosen) == len(order):
                break
            taken += 1
        best.info["search"] = tried
        return best
