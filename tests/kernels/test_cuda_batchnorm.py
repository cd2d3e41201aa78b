"""BN on the GPU path without a GPU: what the CuPy/cuDNN wrappers hand to cuDNN (fakes)."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.kernels import cuda as K
from neuron.kernels import numpy_ref


class FakeArray:
    """Shape, dtype and a device pointer: all the wrappers read of an array."""
    _next = [0x10000]

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.strides = tuple(int(s) for s in np.empty(self.shape, self.dtype).strides)
        self.flags = type("F", (), {"c_contiguous": True})()
        self.data = type("D", (), {"ptr": self._next[0]})()
        self._next[0] += 1 << 20


class FakeCupy:
    def full(self, shape, value, dtype):
        return FakeArray(shape, dtype)

    zeros = ones = empty = lambda self, shape, dtype: FakeArray(shape, dtype)

    def empty_like(self, a):
        return FakeArray(a.shape, a.dtype)


@pytest.fixture
def calls(monkeypatch):
    got = {}
    monkeypatch.setattr(K, "_cp", lambda: FakeCupy())
    monkeypatch.setattr(K, "_h", lambda: None)
    monkeypatch.setattr(K, "_td", lambda a: ("desc", tuple(a.shape), np.dtype(a.dtype).name))
    monkeypatch.setattr(K.dnn, "bias_descriptor",
                        lambda c, dtype: ("bn-desc", c, np.dtype(dtype).name))
    for name in ("batchnorm_backward", "batchnorm_forward_training",
                 "batchnorm_forward_inference"):
        monkeypatch.setattr(K.dnn, name, lambda *a, _n=name: got.__setitem__(_n, a))
    return got


def test_backward_gets_the_layers_eps(calls):
    x, dy = FakeArray((2, 3, 4, 4), np.float32), FakeArray((2, 3, 4, 4), np.float32)
    p = [FakeArray((3,), np.float32) for _ in range(5)]
    K.batchnorm_backward(x, dy, p[0], p[1], p[2], FakeArray(x.shape, np.float32), p[3], p[4],
                         eps=1e-3)
    args = calls["batchnorm_backward"]
    assert 1e-3 in args and 1e-5 not in args


def test_the_layer_passes_its_eps():
    import inspect
    from neuron.layers import norm
    src = inspect.getsource(norm)
    assert "eps=self.eps" in src.split("def backward")[1]
    assert "eps" in inspect.signature(numpy_ref.batchnorm_backward).parameters


def test_half_input_uses_float_parameter_descriptors(calls):
    x = FakeArray((2, 3, 4, 4), np.float16)
    params = [FakeArray((3,), np.float32) for _ in range(6)]
    K.batchnorm_forward_train(x, params[0], params[1], FakeArray(x.shape, np.float16),
                              params[2], params[3], params[4], params[5], 0.1, 1e-3, True)
    assert ("bn-desc", 3, "float32") in calls["batchnorm_forward_training"]
    K.batchnorm_backward(x, FakeArray(x.shape, np.float16), params[0], params[4], params[5],
                         FakeArray(x.shape, np.float16), None, None, eps=1e-3)
    assert ("bn-desc", 3, "float32") in calls["batchnorm_backward"]
    assert K.bn_param_dtype(np.float64) == np.float64


def test_half_parameters_for_half_input_are_a_clear_error(calls):
    x = FakeArray((2, 3, 4, 4), np.float16)
    gamma = FakeArray((3,), np.float16)
    with pytest.raises(ValueError, match=r"weight must be float32 with 3 elements.*float16"):
        K.batchnorm_forward_infer(x, gamma, None, FakeArray(x.shape, np.float16),
                                  FakeArray((3,), np.float32), FakeArray((3,), np.float32), 1e-5)
