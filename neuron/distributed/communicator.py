"""Communicators: the collectives data-parallel training needs, on existing engines.
The interface, its errors and the CPU engines live here; ``comm.make_comm`` picks one.

- MpiComm: MPI through mpi4py (CPU processes; `mpirun -n K`). Every collective is started
  non-blocking and polled against a deadline, so a rank that stalls or dies makes the others
  stop with a CollectiveTimeoutError naming the collective, instead of hanging; a process-failure
  signal from the launcher (MPICH sends SIGUSR1 under `mpirun -disable-auto-cleanup`) stops them
  at once with a RankFailureError.
- NcclComm (neuron.distributed.nccl, built on this module): the same interface on CuPy arrays.
- LocalComm: world size 1, no MPI needed (plain training through the same code path).

mpi4py is imported only when an MpiComm is made: the CPU path without --data-parallel never
needs it.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import time

import numpy as np

from ..errors import NeuronError

#: seconds a collective may wait for the other ranks before the job is declared broken
DEFAULT_TIMEOUT_S = 300.0


class DistributedError(NeuronError, RuntimeError):
    """Data-parallel training cannot continue (a rank died, stalled or diverged)."""


class CollectiveTimeoutError(DistributedError):
    pass


class RankFailureError(DistributedError):
    pass


class ParameterDivergenceError(DistributedError):
    pass


class Communicator:
    """rank, world_size; allreduce_mean/sum in place on arrays of the device; allgather of small
    host values; broadcast of a host object; barrier."""
    rank = 0
    world_size = 1
    engine = "none"

    def allreduce_sum(self, arrays: list, what: str) -> None:
        raise NotImplementedError

    # ---- non-blocking: start, then test/wait (gradient buckets overlapping backward) ----
    def start_allreduce_sum(self, arrays: list, what: str) -> "Pending":
        """Start an in-place sum over the ranks of every array (one collective per array, all
        in flight together); the arrays must not be read, moved or freed until ``wait``.
        The default runs it at once (a world of one, or an engine without requests)."""
        self.allreduce_sum(arrays, what)
        return Pending(arrays, what, done=True)

    def test(self, handle: "Pending") -> bool:
        """Progress the collective without blocking; True once it has completed."""
        return handle.done

    def wait(self, handle: "Pending") -> None:
        """Block (bounded by the timeout) until the collective has completed."""
        handle.done = True

    def progress(self) -> None:
        """Let in-flight collectives advance (MPI progresses only inside MPI calls)."""

    def allreduce_mean(self, arrays: list, what: str) -> None:
        self.allreduce_sum(arrays, what)
        self.sum_to_mean(arrays)

    def sum_to_mean(self, arrays: list) -> None:
        """In place: the sums over the ranks become their means."""
        if self.world_size > 1:
            for a in arrays:
                a *= a.dtype.type(1.0 / self.world_size)

    def allgather(self, value, what: str) -> list:
        raise NotImplementedError

    def flush(self, what: str) -> None:
        """Wait (bounded by the timeout) for collectives still in flight on a device stream."""

    def barrier(self, what: str = "barrier") -> None:
        self.allgather(0, what)

    def abort(self, code: int = 1) -> None:
        pass


class Pending:
    """An in-flight collective: the arrays it works on, the engine's requests (MPI) or event
    (NCCL), and when it started and was first seen complete (for the exposed-time report)."""
    __slots__ = ("arrays", "what", "reqs", "event", "done", "t_start", "t_done")

    def __init__(self, arrays, what, reqs=None, event=None, done=False):
        self.arrays, self.what, self.reqs, self.event = arrays, what, reqs, event
        self.done = done
        self.t_start = time.perf_counter()
        self.t_done = self.t_start if done else None

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)


class LocalComm(Communicator):
    """A world of one: every collective is the identity."""
    engine = "local"

    def allreduce_sum(self, arrays, what):
        pass

    def allgather(self, value, what):
        return [value]

    def bcast_object(self, obj, root: int = 0):
        return obj


class MpiComm(Communicator):
    engine = "mpi"

    def __init__(self, comm=None, timeout_s: float = DEFAULT_TIMEOUT_S):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise DistributedError("--data-parallel on CPU needs mpi4py and an MPI library: "
                                   "pip install 'neuron-arena[mpi]' (in a checkout: pip install -e '.[mpi]') (mpi4py + mpich wheels), then "
                                   "launch with `mpirun -n K python -m neuron train ...`"
                                   ) from e
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        if timeout_s <= 0:
            raise ValueError(f"collective timeout must be positive, got {timeout_s} s")
        self.timeout_s = float(timeout_s)
        self._failed = None
        self._inflight: list = []           # started, not yet seen complete (Pending)
        self._broken = None                 # the collective whose failure stops the job
        self._install_failure_signal()

    def _install_failure_signal(self):
        """MPICH's launcher signals the surviving ranks with SIGUSR1 when one dies (with
        -disable-auto-cleanup; without it the launcher kills them itself). Python runs the
        handler between the polls of _wait, where it turns into a RankFailureError."""
        def on_failure(signum, frame):
            self._failed = signum
            # say it now: MPI may end this process before the error reaches the caller
            os.write(2, f"neuron: rank {self.rank}/{self.world_size}: another rank of the "
                     "data-parallel job died (the MPI launcher signalled a process failure); "
                     "stopping\n".encode())
        try:
            signal.signal(signal.SIGUSR1, on_failure)
        except ValueError:          # not the main thread: rely on the timeout alone
            return
        # a rank that finishes first also makes the launcher signal the others (in their
        # MPI_Finalize): from a normal exit on, the signal means nothing
        atexit.register(signal.signal, signal.SIGUSR1, signal.SIG_IGN)

    def _wait(self, req, what: str):
        self._wait_all([req], what)

    def _test_all(self, reqs, statuses, what: str) -> bool:
        done = self.MPI.Request.Testall(reqs, statuses)
        # a collective with a dead peer can "complete" with garbage: never trust it
        if self._failed is not None or (done and any(
                st.Get_error() != self.MPI.SUCCESS for st in statuses)):
            raise RankFailureError(
                f"rank {self.rank}/{self.world_size}: another rank of the data-parallel job "
                f"died (the MPI launcher signalled a process failure) during {what}; "
                "stopping")
        return done

    def _wait_all(self, reqs, what: str):
        try:
            self._poll_all(reqs, what)
        except (RankFailureError, CollectiveTimeoutError):
            self._broken = what
            raise

    def _poll_all(self, reqs, what: str):
        """Poll requests until all are done; sleep a little between polls so that the peers
        (which share the cores here) get to run."""
        deadline = time.monotonic() + self.timeout_s
        spins = 0
        statuses = [self.MPI.Status() for _ in reqs]
        while True:
            done = self._test_all(reqs, statuses, what)
            if done:
                return
            if time.monotonic() > deadline:
                raise CollectiveTimeoutError(
                    f"rank {self.rank}/{self.world_size}: {what} did not complete within "
                    f"{self.timeout_s:g} s: another rank died or stalled; stopping "
                    "(--dp-timeout sets the limit)")
            spins += 1
            if spins > 64:
                time.sleep(2e-5 if spins < 4096 else 1e-3)

    def allreduce_sum(self, arrays, what):
        """In place, one non-blocking collective per array, all in flight together: no
        staging buffer outside the arena (the arrays are the plan's own gradient tensors)."""
        self.wait(self.start_allreduce_sum(arrays, what))

    def start_allreduce_sum(self, arrays, what):
        """One Iallreduce request per array, started together; progressed by ``test`` /
        ``progress`` (MPICH has no progress thread by default: a request advances only inside
        MPI calls, so the executor tests the in-flight buckets at every backward step)."""
        if self.world_size == 1 or not arrays:
            return Pending(arrays, what, done=True)
        for a in arrays:
            if not a.flags.c_contiguous:
                raise DistributedError(f"{what}: MPI all-reduce needs contiguous arrays, got "
                                       f"strides {a.strides} for shape {a.shape}")
        reqs = [self.comm.Iallreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM) for a in arrays]
        h = Pending(arrays, what, reqs=reqs)
        self._inflight.append(h)
        return h

    def test(self, handle):
        if not handle.done:
            statuses = [self.MPI.Status() for _ in handle.reqs]
            if self._test_all(handle.reqs, statuses, handle.what):
                self._complete(handle)
        return handle.done

    def wait(self, handle):
        if not handle.done and self._broken is not None:
            # the job is stopping (the error was raised once): the clean-up that frees the
            # other buckets' gradients must not wait out the timeout again for each
            handle.done = True
            return
        if not handle.done:
            self._wait_all(handle.reqs, handle.what)
            self._complete(handle)

    def _complete(self, handle):
        handle.done, handle.t_done = True, time.perf_counter()
        if handle in self._inflight:
            self._inflight.remove(handle)

    def progress(self):
        for h in list(self._inflight):
            self.test(h)

    def allgather(self, value, what):
        if self.world_size == 1:
            return [value]
        send = np.atleast_1d(np.asarray(value))
        recv = np.empty((self.world_size, *send.shape), send.dtype)
        self._wait(self.comm.Iallgather(send, recv), what)
        return [r if np.ndim(value) else r[0] for r in recv]

    def bcast_object(self, obj, root: int = 0):
        return self.comm.bcast(obj, root=root)

    def abort(self, code: int = 1) -> None:
        if self.world_size > 1:
            sys.stderr.flush()
            time.sleep(0.5)         # let the launcher forward the error line before the kill
            self.comm.Abort(code)
            os._exit(code)          # MPI_Abort may return before the launcher ends us
