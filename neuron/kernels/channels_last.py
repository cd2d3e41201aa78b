"""Channels-last arrays: a logical (N, C, H, W) array whose storage is the C-ordered
(N, H, W, C) one (--layout nhwc, memory/layout.py; weights: (K, C, R, S) stored K, R, S, C).
What the kernels need to recognise such a view and describe it to cuDNN."""
from __future__ import annotations

#: logical (N, C, H, W) -> storage (N, H, W, C): a.transpose(TO_STORAGE)
TO_STORAGE = (0, 2, 3, 1)
#: storage -> logical
TO_LOGICAL = (0, 3, 1, 2)


def storage_shape(shape) -> tuple:
    """The storage (N, H, W, C) shape of a channels-last (N, C, H, W) array."""
    n, c, h, w = shape
    return (n, h, w, c)


def channels_last_strides(shape, itemsize) -> tuple:
    """Byte strides of a logical (N, C, H, W) array stored N, H, W, C."""
    _, c, h, w = shape
    return (h * w * c * itemsize, itemsize, w * c * itemsize, c * itemsize)


def is_channels_last(a) -> bool:
    """Whether a 4-d array (NumPy or CuPy) is a channels-last view: its storage is the
    C-ordered (N, H, W, C) array and not also the (N, C, H, W) one (C == 1, H == W == 1: the
    bytes are the same in both layouts, and this says no)."""
    return a.ndim == 4 and not a.flags.c_contiguous and \
        a.transpose(TO_STORAGE).flags.c_contiguous


def storage_permutation(a):
    """The axes that make ``a`` C-contiguous: None when it is, TO_STORAGE for a channels-last
    array, else ValueError (a layout the kernels do not take)."""
    if a.flags.c_contiguous:
        return None
    if is_channels_last(a):
        return TO_STORAGE
    raise ValueError(f"an array of shape {tuple(a.shape)} with strides {tuple(a.strides)} is "
                     "neither C-ordered nor channels-last (--layout nchw|nhwc)")


def storage_view(a):
    """``a`` as its storage, C-contiguous: the (N, H, W, C) view of a channels-last array
    (elementwise work in place, such as summing a gradient over ranks, may run on it), else
    ``a`` itself."""
    return a.transpose(TO_STORAGE) if a.ndim == 4 and is_channels_last(a) else a


def nhwc_filter(w, x) -> bool:
    """Whether cuDNN is to read filter ``w`` convolved with ``x`` in its NHWC format: a
    channels-last (K, R, S, C) filter, or a 1x1 one (the same bytes in both) of a channels-last
    input."""
    return is_channels_last(w) or (is_channels_last(x) and
                                   w.transpose(TO_STORAGE).flags.c_contiguous)
