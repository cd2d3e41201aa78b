"""NumPy reference kernels (the CPU device).

Conventions
-----------
* Arrays are NCHW; float32 by default, float64 works everywhere (gradient
  checks).  Kernels WRITE INTO caller-provided output arrays (views into the
  runtime's arena) and never return large new arrays.  Outputs may be
  non-contiguous views.
* Backward kernels OVERWRITE their outputs (dx, dw, db, ...), except that
  ``accumulate=True`` ADDS the input gradient into dx (cuDNN's beta = 1): a
  tensor that feeds several layers gets its gradient summed in place, with
  no gradient-sized temporary in the arena.  Any output given as ``None``
  is simply not computed.
* Small temporaries (per-channel vectors, at most a few activation-sized
  buffers) are allocated internally; convolution keeps its im2col columns in
  the caller-provided ``workspace`` (a 1-D uint8 array).
* Semantics follow PyTorch (cross-correlation convolution, BatchNorm with
  biased batch variance / unbiased running variance, LocalResponseNorm,
  first-maximum max-pool gradient, count_include_pad=True average pooling,
  torch.optim.SGD).

The same signatures are to be implemented by the cuDNN/CuPy device module.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "conv2d_out_hw", "conv2d_workspace_bytes", "conv2d_forward", "conv2d_backward",
    "batchnorm_forward_train", "batchnorm_forward_infer", "batchnorm_backward",
    "bnrelu_forward_train", "bnrelu_forward_infer", "bnrelu_backward", "bnrelu_relu_grad",
    "relu_forward", "relu_backward", "leaky_relu_forward", "leaky_relu_backward",
    "sigmoid_forward", "sigmoid_backward", "tanh_forward", "tanh_backward",
    "pool_out_hw", "maxpool_forward", "maxpool_backward",
    "avgpool_forward", "avgpool_backward",
    "global_avgpool_forward", "global_avgpool_backward",
    "linear_forward", "linear_backward",
    "dropout_forward", "dropout_apply", "dropout_backward",
    "lrn_forward", "lrn_backward",
    "add_forward", "add_relu_forward", "add_relu_backward", "concat_forward", "concat_backward",
    "softmax_xent_forward", "softmax_xent_backward", "mse_forward", "mse_backward",
    "nonfinite_flag_new", "nonfinite_flag_clear", "nonfinite_flag_update",
    "nonfinite_flag_update_many", "nonfinite_flag_read",
    "sgd_update", "sgd_update_many", "fill", "copy", "add_inplace",
]

# The convolution and pooling kernels live in their own files; this module is the CPU
# device's kernel namespace, so it re-exports them.
from .numpy_conv import (CONV_CHUNK_BYTES, conv2d_backward, conv2d_chunk,  # noqa: E402,F401
                         conv2d_forward, conv2d_out_hw, conv2d_workspace_bytes)
from .numpy_helpers import _grad_finish, _grad_target, _pair  # noqa: E402,F401
from .numpy_pool import (avgpool_backward, avgpool_forward,  # noqa: E402,F401
                         global_avgpool_backward, global_avgpool_forward, maxpool_backward,
                         maxpool_forward, pool_out_hw)


# --------------------------------------------------------------------------
# batch normalization
# --------------------------------------------------------------------------

def _bn_axes(x):
    if x.ndim == 4:
        return (0, 2, 3), (1, -1, 1, 1)
    if x.ndim == 2:
        return (0,), (1, -1)
    raise ValueError("batchnorm expects a 2-D or 4-D input")


def _rows(a):
    """a (N, C, ...) as (N, C*...): a view when a is C-contiguous, else None."""
    return a.reshape(a.shape[0], -1) if a.flags.c_contiguous else None


def _channel_op(op, a, v, out):
    """out = op(a, v[channel]) for per-channel values v (C,). On contiguous arrays v is laid
    out once per sample (C*H*W values), so the ufunc's inner loop runs over a whole sample
    instead of one row of W values."""
    n, c = a.shape[0], a.shape[1]
    rest = a.size // max(n * c, 1)
    a2, o2 = _rows(a), _rows(out)
    if a2 is not None and o2 is not None:
        op(a2, np.repeat(v, rest) if rest > 1 else v, out=o2)
    else:
        op(a, v.reshape((1, c) + (1,) * (a.ndim - 2)), out=out)


def _channel_sum(a):
    """Per-channel sum over every axis but 1 (in a's dtype)."""
    return np.einsum("nci->c", a.reshape(a.shape[0], a.shape[1], -1))


def _channel_dot(a, b):
    """Per-channel sum of a*b over every axis but 1, without an a*b temporary."""
    n, c = a.shape[0], a.shape[1]
    return np.einsum("nci,nci->c", a.reshape(n, c, -1), b.reshape(n, c, -1))


def batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var,
                            save_mean, save_invstd, momentum, eps, update_running):
    """Training-mode BN.  Normalizes with the biased batch variance; if
    ``update_running`` the running stats become
    (1-momentum)*running + momentum*batch (unbiased variance for running_var).
    save_mean / save_invstd (C,) receive the batch mean and 1/sqrt(var+eps).
    gamma/beta may be None (affine=False)."""
    _bn_axes(x)
    m = x.size // x.shape[1]
    mean = _channel_sum(x) / m
    _channel_op(np.subtract, x, mean, y)                    # y = x - mean
    var = _channel_dot(y, y) / m                            # biased variance
    bn_scale_and_update(y, mean, var, m, gamma, beta, eps, save_mean, save_invstd,
                        running_mean, running_var, momentum, update_running)


def bn_scale_and_update(y, mean, var, m, gamma, beta, eps, save_mean, save_invstd,
                        running_mean, running_var, momentum, update_running):
    """The rest of training-mode BN once y = x - mean and the biased variance over m values
    are known (one batch here; the global batch in distributed/sync_bn.py). Works on NumPy
    and CuPy arrays alike (np.sqrt dispatches to CuPy through __array_ufunc__)."""
    invstd = 1.0 / np.sqrt(var + eps)
    if save_mean is not None:
        save_mean[...] = mean
    if save_invstd is not None:
        save_invstd[...] = invstd
    scale = invstd if gamma is None else invstd * gamma
    if isinstance(y, np.ndarray):       # a sample-long inner loop (_channel_op)
        _channel_op(np.multiply, y, scale, y)
        if beta is not None:
            _channel_op(np.add, y, beta, y)
    else:                               # CuPy: in-place operators
        bshape = (1, -1, 1, 1) if y.ndim == 4 else (1, -1)
        y *= scale.reshape(bshape)
        if beta is not None:
            y += beta.reshape(bshape)
    if update_running:
        update_running_stats(running_mean, running_var, mean, var, m, momentum)


def update_running_stats(running_mean, running_var, mean, var, m, momentum) -> None:
    """Running statistics as torch updates them: the variance unbiased over m values. In-place
    array operators only, so CuPy arrays work too (the chunked BN of bn_chunks.py uses it)."""
    if running_mean is not None:
        running_mean *= (1.0 - momentum)
        running_mean += momentum * mean
    if running_var is not None:
        unbiased = var * (m / max(m - 1, 1))
        running_var *= (1.0 - momentum)
        running_var += momentum * unbiased


def batchnorm_forward_infer(x, gamma, beta, y, running_mean, running_var, eps):
    """Inference BN using running statistics."""
    _, bshape = _bn_axes(x)
    invstd = 1.0 / np.sqrt(running_var + eps)
    scale = invstd if gamma is None else invstd * gamma
    shift = -running_mean * scale
    if beta is not None:
        shift = shift + beta
    np.multiply(x, scale.reshape(bshape).astype(y.dtype, copy=False), out=y)
    y += shift.reshape(bshape).astype(y.dtype, copy=False)


def batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, eps=1e-5,
                       accumulate=False):
    """Training-mode BN backward (batch statistics depend on x). ``eps`` is the layer's: the
    saved inverse std already contains it here, but cuDNN's backward takes it again. With
    ``accumulate`` dx is added to.

    With d = x - mean and A = gamma*invstd:  dx = A*dy + B*d + C per channel, where
    B = -A*invstd*sum(dy*xhat)/m and C = -A*sum(dy)/m (the usual
    gamma*invstd*(dy - mean(dy) - xhat*mean(dy*xhat)), in three passes over the data)."""
    _bn_axes(x)
    # d = x - mean lives in dx unless dx aliases dy (in-place backward) or is added to
    inplace = dx is not None and (accumulate or np.may_share_memory(dx, dy))
    d = dx if (dx is not None and not inplace) else np.empty_like(x)
    _channel_op(np.subtract, x, save_mean, d)
    _bn_backward_from_d(d, dy, gamma, save_invstd, dx, dgamma, dbeta, accumulate, inplace)


def _bn_backward_from_d(d, dy, gamma, save_invstd, dx, dgamma, dbeta, accumulate, inplace):
    """batchnorm_backward once d = x - mean is known (in dx itself unless ``inplace``)."""
    m = d.size // d.shape[1]
    sum_dy = _channel_sum(dy)
    sum_dy_xhat = _channel_dot(dy, d) * save_invstd
    if dgamma is not None:
        dgamma[...] = sum_dy_xhat
    if dbeta is not None:
        dbeta[...] = sum_dy
    if dx is None:
        return
    a = save_invstd if gamma is None else gamma * save_invstd
    _channel_op(np.multiply, d, (-a * save_invstd) * (sum_dy_xhat / m), d)    # B*d
    _channel_op(np.add, d, -a * (sum_dy / m), d)                              # + C
    if inplace and not accumulate:          # dx is dy: dy is read once more, elementwise
        _channel_op(np.multiply, dy, a, dx)
        np.add(dx, d, out=dx)
        return
    ady = np.empty_like(d)
    _channel_op(np.multiply, dy, a, ady)
    np.add(d, ady, out=d)
    if accumulate:
        np.add(dx, d, out=dx)


# --------------------------------------------------------------------------
# BatchNorm + ReLU as one layer (layers/norm.py BNReLU): the unfused pair's arithmetic
# --------------------------------------------------------------------------

def bnrelu_forward_train(x, gamma, beta, y, running_mean, running_var,
                         save_mean, save_invstd, momentum, eps, update_running, workspace=None):
    """y = max(BN(x), 0): the BatchNorm kernel's own arithmetic, then the ReLU in place, so y
    has the unfused pair's bits and the BN output never exists apart from y. ``workspace``
    (the GPU kernels' partial sums) is not used here."""
    batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean,
                            save_invstd, momentum, eps, update_running)
    np.maximum(y, 0, out=y)


def bnrelu_forward_infer(x, gamma, beta, y, running_mean, running_var, eps):
    batchnorm_forward_infer(x, gamma, beta, y, running_mean, running_var, eps)
    np.maximum(y, 0, out=y)


def bnrelu_relu_grad(x, dy, gamma, beta, save_mean, save_invstd, dz):
    """dz = dy * (z > 0) with z = BN(x) recomputed from x and the saved statistics by the very
    operations of batchnorm_forward_train (x - mean, times invstd*gamma, plus beta), so the
    mask is the one the forward's ReLU saw; the mask times dy as relu_backward multiplies it."""
    _channel_op(np.subtract, x, save_mean, dz)
    scale = save_invstd if gamma is None else save_invstd * gamma
    _channel_op(np.multiply, dz, scale, dz)
    if beta is not None:
        _channel_op(np.add, dz, beta, dz)
    np.greater(dz, 0, out=dz)
    np.multiply(dz, dy, out=dz)


def bnrelu_backward(x, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta, eps=1e-5,
                    accumulate=False, workspace=None):
    """Backward of max(BN(x), 0) from x and dy (the output is not read): batchnorm_backward
    of dz = dy * (z > 0), z recomputed from x, with d = x - mean computed once for both.

    z = fl(fl(d * scale) + beta) > 0 is tested as fl(d * scale) > -beta: a sum of two floats
    rounds to zero only when it is exactly zero (gradual underflow), so the two tests agree
    and the add pass is saved (with flush-to-zero arithmetic, which NumPy does not enable, a
    subnormal z could tell them apart). The other operations are the unfused pair's."""
    inplace = dx is None or accumulate or np.may_share_memory(dx, dy)
    d = np.empty_like(x) if inplace else dx
    _channel_op(np.subtract, x, save_mean, d)
    dz = np.empty_like(dy)
    scale = save_invstd if gamma is None else save_invstd * gamma
    _channel_op(np.multiply, d, scale, dz)
    _channel_op(np.greater, dz, -beta if beta is not None else np.zeros_like(scale), dz)
    np.multiply(dz, dy, out=dz)
    _bn_backward_from_d(d, dz, gamma, save_invstd, dx, dgamma, dbeta, accumulate,
                        inplace and dx is not None)


# --------------------------------------------------------------------------
# activations (backward uses the OUTPUT so they can run in place)
# --------------------------------------------------------------------------

def relu_forward(x, y):
    np.maximum(x, 0, out=y)


def relu_backward(y, dy, dx, accumulate=False):
    t = _grad_target(dx, accumulate)
    if t is dx and np.may_share_memory(dx, dy):
        np.multiply(dy, y > 0, out=t)
    else:                       # the mask as 1.0/0.0 in t: a float*float multiply, same bits
        np.greater(y, 0, out=t)
        np.multiply(t, dy, out=t)
    _grad_finish(dx, t, accumulate)


def leaky_relu_forward(x, y, slope):
    np.copyto(y, np.where(x > 0, x, x * slope))


def leaky_relu_backward(y, dy, dx, slope, accumulate=False):
    g = np.where(y > 0, dy, dy * slope)
    if accumulate:
        np.add(dx, g, out=dx)
    else:
        np.copyto(dx, g)


def sigmoid_forward(x, y):
    np.negative(x, out=y)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += 1
    np.reciprocal(y, out=y)


def sigmoid_backward(y, dy, dx, accumulate=False):
    t = 1 - y
    t *= y
    o = _grad_target(dx, accumulate)
    np.multiply(dy, t, out=o)
    _grad_finish(dx, o, accumulate)


def tanh_forward(x, y):
    np.tanh(x, out=y)


def tanh_backward(y, dy, dx, accumulate=False):
    t = np.square(y)
    np.subtract(1, t, out=t)
    o = _grad_target(dx, accumulate)
    np.multiply(dy, t, out=o)
    _grad_finish(dx, o, accumulate)




# --------------------------------------------------------------------------
# linear
# --------------------------------------------------------------------------

def linear_forward(x, w, b, y):
    """y = x @ w.T + b  (w is (Out, In) like torch)."""
    np.matmul(x, w.T, out=y)
    if b is not None:
        y += b


def linear_backward(x, w, dy, dx, dw, db, accumulate=False, accumulate_params=False):
    if dx is not None:
        t = _grad_target(dx, accumulate)
        np.matmul(dy, w, out=t)
        _grad_finish(dx, t, accumulate)
    if dw is not None:
        t = _grad_target(dw, accumulate_params)
        np.matmul(dy.T, x, out=t)
        _grad_finish(dw, t, accumulate_params)
    if db is not None:
        t = _grad_target(db, accumulate_params)
        np.sum(dy, axis=0, out=t)
        _grad_finish(db, t, accumulate_params)


# --------------------------------------------------------------------------
# dropout
# --------------------------------------------------------------------------

def dropout_forward(x, y, mask, p, seed, batch_offset=0, batch_total=None, key_buffer=None):
    """mask[i] ~ Bernoulli(1-p) from np.random.default_rng(seed) (keep iff
    u < 1-p with u uniform float32 in [0, 1)); y = x*mask/(1-p).
    p >= 1 drops everything (y = 0) like torch. A chunk of a batch of ``batch_total``
    samples starting at ``batch_offset`` gets its part of the whole batch's mask.
    ``key_buffer``: the GPU's (a CUDA graph's seed on the device); None here."""
    if key_buffer is not None:
        raise ValueError("dropout_forward: key_buffer is a CUDA graph's; the CPU takes seed")
    if p >= 1.0:
        mask[...] = 0
    elif p <= 0.0:
        mask[...] = 1
    else:
        if batch_total is None:
            u = np.random.default_rng(seed).random(x.shape, dtype=np.float32)
        else:
            u = np.random.default_rng(seed).random((batch_total, *x.shape[1:]),
                                                   dtype=np.float32)
            u = u[batch_offset:batch_offset + x.shape[0]]
        np.less(u, np.float32(1.0 - p), out=mask, casting="unsafe")
    dropout_apply(x, y, mask, p)


def dropout_apply(x, y, mask, p):
    """Forward with an existing mask (recomputation)."""
    if p >= 1.0:
        y[...] = 0
        return
    np.multiply(x, mask, out=y)
    if p > 0.0:
        y *= 1.0 / (1.0 - p)


def dropout_backward(dy, mask, dx, p, accumulate=False):
    t = _grad_target(dx, accumulate)
    dropout_apply(dy, t, mask, p)
    _grad_finish(dx, t, accumulate)


# --------------------------------------------------------------------------
# local response normalization (torch.nn.LocalResponseNorm)
# --------------------------------------------------------------------------

def _channel_window_sum(a, lo_off, hi_off, out):
    """out[:, c] = sum_{c' = c-lo_off .. c+hi_off, 0 <= c' < C} a[:, c']."""
    c = a.shape[1]
    np.copyto(out, a)
    for d in range(-lo_off, hi_off + 1):
        if d == 0 or abs(d) >= c:
            continue
        if d > 0:
            out[:, :c - d] += a[:, d:]
        else:
            out[:, -d:] += a[:, :c + d]


def _lrn_scale(x, size, alpha, k):
    sq = np.square(x)
    scale = np.empty_like(x)
    # window of channel c: c - size//2 .. c + (size-1)//2 (torch's zero padding)
    _channel_window_sum(sq, size // 2, (size - 1) // 2, scale)
    scale *= alpha / size
    scale += k
    return scale


def lrn_forward(x, y, size, alpha, beta, k):
    """y = x / (k + alpha/size * sum_window x^2) ** beta."""
    scale = _lrn_scale(x, size, alpha, k)
    np.power(scale, -beta, out=scale)
    np.multiply(x, scale, out=y)


def lrn_backward(x, y, dy, dx, size, alpha, beta, k, accumulate=False):
    scale = _lrn_scale(x, size, alpha, k)
    # t = dy * y / scale, summed over the channels whose window contains c
    t = dy * y
    t /= scale
    acc = np.empty_like(t)
    _channel_window_sum(t, (size - 1) // 2, size // 2, acc)
    acc *= x
    acc *= -2.0 * alpha * beta / size
    np.power(scale, -beta, out=scale)
    if accumulate:
        scale *= dy
        acc += scale
        np.add(dx, acc, out=dx)
    else:
        np.multiply(dy, scale, out=dx)
        dx += acc


# --------------------------------------------------------------------------
# structural
# --------------------------------------------------------------------------

def add_forward(xs, y):
    if len(xs) == 1:
        np.copyto(y, xs[0])
        return
    np.add(xs[0], xs[1], out=y)
    for a in xs[2:]:
        y += a


def add_relu_forward(xs, y):
    """y = max(sum of xs, 0) (layers/join.py AddReLU): add_forward's sums, then the ReLU in
    place, so y has the bits of Add then ReLU and the sum never exists apart from y."""
    add_forward(xs, y)
    np.maximum(y, 0, out=y)


def add_relu_backward(y, dy):
    """dy *= (y > 0), in place: the gradient AddReLU hands every input, with relu_backward's
    bits (the mask times dy, a float multiply, so a masked NaN stays NaN and -dy gives -0)."""
    np.multiply(dy, y > 0, out=dy)


def concat_forward(xs, y):
    o = 0
    for a in xs:
        c = a.shape[1]
        y[:, o:o + c] = a
        o += c
    assert o == y.shape[1]


def concat_widths(dy, dxs, widths=None):
    """Channel count of each dxs entry (shared by every device's concat_backward). None
    entries take theirs from ``widths`` or, when exactly one is None, from what the others
    leave of dy.shape[1]. Returns None when there is nothing to write."""
    if widths is not None:
        return widths
    known = [d.shape[1] if d is not None else None for d in dxs]
    missing = known.count(None)
    if missing == 1:
        known[known.index(None)] = dy.shape[1] - sum(c for c in known if c is not None)
    elif missing > 1:
        if all(d is None for d in dxs):
            return None
        raise ValueError("concat_backward: pass widths= when several dxs are None")
    return known


def concat_parts(dy, dxs, widths=None):
    """(i, dxs[i], its channel slice of dy's axis 1) for every dxs[i] that is not None (see
    concat_widths): what each device's concat_backward writes where."""
    widths = concat_widths(dy, dxs, widths)
    if widths is None:
        return
    o = 0
    for i, (d, c) in enumerate(zip(dxs, widths)):
        if d is not None:
            yield i, d, slice(o, o + c)
        o += c
    assert o == dy.shape[1]


def concat_backward(dy, dxs, widths=None, accumulate=()):
    """dxs[i] <- (or += for i in ``accumulate``) its channel slice of dy.  None entries are
    skipped (see concat_widths). In-place operators only, so CuPy arrays take the same code
    (kernels/cuda.py) with no temporary."""
    for i, d, part in concat_parts(dy, dxs, widths):
        if i in accumulate:
            d += dy[:, part]
        else:
            d[...] = dy[:, part]


# --------------------------------------------------------------------------
# loss
# --------------------------------------------------------------------------

def softmax_xent_forward(logits, labels, probs, rows=None, sink=None):
    """Writes softmax(logits) into probs; returns the mean cross entropy
    (log-sum-exp, stable) as a Python float. ``rows`` (the per-row losses' home on devices
    that need one) and ``sink`` (where a GPU leaves them until the step ends) are not used
    here: the host reads nothing back."""
    n = logits.shape[0]
    mx = np.max(logits, axis=1, keepdims=True)
    np.subtract(logits, mx, out=probs)
    picked = probs[np.arange(n), labels].copy()        # logit[label] - max
    np.exp(probs, out=probs)
    s = np.sum(probs, axis=1, keepdims=True)
    probs /= s
    loss = np.log(s[:, 0].astype(np.float64)) - picked.astype(np.float64)
    return float(np.mean(loss))


def softmax_xent_backward(probs, labels, dlogits, accumulate=False, total=None, scale=1.0):
    """The gradient of the mean loss over ``total`` samples (default: these), times ``scale``
    (fp16's loss scale)."""
    n = probs.shape[0]
    t = _grad_target(dlogits, accumulate)
    np.copyto(t, probs)
    t[np.arange(n), labels] -= 1
    t *= scale / (total or n)
    _grad_finish(dlogits, t, accumulate)


def mse_forward(pred, target):
    """Mean over the batch of 0.5 * sum((pred - target)^2), in float64, as a Python float."""
    d = pred.astype(np.float64) - target.astype(np.float64)
    return float(0.5 * np.sum(d * d) / pred.shape[0])


def mse_backward(pred, target, dpred, accumulate=False, total=None):
    """(pred - target) / ``total`` samples (default: these)."""
    t = _grad_target(dpred, accumulate)
    np.subtract(pred, target, out=t)
    t *= 1.0 / (total or pred.shape[0])
    _grad_finish(dpred, t, accumulate)


# --------------------------------------------------------------------------
# optimizer
# --------------------------------------------------------------------------

def _axpy(a, alpha, b, out):
    """out = a + alpha*b with a single rounding (torch's CPU add(alpha=...)
    is a fused multiply-add in its vectorized path).  float32 is emulated in
    float64 (exact product, then one rounding to float64 and one to float32:
    identical to an FMA except for astronomically rare double-rounding
    ties); other dtypes use plain arithmetic."""
    if out.dtype == np.float32:
        r = b.astype(np.float64)
        r *= np.float64(np.float32(alpha))
        r += a
        np.copyto(out, r, casting="same_kind")
    else:
        np.add(a, alpha * b, out=out)


def sgd_update(param, grad, velocity, lr, momentum, weight_decay, nesterov, first_step=False,
               flag=None, neg_lr_buffer=None):
    """In-place torch.optim.SGD step (dampening=0, maximize=False).

        d = grad + weight_decay*param
        v = d                 (first step: torch clones d into the buffer)
        v = momentum*v + d    (later steps)
        d = d + momentum*v if nesterov else v
        param -= lr*d

    First-step convention: torch's clone is reproduced EXACTLY by the
    ordinary rule when velocity holds zeros (momentum*0 + d == d bitwise), so
    a zero-initialized velocity needs nothing else.  ``first_step=True``
    forces the clone and is only needed if the buffer is not zeroed.
    ``flag`` (the step guard's): set when the new parameter or velocity is not finite.
    ``grad`` is not modified.  In float32 the result is bit-identical to torch
    (CPU), whose add(alpha=...) uses fused multiply-add.  ``neg_lr_buffer``: the GPU module's
    device-resident learning rate (a one-element array holding -lr, used instead of ``lr``);
    taken here for the same signature (the CPU replays no CUDA graph).
    """
    if neg_lr_buffer is not None:
        lr = -float(neg_lr_buffer[0])
    if weight_decay != 0:
        d = np.empty_like(param)
        _axpy(grad, weight_decay, param, d)
    else:
        d = grad
    if momentum != 0:
        if velocity is None:
            raise ValueError("sgd_update: momentum != 0 needs a velocity buffer")
        if first_step:
            np.copyto(velocity, d)
        else:
            velocity *= param.dtype.type(momentum) if param.dtype.kind == "f" else momentum
            velocity += d
        if nesterov:
            nd = np.empty_like(param)
            _axpy(d, momentum, velocity, nd)
            d = nd
        else:
            d = velocity
    _axpy(param, -lr, d, param)
    if flag is not None:
        nonfinite_flag_update(flag, param)
        if velocity is not None and momentum != 0:
            nonfinite_flag_update(flag, velocity)



def sgd_update_many(params, grads, velocities, lr, momentum, weight_decay, nesterov,
                    first_step=False, flag=None, neg_lr_buffer=None):
    """``sgd_update`` of each (param, grad, velocity) in turn: the bits of one call per tensor
    (the GPU module updates them all in one launch)."""
    if not len(params) == len(grads) == len(velocities):
        raise ValueError(f"sgd_update_many: {len(params)} parameters, {len(grads)} gradients "
                         f"and {len(velocities)} velocities")
    for p, g, v in zip(params, grads, velocities):
        sgd_update(p, g, v, lr, momentum, weight_decay, nesterov, first_step, flag=flag,
                   neg_lr_buffer=neg_lr_buffer)

# --------------------------------------------------------------------------
# memory primitives
# --------------------------------------------------------------------------

def fill(a, value):
    a.fill(value)


def copy(dst, src):
    np.copyto(dst, src)


def add_inplace(dst, src):
    np.add(dst, src, out=dst)


# --------------------------------------------------------------------------
# step guard: one "something was NaN or infinite" flag per training step
# --------------------------------------------------------------------------

def nonfinite_flag_new():
    """A one-element flag on the device (False: everything seen so far was finite)."""
    return np.zeros(1, dtype=np.bool_)


def nonfinite_flag_clear(flag):
    flag[0] = False


def nonfinite_flag_update(flag, a):
    """flag |= any(a is NaN or infinite). Once set, later arrays are not scanned."""
    if not flag[0] and not np.isfinite(a).all():
        flag[0] = True


def nonfinite_flag_update_many(flag, arrays):
    """nonfinite_flag_update of each array (the GPU's is one launch)."""
    for a in arrays:
        nonfinite_flag_update(flag, a)


def nonfinite_flag_read(flag) -> bool:
    return bool(flag[0])
