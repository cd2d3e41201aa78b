"""The iteration as a flat list of steps, each bound to exactly the tensors it reads and writes.

Built once per (graph, batch, dtype, optimizer) from the layers' declarations. Liveness,
recomputation, offload and the simulator all work on this table, never on the layers.
Forward steps F1..FN follow the route; backward steps BN..B1 mirror it. Each backward step
also applies the optimizer to its layer's parameters (so their gradients die at once), unless
the update is deferred to a later backward step while the gradients' all-reduce overlaps
backward (distributed/overlap.py: then they live until that step).
Recomputation (memory/recompute.py) inserts "R" steps: forward re-runs writing fresh versions
of dropped tensors, which the backward steps are then bound to.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..graph import Graph
from ..layers.base import Layer
from ..layers.data import Input
from ..precision import FP32, Precision
from .aliasing import shared_gradients
from .tensors import Kind, TensorInfo, TensorRegistry


@dataclass(eq=False)
class Step:
    index: int
    layer: Layer
    phase: str                          # "F" forward, "R" recompute (forward again), "B" backward
    ins: list = field(default_factory=list)        # TensorInfo or None (not needed)
    outs: list = field(default_factory=list)
    params: dict = field(default_factory=dict)     # local name -> TensorInfo
    aux: dict = field(default_factory=dict)
    douts: list = field(default_factory=list)      # backward: output gradients
    # backward: (input index, gradient tensor, accumulate); accumulate: another consumer of the
    # input (fan-out) already started its gradient, so this step adds its share in place
    grad_targets: list = field(default_factory=list)
    # backward: indices of the inputs whose gradient is this step's output gradient tensor
    # itself (memory/aliasing.py): no target, nothing written; the layer gets None for them
    aliased: tuple = ()
    updates: list = field(default_factory=list)    # (local name, param, grad, [state tensors])
    workspace_bytes: int = 0
    # gradient all-reduce overlapping backward (distributed/overlap.py): this step starts the
    # collective of ``bucket`` after its kernel; the buckets in ``due`` must be complete here,
    # and their updates run after this step's kernel; ``deferred``: this step's own updates
    # run at a later step (its gradients live until then: they are that step's reads)
    bucket: object = None
    due: list = field(default_factory=list)
    deferred: bool = False
    chunk: object = None                            # memory/chunking.py: which part of the batch
    # ids of tensors this step would write that an earlier step wrote (a parameter gradient
    # summed over chunks, memory/chunking.py): updated in place, so resident, so reads; kept
    # here so that a step rebound by a rewrite (recompute, overlap) stays so
    inplace: tuple = ()
    # mixed precision: (master parameter, low-precision copy) pairs; the copy is one of this
    # step's writes, cast from its master (a read) before the kernel, which binds the copy
    casts: list = field(default_factory=list)
    recast: object = None           # Schedule.bind_params: fresh copies for a re-run of it
    reads: list = field(default_factory=list)      # derived by bind()
    writes: list = field(default_factory=list)
    ids: tuple = ()                                 # ids of reads + writes (locking)

    def bind(self) -> "Step":
        """Derive reads/writes from the bindings (deduplicated, order kept)."""
        reads, writes = {}, {}
        cast = {c.id for _, c in self.casts}
        for m, c in self.casts:
            b = m.storage
            reads[b.id] = b
            writes[c.id] = c
        if self.phase in ("F", "R"):
            for t in self.ins:
                reads[t.id] = t
            for t in self.params.values():
                if t.id in cast:
                    continue
                b = t.storage
                reads[b.id] = b
            for t in self.outs:
                writes[t.id] = t
            for t in self.aux.values():
                # a recompute re-reads aux (dropout mask, BN statistics) instead of making it
                (reads if self.phase == "R" else writes)[t.id] = t
        else:
            for t in [*self.douts, *self.ins, *self.outs, *self.aux.values()]:
                if t is not None:
                    reads[t.id] = t
            for t in self.params.values():
                if t.id in cast:
                    continue
                b = t.storage
                reads[b.id] = b
            started = {g.id for _, g, acc in self.grad_targets if not acc}
            for _, g, acc in self.grad_targets:
                if not acc:
                    writes[g.id] = g
                elif g.id not in started:       # begun by an earlier step: must be resident
                    reads[g.id] = g
            for _, _, g, states in self.updates:
                writes[g.id] = g
                if self.deferred:
                    continue
                for s in states:
                    b = s.storage
                    reads[b.id] = b
            # a bucket's collective reads every gradient of the bucket; a due bucket's updates
            # read its gradients, parameters and optimizer state
            for bk in ([self.bucket] if self.bucket is not None else []) + self.due:
                for _, p, g, states in bk.updates:
                    if g.id not in writes:
                        reads[g.id] = g
                    if bk in self.due:
                        for s in (p, *states):
                            b = s.storage
                            reads[b.id] = b
        for tid in self.inplace:
            if tid in writes and tid not in reads:
                reads[tid] = writes[tid]
        self.reads = list(reads.values())
        self.writes = [t for tid, t in writes.items() if tid not in reads]
        self.ids = tuple(t.id for t in self.reads) + tuple(t.id for t in self.writes)
        return self

    def copy(self) -> "Step":
        """A shallow copy (copy.copy's result, without its generic protocol's cost)."""
        new = Step.__new__(Step)
        new.__dict__.update(self.__dict__)
        return new

    @property
    def name(self) -> str:
        return f"{self.phase}{self.index}:{self.layer.name}"

    def tensors(self) -> list[TensorInfo]:
        return self.reads + self.writes

    def resident_bytes(self) -> int:
        """l_i: bytes this step needs in the arena at once."""
        return sum(t.nbytes for t in self.tensors()) + self.workspace_bytes


@dataclass
class Schedule:
    graph: Graph
    batch: int
    dtype: np.dtype
    registry: TensorRegistry
    steps: list[Step]
    act: dict                   # symbolic tensor id -> TensorInfo of its value
    grad: dict                  # symbolic tensor id -> TensorInfo of its gradient
    params: dict                # layer name -> {local name: TensorInfo}
    param_grads: dict           # qualified name -> TensorInfo
    opt_state: dict             # qualified name -> [TensorInfo]
    aux: dict                   # layer name -> {aux name: TensorInfo}
    chunks: int = 1             # memory/chunking.py: > 1, act and grad are keyed (id, chunk)
    precision: Precision = FP32
    # memory/aliasing.py: symbolic tensor id -> the symbolic tensor whose gradient tensor its
    # gradient is (grad maps both to one TensorInfo)
    aliases: dict = field(default_factory=dict)
    layout: str = "nchw"        # memory/layout.py: the storage layout the steps plan for

    def bind_params(self, step: "Step") -> "Step":
        """Bind ``step``'s layer parameters: the masters, or (mixed precision, a layer that
        computes in the low type) a fresh low-precision copy of each, cast at that step
        (``Step.casts``): one per step, so none lives between a layer's steps."""
        layer = step.layer
        params = dict(self.params.get(layer.name, {}))
        step.casts = []
        if params and self.precision.casts_params(layer):
            low = self.precision.low()
            for pname, m in params.items():
                c = self.registry.add(f"{self.precision.name}:{m.name}#{len(self.registry)}",
                                      Kind.PARAM_COPY, m.shape, low)
                params[pname] = c
                step.casts.append((m, c))
        step.params = params
        step.recast = self.bind_params
        return step

    def values(self, sym) -> list[TensorInfo]:
        """The tensors holding a symbolic tensor's value: one, or one per chunk."""
        if self.chunks == 1:
            return [self.act[id(sym)]]
        return [self.act[id(sym), c] for c in range(self.chunks)]

    def persistent(self) -> list[TensorInfo]:
        """What is allocated for the whole run: the per-layer parameter blocks."""
        return [t for t in self.registry.tensors if t.persistent and t.parent is None]

    def state_tensors(self) -> list[TensorInfo]:
        """Parameters, buffers and optimizer state one by one (the members of the blocks)."""
        return [m for b in self.persistent() for m in (b.members or (b,))]

    def forward_steps(self) -> list[Step]:
        return [s for s in self.steps if s.phase == "F"]


def build_schedule(graph: Graph, batch: int, dtype=np.float32, state_names=(),
                   precision: Precision = FP32, alias_gradients: bool = True,
                   layout: str = "nchw") -> Schedule:
    """``dtype``: the master dtype (parameters, optimizer state, statistics); ``precision``
    (neuron/precision) says which tensors are stored in its low type instead.
    ``alias_gradients``: an Add's input gradient may be its output gradient's tensor
    (memory/aliasing.py); False: every gradient a tensor of its own (the papers' baseline).
    ``layout``: the storage layout (memory/layout.py), for the workspaces it changes."""
    dtype = np.dtype(dtype)
    aliases = shared_gradients(graph) if alias_gradients else {}
    feat = precision.feature_dtype(dtype)       # feature maps and their gradients
    reg = TensorRegistry()
    params, param_grads, opt_state, aux = {}, {}, {}, {}
    members: dict[str, list] = {}
    for qname, layer, pname, spec in graph.params():
        p = reg.add(qname, Kind.PARAM, spec.shape, dtype, persistent=True)
        params.setdefault(layer.name, {})[pname] = p
        members.setdefault(layer.name, []).append(p)
        if spec.trainable:
            param_grads[qname] = reg.add(f"grad:{qname}", Kind.PARAM_GRAD, spec.shape, dtype)
            opt_state[qname] = [reg.add(f"{s}:{qname}", Kind.OPT_STATE, spec.shape, dtype,
                                        persistent=True) for s in state_names]
            members[layer.name].extend(opt_state[qname])
    # a layer's parameters and optimizer state share one allocation: they are used together,
    # so they move to and from the host together (one copy instead of up to six)
    for lname, ms in members.items():
        reg.add_block(f"params:{lname}", ms)
    act, grad = {}, {}
    for layer in graph.route:
        is_data = isinstance(layer, Input)
        for t in layer.outputs:
            tdtype = _value_dtype(layer, t, dtype, feat)
            act[id(t)] = reg.add(f"act:{t.name}", Kind.DATA if is_data else Kind.ACTIVATION,
                                 (batch, *t.shape), tdtype)
            if not is_data and layer.kind != "loss" and id(t) not in aliases:
                grad[id(t)] = reg.add(f"grad:{t.name}", Kind.GRADIENT, (batch, *t.shape), feat)
        aux[layer.name] = {n: reg.add(f"aux:{layer.name}.{n}", Kind.AUX, s.shape,
                                      s.dtype if s.dtype is not None else dtype)
                           for n, s in layer.aux_specs(batch).items()}

    for tid, first in aliases.items():
        grad[tid] = grad[id(first)]
    sched = Schedule(graph, batch, dtype, reg, [], act, grad, params, param_grads, opt_state,
                     aux, precision=precision, aliases=aliases, layout=layout)
    steps = sched.steps
    for layer in graph.route:
        steps.append(sched.bind_params(Step(
            len(steps), layer, "F", ins=[act[id(t)] for t in layer.inputs],
            outs=[act[id(t)] for t in layer.outputs],
            aux=dict(aux[layer.name]),
            workspace_bytes=layer.planned_workspace_bytes("F", batch, feat.itemsize,
                                                          layout))).bind())
    started: set[int] = set()
    for layer in reversed(graph.route):
        if isinstance(layer, Input):
            continue
        s = Step(len(steps), layer, "B",
                 aux=dict(aux[layer.name]),
                 workspace_bytes=layer.planned_workspace_bytes("B", batch, feat.itemsize,
                                                               layout))
        s.douts = [grad.get(id(t)) for t in layer.outputs]
        s.ins = [act[id(t)] if i in layer.retain_inputs else None
                 for i, t in enumerate(layer.inputs)]
        s.outs = [act[id(t)] if j in layer.retain_outputs else None
                  for j, t in enumerate(layer.outputs)]
        for i, t in enumerate(layer.inputs):
            g = grad.get(id(t))
            if g is None:
                continue
            if id(t) in started:
                s.grad_targets.append((i, g, True))
            else:
                started.add(id(t))
                if id(t) in aliases:        # this Add's output gradient is its gradient
                    s.aliased += (i,)
                else:
                    s.grad_targets.append((i, g, False))
        for pname, p in params.get(layer.name, {}).items():
            qname = f"{layer.name}.{pname}"
            if qname in param_grads:
                s.updates.append((pname, p, param_grads[qname], opt_state[qname]))
        steps.append(sched.bind_params(s).bind())
    return sched


def _value_dtype(layer, t, master: np.dtype, feat: np.dtype) -> np.dtype:
    """A layer output's storage type: feature maps in ``feat``; the loss, labels, an Input of
    an explicit dtype and an Input only losses read (regression targets) as they are."""
    if isinstance(layer, Input):
        if layer.dtype is not None:
            return np.dtype(layer.dtype)
        return master if t.consumers and all(c.kind == "loss" for c in t.consumers) else feat
    return master if layer.kind == "loss" else feat
