"""SuperNeurons (seed 001) behind the planner interface: the paper's policy, searched.

Under a budget it simulates candidates in the paper's order (liveness alone; the tensor cache;
the full policy with cost-aware recompute; recompute chosen by time, ``cost-greedy`` and
``cost``; ``cost-swap``, swaps where they are cheaper than recomputes) on the executor's own
clock and keeps the fastest that fits (none fits: ``paper``), then ``polish``es it one tensor at
a time. Evictions the LRU cache would make become planned forward offloads where the clock finds
that faster, and every checkpoint backward reads gets a timed look-ahead prefetch.

The search is bounded deterministically: a candidate whose lower bound on time cannot win is
skipped, and simulation stops at ``max_sim_steps`` (150,000 simulated steps: at 10^4 layers
one simulation, the paper variant's LRU form). ``info["variant"]`` names the winner and
``info["candidates"]`` each candidate's bound and time or why it was skipped. The design, the
deviations from the paper and their measured effect: docs/planners.md.
"""
from __future__ import annotations

import dataclasses

from ..clock import makespan
from ..policy import get_policy
from ..recompute import plan_recompute
from .base import KEEP, PLANNED, RECOMPUTE, SWAP, Decisions, Planner
from .capuchin import rank
from .choice import build, choice_of
from .costs import queued, tensor_costs
from .polish import polish
from .rewrite import droppable
from .swap import release_points, swap_schedule

GRID = 8        # recompute_by_cost's probes per grid (half that on a chunked schedule)


class SuperNeurons(Planner):
    name = "superneurons"
    description = "liveness + cost-aware recompute + LRU tensor cache + time-based prefetch"
    recompute_strategy = "cost"

    def __init__(self, max_sim_steps: int = 150_000, polish: int = 1):
        if max_sim_steps < 0:
            raise ValueError(f"superneurons: max_sim_steps must be >= 0, got {max_sim_steps}")
        if polish not in (0, 1):
            raise ValueError(f"superneurons: polish must be 0 or 1, got {polish!r}")
        self.max_sim_steps = int(max_sim_steps)
        self.polish = bool(polish)

    def paper(self, ctx, cands=None) -> tuple[Decisions, list]:
        """The paper's policy: cost-aware recompute of the cheap segments, the rest kept (with
        a prefetch point). Returns the decisions and the kept tensors."""
        cands = droppable(ctx.schedule) if cands is None else cands
        if ctx.schedule.chunks > 1:
            # the paper's segment rule is by whole layers (memory/recompute.py): with chunks
            # this variant is the policy as it runs them (the cache, no recompute, no prefetch
            # points, which can thrash a tight arena); the cost variants recompute chunks
            return Decisions(ctx.schedule.steps, policy=get_policy("superneurons"),
                             tensors={t.name: KEEP for t in cands}), cands
        steps, report = plan_recompute(ctx.schedule, self.recompute_strategy)
        dropped = {t.name.split("@")[0] for s in steps if s.phase == "R" for t in s.outs}
        kept = [t for t in cands if t.name not in dropped]
        _, prefetch_after = swap_schedule(steps, kept, ctx)
        return Decisions(steps, policy=get_policy("superneurons"), prefetch_after=prefetch_after,
                         recompute_report=report,
                         tensors={t.name: RECOMPUTE if t.name in dropped else KEEP
                                  for t in cands}), kept

    def cache_only(self, ctx, cands) -> Decisions:
        """Liveness and the tensor cache, nothing recomputed."""
        steps = ctx.schedule.steps
        _, prefetch_after = swap_schedule(steps, cands, ctx)
        return Decisions(steps, policy=get_policy("superneurons"), prefetch_after=prefetch_after,
                         tensors={t.name: KEEP for t in cands})

    @staticmethod
    def grid(ctx) -> int:
        """recompute_by_cost's probes per grid: ``GRID``, half that on a chunked schedule,
        whose every simulation costs about ``chunks`` times more (its effort cap grows by as
        much: ``plan``). On ResNet-50 and DenseNet-121 at batch 32, 4 chunks, the full grid took
        1.3 to 2.4x the planning time (DenseNet-121 in 250 MiB: 18 s against 7.6); on the
        module doc's cases (2 and 4 chunks, 150 MiB to 2 GiB) it found at most 3.3% less
        simulated time (ResNet-50 at 2 chunks in 450 MiB: 133.0 ms against 137.4)."""
        return GRID if ctx.schedule.chunks == 1 else GRID // 2

    @staticmethod
    def cost_effort(n: int, steps: int, grid: int = GRID) -> int:
        """About how many steps ``recompute_by_cost`` builds and simulates: its bisection's
        rewrites, and two grids of ``grid`` probes simulated twice (LRU and planned)."""
        return (max(n, 1).bit_length() + 1 + 2 * grid * 3) * 2 * steps

    def recompute_by_cost(self, ctx, cands, best_s: float = float("inf"),
                          run_limit: int | None = None, swaps: bool = False):
        """Cost-aware recompute by time: the tensors backward reads, cheapest to recompute per
        byte first (the cost model's forward seconds of the recompute chain), with
        ``run_limit`` skipping any that would make a run of dropped tensors hold more than that
        (``run_bounded``), as many as memory requires, the tensor cache for the rest. Returns the fastest decisions found, their
        simulated time (inf: none fits) and a log entry. ``swaps``: each tensor takes its
        cheaper way out, a swap (its exposed copy seconds) or a recompute, priced per byte
        (capuchin's ``rank``), the search the same.

        How many: k_fit, the fewest whose live tensors fit the budget without eviction
        (bisection on ``time_bound``'s fit: a rewrite each, no simulation), or all when none
        does; then the fastest k in [0, k_fit] on a grid of GRID points, refined around the
        best on a finer one, each simulated with the cache (``plan_evictions``) unless its
        ``time_bound`` cannot beat the best so far."""
        costs = tensor_costs(ctx, cands)
        if swaps:
            choice_of, order = rank(queued(ctx, costs))
        else:
            choice_of = {}
            order = sorted(costs, key=lambda c: (c.recompute_s / max(c.tensor.nbytes, 1),
                                                 -c.tensor.nbytes))
        if run_limit is not None:
            dropped = {id(c) for c in run_bounded(
                [c for c in order if choice_of.get(c.tensor.id, RECOMPUTE) == RECOMPUTE],
                run_limit)}
            order = [c for c in order if id(c) in dropped or choice_of.get(c.tensor.id) == SWAP]
        made: dict = {}

        def make(k):
            if k not in made:
                d = build(ctx, cands, {c.tensor.id: choice_of.get(c.tensor.id, RECOMPUTE)
                                       for c in order[:k]})
                kept = [t for t in cands if d.tensors[t.name] == KEEP]
                # a kept tensor the cache evicts comes back by time, as in the paper variant
                d.prefetch_after = swap_schedule(
                    d.steps, [t for t in cands if d.tensors[t.name] != RECOMPUTE], ctx)[1]
                made[k] = (d, kept, *time_bound(ctx, d.steps))
            return made[k]

        n = len(order)
        hi = n
        if make(n)[3]:                      # bisection for the fewest that fit
            lo = 0
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if make(mid)[3] else (mid + 1, hi)
        times: dict = {}
        best, t_best, k_best = None, float("inf"), None

        def probe(k, policy=PLANNED):
            nonlocal best, t_best, k_best
            if (k, policy.name) in times:
                return
            d, kept, bound, _ = make(k)
            if bound >= min(best_s, t_best):
                times[k, policy.name] = None    # cannot win: not simulated
                return
            d = dataclasses.replace(d, policy=policy, info={})
            d, t = plan_evictions(ctx, d, kept, min(best_s, t_best))
            times[k, policy.name] = t
            if t < t_best:
                if t < best_s:              # the best of the whole plan so far: keep its run
                    ctx.pin(d)
                best, t_best, k_best = d, t, k

        g = self.grid(ctx)
        for k in sorted({round(hi * i / g) for i in range(g + 1)}, reverse=True):
            probe(k)                        # the most recomputed first: it fits most often
        if k_best is not None:
            step = max(1, hi // g)
            for k in range(max(0, k_best - step), min(hi, k_best + step) + 1,
                           max(1, step // (g // 2))):
                probe(k)
            # the pool's order under pressure: compaction before eviction (PLANNED) moves bytes
            # on the compute stream, eviction first (the paper's pool) on the copy stream;
            # which is faster depends on the plan, so the best k is tried both ways
            probe(k_best, get_policy("superneurons"))
        tried = [t for t in times.values() if t is not None]
        entry = {"tensors_by_cost": n, "fewest_that_fit": hi if make(hi)[3] else None,
                 "probes": len(times), "simulated": len(tried), "fits": t_best < float("inf"),
                 "time_s": t_best}
        if best is not None:
            entry.update(recomputed=sum(1 for c in order[:k_best]
                                        if choice_of.get(c.tensor.id, RECOMPUTE) == RECOMPUTE),
                         policy=best.policy.name)
            if swaps:
                entry["swapped"] = k_best - entry["recomputed"]
        return best, t_best, entry

    def plan(self, ctx) -> Decisions:
        cands = droppable(ctx.schedule)
        paper, kept = self.paper(ctx, cands)
        if ctx.budget is None:
            return paper
        steps = ctx.schedule.steps
        floor = ctx.cum_time(steps)[-1]     # the compute of the schedule alone
        plain, fits = time_bound(ctx, steps)
        # name, time bound, the decisions and the tensors the cache may evict (None: no cache)
        variants = [
            ("liveness", plain if fits else float("inf"),
             lambda: (Decisions(steps, policy=get_policy("liveness"),
                                tensors={t.name: KEEP for t in cands}), None)),
            ("cache", plain, lambda: (self.cache_only(ctx, cands), cands)),
            ("paper", time_bound(ctx, paper.steps)[0], lambda: (paper, kept))]
        best, best_s, log = None, float("inf"), {}
        start = ctx.simulated_steps
        # the cap counts steps of the unchunked iteration (module doc): a chunked schedule's
        # every simulation is about ``chunks`` times longer, so the cap grows by as much
        cap = self.max_sim_steps * ctx.schedule.chunks
        effort = f"max_sim_steps {self.max_sim_steps:,}" + \
            (f" x {ctx.schedule.chunks} chunks" if ctx.schedule.chunks > 1 else "")

        def spent():                    # steps simulated by this plan so far (measured)
            return ctx.simulated_steps - start

        for name, bound, make in sorted(variants, key=lambda v: v[1]):
            entry = log[name] = {"lower_bound_s": bound}
            if bound == float("inf"):
                entry["skipped"] = "its live bytes exceed the budget"
                continue
            if bound >= best_s:
                entry["skipped"] = "bound no better than the best time"
                continue
            if best_s <= floor:
                entry["skipped"] = "the best time is the compute alone"
                continue
            cost = len(paper.steps if name == "paper" else steps)     # one simulation
            if spent() and spent() + cost > cap:
                entry["skipped"] = f"planning effort: {spent():,} steps simulated, {effort}"
                continue
            d, mine = make()
            if mine is None:
                r = ctx.evaluate(d)
                t = r["time_s"]
            else:       # the cache forms: the planned one is a second simulation
                d, t = plan_evictions(ctx, d, mine, best_s,
                                      planned_ok=spent() + 2 * cost <= cap)
                entry.update(d.info.get("evictions", {}))
            entry.update(fits=t < float("inf"), time_s=t)
            if t < best_s:
                best, best_s = (name, d), t
                ctx.pin(d)
        # what a search will simulate: at first the most it could, then what the last one did
        cost_steps = self.cost_effort(len(cands), len(steps), self.grid(ctx))
        l_peak = max(s.resident_bytes() for s in steps)

        def search(name, limit, swaps=False):
            nonlocal best, best_s, cost_steps
            if spent() + cost_steps > cap:
                log[name] = {"skipped": f"planning effort: {spent():,} steps simulated, about "
                                        f"{cost_steps:,} more, {effort}"}
                return
            before = spent()
            d, t, entry = self.recompute_by_cost(ctx, cands, best_s, limit, swaps)
            cost_steps = entry["simulated_steps"] = spent() - before
            log[name] = entry
            if t < best_s:
                best, best_s = (name, d), t

        # by price alone, then with runs held to l_peak (the paper's segment rule) where the
        # effort allows: neither is faster everywhere (ResNet-50 at 0.3x the liveness peak:
        # 38.3 ms by price alone, 28.7 with runs held; DenseNet-121 at 0.5x: 23.2 and 24.8)
        limits = {"cost-greedy": None, "cost": l_peak}
        for name, limit in limits.items():
            search(name, limit)
        # then each tensor's cheaper way out, swap or recompute, in the form (runs held or
        # not) that was faster above
        # (where no swap is cheaper, its order is the recompute order: the same search again;
        # priced only within the effort, pricing 10^4 layers' tensors takes a second)
        if spent() + cost_steps <= cap and \
                not any(c == SWAP for c in rank(tensor_costs(ctx, cands))[0].values()):
            log["cost-swap"] = {"skipped": "no tensor's swap is cheaper than its recompute"}
        else:
            times = {n: log[n].get("time_s", float("inf")) for n in limits}
            search("cost-swap", limits[min(times, key=times.get)], swaps=True)
        if not self.polish:
            log["polish"] = {"skipped": "off (superneurons:polish=0)"}
        elif best is None:
            log["polish"] = {"skipped": "no candidate fits"}
        elif best_s <= floor:
            log["polish"] = {"skipped": "the best time is the compute alone"}
        elif spent() + 2 * len(best[1].steps) > cap:       # its start and one change
            log["polish"] = {"skipped": f"planning effort: {spent():,} steps simulated, "
                                        f"{effort}"}
        else:
            # last, one-tensor changes of the best plan's choice, in what is left of the
            # effort (polish.py: an order's prefix cannot mix swaps and recomputes by where
            # the excess is)
            d, t, entry = polish(ctx, cands, choice_of(best[1], cands), cap - spent())
            log["polish"] = {"from": best[0], **entry}
            if t < best_s:
                best, best_s = ("polish", d), t
        if best is None:                    # nothing fits: the paper's plan and its error
            best = ("paper", paper)
        name, d = best
        d.info["variant"] = name
        if ctx.schedule.chunks > 1:
            d.info["paper_variant"] = "chunks: the policy's own plan (its recompute is by layers)"
        d.info["candidates"] = log
        return d


def run_bounded(order: list, limit: int) -> list:
    """The TensorCosts of ``order`` (cheapest first) that can be dropped together while every
    run of dropped tensors (linked by recompute chains: rewrite.chains) holds at most ``limit``
    bytes. A recompute brings a whole run back at its first backward use and holds it until each
    tensor's own (speed-centric), so a run is the bytes that come back at once: the paper's
    cost-aware rule keeps a segment speed-centric only under l_peak, the largest per-step need.
    A tensor that would join runs past the limit is skipped (kept; the cache takes it)."""
    children: dict = {}
    for c in order:
        for u in c.inputs:
            children.setdefault(u, []).append(c.tensor.id)
    parent: dict = {}
    size: dict = {}

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    out = []
    for c in order:
        i = c.tensor.id
        runs = {root(u) for u in (*c.inputs, *children.get(i, ())) if u in parent}
        total = c.tensor.nbytes + sum(size[r] for r in runs)
        if total > limit:
            continue
        parent[i], size[i] = i, total
        for r in runs:
            parent[r] = i
        out.append(c)
    return out


def time_bound(ctx, steps) -> tuple[float, bool]:
    """A lower bound on the simulated time of running ``steps`` in the budget with the tensor
    cache, and whether their live tensors fit the budget with nothing evicted. The bound: their
    compute, and at each step k where the live non-persistent tensors exceed what the budget
    leaves them by X bytes, those X bytes were copied out before step k and must be copied back
    after it on the one copy stream, so time >= max(compute before k, X / bw) +
    max(compute from k on, X / bw), where under compression bw counts the tensor bytes a
    compressed copy carries (``PlanContext.copy_fraction``, the fewest: a tensor that is not
    a feature map, or goes uncompressed for want of a staging block, moves more)."""
    cum = ctx.cum_time(steps)
    total = cum[-1]
    ex = ctx._ex
    on_host = ex.host_blocks()
    avail = ctx.budget - sum(t.nbytes for t in ex.persistent if t.id not in on_host)
    bw = ctx.cost.copy_bandwidth / ctx.copy_fraction    # tensor bytes per second copied
    frees = ctx.frees(steps, True)
    seen: set = set()
    live, bound, fits = 0, total, True
    for k, s in enumerate(steps):
        for t in s.writes:
            if not t.persistent and t.id not in seen:
                seen.add(t.id)
                live += t.nbytes
        if live > avail:
            fits = False
            x = (live - avail) / bw
            c = cum[k]
            b = max(c, x) + max(total - c, x)
            if b > bound:
                bound = b
        for t in frees[k]:
            live -= t.nbytes
    return bound, fits


def plan_evictions(ctx, d: Decisions, kept, best_s: float = float("inf"),
                   planned_ok: bool = True):
    """``d`` with the LRU cache's evictions (found by simulating it) offloaded by plan, if the
    simulated clock finds that faster; and its simulated time (inf: it does not fit). The
    planned form is not simulated where it cannot win: each of its offloads is copied out and
    back on the one copy stream, so its time is at least those copies, and it must beat both
    the LRU form and ``best_s`` (another candidate's time); nor where ``planned_ok`` is false
    (the planner's effort is spent)."""
    r = ctx.simulate(d, events=True)
    if not r["fits"]:
        return d, float("inf")
    # the LRU plan's time from the simulation already run (one simulation fewer: planning a
    # 10^4-layer ResNet is held to 10 s)
    before = makespan(r["events"], d.steps, ctx.batch, ctx.cost).makespan_s
    by_id = {t.id: t for t in kept}
    evicted = list({e[1]: by_id[e[1]] for e in r["events"]
                    if e[0] == "offload" and e[1] in by_id}.values())
    if not evicted:
        return d, before
    copies = 2 * sum(ctx.copy_cost(t)[0] for t in evicted)
    if copies >= min(before, best_s) or not planned_ok:
        d.info["evictions"] = {"tensors": len(evicted), "lru_time_s": before,
                               "planned_time_s": None, "planned_bound_s": copies,
                               "planned": False}
        if not planned_ok:
            d.info["evictions"]["planned_skipped"] = "planning effort (max_sim_steps)"
        return d, before
    offload_after, _ = swap_schedule(d.steps, evicted, ctx)
    planned = dataclasses.replace(
        d, offload_after=offload_after, info=dict(d.info),
        release_after=release_points(d.steps, offload_after, d.prefetch_after, ctx),
        tensors={**d.tensors, **{t.name: SWAP for t in evicted}})
    after = ctx.evaluate(planned)
    choice = planned if after["fits"] and after["time_s"] < before else d
    choice.info["evictions"] = {"tensors": len(evicted), "lru_time_s": before,
                                "planned_time_s": after["time_s"],
                                "planned": choice is planned}
    return choice, min(before, after["time_s"])
