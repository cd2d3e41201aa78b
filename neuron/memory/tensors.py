"""The runtime's view of a tensor: a name, a kind, a shape and bytes. Storage is the pool's job."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class Kind(enum.Enum):
    DATA = "data"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    PARAM = "param"
    PARAM_GRAD = "param_grad"
    OPT_STATE = "opt_state"
    WORKSPACE = "workspace"
    AUX = "aux"


@dataclass(eq=False)
class TensorInfo:
    id: int
    name: str
    kind: Kind
    shape: tuple[int, ...]
    dtype: np.dtype
    persistent: bool = False        # lives across iterations (parameters, optimizer state)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def __repr__(self):
        return f"<{self.kind.value} {self.name} {self.shape}>"


class TensorRegistry:
    def __init__(self):
        self.tensors: list[TensorInfo] = []
        self.by_name: dict[str, TensorInfo] = {}

    def add(self, name: str, kind: Kind, shape, dtype, persistent: bool = False) -> TensorInfo:
        if name in self.by_name:
            raise KeyError(f"tensor {name!r} registered twice")
        t = TensorInfo(len(self.tensors), name, kind, tuple(int(s) for s in shape),
                       np.dtype(dtype), persistent)
        self.tensors.append(t)
        self.by_name[name] = t
        return t

    def __getitem__(self, name: str) -> TensorInfo:
        return self.by_name[name]

    def __len__(self):
        return len(self.tensors)
