"""The runtime's view of a tensor: a name, a kind, a shape and bytes. Storage is the pool's job."""
from __future__ import annotations

import enum
import math
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


KIND_INDEX = {k: i for i, k in enumerate(Kind)}


class TensorInfo:
    """Plain slots, sizes precomputed: the planner touches these millions of times."""
    __slots__ = ("id", "name", "kind", "kind_index", "shape", "dtype", "persistent", "nbytes")

    def __init__(self, id: int, name: str, kind: Kind, shape, dtype, persistent: bool = False):
        self.id, self.name, self.kind = id, name, kind
        self.kind_index = KIND_INDEX[kind]
        self.shape, self.dtype = shape, dtype
        self.persistent = persistent    # lives across iterations (parameters, optimizer state)
        self.nbytes = math.prod(shape) * dtype.itemsize

    def __repr__(self):
        return f"<{self.kind.value} {self.name} {self.shape}>"


class TensorRegistry:
    def __init__(self):
        self.tensors: list[TensorInfo] = []
        self.by_name: dict[str, TensorInfo] = {}

    def add(self, name: str, kind: Kind, shape, dtype, persistent: bool = False) -> TensorInfo:
        if name in self.by_name:
            raise KeyError(f"tensor {name!r} registered twice")
        dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        t = TensorInfo(len(self.tensors), name, kind, tuple(shape), dtype, persistent)
        self.tensors.append(t)
        self.by_name[name] = t
        return t

    def __getitem__(self, name: str) -> TensorInfo:
        return self.by_name[name]

    def __len__(self):
        return len(self.tensors)
