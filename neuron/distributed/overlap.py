"""The gradient all-reduce overlapping backward, planned in the step list (issue 15).

Without overlap every backward step averages its layer's gradients (a blocking collective) and
then applies the optimizer update, so the whole all-reduce sits on the compute path. With it:

- Buckets: the layers with trainable parameters, in backward order, are grouped until a group
  holds at least ``bucket_bytes`` of gradients (DDP's rule and default of 25 MiB;
  ``distributed.cost.bucket_groups``, which the clock uses too; 0: one bucket per layer). A
  bucket's collective starts right after the backward step of its last layer (one batch of
  in-place non-blocking all-reduces, one per gradient: no staging buffer outside the plan).
- Deferred updates: the bucket's optimizer updates run at the backward step ``lag`` backward
  steps later (or the last backward step, whichever comes first), after that step's kernel and
  after waiting for the collective. Nothing in between reads those parameters (a layer's
  parameters are read only by its own steps), so the result is the same as updating at once.
- In the plan: the launching step reads every gradient of its bucket (they must be resident
  when the collective starts) and the due step reads the gradients, parameters and optimizer
  state it updates. Liveness (memory/liveness.py) therefore keeps the gradients until the due
  step and the simulated pool counts those bytes: the plan under a budget is the run's plan.
- Pinning: from launch to due the gradients are taken out of the pool's LRU (like pinned
  parameters: never evicted) in the plan and in the run alike (``after_step``); in the run a
  move (compaction), offload or free of one first waits for its collective (``Pool.
  pin_collective``), as a move of a tensor with an in-flight prefetch first waits for the copy.

World size 1 with overlap runs the same arithmetic in a different order of independent
updates, hence bit-identical results; chunked schedules (memory/chunking.py) keep the blocking
per-layer path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .cost import bucket_groups

#: DDP's default bucket size
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
#: backward steps a bucket's collective has before its updates must run
DEFAULT_LAG = 3


@dataclass(eq=False)
class Bucket:
    index: int
    updates: list = field(default_factory=list)    # (name, param, grad, states), of all layers
    layers: list = field(default_factory=list)     # layer names, backward order
    launch: int = -1                                # step index that starts the collective
    due_at: int = -1                                # step index that waits and updates

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for _, _, g, _ in self.updates)

    def grads(self) -> list:
        return [g for _, _, g, _ in self.updates]


def is_deferred(steps) -> bool:
    return any(s.bucket is not None for s in steps)


def defer_updates(steps, bucket_bytes: int = DEFAULT_BUCKET_BYTES, lag: int | None = None):
    """The step list with each bucket's updates moved to its due step (new Step objects for the
    backward steps that change; the others are shared). Unchanged when there is nothing to
    defer, the steps are chunked, or they are deferred already. ``lag`` None: DEFAULT_LAG."""
    lag = DEFAULT_LAG if lag is None else lag
    if bucket_bytes < 0 or lag < 0:
        raise ValueError(f"bucket bytes and lag must be >= 0, got {bucket_bytes} and {lag}")
    if is_deferred(steps) or any(s.chunk is not None for s in steps):
        return steps
    bpos = [i for i, s in enumerate(steps) if s.phase == "B"]
    if not any(steps[i].updates for i in bpos):
        return steps
    upd = [k for k, i in enumerate(bpos) if steps[i].updates]     # backward order
    sizes = [sum(g.nbytes for _, _, g, _ in steps[bpos[k]].updates) for k in upd]
    buckets: list[Bucket] = []
    for group in bucket_groups(sizes, bucket_bytes):
        b = Bucket(len(buckets))
        for m in group:
            s = steps[bpos[upd[m]]]
            b.updates.extend(s.updates)
            b.layers.append(s.layer.name)
        last = upd[group[-1]]
        b.launch, b.due_at = bpos[last], bpos[min(last + lag, len(bpos) - 1)]
        buckets.append(b)
    out = list(steps)
    changed = {}

    def copy(i):
        if i not in changed:
            changed[i] = dataclasses.replace(steps[i], due=[])
        return changed[i]

    for b in buckets:
        copy(b.launch).bucket = b
        copy(b.due_at).due.append(b)
    for k in upd:
        copy(bpos[k]).deferred = True
    for i, s in changed.items():
        out[i] = s.bind()
    return out


def due_updates(step) -> list:
    """The (name, param, grad, states) updates a backward step applies after its kernel."""
    own = () if step.deferred else step.updates
    if not step.due:
        return own
    return [*own, *(u for b in step.due for u in b.updates)]


def after_step(pool, step, dp=None) -> None:
    """Pin the gradients of the bucket this step started (against eviction; in a real run
    also against moves and frees until its collective is done); unpin the due buckets'.
    Runs in the plan (virtual device) and the run alike, so both pools evict the same."""
    b = step.bucket
    if b is not None and b not in step.due:
        pool.pin_collective(b.grads(), dp.waiter(b) if dp is not None else None)
    for d in step.due:
        if d is not b:
            pool.unpin_collective(d.grads())
