"""NCCL communicator for one process per GPU (GPU-UNVERIFIED: written against CuPy's
``cupy.cuda.nccl`` binding, never run on a GPU in this repository yet).

Bootstrapped through MPI (mpi4py): rank 0 makes the NCCL unique id and broadcasts it; a world of
one process may bootstrap without MPI (``make_comm("nccl", bootstrap="local")``). Each rank
should see only its own GPU: call ``select_local_gpu()`` before CuPy is first imported (it sets
CUDA_VISIBLE_DEVICES from the launcher's local rank), so device 0 of every process is its GPU and
the executor's arena lands there.

All-reduces run on the device's compute stream, in order with the kernels (the gradient the hook
reduces was written there; the update that follows reads the result there). An NCCL group
batches a layer's gradients into one launch. The timeout polls an event recorded after the
collective; on expiry the communicator is aborted (ncclCommAbort) so no kernel stays stuck.
"""
from __future__ import annotations

import os
import time

import numpy as np

from .communicator import (DEFAULT_TIMEOUT_S, CollectiveTimeoutError, Communicator,
                           DistributedError, MpiComm, Pending)

_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                    "SLURM_LOCALID", "LOCAL_RANK")


def local_rank() -> int:
    for v in _LOCAL_RANK_VARS:
        if v in os.environ:
            return int(os.environ[v])
    return 0


def select_local_gpu() -> int:
    """Restrict this process to the GPU of its local rank (before CuPy initializes CUDA)."""
    lr = local_rank()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s for s in visible.split(",") if s] if visible else None
    if ids is not None:
        if lr >= len(ids):
            raise DistributedError(f"local rank {lr} has no GPU: CUDA_VISIBLE_DEVICES={visible}")
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[lr]
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(lr)
    return lr


class NcclComm(Communicator):
    engine = "nccl"

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, stream=None, host=None):
        import cupy as cp
        from cupy.cuda import nccl
        self._cp, self._nccl = cp, nccl
        # bootstrap + host-side collectives: MPI, or a LocalComm for a world of one
        self.host = host if host is not None else MpiComm(timeout_s=timeout_s)
        self.rank, self.world_size = self.host.rank, self.host.world_size
        self.timeout_s = float(timeout_s)
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = self.host.bcast_object(uid, root=0)
        self.comm = nccl.NcclCommunicator(self.world_size, uid, self.rank)
        self._pending = None
        self.stream = stream            # None: CuPy's current stream (the device's compute)
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32,
                       np.dtype(np.float64): nccl.NCCL_FLOAT64,
                       np.dtype(np.float16): nccl.NCCL_FLOAT16}

    def _stream(self):
        return self.stream if self.stream is not None else self._cp.cuda.get_current_stream()

    def _check(self, arrays, what):
        for a in arrays:
            if not a.flags.c_contiguous:
                raise DistributedError(f"{what}: NCCL needs contiguous arrays, got strides "
                                       f"{a.strides} for shape {a.shape}")
            if np.dtype(a.dtype) not in self._types:
                raise DistributedError(f"{what}: no NCCL type for dtype {a.dtype}")

    def start_allreduce_sum(self, arrays, what):
        """GPU-UNVERIFIED. A bucket on a side stream (``comm_stream``): it starts after the
        compute stream's event (the gradients are written), runs while backward goes on, and
        ``wait`` makes the compute stream wait for its event on the GPU (the host does not
        block; the deferred update queued after it reads the averaged gradient)."""
        if not arrays:
            return Pending(arrays, what, done=True)
        self._check(arrays, what)
        cp, nccl = self._cp, self._nccl
        if getattr(self, "comm_stream", None) is None:
            self.comm_stream = cp.cuda.Stream(non_blocking=True)
        compute = self._stream()
        self.comm_stream.wait_event(compute.record())
        nccl.groupStart()
        try:
            for a in arrays:
                self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, self._types[np.dtype(a.dtype)],
                                    nccl.NCCL_SUM, self.comm_stream.ptr)
        finally:
            nccl.groupEnd()
        return Pending(arrays, what, event=self.comm_stream.record())

    def test(self, handle):
        if not handle.done and handle.event is not None and handle.event.done:
            handle.done = True
            handle.t_done = time.perf_counter()
        return handle.done

    def wait(self, handle):
        """Order the compute stream after the collective (device-side); flush() bounds the
        host's wait once per iteration, with the timeout."""
        if handle.event is not None and not handle.done:
            self._stream().wait_event(handle.event)
            self._pending = (handle.event, handle.what)
        handle.done = True
        handle.t_done = time.perf_counter()

    def allreduce_sum(self, arrays, what):
        if not arrays:
            return
        nccl, stream = self._nccl, self._stream()
        nccl.groupStart()
        try:
            for a in arrays:
                if not a.flags.c_contiguous:
                    raise DistributedError(f"{what}: NCCL needs contiguous arrays, got strides "
                                           f"{a.strides} for shape {a.shape}")
                dt = self._types.get(np.dtype(a.dtype))
                if dt is None:
                    raise DistributedError(f"{what}: no NCCL type for dtype {a.dtype}")
                self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, dt, nccl.NCCL_SUM,
                                    stream.ptr)
        finally:
            nccl.groupEnd()
        # no host wait here: the update that reads the result is queued behind it on the same
        # stream, so backward goes on; flush() bounds the wait once per iteration
        self._pending = (stream.record(), what)

    def flush(self, what):
        if getattr(self, "_pending", None) is not None:
            event, last = self._pending
            self._pending = None
            self._wait(event, f"{what} (last: {last})")

    def _wait(self, event, what):
        deadline = time.monotonic() + self.timeout_s
        while not event.done:
            self.comm.check_async_error()
            if time.monotonic() > deadline:
                self.comm.abort()
                raise CollectiveTimeoutError(
                    f"rank {self.rank}/{self.world_size}: {what} (NCCL) did not complete within "
                    f"{self.timeout_s:g} s: another rank died or stalled; communicator aborted")
            time.sleep(1e-5)

    def allgather(self, value, what):
        return self.host.allgather(value, what)

    def bcast_object(self, obj, root: int = 0):
        return self.host.bcast_object(obj, root)

    def abort(self, code: int = 1) -> None:
        try:
            self.comm.abort()
        finally:
            self.host.abort(code)
