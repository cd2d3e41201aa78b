"""The Executor's whole-graph gradients: finite differences in float64, and vs torch."""
import math

import numpy as np
import pytest

import neuron as nn
from executor_graphs import (batch_for, concat_fan_lrn, data_joins, dropout_mix, relu_maxpool,
                             residual_bn, self_join)


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
