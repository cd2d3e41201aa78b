"""Liveness (SuperNeurons §3.2): each tensor is freed right after the last step that uses it.

O(N) in steps plus tensor uses: one pass records every tensor's last use, a second files it
under that step. Persistent tensors (parameters, optimizer state) never die; tensors listed in
``keep`` (a forward-only run's outputs) live to the end.
"""
from __future__ import annotations



def frees_for(steps, free_dead: bool = True, keep=()) -> list[list]:
    """Per step, the tensors that die after it (empty lists when nothing is freed early)."""
    out = [[] for _ in steps]
    if not free_dead:
        return out
    keep_ids = {t.id for t in keep}
    last: dict[int, tuple[int, object]] = {}
    for i, step in enumerate(steps):
        for t in step.reads:
            last[t.id] = (i, t)
        for t in step.writes:
            last[t.id] = (i, t)
        for _, _, _, states in step.updates:
            for t in states:
                last[t.id] = (i, t)
    for tid, (i, t) in last.items():
        if not t.persistent and tid not in keep_ids:
            out[i].append(t)
    return out
