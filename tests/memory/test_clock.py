"""The simulated clock, the cost model and profiles (issue 12)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from neuron.memory.clock import makespan
from neuron.memory.costmodel import PROFILE_FORMAT, CostModel, DeviceSpec, ProfileError, layer_key
import neuron as nn
from neuron.models import build_model
from neuron.plan import plan


class FixedCost:
    """1 s per step, 1 s per MiB copied, nothing else: times a reader can check by hand."""
    def __init__(self, async_copies):
        self.spec = DeviceSpec("test", 1, 1, 1, 0, 0, async_copies)
        self.step_overhead, self.source = 0.0, "test"

    def step_time(self, step, batch):
        return 1.0

    def copy_time(self, nbytes):
        return nbytes / 2**20

    def move_time(self, nbytes):
        return 0.5

    codec_time = CostModel.codec_time       # a pass over memory at spec.mem_bandwidth


def _steps(n, sync_at=None):
    """n forward steps, each reading its own tensor; step ``sync_at`` reads back to the host."""
    t = [SimpleNamespace(id=i) for i in range(n)]
    return [SimpleNamespace(reads=[t[i]], name=f"s{i}", phase="F",
                            layer=SimpleNamespace(syncs_host=i == sync_at))
            for i in range(n)], t


def test_prefetch_hides_under_compute_on_two_streams():
    steps, _ = _steps(3)
    mib = 2**20
    # prefetch of tensor 2 issued after step 0 (2 s copy) overlaps step 1, step 2 waits 1 s
    ev = [("step", 0, 0), ("prefetch", 2, 2 * mib), ("step", 1, 0), ("step", 2, 0)]
    r = makespan(ev, steps, 1, FixedCost(True))
    assert r.makespan_s == pytest.approx(4.0)
    assert r.copy_s == pytest.approx(2.0) and r.exposed_copy_s == pytest.approx(1.0)
    assert r.hidden_fraction == pytest.approx(0.5)
    # the same log on a device that copies on the compute thread: nothing hides
    r = makespan(ev, steps, 1, FixedCost(False))
    assert r.makespan_s == pytest.approx(5.0) and r.hidden_fraction == pytest.approx(0.0)


def test_offload_and_miss_make_compute_wait_and_compaction_is_on_compute():
    steps, _ = _steps(2)
    mib = 2**20
    ev = [("step", 0, 0), ("offload", 0, mib), ("compact", 1, 10), ("fetch", 0, mib),
          ("step", 1, 0)]
    r = makespan(ev, steps, 1, FixedCost(True))
    # 1 (step) + 1 (offload, waited) + 0.5 (compaction) + 1 (miss) + 1 (step)
    assert r.makespan_s == pytest.approx(4.5)
    assert r.bytes_moved == 2 * mib and r.compaction_s == pytest.approx(0.5)


def test_a_deferred_offload_overlaps_the_next_step_and_its_reuse_waits():
    steps, _ = _steps(3)
    mib = 2**20
    # offload of 1.5 s after step 0 overlaps step 1 (1 s); the drain after step 1 waits 0.5 s
    ev = [("step", 0, 0), ("offload_async", 0, int(1.5 * mib)), ("step", 1, 0), ("drain", 0, 0),
          ("step", 2, 0)]
    r = makespan(ev, steps, 1, FixedCost(True))
    assert r.makespan_s == pytest.approx(3.5) and r.exposed_copy_s == pytest.approx(0.5)
    r = makespan(ev, steps, 1, FixedCost(False))
    assert r.makespan_s == pytest.approx(4.5)


def test_a_compressed_offload_waits_for_its_encode_and_copies_after_it():
    steps, _ = _steps(3)
    mib = 2**20
    # device memory at 1 MiB/s: an encode touching 0.5 MiB takes 0.5 s
    cost = FixedCost(True)
    cost.spec = cost.spec.__class__("test", 1, mib, 1, 0, 0, True)
    ev = [("step", 0, 0), ("encode", 0, mib // 2), ("offload_async", 0, mib), ("step", 1, 0),
          ("drain", 0, 0), ("step", 2, 0)]
    r = makespan(ev, steps, 1, cost)
    # step 0 ends at 1; compute waits for the encode (1.5); the copy (1 s) runs 1.5-2.5 beside
    # step 1 (1.5-2.5); the drain finds it done; step 2 ends at 3.5
    assert r.makespan_s == pytest.approx(3.5) and r.codec_s == pytest.approx(0.5)
    assert r.exposed_copy_s == pytest.approx(0.5)       # the encode's wait


def test_a_staged_decode_waits_for_compute_and_a_dropped_one_for_its_copy():
    """A prefetched compressed tensor is decoded when its reader is issued (after the compute
    queued, its block's last tenant) and the reader waits for the decode; one evicted before
    its reader ("drop") moves nothing, compute only waits for the copy into its staging block."""
    steps, _ = _steps(4)
    mib = 2**20
    cost = FixedCost(True)
    cost.spec = cost.spec.__class__("test", 1, mib, 1, 0, 0, True)
    # the copy in (0.5 s) ends at 1.5, during step 1; the decode (0.5 s) is issued after step 1
    # and runs 2-2.5, not from 1.5; step 2 waits for it
    ev = [("step", 0, 0), ("prefetch", 2, mib // 2), ("step", 1, 0), ("decode", 2, mib // 2),
          ("step", 2, 0)]
    r = makespan(ev, steps, 1, cost)
    assert r.makespan_s == pytest.approx(3.5) and r.codec_s == pytest.approx(0.5)
    # copied in from 1 to 3 (beside step 1), dropped after step 1: compute waits until 3
    ev = [("step", 0, 0), ("prefetch", 3, 2 * mib), ("step", 1, 0), ("drop", 3, 0),
          ("step", 2, 0)]
    r = makespan(ev, steps, 1, cost)
    assert r.makespan_s == pytest.approx(4.0) and r.bytes_moved == 2 * mib
    assert r.exposed_copy_s == pytest.approx(1.0)


def test_unlimited_liveness_time_is_the_sum_of_steps_and_budgets_cost_time():
    g = build_model("resnet_cifar", depth=20)
    cost = CostModel.analytic("h100")
    free = plan(g, 8, policy="liveness", cost=cost, search_min=False, trace=False)
    assert free["simulated_time_s"] == pytest.approx(free["unlimited_time_s"])
    assert free["overhead_pct"] == pytest.approx(0.0)
    tight = plan(g, 8, policy="superneurons", budget=int(free["peak_bytes"] * 0.6),
                 cost=cost, search_min=False, trace=False)
    assert tight["fits"]
    assert tight["bytes_moved"] == tight["offload_bytes"] + tight["prefetch_bytes"] > 0
    assert tight["simulated_time_s"] > free["simulated_time_s"]
    assert 0.0 <= (tight["copy_hidden_fraction"] or 0.0) <= 1.0


def _profile_for(g, batch, tmp_path, **over):
    from neuron.memory.costmodel import cpu_spec
    from neuron.executor import Executor
    ex = Executor(g, batch, device="virtual", policy="liveness")
    entries = {layer_key(s.layer, s.phase, batch): 1e-3 for s in ex.steps}
    prof = {"format": PROFILE_FORMAT, "device": "cpu", "device_detail": cpu_spec().detail,
            "dtype": "float32", "model": "resnet_cifar", "batch": batch, "entries": entries,
            "step_overhead_s": 0.0, **over}
    p = tmp_path / "p.json"
    p.write_text(json.dumps(prof))
    return str(p)


def test_profile_times_are_used_and_other_geometry_or_device_is_refused(tmp_path):
    g = build_model("resnet_cifar", depth=20, in_shape=(3, 8, 8))
    cost = CostModel.from_profile(_profile_for(g, 4, tmp_path))
    r = plan(g, 4, policy="liveness", cost=cost, search_min=False, trace=False)
    assert r["simulated_time_s"] == pytest.approx(1e-3 * r["num_steps"])
    with pytest.raises(ProfileError, match="no entry for step .* batch 4"):
        plan(g, 8, policy="liveness", cost=cost, search_min=False, trace=False)
    with pytest.raises(ProfileError, match="measured on 'another cpu'"):
        CostModel.from_profile(_profile_for(g, 4, tmp_path, device_detail="another cpu"))
    with pytest.raises(ProfileError, match="float16"):
        CostModel.from_profile(_profile_for(g, 4, tmp_path), dtype=np.float16)
    # format 1's keys omitted the padding: its times may belong to another geometry
    with pytest.raises(ProfileError, match="old profile .*re-run `neuron profile`"):
        CostModel.from_profile(_profile_for(g, 4, tmp_path, format="neuron-profile-1"))


@pytest.mark.parametrize("a, b", [
    # same input and output shapes, different arithmetic: each pair needs its own profile time
    (nn.Conv2d(4, 3, 3, padding=0), nn.Conv2d(4, 3, 3, padding=1)),
    (nn.Conv2d(4, 3, 4, dilation=1), nn.Conv2d(4, 3, 4, dilation=2)),
    (nn.Conv2d(4, 3, 3, padding=1, groups=1), nn.Conv2d(4, 3, 3, padding=1, groups=4)),
    (nn.MaxPool2d(3, 3, 0), nn.MaxPool2d(3, 3, 1)),
    (nn.AvgPool2d(3, 3, 0), nn.AvgPool2d(3, 3, 1)),
    (nn.LRN(size=3), nn.LRN(size=5)),
])
def test_profile_keys_tell_geometries_with_equal_shapes_apart(a, b):
    for layer in (a, b):
        layer(nn.Input((4, 9, 9)))
    assert a.outputs[0].shape == b.outputs[0].shape
    assert layer_key(a, "F", 2) != layer_key(b, "F", 2)
    assert layer_key(a, "B", 2) != layer_key(b, "B", 2)


def test_neuron_profile_measures_every_step_geometry(tmp_path):
    from neuron.memory.profile import profile_model
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    prof = profile_model(g, 2, repeat=1)
    from neuron.executor import Executor
    ex = Executor(g, 2, device="virtual", policy="superneurons")
    keys = {layer_key(s.layer, s.phase, 2) for s in ex.steps}
    assert keys <= set(prof["entries"]) and all(v > 0 for v in prof["entries"].values())
    assert prof["measured_iteration_s"] > 0


# ---- pipelined host and GPU (a GPU profile with host issue and event times) ----------------

class PipelinedCost(FixedCost):
    """GPU kernels of ``gpu`` s, each issued by the host in ``host`` s."""
    pipelined = True

    def __init__(self, host, gpu):
        super().__init__(True)
        self.host, self.gpu = host, gpu

    def step_time(self, step, batch):
        return self.gpu

    def host_time(self, step, batch):
        return self.host


def test_pipelined_host_and_gpu_overlap_the_slower_sets_the_pace():
    from neuron.memory.clock import unlimited_time
    steps, _ = _steps(4)
    ev = [("step", i, 0) for i in range(4)]
    # GPU-bound: the host issues step i+1 while the GPU runs step i: 0.1 + 4 x 1
    assert makespan(ev, steps, 1, PipelinedCost(0.1, 1.0)).makespan_s == pytest.approx(4.1)
    # host-bound: the GPU waits on the host: 4 x 1 + the last kernel's 0.1
    assert makespan(ev, steps, 1, PipelinedCost(1.0, 0.1)).makespan_s == pytest.approx(4.1)
    # serial charging (the model without host times) would give 4 x 1.1 for both
    assert unlimited_time(steps, 1, PipelinedCost(0.1, 1.0)) == pytest.approx(4.1)
    assert unlimited_time(steps, 1, PipelinedCost(1.0, 0.1)) == pytest.approx(4.1)


def test_pipelined_host_waits_at_a_read_back():
    """The loss reads its value back: the host issues nothing more until the GPU has run
    everything queued before it."""
    from neuron.memory.clock import unlimited_time
    ev = [("step", i, 0) for i in range(4)]
    steps, _ = _steps(4, sync_at=1)
    # GPU-bound: host issues 0, 1 by 0.2 s; GPU ends step 1 at 2.1; the host waits till then,
    # issues step 2 at 2.2, which starts then: 2.2 + 2 x 1
    cost = PipelinedCost(0.1, 1.0)
    assert makespan(ev, steps, 1, cost).makespan_s == pytest.approx(4.2)
    assert unlimited_time(steps, 1, cost) == pytest.approx(4.2)
    steps, _ = _steps(4)
    assert makespan(ev, steps, 1, cost).makespan_s == pytest.approx(4.1)


def test_pipelined_copies_start_no_earlier_than_the_host_issues_them():
    steps, _ = _steps(3)
    mib = 2**20
    # host-bound (1 s to issue, 0.1 s kernels): the prefetch after step 0 is issued at 1 s and
    # queued behind step 0's kernel (ends 1.1), copies 2 s (ends 3.1); step 2 is issued at 3 s
    # and waits 0.1 s for it
    ev = [("step", 0, 0), ("prefetch", 2, 2 * mib), ("step", 1, 0), ("step", 2, 0)]
    r = makespan(ev, steps, 1, PipelinedCost(1.0, 0.1))
    assert r.makespan_s == pytest.approx(3.2) and r.exposed_copy_s == pytest.approx(0.1)
    # the same copy issued by a fast host (0.1 s) starts at 0.2: step 2 waits 2 s minus what
    # steps 1-2 cover
    r = makespan(ev, steps, 1, PipelinedCost(0.1, 0.1))
    assert r.makespan_s == pytest.approx(2.3) and r.exposed_copy_s == pytest.approx(2.2 - 0.3)


def test_a_gpu_profile_with_host_and_event_times_is_pipelined(tmp_path):
    from neuron.memory.profile import pipelined_entries
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    from neuron.executor import Executor
    ex = Executor(g, 2, device="virtual", policy="liveness")
    n = len(ex.steps)
    # two rounds: the faster of each step's times is kept; the host did 1 ms of its own work
    # per step beyond issuing kernels
    rounds = [{"host": [2e-3] * n, "gpu": [5e-3] * n, "issued_s": 3e-3 * n, "wall_s": 1.0},
              {"host": [3e-3] * n, "gpu": [4e-3] * n, "issued_s": 4e-3 * n, "wall_s": 2.0}]
    # the loss step's host time includes its wait for the GPU: its own synchronized timing
    # (6.5 ms) less its kernels' (4 ms) is what the host spends there
    loss = [k for k, s in enumerate(ex.steps) if s.phase != "B" and s.layer.syncs_host]
    assert len(loss) == 1
    pe = pipelined_entries(ex.steps, 2, rounds, [6.5e-3 if k in loss else 9e-3
                                                 for k in range(n)])
    assert pe["host_overhead_s"] == pytest.approx(1e-3)
    assert pe["pipelined_iteration_s"] == 1.0
    assert set(pe["gpu_entries"].values()) == {4e-3}
    loss_key = layer_key(ex.steps[loss[0]].layer, "F", 2)
    assert pe["host_entries"][loss_key] == pytest.approx(2.5e-3)
    assert {v for k, v in pe["host_entries"].items() if k != loss_key} == {2e-3}
    pe["host_entries"][loss_key] = 2e-3     # a uniform host for the arithmetic below
    keys = {layer_key(s.layer, s.phase, 2) for s in ex.steps}
    prof = {"format": PROFILE_FORMAT, "device": "h100", "dtype": "float32",
            "entries": {k: 9e-3 for k in keys}, "step_overhead_s": 1e-4, **pe}
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps(prof))
    cost = CostModel.from_profile(str(p))
    assert cost.pipelined and cost.describe()["pipelined"]
    r = plan(g, 2, policy="liveness", cost=cost, search_min=False, trace=False)
    # GPU-bound (4 ms kernels, 3 ms to issue each), the host waiting at the loss (step L):
    # the GPU ends step L at 3 ms + (L+1) x 4 ms; the host issues step L+1 3 ms later
    L = loss[0]
    assert r["simulated_time_s"] == pytest.approx(3e-3 + 4e-3 * (L + 1) + 3e-3
                                                  + 4e-3 * (n - L - 1))
    serial = cost.serial()
    assert not serial.pipelined
    r = plan(g, 2, policy="liveness", cost=serial, search_min=False, trace=False)
    assert r["simulated_time_s"] == pytest.approx((9e-3 + 1e-4) * n)


# ---- data parallelism: the comm stream (issue 15) ---------------------------------------

def _backward_steps(n, grad_bytes):
    """n backward steps, each finishing its layer's parameter gradients of ``grad_bytes``."""
    t = [SimpleNamespace(id=i) for i in range(n)]
    g = SimpleNamespace(nbytes=grad_bytes)
    return [SimpleNamespace(reads=[t[i]], name=f"b{i}", phase="B", chunk=None,
                            updates=[("w", None, g, [])]) for i in range(n)]


class SecondsPerCall:
    """A collective model whose every call takes ``dt`` seconds."""
    def __init__(self, world_size, dt, bucket_bytes=0):
        self.world_size, self.dt, self.bucket_bytes = world_size, dt, bucket_bytes

    def seconds(self, nbytes):
        return self.dt


def test_comm_stream_overlaps_later_backward_and_ends_the_iteration():
    steps = _backward_steps(3, 100)
    ev = [("step", i, 0) for i in range(3)]
    # 1 s per step and 1.5 s per all-reduce: issued at 1, 2, 3 -> run 1-2.5, 2.5-4, 4-5.5
    r = makespan(ev, steps, 1, FixedCost(True), comm=SecondsPerCall(2, 1.5), timeline=True)
    assert r.makespan_s == pytest.approx(5.5) and r.compute_s == pytest.approx(3.0)
    assert r.allreduce_s == pytest.approx(4.5) and r.allreduce_exposed_s == pytest.approx(2.5)
    assert r.allreduce_calls == 3
    assert [iv[1:3] for iv in r.timeline if iv[0] == "comm"] == [(1, 2.5), (2.5, 4), (4, 5.5)]
    # buckets of 200 bytes: layers 0+1 go at 2 s, layer 2 (the rest) at 3 s
    r = makespan(ev, steps, 1, FixedCost(True), comm=SecondsPerCall(2, 1.5, bucket_bytes=200))
    assert r.allreduce_calls == 2 and r.makespan_s == pytest.approx(5.0)
    # a world of one, or no comm at all: the two-stream clock unchanged
    for comm in (None, SecondsPerCall(1, 1.5)):
        r = makespan(ev, steps, 1, FixedCost(True), comm=comm)
        assert r.makespan_s == pytest.approx(3.0) and r.allreduce_exposed_s == 0.0


def test_deferred_updates_wait_for_their_collective_at_the_due_step():
    """The runtime's overlap (distributed/overlap.py): a bucket launched after backward step 0
    is due at step 3; compute waits there only for what the collective has not finished."""
    steps = _backward_steps(4, 100)
    bucket = SimpleNamespace(nbytes=100)
    for s in steps:
        s.bucket, s.due = None, []
    steps[0].bucket, steps[3].due = bucket, [bucket]
    ev = [("step", i, 0) for i in range(4)]
    # 1 s per step: launched at 1; 2.5 s of all-reduce ends at 3.5, before step 3 ends at 4
    r = makespan(ev, steps, 1, FixedCost(True), comm=SecondsPerCall(2, 2.5), timeline=True)
    assert r.makespan_s == pytest.approx(4.0) and r.allreduce_exposed_s == 0.0
    assert r.allreduce_calls == 1 and r.allreduce_s == pytest.approx(2.5)
    assert [iv[1:3] for iv in r.timeline if iv[0] == "comm"] == [(1, 3.5)]
    # 5 s: it ends at 6, so the due step's updates wait 2 s (the post-hoc form would say the
    # same total, but here the wait is on the compute stream, before anything after it)
    r = makespan(ev, steps, 1, FixedCost(True), comm=SecondsPerCall(2, 5.0))
    assert r.makespan_s == pytest.approx(6.0) and r.allreduce_exposed_s == pytest.approx(2.0)
    assert r.compute_s == pytest.approx(4.0)
    # a world of one: nothing on the comm stream
    r = makespan(ev, steps, 1, FixedCost(True), comm=SecondsPerCall(1, 5.0))
    assert r.makespan_s == pytest.approx(4.0) and r.allreduce_calls == 0


def _dp_plan(k, gbps, model="resnet_cifar", depth=8, batch=8, trace=False, buckets=None,
             grad_lag=None, **kw):
    from neuron.distributed.cost import RingModel
    g = build_model(model, depth=depth)
    comm = None if k is None else RingModel(k, gbps, **kw)
    return plan(g, batch, search_min=False, trace=trace, cost=CostModel.analytic("h100"),
                comm=comm, grad_buckets=buckets, grad_lag=grad_lag)


def test_planned_overlap_keeps_gradients_live_and_waits_at_due_steps():
    """`plan --data-parallel K` with the runtime's overlap: the deferred updates' gradients
    are in the plan's bytes, and a slow link stalls compute at the due steps."""
    plain, deferred = _dp_plan(2, 1.0), _dp_plan(2, 1.0, buckets=0)
    assert deferred["peak_bytes"] > plain["peak_bytes"]
    assert deferred["allreduce_calls_simulated"] == plain["allreduce_calls_simulated"]
    assert deferred["allreduce_time_s"] == pytest.approx(plain["allreduce_time_s"])
    assert 0 < deferred["allreduce_exposed_s"] <= deferred["allreduce_time_s"] + 1e-12
    assert deferred["simulated_time_s"] == pytest.approx(
        deferred["compute_s"] + deferred["allreduce_exposed_s"], rel=1e-6)
    fast = _dp_plan(2, 1e4, buckets=0, latency_s=1e-8)
    assert fast["allreduce_exposed_s"] < 0.05 * fast["allreduce_time_s"]
    # a longer lag (`--dp-lag`) gives each collective more backward to hide under
    exposed = [_dp_plan(2, 20.0, buckets=0, grad_lag=lag)["allreduce_exposed_s"]
               for lag in (0, 3, 12)]
    assert exposed[0] > exposed[1] > exposed[2] > 0


def test_world_of_one_changes_no_time():
    base, one = _dp_plan(None, 100), _dp_plan(1, 100)
    for key in ("simulated_time_s", "unlimited_time_s", "compute_s", "overhead_pct"):
        assert one[key] == base[key]
    assert one["allreduce_time_s"] == 0.0 and one["allreduce_exposed_s"] == 0.0
    assert "allreduce_exposed_s" not in base


def test_slow_link_adds_between_the_exposed_part_and_the_allreduce_time():
    base, two = _dp_plan(None, 100), _dp_plan(2, 1.0)
    grown = two["simulated_time_s"] - base["simulated_time_s"]
    ar, exposed = two["allreduce_time_s"], two["allreduce_exposed_s"]
    assert ar > base["compute_s"]                   # slow: the comm stream is the long one
    assert exposed - 1e-12 <= grown <= ar + 1e-12 and 0 < exposed <= ar
    assert two["compute_s"] == base["compute_s"]    # the memory plan is the same


def test_fast_link_hides_nearly_all_communication():
    base, fast = _dp_plan(None, 100), _dp_plan(8, 1e4, latency_s=1e-8, trace=True)
    # the last layer's all-reduce has no backward left to hide under; everything before hides
    # (with NCCL's default 5 us per ring step, 43 small calls are latency, not bandwidth)
    assert fast["allreduce_time_s"] > 0
    assert fast["allreduce_exposed_s"] < 0.1 * fast["allreduce_time_s"]
    comm = [iv for iv in fast["timeline"] if iv[0] == "comm"]
    after_first = fast["compute_s"] - comm[0][1]    # compute after the first all-reduce began
    assert fast["allreduce_exposed_s"] < 0.01 * after_first
    assert fast["simulated_time_s"] - base["simulated_time_s"] == pytest.approx(
        fast["allreduce_exposed_s"])
