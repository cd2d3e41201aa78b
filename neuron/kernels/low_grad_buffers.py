"""The low-type gradient buffers of a mixed-precision convolution, in bytes.

Under bf16/fp16 a convolution reads a 2-byte copy of its weight, while the optimizer's gradient
stays float32 (neuron/precision). cuDNN writes dW (and db) in the weight's type, so the GPU
backward (kernels/cuda.py ``_low_param_grads``) first writes them into 2-byte buffers carved
from the front of the step's workspace, then copies each into its float32 master. The
algorithm only gets what is left behind them.

One rule for those bytes, read by the kernel that carves them, by the workspace request that
asks for them on top of the algorithm's own (kernels/conv_algos.py) and by the plan
(layers/conv.py), so that a request of "the algorithm's workspace" still leaves the algorithm
its workspace: on an H200 the deterministic backward-filter algorithm was handed its bytes
minus the buffers' and no deterministic algorithm fit what was left.
"""
from __future__ import annotations

import math

#: every buffer starts on this boundary (cuDNN vectorizes; the workspace after them stays aligned)
ALIGN = 256

#: the itemsize of mixed precision's feature types (bf16, fp16: the only 2-byte ones, and the
#: only ones whose parameters keep float32 masters beside a copy in the feature type)
LOW_ITEMSIZE = 2


def spans(shapes, itemsize: int) -> list[int]:
    """Bytes each buffer takes in the workspace (its elements, rounded up to ALIGN); 0 for a
    missing one (None)."""
    return [-(-math.prod(sh) * int(itemsize) // ALIGN) * ALIGN if sh is not None else 0
            for sh in shapes]


def carved_bytes(w_shape, bias: bool, itemsize: int) -> int:
    """Workspace bytes a backward convolution with features of ``itemsize`` bytes carves for its
    weight (and, with ``bias``, bias) gradient buffers ahead of the algorithm's workspace: 0
    unless the features are 2-byte (mixed precision)."""
    if int(itemsize) != LOW_ITEMSIZE:
        return 0
    return sum(spans([tuple(w_shape), (int(w_shape[0]),) if bias else None], itemsize))
