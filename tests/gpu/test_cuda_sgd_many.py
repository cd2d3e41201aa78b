"""One SGD launch per layer (kernels/cuda.py sgd_update_many) on the GPU: the per-tensor
kernel's bits for tensors of a layer's sizes, the step guard's flag, a learning rate read from
a device buffer, the pointer table made once; a training run per layer and per tensor, eager
and as a CUDA graph, with the same bits; and the time of both on a ResNet's tensors."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.kernels import cuda as K

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("deterministic_kernels")]

#: a layer's tensors: weights over several blocks, a partial block, a bias, one element
SIZES = (64 * 64 * 9 + 5, 4097, 2048, 64, 1)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _tensors(cp, dtype, seed):
    rng = np.random.default_rng(seed)
    return [cp.asarray(rng.standard_normal(n).astype(dtype)) for n in SIZES]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 1e-3), (0.9, False, 0.0),
                                                  (0.9, True, 5e-4)])
def test_one_launch_per_layer_gives_the_per_tensor_bits(cp, dtype, momentum, nesterov, wd):
    grads = _tensors(cp, dtype, 1)
    for first in (True, False):
        for lr_buffer in (None, cp.asarray(np.array([-0.1], dtype))):
            runs = []
            for many in (False, True):
                p = _tensors(cp, dtype, 0)
                v = _tensors(cp, dtype, 2) if momentum else [None] * len(SIZES)
                flag = cp.zeros(1, cp.bool_)
                if many:
                    K.sgd_update_many(p, grads, v, 0.1, momentum, wd, nesterov, first,
                                      flag=flag, neg_lr_buffer=lr_buffer)
                else:
                    for a, g, b in zip(p, grads, v):
                        K.sgd_update(a, g, b, 0.1, momentum, wd, nesterov, first, flag=flag,
                                     neg_lr_buffer=lr_buffer)
                runs.append(([a.get() for a in p],
                             [b.get() for b in v] if momentum else [], bool(flag.get()[0])))
            (p0, v0, f0), (p1, v1, f1) = runs
            assert all(a.tobytes() == b.tobytes() for a, b in zip(p0, p1))
            assert all(a.tobytes() == b.tobytes() for a, b in zip(v0, v1))
            assert not f0 and not f1


def test_a_nonfinite_result_sets_the_flag(cp):
    p, g = _tensors(cp, np.float32, 0), _tensors(cp, np.float32, 1)
    v = [cp.zeros_like(a) for a in p]
    g[1][4096] = np.float32(3e38)           # the last block of the second tensor
    flag = cp.zeros(1, cp.bool_)
    K.sgd_update_many(p, g, v, 10.0, 0.9, 0.0, False, flag=flag)
    assert bool(flag.get()[0])


def test_the_table_is_made_once(cp):
    from neuron.kernels.pointer_tables import TABLES
    p, g = _tensors(cp, np.float32, 0), _tensors(cp, np.float32, 1)
    v = [cp.zeros_like(a) for a in p]
    K.sgd_update_many(p, g, v, 0.1, 0.9, 0.0, False)
    n = TABLES.uploads
    for _ in range(5):
        K.sgd_update_many(p, g, v, 0.1, 0.9, 0.0, False)
    assert TABLES.uploads == n


def _train(replay, per_layer, monkeypatch, steps=5):
    from neuron.models import build_model

    import neuron as nn
    from neuron.executor import Executor
    monkeypatch.setattr(K, "sgd_per_layer", per_layer)
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    rng = np.random.default_rng(0)
    ex = Executor(g, 8, device="cuda", seed=1, replay=replay,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4, nesterov=True))
    losses = [ex.train_step(rng.standard_normal((8, 3, 16, 16)).astype(np.float32),
                            rng.integers(0, 10, 8)) for _ in range(steps)]
    return losses, ex.state_dict(), ex


def test_training_per_layer_eager_and_in_a_graph_gives_the_per_tensor_bits(monkeypatch):
    l0, s0, _ = _train("off", False, monkeypatch)
    for mode in ("off", "graph"):
        l1, s1, ex = _train(mode, True, monkeypatch)
        assert l1 == l0, mode
        assert all(s0[k].tobytes() == s1[k].tobytes() for k in s0), mode
    assert ex.replay["ran"] == "graph" and ex.replay["replayed_iterations"] >= 2, ex.replay
