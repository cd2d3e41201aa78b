"""`neuron summary`: layers, output shapes, parameter counts, and each step's resident bytes
(l_i: every tensor the step reads or writes, its parameters included, plus its workspace; not
`neuron plan`'s ``max_step_bytes``, which leaves out the parameters it counts as resident state
and rounds to the heap's blocks)."""
from __future__ import annotations

import math

import numpy as np

from ..graph import Graph
from ..memory.schedule import build_schedule
from ..optim import SGD


def summarize(graph: Graph, batch: int, dtype=np.float32, optimizer: SGD | None = None) -> dict:
    from ..executor import with_loss
    opt = optimizer or SGD()
    sched = build_schedule(with_loss(graph), batch, dtype, opt.state_names)
    fwd, bwd = {}, {}
    for s in sched.steps:
        (fwd if s.phase == "F" else bwd)[s.layer.name] = s.resident_bytes()
    layers = []
    for layer in sched.graph.route:
        layers.append({
            "name": layer.name, "type": layer.type_name, "describe": layer.describe(),
            "output_shape": [batch, *layer.outputs[0].shape] if layer.outputs else [],
            "params": sum(math.prod(p.shape) for p in layer.param_specs.values() if p.trainable),
            "fwd_bytes": fwd.get(layer.name, 0), "bwd_bytes": bwd.get(layer.name, 0)})
    steps = [{"step": s.index, "layer": s.layer.name, "phase": s.phase,
              "bytes": s.resident_bytes(), "workspace_bytes": s.workspace_bytes}
             for s in sched.steps]
    return {"model": graph.name, "batch": batch, "layers": layers,
            "params": graph.num_params(), "param_bytes": graph.num_params() * np.dtype(dtype).itemsize,
            "num_layers": len(layers), "steps": steps,
            "max_step_resident_bytes": max(s["bytes"] for s in steps)}
