"""NumPy reference convolution (the CPU device): im2col into the caller's workspace, in
sub-blocks of the batch, then one matmul per group. Conventions: numpy_ref.py.

Layout. Within a sub-block of m samples the batch is moved LAST: the input is padded into
(C, Hp, Wp, m), the columns are (C, kh, kw, Ho, Wo, m) and the matmul's output is
(K, Ho, Wo, m). Every window of the padded input is then a strided view whose innermost run
is Wo*m contiguous values, so im2col is one copy of that view (with the batch first the runs
are only Wo long, and NumPy's strided copy is several times slower on them); the batch goes
back to NCHW with one transposing copy per tensor.

Input gradient. With stride 1 and a kernel larger than 1x1, dx is the correlation of the
padded dy with the flipped, transposed weights: im2col of dy and one matmul, no scatter.
Otherwise (strided convolutions, 1x1 kernels) the column gradients W^T dy are scatter-added
into a padded buffer, one strided add per kernel tap. Which of the two runs depends on the
layer's shape only, so results never depend on the workspace or the memory budget.
"""
from __future__ import annotations

import numpy as np

from .numpy_helpers import _pair

# Alignment (bytes) of the column buffer carved out of the workspace.  BLAS
# (through np.matmul) only takes its fast path on aligned arrays.
_WS_ALIGN = 64


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------

def conv2d_out_hw(h, w, kh, kw, stride, padding, dilation):
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return ho, wo


#: im2col columns are built for this many bytes' worth of samples at a time (a sub-block;
#: at least one sample). The sub-block depends only on the layer's shape, never on the memory
#: available, and every matmul (forward, dW partial, dX columns) runs on exactly one sub-block,
#: with dW summed over sub-blocks in batch order: so results are bit-identical whether the
#: step got its workspace or not, under every memory policy and budget.
CONV_CHUNK_BYTES = 4 << 20


def conv2d_chunk(n, c, kh, kw, ho, wo, itemsize) -> int:
    """Samples per im2col sub-block for a batch of n."""
    per_sample = c * kh * kw * ho * wo * itemsize
    return max(1, min(n, CONV_CHUNK_BYTES // max(per_sample, 1)))


def conv2d_workspace_bytes(x_shape, w_shape, stride, padding, dilation, groups, itemsize):
    """Bytes of workspace conv2d_forward and conv2d_backward prefer (0 also works).

    The column matrix of one sub-block of samples has C*kh*kw rows and block*Ho*Wo columns;
    the same buffer is reused in backward (columns for dW, then the columns of dy or the
    column-gradients for dX). A small slack of 64 bytes lets the columns be 64-byte aligned
    whatever the alignment of the workspace slice. Given no workspace (None), the kernels
    build each sub-block's columns in a NumPy temporary instead: the same arithmetic, so the
    same bits (the CPU's stand-in for cuDNN's zero-workspace algorithms).
    """
    n, c, h, w = x_shape
    _, _, kh, kw = w_shape
    ho, wo = conv2d_out_hw(h, w, kh, kw, stride, padding, dilation)
    m = conv2d_chunk(n, c, kh, kw, ho, wo, itemsize)
    return int(c * kh * kw * m * ho * wo * itemsize) + _WS_ALIGN


def _cols_from_workspace(workspace, count, dtype):
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    if workspace is None:
        return np.empty(count, dtype=dtype)
    if workspace.dtype != np.uint8 or workspace.ndim != 1:
        raise TypeError("workspace must be a 1-D uint8 array")
    addr = workspace.__array_interface__["data"][0]
    shift = (-addr) % _WS_ALIGN
    if workspace.nbytes < shift + nbytes:
        shift = (-addr) % dtype.itemsize
        if workspace.nbytes < shift + nbytes:
            raise ValueError(
                f"conv workspace too small: {workspace.nbytes} < {nbytes + _WS_ALIGN}")
    return workspace[shift:shift + nbytes].view(dtype)


# --------------------------------------------------------------------------
# batch-last layout
# --------------------------------------------------------------------------

def _batch_block(src_sample_bytes) -> int:
    """Samples per copy when gathering the batch last. Reading one value per sample at a
    stride of a power of two (4 KiB for 16x8x8 float32) thrashes the cache; a few samples
    at a time keep the reads in a few lines."""
    return 8 if src_sample_bytes >= 4096 else 16 if src_sample_bytes >= 1024 else 1 << 30


def _to_batch_last(dst, src):
    """dst (C, H, W, m) <- src (m, C, H, W) (dst may be a strided view)."""
    m = src.shape[0]
    step = _batch_block(src[0].nbytes if m else 0)
    if step >= m:
        np.copyto(dst, src.transpose(1, 2, 3, 0))
        return
    for i in range(0, m, step):
        np.copyto(dst[..., i:i + step], src[i:i + step].transpose(1, 2, 3, 0))


def _to_batch_first(dst, src, bias=None, accumulate=False):
    """dst (m, K, H, W) <- (or += with ``accumulate``) src (K, H, W, m) [+ bias (K,)]."""
    t = src.transpose(3, 0, 1, 2)
    if accumulate:
        np.add(dst, t, out=dst)
    elif bias is None:
        np.copyto(dst, t)
    else:
        np.add(t, bias.reshape(1, -1, 1, 1), out=dst)


def _pad_batch_last(x, ph, pw):
    """x (m, C, H, W) -> (C, H + 2ph, W + 2pw, m), zeros around (a NumPy temporary)."""
    m, c, h, w = x.shape
    xp = np.empty((c, h + 2 * ph, w + 2 * pw, m), dtype=x.dtype)
    if ph:
        xp[:, :ph] = 0
        xp[:, ph + h:] = 0
    if pw:
        xp[:, ph:ph + h, :pw] = 0
        xp[:, ph:ph + h, pw + w:] = 0
    _to_batch_last(xp[:, ph:ph + h, pw:pw + w], x)
    return xp


def _windows(xp, kh, kw, ho, wo, stride, dilation):
    """The im2col view (C, kh, kw, Ho, Wo, m) of a padded batch-last input (C, Hp, Wp, m), a
    C-contiguous array: element [c, i, j, oh, ow, n] is xp[c, oh*sh + i*dh, ow*sw + j*dw, n].
    Every index stays inside xp when Ho, Wo are the convolution's output size."""
    c, _, _, m = xp.shape
    s0, s1, s2, s3 = xp.strides
    (sh, sw), (dh, dw) = stride, dilation
    # the ndarray constructor: what as_strided does, without its cost per call
    return np.ndarray((c, kh, kw, ho, wo, m), xp.dtype, xp, 0,
                      (s0, s1 * dh, s2 * dw, s1 * sh, s2 * sw, s3))


def _im2col(x, cols6, stride, padding, dilation):
    """cols6 (C, kh, kw, Ho, Wo, m) <- patches of x (m, C, H, W), batch last."""
    _, kh, kw, ho, wo, _ = cols6.shape
    if kh == kw == 1 and padding == (0, 0):
        sh, sw = stride
        _to_batch_last(cols6[:, 0, 0], x[:, :, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw])
        return
    xp = _pad_batch_last(x, *padding)
    np.copyto(cols6, _windows(xp, kh, kw, ho, wo, stride, dilation))


def _col2im(cols6, h, w, stride, padding, dilation):
    """The input gradient (C, H, W, m), batch last, from the column gradients cols6
    (C, kh, kw, Ho, Wo, m): each tap's columns added at its window of a padded buffer, the
    taps in row-major order (a NumPy temporary; the caller moves the batch first)."""
    c, kh, kw, ho, wo, m = cols6.shape
    ph, pw = padding
    dxp = np.zeros((c, h + 2 * ph, w + 2 * pw, m), dtype=cols6.dtype)
    # the padded buffer must hold every window (the last rows/columns a stride skips too)
    win = _windows(dxp, kh, kw, ho, wo, stride, dilation)
    for i in range(kh):
        for j in range(kw):
            tap = win[:, i, j]
            # within one tap the output->input map is injective: += is safe
            np.add(tap, cols6[:, i, j], out=tap)
    return dxp[:, ph:ph + h, pw:pw + w]


def _flipped_transposed(w, g):
    """The weights of dx = corr(dy, W') for w (K, Cg, kh, kw): W'[c, k, i, j] =
    w[k, c, kh-1-i, kw-1-j] within each group, as (G, Cg, Kg*kh*kw)."""
    k, cg, kh, kw = w.shape
    kg = k // g
    wf = w[:, :, ::-1, ::-1].reshape(g, kg, cg, kh, kw).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(wf).reshape(g, cg, kg * kh * kw)


def _dx_by_correlation(k, c, kh, kw, h, w, ho, wo, stride) -> bool:
    """Whether dx is computed as a correlation of the padded dy (stride 1, kernel > 1x1, and
    dy's columns fit where the input's do). A function of the layer's shape only."""
    return stride == (1, 1) and kh * kw > 1 and k * h * w <= c * ho * wo


def conv2d_forward(x, w, b, y, stride, padding, dilation, groups, workspace):
    """y = conv2d(x, w, b) (cross-correlation, torch.nn.functional.conv2d)."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    g = int(groups)
    assert c == cg * g and k % g == 0, "bad group configuration"
    kg = k // g
    ho, wo = y.shape[2], y.shape[3]
    assert (ho, wo) == conv2d_out_hw(h, wd, kh, kw, stride, padding, dilation)
    m = conv2d_chunk(n, c, kh, kw, ho, wo, x.dtype.itemsize)
    wg = w.reshape(g, kg, cg * kh * kw)
    for n0 in range(0, n, m):          # one sub-block at a time (see CONV_CHUNK_BYTES)
        xc, yc = x[n0:n0 + m], y[n0:n0 + m]
        nc = xc.shape[0]
        p = nc * ho * wo
        cols = _cols_from_workspace(workspace, c * kh * kw * p, x.dtype)
        _im2col(xc, cols.reshape(c, kh, kw, ho, wo, nc), stride, padding, dilation)
        # (G, Kg, CgKK) @ (G, CgKK, Ho*Wo*n) -> (G, Kg, Ho*Wo*n)
        tmp = np.matmul(wg, cols.reshape(g, cg * kh * kw, p))
        _to_batch_first(yc, tmp.reshape(k, ho, wo, nc), b)


def conv2d_backward(x, w, dy, dx, dw, db, stride, padding, dilation, groups, workspace,
                    accumulate=False, accumulate_params=False):
    """Gradients of conv2d_forward; dx, dw, db are overwritten (None = skip); with
    ``accumulate`` dx is added to, in place, with ``accumulate_params`` dw and db (a chunk of
    the batch adding its share, memory/chunking.py).

    dW is summed sub-block by sub-block in a fixed order (see CONV_CHUNK_BYTES)."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    g = int(groups)
    kg = k // g
    ho, wo = dy.shape[2], dy.shape[3]
    ckk = cg * kh * kw
    if db is not None:
        if accumulate_params:
            np.add(db, np.sum(dy, axis=(0, 2, 3)), out=db)
        else:
            np.sum(dy, axis=(0, 2, 3), out=db)
    if dw is None and dx is None:
        return
    m = conv2d_chunk(n, c, kh, kw, ho, wo, x.dtype.itemsize)
    by_corr = dx is not None and _dx_by_correlation(k, c, kh, kw, h, wd, ho, wo, stride)
    if dx is not None:
        wx = _flipped_transposed(w, g) if by_corr else w.reshape(g, kg, ckk).transpose(0, 2, 1)
    for n0 in range(0, n, m):
        xc, dyc = x[n0:n0 + m], dy[n0:n0 + m]
        nc = xc.shape[0]
        p = nc * ho * wo
        # dy batch last, as (G, Kg, Ho*Wo*n): a sub-block-sized temporary
        dyt = np.empty((k, ho, wo, nc), dtype=dy.dtype)
        _to_batch_last(dyt, dyc)
        dyt = dyt.reshape(g, kg, p)
        cols = _cols_from_workspace(workspace, c * kh * kw * p, x.dtype)
        if dw is not None:
            _im2col(xc, cols.reshape(c, kh, kw, ho, wo, nc), stride, padding, dilation)
            # dW^T = cols @ dy^T: (G, CgKK, P) @ (G, P, Kg).  This orientation is
            # markedly faster in OpenBLAS than dy @ cols^T for long P.
            dwt = np.matmul(cols.reshape(g, ckk, p), dyt.transpose(0, 2, 1))
            dwt = dwt.transpose(0, 2, 1).reshape(dw.shape)
            if n0 == 0 and not accumulate_params:
                np.copyto(dw, dwt)
            else:
                np.add(dw, dwt, out=dw)
        if dx is None:
            continue
        dxc = dx[n0:n0 + m]
        if by_corr:
            # dx = corr(dy padded by d*(k-1)-p, flipped W^T): the columns of dy, one matmul
            dcols = cols[:k * kh * kw * h * wd * nc].reshape(k, kh, kw, h, wd, nc)
            dyp = _pad_dy(dyt.reshape(k, ho, wo, nc), h, wd, kh, kw, padding, dilation)
            np.copyto(dcols, _windows(dyp, kh, kw, h, wd, (1, 1), dilation))
            gx = np.matmul(wx, dcols.reshape(g, kg * kh * kw, h * wd * nc))
            _to_batch_first(dxc, gx.reshape(c, h, wd, nc), accumulate=accumulate)
        else:
            # column gradients overwrite the columns in the same workspace
            colsg = cols.reshape(g, ckk, p)
            np.matmul(wx, dyt, out=colsg)
            gx = _col2im(cols.reshape(c, kh, kw, ho, wo, nc), h, wd, stride, padding, dilation)
            _to_batch_first(dxc, gx, accumulate=accumulate)


def _pad_dy(dyt, h, w, kh, kw, padding, dilation):
    """dy (K, Ho, Wo, m), batch last, padded by d*(k-1)-p on each side (cropped where that is
    negative): its (H, W) windows of kh x kw taps at dilation d are dx's correlation
    windows (stride 1)."""
    k, ho, wo, m = dyt.shape
    (ph, pw), (dh, dw) = padding, dilation
    qh, qw = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    hp, wp = h + dh * (kh - 1), w + dw * (kw - 1)
    dyp = np.zeros((k, hp, wp, m), dtype=dyt.dtype)
    # rows of dy at dyp row r = oh + qh, kept where 0 <= r < hp
    o0, o1 = max(0, -qh), min(ho, hp - qh)
    p0, p1 = max(0, -qw), min(wo, wp - qw)
    if o1 > o0 and p1 > p0:
        dyp[:, o0 + qh:o1 + qh, p0 + qw:p1 + qw] = dyt[:, o0:o1, p0:p1]
    return dyp
