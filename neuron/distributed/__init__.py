"""Data-parallel training: one replica per process, gradients averaged per layer through MPI
(CPU processes) or NCCL (one process per GPU). See data_parallel.py."""
from .comm import (CollectiveTimeoutError, Communicator, DistributedError, LocalComm, MpiComm,
                   ParameterDivergenceError, RankFailureError, make_comm)
from .cost import ring_allreduce_seconds
from .data_parallel import DataParallel

__all__ = ["CollectiveTimeoutError", "Communicator", "DataParallel", "DistributedError",
           "LocalComm", "MpiComm", "ParameterDivergenceError", "RankFailureError", "make_comm",
           "ring_allreduce_seconds"]
