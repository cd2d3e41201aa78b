"""Synchronized BatchNorm (--sync-bn): statistics of the global batch instead of the replica's.

A kernels wrapper: the executor runs every step with ``dp.kernels(device.kernels)``, and this
object replaces the two training-mode batch-norm kernels while every other name falls through
to the device's own kernels. So no layer changes, and the single-process path is untouched.

Forward: the mean, then the biased variance about it, each summed over the ranks (two small
all-reduces per BN layer, in float64: the same two-pass formula as the single-process kernel).
Backward (PyTorch's SyncBatchNorm): sum(dy) and sum(dy * xhat) are summed over the ranks, with
M the global count. Each rank's dy is the gradient of its shard's mean loss, i.e. K times its part
of the global loss' gradient; the formula is linear in dy, so each rank's dx and dgamma are K
times the global ones, and the gradient averaging of the parameters then gives exactly the
gradient one process computes on the global batch.

Written with the array module of its inputs (NumPy or CuPy); the CuPy path is GPU-unverified.
"""
from __future__ import annotations

from ..kernels.numpy_ref import bn_scale_and_update
from ..recording import collective


def _xp(a):
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    import numpy
    return numpy


def _axes(x):
    if x.ndim == 4:
        return (0, 2, 3), (1, -1, 1, 1)
    if x.ndim == 2:
        return (0,), (1, -1)
    raise ValueError(f"sync batchnorm expects a 2-D or 4-D input, got shape {tuple(x.shape)}")


class SyncBatchNormKernels:
    #: chunked BatchNorm (memory/chunking.py) gathers statistics with its own kernels, which do
    #: not sum over ranks: it checks this flag and refuses
    spans_ranks = True

    def __init__(self, base, comm):
        self._base, self._comm = base, comm

    def __getattr__(self, name):            # everything but batch norm: the device's kernels
        return getattr(self._base, name)

    def _sum(self, a, what):
        self._comm.allreduce_sum([a], what)
        return a

    @collective
    def batchnorm_forward_train(self, x, gamma, beta, y, running_mean, running_var,
                                save_mean, save_invstd, momentum, eps, update_running):
        xp = _xp(x)
        axes, bshape = _axes(x)
        local_m = x.size // x.shape[1]
        m = local_m * self._comm.world_size
        s = self._sum(xp.sum(x, axis=axes, dtype=xp.float64), "sync-bn sum")
        mean = (s / m).astype(x.dtype)
        xp.subtract(x, mean.reshape(bshape), out=y)                    # y = x - mean
        ss = self._sum(xp.sum(xp.square(y), axis=axes, dtype=xp.float64), "sync-bn variance")
        var = (ss / m).astype(x.dtype)                                 # biased, global
        bn_scale_and_update(y, mean, var, m, gamma, beta, eps, save_mean, save_invstd,
                            running_mean, running_var, momentum, update_running)

    @collective
    def batchnorm_backward(self, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                           eps=1e-5, accumulate=False):
        # eps: the layer's (cuDNN's backward takes it); the saved inverse std already holds it
        xp = _xp(x)
        axes, bshape = _axes(x)
        m = (x.size // x.shape[1]) * self._comm.world_size
        xhat = (x - save_mean.reshape(bshape)) * save_invstd.reshape(bshape)
        c = x.shape[1]
        sums = xp.empty(2 * c, dtype=x.dtype)
        sums[:c] = xp.sum(dy, axis=axes)
        sums[c:] = xp.sum(dy * xhat, axis=axes)
        self._sum(sums, "sync-bn backward")
        sum_dy, sum_dy_xhat = sums[:c], sums[c:]
        # this rank's own part of dgamma/dbeta: the gradient averaging sums the ranks' parts
        if dgamma is not None:
            dgamma[...] = xp.sum(dy * xhat, axis=axes)
        if dbeta is not None:
            dbeta[...] = xp.sum(dy, axis=axes)
        if dx is None:
            return
        g = save_invstd if gamma is None else gamma * save_invstd
        out = dy - (sum_dy / m).reshape(bshape) - xhat * (sum_dy_xhat / m).reshape(bshape)
        out *= g.reshape(bshape)
        if accumulate:          # a fan-out input whose gradient another layer began
            dx += out
        else:
            dx[...] = out
