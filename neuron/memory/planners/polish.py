"""Local search over a per-tensor choice: the refinement superneurons and HOME end with.

A plan's choice (tensor -> KEEP | SWAP | RECOMPUTE, and COMPRESS where the caller allows it)
is changed one tensor at a time; a change is kept when the simulated clock finds the plan it
builds (choice.build: recompute rewrite, planned offloads, prefetch by time, the tensor cache
for the rest) faster, and the search stops after a pass over every tensor changes nothing,
or when its effort (steps simulated, counted by the plan context) is spent. First
improvement, in a fixed order: deterministic.

Why: the cost searches of superneurons choose by an order of prices (recompute per byte,
the copy stream's queue), and a prefix of an order cannot mix swaps and recomputes by where
the bytes over the budget are. On resnet_cifar 20 at 0.3x the liveness peak no prefix of
those orders came within 10% of the MILP (+23.0%); the MILP's plan spreads swaps over all
three stages, so the copy stream is busy everywhere, and recomputes the rest. One-tensor
moves from superneurons' best reach it (bench/results/planners.md).
"""
from __future__ import annotations

from .base import KEEP, RECOMPUTE, SWAP
from .choice import build

CODES = (KEEP, SWAP, RECOMPUTE)


def polish(ctx, cands, choice: dict, max_steps: int, codes=CODES, make=None) -> tuple:
    """The fastest choice found from ``choice`` (tensor id -> code; absent: KEEP) by
    one-tensor changes, within ``max_steps`` simulated steps; ``choice`` itself is simulated
    first (as built here: a plan chosen another way, such as the LRU cache's, may run
    differently). ``make(choice)`` builds the decisions (default ``choice.build``). Returns
    (the fastest decisions that fit, None where none did or the effort allowed none; their
    simulated time, inf if none; a log entry)."""
    make = make or (lambda ch: build(ctx, cands, ch))
    start = ctx.simulated_steps
    choice = {t.id: choice.get(t.id, KEEP) for t in cands}
    best_d, time_s, passes, moves, sims, spent_out = None, float("inf"), 0, 0, 0, False
    d = make({i: c for i, c in choice.items() if c != KEEP})
    improved = len(d.steps) <= max_steps
    if improved:
        r = ctx.evaluate(d)
        sims += 1
        if r["fits"]:
            best_d, time_s = d, r["time_s"]
            ctx.pin(d)
    else:
        spent_out = True
    start_s = time_s
    while improved and not spent_out:
        improved, passes = False, passes + 1
        for t in cands:
            for code in codes:
                if code == choice[t.id]:
                    continue
                trial = dict(choice)
                trial[t.id] = code
                d = make({i: c for i, c in trial.items() if c != KEEP})
                if ctx.simulated_steps - start + len(d.steps) > max_steps:
                    spent_out = True
                    break
                r = ctx.evaluate(d)
                sims += 1
                if r["fits"] and r["time_s"] < time_s * (1 - 1e-9):
                    choice, time_s, best_d = trial, r["time_s"], d
                    moves += 1
                    improved = True
                    ctx.pin(d)
            if spent_out:
                break
    log = {"start_s": start_s, "passes": passes, "simulated": sims, "moves": moves,
           "simulated_steps": ctx.simulated_steps - start, "time_s": time_s,
           "stopped": "effort" if spent_out else "no change improves"}
    return best_d, time_s, log
