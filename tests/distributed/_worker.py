"""Run under `mpirun -n K python tests/distributed/_worker.py OUT MODE`: trains a small network
data-parallel for 3 steps and saves each rank's parameters to OUT/rank{r}.npz.

MODE: plain (no BN) | syncbn (BN, --sync-bn) | offload (no BN; superneurons policy with
parameters offloaded to the host under a tight budget) | die (rank 1 kills itself at iteration 2) |
stall (rank 1 stops taking part at iteration 2; short collective timeout) | nccl (no BN; the
GPU path on the CPU: CudaDevice, kernels/cuda.py and NcclComm over the stand-ins of
tests/kernels/cuda_standins/, whose NCCL all-reduces through MPI) | late (offload on the
stream model's device, whose copies complete late). A "+ov" suffix
(plain+ov, syncbn+ov, offload+ov, die+ov, stall+ov): the all-reduce overlaps backward, in
buckets of at least 600 bytes (several per iteration of these small networks). A "+fu" suffix
(syncbn+fu, syncbn+ov+fu): BatchNorm+ReLU fused (Executor(fuse=True)). A "+rp" suffix
(e.g. plain+rp, syncbn+ov+rp): train 6 steps twice, eagerly (replay off) and with the device's
default replay, saving both to OUT/replay{r}.npz instead. fp16 (and fp16+ov): 8 steps at fp16
from a loss scale that overflows at first, saved to OUT/fp16_{r}.npz."""
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from dp_nets import global_batches, make_executor  # noqa: E402

from neuron.distributed import DataParallel, DistributedError, MpiComm  # noqa: E402


def _gpu_path_on_standins():
    """Install the CuPy/cuDNN/NCCL stand-ins in this process; returns (device, comm)."""
    import tempfile
    from pathlib import Path

    import pytest
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "kernels"))
    import cuda_standins

    from neuron.devices.cuda import CudaDevice
    from neuron.distributed.nccl import NcclComm
    cuda_standins.install(pytest.MonkeyPatch(), Path(tempfile.mkdtemp(prefix="standin")))
    return CudaDevice(64 << 20, headroom_bytes=0), NcclComm(timeout_s=60.0)


def main(out, mode, batch):
    full = mode
    mode, overlap, rp = mode.split("+")[0], "+ov" in mode, mode.endswith("+rp")
    if rp:
        return replay_against_eager(out, mode, overlap, batch)
    if mode == "fp16":
        return fp16_overflows(out, overlap, batch)
    if mode == "nccl":
        device, comm = _gpu_path_on_standins()
    else:
        device, comm = "cpu", MpiComm(timeout_s=60.0)
    kw = {"grad_buckets": 600, "device": device} if overlap else {"device": device}
    if "+fu" in full:           # BatchNorm+ReLU fused (neuron/fuse.py) under synchronized BN
        kw["fuse"] = True
    if mode in ("offload", "late"):     # the arena holds one layer's parameters at a time
        kw.update(policy="superneurons", offload_params=True, budget=40 * 1024)
    if mode == "late":          # copies complete late, as on a GPU (tests/memory/stream_model.py)
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "memory"))
        from stream_model import StreamModelDevice
        kw["device"] = StreamModelDevice(40 * 1024, polls=3)
    ex = make_executor(batch, bn=mode == "syncbn", **kw)
    if kw.get("fuse"):
        assert ex.graph.fused == [("bn2", "r2")], ex.graph.fused
    dp = DataParallel(ex, comm, sync_bn=mode == "syncbn", check_every=1)
    if mode == "stall":     # short, but only once both ranks are set up (start-up is uneven)
        comm.timeout_s = 5.0
    losses = []
    try:
        for it, (xg, yg) in enumerate(global_batches(batch * comm.world_size)):
            if it == 2 and comm.rank == 1 and mode == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if it == 2 and comm.rank == 1 and mode == "stall":
                time.sleep(60)
            losses.append(dp.train_step(*dp.shard(xg, yg)))
    except DistributedError as e:
        print(f"neuron: error: {e}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        comm.abort(3)
    np.savez(os.path.join(out, f"rank{comm.rank}.npz"), losses=np.array(losses),
             # on the GPU a conv's workspace is what is free when it runs (dynamic): there
             # only the tensors follow the plan
             stats=np.array([dp.allreduce_calls, dp.allreduce_bytes, dp.overlap,
                             *((ex.planned["tensor_peak_bytes"], ex.pool.tensor_high_water)
                               if mode == "nccl" else
                               (ex.planned["peak_bytes"], ex.pool.high_water))]),
             **{k.replace(":", "__"): v for k, v in ex.state_dict().items()})


def replay_against_eager(out, mode, overlap, batch, steps=6):
    """The same data-parallel training with replay off and with the device's default replay
    (tape on the CPU, graph on CudaDevice, which replays a tape with collectives as a tape)."""
    if mode == "nccl":
        device, comm = _gpu_path_on_standins()
    else:
        device, comm = "cpu", MpiComm(timeout_s=60.0)
    saved = {}
    for replay in ("off", None):
        kw = {"grad_buckets": 600} if overlap else {}
        if mode == "offload":
            kw.update(policy="superneurons", offload_params=True, budget=40 * 1024)
        ex = make_executor(batch, bn=mode == "syncbn", device=device, replay=replay, **kw)
        dp = DataParallel(ex, comm, sync_bn=mode == "syncbn", check_every=1)
        losses = [dp.train_step(*dp.shard(xg, yg))
                  for xg, yg in global_batches(batch * comm.world_size, steps)]
        tag = "eager" if replay == "off" else "replay"
        info = ex.replay
        saved[f"{tag}_losses"] = np.array(losses)
        saved[f"{tag}_stats"] = np.array([dp.allreduce_calls, dp.allreduce_bytes,
                                          info["replayed_iterations"]])
        saved[f"{tag}_ran"] = np.array(info["ran"])
        saved.update({f"{tag}_{k.replace(':', '__')}": v for k, v in ex.state_dict().items()})
    np.savez(os.path.join(out, f"replay{comm.rank}.npz"), **saved)


def fp16_overflows(out, overlap, batch, steps=8):
    """fp16 with dynamic loss scaling from 2**19 (the first steps' scaled gradients overflow
    fp16): the overflow check reads the all-reduced gradients, so every rank skips the same
    steps and keeps the same scale."""
    comm = MpiComm(timeout_s=60.0)
    ex = make_executor(batch, bn=False, precision="fp16",
                       **({"grad_buckets": 600} if overlap else {}))
    ex.loss_scaler.scale = 2.0 ** 19
    dp = DataParallel(ex, comm, check_every=1)
    start = {k: v.copy() for k, v in ex.state_dict().items()}
    scales, losses = [], []
    for xg, yg in global_batches(batch * comm.world_size, steps):
        losses.append(dp.train_step(*dp.shard(xg, yg)))
        scales.append(ex.loss_scaler.scale)
    state = ex.state_dict()
    np.savez(os.path.join(out, f"fp16_{comm.rank}.npz"), scales=np.array(scales),
             losses=np.array(losses), skipped=np.array(ex.loss_scaler.skipped),
             changed=np.array(any(not np.array_equal(start[k], state[k]) for k in start
                                  if not k.startswith("loss_scale"))),
             **{k.replace(":", "__"): v for k, v in state.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4)
