"""Layer base class: a layer is a shape rule, a dependency declaration and forward/backward.

A layer never allocates memory itself. The executor hands it views into the arena:
``ins``/``outs`` (activations), ``params``, ``aux`` (tensors kept from forward for backward,
e.g. BN batch statistics, dropout masks), ``ws`` (a transient workspace) and, in backward,
``douts``/``dins``/``dparams``. ``k`` is the device's kernel module (NumPy or cuDNN/CuPy), so
one layer file serves every device.

What backward reads is declared, not discovered: ``retain_inputs`` / ``retain_outputs`` name the
input and output indices whose *values* backward needs (Chainer's idea). Liveness frees an
activation right after its last declared use, so minimal declarations are what save memory.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import GraphError
from ..sizes import shape_arg
from ..tensor import Tensor


@dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    init: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]
    trainable: bool = True          # BN running statistics are persistent but not trained


@dataclass(frozen=True)
class AuxSpec:
    shape: tuple[int, ...]          # full shape, batch included
    dtype: Any = None               # None: the compute dtype


def pair(v, what: str, layer: str) -> tuple[int, int]:
    v = shape_arg(v, what, layer, "an integer or a pair of integers")
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2:
        raise GraphError(f"{layer}: {what} must be an int or a pair, got {v!r}")
    return v


def at_least(layer: str, what: str, value, minimum: int) -> None:
    """GraphError naming ``layer`` and its argument ``what`` unless every side of ``value`` (an
    int or a pair) is >= minimum."""
    sides = value if isinstance(value, tuple) else (value,)
    if min(sides) < minimum:
        need = "positive" if minimum == 1 else f">= {minimum}"
        raise GraphError(f"{layer}: {what} must be {need}, got "
                         f"{value if len(sides) > 1 else sides[0]}")


def window_text(kernel, stride, padding, dilation=(1, 1)) -> str:
    """A sliding window as ``describe()`` prints it: "3x3/2 p1" (stride, then padding and
    dilation where not 0 and 1; a pair where its two sides differ). All of it is geometry the
    cost model's profile keys must tell apart: the shapes alone do not fix the padding."""
    def one(v):
        return str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"
    out = f"{kernel[0]}x{kernel[1]}/{one(stride)}"
    if any(padding):
        out += f" p{one(padding)}"
    if tuple(dilation) != (1, 1):
        out += f" d{one(dilation)}"
    return out


class Layer:
    #: role in memory planning: "data", "conv", "fc", "join", "concat" are checkpoints
    #: (their outputs are worth keeping); "bn", "act", "pool", "lrn", "dropout" are cheap to
    #: recompute; "loss" ends the graph.
    kind = "generic"
    retain_inputs: tuple[int, ...] = ()
    retain_outputs: tuple[int, ...] = ()
    #: the forward reads a result back to the host (the loss value): on a GPU the host waits
    #: there for everything queued before it (the simulated clock's pipelined model)
    syncs_host = False
    num_inputs: int | None = 1      # None: variadic (add, concat)
    #: backward's every input gradient is its one output gradient, unchanged (Add): the
    #: schedule may bind an input's gradient to the output gradient's tensor itself
    #: (memory/aliasing.py), and backward then gets None for it in ``dins``
    passes_gradient = False
    #: backward overwrites its output gradient with the gradient it passes on (AddReLU masks
    #: it in place): the aliasing rule counts that write, and the CPU mixed-precision
    #: reference stores the rewritten gradient back into the low-precision tensor
    rewrites_gradient = False
    type_name = "Layer"
    _counter: dict[str, int] = {}

    def __init__(self, name: str | None = None):
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"{self.type_name}: name must be a non-empty string or None, got "
                            f"{name!r} ({type(name).__name__})")
        if name is None:
            n = Layer._counter.get(self.type_name, 0)
            Layer._counter[self.type_name] = n + 1
            name = f"{self.type_name.lower()}{n}"
        self.name = name
        self.inputs: list = []      # symbolic Tensors, set when called
        self.outputs: list = []
        self.param_specs: dict[str, ParamSpec] = {}

    # ---- graph building -------------------------------------------------------------
    def __call__(self, *inputs):
        if self.outputs:
            raise GraphError(f"layer {self.name!r} was already called; create a new layer "
                             "(weight sharing between call sites is not supported)")
        if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
            inputs = tuple(inputs[0])
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                raise GraphError(f"{self.name}: input {i} is {type(t).__name__}, expected a "
                                 "neuron Tensor (the output of Input or another layer)")
        if self.num_inputs is not None and len(inputs) != self.num_inputs:
            raise GraphError(f"{self.name}: expects {self.num_inputs} input(s), got {len(inputs)}")
        if self.num_inputs is None and len(inputs) < 2:
            raise GraphError(f"{self.name}: expects at least 2 inputs, got {len(inputs)}")
        shapes = [t.shape for t in inputs]
        self.build(shapes)
        out_shapes = self.infer_shapes(shapes)
        self.inputs = list(inputs)
        self.outputs = [Tensor(s, self, i) for i, s in enumerate(out_shapes)]
        for t in inputs:
            t.consumers.append(self)
        return self.outputs[0] if len(self.outputs) == 1 else tuple(self.outputs)

    def build(self, in_shapes: list[tuple[int, ...]]) -> None:
        """Create parameter specs once input shapes are known."""

    def infer_shapes(self, in_shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        raise NotImplementedError

    # ---- memory declarations (shapes include the batch) ---------------------------------
    def aux_specs(self, batch: int) -> dict[str, AuxSpec]:
        return {}

    def workspace_bytes(self, phase: str, batch: int, itemsize: int) -> int:
        """The workspace this step plans for (a ceiling on devices that choose dynamically)."""
        return 0

    def reorder_bytes(self, phase: str, batch: int, itemsize: int, layout: str) -> int:
        """Workspace this step needs to reorder its input under ``layout`` (Linear after a
        channels-last map: its NCHW-order flatten, layers/linear.py)."""
        return 0

    def planned_workspace_bytes(self, phase: str, batch: int, itemsize: int,
                                layout: str = "nchw") -> int:
        """What a step of this layer plans: its kernels' workspace and its reordering's."""
        return self.workspace_bytes(phase, batch, itemsize) + \
            self.reorder_bytes(phase, batch, itemsize, layout)

    def workspace_shrinks(self) -> bool:
        """Whether this layer's kernels also run, with the same results, on no workspace (the
        executor then gives a step none when its preferred one does not fit in one free block)."""
        return False

    def workspace_request(self, k, phase: str, batch: int, dtype, limit: int,
                          layout: str = "nchw") -> int:
        """Bytes to give this step's kernel when ``limit`` bytes are free in one block.

        Static by default; convolution on the GPU picks the fastest algorithm that fits
        (SuperNeurons §3.5) and asks for exactly its workspace (``layout``, the executor's
        nchw or nhwc, chooses among the algorithms of that layout)."""
        return self.planned_workspace_bytes(phase, batch, np.dtype(dtype).itemsize, layout)

    def in_shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, *t.shape) for t in self.inputs]

    def out_shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, *t.shape) for t in self.outputs]

    # ---- compute ----------------------------------------------------------------------
    def forward(self, k, ins, outs, params, aux, ws, ctx) -> None:
        raise NotImplementedError

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx) -> None:
        raise NotImplementedError

    def flops(self, batch: int) -> int:
        """Rough forward cost (multiply-adds), for cost-aware planning."""
        return sum(math.prod(s) for s in self.out_shapes(batch))

    def describe(self) -> str:
        return self.type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} {self.name}>"


@dataclass
class Context:
    """What a kernel call may need beyond tensors."""
    training: bool = True
    recompute: bool = False         # a re-run of forward: must not update BN running stats
    seed: int = 0
    iteration: int = 0
    feed: dict = field(default_factory=dict)
    losses: dict = field(default_factory=dict)
    # backward: indices of the inputs whose gradient an earlier step already started; the
    # kernel adds its share into it (beta = 1) instead of overwriting
    accumulate: frozenset = frozenset()
    # the part of the batch this step runs on (memory/chunking.py Chunk), None: all of it
    chunk: Any = None
    # the tape recording this iteration (neuron/tape.py), None when it is not recorded
    tape: Any = None
    # (loss name, its rows array) -> a fixed device buffer the loss kernel leaves its per-row
    # values in, read when the step ends (a GPU's guarded training step); None: read at once
    loss_sink: Any = None
    # the executor's next step after the running one (its guard snapshots may start under this
    # one's kernel, neuron/undo.py); None at the last
    ahead: Any = None

    def acc(self, i: int = 0) -> bool:
        return i in self.accumulate

    def grad_kw(self, i: int = 0) -> dict:
        """The kernel keyword for input i's gradient: accumulate only when it does, so
        kernels called without it (and kernel sets that predate it) are unchanged."""
        return {"accumulate": True} if i in self.accumulate else {}


def param_accumulation(ctx) -> dict:
    """Kernel keyword for a chunk after the first: add its parameter gradients (a chunk of the
    batch, memory/chunking.py). Empty otherwise, so unchunked calls stay as they were."""
    if ctx.chunk is not None and not ctx.chunk.first:
        return {"accumulate_params": True}
    return {}
