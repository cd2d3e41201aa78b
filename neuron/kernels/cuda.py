"""GPU kernels: the numpy_ref signatures on CuPy arrays (views into the CUDA arena).

Every function here has exactly the name, arguments and semantics of its twin in
:mod:`neuron.kernels.numpy_ref` (read that module's docstring for the conventions: outputs are
caller-provided views and are overwritten, ``None`` outputs are skipped, PyTorch semantics).

Where cuDNN has the operation it does the work, through :mod:`neuron.kernels.cudnn`:
convolution (forward, backward data/filter/bias), batch normalization, max/average pooling,
ReLU/sigmoid/tanh forward, ReLU backward, cross-channel LRN and the softmax of the loss.
CuPy does the rest with fused elementwise kernels (dropout, leaky ReLU, the SGD step, the
cross-entropy reduction); cuBLAS the linear layers, on a handle of neuron's own
(:mod:`neuron.kernels.cublas`: CuPy's cannot be captured in a CUDA graph). A few cuDNN calls are
replaced by CuPy kernels on purpose, each for a reason given at the spot: sigmoid/tanh backward
(the layers keep only the output, cuDNN's backward wants the input too), average-pool backward
(same), LRN with an even window (cuDNN centres the window differently from torch) and pooling
with ceil-mode output shapes (cuDNN computes floor-mode shapes only).

Convolution algorithms are chosen per call under the bytes of the workspace the executor handed
in (:mod:`neuron.kernels.conv_algos`): every algorithm is timed once per layer geometry with
FindEx under the largest workspace that could be free, then each call takes the fastest whose
workspace fits; every choice is appended to :data:`conv_algo_trace` for the memory trace.
``deterministic = True`` restricts the choice to deterministic algorithms picked by cuDNN's
(reproducible) heuristic ranking under the planned workspace, so runs and policies produce the
same bits.

Pooling and LRN live in :mod:`neuron.kernels.cuda_pool` and the helpers the kernel modules
share in :mod:`neuron.kernels.cuda_helpers`; this module re-exports them, so it stays the one
namespace a CUDA device's layers call (as numpy_ref is for the CPU).

Mixed precision (bf16, fp16: neuron/precision). Feature maps, their gradients and the
low-precision copies of convolution and linear weights arrive in the 2-byte type; cuDNN takes
them with a float compute type and tensor-op math, cuBLAS through cublasGemmEx with float32
accumulation, BatchNorm with float32 scale, bias and statistics, and every elementwise kernel is
:mod:`neuron.kernels.cuda_low`'s (float32 arithmetic, rounded once where it stores). Where a
float32 master receives what a low-type kernel makes (a weight or bias gradient), the kernel
writes a low-type buffer (carved from the step's workspace) that is then copied into the
float32 gradient, as the CPU reference (neuron/precision/mixed_cpu.py) rounds those gradients to the low
type. Raw kernels written for float32 (LRN, sigmoid/tanh/leaky-ReLU backward, ceil-mode pools)
run on float32 temporaries, and so does any cuDNN operation a build refuses in the low type. The loss reads its logits as
float32 (a temporary) and rounds its logit gradient, times fp16's loss scale, once.

Importing this module needs neither CuPy nor cuDNN (the pure helpers are unit-tested on the CPU);
the first kernel call loads both.
"""
from __future__ import annotations

import functools
import math
import sys
import types

import numpy as np

from . import cublas, cuda_low, cuda_raw, cuda_switches, low_grad_buffers, pointer_tables
from . import cudnn as dnn
from . import numpy_ref
from .cuda_raw import (  # noqa: F401 (CuPy kernels, compiled on first use)
    _k_dropout, _k_leaky, _k_sgd, _k_sigmoid_bwd, _k_tanh_bwd, _k_xent)
from .numpy_ref import _pair, conv2d_out_hw, pool_out_hw  # noqa: F401 (mirrors numpy_ref)
from .cuda_helpers import (  # noqa: F401 (shared by the kernel modules)
    _ccontig, _contig, _cp, _grad_into, _h, _low_guarded, _ptr, _td, _via_f32, low_refused)
from .cuda_low import is_low
from .cuda_pool import (  # noqa: F401 (pooling and LRN: re-exported, the device's kernels)
    avgpool_backward, avgpool_forward, global_avgpool_backward, global_avgpool_forward,
    lrn_backward, lrn_forward, maxpool_backward, maxpool_forward)
from .channels_last import (TO_LOGICAL, TO_STORAGE, is_channels_last, nhwc_filter,
                            storage_permutation, storage_view)
from .input_staging import PinnedStager
from .pinned_host import pinned_empty

__all__ = list(numpy_ref.__all__) + [
    "choose_conv_algo", "pick_algo", "workspace_bucket", "conv_algo_trace",
    "clear_conv_algo_cache", "dropout_mask_reference", "ConvAlgoError", "bnrelu_partials",
]

# ------------------------------------------------------------------------------------------
# switches
# ------------------------------------------------------------------------------------------

# deterministic, allow_tf32, conv_algo_search, conv_engines, sgd_per_layer, trace_label: kept in
# cuda_switches.py (where conv_algos.py and cuda_pool.py read them) and set or read here, their public home, through
# the module class at the end of this file

# ------------------------------------------------------------------------------------------
# convolution algorithm choice: neuron.kernels.conv_algos (FindEx once per geometry, then the
# fastest that fits the free bytes of the moment); re-exported here, its public home
# ------------------------------------------------------------------------------------------

from .conv_algos import (  # noqa: E402,F401
    ConvAlgoError, ConvAlgoRecord, ConvChoice, align_region, aligned_workspace,
    choose_conv_algo, clear_conv_algo_cache, conv2d_workspace_request, conv_algo_trace,
    conv_geometry_key, pick_algo, workspace_bucket)
from .conv_algos import choose as _choose  # noqa: E402
from .conv_algos import choose_accumulating as _choose_accumulating  # noqa: E402
from .conv_algos import key_text as _key_text  # noqa: E402,F401
from .conv_algos import math_type as _math_type  # noqa: E402,F401
from .conv_algos import record as _record  # noqa: E402


# ------------------------------------------------------------------------------------------
# convolution
# ------------------------------------------------------------------------------------------

def conv2d_workspace_bytes(x_shape, w_shape, stride, padding, dilation, groups, itemsize):
    """Same number as the NumPy reference (the im2col buffer): it is what the planner budgets on
    every device, so virtual, CPU and GPU plans agree byte for byte. On the GPU it is a ceiling,
    not a need: the algorithm is chosen to fit whatever part of it is handed in."""
    return numpy_ref.conv2d_workspace_bytes(x_shape, w_shape, stride, padding, dilation, groups,
                                            itemsize)


def _run_conv(h, choice, cd, ptrs, ws_ptr, legacy) -> None:
    """The chosen engine plan on ``ptrs`` (x, w, y in forward naming), or ``legacy()`` under
    the choice's math type."""
    if choice.plan is not None:
        dnn.run_conv_plan(h, choice.plan, ptrs, ws_ptr)
    else:
        cd.set_math_type(choice.math_type)
        legacy()


def _plan_ready(layout, *arrays) -> bool:
    """Whether the operands fit an engine plan: packed in ``layout`` (C order, or stored N, H,
    W, C for "nhwc": a 1x1 filter's bytes are both) and aligned as its tensors declare
    (cudnn_engines.ALIGNMENT); otherwise the legacy algorithms run."""
    return all((a.flags.c_contiguous if layout == "nchw" else
                a.transpose(TO_STORAGE).flags.c_contiguous)
               and _ptr(a) % dnn.ALIGNMENT == 0 for a in arrays)


def _conv_setup(x, w, stride, padding, dilation, groups, dw=None):
    """Pairs, the filter descriptor, the convolution descriptor and the layout ("nchw" or
    "nhwc": the algorithm key's). Channels-last weights (--layout nhwc, stored K, R, S, C) take
    cuDNN's NHWC filter format, and so does a 1x1 filter (the same bytes in both) of a
    channels-last input; ``dw`` must be stored as ``w`` is (one descriptor for both)."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    nhwc = _channels_last_filter(w, x, "weight")
    if dw is not None and _channels_last_filter(dw, x, "weight gradient") != nhwc:
        raise ValueError(f"convolution: the weight {tuple(w.shape)} and its gradient are stored "
                         f"in different layouts (strides {tuple(w.strides)} and "
                         f"{tuple(dw.strides)}); --layout stores both alike")
    wd = dnn.filter_descriptor(w.shape, w.dtype,
                               dnn.CUDNN_TENSOR_NHWC if nhwc else dnn.CUDNN_TENSOR_NCHW)
    cd = dnn.convolution_descriptor(padding, stride, dilation, groups, x.dtype)
    return stride, padding, dilation, wd, cd, "nhwc" if nhwc else "nchw"


def _channels_last_filter(w, x, what) -> bool:
    """Whether filter ``w`` is described in cuDNN's NHWC format: a channels-last one, or one
    whose bytes are the same in both (1x1) for a channels-last input ``x``. Strides of neither
    layout are one error."""
    if not w.flags.c_contiguous and not is_channels_last(w):
        raise ValueError(f"convolution {what} of shape {tuple(w.shape)} has strides "
                         f"{tuple(w.strides)}: cuDNN takes K, C, R, S (--layout nchw) or K, R, "
                         "S, C (--layout nhwc) filters")
    return nhwc_filter(w, x)


def conv2d_forward(x, w, b, y, stride, padding, dilation, groups, workspace):
    stride, padding, dilation, wd, cd, layout = _conv_setup(x, w, stride, padding, dilation,
                                                            groups)
    xd, yd = _td(x), _td(y)
    ws_ptr, ws_bytes = aligned_workspace(workspace)
    key = conv_geometry_key("fwd", x.shape, w.shape, stride, padding, dilation, groups, x.dtype,
                            layout)
    ptrs = (_ptr(x), _ptr(w), _ptr(y))
    choice = _choose("fwd", key, xd, wd, cd, yd, ws_bytes, ptrs, (ws_ptr, ws_bytes),
                     plans=_plan_ready(layout, x, w, y))
    _record("fwd", key, choice, ws_bytes)
    h = _h()
    _run_conv(h, choice, cd, ptrs, ws_ptr, lambda: dnn.convolution_forward(
        h, xd, _ptr(x), wd, _ptr(w), cd, choice.algo, ws_ptr, ws_bytes, yd, _ptr(y)))
    if b is not None:
        dnn.add_tensor(h, dnn.bias_descriptor(w.shape[0], b.dtype), _ptr(_contig(b)), yd, _ptr(y),
                       1.0, 1.0)


def conv2d_backward(x, w, dy, dx, dw, db, stride, padding, dilation, groups, workspace,
                    accumulate=False, accumulate_params=False):
    stride, padding, dilation, wd, cd, layout = _conv_setup(
        x, w, stride, padding, dilation, groups,
        dw if dw is not None and dw.dtype == w.dtype else None)
    dyd = _td(dy)
    h = _h()
    ws_ptr, ws_bytes = aligned_workspace(workspace)
    if is_low(w) and ((dw is not None and dw.dtype != w.dtype) or
                      (db is not None and db.dtype != w.dtype)):
        # the float32 masters' gradients: computed in the low type, then added in
        _low_param_grads(lambda dw_, db_, ws_, acc: conv2d_backward(
            x, w, dy, None, dw_, db_, stride, padding, dilation, groups, ws_,
            accumulate_params=acc), dw, db, w.dtype, accumulate_params, workspace)
        dw = db = None
    if db is not None:
        dnn.convolution_backward_bias(h, dyd, _ptr(dy), dnn.bias_descriptor(db.shape[0], db.dtype),
                                      _ptr(_contig(db)), beta=1.0 if accumulate_params else 0.0)
    if dw is not None:
        xd = _td(x)
        key = conv_geometry_key("bwd_filter", x.shape, w.shape, stride, padding, dilation,
                                groups, x.dtype, layout)
        ptrs = (_ptr(x), _ptr(dw), _ptr(dy))
        if accumulate_params:
            choice = _choose_accumulating("bwd_filter", key, xd, wd, cd, dyd, ws_bytes, ptrs, 1,
                                          dw.nbytes, (ws_ptr, ws_bytes))
        else:
            choice = _choose("bwd_filter", key, xd, wd, cd, dyd, ws_bytes, ptrs,
                             (ws_ptr, ws_bytes), plans=_plan_ready(layout, x, dw, dy))
        _record("bwd_filter", key, choice, ws_bytes)
        _run_conv(h, choice, cd, ptrs, ws_ptr, lambda: dnn.convolution_backward_filter(
            h, xd, _ptr(x), dyd, _ptr(dy), cd, choice.algo, ws_ptr, ws_bytes, wd, _ptr(dw),
            beta=1.0 if accumulate_params else 0.0))
    if dx is not None:
        dxd = _td(dx)
        key = conv_geometry_key("bwd_data", x.shape, w.shape, stride, padding, dilation,
                                groups, x.dtype, layout)
        ptrs = (_ptr(dx), _ptr(w), _ptr(dy))
        if accumulate:      # FindEx must not overwrite the partial sum in dx
            choice = _choose_accumulating("bwd_data", key, dxd, wd, cd, dyd, ws_bytes, ptrs, 0,
                                          dx.nbytes, (ws_ptr, ws_bytes))
        else:
            choice = _choose("bwd_data", key, dxd, wd, cd, dyd, ws_bytes, ptrs,
                             (ws_ptr, ws_bytes), plans=_plan_ready(layout, dx, w, dy))
        _record("bwd_data", key, choice, ws_bytes)
        _run_conv(h, choice, cd, ptrs, ws_ptr, lambda: dnn.convolution_backward_data(
            h, wd, _ptr(w), dyd, _ptr(dy), cd, choice.algo, ws_ptr, ws_bytes, dxd, _ptr(dx),
            beta=1.0 if accumulate else 0.0))


def _low_param_grads(run, dw, db, low, accumulate, workspace=None):
    """The float32 masters' gradients of a low-type weight (and bias): ``run(dw_low, db_low,
    workspace_rest, accumulate)`` into low-type buffers, then each into its float32 master.
    ``accumulate`` (a later chunk of the batch): the buffers start as the masters' sums so far
    (low-type values already) and ``run`` adds into them (cuDNN's beta = 1: the sum rounded
    once, as the CPU reference rounds it). The buffers are carved from the front of the step's
    workspace when it holds them (kernels/low_grad_buffers.py: bytes the plan and the request
    count on top of the algorithm's; the rest stays the algorithm's), else CuPy temporaries
    from the arena."""
    cp = _cp()
    # each buffer stored as its master is (a channels-last weight: K, R, S, C), so that one
    # filter descriptor describes the weight and its gradient
    perms = [storage_permutation(g) if g is not None else None for g in (dw, db)]
    shapes = [(tuple(g.shape[i] for i in p) if p is not None else g.shape)
              if g is not None else None for g, p in zip((dw, db), perms)]
    need = [math.prod(sh) * np.dtype(low).itemsize if sh is not None else 0 for sh in shapes]
    spans = low_grad_buffers.spans(shapes, np.dtype(low).itemsize)
    bufs = []
    ptr, usable = aligned_workspace(workspace)
    # the request (conv_algos.conv2d_workspace_request) asked for these bytes on top of the
    # algorithm's, so the algorithm keeps what it was chosen for
    if sum(spans) and usable >= sum(spans):
        at = ptr - workspace.data.ptr
        for sh, n, span in zip(shapes, need, spans):
            bufs.append(workspace[at:at + n].view(low).reshape(sh) if sh is not None else None)
            at += span
        workspace = workspace[at:]
    else:
        bufs = [cp.empty(sh, low) if sh is not None else None for sh in shapes]
    bufs = [b.transpose(TO_LOGICAL) if b is not None and p is not None else b
            for b, p in zip(bufs, perms)]
    if accumulate:
        for g, t in zip((dw, db), bufs):
            if g is not None:
                cuda_low.cast(t, g)
    run(bufs[0], bufs[1], workspace, accumulate)
    for g, t in zip((dw, db), bufs):
        if g is not None:
            cuda_low.cast(g, t)


# low_refused, _low_guarded and _via_f32 live in cuda_helpers.py (cuda_pool.py uses them too)

# ------------------------------------------------------------------------------------------
# batch normalization (cuDNN SPATIAL; a 2-D (N, C) input is described as (N, C, 1, 1))
# ------------------------------------------------------------------------------------------

def bn_param_dtype(dtype):
    """The dtype of cuDNN's bnScaleBiasMeanVarDesc for data of ``dtype``: float for half (and
    bfloat16) data, the data's own type otherwise (cuDNN's documented rule)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _bn_params(x, **arrays):
    """Check that BN's per-channel arrays have cuDNN's parameter dtype; returns it."""
    want = bn_param_dtype(x.dtype)
    c = x.shape[1]
    for name, a in arrays.items():
        if a is None:
            continue
        if np.dtype(a.dtype) != want or a.size != c:
            raise ValueError(f"batchnorm on {np.dtype(x.dtype).name} input of shape "
                             f"{tuple(x.shape)}: {name} must be {want.name} with {c} elements "
                             f"(cuDNN's scale/bias/statistics descriptor), got "
                             f"{np.dtype(a.dtype).name} of shape {tuple(a.shape)}")
    return want


def _param_or(a, channels, dtype, value):
    if a is not None:
        return _contig(a)
    return _cp().full((channels,), value, dtype=dtype)


def batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var,
                            save_mean, save_invstd, momentum, eps, update_running):
    if is_low(x):
        def run(x_, y_):
            _bn_train(x_, gamma, beta, y_, running_mean, running_var, save_mean, save_invstd,
                      momentum, eps, update_running)
        return _low_guarded("batchnorm", lambda: run(x, y),
                            lambda: _via_f32(run, [x], [y]))
    _bn_train(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, momentum,
              eps, update_running)


def _bn_train(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, momentum,
              eps, update_running):
    cp = _cp()
    c = x.shape[1]
    pdt = _bn_params(x, weight=gamma, bias=beta, running_mean=running_mean,
                     running_var=running_var, save_mean=save_mean, save_invstd=save_invstd)
    bn = dnn.bias_descriptor(c, pdt)
    scale = _param_or(gamma, c, pdt, 1.0)
    bias = _param_or(beta, c, pdt, 0.0)
    rm = rv = None
    if update_running and (running_mean is not None or running_var is not None):
        # cuDNN updates both or neither: a missing one gets a throwaway buffer
        rm = running_mean if running_mean is not None else cp.zeros((c,), pdt)
        rv = running_var if running_var is not None else cp.ones((c,), pdt)
    sm, si = save_mean, save_invstd
    if (sm is None) != (si is None):        # likewise for the saved statistics
        sm = sm if sm is not None else cp.empty((c,), pdt)
        si = si if si is not None else cp.empty((c,), pdt)
    # ``factor`` multiplies the new batch statistic: torch's momentum. NULL running pointers
    # (a recompute) leave the running statistics untouched.
    dnn.batchnorm_forward_training(_h(), _td(x), _ptr(x), _td(y), _ptr(y), bn, _ptr(scale),
                                   _ptr(bias), float(momentum), _ptr(rm), _ptr(rv), float(eps),
                                   _ptr(sm), _ptr(si))


def batchnorm_forward_infer(x, gamma, beta, y, running_mean, running_var, eps):
    if is_low(x):
        def run(x_, y_):
            _bn_infer(x_, gamma, beta, y_, running_mean, running_var, eps)
        return _low_guarded("batchnorm", lambda: run(x, y),
                            lambda: _via_f32(run, [x], [y]))
    _bn_infer(x, gamma, beta, y, running_mean, running_var, eps)


def _bn_infer(x, gamma, beta, y, running_mean, running_var, eps):
    c = x.shape[1]
    pdt = _bn_params(x, weight=gamma, bias=beta, running_mean=running_mean,
                     running_var=running_var)
    scale = _param_or(gamma, c, pdt, 1.0)
    bias = _param_or(beta, c, pdt, 0.0)
    dnn.batchnorm_forward_inference(_h(), _td(x), _ptr(x), _td(y), _ptr(y),
                                    dnn.bias_descriptor(c, pdt), _ptr(scale), _ptr(bias),
                                    _ptr(_contig(running_mean)), _ptr(_contig(running_var)),
                                    float(eps))


def batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, eps=1e-5,
                       accumulate=False):
    if is_low(x):
        def run(x_, dy_, dx_):
            _bn_backward(x_, dy_, gamma, save_mean, save_invstd, dx_, dgamma, dbeta, eps,
                         accumulate)
        return _low_guarded("batchnorm", lambda: run(x, dy, dx),
                            lambda: _via_f32(run, [x, dy], [dx], accumulate))
    _bn_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, eps, accumulate)


def _bn_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, eps, accumulate):
    cp = _cp()
    c = x.shape[1]
    pdt = _bn_params(x, weight=gamma, save_mean=save_mean, save_invstd=save_invstd,
                     dweight=dgamma, dbias=dbeta)
    scale = _param_or(gamma, c, pdt, 1.0)
    # cuDNN always writes all three gradients: absent ones go to throwaway buffers
    dx_ = dx if dx is not None else cp.empty_like(x)
    dg = dgamma if dgamma is not None else cp.empty((c,), pdt)
    dbt = dbeta if dbeta is not None else cp.empty((c,), pdt)
    # cuDNN wants the epsilon the forward used (Inception-v4: 1e-3), also with saved statistics
    have_saved = save_mean is not None and save_invstd is not None
    dnn.batchnorm_backward(_h(), _td(x), _ptr(x), _td(dy), _ptr(dy), _td(dx_), _ptr(dx_),
                           dnn.bias_descriptor(c, pdt), _ptr(scale), _ptr(_contig(dg)),
                           _ptr(_contig(dbt)), float(eps),
                           _ptr(save_mean) if have_saved else 0,
                           _ptr(save_invstd) if have_saved else 0,
                           **({"beta_data": 1.0} if accumulate and dx is not None else {}))


# ------------------------------------------------------------------------------------------
# BatchNorm + ReLU fused (layers/norm.py BNReLU): cuda_raw._k_bnrelu's kernels. Forward reads x
# twice (statistics, then y = max(z, 0)) and writes y; backward reads x and dy twice (the sums,
# then dx) and writes dx; z and dz are never stored. 2-byte data is read and written as its
# bits by the low type's own kernels (float32 arithmetic, rounded once where stored).
# ------------------------------------------------------------------------------------------

bnrelu_partials = cuda_raw.bnrelu_partials


def _bnrelu_geometry(x):
    x = _bnrelu_rows(x)             # as the kernels see it
    n, c = x.shape[0], x.shape[1]
    hw = x.size // max(n * c, 1)
    return c, hw, n * hw, bnrelu_partials(n * hw, c)


def _bnrelu_sums(c, p, pdt, workspace):
    """(two C*P partial-sum arrays, two C*P/32 float64 fold arrays): carved from the step's
    workspace (the layer plans it: cuda_raw.bnrelu_workspace_bytes) when it is there and large
    enough, else new arrays."""
    n, q = c * p, c * (p // 32)
    need = 2 * n * pdt.itemsize + 2 * q * 8
    if workspace is not None and workspace.nbytes >= need:
        f = workspace[:2 * q * 8].view(np.float64)          # 8-byte aligned at the start
        s = workspace[2 * q * 8:need].view(pdt)
        return s[:n], s[n:], f[:q], f[q:]
    cp = _cp()
    return (cp.empty((n,), pdt), cp.empty((n,), pdt), cp.empty((q,), np.float64),
            cp.empty((q,), np.float64))


def _bnrelu_rows(a):
    """A channels-last map (--layout nhwc) as its storage, (N*H*W, C) rows: the kernels index
    a 2-d batch of C channels, and each channel's values are the same set; anything else as
    it is."""
    if a is None or a.ndim != 4 or not is_channels_last(a):
        return a
    return a.transpose(TO_STORAGE).reshape(-1, a.shape[1])


def _bnrelu_data(*arrays):
    """(the kernels for these data arrays, their kernel arguments): float32/float64 arrays as
    they are (channels-last ones as rows of channels), 2-byte ones (all of one type) as their
    bits; None when the types are mixed."""
    arrays = [_bnrelu_rows(a) for a in arrays]
    present = [a for a in arrays if a is not None]
    lows = {cuda_low.low_name(a.dtype) for a in present}
    if lows == {None}:
        return cuda_raw._k_bnrelu(), [_contig(a) if a is not None else None for a in arrays]
    if len(lows) != 1:
        return None, None
    return cuda_raw._k_bnrelu(lows.pop()), [
        cuda_low.bits(_contig(a)) if a is not None else None for a in arrays]


def bnrelu_forward_train(x, gamma, beta, y, running_mean, running_var,
                         save_mean, save_invstd, momentum, eps, update_running, workspace=None):
    k, (xd, yd) = _bnrelu_data(x, y)
    if k is None:                   # mixed data types: float32 temporaries
        return _via_f32(lambda x_, y_: bnrelu_forward_train(
            x_, gamma, beta, y_, running_mean, running_var, save_mean, save_invstd, momentum,
            eps, update_running, workspace), [x], [y])
    cp = _cp()
    pdt = _bn_params(x, weight=gamma, bias=beta, running_mean=running_mean,
                     running_var=running_var, save_mean=save_mean, save_invstd=save_invstd)
    c, hw, m, p = _bnrelu_geometry(x)
    s1, s2, f1, f2 = _bnrelu_sums(c, p, pdt, workspace)
    k.stats(xd, c, hw, m, p, s1, s2)
    k.fold(s1, s2, f1, f2)
    sm = _contig(save_mean) if save_mean is not None else cp.empty((c,), pdt)
    si = _contig(save_invstd) if save_invstd is not None else cp.empty((c,), pdt)
    rm = _contig(running_mean) if running_mean is not None else cp.zeros((c,), pdt)
    rv = _contig(running_var) if running_var is not None else cp.ones((c,), pdt)
    k.finish(f1, f2, xd, hw, m, p // 32, pdt.type(momentum), pdt.type(eps),
             int(update_running), sm, si, rm, rv)
    k.apply(xd, sm, si, _param_or(gamma, c, pdt, 1.0), _param_or(beta, c, pdt, 0.0), c, hw, yd)


def bnrelu_forward_infer(x, gamma, beta, y, running_mean, running_var, eps):
    k, (xd, yd) = _bnrelu_data(x, y)
    if k is None:
        return _via_f32(lambda x_, y_: bnrelu_forward_infer(
            x_, gamma, beta, y_, running_mean, running_var, eps), [x], [y])
    c, hw, _, _ = _bnrelu_geometry(x)
    pdt = _bn_params(x, weight=gamma, bias=beta, running_mean=running_mean,
                     running_var=running_var)
    invstd = (1.0 / _cp().sqrt(running_var + pdt.type(eps))).astype(pdt)
    k.apply(xd, _contig(running_mean), invstd, _param_or(gamma, c, pdt, 1.0),
            _param_or(beta, c, pdt, 0.0), c, hw, yd)


def bnrelu_backward(x, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta, eps=1e-5,
                    accumulate=False, workspace=None):
    """``eps`` is unused (the saved inverse std holds it); the signature is numpy_ref's."""
    k, (xd, dyd, dxd) = _bnrelu_data(x, dy, dx)
    if k is None:
        return _via_f32(lambda x_, dy_, dx_: bnrelu_backward(
            x_, dy_, gamma, beta, save_mean, save_invstd, dx_, dgamma, dbeta, eps, accumulate,
            workspace), [x, dy], [dx], accumulate)
    cp = _cp()
    pdt = _bn_params(x, weight=gamma, bias=beta, save_mean=save_mean, save_invstd=save_invstd,
                     dweight=dgamma, dbias=dbeta)
    c, hw, m, p = _bnrelu_geometry(x)
    g, b = _param_or(gamma, c, pdt, 1.0), _param_or(beta, c, pdt, 0.0)
    sm, si = _contig(save_mean), _contig(save_invstd)
    sdz, sdzx, f1, f2 = _bnrelu_sums(c, p, pdt, workspace)
    k.sums(xd, dyd, sm, si, g, b, c, hw, m, p, sdz, sdzx)
    k.fold(sdz, sdzx, f1, f2)
    dg = _contig(dgamma) if dgamma is not None else cp.empty((c,), pdt)
    dbt = _contig(dbeta) if dbeta is not None else cp.empty((c,), pdt)
    k.sums_finish(f1, f2, p // 32, dg, dbt)
    if dx is not None:
        (k.dx_acc if accumulate else k.dx)(xd, dyd, sm, si, g, b, dg, dbt, c, hw,
                                           pdt.type(1.0 / m), dxd)


def bnrelu_relu_grad(x, dy, gamma, beta, save_mean, save_invstd, dz):
    """dz = dy * (z > 0), z recomputed as the fused forward computes it (synchronized
    BatchNorm's BNReLU: its backward then runs on dz)."""
    k, (xd, dyd, dzd) = _bnrelu_data(x, dy, dz)
    if k is None:
        return _via_f32(lambda x_, dy_, dz_: bnrelu_relu_grad(
            x_, dy_, gamma, beta, save_mean, save_invstd, dz_), [x, dy], [dz])
    c, hw, _, _ = _bnrelu_geometry(x)
    pdt = _bn_params(x, weight=gamma, bias=beta)
    k.mask(xd, dyd, _contig(save_mean), _contig(save_invstd), _param_or(gamma, c, pdt, 1.0),
           _param_or(beta, c, pdt, 0.0), c, hw, dzd)


# ------------------------------------------------------------------------------------------
# activations (backward reads the OUTPUT only, as in numpy_ref)
# ------------------------------------------------------------------------------------------

def _act_forward(mode, x, y):
    def run(x_, y_):
        dnn.activation_forward(_h(), dnn.activation_descriptor(mode), _td(x_), _ptr(x_),
                               _td(y_), _ptr(y_))
    if is_low(y):
        return _low_guarded("activation", lambda: run(x, y), lambda: _via_f32(run, [x], [y]))
    run(x, y)


def relu_forward(x, y):
    _act_forward(dnn.CUDNN_ACTIVATION_RELU, x, y)


def relu_backward(y, dy, dx, accumulate=False):
    if is_low(dx):
        return _low_guarded("activation", lambda: _relu_backward(y, dy, dx, accumulate),
                            lambda: _via_f32(lambda y_, dy_, dx_: _relu_backward(
                                y_, dy_, dx_, accumulate), [y, dy], [dx], accumulate))
    _relu_backward(y, dy, dx, accumulate)


def _relu_backward(y, dy, dx, accumulate=False):
    # cuDNN's ReLU backward tests x > 0; y > 0 is the same predicate, so y stands in for the
    # input the layer did not keep
    yd = _td(y)
    dnn.activation_backward(_h(), dnn.activation_descriptor(dnn.CUDNN_ACTIVATION_RELU), yd,
                            _ptr(y), _td(dy), _ptr(dy), yd, _ptr(y), _td(dx), _ptr(dx),
                            beta=1.0 if accumulate else 0.0)


def sigmoid_forward(x, y):
    _act_forward(dnn.CUDNN_ACTIVATION_SIGMOID, x, y)


def tanh_forward(x, y):
    _act_forward(dnn.CUDNN_ACTIVATION_TANH, x, y)


def sigmoid_backward(y, dy, dx, accumulate=False):
    # CuPy, not cuDNN: cuDNN's activation backward takes x as well, which the layer dropped
    if is_low(dx):                  # mixed precision: in float32, rounded once
        return _via_f32(lambda y_, dy_, dx_: sigmoid_backward(y_, dy_, dx_, accumulate),
                        [y, dy], [dx], accumulate)
    _grad_into(dx, accumulate, lambda out: _k_sigmoid_bwd()(y, dy, out))


def tanh_backward(y, dy, dx, accumulate=False):
    if is_low(dx):
        return _via_f32(lambda y_, dy_, dx_: tanh_backward(y_, dy_, dx_, accumulate),
                        [y, dy], [dx], accumulate)
    _grad_into(dx, accumulate, lambda out: _k_tanh_bwd()(y, dy, out))


def leaky_relu_forward(x, y, slope):
    if is_low(y):
        return _via_f32(lambda x_, y_: leaky_relu_forward(x_, y_, slope), [x], [y])
    _k_leaky()[0](x, y.dtype.type(slope), y)


def leaky_relu_backward(y, dy, dx, slope, accumulate=False):
    if is_low(dx):
        return _via_f32(lambda y_, dy_, dx_: leaky_relu_backward(y_, dy_, dx_, slope,
                                                                 accumulate),
                        [y, dy], [dx], accumulate)
    _grad_into(dx, accumulate, lambda out: _k_leaky()[1](y, dy, dx.dtype.type(slope), out))


# ------------------------------------------------------------------------------------------
# linear (cuBLAS on neuron's own handle, which a CUDA graph can capture: kernels/cublas.py;
# cupy.matmul where it does not apply)
# ------------------------------------------------------------------------------------------

def _matmul(a, b, out):
    cp = _cp()
    if not cublas.gemm(cp, a, b, out):
        cp.matmul(a, b, out=out)


def _matmul_low(a, b, out):
    """out = a @ b with low-type operands and float32 accumulation: cublasGemmEx, or float32
    copies through cupy.matmul where neuron's cuBLAS handle does not apply; ``out`` low or
    float32, rounded once."""
    cp = _cp()
    if cublas.gemm(cp, a, b, out):
        return
    af = cuda_low.to_f32(a) if is_low(a) else a
    bf = cuda_low.to_f32(b) if is_low(b) else b
    if is_low(out):
        t = cp.empty(out.shape, np.float32)
        cp.matmul(af, bf, out=t)
        cuda_low.cast(out, t)
    else:
        cp.matmul(af, bf, out=out)


def linear_forward(x, w, b, y):
    if is_low(y):
        # the product in float32, the bias added to it, one rounding: as the CPU reference
        t = _cp().empty(y.shape, np.float32)
        _matmul_low(x, w.T, t)
        if b is None:
            cuda_low.cast(y, t)
        else:
            cuda_low.bias_rows(t, b, y)
        return
    _matmul(x, w.T, y)
    if b is not None:
        _cp().add(y, b, out=y)


def linear_backward(x, w, dy, dx, dw, db, accumulate=False, accumulate_params=False):
    if is_low(dy):
        if dx is not None:
            _grad_into(dx, accumulate, lambda out: _matmul_low(dy, w, out))
        if dw is not None:
            if dw.dtype == w.dtype:
                _grad_into(dw, accumulate_params, lambda out: _matmul_low(dy.T, x, out))
            elif not accumulate_params and dw.flags.c_contiguous:
                # the float32 product (cublasGemmEx) straight into the master gradient, then
                # rounded through the low type in place: no weight-sized temporary outside
                # the plan (VGG16's first classifier layer: 411 MB at float32)
                _matmul_low(dy.T, x, dw)
                cuda_low.round_into(dw, dw, w.dtype)
            else:       # the product in float32 (cublasGemmEx), rounded through the low type
                t = _cp().empty(dw.shape, np.float32)
                _matmul_low(dy.T, x, t)
                cuda_low.round_into(dw, t, w.dtype, accumulate_params)
        if db is not None:
            if db.dtype == np.float32:
                cuda_low.col_sums(_ccontig(dy), db, accumulate_params)
            else:
                raise TypeError(f"linear backward: a {db.dtype} bias gradient of low-type "
                                "outputs (float32 masters only)")
        return
    if dx is not None:
        _grad_into(dx, accumulate, lambda out: _matmul(dy, w, out))
    if dw is not None:
        _grad_into(dw, accumulate_params, lambda out: _matmul(dy.T, x, out))
    if db is not None:
        _grad_into(db, accumulate_params, lambda out: _cp().sum(dy, axis=0, out=out))


# ------------------------------------------------------------------------------------------
# dropout: a counter-based hash, so the mask depends only on (seed, element index)
# ------------------------------------------------------------------------------------------

from .dropout_mask import _GOLDEN, _M64, _seed_key, dropout_mask_reference  # noqa: E402,F401


def dropout_forward(x, y, mask, p, seed, batch_offset=0, batch_total=None, key_buffer=None):
    """``key_buffer``: a one-element uint64 device array holding ``dropout_key(seed)``, read
    in place of ``seed`` (a CUDA graph's per-iteration seed: devices/cuda_graph.py)."""
    if p >= 1.0:
        mask.fill(0)
    elif p <= 0.0:
        mask.fill(1)
    else:
        # a chunk of the batch: element i of the chunk is element base + i of the batch, and
        # the hash takes key + (index + 1) * golden, so the key moves by base * golden
        base = batch_offset * int(np.prod(x.shape[1:], dtype=np.int64))
        add = (base * _GOLDEN) & _M64
        if key_buffer is not None:
            _k_dropout(True)[0](key_buffer, np.uint64(add), np.float32(1.0 - p), mask)
        else:
            key = (dropout_key(seed) + add) & _M64
            _k_dropout()[0](np.uint64(key), np.float32(1.0 - p), mask)
    dropout_apply(x, y, mask, p)


def dropout_key(seed) -> int:
    """The mask's 64-bit key for ``seed`` (what a key buffer holds)."""
    return _seed_key(seed)


def dropout_apply(x, y, mask, p):
    if p >= 1.0:
        fill(y, 0)
        return
    scale = 1.0 / (1.0 - p) if p > 0.0 else 1.0
    if is_low(y):
        cuda_low.dropout_apply(x, mask, scale, y)
        return
    _k_dropout()[1](x, mask, y.dtype.type(scale), y)


def dropout_backward(dy, mask, dx, p, accumulate=False):
    _grad_into(dx, accumulate, lambda out: dropout_apply(dy, out, mask, p))


# ------------------------------------------------------------------------------------------
# structural
# ------------------------------------------------------------------------------------------

def add_forward(xs, y):
    cp = _cp()
    if len(xs) == 1:
        copy(y, xs[0])
        return
    if is_low(y):
        cuda_low.add(xs[0], xs[1], y)
        for a in xs[2:]:
            cuda_low.accumulate(y, a)
        return
    cp.add(xs[0], xs[1], out=y)
    for a in xs[2:]:
        cp.add(y, a, out=y)


# Add + ReLU fused (layers/join.py AddReLU): cuda_raw._k_add_relu's kernels. Forward reads the
# inputs and writes y (two inputs: one pass; more: add_forward's sums, the last add with the
# ReLU); backward masks dy in place in one pass (the inputs take it: memory/aliasing.py).
# Channels-last maps go as their storage, so every kernel is one flat pass; 2-byte data as its
# bits (float32 arithmetic, rounded once where stored).

def _elementwise(*arrays):
    """The arrays as one elementwise kernel takes them: their storage views (a channels-last
    map's C-contiguous (N, H, W, C)) when all are stored alike, else as they are (CuPy indexes
    any strides); 2-byte ones as their bits."""
    views = [storage_view(a) for a in arrays]
    if not (all(v.flags.c_contiguous for v in views) and len({v.shape for v in views}) == 1):
        views = list(arrays)
    return [cuda_low.bits(v) if is_low(v) else v for v in views]


def add_relu_forward(xs, y):
    low = cuda_low.low_name(y.dtype)
    if len(xs) < 2 or any(a.dtype != y.dtype for a in xs):     # mixed types: the pair itself
        add_forward(xs, y)
        return relu_forward(y, y)
    k = cuda_raw._k_add_relu(low)
    if len(xs) == 2:
        k.fwd(*_elementwise(xs[0], xs[1], y))
        return
    add_forward(xs[:-1], y)
    k.acc(*_elementwise(xs[-1], y))


def add_relu_backward(y, dy):
    if y.dtype != dy.dtype:
        raise TypeError(f"add_relu_backward: y is {y.dtype} and dy {dy.dtype}; an AddReLU's "
                        "output and its gradient have one type")
    cuda_raw._k_add_relu(cuda_low.low_name(y.dtype)).mask(*_elementwise(y, dy))


# slice assignment and in-place operators are the same on CuPy arrays: one definition of
# each serves both devices (low-precision arrays: their bits are sliced, their sums are
# cuda_low's)
def concat_forward(xs, y):
    if is_low(y):
        numpy_ref.concat_forward([cuda_low.bits(a) for a in xs], cuda_low.bits(y))
    else:
        numpy_ref.concat_forward(xs, y)


def concat_backward(dy, dxs, widths=None, accumulate=()):
    if not is_low(dy):
        return numpy_ref.concat_backward(dy, dxs, widths, accumulate)
    for i, d, part in numpy_ref.concat_parts(dy, dxs, widths):
        if i in accumulate:
            cuda_low.accumulate(d, dy[:, part])
        else:
            cuda_low.bits(d)[...] = cuda_low.bits(dy)[:, part]


# ------------------------------------------------------------------------------------------
# loss: cuDNN softmax for the probabilities, a float64 log-sum-exp per row for the loss
# ------------------------------------------------------------------------------------------

def softmax_xent_forward(logits, labels, probs, rows=None, sink=None):
    """Softmax into ``probs``; the mean cross entropy as a float. Per-row losses go into ``rows``
    (the loss layer's own output, in the arena) when given: no temporary; without it, a float64
    CuPy temporary. With ``sink`` (a fixed device buffer shaped like ``rows``, outside the
    arena) the rows are copied there and a DeviceLoss is returned: nothing is read back until
    the step ends and asks for the value."""
    if rows is None:
        rows = _cp().empty((logits.shape[0],), np.float64)
    softmax_xent_rows(logits, labels, probs, rows)
    if sink is not None:
        _cp().copyto(sink, rows)
        return DeviceLoss(sink)
    return DeviceLoss(rows).value()     # a read back now: a host sync mid-step


class DeviceLoss:
    """A batch's mean loss whose per-row values are still on the device (``rows``): read when
    the step ends (float()), in float64 on the host, as the eager kernel always averaged."""
    __slots__ = ("rows",)

    def __init__(self, rows):
        self.rows = rows

    def value(self) -> float:
        return float(np.mean(self.rows.get().astype(np.float64)))

    __float__ = value


def softmax_xent_rows(logits, labels, probs, rows):
    """The device part of softmax_xent_forward: softmax into ``probs``, per-row losses into
    ``rows``; nothing read back (a CUDA graph averages them after its launch)."""
    n, k = logits.shape
    if is_low(logits):              # the loss in float32: its logits read as float32
        logits = cuda_low.to_f32(_ccontig(logits))
    dnn.softmax_forward(_h(), _td(logits), _ptr(logits), _td(probs), _ptr(probs),
                        dnn.CUDNN_SOFTMAX_ACCURATE, dnn.CUDNN_SOFTMAX_MODE_INSTANCE)
    _k_xent()[0](_ccontig(logits), _ccontig(labels).astype(np.int64, copy=False), np.int64(k),
                 rows.reshape(n))


def softmax_xent_backward(probs, labels, dlogits, accumulate=False, total=None, scale=1.0):
    """``scale``: fp16's loss scale, applied in float32 before the gradient is rounded."""
    n, k = probs.shape
    labels = _ccontig(labels).astype(np.int64, copy=False)
    if is_low(dlogits):
        cuda_low.xent_grad(probs, labels, dlogits, scale / (total or n), accumulate)
        return
    _grad_into(dlogits, accumulate, lambda out: _k_xent()[1](
        probs, labels, np.int64(k), dlogits.dtype.type(scale / (total or n)), out))


def mse_forward(pred, target):
    """CuPy, unverified on a GPU: 0.5 * sum((pred - target)^2) / batch, in float64."""
    cp = _cp()
    d = pred.astype(cp.float64) - target.astype(cp.float64)
    return float((0.5 * cp.sum(d * d) / pred.shape[0]).get())


def mse_backward(pred, target, dpred, accumulate=False, total=None):
    """CuPy, unverified on a GPU: (pred - target) / total."""
    scale = dpred.dtype.type(1.0 / (total or pred.shape[0]))
    _grad_into(dpred, accumulate, lambda out: _cp().multiply(
        _cp().subtract(pred, target), scale, out=out))


# ------------------------------------------------------------------------------------------
# optimizer: the whole torch.optim.SGD step in one kernel
# ------------------------------------------------------------------------------------------


def sgd_update(param, grad, velocity, lr, momentum, weight_decay, nesterov, first_step=False,
               flag=None, neg_lr_buffer=None):
    """One kernel per parameter; with ``flag`` (the step guard's), the kernel also sets it when
    the new parameter or velocity is not finite. ``neg_lr_buffer``: a one-element device array
    of the parameter's dtype holding -lr, read by the kernel instead of ``lr`` (a CUDA graph's
    learning rate, written before each launch: devices/cuda_graph.py)."""
    t = param.dtype.type
    ks = _k_sgd(flag is not None, neg_lr_buffer is not None)
    tail = (flag,) if flag is not None else ()
    neg_lr = t(-lr) if neg_lr_buffer is None else neg_lr_buffer
    if momentum != 0:
        if velocity is None:
            raise ValueError("sgd_update: momentum != 0 needs a velocity buffer")
        ks[0](grad, t(weight_decay), t(momentum), neg_lr, np.int32(bool(first_step)),
              np.int32(bool(nesterov)), param, velocity, *tail)
    else:
        ks[1](grad, t(weight_decay), neg_lr, param, *tail)


def sgd_update_many(params, grads, velocities, lr, momentum, weight_decay, nesterov,
                    first_step=False, flag=None, neg_lr_buffer=None):
    """``sgd_update`` of every (param, grad, velocity) in ONE launch where they share a dtype
    the kernel has (float32, float64) and each is dense: cuda_raw._k_sgd_many over a table of
    their pointers, made once per set of addresses (pointer_tables.py). The per-tensor kernels
    instead where the switch ``sgd_per_layer`` is off, for one tensor, mixed dtypes, or where
    no table can be made (while a graph is captured, if the record did not make it)."""
    n = len(params)
    if len(grads) != n or len(velocities) != n:
        raise ValueError(f"sgd_update_many: {n} parameters, {len(grads)} gradients and "
                         f"{len(velocities)} velocities")
    if momentum != 0 and any(v is None for v in velocities):
        raise ValueError("sgd_update_many: momentum != 0 needs a velocity buffer for every "
                         "parameter")
    found = _sgd_table(params, grads, velocities, momentum) if n > 1 and \
        cuda_switches.sgd_per_layer else None
    if found is None:
        for p, g, v in zip(params, grads, velocities):
            sgd_update(p, g, v, lr, momentum, weight_decay, nesterov, first_step, flag=flag,
                       neg_lr_buffer=neg_lr_buffer)
        return
    dt = params[0].dtype
    t = dt.type
    if neg_lr_buffer is not None and neg_lr_buffer.dtype != dt:
        raise ValueError(f"sgd_update_many: the learning-rate buffer is {neg_lr_buffer.dtype}, "
                         f"the parameters are {dt}")
    table, blocks = found
    kernel = cuda_raw._k_sgd_many(dt.name, flag is not None, neg_lr_buffer is not None)
    neg_lr = t(-lr) if neg_lr_buffer is None else neg_lr_buffer
    tail = (flag,) if flag is not None else ()
    kernel((blocks,), (cuda_raw.SGD_MANY_THREADS,),
           (table, np.int32(n), t(weight_decay), t(momentum), neg_lr, np.int32(bool(first_step)),
            np.int32(bool(nesterov)), np.int32(momentum != 0), *tail))


def _sgd_table(params, grads, velocities, momentum):
    """(the device table of ``params``' (and their gradients' and velocities') pointers and
    sizes, then each one's first block; the launch's blocks), or None where one launch cannot
    update them all."""
    dt = params[0].dtype
    if dt.name not in cuda_raw.SGD_MANY_TYPES:
        return None
    rows = []
    for p, g, v in zip(params, grads, velocities):
        v = v if momentum != 0 else None
        if p.dtype != dt or g.dtype != dt or (v is not None and v.dtype != dt) or \
                not _same_dense(p, g, v):
            return None
        rows.append((p.data.ptr, g.data.ptr, 0 if v is None else v.data.ptr, int(p.size)))
    return _many_table(rows, [int(p.size) for p in params])


def _many_table(rows, sizes):
    """A multi-tensor kernel's device table (cuda_raw's ``_many_tensor_of_block``): each
    tensor's row of values, then each one's first block of SGD_MANY_CHUNK elements; returns
    (table, the launch's blocks), or None where it cannot be made (nothing to do, a capture,
    the tables' limit: pointer_tables.py)."""
    starts, blocks = [], 0
    for n in sizes:
        starts.append(blocks)
        blocks += -(-n // cuda_raw.SGD_MANY_CHUNK)
    starts.append(blocks)
    if blocks == 0:
        return None
    table = pointer_tables.TABLES.table(tuple(v for r in rows for v in r) + tuple(starts))
    return None if table is None else (table, blocks)


def _same_dense(p, g, v) -> bool:
    """Whether element k of the flat memory of ``p``, ``g`` and ``v`` is one element of all
    three: the same shape and strides, and no gaps (C order, or channels-last storage)."""
    if g.shape != p.shape or g.strides != p.strides or \
            (v is not None and (v.shape != p.shape or v.strides != p.strides)):
        return False
    return p.flags.c_contiguous or storage_view(p).flags.c_contiguous


# ------------------------------------------------------------------------------------------
# memory primitives
# ------------------------------------------------------------------------------------------

def fill(a, value):
    if is_low(a):
        cuda_low.fill(a, value)
    else:
        a.fill(value)


def copy(dst, src):
    """dst <- src; ``src`` may be a CuPy array or host data (NumPy, lists): the data layer feeds
    host batches through here."""
    cp = _cp()
    if isinstance(src, cp.ndarray):
        if is_low(dst) or is_low(src):
            cuda_low.cast(dst, src)         # a weight's low copy, a feature map (any strides)
        else:
            cp.copyto(dst, src)
        return
    src = np.asarray(src)
    if src.shape == dst.shape and is_channels_last(dst):
        # a channels-last tensor (--layout nhwc): the host batch in its storage order, so that
        # it is staged as one contiguous copy like an NCHW one
        dst, src = dst.transpose(TO_STORAGE), np.ascontiguousarray(src.transpose(TO_STORAGE))
    if is_low(dst) and src.dtype == np.float32 and dst.flags.c_contiguous and \
            src.shape == dst.shape:
        _stage_cast(src, dst)           # a float32 batch into a low-precision data tensor
        return
    if src.dtype != dst.dtype:
        src = src.astype(dst.dtype)
    if dst.flags.c_contiguous and src.shape == dst.shape:
        # through a pinned staging buffer, asynchronously on the compute stream; src may die
        # as soon as this returns (it was copied into the staging buffer)
        input_stager().stage(src, dst.data.ptr)
    else:
        cp.copyto(dst, cp.asarray(src))


#: float32 elements per piece of a host batch cast on the device (a 16 MiB temporary)
CAST_CHUNK = 1 << 22


def _stage_cast(src, dst):
    """Host float32 ``src`` into low-precision ``dst``: each piece staged into a float32
    temporary and rounded there by a kernel (a host cast of a ResNet-50 batch takes a tenth
    of a second or more; the GPU's, microseconds), in pieces so the temporary stays small."""
    flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
    n = flat_src.size
    tmp = _cp().empty((min(n, CAST_CHUNK),), np.float32)
    stager = input_stager()
    for lo in range(0, n, CAST_CHUNK):
        hi = min(n, lo + CAST_CHUNK)
        stager.stage(flat_src[lo:hi], tmp.data.ptr)
        cuda_low.cast(flat_dst[lo:hi], tmp[:hi - lo])


_stager = None


def input_stager():
    """The process's PinnedStager over CuPy (pinned buffers, the current stream)."""
    global _stager
    if _stager is None:
        cp = _cp()

        def memcpy_async(dst, src, n):
            cp.cuda.runtime.memcpyAsync(dst, src, n, cp.cuda.runtime.memcpyHostToDevice,
                                        cp.cuda.get_current_stream().ptr)

        def record():
            return cp.cuda.get_current_stream().record(cp.cuda.Event(disable_timing=True))

        _stager = PinnedStager(pinned_empty, memcpy_async, record)
    return _stager


def add_inplace(dst, src):
    if is_low(dst):
        cuda_low.accumulate(dst, src)
    else:
        _cp().add(dst, src, out=dst)


# ------------------------------------------------------------------------------------------
# step guard (neuron/undo.py): accumulated on the device, read once per step
# ------------------------------------------------------------------------------------------

def nonfinite_flag_new():
    return _cp().zeros(1, dtype=np.bool_)


def nonfinite_flag_clear(flag):
    flag.fill(False)


@functools.lru_cache(maxsize=None)
def _k_any_nonfinite():
    # elementwise, storing into the flag: no temporary at all (a CuPy reduction allocates a
    # partial-result buffer, which a full arena cannot give). Every thread that stores, stores
    # the same value, so the race is benign. Compared in double: a float64 1e300 stays finite.
    return _cp().ElementwiseKernel("T x", "raw bool flag",
                                   "if (!isfinite((double)x)) flag[0] = true;",
                                   "neuron_flag_nonfinite")


def nonfinite_flag_update(flag, a):
    """flag |= any(a is NaN or infinite), as one kernel on the current stream: no host sync,
    no temporary."""
    if a.size:
        if is_low(a):
            cuda_low.nonfinite(flag, _ccontig(a))
        else:
            _k_any_nonfinite()(a, flag)


def nonfinite_flag_update_many(flag, arrays):
    """``nonfinite_flag_update`` of every array, in one launch per dtype where they are dense
    float32/float64 (the step guard's checks of a step's BatchNorm statistics: one graph node
    instead of two per layer); the per-array kernel for the others, or where no pointer table
    can be made."""
    groups: dict[str, list] = {}
    for a in arrays:
        if not a.size:
            continue
        dense = a.flags.c_contiguous or storage_view(a).flags.c_contiguous
        if a.dtype.name in cuda_raw.SGD_MANY_TYPES and dense:
            groups.setdefault(a.dtype.name, []).append(a)
        else:
            nonfinite_flag_update(flag, a)
    for dt, group in groups.items():
        found = _many_table([(a.data.ptr, int(a.size)) for a in group],
                            [int(a.size) for a in group]) if len(group) > 1 else None
        if found is None:
            for a in group:
                nonfinite_flag_update(flag, a)
            continue
        table, blocks = found
        cuda_raw._k_nonfinite_many(dt)((blocks,), (cuda_raw.SGD_MANY_THREADS,),
                                       (table, np.int32(len(group)), flag))


def unscale_gradient(grad, inv_scale, flag, overflow):
    """fp16 loss scaling (neuron/precision/loss_scale.py) on the device: grad *= inv_scale; a gradient
    that is inf or NaN sets ``overflow`` and the step guard's ``flag``, read once per step."""
    cuda_low.unscale(grad, inv_scale, flag, overflow)


def nonfinite_flag_read(flag) -> bool:
    """The one device-to-host read of the step (synchronizes with the stream)."""
    return bool(flag.get()[0])


class _CudaKernelsModule(types.ModuleType):
    """This module, forwarding the switches (cuda_switches.NAMES) to cuda_switches.py."""

    def __getattr__(self, name):
        if name in cuda_switches.NAMES:
            return getattr(cuda_switches, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in cuda_switches.NAMES:
            setattr(cuda_switches, name, value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _CudaKernelsModule
