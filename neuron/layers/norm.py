"""Batch normalization and cross-channel local response normalization."""
from __future__ import annotations

import math

from ..errors import GraphError, ShapeError
from ..init import ones, zeros
from ..kernels import bn_chunks
from ..kernels.cuda_raw import bnrelu_workspace_bytes
from ..recording import kernel_module
from ..sizes import number_arg, size_arg
from .base import AuxSpec, Layer, ParamSpec


class BatchNorm(Layer):
    """PyTorch semantics: normalize with the biased batch variance, update running_var with the
    unbiased one. Running statistics change once per iteration: never during a recompute."""
    kind = "bn"
    retain_inputs = (0,)
    type_name = "BN"

    def __init__(self, momentum: float = 0.1, eps: float = 1e-5, name: str | None = None):
        super().__init__(name)
        # running = (1 - momentum) * running + momentum * batch statistic, as PyTorch
        self.momentum = number_arg(momentum, "momentum", self.name, low=0, high=1, error=GraphError)
        self.eps = number_arg(eps, "eps", self.name, low=0, low_open=True, error=GraphError)

    def build(self, in_shapes):
        s = in_shapes[0]
        if len(s) not in (1, 3):
            raise ShapeError(f"{self.name}: expects (C,) or (C,H,W) input, got {s}")
        c = s[0]
        self.channels = c
        self.param_specs = {"weight": ParamSpec((c,), ones), "bias": ParamSpec((c,), zeros),
                            "running_mean": ParamSpec((c,), zeros, trainable=False),
                            "running_var": ParamSpec((c,), ones, trainable=False)}

    def infer_shapes(self, in_shapes):
        return [in_shapes[0]]

    def aux_specs(self, batch):
        return {"save_mean": AuxSpec((self.channels,)), "save_invstd": AuxSpec((self.channels,))}

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        p = params
        if ctx.chunk is not None:
            self._check_chunkable(k)
            return self._forward_chunk(kernel_module(k, bn_chunks), ins[0], outs, p, aux, ctx)
        if ctx.training:
            k.batchnorm_forward_train(ins[0], p["weight"], p["bias"], outs[0], p["running_mean"],
                                      p["running_var"], aux["save_mean"], aux["save_invstd"],
                                      self.momentum, self.eps, not ctx.recompute)
        else:
            k.batchnorm_forward_infer(ins[0], p["weight"], p["bias"], outs[0], p["running_mean"],
                                      p["running_var"], self.eps)

    def _check_chunkable(self, k):
        if getattr(k, "spans_ranks", False):
            raise NotImplementedError(f"{self.name}: synchronized BatchNorm over ranks is not "
                                      "combined with sub-layer chunking; use --chunks 1")

    def _forward_chunk(self, bn, x, outs, p, aux, ctx):
        """Whole-batch statistics over chunks: a "stats" pass, then an "apply" pass."""
        ch = ctx.chunk
        if ch.stage == "stats":
            if not ctx.training:
                return                  # inference normalizes with the running statistics
            per = bn_chunks.per_channel(x) // ch.size
            bn.stats_accumulate(x, aux["save_mean"], aux["save_invstd"],
                                       ch.start * per, ch.first)
            if ch.last:
                bn.stats_finish(aux["save_mean"], aux["save_invstd"], ch.total * per,
                                       p["running_mean"], p["running_var"], self.momentum,
                                       self.eps, not ctx.recompute)
        elif ctx.training:
            bn.apply(x, p["weight"], p["bias"], outs[0], aux["save_mean"],
                            aux["save_invstd"])
        else:
            bn.apply(x, p["weight"], p["bias"], outs[0], p["running_mean"],
                            1.0 / (p["running_var"] + self.eps) ** 0.5)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        ch = ctx.chunk
        if ch is not None:
            self._check_chunkable(k)
            x, bn = ins[0], kernel_module(k, bn_chunks)
            if ch.stage == "sums":
                bn.backward_sums(x, douts[0], aux["save_mean"], aux["save_invstd"],
                                        dparams["weight"], dparams["bias"], ch.first)
            elif dins[0] is not None:
                per = bn_chunks.per_channel(x) // ch.size
                bn.backward_grad(x, douts[0], params["weight"], aux["save_mean"],
                                        aux["save_invstd"], dparams["weight"], dparams["bias"],
                                        ch.total * per, dins[0], ctx.acc(0))
            return
        k.batchnorm_backward(ins[0], douts[0], params["weight"], aux["save_mean"],
                             aux["save_invstd"], dins[0], dparams["weight"], dparams["bias"],
                             eps=self.eps, **ctx.grad_kw(0))


class BNReLU(BatchNorm):
    """max(BatchNorm(x), 0) as one layer: what neuron.fuse makes of a BatchNorm whose only
    reader is a ReLU (opt-in, ``Executor(fuse=True)``). It keeps the BatchNorm's name and
    parameters, so checkpoints are those of the unfused pair. Backward reads x, dy and the saved
    statistics only: the ReLU's mask is recomputed from x (the forward's own operations, so the
    same bits), so neither the BN output nor its gradient is ever a tensor."""
    type_name = "BNReLU"

    def workspace_bytes(self, phase, batch, itemsize):
        """The GPU kernels' per-thread partial sums (kernels/cuda_raw.py); the NumPy kernels
        and the chunked passes run without it."""
        per_sample = math.prod(self.inputs[0].shape) // self.channels
        return bnrelu_workspace_bytes(batch * per_sample, self.channels, itemsize)

    def workspace_shrinks(self):
        return True             # without one, the GPU kernels allocate their partial sums

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        p = params
        if ctx.chunk is not None:
            self._check_chunkable(k)
            if ctx.chunk.stage == "stats":
                return super().forward(k, ins, outs, params, aux, ws, ctx)
            bn = kernel_module(k, bn_chunks)
            if ctx.training:
                bn.apply_relu(ins[0], p["weight"], p["bias"], outs[0], aux["save_mean"],
                              aux["save_invstd"])
            else:
                bn.apply_relu(ins[0], p["weight"], p["bias"], outs[0], p["running_mean"],
                              1.0 / (p["running_var"] + self.eps) ** 0.5)
            return
        if getattr(k, "spans_ranks", False):     # sync-BN's kernels, then the ReLU in place
            super().forward(k, ins, outs, params, aux, ws, ctx)
            k.relu_forward(outs[0], outs[0])
            return
        if ctx.training:
            k.bnrelu_forward_train(ins[0], p["weight"], p["bias"], outs[0], p["running_mean"],
                                   p["running_var"], aux["save_mean"], aux["save_invstd"],
                                   self.momentum, self.eps, not ctx.recompute,
                                   **({"workspace": ws} if ws is not None else {}))
        else:
            k.bnrelu_forward_infer(ins[0], p["weight"], p["bias"], outs[0], p["running_mean"],
                                   p["running_var"], self.eps)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        x, dy, p = ins[0], douts[0], params
        stats = (aux["save_mean"], aux["save_invstd"])
        ch = ctx.chunk
        if ch is not None:
            self._check_chunkable(k)
            bn = kernel_module(k, bn_chunks)
            if ch.stage == "sums" or dins[0] is not None:
                dz = bn.relu_grad(x, dy, p["weight"], p["bias"], *stats)
                super().backward(k, ins, outs, [dz], dins, params, dparams, aux, ws, ctx)
            return
        if getattr(k, "spans_ranks", False):
            # sync-BN's backward sums over the ranks: it takes the ReLU's gradient, made here
            # in a temporary outside the plan (the unfused pair plans it as a tensor)
            dz = dy.copy()
            k.bnrelu_relu_grad(x, dy, p["weight"], p["bias"], *stats, dz)
            return super().backward(k, ins, [None], [dz], dins, params, dparams, aux, ws, ctx)
        k.bnrelu_backward(x, dy, p["weight"], p["bias"], *stats, dins[0], dparams["weight"],
                          dparams["bias"], eps=self.eps, **ctx.grad_kw(0),
                          **({"workspace": ws} if ws is not None else {}))


class LRN(Layer):
    """Cross-channel LRN exactly as torch.nn.LocalResponseNorm (AlexNet's LRN1/LRN2)."""
    kind = "lrn"
    retain_inputs = (0,)
    retain_outputs = (0,)
    type_name = "LRN"

    def __init__(self, size: int = 5, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0,
                 name: str | None = None):
        super().__init__(name)
        # cuDNN's limits (CUDNN_LRN_MIN_N/MAX_N, MIN_K, MIN_BETA), so CPU and GPU take the same
        self.size = size_arg(size, "size", self.name)
        if not 1 <= self.size <= 16:
            raise GraphError(f"{self.name}: size must be between 1 and 16 channels, got {size}")
        self.alpha = number_arg(alpha, "alpha", self.name, error=GraphError)
        self.beta = number_arg(beta, "beta", self.name, low=0.01, error=GraphError)
        self.k = number_arg(k, "k", self.name, low=1e-5, error=GraphError)

    def infer_shapes(self, in_shapes):
        if len(in_shapes[0]) != 3:
            raise ShapeError(f"{self.name}: expects input (C,H,W), got {in_shapes[0]}")
        return [in_shapes[0]]

    def describe(self):
        return f"LRN {self.size}"       # the window: the cost model's key must tell it

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        k.lrn_forward(ins[0], outs[0], self.size, self.alpha, self.beta, self.k)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            k.lrn_backward(ins[0], outs[0], douts[0], dins[0], self.size, self.alpha, self.beta,
                           self.k, **ctx.grad_kw(0))

    def flops(self, batch):
        return math.prod(self.out_shapes(batch)[0]) * self.size
