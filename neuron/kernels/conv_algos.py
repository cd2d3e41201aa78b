"""Which cuDNN convolution algorithm runs, under how much workspace (SuperNeurons §3.5).

Per layer geometry (kind, shapes, stride/padding/dilation/groups, dtype, switches):

1. **Measure once, with the largest workspace that could be free.** The first time a geometry
   is seen, the executor's workspace request (:func:`conv2d_workspace_request`) asks for the
   whole largest free block of the arena; the kernel then runs cudnnFind*AlgorithmEx with that
   buffer, which times every algorithm whose workspace fits it (FFT and Winograd included) and
   writes the output operand (the real call overwrites it right after). Where the operands
   suit them, cuDNN's backend engine plans (cudnn_engines.py, what PyTorch's cudnn.benchmark
   picks from) are built too, and the plans and FindEx's algorithms are timed again by one
   clock (:func:`with_engines`). The answer is cached per geometry, with the workspace it was
   measured under.
2. **Then, at every step, the fastest measured algorithm whose workspace fits the largest free
   block now**: the request is exactly that algorithm's workspace, and the kernel, handed that
   workspace, picks the same algorithm from the same cache.

Algorithms that needed more than the measuring buffer were not timed. Where a later call has at
least twice that buffer free and cuDNN's heuristic list has an algorithm that needs more than
the measuring buffer and fits the new one, the geometry is measured again with the larger buffer
(:func:`wants_measurement`), so a measurement under a tight budget never holds back a later
unbudgeted run in the same process. Without a measurement (``conv_algo_search = "heuristic"``,
or no buffer of the full limit) the choice is cuDNN's heuristic ranking. With ``deterministic``
the choice is the first deterministic algorithm of the (reproducible) heuristic ranking under
the *planned* workspace (the im2col ceiling every device plans with), so that it does not depend
on the free memory of the moment, and two policies compute bit-identical results: the executor
asks for that algorithm's workspace even where less is free (the pool evicts for it).

A mixed-precision backward carves the low-type weight and bias gradient buffers from the front
of its workspace before the filter algorithm runs (low_grad_buffers.py): the request chooses
that algorithm for the bytes behind them and asks for the buffers on top.

Callers that accumulate into the output (beta = 1) use :func:`choose_accumulating`: the
measuring call overwrites the output operand, so it measures with a stand-in output in the
workspace instead.

The switches (``deterministic``, ``allow_tf32``, ``conv_algo_search``, ``trace_label``) are set
on :mod:`neuron.kernels.cuda`, their public home, which keeps them in cuda_switches.py; this
module reads them there at call time.
"""
from __future__ import annotations

import functools
from collections import deque
from typing import NamedTuple

import numpy as np

from . import cuda_switches
from . import cudnn as dnn
from . import low_grad_buffers, numpy_ref
from .channels_last import channels_last_strides, nhwc_filter
from .numpy_ref import _pair, conv2d_out_hw


class ConvAlgoError(RuntimeError):
    """No cuDNN algorithm can run this convolution within the workspace bytes available."""


class ConvChoice(NamedTuple):
    algo: int | str      # a legacy algorithm, or an engine plan's name
    memory: int          # workspace bytes the algorithm needs
    math_type: int       # what to set on the convolution descriptor before running it
    time: float          # ms (FindEx); -1 for heuristic choices
    source: str          # "find", "find-cached", "heuristic"
    plan: object = None  # a cudnn_engines.EnginePlan to run instead of a legacy algorithm


class EnginePerf(NamedTuple):
    """A backend engine plan as one more row of a perf list (what pick_algo reads)."""
    algo: str            # the plan's name
    status: int
    time: float          # ms, CUDA events (cudnn_engines.time_calls)
    memory: int
    determinism: int
    math_type: int       # unused: a plan carries its own
    plan: object


class ConvAlgoRecord(NamedTuple):
    label: str | None    # trace_label at the time (the executor's step/layer name)
    key: str             # kind and geometry: the "layer key"
    kind: str            # fwd | bwd_data | bwd_filter
    algo: int
    algo_name: str
    workspace_bytes: int
    limit_bytes: int
    source: str
    geometry: tuple = ()     # the full key (switches included): which measurement it used


#: one record per convolution call, for the memory trace (bounded: a long run keeps the latest)
conv_algo_trace: deque = deque(maxlen=1 << 16)

_measured: dict = {}        # geometry key -> ([AlgoPerf/EnginePerf] timed, workspace it had)
_heuristic: dict = {}       # geometry key -> [AlgoPerf] from Get*_v7
#: geometry key -> why its backend engines were not timed (the kit reports these)
engine_skips: dict = {}


def clear_conv_algo_cache() -> None:
    _measured.clear()
    _heuristic.clear()
    engine_skips.clear()
    conv_algo_trace.clear()


def measured(key):
    """(perfs, workspace bytes measured under) for a geometry key, or None."""
    return _measured.get(key)


def workspace_bucket(limit_bytes: int) -> int:
    """The power-of-two bucket of a byte limit: the largest 2**k <= limit (0 for 0). Kept for
    reports that group limits; the choice itself no longer depends on buckets."""
    limit_bytes = int(limit_bytes)
    if limit_bytes <= 0:
        return 0
    return 1 << (limit_bytes.bit_length() - 1)


def pick_algo(perfs, limit_bytes: int, *, deterministic: bool = False, by_time: bool = True,
              plans: bool = True):
    """The best usable entry of a cuDNN perf list (AlgoPerf-like: algo, status, time, memory,
    determinism), or None.

    Usable: status SUCCESS, workspace <= limit, deterministic when asked, and a legacy
    algorithm unless ``plans`` (engine plans compute with beta = 0). Best: the fastest
    measured (ties: less workspace) when ``by_time``; otherwise the first in the given order,
    which for the heuristics is cuDNN's own ranking."""
    ok = [p for p in perfs
          if p.status == dnn.CUDNN_STATUS_SUCCESS and 0 <= p.memory <= limit_bytes
          and (not deterministic or p.determinism == dnn.CUDNN_DETERMINISTIC)
          and (plans or getattr(p, "plan", None) is None)]
    if not ok:
        return None
    if by_time:
        return min(ok, key=lambda p: (p.time, p.memory))
    return ok[0]


def math_type(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        # DEFAULT permits TF32 on Ampere and later; FMA forbids it (what torch does when
        # allow_tf32 is off)
        return dnn.CUDNN_DEFAULT_MATH if cuda_switches.allow_tf32 else dnn.CUDNN_FMA_MATH
    if dtype.itemsize == 2 and dtype.name in ("float16", "bfloat16"):
        return dnn.CUDNN_TENSOR_OP_MATH         # mixed precision: tensor cores, float compute
    return dnn.CUDNN_DEFAULT_MATH


def choose_accumulating(kind, key, xd, wd, cd, yd, limit, ptrs, out_index, out_nbytes,
                        ws) -> ConvChoice:
    """:func:`choose` for a call that adds into its output (beta = 1). FindEx writes the output
    operand, which holds a partial sum, so an unmeasured geometry is measured with a stand-in
    output carved from the front of the workspace (when the workspace holds it and more), the
    rest of the workspace timing the algorithms; the choice is then made under the whole
    workspace from that measurement. ``ptrs`` in forward naming (x, w, y); ``out_index`` is the
    output's place in it (bwd_data: 0, bwd_filter: 1)."""
    if ws[1] > 0 and wants_measurement(key, ws[1]):
        head = -(-int(out_nbytes) // _WS_ALIGN) * _WS_ALIGN
        if ws[1] > head and wants_measurement(key, ws[1] - head):
            stand_in = list(ptrs)
            stand_in[out_index] = ws[0]
            rest = (ws[0] + head, ws[1] - head)
            choose(kind, key, xd, wd, cd, yd, rest[1], tuple(stand_in), rest)
    return choose(kind, key, xd, wd, cd, yd, limit, None, ws, plans=False)


def conv_geometry_key(kind, x_shape, w_shape, stride, padding, dilation, groups, dtype,
                      layout: str = "nchw") -> tuple:
    """The key of a convolution's algorithm choice; ``layout`` "nhwc" (channels-last maps and
    K, R, S, C filters: memory/layout.py) is a geometry of its own, with algorithms of its own."""
    key = (kind, tuple(int(s) for s in x_shape), tuple(int(s) for s in w_shape),
           _pair(stride), _pair(padding), _pair(dilation), int(groups), np.dtype(dtype).str,
           bool(cuda_switches.deterministic), bool(cuda_switches.allow_tf32))
    return key if layout == "nchw" else key + (layout,)


@functools.lru_cache(maxsize=4096)      # every traced call formats its key
def key_text(key) -> str:
    kind, xs, ws, st, pd, dl, g, dt = key[:8]
    return (f"{kind} x{list(xs)} w{list(ws)} s{list(st)} p{list(pd)} d{list(dl)} g{g} "
            f"{np.dtype(dt).name}" + "".join(f" {e}" for e in key[10:]))


def _searching() -> bool:
    return cuda_switches.conv_algo_search == "find" and not cuda_switches.deterministic


#: a new measurement needs at least this many times the last one's workspace
REMEASURE_FACTOR = 2


def wants_measurement(key, limit: int) -> bool:
    """Whether a call of this geometry with ``limit`` bytes free should measure (FindEx): never
    measured, or measured under less than half of ``limit`` while cuDNN lists an algorithm
    that needs more than that measurement had and fits ``limit``."""
    if not _searching():
        return False
    rec = _measured.get(key)
    if rec is None:
        return True
    perfs, ws = rec
    if limit < REMEASURE_FACTOR * ws:
        return False
    timed = {p.algo for p in perfs if p.status == dnn.CUDNN_STATUS_SUCCESS and p.time >= 0}
    return any(p.status == dnn.CUDNN_STATUS_SUCCESS and ws < p.memory <= limit
               and p.algo not in timed for p in _heuristic.get(key, ()))


def choose(kind, key, xd, wd, cd, yd, limit, ptrs=None, ws=(0, 0), *,
           plans: bool = True) -> ConvChoice:
    """The algorithm for one call under ``limit`` workspace bytes (see the module docstring).
    ``ptrs`` = (x, w, y) device pointers in forward naming and ``ws`` = (pointer, bytes) of the
    workspace: with both, an unmeasured geometry is measured now, its engine plans too where
    ``plans`` (operands packed and aligned) and ``cuda_switches.conv_engines``; a chosen plan
    is in the answer's ``plan``."""
    det = bool(cuda_switches.deterministic)
    mt = math_type(xd.dtype)
    cd.set_math_type(mt)
    h = dnn.get_handle()
    best, source, perfs = None, "heuristic", None
    if _searching():
        rec = _measured.get(key)
        source = "find-cached"
        if ptrs is not None and ws[1] > 0 and ws[1] >= limit and wants_measurement(key, limit):
            x_ptr, w_ptr, y_ptr = ptrs
            perfs = dnn.find_algorithms(h, kind, xd, x_ptr, wd, w_ptr, cd, yd, y_ptr, ws[0],
                                        ws[1])
            if plans and cuda_switches.conv_engines:
                perfs = with_engines(h, kind, key, (xd, wd, cd, yd), ptrs, ws, perfs, mt)
            rec = _measured[key] = (perfs, ws[1])
            if key not in _heuristic:   # what a larger workspace would admit (wants_measurement)
                _heuristic[key] = dnn.get_algorithms(h, kind, xd, wd, cd, yd)
            source = "find"
        if rec is not None:
            perfs = rec[0]
            best = pick_algo(perfs, limit, by_time=True, plans=plans)
    if best is None:
        perfs = _heuristic.get(key)
        if perfs is None:
            perfs = _heuristic[key] = dnn.get_algorithms(h, kind, xd, wd, cd, yd)
        source = "heuristic"
        best = pick_algo(perfs, limit, deterministic=det, by_time=False)
    if best is None:
        listing = ", ".join(f"{dnn.ALGO_NAMES[kind].get(p.algo, p.algo)}: "
                            f"{p.memory if p.status == 0 else 'unsupported'}" for p in perfs)
        raise ConvAlgoError(f"{key_text(key)}: no {'deterministic ' if det else ''}"
                            f"cuDNN algorithm fits a workspace of {limit} bytes "
                            f"(workspace per algorithm: {listing})")
    # with TF32 off, run under FMA math whatever the perf row says (DEFAULT would allow TF32)
    run_math = mt if mt == dnn.CUDNN_FMA_MATH else best.math_type
    return ConvChoice(best.algo, best.memory, run_math,
                      best.time if source != "heuristic" else -1.0, source,
                      getattr(best, "plan", None))


#: FindEx's fastest rows timed again beside the engine plans
LEGACY_RETIMED = 3


def with_engines(h, kind, key, descs, ptrs, ws, perfs, mt) -> list:
    """FindEx's rows and the geometry's backend engine plans that fit the workspace ``ws`` =
    (pointer, bytes), FindEx's fastest few and the plans timed by one clock
    (cudnn_engines.time_calls: CUDA events around the same runs on the operands at ``ptrs``),
    so that the fastest is chosen like with like.
    Never fails the step: where cuDNN cannot build or run the plans the reason is kept in
    :data:`engine_skips` and FindEx's rows are returned as they were."""
    xd, wd, cd, yd = descs
    _, x_shape, w_shape, stride, padding, dilation = key[:6]
    n, _, hh, ww = x_shape
    ho, wo = conv2d_out_hw(hh, ww, w_shape[2], w_shape[3], stride, padding, dilation)
    # FindEx's fastest few (the rest cannot win, and every timing costs the first step time)
    legacy = sorted((p for p in perfs if p.status == dnn.CUDNN_STATUS_SUCCESS and p.time >= 0
                     and 0 <= p.memory <= ws[1]), key=lambda p: p.time)[:LEGACY_RETIMED]
    try:
        plans, skipped = dnn.conv_engine_plans(
            h, kind, x_shape, w_shape, (n, w_shape[0], ho, wo), padding, stride, dilation,
            np.dtype(xd.dtype), tf32=bool(cuda_switches.allow_tf32), limit_bytes=ws[1],
            layout=key[10] if len(key) > 10 else "nchw")
        if not plans:
            engine_skips[key] = "; ".join(skipped) or "cuDNN's heuristics listed no engine"
            return perfs
        calls = [_legacy_run(h, kind, descs, ptrs, ws, p.algo,
                             mt if mt == dnn.CUDNN_FMA_MATH else p.math_type) for p in legacy]
        calls += [_plan_run(h, plan, ptrs, ws) for plan in plans]
        times = dnn.time_calls(calls)
    except Exception as e:      # noqa: BLE001 - an engine problem must not fail the step
        engine_skips[key] = f"{type(e).__name__}: {e}"
        return perfs
    retimed = {id(p): t for p, t in zip(legacy, times)}
    rows = [p._replace(time=float(retimed[id(p)])) if id(p) in retimed else p for p in perfs]
    return rows + [EnginePerf(p.name, dnn.CUDNN_STATUS_SUCCESS if t != float("inf") else -1,
                              float(t), p.workspace, dnn.CUDNN_DETERMINISTIC if p.deterministic
                              else dnn.CUDNN_NON_DETERMINISTIC, -1, p)
                   for p, t in zip(plans, times[len(legacy):])]


def _legacy_run(h, kind, descs, ptrs, ws, algo, math):
    """One legacy call as FindEx ran it (beta = 0), for :func:`with_engines`' clock."""
    xd, wd, cd, yd = descs
    x, w, y = ptrs

    def run():
        cd.set_math_type(math)
        if kind == "fwd":
            dnn.convolution_forward(h, xd, x, wd, w, cd, algo, ws[0], ws[1], yd, y)
        elif kind == "bwd_data":
            dnn.convolution_backward_data(h, wd, w, yd, y, cd, algo, ws[0], ws[1], xd, x)
        else:
            dnn.convolution_backward_filter(h, xd, x, yd, y, cd, algo, ws[0], ws[1], wd, w)
    run.plan = None
    return run


def _plan_run(h, plan, ptrs, ws):
    def run():
        dnn.run_conv_plan(h, plan, ptrs, ws[0])
    run.plan = plan
    return run


def choice_report(records=None) -> list[dict]:
    """Per geometry and kind (the latest call of each in ``records``, default the trace): the
    algorithm that ran and its FindEx time, the fastest algorithm FindEx timed at all and its
    time and workspace, and the workspace limit of that call. Where ``fastest_ms`` is below
    ``chosen_ms`` the free block, not the measurement, decided; where both are slow against
    PyTorch's kernels the legacy algorithm set is the limit (the GPU kit prints this)."""
    latest = {}
    for r in (conv_algo_trace if records is None else records):
        latest[(r.key, r.kind)] = r
    out = []
    for (text, kind), r in latest.items():
        perfs = (_measured.get(r.geometry) or ((),))[0]
        timed = [p for p in perfs if p.status == dnn.CUDNN_STATUS_SUCCESS and p.time >= 0]
        chosen = next((p for p in timed if p.algo == r.algo), None)
        best = min(timed, key=lambda p: (p.time, p.memory)) if timed else None
        legacy = [p.time for p in timed if getattr(p, "plan", None) is None]
        plans = [p.time for p in timed if getattr(p, "plan", None) is not None]
        out.append({
            # the fastest of each set, by one clock where engines were timed (with_engines)
            "legacy_fastest_ms": round(float(min(legacy)), 4) if legacy else None,
            "engine_fastest_ms": round(float(min(plans)), 4) if plans else None,
            "key": text, "kind": kind, "algo": r.algo_name, "source": r.source,
            "chosen_ms": None if chosen is None else round(float(chosen.time), 4),
            "fastest": None if best is None else dnn.ALGO_NAMES[kind].get(best.algo,
                                                                          str(best.algo)),
            "fastest_ms": None if best is None else round(float(best.time), 4),
            "fastest_workspace_bytes": None if best is None else int(best.memory),
            "workspace_bytes": r.workspace_bytes, "limit_bytes": r.limit_bytes})
    return out


def _record(kind, key, choice, limit):
    conv_algo_trace.append(ConvAlgoRecord(
        cuda_switches.trace_label, key_text(key), kind, choice.algo,
        dnn.ALGO_NAMES[kind].get(choice.algo, str(choice.algo)), choice.memory, limit,
        choice.source, key))


def filter_format(w, x) -> int:
    """cuDNN's filter format of weight array ``w`` convolved with ``x``: NHWC for channels-last
    (K, R, S, C) weights, and for a 1x1 filter (the same bytes in both) of a channels-last x."""
    return dnn.CUDNN_TENSOR_NHWC if nhwc_filter(w, x) else dnn.CUDNN_TENSOR_NCHW


def _descriptors(x_shape, w_shape, stride, padding, dilation, dtype, layout="nchw"):
    n, _, hh, ww = x_shape
    kk, _, kh, kw = w_shape
    ho, wo = conv2d_out_hw(hh, ww, kh, kw, stride, padding, dilation)
    y_shape = (n, kk, ho, wo)
    if layout == "nhwc":
        item = np.dtype(dtype).itemsize
        return (dnn.tensor_descriptor(x_shape, dtype, channels_last_strides(x_shape, item)),
                dnn.filter_descriptor(w_shape, dtype, dnn.CUDNN_TENSOR_NHWC),
                dnn.tensor_descriptor(y_shape, dtype, channels_last_strides(y_shape, item)))
    return (dnn.tensor_descriptor(x_shape, dtype), dnn.filter_descriptor(w_shape, dtype),
            dnn.tensor_descriptor(y_shape, dtype))


def choose_conv_algo(kind, x_shape, w_shape, stride, padding, dilation, groups, dtype,
                     limit_bytes, *, arrays=None, workspace=None, record=True,
                     layout: str = "nchw") -> ConvChoice:
    """The convolution algorithm for this geometry under ``limit_bytes`` of workspace.

    ``kind`` is "fwd", "bwd_data" or "bwd_filter"; shapes are those of the forward convolution's
    x and w. To measure, pass ``arrays`` = (x, w, y) (for bwd_data: (dx, w, dy), for
    bwd_filter: (x, dw, dy); FindEx writes the output operand) and ``workspace`` (a uint8 device
    array of at least limit bytes). Without them, the cached measurement if any, else cuDNN's
    heuristic ranking. ``layout``: "nhwc" for channels-last maps and filters (with ``arrays``,
    read off the filter array)."""
    dtype = np.dtype(dtype)
    limit = max(0, int(limit_bytes))
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if arrays is not None:
        a, b, c = arrays
        fmt = filter_format(b, a)
        layout = "nhwc" if fmt == dnn.CUDNN_TENSOR_NHWC else "nchw"
        xd, wd, yd = (dnn.tensor_descriptor(a.shape, a.dtype, a.strides),
                      dnn.filter_descriptor(b.shape, b.dtype, fmt),
                      dnn.tensor_descriptor(c.shape, c.dtype, c.strides))
        ptrs = (a.data.ptr, b.data.ptr, c.data.ptr)
    else:
        xd, wd, yd = _descriptors(x_shape, w_shape, stride, padding, dilation, dtype, layout)
        ptrs = None
    key = conv_geometry_key(kind, x_shape, w_shape, stride, padding, dilation, groups, dtype,
                            layout)
    cd = dnn.convolution_descriptor(padding, stride, dilation, groups, dtype)
    ws = aligned_workspace(workspace)
    if workspace is not None:
        limit = min(limit, ws[1])
    choice = choose(kind, key, xd, wd, cd, yd, limit, ptrs, ws)
    if record:
        _record(kind, key, choice, limit)
    return choice


def conv2d_workspace_request(phase, x_shape, w_shape, stride, padding, dilation, groups, dtype,
                             limit_bytes, layout: str = "nchw", bias: bool = False) -> int:
    """Workspace bytes for a conv step when ``limit_bytes`` are free in one block.

    An unmeasured geometry asks for all of ``limit_bytes`` (the kernel measures with it); a
    measured one for exactly the workspace of the fastest algorithm that fits. Deterministic
    mode asks for the planned ceiling (policy-independent; see the module docstring). Backward
    asks for the larger of the backward-data and backward-filter needs, the latter behind the
    low-type gradient buffers a mixed-precision backward carves first (low_grad_buffers.py;
    ``bias``: the layer has one): the filter algorithm is chosen for what is left after them,
    and they are asked for on top of its workspace."""
    dtype = np.dtype(dtype)
    limit = max(0, int(limit_bytes))
    kinds = ("fwd",) if phase == "F" else ("bwd_data", "bwd_filter")
    carve = low_grad_buffers.carved_bytes(w_shape, bias, dtype.itemsize) if phase != "F" else 0
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)

    def ahead(kind):            # bytes in front of the algorithm's workspace
        return carve if kind == "bwd_filter" else 0
    if cuda_switches.deterministic:
        # the algorithm depends on the geometry alone, never on what is free: its workspace is
        # asked for even when more than ``limit`` (the pool evicts for it, or the step fails
        # naming the bytes) so that every policy computes the same bits
        ceiling = numpy_ref.conv2d_workspace_bytes(
            x_shape, w_shape, stride, padding, dilation, groups, dtype.itemsize)
        return max(ahead(kind) + _deterministic_workspace(
            kind, x_shape, w_shape, stride, padding, dilation, groups, dtype, ceiling, layout)
            for kind in kinds)
    need = 0
    for kind in kinds:
        key = conv_geometry_key(kind, x_shape, w_shape, stride, padding, dilation, groups, dtype,
                                layout)
        free = max(0, limit - ahead(kind))
        if wants_measurement(key, free):
            return max(limit, ahead(kind))  # the kernel times every algorithm with all of it
        need = max(need, ahead(kind) + choose_conv_algo(
            kind, x_shape, w_shape, stride, padding, dilation, groups, dtype, free,
            record=False, layout=layout).memory)
    return need


def _deterministic_workspace(kind, x_shape, w_shape, stride, padding, dilation, groups, dtype,
                             ceiling, layout="nchw") -> int:
    """Workspace of the deterministic algorithm for a geometry: the first of cuDNN's heuristic
    ranking under the planned ceiling, else the deterministic one that needs least."""
    try:
        return choose_conv_algo(kind, x_shape, w_shape, stride, padding, dilation, groups,
                                dtype, ceiling, record=False, layout=layout).memory
    except ConvAlgoError:
        key = conv_geometry_key(kind, x_shape, w_shape, stride, padding, dilation, groups, dtype,
                                layout)
        perfs = _heuristic.get(key, ())
        det = [p.memory for p in perfs if p.status == dnn.CUDNN_STATUS_SUCCESS and p.memory >= 0
               and p.determinism == dnn.CUDNN_DETERMINISTIC]
        if not det:
            raise
        return min(det)


_WS_ALIGN = 256


def aligned_workspace(workspace) -> tuple[int, int]:
    """(pointer, usable bytes) of a uint8 workspace array, the pointer rounded up to 256 bytes
    (cuDNN kernels vectorize their workspace accesses). (0, 0) for None."""
    if workspace is None:
        return 0, 0
    return align_region(workspace.data.ptr, workspace.nbytes)


def align_region(ptr: int, nbytes: int, align: int = _WS_ALIGN) -> tuple[int, int]:
    shift = (-ptr) % align
    if nbytes <= shift:
        return 0, 0
    return ptr + shift, nbytes - shift


record = _record
