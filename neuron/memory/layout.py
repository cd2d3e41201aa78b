"""Storage layout of 4-d tensors: nchw (C order) or nhwc (channels last).

The layout is a storage property, not a shape property. Graph shapes stay (C, H, W), every
tensor keeps its (N, C, H, W) shape and its bytes (so plans, budgets and reports are the same
in either layout); what changes is where each element lives. Under nhwc a feature map, its
gradient and a convolution weight with everything that mirrors it (the weight's gradient,
optimizer state, a low-precision copy) are stored N, H, W, C (K, R, S, C for weights), and the
pool hands kernels an (N, C, H, W)-shaped view with channels-last strides. Kernels index
logically, so the values they compute do not depend on the layout; cuDNN reads the strides
off the views (tensor descriptors, and the NHWC filter format: kernels/cuda.py).

Byte copies (offload, prefetch, compaction, compression, the undo record) move raw storage and
never look at the layout. Everything that crosses to the user reads the logical view: state
dicts and checkpoints hold NCHW-order (KCRS) arrays in either layout, and a flatten before a
linear layer gives NCHW feature order (layers/linear.py), so weights mean the same thing in
both. What stays C order: 1-d/2-d tensors, per-channel statistics, dropout masks (AUX: their
values are drawn by logical index either way), workspaces."""
from __future__ import annotations

import numpy as np

from ..kernels.channels_last import TO_LOGICAL, TO_STORAGE, storage_shape  # noqa: F401
from .tensors import Kind

#: the layouts, the default first
LAYOUTS = ("nchw", "nhwc")

#: kinds whose 4-d tensors take the layout: feature maps and conv weights with their mirrors
LAID_OUT_KINDS = frozenset({Kind.DATA, Kind.ACTIVATION, Kind.GRADIENT, Kind.PARAM,
                            Kind.PARAM_GRAD, Kind.OPT_STATE, Kind.PARAM_COPY})


def get_layout(layout: str | None, where: str = "Executor") -> str:
    """``layout`` checked (None: nchw); anything else is one error naming the choices."""
    if layout is None:
        return LAYOUTS[0]
    if not isinstance(layout, str) or layout.lower() not in LAYOUTS:
        raise ValueError(f"{where}: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return layout.lower()


def laid_out(t) -> bool:
    """Whether tensor ``t`` (a TensorInfo) is stored channels-last under nhwc."""
    return len(t.shape) == 4 and t.kind in LAID_OUT_KINDS


def apply_layout(registry, layout: str) -> int:
    """Mark every tensor of ``registry`` (a TensorRegistry) that the layout stores
    channels-last (``channels_last`` on the TensorInfo: the pool's views read it), now and
    as tensors are registered later; returns how many are marked. nchw clears the marks."""
    nhwc = layout == "nhwc"
    registry.channels_last_rule = laid_out if nhwc else None
    n = 0
    for t in registry.tensors:
        t.channels_last = nhwc and laid_out(t)
        n += t.channels_last
    return n


def storage_order(value, t):
    """``value`` (a logical array of t's shape) as t's storage holds it, C-contiguous: what raw
    bytes written into t's storage must be (memory/pool.py's host placement)."""
    a = np.asarray(value)
    if t.channels_last:
        a = np.broadcast_to(a, t.shape).transpose(TO_STORAGE)
    return np.ascontiguousarray(a, dtype=t.dtype)

