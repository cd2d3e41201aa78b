"""Data-parallel training of one Executor per rank (DDP semantics).

Each rank holds a full replica and trains on its shard of every global batch; gradients are
averaged per layer at the executor's gradient hook, between a layer's backward kernel and its
optimizer update (the update runs per layer inside backward), so every rank applies the same
averaged gradient and the replicas stay identical. The all-reduce works in place on the plan's
own PARAM_GRAD tensors: they are resident at the hook (the step has just written them) and are
counted, evicted and offloaded by the pool like any other tensor, so a rank's plan under its own
budget is the same with or without data parallelism.

With an executor planned with ``grad_buckets`` (distributed/overlap.py) the all-reduce
overlaps backward instead: a bucket's collective starts after its last layer's backward step,
in-flight collectives are progressed at every backward step, and the bucket's deferred updates
wait for it a few steps later. Which one runs is the plan's choice, not this object's.

The loss each rank computes is its shard's mean, so its gradients are of that mean; averaging
them over equal shards gives the gradient of the global batch's mean, which is what one process
at K x batch computes.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from ..kernels.channels_last import storage_view
from ..recording import collective, host_call, kernel_module, per_iteration
from .comm import Communicator, ParameterDivergenceError
from .overlap import is_deferred
from .sync_bn import SyncBatchNormKernels


class DataParallel:
    """Attach to an executor: ``dp = DataParallel(ex, comm)``; then ``dp.train_step(x, y)``
    with this rank's shard, or ``dp.shard(xg, yg)`` of a global batch first.

    sync_bn: BatchNorm normalizes with statistics of the global batch (default: per replica).
    check_every: compare parameter checksums across ranks every N iterations (0: never).
    force_collectives: run the gradient all-reduces and the loss gather even in a world of one
    (skipped there by default: they change nothing), so that a one-GPU run measures what the
    communication path costs (bench/data_parallel.py, the kit's nccl stage).
    """

    def __init__(self, executor, comm: Communicator, *, sync_bn: bool = False,
                 check_every: int = 100, force_collectives: bool = False):
        if executor.device.computes is False:
            raise ValueError("data parallelism needs a computing device, not a virtual one")
        self.ex, self.comm = executor, comm
        self.sync_bn, self.check_every = bool(sync_bn), int(check_every)
        self.rank, self.world_size = comm.rank, comm.world_size
        self._collect = comm.world_size > 1 or bool(force_collectives)
        self._sync_kernels = None
        if self.sync_bn and comm.world_size > 1:
            self._sync_kernels = SyncBatchNormKernels(executor.device.kernels, comm)
        executor.dp = self
        self.allreduce_calls = 0
        self.allreduce_bytes = 0
        # exposed: seconds backward was blocked on collectives; span: from the start of each
        # collective to when it was seen complete (its duration, as far as polling can tell)
        self.allreduce_wait_s = 0.0
        self.allreduce_span_s = 0.0
        self.overlap = is_deferred(executor.steps)
        self._pending: dict = {}        # bucket index -> comm Pending
        # every rank initialized from the same seed: instead of sending the weights, check that
        # they agree (cheap, and it catches a rank that built a different network)
        self.check_parameters(when="at start")

    # ---- executor hooks ------------------------------------------------------------
    def kernels(self, base):
        """The kernels a step runs with (sync-BN wraps the batch-norm ones; recorded whole,
        all-reduces included, when ``base`` records a tape)."""
        if self._sync_kernels is None:
            return base
        return kernel_module(base, self._sync_kernels)

    def reduce_gradients(self, step, dparams: dict) -> None:
        """Called per backward step after the layer's kernel, before its updates. Blocking
        plan: average this layer's gradients (one collective per layer). Overlapping plan:
        progress the collectives in flight, start this step's bucket, finish the due ones.
        Each collective is a host operation of the iteration (recording.host_call): a replayed
        iteration issues the same collectives at the same points, on every rank."""
        if not self._collect:
            return
        if self.overlap:
            return self._overlap_step(step)
        # channels-last weights (--layout nhwc) reduced as their storage: a sum is elementwise
        grads = [storage_view(dparams[pname]) for pname, _, _, _ in step.updates]
        if not grads:
            return
        name, k = step.layer.name, self.ex._k
        what = per_iteration(k, lambda it: f"all-reduce of {name}'s gradients (iteration {it})",
                             self.ex.iteration)
        host_call(k, self._allreduce_mean, grads, what)

    def _overlap_step(self, step) -> None:
        k = self.ex._k
        if self._pending:
            host_call(k, self._progress)
        b = step.bucket
        if b is not None:
            view = self.ex.pool.view
            layers = f"{', '.join(b.layers[:3])}{', ...' if len(b.layers) > 3 else ''}"
            what = per_iteration(k, lambda it: f"all-reduce of gradient bucket {b.index} "
                                 f"({layers}; iteration {it})", self.ex.iteration)
            self._pending[b.index] = host_call(k, self._start,
                                               [storage_view(view(g)) for g in b.grads()], what)
        for d in step.due:
            host_call(k, self._finish, self._pending.pop(d.index))

    # the collectives themselves: what a tape records and replays
    @collective
    def _allreduce_mean(self, grads, what) -> None:
        t0 = time.perf_counter()
        self.comm.allreduce_mean(grads, what)
        dt = time.perf_counter() - t0
        self.allreduce_wait_s += dt
        self.allreduce_span_s += dt
        self.allreduce_calls += 1
        self.allreduce_bytes += sum(int(g.nbytes) for g in grads)

    @collective
    def _progress(self) -> None:
        self.comm.progress()

    @collective
    def _start(self, grads, what):
        self.allreduce_calls += 1
        self.allreduce_bytes += sum(int(g.nbytes) for g in grads)
        return self.comm.start_allreduce_sum(grads, what)

    @collective
    def _finish(self, h) -> None:
        t0 = time.perf_counter()
        self.comm.wait(h)
        self.allreduce_wait_s += time.perf_counter() - t0
        self.allreduce_span_s += (h.t_done or time.perf_counter()) - h.t_start
        self.comm.sum_to_mean(h.arrays)

    @collective
    def _wait(self, h) -> None:
        self.comm.wait(h)

    def waiter(self, bucket):
        """For the pool: the call that waits for this bucket's collective (before a move)."""
        h = self._pending.get(bucket.index)
        return None if h is None else (lambda: host_call(self.ex._k, self._wait, h))

    def comm_stats(self) -> dict:
        return {"allreduce_calls": self.allreduce_calls, "allreduce_bytes": self.allreduce_bytes,
                "allreduce_wait_s": self.allreduce_wait_s,
                "allreduce_span_s": self.allreduce_span_s, "overlap": self.overlap}

    # ---- training ----------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        return self.ex.batch * self.world_size

    def shard(self, xg, yg):
        """This rank's slice of a global batch (rank r takes samples [r*b, (r+1)*b))."""
        b = self.ex.batch
        if len(xg) != self.global_batch or len(yg) != self.global_batch:
            raise ValueError(f"global batch has {len(xg)} samples and {len(yg)} labels; "
                             f"{self.world_size} ranks x batch {b} need {self.global_batch}")
        sl = slice(self.rank * b, (self.rank + 1) * b)
        return xg[sl], yg[sl]

    def train_step(self, x, y) -> float:
        """One iteration on this rank's shard; returns the global batch's mean loss."""
        try:
            loss = self.ex.train_step(x, y)
        finally:
            self._pending.clear()       # every bucket is due by the last backward step
        if self._collect:
            self.comm.flush(f"gradient all-reduces of iteration {self.ex.iteration - 1}")
            losses = self.comm.allgather(np.float64(loss), f"loss of iteration "
                                         f"{self.ex.iteration - 1}")
            loss = float(np.mean(losses))
        if self.check_every and self.ex.iteration % self.check_every == 0:
            self.check_parameters()
        return loss

    # ---- replica consistency -----------------------------------------------------
    def _state(self):
        return [(t.name, t) for t in self.ex.state_tensors]

    def check_parameters(self, when: str | None = None) -> None:
        """Compare a CRC of every parameter, buffer and optimizer-state tensor with rank 0's;
        raise naming the first tensor (in route order) that differs on any rank."""
        if self.world_size == 1:
            return
        names, crcs = [], []
        for name, t in self._state():
            names.append(name)
            crcs.append(zlib.crc32(np.ascontiguousarray(self.ex._value(t)).view(np.uint8)))
        mine = np.array(crcs, dtype=np.int64)
        when = when or f"after iteration {self.ex.iteration}"
        shapes = self.comm.allgather(np.int64(len(mine)), f"parameter check {when}")
        if len(set(int(s) for s in shapes)) != 1:
            raise ParameterDivergenceError(
                f"rank {self.rank}: ranks hold different numbers of state tensors "
                f"{[int(s) for s in shapes]} {when}: the replicas are different networks")
        all_crcs = self.comm.allgather(mine, f"parameter check {when}")
        for i, name in enumerate(names):
            vals = [int(c[i]) for c in all_crcs]
            if len(set(vals)) > 1:
                bad = [r for r, v in enumerate(vals) if v != vals[0]]
                raise ParameterDivergenceError(
                    f"rank {self.rank}: replicas diverged {when}: tensor {name} differs on "
                    f"rank(s) {bad} from rank 0 (first diverging of {len(names)} state tensors)")
