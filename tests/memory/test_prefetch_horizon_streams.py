"""The prefetch horizon on CudaDevice's streams (the CUDA stand-ins' log, cuda_standins/
stream_check.py): with ``prefetch_ahead="auto"`` a prefetch is issued with more compute queued
between it and its first reader than with one step of look-ahead, it still lands in its block
only after that block's last kernel (and waits for nothing else), and the checker still catches
a fence widened to the whole queue or dropped."""
from __future__ import annotations

import pytest

from neuron.memory import fences as fences_mod
from test_stream_fences import _run

# vdnn's plan with Add gradients aliased moves 70 tensors each way at "auto" against 68 at 1
# (without aliasing 70 at both): this test compares the same copies' leads, so it keeps vdnn on
# the unaliased schedule; the traffic itself is the plan's either way (test_prefetch_horizon.py)
RUNS = [{"policy": "superneurons"}, {"planner": "vdnn", "_alias_gradients": False},
        {"planner": "superneurons", "offload_params": True}]


def prefetch_leads(device) -> list[int]:
    """Per copy into the arena on the prefetch stream, in the stand-ins' issue order: how many
    compute kernels were issued after it and before the first kernel that touches its
    block."""
    from cuda_standins.runtime import _Stream
    compute, h2d = device.compute_stream, device.h2d_stream
    kernels, pending, out = 0, [], []
    for s, i in _Stream.issued:
        if s == "host":
            continue
        op = s.ops[i]
        if op[0] == "h2d" and s is h2d:
            pending.append((op[1], op[1] + op[3], kernels))
        elif op[0] == "kernel" and s is compute:
            keep = []
            for lo, hi, at in pending:
                if any(a < hi and lo < b for a, b in op[2] + op[3]):    # written or read
                    out.append(kernels - at)
                else:
                    keep.append((lo, hi, at))
            pending = keep
            kernels += 1
    return out


@pytest.mark.parametrize("kw", RUNS, ids=lambda kw: ",".join(f"{v}" for v in kw.values()))
def test_the_horizon_issues_prefetches_earlier_with_fences_exact(gpu_kernels, cuda_standins,
                                                                 monkeypatch, kw):
    leads = {}
    for ahead in (1, "auto"):
        # the input stager's buffers and events are per run: the other run's are not logged
        monkeypatch.setattr(gpu_kernels, "_stager", None)
        rep, ex = _run(cuda_standins, {**kw, "prefetch_ahead": ahead})
        leads[ahead] = prefetch_leads(ex.device)
        assert ex.pool.counters()["prefetches"] > 0
        assert rep.waits_for_copies > 0
        assert not rep.races, rep.races[:3]             # never into a block still in use
        assert not rep.copy_waits, rep.copy_waits[:3]   # nor after more than its last kernel
        assert not rep.compute_waits, rep.compute_waits[:3]
    one, auto = leads[1], leads["auto"]
    assert one and len(auto) == len(one)       # the same copies, issued earlier
    assert sum(auto) / len(auto) > sum(one) / len(one), (one, auto)


def test_a_widened_fence_is_caught_with_the_horizon(gpu_kernels, cuda_standins, monkeypatch):
    monkeypatch.setattr(fences_mod.BlockFences, "compute_event",
                        lambda self, epoch: self.device.record_compute(self.device.new_event()))
    rep, _ = _run(cuda_standins, {"policy": "superneurons", "prefetch_ahead": "auto"})
    assert not rep.races
    assert rep.copy_waits


def test_a_dropped_fence_is_a_race_with_the_horizon(gpu_kernels, cuda_standins, monkeypatch):
    monkeypatch.setattr(fences_mod.BlockFences, "compute_event", lambda self, epoch: None)
    rep, _ = _run(cuda_standins, {"policy": "superneurons", "prefetch_ahead": "auto"})
    assert rep.races
