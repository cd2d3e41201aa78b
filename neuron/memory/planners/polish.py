"""Local search over a per-tensor choice: the refinement superneurons ends with (and
``checkmate:polish=1``, the best known reference).

A plan's choice (tensor -> KEEP | SWAP | RECOMPUTE) is changed one tensor at a time, or by
one pair: a tensor recomputed with an input its recompute reads swapped (``moves_of``); a
change is kept when the simulated clock finds the plan it builds (choice.build: recompute
rewrite, planned offloads, prefetch by time, the tensor cache for the rest) faster, and the
search stops after a pass over every tensor changes nothing, or when its effort (steps
simulated, counted by the plan context) is spent. First improvement, in a fixed order:
deterministic.

Why: the cost searches of superneurons choose by an order of prices (recompute per byte,
the copy stream's queue), and a prefix of an order cannot mix swaps and recomputes by where
the bytes over the budget are. On resnet_cifar 20 at 0.3x the liveness peak no prefix of
those orders came within 10% of the MILP (+23.0%); the MILP's plan spreads swaps over all
three stages, so the copy stream is busy everywhere, and recomputes the rest. One-tensor
moves from superneurons' best reach it (bench/results/planners.md).

The pair: the input's prefetch then serves the recompute (the executor brings a swapped
tensor back once, for its first later reader), and each half alone can be slower: the swap
saves nothing while the recompute holds the input, the recompute alone keeps the input all
along. Once the MILP modelled it, its plan of resnet_cifar 8 (32x32, batch 32, 0.5 of the
budget range) was 0.436 ms against superneurons' 0.525; with the pair among the moves,
superneurons' polish reaches 0.439 (resnet_cifar 20 at 0.3x: 1.177 -> 1.092 ms).
"""
from __future__ import annotations

from .base import KEEP, RECOMPUTE, SWAP
from .choice import CODES, build
from .rewrite import chains


def polish(ctx, cands, choice: dict, max_steps: int) -> tuple:
    """The fastest choice found from ``choice`` (tensor id -> code; absent: KEEP) by
    one-tensor changes, within ``max_steps`` simulated steps; ``choice`` itself is simulated
    first (as choice.build makes it: a plan chosen another way, such as the LRU cache's, may
    run differently). Returns (the fastest decisions that fit, None where none did or the
    effort allowed none; their simulated time, inf if none; a log entry)."""
    start = ctx.simulated_steps
    sims = 0

    def run(ch):
        """(decisions, simulated time or inf), or None: the effort is spent."""
        nonlocal sims
        d = build(ctx, cands, {i: c for i, c in ch.items() if c != KEEP})
        if ctx.simulated_steps - start + len(d.steps) > max_steps:
            return None
        sims += 1
        r = ctx.evaluate(d)
        return d, r["time_s"] if r["fits"] else float("inf")

    choice = {t.id: choice.get(t.id, KEEP) for t in cands}
    inputs = recompute_inputs(ctx, cands)
    best_d, time_s, passes, moves = None, float("inf"), 0, 0
    first = run(choice)
    if first is not None and first[1] < time_s:
        best_d, time_s = first
        ctx.pin(best_d)
    start_s, stopped = time_s, "effort" if first is None else None
    pairs = False       # the pair moves once the one-tensor ones improve nothing (moves_of)
    while stopped is None:
        passes += 1
        stopped = "no change improves"
        for t in cands:
            for change in moves_of(t, choice, inputs, pairs):
                trial = {**choice, **change}
                got = run(trial)
                if got is None:
                    stopped = "effort"
                    break
                if got[1] < time_s * (1 - 1e-9):
                    (best_d, time_s), choice = got, trial
                    moves += 1
                    stopped = None          # another pass
                    ctx.pin(best_d)
            if stopped == "effort":
                break
        if stopped != "effort" and (stopped is None or not pairs):
            # a pass of one-tensor moves that improved nothing: a pass of pairs; one that
            # improved, by either: one-tensor moves again
            stopped, pairs = None, stopped is not None
    log = {"start_s": start_s, "passes": passes, "simulated": sims, "moves": moves,
           "simulated_steps": ctx.simulated_steps - start, "time_s": time_s,
           "stopped": stopped}
    return best_d, time_s, log


def recompute_inputs(ctx, cands) -> dict:
    """Candidate id -> the candidates its recompute reads (rewrite.chains' held inputs)."""
    ids = {t.id for t in cands}
    return {tid: [u for u in ins if u in ids]
            for tid, (_, ins) in chains(ctx.schedule, cands).items()}


def moves_of(t, choice: dict, inputs: dict, pairs: bool = False):
    """The changes tried at ``t``: each other code for it alone; with ``pairs``, for each
    candidate its recompute reads, t recomputed with that input swapped instead (the input's
    prefetch serves the recompute: two changes that can each be slower alone). Pairs come
    only after a pass of one-tensor moves improved nothing: where the effort runs out first
    (a large graph's polish), interleaved pairs took effort from them (ResNet-50 at its
    minimum budget: +392.1% -> +403.6% over unlimited memory)."""
    if not pairs:
        for code in CODES:
            if code != choice[t.id]:
                yield {t.id: code}
        return
    for u in inputs.get(t.id, ()):
        if choice[t.id] != RECOMPUTE or choice[u] != SWAP:
            yield {t.id: RECOMPUTE, u: SWAP}
