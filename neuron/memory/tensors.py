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
    # mixed precision (neuron/precision): a step's low-precision copy of the parameters its
    # layer reads, cast from the master weights at that step and freed after it
    PARAM_COPY = "param_copy"


KIND_INDEX = {k: i for i, k in enumerate(Kind)}


class TensorInfo:
    """Plain slots, sizes precomputed: the planner touches these millions of times."""
    __slots__ = ("id", "name", "kind", "kind_index", "shape", "dtype", "persistent", "nbytes",
                 "parent", "byte_offset", "members", "parts", "dtype_name", "dtype_parts",
                 "channels_last")

    def __init__(self, id: int, name: str, kind: Kind, shape, dtype, persistent: bool = False):
        self.id, self.name, self.kind = id, name, kind
        self.kind_index = KIND_INDEX[kind]
        self.shape, self.dtype = shape, dtype
        self.persistent = persistent    # lives across iterations (parameters, optimizer state)
        self.nbytes = math.prod(shape) * dtype.itemsize
        # a member lives at byte_offset inside its parent block (a layer's parameters and
        # optimizer state move as one allocation); a block lists its members
        self.parent: "TensorInfo | None" = None
        self.byte_offset = 0
        self.members: tuple = ()
        self.parts: tuple = ()          # a block's bytes by kind index, for accounting
        # the byte reports count each tensor at its own type (neuron/precision): a block's
        # bytes by its members' dtype names, else this tensor's dtype name
        self.dtype_name = dtype.name
        self.dtype_parts: tuple = ()
        # stored N, H, W, C and viewed (N, C, H, W) with channels-last strides (--layout nhwc,
        # memory/layout.py); the bytes are the same
        self.channels_last = False

    @property
    def storage(self) -> "TensorInfo":
        """The tensor that owns the bytes: the block for a member, else itself."""
        return self.parent or self

    def __repr__(self):
        return f"<{self.kind.value} {self.name} {self.shape}>"


class TensorRegistry:
    def __init__(self):
        self.tensors: list[TensorInfo] = []
        self.by_name: dict[str, TensorInfo] = {}
        # set by memory/layout.apply_layout: which tensors registered later (recomputed
        # versions, low-precision weight copies) are stored channels-last
        self.channels_last_rule = None

    def add(self, name: str, kind: Kind, shape, dtype, persistent: bool = False) -> TensorInfo:
        if name in self.by_name:
            raise KeyError(f"tensor {name!r} registered twice")
        dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        t = TensorInfo(len(self.tensors), name, kind, tuple(shape), dtype, persistent)
        if self.channels_last_rule is not None:
            t.channels_last = self.channels_last_rule(t)
        self.tensors.append(t)
        self.by_name[name] = t
        return t

    def add_block(self, name: str, members: list[TensorInfo], align: int = 256) -> TensorInfo:
        """One persistent allocation holding members at aligned offsets."""
        off = 0
        for m in members:
            m.parent, m.byte_offset = None, off
            off += -(-max(m.nbytes, 1) // align) * align
        block = self.add(name, Kind.PARAM, (off,), np.uint8, persistent=True)
        block.members = tuple(members)
        by_kind: dict[int, int] = {}
        for m in members:
            m.parent = block
            by_kind[m.kind_index] = by_kind.get(m.kind_index, 0) + \
                -(-max(m.nbytes, 1) // align) * align
        block.parts = tuple(by_kind.items())
        by_dtype: dict[str, int] = {}
        for m in members:
            by_dtype[m.dtype_name] = by_dtype.get(m.dtype_name, 0) + \
                -(-max(m.nbytes, 1) // align) * align
        block.dtype_parts = tuple(by_dtype.items())
        return block

    def __getitem__(self, name: str) -> TensorInfo:
        return self.by_name[name]

    def __len__(self):
        return len(self.tensors)
