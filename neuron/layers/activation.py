"""Pointwise activations. Backward reads only the output, so the input can die at once."""
from __future__ import annotations

from ..errors import GraphError
from ..sizes import number_arg
from .base import Layer


class _Pointwise(Layer):
    kind = "act"
    retain_outputs = (0,)
    fwd = bwd = ""

    def infer_shapes(self, in_shapes):
        return [in_shapes[0]]

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        getattr(k, self.fwd)(ins[0], outs[0], *self._extra())

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            getattr(k, self.bwd)(outs[0], douts[0], dins[0], *self._extra(),
                                 **ctx.grad_kw(0))

    def _extra(self):
        return ()


class ReLU(_Pointwise):
    type_name, fwd, bwd = "ReLU", "relu_forward", "relu_backward"


class Sigmoid(_Pointwise):
    type_name, fwd, bwd = "Sigmoid", "sigmoid_forward", "sigmoid_backward"


class Tanh(_Pointwise):
    type_name, fwd, bwd = "Tanh", "tanh_forward", "tanh_backward"


class LeakyReLU(_Pointwise):
    type_name, fwd, bwd = "LeakyReLU", "leaky_relu_forward", "leaky_relu_backward"

    def __init__(self, slope: float = 0.01, name: str | None = None):
        super().__init__(name)
        # > 0: backward reads the output's sign
        self.slope = number_arg(slope, "slope", self.name, low=0, low_open=True, error=GraphError)

    def _extra(self):
        return (self.slope,)
