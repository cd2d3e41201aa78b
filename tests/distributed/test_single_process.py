"""Data parallelism without MPI: a world of one through the same code path, the replica check,
the all-reduce time model, and the plan/CLI wiring."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dp_nets import global_batches, make_executor

from neuron.cli.main import main
from neuron.distributed import (DataParallel, LocalComm, ParameterDivergenceError,
                                ring_allreduce_seconds)
from neuron.distributed.comm import make_comm
from neuron.distributed.cost import allreduce_plan
from neuron.models import build_model


def test_world_of_one_is_plain_training_bitwise():
    plain, wrapped = make_executor(4, True), make_executor(4, True)
    dp = DataParallel(wrapped, LocalComm(), sync_bn=True, check_every=1)
    for x, y in global_batches(4):
        assert plain.train_step(x, y) == dp.train_step(*dp.shard(x, y))
    a, b = plain.state_dict(), wrapped.state_dict()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


class FakeTwoRanks(LocalComm):
    """Rank 0 of two, where rank 1's copy of one tensor differs."""
    world_size = 2

    def __init__(self, corrupt_index):
        self.corrupt_index = corrupt_index

    def allgather(self, value, what):
        other = np.array(value, copy=True)
        if np.ndim(other) and self.corrupt_index is not None:
            other[self.corrupt_index] += 1
        return [value, other]


def test_diverged_replicas_name_the_first_differing_tensor():
    ex = make_executor(4, False)
    dp = DataParallel(ex, FakeTwoRanks(None), check_every=0)     # agree at start
    names = [t.name for t in ex.state_tensors]
    dp.comm.corrupt_index = 3
    with pytest.raises(ParameterDivergenceError, match=rf"tensor {names[3]} differs on "
                       r"rank\(s\) \[1\]"):
        dp.check_parameters()


def test_shard_checks_the_global_batch():
    dp = DataParallel(make_executor(4, False), FakeTwoRanks(None), check_every=0)
    x, y = next(global_batches(8))
    xs, ys = dp.shard(x, y)
    assert np.array_equal(xs, x[:4]) and np.array_equal(ys, y[:4])
    with pytest.raises(ValueError, match="2 ranks x batch 4 need 8"):
        dp.shard(x[:6], y[:6])


def test_ring_allreduce_model():
    gb = 1e9
    # 2 ranks: each sends half of the bytes twice -> n / bandwidth
    assert ring_allreduce_seconds(gb, 2, 8.0, latency_s=0) == pytest.approx(1.0)
    # many ranks: approaches 2 n / bandwidth; latency is paid 2(K-1) times per call
    assert ring_allreduce_seconds(gb, 1000, 8.0, latency_s=0) == pytest.approx(1.998)
    assert ring_allreduce_seconds(0, 4, 8.0) == 0.0
    assert ring_allreduce_seconds(gb, 1, 8.0) == 0.0
    assert (ring_allreduce_seconds(gb, 4, 8.0, latency_s=1e-3, calls=10)
            - ring_allreduce_seconds(gb, 4, 8.0, latency_s=0)) == pytest.approx(10 * 6 * 1e-3)
    for bad in [dict(nbytes=-1, world_size=2, link_gbps=1), dict(nbytes=1, world_size=0,
                link_gbps=1), dict(nbytes=1, world_size=2, link_gbps=0)]:
        with pytest.raises(ValueError):
            ring_allreduce_seconds(**bad)


def test_allreduce_plan_counts_trainable_gradients_per_layer():
    g = build_model("resnet_cifar", depth=8)
    d = allreduce_plan(g, np.float32, 4, 100)
    trainable = sum(int(np.prod(s.shape)) for _, _, _, s in g.params() if s.trainable)
    running_stats = sum(int(np.prod(s.shape)) for _, _, _, s in g.params() if not s.trainable)
    assert running_stats > 0 and d["allreduce_bytes"] == 4 * trainable      # not BN's buffers
    assert d["allreduce_calls"] == len({l.name for _, l, _, s in g.params() if s.trainable})


def test_plan_json_has_allreduce_time(capsys):
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--no-min-budget",
               "--data-parallel", "4", "--link-gbps", "10", "--json"])
    out = capsys.readouterr().out
    r = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and "all-reduce (ring, 4 ranks, 10 Gbit/s)" in out
    assert r["allreduce_time_s"] == pytest.approx(ring_allreduce_seconds(
        r["data_parallel"]["allreduce_bytes"], 4, 10, calls=r["data_parallel"]["allreduce_calls"]))


def test_sync_bn_needs_data_parallel(capsys):
    assert main(["train", "resnet_cifar", "--depth", "8", "--iters", "1", "--sync-bn"]) == 2
    assert "--sync-bn needs --data-parallel" in capsys.readouterr().err


def test_unknown_engine():
    with pytest.raises(ValueError, match="unknown communication engine 'tcp'"):
        make_comm("tcp")


def test_fit_data_parallel_resumes_identically(tmp_path):
    from neuron.data import load_dataset
    from neuron.train import fit
    split = load_dataset("synthetic", seed=0, num_classes=3, sample_shape=(2, 6, 6))

    def run(**kw):
        ex = make_executor(4, True)
        dp = DataParallel(ex, LocalComm(), check_every=2)
        fit(ex, split.train, iters=6, lr=0.1, seed=5, progress=False, dp=dp, **kw)
        return ex.state_dict()

    straight = run()
    run(stop_at=3, checkpoint=str(tmp_path / "ck.npz"))
    resumed = run(resume=str(tmp_path / "ck.npz"))
    assert all(straight[k].tobytes() == resumed[k].tobytes() for k in straight)


def test_cpu_data_parallel_never_imports_cupy():
    """MPI world of one (singleton), sync-BN on: the CPU path must not touch CuPy."""
    pytest.importorskip("mpi4py")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    code = (f"import sys; sys.path[:0] = [{root!r}, {here!r}]\n"
            "from dp_nets import global_batches, make_executor\n"
            "from neuron.distributed import DataParallel, make_comm\n"
            "dp = DataParallel(make_executor(4, True), make_comm('auto', device='cpu'), "
            "sync_bn=True)\n"
            "x, y = next(global_batches(4)); dp.train_step(x, y)\n"
            "assert 'cupy' not in sys.modules, 'cupy imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_plan_time_puts_the_allreduce_on_the_clock(capsys):
    args = ["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--no-min-budget", "--time",
            "--link-gbps", "10", "--json"]
    assert main(args) == 0
    alone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args + ["--data-parallel", "2"]) == 0
    out = capsys.readouterr().out
    r = json.loads(out.strip().splitlines()[-1])
    assert "all-reduce on the clock" in out
    assert r["allreduce_time_s"] == pytest.approx(r["data_parallel"]["allreduce_time_s"])
    assert 0 < r["allreduce_exposed_s"] <= r["allreduce_time_s"]
    # the runtime's overlap by default: a few layers' updates run (and are timed) at a later
    # step, which moves their bytes between steps of the analytic model, not much else
    assert r["compute_s"] == pytest.approx(alone["compute_s"], rel=0.01)
    assert r["simulated_time_s"] == pytest.approx(r["compute_s"] + r["allreduce_exposed_s"])
    assert r["peak_bytes"] > alone["peak_bytes"]        # the deferred gradients, in the plan
    assert main(args + ["--data-parallel", "2", "--no-overlap"]) == 0
    blocking = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert blocking["peak_bytes"] == alone["peak_bytes"]
    assert blocking["simulated_time_s"] == pytest.approx(alone["simulated_time_s"]
                                                         + blocking["allreduce_exposed_s"])


def test_buckets_save_per_call_latency():
    g = build_model("resnet_cifar", depth=8)
    per_layer = allreduce_plan(g, np.float32, 4, 100)
    bucketed = allreduce_plan(g, np.float32, 4, 100, bucket_bytes=2**20)
    assert bucketed["allreduce_bytes"] == per_layer["allreduce_bytes"]
    assert bucketed["allreduce_calls"] < per_layer["allreduce_calls"]
    assert bucketed["allreduce_time_s"] < per_layer["allreduce_time_s"]


def test_bad_plan_data_parallel_options(capsys):
    for bad in (["--data-parallel", "0"], ["--data-parallel", "2", "--bucket-mb", "-1"],
                ["--data-parallel", "2", "--link-gbps", "0"],
                ["--data-parallel", "2", "--dp-lag", "-1"],
                ["--data-parallel", "2", "--dp-lag", "auto"],           # needs --time
                ["--data-parallel", "2", "--time", "--dp-lag", "auto", "--no-overlap"]):
        try:                            # a bad number stops in argparse, the rest later
            rc = main(["plan", "resnet_cifar", "--depth", "8", "--no-min-budget", *bad])
        except SystemExit as e:
            rc = e.code
        assert rc == 2, bad
        capsys.readouterr()


def test_dp_lag_is_a_number_or_auto(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "resnet_cifar", "--depth", "8", "--data-parallel", "2", "--dp-lag", "soon"])
    assert e.value.code == 2
    assert "argument --dp-lag: must be an integer (>= 0) or 'auto', got 'soon'" in capsys.readouterr().err


def test_dp_lag_auto_chooses_on_the_clock_and_train_refuses_it(capsys):
    args = ["plan", "resnet_cifar", "--depth", "8", "--batch", "8", "--no-min-budget", "--time",
            "--data-parallel", "2", "--link-gbps", "20", "--bucket-mb", "0", "--json"]
    assert main(args + ["--dp-lag", "auto"]) == 0
    out = capsys.readouterr().out
    auto = json.loads(out.strip().splitlines()[-1])
    tried = auto["dp_lag_search"]
    assert [t["lag"] for t in tried] == [3 * 2 ** i for i in range(len(tried))]
    assert auto["dp_lag"] > 3 and f"train with --dp-lag {auto['dp_lag']}" in out
    assert main(args) == 0                              # the default lag, 3
    default = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert auto["simulated_time_s"] < default["simulated_time_s"]
    assert auto["allreduce_exposed_s"] < default["allreduce_exposed_s"]
    assert main(["train", "resnet_cifar", "--depth", "8", "--iters", "1", "--data-parallel",
                 "--dp-lag", "auto"]) == 2
    assert "--dp-lag auto chooses the lag on the simulated clock" in capsys.readouterr().err


class _TwoEqualRanks(LocalComm):
    """Rank 0 of two whose peer holds the same gradients; an all-reduce takes C-contiguous
    arrays only, as MPI and NCCL do."""
    world_size = 2

    def allreduce_sum(self, arrays, what):
        for a in arrays:
            assert a.flags.c_contiguous, (what, a.shape, a.strides)
            a += a


def test_channels_last_gradients_are_reduced_as_their_storage():
    """--layout nhwc: conv weight gradients are channels-last views; the all-reduce gets their
    (contiguous) storage and the step is plain training's, bitwise."""
    plain = make_executor(4, False, layout="nhwc")
    wrapped = make_executor(4, False, layout="nhwc")
    dp = DataParallel(wrapped, _TwoEqualRanks(), check_every=0)
    for x, y in global_batches(8):
        xs, ys = dp.shard(x, y)
        assert plain.train_step(xs, ys) == dp.train_step(xs, ys)
    a, b = plain.state_dict(), wrapped.state_dict()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
