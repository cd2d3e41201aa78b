"""Input: the data layer. Its forward copies the batch fed by the executor into the arena."""
from __future__ import annotations

import numpy as np

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
        self.dtype = _input_dtype(dtype, self.shape, self.name)   # None: the compute dtype

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


def _input_dtype(dtype, shape, name):
    """None, a real floating dtype (data), or an integer dtype for a labels input of shape ()
    (one class index per sample, fed to a loss): anything else cannot be fed or computed."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name}: dtype must be a NumPy dtype such as np.float32, got "
                        f"{dtype!r}") from None
    if dt.kind == "f":
        return dt
    if dt.kind in "iu" and shape == ():
        return dt
    if dt.kind in "iu":
        raise GraphError(f"{name}: dtype {dt} is for class labels, an Input of shape () fed to "
                         f"a loss; a data input of shape {shape} takes floating point (np.float32,"
                         " or None for the executor's dtype): feed normalized images")
    raise GraphError(f"{name}: dtype {dt} cannot be computed with; give a floating dtype "
                     "(np.float32, or None for the executor's dtype), or an integer dtype for a "
                     "labels Input of shape ()")


def input_tensor(shape, dtype=None, name: str | None = None):
    """``x = neuron.Input((3, 32, 32))`` style: build the data layer and return its tensor."""
    return Input(shape, dtype=dtype, name=name)()
