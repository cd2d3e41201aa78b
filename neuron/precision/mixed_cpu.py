"""The CPU reference of mixed precision (bf16 through ml_dtypes, fp16 through NumPy's float16).

A layer's float32 NumPy kernels run on float32 copies of its low-precision views (exact: every
bf16/fp16 value is a float32), so every product is summed in float32, as cuDNN's compute type
does; what the layer writes into a low-precision tensor is rounded to that type once, where the
GPU would store it. Tensors already in the master dtype (BatchNorm parameters, statistics and
running estimates, the loss, parameter gradients) are handed over as they are. A layer that
reads low-precision copies of its parameters (precision.CASTS_PARAMS) has its parameter
gradients rounded to the low type too: they are the gradients of those copies, which the GPU
computes in the low type before the float32 master weights take them.

The convolution's workspace is not used: the float32 im2col buffer is a NumPy temporary (the
plan's workspace is the GPU's, in the low type).
"""
from __future__ import annotations

import contextlib

import numpy as np


def _is_low(a) -> bool:
    """A 2-byte floating array (bfloat16 or float16); labels, masks and float32 are not."""
    return a is not None and a.dtype.itemsize == 2 and a.dtype.kind in "fV"


def _up(a, master):
    """A master-dtype copy of a low-precision ``a`` (exact); anything else itself."""
    return a.astype(master) if _is_low(a) else a


def _fresh(a, master):
    """A buffer the kernel overwrites: an empty master-dtype one for a low-precision ``a``,
    laid out as ``a`` is (a channels-last map's reductions run in its memory order)."""
    return np.empty_like(a, dtype=master) if _is_low(a) else a


def _down(dst, src) -> None:
    """Round ``src`` into ``dst`` (nothing to do when the kernel wrote ``dst`` itself)."""
    if dst is not None and src is not dst:
        dst[...] = src.astype(dst.dtype)


def round_to(a: np.ndarray, low) -> None:
    """Round a float32 array to ``low``'s precision, in place (kept in float32)."""
    a[...] = a.astype(low).astype(a.dtype)


def forward(layer, k, ins, outs, params, aux, ctx, master) -> None:
    f_ins = [_up(a, master) for a in ins]
    f_outs = [_fresh(a, master) for a in outs]
    f_params = {n: _up(v, master) for n, v in params.items()}
    # a recompute reads aux (dropout mask, statistics) that the first forward wrote
    f_aux = {n: _up(v, master) for n, v in aux.items()}
    layer.forward(k, f_ins, f_outs, f_params, f_aux, None, ctx)
    for dst, src in zip(outs, f_outs):
        _down(dst, src)
    for n, v in aux.items():
        _down(v, f_aux[n])


def backward(layer, k, ins, outs, douts, dins, params, dparams, aux, ctx, master, low,
             grad_scale: float = 1.0) -> None:
    """``low``: the low type, to round parameter gradients of cast layers to (None: do not);
    ``grad_scale``: the loss layer multiplies its input gradient by it (fp16 loss scaling,
    where an overflow to inf is expected now and then: the loss scaler catches it, NumPy's
    warnings are silenced)."""
    with np.errstate(over="ignore", invalid="ignore") if grad_scale != 1.0 else \
            contextlib.nullcontext():
        _backward(layer, k, ins, outs, douts, dins, params, dparams, aux, ctx, master, low,
                  grad_scale)


def _backward(layer, k, ins, outs, douts, dins, params, dparams, aux, ctx, master, low,
              grad_scale):
    f_dins = [None if d is None else (_up(d, master) if ctx.acc(i) else _fresh(d, master))
              for i, d in enumerate(dins)]
    f_douts = [_up(a, master) for a in douts]
    layer.backward(k, [_up(a, master) for a in ins], [_up(a, master) for a in outs],
                   f_douts, f_dins,
                   {n: _up(v, master) for n, v in params.items()}, dparams,
                   {n: _up(v, master) for n, v in aux.items()}, None, ctx)
    if layer.rewrites_gradient:     # AddReLU's masked gradient: the inputs it aliases read it
        for dst, src in zip(douts, f_douts):
            _down(dst, src)
    if grad_scale != 1.0 and layer.kind == "loss":
        for d in f_dins:
            if d is not None:
                d *= grad_scale
    for dst, src in zip(dins, f_dins):
        _down(dst, src)
    if low is not None:
        for g in dparams.values():
            if g is not None:
                round_to(g, low)
