"""The optimum as a mixed-integer program (Checkmate, Jain et al. 2020, in this runtime's
decision space), solved by HiGHS through ``scipy.optimize.milp``.

Variables per tensor that backward reads: s_i (swap) and r_i (recompute), binary, s_i + r_i
<= 1. Memory, per step k: the liveness plan's bytes at k (every tensor from its producing step
to its last use, plus what stays resident and the step's workspace) minus the bytes of every
dropped tensor whose gap (last forward use, first backward use) contains k, at most the
budget, plus the inputs a recompute keeps alive until it runs. A recompute re-runs its
producer from inputs that are still there: r_i + s_u <= 1 for its inputs u. Objective: simulated seconds added, r_i * (producer forward) + s_i * (copy
time its free time cannot hide) + a tie-break on bytes moved.

This is the optimum of that model, not of every schedule (Checkmate proper also re-orders and
re-materializes at any step): the decisions then run through the executor and the simulator
like every planner's. The pool's fragmentation is outside the model, so the budget in the
MILP is tightened (x0.95, x0.9, ...) until the simulated plan fits. The solver's time limit,
status and optimality gap are reported in ``Decisions.info``.
"""
from __future__ import annotations

import time

import numpy as np

from .base import Decisions, Planner, RECOMPUTE, SWAP
from .choice import build
from .costs import tensor_costs
from .estimate import liveness_bytes
from .rewrite import droppable

MAX_STEPS = 400             # the model grows with steps x tensors; meant for ~150-step graphs
TIME_LIMIT_S = 20.0
MARGINS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.5)


class Checkmate(Planner):
    name = "checkmate"
    description = "MILP optimum of per-tensor keep/swap/recompute under the budget (HiGHS)"
    time_limit_s = TIME_LIMIT_S

    def plan(self, ctx) -> Decisions:
        try:
            from scipy.optimize import Bounds, LinearConstraint, milp
            from scipy.sparse import lil_matrix
        except ImportError:
            raise ValueError("the checkmate planner needs scipy >= 1.11 (HiGHS MILP): "
                             "pip install 'neuron[planners]'") from None
        steps = ctx.schedule.steps
        if len(steps) > MAX_STEPS:
            raise ValueError(f"checkmate: {len(steps)} steps; the MILP is for graphs up to "
                             f"{MAX_STEPS} steps (about 150 layers)")
        cands = droppable(ctx.schedule)
        if ctx.budget is None:
            return build(ctx, cands, {})
        costs = tensor_costs(ctx, cands)
        n = len(costs)
        ex = ctx._ex
        mem = liveness_bytes(steps, ex.persistent, lambda s: s.workspace_bytes, ex.block)
        idx = {c.tensor.id: i for i, c in enumerate(costs)}
        last_use, nbytes = {}, {}
        for k, s in enumerate(steps):
            for t in s.reads + s.writes:
                last_use[t.id], nbytes[t.id] = k, t.nbytes
        # a recompute keeps its producer's inputs alive until it runs: (input bytes, from, to)
        held = [[(nbytes[u], last_use[u], c.first_bwd) for u in c.inputs
                 if u in last_use and last_use[u] < c.first_bwd] for c in costs]
        c_obj = np.array([c.recompute_s for c in costs] +
                         [c.exposed_s + 1e-3 * c.swap_s for c in costs])
        info = {"variables": 2 * n, "time_limit_s": self.time_limit_s, "attempts": []}
        d = None
        for margin in MARGINS:
            cap = ctx.budget * margin
            rows = [k for k in range(len(steps)) if mem[k] > cap]
            A = lil_matrix((len(rows) + n + 4 * n, 2 * n))
            lo, hi = [], []
            for r, k in enumerate(rows):
                for i, c in enumerate(costs):
                    if c.last_fwd < k < c.first_bwd:
                        A[r, i] = A[r, n + i] = c.tensor.nbytes
                    for b, a, e in held[i]:
                        if a < k < e:
                            A[r, i] -= b
                lo.append(mem[k] - cap)
                hi.append(np.inf)
            r = len(rows)
            for i in range(n):                  # one choice per tensor
                A[r, i] = A[r, n + i] = 1
                lo.append(0), hi.append(1)
                r += 1
            for i, c in enumerate(costs):       # recompute from inputs that are not swapped
                for u in c.inputs:
                    if u in idx:
                        A[r, i] = A[r, n + idx[u]] = 1
                        lo.append(0), hi.append(1)
                        r += 1
            A = A[:r].tocsr()
            t0 = time.perf_counter()
            res = milp(c_obj, integrality=np.ones(2 * n), bounds=Bounds(0, 1),
                       constraints=LinearConstraint(A, lo, hi),
                       options={"time_limit": self.time_limit_s, "mip_rel_gap": 1e-4})
            attempt = {"margin": margin, "status": res.status, "message": res.message,
                       "solve_s": round(time.perf_counter() - t0, 3),
                       "gap": getattr(res, "mip_gap", None),
                       "objective_s": None if res.x is None else float(res.fun)}
            info["attempts"].append(attempt)
            if res.x is None:
                continue                         # infeasible at this cap: tighter is too
            x = np.round(res.x).astype(int)
            choice = {}
            for i, c in enumerate(costs):
                if x[i]:
                    choice[c.tensor.id] = RECOMPUTE
                elif x[n + i]:
                    choice[c.tensor.id] = SWAP
            d = build(ctx, cands, choice)
            ev = ctx.evaluate(d, static=True)
            attempt["fits"] = ev["fits"]
            if ev["fits"]:
                break
        if d is None:
            d = build(ctx, cands, {})
        last = info["attempts"][-1] if info["attempts"] else {}
        info.update(gap=last.get("gap"), status=last.get("message"))
        d.info.update(info)
        return d
