"""The all-reduce overlapping backward (distributed/overlap.py), in one process: the deferred
updates in the plan, the bucket rule, pinning in the pool, a world of one unchanged."""
import numpy as np
import pytest

from dp_nets import global_batches, make_executor
from neuron.distributed import DataParallel, LocalComm
from neuron.distributed.comm import Pending
from neuron.distributed.overlap import DEFAULT_BUCKET_BYTES, defer_updates
from neuron.memory.liveness import frees_for


@pytest.mark.parametrize("bn", [False, True])
def test_world_of_one_is_bitwise_identical_with_and_without_overlap(bn):
    plain = make_executor(8, bn)
    runs = [plain] + [make_executor(8, bn, grad_buckets=bb) for bb in (0, 600,
                                                                        DEFAULT_BUCKET_BYTES)]
    runs.append(make_executor(8, bn, grad_buckets=600, grad_lag=7))      # `--dp-lag 7`
    dps = [DataParallel(ex, LocalComm(), check_every=0) for ex in runs[1:3] + runs[4:]]
    assert all(dp.overlap for dp in dps)
    for x, y in global_batches(8):
        losses = [plain.train_step(x, y)] + [dp.train_step(x, y) for dp in dps] + \
                 [runs[3].train_step(x, y)]
        assert len(set(losses)) == 1
    want = plain.state_dict()
    for ex in runs[1:]:
        for k, v in ex.state_dict().items():
            assert v.tobytes() == want[k].tobytes(), k


def _buckets(steps):
    return [s.bucket for s in steps if s.bucket is not None]


def test_buckets_group_consecutive_layers_until_full():
    ex = make_executor(4, True, grad_buckets=600)
    bsteps = [s for s in ex.steps if s.phase == "B"]
    updating = [s.layer.name for s in bsteps if s.updates]
    buckets = _buckets(ex.steps)
    # every layer with trainable parameters in exactly one bucket, in backward order
    assert [n for b in buckets for n in b.layers] == updating
    assert all(b.nbytes >= 600 for b in buckets[:-1])
    # no bucket holds a layer more than needed: without its last layer it would be too small
    for b in buckets[:-1]:
        assert b.nbytes - sum(g.nbytes for _, _, g, _ in b.updates
                              if g.name.startswith(f"grad:{b.layers[-1]}.")) < 600
    for b in buckets:
        assert b.launch <= b.due_at and ex.steps[b.due_at].phase == "B"
    assert buckets[-1].due_at == len(ex.steps) - 1
    # bucket 0 (per layer): one bucket per updating layer
    assert len(_buckets(make_executor(4, True, grad_buckets=0).steps)) == len(updating)
    # the default (25 MiB): the whole small net is one bucket, started at the last layer
    one = _buckets(make_executor(4, True, grad_buckets=DEFAULT_BUCKET_BYTES).steps)
    assert len(one) == 1 and one[0].launch == len(ex.steps) - 1


def test_deferred_gradients_live_until_their_update_and_the_plan_counts_them():
    plain = make_executor(8, False)
    ov = make_executor(8, False, grad_buckets=0)
    frees = frees_for(ov.steps)
    for b in _buckets(ov.steps):
        for g in b.grads():     # freed right after the step that applies the update
            assert [i for i, f in enumerate(frees) if g in f] == [b.due_at]
        assert all(g in ov.steps[b.due_at].reads or g in ov.steps[b.due_at].writes
                   for g in b.grads())
    assert ov.planned["peak_bytes"] > plain.planned["peak_bytes"]
    # under a budget, with eviction: the plan still fits, counts the gradients, is the run
    budget = ov.planned["peak_bytes"] - 2048
    for kw in ({}, dict(grad_buckets=0), dict(grad_buckets=600)):
        ex = make_executor(8, False, policy="superneurons", budget=budget, **kw)
        for x, y in global_batches(8, steps=2):
            ex.train_step(x, y)
        assert ex.pool.high_water == ex.planned["peak_bytes"] <= budget
    peaks = {bb: make_executor(8, False, policy="superneurons", budget=budget,
                               grad_buckets=bb).planned["peak_bytes"] for bb in (None, 0)}
    assert peaks[0] >= peaks[None]


def test_defer_updates_leaves_the_original_steps_alone_and_is_idempotent():
    ex = make_executor(4, False)
    steps = list(ex.steps)
    before = [(s.reads, s.writes, s.due, s.deferred, s.bucket) for s in steps]
    d = defer_updates(steps, 0)
    assert d is not steps and defer_updates(d, 0) is d
    assert [(s.reads, s.writes, s.due, s.deferred, s.bucket) for s in steps] == before
    with pytest.raises(ValueError):
        defer_updates(steps, -1)


def test_pool_pins_tensors_of_an_in_flight_collective():
    ex = make_executor(4, False, grad_buckets=0)
    pool = ex.pool
    g = next(iter(ex.schedule.param_grads.values()))
    pool.alloc(g)
    assert g.id in pool.lru
    waited = []
    pool.pin_collective([g], lambda: waited.append(1))
    assert g.id not in pool.lru and g.id in pool.pinned     # never evicted
    assert not pool._evict_one() or g.id in pool.offset
    pool.free(g)                # a free first waits for the collective
    assert waited == [1] and g.id not in pool.pinned and not pool.collectives
    pool.alloc(g)
    pool.pin_collective([g], None)      # the plan: nothing in flight, still never evicted
    pool.unpin_collective([g])
    assert g.id in pool.lru and g.id not in pool.pinned
    pool.free(g)


def test_local_comm_nonblocking_api():
    c = LocalComm()
    a = [np.ones(3, np.float32)]
    h = c.start_allreduce_sum(a, "x")
    assert isinstance(h, Pending) and c.test(h)
    c.wait(h)
    c.progress()
    assert a[0].tolist() == [1, 1, 1]
