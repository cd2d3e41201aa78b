"""Convolutions on cuDNN's backend engines: the kernels PyTorch's cudnn.benchmark chooses from.

The legacy API (cudnn_ops.py) offers eight fixed algorithms per direction; cuDNN 9 has many
more engines and knob settings behind its backend (graph) API. For one convolution geometry
this module builds the one-operation graph, asks cuDNN's heuristics for its ranked engine
configurations, keeps those whose numerical notes the run allows, finalizes the first few as
execution plans (each knows its exact workspace), times them (:func:`time_calls`, CUDA
events) and runs a chosen one with the step's pointers (:func:`run_conv_plan`). conv_algos.py
decides between these plans and the legacy algorithms by measured time.

Pointer-level like cudnn_ops.py, so the CUDA stand-ins replace these three functions with NumPy
(tests/kernels/cuda_standins/cudnn_ops.py). A plan's operation has beta = 0: calls that add
into their output keep the legacy algorithms.
"""
from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from . import cudnn_api as api
from .channels_last import channels_last_strides
from .cudnn_api import call

#: the variant's tensor ids: the forward naming of the three operands (x, w, y)
UIDS = (ord("x"), ord("w"), ord("y"))
#: bytes every operand pointer (and the workspace) must be aligned to: declared to cuDNN
ALIGNMENT = 16
#: the heuristic's first configurations finalized and timed per geometry (PyTorch's
#: cudnn.benchmark_limit is 10; plans take time to finalize and to time, the first step pays
#: for it, and the heuristic's first ones usually win)
PLANS_PER_GEOMETRY = 4

_OPS = {  # kind -> (operation type, alpha, beta, conv, operand attributes in (x, w, y) order)
    "fwd": (api.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            api.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            api.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            api.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            (api.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
             api.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
             api.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y)),
    "bwd_data": (api.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                 api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                 api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                 api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                 (api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                  api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                  api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY)),
    "bwd_filter": (api.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                   api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                   api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                   api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                   (api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                    api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                    api.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY)),
}


class Descriptor:
    """One backend descriptor. Never destroyed: a plan keeps every descriptor it was built
    from (cuDNN does not reference-count them), and plans live as long as the process."""

    def __init__(self, kind: int):
        self.ptr = ctypes.c_void_p()
        call("cudnnBackendCreateDescriptor", kind, ctypes.byref(self.ptr))

    def set(self, attr: int, typ: int, values, ctype) -> "Descriptor":
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        arr = (ctype * len(values))(*values)
        call("cudnnBackendSetAttribute", self.ptr, attr, typ, len(values), arr)
        return self

    def set_descriptors(self, attr: int, descs) -> "Descriptor":
        return self.set(attr, api.CUDNN_TYPE_BACKEND_DESCRIPTOR, [d.ptr.value for d in descs],
                        ctypes.c_void_p)

    def finalize(self) -> "Descriptor":
        call("cudnnBackendFinalize", self.ptr)
        return self

    def get(self, attr: int, typ: int, ctype, count: int = 1) -> list:
        n = ctypes.c_int64(0)
        arr = (ctype * max(count, 1))()
        call("cudnnBackendGetAttribute", self.ptr, attr, typ, count, ctypes.byref(n), arr)
        return [arr[i] for i in range(min(int(n.value), count))]

    def count(self, attr: int, typ: int) -> int:
        n = ctypes.c_int64(0)
        call("cudnnBackendGetAttribute", self.ptr, attr, typ, 0, ctypes.byref(n), None)
        return int(n.value)


@dataclass
class EnginePlan:
    """A finalized execution plan for one convolution geometry and direction."""
    kind: str
    engine: int                 # cuDNN's global engine index
    workspace: int              # bytes it needs
    notes: tuple                # numerical notes (CUDNN_NUMERICAL_NOTE_*)
    position: int               # its rank in the heuristic's list
    deterministic: bool
    ptr: int = 0                # the execution plan descriptor
    _keep: list = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"engine{self.engine}#{self.position}"


def packed_strides(shape, layout: str = "nchw") -> tuple:
    """Element strides of a packed 4-d (N, C, H, W) array stored in ``layout``: C order, or
    channels-last ("nhwc": stored N, H, W, C; for a filter K, R, S, C)."""
    if layout == "nhwc":
        return channels_last_strides([int(s) for s in shape], 1)
    out, acc = [], 1
    for s in reversed(shape):
        out.insert(0, acc)
        acc *= max(int(s), 1)
    return tuple(out)


def _tensor(uid: int, shape, dtype, layout: str = "nchw") -> Descriptor:
    i64 = api.CUDNN_TYPE_INT64
    return (Descriptor(api.CUDNN_BACKEND_TENSOR_DESCRIPTOR)
            .set(api.CUDNN_ATTR_TENSOR_DATA_TYPE, api.CUDNN_TYPE_DATA_TYPE, api.data_type(dtype),
                 ctypes.c_int)
            .set(api.CUDNN_ATTR_TENSOR_DIMENSIONS, i64, [int(s) for s in shape], ctypes.c_int64)
            .set(api.CUDNN_ATTR_TENSOR_STRIDES, i64, packed_strides(shape, layout),
                 ctypes.c_int64)
            .set(api.CUDNN_ATTR_TENSOR_UNIQUE_ID, i64, uid, ctypes.c_int64)
            .set(api.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, i64, ALIGNMENT, ctypes.c_int64)
            .finalize())


def _convolution(padding, stride, dilation, dtype) -> Descriptor:
    i64 = api.CUDNN_TYPE_INT64
    return (Descriptor(api.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
            .set(api.CUDNN_ATTR_CONVOLUTION_COMP_TYPE, api.CUDNN_TYPE_DATA_TYPE,
                 api.compute_type(dtype), ctypes.c_int)
            .set(api.CUDNN_ATTR_CONVOLUTION_CONV_MODE, api.CUDNN_TYPE_CONVOLUTION_MODE,
                 api.CUDNN_CROSS_CORRELATION, ctypes.c_int)
            .set(api.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, i64, 2, ctypes.c_int64)
            .set(api.CUDNN_ATTR_CONVOLUTION_DILATIONS, i64, dilation, ctypes.c_int64)
            .set(api.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, i64, stride, ctypes.c_int64)
            .set(api.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, i64, padding, ctypes.c_int64)
            .set(api.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, i64, padding, ctypes.c_int64)
            .finalize())


def conv_operation(kind, x_shape, w_shape, y_shape, padding, stride, dilation, dtype,
                   layout: str = "nchw"):
    """The finalized operation descriptor and everything it was built from (no handle needed:
    a CPU test builds it against the real library). ``layout`` "nhwc": every operand stored
    channels-last (--layout nhwc)."""
    op_type, alpha, beta, conv_attr, operands = _OPS[kind]
    tensors = [_tensor(uid, shape, dtype, layout)
               for uid, shape in zip(UIDS, (x_shape, w_shape, y_shape))]
    conv = _convolution(padding, stride, dilation, dtype)
    double = np.dtype(dtype) == np.float64
    typ, ctype = ((api.CUDNN_TYPE_DOUBLE, ctypes.c_double) if double
                  else (api.CUDNN_TYPE_FLOAT, ctypes.c_float))
    op = (Descriptor(op_type).set(alpha, typ, 1.0, ctype).set(beta, typ, 0.0, ctype)
          .set_descriptors(conv_attr, [conv]))
    for attr, t in zip(operands, tensors):
        op.set_descriptors(attr, [t])
    return op.finalize(), [*tensors, conv]


def allowed(notes, behaviour, dtype, tf32: bool, deterministic: bool) -> bool:
    """Whether an engine's notes fit the run, as PyTorch filters them: never inputs converted
    down, no TF32 tensor cores for float32 unless allowed, float accumulation for the 2-byte
    types, no nondeterminism when asked, and no engine compiled at run time (seconds each)."""
    dtype = np.dtype(dtype)
    if api.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS in notes:
        return False
    if dtype == np.float32 and not tf32 and api.CUDNN_NUMERICAL_NOTE_TENSOR_CORE in notes:
        return False
    if dtype.itemsize == 2 and api.CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION in notes:
        return False
    if deterministic and api.CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC in notes:
        return False
    return api.CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION not in behaviour


def conv_engine_plans(handle, kind, x_shape, w_shape, y_shape, padding, stride, dilation, dtype,
                      *, tf32: bool = False, deterministic: bool = False, limit_bytes: int,
                      count: int = PLANS_PER_GEOMETRY,
                      layout: str = "nchw") -> tuple[list, list]:
    """(plans, skipped): up to ``count`` execution plans in the heuristic's order whose notes
    fit the run and whose workspace fits ``limit_bytes``; ``skipped`` says why others were
    left out ("engine N: reason"). Shapes are the forward convolution's x, w, y (logical
    N, C, H, W), stored in ``layout``."""
    op, keep = conv_operation(kind, x_shape, w_shape, y_shape, padding, stride, dilation, dtype,
                              layout)
    h = handle.ptr                  # a cudnn_descriptors.Handle
    bd = api.CUDNN_TYPE_BACKEND_DESCRIPTOR
    graph = (Descriptor(api.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
             .set(api.CUDNN_ATTR_OPERATIONGRAPH_HANDLE, api.CUDNN_TYPE_HANDLE, h.value,
                  ctypes.c_void_p)
             .set_descriptors(api.CUDNN_ATTR_OPERATIONGRAPH_OPS, [op]).finalize())
    heur = (Descriptor(api.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)
            .set_descriptors(api.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, [graph])
            .set(api.CUDNN_ATTR_ENGINEHEUR_MODE, api.CUDNN_TYPE_HEUR_MODE,
                 api.CUDNN_HEUR_MODE_A, ctypes.c_int).finalize())
    n = heur.count(api.CUDNN_ATTR_ENGINEHEUR_RESULTS, bd)
    cfgs = [Descriptor(api.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) for _ in range(n)]
    arr = (ctypes.c_void_p * max(n, 1))(*[c.ptr.value for c in cfgs])
    got = ctypes.c_int64(0)
    call("cudnnBackendGetAttribute", heur.ptr, api.CUDNN_ATTR_ENGINEHEUR_RESULTS, bd, n,
         ctypes.byref(got), arr)
    plans, skipped = [], []
    for position, cfg in enumerate(cfgs[:int(got.value)]):
        if len(plans) >= count:
            break
        engine = Descriptor(api.CUDNN_BACKEND_ENGINE_DESCRIPTOR)
        call("cudnnBackendGetAttribute", cfg.ptr, api.CUDNN_ATTR_ENGINECFG_ENGINE, bd, 1,
             ctypes.byref(got), ctypes.byref(engine.ptr))
        index = engine.get(api.CUDNN_ATTR_ENGINE_GLOBAL_INDEX, api.CUDNN_TYPE_INT64,
                           ctypes.c_int64)[0]
        notes = tuple(engine.get(api.CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 api.CUDNN_TYPE_NUMERICAL_NOTE, ctypes.c_int, 16))
        behaviour = tuple(engine.get(api.CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                                     api.CUDNN_TYPE_BEHAVIOR_NOTE, ctypes.c_int, 16))
        if not allowed(notes, behaviour, dtype, tf32, deterministic):
            skipped.append(f"engine {index}: notes {notes} / {behaviour} not allowed")
            continue
        try:
            plan = (Descriptor(api.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
                    .set(api.CUDNN_ATTR_EXECUTION_PLAN_HANDLE, api.CUDNN_TYPE_HANDLE, h.value,
                         ctypes.c_void_p)
                    .set_descriptors(api.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, [cfg])
                    .finalize())
        except api.CudnnError as e:         # a configuration this geometry cannot run
            skipped.append(f"engine {index}: {e.message}")
            continue
        ws = plan.get(api.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, api.CUDNN_TYPE_INT64,
                      ctypes.c_int64)[0]
        if ws > limit_bytes:
            skipped.append(f"engine {index}: workspace {ws} > {limit_bytes} bytes")
            continue
        plans.append(EnginePlan(kind, int(index), int(ws), notes, position,
                                api.CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC not in notes,
                                plan.ptr.value, [plan, cfg, engine, heur, graph, op, *keep]))
    return plans, skipped


#: variant packs by (plan, pointers, workspace): a replayed step passes the same ones
_packs: OrderedDict = OrderedDict()
_PACKS_KEPT = 4096


def _variant_pack(ptrs, ws_ptr: int) -> Descriptor:
    key = (tuple(int(p) for p in ptrs), int(ws_ptr))
    vp = _packs.get(key)
    if vp is not None:
        _packs.move_to_end(key)
        return vp
    vp = (Descriptor(api.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
          .set(api.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, api.CUDNN_TYPE_INT64, UIDS,
               ctypes.c_int64)
          .set(api.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, api.CUDNN_TYPE_VOID_PTR,
               [int(p) for p in ptrs], ctypes.c_void_p)
          .set(api.CUDNN_ATTR_VARIANT_PACK_WORKSPACE, api.CUDNN_TYPE_VOID_PTR, int(ws_ptr) or None,
               ctypes.c_void_p)
          .finalize())
    _packs[key] = vp
    if len(_packs) > _PACKS_KEPT:
        old = _packs.popitem(last=False)[1]
        call("cudnnBackendDestroyDescriptor", old.ptr)
    return vp


def run_conv_plan(handle, plan: EnginePlan, ptrs, ws_ptr: int) -> None:
    """Run ``plan`` on the handle's stream: ``ptrs`` = (x, w, y) device pointers in forward
    naming (bwd_data: dx, w, dy; bwd_filter: x, dw, dy), the workspace at ``ws_ptr``."""
    vp = _variant_pack(ptrs, ws_ptr)
    call("cudnnBackendExecute", handle.ptr, ctypes.c_void_p(plan.ptr), vp.ptr)


def time_calls(calls, runs: int = 2) -> list[float]:
    """Milliseconds per run of each zero-argument GPU call (one warm-up run, then the mean of
    ``runs`` between CUDA events on the current stream, which the handle is bound to); inf
    where one fails. One clock for plans and legacy algorithms alike (conv_algos)."""
    import cupy                     # the GPU only: the stand-ins have their own
    stream = cupy.cuda.get_current_stream()
    out = []
    for run in calls:
        try:
            run()
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(runs):
                run()
            stop.record(stream)
            stop.synchronize()
            out.append(cupy.cuda.get_elapsed_time(start, stop) / runs)
        except api.CudnnError:
            out.append(float("inf"))
    return out
