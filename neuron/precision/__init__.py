"""Precision: which tensor of an iteration is stored in which type.

- fp32: everything float32 (the master dtype).
- tf32: float32 storage; on a GPU, convolutions and matrix products may use TF32 tensor cores
  (a math mode, not a storage type): planned exactly like fp32.
- bf16 / fp16 (mixed precision): feature maps (data included), their gradients and a
  low-precision copy of every convolution and linear parameter (what those layers read) are 2
  bytes. Parameters themselves (the master weights), their gradients as the optimizer sees
  them, optimizer state, BatchNorm parameters, statistics and running estimates, and the
  softmax loss with its probabilities stay in the master dtype (float32). Convolution and
  linear layers compute with float32 accumulation. fp16 trains with dynamic loss scaling
  (loss_scale.py); bf16 needs none (float32's exponent range).

Planning, the byte reports and execution all ask this one policy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

#: layer kinds (Layer.kind) that read a low-precision copy of their parameters and compute in
#: the low type with float32 accumulation (cuDNN's compute type); every other layer reads its
#: parameters in the master dtype
CASTS_PARAMS = ("conv", "fc")


def bfloat16() -> np.dtype:
    """NumPy's bfloat16, from the ml_dtypes package (an error naming it when missing)."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError("precision bf16 needs the ml_dtypes package (NumPy's bfloat16): "
                          "pip install ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def is_real_float(dtype) -> bool:
    """A real floating type, bfloat16 included (ml_dtypes' types are kind "V" to NumPy)."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class Precision:
    name: str

    @property
    def mixed(self) -> bool:
        """Whether feature maps are stored in a 2-byte type (bf16, fp16)."""
        return self.name in ("bf16", "fp16")

    @property
    def loss_scaling(self) -> bool:
        """fp16's narrow exponent range: gradients need dynamic loss scaling."""
        return self.name == "fp16"

    def low(self) -> np.dtype | None:
        """The 2-byte storage type, or None (fp32, tf32)."""
        if self.name == "bf16":
            return bfloat16()
        if self.name == "fp16":
            return np.dtype(np.float16)
        return None

    def feature_dtype(self, master) -> np.dtype:
        """Feature maps (activations, data) and their gradients."""
        return self.low() or np.dtype(master)

    def casts_params(self, layer) -> bool:
        """Whether ``layer`` reads a low-precision copy of its parameters."""
        return self.mixed and layer.kind in CASTS_PARAMS

    def __str__(self):
        return self.name


FP32 = Precision("fp32")


def get_precision(value, owner: str = "Executor") -> Precision:
    """A Precision from its name (or itself); None is fp32. ValueError naming ``owner``'s
    ``precision`` and the choices otherwise."""
    if value is None:
        return FP32
    if isinstance(value, Precision):
        return value
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ValueError(f"{owner}: precision must be one of {', '.join(PRECISIONS)}, got "
                         f"{value!r}")
    p = Precision(value)
    p.low()                 # bf16 without ml_dtypes: the error now
    return p


def dtype_name(dtype) -> str:
    """A dtype as the reports name it: float32, bfloat16, float16, uint8, ..."""
    return np.dtype(dtype).name
