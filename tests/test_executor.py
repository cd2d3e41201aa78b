"""The Executor end to end: gradients, determinism, memory policies, errors, state."""
import math

import numpy as np
import pytest

import neuron as nn
from neuron.errors import DataError, MemoryBudgetError, NonFiniteLossError


# ---------------------------------------------------------------- graphs
def residual_bn():
    """Residual block: conv-BN-tanh-conv + 1x1 shortcut, Add, tanh, global pool, FC."""
    x = nn.Input((2, 5, 5), name="data")
    a = nn.Conv2d(3, 3, padding=1, name="c1")(x)
    b = nn.BatchNorm(name="bn1")(a)
    c = nn.Tanh(name="t1")(b)
    d = nn.Conv2d(3, 3, padding=1, name="c2")(c)
    s = nn.Conv2d(3, 1, name="sc")(x)
    e = nn.Add(name="add")(d, s)
    f = nn.Tanh(name="t2")(e)
    y = nn.Linear(4, name="fc")(nn.GlobalAvgPool(name="gap")(f))
    return nn.Graph(x, y, name="residual_bn")


def concat_fan_lrn():
    """An intermediate tensor fans out to three branches (gradient accumulation), Concat,
    max pool and a strongly nonlinear LRN."""
    x = nn.Input((2, 6, 6), name="data")
    h = nn.Conv2d(3, 3, padding=1, name="stem")(x)
    a = nn.Conv2d(2, 1, name="br_a")(h)
    b = nn.Conv2d(2, 3, padding=1, name="br_b")(h)
    c = nn.Sigmoid(name="br_c")(h)
    cat = nn.Concat(name="cat")(a, b, c)
    p = nn.MaxPool2d(2, name="pool")(cat)
    n = nn.LRN(size=3, alpha=1.0, beta=0.75, k=1.0, name="lrn")(p)
    y = nn.Linear(3, name="fc")(n)
    return nn.Graph(x, y, name="concat_fan_lrn")


def dropout_mix():
    """Grouped/dilated/strided conv, LeakyReLU, padded avg pool, dropout (fixed mask),
    sigmoid, 1-D BN."""
    x = nn.Input((2, 7, 7), name="data")
    h = nn.Conv2d(4, 3, stride=2, padding=2, dilation=2, groups=2, name="gconv")(x)
    h = nn.LeakyReLU(0.1, name="lrelu")(h)
    h = nn.AvgPool2d(2, stride=2, padding=1, name="apool")(h)
    h = nn.Dropout(0.5, name="drop")(h)
    h = nn.Sigmoid(name="sig")(nn.Linear(6, name="fc1")(h))
    h = nn.BatchNorm(name="bn1d")(h)
    y = nn.Linear(3, name="fc2")(h)
    return nn.Graph(x, y, name="dropout_mix")


def relu_maxpool():
    x = nn.Input((1, 8, 8), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(3, 3, padding=1, name="c1")(x))
    h = nn.MaxPool2d(3, stride=2, padding=1, name="mp")(h)
    h = nn.ReLU(name="r2")(nn.BatchNorm(name="bn")(nn.Conv2d(4, 3, padding=1, name="c2")(h)))
    y = nn.Linear(5, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name="relu_maxpool")


def data_joins():
    """Joins that read the data tensor (which has no gradient) next to computed tensors."""
    x = nn.Input((2, 4, 4), name="data")
    h = nn.Conv2d(2, 3, padding=1, name="c")(x)
    a = nn.Tanh(name="t0")(h)
    c = nn.Concat(name="cat")(x, a, h)
    d = nn.Add(name="add_x")(nn.Conv2d(2, 1, name="c2")(c), x)
    y = nn.Linear(3, name="fc")(nn.Tanh(name="t")(d))
    return nn.Graph(x, y, name="data_joins")


def self_join():
    """A layer that takes the same tensor twice: Add(h, h), Concat(a, h, h)."""
    x = nn.Input((2, 4, 4), name="data")
    h = nn.Conv2d(2, 3, padding=1, name="c")(x)
    a = nn.Add(name="selfadd")(h, h)
    c = nn.Concat(name="cat")(a, h, h)
    y = nn.Linear(3, name="fc")(nn.Tanh(name="t")(c))
    return nn.Graph(x, y, name="self_join")


def small_resnet():
    """Two residual stages (one with a strided projection shortcut), BN, dropout, FC."""
    x = nn.Input((3, 8, 8), name="data")
    h = nn.ReLU(name="stem.relu")(nn.BatchNorm(name="stem.bn")(
        nn.Conv2d(4, 3, padding=1, bias=False, name="stem.conv")(x)))
    for i, (cout, stride) in enumerate([(4, 1), (8, 2)]):
        p = f"b{i}"
        r = nn.Conv2d(cout, 3, stride=stride, padding=1, bias=False, name=f"{p}.conv1")(h)
        r = nn.ReLU(name=f"{p}.relu1")(nn.BatchNorm(name=f"{p}.bn1")(r))
        r = nn.BatchNorm(name=f"{p}.bn2")(nn.Conv2d(cout, 3, padding=1, bias=False,
                                                    name=f"{p}.conv2")(r))
        sc = h if stride == 1 and cout == h.shape[0] else nn.BatchNorm(name=f"{p}.down.bn")(
            nn.Conv2d(cout, 1, stride=stride, bias=False, name=f"{p}.down.conv")(h))
        h = nn.ReLU(name=f"{p}.relu2")(nn.Add(name=f"{p}.add")(r, sc))
    h = nn.Dropout(0.3, name="drop")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, nn.Linear(10, name="fc")(h), name="small_resnet")


def batch_for(graph, batch, num_classes, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *graph.inputs[0].shape))
    y = rng.integers(0, num_classes, batch)
    return x, y


def states_equal(a, b):
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


# ---------------------------------------------------------------- (a) gradients
# Method. With SGD(lr=1, momentum=0, weight_decay=0) one train_step does p <- p - 1*grad for
# every trainable parameter, so (p_before - p_after) is the analytic gradient the executor
# computed (in float64 the subtraction adds only ~1 ulp of |p|). The loss that gradient belongs
# to is the *training-mode* forward of that same step (BN on batch statistics, dropout with the
# mask drawn for (seed, iteration)). train_step returns exactly that loss, computed before any
# update, so the numerical gradient is a central difference of train_step's return value on a
# second executor reloaded with the perturbed parameters and reset to iteration 0 (same dropout
# mask). evaluate() would be wrong here: it runs inference-mode BN and no dropout.
GRAPHS = {"residual_bn": (residual_bn, 4), "concat_fan_lrn": (concat_fan_lrn, 3),
          "dropout_mix": (dropout_mix, 3), "relu_maxpool": (relu_maxpool, 5),
          "data_joins": (data_joins, 3)}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_whole_graph_gradient_check_float64(name):
    _gradient_check(*GRAPHS[name])


def _gradient_check(build, k):
    g = build()
    batch = 4
    x, y = batch_for(g, batch, k, seed=11)
    opt = nn.SGD(lr=1.0, momentum=0.0, weight_decay=0.0)
    ex = nn.Executor(g, batch, optimizer=opt, dtype=np.float64, seed=5)
    before = ex.state_dict()
    ex.train_step(x, y)
    after = ex.state_dict()
    trainable = list(ex.schedule.param_grads)
    assert trainable, "no trainable parameters"
    analytic = {q: before[q] - after[q] for q in trainable}

    fd = nn.Executor(g, batch, optimizer=nn.SGD(lr=1.0, momentum=0.0), dtype=np.float64, seed=5)

    def loss_at(state):
        fd.load_state_dict(state)
        fd.iteration = 0
        return fd.train_step(x, y)

    assert loss_at(before) == pytest.approx(loss_at(before), abs=0)   # deterministic
    rng = np.random.default_rng(0)
    eps = 1e-6
    all_a, all_n = [], []
    for q in trainable:
        shape = before[q].shape
        flat = np.arange(math.prod(shape))
        pick = flat if flat.size <= 12 else rng.choice(flat, 12, replace=False)
        a_vals, n_vals = [], []
        for f in pick:
            idx = np.unravel_index(f, shape)
            st = {kk: v.copy() for kk, v in before.items()}
            st[q][idx] += eps
            lp = loss_at(st)
            st[q][idx] -= 2 * eps
            lm = loss_at(st)
            n_vals.append((lp - lm) / (2 * eps))
            a_vals.append(analytic[q][idx])
        a_vals, n_vals = np.array(a_vals), np.array(n_vals)
        err = np.linalg.norm(a_vals - n_vals)
        assert err <= 1e-6 * (np.linalg.norm(a_vals) + np.linalg.norm(n_vals)) + 1e-9, \
            (q, a_vals, n_vals)
        all_a.append(a_vals)
        all_n.append(n_vals)
    a, n = np.concatenate(all_a), np.concatenate(all_n)
    rel = np.linalg.norm(a - n) / np.linalg.norm(a + n)
    assert rel < 1e-6, rel
    assert np.linalg.norm(a) > 1e-4          # the check is not vacuous



def test_layer_reading_the_same_tensor_twice():
    x = nn.Input((4,), name="data")
    h = nn.Linear(4, name="fc0")(x)
    y = nn.Linear(2, name="fc1")(nn.Add(name="selfadd")(h, h))
    nn.Executor(nn.Graph(x, y), 2)


def test_gradient_check_self_join():
    _gradient_check(self_join, 3)


def test_dropout_mask_depends_on_iteration_and_is_reused_in_backward():
    g = dropout_mix()
    x, y = batch_for(g, 4, 3, seed=1)
    ex = nn.Executor(g, 4, optimizer=nn.SGD(lr=1e-3, momentum=0), dtype=np.float64, seed=0)
    s = ex.state_dict()
    l0 = ex.train_step(x, y)
    ex.load_state_dict(s)
    l1 = ex.train_step(x, y)            # iteration 1: a different mask, a different loss
    ex.load_state_dict(s)
    ex.iteration = 0
    assert ex.train_step(x, y) == l0
    assert l1 != l0


def test_train_step_matches_torch_on_a_residual_bn_graph():
    """Loss and one SGD(momentum, weight decay) update agree with PyTorch (float64)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g = residual_bn()
    x, y = batch_for(g, 4, 4, seed=2)
    opt = nn.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3)
    ex = nn.Executor(g, 4, optimizer=opt, dtype=np.float64, seed=1)
    s = ex.state_dict()
    loss = ex.train_step(x, y)
    new = ex.state_dict()

    P = {k: torch.tensor(v, requires_grad=k in ex.schedule.param_grads) for k, v in s.items()
         if ":" not in k}
    rm, rv = P["bn1.running_mean"].clone(), P["bn1.running_var"].clone()
    X = torch.tensor(x)
    a = F.conv2d(X, P["c1.weight"], P["c1.bias"], padding=1)
    b = F.batch_norm(a, rm, rv, P["bn1.weight"], P["bn1.bias"], training=True, momentum=0.1,
                     eps=1e-5)
    d = F.conv2d(torch.tanh(b), P["c2.weight"], P["c2.bias"], padding=1)
    e = torch.tanh(d + F.conv2d(X, P["sc.weight"], P["sc.bias"]))
    logits = F.linear(e.mean(dim=(2, 3)), P["fc.weight"], P["fc.bias"])
    tl = F.cross_entropy(logits, torch.tensor(y))
    assert loss == pytest.approx(tl.item(), rel=1e-12)
    params = [P[k] for k in ex.schedule.param_grads]
    topt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    tl.backward()
    topt.step()
    for k in ex.schedule.param_grads:
        np.testing.assert_allclose(new[k], P[k].detach().numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=k)
    np.testing.assert_allclose(new["bn1.running_mean"], rm.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(new["bn1.running_var"], rv.numpy(), rtol=1e-12)


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
