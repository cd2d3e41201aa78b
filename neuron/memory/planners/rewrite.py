"""Recompute any chosen set of forward tensors: the schedule rewrite planners share.

Given the ids of forward activations to drop, every backward step that reads one is preceded
by "R" steps that re-run its producer from the nearest tensors still held (recursively through
other dropped tensors, in route order: joins and concats included). A recomputed version of a
dropped tensor is kept until backward has used it (liveness frees it then), so a segment is
recomputed once (speed-centric, Chen et al.'s "one extra forward"). The data layer and the
loss are never recomputed.

A *transient* activation is one no backward step reads (a BN output that only its ReLU reads,
the sum of a residual join): once forward has used it, nothing holds it. A recompute that reads
one re-runs it too, from its own inputs, and lets it die after that use, rather than keeping
the forward copy alive all iteration just to feed the recompute (which would make dropping,
say, a ReLU output save nothing: its BN output would stay instead). ``chains`` gives each
droppable tensor's re-run layers and the held tensors they start from, so costs price what the
rewrite runs. memory/recompute.py is SuperNeurons' own rule (checkpoint kinds, cost-aware
modes); this is the general mechanism for planners that choose tensors themselves.

Everything here goes by the forward step that makes a tensor, not by its layer, so a chunked
schedule (memory/chunking.py) is planned the same way: each chunk of a layer output is a
candidate of its own, and its recompute re-runs that chunk's forward step from that chunk's
inputs (``recompute.rerun_step``: BN's "apply" pass with the whole batch's statistics, which
stay held until backward; dropout with its saved mask).
"""
from __future__ import annotations

from ..recompute import RecomputeReport, rebind, renumber, rerun_step
from ..schedule import Schedule, Step


def producers(schedule: Schedule) -> dict:
    """Forward tensor id -> (the forward step that makes it, its position in the schedule):
    every activation a layer makes (one per chunk in a chunked schedule). Forward steps come
    first, in route order, so positions order the tensors as the route does."""
    out = {}
    for pos, s in enumerate(schedule.steps):
        if s.phase == "F":
            for t in s.outs:
                out[t.id] = (s, pos)
    return out


def recomputable(layer) -> bool:
    return layer.kind not in ("data", "loss") and len(layer.outputs) == 1


def backward_read(schedule: Schedule) -> set:
    """Ids of the tensors some backward step reads or writes."""
    return {t.id for s in schedule.steps if s.phase == "B" for t in [*s.ins, *s.outs]
            if t is not None}


def droppable(schedule: Schedule) -> list:
    """Forward activations backward reads that a recompute could make again, in route order."""
    read = backward_read(schedule)
    return [s.outs[0] for s in schedule.steps if s.phase == "F" and s.outs
            and recomputable(s.layer) and s.outs[0].id in read]


def transient(schedule: Schedule, prod=None) -> set:
    """Ids of forward activations no backward step reads that a recompute could make again."""
    prod = producers(schedule) if prod is None else prod
    read = backward_read(schedule)
    return {tid for tid, (s, _) in prod.items() if tid not in read and recomputable(s.layer)}


def chains(schedule: Schedule, cands) -> dict:
    """Tensor id -> (forward steps re-run to make it again, in route order; ids of the held
    tensors they read): its producer, and the producers of the transient tensors on the way."""
    prod = producers(schedule)
    trans = transient(schedule, prod)
    out = {}
    for t in cands:
        made, frontier, seen, stack = {}, set(), set(), [t.id]
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            step, pos = prod[tid]
            made[pos] = step
            for a in step.ins:
                if a.id in trans:
                    stack.append(a.id)
                else:
                    frontier.add(a.id)
        out[t.id] = ([made[p] for p in sorted(made)], tuple(sorted(frontier)))
    return out


def recompute_rewrite(schedule: Schedule, drop: set, steps=None) -> tuple[list, RecomputeReport]:
    """The schedule with "R" steps that make every dropped tensor again before backward."""
    steps = schedule.steps if steps is None else steps
    reg = schedule.registry
    prod = producers(schedule)
    trans = transient(schedule, prod)
    current: dict[int, object] = {}         # dropped id -> its live recomputed version
    new_steps: list[Step] = []
    counter = [len(reg)]
    extra = 0

    def materialize(t):
        nonlocal extra
        if t.id in current:
            return current[t.id]
        # every dropped ancestor not yet recomputed and every transient one on the way,
        # emitted in route order; a transient's version lives for this chain only
        local: dict[int, object] = {}
        need, stack = {}, [t]
        while stack:
            u = stack.pop()
            if u.id in need or u.id in current:
                continue
            need[u.id] = u
            for a in prod[u.id][0].ins:
                if (a.id in drop or a.id in trans) and a.id not in current:
                    stack.append(a)
        for u in sorted(need.values(), key=lambda u: prod[u.id][1]):
            fwd = prod[u.id][0]
            ins = [current.get(a.id, local.get(a.id, a)) for a in fwd.ins]
            counter[0] += 1
            v = reg.add(f"{u.name}@c{counter[0]}", u.kind, u.shape, u.dtype)
            new_steps.append(rerun_step(fwd, ins, v))
            (local if u.id in trans and u.id not in drop else current)[u.id] = v
            extra += 1
        return current[t.id]

    for s in steps:
        s = s.copy()
        if s.phase == "B":
            binding = {t.id: materialize(t) for t in [*s.ins, *s.outs]
                       if t is not None and t.id in drop}
            if binding:
                rebind(s, binding)
        new_steps.append(s)
    renumber(new_steps)
    dropped = [t for t in reg.tensors if t.id in drop]
    report = RecomputeReport("planned", extra, len(dropped), sum(t.nbytes for t in dropped),
                             0, 0, 0, 0)
    return new_steps, report
