"""The Executor end to end: determinism, memory policies, errors, state (gradients:
test_executor_gradients.py)."""
import math

import numpy as np
import pytest

import neuron as nn
from executor_graphs import (batch_for, concat_fan_lrn, dropout_mix, relu_maxpool, residual_bn,
                             small_resnet, states_equal)
from neuron.errors import DataError, MemoryBudgetError, NonFiniteLossError


# ---------------------------------------------------------------- (b) reproducibility
def _train(graph, seed, steps=5, policy="liveness", dtype=np.float32, batch=6, data_seed=0):
    ex = nn.Executor(graph, batch, optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
                     policy=policy, dtype=dtype, seed=seed)
    losses = []
    for i in range(steps):
        x, y = batch_for(graph, batch, 10, seed=data_seed + i)
        losses.append(ex.train_step(x.astype(np.float32), y))
    return ex, losses


def test_same_seed_bit_identical_different_seed_differs():
    g = small_resnet()
    ex1, l1 = _train(g, seed=7)
    ex2, l2 = _train(g, seed=7)
    assert l1 == l2
    assert states_equal(ex1.state_dict(), ex2.state_dict())
    ex3, l3 = _train(g, seed=8)
    s1, s3 = ex1.parameters(), ex3.parameters()
    assert s1.keys() == s3.keys()
    assert not np.array_equal(s1["stem.conv.weight"], s3["stem.conv.weight"])
    assert not np.array_equal(s1["fc.weight"], s3["fc.weight"])
    assert l1 != l3


def test_independent_graph_builds_reproduce():
    """Two separately built (identically named) graphs train identically."""
    ex1, l1 = _train(small_resnet(), seed=3, steps=3)
    ex2, l2 = _train(small_resnet(), seed=3, steps=3)
    assert l1 == l2 and states_equal(ex1.state_dict(), ex2.state_dict())


# ---------------------------------------------------------------- (c) policies
def _persistent_bytes(ex):
    return sum(ex.pool.heap.round(max(t.nbytes, 1)) for t in ex.schedule.persistent())


def test_policies_bit_identical_and_liveness_saves_memory():
    g = small_resnet()
    exb, lb = _train(g, seed=1, policy="baseline")
    exl, ll = _train(g, seed=1, policy="liveness")
    assert lb == ll
    assert states_equal(exb.state_dict(), exl.state_dict())
    pb, pl = exb.planned["peak_bytes"], exl.planned["peak_bytes"]
    assert pl < pb
    # the plan (a virtual run of the same code) predicts the real pool's high-water mark
    assert exb.pool.high_water == pb
    assert exl.pool.high_water == pl
    assert exb.planned["arena_bytes"] >= pb and exl.planned["arena_bytes"] >= pl
    # the trace never exceeds the peak; between iterations only persistent state is resident
    for ex in (exb, exl):
        assert max(r.bytes_in_use for r in ex.last_trace) <= ex.pool.high_water
        assert ex.pool.used_bytes == _persistent_bytes(ex)
        assert len(ex.last_trace) == len(ex.schedule.steps)
    assert exl.last_trace[-1].bytes_in_use == _persistent_bytes(exl)
    # inference agrees too
    x, y = batch_for(g, 6, 10, seed=99)
    rb, rl = exb.evaluate(x, y), exl.evaluate(x, y)
    assert rb == rl
    assert np.array_equal(exb.last_logits, exl.last_logits)
    assert exb.pool.used_bytes == _persistent_bytes(exb)



@pytest.mark.parametrize("policy,offload_params", [
    (p, o) for p in ("liveness", "offload", "recompute", "superneurons") for o in (False, True)])
def test_every_policy_trains_bit_identically_to_baseline(policy, offload_params):
    """Memory policies change where bytes live, never the arithmetic; the planned peak is the
    measured one for every iteration (not only the first)."""
    from neuron.memory.policy import POLICIES
    if policy not in POLICIES:
        pytest.fail(f"policy {policy} is not registered")
    g = small_resnet()
    ref, lref = _train(g, seed=1, steps=4, policy="baseline")
    ex = nn.Executor(g, 6, optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
                     policy=policy, offload_params=offload_params, seed=1)
    losses = []
    for i in range(4):
        x, y = batch_for(g, 6, 10, seed=i)
        losses.append(ex.train_step(x.astype(np.float32), y))
        assert ex.pool.high_water == ex.planned["peak_bytes"], i
    assert losses == lref
    assert states_equal(ex.state_dict(), ref.state_dict())
    assert ex.planned["peak_bytes"] < ref.planned["peak_bytes"]


def test_offloaded_parameters_go_out_once_per_iteration_where_forward_writes_nothing():
    """Under --offload-params a layer's block comes back for its forward and its backward.
    After its forward it goes out without a copy (its host buffer still holds its bytes),
    unless the forward wrote it (BN running statistics); after its update it is copied. The
    plan counts the same moves as the run."""
    g = small_resnet()
    ex = nn.Executor(g, 6, optimizer=nn.SGD(lr=0.05, momentum=0.9), offload_params=True,
                     seed=1)
    blocks = ex.persistent
    written_in_forward = {b.id for s in ex.steps if s.phase == "F"
                          for b in ex._blocks_written(s)}
    assert written_in_forward and len(written_in_forward) < len(blocks)
    x, y = batch_for(g, 6, 10, seed=0)
    ex.train_step(x.astype(np.float32), y)
    before = ex.pool.counters()
    ex.train_step(x.astype(np.float32), y)
    c = {k: v - before[k] for k, v in ex.pool.counters().items() if k != "host_peak_bytes"}
    total = sum(b.nbytes for b in blocks)
    bn = sum(b.nbytes for b in blocks if b.id in written_in_forward)
    assert c["prefetch_bytes"] == 2 * total
    assert c["offload_bytes"] == total + bn
    assert c["clean_evicted_bytes"] == total - bn
    assert c["offload_bytes"] == ex.planned["offload_bytes"]


@pytest.mark.parametrize("keep", ["none", "some", "all"])
def test_resident_parameters_stay_in_the_arena_and_move_nothing(keep):
    """resident_params: under --offload-params that many bytes of parameter blocks (the last
    layers' first) stay in the arena; only the others come and go, by the same law, the plan
    counting the same moves as the run, and training gives the bits of keeping them all."""
    g = small_resnet()
    blocks = nn.Executor(g, 6, offload_params=True).persistent
    total = sum(b.nbytes for b in blocks)
    resident = {"none": None, "some": total // 2, "all": total}[keep]
    ex = nn.Executor(g, 6, optimizer=nn.SGD(lr=0.05, momentum=0.9), offload_params=True,
                     resident_params=resident, seed=1)
    ref = nn.Executor(g, 6, optimizer=nn.SGD(lr=0.05, momentum=0.9), seed=1)
    on_host = [b for b in ex.persistent if b.id in ex.host_blocks()]
    kept = [b for b in ex.persistent if b.id not in ex.host_blocks()]
    assert sum(b.nbytes for b in kept) <= (resident or 0)
    assert {"none": not kept, "some": kept and on_host, "all": not on_host}[keep]
    assert kept == ex.persistent[len(on_host):]             # the last layers' blocks
    forward_written = {b.id for s in ex.steps if s.phase == "F" for b in ex._blocks_written(s)}
    for i in range(2):
        x, y = batch_for(g, 6, 10, seed=i)
        before = ex.pool.counters()
        assert ex.train_step(x.astype(np.float32), y) == ref.train_step(x.astype(np.float32), y)
    c = {k: v - before[k] for k, v in ex.pool.counters().items() if k != "host_peak_bytes"}
    host = sum(b.nbytes for b in on_host)
    assert c["prefetch_bytes"] == 2 * host == ex.planned["prefetch_bytes"]
    assert c["offload_bytes"] == ex.planned["offload_bytes"] == host + sum(
        b.nbytes for b in on_host if b.id in forward_written)
    assert states_equal(ex.state_dict(), ref.state_dict())


def test_resident_parameters_need_offloaded_parameters():
    with pytest.raises(ValueError, match="offload_params"):
        nn.Executor(small_resnet(), 6, resident_params=1 << 20)


class _PerTensorSGD:
    """SGD without update_many: the executor's per-tensor path."""

    def __init__(self, **kw):
        self._sgd = nn.SGD(**kw)
        self.state_names, self.checks_finite = self._sgd.state_names, True
        self.update, self.config = self._sgd.update, self._sgd.config


@pytest.mark.parametrize("guard", [True, False])
def test_each_steps_updates_go_to_the_optimizer_together_with_the_per_tensor_bits(
        monkeypatch, guard):
    """update_many gets every due update of a backward step in one call (one GPU launch per
    layer: kernels/cuda.py sgd_update_many), and the parameters are the per-tensor path's."""
    g = small_resnet()
    opt = {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True}
    calls = []
    real = nn.SGD.update_many

    def update_many(self, k, items, flag=None):
        calls.append(len(items))
        return real(self, k, items, flag=flag)
    monkeypatch.setattr(nn.SGD, "update_many", update_many)
    runs = []
    for optimizer in (_PerTensorSGD(**opt), nn.SGD(**opt)):
        ex = nn.Executor(g, 6, optimizer=optimizer, seed=1, replay="off")     # every call
        ex.transactional = guard        # off: no undo record, the updates checked nowhere
        losses = []
        for i in range(3):
            x, y = batch_for(g, 6, 10, seed=i)
            losses.append(ex.train_step(x.astype(np.float32), y))
        runs.append((losses, ex.state_dict()))
    steps = [len(s.updates) for s in ex.steps if s.phase == "B" and s.updates]
    assert calls == steps * 3 and max(steps) > 1
    assert runs[0][0] == runs[1][0] and states_equal(runs[0][1], runs[1][1])

def test_planned_peak_equals_measured_across_steps_and_graphs():
    for build, k in [(concat_fan_lrn, 3), (dropout_mix, 3), (residual_bn, 4)]:
        g = build()
        for policy in ("baseline", "liveness"):
            ex = nn.Executor(g, 3, policy=policy)
            for i in range(2):
                x, y = batch_for(g, 3, k, seed=i)
                ex.train_step(x, y)
                assert ex.pool.high_water == ex.planned["peak_bytes"], (g.name, policy, i)


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        nn.Executor(residual_bn(), 2, policy="nope")


# ---------------------------------------------------------------- (d) errors
@pytest.fixture
def bn_ex():
    g = residual_bn()
    ex = nn.Executor(g, 4, optimizer=nn.SGD(lr=0.1, momentum=0.9), seed=0)
    x, y = batch_for(g, 4, 4, seed=0)
    ex.train_step(x, y)               # momentum buffers and BN stats are non-trivial
    return ex, x, y


def _assert_rejected(ex, exc, x, y, *fragments, method="train_step"):
    before, it = ex.state_dict(), ex.iteration
    with pytest.raises(exc) as ei:
        getattr(ex, method)(x, y)
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, (f, msg)
    assert ex.iteration == it
    assert states_equal(before, ex.state_dict())
    return msg


def test_wrong_input_shape(bn_ex):
    ex, x, y = bn_ex
    _assert_rejected(ex, DataError, x[:, :1], y, "(4, 1, 5, 5)", "(4, 2, 5, 5)")
    _assert_rejected(ex, DataError, x[:3], y, "(3, 2, 5, 5)")
    _assert_rejected(ex, DataError, x[:3], y[:3], "(3, 2, 5, 5)", method="evaluate")
    ex.train_step(x, y)               # still usable


@pytest.mark.parametrize("bad,value", [(4, "4"), (-1, "-1"), (1000, "1000")])
def test_labels_out_of_range(bn_ex, bad, value):
    ex, x, y = bn_ex
    y2 = y.copy()
    y2[2] = bad
    msg = _assert_rejected(ex, DataError, x, y2, value, "[0, 4)")
    assert "label" in msg
    _assert_rejected(ex, DataError, x, y2, value, "[0, 4)", method="evaluate")


def test_float_and_misshaped_labels(bn_ex):
    ex, x, y = bn_ex
    _assert_rejected(ex, DataError, x, y.astype(np.float64), "dtype")
    _assert_rejected(ex, DataError, x, y[:2], "labels")
    _assert_rejected(ex, DataError, x, y[:, None], "labels")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input(bn_ex, bad):
    ex, x, y = bn_ex
    x2 = x.copy()
    x2[1, 0, 2, 3] = bad
    _assert_rejected(ex, DataError, x2, y, "NaN or inf")
    _assert_rejected(ex, DataError, x2, y, "NaN or inf", method="evaluate")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_loss_from_huge_lr_leaves_state_untouched():
    x = nn.Input((6,), name="data")
    h = nn.ReLU(name="r1")(nn.BatchNorm(name="bn")(nn.Linear(8, name="fc1")(x)))
    h = nn.ReLU(name="r2")(nn.Linear(8, name="fc2")(h))
    g = nn.Graph(x, nn.Linear(4, name="fc3")(h))
    ex = nn.Executor(g, 4, optimizer=nn.SGD(lr=1e30, momentum=0.9), seed=0)
    x, y = batch_for(g, 4, 4, seed=0)
    for step in range(10):
        before, it = ex.state_dict(), ex.iteration
        try:
            ex.train_step(x, y)
        except NonFiniteLossError as e:
            err = e
            break
    else:
        pytest.fail("a learning rate of 1e30 never produced a non-finite loss")
    assert step >= 1
    assert ex.iteration == it
    after = ex.state_dict()
    assert states_equal(before, after)        # params, momentum AND BN running statistics
    assert isinstance(err, FloatingPointError) and "loss" in str(err)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("policy,offload_params", [
    ("baseline", False), ("liveness", False), ("liveness", True), ("offload", False),
    ("recompute", False), ("recompute", True), ("superneurons", False)])
def test_non_finite_loss_restores_bn_running_stats_and_executor_stays_usable(policy,
                                                                              offload_params):
    g = residual_bn()
    ex = nn.Executor(g, 4, optimizer=nn.SGD(lr=0.1, momentum=0.9), seed=0, policy=policy,
                     offload_params=offload_params)
    x, y = batch_for(g, 4, 4, seed=0)
    ex.train_step(x, y)
    good = ex.state_dict()
    bad = {k: v.copy() for k, v in good.items()}
    bad["fc.weight"][:] = 3e38                # float32 logits overflow -> loss inf/NaN
    bad["fc.bias"][:] = np.float32(-3e38)
    ex.load_state_dict(bad)
    it = ex.iteration
    with pytest.raises(NonFiniteLossError):
        ex.train_step(x, y)
    after = ex.state_dict()
    assert states_equal(bad, after)
    # the forward pass had moved the BN statistics; they were put back
    assert np.array_equal(after["bn1.running_mean"], good["bn1.running_mean"])
    assert ex.iteration == it
    # nothing leaked in the pool: a normal step gives what a fresh executor gives
    ex.load_state_dict(good)
    if not offload_params:
        assert ex.pool.used_bytes == _persistent_bytes(ex)
    ref = nn.Executor(g, 4, optimizer=nn.SGD(lr=0.1, momentum=0.9), seed=0)
    ref.load_state_dict(good)
    ref.iteration = ex.iteration
    assert ex.train_step(x, y) == ref.train_step(x, y)
    assert states_equal(ex.state_dict(), ref.state_dict())
    assert ex.evaluate(x, y) == ref.evaluate(x, y)


def test_budget_too_small_names_step_tensor_and_bytes():
    g = small_resnet()
    peak = nn.Executor(g, 8).planned["peak_bytes"]
    with pytest.raises(MemoryBudgetError) as ei:
        nn.Executor(g, 8, budget=peak // 2)
    e = ei.value
    msg = str(e)
    assert isinstance(e, MemoryError)
    assert e.step is not None and e.step in msg
    assert e.tensor is not None and e.tensor in msg
    assert "bytes" in msg and str(e.requested) in msg
    assert e.requested > e.largest_free and e.budget == peak // 2
    assert e.short == e.requested - e.largest_free


def test_budget_smaller_than_parameters():
    g = small_resnet()
    with pytest.raises(MemoryBudgetError) as ei:
        nn.Executor(g, 8, budget=4096)
    msg = str(ei.value)
    assert "parameters" in msg and ei.value.tensor in msg and "bytes" in msg


def test_budget_exactly_the_planned_arena_fits():
    g = small_resnet()
    arena = nn.Executor(g, 8).planned["arena_bytes"]
    ex = nn.Executor(g, 8, budget=arena)
    x, y = batch_for(g, 8, 10, seed=0)
    assert math.isfinite(ex.train_step(x, y))


def test_bad_batch():
    with pytest.raises(ValueError, match="batch"):
        nn.Executor(residual_bn(), 0)


# ---------------------------------------------------------------- (e) state
def test_state_dict_round_trip():
    g = small_resnet()
    ex1, _ = _train(g, seed=1, steps=3)
    # same seed (it also seeds the dropout masks), but fresh: its state differs from ex1's
    ex2 = nn.Executor(g, 6, optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4), seed=1)
    s1 = ex1.state_dict()
    assert any(k.startswith("momentum:") for k in s1)
    assert "stem.bn.running_var" in s1
    assert all(v.dtype == np.float32 for v in s1.values())
    assert not states_equal(s1, ex2.state_dict())
    ex2.load_state_dict(s1)
    assert states_equal(s1, ex2.state_dict())
    ex2.iteration = ex1.iteration             # dropout masks depend on the iteration
    for i in range(2):
        x, y = batch_for(g, 6, 10, seed=50 + i)
        assert ex1.train_step(x, y) == ex2.train_step(x, y)
    assert states_equal(ex1.state_dict(), ex2.state_dict())
    # state_dict returns copies
    s = ex1.state_dict()
    s["fc.weight"][:] = 0
    assert not np.array_equal(ex1.state_dict()["fc.weight"], s["fc.weight"])
    # parameters() excludes optimizer state
    assert not any(":" in k for k in ex1.parameters())


def test_load_state_dict_shape_mismatch_loads_nothing():
    g = small_resnet()
    ex, _ = _train(g, seed=1, steps=1)
    before = ex.state_dict()
    bad = {k: v + 1 for k, v in before.items()}
    bad["fc.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match=r"fc\.weight"):
        ex.load_state_dict(bad)
    assert states_equal(before, ex.state_dict())


def test_load_state_dict_missing_and_extra_keys():
    g = small_resnet()
    ex, _ = _train(g, seed=1, steps=1)
    before = ex.state_dict()
    part = {"fc.bias": np.full_like(before["fc.bias"], 7)}
    with pytest.raises(KeyError, match="missing"):
        ex.load_state_dict(part)
    assert states_equal(before, ex.state_dict())
    with pytest.raises(KeyError, match="bogus"):
        ex.load_state_dict({**before, "bogus": np.zeros(1)})
    ex.load_state_dict(part, strict=False)
    assert np.all(ex.state_dict()["fc.bias"] == 7)


def test_load_state_dict_casts_dtype():
    g = residual_bn()
    ex32 = nn.Executor(g, 2, dtype=np.float32, seed=0)
    ex64 = nn.Executor(g, 2, dtype=np.float64, seed=1)
    ex64.load_state_dict(ex32.state_dict())
    s = ex64.state_dict()
    assert s["fc.weight"].dtype == np.float64
    np.testing.assert_array_equal(s["fc.weight"], ex32.state_dict()["fc.weight"])


def test_evaluate_counts_correct_and_uses_running_stats():
    g = relu_maxpool()
    ex = nn.Executor(g, 5, seed=0)
    x, y = batch_for(g, 5, 5, seed=3)
    loss, correct = ex.evaluate(x, y)
    full = ex.last_logits.copy()
    assert correct == int((ex.last_logits.argmax(1) == y).sum())
    assert 0 <= correct <= 5 and math.isfinite(loss)
    # inference is per sample: a sample's logits do not depend on the rest of the batch
    x2 = x.copy()
    x2[1:] = 0
    ex.evaluate(x2, y)
    np.testing.assert_allclose(ex.last_logits[0], full[0], rtol=1e-6)
    # evaluation changes no state
    s = ex.state_dict()
    ex.evaluate(x, y)
    assert states_equal(s, ex.state_dict())


# ---------------------------------------------------------------- graph/executor contract
def test_training_needs_vector_logits():
    x = nn.Input((3, 4, 4), name="data")
    g = nn.Graph(x, nn.Conv2d(2, 1, name="c")(x), name="convout")
    with pytest.raises(DataError, match=r"\(K,\)"):
        nn.Executor(g, 2)


def test_reserved_layer_names_collide_with_the_loss():
    x = nn.Input((4,), name="data")
    g = nn.Graph(x, nn.Linear(2, name="loss")(x))
    with pytest.raises(nn.GraphError, match="loss"):
        nn.Executor(g, 2)


def test_multi_input_graph_gets_a_clear_error_or_works():
    x1 = nn.Input((4,), name="in_a")
    x2 = nn.Input((4,), name="in_b")
    g = nn.Graph([x1, x2], nn.Linear(2, name="fc")(nn.Add(name="add")(x1, x2)))
    try:
        nn.Executor(g, 2)
    except nn.NeuronError as e:
        assert "in_a" in str(e) or "input" in str(e)


def test_budget_as_a_size_string_and_bad_budgets_named():
    x = nn.Input((1, 8, 8), name="data")
    g = nn.Graph(x, nn.Linear(3, name="fc")(x), name="tiny")
    assert nn.Executor(g, 2, budget="64MiB").device.arena_bytes == 64 << 20
    with pytest.raises(ValueError, match="Executor: budget: cannot parse size '64 apples'"):
        nn.Executor(g, 2, budget="64 apples")
    with pytest.raises(TypeError, match="Executor: host_budget must be a number of bytes"):
        nn.Executor(g, 2, host_budget=object())
