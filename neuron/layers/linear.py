"""Fully connected layer. Inputs of any shape are flattened per sample in NCHW (C order)
feature order: a free reshape of a C-ordered map; a copy of a channels-last one (--layout
nhwc, memory/layout.py) into the step's planned workspace (``reorder_bytes``), so the
weights mean the same features in either layout."""
from __future__ import annotations

import math

from ..errors import GraphError
from ..init import torch_linear_weight, torch_linear_bias
from ..sizes import callable_arg, flag_arg, size_arg
from .base import Layer, ParamSpec, param_accumulation
from .data import Input


class Linear(Layer):
    kind = "fc"
    retain_inputs = (0,)
    type_name = "FC"

    def __init__(self, out_features: int, bias: bool = True, init=None, name: str | None = None):
        super().__init__(name)
        self.out_features = size_arg(out_features, "out_features", self.name)
        if self.out_features <= 0:
            raise GraphError(f"{self.name}: out_features must be positive, got {out_features}")
        self.bias = flag_arg(bias, "bias", self.name)
        self.init = callable_arg(init, "init", self.name)

    def build(self, in_shapes):
        self.in_features = math.prod(in_shapes[0])
        self.param_specs = {"weight": ParamSpec((self.out_features, self.in_features),
                                                self.init or torch_linear_weight)}
        if self.bias:
            self.param_specs["bias"] = ParamSpec((self.out_features,),
                                                 torch_linear_bias(self.in_features))

    def infer_shapes(self, in_shapes):
        return [(self.out_features,)]

    def reorder_bytes(self, phase, batch, itemsize, layout):
        # a channels-last (C, H, W) input with H*W > 1 is not C-ordered: forward flattens a
        # copy of it, backward a copy of it and its gradient (none for the data's)
        shape = self.inputs[0].shape
        if layout != "nhwc" or len(shape) != 3 or shape[1] * shape[2] == 1:
            return 0
        n = batch * math.prod(shape) * itemsize
        return n if phase == "F" or isinstance(self.inputs[0].producer, Input) else 2 * n

    @staticmethod
    def _in_workspace(a, ws, at=0):
        """An (N, features) C-ordered buffer the size of ``a`` in ``ws`` from byte ``at``; None
        where none was planned there."""
        n = a.size * a.itemsize
        if ws is None or ws.size < at + n:
            return None
        return ws[at:at + n].view(a.dtype).reshape(a.shape[0], -1)

    def _flat(self, k, a, ws):
        """``a`` as (N, features) in NCHW order: a free reshape of a C-ordered array, else a
        copy into the workspace (the reshape's temporary where none was planned)."""
        buf = None if a.flags.c_contiguous else self._in_workspace(a, ws)
        if buf is None:
            return a.reshape(a.shape[0], -1)
        k.copy(buf.reshape(a.shape), a)
        return buf

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.linear_forward(self._flat(k, ins[0], ws), params["weight"], params.get("bias"),
                         outs[0])

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        dx, grad_kw = dins[0], ctx.grad_kw(0)
        x = self._flat(k, ins[0], ws)
        strided = dx is not None and not dx.flags.c_contiguous
        if strided:
            # a channels-last dx: its flat (NCHW-order) gradient is written beside x's copy in
            # the workspace (or a temporary), then into dx (written into a copy, it is lost)
            flat_dx = self._in_workspace(dx, ws, 0 if ins[0].flags.c_contiguous else x.nbytes)
            if flat_dx is None:
                flat_dx = dx.reshape(dx.shape[0], -1)
        else:
            flat_dx = None if dx is None else dx.reshape(dx.shape[0], -1)
        k.linear_backward(x, params["weight"], douts[0], flat_dx,
                          dparams["weight"], dparams.get("bias"),
                          **({} if strided else grad_kw), **param_accumulation(ctx))
        if strided:
            (k.add_inplace if grad_kw else k.copy)(dx, flat_dx.reshape(dx.shape))

    def flops(self, batch):
        return batch * self.in_features * self.out_features

    def describe(self):
        return f"FC {self.in_features}->{self.out_features}"
