"""Bytes resident per step under liveness, by a linear sweep (no heap simulation): the
quick estimate planners use to rank many candidates before simulating the best ones."""
from __future__ import annotations

import numpy as np


def liveness_bytes(ex_steps, persistent, workspace_of, block: int) -> np.ndarray:
    """Bytes resident during each step under liveness (heap-rounded)."""
    rnd = lambda n: -(-max(n, 1) // block) * block       # noqa: E731
    n = len(ex_steps)
    first, last, size = {}, {}, {}
    for i, s in enumerate(ex_steps):
        for t in s.reads + s.writes:
            if t.persistent:
                continue
            first.setdefault(t.id, i)
            last[t.id] = i
            size[t.id] = rnd(t.nbytes)
    delta = np.zeros(n + 1)
    for tid, a in first.items():
        delta[a] += size[tid]
        delta[last[tid] + 1] -= size[tid]
    live = np.cumsum(delta[:n])
    base = sum(rnd(t.nbytes) for t in persistent)
    ws = np.array([rnd(workspace_of(s)) if workspace_of(s) else 0 for s in ex_steps])
    return live + base + ws


def needed_workspace(step) -> int:
    """The workspace a step cannot run without: none where its kernels also run on none (the
    executor gives it none when its preferred one does not fit in a free block, at no cost
    on the clock; counted, the MILP took plans that fit for infeasible: resnet_cifar 20 at
    32x32 and 0.3x its liveness peak fitted nothing without the tensor cache)."""
    return 0 if step.layer is not None and step.layer.workspace_shrinks() else \
        step.workspace_bytes
