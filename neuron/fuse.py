"""Graph fusion (opt-in, ``Executor(fuse=True)`` / ``--fuse``): a layer whose output only a
ReLU reads runs fused with it, where neuron has the fused layer:

- a BatchNorm becomes one BNReLU (layers/norm.py). The pair costs the GPU about 13
  feature-map passes per iteration (BN forward reads x twice and writes z, ReLU reads z and
  writes y; ReLU backward reads dy and y and writes dz, BN backward reads x and dz twice and
  writes dx); fused, about 8, and neither the BN output z nor its gradient dz is a tensor.
- an Add (a residual join) becomes one AddReLU (layers/join.py): forward writes y from the
  inputs in one pass, backward masks dy in place in one pass and hands it to the inputs as Add
  does, so neither the sum nor its gradient is a tensor.

Eager PyTorch runs each pair as two layers.

The pass returns a new Graph over copies of the layers (the given graph is not changed, so
fused and unfused executors can share it). A fused layer keeps the first layer's name and
parameter names, so state_dict, checkpoints and PyTorch weight import are unchanged; the ReLU,
which has no parameters, disappears.
"""
from __future__ import annotations

import copy

from .graph import Graph
from .layers.activation import ReLU
from .layers.base import Layer
from .layers.join import Add, AddReLU
from .layers.norm import BatchNorm, BNReLU
from .tensor import Tensor

#: the layer type fused with a ReLU that is its output's only reader -> the fused layer
FUSED_WITH_RELU = {BatchNorm: BNReLU, Add: AddReLU}


def fusable_pairs(graph: Graph, first=tuple(FUSED_WITH_RELU)) -> list[tuple[Layer, ReLU]]:
    """(BatchNorm or Add, ReLU) pairs in route order: the ReLU is the only reader of the
    first layer's output, which is not a graph output. ``first``: the first layers' types
    looked for (default: every type in FUSED_WITH_RELU)."""
    outputs = {id(t) for t in graph.outputs}
    members = {id(l) for l in graph.route}
    pairs = []
    for layer in graph.route:
        if type(layer) not in first or type(layer) not in FUSED_WITH_RELU:
            continue
        t = layer.outputs[0]
        readers = [c for c in t.consumers if id(c) in members]
        if len(readers) == 1 and type(readers[0]) is ReLU and id(t) not in outputs:
            pairs.append((layer, readers[0]))
    return pairs


def fused_counts(graph: Graph) -> dict[str, int]:
    """Fused layer type name -> how many of the fused graph's layers are of it (for reports)."""
    names = {a for a, _ in getattr(graph, "fused", [])}
    out = {cls.type_name: 0 for cls in FUSED_WITH_RELU.values()}
    for layer in graph.route:
        if layer.name in names and layer.type_name in out:
            out[layer.type_name] += 1
    return out


def _as_fused(layer: Layer) -> Layer:
    """The fused layer standing for ``layer``: its name, index, hyper-parameters and built
    parameter specs, and no graph edges yet (fuse_graph connects it)."""
    fused = FUSED_WITH_RELU[type(layer)].__new__(FUSED_WITH_RELU[type(layer)])
    fused.__dict__.update(layer.__dict__)
    fused.inputs, fused.outputs = [], []
    return fused


def fuse_graph(graph: Graph) -> Graph:
    """The graph with every fusable pair as one fused layer; ``graph`` itself when there is
    none. The result's ``fused`` lists the (first layer's name, ReLU's name) pairs."""
    cached = graph.__dict__.get("_fused")
    if cached is not None:
        return cached
    pairs = fusable_pairs(graph)
    if not pairs:
        graph.fused = getattr(graph, "fused", [])
        return graph
    relu_of = {id(first): relu for first, relu in pairs}
    dropped = {id(relu) for relu in relu_of.values()}
    new: dict[int, Tensor] = {}             # id(old tensor) -> its tensor in the fused graph
    clones = []                             # (clone, the layer it copies)
    for layer in graph.route:
        if id(layer) in dropped:
            continue
        ins = [new[id(t)] for t in layer.inputs]
        if id(layer) in relu_of:
            clone = _as_fused(layer)
            olds = relu_of[id(layer)].outputs        # the fused layer's output is the ReLU's
        else:
            clone = copy.copy(layer)
            olds = layer.outputs
        clones.append((clone, layer))
        clone.inputs = ins
        clone.outputs = [Tensor(t.shape, clone, i) for i, t in enumerate(olds)]
        for t in ins:
            t.consumers.append(clone)
        for old, t in zip(olds, clone.outputs):
            new[id(old)] = t
    fused = Graph([new[id(t)] for t in graph.inputs], [new[id(t)] for t in graph.outputs],
                  name=graph.name)
    for clone, layer in clones:     # the unfused numbers: dropout seeds stay the same
        clone.index = layer.index
    fused.fused = [(first.name, relu.name) for first, relu in pairs]
    graph._fused = fused
    return fused
