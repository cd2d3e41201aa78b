"""NumPy reference convolution (the CPU device): im2col into the caller's workspace, in
sub-blocks of the batch, then one matmul per group. Conventions: numpy_ref.py."""
from __future__ import annotations

import numpy as np

from .numpy_helpers import _offset_slices, _pair

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
    the same buffer is reused in backward (columns for dW, then column-gradients for dX). A
    small slack of 64 bytes lets the columns be 64-byte aligned whatever the alignment of the
    workspace slice. Given no workspace (None), the kernels build each sub-block's columns in
    a NumPy temporary instead: the same arithmetic, so the same bits (the CPU's stand-in for
    cuDNN's zero-workspace algorithms).
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


def _im2col(x, cols6, stride, padding, dilation):
    """cols6 (C, kh, kw, N, Ho, Wo) <- patches of x (N, C, H, W)."""
    _, _, h, w = x.shape
    _, kh, kw, _, ho, wo = cols6.shape
    dh, dw = dilation
    xt = x.transpose(1, 0, 2, 3)                       # (C, N, H, W) view
    for i in range(kh):
        for j in range(kw):
            dst = cols6[:, i, j]                       # (C, N, Ho, Wo)
            sl = _offset_slices(ho, wo, h, w, stride, padding, i * dh, j * dw)
            if sl is None:
                dst[...] = 0
                continue
            oh, ow, ih, iw = sl
            # zero the border that falls into the padding
            if oh.start > 0:
                dst[:, :, :oh.start] = 0
            if oh.stop < ho:
                dst[:, :, oh.stop:] = 0
            if ow.start > 0:
                dst[:, :, oh, :ow.start] = 0
            if ow.stop < wo:
                dst[:, :, oh, ow.stop:] = 0
            dst[:, :, oh, ow] = xt[:, :, ih, iw]


def _col2im(cols6, dx, stride, padding, dilation, accumulate=False):
    """dx (N, C, H, W) <- (or +=, accumulating) scatter-add of cols6 (C, kh, kw, N, Ho, Wo)."""
    _, _, h, w = dx.shape
    _, kh, kw, _, ho, wo = cols6.shape
    dh, dw = dilation
    if not accumulate:
        dx[...] = 0
    dxt = dx.transpose(1, 0, 2, 3)
    for i in range(kh):
        for j in range(kw):
            sl = _offset_slices(ho, wo, h, w, stride, padding, i * dh, j * dw)
            if sl is None:
                continue
            oh, ow, ih, iw = sl
            # within one tap the output->input map is injective: += is safe
            dxt[:, :, ih, iw] += cols6[:, i, j, :, oh, ow]


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
        _im2col(xc, cols.reshape(c, kh, kw, nc, ho, wo), stride, padding, dilation)
        # (G, Kg, CgKK) @ (G, CgKK, n*Ho*Wo) -> (G, Kg, n*Ho*Wo)
        tmp = np.matmul(wg, cols.reshape(g, cg * kh * kw, p))
        tmp = tmp.reshape(k, nc, ho, wo).transpose(1, 0, 2, 3)     # view (n, K, Ho, Wo)
        if b is None:
            np.copyto(yc, tmp)
        else:
            np.add(tmp, b.reshape(1, k, 1, 1), out=yc)


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
    wgt = w.reshape(g, kg, ckk).transpose(0, 2, 1)
    for n0 in range(0, n, m):
        xc, dyc = x[n0:n0 + m], dy[n0:n0 + m]
        nc = xc.shape[0]
        p = nc * ho * wo
        # dy as (K, n*Ho*Wo), one transposed copy (a chunk-sized temporary)
        dyt = np.ascontiguousarray(dyc.transpose(1, 0, 2, 3)).reshape(g, kg, p)
        cols = _cols_from_workspace(workspace, c * kh * kw * p, x.dtype)
        cols6 = cols.reshape(c, kh, kw, nc, ho, wo)
        colsg = cols.reshape(g, ckk, p)
        if dw is not None:
            _im2col(xc, cols6, stride, padding, dilation)
            # dW^T = cols @ dy^T: (G, CgKK, P) @ (G, P, Kg).  This orientation is
            # markedly faster in OpenBLAS than dy @ cols^T for long P.
            dwt = np.matmul(colsg, dyt.transpose(0, 2, 1)).transpose(0, 2, 1).reshape(dw.shape)
            if n0 == 0 and not accumulate_params:
                np.copyto(dw, dwt)
            else:
                np.add(dw, dwt, out=dw)
        if dx is not None:
            # column gradients overwrite the columns in the same workspace
            np.matmul(wgt, dyt, out=colsg)
            _col2im(cols6, dx[n0:n0 + m], stride, padding, dilation, accumulate)
