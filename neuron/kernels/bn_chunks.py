"""Batch normalization over a batch processed in chunks (memory/chunking.py).

The statistics are those of the whole batch: a pass over the chunks combines each chunk's
mean and sum of squared deviations (Chan et al.'s pairwise update, in float64) into the
layer's save_mean / save_invstd tensors (the latter holds the running sum of squared
deviations until the last chunk turns it into 1/sqrt(var + eps)); a second pass normalizes.
Backward likewise: one pass sums dy and dy*xhat per channel (they are dbeta and dgamma), one
computes dx. The formulas follow numpy_ref's whole-batch kernels, so the chunked result is
the unchunked one up to the order of summation.

Written with array methods only, so the same code runs on NumPy and CuPy arrays (the float64
per-chunk temporaries are the kernels' own, outside the arena, like numpy_ref's; on the GPU
this is unverified). Mixed precision on the GPU hands it 2-byte x, y, dy and dx: they are read
as float32 (cuda_low's cast kernels) and each result is rounded into its 2-byte array once, as
cuDNN's whole-batch BatchNorm does (the CPU reference gives it float32 copies already).
"""
from __future__ import annotations

import numpy as np

from . import cuda_low
from .numpy_ref import update_running_stats


def _f32(a):
    """A 2-byte (device) array as a float32 temporary; any other array itself."""
    return cuda_low.to_f32(a) if cuda_low.is_low(a) else a


def _store(out, value, accumulate: bool = False) -> None:
    """out <- value (or out + value), rounded once into a 2-byte ``out``."""
    if cuda_low.is_low(out):
        if accumulate:
            value = value + _f32(out)
        cuda_low.cast(out, value)
    elif accumulate:
        out += value
    else:
        out[...] = value


def _axes(x):
    if x.ndim == 4:
        return (0, 2, 3), (1, -1, 1, 1)
    if x.ndim == 2:
        return (0,), (1, -1)
    raise ValueError(f"batchnorm expects a 2-D or 4-D input, got shape {x.shape}")


def per_channel(x) -> int:
    """Elements per channel in x."""
    return x.size // x.shape[1]


def stats_accumulate(x, mean_acc, m2_acc, seen: int, first: bool) -> None:
    """Fold chunk x into (mean_acc, m2_acc), which hold the statistics of ``seen`` elements
    per channel (ignored when ``first``)."""
    axes, bshape = _axes(x)
    x64 = _f32(x).astype("float64")
    mean = x64.mean(axis=axes)
    x64 -= mean.reshape(bshape)
    m2 = (x64 * x64).sum(axis=axes)
    if first:
        mean_acc[...] = mean
        m2_acc[...] = m2
        return
    n = per_channel(x)
    tot = seen + n
    mean_a = mean_acc.astype("float64")
    delta = mean - mean_a
    mean_acc[...] = mean_a + delta * (n / tot)
    m2_acc[...] = m2_acc.astype("float64") + m2 + delta * delta * (seen * n / tot)


def stats_finish(mean_acc, m2_acc, count: int, running_mean, running_var, momentum, eps,
                 update_running: bool) -> None:
    """After the last chunk: m2_acc becomes 1/sqrt(var + eps); the running statistics
    change once, as numpy_ref.batchnorm_forward_train changes them."""
    var = (m2_acc.astype("float64") / count).astype(m2_acc.dtype)
    mean = mean_acc.copy()
    m2_acc[...] = 1.0 / (var + eps) ** 0.5
    if update_running:
        update_running_stats(running_mean, running_var, mean, var, count, momentum)


def apply(x, gamma, beta, y, save_mean, save_invstd) -> None:
    _, bshape = _axes(x)
    if cuda_low.is_low(y):          # in float32, rounded once
        t = _f32(x) - save_mean.reshape(bshape)
        apply_scale(t, gamma, beta, save_invstd, bshape)
        _store(y, t)
        return
    y[...] = x - save_mean.reshape(bshape)
    apply_scale(y, gamma, beta, save_invstd, bshape)


def apply_relu(x, gamma, beta, y, save_mean, save_invstd) -> None:
    """y = max(apply(x), 0) (the fused BNReLU's apply pass): apply's arithmetic, then the
    ReLU before the one rounding into a 2-byte y."""
    _, bshape = _axes(x)
    t = _f32(x) - save_mean.reshape(bshape)
    apply_scale(t, gamma, beta, save_invstd, bshape)
    np.maximum(t, 0, out=t)     # NumPy's or, through __array_ufunc__, CuPy's
    _store(y, t)


def relu_grad(x, dy, gamma, beta, save_mean, save_invstd):
    """dy * (z > 0) in float32, z = apply(x) recomputed by apply's operations (the mask the
    forward's ReLU saw): the gradient the fused BNReLU's two backward passes read."""
    _, bshape = _axes(x)
    z = _f32(x) - save_mean.reshape(bshape)
    apply_scale(z, gamma, beta, save_invstd, bshape)
    return (z > 0) * _f32(dy)


def apply_scale(y, gamma, beta, save_invstd, bshape) -> None:
    scale = save_invstd if gamma is None else save_invstd * gamma
    y *= scale.reshape(bshape)
    if beta is not None:
        y += beta.reshape(bshape)


def _xhat(x, save_mean, save_invstd):
    _, bshape = _axes(x)
    xhat = x - save_mean.reshape(bshape)
    xhat *= save_invstd.reshape(bshape)
    return xhat


def backward_sums(x, dy, save_mean, save_invstd, dgamma, dbeta, first: bool) -> None:
    """dbeta (+)= sum(dy), dgamma (+)= sum(dy * xhat) per channel over this chunk."""
    axes, _ = _axes(x)
    x, dy = _f32(x), _f32(dy)
    xhat = _xhat(x, save_mean, save_invstd)
    xhat *= dy
    for acc, part in ((dgamma, xhat.sum(axis=axes)), (dbeta, dy.sum(axis=axes))):
        if acc is None:
            continue
        if first:
            acc[...] = part
        else:
            acc += part


def backward_grad(x, dy, gamma, save_mean, save_invstd, sum_dy_xhat, sum_dy, count: int, dx,
                  accumulate: bool) -> None:
    """dx (+)= gamma*invstd * (dy - sum_dy/count - xhat*sum_dy_xhat/count)."""
    _, bshape = _axes(x)
    x, dy = _f32(x), _f32(dy)
    xhat = _xhat(x, save_mean, save_invstd)
    xhat *= (-sum_dy_xhat / count).reshape(bshape)
    xhat += dy
    xhat -= (sum_dy / count).reshape(bshape)
    g = save_invstd if gamma is None else gamma * save_invstd
    xhat *= g.reshape(bshape)
    _store(dx, xhat, accumulate)
