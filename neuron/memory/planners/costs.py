"""Per-tensor costs from the cost model, shared by Capuchin and the MILP: how long a swap
takes, how much of it compute waits for, what a recompute costs. Under FreeLunch compression
a feature map's swap is of its compressed bytes, plus an encode and a decode that compute
waits for (``PlanContext.copy_cost``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .rewrite import chains
from .base import RECOMPUTE, SWAP
from .swap import copy_walk, lead_s, prefetch_step


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
    held_after: int = 0     # a swap's block is released after this step (swap.copy_walk)
    codec_s: float = 0.0    # one codec pass (compressed copies)


def tensor_costs(ctx, cands, compressed: bool = True, busy: bool = False) -> list[TensorCost]:
    """Each candidate's costs (those with a forward and a backward use), once per plan context
    and candidate set: superneurons' two cost orders and the DQN planner's features share it.
    ``compressed=False``: with full-size copies even under compression (capuchin and the
    MILP weigh both). ``busy``: each copy hides under one step only, the copy stream taken
    as busy with others (capuchin's pessimistic pricing)."""
    codec = ctx.codec if compressed else None
    memo = ctx._memo(("tensor_costs", codec, busy), ctx.schedule.steps, dict)
    key = tuple(t.id for t in cands)
    if key not in memo:
        memo[key] = _tensor_costs(ctx, cands, compressed, busy)
    return list(memo[key])


def _tensor_costs(ctx, cands, compressed, busy) -> list[TensorCost]:
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
        p = prefetch_step(cum, f, j, lead_s(ctx, t))
        # alone on the copy stream (swap.copy_walk): a planned offload keeps its block until
        # the first step ending after its copy, not past its prefetch; the copy back starts
        # after that prefetch step and the copy out; compute waits for what is left of either.
        # On a device without a copy stream both copies are exposed. Compute waits for a
        # compressed one's encode (its block is reused once encoded) and decode (at its
        # reader) either way.
        if not ctx.cost.spec.async_copies:
            held, exposed = f + 1, swap + 2 * codec
        else:
            held, wait = copy_walk(cum, [(t.id, f, p, j, one, one, codec)])[t.id]
            if busy:                    # each copy hides under the step after its start
                out_s = ctx.step_time(steps[f + 1]) if f + 1 < len(steps) else 0.0
                back_s = ctx.step_time(steps[p + 1]) if p + 1 < j else 0.0
                wait = max(0.0, one - out_s) + max(0.0, one - back_s)
            exposed = wait + 2 * codec
        out.append(TensorCost(t, f, j, free, swap, exposed,
                              sum(ctx.step_time(s) for s in reruns), ins, p, held, codec))
    return out


def walk_entry(c: TensorCost) -> tuple:
    """A planned swap of ``c`` as swap.copy_walk reads it."""
    one = c.swap_s / 2
    return (c.tensor.id, c.last_fwd, c.prefetch_after, c.first_bwd, one, one, c.codec_s)


def book(cum, booked: list, waits: float, entry: tuple) -> tuple:
    """One more swap (``entry``) on the copy stream of the swaps ``booked``, whose copies
    compute waits ``waits`` seconds for: (the swaps with it, compute's wait for all of them,
    the seconds it adds (that wait's increase and its two codec passes), the step after which
    its block is released)."""
    trial = booked + [entry]
    walk = copy_walk(cum, trial)
    total = sum(w for _, w in walk.values())
    return trial, total, total - waits + 2 * entry[6], walk[entry[0]][0]


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


#: ``queued`` books at most this many swaps (each booking walks those before it)
MAX_QUEUED = 1500


def queued(ctx, costs) -> list[TensorCost]:
    """The costs with each swap priced on a shared copy stream instead of alone: taken in
    the order ``rank`` gives them alone (cheapest per byte first), a tensor whose swap is
    cheaper alone is priced by the wait it adds to the swaps booked before it (copy_walk of
    them with and without it); if that still beats its recompute it is booked. Later copies
    queue behind earlier ones, so swaps priced alone look cheaper the more are chosen. On a
    device without a copy stream, or past MAX_QUEUED swaps, the costs as they are."""
    if not ctx.cost.spec.async_copies:
        return costs
    cum = ctx.cum_time(ctx.schedule.steps)
    choice_of, order = rank(costs)
    booked, base, out = [], 0.0, {}
    for c in order:
        if choice_of[c.tensor.id] != SWAP or len(booked) >= MAX_QUEUED:
            continue
        trial, total, exposed, _ = book(cum, booked, base, walk_entry(c))
        out[c.tensor.id] = dataclasses.replace(c, exposed_s=exposed)
        if exposed <= c.recompute_s:
            booked, base = trial, total
    return [out.get(c.tensor.id, c) for c in costs]
