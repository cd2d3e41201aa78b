"""2-D convolution (cross-correlation, as PyTorch), with stride, padding, dilation, groups."""
from __future__ import annotations

import math

from ..errors import ShapeError
from ..init import he_normal, zeros
from ..sizes import callable_arg, flag_arg, size_arg
from .base import Layer, ParamSpec, at_least, param_accumulation, pair, window_text


class Conv2d(Layer):
    kind = "conv"
    retain_inputs = (0,)            # dW needs x; dx needs only W
    type_name = "Conv"

    def __init__(self, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, init=None, name: str | None = None):
        super().__init__(name)
        self.out_channels = size_arg(out_channels, "out_channels", self.name)
        self.kernel = pair(kernel_size, "kernel_size", self.name)
        self.stride = pair(stride, "stride", self.name)
        self.padding = pair(padding, "padding", self.name)
        self.dilation = pair(dilation, "dilation", self.name)
        self.groups = size_arg(groups, "groups", self.name)
        self.bias = flag_arg(bias, "bias", self.name)
        self.init = callable_arg(init, "init", self.name) or he_normal
        for what, value, least in (("out_channels", self.out_channels, 1),
                                   ("kernel_size", self.kernel, 1), ("stride", self.stride, 1),
                                   ("padding", self.padding, 0), ("dilation", self.dilation, 1),
                                   ("groups", self.groups, 1)):
            at_least(self.name, what, value, least)

    def build(self, in_shapes):
        s = in_shapes[0]
        if len(s) != 3:
            raise ShapeError(f"{self.name}: expects input (C,H,W), got {s}")
        c = s[0]
        if c % self.groups or self.out_channels % self.groups:
            raise ShapeError(f"{self.name}: channels in={c} out={self.out_channels} not divisible "
                             f"by groups={self.groups}")
        self.in_channels = c
        self.param_specs = {"weight": ParamSpec(
            (self.out_channels, c // self.groups, *self.kernel), self.init)}
        if self.bias:
            self.param_specs["bias"] = ParamSpec((self.out_channels,), zeros)

    def infer_shapes(self, in_shapes):
        _, h, w = in_shapes[0]
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel, self.stride, self.padding, self.dilation
        ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        if ho <= 0 or wo <= 0:
            raise ShapeError(f"{self.name}: input {in_shapes[0]} too small for kernel {self.kernel} "
                             f"dilation {self.dilation} padding {self.padding} (output {ho}x{wo})")
        return [(self.out_channels, ho, wo)]

    def _args(self):
        return self.stride, self.padding, self.dilation, self.groups

    def workspace_bytes(self, phase, batch, itemsize):
        # forward and backward use the same im2col buffer; planners ask often, so remember.
        # Backward at 2-byte features (mixed precision) also holds the low-type weight and bias
        # gradients in front of it on the GPU (kernels/low_grad_buffers.py): planned too
        key = (phase == "F", batch, itemsize)
        cache = self.__dict__.setdefault("_ws_cache", {})
        if key not in cache:
            from ..kernels import low_grad_buffers, numpy_ref
            w_shape = self.param_specs["weight"].shape
            cache[key] = numpy_ref.conv2d_workspace_bytes(
                self.in_shapes(batch)[0], w_shape, *self._args(), itemsize) + (
                0 if phase == "F" else
                low_grad_buffers.carved_bytes(w_shape, self.bias, itemsize))
        return cache[key]

    def workspace_shrinks(self):
        # NumPy: the same sub-blocks with their columns in a temporary; cuDNN: an algorithm
        # with no workspace (IMPLICIT_GEMM and friends)
        return True

    def workspace_request(self, k, phase, batch, dtype, limit, layout="nchw"):
        choose = getattr(k, "conv2d_workspace_request", None)
        if choose is None:          # NumPy: the fixed im2col chunk
            return super().workspace_request(k, phase, batch, dtype, limit)
        return choose(phase, self.in_shapes(batch)[0], self.param_specs["weight"].shape,
                      *self._args(), dtype, limit, bias=self.bias,
                      **({"layout": layout} if layout != "nchw" else {}))

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.conv2d_forward(ins[0], params["weight"], params.get("bias"), outs[0], *self._args(), ws)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        k.conv2d_backward(ins[0], params["weight"], douts[0], dins[0], dparams["weight"],
                          dparams.get("bias"), *self._args(), ws,
                          **ctx.grad_kw(0),
                          **param_accumulation(ctx))

    def flops(self, batch):
        c, kh, kw = self.param_specs["weight"].shape[1:]
        return math.prod(self.out_shapes(batch)[0]) * c * kh * kw

    def describe(self):
        # also the cost model's profile key (memory/costmodel.layer_key): all the geometry
        groups = f" g{self.groups}" if self.groups != 1 else ""
        return (f"Conv {window_text(self.kernel, self.stride, self.padding, self.dilation)}"
                f"{groups} {self.in_channels}->{self.out_channels}")
