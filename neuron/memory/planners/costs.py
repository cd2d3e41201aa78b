"""Per-tensor costs from the cost model, shared by Capuchin and the MILP: how long a swap
takes, how much of it compute waits for, what a recompute costs. Under FreeLunch compression
a feature map's swap is of its compressed bytes, plus an encode and a decode that compute
waits for (``PlanContext.copy_cost``)."""
from __future__ import annotations

from dataclasses import dataclass

from .rewrite import chains
from .swap import lead_s, prefetch_step


@dataclass(frozen=True)
class TensorCost:
    tensor: object
    last_fwd: int           # position of its last forward use
    first_bwd: int          # position of its first backward (or recompute) use
    free_s: float           # compute seconds between them (Capuchin's "free time")
    swap_s: float           # out and back on the copy stream
    exposed_s: float        # swap time compute waits for (see below), codec passes included
    recompute_s: float      # its producer's forward once more, with the transient tensors
                            # on the way (rewrite.chains)
    inputs: tuple           # ids of the held tensors that recompute reads
    prefetch_after: int     # a swap's copy back starts after this step (swap.prefetch_step)


def tensor_costs(ctx, cands, compressed: bool = True) -> list[TensorCost]:
    """Each candidate's costs (those with a forward and a backward use), once per plan context
    and candidate set: superneurons' two cost orders and the DQN planner's features share it.
    ``compressed=False``: with full-size copies even under compression (capuchin and the
    MILP weigh both)."""
    codec = ctx.codec if compressed else None
    memo = ctx._memo(("tensor_costs", codec), ctx.schedule.steps, dict)
    key = tuple(t.id for t in cands)
    if key not in memo:
        memo[key] = _tensor_costs(ctx, cands, compressed)
    return list(memo[key])


def _tensor_costs(ctx, cands, compressed) -> list[TensorCost]:
    steps = ctx.schedule.steps
    last_fwd, first_bwd = ctx.uses(steps)
    cum = ctx.cum_time(steps)
    chain = chains(ctx.schedule, cands)
    out = []
    for t in cands:
        f, j = last_fwd.get(t.id), first_bwd.get(t.id)
        if f is None or j is None:
            continue
        free = cum[j] - cum[f + 1]
        one, codec = ctx.copy_cost(t, compressed)
        swap = 2 * one
        reruns, ins = chain[t.id]
        # a planned offload overlaps the next step (its block is kept until then), the copy
        # back the free time before the tensor's use (memory/clock.py); on a device without a
        # copy stream both copies are exposed. Compute waits for a compressed one's encode
        # (its block is reused once encoded) and decode (at its reader) either way.
        if ctx.cost.spec.async_copies:
            nxt = ctx.step_time(steps[f + 1]) if f + 1 < len(steps) else 0.0
            exposed = max(0.0, one - nxt) + max(0.0, one - free) + 2 * codec
        else:
            exposed = swap + 2 * codec
        out.append(TensorCost(t, f, j, free, swap, exposed,
                              sum(ctx.step_time(s) for s in reruns), ins,
                              prefetch_step(cum, f, j, lead_s(ctx, t))))
    return out
