"""precision/loss_scale.py: fp16's dynamic loss scaling, alone and in the executor (CPU, NumPy float16)."""
import numpy as np
import pytest

import neuron as nn
from neuron.precision.loss_scale import GOOD_STEPS_KEY, SCALE_KEY, GradientOverflow, LossScaler
from neuron.models import build_model


def test_overflow_shrinks_and_a_run_of_good_steps_grows():
    s = LossScaler(scale=1024.0, growth_interval=3)
    g = np.array([2048.0, -1024.0], np.float32)
    s.unscale(g)
    assert g.tolist() == [2.0, -1.0]
    with pytest.raises(GradientOverflow, match="loss scale 1024"):
        s.unscale(np.array([np.inf], np.float32))
    s.overflowed()
    assert (s.scale, s.good_steps, s.skipped) == (512.0, 0, 1)
    for _ in range(2):
        s.stepped()
    assert s.scale == 512.0 and s.good_steps == 2
    s.stepped()
    assert s.scale == 1024.0 and s.good_steps == 0
    with pytest.raises(ValueError, match="LossScaler"):
        LossScaler(growth_factor=1.0)


def test_the_scale_is_state():
    s = LossScaler(scale=64.0)
    s.stepped()
    t = LossScaler()
    t.load(s.state())
    assert (t.scale, t.good_steps) == (64.0, 1)
    with pytest.raises(ValueError, match=SCALE_KEY):
        t.load({SCALE_KEY: np.array(0.0)})


def _fp16(seed=1):
    g = build_model("resnet_cifar", depth=8)
    ex = nn.Executor(g, 4, optimizer=nn.SGD(lr=0.05, momentum=0.9), precision="fp16", seed=seed)
    rng = np.random.default_rng(0)
    return ex, rng.standard_normal((4, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 4)


def test_fp16_trains_and_an_overflow_skips_the_step_whole():
    ex, x, y = _fp16()
    assert ex.loss_scaler.scale == 2.0 ** 16
    first = ex.train_step(x, y)
    assert np.isfinite(first) and ex.loss_scaler.good_steps == 1
    before = ex.state_dict()
    ex.loss_scaler.scale = 2.0 ** 60         # every float16 gradient overflows
    loss = ex.train_step(x, y)
    assert np.isfinite(loss) and ex.iteration == 2       # the batch is spent
    assert ex.loss_scaler.scale == 2.0 ** 59 and ex.loss_scaler.skipped == 1
    after = ex.state_dict()
    for k, v in before.items():             # parameters, momentum, BN statistics unchanged
        if k not in (SCALE_KEY, GOOD_STEPS_KEY):
            assert np.array_equal(after[k], v), k
    ex.loss_scaler.scale = 2.0 ** 10
    assert ex.train_step(x, y) < first       # a sane scale trains again


def test_fp16_gradients_match_fp32_at_a_sane_scale():
    """The scale cancels: one fp16 step moves the parameters as fp32 does, to fp16's precision,
    while without the unscale the update would be 2^16 times too large."""
    ex16, x, y = _fp16()
    ex32 = nn.Executor(ex16.graph, 4, optimizer=nn.SGD(lr=0.05, momentum=0.9), seed=1)
    s = ex32.state_dict()
    ex16.train_step(x, y)
    ex32.train_step(x, y)
    a, b = ex16.state_dict(), ex32.state_dict()
    for k in ex32.schedule.param_grads:
        d16, d32 = a[k] - s[k], b[k] - s[k]
        assert np.linalg.norm(d16 - d32) < 0.1 * np.linalg.norm(d32), k


def test_the_loss_scale_is_saved_and_resumed():
    ex, x, y = _fp16()
    ex.train_step(x, y)
    ex.loss_scaler.scale = 1024.0
    saved = ex.state_dict()
    assert float(saved[SCALE_KEY]) == 1024.0 and int(saved[GOOD_STEPS_KEY]) == 1
    again, _, _ = _fp16(seed=2)
    again.load_state_dict(saved)
    assert (again.loss_scaler.scale, again.loss_scaler.good_steps) == (1024.0, 1)
    bf16 = nn.Executor(ex.graph, 4, optimizer=nn.SGD(lr=0.05, momentum=0.9), precision="bf16")
    bf16.load_state_dict(saved)             # a run without loss scaling takes the weights
    assert SCALE_KEY not in bf16.state_dict()
