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


@pytest.mark.parametrize("overlap", [False, True])
def test_nccl_collectives_on_the_tape_give_eager_bits(deterministic_kernels, overlap):
    """The collectives (forced in a world of one) as host operations on the tape: 6 replayed
    steps give the bits of 6 eager ones; a graph cannot hold them, so the tape runs."""
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
    comm = NcclComm(timeout_s=60)
    runs = []
    for replay in ("off", "graph"):
        ex = Executor(net(True), 4, device="cuda", seed=3, optimizer=SGD(lr=0.2),
                      replay=replay, **({"grad_buckets": 600} if overlap else {}))
        dp = DataParallel(ex, comm, check_every=1, force_collectives=True)
        losses = [dp.train_step(x, y) for x, y in global_batches(4, steps=6)]
        runs.append((losses, ex.state_dict(), ex.replay, dp.allreduce_calls))
    (l0, s0, _, c0), (l1, s1, info, c1) = runs
    assert l0 == l1 and c0 == c1
    assert all(s0[k].tobytes() == s1[k].tobytes() for k in s0)
    assert info["ran"] == "tape" and info["replayed_iterations"] >= 3, info
    assert "collective" in info["tape_because"], info
