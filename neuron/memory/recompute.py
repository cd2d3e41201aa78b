"""Cost-aware recomputation (SuperNeurons §3.4).

Checkpoint layers (data, conv, FC, join, concat, loss) keep their outputs. Outputs of the cheap
layers between checkpoints (BN, activations, pooling, LRN, dropout) are *dropped* after their
forward consumers ran: backward gets them back by re-running the segment's forward from its
checkpoint. This is a static rewrite of the schedule: "R" steps are inserted before the backward
step that needs a dropped tensor and write fresh *versions* of it; the backward steps are rebound
to those versions, so liveness frees the forward copy after its last forward use and each version
after its last backward use.

- speed-centric: a segment is recomputed once; every recomputed tensor is kept until backward
  has used it (extra forwards = segment length).
- memory-centric: every needed tensor is recomputed from the checkpoint on its own and the
  intermediates die at once (extra forwards grow quadratically, memory stays at one layer).
- cost-aware (the paper): speed-centric when the segment fits under l_peak, the largest
  per-step need of the whole iteration, memory-centric otherwise. The paper compares the
  segment's bytes alone with l_peak; here the segment is held while its own backward steps run,
  so the test is segment bytes + the largest of those steps <= l_peak: then recomputing cannot
  raise the peak, and it is free in memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from .schedule import Schedule, Step
from .tensors import TensorInfo

CHECKPOINT_KINDS = frozenset({"data", "conv", "fc", "join", "concat", "loss"})
STRATEGIES = ("speed", "memory", "cost")


@dataclass
class RecomputeReport:
    strategy: str
    extra_forward_steps: int
    dropped_tensors: int
    dropped_bytes: int
    segments: int
    speed_segments: int
    memory_segments: int
    l_peak: int


def recompute_step(schedule, layer, ins, out) -> Step:
    """An "R" step: ``layer``'s forward again, from ``ins`` into the new version ``out``."""
    return schedule.bind_params(Step(
        0, layer, "R", ins=ins, outs=[out], aux=dict(schedule.aux.get(layer.name, {})),
        workspace_bytes=layer.planned_workspace_bytes(
            "F", schedule.batch, out.dtype.itemsize, schedule.layout))).bind()


def rerun_step(fwd: Step, ins, out) -> Step:
    """An "R" step repeating the forward step ``fwd`` from ``ins`` into the new version
    ``out``: its layer, parameters, aux (read now: a dropout mask, BN statistics), workspace
    and chunk (memory/chunking.py: a chunk's recompute is that chunk's forward; BN's
    "apply" pass, which reads the whole batch's statistics and changes no running ones)."""
    s = Step(0, fwd.layer, "R", ins=list(ins), outs=[out], params=dict(fwd.params),
             aux=dict(fwd.aux), workspace_bytes=fwd.workspace_bytes)
    s.chunk = fwd.chunk
    if fwd.casts:               # mixed precision: a copy of its own, cast again
        fwd.recast(s)
    return s.bind()


def is_checkpoint(layer) -> bool:
    return layer.kind in CHECKPOINT_KINDS


def plan_recompute(schedule: Schedule, strategy: str = "cost") -> tuple[list[Step], RecomputeReport]:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown recompute strategy {strategy!r}; choose one of "
                         f"{', '.join(STRATEGIES)}")
    steps = schedule.steps
    act = schedule.act
    # which forward tensors backward reads, produced by a cheap layer: those are dropped
    producer = {act[id(t)].id: t.producer for l in schedule.graph.route for t in l.outputs}
    dropped: dict[int, TensorInfo] = {}
    for s in steps:
        if s.phase != "B":
            continue
        for t in [*s.ins, *s.outs]:
            if t is not None and t.id in producer and not is_checkpoint(producer[t.id]):
                dropped[t.id] = t

    def chain(tid: int) -> list:
        """Cheap layers from the segment's checkpoint down to the producer of tensor tid."""
        out = []
        layer = producer[tid]
        while not is_checkpoint(layer):
            out.append(layer)
            layer = layer.inputs[0].producer
        return out[::-1]

    l_peak = max(s.resident_bytes() for s in steps)
    b_need = {id(s.layer): s.resident_bytes() for s in steps if s.phase == "B"}
    seg_mode: dict[int, str] = {}       # id(first layer of chain) -> "speed" | "memory"
    speed_n = mem_n = 0
    new_steps: list[Step] = []
    current: dict[int, TensorInfo] = {}  # forward tensor id -> its live recomputed version
    counter = [len(schedule.registry)]  # version names stay unique across rewrites
    extra = 0

    def version(t_sym) -> TensorInfo:
        base = act[id(t_sym)]
        counter[0] += 1
        return schedule.registry.add(f"{base.name}@r{counter[0]}", base.kind, base.shape,
                                     base.dtype)

    def emit_chain(layers, keep_all: bool) -> dict[int, TensorInfo]:
        nonlocal extra
        made: dict[int, TensorInfo] = {}
        for layer in layers:
            out_sym = layer.outputs[0]
            oid = act[id(out_sym)].id
            if keep_all and oid in current:
                continue                # already recomputed and still held (speed-centric)
            in_t = act[id(layer.inputs[0])]
            src = made.get(in_t.id) or (current.get(in_t.id) if keep_all else None) or in_t
            v = version(out_sym)
            made[oid] = v
            new_steps.append(recompute_step(schedule, layer, [src], v))
            extra += 1
        return made

    for s in steps:
        s = s.copy()               # never renumber the schedule's own steps
        if s.phase != "B":
            new_steps.append(s)
            continue
        need = [t for t in [*s.ins, *s.outs] if t is not None and t.id in dropped]
        binding: dict[int, TensorInfo] = {}
        for t in need:
            if t.id in current:
                binding[t.id] = current[t.id]
                continue
            layers = chain(t.id)
            key = id(layers[0])
            if key not in seg_mode:
                # speed-centric holds the whole segment while its backward steps run: free in
                # memory only if that, plus the largest of those steps, stays under l_peak
                seg_bytes = sum(act[id(l.outputs[0])].nbytes for l in layers)
                seg_step = max(b_need.get(id(l), 0) for l in layers)
                mode = strategy if strategy != "cost" else (
                    "speed" if seg_bytes + seg_step <= l_peak else "memory")
                seg_mode[key] = mode
                speed_n += mode == "speed"
                mem_n += mode == "memory"
            if seg_mode[key] == "speed":
                current.update(emit_chain(layers, keep_all=True))
                binding[t.id] = current[t.id]
            else:
                binding[t.id] = emit_chain(layers, keep_all=False)[t.id]
        if binding:
            rebind(s, binding)
        new_steps.append(s)
    renumber(new_steps)
    report = RecomputeReport(strategy, extra, len(dropped),
                             sum(t.nbytes for t in dropped.values()), len(seg_mode), speed_n,
                             mem_n, l_peak)
    return new_steps, report


def rebind(step, binding: dict) -> None:
    """Point a backward step's inputs/outputs at the recomputed versions (tensor id -> version)."""
    step.ins = [binding.get(t.id, t) if t is not None else None for t in step.ins]
    step.outs = [binding.get(t.id, t) if t is not None else None for t in step.outs]
    step.bind()


def renumber(steps) -> None:
    for i, s in enumerate(steps):
        s.index = i
