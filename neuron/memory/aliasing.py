"""Gradient aliasing: an Add's input gradient that IS its output gradient's tensor.

Add's backward hands every input the output gradient unchanged. Copying it costs a kernel and
a second tensor; instead the schedule binds the input's gradient to the output gradient's
tensor itself, and the Add's backward step has nothing to write for that input. It is decided
once from the graph, before the schedule registers any tensor, so liveness, the pool, every
policy and planner, chunking, recomputation, offload and the tape all see one tensor, and the
virtual device's plan is the run's.

The rule. The gradients that share one tensor form a group: an Add's output gradient and the
inputs it aliases, transitively through chains of Adds. In backward order, each gradient has
- a birth: the backward step of its first consumer (which writes it; for an aliased input,
  its Add, which writes nothing);
- accumulations: the backward steps of its other consumers, which add into it in place;
- a last read: the backward step of its producer, which reads it as its output gradient.
Input x of Add A joins the group of A's output gradient only when
1. A is x's first consumer in backward order and takes x once (nothing began x's gradient,
   and A does not add into it itself), and
2. no member of the group is accumulated into while another member is live: for every
   accumulation into a member at step t, every other member born at or before t had its last
   read before t.
A layer that ``rewrites_gradient`` (AddReLU: it masks its output gradient in place before
passing it on) writes its output's member at its own step, which is that member's last read:
the write counts as an accumulation just before the step (t - 1/2), so no member born earlier
may still be live after it, while the inputs the step aliases (born at t) take the rewritten
value, as they should.
Then an in-place accumulation never changes a value another reader still needs, and no kernel
reads a tensor as its output gradient while adding into it. A member is born at its parent's
last read, so the shared tensor lives exactly as long as its members together: at no step are
more bytes live than without aliasing. The rule is by layers; a chunked schedule
(memory/chunking.py) applies it to each chunk, whose steps keep the layers' order.
"""
from __future__ import annotations

from collections import Counter

from ..layers.data import Input


class _Member:
    """One gradient of a group: its birth, accumulation and last-read positions in backward."""
    __slots__ = ("birth", "adds", "last_read")

    def __init__(self, birth: int, adds: list, last_read: int):
        self.birth, self.adds, self.last_read = birth, adds, last_read

    def clashes(self, other: "_Member") -> bool:
        """One adds into the shared tensor while the other is live (closed interval)."""
        return any(other.birth <= t <= other.last_read for t in self.adds) or \
            any(self.birth <= t <= self.last_read for t in other.adds)


def has_gradient(t) -> bool:
    """Whether the schedule gives symbolic tensor ``t`` a gradient (not data, not a loss)."""
    return not isinstance(t.producer, Input) and t.producer.kind != "loss"


def shared_gradients(graph) -> dict:
    """id(symbolic tensor) -> the symbolic tensor whose gradient tensor its gradient is (its
    group's first member), for every Add input whose gradient is aliased (see the module doc).
    Layers opt in with ``passes_gradient`` (backward: every input gradient is the output
    gradient)."""
    order = [l for l in reversed(graph.route) if not isinstance(l, Input)]
    pos = {id(l): i for i, l in enumerate(order)}
    uses: dict[int, list] = {}          # id(tensor) -> backward positions of its consumers
    for i, layer in enumerate(order):
        for t in layer.inputs:
            if has_gradient(t):
                uses.setdefault(id(t), []).append(i)

    def member(t) -> _Member:
        u = uses[id(t)]
        last = pos[id(t.producer)]
        rewrite = [last - 0.5] if getattr(t.producer, "rewrites_gradient", False) else []
        return _Member(u[0], u[1:] + rewrite, last)

    root: dict[int, object] = {}        # id(tensor) -> its group's first member (a Tensor)
    groups: dict[int, list] = {}        # id(first member) -> live members [(Tensor, _Member)]
    for p, layer in enumerate(order):
        if not getattr(layer, "passes_gradient", False) or len(layer.outputs) != 1:
            continue
        y = layer.outputs[0]
        if id(y) not in uses:
            continue
        first = root.get(id(y), y)
        group = groups.setdefault(id(first), [(y, member(y))])
        # a member last read before p can clash with nothing born at p or later
        group[:] = [(t, m) for t, m in group if m.last_read >= p]
        once = Counter(id(t) for t in layer.inputs)
        for x in layer.inputs:
            if once[id(x)] != 1 or id(x) not in uses or uses[id(x)][0] != p \
                    or x.shape != y.shape:
                continue
            m = member(x)
            if any(m.clashes(o) for _, o in group):
                continue
            group.append((x, m))
            root[id(x)] = first
    return root
