"""Tensor: the symbolic tensor that calling a layer returns (a shape and the layer output it
names). Below both the layers, which make them, and the Graph, which walks them."""
from __future__ import annotations

import math


class Tensor:
    """A symbolic tensor: the ``index``-th output of ``producer``."""
    __slots__ = ("shape", "producer", "index", "consumers")

    def __init__(self, shape, producer, index: int):
        self.shape = tuple(shape)
        self.producer = producer
        self.index = index
        self.consumers: list = []       # the Layers that read it

    @property
    def name(self) -> str:
        p = self.producer
        return p.name if len(p.outputs) <= 1 else f"{p.name}:{self.index}"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self):
        return f"Tensor({self.name}, {self.shape})"
