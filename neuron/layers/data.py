"""Input: the data layer. Its forward copies the batch fed by the executor into the arena."""
from __future__ import annotations

from ..errors import GraphError
from ..sizes import shape_arg
from .base import Layer


class Input(Layer):
    kind = "data"
    num_inputs = 0
    type_name = "Input"

    def __init__(self, shape, dtype=None, name: str | None = None):
        super().__init__(name)
        self.shape = shape_arg(shape, "shape", self.name)
        if any(s <= 0 for s in self.shape):
            raise GraphError(f"{self.name}: shape must be positive, got {self.shape}")
        self.dtype = dtype          # None: compute dtype; labels use np.int64

    def infer_shapes(self, in_shapes):
        return [self.shape]

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        feed = ctx.feed[self.name]
        if ctx.chunk is not None:
            feed = feed[ctx.chunk.start:ctx.chunk.start + ctx.chunk.size]
        k.copy(outs[0], feed)

    def backward(self, *a):
        pass

    def flops(self, batch):
        return 0


def input_tensor(shape, dtype=None, name: str | None = None):
    """``x = neuron.Input((3, 32, 32))`` style: build the data layer and return its tensor."""
    return Input(shape, dtype=dtype, name=name)()
