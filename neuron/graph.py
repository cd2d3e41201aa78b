"""The Graph and route construction (SuperNeurons Algorithm 1) over symbolic tensors
(tensor.py; ``neuron.graph.Tensor`` is the same class).

Shapes here are per sample (no batch dimension), so one graph serves every batch size: the
planner multiplies by the batch when it counts bytes.
"""
from __future__ import annotations

import math
from collections import Counter

from .errors import GraphError
from .layers.base import Layer
from .layers.data import Input
from .tensor import Tensor


class Graph:
    """The layers between ``inputs`` and ``outputs``, in forward route order.

    Every layer that the inputs feed must lead to an output: a dangling layer is an error,
    because its activations would be computed and never used.
    """

    def __init__(self, inputs, outputs, name: str = "net"):
        self.name = name
        self.inputs = _tensors(inputs, "inputs")
        self.outputs = _tensors(outputs, "outputs")
        for t in self.inputs:
            if not isinstance(t.producer, Input):
                raise GraphError(f"graph input {t.name} is not produced by an Input layer")
        layers = self._collect()
        names = Counter(l.name for l in layers)
        dup = [n for n, c in names.items() if c > 1]
        if dup:
            raise GraphError(f"duplicate layer names: {dup[:5]}")
        self.route = route(self.inputs, layers)
        for i, layer in enumerate(self.route):
            layer.index = i             # stable per-layer number (dropout seeds, reports)
        self.layers = {l.name: l for l in self.route}

    def _collect(self) -> list[Layer]:
        """Walk back from the outputs; check every input is declared and nothing dangles."""
        seen: dict[int, Layer] = {}
        stack = [t.producer for t in self.outputs]
        declared = {id(t.producer) for t in self.inputs}
        while stack:
            layer = stack.pop()
            if id(layer) in seen:
                continue
            seen[id(layer)] = layer
            if isinstance(layer, Input) and id(layer) not in declared:
                raise GraphError(f"{layer.name}: an Input the outputs depend on is not among the "
                                 f"graph's inputs {[t.name for t in self.inputs]}")
            stack.extend(t.producer for t in layer.inputs)
        # forward reachability: anything fed by the inputs that is not in `seen` dangles
        stack = [t.producer for t in self.inputs]
        visited = set()
        while stack:
            layer = stack.pop()
            if id(layer) in visited:
                continue
            visited.add(id(layer))
            if id(layer) not in seen:
                if getattr(layer, "training_loss", False):
                    continue    # attached by an executor to an earlier graph over these tensors
                raise GraphError(f"layer {layer.name} ({layer.type_name}) is not connected to the "
                                 f"outputs {[t.name for t in self.outputs]}: its result is never used")
            for t in layer.outputs:
                stack.extend(t.consumers)
        for t in self.inputs:
            if id(t.producer) not in seen:
                raise GraphError(f"graph input {t.name} does not reach any output")
        return list(seen.values())

    # ---- introspection ------------------------------------------------------------------
    def params(self):
        """(qualified name, layer, local name, spec) for every parameter, in route order."""
        for layer in self.route:
            for pname, spec in layer.param_specs.items():
                yield f"{layer.name}.{pname}", layer, pname, spec

    def num_params(self, trainable_only: bool = True) -> int:
        return sum(math.prod(s.shape) for _, _, _, s in self.params()
                   if s.trainable or not trainable_only)

    def __len__(self):
        return len(self.route)


def _tensors(value, what: str) -> list[Tensor]:
    """A Tensor or a list/tuple of Tensors, else a TypeError naming what was given."""
    items = [value] if isinstance(value, Tensor) else value
    if not isinstance(items, (list, tuple)) or not items or \
            not all(isinstance(t, Tensor) for t in items):
        raise TypeError(f"Graph {what} must be a Tensor or a non-empty list of Tensors (what "
                        f"calling a layer returns), got {value!r}")
    return list(items)


def route(inputs: list[Tensor], layers: list[Layer]) -> list[Layer]:
    """Forward route by DFS from the data layers with per-layer arrival counters.

    A layer with several inputs (join, concat) is emitted only when all of its input edges have
    arrived, so it runs after every branch that feeds it. Iterative: 10^4-layer chains are fine.
    Layers that never become ready lie on a cycle; that is an error naming them.
    """
    members = {id(l) for l in layers}
    need = {id(l): len(l.inputs) for l in layers}
    arrived = Counter()
    order: list[Layer] = []
    emitted = set()
    stack = [t.producer for t in reversed(inputs)]
    while stack:
        layer = stack.pop()
        if id(layer) in emitted:
            continue
        if layer.inputs:
            arrived[id(layer)] += 1
            if arrived[id(layer)] < need[id(layer)]:
                continue
        emitted.add(id(layer))
        order.append(layer)
        nxt = [c for t in layer.outputs for c in t.consumers if id(c) in members]
        stack.extend(reversed(nxt))   # first consumer is walked first (depth first)
    if len(order) != len(layers):
        stuck = [l.name for l in layers if id(l) not in emitted]
        raise GraphError(f"route construction stopped with {len(stuck)} layer(s) never ready: "
                         f"{stuck[:8]} (a cycle, or an input that is not a graph input)")
    return order
