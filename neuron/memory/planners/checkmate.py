"""The optimum as a mixed-integer program (Checkmate, Jain et al. 2020, in this runtime's
decision space), solved by HiGHS through ``scipy.optimize.milp``.

Variables per tensor that backward reads: r_i (recompute) and s_i (swap), binary, r_i + s_i
<= 1. Memory, per step k: the liveness plan's bytes at k, minus every recomputed tensor whose
gap (last forward use, first backward use) contains k and every swapped one between its
block's release (swap.copy_walk) and its prefetch (swap.prefetch_step), plus
- the early version of a recomputed tensor: a recompute of j re-runs the dropped tensors it
  reads first and keeps them until their own use, e_ik >= r_i + (j made by step k) - 1;
- the inputs a recompute keeps alive until it runs;
- a swapped input u of a recomputed i, back early for i's recompute: b_uk >= r_i + s_u - 1;
at most the budget. Objective (microseconds: HiGHS's absolute gap ended few-microsecond solves
early): r_i * (the chain's forward) + s_i * (copy time its free time cannot hide) + a_iu * (what
the earlier deadline adds to u's exposed copy) + a tie-break on bytes moved. A convolution
counts with no workspace (the executor gives it none when short).

It is the optimum of that model, not of every schedule: the plan then runs through the
executor and the simulator like every planner's. Fragmentation and copy contention are outside
the model, so the budget is tightened (x0.95, x0.9, ...) until the planned moves fit; where
none fits, one more variable prices the bytes the tensor cache must evict. The copy stream is
one queue, so the program is solved four ways (swaps priced alone, queued, busy, and the stream
as flow: checkmate_stream.py) and the fastest plan kept; under compression, with compressed
and full-size swap costs. ``checkmate:polish=1`` polishes the result on the simulator's clock
(polish.py). Solver limit, status and gap: ``Decisions.info``. Measured effects:
docs/planners.md and bench/results/planners.md.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time

import numpy as np

from .base import Decisions, Planner, RECOMPUTE, SWAP
from .checkmate_stream import US, CopyStream
from .choice import build, choice_of
from .costs import queued, tensor_costs
from .estimate import liveness_bytes, needed_workspace
from .polish import polish
from .rewrite import droppable
from .swap import copy_walk, lead_s, prefetch_step

MAX_STEPS = 400             # the model grows with steps x tensors; meant for ~150-step graphs
TIME_LIMIT_S = 20.0
MARGINS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)
MiB = 1 << 20


class Checkmate(Planner):
    name = "checkmate"
    description = "MILP optimum of per-tensor keep/swap/recompute under the budget (HiGHS)"
    time_limit_s = TIME_LIMIT_S

    def __init__(self, polish: int = 0, polish_steps: int = 150_000):
        if polish not in (0, 1) or polish_steps < 0:
            raise ValueError(f"checkmate: polish must be 0 or 1 and polish_steps >= 0, got "
                             f"polish={polish!r} polish_steps={polish_steps}")
        self.polish, self.polish_steps = bool(polish), int(polish_steps)
        if self.polish:
            self.name = "checkmate+polish"

    def plan(self, ctx) -> Decisions:
        try:
            from scipy.optimize import milp  # noqa: F401
        except ImportError:
            raise ValueError("the checkmate planner needs scipy >= 1.11 (HiGHS MILP): "
                             "pip install 'neuron-arena[planners]'") from None
        steps = ctx.schedule.steps
        if len(steps) > MAX_STEPS:
            k = ctx.schedule.chunks
            raise ValueError(f"checkmate: {len(steps)} steps; the MILP is for graphs up to "
                             f"{MAX_STEPS} steps (about 150 layers" +
                             (f", fewer with --chunks: {k} chunks make {k} steps of each "
                              "layer step)" if k > 1 else ")"))
        cands = droppable(ctx.schedule)
        if ctx.budget is None:
            return build(ctx, cands, {})
        info = {"time_limit_s": self.time_limit_s, "attempts": []}
        d, best, best_t = None, None, float("inf")

        def attempt_at(model, cap, evict, margin, label):
            """Solve, build, simulate; keep the fastest that fits. -> whether it fits alone
            (None: the program is infeasible at this cap)."""
            nonlocal d, best, best_t
            x, attempt = model.solve(cap, evict, self.time_limit_s)
            attempt["margin"] = margin
            if label:
                attempt["costs"] = label
            info["attempts"].append(attempt)
            if x is None:
                return None
            cand = build(ctx, cands, model.choice(x))
            ev = ctx.evaluate(cand, static=True)
            attempt["fits"] = ev["fits"]
            if not ev["fits"]:                  # the tensor cache takes what the model missed
                ev = ctx.evaluate(cand)
                attempt["fits_with_cache"] = ev["fits"]
            attempt["time_s"] = ev["time_s"]
            if ev["fits"] and ev["time_s"] < best_t:
                d, best_t, best = cand, ev["time_s"], attempt
                ctx.pin(d)
            return attempt["fits"]

        objectives = []
        # under compression the program is solved with the compressed copies' costs and with
        # full-size ones (see the module's docstring), the fastest plan kept
        hows = ("alone", "queued", "busy") + (("stream",) if ctx.cost.spec.async_copies
                                              else ())
        for (compressed, label), how in [(p, h) for p in ctx.copy_pricings() for h in hows]:
            costs = tensor_costs(ctx, cands, compressed, how == "busy")
            if how == "queued":
                costs = queued(ctx, costs)
            model = Model(ctx, costs, compressed, how == "busy", how == "stream")
            label = ", ".join(x for x in (label, None if how == "alone" else how) if x) or None
            if any(np.array_equal(model.c_obj, o) for o in objectives):
                continue                        # the same program
            objectives.append(model.c_obj)
            info["variables"] = 2 * model.n
            alone = None
            for margin in MARGINS:
                # stop once a plan fits alone, or the cap is infeasible (tighter ones are too)
                alone = attempt_at(model, ctx.budget * margin, False, margin, label)
                if alone in (True, None):
                    break
            if not alone:
                # no plan fits alone: the cache's variable, for each program (either one's
                # cache plan may be the faster)
                attempt_at(model, ctx.budget, True, "cache", label)
        if d is None:
            d = build(ctx, cands, {})
        elif self.polish:
            # the MILP's plan refined on the simulator's clock (polish.py): where that is
            # faster, the model's optimum is not the simulator's, and the polished plan is
            # the best known reference
            p, t, log = polish(ctx, cands, choice_of(d, cands), self.polish_steps)
            info["polish"] = {"milp_time_s": best_t, **log}
            if t < best_t:
                d = p
        best = best or (info["attempts"][-1] if info["attempts"] else {})
        info.update(gap=best.get("gap"), status=best.get("message"), margin=best.get("margin"))
        d.info.update(info)
        return d


class Model:
    """The MILP's data for one plan: tensors, per-step liveness bytes, chain structure."""

    def __init__(self, ctx, costs, compressed: bool = True, busy: bool = False,
                 stream: bool = False):
        steps, ex = ctx.schedule.steps, ctx._ex
        # a swap is off the device after the step its block is released after: by the clock,
        # or, priced busy, the step after its offload (where the arena is short the pool
        # releases a held block early, waiting for its copy: the wait busy pricing counts)
        self.off_after = [c.last_fwd + 1 if busy else c.held_after for c in costs]
        self.costs, self.n, self.nsteps = costs, len(costs), len(steps)
        self.stream = CopyStream(ctx, costs) if stream else None
        self.mem = liveness_bytes(steps, ex.persistent, needed_workspace, ex.block)
        self.idx = {c.tensor.id: i for i, c in enumerate(costs)}
        last_use, nbytes = {}, {}
        for k, s in enumerate(steps):
            for t in s.reads + s.writes:
                last_use[t.id], nbytes[t.id] = k, t.nbytes
        # a recompute keeps its chain's inputs alive until it runs: (input bytes, from, to)
        self.held = [[(nbytes[u], last_use[u], c.first_bwd) for u in c.inputs
                      if u in last_use and last_use[u] < c.first_bwd] for c in costs]
        # chains: a recompute of j re-runs every dropped tensor it reads first
        self.children = [[] for _ in costs]
        for j, c in enumerate(costs):
            for u in c.inputs:
                if u in self.idx:
                    self.children[self.idx[u]].append(j)
        self.by_bwd = sorted(range(self.n), key=lambda i: costs[i].first_bwd)
        self.back_early = self._back_early(ctx, costs)
        swap_s = self.stream.stall_s if stream else [c.exposed_s for c in costs]
        self.c_obj = np.array([c.recompute_s for c in costs] +
                              [w + 1e-3 * c.swap_s for w, c in zip(swap_s, costs)])
        if stream:
            self.c_obj = np.concatenate([self.c_obj, self.stream.objective()])
        self.evict_s_per_mib = ctx.evict_s_per_byte(compressed, MiB) * MiB    # priced as the swaps

    def _back_early(self, ctx, costs) -> list:
        """(u, i, p, seconds) for each swapped-input case the model allows: a recompute of i
        reads candidate u, so where both are chosen u's prefetch serves i's recompute (the
        executor brings it back once, timed to its first later reader: swap.swap_schedule on
        the rewritten steps) and u is back from after step p on instead of after its own
        prefetch step; seconds: what that earlier deadline adds to u's exposed copy, priced
        alone (swap.copy_walk). Only the direct reader's deadline: where i itself is made
        early by a recomputed child's chain, u comes back earlier still, which the simulation
        of the plan counts."""
        cum = ctx.cum_time(ctx.schedule.steps)
        out = []
        for i, c in enumerate(costs):
            for uid in c.inputs:
                u = self.idx.get(uid)
                if u is None:
                    continue
                cu, one = costs[u], costs[u].swap_s / 2
                j = c.first_bwd
                p = prefetch_step(cum, cu.last_fwd, j, lead_s(ctx, cu.tensor))
                added = 0.0
                if ctx.cost.spec.async_copies:
                    def wait(p, j):
                        return copy_walk(cum, [(uid, cu.last_fwd, p, j, one, one, 0.0)])[uid][1]
                    added = max(0.0, wait(p, j) - wait(cu.prefetch_after, cu.first_bwd))
                out.append((u, i, min(p, cu.prefetch_after), added))
        return out

    def choice(self, x) -> dict:
        x, n = np.round(x).astype(int), self.n
        return {c.tensor.id: RECOMPUTE if x[i] else SWAP
                for i, c in enumerate(self.costs) if x[i] or x[n + i]}

    def solve(self, cap: float, evict: bool, time_limit_s: float, fixed: dict | None = None):
        """-> (solution or None, attempt record). ``evict``: one more variable, the MiB the
        tensor cache evicts at the worst step (copied out and back). ``fixed``: column ->
        value, the choice given (tests price a given plan by the model)."""
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
        costs, n = self.costs, self.n
        rows = [k for k in range(self.nsteps) if self.mem[k] > cap]
        base = len(self.c_obj)                  # r, s and the copy stream's columns first
        # early[i, k]: column of "i's recomputed version is already back at step k of its gap"
        early = {}
        for i in self.by_bwd:                   # children (made first in backward) first
            c = costs[i]
            for k in rows:
                if c.last_fwd < k < c.first_bwd and any(
                        k >= costs[j].first_bwd or (j, k) in early for j in self.children[i]):
                    early[i, k] = base + len(early)
        # back[u, k]: (column of "swapped u is back at step k for a recompute that reads it",
        # each such i whose deadline brings u back by k: the column >= r_i + s_u - 1)
        back = {}
        for k in rows:
            for u, i, p, _ in self.back_early:
                if max(p, self.off_after[u]) < k <= costs[u].prefetch_after:
                    back.setdefault((u, k), (base + len(early) + len(back), []))[1].append(i)
        # and[m]: column of "recompute i and swap its input u" (the added exposed copy)
        priced = [m for m, (*_, added) in enumerate(self.back_early) if added > 0]
        ands = {m: base + len(early) + len(back) + q for q, m in enumerate(priced)}
        ev_col = base + len(early) + len(back) + len(ands)
        nv = ev_col + (1 if evict else 0)
        ri, ci, val, lo, hi = [], [], [], [], []

        def row(entries, low, high=np.inf):
            for col, v in entries:
                ri.append(len(lo)), ci.append(col), val.append(v)
            lo.append(low), hi.append(high)

        for k in rows:                          # bytes saved at k cover the excess
            e = [(ev_col, MiB)] if evict else []
            for i, c in enumerate(costs):
                if c.last_fwd < k < c.first_bwd:
                    e.append((i, c.tensor.nbytes))
                    if (i, k) in early:
                        e.append((early[i, k], -c.tensor.nbytes))
                if self.off_after[i] < k <= c.prefetch_after:  # off the device
                    e.append((n + i, c.tensor.nbytes))
                    if (i, k) in back:
                        e.append((back[i, k][0], -c.tensor.nbytes))
                for b, a, z in self.held[i]:
                    if a < k < z:
                        e.append((i, -b))
            row(e, self.mem[k] - cap)
        for i in range(n):                      # one choice per tensor
            row([(i, 1), (n + i, 1)], 0, 1)
        for (u, k), (col, readers) in back.items():   # swapped u back early for a recompute
            for i in readers:
                row([(col, 1), (i, -1), (n + u, -1)], -1)
        for m, col in ands.items():
            u, i, _, _ = self.back_early[m]
            row([(col, 1), (i, -1), (n + u, -1)], -1)
        for (i, k), col in early.items():       # e_ik >= r_i AND (child j made by step k)
            for j in self.children[i]:
                made = j if k >= costs[j].first_bwd else early.get((j, k))
                if made is not None:
                    row([(col, 1), (i, -1), (made, -1)], -1)
        if self.stream:
            self.stream.constraints(row)
        A = coo_matrix((val, (ri, ci)), shape=(len(lo), nv)).tocsr()
        obj = np.concatenate([self.c_obj, np.zeros(nv - base)])
        for m, col in ands.items():
            obj[col] = self.back_early[m][3]
        integrality = np.concatenate([np.ones(2 * n), np.zeros(nv - 2 * n)])
        upper = np.ones(nv)
        upper[2 * n:base] = np.inf             # the copy stream's flows and waits
        lower = np.zeros(nv)
        for col, v in (fixed or {}).items():
            lower[col] = upper[col] = v
        if evict:
            obj[ev_col], upper[ev_col] = self.evict_s_per_mib, np.inf
        t0 = time.perf_counter()
        # in microseconds: HiGHS's absolute gap tolerance (1e-6) against objectives in
        # seconds (a few us of overhead on a small graph) ended solves at gaps of 5% as optimal
        with solver_output_held():
            res = milp(obj * US, integrality=integrality, bounds=Bounds(lower, upper),
                       constraints=LinearConstraint(A, lo, hi),
                       options={"time_limit": time_limit_s, "mip_rel_gap": 1e-4})
        attempt = {"early_columns": len(early), "back_early_columns": len(back) + len(ands),
                   "status": res.status, "message": res.message,
                   "solve_s": round(time.perf_counter() - t0, 3),
                   "gap": getattr(res, "mip_gap", None),
                   "objective_s": None if res.x is None else float(res.fun) / US}
        if evict and res.x is not None:
            attempt["evicted_mib"] = round(float(res.x[ev_col]), 3)
        return res.x, attempt


@contextlib.contextmanager
def solver_output_held():
    """HiGHS's C++ writes to the process's stdout and stderr whatever ``disp`` says (lines
    such as "HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();", by
    the dozen in a benchmark's log): hold file descriptors 1 and 2 in a temporary file while
    it solves, and pass what it wrote on to stderr only if the solve raised."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    failed = False
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 1)
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            if failed:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))
