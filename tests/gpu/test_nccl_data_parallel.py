"""The NCCL data-parallel path on one GPU (world size 1, no mpirun needed: MPI initializes as a
singleton): through DataParallel it must train exactly as plain CUDA training."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_nccl_world_of_one_trains_like_plain_cuda(deterministic_kernels):
    pytest.importorskip("mpi4py")
    pytest.importorskip("cupy.cuda.nccl")
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "distributed"))
    from dp_nets import global_batches, net
    from neuron.distributed import DataParallel
    from neuron.distributed.nccl import NcclComm
    from neuron.executor import Executor
    from neuron.optim import SGD

    def make():
        return Executor(net(True), 4, device="cuda", seed=3, optimizer=SGD(lr=0.2))
    plain, wrapped = make(), make()
    dp = DataParallel(wrapped, NcclComm(timeout_s=60), check_every=1)
    for x, y in global_batches(4):
        assert plain.train_step(x, y) == dp.train_step(x, y)
    a, b = plain.state_dict(), wrapped.state_dict()
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    assert not differ, differ
