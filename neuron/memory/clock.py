"""The simulated clock: an iteration's makespan from the executor's event log.

The pool and executor log what they did, in order (memory/pool.py ``log``): each step's kernel
(``step``), copies ahead of use (``prefetch``), misses (``fetch``), evictions (``offload``),
planned offloads and the release of their blocks (``offload_async``, ``drain``), compactions,
the codec's passes (``encode``/``decode``/``drop``, memory/compressed_swap.py) and evict-ahead
copies (``precopy``/``precopy_drop``, memory/evict_ahead.py). This file replays that log on a
compute stream and a copy stream (a codec stream under compression) with these dependencies:

- a copy is enqueued after all compute queued so far; a kernel waits for the prefetches of the
  tensors it reads; a miss and an eviction make compute wait for the copy (the block is reused
  at once); a planned offload keeps its block until its ``drain``, so its copy overlaps the
  steps up to it; compaction runs on the compute stream;
- an offload under compression copies after its encode, and a reader waits for its decode;
- on a device without a copy stream (the CPU) every copy runs on the compute thread.

(CudaDevice's runtime is finer than this model: per-block fences and a copy stream per
direction, memory/fences.py. Whether the model's coarser rule costs accuracy is what the GPU
kit's ``simulator`` stage measures.)

With a pipelined cost model (a GPU profile with host issue times and event-timed kernels,
memory/costmodel.py) the host is a timeline too: it issues steps and copies in the log's order,
taking each step's host time, and waits for the GPU only where a layer reads a result back
(``Layer.syncs_host``). Data parallelism (``comm``, K > 1) adds a comm stream for the gradient
all-reduces (distributed/cost.py's ring model): with the runtime's deferred updates
(distributed/overlap.py) a bucket's collective starts when its backward step ends and its due
step waits for it; without them (``--no-overlap``, chunked schedules) compute never waits and
the iteration ends when the last collective does. ``allreduce_exposed_s`` is what the comm
stream adds. A pure function of the log keeps "planning is the executor": the times are those
of the very decisions the executor made.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TimeReport:
    makespan_s: float
    compute_s: float                # kernels + per-step overhead (recomputes included)
    recompute_s: float              # of which re-run forwards ("R" steps)
    copy_s: float                   # busy time of the copy stream
    exposed_copy_s: float           # compute waiting for copies
    compaction_s: float
    bytes_moved: int
    source: str
    timeline: list = field(default_factory=list)    # (stream, start, end, what)
    codec_s: float = 0.0            # busy time of the codec stream (COMPRESS)
    allreduce_s: float | None = None        # busy time of the comm stream (None: no comm)
    allreduce_exposed_s: float = 0.0        # what it adds to the iteration
    allreduce_calls: int = 0

    @property
    def hidden_fraction(self) -> float | None:
        """Share of copy time that overlapped compute (None when nothing was copied)."""
        if self.copy_s <= 0:
            return None
        return max(0.0, 1.0 - self.exposed_copy_s / self.copy_s)

    def as_dict(self) -> dict:
        return {"simulated_time_s": self.makespan_s, "compute_s": self.compute_s,
                "recompute_s": self.recompute_s, "copy_s": self.copy_s,
                "exposed_copy_s": self.exposed_copy_s, "compaction_s": self.compaction_s,
                "bytes_moved": self.bytes_moved, "codec_s": self.codec_s,
                "copy_hidden_fraction": self.hidden_fraction,
                "cost_source": self.source,
                **({} if self.allreduce_s is None else {
                    "allreduce_time_s": self.allreduce_s,
                    "allreduce_exposed_s": self.allreduce_exposed_s,
                    "allreduce_calls_simulated": self.allreduce_calls})}


def _grad_bytes(step) -> int:
    """Bytes of parameter gradients this step finishes (0: none, or not its last chunk)."""
    if step.phase != "B" or not getattr(step, "updates", None):
        return 0
    chunk = getattr(step, "chunk", None)
    if chunk is not None and not chunk.applies_update:
        return 0
    return sum(g.nbytes for _, _, g, _ in step.updates)


def _comm_stream(ready, comm, tl) -> tuple[float, float, int]:
    """The comm stream: ``ready`` lists (time the gradients are written, bytes) in issue order.
    Returns (end, busy seconds, collectives)."""
    from ..distributed.cost import bucket_groups
    # a bucket goes when full: at the time its last part is ready
    issues = [(ready[g[-1]][0], sum(ready[i][1] for i in g))
              for g in bucket_groups([n for _, n in ready], comm.bucket_bytes)]
    end = busy = 0.0
    for t, n in issues:
        dt = comm.seconds(n)
        start = max(end, t)
        end = start + dt
        busy += dt
        if tl is not None:
            tl.append(("comm", start, end, "all-reduce"))
    return end, busy, len(issues)


def makespan(events, steps, batch: int, cost, timeline: bool = False,
             comm=None) -> TimeReport:
    """Replay an event log (from ``Executor.simulate(..., events=True)``) on the cost model.
    ``comm`` (distributed/cost.py RingModel): data parallelism's all-reduces on a third stream
    (see the module's docstring); None or a world of one: no communication."""
    dp = comm is not None and comm.world_size > 1
    grads = [] if dp else None          # (end of the step that wrote them, bytes)
    # steps with the runtime's deferred updates (distributed/overlap.py): the comm stream in
    # line, and a due step waits for its buckets; otherwise the comm stream after the replay
    deferred = dp and any(getattr(s, "bucket", None) is not None for s in steps)
    comm_free = comm_busy = comm_wait = 0.0
    bucket_end: dict[int, float] = {}
    spec = cost.spec
    overlap = spec.async_copies
    compute = copy = 0.0
    busy = recompute = copy_busy = exposed = compaction = 0.0
    moved = 0
    ready: dict[int, float] = {}        # tensor id -> end of its prefetch
    pending: dict[int, float] = {}      # tensor id -> end of its deferred offload
    early: dict[int, float] = {}        # tensor id -> end of its eviction's early copy
    codec = codec_busy = 0.0            # the codec stream (COMPRESS)
    encoded: dict[int, float] = {}      # tensor id -> end of its encode
    tl = [] if timeline else None
    pipe = getattr(cost, "pipelined", False)
    host = 0.0                          # when the host has issued everything so far (pipe)
    for ev in events:
        kind = ev[0]
        if kind == "step":
            step = steps[ev[1]]
            if pipe:
                host += cost.host_time(step, batch)
                compute = max(compute, host)
            start = compute
            for t in step.reads:
                r = ready.pop(t.id, None)
                if r is not None and r > start:
                    start = r
            exposed += start - compute
            dt = cost.step_time(step, batch) + cost.step_overhead
            compute = start + dt
            if pipe and step.phase != "B" and step.layer.syncs_host:
                host = compute          # it reads the result back: waits for the GPU
            busy += dt
            if step.phase == "R":
                recompute += dt
            if tl is not None:
                tl.append(("compute", start, compute, step.name))
            if deferred:                # the runtime's buckets: launched here, waited for
                if step.bucket is not None:
                    dtc = comm.seconds(step.bucket.nbytes)
                    c0 = max(comm_free, compute)
                    comm_free = c0 + dtc
                    bucket_end[id(step.bucket)] = comm_free
                    comm_busy += dtc
                    if tl is not None:
                        tl.append(("comm", c0, comm_free, "all-reduce"))
                if step.due:            # its updates wait for those collectives
                    w = max(bucket_end.get(id(b), 0.0) for b in step.due)
                    if w > compute:
                        comm_wait += w - compute
                        compute = w
            elif dp:
                n = _grad_bytes(step)
                if n:
                    grads.append((compute, n))
        elif kind in ("drain", "drop"):
            # a block reused once its copy is done: out of it (drain: a deferred offload's) or
            # into it (drop: a staged compressed copy evicted before its reader)
            r = (pending if kind == "drain" else ready).pop(ev[1], None)
            if r is not None and r > compute:
                exposed += r - compute
                compute = r
        elif kind in ("precopy_drop", "offload_clean"):    # (the latter: nothing copied)
            early.pop(ev[1], None)
        elif kind in ("offload", "offload_async") and ev[1] in early:
            r = early.pop(ev[1])        # copied ahead: the block waits for that copy only
            if kind == "offload_async":
                pending[ev[1]] = r
            elif overlap and r > compute:
                exposed += r - compute
                compute = r
        elif kind == "compact":
            dt = cost.move_time(ev[2])
            compute = max(compute, host)
            if tl is not None:
                tl.append(("compute", compute, compute + dt, "compact"))
            compute += dt
            compaction += dt
        elif kind in ("encode", "decode"):
            dt = cost.codec_time(ev[2])
            codec_busy += dt
            if not overlap:             # the CPU device: on the compute thread
                compute += dt
                continue
            # a decode: after its copy in and the compute queued so far (its block's last tenant)
            after = max(ready.get(ev[1], 0.0), compute) if kind == "decode" else compute
            start = max(codec, after)
            codec = start + dt
            if tl is not None:
                tl.append(("codec", start, codec, kind))
            if kind == "encode":        # the copy follows it; compute, reusing the block,
                encoded[ev[1]] = codec  # waits for it
                exposed += max(0.0, codec - compute)
                compute = max(compute, codec)
            elif ev[1] in ready:        # a prefetch: its reader waits for the decode
                ready[ev[1]] = codec
            else:                       # a fetch: compute waits now
                exposed += max(0.0, codec - compute)
                compute = max(compute, codec)
        else:                           # a copy: prefetch, fetch or offload
            nbytes = ev[2]
            moved += nbytes
            dt = cost.copy_time(nbytes)
            copy_busy += dt
            if not overlap:             # the CPU device copies on the compute thread
                if tl is not None:
                    tl.append(("copy", compute, compute + dt, kind))
                compute += dt
                exposed += dt
                continue
            start = max(copy, compute, host, encoded.pop(ev[1], 0.0))
            copy = start + dt
            if tl is not None:
                tl.append(("copy", start, copy, kind))
            if kind == "prefetch":
                ready[ev[1]] = copy
            elif kind == "precopy":
                early[ev[1]] = copy
            elif kind == "offload_async":
                pending[ev[1]] = copy
            else:                       # fetch / offload: compute waits
                exposed += copy - compute
                compute = copy
    end = max(compute, copy, codec, host)
    rep = TimeReport(end, busy, recompute, copy_busy, exposed, compaction, moved, cost.source,
                     tl or [], codec_busy)
    if comm is not None:
        rep.allreduce_s = 0.0
    if deferred:
        rep.allreduce_s, rep.allreduce_calls = comm_busy, len(bucket_end)
        rep.makespan_s = max(end, comm_free)
        # never more than the all-reduces take (all exposed: equal but for rounding)
        rep.allreduce_exposed_s = min(comm_busy, comm_wait + rep.makespan_s - end)
    elif dp and grads:
        comm_end, rep.allreduce_s, rep.allreduce_calls = _comm_stream(grads, comm, tl)
        rep.makespan_s = max(end, comm_end)
        rep.allreduce_exposed_s = rep.makespan_s - end
    return rep


def unlimited_time(steps, batch: int, cost, comm=None) -> float:
    """The same network with unlimited memory: every step once, nothing moved or recomputed
    (``comm``: with the same all-reduces on the comm stream): the clock of a log of steps
    alone."""
    return makespan([("step", i, 0) for i in range(len(steps))], steps, batch, cost,
                    comm=comm).makespan_s


def time_report(ex, run: dict, cost, timeline: bool = False, comm=None) -> dict:
    """``neuron plan --time``: this plan's simulated iteration against unlimited memory
    (``timeline``: also the streams' intervals, under the key ``timeline``; ``comm``: both
    with data parallelism's all-reduces, so ``overhead_pct`` stays the cost of the budget)."""
    rep = makespan(run["events"], run["executor"].steps, ex.batch, cost, timeline=timeline,
                   comm=comm)
    # unlimited memory, with the same deferred updates (if any) as the run
    base = unlimited_time(ex._defer(ex.schedule.steps), ex.batch, cost, comm=comm)
    out = rep.as_dict()
    out["unlimited_time_s"] = base
    out["overhead_pct"] = 100.0 * (rep.makespan_s / base - 1.0) if base > 0 else None
    out["cost_device"] = cost.spec.name
    if timeline:
        out["timeline"] = rep.timeline
    return out
