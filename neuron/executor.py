"""The executor: runs one iteration's steps on a device through the pool.

Before a step: allocate what it writes (and a workspace). Run the layer's kernel (unless the
device is virtual). After: free what died, record the memory trace. The same code runs on a
VirtualDevice for planning, so a plan's peak is the real run's peak by construction.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from .devices import Device, VirtualDevice, make_device
from .errors import DataError, MemoryBudgetError, NonFiniteLossError, NonFiniteUpdateError
from .fuse import fuse_graph
from .graph import Graph
from .layers.base import Context
from .layers.loss import LossSum, loss_value
from .distributed.overlap import after_step, due_updates
from .memory.liveness import frees_for
from .memory.policy import Policy, get_policy
from .memory.prefetch_horizon import PrefetchHorizon, prefetch_ahead_arg
from .memory.evict_ahead import EvictionRecorder
from .memory.pool import Pool
from .memory.recompute import plan_recompute
from .memory.chunking import build_chunked_schedule, logits_chunks
from .memory.costmodel import planning_cost
from .memory.schedule import Schedule
from .memory.tensors import Kind
from .optim import SGD
from .precision import Precision, get_precision, is_real_float
from .precision.loss_scale import GOOD_STEPS_KEY, SCALE_KEY, GradientOverflow, LossScaler
from .precision import mixed_cpu
from .memory.layout import TO_LOGICAL, apply_layout, get_layout, storage_shape
from .sizes import byte_size_arg, size_arg
from .training_graph import LOSSES, feed, nonfinite_input, with_loss  # noqa: F401 (with_loss: public here too)
from .interrupt import signals_deferred
from .recording import TapeDiverged, per_iteration
from .replay import MODES as REPLAY_MODES, Replay
from .undo import UndoRecord

VIRTUAL_ARENA = 1 << 40          # 1 TiB: "unbounded" for planning


@contextlib.contextmanager
def no_gc():
    """Planning creates ~10^5 small acyclic objects; the cyclic GC rescanning them triples the
    time of a 10^4-layer plan, and there is nothing for it to collect."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class TraceRow:
    step: int
    layer: str
    phase: str
    bytes_in_use: int
    live_tensors: int
    workspace_bytes: int = 0        # what the step's kernel got (Figure 12: conv workspace)
    peak_bytes: int = 0             # the most in use at any moment of the step (bytes_in_use
                                    # is after its frees)

    def as_dict(self):
        return dict(step=self.step, layer=self.layer, phase=self.phase,
                    bytes_in_use=self.bytes_in_use, live_tensors=self.live_tensors,
                    workspace_bytes=self.workspace_bytes, peak_bytes=self.peak_bytes)


class Executor:
    """Trains a graph on a device under a memory policy.

    policy: baseline | liveness | offload | recompute | superneurons (see memory/policy.py).
    offload_params: parameters and optimizer state live on the host between uses and are
    brought into the arena for their layer's steps (beyond the paper: depth is then no longer
    capped by parameter bytes). ``resident_params``: bytes of those blocks (the last layers'
    first) that stay in the arena all the same, where the plan leaves it room: they move no
    bytes.
    planner: a name from memory/planners (or a Planner): its decisions for ``budget`` (the
    steps, eager offloads, look-ahead prefetches) replace the policy's plan; ``cost`` is the
    memory.costmodel.CostModel it plans with (default: analytic H100).
    chunks: every layer's step split along the batch into this many chunk steps
    (memory/chunking.py; the policy's recompute is then off, a planner's works per chunk).
    grad_buckets: bytes per gradient bucket; set, each bucket's updates are deferred to a later
    backward step so its all-reduce overlaps backward (distributed/overlap.py). None: at once.
    grad_lag: with grad_buckets, how many backward steps later (None: overlap.DEFAULT_LAG).
    replay: "off" (every iteration runs the executor), "tape" (the planned iteration is recorded
    once and its device operations replayed, neuron/tape.py), "graph" (the tape as one CUDA
    graph); None: the device's (tape on the CPU, graph on a GPU). The bits of "off" (on a GPU
    with deterministic algorithms: otherwise eager runs differ among themselves too).
    precision: fp32 | tf32 | bf16 | fp16 (neuron/precision): which tensors are stored in a 2-byte
    type; ``dtype`` stays the master dtype (parameters, optimizer state, statistics). fp16
    trains with dynamic loss scaling (``loss_scaler``, precision/loss_scale.py).
    layout: "nchw" (default) or "nhwc": how 4-d feature maps and convolution weights are stored
    (memory/layout.py). Shapes, planned bytes and checkpoints are the same in both; under nhwc
    the kernels get channels-last views (cuDNN's tensor-core convolutions want them).
    prefetch_ahead: how many steps ahead tensors on the host are prefetched (1: the next
    step's reads, as the SuperNeurons runtime does; N: up to N steps, as far as the arena's
    free bytes allow without any step before the reader evicting), or "auto": as far as that
    and the plan's clock (``cost``, else the device's analytic model) say the copy needs
    (memory/prefetch_horizon.py).
    evict_ahead: the LRU cache's evictions copied to the host ahead, on the schedule of the
    iteration before (memory/evict_ahead.py: right after each evicted tensor's last use, so the
    copy runs under compute); the same evictions, moves and bits as without. Off under a host
    budget (early copies hold host buffers longer than the plan's).
    fuse: every BatchNorm or Add whose only reader is a ReLU runs fused with it as one BNReLU
    or AddReLU layer (neuron/fuse.py): fewer passes over the feature maps, and neither the
    first layer's output nor its gradient is a tensor. Same parameter names (checkpoints load
    either way); ``fused`` lists the pairs.
    _alias_gradients: False gives every Add input a gradient tensor of its own (a copy), as
    the baseline policy always does (memory/aliasing.py); for tests that compare the two.
    """

    def __init__(self, graph: Graph, batch: int, *, device: str | Device = "cpu",
                 optimizer: SGD | None = None, policy: str | Policy = "liveness",
                 dtype=np.float32, seed: int = 0, budget: int | None = None,
                 offload_params: bool = False, recompute_strategy: str = "cost",
                 host_budget: int | None = None, tensor_cache: bool = True,
                 compact: bool | None = None, chunks: int = 1,
                 block: int = 1024, strategy: str = "first_fit", planner=None, cost=None,
                 loss: str = "softmax", grad_buckets: int | None = None,
                 grad_lag: int | None = None, replay: str | None = None,
                 precision: str | Precision | None = None, prefetch_ahead: int | str = 1,
                 evict_ahead: bool = True, layout: str | None = None, fuse: bool = False,
                 resident_params: int | str | None = None,
                 _plan_from=None, _alias_gradients: bool = True):
        if size_arg(batch, "batch", "Executor") <= 0:
            raise ValueError(f"Executor: batch must be positive, got {batch}")
        budget = byte_size_arg(budget, "budget", "Executor")          # 64MiB or bytes
        host_budget = byte_size_arg(host_budget, "host_budget", "Executor")
        chunks, seed = size_arg(chunks, "chunks", "Executor"), size_arg(seed, "seed", "Executor")
        # None: "auto"; set before planning, which simulates with it
        self.prefetch_ahead = prefetch_ahead_arg(prefetch_ahead, "Executor")
        self._horizons: dict = {}           # id(frees) -> (frees, its PrefetchHorizon)
        self.evict_ahead = bool(evict_ahead)
        self._evict_schedule = None         # the last iteration's evictions (evict_ahead.py)
        if not isinstance(fuse, bool):
            raise TypeError(f"Executor: fuse must be True or False, got {fuse!r}")
        if fuse:
            graph = fuse_graph(graph)
        self.fuse = fuse
        self.fused = list(getattr(graph, "fused", [])) if fuse else []
        self.graph = graph
        if loss not in LOSSES:
            raise ValueError(f"Executor: loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        self.loss = loss            # "softmax" (integer labels) or "mse" (float targets)
        self.batch, self.dtype, self.seed = int(batch), np.dtype(dtype), int(seed)
        self.precision = get_precision(precision)
        # what feature maps, their gradients and convolution workspaces are stored in
        self.feature_dtype = self.precision.feature_dtype(self.dtype)
        self.loss_scaler = LossScaler() if self.precision.loss_scaling else None
        self.layout = get_layout(layout)
        self.optimizer = optimizer or SGD()
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.offload_params = bool(offload_params)
        self.resident_params = byte_size_arg(resident_params, "resident_params", "Executor")
        if self.resident_params and not self.offload_params:
            raise ValueError("Executor: resident_params keeps some offloaded parameter blocks in "
                             "the arena; it needs offload_params=True")
        self._host_ids: frozenset | None = None     # the blocks on the host between uses
        self._written: dict = {}            # step -> the persistent blocks it writes
        self.recompute_strategy = recompute_strategy
        self.host_budget = host_budget
        # without the LRU tensor cache (vDNN-style, Table 3's baseline), every activation that
        # backward needs is offloaded right after its last forward use
        self.tensor_cache = bool(tensor_cache)
        # compaction defaults to the policy's (on for all but baseline)
        self.compact = self.policy.compact if compact is None else bool(compact)
        self.block, self.strategy = block, strategy
        # a planner (memory/planners) decides for this budget; it replaces the policy's plan
        self.planner, self.cost, self._compact_arg = planner, cost, compact
        if planner is not None and cost is None:    # its GPU's costs, else the H100's
            self.cost = planning_cost(device, dtype)
        # "auto": the plan's clock says when a prefetch is due (memory/prefetch_horizon.py);
        # a simulation of this plan takes the same clock (_PLAN_FIELDS)
        if _plan_from is None:
            self._horizon_cost = None if self.prefetch_ahead is not None else (
                self.cost or planning_cost(device, dtype))
        self._moves_tensors = budget is not None or bool(offload_params)
        self._plan_budget = budget if budget is not None else (
            device.arena_bytes if isinstance(device, Device) else None)
        self.chunks = int(chunks)
        self.grad_buckets, self.grad_lag = grad_buckets, grad_lag
        if not 1 <= self.chunks <= self.batch:
            raise ValueError(f"chunks must be between 1 and the batch ({self.batch}), got {chunks}")
        # the papers' baseline has a distinct buffer for every tensor: nothing aliased
        self._alias_gradients = bool(_alias_gradients) and self.policy.free_dead
        if _plan_from is not None:          # share the (immutable) plan of another executor
            self.__dict__.update({k: _plan_from.__dict__[k] for k in _PLAN_FIELDS})
        else:
            with no_gc():
                self._make_plan(graph)
        self.iteration = 0
        self.dp = None      # a distributed.DataParallel: gradient hook + sync-BN kernels
        # one step at a time: a second thread gets an error instead of corrupting the pool
        self._busy = threading.Lock()
        self.undo: UndoRecord | None = None     # the running step's undo record
        self._undo_record = None
        # False only to measure what the safeguard costs (bench/step_guard_cost.py): a failed
        # step then leaves a half-updated model, as before the undo record existed
        self.transactional = True
        self.record_trace = True
        self.last_trace: list[TraceRow] = []
        self.last_logits = None
        self.planned = None
        if isinstance(device, Device):
            self.device = device
            if device.computes:     # prove the given arena fits before any state exists
                self.planned = self.simulate(device.arena_bytes)
                if not self.planned["fits"]:
                    raise self.planned["error"]
        elif device == "virtual":
            self.device = VirtualDevice(budget or VIRTUAL_ARENA)
        else:
            # plan first (virtual, same code): it sizes the arena and proves the budget fits
            # before any real state exists, so a failing plan changes nothing
            self.planned = self.simulate(budget)
            if not self.planned["fits"]:
                raise self.planned["error"]
            self.device = make_device(device, budget or self.planned["arena_bytes"])
        self._check_precision()
        self._replay = self._replay_for(replay)
        self._new_pool()
        if self.planned is not None:        # the plan's iteration says this one's evictions
            sim = self.planned["executor"]
            self._adopt_evictions(sim)
            if self._evict_schedule is not None and self._evict_schedule.issue:
                # and the plan is the iteration that runs: with their copies ahead (the same
                # moves and peak; the host buffers taken earlier)
                self.planned = self.simulate(sim.device.arena_bytes)
        self._step_flag = self.device.step_flag() if self.device.computes else None
        self._staging = None                # the fixed buffers a replayed batch is written to
        self._loss_sinks: dict = {}         # (loss, chunk, ...) -> fixed device buffer
        self._early_blocks: list | None = None  # guard snapshots issued at a step's start
        self._k = None                      # the kernels a recorded iteration calls
        self._overflow = None               # fp16 on a native device: the overflow flag
        self._skipped = False               # the last eager step was skipped (fp16 overflow)

    def _replay_for(self, mode) -> Replay | None:
        if mode is None:
            mode = getattr(self.device, "replay_default", "tape")
        if mode not in REPLAY_MODES:
            raise ValueError(f"Executor: replay must be one of {', '.join(REPLAY_MODES)} or None "
                             f"(the device's fastest), got {mode!r}")
        if mode == "graph" and not getattr(self.device, "graph_replay", False):
            raise ValueError(f"Executor: replay='graph' (one CUDA graph per iteration) needs a "
                             f"device that captures graphs; {self.device.name} does not (use "
                             "'tape')")
        if mode == "off" or not self.device.computes:
            return None
        r = Replay(mode)
        if self.precision.mixed and not self._native_mixed:
            r.give_up(f"precision {self.precision} casts around every kernel on the CPU: every "
                      "iteration runs it", warn=False)
        if self.pool_class is not Pool:
            r.give_up(f"the pool is a {self.pool_class.__name__}: every iteration runs it",
                      warn=False)
        return r

    def _instrumented(self) -> bool:
        """Steps wrapped by a subclass or on the instance (a profiler's stopwatch, a test's
        fault): they must run every iteration, so no iteration is replayed."""
        return "_compute" in vars(self) or type(self)._compute is not Executor._compute

    @property
    def replay(self) -> dict:
        """What replay does for this executor: the mode asked for, what the last step ran,
        counts, and why it runs eagerly if it does."""
        if self._replay is None:
            return {"mode": "off", "ran": "off", "replayed_iterations": 0,
                    "recorded_iterations": 0, "operations": None, "eager_because": None,
                    "tape_because": None, "graph_captures": 0}
        return self._replay.info()

    def _make_plan(self, graph):
        self.train_graph = with_loss(graph, self.loss)
        self.schedule: Schedule = build_chunked_schedule(
            self.train_graph, self.batch, self.chunks, self.dtype, self.optimizer.state_names,
            self.precision, self._alias_gradients, self.layout)
        apply_layout(self.schedule.registry, self.layout)    # before any step binds a view
        self.recompute_report = None
        steps = self.schedule.steps
        if self.policy.recompute and self.chunks == 1:
            steps, self.recompute_report = plan_recompute(self.schedule, self.recompute_strategy)
        self.steps = steps = self._defer(steps)
        # a planner replaces the steps (and so their frees): computed once, for its steps
        self.frees = frees_for(steps, self.policy.free_dead) if self.planner is None else None
        self.eval_steps = self.schedule.forward_steps()
        self.logits_tensors = logits_chunks(self.schedule, graph, self.chunks)
        self._eval_frees = None             # computed on the first evaluate()
        self._offload_after = None          # without the tensor cache: step -> tensors
        self.persistent = self.schedule.persistent()
        self.state_tensors = self.schedule.state_tensors()
        self._prefetch_after = None         # planned look-ahead prefetches: step -> tensors
        self.decisions = None
        if self.planner is not None:
            from .memory.planners import PlanContext, get_planner
            planner = get_planner(self.planner)
            if self._plan_budget is not None and \
                    len(self.host_blocks()) < len(self.persistent):
                # the setup's error now, not after a search that cannot succeed
                self._alloc_persistent(Pool(VirtualDevice(self._plan_budget), block=self.block,
                                            strategy=self.strategy))
            ctx = PlanContext(self, self._plan_budget, self.cost)
            d = planner.plan(ctx)
            self._apply_decisions(d, ctx.frees(d.steps, d.policy.free_dead))
            # the planner has often simulated its answer already: simulate() reuses that
            sim = ctx.simulated(d, self._plan_budget)
            self._planned_sim = (self._plan_budget, sim) if sim is not None else None

    def _apply_decisions(self, d, frees=None):
        """A planner's decisions: the steps to run and the moves the pool makes on schedule
        (``frees``: those of ``d.steps``, when already known)."""
        self.policy = d.policy
        self._planned_sim = None
        self.compact = d.policy.compact if self._compact_arg is None else bool(self._compact_arg)
        self.steps, self.recompute_report = self._defer(d.steps), d.recompute_report
        # deferred updates (data-parallel overlap) change the steps' reads: their own frees
        self.frees = frees if frees is not None and self.steps is d.steps else \
            frees_for(self.steps, d.policy.free_dead)
        self._offload_after = d.offload_after or None
        self._prefetch_after = d.prefetch_after or None
        self.decisions = d

    def _defer(self, steps):
        if self.grad_buckets is None:
            return steps
        from .distributed.overlap import defer_updates
        return defer_updates(steps, self.grad_buckets, self.grad_lag)

    #: the pool class a run uses (memory/recorder.py swaps in one that logs every event)
    pool_class = Pool

    def _new_pool(self):
        self.pool = self.pool_class(self.device, block=self.block, strategy=self.strategy,
                         evict=self.policy.offload, host_budget=self.host_budget,
                         compact=self.compact)
        self.pool.compact_first = self.policy.compact_first
        self.pool.prefetch_top = self.prefetch_ahead != 1
        if self.pool.prefetch_top and not hasattr(self.pool.heap._impl, "try_alloc_top"):
            raise RuntimeError("Executor: prefetch_ahead other than 1 needs the heap extension "
                               "rebuilt (neuron/memory/_heap.cpp gained try_alloc_top): pip "
                               "install -e . or python setup.py build_ext --inplace")
        if os.environ.get("NEURON_OVERLAP") != "1" and (
                self._replay is not None or not self._moves_tensors):
            # timed by default: eager runs under a budget or with offloaded parameters (the
            # copies to measure); others only when asked (NEURON_OVERLAP=1): the timeline adds
            # two timing events per step and per copy, and a read of them per step
            self.pool.overlap = None
            if getattr(self.device, "timeline", None) is not None:
                self.device.timeline = None
        if self.decisions is not None and self.decisions.compress:    # FreeLunch COMPRESS
            from .memory.codecs import get_codec
            self.pool.codecs = {i: get_codec(r) for i, r in self.decisions.compress.items()}
        self._alloc_persistent()

    # ---- planning ---------------------------------------------------------------------
    def simulate(self, arena_bytes: int | None = None, trace: bool = True,
                 events: bool = False) -> dict:
        """One iteration on a virtual device of the given arena size (same code path).
        ``events``: also return the event log the simulated clock times (memory/clock.py)."""
        hit = getattr(self, "_planned_sim", None)
        if hit is not None and not trace and hit[0] == arena_bytes:
            return dict(hit[1])         # the planner's own simulation of these decisions
        with no_gc():
            return self._simulate(arena_bytes, trace, events)

    def _simulate(self, arena_bytes, trace=True, events=False):
        try:
            v = type(self)(self.graph, self.batch,
                         device=VirtualDevice(arena_bytes or VIRTUAL_ARENA),
                         optimizer=self.optimizer, policy=self.policy, dtype=self.dtype,
                         offload_params=self.offload_params,
                         resident_params=self.resident_params,
                         recompute_strategy=self.recompute_strategy,
                         host_budget=self.host_budget, tensor_cache=self.tensor_cache,
                         compact=self.compact, chunks=self.chunks,
                         block=self.block,
                         strategy=self.strategy, loss=self.loss, precision=self.precision,
                         prefetch_ahead=self.prefetch_ahead or "auto",
                         evict_ahead=self.evict_ahead, fuse=self.fuse, _plan_from=self)
            v._adopt_evictions(self)
            v.record_trace = trace
            if events:
                v.pool.log = []
            v.train_step(None, None)
        except MemoryBudgetError as e:
            return {"fits": False, "error": e}
        return {"fits": True, "error": None, "peak_bytes": v.pool.high_water,
                "tensor_peak_bytes": v.pool.tensor_high_water,
                "arena_bytes": v.pool.max_extent, "trace": v.last_trace, "executor": v,
                "events": v.pool.log,
                "bytes_by_kind_at_peak": {k.value: b for k, b in v.pool.by_kind_at_peak.items()},
                "bytes_by_dtype_at_peak": v.pool.by_dtype_at_peak,
                **v.pool.counters()}

    def _adopt_evictions(self, other) -> None:
        """Take ``other``'s recorded evictions where they are of this plan in this arena."""
        rec = getattr(other, "_evict_schedule", None)
        if rec is not None and rec.fits(self.steps, self.frees, self.pool.heap.size):
            self._evict_schedule = rec

    def _eviction_hooks(self, steps, frees):
        """For a planned iteration that may evict: the schedule of early copies recorded from
        an earlier iteration (memory/evict_ahead.py), or a recorder for this one; None: off."""
        pool = self.pool
        if not self.evict_ahead or not pool.evict_enabled or self.host_budget is not None:
            return None
        rec = self._evict_schedule
        if rec is not None and rec.fits(steps, frees, pool.heap.size):
            return rec if rec.issue else None
        return EvictionRecorder(steps)

    # ---- state ------------------------------------------------------------------------
    def _alloc_persistent(self, pool=None):
        """One block per layer (parameters + optimizer state), initialized in route order
        (``pool``: only placed there, to check that they fit)."""
        rng = np.random.default_rng(self.seed)
        compute = pool is None and self.device.computes
        pool = pool or self.pool
        on_host = self.host_blocks()
        for block in self.persistent:
            if block.id in on_host:
                pool.place_on_host(block)
            else:
                try:
                    pool.alloc(block, pin=True)
                except MemoryBudgetError as e:
                    raise MemoryBudgetError(
                        f"parameters and optimizer state do not fit: {e}", tensor=block.name,
                        requested=e.requested, largest_free=e.largest_free,
                        free_bytes=e.free_bytes, budget=e.budget) from None
            if not compute:
                continue
            for t in block.members:
                if t.kind is Kind.PARAM:
                    layer_name, pname = t.name.rsplit(".", 1)
                    spec = self.train_graph.layers[layer_name].param_specs[pname]
                    self._write(t, spec.init(rng, spec.shape).astype(self.dtype))
                else:
                    self._write(t, np.zeros(t.shape, self.dtype))

    @property
    def _native_mixed(self) -> bool:
        """Whether the device's kernels take 2-byte feature maps themselves (CudaDevice), so
        that mixed precision calls the layers as float32 does, instead of through the CPU
        reference's casts around each kernel (precision/mixed_cpu.py)."""
        return self.precision.mixed and getattr(self.device, "native_mixed", False)

    def _check_precision(self) -> None:
        """A precision the device cannot run: one error naming what is missing."""
        missing = self.device.precision_missing(self.precision.name)
        if missing is not None:
            raise ValueError(f"precision {self.precision} on device {self.device.name}: "
                             f"{missing}")
        use = getattr(self.device, "use_precision", None)
        if use is not None:
            use(self.precision.name)

    def _write(self, t, value) -> None:
        """Set a parameter/state tensor wherever it lives (arena or host)."""
        self.pool.written([t.storage])
        if self.pool.resident(t):
            self.device.kernels.copy(self.pool.view(t), np.asarray(value, dtype=t.dtype))
        else:
            self.device.synchronize()
            self.pool.host_view(t)[...] = value

    def _value(self, t) -> np.ndarray:
        if self.pool.resident(t):
            return self.device.to_numpy(self.pool.view(t))
        self.device.synchronize()           # an offload may still be in flight
        return self.pool.host_view(t).copy()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters (by torchvision-style names; the float32 master weights in any
        precision) and optimizer state, copied to NumPy; fp16: the loss scale too."""
        out = {t.name: self._value(t) for t in self.state_tensors}
        if self.loss_scaler is not None:
            out.update(self.loss_scaler.state())
        return out

    def load_state_dict(self, arrays: dict[str, np.ndarray], strict: bool = True) -> None:
        """Parameters and optimizer state from ``state_dict()`` of any precision (a loss scale
        is taken by an fp16 run, ignored by others)."""
        arrays = dict(arrays)
        scale = {k: arrays.pop(k) for k in (SCALE_KEY, GOOD_STEPS_KEY) if k in arrays}
        persistent = {t.name: t for t in self.state_tensors}
        if strict:
            missing = sorted(set(persistent) - set(arrays))
            extra = sorted(set(arrays) - set(persistent))
            if missing or extra:
                raise KeyError(f"state mismatch: missing {missing[:5]}, unexpected {extra[:5]}")
        for name, a in arrays.items():
            t = persistent.get(name)
            if t is None:
                continue
            a = np.asarray(a)
            if tuple(a.shape) != t.shape:
                raise ValueError(f"{name}: shape {tuple(a.shape)} does not match {t.shape}")
            if a.dtype.kind != "f":     # a cast would drop imaginary parts or mean a wrong file
                raise DataError(f"{name}: dtype {a.dtype} is not a real floating type "
                                f"(parameters are {self.dtype})")
            if not np.isfinite(a).all():
                raise DataError(f"{name}: contains NaN or infinity; refusing to load it")
        if self.loss_scaler is not None:
            self.loss_scaler.load(scale)
        for name, a in arrays.items():          # validated all first: nothing half-loaded
            t = persistent.get(name)
            if t is not None:
                self._write(t, np.asarray(a, dtype=self.dtype))

    def parameters(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.state_dict().items() if ":" not in k}

    # ---- running ----------------------------------------------------------------------
    def _feed(self, x, y, guarded: bool = False) -> dict:
        """The checked batch (``guarded``: a training step under the step guard, whose flag
        checks the images' finiteness on the device: _compute)."""
        if self.device.computes is False:
            return {}
        fed = feed(self.train_graph, self.batch, self.dtype, self.loss, x, y,
                   check_finite=not (guarded and self._input_on_device()),
                   as_is=tuple(self._staging.values()) if self._staging else ())
        if self._replay is None:
            return fed
        # a recorded iteration reads its batch from buffers that stay where they are
        st = self._staging
        if st is None:
            # in the type of the tensor it is copied to (a bf16 run's images: bf16), and in
            # its storage order (--layout nhwc: an (N, C, H, W) view of (N, H, W, C) bytes),
            # so that a replay copies bytes and casts and transposes nothing
            infos = {t.producer.name: self.schedule.values(t)[0]
                     for t in self.train_graph.inputs}
            st = self._staging = {}
            for n, a in fed.items():
                dtype = infos[n].dtype if self._native_mixed else a.dtype
                if infos[n].channels_last and a.ndim == 4:
                    st[n] = self.device.staging_array(
                        storage_shape(a.shape), dtype).transpose(TO_LOGICAL)
                else:
                    st[n] = self.device.staging_array(a.shape, dtype)
        for n, a in fed.items():
            if a is not st[n]:              # a loader may fill them in place: batch_buffers()
                if a.dtype == st[n].dtype:
                    np.copyto(st[n], a)
                else:
                    st[n][...] = a          # rounded to the low type on the host
        return st

    def batch_buffers(self) -> dict | None:
        """The fixed (pinned, on a GPU) buffers a replayed step reads its batch from, by input
        name ({"data": images, "labels": ...}), once a replaying executor has taken a step;
        None before. Pass them back to train_step, filled in place, to save a copy of the
        batch per step."""
        if self._staging is None:
            return None
        return {layer.name: self._staging[layer.producer.name]
                for layer in self.train_graph.inputs}
    @contextlib.contextmanager
    def _exclusive(self, what: str):
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"{what}: this executor is already running a step (in another "
                               "thread); one executor runs one step at a time: use one executor "
                               "per thread or a lock around the calls")
        try:
            yield
        finally:
            self._busy.release()

    def train_step(self, x, y) -> float:
        """One iteration, as a transaction: if it raises (KeyboardInterrupt included) or any
        gradient, update or BN statistic is non-finite, parameters, optimizer state, BN
        statistics, the pool and the iteration counter are exactly as before it."""
        with self._exclusive("train_step"):
            if self.pool.overlap is not None:   # the last step's copy/compute times, if done
                self.pool.overlap.sample()
            replay = self._replay
            if replay is not None and (not self.transactional or self._instrumented()):
                replay = None   # the unguarded step, a stopwatch run eagerly
            if replay is not None and replay.ready(self.pool):
                loss = self._replay_step(replay, x, y)
                if loss is not None:
                    return loss
            ctx = Context(training=True, seed=self.seed, iteration=self.iteration,
                          feed=self._feed(x, y, guarded=self.transactional))
            if not self.device.computes or not self.transactional:
                scaled = self.device.computes and self.loss_scaler is not None and \
                    self._native_mixed
                if scaled:
                    self._clear_overflow()
                self._run(self.steps, self.frees, ctx, check_loss=self.device.computes)
                if scaled and self._overflowed():
                    # no undo record: the update is applied, as the CPU path raises mid-step
                    raise GradientOverflow(f"a gradient overflowed at loss scale "
                                           f"{self.loss_scaler.scale:g} (not undone: the "
                                           "executor is not transactional)")
                self.iteration += 1
                return loss_value(ctx.losses.get("loss"))
            if getattr(self.device, "loss_on_device", False) and not self.precision.mixed:
                ctx.loss_sink = self._loss_sink(ctx)
            undo = self._undo_record
            if undo is None:
                undo = self._undo_record = UndoRecord(self.device, self.pool, self._step_flag)
            tape = replay.start(self.iteration, self.pool) if replay is not None else None
            log = self.pool.log
            with tape.recording(self.device) if tape is not None else contextlib.nullcontext():
                if tape is not None:        # the step's kernels and the guard's, on the tape
                    ctx.tape = undo.tape = tape
                    self._k = undo.kernels = tape.kernels(self.device.kernels)
                    self.pool.log = []      # its moves, which a replay makes again
                try:
                    self._scaled_run(undo, ctx)
                finally:
                    if tape is not None:
                        undo.tape, undo.kernels, self._k = None, self.device.kernels, None
                        tape.pool_log, self.pool.log = self.pool.log, log
                        if log is not None:
                            log.extend(tape.pool_log)
            if replay is not None:
                replay.last_ran = "off"
                if tape is not None and not self._skipped:
                    # (a step skipped for fp16 overflow recorded its undo too: not the program)
                    replay.finish(tape, self.pool)
            self.iteration += 1
            return loss_value(ctx.losses.get("loss"))

    def _loss_sink(self, ctx):
        """ctx.loss_sink: a fixed device buffer per loss (and chunk) that the loss kernel
        leaves its per-row values in, read once the step has been issued whole."""
        sinks = self._loss_sinks

        def sink(name, rows):
            key = (name, None if ctx.chunk is None else ctx.chunk.index, rows.shape,
                   rows.dtype.str)
            if key not in sinks:
                sinks[key] = self.device.fixed_array(rows.shape, rows.dtype)
            return sinks[key]
        return sink

    def _scaled_run(self, undo, ctx) -> None:
        """The guarded step; fp16: a gradient overflow skips it (undone whole, the batch spent)
        and shrinks the loss scale, a good step may grow it (precision/loss_scale.py)."""
        scaler = self.loss_scaler
        self._skipped = False
        if scaler is None:
            return self._guarded_run(undo, ctx)
        if self._native_mixed:          # the unscale kernels' overflow flag, cleared per step
            self._clear_overflow()
        try:
            self._guarded_run(undo, ctx)
        except GradientOverflow:
            scaler.overflowed()
            self._skipped = True
        else:
            scaler.stepped()

    def _clear_overflow(self) -> None:
        """fp16 on a native device: clear (make, the first time) the unscale kernels' flag."""
        if self._overflow is None:
            self._overflow = self.device.kernels.nonfinite_flag_new()
        self.device.kernels.nonfinite_flag_clear(self._overflow)

    def _overflowed(self) -> bool:
        """fp16 on a native device: read the unscale kernels' flag (after the step guard's
        flag said something was not finite, or where there is no guard)."""
        return bool(self.device.kernels.nonfinite_flag_read(self._overflow))

    def _guarded_run(self, undo, ctx) -> None:
        undo.begin(self._snapshots_at_start())
        self.undo = undo
        try:
            self._run(self.steps, self.frees, ctx, check_loss=True)
            if undo.nonfinite():        # the one read of a good step (and the loss, where
                if self.loss_scaler is not None and self._native_mixed and self._overflowed():
                    raise GradientOverflow(f"a gradient overflowed at loss scale "
                                           f"{self.loss_scaler.scale:g}")
                loss = loss_value(ctx.losses.get("loss"))   # it stayed on the device)
                raise self._loss_error(loss) if not math.isfinite(loss) else \
                    self._update_error(loss)
        except BaseException as e:
            with signals_deferred():    # a second Ctrl-C must not cut the undo in half
                undo.restore()      # (_run's finally already returned the pool to its start)
            bad = self._bad_input(ctx.feed) \
                if isinstance(e, (NonFiniteLossError, NonFiniteUpdateError)) else None
            if bad is not None:
                raise bad from None
            raise
        finally:
            self.undo = None

    def _snapshots_at_start(self) -> list:
        """The blocks a step writes (BN running statistics, then parameters with their
        optimizer state in backward order) whose guard snapshots start with the step (undo.py),
        where they stay in the arena: a device with per-block fences, a policy that moves no
        tensor to the host, and not the parameters that live on the host between uses
        (``host_blocks``; under offload_params the resident ones are early too). Elsewhere
        each snapshot waits until right before its write, and the write waits for it."""
        if self._early_blocks is None:
            self._early_blocks = []
            if getattr(self.pool, "fences", None) is not None and not self.policy.offload:
                seen = set(self.host_blocks())
                for step in self.steps:
                    for b in self._blocks_written(step):
                        if b.id not in seen:
                            seen.add(b.id)
                            self._early_blocks.append(b)
        return self._early_blocks

    def host_blocks(self) -> frozenset:
        """Ids of the parameter blocks that live on the host between uses: under
        offload_params all of them but ``resident_params`` bytes of the last layers'."""
        if self._host_ids is None:
            on_host = [b.id for b in self.persistent] if self.offload_params else []
            room = self.resident_params or 0
            while on_host and self.persistent[len(on_host) - 1].nbytes <= room:
                room -= self.persistent[len(on_host) - 1].nbytes
                on_host.pop()               # the last layers' blocks stay in the arena
            self._host_ids = frozenset(on_host)
        return self._host_ids

    def _blocks_written(self, step) -> list:
        """The persistent blocks a step's kernels write: BN running statistics in a training
        forward, parameters and optimizer state where it applies updates (kept per step)."""
        written = self._written
        blocks = written.get(step)
        if blocks is None:
            if step.phase == "F":
                blocks = [step.params[n].storage for n in self._buffers(step)]
            elif step.phase == "B":
                blocks = [p.storage for _, p, _, _ in due_updates(step)]
            else:
                blocks = []
            written[step] = blocks
        return blocks

    def _buffers(self, step) -> list[str]:
        """The parameters a forward step writes in place: buffers without a gradient (BN
        running statistics), not a step's low-precision copy of its weights."""
        return [n for n, t in step.params.items()
                if t.name not in self.schedule.param_grads and t.dtype == self.dtype]

    def _input_on_device(self) -> bool:
        """Whether the step guard checks the images (float32/64 inputs) on the device."""
        return self.device.computes and self.transactional and not self.precision.mixed

    def _bad_input(self, fed) -> DataError | None:
        """After a non-finite step: the batch's fault, if its images were not finite (checked
        on the device, named here on the host: the rare path)."""
        if not self._input_on_device():
            return None
        data = self.train_graph.inputs[0]
        x = fed.get(data.producer.name)
        if x is not None and is_real_float(x.dtype) and not np.all(np.isfinite(x)):
            return DataError(nonfinite_input(data.name) + "; the step was undone")
        return None

    def _update_error(self, loss) -> NonFiniteUpdateError:
        return NonFiniteUpdateError(
            f"iteration {self.iteration}: a gradient, parameter update or BN statistic is NaN "
            f"or infinite (loss {loss}); the step was undone (lower the learning rate or check "
            "the data)")

    def _replay_step(self, replay: Replay, x, y) -> float | None:
        """One iteration from the tape: the same device operations as the recorded one, with
        this iteration's batch, seed and learning rate; undone like an eager step. None: the
        replay met what its record did not have, was undone, and the step is to run eagerly."""
        tape, undo = replay.tape, self._undo_record
        t0, waited = time.perf_counter(), getattr(self.device, "wait_seconds", 0.0)
        fed = self._feed(x, y, guarded=True)    # checked, written where the tape reads it
        scaled = self.loss_scaler is not None   # fp16 (replayed on a native device only)
        if scaled:
            self._clear_overflow()
        graph = replay.graph_for(self.device, self._staging)
        start = getattr(self.device, "iteration_start", None)
        if start is not None:               # the copies' and timings' event rings from slot 0,
            start()                         # as the recorded iteration took them
        try:
            results = replay.run(graph, self.iteration, self.device)
        except BaseException as e:
            with signals_deferred():
                if graph is not None:       # the launch ran whole, or nothing ran
                    self.device.synchronize()
                    stop = len(tape.ops) if graph.launched_now else 0
                else:
                    stop = tape.stopped_at
                undo.restore(tape.saved_before(stop))
            if not isinstance(e, TapeDiverged):
                raise
            replay.give_up(str(e))          # undone; this step and the next run eagerly
            return None
        loss = loss_value(replay.losses(tape, results).get("loss"))
        failed = None
        flagged = undo.nonfinite()
        if flagged and scaled and self._overflowed():
            with signals_deferred():        # fp16 overflow: skipped, undone, scale shrunk
                undo.restore(tape.saved_before(len(tape.ops)))
            self.loss_scaler.overflowed()
        else:
            if not math.isfinite(loss):
                failed = self._loss_error(loss)
            elif flagged:
                failed = self._update_error(loss)
            if failed is not None:
                with signals_deferred():
                    undo.restore(tape.saved_before(len(tape.ops)))
                raise self._bad_input(fed) or failed
            if scaled:
                self.loss_scaler.stepped()
        replay.repeat_traffic(tape, self.pool)
        if self.pool.log is not None:       # the pool's event log of the recorded iteration
            self.pool.log.extend(tape.pool_log)
        replay.replayed += 1
        replay.last_ran = "graph" if graph is not None and replay.graph is graph else "tape"
        if replay.last_ran == "graph" and self.pool.overlap is not None:
            self.pool.overlap.launched()    # the launch recorded the timeline's events again
        self.iteration += 1
        # the host's own time: all but its waits for a launched graph (replay.info's host_ms)
        replay.host_seconds.append(time.perf_counter() - t0 - (
            getattr(self.device, "wait_seconds", 0.0) - waited))
        return loss

    def evaluate(self, x, y) -> tuple[float, int]:
        """Forward in inference mode; returns (mean loss, number of correct predictions)."""
        with self._exclusive("evaluate"):
            ctx = Context(training=False, seed=self.seed, iteration=self.iteration,
                          feed=self._feed(x, y))
            if self._eval_frees is None:
                self._eval_frees = frees_for(self.eval_steps, self.policy.free_dead,
                                             keep=self.logits_tensors)
            try:
                keep = self._run(self.eval_steps, self._eval_frees, ctx,
                                 keep=self.logits_tensors)
                self.last_logits = np.concatenate([self.device.to_numpy(v) for v in keep])
            finally:
                self._end_iteration()
            if self.loss == "mse":         # regression: nothing to count as correct
                return ctx.losses["loss"], 0
            correct = int((self.last_logits.argmax(axis=1) == np.asarray(y)).sum())
            return ctx.losses["loss"], correct

    def _end_iteration(self):
        """Back to the state every iteration starts from (the one the plan simulated): only
        parameters and optimizer state exist, in the arena or, with offload_params, those of
        host_blocks on the host. Leaving offloaded parameters cached across iterations would
        make each iteration's layout differ from the plan's."""
        pool = self.pool
        pool.drop_precopies()
        pool.release_draining()
        for t in list(pool.live.values()) + [t for t, _ in list(pool.host.values())]:
            if not t.persistent:
                pool.free(t)
        pool.release_held()
        pool.locked.clear()
        pool.host_pool.settle()
        if self._replay is not None:
            self._replay.pool_moved()
        on_host = self.host_blocks()
        for t in list(pool.live.values()) if on_host else ():
            if t.id in on_host:
                pool.offload(t)
        pool.carry_copies()

    def _check_loss(self, ctx):
        loss = ctx.losses.get("loss")
        if isinstance(loss, LossSum) and self.undo is not None:
            # on the device, into the step guard's flag (read when the step ends)
            self.undo.check_finite(loss.device_rows())
            return
        if loss is not None and not math.isfinite(float(loss)):
            raise self._loss_error(float(loss))

    def _loss_error(self, loss) -> NonFiniteLossError:
        return NonFiniteLossError(f"loss is {loss} at iteration {self.iteration}; the step was "
                                  "undone (lower the learning rate or check the data)")

    def _run(self, steps, frees, ctx, keep=(), check_loss=False):
        pool, dev = self.pool, self.device
        compute = dev.computes
        # offloaded parameters go back to the host right after each use: caching them in the
        # arena between a layer's forward and its backward only fragments it
        on_host = self.host_blocks()
        eager_param_offload = bool(on_host)
        planned = steps is self.steps
        if planned and self._offload_after is None and self.policy.offload \
                and not self.tensor_cache:
            self._offload_after = _offload_points(steps)
        eager_act_offload = planned and bool(self._offload_after)
        defer_offloads = self.decisions is not None
        release_after = self.decisions.release_after if defer_offloads else {}
        ahead = self._prefetch_after if planned else None
        horizon = self._horizon(steps, frees)
        evicts = pool.ahead = self._eviction_hooks(steps, frees) if planned else None
        pending: list = []
        trace = [] if self.record_trace else None
        dynamic_ws = getattr(dev, "dynamic_workspace", False)
        ws_off = None
        log = pool.log
        # baseline (nothing freed): one workspace, the largest any step asks for, shared by all
        # steps (the papers' baseline), allocated at the first step that needs one
        shared_ws = None if self.policy.free_dead else [None, max(
            (s.workspace_bytes for s in steps), default=0)]
        try:
            for i, (step, dead) in enumerate(zip(steps, frees)):
                if check_loss and step.phase == "B":    # before any update
                    if self.undo is not None:       # forward's deferred checks, one launch
                        self.undo.check_deferred()
                    self._check_loss(ctx)
                    check_loss = False
                pool.step_peak = pool.used_bytes
                pool.lock(step.ids)
                pool.ensure_all(step.reads, step)
                pool.alloc_all(step.writes, step)
                ws_bytes = step.workspace_bytes
                ws_at = None                    # where this step's workspace is
                if ws_bytes and shared_ws is not None:
                    if shared_ws[0] is None:
                        shared_ws[0] = pool.alloc_bytes(shared_ws[1], None, step)
                        pool.hold_bytes(shared_ws[0])
                    ws_at = shared_ws[0]
                    if dynamic_ws:              # never past the shared block
                        ws_bytes = min(shared_ws[1], step.layer.workspace_request(
                            dev.kernels, "F" if step.phase != "B" else "B",
                            step.chunk.size if step.chunk else self.batch, self.feature_dtype,
                            shared_ws[1], self.layout))
                elif ws_bytes:
                    free = pool.heap.largest_free
                    if dynamic_ws:              # choose under what is free right now (§3.5)
                        ws_bytes = step.layer.workspace_request(
                            dev.kernels, "F" if step.phase != "B" else "B",
                            step.chunk.size if step.chunk else self.batch, self.feature_dtype,
                            free, self.layout)
                    elif ws_bytes > free and step.layer.workspace_shrinks():
                        ws_bytes = 0            # no workspace rather than evicting for one
                    if ws_bytes:
                        ws_off = ws_at = pool.alloc_bytes(ws_bytes, None, step)
                if log is not None:
                    log.append(("step", i, ws_bytes))
                if compute:
                    ws = dev.view(ws_at, (ws_bytes,), np.uint8) if ws_bytes else None
                    # the step after it (its guard snapshots may start under this one)
                    ctx.ahead = steps[i + 1] if i + 1 < len(steps) else None
                    self._compute(step, ctx, ws)
                if step.bucket is not None or step.due:     # all-reduce overlapping backward
                    after_step(pool, step, self.dp)
                if ws_off is not None:
                    pool.free_bytes(ws_off)
                    ws_off = None
                if pool.clean:              # what it wrote no longer equals its host copy
                    pool.written(self._blocks_written(step))
                pool.free_all(dead)
                pool.unlock(step.ids)
                if eager_param_offload:
                    for t in step.reads:
                        if t.id in on_host and pool.resident(t):
                            pool.offload(t)
                if eager_act_offload:
                    # a planner's offloads keep their block until the step the plan's clock
                    # says their copy is done by (at least one more step: the copy overlaps
                    # it); the no-tensor-cache policy frees at once, as it always did
                    if pool.draining:
                        pool.release_draining(i)
                    for t in self._offload_after.get(i, ()):
                        if t.id in pool.offset:
                            pool.offload(t, defer=defer_offloads,
                                         until=release_after.get(t.id, i + 1))
                if trace is not None:
                    trace.append((step.index, step.layer.name, step.phase, pool.used_bytes,
                                  len(pool.live), ws_bytes, pool.step_peak))
                if ahead is not None:       # the plan's look-ahead prefetches, in its order
                    pending.extend(ahead.get(i, ()))
                    if pending and pool.host:
                        pending = _prefetch_in_order(pool, pending)
                if pool.host and i + 1 < len(steps):
                    if horizon is None:     # the next step's reads, each if it fits
                        host = pool.host
                        for t in steps[i + 1].reads:
                            if t.id in host:
                                pool.prefetch(t)
                    else:                   # further ahead, as the arena allows
                        horizon.issue(pool, i)
                if evicts is not None:      # early copies of the evictions ahead
                    evicts.after_step(pool, i)
            if self.undo is not None:   # a run without backward: its deferred checks now
                self.undo.check_deferred()
            if isinstance(evicts, EvictionRecorder):
                self._evict_schedule = evicts.schedule(frees, pool.heap.size)
            self.last_trace = [TraceRow(*r) for r in trace] if trace is not None else []
            return [pool.view(t) for t in keep]
        finally:
            pool.ahead = None
            with signals_deferred():
                if ws_off is not None:      # a step that failed holding its workspace
                    pool.free_bytes(ws_off)
                if not keep:
                    self._end_iteration()

    def _horizon(self, steps, frees) -> PrefetchHorizon | None:
        """The prefetch horizon of these steps (None: one step ahead, the plain rule)."""
        if self.prefetch_ahead == 1:
            return None
        hit = self._horizons.get(id(frees))
        if hit is None or hit[0] is not frees or hit[1].steps is not steps:
            hit = self._horizons[id(frees)] = (frees, PrefetchHorizon(
                steps, frees, self.pool.heap.round, self.prefetch_ahead, self._horizon_cost,
                self.batch))
        return hit[1]

    def _compute(self, step, ctx, ws):
        layer, view = step.layer, self.pool.view
        k = self._k or self.device.kernels
        if self.dp is not None:
            k = self.dp.kernels(k)
        opt = lambda t: view(t) if t is not None else None  # noqa: E731
        params = {n: view(t) for n, t in step.params.items()}
        aux = {n: view(t) for n, t in step.aux.items()}
        undo = self.undo
        ctx.chunk = step.chunk
        mixed = self.precision.mixed and not self._native_mixed     # the CPU reference's casts
        for m, c in step.casts:         # the step's low-precision copy of its parameters
            k.copy(view(c), view(m))
        if step.phase != "B":
            # a training forward (not a recompute) may update buffers (BN running statistics)
            buffers = self._buffers(step) if undo is not None and step.phase == "F" else ()
            for n in buffers:
                undo.save(step.params[n].storage)
            ahead = ctx.ahead
            if undo is not None and ahead is not None and ahead.phase == "F":
                for b in self._blocks_written(ahead):   # the next BatchNorm's statistics
                    undo.save_ahead(b)
            ctx.recompute = step.phase == "R"
            ins, outs = [view(t) for t in step.ins], [view(t) for t in step.outs]
            if mixed:
                mixed_cpu.forward(layer, k, ins, outs, params, aux, ctx, self.dtype)
            else:
                layer.forward(k, ins, outs, params, aux, ws, ctx)
            ctx.recompute = False
            if undo is not None and step.phase == "F" and layer.kind == "data" \
                    and self._input_on_device():    # the images, checked on the device
                undo.check_finite(o for o in outs if is_real_float(o.dtype))
            if buffers:     # where they stay put all step, checked with the others at once
                stay = [undo.stays(step.params[n].storage) for n in buffers]
                undo.check_later([params[n] for n, s in zip(buffers, stay) if s])
                undo.check_finite([params[n] for n, s in zip(buffers, stay) if not s])
            return
        dins = [None] * len(layer.inputs)
        for i, g, _ in step.grad_targets:
            dins[i] = view(g)
        ctx.accumulate = frozenset(i for i, _, acc in step.grad_targets if acc)
        dparams = {pname: view(g) for pname, _, g, _ in step.updates}
        if undo is not None and (step.chunk is None or step.chunk.applies_update):
            for b in self._blocks_written(step):    # their snapshots run under this kernel
                undo.save_ahead(b)
        if self.loss_scaler is not None and not mixed and layer.kind == "loss":
            # fp16: scaled before rounding; on a tape, the scale of each replay's own step
            k = _LossScaled(k, per_iteration(k, _scale_of(self.loss_scaler), self.iteration))
        if mixed:
            scaler = self.loss_scaler
            mixed_cpu.backward(
                layer, k, [opt(t) for t in step.ins], [opt(t) for t in step.outs],
                [opt(t) for t in step.douts], dins, params, dparams, aux, ctx, self.dtype,
                self.feature_dtype if self.precision.casts_params(layer) else None,
                scaler.scale if scaler is not None else 1.0)
        else:
            layer.backward(k, [opt(t) for t in step.ins], [opt(t) for t in step.outs],
                           [opt(t) for t in step.douts], dins, params, dparams, aux, ws, ctx)
        ctx.accumulate = frozenset()
        if step.chunk is not None and not step.chunk.applies_update:
            return                      # the gradients are still being summed over chunks
        if self.dp is not None:     # average gradients over the ranks (or start/finish buckets)
            self.dp.reduce_gradients(step, dparams)
        updates = due_updates(step)     # its own, unless deferred; and those due here
        if self.loss_scaler is not None:    # fp16: overflow skips the whole step (undone)
            if self._native_mixed:          # on the device: flagged, read once at the step's end
                inv = per_iteration(k, _inverse_scale_of(self.loss_scaler), self.iteration)
                for _, _, g, _ in updates:
                    k.unscale_gradient(view(g), inv, undo.flag if undo is not None else
                                       self._overflow, self._overflow)
            else:
                for _, _, g, _ in updates:
                    self.loss_scaler.unscale(view(g))
        if undo is not None:
            for _, p, _, _ in updates:
                undo.save(p.storage)
        fused = undo is not None and getattr(self.optimizer, "checks_finite", False)
        update_many = getattr(self.optimizer, "update_many", None)
        if update_many is not None and updates:     # the step's due updates together
            items = [(view(p), view(g), [view(x) for x in states])
                     for _, p, g, states in updates]
            if fused:
                update_many(k, items, flag=undo.flag)
                return
            update_many(k, items)
            if undo is not None:
                for pv, _, state_views in items:
                    undo.check_finite([pv, *state_views])
            return
        for pname, p, g, states in updates:
            state_views = [view(x) for x in states]
            pv, gv = view(p), view(g)
            if fused:               # the update kernel checks its own results
                self.optimizer.update(k, pv, gv, state_views, flag=undo.flag)
                continue
            self.optimizer.update(k, pv, gv, state_views)
            if undo is not None:
                undo.check_finite([pv, *state_views])


def _scale_of(scaler):
    """The loss scale when a step (or its replay) runs: the scaler's, read then."""
    return lambda iteration: float(scaler.scale)


def _inverse_scale_of(scaler):
    return lambda iteration: 1.0 / scaler.scale


class _LossScaled:
    """A kernel set whose loss gradients are multiplied by fp16's loss scale in float32 before
    they are rounded to the low type (what mixed_cpu.backward's ``grad_scale`` does on the
    CPU); every other kernel is the set's own."""

    def __init__(self, k, scale):
        self._k, self._scale = k, scale     # a float, or a tape's Varying

    def softmax_xent_backward(self, *args, **kw):
        return self._k.softmax_xent_backward(*args, scale=self._scale, **kw)

    def __getattr__(self, name):
        if name == "mse_backward":
            raise NotImplementedError("fp16 loss scaling of the MSE loss on a GPU")
        return getattr(self._k, name)


_ACTIVATIONS = (Kind.ACTIVATION, Kind.DATA)


def _offload_points(steps) -> dict[int, list]:
    """For running without the tensor cache: each activation that backward needs is offloaded
    right after its last forward use (vDNN's schedule), whatever the free memory."""
    last_fwd, used_in_bwd = {}, set()
    for i, s in enumerate(steps):
        for t in s.reads + s.writes:
            if t.kind in _ACTIVATIONS:
                if s.phase == "F":
                    last_fwd[t.id] = (i, t)
                else:               # backward, or a recompute for backward
                    used_in_bwd.add(t.id)
    out: dict[int, list] = {}
    for tid, (i, t) in last_fwd.items():
        if tid in used_in_bwd:
            out.setdefault(i, []).append(t)
    return out


def _prefetch_in_order(pool, pending: list) -> list:
    """Start planned prefetches in the plan's order while each fits without evicting; the rest
    wait for a later step (a tensor no longer on the host was brought back by a miss)."""
    host = pool.host
    for k, t in enumerate(pending):
        if t.id in host and not pool.prefetch(t):
            return [u for u in pending[k:] if u.id in host]
    return []


_PLAN_FIELDS = ("layout", "train_graph", "schedule", "recompute_report", "steps", "frees", "eval_steps",
                "logits_tensors", "_eval_frees", "persistent", "state_tensors",
                "_offload_after", "_prefetch_after", "decisions", "_horizon_cost")
