"""Add (residual join), AddReLU (the join and its ReLU as one layer) and Concat (DenseNet):
layers that wait for all their inputs."""
from __future__ import annotations

from ..errors import ShapeError
from .base import Layer


class Add(Layer):
    """Sum of its inputs. Backward hands each input the output gradient unchanged; an input
    whose gradient the schedule made the output gradient's tensor itself
    (memory/aliasing.py) arrives as None in ``dins``: it already holds its gradient."""
    kind = "join"
    num_inputs = None               # backward needs nothing from forward
    type_name = "Add"
    passes_gradient = True          # every input gradient is the output gradient

    def infer_shapes(self, in_shapes):
        if any(s != in_shapes[0] for s in in_shapes):
            raise ShapeError(f"{self.name}: all inputs must have the same shape, got {in_shapes}")
        return [in_shapes[0]]

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.add_forward(list(ins), outs[0])

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        for i, d in enumerate(dins):
            if d is not None:           # None: no gradient, or aliased to douts[0]
                # the same tensor may be several inputs: its later shares add in place
                (k.add_inplace if ctx.acc(i) else k.copy)(d, douts[0])


class AddReLU(Add):
    """max(sum of inputs, 0) as one layer: what neuron.fuse makes of an Add whose only reader
    is a ReLU (opt-in, ``Executor(fuse=True)``), or a layer of its own. Backward keeps the
    output only: it masks the output gradient by y > 0 in place (``rewrites_gradient``; the
    unmasked gradient has no other reader) and hands the result to every input as Add does,
    so the sum and its gradient are never tensors. Same bits as Add then ReLU."""
    type_name = "AddReLU"
    retain_outputs = (0,)
    rewrites_gradient = True        # douts[0] becomes the input gradient (memory/aliasing.py)

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.add_relu_forward(list(ins), outs[0])

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        k.add_relu_backward(outs[0], douts[0])          # douts[0] *= (y > 0), in place
        super().backward(k, ins, outs, douts, dins, params, dparams, aux, ws, ctx)


class Concat(Layer):
    kind = "concat"
    num_inputs = None
    type_name = "Concat"

    def infer_shapes(self, in_shapes):
        rest = in_shapes[0][1:]
        if any(len(s) != 3 or s[1:] != rest for s in in_shapes):
            raise ShapeError(f"{self.name}: inputs must be (C,H,W) with equal H,W, got {in_shapes}")
        return [(sum(s[0] for s in in_shapes), *rest)]

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.concat_forward(list(ins), outs[0])

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if ctx.accumulate:
            k.concat_backward(douts[0], list(dins), accumulate=ctx.accumulate)
        else:
            k.concat_backward(douts[0], list(dins))
