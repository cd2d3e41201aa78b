"""Recompute any chosen set of forward tensors: the schedule rewrite planners share.

Given the ids of forward activations to drop, every backward step that reads one is preceded
by "R" steps that re-run its producer from the nearest tensors still held (recursively through
other dropped tensors, in route order: joins and concats included). A recomputed version is
kept until backward has used it (liveness frees it then), so a segment is recomputed once
(speed-centric, Chen et al.'s "one extra forward"). The data layer and the loss are never
recomputed. memory/recompute.py is SuperNeurons' own rule (checkpoint kinds, cost-aware
modes); this is the general mechanism for planners that choose tensors themselves.
"""
from __future__ import annotations


from ..recompute import RecomputeReport, rebind, recompute_step, renumber
from ..schedule import Schedule, Step


def producers(schedule: Schedule) -> dict:
    """Forward tensor id -> (layer, route position) for every activation a layer makes."""
    out = {}
    for pos, layer in enumerate(schedule.graph.route):
        for t in layer.outputs:
            out[schedule.act[id(t)].id] = (layer, pos)
    return out


def droppable(schedule: Schedule) -> list:
    """Forward activations backward reads that a recompute could make again, in route order."""
    prod = producers(schedule)
    seen, out = set(), []
    for s in schedule.steps:
        if s.phase != "B":
            continue
        for t in [*s.ins, *s.outs]:
            if t is None or t.id in seen or t.id not in prod:
                continue
            layer = prod[t.id][0]
            if layer.kind in ("data", "loss") or len(layer.outputs) != 1:
                continue
            seen.add(t.id)
            out.append(t)
    out.sort(key=lambda t: prod[t.id][1])
    return out


def recompute_rewrite(schedule: Schedule, drop: set, steps=None) -> tuple[list, RecomputeReport]:
    """The schedule with "R" steps that make every dropped tensor again before backward."""
    steps = schedule.steps if steps is None else steps
    act, reg = schedule.act, schedule.registry
    prod = producers(schedule)
    current: dict[int, object] = {}         # dropped id -> its live recomputed version
    new_steps: list[Step] = []
    counter = [len(reg)]
    extra = 0

    def materialize(t):
        nonlocal extra
        if t.id in current:
            return current[t.id]
        # every dropped ancestor not yet recomputed, emitted in route order
        need, stack = {}, [t]
        while stack:
            u = stack.pop()
            if u.id in need or u.id in current:
                continue
            need[u.id] = u
            layer = prod[u.id][0]
            for sym in layer.inputs:
                a = act[id(sym)]
                if a.id in drop and a.id not in current:
                    stack.append(a)
        for u in sorted(need.values(), key=lambda u: prod[u.id][1]):
            layer = prod[u.id][0]
            ins = [current.get(act[id(sym)].id, act[id(sym)]) for sym in layer.inputs]
            counter[0] += 1
            v = reg.add(f"{u.name}@c{counter[0]}", u.kind, u.shape, u.dtype)
            new_steps.append(recompute_step(schedule, layer, ins, v))
            current[u.id] = v
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
