"""Planning without a GPU: `neuron plan`, `deepest`, `widest`.

Everything here runs the executor's own scheduling on a VirtualDevice (offsets, no storage, no
kernels), so what it says about a budget is what a real run on that budget does.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from .errors import MemoryBudgetError
from .executor import Executor, no_gc
from .fuse import fused_counts
from .graph import Graph
from .memory.chunking import CHUNK_COUNTS

#: bisection stops when the bracket is within this fraction (and one block) of the answer
MIN_BUDGET_TOLERANCE = 0.01


def lower_bound(ex: Executor, *, ideal: bool = False) -> tuple[int, int]:
    """Layer-granularity bound: max over steps of the bytes that step needs resident, plus
    what stays resident all iteration (parameters and optimizer state unless offloaded).
    Returns (bound, max_step_bytes).

    neuron's own (default): its steps as they run (recompute steps included), each with the
    workspace it prefers. ``ideal``: the bound of the mathematics, over the forward and
    backward steps of the layers, each holding only the tensors the layer reads and writes
    (with its parameters and their gradients): no temporaries, no workspace. Convolution
    workspaces shrink to none when they do not fit, so the ideal bound is also a true lower
    bound on neuron's minimum budget."""
    block = ex.block
    rnd = lambda n: -(-max(n, 1) // block) * block       # noqa: E731 (heap rounding)
    on_host = ex.host_blocks()
    resident = sum(rnd(t.nbytes) for t in ex.persistent if t.id not in on_host)
    per_step = 0
    for s in (ex.schedule.steps if ideal else ex.steps):
        b = sum(rnd(t.nbytes) for t in s.tensors() if not t.persistent or t.id in on_host)
        if s.workspace_bytes and not ideal:
            b += rnd(s.workspace_bytes)
        per_step = max(per_step, b)
    return per_step + resident, per_step


def tensor_bytes_by_dtype(ex: Executor) -> dict[str, dict[str, int]]:
    """Every tensor of the iteration (its baseline: each in a buffer of its own), bytes by
    dtype name and kind: what a precision changes, before any planning."""
    out: dict[str, dict[str, int]] = {}
    for t in ex.schedule.registry.tensors:
        if t.members:
            continue                    # a block: counted as its members
        kinds = out.setdefault(t.dtype_name, {})
        kinds[t.kind.value] = kinds.get(t.kind.value, 0) + t.nbytes
    return out


def min_budget(ex: Executor, unbounded: dict, lb: int) -> int:
    """Smallest arena the search finds in which the policy completes an iteration.

    With compaction (the default but for baseline) and no eviction it is the peak, exactly.

    Under LRU eviction, fitting is not monotone in the arena size (a smaller arena evicts
    differently and can fragment less), so a still smaller arena may happen to work: the
    answer is a tight, verified budget, not a proof that nothing smaller fits.

    Baseline (no eviction, no compaction, one workspace that never shrinks) makes the same
    choices in any arena that holds its unbounded extent, and any smaller arena fails at the
    allocation that reached it: the answer is the extent. Otherwise, search upward from the lower bound: grow the
    excess exponentially until a simulation fits, then narrow the bracket. Large plans test
    two candidates at a time in two forked processes (the search is the cost of planning a
    10^4-layer network; the simulations are independent)."""
    extent = unbounded["arena_bytes"]
    if not ex.policy.offload:
        if ex.compact:
            # compaction makes the free space one block whenever it is short, and without
            # eviction the tensor bytes in use do not depend on the arena; a workspace that
            # does not fit shrinks to none: the tensors' own high-water mark is exact
            for cand in (unbounded["tensor_peak_bytes"], unbounded["peak_bytes"]):
                if ex.simulate(cand, trace=False)["fits"]:
                    return cand
            return extent
        if not ex.policy.free_dead:
            return extent           # baseline: one shared workspace that never shrinks
        # first-fit without compaction: a smaller arena shrinks workspaces differently, so
        # the run's layout changes with the arena: search as under eviction
    block = ex.block
    with _ParallelMap(lambda a: ex.simulate(a, trace=False)["fits"],
                      parallel=len(ex.steps) >= PARALLEL_MIN_STEPS) as fits_all:
        lo, hi, step = lb, None, max(block, lb // 32)
        cands = [lb, lb + step]
        while hi is None:                       # exponential phase
            cands = [min(c, extent) for c in cands]
            res = fits_all(cands)
            for c, ok in zip(cands, res):
                if ok or c >= extent:
                    hi = c
                    break
                lo = c
            if hi is None:
                step *= 4
                cands = [lo + step // 2, lo + step]
        if hi == lb:
            return lb
        while hi - lo > max(block, int(hi * MIN_BUDGET_TOLERANCE)):    # narrowing phase
            k = fits_all.width
            cands = sorted({(lo + (hi - lo) * (i + 1) // (k + 1)) // block * block
                            for i in range(k)} - {lo, hi})
            cands = [c for c in cands if lo < c < hi]
            if not cands:
                break
            for c, ok in zip(cands, fits_all(cands)):
                if ok:
                    hi = c
                    break
                lo = c
    return hi


_FORK_FN = None          # what forked workers call (inherited, not pickled)


def _call_forked(arg):
    return _FORK_FN(arg)


def _ignore_sigint():
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _ParallelMap:
    """fn over a list of arguments: two at a time in forked workers when asked to and two cores
    are there, else one by one in order (stopping at the first true result: the searches here
    look for the first fit and ignore what comes after it)."""

    def __init__(self, fn, parallel: bool):
        self.fn, self.pool, self.width = fn, None, 1
        if parallel and (os.cpu_count() or 1) >= 2:
            try:
                import multiprocessing as mp
                global _FORK_FN
                _FORK_FN = fn
                # workers ignore Ctrl-C: the parent stops the search and says so in one line
                self.pool = mp.get_context("fork").Pool(2, initializer=_ignore_sigint)
                self.width = 2
            except (OSError, ValueError):
                self.pool = None

    def __call__(self, args: list) -> list:
        if self.pool is not None and len(args) > 1:
            return self.pool.map(_call_forked, args)
        out = []
        for a in args:
            out.append(bool(self.fn(a)))
            if out[-1]:
                out += [True] * (len(args) - len(out))
                break
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        global _FORK_FN
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
        _FORK_FN = None
        return False


#: plans this long (in steps) search with two processes
PARALLEL_MIN_STEPS = 20_000


@dataclass
class Plan:
    """One planned iteration, the single source of `neuron plan` and `neuron memory`.

    ``report``: what `plan --json` prints. ``executor``: the virtual executor whose plan (its
    steps and, with a planner, its decisions for ``budget``) every figure under the budget
    comes from; ``record`` replays exactly that plan with a log of every memory event.
    """
    report: dict
    executor: Executor
    budget: int | None

    def record(self, arena: int | None = None):
        """(Recording, run) of this plan's iteration in ``arena`` bytes (default: the budget;
        None and no budget: an unbounded arena): memory/recorder.py."""
        from .memory.recorder import record_plan
        return record_plan(self.executor, self.budget if arena is None else arena)


def plan(graph: Graph, batch: int, **kw) -> dict:
    """The report of :func:`make_plan` (its keyword arguments), as `neuron plan --json`."""
    return make_plan(graph, batch, **kw).report


def make_plan(graph: Graph, batch: int, *, policy: str = "superneurons",
              budget: int | None = None, offload_params: bool = False,
              recompute_strategy: str = "cost", host_budget: int | None = None,
              tensor_cache: bool = True, compact: bool | None = None, dtype=np.float32,
              precision=None, search_min: bool = True, chunks=1, model: str | None = None, trace: bool = True,
              cost=None, timed: bool | None = None, planner=None, comm=None,
              grad_buckets: int | None = None, grad_lag: int | None = None,
              prefetch_ahead=1, layout=None, fuse: bool = False,
              resident_params: int | None = None) -> Plan:
    """``cost`` (a memory.costmodel.CostModel): what a planner plans with, and what times the
    iteration when ``timed`` (default: whenever a cost model is given; `plan --time`);
    ``comm`` (distributed/cost.py RingModel): with data parallelism's all-reduces on the clock;
    ``grad_buckets`` (bytes): the runtime's overlap, as `train --data-parallel` runs it (each
    bucket's updates deferred ``grad_lag`` backward steps, its gradients live until then:
    distributed/overlap.py). ``prefetch_ahead``: steps ahead the pool prefetches, or "auto"
    (memory/prefetch_horizon.py). ``fuse``: BatchNorm + ReLU and Add + ReLU pairs as one
    layer (neuron/fuse.py); the report then names them and the bytes the fusion saves.
    ``planner`` (a name in memory/planners): its decisions for ``budget`` replace the policy.
    ``chunks``: every layer split along the batch into that many chunks
    (memory/chunking.py); "auto" takes the smallest count that fits the budget (1 without a
    budget, or when none fits).

    Two plans are in play when a planner plans for a budget: the one for the budget (peak,
    moves, host peak and time under it) and the one for no budget, which gives the figures
    that do not depend on ``budget``: the peak in an unbounded arena, the minimum budget (the
    smallest arena that plan completes in) and the layer bounds. Without a planner, or
    without a budget, they are one plan."""
    t0 = time.perf_counter()
    timed = cost is not None if timed is None else bool(timed)
    if timed and cost is None:
        raise ValueError("plan: timing the iteration needs a cost model (cost=)")
    kw = dict(policy=policy, offload_params=offload_params,
              recompute_strategy=recompute_strategy, host_budget=host_budget,
              tensor_cache=tensor_cache, compact=compact, dtype=dtype, precision=precision,
              prefetch_ahead=prefetch_ahead, layout=layout,
              **({"fuse": True} if fuse else {}),
              **({"resident_params": resident_params} if resident_params else {}))
    more = dict(planner=planner, cost=cost, grad_buckets=grad_buckets, grad_lag=grad_lag)
    ex = None
    for_budget = bool(planner) and budget is not None      # a planner plans for the budget
    if chunks == "auto":        # the search's executor: a planner plans once, not again
        chunks, ex = (_choose(graph, batch, budget, **kw, **more) if budget is not None
                      else None) or (1, None)
    if ex is None:
        try:
            ex = Executor(graph, batch, device="virtual", chunks=chunks,
                          budget=budget if planner else None, **kw, **more)
        except MemoryBudgetError:
            if not for_budget:
                raise
            # the parameters alone exceed the budget: report that as the policy's plans do
            # (does not fit, and the minimum), from the planner's plan for no budget
            ex = Executor(graph, batch, device="virtual", chunks=chunks, **kw, **more)
            for_budget = False
    # the plan for no budget: the same executor unless a planner planned for the budget
    ref = Executor(graph, batch, device="virtual", chunks=ex.chunks, **kw, **more) \
        if for_budget else ex
    unbounded = ref.simulate(None, trace=trace and budget is None)
    if not unbounded["fits"]:           # only the host budget can fail an unbounded arena
        raise unbounded["error"]
    lb, max_step = lower_bound(ref)
    ideal, ideal_step = lower_bound(ref, ideal=True)
    mb = min_budget(ref, unbounded, ideal) if search_min else None
    run = unbounded
    if budget is not None or timed:
        run = ex.simulate(budget, trace=trace, events=timed)
    fits = run["fits"]
    rep = ex.recompute_report
    out = {
        "model": model or graph.name, "batch": batch, "policy": ex.policy.name,
        "offload_params": offload_params, "recompute_strategy": recompute_strategy
        if ex.policy.recompute and ex.chunks == 1 else None,
        # memory/chunking.py: the policy does not rewrite a chunked schedule for
        # recomputation (a planner does: it plans every chunk's tensors)
        "recompute_off_for_chunks": bool(ex.decisions is None and ex.policy.recompute
                                         and ex.chunks > 1),
        "budget_bytes": budget, "fits": fits, "chunks": ex.chunks,
        "peak_bytes": run["peak_bytes"] if fits else None,
        "unbounded_peak_bytes": unbounded["peak_bytes"],
        "min_budget_bytes": mb, "lower_bound_bytes": lb, "max_step_bytes": max_step,
        "ideal_bound_bytes": ideal, "ideal_max_step_bytes": ideal_step,
        "min_budget_vs_lower_bound": round(mb / lb, 4) if mb else None,
        "min_budget_vs_ideal_bound": round(mb / ideal, 4) if mb else None,
        "params": graph.num_params(),
        "extra_forward_steps": rep.extra_forward_steps if rep else 0,
        "offload_bytes": run.get("offload_bytes", 0) if fits else None,
        "prefetch_bytes": run.get("prefetch_bytes", 0) if fits else None,
        # parameter blocks that left without a copy (--offload-params: their host copy held)
        "clean_evicted_bytes": run.get("clean_evicted_bytes", 0) if fits else None,
        "compactions": run.get("compactions") if fits else None,
        "compacted_bytes": run.get("compacted_bytes") if fits else None,
        "cache_hits": run.get("cache_hits") if fits else None,
        "cache_misses": run.get("cache_misses") if fits else None,
        "host_peak_bytes": run.get("host_peak_bytes") if fits else None,
        "bytes_by_kind": run.get("bytes_by_kind_at_peak") if fits else None,
        "precision": ex.precision.name,
        "layout": ex.layout,        # storage only: the bytes are the same in either layout
        # each tensor at its own type (neuron/precision); workspaces are in bytes_by_kind
        "bytes_by_dtype": run.get("bytes_by_dtype_at_peak") if fits else None,
        "tensor_bytes_by_dtype": tensor_bytes_by_dtype(ex),
        "num_steps": len(ex.steps), "num_layers": len(ex.train_graph.route),
        "error": str(run["error"]) if not fits else None,
    }
    if fuse:
        out.update(_fusion_report(graph, batch, ex, unbounded, chunks=ex.chunks,
                                  **{k: v for k, v in kw.items() if k != "fuse"}, **more))
    if ex.decisions is not None:
        from .memory.planners.report import decisions_report
        out.update(decisions_report(ex, planner))
    if timed and fits:
        from .memory.clock import time_report
        out.update(time_report(ex, run, cost, timeline=trace, comm=comm))
    if trace and fits:
        out["steps"] = [r.as_dict() for r in run["trace"]]
    out["plan_seconds"] = round(time.perf_counter() - t0, 3)
    return Plan(out, ex, budget)


def _fusion_report(graph, batch, fused_ex, fused_unbounded, **kw) -> dict:
    """What ``--fuse`` changes: the fused (BN or Add, ReLU) pairs and how many of each fused
    type, the bytes of the tensors that no longer exist (each BN or Add output and its
    gradient) and the unbounded peak against the unfused plan's (planned the same way)."""
    plain = Executor(graph, batch, device="virtual", **kw)
    peak = plain.simulate(None, trace=False)["peak_bytes"]
    sched = plain.schedule
    gone = 0
    for first, _ in fused_ex.fused:
        t = plain.train_graph.layers[first].outputs[0]
        gone += sum(x.nbytes for x in sched.values(t))
        gone += sum(g.nbytes for g in _grads_of(sched, t))
    return {"fuse": True, "fused_layers": [list(p) for p in fused_ex.fused],
            "fused_counts": fused_counts(fused_ex.graph),
            "fused_tensor_bytes": gone, "unfused_unbounded_peak_bytes": peak,
            "fuse_saved_peak_bytes": peak - fused_unbounded["peak_bytes"]}


def _grads_of(sched, t):
    """The gradient tensors of symbolic tensor t: one, or one per chunk."""
    keys = [id(t)] if sched.chunks == 1 else [(id(t), c) for c in range(sched.chunks)]
    return [sched.grad[k] for k in keys if k in sched.grad]


def fits(graph: Graph, batch: int, budget: int, chunks=1, **kw) -> bool:
    """Whether an iteration fits the budget; ``chunks="auto"``: with some chunk count."""
    if chunks == "auto":
        return choose_chunks(graph, batch, budget, **kw) is not None
    return _fitting(graph, batch, budget, chunks, **kw) is not None


def _fitting(graph: Graph, batch: int, budget: int, chunks, **kw) -> Executor | None:
    """The virtual executor of this plan if it fits the budget, else None."""
    planner = kw.get("planner")
    try:
        if planner:
            # below the layer bound nothing fits: known without planning (HOME's search
            # takes seconds, and `--chunks auto` asks several chunk counts)
            plain = Executor(graph, batch, device="virtual", chunks=chunks,
                             **{k: v for k, v in kw.items() if k not in ("planner", "cost")})
            if lower_bound(plain, ideal=True)[0] > budget:
                return None
        # a planner decides for the budget it is asked about
        ex = Executor(graph, batch, device="virtual", chunks=chunks,
                      budget=budget if planner else None, **kw)
    except MemoryBudgetError:
        return None
    if lower_bound(ex, ideal=True)[0] > budget:
        return None                 # no need to simulate: below the bound nothing fits
    return ex if ex.simulate(budget, trace=False)["fits"] else None


def choose_chunks(graph: Graph, batch: int, budget: int, **kw) -> int | None:
    """The smallest chunk count (memory/chunking.py CHUNK_COUNTS) whose plan fits the
    budget, or None (a planner's too: it plans each count's chunk tensors)."""
    found = _choose(graph, batch, budget, **kw)
    return found[0] if found else None


def _choose(graph: Graph, batch: int, budget: int, **kw) -> tuple[int, Executor] | None:
    """choose_chunks, with the executor of the count it chose."""
    for k in CHUNK_COUNTS:
        if k > batch:
            break
        ex = _fitting(graph, batch, budget, k, **kw)
        if ex is not None:
            return k, ex
    return None


@dataclass
class Probe:
    value: int
    fits: bool
    seconds: float


def search_max(ok, start: int = 1, limit: int = 1 << 20, progress=None,
               parallel: bool = False) -> tuple[int | None, list]:
    """Largest k >= start with ok(k) true, assuming monotonicity: exponential, then bisection.

    With ``parallel`` (and two cores), two candidates are tested per round in forked workers:
    k*2 and k*4 while growing, the thirds of the bracket while narrowing."""
    probes: list[Probe] = []
    with _ParallelMap(ok, parallel) as run:

        def test(cands: list[int]) -> list[bool]:
            t = time.perf_counter()
            res = run(cands)
            dt = (time.perf_counter() - t) / len(cands)
            for c, r in zip(cands, res):
                probes.append(Probe(c, r, dt))
                if progress:
                    progress(c, r)
            return res

        if not test([start])[0]:
            return None, probes
        lo, hi = start, None
        while hi is None:
            cands = sorted({min(lo * 2, limit), min(lo * 4, limit)} - {lo})[:run.width]
            if not cands:
                return lo, probes           # lo is the limit
            for c, r in zip(cands, test(cands)):
                if not r:
                    hi = c
                    break
                lo = c
        while hi - lo > 1:
            k = run.width
            cands = sorted({lo + (hi - lo) * (i + 1) // (k + 1) for i in range(k)} - {lo, hi})
            for c, r in zip(cands, test(cands)):
                if not r:
                    hi = c
                    break
                lo = c
        return lo, probes


# depth families: index k -> depth
DEPTH_FAMILIES = {
    "resnet": (lambda k: 3 * (6 + 32 + k + 6) + 2, "n3"),        # SuperNeurons Table 4
    "resnet_cifar": (lambda k: 6 * k + 2, "n"),
    "densenet_cifar": (lambda k: 6 * k + 4, "n"),
}


def deepest(model: str, batch: int, budget: int, *, progress=None, **kw) -> dict:
    from .models import build_model
    if model not in DEPTH_FAMILIES:
        raise ValueError(f"deepest: {model!r} has no depth parameter; choose one of "
                         f"{', '.join(DEPTH_FAMILIES)}")
    to_depth, _ = DEPTH_FAMILIES[model]

    def ok(k):
        with no_gc():
            return fits(build_model(model, depth=to_depth(k)), batch, budget, **kw)

    # every probe builds and plans a network of up to 10^5 layers: two at a time
    k, probes = search_max(ok, 1, limit=1 << 16, parallel=True,
                           progress=(lambda k, r: progress(to_depth(k), r)) if progress else None)
    return {"model": model, "batch": batch, "budget_bytes": budget,
            "deepest": to_depth(k) if k else None,
            "probes": [{"depth": to_depth(p.value), "fits": p.fits,
                        "seconds": round(p.seconds, 3)} for p in probes], **_kw_report(kw)}


def widest(model: str, budget: int, *, depth: int | None = None, progress=None, **kw) -> dict:
    from .models import build_model
    graph = build_model(model, depth=depth)
    b, probes = search_max(lambda b: fits(graph, b, budget, **kw), 1, limit=1 << 20,
                           progress=progress)
    chunks = kw.get("chunks", 1)
    if chunks == "auto" and b is not None:
        chunks = choose_chunks(graph, b, budget, **{k: v for k, v in kw.items()
                                                    if k != "chunks"})
    return {"model": model, "depth": depth, "budget_bytes": budget, "widest": b,
            "chunks": chunks,
            "probes": [{"batch": p.value, "fits": p.fits, "seconds": round(p.seconds, 3)}
                       for p in probes], **_kw_report(kw)}


def _kw_report(kw) -> dict:
    return {"policy": kw.get("policy", "superneurons"), "planner": kw.get("planner"),
            "precision": str(kw.get("precision") or "fp32"),
            "layout": str(kw.get("layout") or "nchw"),
            "offload_params": kw.get("offload_params", False),
            "chunking": kw.get("chunks", 1), **({"fuse": True} if kw.get("fuse") else {})}
