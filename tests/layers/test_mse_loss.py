"""MSELoss: the kernels against finite differences (and torch when importable), the
Executor's loss="mse" path, and its target validation."""
import numpy as np
import pytest

from neuron import Graph, Linear, ReLU
from neuron.errors import DataError
from neuron.executor import Executor, with_loss
from neuron.kernels import numpy_ref as k
from neuron.layers import input_tensor
from neuron.optim import SGD


def test_mse_kernels_match_finite_differences():
    rng = np.random.default_rng(0)
    p, t = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    loss = k.mse_forward(p, t)
    assert loss == pytest.approx(0.5 * ((p - t) ** 2).sum() / 4)
    g = np.empty_like(p)
    k.mse_backward(p, t, g)
    num = np.zeros_like(p)
    for i in np.ndindex(p.shape):
        e = np.zeros_like(p)
        e[i] = 1e-6
        num[i] = (k.mse_forward(p + e, t) - k.mse_forward(p - e, t)) / 2e-6
    np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-8)
    acc = np.ones_like(p)
    k.mse_backward(p, t, acc, accumulate=True)
    np.testing.assert_allclose(acc, 1 + g)


def test_mse_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    p, t = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    tp = torch.tensor(p, requires_grad=True)
    ref = 0.5 * torch.nn.functional.mse_loss(tp, torch.tensor(t), reduction="sum") / 5
    ref.backward()
    g = np.empty_like(p)
    k.mse_backward(p, t, g)
    assert k.mse_forward(p, t) == pytest.approx(float(ref.detach()))
    np.testing.assert_allclose(g, tp.grad.numpy(), rtol=1e-10)


def _mlp():
    x = input_tensor((4,), name="x")
    h = ReLU(name="r")(Linear(16, name="l1")(x))
    return Graph([x], [Linear(2, name="l2")(h)], name="reg")


def test_executor_trains_a_tiny_regression():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = np.stack([x[:, 0] - x[:, 1], 0.5 * x[:, 2]], 1).astype(np.float32)
    ex = Executor(_mlp(), 32, loss="mse", optimizer=SGD(lr=0.05, momentum=0.9))
    first = ex.train_step(x, y)
    for _ in range(150):
        last = ex.train_step(x, y)
    assert last < 0.1 * first
    loss, correct = ex.evaluate(x, y)
    assert loss == pytest.approx(last, rel=0.2) and correct == 0
    assert ex.last_logits.shape == (32, 2)


def test_mse_target_validation_and_unknown_loss():
    ex = Executor(_mlp(), 2, loss="mse")
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(DataError, match="dtype"):
        ex.train_step(x, np.zeros((2, 2), np.int64))
    with pytest.raises(DataError, match=r"shape \(2,\)"):
        ex.train_step(x, np.zeros(2, np.float32))
    with pytest.raises(DataError, match="NaN"):
        ex.train_step(x, np.full((2, 2), np.nan, np.float32))
    with pytest.raises(ValueError, match="loss must be"):
        Executor(_mlp(), 2, loss="hinge")
    with pytest.raises(ValueError, match="loss must be"):
        with_loss(_mlp(), "hinge")
