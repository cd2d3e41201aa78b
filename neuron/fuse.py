"""Graph fusion (opt-in, ``Executor(fuse=True)`` / ``--fuse``): a BatchNorm whose output only a
ReLU reads becomes one BNReLU layer (layers/norm.py).

The pair costs the GPU about 13 feature-map passes per iteration (BN forward reads x twice and
writes z, ReLU reads z and writes y; ReLU backward reads dy and y and writes dz, BN backward
reads x and dz twice and writes dx); fused, about 8, and the BN output z and its gradient dz are
never tensors, so the plan holds fewer bytes. Eager PyTorch runs the two separately.

The pass returns a new Graph over copies of the layers (the given graph is not changed, so
fused and unfused executors can share it). The fused layer keeps the BatchNorm's name and
parameter names, so state_dict, checkpoints and PyTorch weight import are unchanged; the ReLU,
which has no parameters, disappears.
"""
from __future__ import annotations

import copy

from .graph import Graph
from .layers.activation import ReLU
from .layers.norm import BatchNorm, BNReLU
from .tensor import Tensor


def fusable_pairs(graph: Graph) -> list[tuple[BatchNorm, ReLU]]:
    """(BatchNorm, ReLU) pairs in route order: the ReLU is the only reader of the BN's output,
    which is not a graph output."""
    outputs = {id(t) for t in graph.outputs}
    members = {id(l) for l in graph.route}
    pairs = []
    for layer in graph.route:
        if type(layer) is not BatchNorm:
            continue
        t = layer.outputs[0]
        readers = [c for c in t.consumers if id(c) in members]
        if len(readers) == 1 and type(readers[0]) is ReLU and id(t) not in outputs:
            pairs.append((layer, readers[0]))
    return pairs


def fuse_bn_relu(graph: Graph) -> Graph:
    """The graph with every fusable (BatchNorm, ReLU) pair as one BNReLU; ``graph`` itself when
    there is none. The result's ``fused`` lists the (BN name, ReLU name) pairs."""
    cached = graph.__dict__.get("_fused_bn_relu")
    if cached is not None:
        return cached
    pairs = fusable_pairs(graph)
    if not pairs:
        graph.fused = getattr(graph, "fused", [])
        return graph
    relu_of = {id(bn): relu for bn, relu in pairs}
    dropped = {id(relu) for relu in relu_of.values()}
    new: dict[int, Tensor] = {}             # id(old tensor) -> its tensor in the fused graph
    clones = []                             # (clone, the layer it copies)
    for layer in graph.route:
        if id(layer) in dropped:
            continue
        ins = [new[id(t)] for t in layer.inputs]
        if id(layer) in relu_of:
            clone = BNReLU.of(layer)
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
    fused.fused = [(bn.name, relu.name) for bn, relu in pairs]
    graph._fused_bn_relu = fused
    return fused
