"""Dropout with a reproducible mask. The mask is an AUX tensor: a recompute reuses it."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..recording import per_iteration
from ..sizes import number_arg
from .base import AuxSpec, Layer


class Dropout(Layer):
    kind = "dropout"
    type_name = "Dropout"

    def __init__(self, p: float = 0.5, name: str | None = None):
        super().__init__(name)
        self.p = number_arg(p, "p", self.name, low=0, high=1, high_open=True, error=GraphError)
        self.index = 0              # set by the graph: part of the mask seed

    def infer_shapes(self, in_shapes):
        return [in_shapes[0]]

    def aux_specs(self, batch):
        return {"mask": AuxSpec(self.in_shapes(batch)[0], np.uint8)}

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        if not ctx.training:
            k.copy(outs[0], ins[0])
        elif ctx.recompute:
            k.dropout_apply(ins[0], outs[0], aux["mask"], self.p)
        else:
            base, index = ctx.seed * 1_000_003, self.index
            seed = per_iteration(k, lambda it: (base + it * 7919 + index) % (2 ** 63),
                                 ctx.iteration)
            if ctx.chunk is None:
                k.dropout_forward(ins[0], outs[0], aux["mask"], self.p, seed)
            else:                       # this chunk's part of the whole batch's mask
                k.dropout_forward(ins[0], outs[0], aux["mask"], self.p, seed,
                                  batch_offset=ctx.chunk.start, batch_total=ctx.chunk.total)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            k.dropout_backward(douts[0], aux["mask"], dins[0], self.p, **ctx.grad_kw(0))
