"""Max, average and global-average pooling."""
from __future__ import annotations

from ..errors import ShapeError
from ..kernels.numpy_pool import pool_out_hw
from ..sizes import flag_arg
from .base import Layer, at_least, pair, window_text


class _Pool2d(Layer):
    """torch.nn.MaxPool2d / AvgPool2d (dilation 1; average counts the padding). ``ceil_mode``
    rounds the output size up as torch does: the last window must start inside the input or
    the left padding, and an average window past the padded edge divides by its clipped size."""
    kind = "pool"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 name: str | None = None):
        super().__init__(name)
        self.kernel = pair(kernel_size, "kernel_size", self.name)
        self.stride = pair(stride if stride is not None else kernel_size, "stride", self.name)
        self.padding = pair(padding, "padding", self.name)
        self.ceil_mode = flag_arg(ceil_mode, "ceil_mode", self.name)
        for what, value, least in (("kernel_size", self.kernel, 1), ("stride", self.stride, 1),
                                   ("padding", self.padding, 0)):
            at_least(self.name, what, value, least)
        if self.padding[0] * 2 > self.kernel[0] or self.padding[1] * 2 > self.kernel[1]:
            raise ShapeError(f"{self.name}: padding {self.padding} must be at most half the "
                             f"kernel {self.kernel}")

    def infer_shapes(self, in_shapes):
        s = in_shapes[0]
        if len(s) != 3:
            raise ShapeError(f"{self.name}: expects input (C,H,W), got {s}")
        c, h, w = s
        # the kernels take the output shape from the output array, so this is the one rule
        ho, wo = pool_out_hw(h, w, self.kernel, self.stride, self.padding, self.ceil_mode)
        if ho <= 0 or wo <= 0:
            raise ShapeError(f"{self.name}: input {s} too small for kernel {self.kernel}")
        return [(c, ho, wo)]

    def describe(self):
        # also the cost model's profile key (memory/costmodel.layer_key): all the geometry
        ceil = " ceil" if self.ceil_mode else ""
        return f"{self.type_name} {window_text(self.kernel, self.stride, self.padding)}{ceil}"


class MaxPool2d(_Pool2d):
    type_name = "MaxPool"
    retain_inputs = (0,)
    retain_outputs = (0,)           # cuDNN's backward wants x, y and dy

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.maxpool_forward(ins[0], outs[0], self.kernel, self.stride, self.padding)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            k.maxpool_backward(ins[0], outs[0], douts[0], dins[0], self.kernel, self.stride,
                               self.padding, **ctx.grad_kw(0))


class AvgPool2d(_Pool2d):
    type_name = "AvgPool"

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.avgpool_forward(ins[0], outs[0], self.kernel, self.stride, self.padding)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            k.avgpool_backward(douts[0], dins[0], self.kernel, self.stride, self.padding,
                               **ctx.grad_kw(0))


class GlobalAvgPool(Layer):
    kind = "pool"
    type_name = "GlobalAvgPool"

    def infer_shapes(self, in_shapes):
        if len(in_shapes[0]) != 3:
            raise ShapeError(f"{self.name}: expects input (C,H,W), got {in_shapes[0]}")
        return [(in_shapes[0][0],)]

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.global_avgpool_forward(ins[0], outs[0])

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            k.global_avgpool_backward(douts[0], dins[0], **ctx.grad_kw(0))
