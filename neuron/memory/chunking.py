"""Sub-layer chunking: every layer's step split along the batch into K chunks (beyond
SuperNeurons; TSPLIT, ICDE 2022, splits tensors the same way).

A step too large for the arena cannot be planned at layer granularity: no schedule of whole
tensors goes below its bytes. Here every activation and gradient of the iteration is K
separate tensors, one per chunk of the batch, and each layer runs as K steps, one per chunk,
so a step holds one chunk of its inputs, outputs and gradients. Between steps the chunks are
ordinary tensors: liveness frees them, and the unified tensor pool offloads and prefetches
them chunk by chunk like any other tensor. This is a schedule rewrite (like recompute's):
the executor runs the steps as usual, and the few layers whose arithmetic couples samples
read the chunk from ``ctx.chunk``:

- BatchNorm gathers its statistics over the whole batch: forward is a pass over the chunks
  for the statistics ("stats") and one to normalize ("apply"); backward a pass for the two
  per-channel sums, which are dgamma and dbeta ("sums"), and one for dx ("grad").
- Parameter gradients accumulate over the chunks in batch order (the first chunk writes,
  the others add), and the optimizer runs once, in the layer's last backward step.
- The loss is the mean over the whole batch; dropout draws the mask of the whole batch.

The chunk count is the same for every layer (``--chunks auto``: the smallest that fits, with
the policy or the planner given). The policy's own recomputation is off with K > 1 (its
segment rule is by whole layers): its pool's offload does the work. A planner
(memory/planners) plans the chunked schedule itself: every chunk of a layer output is a tensor
of its own to keep, swap or recompute, and a recompute re-runs that chunk's forward step
(recompute.rerun_step): BN's "apply" pass, which reads the whole batch's statistics (held
until backward) and changes no running statistics, and dropout with the chunk's saved mask.
A step that adds to a tensor an earlier chunk wrote records it in ``Step.inplace``, so a
rewrite that rebinds the step keeps it a read.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Graph
from ..layers.data import Input
from ..precision import FP32
from .schedule import Schedule, Step, build_schedule
from .tensors import Kind

#: chunk counts the planner tries, in order
CHUNK_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Chunk:
    index: int
    count: int
    start: int              # first sample of the chunk
    size: int               # samples in the chunk
    total: int              # samples in the batch
    stage: str = ""         # BN: "stats" | "apply" (forward), "sums" | "grad" (backward)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    @property
    def applies_update(self) -> bool:
        """The optimizer runs in a layer's last backward step (BN: after its dx pass)."""
        return self.last and self.stage in ("", "grad")


def chunk_sizes(batch: int, count: int) -> list[int]:
    """Near-equal chunks, the larger first; every chunk has at least one sample."""
    if not 1 <= count <= batch:
        raise ValueError(f"chunk count {count} must be between 1 and the batch ({batch})")
    q, r = divmod(batch, count)
    return [q + (1 if i < r else 0) for i in range(count)]


_FWD_STAGES = {"bn": ("stats", "apply")}
_BWD_STAGES = {"bn": ("sums", "grad")}


def build_chunked_schedule(graph: Graph, batch: int, count: int, dtype=np.float32,
                           state_names=(), precision=None,
                           alias_gradients: bool = True, layout: str = "nchw") -> Schedule:
    """The iteration with every layer split into ``count`` chunk steps (see the module doc).

    Parameters, their gradients and optimizer state are those of the whole-batch schedule
    (shared by the chunks); activations, gradients and batch-shaped aux are per chunk. An
    aliased gradient (memory/aliasing.py) is its Add's output gradient chunk by chunk."""
    base = build_schedule(graph, batch, dtype, state_names, precision or FP32,
                          alias_gradients, layout)
    if count == 1:
        return base
    feat = base.precision.feature_dtype(dtype)     # feature maps, their gradients, workspaces
    reg = base.registry
    sizes = chunk_sizes(batch, count)
    starts = np.cumsum([0, *sizes[:-1]]).tolist()
    chunks = [Chunk(c, count, starts[c], sizes[c], batch) for c in range(count)]
    act, grad = {}, {}              # (symbolic tensor id, chunk) -> TensorInfo
    aux = {}                        # (layer name, chunk) -> {aux name: TensorInfo}
    for layer in graph.route:
        whole_aux = base.aux[layer.name]
        for ch in chunks:
            c, n = ch.index, ch.size
            for t in layer.outputs:
                full = base.act[id(t)]
                act[id(t), c] = reg.add(f"{full.name}#{c}", full.kind, (n, *t.shape), full.dtype)
                g = base.grad.get(id(t))
                if g is not None and id(t) not in base.aliases:
                    grad[id(t), c] = reg.add(f"{g.name}#{c}", Kind.GRADIENT, (n, *t.shape),
                                             g.dtype)
            specs = layer.aux_specs(n)
            aux[layer.name, c] = {
                # batch-independent aux (BN statistics) is shared by the chunks
                name: whole_aux[name] if specs[name].shape == whole_aux[name].shape
                else reg.add(f"{whole_aux[name].name}#{c}", Kind.AUX, specs[name].shape,
                             whole_aux[name].dtype)
                for name in whole_aux}

    for tid, first in base.aliases.items():
        for c in range(count):
            grad[tid, c] = grad[id(first), c]
    steps: list[Step] = []
    for layer in graph.route:
        for stage in _FWD_STAGES.get(layer.kind, ("",)):
            for ch in chunks:
                c = ch.index
                s = Step(len(steps), layer, "F", ins=[act[id(t), c] for t in layer.inputs],
                         outs=[] if stage == "stats" else [act[id(t), c] for t in layer.outputs],
                         aux=dict(aux[layer.name, c]),
                         workspace_bytes=layer.planned_workspace_bytes(
                             "F", ch.size, feat.itemsize, layout))
                s.chunk = Chunk(c, count, ch.start, ch.size, batch, stage)
                steps.append(base.bind_params(s).bind())
    started: set[int] = set()
    for layer in reversed(graph.route):
        if isinstance(layer, Input):
            continue
        accumulate = [id(t) in started for t in layer.inputs]
        for stage in _BWD_STAGES.get(layer.kind, ("",)):
            for ch in chunks:
                c = ch.index
                s = Step(len(steps), layer, "B",
                         aux=dict(aux[layer.name, c]),
                         workspace_bytes=layer.planned_workspace_bytes(
                             "B", ch.size, feat.itemsize, layout))
                s.chunk = Chunk(c, count, ch.start, ch.size, batch, stage)
                s.douts = [grad.get((id(t), c)) for t in layer.outputs]
                s.ins = [act[id(t), c] if i in layer.retain_inputs else None
                         for i, t in enumerate(layer.inputs)]
                s.outs = [act[id(t), c] if j in layer.retain_outputs else None
                          for j, t in enumerate(layer.outputs)]
                if stage != "sums":
                    for i, t in enumerate(layer.inputs):
                        if not accumulate[i] and id(t) in base.aliases:
                            s.aliased += (i,)       # its gradient is this step's douts[0]
                        elif (id(t), c) in grad:
                            s.grad_targets.append((i, grad[id(t), c], accumulate[i]))
                for pname, p in base.params.get(layer.name, {}).items():
                    qname = f"{layer.name}.{pname}"
                    if qname in base.param_grads:
                        s.updates.append((pname, p, base.param_grads[qname],
                                          base.opt_state[qname]))
                steps.append(base.bind_params(s).bind())
        started.update(id(t) for t in layer.inputs)
    _rebind_accumulations(steps)
    return Schedule(graph, batch, base.dtype, reg, steps, act, grad, base.params,
                    base.param_grads, base.opt_state, base.aux, chunks=count,
                    precision=base.precision, aliases=base.aliases, layout=layout)


def _rebind_accumulations(steps) -> None:
    """A tensor that an earlier step wrote and a later chunk step writes again (a parameter
    gradient summed over the chunks, BN's statistics gathered over them, a fan-out gradient
    begun by another consumer) is updated in place: it must be resident, so it is a read."""
    written: set[int] = set()
    for s in steps:
        moved = tuple(t.id for t in s.writes if t.id in written)
        if moved:
            s.inplace = moved
            s.bind()
        written.update(t.id for t in s.writes)


def logits_chunks(schedule: Schedule, graph: Graph, count: int) -> list:
    """The logits tensors of the chunks, in batch order (evaluation gathers them)."""
    return schedule.values(graph.outputs[0])
