"""HOME (He et al., seed 003): retain / swap / recompute per tensor by particle-swarm search,
with the simulator as the fitness function.

A policy is a vector in {0, 1, 2}^n (0 retain, 1 swap, 2 recompute; HOME's §3 encoding), one
entry per forward activation that backward reads (``droppable``). Its fitness is the
simulated iteration time of the decisions it builds (capuchin.build: recompute rewrite, eager
offload and prefetch by time), run by the same executor simulation every planner uses;
an infeasible policy scores ``INFEASIBLE_S`` plus its bytes over the budget (per GB), so
every feasible policy beats every infeasible one and nearer misses rank first.

The swarm is seeded with the superneurons plan's own choice (its local search included,
polish.py; ``home:polish=0`` seeds with its cost searches' plan alone), all-retain, all-swap,
all-recompute, the rest uniform at random (``seed``). The superneurons plan itself (its
cost-aware recompute and LRU tensor cache, which a vector cannot express) is evaluated too
and returned when no particle beats it, so HOME is never worse than superneurons.

Update (a deviation from HOME's Algorithm 3, stated): HOME takes each coordinate from the
last iteration's best (P1) or the particle's own best (P2), whichever the full simulator
prefers, which costs 2n simulations per particle per iteration (the paper's own Table 3 times
cannot be reached that way either, other-seeds.md §3.5). Here each coordinate is drawn from
P1 (p=0.5), P2 (p=0.3) or the current value, with a mutation of probability 1/n, and each
particle costs one simulation per iteration. The search stops after ``iterations`` or
``search_seconds`` (CPU seconds of this process: the cores may be shared, and wall time then
measures other jobs), whichever comes first (only the iteration limit is deterministic).
The convolution workspace is not a dimension: the cost model has one algorithm per layer.

COMPRESS (FreeLunch, seed 002) as a fourth code where the user allows lossy compression
(``home:compress=2|4``, ``--planner home --compress R``): 3 = swap compressed at that rate, so
the swarm decides per tensor whether a compressed copy (fewer bytes, a codec pass each way)
beats a full-size swap, a recompute or keeping it; only those tensors are compressed (other
planners under ``--compress`` compress every feature map they send to the host,
planners/compress.py).
"""
from __future__ import annotations

import time

import numpy as np

from ..codecs import get_codec
from .base import COMPRESS, KEEP, SWAP, Decisions, Planner
from .choice import CODES, build
from .rewrite import droppable
from .superneurons import SuperNeurons

INFEASIBLE_S = 1e3


class Home(Planner):
    name = "home"
    description = "particle-swarm search over retain/swap/recompute, seeded with superneurons"

    plans_compression = True      # get_planner passes compress=R here, not to the wrapper

    def __init__(self, seed: int = 0, search_seconds: float = 30.0, swarm: int = 12,
                 iterations: int = 40, compress: int | None = None, polish: int = 1):
        if swarm < 4 or iterations < 1 or search_seconds <= 0:
            raise ValueError(f"home: swarm >= 4, iterations >= 1 and search_seconds > 0, got "
                             f"swarm={swarm} iterations={iterations} "
                             f"search_seconds={search_seconds}")
        self.seed, self.search_seconds = int(seed), float(search_seconds)
        self.swarm, self.iterations = int(swarm), int(iterations)
        self.seed_planner = SuperNeurons(polish=polish)     # polish=0: its searches alone
        self.rate = get_codec(compress).rate if compress else None
        self.codes = CODES + ((COMPRESS,) if self.rate else ())
        if self.rate:
            self.name = f"home+compress{self.rate}"

    def decisions(self, ctx, cands, vec) -> Decisions:
        codes = [self.codes[c] for c in vec]
        d = build(ctx, cands, {t.id: SWAP if c == COMPRESS else c
                               for t, c in zip(cands, codes) if c != KEEP})
        squeezed = [t for t, c in zip(cands, codes) if c == COMPRESS]
        if squeezed:
            d.compress = {t.id: self.rate for t in squeezed}
            d.tensors.update({t.name: COMPRESS for t in squeezed})
            d.info["compress_rate"] = self.rate
            d.info["codec"] = get_codec(self.rate).name
        return d

    def fitness(self, ctx, d: Decisions) -> float:
        try:
            r = ctx.evaluate(d)
        except Exception:               # a decision set the executor cannot run
            return 2 * INFEASIBLE_S
        if r["fits"]:
            return r["time_s"]
        over = (ctx.simulate(d, None)["peak_bytes"] or 0) - ctx.budget
        return INFEASIBLE_S + max(over, 0) / 1e9

    def plan(self, ctx) -> Decisions:
        t0, c0 = time.perf_counter(), time.process_time()
        cands = droppable(ctx.schedule)
        sn = self.seed_planner.plan(ctx)
        if ctx.budget is None or not cands:
            return sn
        n, rng = len(cands), np.random.default_rng(self.seed)
        k = len(self.codes)
        cache: dict[bytes, float] = {}

        def score(vec) -> float:
            key = vec.tobytes()
            if key not in cache:
                cache[key] = self.fitness(ctx, self.decisions(ctx, cands, vec))
            return cache[key]

        sn_score = self.fitness(ctx, sn)
        sn_vec = np.array([CODES.index(sn.tensors.get(t.name, KEEP)) for t in cands], np.int8)
        # seeds: superneurons' choice, then each code everywhere (all-retain, all-swap, ...)
        swarm = [sn_vec] + [np.full(n, c, np.int8) for c in range(k)][:self.swarm - 1]
        swarm += [rng.integers(0, k, n).astype(np.int8) for _ in range(self.swarm - len(swarm))]
        best_own = [v.copy() for v in swarm]
        own_score = [np.inf] * self.swarm
        best_vec, best = sn_vec.copy(), np.inf
        curve, it, timed_out = [], 0, False
        for it in range(1, self.iterations + 1):
            scores = []
            for i, v in enumerate(swarm):
                s = score(v)
                scores.append(s)
                if s < own_score[i]:
                    own_score[i], best_own[i] = s, v.copy()
                if s < best:
                    best, best_vec = s, v.copy()
                if time.process_time() - c0 > self.search_seconds:
                    timed_out = True
                    break
            feasible = [s for s in scores if s < INFEASIBLE_S]
            curve.append({"iteration": it, "best_s": best if best < INFEASIBLE_S else None,
                          "iteration_best_s": min(feasible) if feasible else None,
                          "mean_s": float(np.mean(feasible)) if feasible else None,
                          "worst_s": max(feasible) if feasible else None,
                          "feasible": len(feasible), "particles": len(scores),
                          "elapsed_s": round(time.perf_counter() - t0, 3),
                          "elapsed_cpu_s": round(time.process_time() - c0, 3)})
            if timed_out:
                break
            p1 = swarm[int(np.argmin(scores))].copy()
            for i, v in enumerate(swarm):
                r = rng.random(n)
                nv = np.where(r < 0.5, p1, np.where(r < 0.8, best_own[i], v))
                mutate = rng.random(n) < 1.0 / n
                nv[mutate] = rng.integers(0, k, int(mutate.sum()))
                swarm[i] = nv.astype(np.int8)
        if best < sn_score:
            d, chosen = self.decisions(ctx, cands, best_vec), "swarm"
        else:
            d, chosen = sn, "superneurons (seed)"
        d.info.update({
            "search_s": round(time.perf_counter() - t0, 3),
            "search_cpu_s": round(time.process_time() - c0, 3), "swarm": self.swarm,
            "iterations": it, "iteration_limit": self.iterations,
            "search_seconds_limit": self.search_seconds, "stopped_by_time": timed_out,
            "evaluations": len(cache), "seed": self.seed, "tensors": n, "chosen": chosen,
            "superneurons_s": sn_score if sn_score < INFEASIBLE_S else None,
            "best_s": min(best, sn_score) if min(best, sn_score) < INFEASIBLE_S else None,
            "convergence": curve})
        return d
