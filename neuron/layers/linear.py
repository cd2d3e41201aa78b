"""Fully connected layer. Inputs of any shape are flattened per sample in NCHW (C order)
feature order: a free reshape of a C-ordered map; a copy of a channels-last one (--layout
nhwc, memory/layout.py), so the weights mean the same features in either layout."""
from __future__ import annotations

import math

from ..errors import GraphError
from ..init import torch_linear_weight, torch_linear_bias
from ..sizes import callable_arg, flag_arg, size_arg
from .base import Layer, ParamSpec, param_accumulation


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

    @staticmethod
    def _flat(a):
        return None if a is None else a.reshape(a.shape[0], -1)

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.linear_forward(self._flat(ins[0]), params["weight"], params.get("bias"), outs[0])

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        dx, grad_kw = dins[0], ctx.grad_kw(0)
        strided = dx is not None and not dx.flags.c_contiguous
        # a channels-last dx: its flat (NCHW-order) gradient goes to a temporary, the reshape's
        # copy, and from there into dx (written into a copy, it would be lost)
        flat_dx = self._flat(dx)
        k.linear_backward(self._flat(ins[0]), params["weight"], douts[0], flat_dx,
                          dparams["weight"], dparams.get("bias"),
                          **({} if strided else grad_kw), **param_accumulation(ctx))
        if strided:
            (k.add_inplace if grad_kw else k.copy)(dx, flat_dx.reshape(dx.shape))

    def flops(self, batch):
        return batch * self.in_features * self.out_features

    def describe(self):
        return f"FC {self.in_features}->{self.out_features}"
