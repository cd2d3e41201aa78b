"""The recording pool (neuron/memory/recorder.py) logs the plan's own simulation exactly."""
import pytest

from neuron.memory.recorder import (ARRIVE, MOVE, PREFETCH, OFFLOAD, record_iteration)
from neuron.models import build_model
from neuron.plan import plan

CASES = [("liveness", None), ("superneurons", "min"), ("offload", "min"), ("baseline", None),
         ("recompute", None)]


def resnet8():
    return build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))


@pytest.mark.parametrize("policy,budget", CASES)
def test_recording_agrees_with_the_plan(policy, budget):
    g = resnet8()
    p = plan(g, 8, policy=policy, trace=False)
    arena = p["min_budget_bytes"] if budget == "min" else None
    rec, run = record_iteration(g, 8, arena, policy=policy)
    assert run["fits"]
    # the log's high-water mark is the pool's, and what it says was resident then adds up to it
    assert rec.peak_bytes == run["peak_bytes"] == (p["unbounded_peak_bytes"] if arena is None
                                                   else run["peak_bytes"])
    assert sum(e.nbytes for e in rec.resident_at(rec.peak_event).values()) == rec.peak_bytes
    assert len(rec.steps) == p["num_steps"]
    moved_out = sum(e.nbytes for e in rec.events if e.op == OFFLOAD)
    assert (moved_out > 0) == (run["offload_bytes"] > 0)
    assert len(rec.compactions) == run["compactions"]


def test_stays_never_overlap_in_the_arena():
    """At every step, the arena ranges of the tensors resident then are disjoint (the heap's
    promise, seen through the log; compaction moves included)."""
    g = resnet8()
    p = plan(g, 8, policy="superneurons", trace=False)
    rec, _ = record_iteration(g, 8, p["min_budget_bytes"], policy="superneurons")
    stays = rec.intervals()
    assert stays and all(s[4] <= s[5] for s in stays)
    for step in range(0, len(rec.steps), 3):
        # a stay that ends at a step and one that starts there may share bytes (freed, reused)
        here = sorted((off, off + n) for _, _, off, n, a, b in stays if a < step < b)
        for (a0, a1), (b0, b1) in zip(here, here[1:]):
            assert a1 <= b0, (step, (a0, a1), (b0, b1))
        assert all(hi <= rec.arena_bytes for _, hi in here)


def test_offloads_and_prefetches_are_logged_with_their_bytes():
    g = resnet8()
    p = plan(g, 8, policy="offload", trace=False)
    rec, run = record_iteration(g, 8, p["min_budget_bytes"], policy="offload")
    ops = {e.op for e in rec.events}
    assert OFFLOAD in ops and ARRIVE & ops
    assert sum(e.nbytes >= 1 for e in rec.events if e.op in (OFFLOAD, PREFETCH, MOVE)) > 0


def test_an_arena_too_small_records_nothing():
    g = resnet8()
    rec, run = record_iteration(g, 8, 1 << 16, policy="liveness")
    assert rec is None and not run["fits"]
