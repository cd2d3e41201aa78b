"""The planner interface: (schedule, budget, cost model) -> decisions the one executor runs.

A planner returns ``Decisions``: the steps to run (the schedule, possibly rewritten with "R"
recompute steps), the pool's behaviour (a Policy: free after last use, LRU eviction as the
fallback, compaction), and per step the tensors to offload after it and the tensors whose
prefetch starts after it. ``tensors`` records the per-tensor choice (KEEP, SWAP, RECOMPUTE)
for reports. Every plan is checked by the same simulation (``PlanContext.simulate``) and runs
for real through the same executor, so planners differ only in what they decide.

To add a planner: subclass ``Planner`` in a file of this package and register it in
``__init__.py``. ``PlanContext`` gives the schedule, the budget, the cost model and a
simulator of candidate decisions (peak and time), which search-based planners use as their
fitness function.

Under FreeLunch compression (planners/compress.py) the context carries the codec
(``PlanContext.codec``): every candidate is simulated with the compressed copies its
decisions will have (``compress_map``), and ``copy_cost`` gives the per-tensor copy and codec
seconds the cost-based planners weigh (costs.py), so a planner decides with the copies the
run will make.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..clock import makespan
from ..costmodel import CostModel
from ..liveness import frees_for
from ..policy import Policy
from ..schedule import Step
from ..tensors import Kind

KEEP, SWAP, RECOMPUTE = "keep", "swap", "recompute"
COMPRESS = "compress"        # swapped, compressed at a fixed rate (planners/compress.py)

#: the pool under a planner: free after last use, compaction, and LRU eviction only as the
#: fallback when a planned move was not enough (so a plan never fails where bytes exist)
PLANNED = Policy("planned", free_dead=True, offload=True, recompute=False, compact_first=True,
                 description="a planner's decisions, LRU eviction as the fallback")
PLANNED_NO_EVICT = Policy("planned-static", free_dead=True, offload=False, recompute=False,
                          description="a planner's decisions only")


@dataclass
class Decisions:
    steps: list[Step]
    policy: Policy = PLANNED
    offload_after: dict = field(default_factory=dict)    # step position -> [TensorInfo]
    prefetch_after: dict = field(default_factory=dict)   # step position -> [TensorInfo]
    recompute_report: object = None
    tensors: dict = field(default_factory=dict)          # tensor name -> KEEP | SWAP | RECOMPUTE
    info: dict = field(default_factory=dict)             # planner-specific (e.g. MILP gap)
    compress: dict = field(default_factory=dict)         # tensor id -> codec rate (2 or 4)
    # tensor id -> the step position after which a planned offload's block is released
    # (its copy done by then, swap.release_points); absent: the step after its offload
    release_after: dict = field(default_factory=dict)

    def counts(self) -> dict:
        out = {KEEP: 0, SWAP: 0, RECOMPUTE: 0}
        for v in self.tensors.values():
            out[v] = out.get(v, 0) + 1
        return out


def feature_map(t) -> bool:
    """What FreeLunch compresses: a float32 activation (recomputed ones included; never a
    gradient, a parameter or the data batch)."""
    return t.kind == Kind.ACTIVATION and np.dtype(t.dtype) == np.float32


class PlanContext:
    """What a planner sees: the schedule, the budget (bytes or None), the cost model, and a
    simulator of candidate decisions on this executor's virtual twin."""

    def __init__(self, ex, budget: int | None, cost: CostModel | None = None):
        self._ex = ex
        self.schedule = ex.schedule
        self.batch = ex.batch
        self.budget = budget
        self.cost = cost or CostModel.analytic("h100", dtype=ex.dtype)
        # per steps list (a planner simulates the same steps under several decisions): its
        # frees, tensor uses and cumulative compute time, each derived once
        self._derived: dict = {}
        # the last few simulations with events (decisions, arena, result): the executor reuses
        # the one of the decisions a planner returns instead of simulating them again
        self._sims: list[tuple] = []
        self._pinned: list[tuple] = []
        self.simulated_steps = 0        # steps simulated so far (every candidate's whole run)
        # FreeLunch (planners/compress.py): the codec every feature map goes to the host with,
        # set before planning; None: copies are full size
        self.codec = None

    def step_time(self, step) -> float:
        return self.cost.step_time(step, self.batch) + self.cost.step_overhead

    def _memo(self, what: str, steps, make):
        key = what, id(steps)
        hit = self._derived.get(key)
        if hit is not None and hit[0] is steps:
            return hit[1]
        if len(self._derived) >= 16:        # a search makes many step lists: keep the newest
            self._derived.pop(next(iter(self._derived)))
        value = make()
        self._derived[key] = (steps, value)     # holding steps keeps its id unique
        return value

    def frees(self, steps, free_dead: bool = True) -> list:
        """Liveness's frees of these steps (memory/liveness.py), once per list."""
        return self._memo(("frees", free_dead), steps, lambda: frees_for(steps, free_dead))

    def uses(self, steps) -> tuple[dict, dict]:
        """swap.uses of these steps, once per list (do not modify the dicts)."""
        from .swap import uses
        return self._memo("uses", steps, lambda: uses(steps))

    def cum_time(self, steps) -> list:
        """cum[k]: compute seconds of steps[:k], once per list."""
        def make():
            cum, acc, st = [0.0], 0.0, self.step_time
            for s in steps:
                acc += st(s)
                cum.append(acc)
            return cum
        return self._memo("cum", steps, make)

    def compress_map(self, steps) -> dict:
        """Decisions.compress for these steps under the context's codec: every feature map
        they touch (empty without a codec)."""
        if self.codec is None:
            return {}
        rate = self.codec.rate
        return self._memo("compress", steps, lambda: {
            t.id: rate for s in steps for t in s.reads + s.writes if feature_map(t)})

    def copy_cost(self, t, compressed: bool = True) -> tuple[float, float]:
        """Seconds of one copy of ``t`` between device and host, and of one codec pass over it
        (0.0: it goes as it is). Compressed, a copy moves ``codec.nbytes`` and each way one
        pass touches the tensor and its compressed bytes (the clock's encode and decode).
        ``compressed=False``: as if there were no codec."""
        if not compressed or self.codec is None or not feature_map(t):
            return self.cost.copy_time(t.nbytes), 0.0
        m = self.codec.nbytes(t.nbytes // t.dtype.itemsize)
        return self.cost.copy_time(m), self.cost.codec_time(t.nbytes + m)

    def copy_pricings(self) -> list[tuple[bool, str | None]]:
        """(compressed, log label) per way a cost-based planner prices its copies: as they
        are without a codec; under one both compressed and full-size (capuchin.py and
        checkmate.py search each and keep the faster plan)."""
        if self.codec is None:
            return [(True, None)]
        return [(True, "compressed"), (False, "full-size")]

    def evict_s_per_byte(self, compressed: bool = True, nbytes: int = 1 << 30) -> float:
        """Seconds per byte the tensor cache pays to evict a feature map of ``nbytes`` and
        bring it back (out and back, with the codec's passes when compressed): the linear
        price of evicted bytes in the MILP and the DQN's features. The evictions of a
        compressed run go through the codec like planned offloads (memory/compressed_swap.py),
        so pricing them full size overstates what the cache costs there."""
        if not compressed or self.codec is None:
            return 2 * self.cost.copy_time(nbytes) / nbytes
        m = self.codec.nbytes(nbytes // 4)
        return 2 * (self.cost.copy_time(m) + self.cost.codec_time(nbytes + m)) / nbytes

    @property
    def copy_fraction(self) -> float:
        """The fewest bytes a copy moves per byte of tensor: 1, or the codec's ratio (a
        lower bound for bounds on copy time: not every tensor is a feature map)."""
        if self.codec is None:
            return 1.0
        n = 1 << 20
        return self.codec.nbytes(n) / (4 * n)

    def simulate(self, d: Decisions, arena="budget", events: bool = False,
                 trace: bool = False) -> dict:
        """One iteration of these decisions in an arena (default: the budget; None:
        unbounded); ``trace``: with the per-step rows (executor.TraceRow)."""
        arena = self.budget if arena == "budget" else arena
        self.simulated_steps += len(d.steps)       # a planner's measured effort
        v = copy.copy(self._ex)
        v.planner = None
        # with the compression its decisions will have (planners/compress.py)
        run = d if d.compress or self.codec is None else \
            dataclasses.replace(d, compress=self.compress_map(d.steps))
        v._apply_decisions(run, self.frees(d.steps, d.policy.free_dead))
        r = v.simulate(arena, trace=trace, events=events)
        if events:
            self._sims = [x for x in self._sims[-3:] if x[0] is not d] + [(d, arena, r)]
        return r

    def pin(self, d: Decisions) -> None:
        """Keep the simulation of ``d`` (a search's best so far) for ``simulated`` however
        many candidates are simulated after it."""
        self._pinned = [x for x in self._sims if x[0] is d][-1:] or self._pinned

    def simulated(self, d: Decisions, arena) -> dict | None:
        """The simulation (with events) of exactly these decisions in this arena, if one of
        the last few (or the pinned one) was."""
        for dd, a, r in self._sims + self._pinned:
            if dd is d and a == arena:
                return r
        return None

    def evaluate(self, d: Decisions, arena="budget", static: bool = False) -> dict:
        """fits, peak and simulated seconds of a candidate (the planners' fitness).
        ``static``: without the LRU fallback, so only the planned moves count."""
        if static:
            d = dataclasses.replace(d, policy=PLANNED_NO_EVICT)
        r = self.simulate(d, arena, events=True)
        if not r["fits"]:
            return {"fits": False, "peak_bytes": None, "time_s": float("inf"),
                    "error": r["error"]}
        t = makespan(r["events"], d.steps, self.batch, self.cost).makespan_s
        return {"fits": True, "peak_bytes": r["peak_bytes"], "time_s": t, "error": None}


class Planner:
    name = ""
    description = ""

    def plan(self, ctx: PlanContext) -> Decisions:
        raise NotImplementedError
