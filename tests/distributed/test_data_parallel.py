"""Data-parallel training under `mpirun -n 2` (CPU, MPI from the mpich + mpi4py wheels):
equivalence with one process at twice the batch, bitwise-identical replicas, failures that stop
the job instead of hanging. Each MPI case is one short job (a few seconds)."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from dp_nets import global_batches, make_executor

pytest.importorskip("mpi4py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
# the launcher that came with the MPI next to this interpreter (the mpich wheel), else PATH's
MPIEXEC = (shutil.which("mpiexec", path=os.path.dirname(sys.executable))
           or shutil.which("mpiexec"))
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install 'neuron-arena[mpi]')")
JOB_LIMIT_S = 120


def mpirun(*args, n=2, timeout=JOB_LIMIT_S):
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # -disable-auto-cleanup: the launcher signals the survivors of a dead rank instead of
    # killing them, so they get to say what happened
    cmd = [MPIEXEC, "-disable-auto-cleanup", "-n", str(n), sys.executable, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env)


def worker(tmp_path, mode, batch=4):
    t0 = time.monotonic()
    r = mpirun(os.path.join(HERE, "_worker.py"), str(tmp_path), mode, str(batch))
    return r, time.monotonic() - t0


def load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("mode", ["plain", "syncbn", "offload", "plain+ov", "syncbn+ov",
                                  "offload+ov", "nccl", "nccl+ov", "late+ov", "syncbn+fu",
                                  "syncbn+ov+fu"])
def test_two_ranks_equal_one_process_at_twice_the_batch(tmp_path, mode):
    """plain: no BN; syncbn: BN with --sync-bn; offload: no BN, each rank under a tight budget
    with parameters offloaded (the all-reduce runs on gradients the pool placed). +ov: the
    all-reduce overlaps backward in buckets, the updates deferred (distributed/overlap.py).
    nccl: NcclComm and CudaDevice with the GPU kernel module, on the CPU stand-ins. late: offload
    on a device whose copies complete late (the pool's collectives wait for them). +fu: each
    rank's BatchNorm+ReLU fused, its statistics and backward sums synchronized, against the
    unfused single process."""
    b, bn = 4, mode.startswith("syncbn")
    r, _ = worker(tmp_path, mode, b)
    assert r.returncode == 0, r.stderr
    ranks = [load(tmp_path / f"rank{i}.npz") for i in range(2)]
    single = make_executor(2 * b, bn)
    losses = [single.train_step(x, y) for x, y in global_batches(2 * b)]
    # the reported loss is the global batch's mean
    np.testing.assert_allclose(ranks[0]["losses"], losses, rtol=1e-5)
    state = single.state_dict()
    assert len(state) == len(ranks[0]) - 2      # but losses and stats
    calls, nbytes, overlap, planned_peak, high_water = ranks[0]["stats"]
    assert overlap == ("+ov" in mode)
    # every trainable gradient all-reduced once per iteration (fewer calls in buckets)
    grad_bytes = sum(g.nbytes for g in single.schedule.param_grads.values())
    assert nbytes == 3 * grad_bytes
    layers = len({q.rsplit(".", 1)[0] for q in single.schedule.param_grads})
    assert (calls < 3 * layers) if overlap else (calls == 3 * layers)
    assert high_water == planned_peak           # each rank ran its own plan
    for name, want in state.items():
        key = name.replace(":", "__")
        # the replicas: bitwise identical
        assert ranks[0][key].tobytes() == ranks[1][key].tobytes(), name
        # against one process at 2b: float32 rounding of a differently ordered sum
        np.testing.assert_allclose(ranks[0][key], want, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", ["die", "die+ov"])
def test_a_killed_rank_stops_the_other_with_a_clear_error(tmp_path, mode):
    r, seconds = worker(tmp_path, mode)
    assert r.returncode != 0
    # rank 0 says so as soon as the launcher signals it; MPI sometimes ends rank 0 before
    # it can, and then the launcher's own line names the dead rank's signal
    assert ("rank 0/2: another rank of the data-parallel job died" in r.stderr
            or "Killed (signal 9)" in r.stdout), (r.stdout, r.stderr)
    assert not (tmp_path / "rank0.npz").exists()
    assert seconds < 60


@pytest.mark.parametrize("mode", ["stall", "stall+ov"])
def test_a_stalled_rank_times_out_naming_the_collective(tmp_path, mode):
    r, seconds = worker(tmp_path, mode)
    assert r.returncode != 0
    if mode == "stall":
        assert "all-reduce of fc2's gradients (iteration 2) did not complete within 5 s" \
            in r.stderr
    else:           # the first bucket's wait, at its due step
        assert "all-reduce of gradient bucket 0 (fc2" in r.stderr
        assert "iteration 2) did not complete within 5 s" in r.stderr
    assert seconds < 60         # the stalled rank sleeps 60 s: the abort ended it


@pytest.mark.parametrize("overlap", ["--overlap", "--no-overlap"])
def test_cli_train_data_parallel_reports_global_batch_and_checkpoints_once(tmp_path, overlap):
    ck = tmp_path / "ck.npz"
    r = mpirun("-m", "neuron", "train", "resnet_cifar", "--depth", "8", "--batch", "4",
               "--iters", "2", "--data-parallel", "--sync-bn", "--no-progress", "--device",
               "cpu", "--dp-check-every", "1", "--checkpoint", str(ck), "--json", overlap,
               "--bucket-mb", "0.01")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(s) for s in r.stdout.splitlines() if s.startswith("{")]
    assert len(lines) == 1                  # rank 0 reports for the job
    res = lines[0]
    assert res["world_size"] == 2 and res["global_batch"] == 8 and res["sync_bn"]
    assert res["engine"] == "mpi" and res["allreduce_calls"] > 0
    assert res["overlap"] == (overlap == "--overlap")
    assert res["bucket_mb"] == (0.01 if overlap == "--overlap" else None)
    # rank 0's collectives: the time backward waited on them, within the training time
    assert 0 <= res["allreduce_wait_s"] <= res["seconds"]
    assert res["allreduce_bytes"] > 0 and res["allreduce_span_s"] >= 0
    assert "all-reduce (" in r.stdout and "waited" in r.stdout
    assert ck.exists()
    # only rank 0 wrote: no second temp file was left behind or renamed over it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]


@pytest.mark.parametrize("mode", ["plain", "syncbn", "offload", "plain+ov", "syncbn+ov",
                                  "offload+ov", "nccl", "nccl+ov"])
def test_replayed_data_parallel_iterations_give_eager_bits(tmp_path, mode):
    """Each rank's collectives are host operations on its tape (recording.host_call): 6 steps
    replayed give each rank the bits of the same 6 steps run eagerly, the same collectives
    (calls, bytes), and the replicas stay identical. nccl: CudaDevice over the stand-ins,
    whose default is a CUDA graph: a tape with collectives is replayed as a tape."""
    r, _ = worker(tmp_path, mode + "+rp")
    assert r.returncode == 0, r.stderr
    ranks = [load(tmp_path / f"replay{i}.npz") for i in range(2)]
    for z in ranks:
        calls, nbytes, replayed = z["replay_stats"]
        assert replayed >= 3, z["replay_stats"]        # iterations 3..5 at least
        assert str(z["replay_ran"]) == "tape"
        np.testing.assert_array_equal(z["replay_stats"][:2], z["eager_stats"][:2])
        assert z["eager_stats"][2] == 0
        assert z["replay_losses"].tobytes() == z["eager_losses"].tobytes()
        names = [k[len("eager_"):] for k in z
                 if k.startswith("eager_") and k not in ("eager_losses", "eager_stats",
                                                         "eager_ran")]
        assert names
        for name in names:
            assert z["replay_" + name].tobytes() == z["eager_" + name].tobytes(), name
            assert z["replay_" + name].tobytes() == ranks[1]["replay_" + name].tobytes(), name


@pytest.mark.parametrize("mode", ["fp16", "fp16+ov"])
def test_fp16_overflows_are_agreed_on_by_every_rank(tmp_path, mode):
    """The overflow check reads the all-reduced gradients, so an overflow on any rank is an
    overflow on every rank: all skip the same steps, shrink to the same scale, and the
    replicas stay bitwise identical (check_every=1 compares them after every step)."""
    r, _ = worker(tmp_path, mode)
    assert r.returncode == 0, r.stderr
    a, b = (load(tmp_path / f"fp16_{i}.npz") for i in range(2))
    assert int(a["skipped"]) >= 1 and int(a["skipped"]) == int(b["skipped"])
    assert int(a["skipped"]) < len(a["scales"])        # and then it trained
    assert bool(a["changed"])
    assert a["scales"].tobytes() == b["scales"].tobytes()
    assert a["scales"][-1] < 2.0 ** 19
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
