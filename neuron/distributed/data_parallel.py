"""Data-parallel training of one Executor per rank (DDP semantics).

Each rank holds a full replica and trains on its shard of every global batch; gradients are
averaged per layer at the executor's gradient hook, between a layer's backward kernel and its
optimizer update (the update runs per layer inside backward), so every rank applies the same
averaged gradient and the replicas stay identical. The all-reduce works in place on the plan's
own PARAM_GRAD tensors: they are resident at the hook (the step has just written them) and are
counted, evicted and offloaded by the pool like any other tensor, so a rank's plan under its own
budget is the same with or without data parallelism.

The loss each rank computes is its shard's mean, so its gradients are of that mean; averaging
them over equal shards gives the gradient of the global batch's mean, which is what one process
at K x batch computes.
"""
from __future__ import annotations

import zlib

import numpy as np

from .comm import Communicator, ParameterDivergenceError
from .sync_bn import SyncBatchNormKernels


class DataParallel:
    """Attach to an executor: ``dp = DataParallel(ex, comm)``; then ``dp.train_step(x, y)``
    with this rank's shard, or ``dp.shard(xg, yg)`` of a global batch first.

    sync_bn: BatchNorm normalizes with statistics of the global batch (default: per replica).
    check_every: compare parameter checksums across ranks every N iterations (0: never).
    """

    def __init__(self, executor, comm: Communicator, *, sync_bn: bool = False,
                 check_every: int = 100):
        if executor.device.computes is False:
            raise ValueError("data parallelism needs a computing device, not a virtual one")
        self.ex, self.comm = executor, comm
        self.sync_bn, self.check_every = bool(sync_bn), int(check_every)
        self.rank, self.world_size = comm.rank, comm.world_size
        self._sync_kernels = None
        if self.sync_bn and comm.world_size > 1:
            self._sync_kernels = SyncBatchNormKernels(executor.device.kernels, comm)
        executor.dp = self
        self.allreduce_calls = 0
        self.allreduce_bytes = 0
        # every rank initialized from the same seed: instead of sending the weights, check that
        # they agree (cheap, and it catches a rank that built a different network)
        self.check_parameters(when="at start")

    # ---- executor hooks ------------------------------------------------------------
    def kernels(self, base):
        """The kernels a step runs with (sync-BN wraps the batch-norm ones)."""
        return self._sync_kernels if self._sync_kernels is not None else base

    def reduce_gradients(self, step, dparams: dict) -> None:
        """Called per backward step after the layer's kernel, before its update: average this
        layer's parameter gradients over the ranks (one collective per layer)."""
        grads = [dparams[pname] for pname, _, _, _ in step.updates]
        if not grads or self.world_size == 1:
            return
        self.comm.allreduce_mean(grads, f"all-reduce of {step.layer.name}'s gradients "
                                 f"(iteration {self.ex.iteration})")
        self.allreduce_calls += 1
        self.allreduce_bytes += sum(int(g.nbytes) for g in grads)

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
        loss = self.ex.train_step(x, y)
        if self.world_size > 1:
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
