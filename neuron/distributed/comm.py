"""``make_comm``: the communicator a run asks for (MPI, NCCL or a world of one).

Above both engines (communicator.py, nccl.py), so that each imports only downward; the
interface and errors are re-exported here, where callers have always found them.
"""
from __future__ import annotations

from .communicator import (DEFAULT_TIMEOUT_S, CollectiveTimeoutError,  # noqa: F401 (re-exported)
                           Communicator, DistributedError, LocalComm, MpiComm,
                           ParameterDivergenceError, Pending, RankFailureError)
from .nccl import NcclComm


def make_comm(engine: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S, device: str = "cpu",
              bootstrap: str = "mpi"):
    """mpi | nccl | local | auto (nccl on a CUDA device, else mpi). ``bootstrap`` (nccl): how
    the ranks find each other, "mpi" or "local" (a world of one process, no MPI needed: the
    one-GPU NCCL path of a machine without an MPI library)."""
    if engine == "auto":
        engine = "nccl" if device == "cuda" else "mpi"
    if engine == "local":
        return LocalComm()
    if engine == "mpi":
        return MpiComm(timeout_s=timeout_s)
    if engine == "nccl":
        if bootstrap not in ("mpi", "local"):
            raise ValueError(f"unknown NCCL bootstrap {bootstrap!r}; expected mpi or local")
        return NcclComm(timeout_s=timeout_s,
                        host=LocalComm() if bootstrap == "local" else None)
    raise ValueError(f"unknown communication engine {engine!r}; expected mpi, nccl or local")
